/*
 * Costs that stay flat as the pool grows (issue 38): the work of each
 * operation on a pool of N free extents, counted with the arena's meter
 * (pp_extents_t.work: tree nodes, extents, chunks, entries copied or
 * sorted, in src/extent.c), never timed. Each test builds the same
 * fragmentation at N = 1,000 and 10,000 free extents and asserts that the
 * count per operation grows at most logarithmically; the lock-hold test
 * builds 100,000 and counts the most elements any call visits in one hold
 * of seg_lock while a thread runs empty_cache, a snapshot and get_stats in
 * a loop and another allocates and frees.
 *
 * The fragmentation: 2N + 1 blocks of 260 KiB (each a segment of its own,
 * carved from the arena), every other one freed and its segment released
 * by pinpool_empty_cache: N free extents separated by blocks in use. The
 * backend reserves address space only (PROT_NONE, MAP_NORESERVE): the pool
 * never touches block memory (DESIGN.md, invariant 4), so 100,000 extents
 * take 52 GB of addresses and no memory.
 *
 * The mutants (tests/CMakeLists.txt, docs/verification.md) restore a walk
 * each: free_capped and empty_cache fail with EXT_CHUNK_WALK (the chunk
 * to release found by walking every free extent), snapshot_hold with
 * SNAPSHOT_ONE_HOLD (the snapshot's copy in one hold, not in pieces).
 */
#include "testutil.h"

#include "internal.h"
#include "snapshot.h"
#include "space_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BLOCK ((size_t)260 * 1024) /* above the slabs: a segment each */

/* ---- The meter ----------------------------------------------------------- */

typedef struct meter {
  uint64_t work, work_max, copy_max;
  size_t nfree, nchunks;
} meter_t;

/* The arena's meter summed over its nodes (maxima: the largest), read
 * under seg_lock; reset clears the maxima. */
static meter_t meter(pinpool_t *pool, bool reset) {
  meter_t m = {0, 0, 0, 0, 0};
  pp_mutex_lock(&pool->seg_lock);
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_extents_t *x = &pool->arena.node[n].ext;
    m.work += x->work;
    m.work_max = x->work_max > m.work_max ? x->work_max : m.work_max;
    m.copy_max = x->copy_max > m.copy_max ? x->copy_max : m.copy_max;
    m.nfree += x->nfree;
    m.nchunks += x->nchunks;
    if (reset)
      x->work_max = x->copy_max = 0;
  }
  pp_mutex_unlock(&pool->seg_lock);
  return m;
}

/* What a call may visit at N free extents and C chunks when it is
 * logarithmic in N: a few descents of a tree of N nodes (each at most
 * 1.44 log2 N deep) and the chunk table's upkeep. */
static uint64_t log_bound(size_t n, size_t chunks) {
  return (uint64_t)(8 * log2((double)n + 2)) + 2 * chunks + 32;
}

/* ---- The fragmentation --------------------------------------------------- */

typedef struct frag {
  pinpool_t *pool;
  void **live; /* the blocks kept: N + 1 */
  size_t nlive;
  uint64_t allocs_max; /* the most one allocation visited */
} frag_t;

static void frag_make(frag_t *f, size_t n, const char *conf) {
  PP_OK(pinpool_create_with_backend(conf, &pp_space_backend, &f->pool));
  size_t total = 2 * n + 1;
  void **all = malloc(total * sizeof *all);
  f->live = malloc((n + 1) * sizeof *f->live);
  PP_ASSERT(all != NULL && f->live != NULL, "out of memory");
  for (size_t i = 0; i < total; i++)
    PP_OK(pinpool_alloc(f->pool, BLOCK, &all[i]));
  /* Each one handed out may come back alone: the boundary table doubles
   * as they are (extent.c, room_for_one_more). */
  f->allocs_max = meter(f->pool, true).work_max;
  f->nlive = 0;
  for (size_t i = 0; i < total; i++) {
    if (i % 2 == 0)
      f->live[f->nlive++] = all[i];
    else
      PP_OK(pinpool_free(f->pool, all[i]));
  }
  free(all);
  PP_OK(pinpool_empty_cache(f->pool));
  meter_t m = meter(f->pool, true);
  PP_ASSERT(m.nfree >= n && m.nfree <= n + m.nchunks + 2,
            "%zu free extents for %zu islands (%zu chunks)", m.nfree, n,
            m.nchunks);
}

