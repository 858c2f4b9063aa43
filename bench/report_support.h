/*
 * The lowest layer of pp_report, used by every other part of it (report.c,
 * report_data.c, report_goals.c, report_json.c, report_md.c,
 * report_plots.c, report_w9.c) and using none of them: dying with a
 * message, the JSON number writer, the sort order of doubles, the formats
 * of times, numbers and ratios, and the goal list that latest.json and
 * latest.md print. Every name that crosses a file of pp_report starts with
 * pr_ (pp_bench's start with pb_).
 */
#ifndef PP_REPORT_SUPPORT_H
#define PP_REPORT_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Print "pp_report: " and the message to stderr, and exit(1). */
__attribute__((noreturn, format(printf, 1, 2))) void pr_die(const char *fmt,
                                                            ...);
/* realloc, or pr_die. */
void *pr_xrealloc(void *p, size_t n);

/* qsort's comparison of doubles, ascending. */
int pr_cmp_double(const void *a, const void *b);

/* A number, or null where it is not finite. */
void pr_json_num(FILE *f, double v);

/* A time in ns as "12 ns", "3.4 µs", "5.6 ms", "1.2 s" ("–" if not
 * finite, "−" before a negative time); a number ("1.2k", "3.4M"); a ratio
 * ("1.5×"). Each writes buf and returns it. */
const char *pr_fmt_ns(double ns, char *buf, size_t len);
const char *pr_fmt_num(double v, char *buf, size_t len);
const char *pr_fmt_ratio(double v, char *buf, size_t len);

/* An output file opened for writing (or pr_die), and now (UTC) in fmt
 * (strftime) into date: the time it was written. */
FILE *pr_open_dated(const char *path, const char *fmt, char *date, size_t len);

/* ---- The goal list ------------------------------------------------------ */

typedef struct pr_goal {
  char name[160];
  char status[16]; /* met, missed, partly, n/a */
  char detail[12288];
} pr_goal_t;

/* The goals in the order they were added (at most 24). */
extern pr_goal_t pr_goals[24];
extern int pr_ngoals;

/* A new goal at the end of the list (its status empty until set). */
pr_goal_t *pr_goal_new(const char *name);
/* Append to the goal's detail text. */
__attribute__((format(printf, 2, 3))) void pr_goal_add(pr_goal_t *g,
                                                       const char *fmt, ...);
/* n (case, threads, mode) checked, ok of them met. */
void pr_goal_count_status(pr_goal_t *g, int ok, int n);
/* A goal met or missed as a whole; n/a when none of its runs is there. */
void pr_goal_flag_status(pr_goal_t *g, bool any, bool ok);

#endif
