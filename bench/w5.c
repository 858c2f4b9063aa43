/* pp_bench: W5, producer / consumer (cross-thread frees). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ==== W5: producer / consumer (cross-thread frees) ===========================
 * xmalloc-test style: the producer allocates log-uniform 4 KiB - 4 MiB
 * blocks in batches of 64 and hands each batch to the consumer, which frees
 * it (at most 4 batches queued). One thread: allocate 64, free 64. */

#define W5_BATCH 64
#define W5_QUEUE 4

typedef struct w5_arg {
  uint64_t warm; /* batches */
  span_t span;   /* blocks */
  lblock_t q[W5_QUEUE][W5_BATCH];
  spsc_t queue; /* of batches */
  uint64_t rss_mid, rss_end;
} w5_arg_t;

static void *w5_producer(worker_t *w) {
  w5_arg_t *a = w->arg;
  rng_t r = {0x5eed0005u};
  lblock_t local[W5_BATCH];
  bool single = pb_opt.threads == 1;
  uint64_t b, t1 = 0;
  pb_samples_init(&w->ns, a->span.min_ops * 2);
  pb_samples_init(&w->ns2, a->span.min_ops / W5_BATCH + 1);
  pthread_barrier_wait(&pb_barrier);
  for (b = 0;; b++) {
    if (b == a->warm && !single)
      pb_spsc_wait_drained(&a->queue);
    if (pb_phase_over(w, b, a->warm, W5_BATCH, &a->span, &t1))
      break;
    if (a->rss_mid == 0 && b >= a->warm + a->span.min_ops / W5_BATCH / 4)
      a->rss_mid = pb_proc_status_kib("VmRSS");
    lblock_t *dst = local;
    uint64_t tail = 0;
    if (!single) {
      tail = pb_spsc_wait_room(&a->queue, W5_QUEUE);
      dst = a->q[tail % W5_QUEUE];
    }
    for (unsigned k = 0; k < W5_BATCH; k++) {
      size_t s = pb_log_uniform(&r, 4 * KIB, 4 * MIB);
      void *ctx = NULL;
      uint64_t t0 = pb_now_ns();
      void *p = pb_im_alloc(s, &ctx);
      t1 = pb_now_ns();
      pb_req_alloc(0, s);
      if (b >= a->warm)
        pb_samples_add(&w->ns, t1 - t0);
      dst[k] = (lblock_t){p, ctx, s};
    }
    if (single) {
      uint64_t t0 = pb_now_ns();
      for (unsigned k = 0; k < W5_BATCH; k++)
        pb_im_free(local[k].p, local[k].size, local[k].ctx);
      t1 = pb_now_ns();
      for (unsigned k = 0; k < W5_BATCH; k++)
        pb_req_free(0, local[k].size);
      if (b >= a->warm)
        pb_samples_add(&w->ns2, (t1 - t0) / W5_BATCH);
    } else {
      pb_spsc_publish(&a->queue, tail);
    }
  }
  if (!single)
    pb_spsc_finish(&a->queue);
  w->t_end = pb_now_ns();
  a->rss_end = pb_proc_status_kib("VmRSS");
  w->ops = (b - a->warm) * W5_BATCH;
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: exit */
  return NULL;
}

static uint64_t w5_take(void *arg, uint64_t slot) {
  w5_arg_t *a = arg;
  lblock_t *src = a->q[slot % W5_QUEUE];
  uint64_t t0 = pb_now_ns();
  for (unsigned k = 0; k < W5_BATCH; k++) {
    pb_im_free(src[k].p, src[k].size, src[k].ctx);
    pb_req_free(1, src[k].size); /* a relaxed store: keeps "live" exact */
  }
  return (pb_now_ns() - t0) / W5_BATCH;
}

static void *w5_consumer(worker_t *w) {
  w5_arg_t *a = w->arg;
  pb_samples_init(&w->ns2, a->span.min_ops / W5_BATCH + 1);
  pthread_barrier_wait(&pb_barrier);
  pb_spsc_consume(w, &a->queue, a->warm, w5_take, a);
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: exit */
  return NULL;
}

static void *w5_thread(worker_t *w) {
  return w->idx == 0 ? w5_producer(w) : w5_consumer(w);
}

void pb_w5_run(int ci) {
  (void)ci;
  worker_t ws[MAX_THREADS];
  static w5_arg_t a;
  memset(ws, 0, sizeof ws);
  memset(&a, 0, sizeof a);
  a.warm = pb_opt.quick ? 2 : 10;
  a.span =
      (span_t){(pb_opt.quick ? 6 : 60) * W5_BATCH, 4000000, pb_min_phase_ns()};
  pb_spsc_init(&a.queue);
  pb_rec_begin("W5", "4KiB-4MiB log-uniform, batches of 64");
  /* ~5 batches live (64 blocks of 605 KiB on average each). */
  pb_floor_prepare(256 * MIB, pb_opt.threads);
  pb_start(ws, w5_thread, &a);
  window_t win;
  pb_measure(ws, 2, &win); /* the workers' exit: not counted */

  samples_t alloc_ns, free_ns;
  pb_samples_init(&alloc_ns, 1024);
  pb_samples_init(&free_ns, 64);
  (void)pb_merge(ws, &alloc_ns, &free_ns);
  common_t c = pb_window_common(&win, &alloc_ns, ws[0].ops,
                                pb_workers_wall(ws, pb_opt.threads));
  pb_rec_common(&c);
  pb_rec_num("free_ns_med", pb_samples_quantile(&free_ns, 0.5));
  if (a.rss_mid > 0)
    pb_rec_num("rss_growth_mib",
               ((double)a.rss_end - (double)a.rss_mid) / (double)MIB);
  pb_rec_end();
  pb_samples_free(&alloc_ns);
  pb_samples_free(&free_ns);
}
