/*
 * pp_report — merge benchmark runs into bench/results/latest.{json,md} and
 * the data and script for the charts (issue 7).
 *
 *   pp_report --raw FILE --json OUT --markdown OUT --plots DIR
 *             [--rev REV] [--mode quick|full] [--elapsed SECONDS]
 *             [--peer NAME=VERSION]... [--missing NAME=REASON]...
 *             [--load-start "L1 L5 L15"] [--load-end "..."] [--charts 0|1]
 *
 * FILE holds the lines the pp_bench programs print (R: a record, N: a
 * note; W9: a record of pp_bench_w9 --raw, report_w9.c's) and the lines
 * bench/run.sh adds (F: a run that failed; T: how long a run took, in
 * microseconds). Records of
 * the same (workload, case, implementation, mode, threads) are repetitions:
 * every metric is reported as the median over them, and each record gets
 * its ratio to pinpool's record of the same case and thread count.
 * DIR receives *.dat files and plots.gp (run it with gnuplot from DIR; it
 * writes the PNGs into the directory given as `outdir`).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "report.h"
#include "report_w9.h"

#define MAX_METRICS 64 /* W8 reports ~50 */
#define MAX_NOTES 6

typedef struct metric {
  char key[40];
  double v;
} metric_t;

typedef struct run {
  metric_t m[MAX_METRICS];
  int n;
} run_t;

typedef struct group {
  char workload[8];
  char kase[96];
  char impl[32];
  char mode[16];
  char config[256];
  int threads;
  run_t *runs;
  int nruns, cap;
  char notes[MAX_NOTES][256];
  int nnotes;
  metric_t agg[MAX_METRICS];
  int nagg;
  double ratio_ns, ratio_ops;        /* NAN if no pinpool baseline */
  double over_floor_ns, ratio_floor; /* touch mode: distance to the floor */
} group_t;

typedef struct failure {
  char text[512];
} failure_t;

/* Seconds spent per workload and thread count (T lines of bench/run.sh). */
typedef struct cost {
  char workload[8];
  int threads;
  int runs;
  double seconds;
} cost_t;

static cost_t g_cost[32];
static int g_ncost;

static group_t *g_groups;
static int g_ngroups, g_capgroups;
static failure_t *g_fail;
static int g_nfail, g_capfail;

static struct {
  const char *raw, *json, *md, *plots, *rev, *mode, *load_start, *load_end;
  double elapsed;
  const char *peers[16];
  int npeers;
  const char *missing[16];
  int nmissing;
  bool charts;
} g_o;

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "pp_report: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n);
  if (q == NULL)
    die("out of memory");
  return q;
}

/* ---- Parsing ------------------------------------------------------------- */

static group_t *find_group(const char *wl, const char *kase, const char *impl,
                           const char *mode, int threads, bool create) {
  for (int i = 0; i < g_ngroups; i++) {
    group_t *g = &g_groups[i];
    if (g->threads == threads && strcmp(g->workload, wl) == 0 &&
        strcmp(g->kase, kase) == 0 && strcmp(g->impl, impl) == 0 &&
        strcmp(g->mode, mode) == 0)
      return g;
  }
  if (!create)
    return NULL;
  if (g_ngroups == g_capgroups) {
    g_capgroups = g_capgroups ? g_capgroups * 2 : 64;
    g_groups = xrealloc(g_groups, (size_t)g_capgroups * sizeof *g_groups);
  }
  group_t *g = &g_groups[g_ngroups++];
  memset(g, 0, sizeof *g);
  snprintf(g->workload, sizeof g->workload, "%s", wl);
  snprintf(g->kase, sizeof g->kase, "%s", kase);
  snprintf(g->impl, sizeof g->impl, "%s", impl);
  snprintf(g->mode, sizeof g->mode, "%s", mode);
  g->threads = threads;
  g->ratio_ns = g->ratio_ops = NAN;
  g->over_floor_ns = g->ratio_floor = NAN;
  return g;
}

/* Split a line at tabs in place; returns the number of fields. */
static int split_tabs(char *line, char **f, int max) {
  int n = 0;
  char *save = NULL;
  line[strcspn(line, "\r\n")] = '\0';
  for (char *t = strtok_r(line, "\t", &save); t != NULL && n < max;
       t = strtok_r(NULL, "\t", &save))
    f[n++] = t;
  return n;
}

static void add_failure(const char *text) {
  if (g_nfail == g_capfail) {
    g_capfail = g_capfail ? g_capfail * 2 : 8;
    g_fail = xrealloc(g_fail, (size_t)g_capfail * sizeof *g_fail);
  }
  snprintf(g_fail[g_nfail++].text, sizeof g_fail[0].text, "%s", text);
}

static void parse_raw(const char *path) {
  FILE *f = fopen(path, "r");
  char line[8192];
  char *fld[80];
  if (f == NULL)
    die("cannot read %s: %s", path, strerror(errno));
  while (fgets(line, sizeof line, f) != NULL) {
    int n = split_tabs(line, fld, 80);
    if (w9_parse(fld, n))
      continue;
    if (n >= 8 && strcmp(fld[0], "R") == 0) {
      group_t *g =
          find_group(fld[1], fld[2], fld[3], fld[4], atoi(fld[5]), true);
      snprintf(g->config, sizeof g->config, "%s", fld[7]);
      if (g->nruns == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 8;
        g->runs = xrealloc(g->runs, (size_t)g->cap * sizeof *g->runs);
      }
      run_t *r = &g->runs[g->nruns++];
      r->n = 0;
      for (int i = 8; i < n && r->n < MAX_METRICS; i++) {
        char *eq = strchr(fld[i], '=');
        if (eq == NULL)
          continue;
        *eq = '\0';
        snprintf(r->m[r->n].key, sizeof r->m[0].key, "%s", fld[i]);
        r->m[r->n].v = strtod(eq + 1, NULL);
        r->n++;
      }
    } else if (n >= 7 && strcmp(fld[0], "N") == 0) {
      group_t *g =
          find_group(fld[1], fld[2], fld[3], fld[4], atoi(fld[5]), true);
      bool dup = false;
      for (int i = 0; i < g->nnotes; i++)
        dup = dup || strcmp(g->notes[i], fld[6]) == 0;
      if (!dup && g->nnotes < MAX_NOTES)
        snprintf(g->notes[g->nnotes++], sizeof g->notes[0], "%s", fld[6]);
    } else if (n >= 9 && strcmp(fld[0], "T") == 0) {
      int t = atoi(fld[6]), k;
      for (k = 0; k < g_ncost; k++)
        if (g_cost[k].threads == t && strcmp(g_cost[k].workload, fld[1]) == 0)
          break;
      if (k == g_ncost && g_ncost < 32) {
        snprintf(g_cost[k].workload, sizeof g_cost[k].workload, "%s", fld[1]);
        g_cost[k].threads = t;
        g_ncost++;
      }
      if (k < g_ncost) {
        g_cost[k].runs++;
        g_cost[k].seconds += strtod(fld[8], NULL) / 1e6;
      }
    } else if (n >= 2 && strcmp(fld[0], "F") == 0) {
      char buf[512];
      size_t len = 0;
      buf[0] = '\0';
      for (int i = 1; i < n && len < sizeof buf - 2; i++)
        len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s",
                                i > 1 ? " " : "", fld[i]);
      add_failure(buf);
    }
  }
  fclose(f);
}

/* ---- Aggregation --------------------------------------------------------- */

int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double get(const group_t *g, const char *key) {
  if (g == NULL)
    return NAN;
  for (int i = 0; i < g->nagg; i++)
    if (strcmp(g->agg[i].key, key) == 0)
      return g->agg[i].v;
  return NAN;
}

static void aggregate(group_t *g) {
  double vals[256];
  g->nagg = 0;
  for (int r = 0; r < g->nruns; r++) {
    for (int k = 0; k < g->runs[r].n; k++) {
      const char *key = g->runs[r].m[k].key;
      bool seen = false;
      for (int j = 0; j < g->nagg && !seen; j++)
        seen = strcmp(g->agg[j].key, key) == 0;
      if (seen || g->nagg == MAX_METRICS)
        continue;
      int nv = 0;
      for (int r2 = 0; r2 < g->nruns && nv < 256; r2++)
        for (int k2 = 0; k2 < g->runs[r2].n; k2++)
          if (strcmp(g->runs[r2].m[k2].key, key) == 0)
            vals[nv++] = g->runs[r2].m[k2].v;
      qsort(vals, (size_t)nv, sizeof vals[0], cmp_double);
      double med =
          nv % 2 ? vals[nv / 2] : (vals[nv / 2 - 1] + vals[nv / 2]) / 2.0;
      snprintf(g->agg[g->nagg].key, sizeof g->agg[0].key, "%s", key);
      g->agg[g->nagg].v = med;
      g->nagg++;
    }
  }
}

/* Ratios are like for like: pinpool in the same mode. */
static const group_t *baseline(const group_t *g) {
  return find_group(g->workload, g->kase, "pinpool", g->mode, g->threads,
                    false);
}

/* The per-operation time that "ahead" compares: W4's ops/s is set by the
 * simulated streams, so its allocator cost per op is the fair measure. */
static double speed(const group_t *g) {
  if (g == NULL)
    return NAN;
  if (strcmp(g->workload, "W4") == 0) {
    double ns = get(g, "ns_mean");
    return ns > 0 ? 1e9 / ns : NAN;
  }
  return get(g, "ops_per_s");
}

/* The time one operation takes (1 / speed), in ns. */
static double op_ns(const group_t *g) {
  double v = speed(g);
  return v > 0 ? 1e9 / v : NAN;
}

/* Rows: touch mode first (the headline), then alloc; the floor first. */
static int impl_rank(const group_t *g) {
  static const char *order[] = {
      "floor",           "pinpool",         "pinpool-prearena",
      "pinpool-tc",      "pinpool-h-alloc", "pinpool-h-all",
      "pinpool-h-all16", "pinpool-cuda",    "pinpool-cuda-register",
      "rmmpool",         "refpool",         "refpool-cuda",
      "naive",           "cuhostalloc",     "glibc",
      "jemalloc",        "mimalloc",        "tcmalloc",
      "tcmalloc-rr0"};
  int r = 99;
  for (int i = 0; i < (int)(sizeof order / sizeof order[0]); i++)
    if (strcmp(g->impl, order[i]) == 0)
      r = i;
  return (strcmp(g->mode, "alloc") == 0 ? 100 : 0) + r;
}

