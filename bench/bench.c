/*
 * pp_bench — one run of one benchmark case (issue 7).
 *
 * The same source is built once per malloc peer: pp_bench (glibc malloc),
 * pp_bench_jemalloc, pp_bench_mimalloc, pp_bench_tcmalloc; each links its
 * allocator so that malloc() in the whole process is that allocator and no
 * two peers share a process. Every binary also holds pinpool, the reference
 * pool (refpool.c: PyTorch's policy) and the naive baseline; bench/run.sh
 * runs those from pp_bench.
 *
 * One invocation measures one (workload, case, implementation, mode,
 * thread count) once and prints one record; bench/run.sh interleaves the
 * implementations, repeats, and pp_report takes the medians. One case per
 * process keeps the peak RSS (VmHWM) of a case free of the others.
 *
 *   pp_bench --workload W --impl NAME [--mode alloc|touch]
 *            [--threads 1|2] [--case N] [--rep N] [--quick] [--name NAME]
 *   pp_bench --list W [--threads N] [--quick]   the number of cases
 *
 * Workloads: W1..W7 (every implementation), W1h (W1's pair with pinpool's
 * allocation history on) and W8 (snapshots), both pinpool only.
 *
 * Implementations (--impl):
 *   pinpool  pinpool (mlock=1; workload-specific settings in the record)
 *   pinpool-tc  W1 only: pinpool with tcache_bytes=8GiB (every size in the
 *            thread cache)
 *   pinpool-h-alloc, pinpool-h-all, pinpool-h-all16  W1h only: pinpool
 *            with history level alloc (no stacks), all (no stacks), all
 *            with 16-frame stacks
 *   refpool  the PyTorch-policy reference pool (refpool.c)
 *   rmmpool  the RMM pool_memory_resource-policy reference pool
 *            (rmmpool.c: coalescing best fit in populated chunks)
 *   naive    mmap(MAP_POPULATE) + mlock per allocation, munlock + munmap
 *            per free: the CPU analogue of cudaHostAlloc / cudaFreeHost
 *   floor    touch mode only: no allocator; blocks are consecutive pieces
 *            of a pre-faulted region (a ring per thread the size of the
 *            workload's live set), frees do nothing: the cost of the
 *            touches alone
 *   malloc   this binary's malloc (glibc, jemalloc, mimalloc or tcmalloc;
 *            --name renames it, e.g. tcmalloc-rr0 for the tcmalloc binary
 *            run under TCMALLOC_RELEASE_RATE=0)
 * Modes, the same for every implementation: "touch" writes one byte in
 * every 4 KiB page of every block handed out (pinned memory is written by
 * its user; the pools' pages are resident, the mallocs' may fault);
 * "alloc" writes nothing (the allocator alone).
 *
 * Output lines (tab-separated):
 *   R <workload> <case> <impl> <mode> <threads> <rep> <config> k=v ...
 *   N <workload> <case> <impl> <mode> <threads> <note>
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cudapeer.h"
#include "pinpool.h"
#include "refpool.h"
#include "rmmpool.h"
#include "syscount.h"

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

/* ---- Small utilities ----------------------------------------------------- */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "pp_bench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

static void die_pp(const char *call, int rc) {
  die("%s failed: %s: %s", call, pinpool_strerror(rc), pinpool_last_error());
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (p == NULL)
    die("out of memory (%zu bytes of bookkeeping)", n);
  return p;
}

/* splitmix64: a small deterministic generator, seeded per workload/thread. */
typedef struct rng {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double rng_unit(rng_t *r) { /* [0, 1) */
  return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static size_t rng_below(rng_t *r, size_t n) {
  return (size_t)(rng_unit(r) * (double)n);
}

/* A log-uniform size in [lo, hi]. */
static size_t log_uniform(rng_t *r, size_t lo, size_t hi) {
  double l = log((double)lo), h = log((double)hi);
  size_t s = (size_t)exp(l + (h - l) * rng_unit(r));
  return s < lo ? lo : s > hi ? hi : s;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* Samples (nanoseconds), per thread. */
typedef struct samples {
  uint64_t *v;
  size_t n, cap;
} samples_t;

static void samples_init(samples_t *s, size_t cap) {
  s->v = xmalloc((cap ? cap : 1) * sizeof *s->v);
  s->n = 0;
  s->cap = cap ? cap : 1;
}

static void samples_add(samples_t *s, uint64_t x) {
  if (s->n == s->cap) {
    size_t ncap = s->cap * 2;
    uint64_t *nv = realloc(s->v, ncap * sizeof *nv);
    if (nv == NULL)
      die("out of memory (samples)");
    s->v = nv;
    s->cap = ncap;
  }
  s->v[s->n++] = x;
}

static void samples_merge(samples_t *into, const samples_t *from) {
  for (size_t i = 0; i < from->n; i++)
    samples_add(into, from->v[i]);
}

/* Sorts the samples; q in [0, 1]; nearest rank. */
static double samples_quantile(samples_t *s, double q) {
  if (s->n == 0)
    return 0.0;
  qsort(s->v, s->n, sizeof s->v[0], cmp_u64);
  size_t rank = (size_t)ceil(q * (double)s->n);
  if (rank < 1)
    rank = 1;
  if (rank > s->n)
    rank = s->n;
  return (double)s->v[rank - 1];
}

static double samples_mean(const samples_t *s) {
  double t = 0;
  for (size_t i = 0; i < s->n; i++)
    t += (double)s->v[i];
  return s->n ? t / (double)s->n : 0.0;
}

static void samples_free(samples_t *s) {
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

/* ---- Process measurements: faults, RSS, CPUs ----------------------------- */

static uint64_t minflt_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)ru.ru_minflt;
}

/* A "VmXXX:" field of /proc/self/status, in bytes (0 if unreadable). */
static uint64_t proc_status_kib(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  uint64_t v = 0;
  size_t len = strlen(field);
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, field, len) == 0 && line[len] == ':') {
      v = strtoull(line + len + 1, NULL, 10) * 1024u;
      break;
    }
  }
  fclose(f);
  return v;
}

static uint64_t g_rss_base;
static bool g_hwm_reset;

/* Reset the peak RSS to the current RSS (Linux clear_refs "5"). */
static void rss_begin(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  g_hwm_reset = false;
  if (f != NULL) {
    g_hwm_reset = fputs("5", f) >= 0;
    if (fclose(f) != 0)
      g_hwm_reset = false;
  }
  g_rss_base = proc_status_kib("VmRSS");
}

/* Peak RSS since rss_begin, above the RSS at rss_begin. */
static uint64_t rss_peak_delta(void) {
  uint64_t hwm = proc_status_kib("VmHWM");
  return hwm > g_rss_base ? hwm - g_rss_base : 0;
}

static int g_cpus[64];
static int g_ncpus;

static void cpus_init(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    return;
  for (int c = 0; c < CPU_SETSIZE && g_ncpus < 64; c++)
    if (CPU_ISSET(c, &set))
      g_cpus[g_ncpus++] = c;
}

/* Pin the calling thread to the idx-th CPU it may run on. */
static void pin_self(int idx) {
  if (g_ncpus == 0)
    return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(g_cpus[idx % g_ncpus], &set);
  (void)sched_setaffinity(0, sizeof set, &set);
}

static void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* ---- Options ------------------------------------------------------------- */

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

static options_t g_opt = {NULL, NULL, false, 1, 0, 1, false, NULL, NULL};

/* ---- Implementations ----------------------------------------------------- */

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

static impl_t g_im;
/* Why a malloc peer's backend calls are not counted (syscount_init). */
static char g_syscount_why[256];
/* Per thread: a shared sink would be a data race and bounce a cache line
 * between the threads of a 2-thread run. */
static _Thread_local void *volatile g_sink;

/* The worker's index (0 on the main thread): the floor's ring of each
 * thread. */
static _Thread_local int g_tidx;
/* The stream an allocation is for (W4; 0 elsewhere): rmmpool's
 * stream-ordered free lists. */
static _Thread_local uintptr_t g_cur_stream;

/* Use the block the same way for every implementation: touch mode writes
 * one byte in every 4 KiB page of it, alloc mode writes nothing. */
static inline void use_block(void *p, size_t size) {
  if (g_im.touch) {
    volatile unsigned char *b = p;
    for (size_t off = 0; off < size; off += PAGE)
      b[off] = (unsigned char)off;
  }
  g_sink = p;
}

/* ---- The floor
 * --------------------------------------------------------------- Memory no
 * allocator manages: one region, populated (MAP_POPULATE) before the
 * measurement, split in one ring per thread; an allocation is the next `size`
 * bytes of the thread's ring (page-aligned; back to the ring's start when they
 * do not fit) and a free does nothing. Each workload sizes the rings to its
 * live set (plus one block), so that the touches of touch mode land on memory
 * whose reuse distance is that of the workload: what is left is the cost of the
 * touches themselves (TLB and cache misses, no faults), the bound every
 * implementation is measured against. */
typedef struct floor_ring {
  alignas(64) char *start, *end, *cur;
} floor_ring_t;

static char *g_floor_base;
static size_t g_floor_len;
static floor_ring_t g_floor[MAX_THREADS];

/* Called by each workload before its threads start: `per_thread` bytes for
 * each of `threads` rings (a no-op for other implementations). */
static void floor_prepare(size_t per_thread, int threads) {
  if (g_im.kind != K_FLOOR || g_floor_base != NULL)
    return;
  per_thread = (per_thread + PAGE - 1) & ~(PAGE - 1);
  g_floor_len = per_thread * (size_t)threads;
  void *p = mmap(NULL, g_floor_len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    die("floor: mmap(%zu) failed: %s", g_floor_len, strerror(errno));
  g_floor_base = p;
  for (int t = 0; t < threads; t++) {
    g_floor[t].start = g_floor[t].cur = g_floor_base + per_thread * (size_t)t;
    g_floor[t].end = g_floor[t].start + per_thread;
  }
}

static void *floor_alloc(size_t size) {
  floor_ring_t *r = &g_floor[g_tidx];
  size_t len = (size + PAGE - 1) & ~(PAGE - 1);
  if (r->start == NULL || len > (size_t)(r->end - r->start))
    die("floor: a %zu-byte block does not fit the workload's ring", size);
  if (len > (size_t)(r->end - r->cur))
    r->cur = r->start;
  char *p = r->cur;
  r->cur += len;
  return p;
}

/* Backend calls and reserved bytes of the per-request baselines. */
static void naive_count_alloc(size_t len) {
  uint64_t r =
      atomic_fetch_add_explicit(&g_im.nv_reserved, len, memory_order_relaxed) +
      len;
  uint64_t pk = atomic_load_explicit(&g_im.nv_peak, memory_order_relaxed);
  while (r > pk && !atomic_compare_exchange_weak_explicit(
                       &g_im.nv_peak, &pk, r, memory_order_relaxed,
                       memory_order_relaxed)) {
  }
  atomic_fetch_add_explicit(&g_im.nv_calls, 1, memory_order_relaxed);
}

static void naive_count_free(size_t len) {
  atomic_fetch_sub_explicit(&g_im.nv_reserved, len, memory_order_relaxed);
  atomic_fetch_add_explicit(&g_im.nv_calls, 1, memory_order_relaxed);
}

static void *naive_alloc(size_t size) {
  size_t len = (size + PAGE - 1) & ~(PAGE - 1);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    die("naive: mmap(%zu) failed: %s", len, strerror(errno));
  if (mlock(p, len) != 0)
    atomic_fetch_add_explicit(&g_im.nv_mlock_fail, 1, memory_order_relaxed);
  naive_count_alloc(len);
  return p;
}

static void naive_free(void *p, size_t size) {
  size_t len = (size + PAGE - 1) & ~(PAGE - 1);
  (void)munlock(p, len);
  if (munmap(p, len) != 0)
    die("naive: munmap failed: %s", strerror(errno));
  naive_count_free(len);
}

/* The naive baseline on a GPU machine: the driver pins per request. */
static void *cuhost_alloc(size_t size) {
  void *p = cudapeer_host_alloc(size);
  if (p == NULL)
    die("cuMemHostAlloc(%zu) failed: %s", size, cudapeer_last_error());
  naive_count_alloc((size + PAGE - 1) & ~(PAGE - 1));
  return p;
}

static void cuhost_free(void *p, size_t size) {
  if (cudapeer_free_host(p) != 0)
    die("cuMemFreeHost failed: %s", cudapeer_last_error());
  naive_count_free((size + PAGE - 1) & ~(PAGE - 1));
}

/* The per-request baselines: naive, or cuhostalloc on a GPU machine. */
static void *baseline_alloc(size_t size) {
  return g_im.kind == K_CUHOST ? cuhost_alloc(size) : naive_alloc(size);
}

static void baseline_free(void *p, size_t size) {
  if (g_im.kind == K_CUHOST)
    cuhost_free(p, size);
  else
    naive_free(p, size);
}

/* refpool-cuda's backend: PyTorch's allocator on cudaHostAlloc. */
static void *ref_cu_alloc(void *ctx, size_t size) {
  (void)ctx;
  return cudapeer_host_alloc(size);
}

static void ref_cu_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  (void)size;
  if (cudapeer_free_host(p) != 0)
    die("refpool-cuda: cuMemFreeHost failed: %s", cudapeer_last_error());
}

/* Allocate and use a block; *ctx gets the refpool block handle. */
static void *im_alloc(size_t size, void **ctx) {
  void *p = NULL;
  switch (g_im.kind) {
  case K_PINPOOL: {
    int rc = pinpool_alloc(g_im.pool, size, &p);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_alloc", rc);
    break;
  }
  case K_REFPOOL:
    p = refpool_alloc(g_im.ref, size, ctx);
    if (p == NULL)
      die("refpool_alloc(%zu) failed%s%s", size, g_im.cuda ? ": " : "",
          g_im.cuda ? cudapeer_last_error() : "");
    break;
  case K_RMMPOOL:
    p = rmmpool_alloc(g_im.rmm, size, g_cur_stream);
    if (p == NULL)
      die("rmmpool_alloc(%zu) failed", size);
    break;
  case K_NAIVE:
  case K_CUHOST:
    p = baseline_alloc(size);
    break;
  case K_MALLOC:
    p = malloc(size);
    if (p == NULL)
      die("malloc(%zu) failed", size);
    break;
  case K_FLOOR:
    p = floor_alloc(size);
    break;
  }
  use_block(p, size);
  return p;
}

static void im_free(void *p, size_t size, void *ctx) {
  switch (g_im.kind) {
  case K_PINPOOL: {
    int rc = pinpool_free(g_im.pool, p);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_free", rc);
    break;
  }
  case K_REFPOOL:
    refpool_free(g_im.ref, ctx);
    break;
  case K_RMMPOOL:
    rmmpool_free(g_im.rmm, p, size, 0, false);
    break;
  case K_NAIVE:
  case K_CUHOST:
    baseline_free(p, size);
    break;
  case K_MALLOC:
    free(p);
    break;
  case K_FLOOR:
    break;
  }
}

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

