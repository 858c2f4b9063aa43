/* The cuda and cuda-register backends through the public API: every
 * arena chunk the pool reserves is one cuMemHostAlloc (or one mmap +
 * cuMemHostRegister, in pieces of at most register_max) given back exactly
 * once, whatever number of segments is carved from it; cuda_flags reach the
 * driver; driver errors become PINPOOL_ENOMEM / PINPOOL_EBACKEND with the
 * driver's error name and leave the pool usable; threads that never touched
 * CUDA can allocate, and a caller's own context stack is left as it was.
 *
 * Runs against the fake driver (counts checked) and, from
 * scripts/gpu-check.sh, against a real one (the fake-only checks skip). */
#define _GNU_SOURCE
#include "cudatest.h"

#include "base.h" /* the test hook and its points (src/) */

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Allocate a mix of sizes, write them, free them; check the driver holds
 * exactly the pool's arena chunks (segments are carved from them and cost
 * no driver call), all of them page-locked. */
static void churn(pinpool_t *pool, bool reg) {
  static const size_t sizes[] = {1,      512,     4096,    5000,
                                 100000, 1 << 20, 3 << 20, 9 << 20};
  enum { N = sizeof sizes / sizeof sizes[0] };
  void *p[N];
  for (int i = 0; i < N; i++) {
    CT_OK(pinpool_alloc(pool, sizes[i], &p[i]));
    CT_ASSERT(((uintptr_t)p[i] & 63) == 0, "block %p not 64-byte aligned",
              p[i]);
    memset(p[i], i + 1, sizes[i]);
  }
  for (int i = 0; i < N; i++)
    CT_ASSERT(((unsigned char *)p[i])[sizes[i] - 1] == i + 1,
              "block %d overwritten", i);
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.locked_bytes == st.reserved_bytes.current,
            "locked %llu of %llu reserved bytes",
            (unsigned long long)st.locked_bytes,
            (unsigned long long)st.reserved_bytes.current);
  CT_ASSERT(st.arena_chunks > 0 && st.arena_chunks == st.backend_alloc.count -
                                                          st.backend_free.count,
            "%llu chunks, %llu backend allocations, %llu frees",
            (unsigned long long)st.arena_chunks,
            (unsigned long long)st.backend_alloc.count,
            (unsigned long long)st.backend_free.count);
  /* More segments than chunks: several are carved from one chunk. */
  CT_ASSERT(st.segments.current > st.arena_chunks, "%llu segments, %llu chunks",
            (unsigned long long)st.segments.current,
            (unsigned long long)st.arena_chunks);
  CT_FAKE_EQ(reg ? "live_registrations" : "live_host_allocs",
             (long long)st.arena_chunks);
  CT_FAKE_EQ(reg ? "registered_bytes" : "host_alloc_bytes",
             (long long)st.reserved_bytes.current);
  CT_FAKE_EQ(reg ? "live_host_allocs" : "live_registrations", 0);
  for (int i = 0; i < N; i++)
    CT_OK(pinpool_free(pool, p[i]));
  CT_OK(pinpool_validate(pool));
  CT_FAKE_CLEAN();
}

static void check_released(pinpool_t *pool, bool reg) {
  CT_OK(pinpool_empty_cache(pool));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.reserved_bytes.current == 0 && st.arena_chunks == 0,
            "%llu bytes still reserved in %llu chunks",
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)st.arena_chunks);
  CT_FAKE_EQ(reg ? "live_registrations" : "live_host_allocs", 0);
  /* Every chunk given back, each with one driver call. */
  CT_ASSERT(st.backend_free.count == st.backend_alloc.count,
            "%llu chunks allocated, %llu freed",
            (unsigned long long)st.backend_alloc.count,
            (unsigned long long)st.backend_free.count);
  CT_FAKE_EQ(reg ? "calls:cuMemHostUnregister" : "calls:cuMemFreeHost",
             (long long)st.backend_free.count);
  CT_FAKE_EQ(reg ? "calls:cuMemHostRegister" : "calls:cuMemHostAlloc",
             (long long)st.backend_alloc.count);
}