static int case_order(const group_t *a) {
  /* Cases in first-appearance order within a workload. */
  for (int i = 0; i < g_ngroups; i++)
    if (strcmp(g_groups[i].workload, a->workload) == 0 &&
        strcmp(g_groups[i].kase, a->kase) == 0)
      return i;
  return 0;
}

/* Sort by a key computed before sorting (case_order needs the original
 * order, so compute it first into a parallel array). */
typedef struct sortable {
  group_t g;
  int corder;
} sortable_t;

static int cmp_sortable(const void *pa, const void *pb) {
  const sortable_t *a = pa, *b = pb;
  int c = strcmp(a->g.workload, b->g.workload);
  if (c)
    return c;
  if (a->corder != b->corder)
    return a->corder - b->corder;
  if (a->g.threads != b->g.threads)
    return a->g.threads - b->g.threads;
  return impl_rank(&a->g) - impl_rank(&b->g);
}

static void sort_groups(void) {
  size_t n = g_ngroups > 0 ? (size_t)g_ngroups : 0;
  sortable_t *s = calloc(n + 1, sizeof *s);
  if (s == NULL)
    die("out of memory");
  for (int i = 0; i < g_ngroups; i++) {
    s[i].g = g_groups[i];
    s[i].corder = case_order(&g_groups[i]);
  }
  qsort(s, n, sizeof *s, cmp_sortable);
  for (int i = 0; i < g_ngroups; i++)
    g_groups[i] = s[i].g;
  free(s);
}

/* Touch mode: the headline comparison (every implementation writes every
 * page of its blocks); alloc mode is like for like too, and reported. */
static bool fair(const group_t *g) { return strcmp(g->mode, "touch") == 0; }

static bool is_pinpool(const group_t *g) {
  return strncmp(g->impl, "pinpool", 7) == 0;
}

/* A peer pinpool is compared with: not pinpool, not the floor. */
static bool is_peer(const group_t *g) {
  return !is_pinpool(g) && strcmp(g->impl, "floor") != 0;
}

/* W1h and W8 measure pinpool alone: they have their own tables and goals
 * and stay out of the comparisons with the peers. */
static bool pinpool_only_wl(const char *wl) {
  return strcmp(wl, "W1h") == 0 || strcmp(wl, "W8") == 0;
}

static bool have_workload(const char *wl) {
  for (int i = 0; i < g_ngroups; i++)
    if (strcmp(g_groups[i].workload, wl) == 0 && g_groups[i].nruns > 0)
      return true;
  return false;
}

/* ---- Machine ------------------------------------------------------------- */

typedef struct machine {
  char uname[256];
  char cpu[256];
  long nproc;
  double mem_gib;
  char thp[64];
  char memlock[64];
  int uid;
} machine_t;

static void read_first_line(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  buf[0] = '\0';
  if (f == NULL)
    return;
  if (fgets(buf, (int)len, f) == NULL)
    buf[0] = '\0';
  buf[strcspn(buf, "\n")] = '\0';
  fclose(f);
}

static void describe_machine(machine_t *m) {
  struct utsname u;
  FILE *f;
  char line[512];
  memset(m, 0, sizeof *m);
  if (uname(&u) == 0)
    snprintf(m->uname, sizeof m->uname, "%s %s %s", u.sysname, u.release,
             u.machine);
  m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(m->cpu, sizeof m->cpu, "unknown");
  if ((f = fopen("/proc/cpuinfo", "r")) != NULL) {
    while (fgets(line, sizeof line, f) != NULL) {
      if (strncmp(line, "model name", 10) == 0) {
        char *c = strchr(line, ':');
        if (c != NULL) {
          c++;
          while (*c == ' ' || *c == '\t')
            c++;
          c[strcspn(c, "\n")] = '\0';
          snprintf(m->cpu, sizeof m->cpu, "%s", c);
        }
        break;
      }
    }
    fclose(f);
  }
  if ((f = fopen("/proc/meminfo", "r")) != NULL) {
    while (fgets(line, sizeof line, f) != NULL)
      if (strncmp(line, "MemTotal:", 9) == 0)
        m->mem_gib = strtod(line + 9, NULL) / 1048576.0;
    fclose(f);
  }
  read_first_line("/sys/kernel/mm/transparent_hugepage/enabled", m->thp,
                  sizeof m->thp);
  if ((f = fopen("/proc/self/limits", "r")) != NULL) {
    while (fgets(line, sizeof line, f) != NULL) {
      if (strncmp(line, "Max locked memory", 17) == 0) {
        char soft[32] = "";
        if (sscanf(line + 17, "%31s", soft) == 1)
          snprintf(m->memlock, sizeof m->memlock, "%s", soft);
      }
    }
    fclose(f);
  }
  m->uid = (int)getuid();
}

/* ---- Formatting ---------------------------------------------------------- */

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

void json_num(FILE *f, double v) {
  if (!isfinite(v))
    fputs("null", f);
  else if (v == floor(v) && fabs(v) < 1e15)
    fprintf(f, "%.0f", v);
  else
    fprintf(f, "%.6g", v);
}

/* A time in ns as "12 ns", "3.4 µs", "5.6 ms", "1.2 s". */
/* Literal JSON text (keys, separators), then a value. */
static void json_put_str(FILE *f, const char *text, const char *s) {
  fputs(text, f);
  json_str(f, s);
}

static void json_put_num(FILE *f, const char *text, double v) {
  fputs(text, f);
  json_num(f, v);
}

