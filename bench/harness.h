/*
 * pp_bench's harness (harness.c): the requested bytes, the records, the
 * worker threads and the run protocol the workloads share; the one header
 * the workloads (w1.c .. w8.c) and the dispatch (main.c) include. It
 * brings the layers below it: the implementations under test (impl.h) and
 * the utilities (util.h). Not installed.
 *
 * The helpers that sit inside timed regions (req_free, the phase and
 * queue steps) are static inline here, as they were when everything was
 * one file: the timings must stay comparable with earlier runs.
 */
#ifndef PP_BENCH_HARNESS_H
#define PP_BENCH_HARNESS_H

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "impl.h"
#include "util.h"

/* ---- CPUs (harness.c) ---------------------------------------------------- */

/* The CPUs the process may run on; each worker is pinned to one of them. */
void pb_cpus_init(void);

/* ---- Requested bytes (harness.c) ----------------------------------------- */

typedef struct tcount {
  alignas(64) atomic_uint_fast64_t allocated;
  atomic_uint_fast64_t freed;
  uint64_t peak_seen; /* owner only */
  unsigned tick;      /* owner only */
} tcount_t;

extern tcount_t pb_req[MAX_THREADS];

void pb_req_reset(int nthreads);
void pb_req_alloc(int t, size_t size);
void pb_req_sample(int t);

static inline void pb_req_free(int t, size_t size) {
  tcount_t *c = &pb_req[t];
  atomic_store_explicit(
      &c->freed, atomic_load_explicit(&c->freed, memory_order_relaxed) + size,
      memory_order_relaxed);
}

/* ---- Records (harness.c) ------------------------------------------------- */

void pb_rec_begin(const char *workload, const char *kase);
void pb_rec_num(const char *key, double v);
__attribute__((format(printf, 1, 2))) void pb_note(const char *fmt, ...);
void pb_rec_end(void);

/* Metrics every workload reports. ns: per-operation samples (sorted here).
 * ops over wall_ns; faults over the measured phase; memory over the case. */
typedef struct common {
  samples_t *ns;
  uint64_t ops;
  uint64_t wall_ns;
  uint64_t minflt;
  uint64_t backend_calls; /* measured phase */
  bool backend_known;
} common_t;

void pb_rec_common(const common_t *c);

/* ---- Threads (harness.c) ------------------------------------------------- */

extern pthread_barrier_t pb_barrier;

typedef struct worker {
  int idx;
  pthread_t th;
  void *(*fn)(struct worker *);
  void *arg;
  samples_t ns;
  samples_t ns2;
  uint64_t ops;
  uint64_t t_start, t_end;
  double extra[12];
} worker_t;

void pb_run_workers(worker_t *ws, int n, void *(*fn)(worker_t *), void *arg);
void pb_join_workers(worker_t *ws, int n);
uint64_t pb_workers_wall(const worker_t *ws, int n);

/* ---- Measured phases (harness.c) ----------------------------------------- */

/* A measured phase lasts at least min_ops operations and at least min_ns
 * (so that fast implementations are timed long enough for a preemption not
 * to dominate), and at most max_ops operations. */
typedef struct span {
  uint64_t min_ops, max_ops, min_ns;
} span_t;

static inline bool pb_span_done(const span_t *s, uint64_t done,
                                uint64_t elapsed_ns) {
  return done >= s->max_ops || (done >= s->min_ops && elapsed_ns >= s->min_ns);
}

uint64_t pb_min_phase_ns(void);

/* A block a workload holds: ctx is refpool's handle. */
typedef struct lblock {
  void *p;
  void *ctx;
  size_t size;
} lblock_t;

/* A worker's side of the warm-up: at operation i == warm it meets the main
 * thread twice (warmed up; counters taken) and starts its clock; true once
 * the measured phase is over. scale: operations per i (W5 counts batches). */
static inline bool pb_phase_over(worker_t *w, uint64_t i, uint64_t warm,
                                 uint64_t scale, const span_t *s,
                                 uint64_t *t1) {
  if (i == warm) {
    pthread_barrier_wait(&pb_barrier);
    pthread_barrier_wait(&pb_barrier);
    w->t_start = *t1 = pb_now_ns();
  }
  return i >= warm && pb_span_done(s, (i - warm) * scale, *t1 - w->t_start);
}