static void im_get_counters(im_counters_t *c) {
  memset(c, 0, sizeof *c);
  switch (g_im.kind) {
  case K_PINPOOL: {
    pinpool_stats_t s;
    int rc = pinpool_get_stats(g_im.pool, &s);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_get_stats", rc);
    c->known = true;
    c->backend_calls = s.backend_alloc.count + s.backend_free.count;
    c->reserved_peak = s.reserved_bytes.peak;
    c->reserved_now = s.reserved_bytes.current;
    c->requested_peak = s.requested_bytes.peak;
    c->mlock_failures = s.mlock_failures;
    break;
  }
  case K_REFPOOL: {
    refpool_stats_t s;
    refpool_get_stats(g_im.ref, &s);
    c->known = true;
    c->backend_calls = s.backend_allocs + s.backend_frees;
    c->reserved_peak = s.reserved_peak;
    c->reserved_now = s.reserved_bytes;
    c->mlock_failures = s.mlock_failures;
    break;
  }
  case K_RMMPOOL: {
    rmmpool_stats_t s;
    rmmpool_get_stats(g_im.rmm, &s);
    c->known = true;
    c->backend_calls = s.backend_allocs + s.backend_frees;
    c->reserved_peak = s.reserved_peak;
    c->reserved_now = s.reserved_bytes;
    c->mlock_failures = s.mlock_failures;
    break;
  }
  case K_FLOOR:
    c->known = true;
    c->reserved_peak = c->reserved_now = g_floor_len;
    break;
  case K_NAIVE:
  case K_CUHOST:
    c->known = true;
    c->backend_calls = atomic_load(&g_im.nv_calls);
    c->reserved_peak = atomic_load(&g_im.nv_peak);
    c->reserved_now = atomic_load(&g_im.nv_reserved);
    c->mlock_failures = atomic_load(&g_im.nv_mlock_fail);
    break;
  case K_MALLOC:
    c->calls_known = syscount_read(&c->backend_calls);
    break;
  }
  if (c->known)
    c->calls_known = true;
}

/* ---- Simulated streams (W4) ------------------------------------------------
 * Every implementation sees the same device model: pinpool's simulated
 * streams (events=simulated), one worker thread per stream running queued
 * "copies" in order. pinpool uses its own pool's streams and its event
 * provider; the others use a second pinpool pool only as a stream clock,
 * and learn completion from a counter the copy's callback increments. */

typedef struct wstream {
  pinpool_stream_t id;
  uint64_t copy_ns;
  uint64_t submitted; /* producer thread only */
  alignas(64) atomic_uint_fast64_t completed;
} wstream_t;

#define W4_STREAMS_PER_THREAD 2
static wstream_t g_streams[MAX_THREADS * W4_STREAMS_PER_THREAD + 1];
static pinpool_t *g_clock; /* the stream clock for non-pinpool impls */

static pinpool_t *stream_pool(void) {
  return g_im.kind == K_PINPOOL ? g_im.pool : g_clock;
}

/* refpool's events are simulated-stream items too, recorded the way
 * pinpool's simulated provider records them (a zero-length item queued on
 * the stream, complete when the stream's worker reaches it), so that both
 * pools pay the same per-event cost. */
static atomic_uchar *g_ref_events; /* done flags, one per event */
static atomic_uint_fast64_t g_ref_next;
static uint64_t g_ref_cap;

static void ref_event_done(void *arg) {
  atomic_store_explicit((atomic_uchar *)arg, 1, memory_order_release);
}

static int ref_record(void *ctx, uintptr_t stream, refpool_event_t *ev) {
  (void)ctx;
  uint64_t i = atomic_fetch_add_explicit(&g_ref_next, 1, memory_order_relaxed);
  if (i >= g_ref_cap)
    die("refpool: more events than planned");
  atomic_init(&g_ref_events[i], 0);
  int rc = pinpool_sim_submit(g_clock, (pinpool_stream_t)stream, 0,
                              ref_event_done, &g_ref_events[i]);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_sim_submit(event)", rc);
  ev->stream = stream;
  ev->ticket = i;
  return 0;
}

static int ref_query(void *ctx, const refpool_event_t *ev) {
  (void)ctx;
  return atomic_load_explicit(&g_ref_events[ev->ticket],
                              memory_order_acquire) != 0;
}

/* ---- Setup --------------------------------------------------------------- */

/* W1h's implementations: pinpool with history switched on after create.
 * The ring keeps its default size (100,000 entries), what a user who only
 * sets the level gets. */
typedef struct hist_variant {
  const char *name;
  int record;
  unsigned stack_depth;
  const char *desc;
} hist_variant_t;

static const hist_variant_t g_hist_variants[] = {
    {"pinpool-h-alloc", PINPOOL_HISTORY_ALLOC, 0,
     "history alloc, stack_depth 0, ring 100000"},
    {"pinpool-h-all", PINPOOL_HISTORY_ALL, 0,
     "history all, stack_depth 0, ring 100000"},
    {"pinpool-h-all16", PINPOOL_HISTORY_ALL, 16,
     "history all, stack_depth 16, ring 100000"},
};

/* The GPU implementations, measured where a CUDA driver and a device are
 * found (bench/run.sh asks --cuda-probe): pinpool on each CUDA backend,
 * and (im_setup) refpool-cuda, PyTorch's policy on cuMemHostAlloc, and
 * cuhostalloc, cuMemHostAlloc / cuMemFreeHost per request. */
typedef struct cuda_pool {
  const char *name;
  const char *config; /* appended to the workload's pool configuration */
} cuda_pool_t;

static const cuda_pool_t g_cuda_pools[] = {
    {"pinpool-cuda", ",backend=cuda,device=0"},
    {"pinpool-cuda-register", ",backend=cuda-register,device=0"},
};

static const cuda_pool_t *find_cuda_pool(const char *impl) {
  for (size_t i = 0; i < sizeof g_cuda_pools / sizeof g_cuda_pools[0]; i++)
    if (strcmp(g_cuda_pools[i].name, impl) == 0)
      return &g_cuda_pools[i];
  return NULL;
}

static bool is_cuda_impl(const char *impl) {
  return find_cuda_pool(impl) != NULL || strcmp(impl, "refpool-cuda") == 0 ||
         strcmp(impl, "cuhostalloc") == 0;
}

/* Open the driver for a GPU implementation, or stop with the reason. */
static void need_cuda(const char *impl) {
  char why[256] = "";
  if (cudapeer_open(why, sizeof why) != 0)
    die("--impl %s needs a CUDA driver and device: %s", impl, why);
}

static const hist_variant_t *find_hist_variant(const char *impl) {
  for (size_t i = 0; i < sizeof g_hist_variants / sizeof g_hist_variants[0];
       i++)
    if (strcmp(g_hist_variants[i].name, impl) == 0)
      return &g_hist_variants[i];
  return NULL;
}

/* variant: NULL, or the name of a pinpool variant and its extra config.
 * hist: whether the pinpool-h-* implementations are allowed (W1h). */
static void im_setup(const char *pool_config, const char *variant,
                     const char *variant_config, bool hist) {
  memset(&g_im, 0, sizeof g_im);
  const char *impl = g_opt.impl;
  bool var = variant != NULL && strcmp(impl, variant) == 0;
  const hist_variant_t *hv = hist ? find_hist_variant(impl) : NULL;
  const cuda_pool_t *cp = find_cuda_pool(impl);
  if (is_cuda_impl(impl))
    need_cuda(impl);
  if (strcmp(impl, "pinpool") == 0 || var || hv != NULL || cp != NULL) {
    g_im.kind = K_PINPOOL;
    g_im.name = var          ? variant
                : hv != NULL ? hv->name
                : cp != NULL ? cp->name
                             : "pinpool";
    snprintf(g_im.config, sizeof g_im.config, "%s%s", pool_config,
             var          ? variant_config
             : cp != NULL ? cp->config
                          : "");
    int rc = pinpool_create(g_im.config, &g_im.pool);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_create", rc);
    if (hv != NULL) {
      pinpool_history_options_t ho = {hv->record, 0, hv->stack_depth, 0};
      rc = pinpool_record_history(g_im.pool, &ho);
      if (rc != PINPOOL_OK)
        die_pp("pinpool_record_history", rc);
      size_t n = strlen(g_im.config);
      snprintf(g_im.config + n, sizeof g_im.config - n, " (%s)", hv->desc);
    }
  } else if (strcmp(impl, "refpool") == 0 ||
             strcmp(impl, "refpool-cuda") == 0) {
    static const refpool_events_t ev = {ref_record, ref_query, NULL};
    static const refpool_backend_t cu = {ref_cu_alloc, ref_cu_free, NULL};
    g_im.kind = K_REFPOOL;
    g_im.cuda = strcmp(impl, "refpool-cuda") == 0;
    g_im.name = g_im.cuda ? "refpool-cuda" : "refpool";
    snprintf(g_im.config, sizeof g_im.config,
             "pow2, no split, global event FIFO%s",
             g_im.cuda ? ", cuMemHostAlloc(PORTABLE) per block" : "");
    if (refpool_create(&ev, g_im.cuda ? &cu : NULL, &g_im.ref) != 0)
      die("refpool_create failed");
  } else if (strcmp(impl, "rmmpool") == 0) {
    static const refpool_events_t ev = {ref_record, ref_query, NULL};
    g_im.kind = K_RMMPOOL;
    g_im.name = "rmmpool";
    snprintf(g_im.config, sizeof g_im.config,
             "RMM pool_memory_resource policy: coalescing best fit, 256 B "
             "alignment, initial 0, grows by max(request, pool size), "
             "per-stream free lists");
    if (rmmpool_create(0, &ev, NULL, &g_im.rmm) != 0)
      die("rmmpool_create failed");
  } else if (strcmp(impl, "floor") == 0) {
    g_im.kind = K_FLOOR;
    g_im.name = "floor";
    snprintf(g_im.config, sizeof g_im.config,
             "pre-faulted region, a ring per thread sized to the live set, "
             "free is a no-op");
  } else if (strcmp(impl, "naive") == 0) {
    g_im.kind = K_NAIVE;
    g_im.name = "naive";
    snprintf(g_im.config, sizeof g_im.config,
             "mmap+MAP_POPULATE+mlock / munlock+munmap per block");
  } else if (strcmp(impl, "cuhostalloc") == 0) {
    g_im.kind = K_CUHOST;
    g_im.cuda = true;
    g_im.name = "cuhostalloc";
    snprintf(g_im.config, sizeof g_im.config,
             "cuMemHostAlloc(PORTABLE) / cuMemFreeHost per block");
  } else if (strcmp(impl, "malloc") == 0) {
    g_im.kind = K_MALLOC;
    g_im.name = g_opt.name != NULL ? g_opt.name : PEER_NAME;
    /* A tuned peer is the same executable under its tuning variable (set by
     * bench/run.sh before the process starts: tcmalloc reads it then). */
    const char *rr = getenv("TCMALLOC_RELEASE_RATE");
    if (strcmp(PEER_NAME, "tcmalloc") == 0 && rr != NULL)
      snprintf(g_im.config, sizeof g_im.config,
               "%s malloc/free, TCMALLOC_RELEASE_RATE=%s", PEER_NAME, rr);
    else
      snprintf(g_im.config, sizeof g_im.config, "%s malloc/free, defaults",
               PEER_NAME);
    /* Its backend calls: counted on every thread that calls it (here for
     * W6's main thread, worker_main for the workers). */
    (void)syscount_init(g_syscount_why, sizeof g_syscount_why);
  } else {
    die("unknown --impl '%s'", impl);
  }
  if (g_opt.name != NULL && g_im.kind != K_MALLOC)
    die("--name renames a malloc peer only");
  /* Every implementation's blocks are used the same way (use_block). */
  g_im.touch = g_opt.touch;
  g_im.mode = g_opt.touch ? "touch" : "alloc";
  if (g_im.kind == K_FLOOR && !g_opt.touch)
    die("the floor is measured in touch mode only");
}

static void im_teardown(void) {
  if (g_im.kind == K_PINPOOL) {
    pinpool_destroy(g_im.pool);
    g_im.pool = NULL;
  } else if (g_im.kind == K_REFPOOL) {
    refpool_destroy(g_im.ref);
    g_im.ref = NULL;
  } else if (g_im.kind == K_RMMPOOL) {
    rmmpool_destroy(g_im.rmm);
    g_im.rmm = NULL;
  } else if (g_im.kind == K_FLOOR && g_floor_base != NULL) {
    munmap(g_floor_base, g_floor_len);
    g_floor_base = NULL;
  }
}

/* Check that malloc really is this binary's peer (not glibc by accident).
 * Sanitizer builds replace malloc themselves: nothing to check. */
static void check_peer(void) {
#ifdef PP_BENCH_SANITIZED
  return;
#endif
  Dl_info info;
  void *(*fn)(size_t) = malloc;
  if (dladdr((void *)(uintptr_t)fn, &info) == 0 || info.dli_fname == NULL)
    return; /* cannot tell */
  if (strstr(info.dli_fname, PEER_LIB) == NULL)
    die("malloc comes from %s, expected %s (%s)", info.dli_fname, PEER_LIB,
        PEER_NAME);
}

/* ---- Requested bytes, tracked by the harness for every implementation ---- */

typedef struct tcount {
  alignas(64) atomic_uint_fast64_t allocated;
  atomic_uint_fast64_t freed;
  uint64_t peak_seen; /* owner only */
  unsigned tick;      /* owner only */
} tcount_t;

static tcount_t g_req[MAX_THREADS];
static int g_req_n = 1;

static void req_reset(int nthreads) {
  for (int i = 0; i < MAX_THREADS; i++) {
    atomic_store(&g_req[i].allocated, 0);
    atomic_store(&g_req[i].freed, 0);
    g_req[i].peak_seen = 0;
    g_req[i].tick = 0;
  }
  g_req_n = nthreads;
}

static uint64_t req_live(void) {
  uint64_t a = 0, f = 0;
  for (int i = 0; i < g_req_n; i++) {
    a += atomic_load_explicit(&g_req[i].allocated, memory_order_relaxed);
    f += atomic_load_explicit(&g_req[i].freed, memory_order_relaxed);
  }
  return a - f;
}

/* Thread t allocated `size` bytes. The live total is sampled on every
 * allocation with one thread, every 8th with two (reading the other
 * thread's counters costs a cache miss). */
static void req_alloc(int t, size_t size) {
  tcount_t *c = &g_req[t];
  atomic_store_explicit(
      &c->allocated,
      atomic_load_explicit(&c->allocated, memory_order_relaxed) + size,
      memory_order_relaxed);
  if (g_req_n == 1 || (++c->tick & 7) == 0) {
    uint64_t live = req_live();
    if (live > c->peak_seen)
      c->peak_seen = live;
  }
}