static const char *fmt_ns(double ns, char *buf, size_t len) {
  if (isfinite(ns) && ns < 0) { /* under the floor */
    char tmp[32];
    fmt_ns(-ns, tmp, sizeof tmp);
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

static const char *fmt_num(double v, char *buf, size_t len) {
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

static const char *fmt_ratio(double v, char *buf, size_t len) {
  if (!isfinite(v))
    snprintf(buf, len, "–");
  else if (v >= 100)
    snprintf(buf, len, "%.0f×", v);
  else
    snprintf(buf, len, "%.2g×", v);
  return buf;
}

/* ---- Goals --------------------------------------------------------------- */

static goal_t g_goals[24];
static int g_ngoals;

goal_t *goal_new(const char *name) {
  goal_t *g = &g_goals[g_ngoals++];
  memset(g, 0, sizeof *g);
  snprintf(g->name, sizeof g->name, "%s", name);
  return g;
}

void goal_add(goal_t *g, const char *fmt, ...) {
  size_t len = strlen(g->detail);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->detail + len, sizeof g->detail - len, fmt, ap);
  va_end(ap);
}

/* n (case, threads, mode) checked, ok of them met. */
void goal_count_status(goal_t *g, int ok, int n) {
  snprintf(g->status, sizeof g->status, "%s",
           n == 0    ? "n/a"
           : ok == n ? "met"
           : ok > 0  ? "partly"
                     : "missed");
}

/* A goal met or missed as a whole; n/a when none of its runs is there. */
static void goal_flag_status(goal_t *g, bool any, bool ok) {
  snprintf(g->status, sizeof g->status, "%s",
           !any ? "n/a"
           : ok ? "met"
                : "missed");
}

static const char *label(const group_t *g, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", g->impl, g->mode);
  return buf;
}

static void goals_w1(void) {
  goal_t *a = goal_new("W1: cached alloc+free pair <= 20 ns at every size "
                       "(alloc mode: nothing written), 1 thread");
  bool all_a = true, any = false;
  char buf[64], buf2[64], buf3[64];
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (strcmp(g->workload, "W1") || g->threads != 1 ||
        strcmp(g->impl, "pinpool") || strcmp(g->mode, "alloc"))
      continue;
    any = true;
    double ns = get(g, "ns_med");
    const group_t *tc =
        find_group("W1", g->kase, "pinpool-tc", "alloc", 1, false);
    const group_t *t = find_group("W1", g->kase, "pinpool", "touch", 1, false);
    goal_add(a, "%s%s %s", a->detail[0] ? "; " : "", g->kase,
             fmt_ns(ns, buf, sizeof buf));
    if (tc != NULL)
      goal_add(a, " (tcache_bytes=8GiB: %s)",
               fmt_ns(get(tc, "ns_med"), buf, sizeof buf));
    const group_t *pre =
        find_group("W1", g->kase, "pinpool-prearena", "alloc", 1, false);
    if (pre != NULL && pre->nruns > 0)
      goal_add(a, " (before the arenas, this machine: %s)",
               fmt_ns(get(pre, "ns_med"), buf, sizeof buf));
    if (t != NULL && isfinite(t->over_floor_ns))
      goal_add(a, " [touch mode, per pair: %s, floor %s: %s over it]",
               fmt_ns(op_ns(t), buf, sizeof buf),
               fmt_ns(op_ns(t) - t->over_floor_ns, buf2, sizeof buf2),
               fmt_ns(t->over_floor_ns, buf3, sizeof buf3));
    if (!(ns <= 20.0))
      all_a = false;
  }
  goal_flag_status(a, any, all_a);
}

/* The fastest peer of pinpool group p (same workload, case, threads and
 * mode); NULL if none. */
static const group_t *best_peer(const group_t *p) {
  const group_t *best = NULL;
  for (int j = 0; j < g_ngroups; j++) {
    const group_t *q = &g_groups[j];
    if (strcmp(q->workload, p->workload) || q->threads != p->threads ||
        strcmp(q->kase, p->kase) || strcmp(q->mode, p->mode) || !is_peer(q) ||
        q->nruns == 0)
      continue;
    if (isfinite(speed(q)) && (best == NULL || speed(q) > speed(best)))
      best = q;
  }
  return best;
}

/* pinpool ahead of every peer in `wl`, like for like (each mode against
 * the same mode), every case, 1 and 2 threads? min_big: the margin asked
 * over the best peer where the live set is >= 1 GiB (W2), else 1.
 * met: everywhere; partly: somewhere; missed: nowhere. */
static void goal_ahead_min(const char *wl, const char *title, double min_big) {
  goal_t *g = goal_new(title);
  int n = 0, ok = 0;
  char buf[64], buf2[64], buf3[64];
  static const char *modes[] = {"touch", "alloc"};
  for (int m = 0; m < 2; m++) {
    bool head = false;
    for (int t = 1; t <= 2; t++) {
      for (int i = 0; i < g_ngroups; i++) {
        const group_t *p = &g_groups[i];
        if (strcmp(p->workload, wl) || p->threads != t ||
            strcmp(p->impl, "pinpool") || strcmp(p->mode, modes[m]))
          continue;
        const group_t *wg = best_peer(p);
        if (wg == NULL)
          continue;
        double r = speed(p) / speed(wg); /* > 1: pinpool ahead */
        double need = get(p, "live_cap_mib") >= 1024 ? min_big : 1.0;
        bool met = r > need || (need == 1.0 && r > 1.0);
        n++;
        ok += met;
        if (!head)
          goal_add(g, "%s**%s mode**: ", g->detail[0] ? "; " : "", modes[m]);
        goal_add(g, "%s%s %dT %s %s (%s vs %s %s)%s", head ? "; " : "", p->kase,
                 t, met ? "ahead" : "BEHIND", fmt_ratio(r, buf, sizeof buf),
                 fmt_num(speed(p), buf2, sizeof buf2), wg->impl,
                 fmt_num(speed(wg), buf3, sizeof buf3),
                 need > 1.0
                     ? (r >= need ? " (>= 1.5x: met)" : " (>= 1.5x asked)")
                     : "");
        head = true;
      }
    }
  }
  goal_count_status(g, ok, n);
  if (n > 0)
    goal_add(g,
             ". %d of %d (case, threads, mode) met; ratio = pinpool "
             "%s ÷ the fastest peer's in the same mode",
             ok, n, strcmp(wl, "W4") == 0 ? "1e9 / mean ns" : "ops/s");
}

static void goal_ahead(const char *wl, const char *title) {
  goal_ahead_min(wl, title, 1.0);
}

/* Steady state: pinpool takes no page fault per operation (touch mode,
 * after each workload's warm-up or fill; W6 and W4 excluded: W6 is backend
 * churn by design, W4 starts cold). */
static void goals_faults(void) {
  goal_t *g = goal_new("Steady state: 0 page faults per operation for "
                       "pinpool (touch mode; W1, W2 after the fill, W3, "
                       "W5, W7; < 0.01 counts as 0)");
  static const char *wls[] = {"W1", "W2", "W3", "W5", "W7"};
  int n = 0, ok = 0;
  for (size_t w = 0; w < sizeof wls / sizeof wls[0]; w++) {
    double worst = -1;
    const group_t *wg = NULL;
    int nw = 0, okw = 0;
    for (int i = 0; i < g_ngroups; i++) {
      const group_t *p = &g_groups[i];
      if (strcmp(p->workload, wls[w]) || strcmp(p->impl, "pinpool") ||
          strcmp(p->mode, "touch"))
        continue;
      double f = get(p, "minflt_per_op");
      if (!isfinite(f))
        continue;
      nw++;
      okw += f < 0.01;
      if (f > worst) {
        worst = f;
        wg = p;
      }
    }
    if (wg == NULL)
      continue;
    n += nw;
    ok += okw;
    goal_add(g, "%s%s: %d of %d cases at 0", g->detail[0] ? "; " : "", wls[w],
             okw, nw);
    if (okw < nw)
      goal_add(g, ", worst %.3g faults/op (%s, %d thread%s)", worst, wg->kase,
               wg->threads, wg->threads > 1 ? "s" : "");
  }
  goal_count_status(g, ok, n);
}

static void goals_w2(void) {
  goal_t *a = goal_new("W2: memory held <= 1.10x the peak requested "
                       "(pinpool: peak reserved ÷ peak requested), every "
                       "variant");
  char buf[64];
  int n = 0, ok = 0;
  for (int t = 1; t <= 2; t++) {
    for (int i = 0; i < g_ngroups; i++) {
      const group_t *p = &g_groups[i];
      if (strcmp(p->workload, "W2") || p->threads != t ||
          strcmp(p->impl, "pinpool") || strcmp(p->mode, "touch"))
        continue;
      double ov = get(p, "overhead");
      const group_t *r =
          find_group("W2", p->kase, "rmmpool", "touch", t, false);
      const group_t *f =
          find_group("W2", p->kase, "refpool", "touch", t, false);
      n++;
      ok += ov <= 1.10;
      goal_add(a, "%s%s %dT pinpool %.2f", a->detail[0] ? "; " : "", p->kase, t,
               ov);
      if (r != NULL)
        goal_add(a, " (rmmpool %.2f", get(r, "overhead"));
      if (f != NULL)
        goal_add(a, "%srefpool %.2f", r != NULL ? ", " : " (",
                 get(f, "overhead"));
      if (r != NULL || f != NULL)
        goal_add(a, ")");
    }
  }
  (void)buf;
  goal_count_status(a, ok, n);
  if (n > 0)
    goal_add(a, ". %d of %d met", ok, n);
  goal_ahead_min("W2",
                 "W2: ahead of every peer on every variant, like for "
                 "like (touch and alloc modes, 1 and 2 threads), by "
                 ">= 1.5x over the best at >= 1 GiB live",
                 1.5);
}

/* W3-W7 no more than 10 % slower than before the arenas: pinpool's ns/op
 * median in alloc mode against pinpool-prearena's, the last revision before
 * them built from the repository and run in the same interleaving
 * (bench/run.sh), so on the same machine at the same load. */
static void goals_before(void) {
  goal_t *g = goal_new("W3-W7: pinpool no more than 10 % slower than "
                       "before the arenas (ns/op median, alloc mode, vs "
                       "pinpool-prearena run beside it)");
  int n = 0, ok = 0;
  char b1[64], b2[64], b3[64];
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *p = &g_groups[i];
    if (strcmp(p->impl, "pinpool") || strcmp(p->mode, "alloc") ||
        p->nruns == 0 || p->workload[1] < '3' || p->workload[1] > '7' ||
        p->workload[2] != '\0')
      continue;
    const group_t *b = find_group(p->workload, p->kase, "pinpool-prearena",
                                  "alloc", p->threads, false);
    if (b == NULL || b->nruns == 0)
      continue;
    double now = get(p, "ns_med"), then = get(b, "ns_med");
    double r = now / then;
    n++;
    ok += r <= 1.10;
    goal_add(g, "%s%s %s %dT: %s vs %s (%s)%s", g->detail[0] ? "; " : "",
             p->workload, p->kase, p->threads, fmt_ns(now, b1, sizeof b1),
             fmt_ns(then, b2, sizeof b2), fmt_ratio(r, b3, sizeof b3),
             r <= 1.10 ? "" : " SLOWER");
  }
  goal_count_status(g, ok, n);
  if (n == 0)
    goal_add(g, "pinpool-prearena was not run (see the unavailable "
                "implementations)");
  else
    goal_add(g, ". %d of %d within 10 %%", ok, n);
}

static void goals_w4(void) {
  goal_t *g = goal_new("W4: blocks of a fast stream reused while a slow "
                       "stream lags (the FIFO reference cannot)");
  bool ok = true, any = false;
  for (int t = 1; t <= 2; t++) {
    const group_t *p = NULL, *r = NULL;
    for (int i = 0; i < g_ngroups && p == NULL; i++)
      if (!strcmp(g_groups[i].workload, "W4") && g_groups[i].threads == t &&
          !strcmp(g_groups[i].impl, "pinpool") &&
          !strcmp(g_groups[i].mode, "touch"))
        p = &g_groups[i];
    for (int i = 0; i < g_ngroups && p != NULL; i++)
      if (!strcmp(g_groups[i].workload, "W4") && g_groups[i].threads == t &&
          !strcmp(g_groups[i].impl, "refpool") &&
          !strcmp(g_groups[i].mode, "touch"))
        r = &g_groups[i];
    if (p == NULL || r == NULL)
      continue;
    any = true;
    double pf = get(p, "lag_fast_us_med"), rf = get(r, "lag_fast_us_med");
    double po = get(p, "reserved_over_need"), ro = get(r, "reserved_over_need");
    double pe = get(p, "early_reuse");
    goal_add(g,
             "%s%d thread%s: fast-stream reuse lag (median) pinpool %.3g µs "
             "vs refpool %.3g µs; reclaim lag pinpool %.3g µs vs refpool "
             "%.3g µs; reserved / (live + in flight) pinpool %.2f vs "
             "refpool %.2f; early reuses %.0f",
             g->detail[0] ? "; " : "", t, t > 1 ? "s" : "", pf, rf,
             get(p, "reclaim_lag_us"), get(r, "reclaim_lag_us"), po, ro, pe);
    if (!(pf * 10 < rf) || !(pe == 0))
      ok = false;
  }
  goal_flag_status(g, any, ok);
  goal_add(g, ". Met means: pinpool's fast-stream lag is under a tenth of "
              "refpool's and no block was reused before its copy completed");
  goal_ahead("W4", "W4: ahead of every peer (allocator time per op, "
                   "including the record/free path)");
}

/* W1h's history levels: the implementation names and how they read. */
static const struct {
  const char *impl, *label;
} g_hlevels[] = {{"pinpool", "off"},
                 {"pinpool-h-alloc", "alloc, no stacks"},
                 {"pinpool-h-all", "all, no stacks"},
                 {"pinpool-h-all16", "all, 16-frame stacks"}};
#define N_HLEVELS ((int)(sizeof g_hlevels / sizeof g_hlevels[0]))

/* ns per history event of group g: its pair minus the history-off pair,
 * over the two events (alloc, free) a pair records. */
static double ns_per_event(const group_t *g) {
  const group_t *off = baseline(g);
  if (off == NULL || off == g)
    return NAN;
  return (get(g, "ns_med") - get(off, "ns_med")) / 2.0;
}

