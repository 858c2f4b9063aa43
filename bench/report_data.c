/*
 * pp_report's model of a run (report_data.h): the raw records parsed and merged
 * into groups, and the questions the outputs ask of them. It calls W9's
 * part (report_w9.c) for W9's lines and the support layer; no output.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "report_data.h"

pr_options_t pr_opt;
pr_cost_t pr_cost[32];
int pr_ncost;

pr_group_t *pr_groups;
int pr_ngroups;
static int g_capgroups;
pr_failure_t *pr_fail;
int pr_nfail;
static int g_capfail;

/* ---- Parsing ------------------------------------------------------------- */

pr_group_t *pr_find_group(const char *wl, const char *kase, const char *impl,
                          const char *mode, int threads, bool create) {
  for (int i = 0; i < pr_ngroups; i++) {
    pr_group_t *g = &pr_groups[i];
    if (g->threads == threads && strcmp(g->workload, wl) == 0 &&
        strcmp(g->kase, kase) == 0 && strcmp(g->impl, impl) == 0 &&
        strcmp(g->mode, mode) == 0)
      return g;
  }
  if (!create)
    return NULL;
  if (pr_ngroups == g_capgroups) {
    g_capgroups = g_capgroups ? g_capgroups * 2 : 64;
    pr_groups = pr_xrealloc(pr_groups, (size_t)g_capgroups * sizeof *pr_groups);
  }
  pr_group_t *g = &pr_groups[pr_ngroups++];
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
  if (pr_nfail == g_capfail) {
    g_capfail = g_capfail ? g_capfail * 2 : 8;
    pr_fail = pr_xrealloc(pr_fail, (size_t)g_capfail * sizeof *pr_fail);
  }
  snprintf(pr_fail[pr_nfail++].text, sizeof pr_fail[0].text, "%s", text);
}

