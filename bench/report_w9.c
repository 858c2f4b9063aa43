/*
 * pp_report's W9 part (report_w9.h). A case is (workers, batch MiB, fill);
 * each case has two paths, lend (pinpool's shared pool) and copy (today's
 * path), and every metric of a path is the median over its runs (the runs
 * of the two paths are interleaved by bench/run.sh, so they share the
 * machine's noise). Kept apart from report.c, which is about pp_bench's
 * workloads and their peers.
 */
#include "report_w9.h"
#include "report_support.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define W9_MAX_CASES 32
#define W9_MAX_RUNS 64

enum { LEND, COPY, NPATH };

/* The metrics of a W9 line; EXCL is derived per run (main - consume): the
 * main process's CPU without the consumer stand-in, which a device's DMA
 * copy would not spend. */
enum {
  M_PER_S,
  M_COPIED,
  M_HELD,
  M_LOCKED,
  M_CPU,
  M_CONSUME,
  M_MLOCKFAIL,
  M_EXCL,
  NMET
};
static const char *const MET_KEY[NMET] = {
    "batches_per_s",         "copied_bytes_per_batch",
    "memory_held_mib",       "locked_mib",
    "main_cpu_ms_per_batch", "consume_cpu_ms_per_batch",
    "mlock_failures",        "main_cpu_ms_per_batch_excl_consume"};

typedef struct side {
  double run[W9_MAX_RUNS][NMET];
  int nruns;
  double med[NMET];
  double max_copied; /* the zero-copy goal holds in every run, not a median */
} side_t;

typedef struct w9case {
  int workers, batch_mib;
  char fill[8];
  side_t p[NPATH];
  double speed_ratio, cpu_ratio, excl_ratio; /* lend ÷ copy; NAN without both */
} w9case_t;

static w9case_t g_case[W9_MAX_CASES];
static int g_ncase;
static int g_nfailed; /* W9 runs that failed (F lines) */

static w9case_t *find_case(int workers, int batch_mib, const char *fill) {
  for (int i = 0; i < g_ncase; i++)
    if (g_case[i].workers == workers && g_case[i].batch_mib == batch_mib &&
        strcmp(g_case[i].fill, fill) == 0)
      return &g_case[i];
  if (g_ncase == W9_MAX_CASES)
    return NULL;
  w9case_t *c = &g_case[g_ncase++];
  memset(c, 0, sizeof *c);
  c->workers = workers;
  c->batch_mib = batch_mib;
  snprintf(c->fill, sizeof c->fill, "%s", fill);
  return c;
}

bool pr_w9_parse(char **fld, int n) {
  if (n >= 2 && strcmp(fld[0], "F") == 0 && strncmp(fld[1], "W9 ", 3) == 0) {
    g_nfailed++;
    return false;
  }
  if (n < 6 || strcmp(fld[0], "W9") != 0)
    return false;
  int path = strcmp(fld[1], "lend") == 0   ? LEND
             : strcmp(fld[1], "copy") == 0 ? COPY
                                           : -1;
  w9case_t *c = find_case(atoi(fld[2]), atoi(fld[3]), fld[4]);
  if (path < 0 || c == NULL || c->p[path].nruns == W9_MAX_RUNS)
    return true;
  side_t *s = &c->p[path];
  double *r = s->run[s->nruns++];
  for (int m = 0; m < NMET; m++)
    r[m] = NAN;
  for (int i = 5; i < n; i++) {
    const char *eq = strchr(fld[i], '=');
    if (eq == NULL)
      continue;
    for (int m = 0; m < NMET; m++)
      if (strlen(MET_KEY[m]) == (size_t)(eq - fld[i]) &&
          strncmp(fld[i], MET_KEY[m], (size_t)(eq - fld[i])) == 0)
        r[m] = strtod(eq + 1, NULL);
  }
  r[M_EXCL] = r[M_CPU] - r[M_CONSUME];
  return true;
}

