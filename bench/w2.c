/* pp_bench: W2, log-uniform sizes with the live set capped. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ==== W2: log-uniform sizes, live set capped =================================
 * Each thread keeps a live set under live / threads bytes: per operation it
 * draws a log-uniform size in [lo, hi], frees random live blocks until the
 * new one fits, allocates it and uses it (pb_use_block). The sequence of sizes
 * and frees depends only on the seed, never on the implementation, so every
 * implementation runs the same operations:
 *   - the fill: operations 0 .. F-1, F being the first operation that needs
 *     a free (the live set has reached the cap: the heap grew until then);
 *   - the steady state: operations F .. F+N-1, N = 10,000 per thread
 *     (quick: 1,000), timed per operation and as a whole, with the page
 *     faults and memory system calls of the phase; its second half (the
 *     "late" half) is reported apart too, to show whether the numbers
 *     still drift.
 * Cases: live set 64 MiB, 256 MiB, 1 GiB, 4 GiB × sizes 4 KiB–4 MiB,
 * 1 MiB–64 MiB, 4 KiB–64 MiB (quick: 64 MiB and 4 KiB–4 MiB only). */

typedef struct w2_case {
  size_t live, lo, hi;
} w2_case_t;

static const w2_case_t w2_cases[] = {
    {64 * MIB, 4 * KIB, 4 * MIB},   {64 * MIB, 1 * MIB, 64 * MIB},
    {64 * MIB, 4 * KIB, 64 * MIB},  {256 * MIB, 4 * KIB, 4 * MIB},
    {256 * MIB, 1 * MIB, 64 * MIB}, {256 * MIB, 4 * KIB, 64 * MIB},
    {1 * GIB, 4 * KIB, 4 * MIB},    {1 * GIB, 1 * MIB, 64 * MIB},
    {1 * GIB, 4 * KIB, 64 * MIB},   {4 * GIB, 4 * KIB, 4 * MIB},
    {4 * GIB, 1 * MIB, 64 * MIB},   {4 * GIB, 4 * KIB, 64 * MIB},
};

/* Quick: the smallest live set and size range only (case 0), with 1,000
 * steady operations per thread: it checks the suite's shape. */
int pb_w2_ncases(void) { return pb_opt.quick ? 1 : 12; }

typedef struct w2_arg {
  size_t cap; /* per thread */
  size_t lo, hi;
  uint64_t steady; /* operations per thread after the fill */
} w2_arg_t;

/* Faults are the process's (pb_minflt_now: getrusage(RUSAGE_SELF)), not
 * the worker's: a pool may fault pages in on helper threads (pinpool
 * populates a large chunk in parallel threads), whose faults the worker's
 * own count would leave out. A phase's count runs from the first thread
 * to start it to the last to end it (W2_F*: each worker's readings). */
enum { W2_F_FILL0 = 7, W2_F_FILL1, W2_F_HALF, W2_F_END };

/* extra[]: 0 fill ops, 1 fill ns, 2 fill faults (unused), 3 late ops,
 * 4 late ns, 5-6 unused, W2_F_*: the process's faults when this thread
 * started and ended the fill, reached the late half, ended. */
static void *w2_thread(worker_t *w) {
  const w2_arg_t *a = w->arg;
  size_t maxlive = a->cap / a->lo + 2;
  lblock_t *live = pb_xmalloc(maxlive * sizeof *live);
  size_t nlive = 0, bytes = 0;
  rng_t r = {0x5eed0002u + (uint64_t)w->idx * 7919u};
  bool steady = false;
  uint64_t i, n_steady = 0, t_fill = 0, t_half = 0;
  pb_samples_init(&w->ns, a->steady);
  pthread_barrier_wait(&pb_barrier); /* start: the fill */
  w->extra[W2_F_FILL0] = (double)pb_minflt_now();
  uint64_t t_fill0 = pb_now_ns();
  for (i = 0;; i++) {
    size_t s = pb_log_uniform(&r, a->lo, a->hi);
    if (!steady && bytes + s > a->cap && nlive > 0) {
      /* Operation F: the fill ends here, for every implementation. */
      t_fill = pb_now_ns() - t_fill0;
      w->extra[W2_F_FILL1] = (double)pb_minflt_now();
      w->extra[0] = (double)i;
      pthread_barrier_wait(&pb_barrier); /* fill done */
      pthread_barrier_wait(&pb_barrier); /* counters taken */
      steady = true;
      w->t_start = pb_now_ns();
    }
    if (steady && n_steady == a->steady / 2) {
      t_half = pb_now_ns();
      w->extra[W2_F_HALF] = (double)pb_minflt_now();
    }
    if (steady && n_steady == a->steady)
      break;
    uint64_t t0 = pb_now_ns();
    while (bytes + s > a->cap && nlive > 0) {
      size_t k = pb_rng_below(&r, nlive);
      pb_im_free(live[k].p, live[k].size, live[k].ctx);
      pb_req_free(w->idx, live[k].size);
      bytes -= live[k].size;
      live[k] = live[--nlive];
    }
    void *ctx = NULL;
    void *p = pb_im_alloc(s, &ctx);
    uint64_t t1 = pb_now_ns();
    pb_req_alloc(w->idx, s);
    live[nlive++] = (lblock_t){p, ctx, s};
    bytes += s;
    if (steady) {
      pb_samples_add(&w->ns, t1 - t0);
      n_steady++;
    }
  }
  w->t_end = pb_now_ns();
  w->extra[W2_F_END] = (double)pb_minflt_now();
  w->ops = n_steady;
  w->extra[1] = (double)t_fill;
  w->extra[3] = (double)(n_steady - a->steady / 2);
  w->extra[4] = (double)(w->t_end - t_half);
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: clean up */
  for (size_t k = 0; k < nlive; k++)
    pb_im_free(live[k].p, live[k].size, live[k].ctx);
  free(live);
  return NULL;
}

