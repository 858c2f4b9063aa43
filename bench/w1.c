/* pp_bench: W1, hot reuse, and W1h, the history's cost on its hot path
 * (docs/benchmarks.md). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudapeer.h"
#include "harness.h"

/* ==== W1: hot reuse =========================================================
 * Each thread allocates and frees one size in a loop. Pairs are timed in
 * groups of k (a group lasts >= 4 us, so the clock's cost is amortized;
 * k = 1 for slow pairs); ns_med is the median of the groups' ns per pair,
 * ns_p99 their 99th percentile. */

static const size_t w1_sizes[] = {4 * KIB, 64 * KIB, 1 * MIB, 64 * MIB,
                                  1 * GIB};

/* Quick: up to 64 MiB with 1 thread, 1 MiB with 2; full: every size (with
 * 2 threads, 2 GiB live in the 1 GiB case). */
int pb_w1_ncases(void) {
  if (!pb_opt.quick)
    return 5;
  return pb_opt.threads > 1 ? 3 : 4;
}

/* W1's use of a block: nothing (alloc mode) or one byte per page (touch
 * mode), as pb_use_block, inlined into the timed loops. */
static inline __attribute__((always_inline)) void w1_use(void *p, size_t size,
                                                         uint64_t i) {
  if (pb_im.touch) {
    volatile unsigned char *b = p;
    for (size_t off = 0; off < size; off += PAGE)
      b[off] = (unsigned char)i;
  }
  pb_sink = p;
}

static void w1_pairs(size_t size, uint64_t n) {
  switch (pb_im.kind) {
  case K_PINPOOL:
    for (uint64_t i = 0; i < n; i++) {
      void *p;
      int rc = pinpool_alloc(pb_im.pool, size, &p);
      if (rc != PINPOOL_OK)
        pb_die_pp("pinpool_alloc", rc);
      w1_use(p, size, i);
      rc = pinpool_free(pb_im.pool, p);
      if (rc != PINPOOL_OK)
        pb_die_pp("pinpool_free", rc);
    }
    break;
  case K_REFPOOL:
    for (uint64_t i = 0; i < n; i++) {
      void *ctx = NULL;
      void *p = refpool_alloc(pb_im.ref, size, &ctx);
      if (p == NULL)
        pb_die("refpool_alloc(%zu) failed%s%s", size, pb_im.cuda ? ": " : "",
               pb_im.cuda ? cudapeer_last_error() : "");
      w1_use(p, size, i);
      refpool_free(pb_im.ref, ctx);
    }
    break;
  case K_RMMPOOL:
    for (uint64_t i = 0; i < n; i++) {
      void *p = rmmpool_alloc(pb_im.rmm, size, 0);
      if (p == NULL)
        pb_die("rmmpool_alloc(%zu) failed", size);
      w1_use(p, size, i);
      rmmpool_free(pb_im.rmm, p, size, 0, false);
    }
    break;
  case K_NAIVE:
  case K_CUHOST:
    for (uint64_t i = 0; i < n; i++) {
      void *p = pb_baseline_alloc(size);
      w1_use(p, size, i);
      pb_baseline_free(p, size);
    }
    break;
  case K_MALLOC:
    for (uint64_t i = 0; i < n; i++) {
      unsigned char *p = malloc(size);
      if (p == NULL)
        pb_die("malloc(%zu) failed", size);
      w1_use(p, size, i);
      free(p);
    }
    break;
  case K_FLOOR:
    for (uint64_t i = 0; i < n; i++)
      w1_use(pb_floor_alloc(size), size, i);
    break;
  }
}

typedef struct w1_arg {
  size_t size;
  double budget_ns;
  uint64_t warm_pairs; /* W1h: untimed pairs first (0 in W1) */
} w1_arg_t;