static void frag_free(frag_t *f) {
  for (size_t i = 0; i < f->nlive; i++)
    PP_OK(pinpool_free(f->pool, f->live[i]));
  free(f->live);
  pinpool_destroy(f->pool);
}

static const size_t scale_n[2] = {1000, 10000};

/* w[1] (at 10 N) at most logarithmically above w[0] (at N): within the
 * bound, and not twice w[0] plus a little. */
static void check_growth(const char *what, const uint64_t w[2],
                         const size_t chunks[2]) {
  printf("%s: %llu elements at %zu free extents, %llu at %zu\n", what,
         (unsigned long long)w[0], scale_n[0], (unsigned long long)w[1],
         scale_n[1]);
  for (int i = 0; i < 2; i++)
    PP_ASSERT(w[i] <= log_bound(scale_n[i], chunks[i]),
              "%s visited %llu elements at %zu free extents (%zu chunks): "
              "more than logarithmic (%llu)",
              what, (unsigned long long)w[i], scale_n[i], chunks[i],
              (unsigned long long)log_bound(scale_n[i], chunks[i]));
  PP_ASSERT(w[1] <= 2 * w[0] + 2 * (chunks[1] - chunks[0]) + 32,
            "%s: %llu elements at 10x the free extents, %llu before", what,
            (unsigned long long)w[1], (unsigned long long)w[0]);
}

/* Item 2: with max_cached, a free trims, and the trim looks for a whole
 * free chunk to release: none here, and finding that out walked every
 * free extent (616 us per free at 30,000). */
static void test_free_capped(void **state) {
  (void)state;
  uint64_t w[2];
  size_t c[2];
  for (int i = 0; i < 2; i++) {
    frag_t f;
    frag_make(&f, scale_n[i], "max_cached=1MiB,tcache_bytes=0");
    meter_t m0 = meter(f.pool, true);
    uint64_t most = 0;
    for (int k = 0; k < 16; k++) {
      void *p;
      PP_OK(pinpool_alloc(f.pool, BLOCK, &p));
      meter_t a = meter(f.pool, false);
      PP_OK(pinpool_free(f.pool, p));
      meter_t b = meter(f.pool, false);
      if (b.work - a.work > most)
        most = b.work - a.work;
    }
    meter_t m1 = meter(f.pool, false);
    PP_ASSERT(m1.work > m0.work, "the frees did no work: nothing measured");
    w[i] = most;
    c[i] = m1.nchunks;
    frag_free(&f);
  }
  check_growth("a free with max_cached", w, c);
}

/* Item 3: empty_cache releases every whole free chunk: 728 ms with 32 of
 * them and 100,000 extents (each release walked them all). Its work is
 * proportional to the chunks released, and each hold to one of them. */
