/*
 * What pp_report's parts share (report.c, report_w9.c): the goal list that
 * latest.json and latest.md print, the JSON number writer and the sort
 * order of doubles.
 */
#ifndef PP_REPORT_H
#define PP_REPORT_H

#include <stdio.h>

typedef struct goal {
  char name[160];
  char status[16]; /* met, missed, partly, n/a */
  char detail[12288];
} goal_t;

/* A new goal at the end of the list (its status empty until set). */
goal_t *goal_new(const char *name);
/* Append to the goal's detail text. */
__attribute__((format(printf, 2, 3))) void goal_add(goal_t *g, const char *fmt,
                                                    ...);
/* n (case, threads, mode) checked, ok of them met. */
void goal_count_status(goal_t *g, int ok, int n);

/* A number, or null where it is not finite. */
void json_num(FILE *f, double v);
/* qsort's comparison of doubles, ascending. */
int cmp_double(const void *a, const void *b);

#endif
