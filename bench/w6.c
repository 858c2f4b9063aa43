/* pp_bench: W6, backend churn. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ==== W6: backend churn ======================================================
 * Large blocks (256 MiB - 1 GiB; quick: 16 - 64 MiB) in a cycle, two live
 * at a time; pinpool's cache is capped below the working set
 * (max_cached=512MiB; quick: 32MiB), so most requests reach the backend.
 * With 2 threads each cycles through half the sizes (the working set and
 * the cap stay those of 1 thread), starting at different points of the
 * cycle. Reported: ms per GiB to acquire (allocate + use) and to release. */

typedef struct w6_arg {
  const size_t *sizes; /* 4 */
  size_t div;          /* sizes / threads */
  unsigned nops;
} w6_arg_t;

static void *w6_thread(worker_t *w) {
  const w6_arg_t *a = w->arg;
  lblock_t live[2];
  unsigned nlive = 0;
  double acq_ns = 0, rel_ns = 0, gib_acq = 0, gib_rel = 0;
  pb_samples_init(&w->ns, a->nops);
  pb_samples_init(&w->ns2, a->nops);
  pthread_barrier_wait(&pb_barrier); /* ready */
  pthread_barrier_wait(&pb_barrier); /* counters taken: go */
  w->t_start = pb_now_ns();
  for (unsigned i = 0; i < a->nops; i++) {
    size_t s = a->sizes[(i + 2 * (unsigned)w->idx) % 4] / a->div;
    void *ctx = NULL;
    uint64_t t0 = pb_now_ns();
    void *p = pb_im_alloc(s, &ctx);
    uint64_t t1 = pb_now_ns();
    pb_req_alloc(w->idx, s);
    pb_req_sample(w->idx);
    pb_samples_add(&w->ns, t1 - t0);
    acq_ns += (double)(t1 - t0);
    gib_acq += (double)s / (double)GIB;
    if (nlive == 2) {
      uint64_t t2 = pb_now_ns();
      pb_im_free(live[0].p, live[0].size, live[0].ctx);
      uint64_t t3 = pb_now_ns();
      pb_req_free(w->idx, live[0].size);
      pb_samples_add(&w->ns2, t3 - t2);
      rel_ns += (double)(t3 - t2);
      gib_rel += (double)live[0].size / (double)GIB;
      live[0] = live[1];
      nlive = 1;
    }
    live[nlive++] = (lblock_t){p, ctx, s};
  }
  w->t_end = pb_now_ns();
  w->ops = a->nops;
  w->extra[0] = acq_ns;
  w->extra[1] = rel_ns;
  w->extra[2] = gib_acq;
  w->extra[3] = gib_rel;
  pthread_barrier_wait(&pb_barrier); /* done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: clean up */
  for (unsigned k = 0; k < nlive; k++)
    pb_im_free(live[k].p, live[k].size, live[k].ctx);
  return NULL;
}

void pb_w6_run(int ci) {
  (void)ci;
  static const size_t full_sizes[] = {256 * MIB, 512 * MIB, 768 * MIB,
                                      1024 * MIB};
  static const size_t quick_sizes[] = {16 * MIB, 32 * MIB, 48 * MIB, 64 * MIB};
  worker_t ws[MAX_THREADS];
  w6_arg_t a = {pb_opt.quick ? quick_sizes : full_sizes, (size_t)pb_opt.threads,
                4};
  memset(ws, 0, sizeof ws);
  pb_rec_begin("W6", pb_opt.quick ? "16-64MiB cycle, 2 live, cap 32MiB"
                                  : "256MiB-1GiB cycle, 2 live, cap 512MiB");
  pb_floor_prepare(3 * a.sizes[3] / a.div, pb_opt.threads);
  pb_start(ws, w6_thread, &a);
  window_t win;
  pb_measure(ws, 1, &win);
  samples_t acq, rel;
  pb_samples_init(&acq, 16);
  pb_samples_init(&rel, 16);
  uint64_t ops = pb_merge(ws, &acq, &rel);
  double acq_ns = 0, rel_ns = 0, gib_acq = 0, gib_rel = 0;
  for (int i = 0; i < pb_opt.threads; i++) {
    acq_ns += ws[i].extra[0];
    rel_ns += ws[i].extra[1];
    gib_acq += ws[i].extra[2];
    gib_rel += ws[i].extra[3];
  }
  uint64_t wall = pb_workers_wall(ws, pb_opt.threads);
  common_t c = pb_window_common(&win, &acq, ops, wall);
  pb_rec_common(&c);
  pb_rec_num("acquire_ms_per_gib", gib_acq > 0 ? acq_ns / 1e6 / gib_acq : 0);
  pb_rec_num("release_ms_per_gib", gib_rel > 0 ? rel_ns / 1e6 / gib_rel : 0);
  pb_rec_num("gib_per_s", wall > 0 ? gib_acq / ((double)wall / 1e9) : 0);
  pb_rec_end();
  pb_samples_free(&acq);
  pb_samples_free(&rel);
}