static void test_empty_cache(void **state) {
  (void)state;
  enum { K = 8 };
  uint64_t w[2], hold[2];
  size_t c[2];
  for (int i = 0; i < 2; i++) {
    frag_t f;
    frag_make(&f, scale_n[i], "tcache_bytes=0");
    /* K chunks of their own (above the largest chunk the growth makes),
     * wholly free once their blocks are freed. */
    void *big[K];
    for (int k = 0; k < K; k++)
      PP_OK(pinpool_alloc(f.pool, (size_t)2 << 30, &big[k]));
    for (int k = 0; k < K; k++)
      PP_OK(pinpool_free(f.pool, big[k]));
    pinpool_stats_t st0, st1;
    PP_STATS(f.pool, &st0);
    meter_t a = meter(f.pool, true);
    PP_OK(pinpool_empty_cache(f.pool));
    meter_t b = meter(f.pool, false);
    PP_STATS(f.pool, &st1);
    PP_ASSERT(st1.arena_chunks + K <= st0.arena_chunks,
              "empty_cache released %llu chunks, %d were free",
              (unsigned long long)(st0.arena_chunks - st1.arena_chunks), K);
    w[i] = (b.work - a.work) / K; /* per chunk released */
    hold[i] = b.work_max;
    c[i] = a.nchunks;
    frag_free(&f);
  }
  check_growth("empty_cache, per chunk released", w, c);
  check_growth("empty_cache, the longest hold", hold, c);
}

/* What one hold of a snapshot's copy may visit at N free extents and C
 * chunks: a piece of PP_SNAP_PIECE segments, chunks and free extents,
 * copied in steps of PP_SNAP_STEP, each step's call finding its place
 * again (pp_ext_copy_some: at most 3 * budget + 6 log2(N + 2) +
 * log2(C + 2) + 2 a call). Logarithmic in N; a copy of everything in one
 * hold is N extents, N segments and C chunks. */
static uint64_t piece_bound(size_t n, size_t chunks) {
  return (uint64_t)3 * PP_SNAP_PIECE +
         (uint64_t)(PP_SNAP_PIECE / PP_SNAP_STEP + 1) *
             (uint64_t)(6 * log2((double)n + 2) + log2((double)chunks + 2) + 2);
}

/* Item 6: a snapshot copies the segments and the arena in pieces, each in
 * a hold of seg_lock of at most PP_SNAP_PIECE elements, the same at N and
 * 10 N (one hold copied them all: 38 ms at 100,000 free extents, and
 * sorted them too, before 33b76b4), and it copies them all. */
static void test_snapshot_hold(void **state) {
  (void)state;
  for (int i = 0; i < 2; i++) {
    frag_t f;
    frag_make(&f, scale_n[i], "tcache_bytes=0");
    meter_t a = meter(f.pool, true);
    char *text;
    size_t len;
    PP_OK(pinpool_snapshot_write_mem(f.pool, &text, &len,
                                     PINPOOL_SNAPSHOT_NO_HISTORY));
    meter_t b = meter(f.pool, false);
    printf("snapshot: %llu elements in a hold for %zu free extents and "
           "%zu chunks\n",
           (unsigned long long)b.copy_max, a.nfree, a.nchunks);
    uint64_t bound = piece_bound(a.nfree, a.nchunks);
    /* Not at least a piece: a piece also ends after PP_SNAP_PIECE_NS,
     * which a loaded machine or a sanitizer reaches sooner. */
    PP_ASSERT(b.copy_max > 0 && b.copy_max <= bound,
              "the snapshot's hold visited %llu elements for %zu free "
              "extents and %zu chunks: more than a piece (%llu)",
              (unsigned long long)b.copy_max, a.nfree, a.nchunks,
              (unsigned long long)bound);
    /* All of it copied: every free extent's bytes in the snapshot. */
    pinpool_stats_t st;
    PP_STATS(f.pool, &st);
    char want[64];
    snprintf(want, sizeof want, "\"chunk_free_bytes\":%llu,",
             (unsigned long long)st.chunk_free_bytes);
    const char *tot = strstr(text, "\"totals\":{");
    PP_ASSERT(tot != NULL && strstr(tot, want) != NULL,
              "the snapshot's totals lack %s", want);
    pinpool_snapshot_free(text);
    frag_free(&f);
  }
}

/* ---- The arena's remaining walks (issue 38, the outside review) -------- */

/* The most elements one hold of seg_lock visited since the last reset
 * (base.h, the locks' meter). */
static uint64_t seg_hold_max(pinpool_t *pool, bool reset) {
  return pp_lock_meter(&pool->seg_lock, reset);
}

