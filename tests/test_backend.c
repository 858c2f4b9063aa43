/* The backend interface, observed through a counting user backend: call
 * balance, chunks (the backend's ranges) and the slabs and page-rounded
 * large blocks carved from them, caching, empty_cache, thread-cache flushing at
 * exit, a backend that runs out of memory, no pool lock held during backend
 * calls, metadata kept outside user memory, and the built-in backends/options.
 */
#define _GNU_SOURCE
#include "testutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define SENTINEL_PTR ((void *)(uintptr_t)0xdeadbee0)

static pinpool_t *create_cb_(const char *conf, counting_backend_t *cb,
                             int page_locked, const char *file, int line) {
  pinpool_backend_t t = cb_table(cb, page_locked);
  pinpool_t *pool = NULL;
  pp_check_rc_(pinpool_create_with_backend(conf, &t, &pool), 0,
               "pinpool_create_with_backend", file, line);
  return pool;
}
#define create_cb(conf, cb) create_cb_((conf), (cb), 0, __FILE__, __LINE__)

/* The stats' view of the backend equals the backend's own counts. */
static void check_backend_stats_(pinpool_t *pool, counting_backend_t *cb,
                                 const char *file, int line) {
  pinpool_stats_t st;
  pp_get_stats_(pool, &st, file, line);
  cb_counts_t c = cb_counts(cb);
  int bad = 0;
  if (st.backend_alloc.count != c.calls) {
    print_error("ERROR: stats.backend_alloc.count %" PRIu64
                " != backend alloc calls %" PRIu64 "\n",
                st.backend_alloc.count, c.calls);
    bad = 1;
  }
  if (st.backend_free.count != c.nfree) {
    print_error("ERROR: stats.backend_free.count %" PRIu64
                " != backend free calls %" PRIu64 "\n",
                st.backend_free.count, c.nfree);
    bad = 1;
  }
  if (st.reserved_bytes.current != c.live_bytes) {
    print_error("ERROR: reserved_bytes.current %" PRIu64
                " != bytes held from the backend %" PRIu64 "\n",
                st.reserved_bytes.current, c.live_bytes);
    bad = 1;
  }
  if (st.reserved_bytes.allocated != c.bytes_alloc ||
      st.reserved_bytes.freed != c.bytes_freed) {
    print_error("ERROR: reserved_bytes allocated/freed %" PRIu64 "/%" PRIu64
                " != backend %" PRIu64 "/%" PRIu64 "\n",
                st.reserved_bytes.allocated, st.reserved_bytes.freed,
                c.bytes_alloc, c.bytes_freed);
    bad = 1;
  }
  /* The backend's ranges are the arena's chunks (segments are carved from
   * them and are no backend allocations). */
  if (st.arena_chunks != c.live_count) {
    print_error("ERROR: arena_chunks %" PRIu64
                " != ranges held from the backend %" PRIu64 "\n",
                st.arena_chunks, c.live_count);
    bad = 1;
  }
  /* The free space inside the chunks is part of what they hold, in
   * free_extents ranges of which the largest is largest_free_extent. */
  if (st.chunk_free_bytes > st.reserved_bytes.current ||
      st.largest_free_extent > st.chunk_free_bytes ||
      (st.free_extents == 0) != (st.chunk_free_bytes == 0) ||
      (st.free_extents != 0 && st.largest_free_extent == 0) ||
      st.largest_free_extent * st.free_extents < st.chunk_free_bytes) {
    print_error("ERROR: chunk free space: %" PRIu64 " bytes in %" PRIu64
                " extents, the largest %" PRIu64 ", of %" PRIu64 " reserved\n",
                st.chunk_free_bytes, st.free_extents, st.largest_free_extent,
                st.reserved_bytes.current);
    bad = 1;
  }
  /* A miss is an allocation that grew the arena: each made (at least) one
   * successful backend allocation. */
  if (st.cache_misses > c.nalloc) {
    print_error("ERROR: cache_misses %" PRIu64
                " > successful backend allocations %" PRIu64 "\n",
                st.cache_misses, c.nalloc);
    bad = 1;
  }
  if (st.backend_alloc.max_ns > st.backend_alloc.total_ns ||
      st.backend_free.max_ns > st.backend_free.total_ns) {
    print_error("ERROR: backend duration max_ns above total_ns\n");
    bad = 1;
  }
  if (bad)
    _fail(file, line);
  pp_check_cb_clean_(cb, file, line);
}
#define CHECK_BACKEND_STATS(pool, cb)                                          \
  check_backend_stats_((pool), (cb), __FILE__, __LINE__)

/* ---- Carving from chunks ------------------------------------------------ */
/* The free space inside the chunks (stats) is exactly as given. */
static void check_chunk_free_(pinpool_t *pool, uint64_t free_bytes,
                              uint64_t extents, uint64_t largest,
                              const char *what, const char *file, int line) {
  pinpool_stats_t st;
  pp_get_stats_(pool, &st, file, line);
  if (st.chunk_free_bytes != free_bytes || st.free_extents != extents ||
      st.largest_free_extent != largest) {
    print_error("ERROR: %s: chunk_free_bytes %" PRIu64 ", free_extents %" PRIu64
                ", largest_free_extent %" PRIu64 ", want %" PRIu64 ", %" PRIu64
                ", %" PRIu64 "\n",
                what, st.chunk_free_bytes, st.free_extents,
                st.largest_free_extent, free_bytes, extents, largest);
    _fail(file, line);
  }
}
#define CHECK_CHUNK_FREE(pool, bytes, extents, largest, what)                  \
  check_chunk_free_((pool), (bytes), (extents), (largest), (what), __FILE__,   \
                    __LINE__)

/* Blocks p[0..n) of `bs` bytes all lie in [lo, lo + len). */
static void check_blocks_in_(void **p, int n, size_t bs, const void *lo,
                             size_t len, const char *what, const char *file,
                             int line) {
  for (int i = 0; i < n; i++) {
    uintptr_t a = (uintptr_t)p[i];
    if (a < (uintptr_t)lo || a + bs > (uintptr_t)lo + len || a % 4096 != 0) {
      print_error("ERROR: %s: block %d (%p) outside [%p, +%zu) or not "
                  "4096-aligned\n",
                  what, i, p[i], lo, len);
      _fail(file, line);
    }
  }
}
#define CHECK_BLOCKS_IN(p, n, bs, lo, len, what)                               \
  check_blocks_in_((p), (n), (bs), (lo), (len), (what), __FILE__, __LINE__)

