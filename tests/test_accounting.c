/* A deterministic random workload (xorshift, fixed seeds): allocations of
 * 1 B .. 8 MiB (log-uniform), frees of random live blocks, and now and then
 * empty_cache, reset_peak_stats and thread_flush. After EVERY step the stats
 * are compared with our own shadow bookkeeping (exact for requests,
 * requested bytes and block bytes), the accounting identity and
 * current == allocated - freed are checked, and pinpool_validate() must pass.
 * With the counting backend, the backend's view must match as well: its
 * ranges are the arena's chunks (arena_chunks, backend calls, misses = the
 * allocations that grew the arena, trimmed_segments = chunks released), and
 * every live block lies inside one of them. */
#define _GNU_SOURCE
#include "testutil.h"

#include <inttypes.h>
#include <stdlib.h>

enum { MAXLIVE = 64 };

/* Sanitizer builds run fewer steps (validate() after every step dominates);
 * PINPOOL_ACCOUNTING_STEPS=N overrides the step count of every run. */
#ifdef PP_SANITIZED
#define STEPS(normal, sanitized) (sanitized)
#else
#define STEPS(normal, sanitized) (normal)
#endif

static int steps_for(int n) {
  const char *e = getenv("PINPOOL_ACCOUNTING_STEPS");
  if (e != NULL && *e != '\0') {
    long v = strtol(e, NULL, 10);
    if (v > 0 && v < 100000000)
      return (int)v;
  }
  return n;
}

struct live {
  unsigned char *p;
  size_t size;
  size_t cls;
  uint64_t tag;
};

struct shadow {
  struct live live[MAXLIVE];
  size_t nlive;
  uint64_t n_alloc, n_free;
  uint64_t req_alloc, req_freed, blk_alloc, blk_freed;
  uint64_t cur_req, cur_blk;
  /* true peaks since create / the last reset */
  uint64_t peak_count, peak_req, peak_blk;
};

static void put_cookie(struct live *l) {
  if (l->size <= 64) {
    memset(l->p, (int)(l->tag & 0xff), l->size);
    return;
  }
  uint64_t a = l->tag, b = ~l->tag;
  memcpy(l->p, &a, 8);
  memcpy(l->p + l->size - 8, &b, 8);
}

static int cookie_ok(const struct live *l) {
  if (l->size <= 64) {
    for (size_t i = 0; i < l->size; i++)
      if (l->p[i] != (unsigned char)(l->tag & 0xff))
        return 0;
    return 1;
  }
  uint64_t a, b;
  memcpy(&a, l->p, 8);
  memcpy(&b, l->p + l->size - 8, 8);
  return a == l->tag && b == ~l->tag;
}

#define U64(x) ((uint64_t)(x))