/* Blocks on the deferred stack (pool.c), counted under seg_lock. */
static size_t deferred_count(pinpool_t *pool) {
  size_t n = 0;
  pp_mutex_lock(&pool->seg_lock);
  for (pp_segment_t *s = pp_load_acquire(&pool->deferred); s != NULL;
       s = pp_load_relaxed(&s->defer_next))
    n++;
  pp_mutex_unlock(&pool->seg_lock);
  return n;
}

/* At most logarithmic in n: a few descents and a constant. */
static uint64_t hold_bound(size_t n) {
  return (uint64_t)(8 * log2((double)n + 2)) + 64;
}

static void check_hold_growth(const char *what, const uint64_t w[2],
                              const size_t n[2]) {
  printf("%s: %llu elements in a hold at %zu, %llu at %zu\n", what,
         (unsigned long long)w[0], n[0], (unsigned long long)w[1], n[1]);
  for (int i = 0; i < 2; i++)
    PP_ASSERT(w[i] <= hold_bound(n[i]),
              "%s: one hold visited %llu elements at %zu: more than "
              "logarithmic (%llu)",
              what, (unsigned long long)w[i], n[i],
              (unsigned long long)hold_bound(n[i]));
  PP_ASSERT(w[1] <= 2 * w[0] + 32, "%s: %llu elements at 10x, %llu before",
            what, (unsigned long long)w[1], (unsigned long long)w[0]);
}

/* Review item 2: the deferred stack of freed large blocks was drained in
 * one hold of seg_lock, however long (one allocation released 2,000
 * segments in 677 us). N blocks in one reserve chunk, all freed (four to
 * the hot slots, the rest deferred), then a request that fits only once
 * half of them are back and coalesced: it must not grow the arena (the
 * decision to grow comes after every deferred block: issue 37, D4), and
 * no hold of seg_lock releases more than a piece. Mutant DEFER_ONE_HOLD
 * drains the stack in one hold. */
static void test_defer_hold(void **state) {
  (void)state;
  uint64_t w[2];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    n[i] = scale_n[i];
    char conf[96];
    snprintf(conf, sizeof conf, "tcache_bytes=0,reserve=%zu",
             (n[i] + 16) * BLOCK);
    pinpool_t *pool;
    PP_OK(pinpool_create_with_backend(conf, &pp_space_backend, &pool));
    void **all = malloc(n[i] * sizeof *all);
    PP_ASSERT(all != NULL, "out of memory");
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_alloc(pool, BLOCK, &all[k]));
    pinpool_stats_t st0, st1;
    PP_STATS(pool, &st0);
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_free(pool, all[k]));
    size_t deferred = deferred_count(pool);
    PP_ASSERT(deferred + 8 >= n[i], "%zu of %zu blocks deferred", deferred,
              n[i]);
    (void)seg_hold_max(pool, true);
    void *big;
    PP_OK(pinpool_alloc(pool, n[i] / 2 * BLOCK, &big));
    w[i] = seg_hold_max(pool, false);
    PP_STATS(pool, &st1);
    PP_ASSERT(st1.arena_chunks == st0.arena_chunks &&
                  st1.reserved_bytes.current == st0.reserved_bytes.current,
              "the arena grew (%llu -> %llu chunks) past %zu deferred "
              "blocks",
              (unsigned long long)st0.arena_chunks,
              (unsigned long long)st1.arena_chunks, deferred);
    PP_OK(pinpool_free(pool, big));
    PP_CHECK_CONSISTENT(pool);
    free(all);
    pinpool_destroy(pool);
  }
  check_hold_growth("the deferred stack's drain", w, n);
}

