/*
 * What `pinpool snapshot diff` (snapshot_diff.c) takes from `pinpool
 * snapshot summary` (snapshot_summary.c): the JSON writers and the parsing
 * of the subcommands' arguments. Every name starts with snap_.
 */
#ifndef PINPOOL_TOOLS_SNAPSHOT_SUMMARY_H
#define PINPOOL_TOOLS_SNAPSHOT_SUMMARY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "snapshot_load.h"

json_t *snap_jint(uint64_t v);
json_t *snap_jname(const char *name);
void snap_jset(json_t *o, const char *key, json_t *v);
/* Write j (and a newline) to out and drop it; -1 if it could not be made. */
int snap_dump_json(json_t *j, FILE *out);
/* Positional files and options, in any order. Returns -1 to go on, or an
 * exit code (help printed, usage error). */
int snap_report_args(const char *sub, void (*usage)(FILE *), int argc,
                     char **argv, const char **files, int nfiles, size_t *top,
                     int *json);
/* Load path into s; else report why on stderr and return the exit code. */
int snap_load_or_report(const char *sub, const char *path, snap_t *s);

#endif /* PINPOOL_TOOLS_SNAPSHOT_SUMMARY_H */