static double median(double *v, int n) {
  if (n == 0)
    return NAN;
  qsort(v, (size_t)n, sizeof v[0], pr_cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

/* Cases by batch, then fill (mem first), then workers: the order of
 * docs/benchmarks.md's W9 tables. */
static int cmp_case(const void *pa, const void *pb) {
  const w9case_t *a = pa, *b = pb;
  if (a->batch_mib != b->batch_mib)
    return a->batch_mib - b->batch_mib;
  int f = strcmp(b->fill, a->fill); /* "mem" before "cpu" */
  if (f != 0)
    return f;
  return a->workers - b->workers;
}

void pr_w9_aggregate(void) {
  qsort(g_case, (size_t)g_ncase, sizeof g_case[0], cmp_case);
  for (int i = 0; i < g_ncase; i++) {
    w9case_t *c = &g_case[i];
    for (int p = 0; p < NPATH; p++) {
      side_t *s = &c->p[p];
      double v[W9_MAX_RUNS];
      s->max_copied = NAN;
      for (int m = 0; m < NMET; m++) {
        int nv = 0;
        for (int r = 0; r < s->nruns; r++)
          if (isfinite(s->run[r][m]))
            v[nv++] = s->run[r][m];
        s->med[m] = median(v, nv);
        if (m == M_COPIED && nv > 0)
          s->max_copied = v[nv - 1]; /* sorted by median() */
      }
    }
    const double *l = c->p[LEND].med, *k = c->p[COPY].med;
    c->speed_ratio = l[M_PER_S] / k[M_PER_S];
    c->cpu_ratio = l[M_CPU] / k[M_CPU];
    c->excl_ratio = l[M_EXCL] / k[M_EXCL];
  }
}

bool pr_w9_have(void) {
  for (int i = 0; i < g_ncase; i++)
    if (g_case[i].p[LEND].nruns || g_case[i].p[COPY].nruns)
      return true;
  return false;
}

const char *pr_w9_unavailable(void) {
  if (pr_w9_have())
    return NULL;
  return g_nfailed ? "every W9 run failed (listed under failures)"
                   : "not run (bench/run.sh --workloads without W9)";
}

/* ---- Goals --------------------------------------------------------------- */

static bool both(const w9case_t *c) {
  return c->p[LEND].nruns > 0 && c->p[COPY].nruns > 0;
}

/* Zero host copies: lend's copied bytes are 0 in every run of every case. */
static void goal_zero_copy(void) {
  pr_goal_t *g = pr_goal_new(
      "W9: zero host copies between the worker's fill and the pinned "
      "buffer (lend path, every case)");
  int ok = 0, n = 0;
  double copy_lo = INFINITY, copy_hi = -INFINITY;
  for (int i = 0; i < g_ncase; i++) {
    const w9case_t *c = &g_case[i];
    if (c->p[LEND].nruns > 0) {
      n++;
      ok += c->p[LEND].max_copied == 0;
    }
    if (c->p[COPY].nruns > 0) {
      double mib = c->p[COPY].med[M_COPIED] / 1048576.0;
      copy_lo = fmin(copy_lo, mib);
      copy_hi = fmax(copy_hi, mib);
    }
  }
  pr_goal_count_status(g, ok, n);
  if (n == 0) {
    pr_goal_add(g, "W9 not run");
    return;
  }
  pr_goal_add(g, "lend: 0 bytes copied per batch in %d of %d cases (every run)",
              ok, n);
  if (isfinite(copy_lo) && copy_lo == copy_hi)
    pr_goal_add(g, "; today's path copies the whole batch: %.0f MiB per batch",
                copy_lo);
  else if (isfinite(copy_lo))
    pr_goal_add(
        g, "; today's path copies the whole batch: %.0f–%.0f MiB per batch",
        copy_lo, copy_hi);
}

/* >= 1.5x today's batches/s at 64 MiB with 2 workers, each fill. */
static void goal_speed(void) {
  pr_goal_t *g = pr_goal_new(
      "W9: lend >= 1.5x the batches/s of today's path at 64 MiB with 2 "
      "workers");
  int ok = 0, n = 0;
  for (int i = 0; i < g_ncase; i++) {
    const w9case_t *c = &g_case[i];
    if (c->batch_mib != 64 || c->workers != 2 || !both(c))
      continue;
    n++;
    ok += c->speed_ratio >= 1.5;
    pr_goal_add(g, "%s%s fill: %.2fx (lend %.1f vs copy %.1f batches/s)%s",
                g->detail[0] ? "; " : "", c->fill, c->speed_ratio,
                c->p[LEND].med[M_PER_S], c->p[COPY].med[M_PER_S],
                c->speed_ratio >= 1.5 ? "" : " — missed");
  }
  pr_goal_count_status(g, ok, n);
  if (n == 0)
    pr_goal_add(g, "no 64 MiB, 2-worker case with both paths in this run%s",
                pr_w9_have() ? " (a quick run's batches are smaller)"
                             : " (W9 not run)");
}

/* Main-process CPU per batch <= 1/4 of today's: the literal measure sets
 * the status; the measure without the consumer stand-in (the checksum both
 * paths run on the CPU, where a device would copy by DMA) is reported
 * beside it, since it is what lending itself costs the main process. */
static void goal_cpu(void) {
  pr_goal_t *g =
      pr_goal_new("W9: main-process CPU per batch <= 1/4 of today's path");
  int ok = 0, n = 0, ok_x = 0;
  double lo = INFINITY, hi = -INFINITY, lo_x = INFINITY, hi_x = -INFINITY;
  double lend_lo = INFINITY, lend_hi = -INFINITY;
  double copy_lo = INFINITY, copy_hi = -INFINITY;
  for (int i = 0; i < g_ncase; i++) {
    const w9case_t *c = &g_case[i];
    if (!both(c))
      continue;
    n++;
    ok += c->cpu_ratio <= 0.25;
    ok_x += c->excl_ratio <= 0.25;
    lo = fmin(lo, c->cpu_ratio);
    hi = fmax(hi, c->cpu_ratio);
    lo_x = fmin(lo_x, c->excl_ratio);
    hi_x = fmax(hi_x, c->excl_ratio);
    lend_lo = fmin(lend_lo, c->p[LEND].med[M_EXCL]);
    lend_hi = fmax(lend_hi, c->p[LEND].med[M_EXCL]);
    copy_lo = fmin(copy_lo, c->p[COPY].med[M_EXCL]);
    copy_hi = fmax(copy_hi, c->p[COPY].med[M_EXCL]);
  }
  pr_goal_count_status(g, ok, n);
  if (n == 0) {
    pr_goal_add(g, "W9 not run");
    return;
  }
  pr_goal_add(
      g,
      "literal measure (getrusage of the main process, which includes the "
      "checksum standing in for the device copy in both paths): lend ÷ copy "
      "%.2f–%.2f, %d of %d cases <= 0.25. Without the consumer stand-in "
      "(what a device's DMA copy would leave: lending, returning, sending "
      "against copying the batch): %.3f–%.3f, %d of %d cases <= 0.25 "
      "(lend %.3f–%.3f ms per batch, copy %.2f–%.2f ms). Status from the "
      "literal measure",
      lo, hi, ok, n, lo_x, hi_x, ok_x, n, lend_lo, lend_hi, copy_lo, copy_hi);
}

void pr_w9_goals(void) {
  goal_zero_copy();
  goal_speed();
  goal_cpu();
}

/* ---- JSON ---------------------------------------------------------------- */

static void json_side(FILE *f, const side_t *s) {
  if (s->nruns == 0) {
    fputs("null", f);
    return;
  }
  fprintf(f, "{\"reps\": %d", s->nruns);
  for (int m = 0; m < NMET; m++) {
    fprintf(f, ", \"%s\": ", MET_KEY[m]);
    pr_json_num(f, s->med[m]);
  }
  fputs("}", f);
}

void pr_w9_write_json(FILE *f) {
  fputs("\"w9\": [", f);
  for (int i = 0; i < g_ncase; i++) {
    const w9case_t *c = &g_case[i];
    fprintf(f,
            "%s\n    {\"workers\": %d, \"batch_mib\": %d, \"fill\": \"%s\","
            "\n     \"lend\": ",
            i ? "," : "", c->workers, c->batch_mib, c->fill);
    json_side(f, &c->p[LEND]);
    fputs(",\n     \"copy\": ", f);
    json_side(f, &c->p[COPY]);
    fputs(",\n     \"speed_ratio\": ", f);
    pr_json_num(f, c->speed_ratio);
    fputs(", \"cpu_ratio\": ", f);
    pr_json_num(f, c->cpu_ratio);
    fputs(", \"cpu_ratio_excl_consume\": ", f);
    pr_json_num(f, c->excl_ratio);
    fputs("}", f);
  }
  fputs(g_ncase ? "\n  ]" : "]", f);
}

/* ---- Markdown ------------------------------------------------------------ */

static void cell(FILE *f, double v, const char *fmt) {
  if (isfinite(v))
    fprintf(f, fmt, v);
  else
    fputs("–", f);
  fputs(" | ", f);
}

void pr_w9_write_md(FILE *f) {
  fprintf(f, "## W9 lending batches to worker processes (issue 22)\n\n"
             "`bench/w9.c`. Worker processes fill batches (`mem`: at memory "
             "speed; `cpu`: per-batch CPU work), 2 in flight per worker; the "
             "main process consumes each (a checksum of every word, standing "
             "in for the device copy) and gives it back. **lend**: pinpool "
             "`shared=1,mlock=1`, the batch lent to the worker, filled in "
             "place (no host copy). **copy** (today's path, DataLoader with "
             "`pin_memory=True`): the worker fills its shared-memory slot, the "
             "main process copies it into a locked buffer. Medians over `reps` "
             "runs (one process each, the two paths interleaved). CPU = the "
             "main process's (user + system) per batch; consumer = the "
             "checksum's share of it; excl. = CPU minus consumer. Ratios: lend "
             "÷ copy (speed > 1 and CPU < 1 favour lend). Held / locked: the "
             "main process's shared and pinned MiB.\n\n");
  const char *why = pr_w9_unavailable();
  if (why != NULL) {
    fprintf(f, "W9: %s.\n\n", why);
    return;
  }
  fprintf(f, "| workers | batch MiB | fill | path | batches/s | copied MiB "
             "/ batch | held MiB | locked MiB | CPU ms / batch | consumer "
             "ms | excl. ms | speed ÷ copy | CPU ÷ copy | excl. ÷ copy | "
             "reps |\n"
             "|--:|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
             "\n");
  bool unlocked = false;
  for (int i = 0; i < g_ncase; i++) {
    const w9case_t *c = &g_case[i];
    for (int p = 0; p < NPATH; p++) {
      const side_t *s = &c->p[p];
      const double *m = s->med;
      fprintf(f, "| %d | %d | %s | %s | ", c->workers, c->batch_mib, c->fill,
              p == LEND ? "**lend**" : "copy");
      if (s->nruns == 0) {
        fprintf(f, "no run | | | | | | | | | | |\n");
        continue;
      }
      cell(f, m[M_PER_S], "%.1f");
      cell(f, m[M_COPIED] / 1048576.0, "%.0f");
      cell(f, m[M_HELD], "%.0f");
      cell(f, m[M_LOCKED], "%.0f");
      cell(f, m[M_CPU], "%.2f");
      cell(f, m[M_CONSUME], "%.2f");
      cell(f, m[M_EXCL], "%.3f");
      if (p == LEND) {
        cell(f, c->speed_ratio, "%.2f×");
        cell(f, c->cpu_ratio, "%.2f");
        cell(f, c->excl_ratio, "%.3f");
      } else {
        fputs(" | | | ", f);
      }
      fprintf(f, "%d |\n", s->nruns);
      unlocked = unlocked || m[M_MLOCKFAIL] > 0 ||
                 (p == LEND && m[M_LOCKED] < m[M_HELD]);
    }
  }
  fprintf(f, "\n");
  if (unlocked)
    fprintf(f, "Not every pinned byte was locked in some runs (mlock is best "
               "effort in both paths: RLIMIT_MEMLOCK, without root): the "
               "`locked MiB` column says how much was.\n\n");
}