/* Review item 7: every empty_cache and every arena miss walked every bin
 * (PP_NCLASSES x shards x nodes: 2.2 ms for an empty_cache of an empty
 * pool at shards=64 and 8 nodes) for idle segments, and a growth's
 * deciding hold of seg_lock read every hot slot of every large class in
 * every shard. At shards=4 and 40 (ten times the bins), with a few idle
 * slabs and a block in a hot slot: one hold of trim_lock (empty_cache's
 * walk) and of seg_lock (a growing allocation's) visits the bins that
 * hold something, and the map's words, not every bin. Mutant
 * BINS_FULL_WALK walks them all. */
static void test_bins_walk(void **state) {
  (void)state;
  static const size_t small[3] = {512, 8192, 65536};
  uint64_t trim[2], seg[2];
  size_t bins[2];
  for (int i = 0; i < 2; i++) {
    unsigned shards = i == 0 ? 4 : 40;
    bins[i] = (size_t)PP_NCLASSES * shards;
    char conf[64];
    snprintf(conf, sizeof conf, "tcache_bytes=0,shards=%u", shards);
    pinpool_t *pool;
    PP_OK(pinpool_create_with_backend(conf, &pp_space_backend, &pool));
    void *p[3], *big;
    for (int k = 0; k < 3; k++)
      PP_OK(pinpool_alloc(pool, small[k], &p[k]));
    PP_OK(pinpool_alloc(pool, (size_t)512 << 20, &big));
    for (int k = 0; k < 3; k++)
      PP_OK(pinpool_free(pool, p[k])); /* idle slabs in three bins */
    PP_OK(pinpool_free(pool, big));    /* a hot slot */
    (void)pp_lock_meter(&pool->trim_lock, true);
    PP_OK(pinpool_empty_cache(pool));
    trim[i] = pp_lock_meter(&pool->trim_lock, true);
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.segments.current == 0 && st.arena_chunks == 0,
              "empty_cache left %llu segments, %llu chunks",
              (unsigned long long)st.segments.current,
              (unsigned long long)st.arena_chunks);
    /* A growing allocation, with a block in a hot slot again. */
    PP_OK(pinpool_alloc(pool, (size_t)512 << 20, &big));
    PP_OK(pinpool_free(pool, big));
    (void)seg_hold_max(pool, true);
    PP_OK(pinpool_alloc(pool, 300 << 10, &p[0]));
    seg[i] = seg_hold_max(pool, false);
    PP_OK(pinpool_free(pool, p[0]));
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
  }
  check_hold_growth("empty_cache's walk of the bins (trim_lock)", trim, bins);
  check_hold_growth("a growing allocation's look at the hot slots (seg_lock)",
                    seg, bins);
}

/* The release of idle memory took every idle segment of the pool off its
 * bin in one hold of trim_lock, which a trim on a free (max_cached) waits
 * for: N idle slabs in one bin (1,000 and 10,000 segments of 2 MiB), then
 * empty_cache. Each hold takes at most a piece, and all go. Mutant
 * BINS_FULL_WALK holds the lock for the whole walk. */
static void test_idle_pieces(void **state) {
  (void)state;
  const size_t bs = (size_t)256 << 10; /* the largest slab class: 8 a slab */
  uint64_t w[2];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    n[i] = scale_n[i];
    size_t nblocks = 8 * n[i];
    pinpool_t *pool;
    PP_OK(pinpool_create_with_backend("tcache_bytes=0,shards=1",
                                      &pp_space_backend, &pool));
    void **all = malloc(nblocks * sizeof *all);
    PP_ASSERT(all != NULL, "out of memory");
    for (size_t k = 0; k < nblocks; k++)
      PP_OK(pinpool_alloc(pool, bs, &all[k]));
    for (size_t k = 0; k < nblocks; k++)
      PP_OK(pinpool_free(pool, all[k]));
    free(all);
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.segments.current + 2 >= n[i], "%llu idle segments for %zu",
              (unsigned long long)st.segments.current, n[i]);
    (void)pp_lock_meter(&pool->trim_lock, true);
    PP_OK(pinpool_empty_cache(pool));
    w[i] = pp_lock_meter(&pool->trim_lock, false);
    PP_STATS(pool, &st);
    PP_ASSERT(st.segments.current == 0 && st.arena_chunks == 0,
              "empty_cache left %llu segments, %llu chunks",
              (unsigned long long)st.segments.current,
              (unsigned long long)st.arena_chunks);
    pinpool_destroy(pool);
  }
  check_hold_growth("empty_cache's release of idle slabs (trim_lock)", w, n);
}