/* Sample the live total now (a workload with few, large allocations, W6,
 * where every eighth would miss the peak). */
static void req_sample(int t) {
  uint64_t live = req_live();
  if (live > g_req[t].peak_seen)
    g_req[t].peak_seen = live;
}

static void req_free(int t, size_t size) {
  tcount_t *c = &g_req[t];
  atomic_store_explicit(
      &c->freed, atomic_load_explicit(&c->freed, memory_order_relaxed) + size,
      memory_order_relaxed);
}

static uint64_t req_peak(void) {
  uint64_t pk = 0;
  for (int i = 0; i < g_req_n; i++)
    if (g_req[i].peak_seen > pk)
      pk = g_req[i].peak_seen;
  return pk;
}

/* ---- Records ------------------------------------------------------------- */

typedef struct rec {
  char workload[8];
  char kase[96];
  char text[4096];
  size_t len;
} rec_t;

static rec_t g_rec;

static void rec_begin(const char *workload, const char *kase) {
  memset(&g_rec, 0, sizeof g_rec);
  snprintf(g_rec.workload, sizeof g_rec.workload, "%s", workload);
  snprintf(g_rec.kase, sizeof g_rec.kase, "%s", kase);
}

static void rec_num(const char *key, double v) {
  if (!isfinite(v))
    return;
  if (g_rec.len + 64 + strlen(key) >= sizeof g_rec.text)
    return;
  g_rec.len +=
      (size_t)snprintf(g_rec.text + g_rec.len, sizeof g_rec.text - g_rec.len,
                       "\t%s=%.9g", key, v);
}

static void note(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  for (char *c = buf; *c; c++)
    if (*c == '\t' || *c == '\n')
      *c = ' ';
  printf("N\t%s\t%s\t%s\t%s\t%d\t%s\n", g_rec.workload, g_rec.kase, g_im.name,
         g_im.mode, g_opt.threads, buf);
}

static void rec_end(void) {
  printf("R\t%s\t%s\t%s\t%s\t%d\t%d\t%s%s\n", g_rec.workload, g_rec.kase,
         g_im.name, g_im.mode, g_opt.threads, g_opt.rep, g_im.config,
         g_rec.text);
  fflush(stdout);
}

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

static void rec_common(const common_t *c) {
  im_counters_t ic;
  im_get_counters(&ic);
  rec_num("ns_med", samples_quantile(c->ns, 0.5));
  rec_num("ns_p99", samples_quantile(c->ns, 0.99));
  rec_num("ns_mean", samples_mean(c->ns));
  rec_num("ops", (double)c->ops);
  rec_num("ops_per_s",
          c->wall_ns ? (double)c->ops * 1e9 / (double)c->wall_ns : 0.0);
  rec_num("minflt_per_op", c->ops ? (double)c->minflt / (double)c->ops : 0.0);
  if (c->backend_known)
    rec_num("backend_calls", (double)c->backend_calls);
  else if (g_im.kind == K_MALLOC)
    note("backend calls (memory system calls) not counted: %s",
         g_syscount_why[0] ? g_syscount_why : "a thread's counters failed");
  if (ic.calls_known)
    rec_num("backend_calls_total", (double)ic.backend_calls);

  uint64_t req = req_peak();
  uint64_t rss = rss_peak_delta();
  if (g_im.kind == K_PINPOOL && ic.requested_peak > 0)
    req = ic.requested_peak; /* the pool's own exact tracking */
  rec_num("requested_peak_mib", (double)req / (double)MIB);
  if (g_hwm_reset)
    rec_num("rss_peak_mib", (double)rss / (double)MIB);
  if (ic.known) {
    rec_num("reserved_peak_mib", (double)ic.reserved_peak / (double)MIB);
    if (req > 0)
      rec_num("overhead", (double)ic.reserved_peak / (double)req);
    if (ic.mlock_failures > 0)
      note("%llu mlock failures (RLIMIT_MEMLOCK?): memory not locked",
           (unsigned long long)ic.mlock_failures);
    if (g_im.kind == K_PINPOOL) {
      /* Where the held memory is at the end (fragmentation, issue 21):
       * free inside the arena's chunks, and idle in caches. */
      pinpool_stats_t s;
      if (pinpool_get_stats(g_im.pool, &s) == PINPOOL_OK) {
        rec_num("chunks", (double)s.arena_chunks);
        rec_num("chunk_free_mib", (double)s.chunk_free_bytes / (double)MIB);
        rec_num("free_extents", (double)s.free_extents);
        rec_num("largest_free_mib",
                (double)s.largest_free_extent / (double)MIB);
        rec_num("cached_mib", (double)s.cached_bytes.current / (double)MIB);
      }
    }
  } else if (req > 0 && g_hwm_reset) {
    rec_num("overhead", (double)rss / (double)req);
  }
  if (req > 0 && g_hwm_reset)
    rec_num("rss_overhead", (double)rss / (double)req);
}

/* ---- Threads ------------------------------------------------------------- */

static pthread_barrier_t g_barrier;

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

static void *worker_main(void *arg) {
  worker_t *w = arg;
  g_tidx = w->idx;
  if (g_im.kind == K_MALLOC)
    syscount_thread_start();
  if (g_opt.threads > 1)
    pin_self(w->idx);
  if (g_im.cuda && cudapeer_enter() != 0)
    die("cuCtxSetCurrent failed: %s", cudapeer_last_error());
  return w->fn(w);
}

/* Run fn on n threads (pinned to distinct CPUs when n > 1); the workers
 * meet at g_barrier (count n + 1: the caller waits there too). */
static void run_workers(worker_t *ws, int n, void *(*fn)(worker_t *),
                        void *arg) {
  pthread_barrier_init(&g_barrier, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++) {
    ws[i].idx = i;
    ws[i].fn = fn;
    ws[i].arg = arg;
    if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
      die("pthread_create failed");
  }
}

static void join_workers(worker_t *ws, int n) {
  for (int i = 0; i < n; i++)
    pthread_join(ws[i].th, NULL);
  pthread_barrier_destroy(&g_barrier);
}

/* Wall time from the earliest start to the latest end. */
static uint64_t workers_wall(const worker_t *ws, int n) {
  uint64_t s = UINT64_MAX, e = 0;
  for (int i = 0; i < n; i++) {
    if (ws[i].t_start < s)
      s = ws[i].t_start;
    if (ws[i].t_end > e)
      e = ws[i].t_end;
  }
  return e > s ? e - s : 1;
}

static const char *size_str(size_t size, char *buf, size_t len) {
  if (size >= GIB && size % GIB == 0)
    snprintf(buf, len, "%zuGiB", size / GIB);
  else if (size >= MIB && size % MIB == 0)
    snprintf(buf, len, "%zuMiB", size / MIB);
  else if (size >= MIB)
    snprintf(buf, len, "%.1fMiB", (double)size / (double)MIB);
  else if (size >= KIB && size % KIB == 0)
    snprintf(buf, len, "%zuKiB", size / KIB);
  else
    snprintf(buf, len, "%zuB", size);
  return buf;
}

/* ==== W1: hot reuse =========================================================
 * Each thread allocates and frees one size in a loop. Pairs are timed in
 * groups of k (a group lasts >= 4 us, so the clock's cost is amortized;
 * k = 1 for slow pairs); ns_med is the median of the groups' ns per pair,
 * ns_p99 their 99th percentile. */

static const size_t w1_sizes[] = {4 * KIB, 64 * KIB, 1 * MIB, 64 * MIB,
                                  1 * GIB};

/* Quick: up to 64 MiB with 1 thread, 1 MiB with 2; full: every size (with
 * 2 threads, 2 GiB live in the 1 GiB case). */
static int w1_ncases(void) {
  if (!g_opt.quick)
    return 5;
  return g_opt.threads > 1 ? 3 : 4;
}

/* One pinpool alloc+free pair that writes a byte of the block: W1's (and
 * W1h's) timed loop and W8's allocating threads. Inlined, so that W1 times
 * the pair itself. */
static inline __attribute__((always_inline)) void pool_pair(size_t size,
                                                            uint64_t i) {
  void *p;
  int rc = pinpool_alloc(g_im.pool, size, &p);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_alloc", rc);
  *(volatile unsigned char *)p = (unsigned char)i;
  g_sink = p;
  rc = pinpool_free(g_im.pool, p);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_free", rc);
}

/* W1's use of a block: nothing (alloc mode) or one byte per page (touch
 * mode), as use_block, inlined into the timed loops. */
static inline __attribute__((always_inline)) void w1_use(void *p, size_t size,
                                                         uint64_t i) {
  if (g_im.touch) {
    volatile unsigned char *b = p;
    for (size_t off = 0; off < size; off += PAGE)
      b[off] = (unsigned char)i;
  }
  g_sink = p;
}

static void w1_pairs(size_t size, uint64_t n) {
  switch (g_im.kind) {
  case K_PINPOOL:
    for (uint64_t i = 0; i < n; i++) {
      void *p;
      int rc = pinpool_alloc(g_im.pool, size, &p);
      if (rc != PINPOOL_OK)
        die_pp("pinpool_alloc", rc);
      w1_use(p, size, i);
      rc = pinpool_free(g_im.pool, p);
      if (rc != PINPOOL_OK)
        die_pp("pinpool_free", rc);
    }
    break;
  case K_REFPOOL:
    for (uint64_t i = 0; i < n; i++) {
      void *ctx = NULL;
      void *p = refpool_alloc(g_im.ref, size, &ctx);
      if (p == NULL)
        die("refpool_alloc(%zu) failed%s%s", size, g_im.cuda ? ": " : "",
            g_im.cuda ? cudapeer_last_error() : "");
      w1_use(p, size, i);
      refpool_free(g_im.ref, ctx);
    }
    break;
  case K_RMMPOOL:
    for (uint64_t i = 0; i < n; i++) {
      void *p = rmmpool_alloc(g_im.rmm, size, 0);
      if (p == NULL)
        die("rmmpool_alloc(%zu) failed", size);
      w1_use(p, size, i);
      rmmpool_free(g_im.rmm, p, size, 0, false);
    }
    break;
  case K_NAIVE:
  case K_CUHOST:
    for (uint64_t i = 0; i < n; i++) {
      void *p = baseline_alloc(size);
      w1_use(p, size, i);
      baseline_free(p, size);
    }
    break;
  case K_MALLOC:
    for (uint64_t i = 0; i < n; i++) {
      unsigned char *p = malloc(size);
      if (p == NULL)
        die("malloc(%zu) failed", size);
      w1_use(p, size, i);
      free(p);
    }
    break;
  case K_FLOOR:
    for (uint64_t i = 0; i < n; i++)
      w1_use(floor_alloc(size), size, i);
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
  uint64_t tw = now_ns();
  w1_pairs(a->size, 1);
  tw = now_ns() - tw;
  w1_pairs(a->size, a->warm_pairs);
  for (;;) {
    uint64_t t0 = now_ns();
    w1_pairs(a->size, n);
    t = now_ns() - t0;
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
  samples_init(&w->ns, groups);
  pthread_barrier_wait(&g_barrier); /* calibrated */
  pthread_barrier_wait(&g_barrier); /* counters taken: go */
  w->t_start = now_ns();
  for (uint64_t g = 0; g < groups; g++) {
    uint64_t t0 = now_ns();
    w1_pairs(a->size, group);
    samples_add(&w->ns, (now_ns() - t0 + group / 2) / group);
  }
  w->t_end = now_ns();
  w->ops = groups * group;
  w->extra[0] = (double)group;
  pthread_barrier_wait(&g_barrier); /* timed pairs done */
  pthread_barrier_wait(&g_barrier); /* counters taken: exit */
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
  w1_arg_t a = {w1_sizes[ci], g_opt.quick ? 10e6 : 60e6,
                strcmp(workload, "W1h") == 0 ? 51000 : 0};
  memset(ws, 0, sizeof ws);
  size_str(a.size, sz, sizeof sz);
  rec_begin(workload, sz);
  floor_prepare(a.size, g_opt.threads); /* the block, reused */
  req_reset(g_opt.threads);
  rss_begin();
  run_workers(ws, g_opt.threads, w1_thread, &a);
  /* The counters are read between barriers, so that their window is the
   * timed pairs exactly: no calibration pair in it, none left out, and not
   * the threads' exit (glibc releases a thread's stack with madvise, a
   * system call a malloc peer's count would include). */
  pthread_barrier_wait(&g_barrier);
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  pthread_barrier_wait(&g_barrier);
  join_workers(ws, g_opt.threads);

  samples_t all;
  samples_init(&all, 1024);
  uint64_t ops = 0;
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&all, &ws[i].ns);
    ops += ws[i].ops;
  }
  for (int i = 0; i < g_opt.threads; i++)
    g_req[i].peak_seen = a.size * (uint64_t)g_opt.threads;
  common_t c = {&all,
                ops,
                workers_wall(ws, g_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  rec_common(&c);
  rec_num("size", (double)a.size);
  rec_num("pairs_per_sample", ws[0].extra[0]);
  if (g_im.kind == K_PINPOOL) {
    pinpool_stats_t s;
    pinpool_get_stats(g_im.pool, &s);
    uint64_t allocs = s.cache_hits + s.cache_misses;
    rec_num("tcache_hit_pct",
            allocs ? 100.0 * (double)s.tcache_hits / (double)allocs : 0.0);
  }
  rec_end();
  samples_free(&all);
  for (int i = 0; i < g_opt.threads; i++)
    samples_free(&ws[i].ns);
}

static void w1_run(int ci) { w1_measure("W1", ci); }

/* ==== W1h: the history's cost on the hot path ================================
 * W1's cached pair (4 KiB, 64 KiB, 1 MiB; one thread) with history off
 * (impl "pinpool") and on at three levels (impls pinpool-h-*, see
 * g_hist_variants). The variants differ from "pinpool" only by the
 * pinpool_record_history call after create, so time ÷ pinpool is the cost
 * of recording; with level alloc or all each pair records two events. */

static int w1h_ncases(void) { return 3; }

static void w1h_run(int ci) { w1_measure("W1h", ci); }

/* ==== Measured phases ========================================================
 * A measured phase lasts at least min_ops operations and at least min_ns
 * (so that fast implementations are timed long enough for a preemption not
 * to dominate), and at most max_ops operations. */

typedef struct span {
  uint64_t min_ops, max_ops, min_ns;
} span_t;

static bool span_done(const span_t *s, uint64_t done, uint64_t elapsed_ns) {
  return done >= s->max_ops || (done >= s->min_ops && elapsed_ns >= s->min_ns);
}

static uint64_t min_phase_ns(void) {
  return g_opt.quick ? 10000000u : 200000000u;
}

typedef struct lblock {
  void *p;
  void *ctx;
  size_t size;
} lblock_t;

/* ==== W2: log-uniform sizes, live set capped =================================
 * Each thread keeps a live set under live / threads bytes: per operation it
 * draws a log-uniform size in [lo, hi], frees random live blocks until the
 * new one fits, allocates it and uses it (use_block). The sequence of sizes
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
static int w2_ncases(void) { return g_opt.quick ? 1 : 12; }

typedef struct w2_arg {
  size_t cap; /* per thread */
  size_t lo, hi;
  uint64_t steady; /* operations per thread after the fill */
} w2_arg_t;

static uint64_t thread_minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return (uint64_t)ru.ru_minflt;
}

