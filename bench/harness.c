/*
 * pp_bench's harness (harness.h): the CPUs, the requested bytes, the
 * records, the worker threads and the measured window; what every workload
 * (w1.c .. w8.c) measures with. It measures the implementations under test
 * (impl.c) and calls nothing above it.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cudapeer.h"
#include "harness.h"
#include "syscount.h"

/* ---- CPUs ---------------------------------------------------------------- */

static int g_cpus[64];
static int g_ncpus;

void pb_cpus_init(void) {
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

/* ---- Requested bytes, tracked by the harness for every implementation ---- */

tcount_t pb_req[MAX_THREADS];
static int g_req_n = 1;

void pb_req_reset(int nthreads) {
  for (int i = 0; i < MAX_THREADS; i++) {
    atomic_store(&pb_req[i].allocated, 0);
    atomic_store(&pb_req[i].freed, 0);
    pb_req[i].peak_seen = 0;
    pb_req[i].tick = 0;
  }
  g_req_n = nthreads;
}

static uint64_t req_live(void) {
  uint64_t a = 0, f = 0;
  for (int i = 0; i < g_req_n; i++) {
    a += atomic_load_explicit(&pb_req[i].allocated, memory_order_relaxed);
    f += atomic_load_explicit(&pb_req[i].freed, memory_order_relaxed);
  }
  return a - f;
}

/* Thread t allocated `size` bytes. The live total is sampled on every
 * allocation with one thread, every 8th with two (reading the other
 * thread's counters costs a cache miss). */
void pb_req_alloc(int t, size_t size) {
  tcount_t *c = &pb_req[t];
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
void pb_req_sample(int t) {
  uint64_t live = req_live();
  if (live > pb_req[t].peak_seen)
    pb_req[t].peak_seen = live;
}

static uint64_t req_peak(void) {
  uint64_t pk = 0;
  for (int i = 0; i < g_req_n; i++)
    if (pb_req[i].peak_seen > pk)
      pk = pb_req[i].peak_seen;
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

void pb_rec_begin(const char *workload, const char *kase) {
  memset(&g_rec, 0, sizeof g_rec);
  snprintf(g_rec.workload, sizeof g_rec.workload, "%s", workload);
  snprintf(g_rec.kase, sizeof g_rec.kase, "%s", kase);
}

void pb_rec_num(const char *key, double v) {
  if (!isfinite(v))
    return;
  if (g_rec.len + 64 + strlen(key) >= sizeof g_rec.text)
    return;
  g_rec.len +=
      (size_t)snprintf(g_rec.text + g_rec.len, sizeof g_rec.text - g_rec.len,
                       "\t%s=%.9g", key, v);
}

void pb_note(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  for (char *c = buf; *c; c++)
    if (*c == '\t' || *c == '\n')
      *c = ' ';
  printf("N\t%s\t%s\t%s\t%s\t%d\t%s\n", g_rec.workload, g_rec.kase, pb_im.name,
         pb_im.mode, pb_opt.threads, buf);
}

void pb_rec_end(void) {
  printf("R\t%s\t%s\t%s\t%s\t%d\t%d\t%s%s\n", g_rec.workload, g_rec.kase,
         pb_im.name, pb_im.mode, pb_opt.threads, pb_opt.rep, pb_im.config,
         g_rec.text);
  fflush(stdout);
}

void pb_rec_common(const common_t *c) {
  im_counters_t ic;
  pb_im_get_counters(&ic);
  pb_rec_num("ns_med", pb_samples_quantile(c->ns, 0.5));
  pb_rec_num("ns_p99", pb_samples_quantile(c->ns, 0.99));
  pb_rec_num("ns_mean", pb_samples_mean(c->ns));
  pb_rec_num("ops", (double)c->ops);
  pb_rec_num("ops_per_s",
             c->wall_ns ? (double)c->ops * 1e9 / (double)c->wall_ns : 0.0);
  pb_rec_num("minflt_per_op",
             c->ops ? (double)c->minflt / (double)c->ops : 0.0);
  if (c->backend_known)
    pb_rec_num("backend_calls", (double)c->backend_calls);
  else if (pb_im.kind == K_MALLOC)
    pb_note("backend calls (memory system calls) not counted: %s",
            pb_syscount_why[0] ? pb_syscount_why
                               : "a thread's counters failed");
  if (ic.calls_known)
    pb_rec_num("backend_calls_total", (double)ic.backend_calls);

  uint64_t req = req_peak();
  uint64_t rss = pb_rss_peak_delta();
  if (pb_im.kind == K_PINPOOL && ic.requested_peak > 0)
    req = ic.requested_peak; /* the pool's own exact tracking */
  pb_rec_num("requested_peak_mib", (double)req / (double)MIB);
  if (pb_hwm_reset)
    pb_rec_num("rss_peak_mib", (double)rss / (double)MIB);
  if (ic.known) {
    pb_rec_num("reserved_peak_mib", (double)ic.reserved_peak / (double)MIB);
    if (req > 0)
      pb_rec_num("overhead", (double)ic.reserved_peak / (double)req);
    if (ic.mlock_failures > 0)
      pb_note("%llu mlock failures (RLIMIT_MEMLOCK?): memory not locked",
              (unsigned long long)ic.mlock_failures);
    if (pb_im.kind == K_PINPOOL) {
      /* Where the held memory is at the end (fragmentation, issue 21):
       * free inside the arena's chunks, and idle in caches. */
      pinpool_stats_t s;
      if (pinpool_get_stats(pb_im.pool, &s) == PINPOOL_OK) {
        pb_rec_num("chunks", (double)s.arena_chunks);
        pb_rec_num("chunk_free_mib", (double)s.chunk_free_bytes / (double)MIB);
        pb_rec_num("free_extents", (double)s.free_extents);
        pb_rec_num("largest_free_mib",
                   (double)s.largest_free_extent / (double)MIB);
        pb_rec_num("cached_mib", (double)s.cached_bytes.current / (double)MIB);
      }
    }
  } else if (req > 0 && pb_hwm_reset) {
    pb_rec_num("overhead", (double)rss / (double)req);
  }
  if (req > 0 && pb_hwm_reset)
    pb_rec_num("rss_overhead", (double)rss / (double)req);
}

/* ---- Threads ------------------------------------------------------------- */

pthread_barrier_t pb_barrier;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  pb_tidx = w->idx;
  if (pb_im.kind == K_MALLOC)
    syscount_thread_start();
  if (pb_opt.threads > 1)
    pin_self(w->idx);
  if (pb_im.cuda && cudapeer_enter() != 0)
    pb_die("cuCtxSetCurrent failed: %s", cudapeer_last_error());
  return w->fn(w);
}

/* Run fn on n threads (pinned to distinct CPUs when n > 1); the workers
 * meet at pb_barrier (count n + 1: the caller waits there too). */
void pb_run_workers(worker_t *ws, int n, void *(*fn)(worker_t *), void *arg) {
  pthread_barrier_init(&pb_barrier, NULL, (unsigned)n + 1);
  for (int i = 0; i < n; i++) {
    ws[i].idx = i;
    ws[i].fn = fn;
    ws[i].arg = arg;
    if (pthread_create(&ws[i].th, NULL, worker_main, &ws[i]) != 0)
      pb_die("pthread_create failed");
  }
}

void pb_join_workers(worker_t *ws, int n) {
  for (int i = 0; i < n; i++)
    pthread_join(ws[i].th, NULL);
  pthread_barrier_destroy(&pb_barrier);
}

/* Wall time from the earliest start to the latest end. */
uint64_t pb_workers_wall(const worker_t *ws, int n) {
  uint64_t s = UINT64_MAX, e = 0;
  for (int i = 0; i < n; i++) {
    if (ws[i].t_start < s)
      s = ws[i].t_start;
    if (ws[i].t_end > e)
      e = ws[i].t_end;
  }
  return e > s ? e - s : 1;
}

/* ---- Measured phases (span_t) -------------------------------------------- */

uint64_t pb_min_phase_ns(void) { return pb_opt.quick ? 10000000u : 200000000u; }

/* ---- The measured window (the workloads' shared protocol) ---------------- */

void pb_start(worker_t *ws, void *(*fn)(worker_t *), void *arg) {
  pb_req_reset(pb_opt.threads);
  pb_rss_begin();
  pb_run_workers(ws, pb_opt.threads, fn, arg);
}

/* lead: the barriers the workers pass before the phase (set-up, warm-up).
 * Then "go", "done", and the last one lets them clean up or exit outside
 * the window: glibc releases a thread's stack with madvise, a system call
 * a malloc peer's count would include. */
void pb_measure(worker_t *ws, int lead, window_t *win) {
  for (int i = 0; i < lead; i++)
    pthread_barrier_wait(&pb_barrier);
  pb_im_get_counters(&win->c0);
  win->f0 = pb_minflt_now();
  pthread_barrier_wait(&pb_barrier);
  pthread_barrier_wait(&pb_barrier);
  win->f1 = pb_minflt_now();
  pb_im_get_counters(&win->c1);
  pthread_barrier_wait(&pb_barrier);
  pb_join_workers(ws, pb_opt.threads);
}

/* The workers' samples into ns (and ns2 into ns2 unless NULL), freed; the
 * sum of their operations. */
uint64_t pb_merge(worker_t *ws, samples_t *ns, samples_t *ns2) {
  uint64_t ops = 0;
  for (int i = 0; i < pb_opt.threads; i++) {
    pb_samples_merge(ns, &ws[i].ns);
    pb_samples_free(&ws[i].ns);
    if (ns2 != NULL) {
      pb_samples_merge(ns2, &ws[i].ns2);
      pb_samples_free(&ws[i].ns2);
    }
    ops += ws[i].ops;
  }
  return ops;
}

common_t pb_window_common(const window_t *win, samples_t *ns, uint64_t ops,
                          uint64_t wall_ns) {
  common_t c = {ns,
                ops,
                wall_ns,
                win->f1 - win->f0,
                win->c1.backend_calls - win->c0.backend_calls,
                win->c0.calls_known && win->c1.calls_known};
  return c;
}