/* Issue 4's goals: W1h (history on the hot path) and W8 (snapshots). */
static void goals_history(void) {
  goal_t *off = goal_new("History off: no measurable cost on the hot path");
  goal_t *ns = goal_new("History on without stacks: <= 10 % on the hot "
                        "path (W1h, level alloc, stack_depth 0)");
  goal_t *st = goal_new("History with 16-frame stacks: <= 1 µs per event "
                        "(W1h, level all)");
  goal_t *sn = goal_new("W8: snapshot of 100,000 live blocks with "
                        "1,000,000 history entries written in < 1 s");
  char b1[64], b2[64], b3[64], b4[64];
  bool any = false, ns_ok = true, st_ok = true;
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (strcmp(g->workload, "W1h") || strcmp(g->impl, "pinpool") ||
        g->threads != 1)
      continue;
    const group_t *a =
        find_group("W1h", g->kase, "pinpool-h-alloc", "alloc", 1, false);
    const group_t *a0 =
        find_group("W1h", g->kase, "pinpool-h-all", "alloc", 1, false);
    const group_t *a16 =
        find_group("W1h", g->kase, "pinpool-h-all16", "alloc", 1, false);
    const group_t *w1 = find_group("W1", g->kase, "pinpool", "alloc", 1, false);
    any = true;
    goal_add(off, "%s%s %s", off->detail[0] ? "; " : "", g->kase,
             fmt_ns(get(g, "ns_med"), b1, sizeof b1));
    if (w1 != NULL)
      goal_add(off, " (W1: %s)", fmt_ns(get(w1, "ns_med"), b1, sizeof b1));
    if (a != NULL) {
      goal_add(ns, "%s%s: off %s, alloc %s (%s)", ns->detail[0] ? "; " : "",
               g->kase, fmt_ns(get(g, "ns_med"), b1, sizeof b1),
               fmt_ns(get(a, "ns_med"), b2, sizeof b2),
               fmt_ratio(a->ratio_ns, b3, sizeof b3));
      if (!(a->ratio_ns <= 1.10))
        ns_ok = false;
    }
    if (a0 != NULL)
      goal_add(ns, ", all %s (%s)", fmt_ns(get(a0, "ns_med"), b2, sizeof b2),
               fmt_ratio(a0->ratio_ns, b3, sizeof b3));
    if (a16 != NULL) {
      double ev = ns_per_event(a16);
      goal_add(st, "%s%s: pair %s vs %s off, %s per event",
               st->detail[0] ? "; " : "", g->kase,
               fmt_ns(get(a16, "ns_med"), b1, sizeof b1),
               fmt_ns(get(g, "ns_med"), b2, sizeof b2),
               fmt_ns(ev, b3, sizeof b3));
      if (!(ev <= 1000.0))
        st_ok = false;
    }
  }
  snprintf(off->status, sizeof off->status, "n/a");
  if (any)
    goal_add(off, ". Not measurable within one build: with history off the "
                  "alloc and free paths add one relaxed atomic load and a "
                  "branch; these are W1h's history-off pairs (W1's in "
                  "parentheses: the same code). The comparison with the "
                  "build before history is in docs/benchmarks.md");
  else
    goal_add(off, "W1h not run");
  goal_flag_status(ns, any, ns_ok);
  goal_flag_status(st, any, st_ok);
  if (!any) {
    goal_add(ns, "W1h not run");
    goal_add(st, "W1h not run");
  }

  const group_t *s = NULL, *s2 = NULL;
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (strcmp(g->workload, "W8") || get(g, "live_blocks") != 1e5 ||
        get(g, "ring") != 1e6)
      continue;
    if (g->threads == 1)
      s = g;
    else
      s2 = g;
  }
  if (s == NULL) {
    snprintf(sn->status, sizeof sn->status, "n/a");
    goal_add(sn, "%s",
             have_workload("W8")
                 ? "no case with 100,000 live blocks and a ring "
                   "of 1,000,000 (full runs only)"
                 : "W8 not run");
    return;
  }
  double ms = get(s, "snap_ms_med");
  snprintf(sn->status, sizeof sn->status, "%s", ms < 1000 ? "met" : "missed");
  goal_add(sn,
           "%s (median of %.0f, 1 thread allocating meanwhile; first one "
           "in the process %s), %.0f MiB, gathered in %s, longest lock "
           "hold %s",
           fmt_ns(ms * 1e6, b1, sizeof b1), get(s, "snaps"),
           fmt_ns(get(s, "snap_ms_cold") * 1e6, b2, sizeof b2),
           get(s, "file_mib"),
           fmt_ns(get(s, "gather_ms_med") * 1e6, b3, sizeof b3),
           fmt_ns(get(s, "hold_us_max") * 1e3, b4, sizeof b4));
  if (s2 != NULL)
    goal_add(sn, "; with 2 threads allocating: %s",
             fmt_ns(get(s2, "snap_ms_med") * 1e6, b1, sizeof b1));
  goal_add(sn,
           ". The allocating thread's longest pair: %s during snapshots, "
           "%s without",
           fmt_ns(get(s, "snap_max"), b1, sizeof b1),
           fmt_ns(get(s, "idle_max"), b2, sizeof b2));
}

static void evaluate_goals(void) {
  goals_faults();
  goals_w2();
  goals_w1();
  goals_before();
  goal_ahead("W3", "W3: ahead of every peer, like for like, 1 and 2 "
                   "threads");
  goals_w4();
  goal_ahead("W5", "W5: ahead of every peer, like for like, 1 and 2 "
                   "threads");
  goal_ahead("W7", "W7: ahead of every peer, like for like, 1 and 2 "
                   "threads");
  goals_history();
  w9_goals();
}

/* ---- JSON ---------------------------------------------------------------- */

static const char *W8_REASON = "not run (bench/run.sh --workloads without "
                               "W8)";

/* A --peer / --missing argument, NAME=TEXT: NAME into name, TEXT returned
 * ("" without '='). */
static const char *split_spec(const char *spec, char *name, size_t len) {
  const char *eq = strchr(spec, '=');
  size_t n = eq ? (size_t)(eq - spec) : strlen(spec);
  snprintf(name, len, "%.*s", (int)n, spec);
  return eq ? eq + 1 : "";
}

/* An output file, and now (UTC) in fmt into date: the time it was written. */
static FILE *open_dated(const char *path, const char *fmt, char *date,
                        size_t len) {
  FILE *f = fopen(path, "w");
  time_t now = time(NULL);
  if (f == NULL)
    die("cannot write %s: %s", path, strerror(errno));
  strftime(date, len, fmt, gmtime(&now));
  return f;
}

static void write_json(const machine_t *m) {
  char date[64];
  FILE *f = open_dated(g_o.json, "%Y-%m-%dT%H:%M:%SZ", date, sizeof date);
  json_put_str(f, "{\n  \"schema\": \"pinpool-bench/3\",\n  \"git_revision\": ",
               g_o.rev);
  fprintf(f, ",\n  \"date\": \"%s\",\n  \"mode\": ", date);
  json_str(f, g_o.mode);
  json_put_num(f, ",\n  \"elapsed_s\": ", g_o.elapsed);
  json_put_str(f, ",\n  \"machine\": {\"uname\": ", m->uname);
  fprintf(f, ", \"nproc\": %ld, \"cpu_model\": ", m->nproc);
  json_str(f, m->cpu);
  fprintf(f, ", \"mem_total_gib\": %.1f, \"thp\": ", m->mem_gib);
  json_str(f, m->thp);
  json_put_str(f, ", \"memlock_limit\": ", m->memlock);
  fprintf(f, ", \"uid\": %d, \"loadavg_start\": ", m->uid);
  json_str(f, g_o.load_start ? g_o.load_start : "");
  json_put_str(f, ", \"loadavg_end\": ", g_o.load_end ? g_o.load_end : "");
  fprintf(f, "},\n  \"peers\": [");
  for (int i = 0; i < g_o.npeers; i++) {
    char name[64];
    const char *value = split_spec(g_o.peers[i], name, sizeof name);
    fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
    json_str(f, name);
    json_put_str(f, ", \"version\": ", value);
    fprintf(f, ", \"available\": true}");
  }
  for (int i = 0; i < g_o.nmissing; i++) {
    char name[64];
    const char *value = split_spec(g_o.missing[i], name, sizeof name);
    fprintf(f, "%s\n    {\"name\": ", g_o.npeers + i ? "," : "");
    json_str(f, name);
    json_put_str(f, ", \"available\": false, \"reason\": ", value);
    fprintf(f, "}");
  }
  fprintf(f, "\n  ],\n  \"results\": [");
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (g->nruns == 0)
      continue;
    fprintf(f, "%s\n    {\"workload\": ", i ? "," : "");
    json_str(f, g->workload);
    json_put_str(f, ", \"case\": ", g->kase);
    json_put_str(f, ", \"impl\": ", g->impl);
    json_put_str(f, ", \"mode\": ", g->mode);
    fprintf(f, ", \"threads\": %d, \"reps\": %d, \"config\": ", g->threads,
            g->nruns);
    json_str(f, g->config);
    json_put_num(f, ",\n     \"ns_per_op_median\": ", get(g, "ns_med"));
    json_put_num(f, ", \"ns_per_op_p99\": ", get(g, "ns_p99"));
    json_put_num(f, ", \"ops_per_s\": ", get(g, "ops_per_s"));
    json_put_num(f, ", \"overhead\": ",
                 strcmp(g->workload, "W4") == 0 ? get(g, "reserved_over_need")
                                                : get(g, "overhead"));
    json_put_num(f, ", \"backend_calls\": ", get(g, "backend_calls"));
    json_put_num(f, ", \"minflt_per_op\": ", get(g, "minflt_per_op"));
    json_put_num(f, ", \"ratio_ns_to_pinpool\": ", g->ratio_ns);
    json_put_num(f, ", \"ratio_ops_to_pinpool\": ", g->ratio_ops);
    json_put_num(f, ", \"ns_over_floor\": ", g->over_floor_ns);
    json_put_num(f, ", \"ratio_to_floor\": ", g->ratio_floor);
    fprintf(f, ",\n     \"metrics\": {");
    for (int k = 0; k < g->nagg; k++) {
      fprintf(f, "%s", k ? ", " : "");
      json_str(f, g->agg[k].key);
      json_put_num(f, ": ", g->agg[k].v);
    }
    fprintf(f, "}, \"notes\": [");
    for (int k = 0; k < g->nnotes; k++) {
      fprintf(f, "%s", k ? ", " : "");
      json_str(f, g->notes[k]);
    }
    fprintf(f, "]}");
  }
  fprintf(f, "\n  ],\n  \"unavailable\": [");
  if (!have_workload("W8")) {
    json_put_str(f, "{\"workload\": \"W8\", \"reason\": ", W8_REASON);
    fprintf(f, "}");
  }
  const char *w9_why = w9_unavailable();
  if (w9_why != NULL) {
    /* after W8's entry, if W8 is unavailable too */
    fprintf(f, "%s{\"workload\": \"W9\", \"reason\": ",
            have_workload("W8") ? "" : ", ");
    json_str(f, w9_why);
    fprintf(f, "}");
  }
  fprintf(f, "],\n  ");
  w9_write_json(f);
  fprintf(f, ",\n  \"failures\": [");
  for (int i = 0; i < g_nfail; i++) {
    fprintf(f, "%s", i ? ", " : "");
    json_str(f, g_fail[i].text);
  }
  fprintf(f, "],\n  \"goals\": [");
  for (int i = 0; i < g_ngoals; i++) {
    fprintf(f, "%s\n    {\"goal\": ", i ? "," : "");
    json_str(f, g_goals[i].name);
    json_put_str(f, ", \"status\": ", g_goals[i].status);
    json_put_str(f, ", \"detail\": ", g_goals[i].detail);
    fprintf(f, "}");
  }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f) != 0)
    die("cannot write %s", g_o.json);
}