/* extra[]: 0 fill ops, 1 fill ns, 2 fill faults, 3 late ops, 4 late ns,
 * 5 late faults, 6 steady faults (this thread's). */
static void *w2_thread(worker_t *w) {
  const w2_arg_t *a = w->arg;
  size_t maxlive = a->cap / a->lo + 2;
  lblock_t *live = xmalloc(maxlive * sizeof *live);
  size_t nlive = 0, bytes = 0;
  rng_t r = {0x5eed0002u + (uint64_t)w->idx * 7919u};
  bool steady = false;
  uint64_t i, n_steady = 0, t_fill = 0, f_fill = 0, t_half = 0, f_half = 0;
  uint64_t f_start = 0;
  samples_init(&w->ns, a->steady);
  pthread_barrier_wait(&g_barrier); /* start: the fill */
  uint64_t t_fill0 = now_ns(), f_fill0 = thread_minflt();
  for (i = 0;; i++) {
    size_t s = log_uniform(&r, a->lo, a->hi);
    if (!steady && bytes + s > a->cap && nlive > 0) {
      /* Operation F: the fill ends here, for every implementation. */
      t_fill = now_ns() - t_fill0;
      f_fill = thread_minflt() - f_fill0;
      w->extra[0] = (double)i;
      pthread_barrier_wait(&g_barrier); /* fill done */
      pthread_barrier_wait(&g_barrier); /* counters taken */
      steady = true;
      f_start = thread_minflt();
      w->t_start = now_ns();
    }
    if (steady && n_steady == a->steady / 2) {
      t_half = now_ns();
      f_half = thread_minflt();
    }
    if (steady && n_steady == a->steady)
      break;
    uint64_t t0 = now_ns();
    while (bytes + s > a->cap && nlive > 0) {
      size_t k = rng_below(&r, nlive);
      im_free(live[k].p, live[k].size, live[k].ctx);
      req_free(w->idx, live[k].size);
      bytes -= live[k].size;
      live[k] = live[--nlive];
    }
    void *ctx = NULL;
    void *p = im_alloc(s, &ctx);
    uint64_t t1 = now_ns();
    req_alloc(w->idx, s);
    live[nlive++] = (lblock_t){p, ctx, s};
    bytes += s;
    if (steady) {
      samples_add(&w->ns, t1 - t0);
      n_steady++;
    }
  }
  w->t_end = now_ns();
  uint64_t f_end = thread_minflt();
  w->ops = n_steady;
  w->extra[1] = (double)t_fill;
  w->extra[2] = (double)f_fill;
  w->extra[3] = (double)(n_steady - a->steady / 2);
  w->extra[4] = (double)(w->t_end - t_half);
  w->extra[5] = (double)(f_end - f_half);
  w->extra[6] = (double)(f_end - f_start);
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  pthread_barrier_wait(&g_barrier); /* counters taken: clean up */
  for (size_t k = 0; k < nlive; k++)
    im_free(live[k].p, live[k].size, live[k].ctx);
  free(live);
  return NULL;
}

static void w2_run(int ci) {
  worker_t ws[MAX_THREADS];
  w2_arg_t a;
  char name[96], b1[32], b2[32], b3[32];
  const w2_case_t *wc = &w2_cases[ci];
  memset(ws, 0, sizeof ws);
  a.cap = wc->live / (size_t)g_opt.threads;
  a.lo = wc->lo;
  a.hi = wc->hi;
  a.steady = g_opt.quick ? 1000 : 10000;
  snprintf(name, sizeof name, "%s-%s live<=%s", size_str(a.lo, b1, sizeof b1),
           size_str(a.hi, b2, sizeof b2), size_str(wc->live, b3, sizeof b3));
  rec_begin("W2", name);
  floor_prepare(a.cap + a.hi, g_opt.threads);
  req_reset(g_opt.threads);
  rss_begin();
  run_workers(ws, g_opt.threads, w2_thread, &a);
  pthread_barrier_wait(&g_barrier); /* start */
  im_counters_t cf;
  im_get_counters(&cf);
  pthread_barrier_wait(&g_barrier); /* fill done */
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier); /* go */
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  /* The workers free their live sets only now: not in the measured
   * phase's counters. */
  pthread_barrier_wait(&g_barrier);
  join_workers(ws, g_opt.threads);

  samples_t all;
  samples_init(&all, 1024);
  uint64_t ops = 0;
  double fill_ops = 0, fill_ns = 0, fill_flt = 0, late_ops = 0, late_ns = 0,
         late_flt = 0;
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&all, &ws[i].ns);
    ops += ws[i].ops;
    samples_free(&ws[i].ns);
    fill_ops += ws[i].extra[0];
    if (ws[i].extra[1] > fill_ns) /* the threads fill side by side */
      fill_ns = ws[i].extra[1];
    fill_flt += ws[i].extra[2];
    late_ops += ws[i].extra[3];
    if (ws[i].extra[4] > late_ns)
      late_ns = ws[i].extra[4];
    late_flt += ws[i].extra[5];
  }
  common_t c = {&all,
                ops,
                workers_wall(ws, g_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  rec_common(&c);
  rec_num("live_cap_mib", (double)wc->live / MIB);
  rec_num("steady_ops_per_thread", (double)a.steady);
  rec_num("fill_ops", fill_ops);
  if (fill_ops > 0) {
    rec_num("fill_ops_per_s", fill_ns > 0 ? fill_ops * 1e9 / fill_ns : 0);
    rec_num("fill_minflt_per_op", fill_flt / fill_ops);
  }
  if (cf.calls_known && c0.calls_known)
    rec_num("fill_backend_calls",
            (double)(c0.backend_calls - cf.backend_calls));
  if (late_ops > 0) {
    rec_num("late_ops_per_s", late_ns > 0 ? late_ops * 1e9 / late_ns : 0);
    rec_num("late_minflt_per_op", late_flt / late_ops);
  }
  rec_end();
  samples_free(&all);
}

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
  samples_init(&w->ns, a->span.min_ops * 2);
  samples_init(&w->ns2, a->span.min_ops * 2);
  pthread_barrier_wait(&g_barrier);
  for (i = 0;; i++) {
    if (i == a->warm) {
      pthread_barrier_wait(&g_barrier);
      pthread_barrier_wait(&g_barrier);
      w->t_start = t1 = now_ns();
    }
    if (i >= a->warm && span_done(&a->span, i - a->warm, t1 - w->t_start))
      break;
    if (qn == a->depth) {
      uint64_t t0 = now_ns();
      im_free(q[qh].p, q[qh].size, q[qh].ctx);
      uint64_t tf = now_ns();
      req_free(0, q[qh].size);
      if (i >= a->warm)
        samples_add(&w->ns2, tf - t0);
      qh = (qh + 1) % 8;
      qn--;
    }
    void *ctx = NULL;
    uint64_t t0 = now_ns();
    void *p = im_alloc(a->size, &ctx);
    t1 = now_ns();
    req_alloc(0, a->size);
    if (i >= a->warm)
      samples_add(&w->ns, t1 - t0);
    q[(qh + qn) % 8] = (lblock_t){p, ctx, a->size};
    qn++;
  }
  w->t_end = now_ns();
  w->ops = i - a->warm;
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  pthread_barrier_wait(&g_barrier); /* counters taken: clean up */
  while (qn > 0) {
    im_free(q[qh].p, q[qh].size, q[qh].ctx);
    qh = (qh + 1) % 8;
    qn--;
  }
  return NULL;
}

static void w3_producer(worker_t *w, w3_arg_t *a) {
  uint64_t i, t1 = 0;
  for (i = 0;; i++) {
    if (i == a->warm) {
      pthread_barrier_wait(&g_barrier);
      pthread_barrier_wait(&g_barrier);
      w->t_start = t1 = now_ns();
    }
    if (i >= a->warm && span_done(&a->span, i - a->warm, t1 - w->t_start))
      break;
    void *ctx = NULL;
    uint64_t t0 = now_ns();
    void *p = im_alloc(a->size, &ctx);
    t1 = now_ns();
    req_alloc(0, a->size);
    if (i >= a->warm)
      samples_add(&w->ns, t1 - t0);
    uint64_t tail = atomic_load_explicit(&a->tail, memory_order_relaxed);
    while (tail - atomic_load_explicit(&a->head, memory_order_acquire) >=
           a->depth)
      cpu_relax();
    a->ring[tail % 8] = (lblock_t){p, ctx, a->size};
    atomic_store_explicit(&a->tail, tail + 1, memory_order_release);
  }
  atomic_store_explicit(&a->done, true, memory_order_release);
  while (atomic_load_explicit(&a->head, memory_order_acquire) !=
         atomic_load_explicit(&a->tail, memory_order_relaxed))
    cpu_relax();
  w->t_end = now_ns();
  w->ops = i - a->warm;
}

static void w3_consumer(worker_t *w, w3_arg_t *a) {
  uint64_t consumed = 0;
  bool warmed = false;
  for (;;) {
    if (consumed == a->warm && !warmed) {
      warmed = true;
      pthread_barrier_wait(&g_barrier);
      pthread_barrier_wait(&g_barrier);
      w->t_start = now_ns();
    }
    uint64_t head = atomic_load_explicit(&a->head, memory_order_relaxed);
    if (atomic_load_explicit(&a->tail, memory_order_acquire) == head) {
      if (atomic_load_explicit(&a->done, memory_order_acquire) &&
          atomic_load_explicit(&a->tail, memory_order_acquire) == head)
        break;
      cpu_relax();
      continue;
    }
    lblock_t b = a->ring[head % 8];
    uint64_t t0 = now_ns();
    im_free(b.p, b.size, b.ctx);
    uint64_t t1 = now_ns();
    req_free(1, b.size);
    if (consumed >= a->warm)
      samples_add(&w->ns2, t1 - t0);
    consumed++;
    atomic_store_explicit(&a->head, head + 1, memory_order_release);
  }
  w->t_end = now_ns();
}

static void *w3_pair(worker_t *w) {
  w3_arg_t *a = w->arg;
  samples_init(&w->ns, a->span.min_ops * 2);
  samples_init(&w->ns2, a->span.min_ops * 2);
  pthread_barrier_wait(&g_barrier);
  if (w->idx == 0)
    w3_producer(w, a);
  else
    w3_consumer(w, a);
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  pthread_barrier_wait(&g_barrier); /* counters taken: exit */
  return NULL;
}

typedef struct w3_case {
  size_t size;
  unsigned depth;
} w3_case_t;

static const w3_case_t w3_full[] = {
    {38535168, 2}, {38535168, 4}, {154140672, 2}};
static const w3_case_t w3_quick[] = {{9633792, 2}, {9633792, 4}};

static int w3_ncases(void) { return g_opt.quick ? 2 : 3; }