static void test_carving_small_blocks(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("", &cb);
  cb_counts_t c = cb_counts(&cb);
  PP_ASSERT(c.calls == 0, "%" PRIu64 " backend calls at create (reserve=0)",
            c.calls);

  /* The first allocation makes the first chunk (2 MiB, the minimum); the
   * class's first slab (512 KiB: 128 blocks of 4 KiB) is carved from its
   * low end. */
  enum { FIRST = 100 };
  void *p[FIRST];
  for (int i = 0; i < FIRST; i++)
    PP_OK(pinpool_alloc(pool, 4096, &p[i]));
  c = cb_counts(&cb);
  PP_ASSERT(c.calls == 1 && c.nalloc == 1,
            "100 allocations of 4 KiB made %" PRIu64 " backend calls, want 1",
            c.calls);
  size_t n = 0;
  cb_rec_t *r = cb_records(&cb, &n);
  PP_ASSERT(n == 1 && r[0].size == 2 * MiB,
            "the first chunk has %zu bytes, want 2 MiB", r[0].size);
  void *chunk0 = r[0].ptr;
  free(r);
  CHECK_BLOCKS_IN(p, FIRST, 4096, chunk0, 512 * KiB,
                  "the first slab (the chunk's low 512 KiB)");
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.segments.current == 1 && st.arena_chunks == 1,
            "segments %" PRIu64 ", chunks %" PRIu64, st.segments.current,
            st.arena_chunks);
  PP_ASSERT(st.reserved_bytes.current == 2 * MiB, "reserved %" PRIu64,
            st.reserved_bytes.current);
  CHECK_CHUNK_FREE(pool, 3 * 512 * KiB, 1, 3 * 512 * KiB,
                   "a 512 KiB slab carved from a 2 MiB chunk");
  PP_ASSERT(st.cache_misses == 1,
            "cache_misses %" PRIu64 ", want 1 (one "
            "allocation grew the arena)",
            st.cache_misses);

  /* Then a 1 MiB slab (carved from the rest of the first chunk), then
   * 2 MiB slabs, each of which needs a chunk of its own (2 MiB: an eighth of
   * the arena is below the minimum). */
  enum { SLAB2 = 256, SLAB3 = 512, MORE = 28 + SLAB2 + SLAB3 + 128 };
  void **more = calloc(MORE, sizeof *more);
  assert_non_null(more);
  int k = 0;
  for (; k < 28 + SLAB2; k++) /* fills the first slab, then the second */
    PP_OK(pinpool_alloc(pool, 4096, &more[k]));
  PP_STATS(pool, &st);
  PP_ASSERT(st.segments.current == 2 && st.arena_chunks == 1 &&
                cb_counts(&cb).calls == 1,
            "2nd slab: segments %" PRIu64 ", chunks %" PRIu64
            ", backend calls %" PRIu64,
            st.segments.current, st.arena_chunks, cb_counts(&cb).calls);
  CHECK_BLOCKS_IN(more, 28, 4096, chunk0, 512 * KiB, "the first slab");
  CHECK_BLOCKS_IN(more + 28, SLAB2, 4096, (char *)chunk0 + 512 * KiB, MiB,
                  "the second slab (1 MiB after the first)");
  CHECK_CHUNK_FREE(pool, 512 * KiB, 1, 512 * KiB,
                   "a 1 MiB slab carved after the first");
  for (; k < 28 + SLAB2 + SLAB3; k++)
    PP_OK(pinpool_alloc(pool, 4096, &more[k]));
  r = cb_records(&cb, &n);
  PP_ASSERT(n == 2 && r[1].size == 2 * MiB,
            "3rd slab: %zu chunks, the 2nd of %zu bytes (want 2, 2 MiB)", n,
            n > 1 ? r[1].size : 0);
  CHECK_BLOCKS_IN(more + 28 + SLAB2, SLAB3, 4096, r[1].ptr, 2 * MiB,
                  "the third slab (2 MiB, the whole 2nd chunk)");
  free(r);
  CHECK_CHUNK_FREE(pool, 512 * KiB, 1, 512 * KiB,
                   "a 2 MiB slab filling a new chunk");
  for (; k < MORE; k++)
    PP_OK(pinpool_alloc(pool, 4096, &more[k]));
  r = cb_records(&cb, &n);
  PP_ASSERT(n == 3 && r[2].size == 2 * MiB,
            "4th slab: %zu chunks, the 3rd of %zu bytes (want 3, 2 MiB)", n,
            n > 2 ? r[2].size : 0);
  CHECK_BLOCKS_IN(more + 28 + SLAB2 + SLAB3, 128, 4096, r[2].ptr, 2 * MiB,
                  "the fourth slab (2 MiB, the whole 3rd chunk)");
  free(r);
  PP_STATS(pool, &st);
  PP_ASSERT(st.segments.current == 4 && st.arena_chunks == 3 &&
                st.reserved_bytes.current == 6 * MiB,
            "segments %" PRIu64 ", chunks %" PRIu64 ", reserved %" PRIu64,
            st.segments.current, st.arena_chunks, st.reserved_bytes.current);
  PP_ASSERT(st.cache_misses == 3, "cache_misses %" PRIu64 ", want 3",
            st.cache_misses);
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);

  /* Everything but p[] freed and released: slabs 2 to 4 go back to their
   * chunks; the 2nd and 3rd chunks, whole and free, go to the backend; the
   * first keeps slab 1 (p[] is live) and 1.5 MiB free in one extent (the
   * second slab coalesced with the tail). */
  for (int i = 0; i < MORE; i++)
    PP_OK(pinpool_free(pool, more[i]));
  free(more);
  PP_OK(pinpool_empty_cache(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.segments.current == 1 && st.arena_chunks == 1 &&
                cb_counts(&cb).live_count == 1 &&
                cb_find_live(&cb, chunk0).ptr == chunk0 &&
                st.trimmed_segments == 2,
            "after empty_cache: segments %" PRIu64 ", chunks %" PRIu64
            ", trimmed %" PRIu64 ", the first chunk %s",
            st.segments.current, st.arena_chunks, st.trimmed_segments,
            cb_find_live(&cb, chunk0).ptr == chunk0 ? "kept" : "released");
  CHECK_CHUNK_FREE(pool, 3 * 512 * KiB, 1, 3 * 512 * KiB, "after empty_cache");
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);

  /* 256 KiB is still a small class: its first slab is 4 blocks (1 MiB),
   * carved from the free space without a backend call. */
  void *q256 = NULL, *q257 = NULL, *q4m = NULL, *q1m = NULL;
  uint64_t calls = cb_counts(&cb).calls;
  PP_OK(pinpool_alloc(pool, 256 * KiB, &q256));
  CHECK_BLOCKS_IN(&q256, 1, 256 * KiB, (char *)chunk0 + 512 * KiB, MiB,
                  "a 256 KiB block's slab (after the first slab)");
  CHECK_CHUNK_FREE(pool, 512 * KiB, 1, 512 * KiB,
                   "a 256 KiB class's first slab (1 MiB)");
  /* 256 KiB + 1 is a large block: a segment of its own, the request rounded
   * up to a page (266240 bytes), carved from the low end of the free
   * extent. */
  PP_OK(pinpool_alloc(pool, 256 * KiB + 1, &q257));
  size_t bs = 0;
  PP_OK(pinpool_block_size(pool, q257, &bs));
  PP_ASSERT(bs == pp_ref_block(256 * KiB + 1) && bs == 266240,
            "block_size of 256KiB+1: %zu, want 266240", bs);
  assert_ptr_equal(q257, (char *)chunk0 + 3 * 512 * KiB);
  CHECK_CHUNK_FREE(pool, 512 * KiB - 266240, 1, 512 * KiB - 266240,
                   "a 256KiB+1 block carved at its page-rounded size");
  PP_STATS(pool, &st);
  PP_ASSERT(cb_counts(&cb).calls == calls && st.segments.current == 3,
            "256 KiB and 256KiB+1: %" PRIu64 " backend calls, segments %" PRIu64
            " (want 0, 3)",
            cb_counts(&cb).calls - calls, st.segments.current);
  /* A request above the chunk size gets a chunk of its own, of exactly the
   * request rounded up to 2 MiB. */
  PP_OK(pinpool_alloc(pool, 4 * MiB, &q4m));
  cb_rec_t seg = cb_find_live(&cb, q4m);
  PP_ASSERT(seg.ptr == q4m && seg.size == 4 * MiB,
            "4 MiB request: chunk %p of %zu bytes (block %p), want its own of "
            "4 MiB",
            seg.ptr, seg.size, q4m);
  CHECK_CHUNK_FREE(pool, 512 * KiB - 266240, 1, 512 * KiB - 266240,
                   "a 4 MiB block filling its chunk");
  /* 1 MiB + 1 does not fit the rest: a new chunk of 2 MiB (an eighth of
   * 6 MiB is below the minimum), the block (1 MiB + 4 KiB) at its low
   * end. */
  PP_OK(pinpool_alloc(pool, MiB + 1, &q1m));
  seg = cb_find_live(&cb, q1m);
  PP_OK(pinpool_block_size(pool, q1m, &bs));
  PP_ASSERT(seg.ptr == q1m && seg.size == 2 * MiB &&
                bs == pp_ref_block(MiB + 1) && bs == MiB + 4 * KiB,
            "1MiB+1 request: chunk %p of %zu bytes (block %p), block_size "
            "%zu, want a 2 MiB chunk and %zu",
            seg.ptr, seg.size, q1m, bs, pp_ref_block(MiB + 1));
  CHECK_CHUNK_FREE(pool, 512 * KiB - 266240 + MiB - 4 * KiB, 2, MiB - 4 * KiB,
                   "a 1MiB+1 block in a new 2 MiB chunk");
  PP_STATS(pool, &st);
  PP_ASSERT(st.segments.current == 5 && st.arena_chunks == 3 &&
                st.cache_misses == 5 && st.reserved_bytes.current == 8 * MiB,
            "segments %" PRIu64 ", chunks %" PRIu64 ", cache_misses %" PRIu64
            ", reserved %" PRIu64 " (want 5, 3, 5, 8 MiB)",
            st.segments.current, st.arena_chunks, st.cache_misses,
            st.reserved_bytes.current);
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);

  /* Destroy with live blocks: every chunk goes back exactly once. */
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

