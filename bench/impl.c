/*
 * pp_bench's implementations under test (pinpool, its variants and CUDA
 * backends, refpool, rmmpool, naive, cuhostalloc, malloc, the floor): one
 * interface, pb_im_alloc / pb_im_free / pb_im_get_counters, that every
 * workload calls the same way, and their setup from --impl.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "cudapeer.h"
#include "impl.h"
#include "syscount.h"

/* ---- Implementations ----------------------------------------------------- */

impl_t pb_im;
char pb_syscount_why[256];
_Thread_local void *volatile pb_sink;
_Thread_local int pb_tidx;
_Thread_local uintptr_t pb_cur_stream;

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
static bool g_floor_huge; /* floor-huge: the ring on 2 MiB pages */

/* Called by each workload before its threads start: `per_thread` bytes for
 * each of `threads` rings (a no-op for other implementations). */
void pb_floor_prepare(size_t per_thread, int threads) {
  if (pb_im.kind != K_FLOOR || g_floor_base != NULL)
    return;
  per_thread = (per_thread + PAGE - 1) & ~(PAGE - 1);
  g_floor_len = per_thread * (size_t)threads;
  void *p;
  if (g_floor_huge) {
    /* floor-huge: the same ring on transparent huge pages (the floor of
     * pinpool's hugepages=1), 2 MiB aligned and advised before the first
     * touch, then written one byte a page (faulted in as huge pages). */
    const size_t huge = (size_t)2 << 20;
    g_floor_len = (g_floor_len + huge - 1) & ~(huge - 1);
    char *m = mmap(NULL, g_floor_len + huge, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
      pb_die("floor: mmap(%zu) failed: %s", g_floor_len, strerror(errno));
    char *a = (char *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    if (a > m)
      munmap(m, (size_t)(a - m));
    munmap(a + g_floor_len, (size_t)(m + huge - a));
    if (madvise(a, g_floor_len, MADV_HUGEPAGE) != 0)
      pb_die("floor-huge: madvise(MADV_HUGEPAGE): %s", strerror(errno));
    for (size_t o = 0; o < g_floor_len; o += PAGE)
      ((volatile char *)a)[o] = 0;
    p = a;
  } else {
    p = mmap(NULL, g_floor_len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED)
      pb_die("floor: mmap(%zu) failed: %s", g_floor_len, strerror(errno));
  }
  g_floor_base = p;
  for (int t = 0; t < threads; t++) {
    g_floor[t].start = g_floor[t].cur = g_floor_base + per_thread * (size_t)t;
    g_floor[t].end = g_floor[t].start + per_thread;
  }
}

void *pb_floor_alloc(size_t size) {
  floor_ring_t *r = &g_floor[pb_tidx];
  size_t len = (size + PAGE - 1) & ~(PAGE - 1);
  if (r->start == NULL || len > (size_t)(r->end - r->start))
    pb_die("floor: a %zu-byte block does not fit the workload's ring", size);
  if (len > (size_t)(r->end - r->cur))
    r->cur = r->start;
  char *p = r->cur;
  r->cur += len;
  return p;
}

/* Backend calls and reserved bytes of the per-request baselines. */
static void naive_count_alloc(size_t len) {
  uint64_t r =
      atomic_fetch_add_explicit(&pb_im.nv_reserved, len, memory_order_relaxed) +
      len;
  uint64_t pk = atomic_load_explicit(&pb_im.nv_peak, memory_order_relaxed);
  while (r > pk && !atomic_compare_exchange_weak_explicit(
                       &pb_im.nv_peak, &pk, r, memory_order_relaxed,
                       memory_order_relaxed)) {
  }
  atomic_fetch_add_explicit(&pb_im.nv_calls, 1, memory_order_relaxed);
}

static void naive_count_free(size_t len) {
  atomic_fetch_sub_explicit(&pb_im.nv_reserved, len, memory_order_relaxed);
  atomic_fetch_add_explicit(&pb_im.nv_calls, 1, memory_order_relaxed);
}

static void *naive_alloc(size_t size) {
  size_t len = (size + PAGE - 1) & ~(PAGE - 1);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    pb_die("naive: mmap(%zu) failed: %s", len, strerror(errno));
  if (mlock(p, len) != 0)
    atomic_fetch_add_explicit(&pb_im.nv_mlock_fail, 1, memory_order_relaxed);
  naive_count_alloc(len);
  return p;
}

static void naive_free(void *p, size_t size) {
  size_t len = (size + PAGE - 1) & ~(PAGE - 1);
  (void)munlock(p, len);
  if (munmap(p, len) != 0)
    pb_die("naive: munmap failed: %s", strerror(errno));
  naive_count_free(len);
}

/* The naive baseline on a GPU machine: the driver pins per request. */
static void *cuhost_alloc(size_t size) {
  void *p = cudapeer_host_alloc(size);
  if (p == NULL)
    pb_die("cuMemHostAlloc(%zu) failed: %s", size, cudapeer_last_error());
  naive_count_alloc((size + PAGE - 1) & ~(PAGE - 1));
  return p;
}

static void cuhost_free(void *p, size_t size) {
  if (cudapeer_free_host(p) != 0)
    pb_die("cuMemFreeHost failed: %s", cudapeer_last_error());
  naive_count_free((size + PAGE - 1) & ~(PAGE - 1));
}

/* The per-request baselines: naive, or cuhostalloc on a GPU machine. */
void *pb_baseline_alloc(size_t size) {
  return pb_im.kind == K_CUHOST ? cuhost_alloc(size) : naive_alloc(size);
}

void pb_baseline_free(void *p, size_t size) {
  if (pb_im.kind == K_CUHOST)
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
    pb_die("refpool-cuda: cuMemFreeHost failed: %s", cudapeer_last_error());
}

/* Allocate and use a block; *ctx gets the refpool block handle. */
void *pb_im_alloc(size_t size, void **ctx) {
  void *p = NULL;
  switch (pb_im.kind) {
  case K_PINPOOL: {
    int rc = pinpool_alloc(pb_im.pool, size, &p);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_alloc", rc);
    break;
  }
  case K_REFPOOL:
    p = refpool_alloc(pb_im.ref, size, ctx);
    if (p == NULL)
      pb_die("refpool_alloc(%zu) failed%s%s", size, pb_im.cuda ? ": " : "",
             pb_im.cuda ? cudapeer_last_error() : "");
    break;
  case K_RMMPOOL:
    p = rmmpool_alloc(pb_im.rmm, size, pb_cur_stream);
    if (p == NULL)
      pb_die("rmmpool_alloc(%zu) failed", size);
    break;
  case K_NAIVE:
  case K_CUHOST:
    p = pb_baseline_alloc(size);
    break;
  case K_MALLOC:
    p = malloc(size);
    if (p == NULL)
      pb_die("malloc(%zu) failed", size);
    break;
  case K_FLOOR:
    p = pb_floor_alloc(size);
    break;
  }
  pb_use_block(p, size);
  return p;
}

void pb_im_free(void *p, size_t size, void *ctx) {
  switch (pb_im.kind) {
  case K_PINPOOL: {
    int rc = pinpool_free(pb_im.pool, p);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_free", rc);
    break;
  }
  case K_REFPOOL:
    refpool_free(pb_im.ref, ctx);
    break;
  case K_RMMPOOL:
    rmmpool_free(pb_im.rmm, p, size, 0, false);
    break;
  case K_NAIVE:
  case K_CUHOST:
    pb_baseline_free(p, size);
    break;
  case K_MALLOC:
    free(p);
    break;
  case K_FLOOR:
    break;
  }
}

void pb_im_get_counters(im_counters_t *c) {
  memset(c, 0, sizeof *c);
  switch (pb_im.kind) {
  case K_PINPOOL: {
    pinpool_stats_t s;
    int rc = pinpool_get_stats(pb_im.pool, &s);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_get_stats", rc);
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
    refpool_get_stats(pb_im.ref, &s);
    c->known = true;
    c->backend_calls = s.backend_allocs + s.backend_frees;
    c->reserved_peak = s.reserved_peak;
    c->reserved_now = s.reserved_bytes;
    c->mlock_failures = s.mlock_failures;
    break;
  }
  case K_RMMPOOL: {
    rmmpool_stats_t s;
    rmmpool_get_stats(pb_im.rmm, &s);
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
    c->backend_calls = atomic_load(&pb_im.nv_calls);
    c->reserved_peak = atomic_load(&pb_im.nv_peak);
    c->reserved_now = atomic_load(&pb_im.nv_reserved);
    c->mlock_failures = atomic_load(&pb_im.nv_mlock_fail);
    break;
  case K_MALLOC:
    c->calls_known = syscount_read(&c->backend_calls);
    break;
  }
  if (c->known)
    c->calls_known = true;
}

/* ---- The stream clock and refpool's events (W4) ---------------------------
 * The implementations other than pinpool learn the simulated streams' time
 * from a second pinpool pool, the clock (w4.c). refpool's and rmmpool's
 * events are simulated-stream items too, recorded the way pinpool's
 * simulated provider records them (a zero-length item queued on the
 * stream, complete when the stream's worker reaches it), so that the pools
 * pay the same per-event cost. */
pinpool_t *pb_clock;

static atomic_uchar *g_ref_events; /* done flags, one per event */
static atomic_uint_fast64_t g_ref_next;
static uint64_t g_ref_cap;

void pb_ref_events_reset(uint64_t cap) {
  g_ref_cap = cap;
  g_ref_events = pb_xmalloc(g_ref_cap * sizeof *g_ref_events);
  atomic_init(&g_ref_next, 0);
}

static void ref_event_done(void *arg) {
  atomic_store_explicit((atomic_uchar *)arg, 1, memory_order_release);
}

static int ref_record(void *ctx, uintptr_t stream, refpool_event_t *ev) {
  (void)ctx;
  uint64_t i = atomic_fetch_add_explicit(&g_ref_next, 1, memory_order_relaxed);
  if (i >= g_ref_cap)
    pb_die("refpool: more events than planned");
  atomic_init(&g_ref_events[i], 0);
  int rc = pinpool_sim_submit(pb_clock, (pinpool_stream_t)stream, 0,
                              ref_event_done, &g_ref_events[i]);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_sim_submit(event)", rc);
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
 * and (pb_im_setup) refpool-cuda, PyTorch's policy on cuMemHostAlloc, and
 * cuhostalloc, cuMemHostAlloc / cuMemFreeHost per request. */
typedef struct cuda_pool {
  const char *name;
  const char *config; /* appended to the workload's pool configuration */
} cuda_pool_t;

static const cuda_pool_t g_cuda_pools[] = {
    {"pinpool-cuda", ",backend=cuda,device=0"},
    {"pinpool-cuda-register", ",backend=cuda-register,device=0"},
};

const struct cuda_pool *pb_find_cuda_pool(const char *impl) {
  for (size_t i = 0; i < sizeof g_cuda_pools / sizeof g_cuda_pools[0]; i++)
    if (strcmp(g_cuda_pools[i].name, impl) == 0)
      return &g_cuda_pools[i];
  return NULL;
}

static bool is_cuda_impl(const char *impl) {
  return pb_find_cuda_pool(impl) != NULL || strcmp(impl, "refpool-cuda") == 0 ||
         strcmp(impl, "cuhostalloc") == 0;
}

/* Open the driver for a GPU implementation, or stop with the reason. */
static void need_cuda(const char *impl) {
  char why[256] = "";
  if (cudapeer_open(why, sizeof why) != 0)
    pb_die("--impl %s needs a CUDA driver and device: %s", impl, why);
}

const struct hist_variant *pb_find_hist_variant(const char *impl) {
  for (size_t i = 0; i < sizeof g_hist_variants / sizeof g_hist_variants[0];
       i++)
    if (strcmp(g_hist_variants[i].name, impl) == 0)
      return &g_hist_variants[i];
  return NULL;
}

/* variant: NULL, or the name of a pinpool variant and its extra config.
 * hist: whether the pinpool-h-* implementations are allowed (W1h). */
void pb_im_setup(const char *pool_config, const char *variant,
                 const char *variant_config, bool hist) {
  memset(&pb_im, 0, sizeof pb_im);
  const char *impl = pb_opt.impl;
  bool var = variant != NULL && strcmp(impl, variant) == 0;
  const hist_variant_t *hv = hist ? pb_find_hist_variant(impl) : NULL;
  const cuda_pool_t *cp = pb_find_cuda_pool(impl);
  if (is_cuda_impl(impl))
    need_cuda(impl);
  if (strcmp(impl, "pinpool") == 0 || var || hv != NULL || cp != NULL) {
    pb_im.kind = K_PINPOOL;
    pb_im.name = var          ? variant
                 : hv != NULL ? hv->name
                 : cp != NULL ? cp->name
                              : "pinpool";
    snprintf(pb_im.config, sizeof pb_im.config, "%s%s", pool_config,
             var          ? variant_config
             : cp != NULL ? cp->config
                          : "");
    int rc = pinpool_create(pb_im.config, &pb_im.pool);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_create", rc);
    if (hv != NULL) {
      pinpool_history_options_t ho = {hv->record, 0, hv->stack_depth, 0};
      rc = pinpool_record_history(pb_im.pool, &ho);
      if (rc != PINPOOL_OK)
        pb_die_pp("pinpool_record_history", rc);
      size_t n = strlen(pb_im.config);
      snprintf(pb_im.config + n, sizeof pb_im.config - n, " (%s)", hv->desc);
    }
  } else if (strcmp(impl, "refpool") == 0 ||
             strcmp(impl, "refpool-cuda") == 0) {
    static const refpool_events_t ev = {ref_record, ref_query, NULL};
    static const refpool_backend_t cu = {ref_cu_alloc, ref_cu_free, NULL};
    pb_im.kind = K_REFPOOL;
    pb_im.cuda = strcmp(impl, "refpool-cuda") == 0;
    pb_im.name = pb_im.cuda ? "refpool-cuda" : "refpool";
    snprintf(pb_im.config, sizeof pb_im.config,
             "pow2, no split, global event FIFO%s",
             pb_im.cuda ? ", cuMemHostAlloc(PORTABLE) per block" : "");
    if (refpool_create(&ev, pb_im.cuda ? &cu : NULL, &pb_im.ref) != 0)
      pb_die("refpool_create failed");
  } else if (strcmp(impl, "rmmpool") == 0) {
    static const refpool_events_t ev = {ref_record, ref_query, NULL};
    pb_im.kind = K_RMMPOOL;
    pb_im.name = "rmmpool";
    snprintf(pb_im.config, sizeof pb_im.config,
             "RMM pool_memory_resource policy: coalescing best fit, 256 B "
             "alignment, initial 0, grows by max(request, pool size), "
             "per-stream free lists");
    if (rmmpool_create(0, &ev, NULL, &pb_im.rmm) != 0)
      pb_die("rmmpool_create failed");
  } else if (strcmp(impl, "floor") == 0 || strcmp(impl, "floor-huge") == 0) {
    pb_im.kind = K_FLOOR;
    g_floor_huge = strcmp(impl, "floor-huge") == 0;
    pb_im.name = g_floor_huge ? "floor-huge" : "floor";
    snprintf(pb_im.config, sizeof pb_im.config,
             "pre-faulted region%s, a ring per thread sized to the live set, "
             "free is a no-op",
             g_floor_huge ? " on transparent huge pages" : "");
  } else if (strcmp(impl, "naive") == 0) {
    pb_im.kind = K_NAIVE;
    pb_im.name = "naive";
    snprintf(pb_im.config, sizeof pb_im.config,
             "mmap+MAP_POPULATE+mlock / munlock+munmap per block");
  } else if (strcmp(impl, "cuhostalloc") == 0) {
    pb_im.kind = K_CUHOST;
    pb_im.cuda = true;
    pb_im.name = "cuhostalloc";
    snprintf(pb_im.config, sizeof pb_im.config,
             "cuMemHostAlloc(PORTABLE) / cuMemFreeHost per block");
  } else if (strcmp(impl, "malloc") == 0) {
    pb_im.kind = K_MALLOC;
    pb_im.name = pb_opt.name != NULL ? pb_opt.name : PEER_NAME;
    /* A tuned peer is the same executable under its tuning variable (set by
     * bench/run.sh before the process starts: tcmalloc reads it then). */
    const char *rr = getenv("TCMALLOC_RELEASE_RATE");
    if (strcmp(PEER_NAME, "tcmalloc") == 0 && rr != NULL)
      snprintf(pb_im.config, sizeof pb_im.config,
               "%s malloc/free, TCMALLOC_RELEASE_RATE=%s", PEER_NAME, rr);
    else
      snprintf(pb_im.config, sizeof pb_im.config, "%s malloc/free, defaults",
               PEER_NAME);
    /* Its backend calls: counted on every thread that calls it (here for
     * W6's main thread, worker_main for the workers). */
    (void)syscount_init(pb_syscount_why, sizeof pb_syscount_why);
  } else {
    pb_die("unknown --impl '%s'", impl);
  }
  if (pb_opt.name != NULL && pb_im.kind != K_MALLOC)
    pb_die("--name renames a malloc peer only");
  /* Every implementation's blocks are used the same way (pb_use_block). */
  pb_im.touch = pb_opt.touch;
  pb_im.mode = pb_opt.touch ? "touch" : "alloc";
  if (pb_im.kind == K_FLOOR && !pb_opt.touch)
    pb_die("the floor is measured in touch mode only");
}

void pb_im_teardown(void) {
  if (pb_im.kind == K_PINPOOL) {
    pinpool_destroy(pb_im.pool);
    pb_im.pool = NULL;
  } else if (pb_im.kind == K_REFPOOL) {
    refpool_destroy(pb_im.ref);
    pb_im.ref = NULL;
  } else if (pb_im.kind == K_RMMPOOL) {
    rmmpool_destroy(pb_im.rmm);
    pb_im.rmm = NULL;
  } else if (pb_im.kind == K_FLOOR && g_floor_base != NULL) {
    munmap(g_floor_base, g_floor_len);
    g_floor_base = NULL;
  }
}

/* Check that malloc really is this binary's peer (not glibc by accident).
 * Sanitizer builds replace malloc themselves: nothing to check. */
void pb_check_peer(void) {
#ifdef PP_BENCH_SANITIZED
  return;
#endif
  Dl_info info;
  void *(*fn)(size_t) = malloc;
  if (dladdr((void *)(uintptr_t)fn, &info) == 0 || info.dli_fname == NULL)
    return; /* cannot tell */
  if (strstr(info.dli_fname, PEER_LIB) == NULL)
    pb_die("malloc comes from %s, expected %s (%s)", info.dli_fname, PEER_LIB,
           PEER_NAME);
}