static void w3_run(int ci) {
  worker_t ws[MAX_THREADS];
  static w3_arg_t a;
  char name[96], sz[32];
  const w3_case_t *wc = g_opt.quick ? &w3_quick[ci] : &w3_full[ci];
  memset(ws, 0, sizeof ws);
  memset(&a, 0, sizeof a);
  a.size = wc->size;
  a.depth = wc->depth;
  a.warm = 3 * a.depth + 4; /* every block in flight allocated once */
  a.span = (span_t){g_opt.quick ? 6 : (a.size > 64 * MIB ? 8 : 20), 1000000,
                    min_phase_ns()};
  atomic_init(&a.head, 0);
  atomic_init(&a.tail, 0);
  atomic_init(&a.done, false);
  snprintf(name, sizeof name, "%s batch, depth %u",
           size_str(a.size, sz, sizeof sz), a.depth);
  rec_begin("W3", name);
  floor_prepare(a.size * (a.depth + 2), g_opt.threads);
  req_reset(g_opt.threads);
  rss_begin();
  run_workers(ws, g_opt.threads, g_opt.threads > 1 ? w3_pair : w3_single, &a);
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  pthread_barrier_wait(&g_barrier); /* the workers' exit: not counted */
  join_workers(ws, g_opt.threads);

  samples_t alloc_ns, free_ns;
  samples_init(&alloc_ns, 64);
  samples_init(&free_ns, 64);
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&alloc_ns, &ws[i].ns);
    samples_merge(&free_ns, &ws[i].ns2);
    samples_free(&ws[i].ns);
    samples_free(&ws[i].ns2);
  }
  common_t c = {&alloc_ns,
                ws[0].ops,
                workers_wall(ws, g_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  rec_common(&c);
  rec_num("free_ns_med", samples_quantile(&free_ns, 0.5));
  rec_num("free_ns_p99", samples_quantile(&free_ns, 0.99));
  rec_num("batch_mib", (double)a.size / MIB);
  rec_num("depth", a.depth);
  rec_end();
  samples_free(&alloc_ns);
  samples_free(&free_ns);
}

/* ==== W4: stream-ordered frees ===============================================
 * Each thread stages 1 MiB blocks through two simulated streams: a fast one
 * (each copy 50 us) and a slow one (2 ms). Per block: allocate, use, queue
 * a copy on a stream, free it at once (stream-ordered): pinpool records the
 * stream (pinpool_record_stream, events=simulated); refpool records its
 * event (an item on the same simulated stream, as pinpool's provider does)
 * on its global FIFO; malloc peers and naive go through a shim that keeps
 * the block on a per-stream queue and frees it when the stream's completion
 * counter passes the copy. At most 4 copies are in flight per stream (the
 * producer prefers the streams in turn and waits when both are full).
 * Timed per op: the shim's drain + allocation + use, and record + free (or
 * the shim's queueing); not the copy's submission nor the waits.
 *
 * Reuse lag: when an allocation returns an address whose last copy
 * completed at time T, lag = now - T, attributed to that copy's stream.
 * An address handed out before its copy completed is an early reuse (a
 * correctness failure; must be 0). "need" = bytes allocated and not yet
 * freed or whose copy has not completed; overhead = reserved (RSS for
 * malloc) peak / need peak. */

#define W4_DEPTH 4
#define W4_SIZE (1 * MIB)

typedef struct w4_op {
  void *p;
  int stream;      /* index in g_streams */
  uint64_t t_free; /* when the producer's free returned */
  atomic_uint_fast64_t t_done;
} w4_op_t;

typedef struct w4_copy {
  w4_op_t *op;
  wstream_t *st;
} w4_copy_t;

typedef struct shim_item {
  void *p;
  uint64_t ticket;
  const atomic_uint_fast64_t *t_done; /* of the block's copy */
} shim_item_t;

typedef struct w4_arg {
  uint64_t ops; /* per thread */
} w4_arg_t;

static atomic_uint_fast64_t g_w4_allocs, g_w4_done;

static void w4_copy_done(void *arg) {
  w4_copy_t *c = arg;
  atomic_store_explicit(&c->op->t_done, now_ns(), memory_order_relaxed);
  atomic_fetch_add_explicit(&g_w4_done, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->st->completed, 1, memory_order_release);
}

/* Address -> index of the op that last used it (open addressing). */
typedef struct addrmap {
  uintptr_t *key;
  uint64_t *val;
  size_t cap;
} addrmap_t;

static size_t addr_hash(uintptr_t a, size_t cap) {
  uint64_t x = (uint64_t)a * 0x9e3779b97f4a7c15ULL;
  return (size_t)(x >> 17) & (cap - 1);
}

static void addrmap_put(addrmap_t *m, uintptr_t a, uint64_t v) {
  size_t i = addr_hash(a, m->cap);
  while (m->key[i] != 0 && m->key[i] != a)
    i = (i + 1) & (m->cap - 1);
  m->key[i] = a;
  m->val[i] = v;
}

static bool addrmap_get(const addrmap_t *m, uintptr_t a, uint64_t *v) {
  size_t i = addr_hash(a, m->cap);
  while (m->key[i] != 0) {
    if (m->key[i] == a) {
      *v = m->val[i];
      return true;
    }
    i = (i + 1) & (m->cap - 1);
  }
  return false;
}

typedef struct shimq {
  shim_item_t *v;
  size_t head, n, cap;
  uint64_t reclaimed, reclaim_ns; /* copy done -> handed back to malloc */
} shimq_t;

static void shim_push(shimq_t *q, shim_item_t it) {
  if (q->n == q->cap) {
    size_t ncap = q->cap ? q->cap * 2 : 64;
    shim_item_t *nv = xmalloc(ncap * sizeof *nv);
    for (size_t i = 0; i < q->n; i++)
      nv[i] = q->v[(q->head + i) % q->cap];
    free(q->v);
    q->v = nv;
    q->cap = ncap;
    q->head = 0;
  }
  q->v[(q->head + q->n) % q->cap] = it;
  q->n++;
}

/* Free (to malloc / naive) every queued block whose copy completed. */
static void shim_drain(shimq_t *q, wstream_t *st, bool count) {
  uint64_t done = atomic_load_explicit(&st->completed, memory_order_acquire);
  uint64_t now = count && q->n > 0 ? now_ns() : 0;
  while (q->n > 0 && q->v[q->head].ticket <= done) {
    if (count) {
      uint64_t td =
          atomic_load_explicit(q->v[q->head].t_done, memory_order_relaxed);
      q->reclaimed++;
      q->reclaim_ns += now > td ? now - td : 0;
    }
    im_free(q->v[q->head].p, W4_SIZE, NULL);
    q->head = (q->head + 1) % q->cap;
    q->n--;
  }
}

static void *w4_thread(worker_t *w) {
  const w4_arg_t *a = w->arg;
  int s0 = 1 + w->idx * W4_STREAMS_PER_THREAD; /* fast; s0 + 1 is slow */
  w4_op_t *ops = xmalloc(a->ops * sizeof *ops);
  w4_copy_t *copies = xmalloc(a->ops * sizeof *copies);
  addrmap_t map;
  shimq_t shq[W4_STREAMS_PER_THREAD];
  samples_t lag[W4_STREAMS_PER_THREAD];
  uint64_t early = 0, need_peak = 0, waits = 0;
  bool shim =
      g_im.kind == K_MALLOC || g_im.kind == K_NAIVE || g_im.kind == K_CUHOST;
  memset(shq, 0, sizeof shq);
  map.cap = 1;
  while (map.cap < a->ops * 4)
    map.cap <<= 1;
  map.key = xmalloc(map.cap * sizeof *map.key);
  map.val = xmalloc(map.cap * sizeof *map.val);
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++)
    samples_init(&lag[k], a->ops);
  samples_init(&w->ns, a->ops);
  pthread_barrier_wait(&g_barrier); /* set up */
  pthread_barrier_wait(&g_barrier); /* counters taken: go */
  w->t_start = now_ns();
  for (uint64_t i = 0; i < a->ops; i++) {
    /* Pick a stream with room: alternate, fall back to the other. */
    int pick = -1;
    for (;;) {
      for (int k = 0; k < W4_STREAMS_PER_THREAD && pick < 0; k++) {
        int s = s0 + (int)((i + (uint64_t)k) % W4_STREAMS_PER_THREAD);
        wstream_t *st = &g_streams[s];
        if (st->submitted -
                atomic_load_explicit(&st->completed, memory_order_acquire) <
            W4_DEPTH)
          pick = s;
      }
      if (pick >= 0)
        break;
      waits++;
      sched_yield();
    }
    wstream_t *st = &g_streams[pick];
    uint64_t t0 = now_ns();
    if (shim)
      for (int k = 0; k < W4_STREAMS_PER_THREAD; k++)
        shim_drain(&shq[k], &g_streams[s0 + k], true);
    void *ctx = NULL;
    g_cur_stream = (uintptr_t)pick; /* rmmpool: allocated for that stream */
    void *p = im_alloc(W4_SIZE, &ctx);
    uint64_t ta = now_ns();
    atomic_fetch_add_explicit(&g_w4_allocs, 1, memory_order_relaxed);
    uint64_t need = (atomic_load_explicit(&g_w4_allocs, memory_order_relaxed) -
                     atomic_load_explicit(&g_w4_done, memory_order_relaxed)) *
                    W4_SIZE;
    if (need > need_peak)
      need_peak = need;
    uint64_t prev;
    if (addrmap_get(&map, (uintptr_t)p, &prev)) {
      uint64_t td =
          atomic_load_explicit(&ops[prev].t_done, memory_order_relaxed);
      if (td == 0)
        early++;
      else
        samples_add(&lag[ops[prev].stream - s0], ta > td ? ta - td : 0);
    }
    ops[i].p = p;
    ops[i].stream = pick;
    atomic_init(&ops[i].t_done, 0);
    addrmap_put(&map, (uintptr_t)p, i);
    copies[i] = (w4_copy_t){&ops[i], st};
    int rc = pinpool_sim_submit(stream_pool(), st->id, st->copy_ns,
                                w4_copy_done, &copies[i]);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_sim_submit", rc);
    st->submitted++;
    uint64_t t1 = now_ns();
    switch (g_im.kind) {
    case K_PINPOOL:
      rc = pinpool_record_stream(g_im.pool, p, st->id);
      if (rc != PINPOOL_OK)
        die_pp("pinpool_record_stream", rc);
      rc = pinpool_free(g_im.pool, p);
      if (rc != PINPOOL_OK)
        die_pp("pinpool_free", rc);
      break;
    case K_REFPOOL:
      if (refpool_record_stream(g_im.ref, p, ctx, (uintptr_t)pick) != 0)
        die("refpool_record_stream failed");
      refpool_free(g_im.ref, ctx);
      break;
    case K_RMMPOOL: /* freed on the stream, reused once its event completed */
      rmmpool_free(g_im.rmm, p, W4_SIZE, (uintptr_t)pick, true);
      break;
    case K_FLOOR: /* the ring comes back to it after 256 blocks */
      break;
    case K_NAIVE:
    case K_CUHOST:
    case K_MALLOC:
      shim_push(&shq[pick - s0],
                (shim_item_t){p, st->submitted, &ops[i].t_done});
      break;
    }
    uint64_t t2 = now_ns();
    ops[i].t_free = t2;
    samples_add(&w->ns, (ta - t0) + (t2 - t1));
  }
  w->t_end = now_ns();
  w->ops = a->ops;
  /* Wait for every copy, then hand the shims' blocks back. */
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++) {
    wstream_t *st = &g_streams[s0 + k];
    while (atomic_load_explicit(&st->completed, memory_order_acquire) <
           st->submitted)
      sched_yield();
    if (shim)
      shim_drain(&shq[k], st, false);
  }
  pthread_barrier_wait(&g_barrier); /* every block back */
  pthread_barrier_wait(&g_barrier); /* counters taken: clean up */
  /* Copy latency: from the free to the copy's completion, on average over
   * the copies that completed while the producer ran (the blocks a pool
   * could have reclaimed). */
  double lat = 0, nlat = 0;
  for (uint64_t i = 0; i < a->ops; i++) {
    uint64_t td = atomic_load_explicit(&ops[i].t_done, memory_order_relaxed);
    if (td > w->t_end)
      continue;
    lat += td > ops[i].t_free ? (double)(td - ops[i].t_free) : 0.0;
    nlat++;
  }
  w->extra[8] = lat;
  w->extra[9] = nlat;
  w->extra[10] = 0;
  w->extra[11] = 0;
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++) {
    w->extra[10] += (double)shq[k].reclaimed;
    w->extra[11] += (double)shq[k].reclaim_ns;
    free(shq[k].v);
  }
  w->extra[0] = (double)early;
  w->extra[1] = (double)need_peak;
  w->extra[2] = (double)waits;
  w->extra[3] = samples_quantile(&lag[0], 0.5);
  w->extra[4] = samples_quantile(&lag[0], 0.99);
  w->extra[5] = samples_quantile(&lag[1], 0.5);
  w->extra[6] = (double)lag[0].n;
  w->extra[7] = (double)lag[1].n;
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++)
    samples_free(&lag[k]);
  free(map.key);
  free(map.val);
  free(copies);
  free(ops);
  return NULL;
}

static void w4_run(int ci) {
  (void)ci;
  worker_t ws[MAX_THREADS];
  w4_arg_t a = {g_opt.quick ? 400 : 2000};
  memset(ws, 0, sizeof ws);
  rec_begin("W4", "1MiB blocks, fast 50us + slow 2ms streams, 4 in flight");
  /* 8 blocks in flight at most, but a slow copy can stay pending while
   * the fast stream goes through a hundred blocks or more: 256 blocks a
   * thread. The floor reuses by address order, not by completion: its
   * early reuses, when the ring laps a pending slow copy anyway, mean
   * nothing (the floor's writes are never checked). */
  floor_prepare(256 * W4_SIZE, g_opt.threads);
  atomic_init(&g_w4_allocs, 0);
  atomic_init(&g_w4_done, 0);
  if (g_im.kind != K_PINPOOL) {
    int rc = pinpool_create("events=simulated,sim_delay_us=0", &g_clock);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_create(clock)", rc);
  }
  if (g_im.kind == K_REFPOOL || g_im.kind == K_RMMPOOL) {
    g_ref_cap = a.ops * (uint64_t)g_opt.threads + 16;
    g_ref_events = xmalloc(g_ref_cap * sizeof *g_ref_events);
    atomic_init(&g_ref_next, 0);
  }
  /* Start every stream's worker from this (unpinned) thread. */
  for (int i = 1; i <= g_opt.threads * W4_STREAMS_PER_THREAD; i++) {
    g_streams[i].id = (pinpool_stream_t)i;
    g_streams[i].copy_ns = (i % 2) ? 50000 : 2000000;
    g_streams[i].submitted = 0;
    atomic_init(&g_streams[i].completed, 0);
    int rc = pinpool_sim_submit(stream_pool(), g_streams[i].id, 0, NULL, NULL);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_sim_submit", rc);
  }
  req_reset(g_opt.threads);
  rss_begin();
  /* The counters' window: from the workers' set-up done to every block
   * back (their set-up and clean-up allocate too, through a malloc peer). */
  run_workers(ws, g_opt.threads, w4_thread, &a);
  pthread_barrier_wait(&g_barrier);
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  pthread_barrier_wait(&g_barrier);
  join_workers(ws, g_opt.threads);

  samples_t all;
  samples_init(&all, 1024);
  uint64_t ops = 0;
  double early = 0, need = 0, waits = 0, lf = 0, lf99 = 0, ls = 0, nf = 0,
         ns = 0, lat = 0, nlat = 0, shim_n = 0, shim_ns = 0;
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&all, &ws[i].ns);
    samples_free(&ws[i].ns);
    ops += ws[i].ops;
    early += ws[i].extra[0];
    if (ws[i].extra[1] > need) /* global counts: the threads' max */
      need = ws[i].extra[1];
    waits += ws[i].extra[2];
    lf += ws[i].extra[3] / g_opt.threads;
    lf99 += ws[i].extra[4] / g_opt.threads;
    ls += ws[i].extra[5] / g_opt.threads;
    nf += ws[i].extra[6];
    ns += ws[i].extra[7];
    lat += ws[i].extra[8];
    nlat += ws[i].extra[9];
    shim_n += ws[i].extra[10];
    shim_ns += ws[i].extra[11];
  }
  /* Reclaim lag: from a block's copy completing to the block being
   * reusable, on average. Pools: (mean free -> cached, from their
   * statistics) - (mean free -> copy done); the shim: measured per block. */
  double rec_n = 0, rec_ns = 0;
  if (g_im.kind == K_PINPOOL) {
    pinpool_stats_t st;
    int rc = pinpool_get_stats(g_im.pool, &st);
    if (rc != PINPOOL_OK)
      die_pp("pinpool_get_stats", rc);
    rec_n = (double)st.reclaim.count;
    rec_ns = (double)st.reclaim.total_ns;
  } else if (g_im.kind == K_REFPOOL) {
    refpool_stats_t st;
    refpool_get_stats(g_im.ref, &st);
    rec_n = (double)st.reclaim_count;
    rec_ns = (double)st.reclaim_total_ns;
  } else if (g_im.kind == K_RMMPOOL) {
    rmmpool_stats_t st;
    rmmpool_get_stats(g_im.rmm, &st);
    rec_n = (double)st.reclaim_count;
    rec_ns = (double)st.reclaim_total_ns;
  } else {
    rec_n = shim_n;
    rec_ns = shim_ns;
  }
  if (rec_n > 0 && nlat > 0) {
    double l =
        rec_ns / rec_n -
        (c0.known && g_im.kind != K_NAIVE && g_im.kind != K_CUHOST ? lat / nlat
                                                                   : 0.0);
    rec_num("reclaim_lag_us", (l > 0 ? l : 0) / 1e3);
    rec_num("copy_latency_us", lat / nlat / 1e3);
  }
  if (need > 0) /* the harness's requested peak: live + in flight */
    g_req[0].peak_seen = (uint64_t)need;
  common_t c = {&all,
                ops,
                workers_wall(ws, g_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  /* For pinpool, "overhead" is reserved over need too (not over its own
   * requested peak, which excludes the pending blocks). */
  rec_num("need_peak_mib", need / MIB);
  if (g_im.kind == K_PINPOOL) {
    im_counters_t ic;
    im_get_counters(&ic);
    rec_num("reserved_over_need", (double)ic.reserved_peak / need);
  } else if (c0.known) {
    rec_num("reserved_over_need", (double)c1.reserved_peak / need);
  } else if (g_hwm_reset) {
    rec_num("reserved_over_need", (double)rss_peak_delta() / need);
  }
  rec_common(&c);
  rec_num("lag_fast_us_med", lf / 1e3);
  rec_num("lag_fast_us_p99", lf99 / 1e3);
  rec_num("lag_slow_us_med", ls / 1e3);
  rec_num("reuses_fast", nf);
  rec_num("reuses_slow", ns);
  rec_num("early_reuse", early);
  rec_num("producer_waits", waits);
  if (early > 0)
    note("%.0f blocks handed out before their copy completed", early);
  if (g_im.kind == K_NAIVE || g_im.kind == K_CUHOST)
    note("%s: reuse lag measures address reuse by the kernel or driver, not "
         "caching",
         g_im.name);
  rec_end();
  samples_free(&all);
  if (g_clock != NULL) { /* joins the stream workers: every event ran */
    pinpool_destroy(g_clock);
    g_clock = NULL;
  }
}

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
    cpu_relax();
}