/* Review item 3, the free path: with max_reserved near its cap every
 * chunk is just its request, so K blocks make K chunks side by side (the
 * host backend places them in one run), all whole once freed. Then an
 * alloc/free cycle beside them (alloc A and B from the run's low end,
 * free A, free B): B's give merges A's extent with the one holding the
 * K - 2 whole chunks, and repointed all of them to A's node, O(K) a
 * cycle (257 elements at 250 chunks). The arena's meter (one call, one
 * hold) at K = 25 and 250. Mutant EXT_REPOINT_RIGHT (the right node
 * always goes) must fail. */
static void test_chunks_cycle(void **state) {
  (void)state;
  uint64_t w[2];
  size_t n[2] = {25, 250};
  for (int i = 0; i < 2; i++) {
    pinpool_t *pool;
    PP_OK(pinpool_create("backend=host,populate=0,mlock=0,tcache_bytes=0,"
                         "max_reserved=1GiB,max_cached=1GiB",
                         &pool));
    void *big, **v = malloc(n[i] * sizeof *v);
    PP_ASSERT(v != NULL, "out of memory");
    PP_OK(pinpool_alloc(pool, (size_t)950 << 20, &big));
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_alloc(pool, BLOCK, &v[k]));
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.arena_chunks >= n[i], "%llu chunks for %zu blocks",
              (unsigned long long)st.arena_chunks, n[i]);
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_free(pool, v[k]));
    (void)meter(pool, true);
    for (int r = 0; r < 100; r++) {
      void *a, *b;
      PP_OK(pinpool_alloc(pool, BLOCK, &a));
      PP_OK(pinpool_alloc(pool, BLOCK, &b));
      PP_OK(pinpool_free(pool, a));
      PP_OK(pinpool_free(pool, b));
    }
    w[i] = meter(pool, false).work_max;
    PP_CHECK_CONSISTENT(pool);
    PP_OK(pinpool_free(pool, big));
    free(v);
    pinpool_destroy(pool);
  }
  check_hold_growth("an alloc/free cycle beside N whole chunks", w, n);
}

static int by_address(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (void *const *)a,
            y = (uintptr_t) * (void *const *)b;
  return x < y ? -1 : x > y;
}

/* Review item 3, the chunk table (fl38b's remaining walks): adding or
 * releasing a chunk shifted the sorted chunk array and rebuilt the run
 * starts, O(chunks) a hold, and a chunk cut out of the middle of an
 * extent repointed every whole chunk right of the cut to a new node.
 * K blocks make K chunks of one run (as chunks_cycle); the most one call
 * visited while empty_cache released them, freed so that each release
 * cuts a chunk with one whole chunk left of it and the rest of the run
 * right of it (the odd ones by address first, then the even ones: the
 * oldest goes first); then while K chunks grew again. At K = 100 and
 * 1,000. Mutant
 * EXT_CUT_LEFT (the cut keeps the left side's node) must fail. */