/* Many small classes: one 2 MiB segment per (class, ...) at most; a
 * thousand 512 B blocks fit into a single segment. */
static void test_carving_many_512(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("", &cb);
  void *p[1000];
  for (int i = 0; i < 1000; i++)
    PP_OK(pinpool_alloc(pool, (size_t)(i % 512) + 1, &p[i]));
  cb_counts_t c = cb_counts(&cb);
  PP_ASSERT(c.nalloc == 1, "1000 blocks of 512 B took %" PRIu64 " segments",
            c.nalloc);
  for (int i = 0; i < 1000; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  CHECK_BACKEND_STATS(pool, &cb);
  c = cb_counts(&cb);
  PP_ASSERT(c.live_count == 0, "%" PRIu64 " segments kept after empty_cache",
            c.live_count);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

/* ---- Caching --------------------------------------------------------------
 */
static void reuse_with(const char *conf) {
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb(conf, &cb);
  static const size_t sizes[] = {100,       4096,    70000,      256 * KiB,
                                 300 * KiB, 4 * MiB, 6 * MiB + 3};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    void *a = NULL, *b = NULL;
    PP_OK(pinpool_alloc(pool, sizes[i], &a));
    uint64_t calls = cb_counts(&cb).calls;
    pinpool_stats_t s0, s1;
    PP_STATS(pool, &s0);
    PP_OK(pinpool_free(pool, a));
    PP_OK(pinpool_alloc(pool, sizes[i], &b));
    PP_STATS(pool, &s1);
    PP_ASSERT(cb_counts(&cb).calls == calls,
              "[%s] free+alloc of %zu bytes called the backend", conf,
              sizes[i]);
    PP_ASSERT(s1.cache_hits == s0.cache_hits + 1,
              "[%s] reuse of %zu bytes: cache_hits %" PRIu64 " -> %" PRIu64,
              conf, sizes[i], s0.cache_hits, s1.cache_hits);
    PP_ASSERT(s1.cache_misses == s0.cache_misses,
              "[%s] reuse counted as a miss", conf);
    PP_ASSERT(s1.tcache_hits <= s1.cache_hits, "tcache_hits > cache_hits");
    PP_OK(pinpool_free(pool, b));
    CHECK_BACKEND_STATS(pool, &cb);
    PP_CHECK_CONSISTENT(pool);
  }
  /* Free everything, then empty_cache from this (the freeing) thread:
   * every segment goes back. */
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.reserved_bytes.current == 0 && st.segments.current == 0 &&
                st.cached_bytes.current == 0,
            "[%s] after empty_cache: reserved %" PRIu64 ", segments %" PRIu64
            ", cached %" PRIu64,
            conf, st.reserved_bytes.current, st.segments.current,
            st.cached_bytes.current);
  cb_counts_t c = cb_counts(&cb);
  PP_ASSERT(c.live_count == 0 && c.nfree == c.nalloc,
            "[%s] backend still holds %" PRIu64 " ranges", conf, c.live_count);
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);
  /* The pool works after releasing everything. */
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 5000, &p));
  PP_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