/* ---- Markdown ------------------------------------------------------------ */

typedef struct column {
  const char *key;
  const char *head;
  char kind; /* t: time (ns), n: number, r: ratio, x: plain %.2f */
} column_t;

typedef struct wl_desc {
  const char *name;
  const char *title;
  const char *what;
  column_t extra[5];
} wl_desc_t;

static const wl_desc_t g_wl[] = {
    {"W1",
     "W1 hot reuse",
     "Alloc+free pairs of one size in a loop (each thread its own loop). "
     "ns/op = per pair: median and p99 over timed groups of pairs.",
     {{NULL, NULL, 0}}},
    {"W2",
     "W2 log-uniform sizes, capped live set",
     "Sizes log-uniform in the case's range; random frees keep the live set "
     "under the cap (split between threads). The same operations for every "
     "implementation: the fill (until the live set first reaches the cap) "
     "is reported apart (fill ops/s, fill faults/op); ns/op, ops/s, "
     "faults/op and backend calls are the steady state: the next 10,000 "
     "operations per thread (quick: 1,000), of which the second half is "
     "shown apart too (late faults/op, late ops/s). One operation = the "
     "frees it needs + allocation + use.",
     {{"fill_ops_per_s", "fill ops/s", 'n'},
      {"fill_minflt_per_op", "fill faults/op", 'x'},
      {"late_minflt_per_op", "late faults/op", 'x'},
      {"late_ops_per_s", "late ops/s", 'n'},
      {NULL, NULL, 0}}},
    {"W3",
     "W3 data-loader batches",
     "Producer allocates a batch (uint8 / fp32 256×3×224²), consumer frees "
     "the oldest; at most `depth` queued. 2 threads: producer and consumer "
     "on their own CPUs. ns/op = allocation (+ touch); ops/s = batches/s.",
     {{"free_ns_med", "free med", 't'}, {NULL, NULL, 0}}},
    {"W4",
     "W4 stream-ordered frees",
     "1 MiB blocks staged through a fast (50 µs copies) and a slow (2 ms) "
     "simulated stream, ≤ 4 copies in flight per stream, each block freed "
     "right after its copy is queued. pinpool: record_stream + free "
     "(events=simulated); refpool: its global event FIFO; malloc peers and "
     "naive: a shim that frees a block when its stream passes it. ns/op = "
     "allocation + use + record/free (the copy's submission and the waits "
     "for stream room excluded). Reuse lag = time from a block's copy "
     "completing to the same address being handed out again, by the "
     "stream of that copy (median). Reclaim lag = mean time from a copy "
     "completing to its block being reusable (pools: from their reclaim "
     "statistics; shim: measured per block). Overhead = reserved (RSS for "
     "malloc) peak / peak of live + in-flight bytes.",
     {{"lag_fast_us_med", "fast reuse lag µs", 'n'},
      {"lag_slow_us_med", "slow reuse lag µs", 'n'},
      {"reclaim_lag_us", "reclaim lag µs", 'n'},
      {"early_reuse", "early reuse", 'n'},
      {NULL, NULL, 0}}},
    {"W5",
     "W5 producer/consumer, cross-thread frees",
     "xmalloc-test style: log-uniform 4 KiB – 4 MiB blocks allocated in "
     "batches of 64 and freed by the consumer (≤ 4 batches queued); 1 "
     "thread: allocate 64, free 64. ns/op = allocation (+ touch).",
     {{"free_ns_med", "free med", 't'},
      {"rss_growth_mib", "RSS growth MiB", 'x'},
      {NULL, NULL, 0}}},
    {"W6",
     "W6 backend churn",
     "Large blocks in a cycle (quick: 16–64 MiB; full: 256 MiB – 1 GiB), two "
     "live at a time; pinpool's cache is capped below the working set, so "
     "blocks come from the backend. ns/op = one acquisition (allocation + "
     "use).",
     {{"acquire_ms_per_gib", "acquire ms/GiB", 'x'},
      {"release_ms_per_gib", "release ms/GiB", 'x'},
      {NULL, NULL, 0}}},
    {"W7",
     "W7 KV-cache offload",
     "Bursts of 2 MiB pages; least recently used pages freed to stay under "
     "the live cap; a tenth of the live pages re-accessed after each burst. "
     "ns/op = one page (its LRU free + allocation + use).",
     {{"reserved_end_mib", "reserved at end MiB", 'x'}, {NULL, NULL, 0}}},
};

static void md_cell(FILE *f, const group_t *g, const column_t *c) {
  char buf[64];
  double v = get(g, c->key);
  switch (c->kind) {
  case 't':
    fprintf(f, " %s |", fmt_ns(v, buf, sizeof buf));
    break;
  case 'x':
    if (isfinite(v))
      fprintf(f, " %.2f |", v);
    else
      fprintf(f, " – |");
    break;
  default:
    fprintf(f, " %s |", fmt_num(v, buf, sizeof buf));
  }
}

static void md_table(FILE *f, const wl_desc_t *w) {
  bool any = false;
  for (int i = 0; i < g_ngroups && !any; i++)
    any = strcmp(g_groups[i].workload, w->name) == 0;
  fprintf(f, "## %s\n\n%s\n\n", w->title, w->what);
  if (!any) {
    fprintf(f, "No results.\n\n");
    return;
  }
  fprintf(f, "| case | thr | impl | mode | ns/op med | p99 | ops/s | "
             "time ÷ pinpool | ops/s ÷ pinpool | over floor /op | ÷ floor | "
             "memory held | backend calls | faults/op |");
  for (const column_t *c = w->extra; c->key; c++)
    fprintf(f, " %s |", c->head);
  fprintf(f, " reps |\n|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
             "--:|");
  for (const column_t *c = w->extra; c->key; c++)
    fprintf(f, "--:|");
  fprintf(f, "--:|\n");
  const char *prev_case = "";
  int prev_t = 0;
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    char b1[64], b2[64], b3[64], b4[64], b5[64], b6[64];
    if (strcmp(g->workload, w->name) || g->nruns == 0)
      continue;
    bool same = strcmp(prev_case, g->kase) == 0 && prev_t == g->threads;
    double ov = strcmp(w->name, "W4") == 0 ? get(g, "reserved_over_need")
                                           : get(g, "overhead");
    fprintf(f, "| %s | %d | %s%s%s | %s | %s | %s | %s | %s | %s | ",
            same ? "" : g->kase, g->threads, is_pinpool(g) ? "**" : "", g->impl,
            is_pinpool(g) ? "**" : "", g->mode,
            fmt_ns(get(g, "ns_med"), b1, sizeof b1),
            fmt_ns(get(g, "ns_p99"), b2, sizeof b2),
            fmt_num(get(g, "ops_per_s"), b3, sizeof b3),
            fmt_ratio(g->ratio_ns, b4, sizeof b4),
            fmt_ratio(g->ratio_ops, b5, sizeof b5));
    fprintf(f, "%s | %s | ", fmt_ns(g->over_floor_ns, b1, sizeof b1),
            fmt_ratio(g->ratio_floor, b2, sizeof b2));
    if (isfinite(ov))
      fprintf(f, "%.2f | ", ov);
    else
      fprintf(f, "– | ");
    fprintf(f, "%s | %s |", fmt_num(get(g, "backend_calls"), b6, sizeof b6),
            fmt_num(get(g, "minflt_per_op"), b1, sizeof b1));
    for (const column_t *c = w->extra; c->key; c++)
      md_cell(f, g, c);
    fprintf(f, " %d |\n", g->nruns);
    prev_case = g->kase;
    prev_t = g->threads;
  }
  /* Notes */
  bool header = false;
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    char b[64];
    if (strcmp(g->workload, w->name))
      continue;
    for (int k = 0; k < g->nnotes; k++) {
      if (!header)
        fprintf(f, "\nNotes:\n\n");
      header = true;
      fprintf(f, "- %s, %d thread%s, %s: %s\n", g->kase, g->threads,
              g->threads > 1 ? "s" : "", label(g, b, sizeof b), g->notes[k]);
    }
  }
  /* Configurations */
  fprintf(f, "\npinpool configuration:");
  const char *seen[4] = {NULL, NULL, NULL, NULL};
  int nseen = 0;
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (strcmp(g->workload, w->name) || !is_pinpool(g))
      continue;
    bool dup = false;
    for (int k = 0; k < nseen; k++)
      dup = dup || strcmp(seen[k], g->config) == 0;
    if (dup || nseen == 4)
      continue;
    seen[nseen++] = g->config;
    fprintf(f, "%s %s `%s`", nseen > 1 ? ";" : "", g->impl, g->config);
  }
  fprintf(f, ".\n\n");
}

/* W1h: one row per size and history level. */
static void md_w1h(FILE *f) {
  fprintf(f, "## W1h history cost on the hot path\n\n"
             "W1's cached alloc+free pair, 1 thread, pinpool with history off "
             "and on (`pinpool_record_history` right after create; a ring of "
             "100,000 entries, the default). With history on, each pair "
             "records 2 events (alloc, free_completed). ÷ off = ns/pair ÷ the "
             "history-off pair; ns per event = (pair − off pair) ÷ 2.\n\n");
  if (!have_workload("W1h")) {
    fprintf(f, "No results.\n\n");
    return;
  }
  fprintf(f, "| size | history | impl | ns/pair med | p99 | ÷ off | ns per "
             "event | reps |\n|---|---|---|--:|--:|--:|--:|--:|\n");
  const char *prev = "";
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    char b1[64], b2[64], b3[64], b4[64];
    if (strcmp(g->workload, "W1h") || g->nruns == 0)
      continue;
    const char *lvl = g->impl;
    for (int k = 0; k < N_HLEVELS; k++)
      if (strcmp(g_hlevels[k].impl, g->impl) == 0)
        lvl = g_hlevels[k].label;
    fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %d |\n",
            strcmp(prev, g->kase) ? g->kase : "", lvl, g->impl,
            fmt_ns(get(g, "ns_med"), b1, sizeof b1),
            fmt_ns(get(g, "ns_p99"), b2, sizeof b2),
            fmt_ratio(g->ratio_ns, b3, sizeof b3),
            fmt_ns(ns_per_event(g), b4, sizeof b4), g->nruns);
    prev = g->kase;
  }
  fprintf(f, "\n");
}