static void test_cuda_alloc_free(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0");
  char cfg[1024];
  CT_OK(pinpool_get_config(pool, cfg, sizeof cfg, NULL));
  CT_ASSERT(strstr(cfg, "backend=cuda,") != NULL, "config: %s", cfg);
  churn(pool, false);
  /* Cached: the same sizes again cost no driver call. */
  long long before = ct_is_fake ? ct_fake.get("calls:cuMemHostAlloc") : 0;
  churn(pool, false);
  CT_FAKE_EQ("calls:cuMemHostAlloc", before);
  check_released(pool, false);
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_register_alloc_free(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  pinpool_t *pool =
      CT_CREATE("backend=cuda-register,device=0,register_threads=4,"
                "populate_parallel_min=1MiB");
  churn(pool, true);
  /* Registered memory is portable (any context may use it). */
  CT_FAKE_EQ("last_register_flags", CU_MEMHOSTREGISTER_PORTABLE);
  CT_FAKE_EQ("calls:cuMemHostAlloc", 0);
  check_released(pool, true);
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

/* numa=local (issue 24) on cuda-register: each node's chunks are bound to
 * their node, populated, then registered; the driver holds exactly the
 * arena's chunks, of every node. backend=cuda cannot place memory: a
 * config error. */
static void test_register_numa_local(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  /* On one CPU: the thread stays on one node (CPU c is on node c % 2). */
  cpu_set_t old, one;
  bool pinned = sched_getaffinity(0, sizeof old, &old) == 0;
  CPU_ZERO(&one);
  CPU_SET(0, &one);
  pinned = pinned && sched_setaffinity(0, sizeof one, &one) == 0;
  pinpool_t *pool = CT_CREATE("backend=cuda-register,device=0,numa=local,"
                              "numa_fake_nodes=2");
  unsigned nodes = 0;
  CT_OK(pinpool_numa_nodes(pool, &nodes));
  CT_ASSERT(nodes == 2, "%u nodes", nodes);
  churn(pool, true);
  check_released(pool, true);
  pinpool_destroy(pool);
  if (pinned)
    (void)sched_setaffinity(0, sizeof old, &old);
  pinpool_t *bad = NULL;
  ct_rc_(pinpool_create("backend=cuda,device=0,numa=local", &bad),
         PINPOOL_ECONFIG, "backend=cuda,numa=local", __FILE__, __LINE__);
  CT_ASSERT(bad == NULL, "pool created");
  CT_FAKE_BALANCED();
}

static void test_destroy_releases_live_blocks(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  const char *confs[] = {"backend=cuda,device=0",
                         "backend=cuda-register,device=0",
                         "backend=cuda,device=0,reserve=8MiB"};
  for (size_t i = 0; i < 3; i++) {
    pinpool_t *pool = CT_CREATE(confs[i]);
    void *p = NULL, *q = NULL;
    CT_OK(pinpool_alloc(pool, 777, &p));
    CT_OK(pinpool_alloc(pool, 5 * MiB, &q));
    pinpool_destroy(pool); /* with both blocks still allocated */
    CT_FAKE_BALANCED();
  }
}

static void test_reserve(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0,reserve=8MiB");
  /* The reserve is one backend allocation made at create: the arena's
   * first chunk. */
  CT_FAKE_EQ("live_host_allocs", 1);
  CT_FAKE_EQ("host_alloc_bytes", 8 << 20);
  CT_ASSERT(ct_stats(pool).arena_chunks == 1, "chunks");
  /* Small and large blocks are carved from it. */
  void *p = NULL, *s = NULL;
  CT_OK(pinpool_alloc(pool, MiB, &p));
  CT_OK(pinpool_alloc(pool, 1000, &s));
  CT_FAKE_EQ("live_host_allocs", 1);
  /* More than its room left: the arena grows by one chunk. */
  void *q = NULL;
  CT_OK(pinpool_alloc(pool, 7 * MiB, &q));
  CT_FAKE_EQ("live_host_allocs", 2);
  CT_ASSERT(ct_stats(pool).arena_chunks == 2, "chunks");
  CT_OK(pinpool_free(pool, q));
  CT_OK(pinpool_free(pool, s));
  CT_OK(pinpool_free(pool, p));
  CT_OK(pinpool_empty_cache(pool));
  /* The grown chunk goes back; the reserve is kept for the pool's life. */
  CT_FAKE_EQ("live_host_allocs", 1);
  CT_FAKE_EQ("host_alloc_bytes", 8 << 20);
  CT_ASSERT(ct_stats(pool).arena_chunks == 1, "chunks");
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_cuda_flags(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  static const struct {
    const char *conf;
    const char *key;
    long long want;
  } cases[] = {
      {"backend=cuda,device=0", "last_host_alloc_flags",
       CU_MEMHOSTALLOC_PORTABLE},
      {"backend=cuda,device=0,cuda_flags=none", "last_host_alloc_flags", 0},
      {"backend=cuda,device=0,cuda_flags=devicemap", "last_host_alloc_flags",
       CU_MEMHOSTALLOC_DEVICEMAP},
      {"backend=cuda,device=0,cuda_flags=portable+devicemap+writecombined",
       "last_host_alloc_flags",
       CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP |
           CU_MEMHOSTALLOC_WRITECOMBINED},
      {"backend=cuda-register,device=0,cuda_flags=none", "last_register_flags",
       CU_MEMHOSTREGISTER_PORTABLE},
      {"backend=cuda-register,device=0,cuda_flags=devicemap",
       "last_register_flags",
       CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP},
      /* write-combining has no register form */
      {"backend=cuda-register,device=0,cuda_flags=writecombined",
       "last_register_flags", CU_MEMHOSTREGISTER_PORTABLE},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ct_fake.reset();
    pinpool_t *pool = CT_CREATE(cases[i].conf);
    void *p = NULL;
    CT_OK(pinpool_alloc(pool, 4096, &p));
    long long got = ct_fake.get(cases[i].key);
    CT_ASSERT(got == cases[i].want, "%s: %s = %lld, expected %lld",
              cases[i].conf, cases[i].key, got, cases[i].want);
    CT_OK(pinpool_free(pool, p));
    pinpool_destroy(pool);
    CT_FAKE_BALANCED();
  }
}

static void test_out_of_memory(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  const char *confs[] = {"backend=cuda,device=0",
                         "backend=cuda-register,device=0"};
  const char *calls[] = {"cuMemHostAlloc", "cuMemHostRegister"};
  for (int i = 0; i < 2; i++) {
    ct_fake.reset();
    pinpool_t *pool = CT_CREATE(confs[i]);
    void *keep = NULL, *p = (void *)(uintptr_t)0x1234;
    CT_OK(pinpool_alloc(pool, 1000, &keep));
    /* One failure: the pool releases idle memory and retries, once. */
    CT_ASSERT(ct_fake.inject(calls[i], 1, CUDA_ERROR_OUT_OF_MEMORY) == 0,
              "arm");
    CT_OK(pinpool_alloc(pool, 3 * MiB, &p));
    CT_OK(pinpool_free(pool, p));
    pinpool_stats_t st = ct_stats(pool);
    CT_ASSERT(st.retries == 1 && st.oom_count == 0, "retries %llu, oom %llu",
              (unsigned long long)st.retries, (unsigned long long)st.oom_count);
    /* Two: the allocation fails cleanly with the driver's reason. */
    p = (void *)(uintptr_t)0x1234;
    CT_ASSERT(ct_fake.inject(calls[i], 1, CUDA_ERROR_OUT_OF_MEMORY) == 0 &&
                  ct_fake.inject(calls[i], 2, CUDA_ERROR_OUT_OF_MEMORY) == 0,
              "arm");
    CT_RC(pinpool_alloc(pool, 5 * MiB, &p), PINPOOL_ENOMEM);
    CT_ERROR_HAS(calls[i]);
    CT_ERROR_HAS("CUDA_ERROR_OUT_OF_MEMORY");
    CT_ASSERT(p == (void *)(uintptr_t)0x1234, "*out changed on failure");
    st = ct_stats(pool);
    CT_ASSERT(st.oom_count == 1, "oom_count %llu",
              (unsigned long long)st.oom_count);
    CT_OK(pinpool_validate(pool));
    /* Still usable: the next call reaches the driver again. */
    CT_OK(pinpool_alloc(pool, 5 * MiB, &p));
    memset(p, 7, 5 * MiB);
    CT_OK(pinpool_free(pool, p));
    CT_OK(pinpool_free(pool, keep));
    CT_OK(pinpool_validate(pool));
    pinpool_destroy(pool);
    CT_FAKE_BALANCED();
  }
}

static void test_backend_errors(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0");
  void *p = NULL;
  CT_ASSERT(ct_fake.inject("cuMemHostAlloc", 1, CUDA_ERROR_UNKNOWN) == 0,
            "arm");
  CT_RC(pinpool_alloc(pool, 4096, &p), PINPOOL_EBACKEND);
  CT_ERROR_HAS("CUDA_ERROR_UNKNOWN");
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* A failed register gives the mapping back and is not retried. */
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda-register,device=0");
  CT_ASSERT(ct_fake.inject("cuMemHostRegister", 1,
                           CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED) == 0,
            "arm");
  CT_RC(pinpool_alloc(pool, 3 * MiB, &p), PINPOOL_EBACKEND);
  CT_ERROR_HAS("cuMemHostRegister");
  CT_ERROR_HAS("CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
  CT_FAKE_EQ("calls:cuMemHostRegister", 1);
  CT_FAKE_EQ("live_registrations", 0);
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.reserved_bytes.current == 0, "reserved after failure");
  CT_OK(pinpool_alloc(pool, 3 * MiB, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* A context that cannot be made current fails the call, cleanly. */
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda,device=0");
  CT_ASSERT(ct_fake.inject("cuCtxPushCurrent", 1, CUDA_ERROR_INVALID_CONTEXT) ==
                0,
            "arm");
  CT_RC(pinpool_alloc(pool, 4096, &p), PINPOOL_EBACKEND);
  CT_ERROR_HAS("CUDA_ERROR_INVALID_CONTEXT");
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_misaligned_driver_memory(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0");
  CT_ASSERT(ct_fake.set("misalign", 1) == 0, "set");
  void *p = NULL;
  CT_RC(pinpool_alloc(pool, 4096, &p), PINPOOL_EBACKEND);
  CT_ERROR_HAS("not aligned");
  CT_FAKE_EQ("live_host_allocs", 0); /* given back */
  CT_ASSERT(ct_fake.set("misalign", 0) == 0, "set");
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

/* ---- Threads without a context ------------------------------------------ */
typedef struct worker {
  pinpool_t *pool;
  pthread_t tid;
  unsigned seed;
  int failures;
  bool ctx_leaked; /* a context was current after a pool call */
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  void *held[16] = {0};
  for (int it = 0; it < 400; it++) {
    int slot = (int)(rand_r(&w->seed) % 16);
    if (held[slot] != NULL) {
      if (pinpool_free(w->pool, held[slot]) != 0)
        w->failures++;
      held[slot] = NULL;
    } else {
      size_t size = (size_t)1 << (rand_r(&w->seed) % 22);
      if (pinpool_alloc(w->pool, size, &held[slot]) != 0) {
        w->failures++;
        held[slot] = NULL;
      } else {
        memset(held[slot], slot, size);
      }
    }
    if (it % 64 == 0 && ct_cu.get_current != NULL) {
      CUcontext c = (CUcontext)(uintptr_t)1;
      if (ct_cu.get_current(&c) != CUDA_SUCCESS || c != NULL)
        w->ctx_leaked = true;
    }
  }
  for (int i = 0; i < 16; i++)
    if (held[i] != NULL && pinpool_free(w->pool, held[i]) != 0)
      w->failures++;
  return NULL;
}

static void run_threads(const char *conf) {
  pinpool_t *pool = CT_CREATE(conf);
  worker_t w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (worker_t){pool, 0, (unsigned)i * 7919u + 1, 0, false};
    CT_ASSERT(pthread_create(&w[i].tid, NULL, worker_main, &w[i]) == 0,
              "pthread_create");
  }
  for (int i = 0; i < 4; i++)
    (void)pthread_join(w[i].tid, NULL);
  for (int i = 0; i < 4; i++) {
    CT_ASSERT(w[i].failures == 0, "%s: thread %d: %d failed calls", conf, i,
              w[i].failures);
    CT_ASSERT(!w[i].ctx_leaked, "%s: thread %d was left with a context", conf,
              i);
  }
  /* Every driver call from those threads ran with the pool's context. */
  CT_FAKE_CLEAN();
  CT_OK(pinpool_empty_cache(pool));
  CT_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_threads_without_context(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  run_threads("backend=cuda,device=0,tcache_bytes=256KiB,max_cached=8MiB");
  run_threads("backend=cuda-register,device=0,tcache_bytes=256KiB,"
              "max_cached=8MiB,register_threads=2");
}

static void test_caller_context_preserved(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  CT_ASSERT(ct_fake.set("device_count", 2) == 0, "set");
  ct_ctx_enter(); /* device 0's context, current here */
  CUcontext mine = NULL;
  CT_ASSERT(ct_cu.get_current(&mine) == CUDA_SUCCESS && mine != NULL, "ctx");
  /* The pool works in device 1's context. */
  pinpool_t *pool = CT_CREATE("backend=cuda,device=1");
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, 3 * MiB, &p));
  CT_OK(pinpool_free(pool, p));
  CT_OK(pinpool_empty_cache(pool));
  CUcontext now = NULL;
  CT_ASSERT(ct_cu.get_current(&now) == CUDA_SUCCESS && now == mine,
            "the caller's context was changed");
  pinpool_destroy(pool);
  CT_ASSERT(ct_cu.get_current(&now) == CUDA_SUCCESS && now == mine,
            "destroy changed the caller's context");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
  CT_FAKE_BALANCED();
}

/* ---- Registration in pieces (register_max) ----------------------------
 * An arena chunk above register_max is registered in pieces of at most
 * that size (one call of 512 GiB or more fails on recent drivers); the
 * chunk's release unregisters the same pieces; a piece that fails rolls
 * back the pieces before it, nothing leaks and the pool stays usable. */
static void test_register_pieces(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  pinpool_t *pool =
      CT_CREATE("backend=cuda-register,device=0,register_max=2MiB,"
                "tcache_bytes=0");
  char cfg[1024];
  CT_OK(pinpool_get_config(pool, cfg, sizeof cfg, NULL));
  CT_ASSERT(strstr(cfg, "register_max=2097152") != NULL, "config: %s", cfg);
  void *p = NULL;
  /* 9 MiB, above the 2 MiB first chunk: a chunk of its own, the request
   * rounded up to 2 MiB (10 MiB), 5 pieces. */
  CT_OK(pinpool_alloc(pool, 9 * MiB, &p));
  pinpool_stats_t st = ct_stats(pool);
  long long seg = (long long)st.reserved_bytes.current;
  long long pieces = (seg + (long long)(2 * MiB) - 1) / (long long)(2 * MiB);
  CT_ASSERT(st.arena_chunks == 1 && seg == (long long)(10 * MiB),
            "%llu chunks of %lld bytes", (unsigned long long)st.arena_chunks,
            seg);
  CT_ASSERT(pieces == 5, "chunk of %lld bytes", seg);
  CT_FAKE_EQ("calls:cuMemHostRegister", pieces);
  CT_FAKE_EQ("live_registrations", pieces);
  CT_FAKE_EQ("registered_bytes", seg);
  memset(p, 7, 9 * MiB);
  CT_OK(pinpool_free(pool, p));
  CT_OK(pinpool_empty_cache(pool));
  CT_FAKE_EQ("live_registrations", 0);
  CT_FAKE_EQ("calls:cuMemHostUnregister", pieces);

  /* Piece k fails: the pieces before it are unregistered, the mapping
   * given back, the error names the piece. (Not out of memory: that one
   * the pool retries after giving idle memory back.) */
  for (unsigned k = 1; k <= 5; k++) {
    ct_fake.reset();
    CT_ASSERT(
        ct_fake.inject("cuMemHostRegister", k, CUDA_ERROR_INVALID_VALUE) == 0,
        "arm");
    CT_RC(pinpool_alloc(pool, 9 * MiB, &p), PINPOOL_EBACKEND);
    CT_ERROR_HAS("piece");
    CT_FAKE_EQ("calls:cuMemHostRegister", k);
    CT_FAKE_EQ("calls:cuMemHostUnregister", k - 1);
    CT_FAKE_EQ("live_registrations", 0);
    CT_FAKE_EQ("registered_bytes", 0);
    st = ct_stats(pool);
    CT_ASSERT(st.reserved_bytes.current == 0, "reserved after the failure");
    CT_OK(pinpool_validate(pool));
  }
  CT_OK(pinpool_alloc(pool, 9 * MiB, &p)); /* usable afterwards */
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* A chunk that is not a multiple of register_max: under max_reserved
   * the chunk is exactly the (page-rounded) request, 9 MiB, registered as
   * four 2 MiB pieces and a last one of 1 MiB. */
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda-register,device=0,register_max=2MiB,"
                   "max_reserved=9MiB,tcache_bytes=0");
  CT_OK(pinpool_alloc(pool, 9 * MiB, &p));
  st = ct_stats(pool);
  CT_ASSERT(st.arena_chunks == 1 && st.reserved_bytes.current == 9 * MiB,
            "%llu chunks, %llu bytes", (unsigned long long)st.arena_chunks,
            (unsigned long long)st.reserved_bytes.current);
  CT_FAKE_EQ("calls:cuMemHostRegister", 5);
  CT_FAKE_EQ("live_registrations", 5);
  CT_FAKE_EQ("registered_bytes", (long long)(9 * MiB));
  memset(p, 9, 9 * MiB);
  CT_OK(pinpool_free(pool, p));
  CT_OK(pinpool_empty_cache(pool));
  CT_FAKE_EQ("live_registrations", 0);
  CT_FAKE_EQ("calls:cuMemHostUnregister", 5);
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* Blocks in every piece: the driver knows each as pinned host memory
   * (cuPointerGetAttribute on an address inside a later piece). 256 KiB
   * blocks, 3 MiB of them: slabs carved from at least two chunks of at
   * least 2 MiB, each registered as 1 MiB pieces. */
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda-register,device=0,register_max=1MiB,"
                   "tcache_bytes=0");
  enum { NB = 12 };
  pinpool_buffer_t *bufs[NB];
  for (int i = 0; i < NB; i++) {
    CT_OK(pinpool_buffer_alloc(pool, 256 * KiB, &bufs[i]));
    pinpool_mem_attrs_t a;
    CT_OK(pinpool_buffer_attrs(bufs[i], &a));
    CT_ASSERT(a.device_accessible == 1 && a.device_id == 0 && a.page_locked,
              "block %d: accessible %d device %d locked %d", i,
              a.device_accessible, a.device_id, a.page_locked);
  }
  CT_ASSERT(ct_fake.get("calls:cuPointerGetAttribute") >= NB,
            "the driver was not asked");
  st = ct_stats(pool);
  CT_ASSERT(st.arena_chunks >= 2, "%llu chunks",
            (unsigned long long)st.arena_chunks);
  CT_ASSERT(ct_fake.get("live_registrations") > (long long)st.arena_chunks,
            "%lld registrations for %llu chunks: no chunk in pieces",
            ct_fake.get("live_registrations"),
            (unsigned long long)st.arena_chunks);
  /* Chunks are whole 2 MiB multiples here: exactly one piece per MiB. */
  CT_FAKE_EQ("live_registrations",
             (long long)(st.reserved_bytes.current / MiB));
  CT_FAKE_EQ("registered_bytes", (long long)st.reserved_bytes.current);
  for (int i = 0; i < NB; i++)
    CT_OK(pinpool_buffer_release(bufs[i]));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* Hugepages: pieces are whole huge pages; register_max must be too. */
  pinpool_t *bad = NULL;
  CT_RC(pinpool_create("backend=cuda-register,device=0,hugepages=1,"
                       "register_max=1MiB",
                       &bad),
        PINPOOL_ECONFIG);
  CT_ERROR_HAS("register_max");
  CT_RC(
      pinpool_create("backend=cuda-register,device=0,register_max=5000", &bad),
      PINPOOL_ECONFIG);
  CT_RC(pinpool_create("backend=cuda-register,device=0,register_max=0", &bad),
        PINPOOL_ECONFIG);

  /* backend=cuda cannot cut an allocation: above register_max, refused. */
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda,device=0,register_max=4MiB");
  CT_RC(pinpool_alloc(pool, 9 * MiB, &p), PINPOOL_ENOMEM);
  CT_ERROR_HAS("register_max");
  CT_FAKE_EQ("calls:cuMemHostAlloc", 0);
  CT_OK(pinpool_alloc(pool, 3 * MiB, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* ... and the arena's chunks stop at register_max too: a small request
   * under register_max=1MiB (the first chunk would be 2 MiB), and a
   * growing arena whose eighth passes register_max (regression: the
   * tenth 4 MiB block asked for a 6 MiB chunk and every allocation that
   * grew the arena failed from then on). */
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda,device=0,register_max=1MiB");
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_FAKE_EQ("live_host_allocs", 1);
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
  enum { NK = 40 };
  void *keep[NK];
  pool = CT_CREATE("backend=cuda,device=0,register_max=4MiB,tcache_bytes=0");
  for (int i = 0; i < NK; i++)
    CT_OK(pinpool_alloc(pool, 4 * MiB, &keep[i]));
  st = ct_stats(pool);
  CT_ASSERT(st.arena_chunks == NK && st.reserved_bytes.current == NK * 4 * MiB,
            "%llu chunks, %llu bytes", (unsigned long long)st.arena_chunks,
            (unsigned long long)st.reserved_bytes.current);
  CT_OK(pinpool_alloc(pool, 1 * MiB, &p));
  CT_OK(pinpool_free(pool, p));
  for (int i = 0; i < NK; i++)
    CT_OK(pinpool_free(pool, keep[i]));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

/* ---- Interior pointers of a block across pieces -------------------------
 * The driver answers cuPointerGetAttribute for every byte of a registered
 * range (docs/cuda.md, "Large segments"): a block that spans two pieces is
 * pinned host memory wherever a kernel or a copy points into it, and the
 * byte before a piece boundary and the byte after it both answer, each from
 * its own piece. pinpool's own query (pinpool_buffer_attrs) asks about a
 * block's first byte only (the API takes a buffer, not a pointer), so the
 * interior is checked at the driver, after the pool registered the chunk,
 * in the pool's context. Any driver; which piece answered, and the
 * refusals after the release, with the fake only. */
typedef __typeof__(&cuPointerGetAttribute) ct_ptr_attr_fn;
typedef __typeof__(&fake_cuda_registration) ct_registration_fn;

static void *driver_lib(void) {
  const char *path = getenv("PINPOOL_LIBCUDA");
  return dlopen(path != NULL && path[0] != '\0' ? path : "libcuda.so.1",
                RTLD_NOW | RTLD_NOLOAD);
}

/* Host memory the driver knows, at p, with the same device ordinal as the
 * block's first byte (attributes do not depend on where a block sits). */
static void host_at_(ct_ptr_attr_fn query, const char *p, int want_ordinal,
                     const char *what, size_t off, const char *file, int line) {
  unsigned type = 0;
  int ordinal = -2;
  CUresult r1 =
      query(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)p);
  CUresult r2 = query(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                      (CUdeviceptr)(uintptr_t)p);
  if (r1 == CUDA_SUCCESS && type == CU_MEMORYTYPE_HOST && r2 == CUDA_SUCCESS &&
      ordinal == want_ordinal)
    return;
  print_error("ERROR: %s: block + %zu (%p): memory type %u (%d), device "
              "ordinal %d (%d), expected host memory of device %d\n",
              what, off, (const void *)p, type, r1, ordinal, r2, want_ordinal);
  _fail(file, line);
}
#define HOST_AT(q, p, want, what, off)                                         \
  host_at_((q), (p), (want), (what), (off), __FILE__, __LINE__)

static CUresult query_type(ct_ptr_attr_fn query, const void *p) {
  unsigned type = 0;
  return query(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
               (CUdeviceptr)(uintptr_t)p);
}

static void interior_pointers(ct_ptr_attr_fn query, ct_registration_fn reg,
                              const char *conf) {
  if (ct_is_fake)
    ct_fake.reset();
  pinpool_t *pool = CT_CREATE(conf);
  /* 9 MiB: a chunk of its own, 10 MiB, registered as 4 + 4 + 2 MiB. */
  pinpool_buffer_t *b = NULL;
  CT_OK(pinpool_buffer_alloc(pool, 9 * MiB, &b));
  void *vp = NULL;
  CT_OK(pinpool_buffer_ptr(b, &vp));
  char *p = vp;
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.arena_chunks == 1 && st.reserved_bytes.current == 10 * MiB,
            "%s: %llu chunks of %llu bytes", conf,
            (unsigned long long)st.arena_chunks,
            (unsigned long long)st.reserved_bytes.current);
  CT_FAKE_EQ("live_registrations", 3);
  /* The public query: the block's first byte. */
  pinpool_mem_attrs_t a;
  CT_OK(pinpool_buffer_attrs(b, &a));
  CT_ASSERT(a.device_accessible == 1 && a.page_locked == 1,
            "%s: accessible %d, locked %d", conf, a.device_accessible,
            a.page_locked);
  ct_ctx_enter();
  /* Every 256 KiB of the block, the byte before each of them and its last
   * byte: pinned host memory of the block's device, whichever piece. */
  int ordinal = -2;
  CT_ASSERT(query(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                  (CUdeviceptr)(uintptr_t)p) == CUDA_SUCCESS,
            "%s: the block's first byte is unknown to the driver", conf);
  CT_ASSERT(ordinal == a.device_id, "%s: ordinal %d, attrs say %d", conf,
            ordinal, a.device_id);
  for (size_t off = 256 * KiB; off < 9 * MiB; off += 256 * KiB) {
    HOST_AT(query, p + off, ordinal, conf, off);
    HOST_AT(query, p + off - 1, ordinal, conf, off - 1);
  }
  HOST_AT(query, p + 9 * MiB - 1, ordinal, conf, 9 * MiB - 1);
  /* Memory the driver was never told of: refused. */
  char *own = mmap(NULL, 2 * MiB, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CT_ASSERT(own != MAP_FAILED, "mmap");
  own[0] = 1;
  CT_ASSERT(query_type(query, own) == CUDA_ERROR_INVALID_VALUE &&
                query_type(query, own + MiB) == CUDA_ERROR_INVALID_VALUE,
            "%s: the driver answers for memory nobody registered", conf);
  if (reg != NULL) {
    /* Which registration answered: the block starts in one piece, its
     * interior at +5 MiB lies in the next one, which starts where the
     * first ends, inside the block; the bytes either side of that boundary
     * are each in their own piece. */
    void *b0 = NULL, *b1 = NULL, *lo = NULL, *hi = NULL;
    size_t s0 = 0, s1 = 0, slo = 0, shi = 0;
    CT_ASSERT(reg(p, &b0, &s0) == 0, "%s: block start not registered", conf);
    CT_ASSERT(reg(p + 5 * MiB, &b1, &s1) == 0,
              "%s: block + 5 MiB not registered", conf);
    char *boundary = (char *)b0 + s0;
    CT_ASSERT(s0 == 4 * MiB && s1 <= 4 * MiB && b1 == boundary &&
                  boundary > p && boundary < p + 9 * MiB,
              "%s: block %p; start in [%p, +%zu), +5 MiB in [%p, +%zu)", conf,
              (void *)p, b0, s0, b1, s1);
    CT_ASSERT(reg(boundary - 1, &lo, &slo) == 0 && lo == b0 &&
                  reg(boundary, &hi, &shi) == 0 && hi == b1,
              "%s: around the boundary %p: pieces %p and %p", conf,
              (void *)boundary, lo, hi);
    CT_ASSERT(reg(own, NULL, NULL) == -1, "%s: own memory registered", conf);
  }
  /* The release unregisters every piece: the interior is unknown again
   * (the fake keeps nothing mapped there that it could answer for). */
  CT_OK(pinpool_buffer_release(b));
  CT_OK(pinpool_empty_cache(pool));
  CT_FAKE_EQ("live_registrations", 0);
  if (reg != NULL) {
    CT_ASSERT(reg(p + 5 * MiB, NULL, NULL) == -1, "%s: still registered", conf);
    CT_ASSERT(query_type(query, p) == CUDA_ERROR_INVALID_VALUE &&
                  query_type(query, p + 5 * MiB) == CUDA_ERROR_INVALID_VALUE,
              "%s: the driver still answers after the release", conf);
  }
  (void)munmap(own, 2 * MiB);
  ct_ctx_leave();
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_register_interior_pointers(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  void *lib = driver_lib();
  ct_ptr_attr_fn query = NULL;
  ct_registration_fn reg = NULL;
  if (lib != NULL) {
    CU_LOAD(lib, query, "cuPointerGetAttribute");
    if (ct_is_fake)
      CU_LOAD(lib, reg, "fake_cuda_registration");
  }
  if (query == NULL) {
    if (lib != NULL)
      (void)dlclose(lib);
    print_message("[  SKIP    ] the driver has no cuPointerGetAttribute\n");
    skip();
  }
  CT_ASSERT(!ct_is_fake || reg != NULL, "fake without fake_cuda_registration");
  interior_pointers(query, reg,
                    "backend=cuda-register,device=0,register_max=4MiB,"
                    "tcache_bytes=0");
  interior_pointers(query, reg,
                    "backend=cuda-register,device=0,register_max=4MiB,"
                    "hugepages=1,tcache_bytes=0");
  (void)dlclose(lib); /* the pool's own handle keeps it loaded */
}

/* ---- hugepages=1 on cuda-register ----------------------------------------
 * The chunk goes through the host backend's mapping: MADV_HUGEPAGE before
 * any page is touched, then population by register_threads threads, then
 * cuMemHostRegister (the driver pins what is already resident). The test
 * hook records the order (PP_HOOK_HUGE_ADVISED, PP_HOOK_POPULATE,
 * PP_HOOK_POPULATE_JOB) with the thread of each point, and, with the fake,
 * how many registrations were made when population started. */
enum { HO_MAX = 256 };
static atomic_int ho_n;
static int ho_point[HO_MAX];
static long ho_tid[HO_MAX];
static long long ho_regs_at_populate;

static void ho_record(int point) {
  if (point != PP_HOOK_HUGE_ADVISED && point != PP_HOOK_POPULATE &&
      point != PP_HOOK_POPULATE_JOB)
    return;
  int i = atomic_fetch_add(&ho_n, 1);
  if (i < HO_MAX) {
    ho_point[i] = point;
    ho_tid[i] = (long)syscall(SYS_gettid);
  }
  if (point == PP_HOOK_POPULATE && ct_is_fake && ho_regs_at_populate < 0)
    ho_regs_at_populate = ct_fake.get("calls:cuMemHostRegister");
}

static void test_register_huge_order(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  if (ct_is_fake)
    ct_fake.reset();
  pinpool_t *pool = CT_CREATE(
      "backend=cuda-register,device=0,hugepages=1,register_threads=4,"
      "populate_threads=1,populate_parallel_min=4MiB,register_max=4MiB,"
      "tcache_bytes=0");
  atomic_store(&ho_n, 0);
  ho_regs_at_populate = -1;
  atomic_store(&pp_test_hook, ho_record);
  pinpool_buffer_t *b = NULL;
  int rc = pinpool_buffer_alloc(pool, 9 * MiB, &b);
  atomic_store(&pp_test_hook, NULL);
  CT_OK(rc);
  int n = atomic_load(&ho_n);
  CT_ASSERT(n <= HO_MAX, "%d points", n);
  int advised = -1, first_pop = -1, nadvised = 0;
  long tids[HO_MAX];
  unsigned ntids = 0;
  for (int i = 0; i < n; i++) {
    if (ho_point[i] == PP_HOOK_HUGE_ADVISED) {
      nadvised++;
      advised = advised < 0 ? i : advised;
      continue;
    }
    first_pop = first_pop < 0 ? i : first_pop;
    if (ho_point[i] != PP_HOOK_POPULATE_JOB)
      continue;
    unsigned k = 0;
    while (k < ntids && tids[k] != ho_tid[i])
      k++;
    if (k == ntids)
      tids[ntids++] = ho_tid[i];
  }
  CT_ASSERT(nadvised == 1, "%d MADV_HUGEPAGE for one chunk", nadvised);
  CT_ASSERT(first_pop >= 0 && advised < first_pop,
            "populating started (point %d) before MADV_HUGEPAGE (point %d)",
            first_pop, advised);
  /* register_threads, not populate_threads (1 here), populate it. */
  CT_ASSERT(ntids >= 2, "the 10 MiB chunk was populated by %u thread(s)",
            ntids);
  CT_ASSERT(!ct_is_fake || ho_regs_at_populate == 0,
            "%lld cuMemHostRegister before the population",
            ho_regs_at_populate);
  CT_FAKE_EQ("live_registrations", 3);
  pinpool_mem_attrs_t a;
  CT_OK(pinpool_buffer_attrs(b, &a));
  CT_ASSERT(a.huge_advised == 1 && a.page_locked == 1,
            "cuda-register, hugepages=1: advised %d, locked %d", a.huge_advised,
            a.page_locked);
  print_message("cuda-register chunk: advised, then populated by %u "
                "threads, then registered\n",
                ntids);
  CT_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* backend=cuda: the driver maps the memory; hugepages=1 has nothing to
   * advise (no MADV_HUGEPAGE, no population of ours). */
  if (ct_is_fake)
    ct_fake.reset();
  pool = CT_CREATE("backend=cuda,device=0,hugepages=1,tcache_bytes=0");
  atomic_store(&ho_n, 0);
  atomic_store(&pp_test_hook, ho_record);
  rc = pinpool_buffer_alloc(pool, 4 * MiB, &b);
  atomic_store(&pp_test_hook, NULL);
  CT_OK(rc);
  CT_ASSERT(atomic_load(&ho_n) == 0, "%d host-mapping points for backend=cuda",
            atomic_load(&ho_n));
  CT_OK(pinpool_buffer_attrs(b, &a));
  CT_ASSERT(a.huge_advised == 0, "backend=cuda reports huge_advised");
  CT_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();

  /* ... but a chunk the driver refused to pin, mapped pageable instead
   * (pin_failure=pageable), is the host backend's mapping: advised, then
   * populated. */
  if (!ct_is_fake)
    return;
  ct_fake.reset();
  pool = CT_CREATE("backend=cuda,device=0,hugepages=1,pin_failure=pageable,"
                   "tcache_bytes=0");
  CT_ASSERT(ct_fake.inject("cuMemHostAlloc", 1, CUDA_ERROR_OUT_OF_MEMORY) == 0,
            "arm");
  atomic_store(&ho_n, 0);
  atomic_store(&pp_test_hook, ho_record);
  rc = pinpool_buffer_alloc(pool, 4 * MiB, &b);
  atomic_store(&pp_test_hook, NULL);
  CT_OK(rc);
  n = atomic_load(&ho_n);
  CT_ASSERT(n >= 2 && n <= HO_MAX && ho_point[0] == PP_HOOK_HUGE_ADVISED &&
                ho_point[1] == PP_HOOK_POPULATE,
            "pageable fallback chunk: %d points, first %d then %d", n,
            n > 0 ? ho_point[0] : -1, n > 1 ? ho_point[1] : -1);
  CT_OK(pinpool_buffer_attrs(b, &a));
  CT_ASSERT(a.huge_advised == 1 && a.page_locked == 0,
            "pageable fallback chunk: advised %d, locked %d", a.huge_advised,
            a.page_locked);
  CT_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

/* The attributes of the block a new buffer of `size` bytes gets. */
static pinpool_buffer_t *buffer_(pinpool_t *pool, size_t size,
                                 pinpool_mem_attrs_t *a, const char *file,
                                 int line) {
  pinpool_buffer_t *b = NULL;
  ct_rc_(pinpool_buffer_alloc(pool, size, &b), 0, "buffer", file, line);
  ct_rc_(pinpool_buffer_attrs(b, a), 0, "attrs", file, line);
  return b;
}
#define BUFFER(pool, size, a) buffer_((pool), (size), (a), __FILE__, __LINE__)

/* pin_failure=pageable: the driver refuses to pin a chunk, the pool maps
 * it pageable instead. The block says page_locked=0, the stats count it,
 * the driver never sees the range (no cuMemFreeHost / unregister of memory
 * it did not give: bad_calls), the thread's last error is what it was, the
 * next chunk is pinned, pinned memory is carved first, and the pageable
 * chunk is the first to go. For both CUDA backends. */
static void pin_fallback(const char *backend, const char *entry) {
  ct_fake.reset();
  char conf[160];
  (void)snprintf(conf, sizeof conf,
                 "backend=%s,device=0,pin_failure=pageable,tcache_bytes=0",
                 backend);
  pinpool_t *pool = CT_CREATE(conf);
  char cfg[1024];
  CT_OK(pinpool_get_config(pool, cfg, sizeof cfg, NULL));
  CT_ASSERT(strstr(cfg, "pin_failure=pageable") != NULL, "config: %s", cfg);
  /* A marker in the last error, from a call that failed before. */
  CT_RC(pinpool_free(pool, NULL), PINPOOL_EINVAL);
  char before[256];
  (void)snprintf(before, sizeof before, "%s", pinpool_last_error());
  CT_ASSERT(ct_fake.inject(entry, 1, CUDA_ERROR_OUT_OF_MEMORY) == 0, "arm");
  pinpool_mem_attrs_t a;
  pinpool_buffer_t *b1 = BUFFER(pool, 1 * MiB, &a);
  CT_ASSERT(a.page_locked == 0, "a block of the fallback chunk is pageable");
  CT_ASSERT(strcmp(pinpool_last_error(), before) == 0,
            "the refusal left '%s' (was '%s')", pinpool_last_error(), before);
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.fallback_bytes == st.reserved_bytes.current &&
                st.fallback_bytes >= 1 * MiB && st.locked_bytes == 0 &&
                st.fallback_blocks >= 1,
            "fallback %llu bytes, %llu blocks; reserved %llu, locked %llu",
            (unsigned long long)st.fallback_bytes,
            (unsigned long long)st.fallback_blocks,
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)st.locked_bytes);
  uint64_t fb = st.fallback_bytes;
  CT_FAKE_EQ("registered_bytes", 0);
  CT_FAKE_EQ("host_alloc_bytes", 0);
  /* Larger than what the fallback chunk (2 MiB) has left: a new chunk of
   * 4 MiB, pinned (the refusal was one call, and left nothing behind in
   * the driver). */
  pinpool_buffer_t *b2 = BUFFER(pool, 2560 * KiB, &a);
  CT_ASSERT(a.page_locked == 1, "the next chunk is pinned");
  st = ct_stats(pool);
  CT_ASSERT(st.fallback_bytes == fb && st.locked_bytes == 4 * MiB &&
                st.arena_chunks == 2,
            "fallback %llu, locked %llu, %llu chunks",
            (unsigned long long)st.fallback_bytes,
            (unsigned long long)st.locked_bytes,
            (unsigned long long)st.arena_chunks);
  /* 1 MiB free in the fallback chunk, 1.5 MiB in the pinned one: a slab
   * of 1 MiB (four 256 KiB blocks) fits the fallback extent best, and is
   * carved from the pinned one. */
  pinpool_buffer_t *b3 = BUFFER(pool, 256 * KiB, &a);
  CT_ASSERT(a.page_locked == 1, "pinned memory is carved first");
  CT_OK(pinpool_buffer_close(b2));
  CT_OK(pinpool_buffer_release(b2));
  CT_OK(pinpool_validate(pool));
  /* A snapshot marks the fallback chunk and its segment. */
  char *json = NULL;
  size_t len = 0;
  CT_OK(pinpool_snapshot_write_mem(pool, &json, &len, 0));
  CT_ASSERT(strstr(json, "\"pin_fallback\"") != NULL, "snapshot flags");
  pinpool_snapshot_free(json);
  /* Everything idle: the fallback chunk goes back (unmapped by the pool,
   * not given to the driver). */
  CT_OK(pinpool_buffer_close(b1));
  CT_OK(pinpool_buffer_release(b1));
  CT_OK(pinpool_buffer_close(b3));
  CT_OK(pinpool_buffer_release(b3));
  CT_OK(pinpool_empty_cache(pool));
  st = ct_stats(pool);
  CT_ASSERT(st.fallback_bytes == 0 && st.fallback_blocks == 0,
            "after empty_cache: %llu bytes, %llu blocks",
            (unsigned long long)st.fallback_bytes,
            (unsigned long long)st.fallback_blocks);
  pinpool_destroy(pool);
  CT_FAKE_EQ("bad_calls", 0);
  CT_FAKE_BALANCED();
}

static void test_pin_fallback(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  pin_fallback("cuda", "cuMemHostAlloc");
  pin_fallback("cuda-register", "cuMemHostRegister");
}

/* The default, pin_failure=error: the refusal is the allocation's error,
 * nothing is held, nothing is counted as a fallback, and the next call
 * succeeds (the driver API keeps no sticky error: neither does the pool). */
static void test_pin_failure_error(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  static const char *const backends[2][2] = {
      {"cuda", "cuMemHostAlloc"}, {"cuda-register", "cuMemHostRegister"}};
  for (int i = 0; i < 2; i++) {
    ct_fake.reset();
    char conf[128];
    (void)snprintf(conf, sizeof conf, "backend=%s,device=0,tcache_bytes=0",
                   backends[i][0]);
    pinpool_t *pool = CT_CREATE(conf);
    CT_ASSERT(ct_fake.inject(backends[i][1], 1, CUDA_ERROR_INVALID_VALUE) == 0,
              "arm");
    void *p = NULL;
    CT_RC(pinpool_alloc(pool, 1 * MiB, &p), PINPOOL_EBACKEND);
    CT_ERROR_HAS(backends[i][1]);
    pinpool_stats_t st = ct_stats(pool);
    CT_ASSERT(st.reserved_bytes.current == 0 && st.fallback_bytes == 0 &&
                  st.fallback_blocks == 0,
              "after the refusal: %llu reserved, %llu fallback",
              (unsigned long long)st.reserved_bytes.current,
              (unsigned long long)st.fallback_bytes);
    CT_OK(pinpool_alloc(pool, 1 * MiB, &p));
    CT_OK(pinpool_free(pool, p));
    pinpool_destroy(pool);
    CT_FAKE_EQ("bad_calls", 0);
    CT_FAKE_BALANCED();
  }
}

/* The fallback with a real driver too (scripts/gpu-check.sh): pinpool's
 * own injection refuses the first registration before the driver sees
 * it; the chunk is pageable, the next one is registered by the driver. */
static void test_pin_fallback_injected(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  if (ct_fake.reset != NULL)
    ct_fake.reset();
  pinpool_t *pool = CT_CREATE("backend=cuda-register,device=0,"
                              "pin_failure=pageable,fault=register:1,"
                              "tcache_bytes=0");
  pinpool_mem_attrs_t a;
  pinpool_buffer_t *b1 = BUFFER(pool, 1 * MiB, &a);
  CT_ASSERT(a.page_locked == 0, "the refused chunk is pageable");
  pinpool_buffer_t *b2 = BUFFER(pool, 2560 * KiB, &a);
  CT_ASSERT(a.page_locked == 1, "the next chunk is registered");
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.fallback_bytes == 2 * MiB && st.locked_bytes == 4 * MiB,
            "fallback %llu, locked %llu", (unsigned long long)st.fallback_bytes,
            (unsigned long long)st.locked_bytes);
  void *p1 = NULL, *p2 = NULL;
  CT_OK(pinpool_buffer_ptr(b1, &p1));
  CT_OK(pinpool_buffer_ptr(b2, &p2));
  memset(p1, 1, 1 * MiB);
  memset(p2, 2, 2560 * KiB);
  CT_OK(pinpool_buffer_close(b1));
  CT_OK(pinpool_buffer_release(b1));
  CT_OK(pinpool_buffer_close(b2));
  CT_OK(pinpool_buffer_release(b2));
  CT_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  CT_FAKE_EQ("bad_calls", 0);
}

int main(void) {
  ct_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_cuda_alloc_free, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_register_alloc_free, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_register_numa_local, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_destroy_releases_live_blocks,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_reserve, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_cuda_flags, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_out_of_memory, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_pin_fallback, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_pin_failure_error, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_pin_fallback_injected, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_register_interior_pointers, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_register_huge_order, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_register_pieces, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_backend_errors, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_misaligned_driver_memory, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_threads_without_context, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_caller_context_preserved, ct_setup,
                                      ct_teardown),
  };
  return cmocka_run_group_tests_name("cuda_backend", tests, NULL, NULL);
}