static void test_reuse_default(void **state) {
  (void)state;
  reuse_with("");
}
static void test_reuse_no_tcache(void **state) {
  (void)state;
  reuse_with("tcache_bytes=0");
}
static void test_reuse_one_shard(void **state) {
  (void)state;
  reuse_with("shards=1,tcache_bytes=64KiB");
}

/* ---- Thread caches: flushed at exit and on request ---------------------- */
struct worker {
  pinpool_t *pool;
  int rc;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stage; /* 0 start, 1 worker allocated+freed, 2 main says flush,
                3 worker flushed, 4 main says exit */
};

static void worker_wait(struct worker *w, int stage) {
  pthread_mutex_lock(&w->mu);
  while (w->stage < stage)
    pthread_cond_wait(&w->cv, &w->mu);
  pthread_mutex_unlock(&w->mu);
}
static void worker_set(struct worker *w, int stage) {
  pthread_mutex_lock(&w->mu);
  w->stage = stage;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

/* Run fn(arg) on *t with w zeroed and ready for worker_wait / worker_set
 * (arg is w or a struct that starts with it); worker_fini after the join. */
static void worker_start(struct worker *w, pinpool_t *pool, void *(*fn)(void *),
                         void *arg, pthread_t *t) {
  memset(w, 0, sizeof *w);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  w->pool = pool;
  PP_ASSERT(pthread_create(t, NULL, fn, arg) == 0, "pthread_create");
}
static void worker_fini(struct worker *w) {
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
}

static int churn(pinpool_t *pool) {
  void *p[40];
  static const size_t sizes[] = {64, 600, 4096, 9000, 200 * KiB};
  for (int i = 0; i < 40; i++) {
    int rc = pinpool_alloc(pool, sizes[i % 5], &p[i]);
    if (rc)
      return rc;
    memset(p[i], i, sizes[i % 5]);
  }
  for (int i = 0; i < 40; i++) {
    int rc = pinpool_free(pool, p[i]);
    if (rc)
      return rc;
  }
  return 0;
}

static void *exit_worker(void *arg) {
  struct worker *w = arg;
  w->rc = churn(w->pool);
  return NULL;
}

static void test_thread_exit_flushes_cache(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("", &cb);
  struct worker w;
  memset(&w, 0, sizeof w);
  w.pool = pool;
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, exit_worker, &w) == 0, "pthread_create");
  pthread_join(t, NULL);
  PP_CHECK_RC(w.rc, 0);
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.reserved_bytes.current == 0,
            "reserved %" PRIu64 " after the worker exited and empty_cache",
            st.reserved_bytes.current);
  cb_counts_t c = cb_counts(&cb);
  PP_ASSERT(c.live_count == 0 && c.nalloc == c.nfree,
            "backend: %" PRIu64 " allocs, %" PRIu64 " frees", c.nalloc,
            c.nfree);
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

static void *flush_worker(void *arg) {
  struct worker *w = arg;
  w->rc = churn(w->pool);
  worker_set(w, 1);
  worker_wait(w, 2);
  int rc = pinpool_thread_flush(w->pool);
  if (w->rc == 0)
    w->rc = rc;
  worker_set(w, 3);
  worker_wait(w, 4);
  return NULL;
}

static void test_thread_flush_then_empty(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("", &cb);
  struct worker w;
  pthread_t t;
  worker_start(&w, pool, flush_worker, &w, &t);
  worker_wait(&w, 1);
  /* The worker is alive and idle (not inside a call): stats are exact. */
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  PP_CHECK_CONSISTENT(pool);
  worker_set(&w, 2);
  worker_wait(&w, 3);
  PP_CHECK_RC(w.rc, 0);
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.reserved_bytes.current == 0,
            "reserved %" PRIu64 " after the worker flushed and empty_cache",
            st.reserved_bytes.current);
  PP_ASSERT(cb_counts(&cb).live_count == 0, "backend ranges still held");
  CHECK_BACKEND_STATS(pool, &cb);
  worker_set(&w, 4);
  pthread_join(t, NULL);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  worker_fini(&w);
  cb_fini(&cb);
}

/* empty_cache from one thread while another thread's cache holds freed
 * blocks: whatever is released, the other thread must never be handed
 * memory that went back to the backend (its next allocations must lie in
 * ranges the backend still has out, and be usable). */
struct holder {
  struct worker w;
  size_t size;
  void *first[16];
  void *after[16];
  int rc_after;
};

static void *holder_main(void *arg) {
  struct holder *h = arg;
  struct worker *w = &h->w;
  for (int i = 0; i < 16; i++)
    if ((w->rc = pinpool_alloc(w->pool, h->size, &h->first[i])) != 0)
      break;
  for (int i = 0; i < 16 && w->rc == 0; i++)
    w->rc = pinpool_free(w->pool, h->first[i]); /* into this thread's cache */
  worker_set(w, 1);
  worker_wait(w, 2); /* main runs empty_cache meanwhile */
  h->rc_after = 0;
  for (int i = 0; i < 16 && h->rc_after == 0; i++)
    h->rc_after = pinpool_alloc(w->pool, h->size, &h->after[i]);
  worker_set(w, 3);
  worker_wait(w, 4); /* main checks and frees the blocks */
  return NULL;
}

static void empty_cache_vs_other_cache(size_t size) {
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("", &cb);
  struct holder h;
  memset(&h, 0, sizeof h);
  h.size = size;
  pthread_t t;
  worker_start(&h.w, pool, holder_main, &h, &t);
  worker_wait(&h.w, 1);
  PP_CHECK_RC(h.w.rc, 0);
  PP_OK(pinpool_empty_cache(pool));
  PP_CHECK_CONSISTENT(pool);
  worker_set(&h.w, 2);
  worker_wait(&h.w, 3);
  PP_CHECK_RC(h.rc_after, 0);
  for (int i = 0; i < 16; i++) {
    cb_rec_t r = cb_find_live(&cb, h.after[i]);
    PP_ASSERT(r.ptr != NULL &&
                  (uintptr_t)h.after[i] + size <= (uintptr_t)r.ptr + r.size,
              "block %p (%zu bytes) handed out after empty_cache lies in "
              "memory the pool gave back to the backend",
              h.after[i], size);
    size_t bs = 0;
    PP_OK(pinpool_block_size(pool, h.after[i], &bs));
    PP_ASSERT(bs == pp_ref_block(size), "block_size %zu, want %zu", bs,
              pp_ref_block(size));
    memset(h.after[i], 0x5a, size);
  }
  for (int i = 0; i < 16; i++)
    PP_OK(pinpool_free(pool, h.after[i]));
  worker_set(&h.w, 4);
  pthread_join(t, NULL);
  PP_CHECK_CONSISTENT(pool);
  CHECK_BACKEND_STATS(pool, &cb);
  PP_OK(pinpool_empty_cache(pool));
  PP_ASSERT(cb_counts(&cb).live_count == 0, "segments kept after the thread "
                                            "exited and empty_cache");
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  worker_fini(&h.w);
  cb_fini(&cb);
}