static void check_step(pinpool_t *pool, const struct shadow *sh,
                       counting_backend_t *cb, int step) {
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  int bad = 0;
#define EXPECT_EQ(got, want)                                                   \
  if (U64(got) != U64(want)) {                                                 \
    print_error("ERROR: step %d: %s = %" PRIu64 ", want %s = %" PRIu64 "\n",   \
                step, #got, U64(got), #want, U64(want));                       \
    bad = 1;                                                                   \
  }
  EXPECT_EQ(st.requests.current, sh->nlive);
  EXPECT_EQ(st.blocks.current, sh->nlive);
  EXPECT_EQ(st.requested_bytes.current, sh->cur_req);
  EXPECT_EQ(st.block_bytes.current, sh->cur_blk);
  EXPECT_EQ(st.requests.allocated, sh->n_alloc);
  EXPECT_EQ(st.requests.freed, sh->n_free);
  EXPECT_EQ(st.blocks.allocated, sh->n_alloc);
  EXPECT_EQ(st.blocks.freed, sh->n_free);
  EXPECT_EQ(st.requested_bytes.allocated, sh->req_alloc);
  EXPECT_EQ(st.requested_bytes.freed, sh->req_freed);
  EXPECT_EQ(st.block_bytes.allocated, sh->blk_alloc);
  EXPECT_EQ(st.block_bytes.freed, sh->blk_freed);
  EXPECT_EQ(st.pending_bytes, 0);
  EXPECT_EQ(st.cache_hits + st.cache_misses, sh->n_alloc);
  /* Peaks: never above the true peak; for bytes, at most peak_slack_bytes
   * below it. */
  if (st.requests.peak > sh->peak_count || st.blocks.peak > sh->peak_count) {
    print_error("ERROR: step %d: requests/blocks peak %" PRIu64 "/%" PRIu64
                " above the true peak %" PRIu64 "\n",
                step, st.requests.peak, st.blocks.peak, sh->peak_count);
    bad = 1;
  }
  if (st.requested_bytes.peak > sh->peak_req ||
      st.requested_bytes.peak + st.peak_slack_bytes < sh->peak_req) {
    print_error("ERROR: step %d: requested_bytes.peak %" PRIu64
                ", true peak %" PRIu64 ", slack %" PRIu64 "\n",
                step, st.requested_bytes.peak, sh->peak_req,
                st.peak_slack_bytes);
    bad = 1;
  }
  if (st.block_bytes.peak > sh->peak_blk ||
      st.block_bytes.peak + st.peak_slack_bytes < sh->peak_blk) {
    print_error("ERROR: step %d: block_bytes.peak %" PRIu64
                ", true peak %" PRIu64 ", slack %" PRIu64 "\n",
                step, st.block_bytes.peak, sh->peak_blk, st.peak_slack_bytes);
    bad = 1;
  }
  if (st.tcache_hits > st.cache_hits) {
    print_error("ERROR: step %d: tcache_hits > cache_hits\n", step);
    bad = 1;
  }
  if (sh->n_alloc > 0 && st.cache_misses < 1) {
    print_error("ERROR: step %d: no cache miss recorded\n", step);
    bad = 1;
  }
  /* Segments are carved from chunks: a large block is a segment of its
   * own, and each small class with a live block has at least one slab. The
   * chunks hold the segments (all but chunk_free_bytes of them), and the
   * segments hold the live blocks. */
  uint64_t nlarge = 0, nsmall_classes = 0;
  for (size_t i = 0; i < sh->nlive; i++) {
    size_t bs = sh->live[i].cls;
    if (bs > 256 * KiB) {
      nlarge++;
      continue;
    }
    size_t k = 0;
    while (k < i && sh->live[k].cls != bs)
      k++;
    nsmall_classes += k == i;
  }
  if (st.segments.current < nlarge + nsmall_classes) {
    print_error("ERROR: step %d: segments.current %" PRIu64 " < %" PRIu64
                " large blocks + %" PRIu64 " small classes live\n",
                step, st.segments.current, nlarge, nsmall_classes);
    bad = 1;
  }
  if (st.chunk_free_bytes > st.reserved_bytes.current ||
      st.reserved_bytes.current - st.chunk_free_bytes < sh->cur_blk) {
    print_error("ERROR: step %d: chunks of %" PRIu64 " bytes, %" PRIu64
                " free in them: no room for %" PRIu64 " bytes of live blocks\n",
                step, st.reserved_bytes.current, st.chunk_free_bytes,
                sh->cur_blk);
    bad = 1;
  }
  if (st.largest_free_extent > st.chunk_free_bytes ||
      (st.free_extents == 0) != (st.chunk_free_bytes == 0)) {
    print_error("ERROR: step %d: %" PRIu64 " free bytes in %" PRIu64
                " extents, the largest %" PRIu64 "\n",
                step, st.chunk_free_bytes, st.free_extents,
                st.largest_free_extent);
    bad = 1;
  }
  if (cb != NULL) {
    /* The backend's ranges are the chunks. One thread, no reserve, no
     * max_reserved: an allocation that grew the arena made exactly one
     * backend allocation, and the pool frees a chunk only when it releases
     * it (empty_cache, max_cached). */
    cb_counts_t c = cb_counts(cb);
    EXPECT_EQ(st.backend_alloc.count, c.calls);
    EXPECT_EQ(st.backend_free.count, c.nfree);
    EXPECT_EQ(st.reserved_bytes.current, c.live_bytes);
    EXPECT_EQ(st.reserved_bytes.allocated, c.bytes_alloc);
    EXPECT_EQ(st.reserved_bytes.freed, c.bytes_freed);
    EXPECT_EQ(st.arena_chunks, c.live_count);
    EXPECT_EQ(st.cache_misses, c.nalloc);
    EXPECT_EQ(st.trimmed_segments, c.nfree);
    for (size_t i = 0; i < sh->nlive; i++) {
      const struct live *l = &sh->live[i];
      cb_rec_t r = cb_find_live(cb, l->p);
      if (r.ptr == NULL ||
          (uintptr_t)l->p + l->cls > (uintptr_t)r.ptr + r.size) {
        print_error("ERROR: step %d: block %p (%zu bytes) is not inside a "
                    "chunk the backend has out (%p, %zu bytes)\n",
                    step, (void *)l->p, l->cls, r.ptr, r.size);
        bad = 1;
      }
    }
  }
#undef EXPECT_EQ
  if (bad)
    PP_FAIL("step %d: stats disagree with the shadow bookkeeping", step);
  PP_CHECK_CONSISTENT(pool);
  if (cb != NULL)
    PP_CHECK_CB_CLEAN(cb);
}

/* After empty_cache (from the only thread), every chunk still held by the
 * pool contains at least one live block (whole free chunks go back), and
 * every segment left holds one (a live block is in one segment). */
static void check_no_idle_chunk(pinpool_t *pool, const struct shadow *sh,
                                counting_backend_t *cb, int step) {
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.segments.current <= sh->nlive,
            "step %d: after empty_cache %" PRIu64
            " segments for %zu live blocks: an idle segment was kept",
            step, st.segments.current, sh->nlive);
  size_t n = 0;
  cb_rec_t *r = cb_records(cb, &n);
  for (size_t i = 0; i < n; i++) {
    if (r[i].free_seq != 0)
      continue;
    uintptr_t lo = (uintptr_t)r[i].ptr, hi = lo + r[i].size;
    int used = 0;
    for (size_t k = 0; k < sh->nlive && !used; k++) {
      uintptr_t a = (uintptr_t)sh->live[k].p;
      used = a >= lo && a < hi;
    }
    if (!used) {
      void *seg = r[i].ptr;
      size_t sz = r[i].size;
      free(r);
      PP_FAIL("step %d: after empty_cache the pool still holds an idle "
              "chunk %p (%zu bytes)",
              step, seg, sz);
    }
  }
  free(r);
}