/* W8: the snapshots' cost, then the latency of the allocating threads in
 * each phase. */
static void md_w8(FILE *f) {
  fprintf(f, "## W8 snapshots\n\n"
             "pinpool only. A live set of N blocks (log-uniform 512 B – "
             "4 KiB) with history on (level all, 16-frame stacks, the ring "
             "full: 1,000,000 entries, quick 100,000), then 1 or 2 threads "
             "(`thr`) allocate and free while the main thread writes "
             "snapshots to a file in a loop. Snapshot: wall time of "
             "`pinpool_snapshot_write` (median; cold = the first one in the "
             "process, before the measurement), its file, and the `gather_ns` "
             "and `max_hold_ns` it reports (the longest time it held a pool "
             "lock). Duty = share of the phase spent writing snapshots.\n\n");
  if (!have_workload("W8")) {
    fprintf(f, "%s.\n\n", W8_REASON);
    return;
  }
  fprintf(f, "| case | thr | snapshot med | max | cold | file MiB | gather "
             "| lock hold med | max | ring kept | duty | setup | reps |\n"
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    char b[7][64];
    if (strcmp(g->workload, "W8") || g->nruns == 0)
      continue;
    fprintf(f,
            "| %s | %d | %s | %s | %s | %.1f | %s | %s | %s | %s | %.0f %% "
            "| %.1f s | %d |\n",
            g->kase, g->threads,
            fmt_ns(get(g, "snap_ms_med") * 1e6, b[0], sizeof b[0]),
            fmt_ns(get(g, "snap_ms_max") * 1e6, b[1], sizeof b[1]),
            fmt_ns(get(g, "snap_ms_cold") * 1e6, b[2], sizeof b[2]),
            get(g, "file_mib"),
            fmt_ns(get(g, "gather_ms_med") * 1e6, b[3], sizeof b[3]),
            fmt_ns(get(g, "hold_us_med") * 1e3, b[4], sizeof b[4]),
            fmt_ns(get(g, "hold_us_max") * 1e3, b[5], sizeof b[5]),
            fmt_num(get(g, "hist_kept"), b[6], sizeof b[6]),
            get(g, "snap_duty_pct"), get(g, "setup_s"), g->nruns);
  }
  fprintf(f, "\nLatency of the allocating threads: every alloc+free pair "
             "timed, all threads together, in three phases of equal length: "
             "the main thread idle (no snapshot), busy (memsets a 64 MiB "
             "buffer: CPU and memory traffic without the pool; with 2 threads "
             "on 2 CPUs it takes CPU time from them), and writing snapshots. "
             "Pairs: hot = 4 KiB from the thread cache; central = every 64th, "
             "after a thread-cache flush (refill from a central bin); backend "
             "= every 10 ms, 512 KiB, a segment created and released (waits "
             "for the segment lock a snapshot takes, and for the kernel's mmap "
             "lock, which the snapshot's own buffers take too). History level "
             "all with 16-frame stacks makes a hot pair hundreds of ns long "
             "(see W1h).\n\n"
             "| case | thr | main thread | pairs/s | med | p99 | p99.9 | max | "
             "hot max | central med | central max | backend med | backend "
             "max |\n|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  static const struct {
    const char *key, *label;
  } ph[] = {{"idle", "idle"}, {"busy", "busy"}, {"snap", "**snapshots**"}};
  static const char *const cols[] = {
      "med",         "p99",         "p999",        "max",        "hot_max",
      "central_med", "central_max", "backend_med", "backend_max"};
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    char b[64], key[48];
    if (strcmp(g->workload, "W8") || g->nruns == 0)
      continue;
    for (size_t p = 0; p < sizeof ph / sizeof ph[0]; p++) {
      snprintf(key, sizeof key, "%s_pairs_per_s", ph[p].key);
      fprintf(f, "| %s | %s | %s | %s |", p ? "" : g->kase,
              p ? "" : (g->threads > 1 ? "2" : "1"), ph[p].label,
              fmt_num(get(g, key), b, sizeof b));
      for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        snprintf(key, sizeof key, "%s_%s", ph[p].key, cols[c]);
        fprintf(f, " %s |", fmt_ns(get(g, key), b, sizeof b));
      }
      fprintf(f, "\n");
    }
  }
  fprintf(f, "\npinpool configuration:");
  for (int i = 0; i < g_ngroups; i++)
    if (strcmp(g_groups[i].workload, "W8") == 0) {
      fprintf(f, " `%s`", g_groups[i].config);
      break;
    }
  fprintf(f, ".\n\n");
}

/* The headline: W2 like for like, per variant, threads and mode: pinpool
 * against the fastest peer, with faults per operation and memory held. */
static void md_w2_summary(FILE *f) {
  if (!have_workload("W2"))
    return;
  fprintf(f, "## W2 at a glance (steady state, like for like)\n\n"
             "Each row: pinpool and the fastest peer in the same mode "
             "(ops/s in the steady state, after the fill), pinpool ÷ that "
             "peer (> 1: pinpool ahead), page faults per operation and "
             "memory held (peak reserved or RSS ÷ peak requested) of both; "
             "in touch mode also the floor's ops/s. In alloc mode a malloc "
             "peer's memory held (RSS growth) is meaningless: its pages are "
             "never touched.\n\n"
             "| case | thr | mode | pinpool ops/s | faults/op | memory held "
             "| fastest peer | its ops/s | faults/op | memory held | "
             "pinpool ÷ peer | floor ops/s |\n"
             "|---|--:|---|--:|--:|--:|---|--:|--:|--:|--:|--:|\n");
  static const char *modes[] = {"touch", "alloc"};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < g_ngroups; i++) {
      const group_t *p = &g_groups[i];
      char b[6][64];
      if (strcmp(p->workload, "W2") || strcmp(p->impl, "pinpool") ||
          strcmp(p->mode, modes[m]) || p->nruns == 0)
        continue;
      const group_t *q = best_peer(p);
      const group_t *fl =
          find_group("W2", p->kase, "floor", "touch", p->threads, false);
      fprintf(f,
              "| %s | %d | %s | %s | %s | %.2f | %s | %s | %s | %.2f | "
              "**%s** | %s |\n",
              p->kase, p->threads, p->mode,
              fmt_num(speed(p), b[0], sizeof b[0]),
              fmt_num(get(p, "minflt_per_op"), b[1], sizeof b[1]),
              get(p, "overhead"), q ? q->impl : "–",
              fmt_num(speed(q), b[2], sizeof b[2]),
              fmt_num(get(q, "minflt_per_op"), b[3], sizeof b[3]),
              get(q, "overhead"),
              fmt_ratio(q ? speed(p) / speed(q) : NAN, b[4], sizeof b[4]),
              fmt_num(strcmp(p->mode, "touch") == 0 ? speed(fl) : NAN, b[5],
                      sizeof b[5]));
    }
  fprintf(f, "\n");
}

static void write_md(const machine_t *m) {
  char date[64];
  FILE *f = open_dated(g_o.md, "%Y-%m-%d %H:%M UTC", date, sizeof date);
  fprintf(f, "# pinpool benchmarks (%s run)\n\n", g_o.mode);
  fprintf(f,
          "Written by `bench/run.sh%s` on %s, revision `%s`, in %.0f s. "
          "Method and caveats: [docs/benchmarks.md](../../docs/"
          "benchmarks.md). Raw numbers: [latest.json](latest.json).\n\n",
          strcmp(g_o.mode, "quick") == 0 ? " --quick" : "", date, g_o.rev,
          g_o.elapsed);
  fprintf(f,
          "- Machine: %s; %ld CPUs (%s); %.1f GiB; THP `%s`; RLIMIT_MEMLOCK "
          "%s; uid %d.\n",
          m->uname, m->nproc, m->cpu, m->mem_gib, m->thp, m->memlock, m->uid);
  fprintf(f,
          "- Load average at start / end: %s / %s (other work on the machine "
          "shares its CPUs; repetitions are interleaved to spread that "
          "noise).\n",
          g_o.load_start ? g_o.load_start : "?",
          g_o.load_end ? g_o.load_end : "?");
  fprintf(f, "- Implementations: **pinpool**; refpool (PyTorch "
             "CachingHostAllocator policy: power-of-two, no split, global "
             "event FIFO; bench/refpool.c); rmmpool (RMM "
             "pool_memory_resource policy: coalescing best fit over "
             "populated chunks that double, per-stream free lists; "
             "bench/rmmpool.c); naive (mmap+MAP_POPULATE+mlock per block, "
             "munlock+munmap per free; not in W2); floor (no allocator: the "
             "touches alone, on a pre-faulted ring the size of the live "
             "set)");
  for (int i = 0; i < g_o.npeers; i++)
    fprintf(f, "; %s", g_o.peers[i]);
  for (int i = 0; i < g_o.nmissing; i++)
    fprintf(f, "; %s (missing)", g_o.missing[i]);
  fprintf(f, ".\n");
  for (int i = 0; i < g_o.npeers; i++)
    if (strncmp(g_o.peers[i], "cuda=", 5) == 0)
      fprintf(f, "- GPU implementations (the CUDA driver above; touch mode "
                 "only): "
                 "pinpool-cuda (`backend=cuda`: cuMemHostAlloc segments), "
                 "pinpool-cuda-register (`backend=cuda-register`: mmap, "
                 "parallel populate, cuMemHostRegister), refpool-cuda "
                 "(refpool on cuMemHostAlloc, as PyTorch), cuhostalloc "
                 "(cuMemHostAlloc / cuMemFreeHost per block: the naive "
                 "baseline on a GPU machine); all with "
                 "CU_MEMHOSTALLOC_PORTABLE.\n");
  fprintf(f, "- Modes, the same for every implementation: `touch` writes one "
             "byte in every 4 KiB page of every block handed out (the "
             "headline: a pinned block is written by its user; a pool's pages "
             "are resident, a malloc's may fault); `alloc` writes nothing (the "
             "allocator alone). Every ratio compares an implementation with "
             "pinpool in the same mode. `floor` (touch mode only) is the "
             "touches alone; `over floor /op` = an implementation's time per "
             "operation (1 / ops/s) minus the floor's, `÷ floor` their ratio.\n"
             "- Every number is the median over `reps` runs; each run is one "
             "process, implementations interleaved with a rotating order. "
             "`time ÷ pinpool` = ns/op median ÷ pinpool's (> 1: pinpool is "
             "faster); `ops/s ÷ pinpool` (< 1: pinpool is faster). "
             "Memory held (`overhead`) = peak reserved ÷ peak requested bytes "
             "for the pools, naive and the floor (its ring), peak RSS (VmHWM) "
             "growth ÷ peak requested for malloc peers (meaningless in `alloc` "
             "mode, where their pages are never touched). Page faults per "
             "operation (minor faults of the process in the measured phase) "
             "and backend calls in the measured phase: segment or chunk "
             "allocations + releases for pools, mappings + unmappings for "
             "naive, and for malloc peers their memory system calls (mmap, "
             "munmap, mremap, brk, mprotect, madvise, counted by the kernel "
             "on its syscall tracepoints; left out, with a note, where it "
             "cannot count them).\n\n");
  md_w2_summary(f);

  fprintf(f, "## Goals (issues 21, 7, 4 and 22; reported, not asserted)\n\n"
             "| goal | status | where we stand "
             "|\n"
             "|---|---|---|\n");
  for (int i = 0; i < g_ngoals; i++)
    fprintf(f, "| %s | **%s** | %s |\n", g_goals[i].name, g_goals[i].status,
            g_goals[i].detail);
  fprintf(f, "\n");
  if (g_o.charts) {
    fprintf(f, "Charts: [W1 hot reuse](w1.png), [throughput vs pinpool]"
               "(throughput.png), [memory overhead](overhead.png), "
               "[W4 reuse lag](w4.png), [W6 backend churn](w6.png).\n\n");
    fprintf(f, "![W1](w1.png)\n\n![throughput](throughput.png)\n\n");
  } else {
    fprintf(f, "Charts: not drawn (gnuplot is not installed, or there "
               "was nothing to draw in this run).\n\n");
  }
  for (size_t i = 0; i < sizeof g_wl / sizeof g_wl[0]; i++)
    md_table(f, &g_wl[i]);
  md_w1h(f);
  md_w8(f);
  w9_write_md(f);
  if (g_ncost > 0) {
    /* W9's T lines carry its workers where the others' carry threads. */
    fprintf(f,
            "## Time spent\n\n| workload | threads%s | runs | seconds |\n"
            "|---|--:|--:|--:|\n",
            w9_have() ? " (W9: workers)" : "");
    for (int i = 0; i < g_ncost; i++)
      fprintf(f, "| %s | %d | %d | %.0f |\n", g_cost[i].workload,
              g_cost[i].threads, g_cost[i].runs, g_cost[i].seconds);
    fprintf(f, "\n");
  }
  if (g_nfail > 0) {
    fprintf(f, "## Failed runs\n\n");
    for (int i = 0; i < g_nfail; i++)
      fprintf(f, "- %s\n", g_fail[i].text);
    fprintf(f, "\n");
  }
  if (fclose(f) != 0)
    die("cannot write %s", g_o.md);
}