static void test_release_many(void **state) {
  (void)state;
  uint64_t grow[2], rel[2];
  size_t n[2] = {100, 1000};
  for (int i = 0; i < 2; i++) {
    /* The cap leaves room for the K blocks and is nearer than an eighth
     * of the arena (chunk_size's growth): each chunk is its request. */
    pinpool_t *pool;
    size_t bigsz = (size_t)2560 << 20;
    char conf[200];
    (void)snprintf(conf, sizeof conf,
                   "backend=host,populate=0,mlock=0,tcache_bytes=0,"
                   "max_reserved=%zuKiB,max_cached=4GiB",
                   (bigsz + n[i] * BLOCK) / 1024 + 1024);
    PP_OK(pinpool_create(conf, &pool));
    void *big, **v = malloc(n[i] * sizeof *v);
    PP_ASSERT(v != NULL, "out of memory");
    PP_OK(pinpool_alloc(pool, bigsz, &big));
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_alloc(pool, BLOCK, &v[k]));
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.arena_chunks >= n[i], "%llu chunks for %zu blocks",
              (unsigned long long)st.arena_chunks, n[i]);
    qsort(v, n[i], sizeof *v, by_address);
    for (size_t k = 1; k < n[i]; k += 2)
      PP_OK(pinpool_free(pool, v[k]));
    for (size_t k = 0; k < n[i]; k += 2)
      PP_OK(pinpool_free(pool, v[k]));
    PP_CHECK_CONSISTENT(pool);
    (void)meter(pool, true);
    PP_OK(pinpool_empty_cache(pool));
    rel[i] = meter(pool, false).work_max;
    PP_STATS(pool, &st);
    PP_ASSERT(st.arena_chunks <= 2, "%llu chunks left after empty_cache",
              (unsigned long long)st.arena_chunks);
    PP_CHECK_CONSISTENT(pool);
    /* Again, the boundary table now large enough (its doubling, one
     * O(N) hold, is table_doubling's): the holds that add the chunks. */
    (void)meter(pool, true);
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_alloc(pool, BLOCK, &v[k]));
    grow[i] = meter(pool, false).work_max;
    PP_STATS(pool, &st);
    PP_ASSERT(st.arena_chunks >= n[i], "%llu chunks for %zu blocks",
              (unsigned long long)st.arena_chunks, n[i]);
    for (size_t k = 0; k < n[i]; k++)
      PP_OK(pinpool_free(pool, v[k]));
    PP_CHECK_CONSISTENT(pool);
    PP_OK(pinpool_free(pool, big));
    free(v);
    pinpool_destroy(pool);
  }
  check_hold_growth("empty_cache's release of N chunks of one run", rel, n);
  check_hold_growth("a chunk added, growing to N chunks", grow, n);
}

/* The review's suspicion: the boundary table's rehash when it doubles
 * (src/extent.c, tab_reserve) visits every old slot in one hold. Counted
 * by the arena's meter: building the fragmentation at N and 10 N, the work
 * per operation stays flat (each doubling moves at most twice the keys
 * added since the last: amortized O(1) an extent), and the longest of the
 * 2N + 1 allocations (the table doubles as they are made: each block may
 * come back alone) is bounded: the doubling goes in pieces (issue 38
 * (s39); it was O(N) in one call). Mutant XTAB_ONE_HOLD: the whole table
 * in one call. */
static void test_table_doubling(void **state) {
  (void)state;
  uint64_t per_op[2], longest[2];
  size_t n[2];
  for (int i = 0; i < 2; i++) {
    n[i] = scale_n[i];
    frag_t f;
    frag_make(&f, n[i], "tcache_bytes=0");
    meter_t m = meter(f.pool, false);
    size_t ops = 3 * n[i] + 1; /* 2N + 1 allocations, N frees */
    per_op[i] = m.work / ops;
    longest[i] = f.allocs_max;
    pp_mutex_lock(&f.pool->seg_lock);
    size_t tcap = f.pool->arena.node[0].ext.tcap;
    pp_mutex_unlock(&f.pool->seg_lock);
    printf("the boundary table: %llu elements per operation at %zu free "
           "extents, %llu in all; its last doubling visited %zu slots in "
           "one call\n",
           (unsigned long long)per_op[i], n[i], (unsigned long long)m.work,
           tcap / 2);
    frag_free(&f);
  }
  PP_ASSERT(per_op[1] <= 2 * per_op[0] + 16,
            "work per operation %llu at %zu extents, %llu at %zu: the "
            "rehash is not amortized",
            (unsigned long long)per_op[1], n[1], (unsigned long long)per_op[0],
            n[0]);
  check_hold_growth("the allocations that double the boundary table", longest,
                    n);
}

