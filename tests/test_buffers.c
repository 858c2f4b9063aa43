/*
 * Buffers (pinpool.h, "Buffers"): references, close, exports, attributes,
 * and the races between them, hammered with threads:
 *
 * - the last reference and the last export dropped at the same moment by
 *   two threads: the block goes back exactly once, the handle is freed
 *   exactly once (ASan), never both skipped (stats);
 * - close racing exports: an export either succeeds before the close (and
 *   keeps the memory valid) or fails with EBUSY, never in between;
 * - first attribute queries racing: every thread sees the same, complete
 *   result;
 * - a buffer released (and an export released) on another thread than the
 *   one that allocated it; a buffer and an export outliving
 *   pinpool_destroy; exports outliving the last reference;
 * - bad arguments: the documented error, nothing changes.
 */
#include "testutil.h"

#include "base.h" /* the test hook and its points (huge_then_populate) */

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static unsigned rounds(unsigned normal) {
  const char *e = getenv("PINPOOL_RACE_ROUNDS");
  unsigned r = e != NULL ? (unsigned)atoi(e) : 0;
  if (r == 0)
    return normal;
  return r < normal ? r : normal;
}

static pinpool_buffer_t *balloc(pinpool_t *pool, size_t n) {
  pinpool_buffer_t *b = NULL;
  PP_OK(pinpool_buffer_alloc(pool, n, &b));
  PP_ASSERT(b != NULL, "no buffer");
  return b;
}

static size_t nexports(pinpool_buffer_t *b) {
  size_t n = 99;
  PP_OK(pinpool_buffer_exports(b, &n));
  return n;
}

static uint64_t live_blocks(pinpool_t *pool) {
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  return st.blocks.current;
}

/* ---- Basics ------------------------------------------------------------- */

