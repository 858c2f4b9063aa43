/*
 * pp_bench's internal header: what the harness (harness.c, impl.c), the
 * workloads (w1.c .. w8.c) and the dispatch (main.c) share. Not installed;
 * every name that crosses a file starts with pb_ so that none can collide
 * with pinpool's own (the harness links pinpool_static).
 *
 * The few helpers that sit inside timed regions (the clock, the generator,
 * use_block, req_free, pool_pair) are static inline here: they were inlined
 * into the workloads' loops when everything was one file, and the timings
 * must stay comparable with earlier runs.
 */
#ifndef PP_BENCH_HARNESS_H
#define PP_BENCH_HARNESS_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "pinpool.h"
#include "refpool.h"
#include "rmmpool.h"

#ifndef PEER_NAME
#define PEER_NAME "glibc"
#endif
/* A substring of the path of the shared object malloc must come from. */
#ifndef PEER_LIB
#define PEER_LIB "libc.so"
#endif

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define PAGE ((size_t)4096)
#define MAX_THREADS 2

/* ---- Small utilities (harness.c) ----------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) void pb_die(const char *fmt,
                                                            ...);
__attribute__((noreturn)) void pb_die_pp(const char *call, int rc);
void *pb_xmalloc(size_t n);

static inline uint64_t pb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: a small deterministic generator, seeded per workload/thread. */
typedef struct rng {
  uint64_t s;
} rng_t;

static inline uint64_t pb_rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline double pb_rng_unit(rng_t *r) { /* [0, 1) */
  return (double)(pb_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static inline size_t pb_rng_below(rng_t *r, size_t n) {
  return (size_t)(pb_rng_unit(r) * (double)n);
}

size_t pb_log_uniform(rng_t *r, size_t lo, size_t hi);

/* Samples (nanoseconds), per thread. */
typedef struct samples {
  uint64_t *v;
  size_t n, cap;
} samples_t;

void pb_samples_init(samples_t *s, size_t cap);
void pb_samples_add(samples_t *s, uint64_t x);
void pb_samples_merge(samples_t *into, const samples_t *from);
double pb_samples_quantile(samples_t *s, double q);
double pb_samples_mean(const samples_t *s);
void pb_samples_free(samples_t *s);

const char *pb_size_str(size_t size, char *buf, size_t len);

/* ---- Process measurements (harness.c) ------------------------------------ */

uint64_t pb_minflt_now(void);
uint64_t pb_proc_status_kib(const char *field);
extern bool pb_hwm_reset;
void pb_rss_begin(void);
uint64_t pb_rss_peak_delta(void);
void pb_cpus_init(void);

static inline void pb_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* ---- Options (harness.c) --------------------------------------------------
 */

typedef struct options {
  const char *workload;
  const char *impl;
  bool touch;
  int threads;
  int case_idx;
  int rep;
  bool quick;
  const char *config; /* overrides the workload's pinpool config */
  const char *name;   /* the reported name of a malloc peer (--name) */
} options_t;

extern options_t pb_opt;

/* ---- Implementations (impl.c) ---------------------------------------------
 */

/* K_CUHOST: cuMemHostAlloc / cuMemFreeHost per block, the naive baseline on
 * a GPU machine (counted like K_NAIVE). */
typedef enum kind {
  K_PINPOOL,
  K_REFPOOL,
  K_RMMPOOL,
  K_NAIVE,
  K_CUHOST,
  K_MALLOC,
  K_FLOOR
} kind_t;

typedef struct impl {
  kind_t kind;
  const char *name; /* as reported */
  const char *mode; /* alloc, touch */
  bool touch;
  bool cuda; /* calls the CUDA driver itself: every thread enters its context */
  char config[256];
  pinpool_t *pool;
  refpool_t *ref;
  rmmpool_t *rmm;
  atomic_uint_fast64_t nv_reserved, nv_peak, nv_calls, nv_mlock_fail;
} impl_t;

extern impl_t pb_im;
/* Why a malloc peer's backend calls are not counted (syscount_init). */
extern char pb_syscount_why[256];
/* Per thread: a shared sink would be a data race and bounce a cache line
 * between the threads of a 2-thread run. */
extern _Thread_local void *volatile pb_sink;
/* The worker's index (0 on the main thread): the floor's ring of each
 * thread. */
extern _Thread_local int pb_tidx;
/* The stream an allocation is for (W4; 0 elsewhere): rmmpool's
 * stream-ordered free lists. */
extern _Thread_local uintptr_t pb_cur_stream;

/* Use the block the same way for every implementation: touch mode writes
 * one byte in every 4 KiB page of it, alloc mode writes nothing. */
static inline void pb_use_block(void *p, size_t size) {
  if (pb_im.touch) {
    volatile unsigned char *b = p;
    for (size_t off = 0; off < size; off += PAGE)
      b[off] = (unsigned char)off;
  }
  pb_sink = p;
}

/* One pinpool alloc+free pair that writes a byte of the block: W1's (and
 * W1h's) timed loop and W8's allocating threads. Inlined, so that W1 times
 * the pair itself. */
static inline __attribute__((always_inline)) void pb_pool_pair(size_t size,
                                                               uint64_t i) {
  void *p;
  int rc = pinpool_alloc(pb_im.pool, size, &p);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_alloc", rc);
  *(volatile unsigned char *)p = (unsigned char)i;
  pb_sink = p;
  rc = pinpool_free(pb_im.pool, p);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_free", rc);
}

void pb_floor_prepare(size_t per_thread, int threads);
void *pb_floor_alloc(size_t size);
void *pb_baseline_alloc(size_t size);
void pb_baseline_free(void *p, size_t size);
void *pb_im_alloc(size_t size, void **ctx);
void pb_im_free(void *p, size_t size, void *ctx);

/* Counters of the implementation itself (pools and naive); for a malloc
 * peer only its backend calls: the memory system calls its threads made,
 * counted by the kernel (syscount.h), where the machine lets us. */
typedef struct im_counters {
  bool known;       /* the memory counters below */
  bool calls_known; /* backend_calls */
  uint64_t backend_calls;
  uint64_t reserved_peak;
  uint64_t reserved_now;
  uint64_t requested_peak; /* pinpool only (its own exact tracking) */
  uint64_t mlock_failures;
} im_counters_t;

void pb_im_get_counters(im_counters_t *c);

/* The stream clock of the implementations other than pinpool (W4), and
 * room for `cap` refpool / rmmpool events on it. */
extern pinpool_t *pb_clock;
void pb_ref_events_reset(uint64_t cap);

/* ---- Setup (impl.c) --------------------------------------------------------
 */

struct hist_variant;
struct cuda_pool;
const struct hist_variant *pb_find_hist_variant(const char *impl);
const struct cuda_pool *pb_find_cuda_pool(const char *impl);
void pb_im_setup(const char *pool_config, const char *variant,
                 const char *variant_config, bool hist);
void pb_im_teardown(void);
void pb_check_peer(void);

/* ---- Requested bytes (harness.c) ------------------------------------------
 */

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

/* ---- Records (harness.c) ---------------------------------------------------
 */

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

/* ---- Threads (harness.c) ---------------------------------------------------
 */

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

/* ---- Measured phases (harness.c) -------------------------------------------
 */

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

/* ---- Workloads (w1.c .. w8.c) ----------------------------------------------
 */

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