void pr_parse_raw(const char *path) {
  FILE *f = fopen(path, "r");
  char line[8192];
  char *fld[80];
  if (f == NULL)
    pr_die("cannot read %s: %s", path, strerror(errno));
  while (fgets(line, sizeof line, f) != NULL) {
    int n = split_tabs(line, fld, 80);
    if (pr_w9_parse(fld, n))
      continue;
    if (n >= 8 && strcmp(fld[0], "R") == 0) {
      pr_group_t *g =
          pr_find_group(fld[1], fld[2], fld[3], fld[4], atoi(fld[5]), true);
      snprintf(g->config, sizeof g->config, "%s", fld[7]);
      if (g->nruns == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 8;
        g->runs = pr_xrealloc(g->runs, (size_t)g->cap * sizeof *g->runs);
      }
      pr_run_t *r = &g->runs[g->nruns++];
      r->n = 0;
      for (int i = 8; i < n && r->n < PR_MAX_METRICS; i++) {
        char *eq = strchr(fld[i], '=');
        if (eq == NULL)
          continue;
        *eq = '\0';
        snprintf(r->m[r->n].key, sizeof r->m[0].key, "%s", fld[i]);
        r->m[r->n].v = strtod(eq + 1, NULL);
        r->n++;
      }
    } else if (n >= 7 && strcmp(fld[0], "N") == 0) {
      pr_group_t *g =
          pr_find_group(fld[1], fld[2], fld[3], fld[4], atoi(fld[5]), true);
      bool dup = false;
      for (int i = 0; i < g->nnotes; i++)
        dup = dup || strcmp(g->notes[i], fld[6]) == 0;
      if (!dup && g->nnotes < PR_MAX_NOTES)
        snprintf(g->notes[g->nnotes++], sizeof g->notes[0], "%s", fld[6]);
    } else if (n >= 9 && strcmp(fld[0], "T") == 0) {
      int t = atoi(fld[6]), k;
      for (k = 0; k < pr_ncost; k++)
        if (pr_cost[k].threads == t && strcmp(pr_cost[k].workload, fld[1]) == 0)
          break;
      if (k == pr_ncost && pr_ncost < 32) {
        snprintf(pr_cost[k].workload, sizeof pr_cost[k].workload, "%s", fld[1]);
        pr_cost[k].threads = t;
        pr_ncost++;
      }
      if (k < pr_ncost) {
        pr_cost[k].runs++;
        pr_cost[k].seconds += strtod(fld[8], NULL) / 1e6;
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

double pr_get(const pr_group_t *g, const char *key) {
  if (g == NULL)
    return NAN;
  for (int i = 0; i < g->nagg; i++)
    if (strcmp(g->agg[i].key, key) == 0)
      return g->agg[i].v;
  return NAN;
}

static void aggregate(pr_group_t *g) {
  double vals[256];
  g->nagg = 0;
  for (int r = 0; r < g->nruns; r++) {
    for (int k = 0; k < g->runs[r].n; k++) {
      const char *key = g->runs[r].m[k].key;
      bool seen = false;
      for (int j = 0; j < g->nagg && !seen; j++)
        seen = strcmp(g->agg[j].key, key) == 0;
      if (seen || g->nagg == PR_MAX_METRICS)
        continue;
      int nv = 0;
      for (int r2 = 0; r2 < g->nruns && nv < 256; r2++)
        for (int k2 = 0; k2 < g->runs[r2].n; k2++)
          if (strcmp(g->runs[r2].m[k2].key, key) == 0)
            vals[nv++] = g->runs[r2].m[k2].v;
      qsort(vals, (size_t)nv, sizeof vals[0], pr_cmp_double);
      double med =
          nv % 2 ? vals[nv / 2] : (vals[nv / 2 - 1] + vals[nv / 2]) / 2.0;
      snprintf(g->agg[g->nagg].key, sizeof g->agg[0].key, "%s", key);
      g->agg[g->nagg].v = med;
      g->nagg++;
    }
  }
}

/* Ratios are like for like: pinpool in the same mode. */
static const pr_group_t *baseline(const pr_group_t *g) {
  return pr_find_group(g->workload, g->kase, "pinpool", g->mode, g->threads,
                       false);
}

/* The per-operation time that "ahead" compares: W4's ops/s is set by the
 * simulated streams, so its allocator cost per op is the fair measure. */
double pr_speed(const pr_group_t *g) {
  if (g == NULL)
    return NAN;
  if (strcmp(g->workload, "W4") == 0) {
    double ns = pr_get(g, "ns_mean");
    return ns > 0 ? 1e9 / ns : NAN;
  }
  return pr_get(g, "ops_per_s");
}

/* The time one operation takes (1 / speed), in ns. */
double pr_op_ns(const pr_group_t *g) {
  double v = pr_speed(g);
  return v > 0 ? 1e9 / v : NAN;
}

/* Rows: touch mode first (the headline), then alloc; the floor first. */
static int impl_rank(const pr_group_t *g) {
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

static int case_order(const pr_group_t *a) {
  /* Cases in first-appearance order within a workload. */
  for (int i = 0; i < pr_ngroups; i++)
    if (strcmp(pr_groups[i].workload, a->workload) == 0 &&
        strcmp(pr_groups[i].kase, a->kase) == 0)
      return i;
  return 0;
}

/* Sort by a key computed before sorting (case_order needs the original
 * order, so compute it first into a parallel array). */
typedef struct sortable {
  pr_group_t g;
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
  size_t n = pr_ngroups > 0 ? (size_t)pr_ngroups : 0;
  sortable_t *s = calloc(n + 1, sizeof *s);
  if (s == NULL)
    pr_die("out of memory");
  for (int i = 0; i < pr_ngroups; i++) {
    s[i].g = pr_groups[i];
    s[i].corder = case_order(&pr_groups[i]);
  }
  qsort(s, n, sizeof *s, cmp_sortable);
  for (int i = 0; i < pr_ngroups; i++)
    pr_groups[i] = s[i].g;
  free(s);
}

/* Touch mode: the headline comparison (every implementation writes every
 * page of its blocks); alloc mode is like for like too, and reported. */
bool pr_fair(const pr_group_t *g) { return strcmp(g->mode, "touch") == 0; }

bool pr_is_pinpool(const pr_group_t *g) {
  return strncmp(g->impl, "pinpool", 7) == 0;
}

/* A peer pinpool is compared with: not pinpool, not the floor. */
static bool is_peer(const pr_group_t *g) {
  return !pr_is_pinpool(g) && strcmp(g->impl, "floor") != 0;
}

/* W1h and W8 measure pinpool alone: they have their own tables and goals
 * and stay out of the comparisons with the peers. */
bool pr_pinpool_only_wl(const char *wl) {
  return strcmp(wl, "W1h") == 0 || strcmp(wl, "W8") == 0;
}

bool pr_have_workload(const char *wl) {
  for (int i = 0; i < pr_ngroups; i++)
    if (strcmp(pr_groups[i].workload, wl) == 0 && pr_groups[i].nruns > 0)
      return true;
  return false;
}

void pr_merge(void) {
  pr_w9_aggregate();
  for (int i = 0; i < pr_ngroups; i++)
    aggregate(&pr_groups[i]);
  sort_groups();
  for (int i = 0; i < pr_ngroups; i++) {
    pr_group_t *g = &pr_groups[i];
    const pr_group_t *b = baseline(g);
    if (b == NULL)
      continue;
    g->ratio_ns = pr_get(g, "ns_med") / pr_get(b, "ns_med");
    g->ratio_ops = pr_get(g, "ops_per_s") / pr_get(b, "ops_per_s");
  }
  /* Touch mode: each implementation's distance to the floor (the same
   * touches on a pre-faulted region), in time per operation. */
  for (int i = 0; i < pr_ngroups; i++) {
    pr_group_t *g = &pr_groups[i];
    if (strcmp(g->mode, "touch") || strcmp(g->impl, "floor") == 0)
      continue;
    const pr_group_t *fl = pr_find_group(g->workload, g->kase, "floor", "touch",
                                         g->threads, false);
    if (fl == NULL || fl->nruns == 0 || g->nruns == 0)
      continue;
    g->over_floor_ns = pr_op_ns(g) - pr_op_ns(fl);
    g->ratio_floor = pr_op_ns(g) / pr_op_ns(fl);
  }
}

/* ---- Questions the outputs ask ------------------------------------------ */

const char *pr_label(const pr_group_t *g, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s", g->impl, g->mode);
  return buf;
}

/* The fastest peer of pinpool group p (same workload, case, threads and
 * mode); NULL if none. */
const pr_group_t *pr_best_peer(const pr_group_t *p) {
  const pr_group_t *best = NULL;
  for (int j = 0; j < pr_ngroups; j++) {
    const pr_group_t *q = &pr_groups[j];
    if (strcmp(q->workload, p->workload) || q->threads != p->threads ||
        strcmp(q->kase, p->kase) || strcmp(q->mode, p->mode) || !is_peer(q) ||
        q->nruns == 0)
      continue;
    if (isfinite(pr_speed(q)) && (best == NULL || pr_speed(q) > pr_speed(best)))
      best = q;
  }
  return best;
}

const pr_hlevel_t pr_hlevels[4] = {{"pinpool", "off"},
                                   {"pinpool-h-alloc", "alloc, no stacks"},
                                   {"pinpool-h-all", "all, no stacks"},
                                   {"pinpool-h-all16", "all, 16-frame stacks"}};

/* ns per history event of group g: its pair minus the history-off pair,
 * over the two events (alloc, free) a pair records. */
double pr_ns_per_event(const pr_group_t *g) {
  const pr_group_t *off = baseline(g);
  if (off == NULL || off == g)
    return NAN;
  return (pr_get(g, "ns_med") - pr_get(off, "ns_med")) / 2.0;
}

/* ---- Machine ------------------------------------------------------------- */

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

void pr_describe_machine(pr_machine_t *m) {
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