static void test_empty_cache_vs_other_thread_cache(void **state) {
  (void)state;
  empty_cache_vs_other_cache(4096);
  empty_cache_vs_other_cache(30000);
  empty_cache_vs_other_cache(200 * KiB);
  empty_cache_vs_other_cache(MiB);
}

/* Destroy while a thread that used the pool is still running: its cache
 * for the pool is dropped and every segment still goes back at destroy. */
static void *survivor(void *arg) {
  struct worker *w = arg;
  void *keep = NULL;
  w->rc = churn(w->pool);
  if (w->rc == 0)
    w->rc = pinpool_alloc(w->pool, 12345, &keep); /* left allocated */
  worker_set(w, 1);
  worker_wait(w, 2); /* main destroys the pool meanwhile */
  /* Keep using pinpool with another pool, then exit (thread-exit cleanup
   * must not touch the destroyed pool). */
  pinpool_t *other = NULL;
  int rc = pinpool_create("", &other);
  if (rc == 0) {
    rc = churn(other);
    pinpool_destroy(other);
  }
  if (w->rc == 0)
    w->rc = rc;
  worker_set(w, 3);
  return NULL;
}

static void test_destroy_while_user_thread_alive(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("", &cb);
  struct worker w;
  pthread_t t;
  worker_start(&w, pool, survivor, &w, &t);
  worker_wait(&w, 1);
  pinpool_destroy(pool);
  /* Before the thread exits, everything is back. */
  PP_CHECK_CB_BALANCED(&cb);
  worker_set(&w, 2);
  pthread_join(t, NULL);
  PP_CHECK_RC(w.rc, 0);
  PP_CHECK_CB_BALANCED(&cb);
  worker_fini(&w);
  cb_fini(&cb);
}

/* ---- A backend out of memory ----------------------------------------------
 */
static void failing_backend_with(int code) {
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb("tcache_bytes=0", &cb);

  /* Fresh pool, backend failing: small and large allocations fail. */
  cb_set_fail(&cb, code);
  void *out = SENTINEL_PTR;
  pinpool_stats_t s0, s1;
  PP_STATS(pool, &s0);
  PP_CHECK_RC(pinpool_alloc(pool, 100, &out), code);
  PP_ASSERT(pinpool_last_error()[0] != '\0', "no message");
  PP_CHECK_RC(pinpool_alloc(pool, 4 * MiB, &out), code);
  PP_ASSERT(out == SENTINEL_PTR, "*out changed on failure");
  PP_STATS(pool, &s1);
  PP_ASSERT(s1.requests.current == 0 && s1.requests.allocated == 0 &&
                s1.reserved_bytes.current == 0 && s1.block_bytes.allocated == 0,
            "a failed allocation was counted");
  if (code == PINPOOL_ENOMEM)
    PP_ASSERT(s1.oom_count >= s0.oom_count + 2,
              "oom_count %" PRIu64 " -> %" PRIu64, s0.oom_count, s1.oom_count);
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);

  /* Recovery. */
  cb_set_fail(&cb, 0);
  void *small = NULL, *large = NULL;
  PP_OK(pinpool_alloc(pool, 100, &small));
  PP_OK(pinpool_alloc(pool, 4 * MiB, &large));
  PP_CHECK_CONSISTENT(pool);

  /* Failing again: what fits in held segments still works, a new segment
   * fails cleanly, and freeing works. */
  cb_set_fail(&cb, code);
  void *small2 = NULL;
  PP_OK(pinpool_alloc(pool, 100, &small2));
  PP_OK(pinpool_free(pool, large));
  void *large2 = NULL;
  PP_OK(pinpool_alloc(pool, 4 * MiB, &large2)); /* the cached one */
  PP_STATS(pool, &s0);
  out = SENTINEL_PTR;
  PP_CHECK_RC(pinpool_alloc(pool, 5 * MiB, &out), code);
  PP_ASSERT(out == SENTINEL_PTR, "*out changed on failure");
  PP_STATS(pool, &s1);
  PP_ASSERT(s1.requests.current == s0.requests.current &&
                s1.requested_bytes.current == s0.requested_bytes.current &&
                s1.reserved_bytes.current == s0.reserved_bytes.current,
            "a failed allocation changed the accounting");
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);
  cb_set_fail(&cb, 0);
  PP_OK(pinpool_alloc(pool, 5 * MiB, &out));
  PP_OK(pinpool_free(pool, out));
  PP_OK(pinpool_free(pool, large2));
  PP_OK(pinpool_free(pool, small));
  PP_OK(pinpool_free(pool, small2));
  PP_OK(pinpool_empty_cache(pool));
  CHECK_BACKEND_STATS(pool, &cb);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);

  /* A reserve that cannot be allocated fails create, leaking nothing. */
  cb_set_fail(&cb, code);
  pinpool_backend_t t = cb_table(&cb, 0);
  pinpool_t *p2 = (pinpool_t *)SENTINEL_PTR;
  PP_CHECK_RC(pinpool_create_with_backend("reserve=4MiB", &t, &p2), code);
  PP_ASSERT(p2 == (pinpool_t *)SENTINEL_PTR, "*out changed on failure");
  PP_CHECK_CB_BALANCED(&cb);
  cb_set_fail(&cb, 0);
  cb_fini(&cb);
}

static void test_backend_enomem(void **state) {
  (void)state;
  failing_backend_with(PINPOOL_ENOMEM);
}
static void test_backend_ebackend(void **state) {
  (void)state;
  failing_backend_with(PINPOOL_EBACKEND);
}

/* ---- No pool lock is held while the backend runs --------------------------
 * From inside alloc/free, a second thread uses the pool (stats, an
 * allocation served from the bins, block_size, free). If the pool held a
 * lock around the backend call, that thread would block: we wait 20 s, then
 * report and exit (the test process cannot recover from a deadlock). */