static void *w5_producer(worker_t *w) {
  w5_arg_t *a = w->arg;
  rng_t r = {0x5eed0005u};
  lblock_t local[W5_BATCH];
  bool single = g_opt.threads == 1;
  uint64_t b, t1 = 0;
  samples_init(&w->ns, a->span.min_ops * 2);
  samples_init(&w->ns2, a->span.min_ops / W5_BATCH + 1);
  pthread_barrier_wait(&g_barrier);
  for (b = 0;; b++) {
    if (b == a->warm) {
      if (!single)
        w5_wait_drained(a);
      pthread_barrier_wait(&g_barrier);
      pthread_barrier_wait(&g_barrier);
      w->t_start = t1 = now_ns();
    }
    if (b >= a->warm &&
        span_done(&a->span, (b - a->warm) * W5_BATCH, t1 - w->t_start))
      break;
    if (a->rss_mid == 0 && b >= a->warm + a->span.min_ops / W5_BATCH / 4)
      a->rss_mid = proc_status_kib("VmRSS");
    lblock_t *dst = local;
    if (!single) {
      uint64_t tail = atomic_load_explicit(&a->tail, memory_order_relaxed);
      while (tail - atomic_load_explicit(&a->head, memory_order_acquire) >=
             W5_QUEUE)
        cpu_relax();
      dst = a->q[tail % W5_QUEUE];
    }
    for (unsigned k = 0; k < W5_BATCH; k++) {
      size_t s = log_uniform(&r, 4 * KIB, 4 * MIB);
      void *ctx = NULL;
      uint64_t t0 = now_ns();
      void *p = im_alloc(s, &ctx);
      t1 = now_ns();
      req_alloc(0, s);
      if (b >= a->warm)
        samples_add(&w->ns, t1 - t0);
      dst[k] = (lblock_t){p, ctx, s};
    }
    if (single) {
      uint64_t t0 = now_ns();
      for (unsigned k = 0; k < W5_BATCH; k++)
        im_free(local[k].p, local[k].size, local[k].ctx);
      t1 = now_ns();
      for (unsigned k = 0; k < W5_BATCH; k++)
        req_free(0, local[k].size);
      if (b >= a->warm)
        samples_add(&w->ns2, (t1 - t0) / W5_BATCH);
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
  w->t_end = now_ns();
  a->rss_end = proc_status_kib("VmRSS");
  w->ops = (b - a->warm) * W5_BATCH;
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  pthread_barrier_wait(&g_barrier); /* counters taken: exit */
  return NULL;
}

static void *w5_consumer(worker_t *w) {
  w5_arg_t *a = w->arg;
  uint64_t consumed = 0;
  bool warmed = false;
  samples_init(&w->ns2, a->span.min_ops / W5_BATCH + 1);
  pthread_barrier_wait(&g_barrier);
  for (;;) {
    if (consumed == a->warm && !warmed) {
      warmed = true;
      pthread_barrier_wait(&g_barrier);
      pthread_barrier_wait(&g_barrier);
      w->t_start = now_ns();
    }
    uint64_t head = atomic_load_explicit(&a->head, memory_order_relaxed);
    if (atomic_load_explicit(&a->tail, memory_order_acquire) == head) {
      if (atomic_load_explicit(&a->done, memory_order_acquire) &&
          atomic_load_explicit(&a->tail, memory_order_acquire) == head)
        break;
      cpu_relax();
      continue;
    }
    lblock_t *src = a->q[head % W5_QUEUE];
    uint64_t t0 = now_ns();
    for (unsigned k = 0; k < W5_BATCH; k++) {
      im_free(src[k].p, src[k].size, src[k].ctx);
      req_free(1, src[k].size); /* a relaxed store: keeps "live" exact */
    }
    uint64_t t1 = now_ns();
    if (consumed >= a->warm)
      samples_add(&w->ns2, (t1 - t0) / W5_BATCH);
    consumed++;
    atomic_store_explicit(&a->head, head + 1, memory_order_release);
  }
  w->t_end = now_ns();
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  pthread_barrier_wait(&g_barrier); /* counters taken: exit */
  return NULL;
}

static void *w5_thread(worker_t *w) {
  return w->idx == 0 ? w5_producer(w) : w5_consumer(w);
}

static void w5_run(int ci) {
  (void)ci;
  worker_t ws[MAX_THREADS];
  static w5_arg_t a;
  memset(ws, 0, sizeof ws);
  memset(&a, 0, sizeof a);
  a.warm = g_opt.quick ? 2 : 10;
  a.span = (span_t){(g_opt.quick ? 6 : 60) * W5_BATCH, 4000000, min_phase_ns()};
  atomic_init(&a.head, 0);
  atomic_init(&a.tail, 0);
  atomic_init(&a.done, false);
  rec_begin("W5", "4KiB-4MiB log-uniform, batches of 64");
  /* ~5 batches live (64 blocks of 605 KiB on average each). */
  floor_prepare(256 * MIB, g_opt.threads);
  req_reset(g_opt.threads);
  rss_begin();
  run_workers(ws, g_opt.threads, w5_thread, &a);
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  pthread_barrier_wait(&g_barrier); /* the workers' exit: not counted */
  join_workers(ws, g_opt.threads);

  samples_t alloc_ns, free_ns;
  samples_init(&alloc_ns, 1024);
  samples_init(&free_ns, 64);
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&alloc_ns, &ws[i].ns);
    samples_merge(&free_ns, &ws[i].ns2);
    samples_free(&ws[i].ns);
    samples_free(&ws[i].ns2);
  }
  common_t c = {&alloc_ns,
                ws[0].ops,
                workers_wall(ws, g_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  rec_common(&c);
  rec_num("free_ns_med", samples_quantile(&free_ns, 0.5));
  if (a.rss_mid > 0)
    rec_num("rss_growth_mib",
            ((double)a.rss_end - (double)a.rss_mid) / (double)MIB);
  rec_end();
  samples_free(&alloc_ns);
  samples_free(&free_ns);
}

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
  samples_init(&w->ns, a->nops);
  samples_init(&w->ns2, a->nops);
  pthread_barrier_wait(&g_barrier); /* ready */
  pthread_barrier_wait(&g_barrier); /* counters taken: go */
  w->t_start = now_ns();
  for (unsigned i = 0; i < a->nops; i++) {
    size_t s = a->sizes[(i + 2 * (unsigned)w->idx) % 4] / a->div;
    void *ctx = NULL;
    uint64_t t0 = now_ns();
    void *p = im_alloc(s, &ctx);
    uint64_t t1 = now_ns();
    req_alloc(w->idx, s);
    req_sample(w->idx);
    samples_add(&w->ns, t1 - t0);
    acq_ns += (double)(t1 - t0);
    gib_acq += (double)s / (double)GIB;
    if (nlive == 2) {
      uint64_t t2 = now_ns();
      im_free(live[0].p, live[0].size, live[0].ctx);
      uint64_t t3 = now_ns();
      req_free(w->idx, live[0].size);
      samples_add(&w->ns2, t3 - t2);
      rel_ns += (double)(t3 - t2);
      gib_rel += (double)live[0].size / (double)GIB;
      live[0] = live[1];
      nlive = 1;
    }
    live[nlive++] = (lblock_t){p, ctx, s};
  }
  w->t_end = now_ns();
  w->ops = a->nops;
  w->extra[0] = acq_ns;
  w->extra[1] = rel_ns;
  w->extra[2] = gib_acq;
  w->extra[3] = gib_rel;
  pthread_barrier_wait(&g_barrier); /* done */
  pthread_barrier_wait(&g_barrier); /* counters taken: clean up */
  for (unsigned k = 0; k < nlive; k++)
    im_free(live[k].p, live[k].size, live[k].ctx);
  return NULL;
}

static void w6_run(int ci) {
  (void)ci;
  static const size_t full_sizes[] = {256 * MIB, 512 * MIB, 768 * MIB,
                                      1024 * MIB};
  static const size_t quick_sizes[] = {16 * MIB, 32 * MIB, 48 * MIB, 64 * MIB};
  worker_t ws[MAX_THREADS];
  w6_arg_t a = {g_opt.quick ? quick_sizes : full_sizes, (size_t)g_opt.threads,
                4};
  memset(ws, 0, sizeof ws);
  rec_begin("W6", g_opt.quick ? "16-64MiB cycle, 2 live, cap 32MiB"
                              : "256MiB-1GiB cycle, 2 live, cap 512MiB");
  floor_prepare(3 * a.sizes[3] / a.div, g_opt.threads);
  req_reset(g_opt.threads);
  rss_begin();
  run_workers(ws, g_opt.threads, w6_thread, &a);
  pthread_barrier_wait(&g_barrier);
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  pthread_barrier_wait(&g_barrier);
  join_workers(ws, g_opt.threads);
  samples_t acq, rel;
  samples_init(&acq, 16);
  samples_init(&rel, 16);
  double acq_ns = 0, rel_ns = 0, gib_acq = 0, gib_rel = 0;
  uint64_t ops = 0;
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&acq, &ws[i].ns);
    samples_merge(&rel, &ws[i].ns2);
    samples_free(&ws[i].ns);
    samples_free(&ws[i].ns2);
    ops += ws[i].ops;
    acq_ns += ws[i].extra[0];
    rel_ns += ws[i].extra[1];
    gib_acq += ws[i].extra[2];
    gib_rel += ws[i].extra[3];
  }
  uint64_t wall = workers_wall(ws, g_opt.threads);
  common_t c = {&acq,
                ops,
                wall,
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  rec_common(&c);
  rec_num("acquire_ms_per_gib", gib_acq > 0 ? acq_ns / 1e6 / gib_acq : 0);
  rec_num("release_ms_per_gib", gib_rel > 0 ? rel_ns / 1e6 / gib_rel : 0);
  rec_num("gib_per_s", wall > 0 ? gib_acq / ((double)wall / 1e9) : 0);
  rec_end();
  samples_free(&acq);
  samples_free(&rel);
}

/* ==== W7: KV-cache offload ===================================================
 * Fixed-size 2 MiB pages allocated in bursts (uniform between 1/16 and 1/4
 * of the capacity), least recently used pages freed to stay under the live
 * cap (1 GiB; quick 64 MiB; split between threads); after each burst a
 * random tenth of the live pages is accessed (moved to most recently used).
 * Timed per page: the LRU free it needs + allocation + use. */

typedef struct w7_arg {
  size_t page;
  size_t cap;
  uint64_t warm;
  span_t span;
} w7_arg_t;

typedef struct lru_node {
  void *p;
  void *ctx;
  uint32_t prev, next;
} lru_node_t;

#define LRU_NIL UINT32_MAX

typedef struct lru {
  lru_node_t *n;
  uint32_t head, tail; /* head = most recent */
  uint32_t *free_slots;
  uint32_t nfree;
  uint32_t *live; /* slot ids of live pages (for random access) */
  uint32_t *pos;  /* slot -> index in live */
  uint32_t nlive;
} lru_t;

static void lru_unlink(lru_t *l, uint32_t s) {
  lru_node_t *x = &l->n[s];
  if (x->prev != LRU_NIL)
    l->n[x->prev].next = x->next;
  else
    l->head = x->next;
  if (x->next != LRU_NIL)
    l->n[x->next].prev = x->prev;
  else
    l->tail = x->prev;
}

static void lru_push_front(lru_t *l, uint32_t s) {
  l->n[s].prev = LRU_NIL;
  l->n[s].next = l->head;
  if (l->head != LRU_NIL)
    l->n[l->head].prev = s;
  l->head = s;
  if (l->tail == LRU_NIL)
    l->tail = s;
}

static void *w7_thread(worker_t *w) {
  const w7_arg_t *a = w->arg;
  uint32_t cap = (uint32_t)(a->cap / a->page);
  lru_t l;
  rng_t r = {0x5eed0007u + (uint64_t)w->idx * 104729u};
  uint64_t i, t1 = 0, burst_left = 0;
  bool first = true;
  l.n = xmalloc(cap * sizeof *l.n);
  l.free_slots = xmalloc(cap * sizeof *l.free_slots);
  l.live = xmalloc(cap * sizeof *l.live);
  l.pos = xmalloc(cap * sizeof *l.pos);
  l.head = l.tail = LRU_NIL;
  l.nfree = cap;
  l.nlive = 0;
  for (uint32_t k = 0; k < cap; k++)
    l.free_slots[k] = cap - 1 - k;
  samples_init(&w->ns, a->span.min_ops * 2);
  pthread_barrier_wait(&g_barrier);
  for (i = 0;; i++) {
    if (i == a->warm) {
      pthread_barrier_wait(&g_barrier);
      pthread_barrier_wait(&g_barrier);
      w->t_start = t1 = now_ns();
    }
    if (i >= a->warm && span_done(&a->span, i - a->warm, t1 - w->t_start))
      break;
    if (burst_left == 0) {
      if (!first) { /* attention reads between bursts */
        for (uint32_t k = 0; k < l.nlive / 10; k++) {
          uint32_t s = l.live[rng_below(&r, l.nlive)];
          lru_unlink(&l, s);
          lru_push_front(&l, s);
        }
      }
      first = false;
      burst_left = cap / 16 + rng_below(&r, cap / 4 - cap / 16 + 1);
      if (burst_left < 1)
        burst_left = 1;
    }
    burst_left--;
    uint64_t t0 = now_ns();
    if (l.nfree == 0) { /* evict the least recently used page */
      uint32_t s = l.tail;
      lru_unlink(&l, s);
      im_free(l.n[s].p, a->page, l.n[s].ctx);
      req_free(w->idx, a->page);
      uint32_t at = l.pos[s];
      l.live[at] = l.live[--l.nlive];
      l.pos[l.live[at]] = at;
      l.free_slots[l.nfree++] = s;
    }
    void *ctx = NULL;
    void *p = im_alloc(a->page, &ctx);
    t1 = now_ns();
    req_alloc(w->idx, a->page);
    uint32_t s = l.free_slots[--l.nfree];
    l.n[s].p = p;
    l.n[s].ctx = ctx;
    lru_push_front(&l, s);
    l.pos[s] = l.nlive;
    l.live[l.nlive++] = s;
    if (i >= a->warm)
      samples_add(&w->ns, t1 - t0);
  }
  w->t_end = t1;
  w->ops = i - a->warm;
  pthread_barrier_wait(&g_barrier); /* measured phase done */
  pthread_barrier_wait(&g_barrier); /* counters taken: clean up */
  for (uint32_t s = l.head; s != LRU_NIL; s = l.n[s].next)
    im_free(l.n[s].p, a->page, l.n[s].ctx);
  free(l.n);
  free(l.free_slots);
  free(l.live);
  free(l.pos);
  return NULL;
}