static void test_basic(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("", &pool));
  pinpool_buffer_t *b = balloc(pool, 1000);
  void *p = NULL;
  size_t size = 0, req = 0;
  pinpool_t *owner = NULL;
  int closed = -1;
  PP_OK(pinpool_buffer_ptr(b, &p));
  PP_OK(pinpool_buffer_size(b, &size));
  PP_OK(pinpool_buffer_requested_size(b, &req));
  PP_OK(pinpool_buffer_pool(b, &owner));
  PP_OK(pinpool_buffer_closed(b, &closed));
  size_t bs = 0;
  PP_OK(pinpool_block_size(pool, p, &bs));
  PP_ASSERT(size == bs && size == 1024, "size %zu, block size %zu", size, bs);
  PP_ASSERT(req == 1000 && owner == pool && closed == 0,
            "requested %zu, pool %p, closed %d", req, (void *)owner, closed);
  PP_ASSERT(nexports(b) == 0, "fresh buffer has exports");
  memset(p, 0x5a, size);

  /* Two exports: each its own descriptor, immutable, describing the bytes
   * asked for. */
  const pinpool_export_t *e1 = NULL, *e2 = NULL;
  PP_OK(pinpool_buffer_export(b, 0, &e1));
  PP_OK(pinpool_buffer_export(b, PINPOOL_EXPORT_READONLY, &e2));
  PP_ASSERT(e1 != e2, "exports share a descriptor");
  PP_ASSERT(e1->ptr == p && e1->size == 1000 && e1->ndim == 1 &&
                e1->shape[0] == 1000 && e1->strides[0] == 1 &&
                e1->readonly == 0 && e1->buffer == b,
            "export descriptor: ptr %p size %zu ndim %d shape %lld", e1->ptr,
            e1->size, e1->ndim, (long long)e1->shape[0]);
  PP_ASSERT(e2->readonly == 1 && e1->readonly == 0,
            "readonly flags %d %d: one export's flag leaked into another",
            e1->readonly, e2->readonly);
  PP_ASSERT(nexports(b) == 2, "exports %zu", nexports(b));
  ((unsigned char *)e1->ptr)[10] = 0xa5; /* a write through the export */
  PP_ASSERT(((unsigned char *)p)[10] == 0xa5, "write not visible");
  PP_OK(pinpool_export_release(e2));
  PP_OK(pinpool_export_release(e1));
  PP_ASSERT(nexports(b) == 0, "exports %zu", nexports(b));

  PP_OK(pinpool_buffer_retain(b));
  PP_OK(pinpool_buffer_release(b));
  PP_ASSERT(live_blocks(pool) == 1, "block freed while a reference remains");
  PP_OK(pinpool_buffer_release(b));
  PP_ASSERT(live_blocks(pool) == 0, "block not given back");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_bad_arguments(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("", &pool));
  pinpool_buffer_t *b = (pinpool_buffer_t *)&pool; /* sentinel: untouched */
  PP_CHECK_RC(pinpool_buffer_alloc(NULL, 10, &b), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_alloc(pool, 10, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_alloc(pool, 0, &b), PINPOOL_EZEROSIZE);
  PP_CHECK_RC(pinpool_buffer_alloc(pool, SIZE_MAX, &b), PINPOOL_EOVERFLOW);
  PP_ASSERT(b == (pinpool_buffer_t *)&pool, "*out written on error");
  PP_ASSERT(strstr(pinpool_last_error(), "2^60") != NULL, "message: %s",
            pinpool_last_error());

  PP_CHECK_RC(pinpool_buffer_retain(NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_release(NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_close(NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_record_stream(NULL, 1), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_export_release(NULL), PINPOOL_EINVAL);

  b = balloc(pool, 100);
  void *vp;
  size_t n;
  int i;
  pinpool_t *pp;
  pinpool_mem_attrs_t at;
  const pinpool_export_t *e = NULL;
  PP_CHECK_RC(pinpool_buffer_ptr(NULL, &vp), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_ptr(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_size(NULL, &n), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_size(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_requested_size(NULL, &n), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_requested_size(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_pool(NULL, &pp), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_pool(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_exports(NULL, &n), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_exports(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_closed(NULL, &i), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_closed(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_attrs(NULL, &at), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_attrs(b, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_export(NULL, 0, &e), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_export(b, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_export(b, 0x10, &e), PINPOOL_EINVAL);
  PP_ASSERT(e == NULL && nexports(b) == 0, "failed export changed state");
  /* events=none: no stream can be recorded. */
  PP_CHECK_RC(pinpool_buffer_record_stream(b, 1), PINPOOL_EBUSY);
  PP_ASSERT(nexports(b) == 0, "failed record_stream left a hold");

  /* After close: exports and record_stream refused, close idempotent. */
  PP_OK(pinpool_buffer_export(b, 0, &e));
  PP_OK(pinpool_buffer_close(b));
  PP_OK(pinpool_buffer_close(b));
  const pinpool_export_t *e2 = NULL;
  PP_CHECK_RC(pinpool_buffer_export(b, 0, &e2), PINPOOL_EBUSY);
  PP_CHECK_RC(pinpool_buffer_record_stream(b, 1), PINPOOL_EBUSY);
  PP_ASSERT(e2 == NULL && nexports(b) == 1, "refused export changed state");
  /* The last reference, then releasing again: EINVAL, the export (which
   * keeps the handle alive) still works. */
  PP_OK(pinpool_buffer_release(b));
  PP_CHECK_RC(pinpool_buffer_release(b), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_buffer_retain(b), PINPOOL_EINVAL);
  PP_ASSERT(live_blocks(pool) == 1, "block freed under an export");
  memset(e->ptr, 1, e->size);
  PP_OK(pinpool_export_release(e));
  PP_ASSERT(live_blocks(pool) == 0, "block not given back");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- Lifetimes ---------------------------------------------------------- */

static void test_close_deferred_by_export(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("", &pool));
  pinpool_buffer_t *b = balloc(pool, 64 * KiB);
  const pinpool_export_t *e;
  PP_OK(pinpool_buffer_export(b, 0, &e));
  PP_OK(pinpool_buffer_close(b));
  int closed = 0;
  PP_OK(pinpool_buffer_closed(b, &closed));
  PP_ASSERT(closed == 1, "not closed");
  /* The export keeps the block: allocated, writable, not handed out. */
  PP_ASSERT(live_blocks(pool) == 1, "close freed a block under an export");
  memset(e->ptr, 0x77, e->size);
  void *other;
  PP_OK(pinpool_alloc(pool, 64 * KiB, &other));
  PP_ASSERT(other != e->ptr, "exported block handed out again");
  PP_OK(pinpool_free(pool, other));
  PP_OK(pinpool_export_release(e));
  PP_ASSERT(live_blocks(pool) == 0, "block kept after the last export");
  /* Closed, references remain: accessors work, no export. */
  size_t n;
  PP_OK(pinpool_buffer_requested_size(b, &n));
  pinpool_mem_attrs_t at;
  int rc = pinpool_buffer_attrs(b, &at);
  PP_ASSERT(rc == PINPOOL_EBUSY, "attrs of a closed, never queried buffer: %d",
            rc);
  PP_OK(pinpool_buffer_release(b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_export_outlives_last_ref(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("", &pool));
  pinpool_buffer_t *b = balloc(pool, 5000);
  const pinpool_export_t *e[3];
  for (int i = 0; i < 3; i++)
    PP_OK(pinpool_buffer_export(b, 0, &e[i]));
  PP_OK(pinpool_buffer_release(b)); /* last reference: closes */
  for (int i = 0; i < 3; i++) {
    PP_ASSERT(live_blocks(pool) == 1, "block freed with %d exports left",
              3 - i);
    memset(e[i]->ptr, i, e[i]->size);
    PP_OK(pinpool_export_release(e[i]));
  }
  PP_ASSERT(live_blocks(pool) == 0, "block not given back");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_outlives_destroy(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_backend_t tab = cb_table(&cb, 0);
  pinpool_t *pool;
  PP_OK(pinpool_create_with_backend("", &tab, &pool));
  pinpool_buffer_t *b1 = balloc(pool, 100 * KiB);
  pinpool_buffer_t *b2 = balloc(pool, 3 * MiB);
  const pinpool_export_t *e;
  PP_OK(pinpool_buffer_export(b2, 0, &e));
  pinpool_destroy(pool); /* the owner's reference */
  /* Not torn down: the buffers hold the pool. */
  PP_ASSERT(cb_counts(&cb).nfree == 0, "segments released under buffers");
  void *p1;
  PP_OK(pinpool_buffer_ptr(b1, &p1));
  memset(p1, 1, 100 * KiB);
  pinpool_mem_attrs_t at;
  PP_OK(pinpool_buffer_attrs(b1, &at));
  PP_ASSERT(strcmp(at.backend, tab.name) == 0, "backend name %s", at.backend);
  PP_OK(pinpool_buffer_release(b1));
  PP_ASSERT(cb_counts(&cb).live_count > 0, "torn down under an export");
  PP_OK(pinpool_buffer_release(b2)); /* closes; the export keeps it */
  memset(e->ptr, 2, e->size);
  PP_ASSERT(cb_counts(&cb).live_count > 0, "torn down under an export");
  PP_OK(pinpool_export_release(e)); /* the last hold: teardown here */
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

/* ---- Cross-thread release ----------------------------------------------- */

typedef struct handoff {
  pinpool_buffer_t *buf;
  const pinpool_export_t *exp;
  int rc_release, rc_export;
} handoff_t;

static void *release_elsewhere(void *arg) {
  handoff_t *h = arg;
  memset(h->exp->ptr, 0x33, h->exp->size);
  h->rc_release = pinpool_buffer_release(h->buf);
  h->rc_export = pinpool_export_release(h->exp);
  return NULL;
}

static void test_release_on_other_thread(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated", &pool));
  for (int i = 0; i < 50; i++) {
    handoff_t h = {balloc(pool, (size_t)(i + 1) * 3000), NULL, -1, -1};
    PP_OK(pinpool_buffer_export(h.buf, 0, &h.exp));
    if (i % 2)
      PP_OK(pinpool_buffer_record_stream(h.buf, (pinpool_stream_t)(i % 3)));
    pthread_t t;
    PP_ASSERT(pthread_create(&t, NULL, release_elsewhere, &h) == 0, "thread");
    pthread_join(t, NULL);
    PP_OK(h.rc_release);
    PP_OK(h.rc_export);
  }
  PP_OK(pinpool_synchronize(pool));
  PP_ASSERT(live_blocks(pool) == 0, "blocks left");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- Stream-ordered give-back -------------------------------------------- */

static void test_stream_ordered(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=0", &pool));
  pinpool_buffer_t *b = balloc(pool, 8 * KiB);
  PP_OK(pinpool_sim_submit(pool, 5, 50 * 1000 * 1000, NULL, NULL)); /* 50 ms */
  PP_OK(pinpool_buffer_record_stream(b, 5));
  PP_OK(pinpool_buffer_release(b));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 1,
            "pending %llu: the give-back did not wait "
            "for the stream",
            (unsigned long long)st.pending_blocks);
  PP_OK(pinpool_synchronize(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 0 && st.blocks.current == 0, "not reclaimed");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- Attributes -----------------------------------------------------------
 */

static int thp_possible(void) {
  FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
  if (f == NULL)
    return 0;
  char line[128] = "";
  if (fgets(line, sizeof line, f) == NULL)
    line[0] = '\0';
  fclose(f);
  return strstr(line, "[never]") == NULL;
}

static void test_attrs_host(void **state) {
  (void)state;
  pinpool_t *pool;
  /* backend=host: backend=auto would take the fake driver (the test's
   * PINPOOL_LIBCUDA) and make a cuda-register pool. */
  PP_OK(pinpool_create("backend=host,mlock=1,hugepages=1", &pool));
  pinpool_buffer_t *b = balloc(pool, 4 * MiB);
  pinpool_mem_attrs_t a, again;
  PP_OK(pinpool_buffer_attrs(b, &a));
  PP_OK(pinpool_buffer_attrs(b, &again));
  PP_ASSERT(memcmp(&a, &again, sizeof a) == 0, "attributes changed");
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(a.host_accessible == 1 && a.device_accessible == 0 &&
                a.device_id == -1 && strcmp(a.backend, "host") == 0,
            "host %d device %d id %d backend %s", a.host_accessible,
            a.device_accessible, a.device_id, a.backend);
  PP_ASSERT(a.page_locked == (st.locked_bytes > 0),
            "page_locked %d but locked_bytes %llu", a.page_locked,
            (unsigned long long)st.locked_bytes);
  PP_ASSERT(a.huge_advised == 1, "hugepages=1 not reported");
  PP_ASSERT(a.huge_pages >= -1 && a.huge_pages <= 1, "huge %d", a.huge_pages);
  if (!thp_possible())
    PP_ASSERT(a.huge_pages != 1, "huge pages reported with THP off");
  PP_ASSERT(a.numa_node >= -1, "numa %d", a.numa_node);
  print_message("host buffer: locked %d, huge pages %d, numa node %d\n",
                a.page_locked, a.huge_pages, a.numa_node);
  PP_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);

  /* Placed pool: the node is known at allocation. */
  PP_OK(pinpool_create("numa_node=0", &pool));
  b = balloc(pool, 10000);
  PP_OK(pinpool_buffer_attrs(b, &a));
  PP_ASSERT(a.numa_node == 0, "numa_node=0 pool reports node %d", a.numa_node);
  PP_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);
}

/* hugepages=1: MADV_HUGEPAGE must reach a segment before any of its pages
 * is touched (pages faulted in before it are small ones, and stay so), and
 * a large segment is populated by several threads. The huge_advised flag
 * alone would not notice the advice coming after the population, so the
 * test hook records the order: the advice (PP_HOOK_HUGE_ADVISED), the
 * start of the population (PP_HOOK_POPULATE) and each thread's share of it
 * (PP_HOOK_POPULATE_JOB), each with the thread it ran on. */
enum { HP_MAX = 256 };
static atomic_int hp_n;
static int hp_point[HP_MAX];
static long hp_tid[HP_MAX];

/* Any thread (the populate workers included); the slots are read after
 * the allocation returned, which joined the workers. */
static void hp_record(int point) {
  if (point != PP_HOOK_HUGE_ADVISED && point != PP_HOOK_POPULATE &&
      point != PP_HOOK_POPULATE_JOB)
    return;
  int i = atomic_fetch_add(&hp_n, 1);
  if (i < HP_MAX) {
    hp_point[i] = point;
    hp_tid[i] = (long)syscall(SYS_gettid);
  }
}

/* The points recorded since the last call (one new segment) say: advised
 * once, then populated, the population split over at least min_threads
 * threads (the caller among them when min_threads > 1). */
static void hp_check(const char *what, unsigned min_threads) {
  int n = atomic_exchange(&hp_n, 0);
  PP_ASSERT(n <= HP_MAX, "%s: %d points", what, n);
  int advised = -1, first_pop = -1, nadvised = 0, njobs = 0;
  long tids[HP_MAX];
  unsigned ntids = 0;
  for (int i = 0; i < n; i++) {
    if (hp_point[i] == PP_HOOK_HUGE_ADVISED) {
      nadvised++;
      if (advised < 0)
        advised = i;
      continue;
    }
    if (first_pop < 0)
      first_pop = i;
    if (hp_point[i] != PP_HOOK_POPULATE_JOB)
      continue;
    njobs++;
    unsigned k = 0;
    while (k < ntids && tids[k] != hp_tid[i])
      k++;
    if (k == ntids)
      tids[ntids++] = hp_tid[i];
  }
  PP_ASSERT(nadvised == 1, "%s: %d MADV_HUGEPAGE for one segment", what,
            nadvised);
  PP_ASSERT(first_pop >= 0, "%s: the segment was not populated", what);
  PP_ASSERT(advised < first_pop,
            "%s: populating started (point %d) before MADV_HUGEPAGE (point "
            "%d): its pages are small ones",
            what, first_pop, advised);
  PP_ASSERT(ntids >= min_threads,
            "%s: populated by %u thread(s) in %d job(s), expected at least %u",
            what, ntids, njobs, min_threads);
}

static void test_huge_then_populate(void **state) {
  (void)state;
  /* 8 MiB segments, populate_parallel_min below them: 4 threads, 2 MiB
   * (one huge page) each. mlock=1 populates by locking (and, refused by
   * RLIMIT_MEMLOCK, populates again unlocked); shared=1 maps a memfd. */
  static const char *const confs[] = {
      "hugepages=1,populate_threads=4,populate_parallel_min=4MiB,"
      "tcache_bytes=0",
      "hugepages=1,populate_threads=4,populate_parallel_min=4MiB,"
      "tcache_bytes=0,mlock=1",
      "hugepages=1,populate_threads=4,populate_parallel_min=4MiB,"
      "tcache_bytes=0,shared=1",
  };
  atomic_store(&pp_test_hook, hp_record);
  for (size_t c = 0; c < sizeof confs / sizeof confs[0]; c++) {
    pinpool_t *pool;
    PP_OK(pinpool_create(confs[c], &pool));
    (void)atomic_exchange(&hp_n, 0);
    /* The first chunk (mapped with room to align it), then a second one
     * beside it (mapped at the arena's hint, advised there). */
    pinpool_buffer_t *b[2];
    for (int i = 0; i < 2; i++) {
      b[i] = balloc(pool, 8 * MiB);
      char what[160];
      (void)snprintf(what, sizeof what, "%s, chunk %d", confs[c], i);
      hp_check(what, 2);
      pinpool_mem_attrs_t a;
      PP_OK(pinpool_buffer_attrs(b[i], &a));
      PP_ASSERT(a.huge_advised == 1, "%s: not advised", what);
    }
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.arena_chunks == 2, "%s: %llu chunks", confs[c],
              (unsigned long long)st.arena_chunks);
    /* Below populate_parallel_min: one thread, still after the advice. */
    pinpool_buffer_t *small = balloc(pool, 2 * MiB);
    hp_check(confs[c], 1);
    PP_OK(pinpool_buffer_release(small));
    for (int i = 0; i < 2; i++)
      PP_OK(pinpool_buffer_release(b[i]));
    pinpool_destroy(pool);
  }
  atomic_store(&pp_test_hook, NULL);
}

/* A failed (here: not yet answerable) query is retried by the next one:
 * the node of a page that nobody touched yet is unknown, and known after
 * the page is written. */
static void test_attrs_retry(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("populate=0", &pool));
  pinpool_buffer_t *b = balloc(pool, 8 * MiB); /* a segment of its own */
  void *p;
  PP_OK(pinpool_buffer_ptr(b, &p));
  pinpool_mem_attrs_t a;
  PP_OK(pinpool_buffer_attrs(b, &a));
  unsigned char vec = 0;
  PP_OK(mincore(p, 4096, &vec));
  PP_ASSERT(a.numa_node == -1 || (vec & 1),
            "node %d reported for a page not yet there", a.numa_node);
  ((volatile char *)p)[0] = 1;
  PP_OK(pinpool_buffer_attrs(b, &a));
  int node = -1;
  long sr = syscall(SYS_get_mempolicy, &node, NULL, 0UL, p, 3 /* NODE|ADDR */);
  if (sr == 0)
    PP_ASSERT(a.numa_node == node, "node %d after the touch, kernel says %d",
              a.numa_node, node);
  else
    print_message("get_mempolicy unavailable: node stays unknown\n");
  PP_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);

  /* A user backend: device accessibility unknown, the name reported. */
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_backend_t tab = cb_table(&cb, 1);
  PP_OK(pinpool_create_with_backend("", &tab, &pool));
  b = balloc(pool, 100);
  PP_OK(pinpool_buffer_attrs(b, &a));
  PP_ASSERT(a.device_accessible == -1 && a.page_locked == 1 &&
                strcmp(a.backend, tab.name) == 0,
            "user backend: device %d locked %d name %s", a.device_accessible,
            a.page_locked, a.backend);
  PP_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);
  cb_fini(&cb);
}

/* backend=cuda through the fake driver (PINPOOL_LIBCUDA, set by ctest). */
static void test_attrs_cuda(void **state) {
  (void)state;
  if (getenv("PINPOOL_LIBCUDA") == NULL) {
    print_message("PINPOOL_LIBCUDA not set: skipped\n");
    return;
  }
  pinpool_t *pool;
  int rc = pinpool_create("backend=cuda,device=0", &pool);
  if (rc != 0) {
    print_message("no CUDA pool (%s): skipped\n", pinpool_last_error());
    return;
  }
  pinpool_buffer_t *b = balloc(pool, 3000);
  pinpool_mem_attrs_t a;
  PP_OK(pinpool_buffer_attrs(b, &a));
  PP_ASSERT(a.device_accessible == 1 && a.device_id == 0 &&
                a.page_locked == 1 && strcmp(a.backend, "cuda") == 0,
            "cuda: device %d id %d locked %d backend %s", a.device_accessible,
            a.device_id, a.page_locked, a.backend);
  PP_OK(pinpool_buffer_release(b));
  pinpool_destroy(pool);
}

/* ---- Races ------------------------------------------------------------------
 * Persistent threads meet at a barrier each round; the main thread sets up
 * the round's buffer before and checks the outcome after. */

#define NT 4
typedef struct race {
  pthread_barrier_t start, done;
  pinpool_t *pool;
  pinpool_buffer_t *buf;
  const pinpool_export_t *exp[NT];
  int kind;
  _Atomic(int) stop;
  _Atomic(int) ok_exports, busy_exports;
  pinpool_mem_attrs_t seen[NT];
  int rc[NT];
} race_t;

enum { R_LAST_REF_VS_EXPORT, R_CLOSE_VS_EXPORT, R_ATTRS };

typedef struct racer {
  race_t *r;
  int id;
} racer_t;

static void *racer_main(void *arg) {
  racer_t *me = arg;
  race_t *r = me->r;
  for (;;) {
    pthread_barrier_wait(&r->start);
    if (atomic_load(&r->stop))
      return NULL;
    pinpool_buffer_t *b = r->buf;
    switch (r->kind) {
    case R_LAST_REF_VS_EXPORT:
      /* Thread 0 drops the last reference, thread 1 the last export. */
      if (me->id == 0)
        r->rc[0] = pinpool_buffer_release(b);
      else if (me->id == 1)
        r->rc[1] = pinpool_export_release(r->exp[0]);
      break;
    case R_CLOSE_VS_EXPORT:
      if (me->id == 0) {
        r->rc[0] = pinpool_buffer_close(b);
      } else {
        const pinpool_export_t *e = NULL;
        int rc = pinpool_buffer_export(b, 0, &e);
        r->rc[me->id] = rc;
        if (rc == 0) {
          /* The memory is ours until we release, close or not (each
           * consumer writes its own byte). */
          ((volatile unsigned char *)e->ptr)[me->id] = (unsigned char)me->id;
          atomic_fetch_add(&r->ok_exports, 1);
          r->exp[me->id] = e;
        } else if (rc == PINPOOL_EBUSY) {
          atomic_fetch_add(&r->busy_exports, 1);
        }
      }
      break;
    case R_ATTRS:
      r->rc[me->id] = pinpool_buffer_attrs(b, &r->seen[me->id]);
      break;
    default:
      break;
    }
    pthread_barrier_wait(&r->done);
  }
}

static void race_run(void (*round)(race_t *, unsigned), const char *config,
                     int kind, unsigned n) {
  race_t r;
  memset(&r, 0, sizeof r);
  pthread_barrier_init(&r.start, NULL, NT + 1);
  pthread_barrier_init(&r.done, NULL, NT + 1);
  PP_OK(pinpool_create(config, &r.pool));
  r.kind = kind;
  pthread_t t[NT];
  racer_t who[NT];
  for (int i = 0; i < NT; i++) {
    who[i] = (racer_t){&r, i};
    PP_ASSERT(pthread_create(&t[i], NULL, racer_main, &who[i]) == 0, "thread");
  }
  for (unsigned i = 0; i < n; i++)
    round(&r, i);
  atomic_store(&r.stop, 1);
  pthread_barrier_wait(&r.start);
  for (int i = 0; i < NT; i++)
    pthread_join(t[i], NULL);
  PP_CHECK_CONSISTENT(r.pool);
  pinpool_destroy(r.pool);
  pthread_barrier_destroy(&r.start);
  pthread_barrier_destroy(&r.done);
}

static void round_last_ref_vs_export(race_t *r, unsigned i) {
  pinpool_stats_t before, after;
  PP_STATS(r->pool, &before);
  r->buf = balloc(r->pool, 512 + (i % 64) * 512);
  PP_OK(pinpool_buffer_export(r->buf, 0, &r->exp[0]));
  pthread_barrier_wait(&r->start);
  pthread_barrier_wait(&r->done);
  PP_OK(r->rc[0]);
  PP_OK(r->rc[1]);
  PP_STATS(r->pool, &after);
  /* Exactly one give-back: not zero (leak), not two (a double free would
   * fail in pinpool_free, or free a block someone else owns). */
  PP_ASSERT(after.requests.freed == before.requests.freed + 1 &&
                after.blocks.current == 0,
            "round %u: %llu frees for one buffer, %llu blocks live", i,
            (unsigned long long)(after.requests.freed - before.requests.freed),
            (unsigned long long)after.blocks.current);
}

static void test_race_last_ref_vs_last_export(void **state) {
  (void)state;
  race_run(round_last_ref_vs_export, "", R_LAST_REF_VS_EXPORT, rounds(3000));
}

static void round_close_vs_export(race_t *r, unsigned i) {
  (void)i;
  r->buf = balloc(r->pool, 4096);
  atomic_store(&r->ok_exports, 0);
  atomic_store(&r->busy_exports, 0);
  memset(r->exp, 0, sizeof r->exp);
  pthread_barrier_wait(&r->start);
  pthread_barrier_wait(&r->done);
  PP_OK(r->rc[0]);
  int ok = atomic_load(&r->ok_exports), busy = atomic_load(&r->busy_exports);
  PP_ASSERT(ok + busy == NT - 1, "round %u: %d exports, %d refused", i, ok,
            busy);
  PP_ASSERT(nexports(r->buf) == (size_t)ok, "round %u: %zu exports counted", i,
            nexports(r->buf));
  /* Every export that got in keeps the block until it is released. */
  PP_ASSERT(live_blocks(r->pool) == (ok > 0 ? 1u : 0u),
            "round %u: %llu blocks live with %d exports", i,
            (unsigned long long)live_blocks(r->pool), ok);
  for (int k = 1; k < NT; k++)
    if (r->exp[k] != NULL)
      PP_OK(pinpool_export_release(r->exp[k]));
  PP_ASSERT(live_blocks(r->pool) == 0, "round %u: block kept", i);
  PP_OK(pinpool_buffer_release(r->buf));
}

static void test_race_close_vs_export(void **state) {
  (void)state;
  race_run(round_close_vs_export, "", R_CLOSE_VS_EXPORT, rounds(3000));
}

static void round_attrs(race_t *r, unsigned i) {
  r->buf = balloc(r->pool, 1000 + i);
  void *p;
  PP_OK(pinpool_buffer_ptr(r->buf, &p));
  memset(p, 0, 1000);
  pthread_barrier_wait(&r->start);
  pthread_barrier_wait(&r->done);
  for (int k = 0; k < NT; k++) {
    PP_OK(r->rc[k]);
    PP_ASSERT(r->seen[k].host_accessible == 1 && r->seen[k].backend != NULL &&
                  r->seen[k].huge_pages >= -1,
              "round %u: thread %d saw a partial result", i, k);
    PP_ASSERT(memcmp(&r->seen[k], &r->seen[0], sizeof r->seen[0]) == 0,
              "round %u: threads 0 and %d saw different attributes", i, k);
  }
  PP_OK(pinpool_buffer_release(r->buf));
}

static void test_race_first_attr_query(void **state) {
  (void)state;
  race_run(round_attrs, "", R_ATTRS, rounds(300));
}

/* Everything at once on a few shared buffers, for a bounded time: retain,
 * release, export, export release, close, attributes, replace. */
#define SLOTS 6
typedef struct mixed {
  pthread_mutex_t lock;
  pinpool_buffer_t *slot[SLOTS];
  pinpool_t *pool;
  double end;
  _Atomic(int) errors;
} mixed_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mixed_err(mixed_t *m, const char *what, int rc) {
  if (atomic_fetch_add(&m->errors, 1) < 5)
    print_error("%s: %s (%s)\n", what, pp_code_name(rc), pinpool_last_error());
}

typedef struct mixer {
  mixed_t *m;
  unsigned id;
} mixer_t;

static void *mixed_main(void *arg) {
  mixed_t *m = ((mixer_t *)arg)->m;
  unsigned id = ((mixer_t *)arg)->id;
  uint64_t s = pp_seed((uint64_t)(uintptr_t)&s);
  const pinpool_export_t *held[8] = {0};
  for (unsigned it = 0;; it++) {
    if ((it & 63) == 0 && now_s() > m->end)
      break;
    unsigned k = (unsigned)(pp_rand(&s) % SLOTS);
    /* Take a reference to a slot's buffer under the lock. */
    pthread_mutex_lock(&m->lock);
    pinpool_buffer_t *b = m->slot[k];
    int rc = pinpool_buffer_retain(b);
    pthread_mutex_unlock(&m->lock);
    if (rc != 0) {
      mixed_err(m, "retain", rc);
      continue;
    }
    unsigned op = (unsigned)(pp_rand(&s) % 10);
    unsigned h = (unsigned)(pp_rand(&s) % 8);
    if (op < 4) {
      if (held[h] != NULL) {
        if ((rc = pinpool_export_release(held[h])) != 0)
          mixed_err(m, "export_release", rc);
        held[h] = NULL;
      }
      rc = pinpool_buffer_export(b, 0, &held[h]);
      if (rc == 0) /* each thread writes its own byte */
        ((volatile unsigned char *)held[h]->ptr)[id] = (unsigned char)h;
      else if (rc != PINPOOL_EBUSY)
        mixed_err(m, "export", rc);
    } else if (op < 6) {
      pinpool_mem_attrs_t a;
      rc = pinpool_buffer_attrs(b, &a);
      if (rc != 0 && rc != PINPOOL_EBUSY)
        mixed_err(m, "attrs", rc);
    } else if (op == 6) {
      if ((rc = pinpool_buffer_close(b)) != 0)
        mixed_err(m, "close", rc);
    } else if (op == 7) {
      /* Replace the slot: the slot's reference goes (maybe the last). */
      pinpool_buffer_t *nb = NULL;
      rc = pinpool_buffer_alloc(m->pool, 64 + pp_rand(&s) % 20000, &nb);
      if (rc != 0) {
        mixed_err(m, "alloc", rc);
      } else {
        pthread_mutex_lock(&m->lock);
        pinpool_buffer_t *old = m->slot[k];
        m->slot[k] = nb;
        pthread_mutex_unlock(&m->lock);
        if ((rc = pinpool_buffer_release(old)) != 0)
          mixed_err(m, "release slot", rc);
      }
    } else {
      size_t n = 0;
      if ((rc = pinpool_buffer_exports(b, &n)) != 0)
        mixed_err(m, "exports", rc);
    }
    if ((rc = pinpool_buffer_release(b)) != 0)
      mixed_err(m, "release", rc);
  }
  for (int h = 0; h < 8; h++)
    if (held[h] != NULL)
      (void)pinpool_export_release(held[h]);
  return NULL;
}

static void test_mixed_hammer(void **state) {
  (void)state;
  mixed_t m;
  memset(&m, 0, sizeof m);
  pthread_mutex_init(&m.lock, NULL);
  PP_OK(pinpool_create("tcache_bytes=256KiB", &m.pool));
  for (int k = 0; k < SLOTS; k++)
    m.slot[k] = balloc(m.pool, 1000);
  m.end = now_s() + 1.5;
  pthread_t t[NT];
  mixer_t who[NT];
  for (unsigned i = 0; i < NT; i++) {
    who[i] = (mixer_t){&m, i};
    PP_ASSERT(pthread_create(&t[i], NULL, mixed_main, &who[i]) == 0, "thread");
  }
  for (int i = 0; i < NT; i++)
    pthread_join(t[i], NULL);
  for (int k = 0; k < SLOTS; k++)
    PP_OK(pinpool_buffer_release(m.slot[k]));
  PP_ASSERT(atomic_load(&m.errors) == 0, "%d errors", atomic_load(&m.errors));
  PP_ASSERT(live_blocks(m.pool) == 0, "%llu blocks leaked",
            (unsigned long long)live_blocks(m.pool));
  PP_CHECK_CONSISTENT(m.pool);
  pinpool_destroy(m.pool);
  pthread_mutex_destroy(&m.lock);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_basic),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_close_deferred_by_export),
      cmocka_unit_test(test_export_outlives_last_ref),
      cmocka_unit_test(test_outlives_destroy),
      cmocka_unit_test(test_release_on_other_thread),
      cmocka_unit_test(test_stream_ordered),
      cmocka_unit_test(test_attrs_host),
      cmocka_unit_test(test_huge_then_populate),
      cmocka_unit_test(test_attrs_retry),
      cmocka_unit_test(test_attrs_cuda),
      cmocka_unit_test(test_race_last_ref_vs_last_export),
      cmocka_unit_test(test_race_close_vs_export),
      cmocka_unit_test(test_race_first_attr_query),
      cmocka_unit_test(test_mixed_hammer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