struct probe {
  _Atomic(pinpool_t *) pool;
  atomic_int armed;
  atomic_int busy;
  atomic_int probes;
  atomic_int failures;
  void *existing; /* a live block, set before arming */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int done;
  _Atomic(const char *) where;
};

static void *probe_thread(void *arg) {
  struct probe *pr = arg;
  pinpool_t *pool = atomic_load(&pr->pool);
  pinpool_stats_t st;
  char cfg[1024];
  size_t sz = 0;
  void *p = NULL;
  int bad = 0;
  /* Calls that take the pool's locks: stats, config, an allocation from the
   * bins, one that needs a new segment (its own backend call is not
   * probed), and empty_cache. */
  if (pinpool_get_stats(pool, &st) != 0)
    bad |= 1;
  if (pinpool_get_config(pool, cfg, sizeof cfg, NULL) != 0)
    bad |= 2;
  if (pinpool_alloc(pool, 700, &p) != 0)
    bad |= 4;
  else if (pinpool_free(pool, p) != 0)
    bad |= 8;
  if (pinpool_alloc(pool, 300 * KiB, &p) != 0)
    bad |= 16;
  else if (pinpool_free(pool, p) != 0)
    bad |= 32;
  if (pinpool_empty_cache(pool) != 0)
    bad |= 64;
  if (pinpool_block_size(pool, pr->existing, &sz) != 0)
    bad |= 128;
  if (bad) {
    fprintf(stderr, "probe: calls failed (mask %#x): %s\n", (unsigned)bad,
            pinpool_last_error());
    atomic_fetch_add(&pr->failures, 1);
  }
  pthread_mutex_lock(&pr->mu);
  pr->done = 1;
  pthread_cond_broadcast(&pr->cv);
  pthread_mutex_unlock(&pr->mu);
  return NULL;
}

static void probe_hook(counting_backend_t *cb, int is_alloc, size_t size,
                       void *arg) {
  (void)cb;
  struct probe *pr = arg;
  if (!atomic_load(&pr->armed) || atomic_load(&pr->pool) == NULL)
    return;
  if (atomic_exchange(&pr->busy, 1))
    return; /* a nested call made by the probe itself */
  pthread_mutex_lock(&pr->mu);
  pr->done = 0;
  pthread_mutex_unlock(&pr->mu);
  pthread_t t;
  if (pthread_create(&t, NULL, probe_thread, pr) != 0) {
    atomic_fetch_add(&pr->failures, 1);
    atomic_store(&pr->busy, 0);
    return;
  }
  struct timespec dl;
  clock_gettime(CLOCK_REALTIME, &dl);
  dl.tv_sec += 20;
  pthread_mutex_lock(&pr->mu);
  int rc = 0;
  while (!pr->done && rc != ETIMEDOUT)
    rc = pthread_cond_timedwait(&pr->cv, &pr->mu, &dl);
  int done = pr->done;
  pthread_mutex_unlock(&pr->mu);
  if (!done) {
    fprintf(stderr,
            "FATAL: backend %s(%zu) during %s: another thread could not use "
            "the pool for 20 s: the pool holds a lock while calling its "
            "backend\n",
            is_alloc ? "alloc" : "free", size, atomic_load(&pr->where));
    fflush(stderr);
    _exit(3);
  }
  pthread_join(t, NULL);
  atomic_fetch_add(&pr->probes, 1);
  atomic_store(&pr->busy, 0);
}

static struct probe *probe_new(void) {
  static struct probe pr; /* outlives the pools */
  memset(&pr, 0, sizeof pr);
  pthread_mutex_init(&pr.mu, NULL);
  pthread_cond_init(&pr.cv, NULL);
  return &pr;
}

/* Creates the pool, a live block for the probe and a cached 700 B block so
 * that the probe's allocation is served from the bins (tcache off, one
 * shard), then arms the probe. */
static pinpool_t *probe_pool(struct probe *pr, counting_backend_t *cb,
                             const char *conf) {
  cb_init(cb);
  cb->hook = probe_hook;
  cb->hook_arg = pr;
  pinpool_t *pool = create_cb(conf, cb);
  void *prime = NULL, *existing = NULL;
  PP_OK(pinpool_alloc(pool, 700, &existing));
  PP_OK(pinpool_alloc(pool, 700, &prime));
  PP_OK(pinpool_free(pool, prime));
  pr->existing = existing;
  atomic_store(&pr->pool, pool);
  atomic_store(&pr->armed, 1);
  return pool;
}

static void probe_finish(struct probe *pr, counting_backend_t *cb,
                         pinpool_t *pool) {
  PP_ASSERT(atomic_load(&pr->failures) == 0,
            "%d probe calls failed while the backend ran",
            atomic_load(&pr->failures));
  atomic_store(&pr->armed, 0);
  atomic_store(&pr->pool, NULL);
  PP_OK(pinpool_free(pool, pr->existing));
  CHECK_BACKEND_STATS(pool, cb);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(cb);
  cb_fini(cb);
  pthread_mutex_destroy(&pr->mu);
  pthread_cond_destroy(&pr->cv);
}

/* Every path that reaches the backend: a new segment, empty_cache, the
 * max_cached trim (inside free) and the max_reserved retry (inside alloc). */
