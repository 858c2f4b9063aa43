/* pp_bench: W3, data-loader batches. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ==== W3: data-loader batches ================================================
 * The producer allocates a batch (uint8 256x3x224x224 at depth 2 and 4, fp32
 * at depth 2; quick: uint8 256x3x112x112) and, in touch mode, writes every
 * page, and queues it; the
 * consumer takes the oldest and frees it; at most `depth` batches are
 * queued. One thread: both roles in turn. Two threads: producer and
 * consumer on their own CPUs (cross-thread frees). The producer decides
 * when the measured phase ends; the consumer drains the queue. */

typedef struct w3_arg {
  size_t size;
  unsigned depth;
  uint64_t warm;
  span_t span;
  lblock_t ring[8]; /* SPSC ring (two threads) */
  spsc_t q;
} w3_arg_t;

/* One batch, allocated and used; the allocation timed past the warm-up. */
static lblock_t w3_alloc(worker_t *w, const w3_arg_t *a, uint64_t i,
                         uint64_t *t1) {
  void *ctx = NULL;
  uint64_t t0 = pb_now_ns();
  void *p = pb_im_alloc(a->size, &ctx);
  *t1 = pb_now_ns();
  pb_req_alloc(0, a->size);
  if (i >= a->warm)
    pb_samples_add(&w->ns, *t1 - t0);
  return (lblock_t){p, ctx, a->size};
}

static void *w3_single(worker_t *w) {
  w3_arg_t *a = w->arg;
  lblock_t q[8];
  unsigned qh = 0, qn = 0;
  uint64_t i, t1 = 0;
  pb_samples_init(&w->ns, a->span.min_ops * 2);
  pb_samples_init(&w->ns2, a->span.min_ops * 2);
  pthread_barrier_wait(&pb_barrier);
  for (i = 0;; i++) {
    if (pb_phase_over(w, i, a->warm, 1, &a->span, &t1))
      break;
    if (qn == a->depth) {
      uint64_t t0 = pb_now_ns();
      pb_im_free(q[qh].p, q[qh].size, q[qh].ctx);
      uint64_t tf = pb_now_ns();
      pb_req_free(0, q[qh].size);
      if (i >= a->warm)
        pb_samples_add(&w->ns2, tf - t0);
      qh = (qh + 1) % 8;
      qn--;
    }
    q[(qh + qn) % 8] = w3_alloc(w, a, i, &t1);
    qn++;
  }
  w->t_end = pb_now_ns();
  w->ops = i - a->warm;
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: clean up */
  while (qn > 0) {
    pb_im_free(q[qh].p, q[qh].size, q[qh].ctx);
    qh = (qh + 1) % 8;
    qn--;
  }
  return NULL;
}

static void w3_producer(worker_t *w, w3_arg_t *a) {
  uint64_t i, t1 = 0;
  for (i = 0;; i++) {
    if (pb_phase_over(w, i, a->warm, 1, &a->span, &t1))
      break;
    lblock_t b = w3_alloc(w, a, i, &t1);
    uint64_t tail = pb_spsc_wait_room(&a->q, a->depth);
    a->ring[tail % 8] = b;
    pb_spsc_publish(&a->q, tail);
  }
  pb_spsc_finish(&a->q);
  w->t_end = pb_now_ns();
  w->ops = i - a->warm;
}

static uint64_t w3_take(void *arg, uint64_t slot) {
  w3_arg_t *a = arg;
  lblock_t b = a->ring[slot % 8];
  uint64_t t0 = pb_now_ns();
  pb_im_free(b.p, b.size, b.ctx);
  uint64_t t1 = pb_now_ns();
  pb_req_free(1, b.size);
  return t1 - t0;
}

static void *w3_pair(worker_t *w) {
  w3_arg_t *a = w->arg;
  pb_samples_init(&w->ns, a->span.min_ops * 2);
  pb_samples_init(&w->ns2, a->span.min_ops * 2);
  pthread_barrier_wait(&pb_barrier);
  if (w->idx == 0)
    w3_producer(w, a);
  else
    pb_spsc_consume(w, &a->q, a->warm, w3_take, a);
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: exit */
  return NULL;
}

typedef struct w3_case {
  size_t size;
  unsigned depth;
} w3_case_t;

static const w3_case_t w3_full[] = {
    {38535168, 2}, {38535168, 4}, {154140672, 2}};
static const w3_case_t w3_quick[] = {{9633792, 2}, {9633792, 4}};

int pb_w3_ncases(void) { return pb_opt.quick ? 2 : 3; }

void pb_w3_run(int ci) {
  worker_t ws[MAX_THREADS];
  static w3_arg_t a;
  char name[96], sz[32];
  const w3_case_t *wc = pb_opt.quick ? &w3_quick[ci] : &w3_full[ci];
  memset(ws, 0, sizeof ws);
  memset(&a, 0, sizeof a);
  a.size = wc->size;
  a.depth = wc->depth;
  a.warm = 3 * a.depth + 4; /* every block in flight allocated once */
  a.span = (span_t){pb_opt.quick ? 6 : (a.size > 64 * MIB ? 8 : 20), 1000000,
                    pb_min_phase_ns()};
  pb_spsc_init(&a.q);
  snprintf(name, sizeof name, "%s batch, depth %u",
           pb_size_str(a.size, sz, sizeof sz), a.depth);
  pb_rec_begin("W3", name);
  pb_floor_prepare(a.size * (a.depth + 2), pb_opt.threads);
  pb_start(ws, pb_opt.threads > 1 ? w3_pair : w3_single, &a);
  window_t win;
  pb_measure(ws, 2, &win); /* the workers' exit: not counted */

  samples_t alloc_ns, free_ns;
  pb_samples_init(&alloc_ns, 64);
  pb_samples_init(&free_ns, 64);
  (void)pb_merge(ws, &alloc_ns, &free_ns);
  common_t c = pb_window_common(&win, &alloc_ns, ws[0].ops,
                                pb_workers_wall(ws, pb_opt.threads));
  pb_rec_common(&c);
  pb_rec_num("free_ns_med", pb_samples_quantile(&free_ns, 0.5));
  pb_rec_num("free_ns_p99", pb_samples_quantile(&free_ns, 0.99));
  pb_rec_num("batch_mib", (double)a.size / MIB);
  pb_rec_num("depth", a.depth);
  pb_rec_end();
  pb_samples_free(&alloc_ns);
  pb_samples_free(&free_ns);
}