static void *w1_thread(worker_t *w) {
  const w1_arg_t *a = w->arg;
  uint64_t n = 1, t = 0;
  /* Warm-up (the pool's first miss), then calibrate for ~2 ms, unless the
   * warm-up pair alone took longer than 20 ms (1 GiB without a cache):
   * then a second pair is the estimate. */
  uint64_t tw = pb_now_ns();
  w1_pairs(a->size, 1);
  tw = pb_now_ns() - tw;
  w1_pairs(a->size, a->warm_pairs);
  for (;;) {
    uint64_t t0 = pb_now_ns();
    w1_pairs(a->size, n);
    t = pb_now_ns() - t0;
    if (t >= 2000000 || n >= ((uint64_t)1 << 24) || tw > 20000000)
      break;
    n *= 4;
  }
  double est = (double)t / (double)n;
  if (est < 0.5)
    est = 0.5;
  uint64_t per_rep = (uint64_t)(a->budget_ns / est);
  uint64_t min_pairs = est > 200e6 ? 1 : est > 20e6 ? 2 : 5;
  if (per_rep < min_pairs)
    per_rep = min_pairs;
  if (per_rep > ((uint64_t)1 << 26))
    per_rep = (uint64_t)1 << 26;
  uint64_t group = est >= 4000.0 ? 1 : (uint64_t)(4000.0 / est) + 1;
  if (group > per_rep)
    group = per_rep;
  uint64_t groups = per_rep / group;
  pb_samples_init(&w->ns, groups);
  pthread_barrier_wait(&pb_barrier); /* calibrated */
  pthread_barrier_wait(&pb_barrier); /* counters taken: go */
  w->t_start = pb_now_ns();
  for (uint64_t g = 0; g < groups; g++) {
    uint64_t t0 = pb_now_ns();
    w1_pairs(a->size, group);
    pb_samples_add(&w->ns, (pb_now_ns() - t0 + group / 2) / group);
  }
  w->t_end = pb_now_ns();
  w->ops = groups * group;
  w->extra[0] = (double)group;
  pthread_barrier_wait(&pb_barrier); /* timed pairs done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: exit */
  return NULL;
}

/* W1 and W1h (the same pairs with history on) share the measurement. */
static void w1_measure(const char *workload, int ci) {
  worker_t ws[MAX_THREADS];
  char sz[32];
  /* W1h: the history ring is mmap'ed and its pages are faulted in as it is
   * first written; wrapping it once before the timing (2 events per pair,
   * 100,000 entries) measures the steady state. History off runs the same
   * pairs, so every W1h implementation follows one protocol. */
  w1_arg_t a = {w1_sizes[ci], pb_opt.quick ? 10e6 : 60e6,
                strcmp(workload, "W1h") == 0 ? 51000 : 0};
  memset(ws, 0, sizeof ws);
  pb_size_str(a.size, sz, sizeof sz);
  pb_rec_begin(workload, sz);
  pb_floor_prepare(a.size, pb_opt.threads); /* the block, reused */
  pb_start(ws, w1_thread, &a);
  /* The counters' window is the timed pairs exactly: no calibration pair
   * in it, none left out. */
  window_t win;
  pb_measure(ws, 1, &win);

  samples_t all;
  pb_samples_init(&all, 1024);
  uint64_t ops = pb_merge(ws, &all, NULL);
  for (int i = 0; i < pb_opt.threads; i++)
    pb_req[i].peak_seen = a.size * (uint64_t)pb_opt.threads;
  common_t c =
      pb_window_common(&win, &all, ops, pb_workers_wall(ws, pb_opt.threads));
  pb_rec_common(&c);
  pb_rec_num("size", (double)a.size);
  pb_rec_num("pairs_per_sample", ws[0].extra[0]);
  if (pb_im.kind == K_PINPOOL) {
    pinpool_stats_t s;
    pinpool_get_stats(pb_im.pool, &s);
    uint64_t allocs = s.cache_hits + s.cache_misses;
    pb_rec_num("tcache_hit_pct",
               allocs ? 100.0 * (double)s.tcache_hits / (double)allocs : 0.0);
  }
  pb_rec_end();
  pb_samples_free(&all);
}

void pb_w1_run(int ci) { w1_measure("W1", ci); }

/* ==== W1h: the history's cost on the hot path ================================
 * W1's cached pair (4 KiB, 64 KiB, 1 MiB; one thread) with history off
 * (impl "pinpool") and on at three levels (impls pinpool-h-*, see
 * g_hist_variants). The variants differ from "pinpool" only by the
 * pinpool_record_history call after create, so time ÷ pinpool is the cost
 * of recording; with level alloc or all each pair records two events. */

int pb_w1h_ncases(void) { return 3; }

void pb_w1h_run(int ci) { w1_measure("W1h", ci); }