static void test_no_lock_held_during_backend_calls(void **state) {
  (void)state;
  struct probe *pr = probe_new();
  counting_backend_t cb;

  /* New chunks and empty_cache. */
  pinpool_t *pool = probe_pool(pr, &cb, "tcache_bytes=0,shards=1");
  void *a = NULL, *b = NULL, *c = NULL;
  atomic_store(&pr->where, "alloc (new segment)");
  PP_OK(pinpool_alloc(pool, 4 * MiB, &a));
  PP_OK(pinpool_alloc(pool, 3 * MiB, &b));
  PP_ASSERT(atomic_load(&pr->probes) >= 2, "%d probes for 2 new chunks",
            atomic_load(&pr->probes));
  atomic_store(&pr->where, "empty_cache");
  int before = atomic_load(&pr->probes);
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_empty_cache(pool));
  PP_ASSERT(atomic_load(&pr->probes) > before,
            "empty_cache did not release the idle segments");
  probe_finish(pr, &cb, pool);

  /* The max_cached trim, inside pinpool_free. */
  pr = probe_new();
  pool = probe_pool(pr, &cb, "tcache_bytes=0,shards=1,max_cached=4MiB");
  atomic_store(&pr->where, "alloc (new segment)");
  PP_OK(pinpool_alloc(pool, 4 * MiB, &a));
  PP_OK(pinpool_alloc(pool, 4 * MiB, &b));
  atomic_store(&pr->where, "free (max_cached trim)");
  before = atomic_load(&pr->probes);
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_free(pool, b)); /* 8 MiB idle > max_cached: trims */
  PP_ASSERT(atomic_load(&pr->probes) > before,
            "no backend free during the max_cached trim");
  probe_finish(pr, &cb, pool);

  /* The max_reserved retry, inside pinpool_alloc: a 2 MiB chunk (the small
   * blocks) + an idle 8 MiB chunk + 9 MiB more > 12 MiB, and 9 MiB does not
   * fit the idle chunk: the whole free chunk goes back to the backend and
   * the allocation is retried (a new chunk). */
  pr = probe_new();
  pool = probe_pool(pr, &cb, "tcache_bytes=0,shards=1,max_reserved=12MiB");
  atomic_store(&pr->where, "alloc (new segment)");
  PP_OK(pinpool_alloc(pool, 8 * MiB, &a));
  PP_OK(pinpool_free(pool, a));
  atomic_store(&pr->where, "alloc (max_reserved retry)");
  pinpool_stats_t s0, s1;
  PP_STATS(pool, &s0);
  before = atomic_load(&pr->probes);
  PP_OK(pinpool_alloc(pool, 9 * MiB, &c));
  PP_STATS(pool, &s1);
  PP_ASSERT(atomic_load(&pr->probes) >= before + 2,
            "the retry did not free the idle chunk and allocate");
  PP_ASSERT(s1.retries == s0.retries + 1 &&
                s1.trimmed_segments == s0.trimmed_segments + 1 &&
                s1.arena_chunks == 2 && s1.reserved_bytes.current <= 12 * MiB,
            "retries %" PRIu64 " -> %" PRIu64 ", trimmed %" PRIu64
            " -> %" PRIu64 ", chunks %" PRIu64 ", reserved %" PRIu64,
            s0.retries, s1.retries, s0.trimmed_segments, s1.trimmed_segments,
            s1.arena_chunks, s1.reserved_bytes.current);
  PP_OK(pinpool_free(pool, c));
  probe_finish(pr, &cb, pool);
}

/* ---- Metadata lives outside user memory ------------------------------------
 * The backend fills each new range with a pattern; the test never writes
 * into the blocks, so the pool must never change a byte of any segment
 * (no headers, no free-list links, no footers in pinned memory). */
static void check_pattern(counting_backend_t *cb, unsigned char pat) {
  static unsigned char ref[64 * 1024];
  memset(ref, pat, sizeof ref);
  size_t n = 0;
  cb_rec_t *r = cb_records(cb, &n);
  for (size_t i = 0; i < n; i++) {
    if (r[i].free_seq != 0)
      continue;
    const unsigned char *b = r[i].ptr;
    for (size_t off = 0; off < r[i].size; off += sizeof ref) {
      size_t len = r[i].size - off < sizeof ref ? r[i].size - off : sizeof ref;
      if (memcmp(b + off, ref, len) == 0)
        continue;
      size_t k = off;
      while (b[k] == pat)
        k++;
      uintptr_t at = (uintptr_t)(b + k);
      unsigned v = b[k];
      free(r);
      PP_FAIL("the pool wrote into user memory: segment %p+%zu (%p) holds "
              "0x%02x",
              (const void *)b, k, (void *)at, v);
    }
  }
  free(r);
}

static void metadata_outside_with(const char *conf) {
  counting_backend_t cb;
  cb_init(&cb);
  cb.fill = 0xA5;
  pinpool_t *pool = create_cb(conf, &cb);
  void *p[300];
  uint64_t s = pp_seed(99);
  for (int i = 0; i < 300; i++)
    PP_OK(pinpool_alloc(
        pool, pp_rand_size(&s, 1, (i % 10 == 0) ? 3 * MiB : 64 * KiB), &p[i]));
  check_pattern(&cb, 0xA5);
  for (int i = 0; i < 300; i += 2)
    PP_OK(pinpool_free(pool, p[i]));
  check_pattern(&cb, 0xA5);
  PP_OK(pinpool_thread_flush(pool));
  check_pattern(&cb, 0xA5);
  for (int i = 0; i < 300; i += 2)
    PP_OK(pinpool_alloc(pool, pp_rand_size(&s, 1, 64 * KiB), &p[i]));
  check_pattern(&cb, 0xA5);
  for (int i = 0; i < 300; i++)
    PP_OK(pinpool_free(pool, p[i]));
  check_pattern(&cb, 0xA5);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

static void test_metadata_outside_user_memory(void **state) {
  (void)state;
  metadata_outside_with("populate=0");
  metadata_outside_with("populate=0,tcache_bytes=0,shards=1");
}

/* ---- page_locked is reported ----------------------------------------------
 */
static void test_page_locked_reported(void **state) {
  (void)state;
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_t *pool = create_cb_("", &cb, 1, __FILE__, __LINE__);
  void *a = NULL, *b = NULL;
  PP_OK(pinpool_alloc(pool, 1000, &a));
  PP_OK(pinpool_alloc(pool, 3 * MiB, &b));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.locked_bytes == st.reserved_bytes.current,
            "page_locked backend: locked_bytes %" PRIu64
            " != reserved %" PRIu64,
            st.locked_bytes, st.reserved_bytes.current);
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_EMPTIED(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);

  /* Not page-locked and mlock off: nothing counts as locked. */
  cb_init(&cb);
  pool = create_cb_("mlock=0", &cb, 0, __FILE__, __LINE__);
  PP_OK(pinpool_alloc(pool, 3 * MiB, &b));
  PP_STATS(pool, &st);
  PP_ASSERT(st.locked_bytes == 0, "locked_bytes %" PRIu64, st.locked_bytes);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

/* ---- Built-in backends and options: a small workload ----------------------
 */
static void workload_with(const char *conf) {
  pinpool_t *pool = NULL;
  int rc = pinpool_create(conf, &pool);
  if (rc != 0)
    PP_FAIL("pinpool_create(\"%s\") = %d (%s): %s", conf, rc, pp_code_name(rc),
            pinpool_last_error());
  uint64_t s = pp_seed(1234);
  enum { LIVE = 32 };
  void *p[LIVE] = {0};
  size_t sz[LIVE] = {0};
  for (int step = 0; step < 400; step++) {
    int i = (int)(pp_rand(&s) % LIVE);
    if (p[i] == NULL) {
      size_t n = pp_rand_size(&s, 1, 8 * MiB);
      rc = pinpool_alloc(pool, n, &p[i]);
      if (rc != 0)
        PP_FAIL("[%s] alloc(%zu) = %d (%s): %s", conf, n, rc, pp_code_name(rc),
                pinpool_last_error());
      sz[i] = n;
      unsigned char *b = p[i];
      b[n - 1] = (unsigned char)~i;
      b[0] = (unsigned char)i; /* for n == 1, b[0] is the one that counts */
    } else {
      unsigned char *b = p[i];
      PP_ASSERT(b[0] == (unsigned char)i &&
                    (sz[i] == 1 || b[sz[i] - 1] == (unsigned char)~i),
                "[%s] block contents changed", conf);
      PP_OK(pinpool_free(pool, p[i]));
      p[i] = NULL;
    }
    if (step % 20 == 0)
      PP_CHECK_CONSISTENT(pool);
  }
  for (int i = 0; i < LIVE; i++)
    if (p[i])
      PP_OK(pinpool_free(pool, p[i]));
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.reserved_bytes.current == 0 && st.segments.current == 0,
            "[%s] reserved %" PRIu64 " segments %" PRIu64
            " after freeing all + empty_cache",
            conf, st.reserved_bytes.current, st.segments.current);
  /* Every chunk went back, each with one backend free; every segment
   * ended. */
  PP_ASSERT(st.backend_alloc.count >= 1 &&
                st.backend_free.count == st.backend_alloc.count &&
                st.arena_chunks == 0 &&
                st.segments.freed == st.segments.allocated,
            "[%s] backend_alloc %" PRIu64 ", backend_free %" PRIu64
            ", chunks %" PRIu64 ", segments freed %" PRIu64,
            conf, st.backend_alloc.count, st.backend_free.count,
            st.arena_chunks, st.segments.freed);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_builtin_backends_and_options(void **state) {
  (void)state;
  static const char *confs[] = {
      "",
      "backend=host",
      "backend=malloc",
      "hugepages=1",
      "populate=0",
      "populate=1,populate_threads=4",
      "mlock=1",
      "hugepages=1,populate=0,backend=malloc",
      "backend=malloc,tcache_bytes=0,shards=64",
      "backend=host,hugepages=1,populate=1,populate_threads=3,shards=2",
  };
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++)
    workload_with(confs[i]);
}