void pb_w2_run(int ci) {
  worker_t ws[MAX_THREADS];
  w2_arg_t a;
  char name[96], b1[32], b2[32], b3[32];
  const w2_case_t *wc = &w2_cases[ci];
  memset(ws, 0, sizeof ws);
  a.cap = wc->live / (size_t)pb_opt.threads;
  a.lo = wc->lo;
  a.hi = wc->hi;
  a.steady = pb_opt.quick ? 1000 : 10000;
  snprintf(name, sizeof name, "%s-%s live<=%s",
           pb_size_str(a.lo, b1, sizeof b1), pb_size_str(a.hi, b2, sizeof b2),
           pb_size_str(wc->live, b3, sizeof b3));
  pb_rec_begin("W2", name);
  pb_floor_prepare(a.cap + a.hi, pb_opt.threads);
  pb_start(ws, w2_thread, &a);
  pthread_barrier_wait(&pb_barrier); /* start */
  im_counters_t cf;
  pb_im_get_counters(&cf);
  /* After "fill done": the window is the steady state; the workers free
   * their live sets after it. */
  window_t win;
  pb_measure(ws, 1, &win);

  samples_t all;
  pb_samples_init(&all, 1024);
  uint64_t ops = pb_merge(ws, &all, NULL);
  double fill_ops = 0, fill_ns = 0, late_ops = 0, late_ns = 0;
  double f0 = ws[0].extra[W2_F_FILL0], f1 = ws[0].extra[W2_F_FILL1];
  double fh = ws[0].extra[W2_F_HALF], fe = ws[0].extra[W2_F_END];
  for (int i = 0; i < pb_opt.threads; i++) {
    fill_ops += ws[i].extra[0];
    if (ws[i].extra[1] > fill_ns) /* the threads fill side by side */
      fill_ns = ws[i].extra[1];
    late_ops += ws[i].extra[3];
    if (ws[i].extra[4] > late_ns)
      late_ns = ws[i].extra[4];
    /* The process's counter only grows: the earliest start and the
     * latest end of each phase are the smallest and largest readings. */
    f0 = ws[i].extra[W2_F_FILL0] < f0 ? ws[i].extra[W2_F_FILL0] : f0;
    f1 = ws[i].extra[W2_F_FILL1] > f1 ? ws[i].extra[W2_F_FILL1] : f1;
    fh = ws[i].extra[W2_F_HALF] < fh ? ws[i].extra[W2_F_HALF] : fh;
    fe = ws[i].extra[W2_F_END] > fe ? ws[i].extra[W2_F_END] : fe;
  }
  double fill_flt = f1 - f0, late_flt = fe - fh;
  common_t c =
      pb_window_common(&win, &all, ops, pb_workers_wall(ws, pb_opt.threads));
  pb_rec_common(&c);
  pb_rec_num("live_cap_mib", (double)wc->live / MIB);
  pb_rec_num("steady_ops_per_thread", (double)a.steady);
  pb_rec_num("fill_ops", fill_ops);
  if (fill_ops > 0) {
    pb_rec_num("fill_ops_per_s", fill_ns > 0 ? fill_ops * 1e9 / fill_ns : 0);
    pb_rec_num("fill_minflt_per_op", fill_flt / fill_ops);
  }
  if (cf.calls_known && win.c0.calls_known)
    pb_rec_num("fill_backend_calls",
               (double)(win.c0.backend_calls - cf.backend_calls));
  if (late_ops > 0) {
    pb_rec_num("late_ops_per_s", late_ns > 0 ? late_ops * 1e9 / late_ns : 0);
    pb_rec_num("late_minflt_per_op", late_flt / late_ops);
  }
  pb_rec_end();
  pb_samples_free(&all);
}