/* ---- The lock-hold test -------------------------------------------------- */

typedef struct looper {
  pinpool_t *pool;
  int rounds;
} looper_t;

static void *loop_ops(void *arg) {
  looper_t *l = arg;
  for (int r = 0; r < l->rounds; r++) {
    pinpool_stats_t st;
    PP_OK(pinpool_empty_cache(l->pool));
    char *text;
    size_t len;
    PP_OK(pinpool_snapshot_write_mem(l->pool, &text, &len,
                                     PINPOOL_SNAPSHOT_NO_HISTORY));
    pinpool_snapshot_free(text);
    PP_OK(pinpool_get_stats(l->pool, &st));
  }
  return NULL;
}

/* N free extents (100,000; fewer under the sanitizers: PINPOOL_SCALE_N):
 * one thread runs empty_cache, a snapshot and get_stats in a loop, this
 * one allocates and frees blocks that carve, split, merge and release
 * chunks. The most elements any call visited in its hold: logarithmic,
 * but for the snapshot's copy, which is the extents and chunks once. */
static void test_lock_hold(void **state) {
  (void)state;
  const char *env = getenv("PINPOOL_SCALE_N");
  size_t n = env != NULL ? (size_t)strtoull(env, NULL, 10) : 100000;
  frag_t f;
  frag_make(&f, n, "tcache_bytes=0");
  meter_t a = meter(f.pool, true);
  looper_t l = {f.pool, 3};
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, loop_ops, &l) == 0, "thread");
  for (int r = 0; r < 200; r++) {
    void *p, *q, *big;
    PP_OK(pinpool_alloc(f.pool, BLOCK, &p));
    PP_OK(pinpool_alloc(f.pool, 3 * BLOCK, &q));
    PP_OK(pinpool_alloc(f.pool, (size_t)2 << 30, &big));
    PP_OK(pinpool_free(f.pool, p));
    PP_OK(pinpool_free(f.pool, big));
    PP_OK(pinpool_free(f.pool, q));
  }
  PP_ASSERT(pthread_join(t, NULL) == 0, "join");
  meter_t b = meter(f.pool, false);
  size_t chunks = a.nchunks > b.nchunks ? a.nchunks : b.nchunks;
  printf("lock hold at %zu free extents, %zu chunks: at most %llu elements "
         "in a call, %llu in a snapshot's copy\n",
         a.nfree, chunks, (unsigned long long)b.work_max,
         (unsigned long long)b.copy_max);
  PP_ASSERT(b.work_max <= log_bound(a.nfree, chunks + 1),
            "a hold of seg_lock visited %llu elements at %zu free extents",
            (unsigned long long)b.work_max, a.nfree);
  PP_ASSERT(b.copy_max > 0 && b.copy_max <= piece_bound(a.nfree, chunks),
            "a snapshot's hold visited %llu elements at %zu free extents: "
            "more than a piece (%llu)",
            (unsigned long long)b.copy_max, a.nfree,
            (unsigned long long)piece_bound(a.nfree, chunks));
  frag_free(&f);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(test_free_capped),
      cmocka_unit_test(test_empty_cache),
      cmocka_unit_test(test_snapshot_hold),
      cmocka_unit_test(test_lock_hold),
      cmocka_unit_test(test_defer_hold),
      cmocka_unit_test(test_bins_walk),
      cmocka_unit_test(test_idle_pieces),
      cmocka_unit_test(test_chunks_cycle),
      cmocka_unit_test(test_release_many),
      cmocka_unit_test(test_table_doubling),
  };
  return pp_run_selected("test_scale", all, sizeof all / sizeof all[0], argc,
                         argv);
}
