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
  lblock_t ring[8];                      /* SPSC ring (two threads) */
  alignas(64) atomic_uint_fast64_t head; /* consumer */
  alignas(64) atomic_uint_fast64_t tail; /* producer */
  atomic_bool done;
} w3_arg_t;

static void *w3_single(worker_t *w) {
  w3_arg_t *a = w->arg;
  lblock_t q[8];
  unsigned qh = 0, qn = 0;
  uint64_t i, t1 = 0;
  pb_samples_init(&w->ns, a->span.min_ops * 2);
  pb_samples_init(&w->ns2, a->span.min_ops * 2);
  pthread_barrier_wait(&pb_barrier);
  for (i = 0;; i++) {
    if (i == a->warm) {
      pthread_barrier_wait(&pb_barrier);
      pthread_barrier_wait(&pb_barrier);
      w->t_start = t1 = pb_now_ns();
    }
    if (i >= a->warm && pb_span_done(&a->span, i - a->warm, t1 - w->t_start))
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
    void *ctx = NULL;
    uint64_t t0 = pb_now_ns();
    void *p = pb_im_alloc(a->size, &ctx);
    t1 = pb_now_ns();
    pb_req_alloc(0, a->size);
    if (i >= a->warm)
      pb_samples_add(&w->ns, t1 - t0);
    q[(qh + qn) % 8] = (lblock_t){p, ctx, a->size};
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
    if (i == a->warm) {
      pthread_barrier_wait(&pb_barrier);
      pthread_barrier_wait(&pb_barrier);
      w->t_start = t1 = pb_now_ns();
    }
    if (i >= a->warm && pb_span_done(&a->span, i - a->warm, t1 - w->t_start))
      break;
    void *ctx = NULL;
    uint64_t t0 = pb_now_ns();
    void *p = pb_im_alloc(a->size, &ctx);
    t1 = pb_now_ns();
    pb_req_alloc(0, a->size);
    if (i >= a->warm)
      pb_samples_add(&w->ns, t1 - t0);
    uint64_t tail = atomic_load_explicit(&a->tail, memory_order_relaxed);
    while (tail - atomic_load_explicit(&a->head, memory_order_acquire) >=
           a->depth)
      pb_cpu_relax();
    a->ring[tail % 8] = (lblock_t){p, ctx, a->size};
    atomic_store_explicit(&a->tail, tail + 1, memory_order_release);
  }
  atomic_store_explicit(&a->done, true, memory_order_release);
  while (atomic_load_explicit(&a->head, memory_order_acquire) !=
         atomic_load_explicit(&a->tail, memory_order_relaxed))
    pb_cpu_relax();
  w->t_end = pb_now_ns();
  w->ops = i - a->warm;
}

static void w3_consumer(worker_t *w, w3_arg_t *a) {
  uint64_t consumed = 0;
  bool warmed = false;
  for (;;) {
    if (consumed == a->warm && !warmed) {
      warmed = true;
      pthread_barrier_wait(&pb_barrier);
      pthread_barrier_wait(&pb_barrier);
      w->t_start = pb_now_ns();
    }
    uint64_t head = atomic_load_explicit(&a->head, memory_order_relaxed);
    if (atomic_load_explicit(&a->tail, memory_order_acquire) == head) {
      if (atomic_load_explicit(&a->done, memory_order_acquire) &&
          atomic_load_explicit(&a->tail, memory_order_acquire) == head)
        break;
      pb_cpu_relax();
      continue;
    }
    lblock_t b = a->ring[head % 8];
    uint64_t t0 = pb_now_ns();
    pb_im_free(b.p, b.size, b.ctx);
    uint64_t t1 = pb_now_ns();
    pb_req_free(1, b.size);
    if (consumed >= a->warm)
      pb_samples_add(&w->ns2, t1 - t0);
    consumed++;
    atomic_store_explicit(&a->head, head + 1, memory_order_release);
  }
  w->t_end = pb_now_ns();
}

static void *w3_pair(worker_t *w) {
  w3_arg_t *a = w->arg;
  pb_samples_init(&w->ns, a->span.min_ops * 2);
  pb_samples_init(&w->ns2, a->span.min_ops * 2);
  pthread_barrier_wait(&pb_barrier);
  if (w->idx == 0)
    w3_producer(w, a);
  else
    w3_consumer(w, a);
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
  atomic_init(&a.head, 0);
  atomic_init(&a.tail, 0);
  atomic_init(&a.done, false);
  snprintf(name, sizeof name, "%s batch, depth %u",
           pb_size_str(a.size, sz, sizeof sz), a.depth);
  pb_rec_begin("W3", name);
  pb_floor_prepare(a.size * (a.depth + 2), pb_opt.threads);
  pb_req_reset(pb_opt.threads);
  pb_rss_begin();
  pb_run_workers(ws, pb_opt.threads, pb_opt.threads > 1 ? w3_pair : w3_single,
                 &a);
  pthread_barrier_wait(&pb_barrier);
  pthread_barrier_wait(&pb_barrier);
  im_counters_t c0;
  pb_im_get_counters(&c0);
  uint64_t f0 = pb_minflt_now();
  pthread_barrier_wait(&pb_barrier);
  pthread_barrier_wait(&pb_barrier);
  uint64_t f1 = pb_minflt_now();
  im_counters_t c1;
  pb_im_get_counters(&c1);
  pthread_barrier_wait(&pb_barrier); /* the workers' exit: not counted */
  pb_join_workers(ws, pb_opt.threads);

  samples_t alloc_ns, free_ns;
  pb_samples_init(&alloc_ns, 64);
  pb_samples_init(&free_ns, 64);
  for (int i = 0; i < pb_opt.threads; i++) {
    pb_samples_merge(&alloc_ns, &ws[i].ns);
    pb_samples_merge(&free_ns, &ws[i].ns2);
    pb_samples_free(&ws[i].ns);
    pb_samples_free(&ws[i].ns2);
  }
  common_t c = {&alloc_ns,
                ws[0].ops,
                pb_workers_wall(ws, pb_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  pb_rec_common(&c);
  pb_rec_num("free_ns_med", pb_samples_quantile(&free_ns, 0.5));
  pb_rec_num("free_ns_p99", pb_samples_quantile(&free_ns, 0.99));
  pb_rec_num("batch_mib", (double)a.size / MIB);
  pb_rec_num("depth", a.depth);
  pb_rec_end();
  pb_samples_free(&alloc_ns);
  pb_samples_free(&free_ns);
}