static void run_workload(const char *conf, int use_cb, uint64_t seed,
                         int steps) {
  counting_backend_t cb;
  pinpool_t *pool = NULL;
  if (use_cb) {
    cb_init(&cb);
    pinpool_backend_t t = cb_table(&cb, 0);
    PP_OK(pinpool_create_with_backend(conf, &t, &pool));
  } else {
    PP_OK(pinpool_create(conf, &pool));
  }
  counting_backend_t *cbp = use_cb ? &cb : NULL;
  steps = steps_for(steps);
  struct shadow *sh = calloc(1, sizeof *sh);
  PP_ASSERT(sh != NULL, "calloc");
  uint64_t s = pp_seed(seed);
  uint64_t tags = 0;
  int empties = 0, resets = 0;
  int misaligned = 0;
  char first_misaligned[128] = "";
  check_step(pool, sh, cbp, -1);

  for (int step = 0; step < steps; step++) {
    uint64_t r = pp_rand(&s) % 1000;
    if (r < 3) {
      PP_OK(pinpool_empty_cache(pool));
      empties++;
      if (cbp)
        check_no_idle_chunk(pool, sh, cbp, step);
      if (sh->nlive == 0) {
        pinpool_stats_t st;
        PP_STATS(pool, &st);
        PP_ASSERT(st.reserved_bytes.current == 0 && st.segments.current == 0 &&
                      st.arena_chunks == 0,
                  "step %d: nothing live, after empty_cache reserved %" PRIu64
                  ", segments %" PRIu64 ", chunks %" PRIu64,
                  step, st.reserved_bytes.current, st.segments.current,
                  st.arena_chunks);
      }
    } else if (r < 8) {
      PP_OK(pinpool_reset_peak_stats(pool));
      resets++;
      sh->peak_count = sh->nlive;
      sh->peak_req = sh->cur_req;
      sh->peak_blk = sh->cur_blk;
      pinpool_stats_t st;
      PP_STATS(pool, &st);
#define PEAK_IS_CURRENT(f)                                                     \
  PP_ASSERT(st.f.peak == st.f.current,                                         \
            "step %d: after reset_peak_stats " #f ".peak %" PRIu64             \
            " != current %" PRIu64,                                            \
            step, st.f.peak, st.f.current);
      PEAK_IS_CURRENT(requests)
      PEAK_IS_CURRENT(requested_bytes)
      PEAK_IS_CURRENT(blocks)
      PEAK_IS_CURRENT(block_bytes)
      PEAK_IS_CURRENT(reserved_bytes)
      PEAK_IS_CURRENT(cached_bytes)
      PEAK_IS_CURRENT(segments)
#undef PEAK_IS_CURRENT
    } else if (r < 11) {
      PP_OK(pinpool_thread_flush(pool));
    } else if (sh->nlive == 0 ||
               (sh->nlive < MAXLIVE && pp_rand(&s) % 100 < 52)) {
      struct live *l = &sh->live[sh->nlive];
      l->size = pp_rand_size(&s, 1, 8 * MiB);
      l->cls = pp_ref_class(l->size);
      void *p = NULL;
      int rc = pinpool_alloc(pool, l->size, &p);
      if (rc != 0)
        PP_FAIL("step %d: alloc(%zu) = %d (%s): %s", step, l->size, rc,
                pp_code_name(rc), pinpool_last_error());
      l->p = p;
      l->tag = ++tags * UINT64_C(0x9E3779B97F4A7C15);
      size_t bs = 0;
      PP_OK(pinpool_block_size(pool, p, &bs));
      PP_ASSERT(pp_ref_block_ok(l->size, bs),
                "step %d: block_size %zu, want %zu", step, bs,
                pp_ref_block(l->size));
      l->cls = bs; /* what the pool accounts for this block */
      PP_ASSERT((uintptr_t)p % 64 == 0, "step %d: %p not 64-aligned", step, p);
      /* 4096 alignment for classes that are multiples of 4096 (header):
       * reported at the end so that the accounting checks still run. */
      if (l->cls % 4096 == 0 && (uintptr_t)p % 4096 != 0 && misaligned++ == 0)
        snprintf(first_misaligned, sizeof first_misaligned,
                 "step %d: %p of class %zu not 4096-aligned", step, p, l->cls);
      put_cookie(l);
      sh->nlive++;
      sh->n_alloc++;
      sh->req_alloc += l->size;
      sh->blk_alloc += l->cls;
      sh->cur_req += l->size;
      sh->cur_blk += l->cls;
      if (sh->nlive > sh->peak_count)
        sh->peak_count = sh->nlive;
      if (sh->cur_req > sh->peak_req)
        sh->peak_req = sh->cur_req;
      if (sh->cur_blk > sh->peak_blk)
        sh->peak_blk = sh->cur_blk;
    } else {
      size_t k = (size_t)(pp_rand(&s) % sh->nlive);
      struct live *l = &sh->live[k];
      PP_ASSERT(cookie_ok(l),
                "step %d: block %p (%zu bytes) was overwritten while live: "
                "overlapping blocks?",
                step, (void *)l->p, l->size);
      PP_OK(pinpool_free(pool, l->p));
      sh->n_free++;
      sh->req_freed += l->size;
      sh->blk_freed += l->cls;
      sh->cur_req -= l->size;
      sh->cur_blk -= l->cls;
      sh->live[k] = sh->live[--sh->nlive];
    }
    check_step(pool, sh, cbp, step);
  }
  PP_ASSERT(empties > 0 && resets > 0, "workload too short");

  /* Drain: everything back after empty_cache. */
  while (sh->nlive > 0) {
    struct live *l = &sh->live[sh->nlive - 1];
    PP_ASSERT(cookie_ok(l), "block %p overwritten", (void *)l->p);
    PP_OK(pinpool_free(pool, l->p));
    sh->n_free++;
    sh->req_freed += l->size;
    sh->blk_freed += l->cls;
    sh->cur_req -= l->size;
    sh->cur_blk -= l->cls;
    sh->nlive--;
  }
  check_step(pool, sh, cbp, steps);
  PP_OK(pinpool_empty_cache(pool));
  check_step(pool, sh, cbp, steps + 1);
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.reserved_bytes.current == 0 && st.cached_bytes.current == 0 &&
                st.segments.current == 0 && st.arena_chunks == 0 &&
                st.chunk_free_bytes == 0 && st.free_extents == 0,
            "[%s] after freeing all and empty_cache: reserved %" PRIu64
            ", cached %" PRIu64 ", segments %" PRIu64 ", chunks %" PRIu64
            ", %" PRIu64 " bytes free in chunks",
            conf, st.reserved_bytes.current, st.cached_bytes.current,
            st.segments.current, st.arena_chunks, st.chunk_free_bytes);
  PP_ASSERT(st.cache_hits > 0, "no cache hit in the whole workload");
  pinpool_destroy(pool);
  if (use_cb) {
    PP_CHECK_CB_BALANCED(&cb);
    cb_fini(&cb);
  }
  free(sh);
  PP_ASSERT(misaligned == 0,
            "[%s] %d blocks of class >= 4096 were not "
            "4096-aligned; first: %s",
            conf, misaligned, first_misaligned);
}

static void test_workload_default(void **state) {
  (void)state;
  run_workload("", 0, 1, STEPS(20000, 4000));
}

static void test_workload_counting_backend(void **state) {
  (void)state;
  run_workload("", 1, 2, STEPS(4000, 1200));
}

static void test_workload_capped_no_tcache(void **state) {
  (void)state;
  run_workload("tcache_bytes=0,max_cached=32MiB,shards=2", 1, 3,
               STEPS(4000, 1200));
}

static void test_workload_malloc_backend(void **state) {
  (void)state;
  run_workload("backend=malloc,shards=1,tcache_bytes=128KiB", 0, 4,
               STEPS(3000, 800));
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_workload_default),
      cmocka_unit_test(test_workload_counting_backend),
      cmocka_unit_test(test_workload_capped_no_tcache),
      cmocka_unit_test(test_workload_malloc_backend),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
