/*
 * `pinpool demo`'s output (demo_report.c): the progress line on stderr,
 * and the stats table, checks, cached pairs and totals on stdout.
 */
#ifndef PINPOOL_TOOLS_DEMO_REPORT_H
#define PINPOOL_TOOLS_DEMO_REPORT_H

#include <stdbool.h>
#include <stdint.h>

#include "demo_pipeline.h"
#include "pinpool.h"

/* The progress line's state (demo_progress_print). */
typedef struct progress {
  bool tty;
  double start;
  double last_time;
  uint64_t last_buffers;
  uint64_t last_bytes;
  bool printed;
} demo_progress_t;

/* Print the progress line to stderr (rewritten in place on a terminal). */
void demo_progress_print(demo_t *d, demo_progress_t *pr, double now);
/* The pool's stats as a table (stdout). */
void demo_print_stats_table(const pinpool_stats_t *s);
/* Print the checks; returns the number that failed. */
unsigned demo_print_checks(demo_t *d, const pinpool_stats_t *s,
                           uint64_t produced);
/* The cached alloc+free pair of a few sizes, timed as bench W1 does. */
void demo_print_cached_pairs(demo_t *d);
/* Buffers, bytes, rates and waste of the run (stdout). */
void demo_print_totals(demo_t *d, const demo_producer_t *prods,
                       const pinpool_stats_t *s, double elapsed);

#endif /* PINPOOL_TOOLS_DEMO_REPORT_H */