/* ---- Charts -------------------------------------------------------------- */

static FILE *open_in(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f == NULL)
    die("cannot write %s: %s", path, strerror(errno));
  return f;
}

/* Distinct series (impl, mode) in a workload, fair modes only or all. */
static int series(const char *wl, int threads, bool fair_only,
                  const group_t **out, int max) {
  int n = 0;
  for (int i = 0; i < g_ngroups && n < max; i++) {
    const group_t *g = &g_groups[i];
    if (strcmp(g->workload, wl) || g->threads != threads ||
        (fair_only && !fair(g)))
      continue;
    bool dup = false;
    for (int k = 0; k < n; k++)
      dup = dup || (strcmp(out[k]->impl, g->impl) == 0 &&
                    strcmp(out[k]->mode, g->mode) == 0);
    if (!dup)
      out[n++] = g;
  }
  return n;
}

/* Colour and dash of a series: one colour per implementation, dashed for
 * malloc peers' alloc-only mode. */
static const char *style(const char *impl, const char *mode, char *buf,
                         size_t len) {
  static const struct {
    const char *impl, *rgb;
  } colours[] = {{"pinpool", "#000000"},
                 {"pinpool-tc", "#7f7f7f"},
                 {"pinpool-prearena", "#8c8c3c"},
                 {"refpool", "#9467bd"},
                 {"rmmpool", "#17becf"},
                 {"floor", "#bbbbbb"},
                 {"tcmalloc-rr0", "#ffbb78"},
                 {"naive", "#8c564b"},
                 {"glibc", "#1f77b4"},
                 {"pinpool-cuda", "#393b79"},
                 {"pinpool-cuda-register", "#bcbd22"},
                 {"refpool-cuda", "#c5b0d5"},
                 {"cuhostalloc", "#e377c2"},
                 {"jemalloc", "#d62728"},
                 {"mimalloc", "#2ca02c"},
                 {"tcmalloc", "#ff7f0e"}};
  const char *rgb = "#555555";
  for (size_t i = 0; i < sizeof colours / sizeof colours[0]; i++)
    if (strcmp(colours[i].impl, impl) == 0)
      rgb = colours[i].rgb;
  snprintf(buf, len, "lc rgb '%s' dt %d", rgb,
           strcmp(mode, "alloc") == 0 ? 2 : 1);
  return buf;
}

/* "impl" or "impl/mode" -> its parts. */
static void split_label(const char *s, char *impl, size_t ilen, char *mode,
                        size_t mlen) {
  const char *sl = strchr(s, '/');
  snprintf(impl, ilen, "%.*s", (int)(sl ? (size_t)(sl - s) : strlen(s)), s);
  snprintf(mode, mlen, "%s", sl ? sl + 1 : "touch");
}

/* A short name for a case, for the x axis of the bar charts. */
static const char *short_case(const group_t *g, bool threads, char *buf,
                              size_t len) {
  char sz[32] = "";
  unsigned depth = 0;
  char live[32] = "";
  if (strcmp(g->workload, "W3") == 0 &&
      sscanf(g->kase, "%31s batch, depth %u", sz, &depth) == 2)
    snprintf(buf, len, "W3 %s d%u", sz, depth);
  else if (strcmp(g->workload, "W2") == 0 &&
           sscanf(g->kase, "%31s live<=%31s", sz, live) == 2)
    snprintf(buf, len, "W2 %s %s", sz, live);
  else
    snprintf(buf, len, "%s", g->workload);
  if (threads) {
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, " %dT", g->threads);
  }
  return buf;
}

static const char *g_bar_peers[] = {
    "rmmpool/touch",  "refpool/touch",  "naive/touch",    "glibc/touch",
    "jemalloc/touch", "mimalloc/touch", "tcmalloc/touch", "tcmalloc-rr0/touch"};
#define N_BAR_PEERS ((int)(sizeof g_bar_peers / sizeof g_bar_peers[0]))

/* One histogram plot command over `file` with columns 2..n+1 styled as
 * the labels say. */
static void gp_bars(FILE *gp, const char *file, const char *const *labels,
                    int n) {
  char st[96], impl[32], mode[16];
  fprintf(gp, "plot ");
  for (int k = 0; k < n; k++) {
    split_label(labels[k], impl, sizeof impl, mode, sizeof mode);
    fprintf(gp, "%s'%s' using %d%s title columnheader(%d) %s", k ? ", " : "",
            file, k + 2, k ? "" : ":xtic(1)", k + 2,
            style(impl, mode, st, sizeof st));
  }
  fprintf(gp, "\n");
}

/* The header row of a bar chart's data: "case", then one column a label. */
static void dat_header(FILE *d, const char *const *labels, int n) {
  fprintf(d, "case");
  for (int k = 0; k < n; k++)
    fprintf(d, "\t%s", labels[k]);
  fprintf(d, "\n");
}

/* The group of g's case measured by label ("impl/mode") at threads, or
 * NULL. */
static const group_t *same_case(const group_t *g, const char *label,
                                int threads) {
  char impl[32], mode[16];
  split_label(label, impl, sizeof impl, mode, sizeof mode);
  return find_group(g->workload, g->kase, impl, mode, threads, false);
}