/* pinpool_free's hint (alloc.c): each thread remembers the segment of its
 * last free. Here that segment (a 512 KiB slab of 4 KiB blocks) is
 * released; its addresses go to a new 2 MiB block (another descriptor:
 * large descriptors are a separate free list) and its descriptor to a new
 * slab elsewhere, whose block 0 is allocated. Freeing the 2 MiB block must
 * free it and nothing else. Without the generation check on the hint, the
 * free would take the recycled descriptor for the block's segment and free
 * block 0 of the other slab instead (the HINT_NO_GEN mutant). */
typedef struct two_regions {
  void *base[2];
  int in_use[2];
} two_regions_t;

static int two_regions_alloc(void *ctx, size_t size, void **out) {
  two_regions_t *r = ctx;
  for (int i = 0; i < 2; i++) {
    if (!r->in_use[i] && size <= 2 * MiB) {
      r->in_use[i] = 1;
      *out = r->base[i];
      return 0;
    }
  }
  return PINPOOL_ENOMEM;
}

static void two_regions_free(void *ctx, void *ptr, size_t size) {
  two_regions_t *r = ctx;
  (void)size;
  for (int i = 0; i < 2; i++)
    if (ptr == r->base[i])
      r->in_use[i] = 0;
}

static void test_free_hint_recycled(void **state) {
  (void)state;
  two_regions_t r;
  memset(&r, 0, sizeof r);
  for (int i = 0; i < 2; i++) {
    r.base[i] = aligned_alloc(2 * MiB, 2 * MiB);
    assert_non_null(r.base[i]);
  }
  pinpool_backend_t t;
  memset(&t, 0, sizeof t);
  t.name = "two-regions";
  t.alloc = two_regions_alloc;
  t.free = two_regions_free;
  t.ctx = &r;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend("", &t, &pool));
  void *a = NULL, *big = NULL;
  PP_OK(pinpool_alloc(pool, 4 * KiB, &a));
  PP_ASSERT((char *)a >= (char *)r.base[0] &&
                (char *)a < (char *)r.base[0] + 2 * MiB,
            "the first slab is in region 0");
  PP_OK(pinpool_free(pool, a)); /* the hint: the slab in region 0 */
  PP_OK(pinpool_empty_cache(pool));
  PP_ASSERT(!r.in_use[0] && !r.in_use[1], "the slab went back");
  PP_OK(pinpool_alloc(pool, 2 * MiB, &big));
  assert_ptr_equal(big, r.base[0]); /* the slab's addresses */
  enum { N = 128 }; /* one whole first slab (512 KiB) of 4 KiB blocks */
  void **small = calloc(N, sizeof *small);
  assert_non_null(small);
  for (int i = 0; i < N; i++) {
    PP_OK(pinpool_alloc(pool, 4 * KiB, &small[i]));
    PP_ASSERT(small[i] >= r.base[1] &&
                  (char *)small[i] < (char *)r.base[1] + 2 * MiB,
              "block %d of the new slab is in region 1", i);
  }
  PP_OK(pinpool_free(pool, big));
  size_t bs = 0;
  PP_CHECK_RC(pinpool_block_size(pool, big, &bs), PINPOOL_EDOUBLEFREE);
  for (int i = 0; i < N; i++)
    PP_OK(pinpool_free(pool, small[i])); /* none was freed by mistake */
  PP_CHECK_RC(pinpool_free(pool, big), PINPOOL_EDOUBLEFREE);
  PP_OK(pinpool_validate(pool));
  free(small);
  pinpool_destroy(pool);
  for (int i = 0; i < 2; i++)
    free(r.base[i]);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_carving_small_blocks),
      cmocka_unit_test(test_carving_many_512),
      cmocka_unit_test(test_reuse_default),
      cmocka_unit_test(test_reuse_no_tcache),
      cmocka_unit_test(test_reuse_one_shard),
      cmocka_unit_test(test_thread_exit_flushes_cache),
      cmocka_unit_test(test_thread_flush_then_empty),
      cmocka_unit_test(test_empty_cache_vs_other_thread_cache),
      cmocka_unit_test(test_destroy_while_user_thread_alive),
      cmocka_unit_test(test_backend_enomem),
      cmocka_unit_test(test_backend_ebackend),
      cmocka_unit_test(test_no_lock_held_during_backend_calls),
      cmocka_unit_test(test_metadata_outside_user_memory),
      cmocka_unit_test(test_page_locked_reported),
      cmocka_unit_test(test_builtin_backends_and_options),
      cmocka_unit_test(test_free_hint_recycled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
