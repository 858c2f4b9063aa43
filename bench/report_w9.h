/*
 * pp_report's W9 part (issue 22: batches lent to worker processes, against
 * today's shared memory + copy). W9 is not a pp_bench workload: its records
 * are pp_bench_w9's W9 lines (path, workers, batch MiB, fill, key=value
 * fields), merged per (path, workers, batch, fill) into medians, and
 * reported as latest.json's "w9" array, a section of latest.md and three
 * goals.
 */
#ifndef PP_REPORT_W9_H
#define PP_REPORT_W9_H

#include <stdbool.h>
#include <stdio.h>

/* A raw line split at tabs: a W9 record is taken (true); an F line of a W9
 * run is counted, not taken (the caller lists every failure). */
bool pr_w9_parse(char **fld, int n);

/* Medians and ratios; call once, after parsing. */
void pr_w9_aggregate(void);

/* Whether any W9 record was read. */
bool pr_w9_have(void);

/* Why W9 has no results (NULL when it has some): not run, or every run
 * failed. */
const char *pr_w9_unavailable(void);

/* The three goals, appended to the report's goal list
 * (report_support.h). */
void pr_w9_goals(void);

/* `"w9": [...]` (one object per case), without a separator around it. */
void pr_w9_write_json(FILE *f);

/* The markdown section (heading, method, table, notes). */
void pr_w9_write_md(FILE *f);

#endif
