/*
 * pp_report's lowest layer (report_support.h): nothing here calls another
 * part of pp_report.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "report_support.h"

void pr_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "pp_report: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

void *pr_xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (q == NULL)
    pr_die("out of memory");
  return q;
}

int pr_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

void pr_json_num(FILE *f, double v) {
  if (!isfinite(v))
    fputs("null", f);
  else if (v == floor(v) && fabs(v) < 1e15)
    fprintf(f, "%.0f", v);
  else
    fprintf(f, "%.6g", v);
}

/* ---- Formats ----------------------------------------------------------- */

const char *pr_fmt_ns(double ns, char *buf, size_t len) {
  if (isfinite(ns) && ns < 0) { /* under the floor */
    char tmp[32];
    pr_fmt_ns(-ns, tmp, sizeof tmp);
    snprintf(buf, len, "−%s", tmp);
    return buf;
  }
  if (!isfinite(ns))
    snprintf(buf, len, "–");
  else if (ns < 1e3)
    snprintf(buf, len, "%.0f ns", ns);
  else if (ns < 1e6)
    snprintf(buf, len, "%.3g µs", ns / 1e3);
  else if (ns < 1e9)
    snprintf(buf, len, "%.3g ms", ns / 1e6);
  else
    snprintf(buf, len, "%.3g s", ns / 1e9);
  return buf;
}

const char *pr_fmt_num(double v, char *buf, size_t len) {
  if (!isfinite(v))
    snprintf(buf, len, "–");
  else if (fabs(v) >= 1e9)
    snprintf(buf, len, "%.3gG", v / 1e9);
  else if (fabs(v) >= 1e6)
    snprintf(buf, len, "%.3gM", v / 1e6);
  else if (fabs(v) >= 1e4)
    snprintf(buf, len, "%.3gk", v / 1e3);
  else if (v == floor(v) || fabs(v) >= 100)
    snprintf(buf, len, "%.0f", v);
  else
    snprintf(buf, len, "%.3g", v);
  return buf;
}

const char *pr_fmt_ratio(double v, char *buf, size_t len) {
  if (!isfinite(v))
    snprintf(buf, len, "–");
  else if (v >= 100)
    snprintf(buf, len, "%.0f×", v);
  else
    snprintf(buf, len, "%.2g×", v);
  return buf;
}

/* An output file, and now (UTC) in fmt into date: the time it was written. */
FILE *pr_open_dated(const char *path, const char *fmt, char *date, size_t len) {
  FILE *f = fopen(path, "w");
  time_t now = time(NULL);
  if (f == NULL)
    pr_die("cannot write %s: %s", path, strerror(errno));
  strftime(date, len, fmt, gmtime(&now));
  return f;
}

/* ---- The goal list ----------------------------------------------------- */

pr_goal_t pr_goals[24];
int pr_ngoals;

pr_goal_t *pr_goal_new(const char *name) {
  pr_goal_t *g = &pr_goals[pr_ngoals++];
  memset(g, 0, sizeof *g);
  snprintf(g->name, sizeof g->name, "%s", name);
  return g;
}

void pr_goal_add(pr_goal_t *g, const char *fmt, ...) {
  size_t len = strlen(g->detail);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->detail + len, sizeof g->detail - len, fmt, ap);
  va_end(ap);
}

/* n (case, threads, mode) checked, ok of them met. */
void pr_goal_count_status(pr_goal_t *g, int ok, int n) {
  snprintf(g->status, sizeof g->status, "%s",
           n == 0    ? "n/a"
           : ok == n ? "met"
           : ok > 0  ? "partly"
                     : "missed");
}

void pr_goal_flag_status(pr_goal_t *g, bool any, bool ok) {
  snprintf(g->status, sizeof g->status, "%s",
           !any ? "n/a"
           : ok ? "met"
                : "missed");
}
