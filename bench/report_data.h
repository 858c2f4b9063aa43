/*
 * pp_report's model of a run (report_data.c): pp_bench's records merged
 * into groups, one per (workload, case, implementation, mode, threads),
 * each with the median of every metric over its repetitions and its ratio
 * to pinpool; the failed runs, the time spent, the machine, the options;
 * and the questions every output asks of them. The outputs (report_goals.c,
 * report_json.c, report_md.c, report_plots.c) read it and do not call one
 * another; report.c runs them in order.
 */
#ifndef PP_REPORT_DATA_H
#define PP_REPORT_DATA_H

#include <stdbool.h>
#include <stdio.h>

#include "report_support.h"
#include "report_w9.h"

#define PR_MAX_METRICS 64 /* W8 reports ~50 */
#define PR_MAX_NOTES 6

typedef struct pr_metric {
  char key[40];
  double v;
} pr_metric_t;

typedef struct pr_run {
  pr_metric_t m[PR_MAX_METRICS];
  int n;
} pr_run_t;

typedef struct pr_group {
  char workload[8];
  char kase[96];
  char impl[32];
  char mode[16];
  char config[256];
  int threads;
  pr_run_t *runs;
  int nruns, cap;
  char notes[PR_MAX_NOTES][256];
  int nnotes;
  pr_metric_t agg[PR_MAX_METRICS];
  int nagg;
  double ratio_ns, ratio_ops;        /* NAN if no pinpool baseline */
  double over_floor_ns, ratio_floor; /* touch mode: distance to the floor */
} pr_group_t;

typedef struct pr_failure {
  char text[512];
} pr_failure_t;

/* Seconds spent per workload and thread count (T lines of bench/run.sh). */
typedef struct pr_cost {
  char workload[8];
  int threads;
  int runs;
  double seconds;
} pr_cost_t;

/* The options of pp_report (report.c fills them in). */
typedef struct pr_options {
  const char *raw, *json, *md, *plots, *rev, *mode, *load_start, *load_end;
  double elapsed;
  const char *peers[16];
  int npeers;
  const char *missing[16];
  int nmissing;
  bool charts;
} pr_options_t;

extern pr_options_t pr_opt;
extern pr_cost_t pr_cost[32];
extern int pr_ncost;
extern pr_group_t *pr_groups;
extern int pr_ngroups;
extern pr_failure_t *pr_fail;
extern int pr_nfail;

/* Why latest.json and latest.md have no W8 results. */
#define PR_W8_REASON "not run (bench/run.sh --workloads without W8)"

/* Read the raw records of path (R, N, T, F and W9 lines). */
void pr_parse_raw(const char *path);
/* Medians, the order of the groups, ratios to pinpool and distances to the
 * floor; call once, after pr_parse_raw. */
void pr_merge(void);

/* The group of (wl, kase, impl, mode, threads); created if create, else
 * NULL where there is none. */
pr_group_t *pr_find_group(const char *wl, const char *kase, const char *impl,
                          const char *mode, int threads, bool create);
/* The median of metric key over g's runs; NAN without it or without g. */
double pr_get(const pr_group_t *g, const char *key);
/* Operations per second that "ahead" compares (W4: 1 / allocator ns). */
double pr_speed(const pr_group_t *g);
/* The time one operation takes (1 / speed), in ns. */
double pr_op_ns(const pr_group_t *g);
/* Touch mode, the headline comparison. */
bool pr_fair(const pr_group_t *g);
bool pr_is_pinpool(const pr_group_t *g);
/* W1h and W8 measure pinpool alone. */
bool pr_pinpool_only_wl(const char *wl);
/* Any run of workload wl. */
bool pr_have_workload(const char *wl);
/* The fastest peer of pinpool group p (same workload, case, threads and
 * mode); NULL if none. */
const pr_group_t *pr_best_peer(const pr_group_t *p);
/* "impl/mode" into buf. */
const char *pr_label(const pr_group_t *g, char *buf, size_t len);

/* W1h's history levels: the implementation names and how they read. */
typedef struct pr_hlevel {
  const char *impl, *label;
} pr_hlevel_t;
extern const pr_hlevel_t pr_hlevels[4];
#define PR_N_HLEVELS ((int)(sizeof pr_hlevels / sizeof pr_hlevels[0]))
/* ns per history event of group g (W1h). */
double pr_ns_per_event(const pr_group_t *g);

typedef struct pr_machine {
  char uname[256];
  char cpu[256];
  long nproc;
  double mem_gib;
  char thp[64];
  char memlock[64];
  int uid;
} pr_machine_t;

void pr_describe_machine(pr_machine_t *m);

/* The outputs: report_goals.c, report_json.c, report_md.c, report_plots.c. */
void pr_evaluate_goals(void);
void pr_write_json(const pr_machine_t *m);
void pr_write_md(const pr_machine_t *m);
void pr_write_plots(void);

#endif