/* The main thread's side of a case: the counters and faults of the measured
 * phase, taken between barriers so that the window is the phase exactly. */
typedef struct window {
  im_counters_t c0, c1;
  uint64_t f0, f1;
} window_t;

void pb_start(worker_t *ws, void *(*fn)(worker_t *), void *arg);
void pb_measure(worker_t *ws, int lead, window_t *win);
uint64_t pb_merge(worker_t *ws, samples_t *ns, samples_t *ns2);
common_t pb_window_common(const window_t *win, samples_t *ns, uint64_t ops,
                          uint64_t wall_ns);

/* A single-producer single-consumer queue of slots (W3, W5): the producer
 * fills slot tail % N after pb_spsc_wait_room and publishes it. Inline, as
 * the loops were when each workload had its own: the two threads' timings
 * depend on how fast the other side turns around. */
typedef struct spsc {
  alignas(64) atomic_uint_fast64_t head; /* slots consumed */
  alignas(64) atomic_uint_fast64_t tail; /* slots produced */
  atomic_bool done;
} spsc_t;

static inline void pb_spsc_init(spsc_t *q) {
  atomic_init(&q->head, 0);
  atomic_init(&q->tail, 0);
  atomic_init(&q->done, false);
}

/* At most depth slots queued: wait for one to be consumed; the slot to
 * fill is tail % N. */
static inline uint64_t pb_spsc_wait_room(spsc_t *q, uint64_t depth) {
  uint64_t tail = atomic_load_explicit(&q->tail, memory_order_relaxed);
  while (tail - atomic_load_explicit(&q->head, memory_order_acquire) >= depth)
    pb_cpu_relax();
  return tail;
}

static inline void pb_spsc_publish(spsc_t *q, uint64_t tail) {
  atomic_store_explicit(&q->tail, tail + 1, memory_order_release);
}

static inline void pb_spsc_wait_drained(spsc_t *q) {
  while (atomic_load_explicit(&q->head, memory_order_acquire) !=
         atomic_load_explicit(&q->tail, memory_order_relaxed))
    pb_cpu_relax();
}

/* The producer is done: the consumer stops once the queue is empty. */
static inline void pb_spsc_finish(spsc_t *q) {
  atomic_store_explicit(&q->done, true, memory_order_release);
  pb_spsc_wait_drained(q);
}

/* The consumer: take(arg, slot) frees a slot's blocks and returns the ns
 * per block it timed, a sample of w->ns2 once `warm` slots were consumed
 * (the warm-up meets the main thread as pb_phase_over does). */
static inline void pb_spsc_consume(worker_t *w, spsc_t *q, uint64_t warm,
                                   uint64_t (*take)(void *arg, uint64_t slot),
                                   void *arg) {
  uint64_t consumed = 0;
  bool warmed = false;
  for (;;) {
    if (consumed == warm && !warmed) {
      warmed = true;
      pthread_barrier_wait(&pb_barrier);
      pthread_barrier_wait(&pb_barrier);
      w->t_start = pb_now_ns();
    }
    uint64_t head = atomic_load_explicit(&q->head, memory_order_relaxed);
    if (atomic_load_explicit(&q->tail, memory_order_acquire) == head) {
      if (atomic_load_explicit(&q->done, memory_order_acquire) &&
          atomic_load_explicit(&q->tail, memory_order_acquire) == head)
        break;
      pb_cpu_relax();
      continue;
    }
    uint64_t ns = take(arg, head);
    if (consumed >= warm)
      pb_samples_add(&w->ns2, ns);
    consumed++;
    atomic_store_explicit(&q->head, head + 1, memory_order_release);
  }
  w->t_end = pb_now_ns();
}

/* ---- Workloads (w1.c .. w8.c) -------------------------------------------- */

int pb_w1_ncases(void);
void pb_w1_run(int ci);
int pb_w1h_ncases(void);
void pb_w1h_run(int ci);
int pb_w2_ncases(void);
void pb_w2_run(int ci);
int pb_w3_ncases(void);
void pb_w3_run(int ci);
void pb_w4_run(int ci);
void pb_w5_run(int ci);
void pb_w6_run(int ci);
void pb_w7_run(int ci);
int pb_w8_ncases(void);
void pb_w8_run(int ci);

#endif