static void w7_run(int ci) {
  worker_t ws[MAX_THREADS];
  w7_arg_t a;
  char name[96], sz[32];
  (void)ci;
  memset(ws, 0, sizeof ws);
  a.page = 2 * MIB;
  a.cap = (g_opt.quick ? 64 * MIB : 1 * GIB) / (size_t)g_opt.threads;
  a.warm = a.cap / a.page;
  a.span = (span_t){a.cap / a.page, 10000000, min_phase_ns()};
  snprintf(name, sizeof name, "%s pages, live<=%s",
           size_str(a.page, sz, sizeof sz), g_opt.quick ? "64MiB" : "1GiB");
  rec_begin("W7", name);
  floor_prepare(a.cap + a.page, g_opt.threads);
  req_reset(g_opt.threads);
  rss_begin();
  run_workers(ws, g_opt.threads, w7_thread, &a);
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  im_counters_t c0;
  im_get_counters(&c0);
  uint64_t f0 = minflt_now();
  pthread_barrier_wait(&g_barrier);
  pthread_barrier_wait(&g_barrier);
  uint64_t f1 = minflt_now();
  im_counters_t c1;
  im_get_counters(&c1);
  pthread_barrier_wait(&g_barrier); /* the workers' clean-up: not counted */
  join_workers(ws, g_opt.threads);
  samples_t all;
  samples_init(&all, 1024);
  uint64_t ops = 0;
  for (int i = 0; i < g_opt.threads; i++) {
    samples_merge(&all, &ws[i].ns);
    samples_free(&ws[i].ns);
    ops += ws[i].ops;
  }
  common_t c = {&all,
                ops,
                workers_wall(ws, g_opt.threads),
                f1 - f0,
                c1.backend_calls - c0.backend_calls,
                c0.calls_known && c1.calls_known};
  rec_common(&c);
  if (c1.known)
    rec_num("reserved_end_mib", (double)c1.reserved_now / MIB);
  rec_num("page_kib", (double)a.page / KIB);
  rec_end();
  samples_free(&all);
}

/* ==== W8: snapshots ==========================================================
 * pinpool only: no peer has snapshots. The main thread builds a live set of
 * N blocks (log-uniform 512 B - 4 KiB: the 10^6-block case stays under
 * 2 GiB) with history on (level all, 16-frame stacks, a ring of 1,000,000
 * entries; quick: 100,000) and frees and reallocates random blocks until
 * the ring has wrapped, so that every snapshot carries a full ring. One
 * snapshot is written before the measurement ("cold": the first one in a
 * process loads the symbolizer). Then 1 or 2 workers (--threads) allocate
 * and free while the main thread, in three phases of equal length:
 *   snap  writes snapshots to a file in a temp dir in a loop (at least 3,
 *         quick 1, and for at least the usual minimal phase); each timed,
 *         its file size and the gather_ns and max_hold_ns it reports read
 *         back
 *   idle  sleeps: the baseline
 *   busy  memsets a 64 MiB buffer: a writer's CPU time and memory traffic
 *         without its locks. With 2 workers pinned to the 2 CPUs of a small
 *         machine the writer takes CPU time from them; comparing snap with
 *         busy separates that from what the pool's locks cost.
 * Each worker times every alloc+free pair:
 *   hot      4 KiB from its thread cache (most pairs)
 *   central  every 64th: after a pinpool_thread_flush, so the allocation
 *            refills from a central bin (its mutex)
 *   backend  every 10 ms: a 512 KiB pair and a flush; a block that size is
 *            a segment of its own and max_cached=256KiB keeps no idle one,
 *            so this is one segment created and one released: the paths
 *            that wait for the segment lock a snapshot takes
 *            (docs/snapshot-format.md), and for the process's mmap lock,
 *            which the snapshot's own large buffers take too. Rare enough
 *            to cost the worker about 5 % of its time (a segment is
 *            populated and locked).
 * A worker keeps one 4 KiB block allocated throughout so that a flush never
 * leaves its 4 KiB segment idle (max_cached would release it, turning
 * central pairs into backend pairs). */

/* Millions of pairs per phase are too many to keep and sort: a log-linear
 * histogram (exact below 64 ns, then 32 buckets per power of two, so within
 * about 3 %) gives the quantiles, and the maximum is kept exactly. */
#define LH_EXACT 64u
#define LH_SUB_BITS 5u
#define LH_BUCKETS (LH_EXACT + (64u - 6u) * (1u << LH_SUB_BITS))

typedef struct lhist {
  uint64_t n, max;
  uint64_t b[LH_BUCKETS];
} lhist_t;

static unsigned lh_index(uint64_t v) {
  if (v < LH_EXACT)
    return (unsigned)v;
  unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 6 */
  unsigned m = (unsigned)(v >> (e - LH_SUB_BITS)) & ((1u << LH_SUB_BITS) - 1u);
  return LH_EXACT + (e - 6u) * (1u << LH_SUB_BITS) + m;
}

static void lh_add(lhist_t *h, uint64_t v) {
  h->b[lh_index(v)]++;
  h->n++;
  if (v > h->max)
    h->max = v;
}

static void lh_merge(lhist_t *into, const lhist_t *from) {
  for (unsigned i = 0; i < LH_BUCKETS; i++)
    into->b[i] += from->b[i];
  into->n += from->n;
  if (from->max > into->max)
    into->max = from->max;
}

/* Nearest rank, as samples_quantile; a bucket reads as its middle. */
static double lh_quantile(const lhist_t *h, double q) {
  if (h->n == 0)
    return NAN;
  uint64_t rank = (uint64_t)ceil(q * (double)h->n), seen = 0;
  if (rank < 1)
    rank = 1;
  for (unsigned i = 0; i < LH_BUCKETS; i++) {
    seen += h->b[i];
    if (seen < rank)
      continue;
    if (i < LH_EXACT)
      return (double)i;
    unsigned j = i - LH_EXACT, e = j / (1u << LH_SUB_BITS) + 6u;
    uint64_t lo = (uint64_t)1 << e | (uint64_t)(j % (1u << LH_SUB_BITS))
                                         << (e - LH_SUB_BITS);
    double mid = (double)lo + (double)((uint64_t)1 << (e - LH_SUB_BITS)) / 2;
    return mid < (double)h->max ? mid : (double)h->max;
  }
  return (double)h->max;
}

enum { W8_SNAP, W8_IDLE, W8_BUSY, W8_NPHASES };
enum { W8_ALL, W8_HOT, W8_CENTRAL, W8_BACKEND, W8_NKINDS };
#define W8_WARM (-1)
#define W8_STOP W8_NPHASES
#define W8_CENTRAL_EVERY 64u
#define W8_BACKEND_NS 10000000u
#define W8_HOT_SIZE (4 * KIB)
#define W8_BACKEND_SIZE (512 * KIB)
#define W8_DEPTH 16u

typedef struct w8_arg {
  alignas(64) atomic_int phase;
  lhist_t *h[MAX_THREADS]; /* [phase][kind] per worker */
} w8_arg_t;

static void w8_flush(void) {
  int rc = pinpool_thread_flush(g_im.pool);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_thread_flush", rc);
}

static void *w8_worker(worker_t *w) {
  w8_arg_t *a = w->arg;
  lhist_t *h = a->h[w->idx];
  void *anchor;
  int rc = pinpool_alloc(g_im.pool, W8_HOT_SIZE, &anchor);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_alloc", rc);
  pthread_barrier_wait(&g_barrier);
  uint64_t t1 = now_ns(), next_backend = t1 + W8_BACKEND_NS;
  for (unsigned i = 1;; i++) {
    int ph = atomic_load_explicit(&a->phase, memory_order_relaxed);
    if (ph == W8_STOP)
      break;
    int kind = W8_HOT;
    uint64_t t0;
    if (t1 >= next_backend) {
      kind = W8_BACKEND;
      t0 = now_ns();
      pool_pair(W8_BACKEND_SIZE, i);
      w8_flush();
      t1 = now_ns();
      next_backend = t1 + W8_BACKEND_NS;
    } else {
      if (i % W8_CENTRAL_EVERY == 0) {
        w8_flush();
        kind = W8_CENTRAL;
      }
      t0 = now_ns();
      pool_pair(W8_HOT_SIZE, i);
      t1 = now_ns();
    }
    if (ph >= 0) {
      lh_add(&h[ph * W8_NKINDS + W8_ALL], t1 - t0);
      lh_add(&h[ph * W8_NKINDS + kind], t1 - t0);
    }
  }
  rc = pinpool_free(g_im.pool, anchor);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_free", rc);
  return NULL;
}

static const size_t w8_counts[] = {1000, 10000, 100000, 1000000};

static int w8_ncases(void) { return g_opt.quick ? 2 : 4; }

static const char *count_str(size_t n, char *buf, size_t len) {
  if (n >= 1000000 && n % 1000000 == 0)
    snprintf(buf, len, "%zuM", n / 1000000);
  else if (n >= 1000 && n % 1000 == 0)
    snprintf(buf, len, "%zuk", n / 1000);
  else
    snprintf(buf, len, "%zu", n);
  return buf;
}

/* The unsigned number after `key` in text, or NAN. */
static double json_u64_after(const char *text, const char *key) {
  const char *p = strstr(text, key);
  unsigned long long v;
  if (p == NULL || sscanf(p + strlen(key), "%llu", &v) != 1)
    return NAN;
  return (double)v;
}

typedef struct w8_snap {
  double ns, bytes, gather_ns, hold_ns;
  double hist_max_entries, hist_recorded, hist_dropped; /* if asked */
} w8_snap_t;

/* Write one snapshot to path, time it and read back what it reports. The
 * history header sits after the segments (~100 MB into a 10^6-block file),
 * so it is looked for only in the phase's last snapshot, after the phases.
 * The previous file is removed first, untimed: ext4 writes back a file
 * that was truncated and rewritten when it is closed (auto_da_alloc), which
 * would time the disk; a new file per snapshot is also the usual use. */
static void w8_snapshot(const char *path, w8_snap_t *out) {
  if (unlink(path) != 0 && errno != ENOENT)
    die("W8: cannot remove %s: %s", path, strerror(errno));
  uint64_t t0 = now_ns();
  int rc = pinpool_snapshot_write(g_im.pool, path, 0);
  uint64_t t1 = now_ns();
  if (rc != PINPOOL_OK)
    die_pp("pinpool_snapshot_write", rc);
  memset(out, 0, sizeof *out);
  out->ns = (double)(t1 - t0);
  out->hist_max_entries = out->hist_recorded = out->hist_dropped = NAN;
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    die("W8: cannot read the snapshot %s: %s", path, strerror(errno));
  out->bytes = (double)st.st_size;
  char head[4096];
  ssize_t n = pread(fd, head, sizeof head - 1, 0);
  head[n > 0 ? n : 0] = '\0';
  out->gather_ns = json_u64_after(head, "\"gather_ns\":");
  out->hold_ns = json_u64_after(head, "\"max_hold_ns\":");
  close(fd);
}

/* The ring's header of the snapshot in path, into out. */
static void w8_ring_header(const char *path, w8_snap_t *out) {
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    die("W8: cannot read the snapshot %s: %s", path, strerror(errno));
  if (st.st_size > 0) {
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
      die("W8: mmap of the snapshot failed: %s", strerror(errno));
    static const char key[] = "\"history\":{";
    const char *hp = memmem(map, len, key, sizeof key - 1);
    if (hp != NULL) {
      char buf[512];
      size_t k = len - (size_t)(hp - (const char *)map);
      k = k < sizeof buf - 1 ? k : sizeof buf - 1;
      memcpy(buf, hp, k);
      buf[k] = '\0';
      out->hist_max_entries = json_u64_after(buf, "\"max_entries\":");
      out->hist_recorded = json_u64_after(buf, "\"recorded\":");
      out->hist_dropped = json_u64_after(buf, "\"dropped\":");
    }
    munmap(map, len);
  }
  close(fd);
}

static void sleep_until(uint64_t t) {
  for (uint64_t now = now_ns(); now < t; now = now_ns()) {
    uint64_t d = t - now;
    struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
    nanosleep(&ts, NULL);
  }
}

