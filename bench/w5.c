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
  alignas(64) atomic_uint_fast64_t head; /* batches consumed */
  alignas(64) atomic_uint_fast64_t tail; /* batches produced */
  atomic_bool done;
  uint64_t rss_mid, rss_end;
} w5_arg_t;

static void w5_wait_drained(w5_arg_t *a) {
  while (atomic_load_explicit(&a->head, memory_order_acquire) !=
         atomic_load_explicit(&a->tail, memory_order_relaxed))
    pb_cpu_relax();
}

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
    if (b == a->warm) {
      if (!single)
        w5_wait_drained(a);
      pthread_barrier_wait(&pb_barrier);
      pthread_barrier_wait(&pb_barrier);
      w->t_start = t1 = pb_now_ns();
    }
    if (b >= a->warm &&
        pb_span_done(&a->span, (b - a->warm) * W5_BATCH, t1 - w->t_start))
      break;
    if (a->rss_mid == 0 && b >= a->warm + a->span.min_ops / W5_BATCH / 4)
      a->rss_mid = pb_proc_status_kib("VmRSS");
    lblock_t *dst = local;
    if (!single) {
      uint64_t tail = atomic_load_explicit(&a->tail, memory_order_relaxed);
      while (tail - atomic_load_explicit(&a->head, memory_order_acquire) >=
             W5_QUEUE)
        pb_cpu_relax();
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
      atomic_store_explicit(
          &a->tail, atomic_load_explicit(&a->tail, memory_order_relaxed) + 1,
          memory_order_release);
    }
  }
  if (!single) {
    atomic_store_explicit(&a->done, true, memory_order_release);
    w5_wait_drained(a);
  }
  w->t_end = pb_now_ns();
  a->rss_end = pb_proc_status_kib("VmRSS");
  w->ops = (b - a->warm) * W5_BATCH;
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: exit */
  return NULL;
}

static void *w5_consumer(worker_t *w) {
  w5_arg_t *a = w->arg;
  uint64_t consumed = 0;
  bool warmed = false;
  pb_samples_init(&w->ns2, a->span.min_ops / W5_BATCH + 1);
  pthread_barrier_wait(&pb_barrier);
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
    lblock_t *src = a->q[head % W5_QUEUE];
    uint64_t t0 = pb_now_ns();
    for (unsigned k = 0; k < W5_BATCH; k++) {
      pb_im_free(src[k].p, src[k].size, src[k].ctx);
      pb_req_free(1, src[k].size); /* a relaxed store: keeps "live" exact */
    }
    uint64_t t1 = pb_now_ns();
    if (consumed >= a->warm)
      pb_samples_add(&w->ns2, (t1 - t0) / W5_BATCH);
    consumed++;
    atomic_store_explicit(&a->head, head + 1, memory_order_release);
  }
  w->t_end = pb_now_ns();
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
  atomic_init(&a.head, 0);
  atomic_init(&a.tail, 0);
  atomic_init(&a.done, false);
  pb_rec_begin("W5", "4KiB-4MiB log-uniform, batches of 64");
  /* ~5 batches live (64 blocks of 605 KiB on average each). */
  pb_floor_prepare(256 * MIB, pb_opt.threads);
  pb_req_reset(pb_opt.threads);
  pb_rss_begin();
  pb_run_workers(ws, pb_opt.threads, w5_thread, &a);
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
  pb_samples_init(&alloc_ns, 1024);
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
  if (a.rss_mid > 0)
    pb_rec_num("rss_growth_mib",
               ((double)a.rss_end - (double)a.rss_mid) / (double)MIB);
  pb_rec_end();
  pb_samples_free(&alloc_ns);
  pb_samples_free(&free_ns);
}