static void write_plots(void) {
  const group_t *ser[32];
  char b[64], st[96];
  FILE *gp = open_in(g_o.plots, "plots.gp");
  fprintf(gp, "# generated by pp_report; run: gnuplot -e \"outdir='DIR'\" "
              "plots.gp\n"
              "if (!exists(\"outdir\")) outdir = \".\"\n"
              "set datafile missing \"?\"\nset datafile separator \"\\t\"\n"
              "set grid ytics\nset key outside right top\n"
              "set style fill solid 0.85 border -1\n");

  /* W1: ns per pair vs size, 1 thread. */
  int ns = series("W1", 1, false, ser, 32);
  FILE *d = open_in(g_o.plots, "w1.dat");
  fprintf(d, "size\tbytes");
  for (int k = 0; k < ns; k++)
    fprintf(d, "\t%s", label(ser[k], b, sizeof b));
  fprintf(d, "\n");
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (strcmp(g->workload, "W1") || g->threads != 1 ||
        strcmp(g->impl, "pinpool") || strcmp(g->mode, "touch"))
      continue;
    fprintf(d, "%s\t%.0f", g->kase, get(g, "size"));
    for (int k = 0; k < ns; k++) {
      const group_t *q =
          find_group("W1", g->kase, ser[k]->impl, ser[k]->mode, 1, false);
      double v = get(q, "ns_med");
      fprintf(d, isfinite(v) ? "\t%.6g" : "\t?", v);
    }
    fprintf(d, "\n");
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 960,560 font 'sans,10'\n"
              "set output outdir.'/w1.png'\n"
              "set title 'W1 hot reuse, 1 thread: ns per alloc+free pair "
              "(median, log-log; lower is better; solid: touch, dashed: "
              "alloc)'\n"
              "set logscale xy\nset xlabel 'block size'\n"
              "set ylabel 'ns per pair'\nset format y '10^{%%L}'\n"
              "set xtics ('4K' 4096, '64K' 65536, '1M' 1048576, "
              "'64M' 67108864, '1G' 1073741824)\nplot ");
  for (int k = 0; k < ns; k++)
    fprintf(gp,
            "%s'w1.dat' using 2:%d title columnheader(%d) with "
            "linespoints lw %d pt 7 ps 0.6 %s",
            k ? ", " : "", k + 3, k + 3,
            strcmp(ser[k]->impl, "pinpool") ? 2 : 4,
            style(ser[k]->impl, ser[k]->mode, st, sizeof st));
  fprintf(gp, "\nunset logscale\nunset xlabel\nunset ylabel\n"
              "set xtics autofreq\nset format y '%%g'\n");

  /* Throughput: pinpool speed / peer speed for W2-W7 (fair modes). */
  d = open_in(g_o.plots, "throughput.dat");
  dat_header(d, g_bar_peers, N_BAR_PEERS);
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (!strcmp(g->workload, "W1") || strcmp(g->impl, "pinpool") ||
        strcmp(g->mode, "touch") || pinpool_only_wl(g->workload))
      continue;
    fprintf(d, "%s", short_case(g, true, b, sizeof b));
    for (int k = 0; k < N_BAR_PEERS; k++) {
      const group_t *q = same_case(g, g_bar_peers[k], g->threads);
      double r = q ? speed(g) / speed(q) : NAN;
      fprintf(d, isfinite(r) && r > 0 ? "\t%.6g" : "\t?", r);
    }
    fprintf(d, "\n");
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 1600,600 font 'sans,10'\n"
              "set output outdir.'/throughput.png'\n"
              "set title 'Throughput: pinpool ÷ peer (ops/s; W4: allocator "
              "time per op), touch mode, like for like. Above 1: pinpool "
              "ahead'\n"
              "set style data histograms\nset style histogram clustered "
              "gap 1\nset logscale y\nset yrange [0.1:*]\n"
              "set ylabel 'ratio (log)'\n"
              "set xtics rotate by -30 scale 0\nset bmargin 8\n"
              "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead "
              "lw 2 lc rgb 'black'\n");
  gp_bars(gp, "throughput.dat", g_bar_peers, N_BAR_PEERS);
  fprintf(gp, "unset arrow 1\nunset logscale\nunset ylabel\n");

  /* Memory overhead, 1 thread, per workload (fair series). */
  static const char *oimpl[] = {
      "pinpool/touch",  "rmmpool/touch",  "refpool/touch",
      "naive/touch",    "glibc/touch",    "jemalloc/touch",
      "mimalloc/touch", "tcmalloc/touch", "tcmalloc-rr0/touch"};
  const int noimpl = (int)(sizeof oimpl / sizeof oimpl[0]);
  d = open_in(g_o.plots, "overhead.dat");
  dat_header(d, oimpl, noimpl);
  for (int i = 0; i < g_ngroups; i++) {
    const group_t *g = &g_groups[i];
    if (!strcmp(g->workload, "W1") || g->threads != 1 ||
        strcmp(g->impl, "pinpool") || strcmp(g->mode, "touch") ||
        pinpool_only_wl(g->workload))
      continue;
    fprintf(d, "%s", short_case(g, false, b, sizeof b));
    for (int k = 0; k < noimpl; k++) {
      const group_t *q = same_case(g, oimpl[k], 1);
      double v = strcmp(g->workload, "W4") == 0 ? get(q, "reserved_over_need")
                                                : get(q, "overhead");
      fprintf(d, isfinite(v) ? "\t%.6g" : "\t?", v);
    }
    fprintf(d, "\n");
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 1400,560 font 'sans,10'\n"
              "set output outdir.'/overhead.png'\n"
              "set title 'Memory overhead, 1 thread: peak reserved (malloc: "
              "peak RSS growth) ÷ peak requested; W4: ÷ (live + in flight). "
              "Lower is better'\n"
              "set logscale y\nset yrange [0.8:*]\n"
              "set ytics (0.8, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20)\n"
              "set ylabel 'overhead (log)'\nset xtics rotate by -30 scale 0\n"
              "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead "
              "lw 2 lc rgb 'black'\n");
  gp_bars(gp, "overhead.dat", oimpl, noimpl);
  fprintf(gp, "unset arrow 1\nunset logscale\nset yrange [*:*]\n"
              "set ytics autofreq\nunset ylabel\n");

  /* W4: reuse lag per implementation, 1 thread. */
  ns = series("W4", 1, true, ser, 32);
  d = open_in(g_o.plots, "w4.dat");
  fprintf(d, "impl\tfast stream\tslow stream\treserved / need\n");
  for (int k = 0; k < ns; k++) {
    double f1 = get(ser[k], "lag_fast_us_med"),
           s1 = get(ser[k], "lag_slow_us_med"),
           o1 = get(ser[k], "reserved_over_need");
    fprintf(d, "%s", label(ser[k], b, sizeof b));
    fprintf(d, isfinite(f1) && f1 > 0 ? "\t%.6g" : "\t?", f1);
    fprintf(d, isfinite(s1) && s1 > 0 ? "\t%.6g" : "\t?", s1);
    fprintf(d, isfinite(o1) ? "\t%.6g\n" : "\t?\n", o1);
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 1100,500 font 'sans,10'\n"
              "set output outdir.'/w4.png'\n"
              "set multiplot layout 1,2 title 'W4 stream-ordered frees, 1 "
              "thread (fast stream: 50 µs copies, slow: 2 ms)'\n"
              "set xtics rotate by -30 scale 0\nset key inside top right\n"
              "set title 'reuse lag after the copy completed (median µs, "
              "log)'\nset logscale y\n"
              "plot 'w4.dat' using 2:xtic(1) title columnheader(2) lc rgb "
              "'#1f77b4', '' using 3 title columnheader(3) lc rgb '#d62728'\n"
              "unset logscale\nset yrange [0:*]\n"
              "set title 'reserved ÷ (live + in flight), peak'\nunset key\n"
              "plot 'w4.dat' using 4:xtic(1) lc rgb '#9467bd'\n"
              "unset multiplot\nset yrange [*:*]\nset key outside right "
              "top\n");

  /* W6: acquire and release ms per GiB (fair modes). */
  ns = series("W6", 1, true, ser, 32);
  d = open_in(g_o.plots, "w6.dat");
  fprintf(d, "impl\tacquire ms/GiB\trelease ms/GiB\n");
  for (int k = 0; k < ns; k++) {
    double a1 = get(ser[k], "acquire_ms_per_gib"),
           r1 = get(ser[k], "release_ms_per_gib");
    fprintf(d, "%s", label(ser[k], b, sizeof b));
    fprintf(d, isfinite(a1) ? "\t%.6g" : "\t?", a1);
    fprintf(d, isfinite(r1) ? "\t%.6g\n" : "\t?\n", r1);
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 960,500 font 'sans,10'\n"
              "set output outdir.'/w6.png'\n"
              "set title 'W6 backend churn: ms per GiB acquired / released "
              "(lower is better)'\n"
              "set yrange [0:*]\nset ylabel 'ms per GiB'\n"
              "plot 'w6.dat' using 2:xtic(1) title columnheader(2) lc rgb "
              "'#1f77b4', '' using 3 title columnheader(3) lc rgb "
              "'#ff7f0e'\n");
  if (fclose(gp) != 0)
    die("cannot write plots.gp");
}

/* ---- Main ---------------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr,
          "usage: pp_report --raw FILE --json OUT --markdown OUT --plots DIR\n"
          "                 [--rev REV] [--mode quick|full] [--elapsed S]\n"
          "                 [--peer NAME=VERSION]... [--missing NAME=WHY]...\n"
          "                 [--load-start L] [--load-end L] [--charts 0|1]\n");
}

int main(int argc, char **argv) {
  machine_t m;
  g_o.rev = "unknown";
  g_o.mode = "full";
  g_o.charts = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) {
      usage();
      die("option %s needs a value", a);
    }
    const char *v = argv[++i];
    if (strcmp(a, "--raw") == 0)
      g_o.raw = v;
    else if (strcmp(a, "--json") == 0)
      g_o.json = v;
    else if (strcmp(a, "--markdown") == 0)
      g_o.md = v;
    else if (strcmp(a, "--plots") == 0)
      g_o.plots = v;
    else if (strcmp(a, "--rev") == 0)
      g_o.rev = v;
    else if (strcmp(a, "--mode") == 0)
      g_o.mode = v;
    else if (strcmp(a, "--elapsed") == 0)
      g_o.elapsed = strtod(v, NULL);
    else if (strcmp(a, "--load-start") == 0)
      g_o.load_start = v;
    else if (strcmp(a, "--load-end") == 0)
      g_o.load_end = v;
    else if (strcmp(a, "--peer") == 0 && g_o.npeers < 16)
      g_o.peers[g_o.npeers++] = v;
    else if (strcmp(a, "--charts") == 0)
      g_o.charts = strcmp(v, "0") != 0;
    else if (strcmp(a, "--missing") == 0 && g_o.nmissing < 16)
      g_o.missing[g_o.nmissing++] = v;
    else {
      usage();
      die("unknown option '%s'", a);
    }
  }
  if (g_o.raw == NULL || g_o.json == NULL || g_o.md == NULL ||
      g_o.plots == NULL) {
    usage();
    return 2;
  }
  parse_raw(g_o.raw);
  /* Failures alone (every W9 run failed) still make a report, which lists
   * them. */
  if (g_ngroups == 0 && !w9_have() && g_nfail == 0)
    die("no records in %s", g_o.raw);
  w9_aggregate();
  for (int i = 0; i < g_ngroups; i++)
    aggregate(&g_groups[i]);
  sort_groups();
  for (int i = 0; i < g_ngroups; i++) {
    group_t *g = &g_groups[i];
    const group_t *b = baseline(g);
    if (b == NULL)
      continue;
    g->ratio_ns = get(g, "ns_med") / get(b, "ns_med");
    g->ratio_ops = get(g, "ops_per_s") / get(b, "ops_per_s");
  }
  /* Touch mode: each implementation's distance to the floor (the same
   * touches on a pre-faulted region), in time per operation. */
  for (int i = 0; i < g_ngroups; i++) {
    group_t *g = &g_groups[i];
    if (strcmp(g->mode, "touch") || strcmp(g->impl, "floor") == 0)
      continue;
    const group_t *fl =
        find_group(g->workload, g->kase, "floor", "touch", g->threads, false);
    if (fl == NULL || fl->nruns == 0 || g->nruns == 0)
      continue;
    g->over_floor_ns = op_ns(g) - op_ns(fl);
    g->ratio_floor = op_ns(g) / op_ns(fl);
  }
  describe_machine(&m);
  evaluate_goals();
  write_json(&m);
  write_md(&m);
  write_plots();
  return 0;
}