static void w8_run(int ci) {
  const size_t nlive = w8_counts[ci];
  const size_t ring = g_opt.quick ? 100000 : 1000000;
  const unsigned min_snaps = g_opt.quick ? 1 : 3;
  char name[96], b1[32], b2[32];
  snprintf(name, sizeof name, "%s live, ring %s",
           count_str(nlive, b1, sizeof b1), count_str(ring, b2, sizeof b2));
  rec_begin("W8", name);
  size_t clen = strlen(g_im.config);
  snprintf(g_im.config + clen, sizeof g_im.config - clen,
           " (history all, stack_depth %u, ring %zu)", W8_DEPTH, ring);
  pinpool_history_options_t ho = {PINPOOL_HISTORY_ALL, ring, W8_DEPTH, 0};
  int rc = pinpool_record_history(g_im.pool, &ho);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_record_history", rc);

  /* The live set, then churn until the ring has wrapped (with level all
   * every allocation and every free is one entry). */
  uint64_t ts0 = now_ns();
  lblock_t *live = xmalloc(nlive * sizeof *live);
  rng_t r = {0x5eed0008u};
  double live_bytes = 0;
  for (size_t k = 0; k < nlive; k++) {
    size_t s = log_uniform(&r, 512, 4 * KIB);
    live[k] = (lblock_t){im_alloc(s, NULL), NULL, s};
    live_bytes += (double)s;
  }
  uint64_t events = nlive, target = ring + ring / 20;
  for (; events < target; events += 2) {
    size_t k = rng_below(&r, nlive);
    im_free(live[k].p, live[k].size, NULL);
    live_bytes -= (double)live[k].size;
    size_t s = log_uniform(&r, 512, 4 * KIB);
    live[k] = (lblock_t){im_alloc(s, NULL), NULL, s};
    live_bytes += (double)s;
  }
  double setup_s = (double)(now_ns() - ts0) / 1e9;

  char dir[4096], path[4200];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/pp-w8.XXXXXX",
           tmp != NULL && *tmp != '\0' ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL)
    die("W8: mkdtemp(%s) failed: %s", dir, strerror(errno));
  snprintf(path, sizeof path, "%s/snapshot.json", dir);
  w8_snap_t cold;
  w8_snapshot(path, &cold);

  size_t busy_len = 64 * MIB;
  unsigned char *busy = xmalloc(busy_len);
  memset(busy, 1, busy_len); /* fault it in before it is timed */
  g_sink = busy;             /* escapes: the memsets below are not dead */

  w8_arg_t a;
  worker_t ws[MAX_THREADS];
  memset(ws, 0, sizeof ws);
  atomic_init(&a.phase, W8_WARM);
  for (int i = 0; i < g_opt.threads; i++)
    a.h[i] = xmalloc(W8_NPHASES * W8_NKINDS * sizeof(lhist_t));
  run_workers(ws, g_opt.threads, w8_worker, &a);
  pthread_barrier_wait(&g_barrier);
  sleep_until(now_ns() + 20000000u); /* warm-up: first stacks, first flush */

  /* snap: at least min_snaps snapshots and the usual minimal phase. */
  samples_t snap_ns, gather_ns, hold_ns;
  samples_init(&snap_ns, 16);
  samples_init(&gather_ns, 16);
  samples_init(&hold_ns, 16);
  w8_snap_t last;
  memset(&last, 0, sizeof last);
  double bytes = 0, in_snap_ns = 0;
  uint64_t p0 = now_ns(), p1;
  atomic_store(&a.phase, W8_SNAP);
  for (unsigned k = 0;; k++) {
    p1 = now_ns();
    if (k >= min_snaps && p1 - p0 >= min_phase_ns())
      break;
    w8_snapshot(path, &last);
    samples_add(&snap_ns, (uint64_t)last.ns);
    samples_add(&gather_ns, (uint64_t)last.gather_ns);
    samples_add(&hold_ns, (uint64_t)last.hold_ns);
    bytes = last.bytes;
    in_snap_ns += last.ns;
  }
  uint64_t dur = p1 - p0;
  atomic_store(&a.phase, W8_IDLE);
  sleep_until(p1 + dur);
  uint64_t p2 = now_ns();
  atomic_store(&a.phase, W8_BUSY);
  for (unsigned k = 0; now_ns() < p2 + dur; k++)
    for (size_t off = 0; off < busy_len && now_ns() < p2 + dur; off += MIB)
      memset(busy + off, (int)k, MIB);
  uint64_t p3 = now_ns();
  atomic_store(&a.phase, W8_STOP);
  join_workers(ws, g_opt.threads);

  w8_ring_header(path, &last);
  if (unlink(path) != 0 || rmdir(dir) != 0)
    die("W8: cannot remove %s: %s", dir, strerror(errno));

  lhist_t *h = xmalloc(W8_NPHASES * W8_NKINDS * sizeof(lhist_t));
  for (int i = 0; i < g_opt.threads; i++) {
    for (int k = 0; k < W8_NPHASES * W8_NKINDS; k++)
      lh_merge(&h[k], &a.h[i][k]);
    free(a.h[i]);
  }
  const double phase_s[W8_NPHASES] = {
      (double)dur / 1e9, (double)(p2 - p1) / 1e9, (double)(p3 - p2) / 1e9};
  static const char *const pname[W8_NPHASES] = {"snap", "idle", "busy"};
  const lhist_t *all = &h[W8_SNAP * W8_NKINDS + W8_ALL];
  rec_num("ns_med", lh_quantile(all, 0.5));
  rec_num("ns_p99", lh_quantile(all, 0.99));
  rec_num("ops", (double)all->n);
  rec_num("ops_per_s", (double)all->n / phase_s[W8_SNAP]);
  rec_num("live_blocks", (double)nlive);
  rec_num("live_mib", live_bytes / (double)MIB);
  rec_num("ring", (double)ring);
  rec_num("hist_max_entries", last.hist_max_entries);
  rec_num("hist_recorded", last.hist_recorded);
  rec_num("hist_kept", last.hist_recorded - last.hist_dropped);
  rec_num("setup_s", setup_s);
  rec_num("snaps", (double)snap_ns.n);
  rec_num("snap_ms_cold", cold.ns / 1e6);
  rec_num("snap_ms_med", samples_quantile(&snap_ns, 0.5) / 1e6);
  rec_num("snap_ms_max", samples_quantile(&snap_ns, 1.0) / 1e6);
  rec_num("snap_duty_pct", 100.0 * in_snap_ns / (double)dur);
  rec_num("file_mib", bytes / (double)MIB);
  rec_num("gather_ms_med", samples_quantile(&gather_ns, 0.5) / 1e6);
  rec_num("hold_us_med", samples_quantile(&hold_ns, 0.5) / 1e3);
  rec_num("hold_us_max", samples_quantile(&hold_ns, 1.0) / 1e3);
  for (int ph = 0; ph < W8_NPHASES; ph++) {
    static const struct {
      int kind;
      const char *name;
      double q;
    } cols[] = {{W8_ALL, "med", 0.5},
                {W8_ALL, "p99", 0.99},
                {W8_ALL, "p999", 0.999},
                {W8_ALL, "max", 1.0},
                {W8_HOT, "hot_max", 1.0},
                {W8_CENTRAL, "central_med", 0.5},
                {W8_CENTRAL, "central_max", 1.0},
                {W8_BACKEND, "backend_med", 0.5},
                {W8_BACKEND, "backend_max", 1.0}};
    char key[40];
    const lhist_t *hp = &h[ph * W8_NKINDS];
    snprintf(key, sizeof key, "%s_pairs_per_s", pname[ph]);
    rec_num(key, (double)hp[W8_ALL].n / phase_s[ph]);
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
      snprintf(key, sizeof key, "%s_%s", pname[ph], cols[c].name);
      const lhist_t *x = &hp[cols[c].kind];
      rec_num(key, cols[c].q >= 1.0 ? (x->n ? (double)x->max : NAN)
                                    : lh_quantile(x, cols[c].q));
    }
  }
  pinpool_stats_t st;
  if (pinpool_get_stats(g_im.pool, &st) == PINPOOL_OK)
    rec_num("reserved_mib", (double)st.reserved_bytes.current / (double)MIB);
  rec_end();

  free(h);
  free(busy);
  samples_free(&snap_ns);
  samples_free(&gather_ns);
  samples_free(&hold_ns);
  /* History off first: a million frees with stacks would take seconds. */
  ho = (pinpool_history_options_t){PINPOOL_HISTORY_NONE, 0, 0, 0};
  rc = pinpool_record_history(g_im.pool, &ho);
  if (rc != PINPOOL_OK)
    die_pp("pinpool_record_history", rc);
  for (size_t k = 0; k < nlive; k++)
    im_free(live[k].p, live[k].size, NULL);
  free(live);
}

/* ==== Dispatch ============================================================ */

typedef struct workload {
  const char *name;
  const char *pool_config;
  const char *variant; /* a pinpool variant measured too, or NULL */
  const char *variant_config;
  int (*ncases)(void);
  void (*run)(int ci);
  int max_threads;
  bool pinpool_only;  /* no peer has the feature measured */
  bool hist_variants; /* the pinpool-h-* implementations are measured */
} workload_t;

static int one_case(void) { return 1; }

static const workload_t g_workloads[] = {
    {"W1", "mlock=1", "pinpool-tc", ",tcache_bytes=8GiB", w1_ncases, w1_run, 2,
     false, false},
    {"W2", "mlock=1", NULL, NULL, w2_ncases, w2_run, 2, false, false},
    {"W3", "mlock=1", NULL, NULL, w3_ncases, w3_run, 2, false, false},
    {"W4", "mlock=1,events=simulated,sim_delay_us=0", NULL, NULL, one_case,
     w4_run, 2, false, false},
    {"W5", "mlock=1", NULL, NULL, one_case, w5_run, 2, false, false},
    {"W6", "mlock=1,max_cached=512MiB", NULL, NULL, one_case, w6_run, 2, false,
     false},
    {"W7", "mlock=1", NULL, NULL, one_case, w7_run, 2, false, false},
    {"W1h", "mlock=1", NULL, NULL, w1h_ncases, w1h_run, 1, true, true},
    {"W8", "mlock=1,max_cached=256KiB", NULL, NULL, w8_ncases, w8_run, 2, true,
     false},
};

static const workload_t *find_workload(const char *name) {
  for (size_t i = 0; i < sizeof g_workloads / sizeof g_workloads[0]; i++)
    if (strcmp(g_workloads[i].name, name) == 0)
      return &g_workloads[i];
  return NULL;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: pp_bench --workload W --impl NAME [--mode alloc|touch]\n"
      "                [--threads 1|2] [--case N] [--rep N] [--quick]\n"
      "                [--name NAME]\n"
      "                [--config PINPOOL_CONFIG]\n"
      "       pp_bench --list W [--threads N] [--quick]\n"
      "       pp_bench --cuda-probe\n"
      "       pp_bench --hold-syscount\n"
      "workloads: W1..W7, W1h (history cost), W8 (snapshots)\n"
      "impls: pinpool, pinpool-tc (W1), pinpool-h-alloc,\n"
      "       pinpool-h-all, pinpool-h-all16 (W1h), refpool, rmmpool, naive,\n"
      "       floor (touch mode only), malloc (%s; --name NAME reports it\n"
      "       under another name); W1h and W8 measure pinpool only\n"
      "       with a CUDA driver and device (W1..W7): pinpool-cuda,\n"
      "       pinpool-cuda-register, refpool-cuda, cuhostalloc\n"
      "       pp_bench --cuda-probe: exit 0 if those can run (prints the\n"
      "       device), 1 if not (prints why)\n"
      "       pp_bench --hold-syscount: keep the syscall tracepoints that\n"
      "       count malloc peers' backend calls registered until killed\n"
      "       (bench/run.sh; prints 'ready' or why not and exits 1)\n",
      PEER_NAME);
}

static long parse_int(const char *s, const char *what) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0')
    die("%s: bad number '%s'", what, s);
  return v;
}

int main(int argc, char **argv) {
  const char *list = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--quick") == 0) {
      g_opt.quick = true;
      continue;
    }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(a, "--cuda-probe") == 0) {
      /* bench/run.sh: are the GPU implementations measurable here? */
      char why[256] = "";
      if (cudapeer_open(why, sizeof why) != 0) {
        printf("%s\n", why);
        return 1;
      }
      printf("%s\n", cudapeer_describe());
      return 0;
    }
    if (strcmp(a, "--hold-syscount") == 0) {
      /* bench/run.sh runs this for the whole suite: with the tracepoints
       * registered by this process, a measurement's own events open and
       * close without the kernel's (un)registration (syscount.h). */
      char why[256] = "";
      if (!syscount_init(why, sizeof why)) {
        printf("%s\n", why);
        return 1;
      }
      /* Gone with bench/run.sh even if it is killed without its trap. */
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      printf("ready\n");
      fflush(stdout);
      for (;;)
        pause();
    }
    if (v == NULL) {
      usage(stderr);
      die("option %s needs a value", a);
    }
    i++;
    if (strcmp(a, "--workload") == 0)
      g_opt.workload = v;
    else if (strcmp(a, "--list") == 0)
      list = v;
    else if (strcmp(a, "--impl") == 0)
      g_opt.impl = v;
    else if (strcmp(a, "--mode") == 0) {
      if (strcmp(v, "touch") != 0 && strcmp(v, "alloc") != 0)
        die("--mode is alloc or touch, not '%s'", v);
      g_opt.touch = strcmp(v, "touch") == 0;
    } else if (strcmp(a, "--name") == 0)
      g_opt.name = v;
    else if (strcmp(a, "--threads") == 0)
      g_opt.threads = (int)parse_int(v, "--threads");
    else if (strcmp(a, "--case") == 0)
      g_opt.case_idx = (int)parse_int(v, "--case");
    else if (strcmp(a, "--rep") == 0)
      g_opt.rep = (int)parse_int(v, "--rep");
    else if (strcmp(a, "--config") == 0)
      g_opt.config = v;
    else
      die("unknown option '%s' (try --help)", a);
  }
  if (g_opt.threads < 1 || g_opt.threads > MAX_THREADS)
    die("--threads must be 1..%d", MAX_THREADS);
  if (list != NULL) {
    const workload_t *wl = find_workload(list);
    if (wl == NULL)
      die("unknown workload '%s'", list);
    if (g_opt.threads > wl->max_threads)
      return 0; /* no cases */
    printf("%d\n", wl->ncases());
    return 0;
  }
  if (g_opt.workload == NULL || g_opt.impl == NULL) {
    usage(stderr);
    return 2;
  }
  const workload_t *wl = find_workload(g_opt.workload);
  if (wl == NULL)
    die("unknown workload '%s'", g_opt.workload);
  if (g_opt.threads > wl->max_threads)
    die("%s runs with at most %d thread(s)", wl->name, wl->max_threads);
  if (g_opt.case_idx < 0 || g_opt.case_idx >= wl->ncases())
    die("%s has cases 0..%d", wl->name, wl->ncases() - 1);
  if (strncmp(g_opt.impl, "pinpool-", 8) == 0 &&
      (wl->variant == NULL || strcmp(g_opt.impl, wl->variant) != 0) &&
      (!wl->hist_variants || find_hist_variant(g_opt.impl) == NULL) &&
      (wl->pinpool_only || find_cuda_pool(g_opt.impl) == NULL))
    die("%s is not a variant measured in %s", g_opt.impl, wl->name);
  if (wl->pinpool_only && strncmp(g_opt.impl, "pinpool", 7) != 0)
    die("%s measures pinpool only", wl->name);
  cpus_init();
  if (strcmp(g_opt.impl, "malloc") == 0)
    check_peer();
  const char *cfg = wl->pool_config, *vcfg = wl->variant_config;
  if (g_opt.quick && strcmp(wl->name, "W6") == 0)
    cfg = "mlock=1,max_cached=32MiB";
  if (g_opt.config != NULL)
    cfg = g_opt.config;
  im_setup(cfg, wl->variant, vcfg, wl->hist_variants);
  wl->run(g_opt.case_idx);
  im_teardown();
  return 0;
}
