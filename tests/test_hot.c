/*
 * Hot slots (src/pool.c): a class above tcache_bytes has no thread cache;
 * the last blocks freed into each of its bins wait in atomic slots,
 * outside the bin's lists, for the next allocation. Whatever needs every
 * idle byte of the arena must see it there too: reuse, a request of
 * another size, releasing idle memory (pinpool_empty_cache, the
 * max_reserved retry), the validator and the stats. Each case below fails if
 * one of those paths forgets the slot; test_slot_used (white box) that the slot
 * is used at all, without which they would pass on the lists alone. (The
 * ordering that hands the memory over is what the race mutant HOT_RELAXED
 * shows: tests/mutants.)
 */
#include "testutil.h"

#include "internal.h" /* test_slot_used looks into the bins */

#include <inttypes.h>
#include <pthread.h>

/* Classes above 1 MiB bypass the thread caches: their frees fill slots. */
#define BASE "tcache_bytes=1MiB,shards=2"

static pinpool_t *make(const char *extra) {
  char conf[256];
  snprintf(conf, sizeof conf, "%s%s%s", BASE, extra[0] ? "," : "", extra);
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(conf, &pool));
  return pool;
}

/* A free on a thread that never allocated the class: it has no stack for
 * it (a free never opens one), so the block goes to the hot slot. A free
 * by the thread that allocated the class keeps one block in its oversize
 * stack instead (test_oversize_stack). */
typedef struct {
  pinpool_t *pool;
  void *p;
  int rc;
} freer_t;

static void *freer(void *arg) {
  freer_t *f = arg;
  f->rc = pinpool_free(f->pool, f->p);
  return NULL;
}

static void free_elsewhere(pinpool_t *pool, void *p) {
  freer_t f = {pool, p, -1};
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, freer, &f) == 0, "pthread_create");
  pthread_join(t, NULL);
  PP_OK(f.rc);
}

/* A freed block waits in the slot: counted as cached, valid, and the next
 * allocation of its class gets it back with no new segment. A second free
 * waits in a second slot (a consumer frees a producer's blocks a few at a
 * time): both are reused whole, no segment carved again (with one slot per
 * bin the first went back to the arena and was carved anew). */
static void test_reuse(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 4 * MiB);
  free_elsewhere(pool, a);
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.cached_bytes.current == 4 * MiB && s.segments.current == 1,
            "cached %" PRIu64, s.cached_bytes.current);
  PP_CHECK_CONSISTENT(pool); /* the validator counts the slot */
  void *b = pp_alloc_touch(pool, 4 * MiB);
  PP_ASSERT(b == a, "the slot's block: %p, got %p", a, b);
  void *c = pp_alloc_touch(pool, 4 * MiB);
  free_elsewhere(pool, b);
  free_elsewhere(pool, c); /* a second slot */
  PP_CHECK_CONSISTENT(pool);
  uint64_t made = pp_stats_of(pool).segments.allocated;
  void *d = pp_alloc_touch(pool, 4 * MiB);
  void *e = pp_alloc_touch(pool, 4 * MiB);
  PP_ASSERT(d == c && e == b, "the one freed last first: %p %p", d, e);
  s = pp_stats_of(pool);
  PP_ASSERT(s.segments.allocated == made,
            "%" PRIu64 " segments carved again from blocks freed whole",
            s.segments.allocated - made);
  PP_ASSERT(s.segments.current == 2 && s.cache_misses == 2,
            "segments %" PRIu64 " misses %" PRIu64, s.segments.current,
            s.cache_misses);
  PP_OK(pinpool_free(pool, d));
  PP_OK(pinpool_free(pool, e));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A large block freed on a stream goes to the hot slot when its event
 * completes, as a plain free does: the next allocation of its size gets
 * it whole, no segment carved again, for each of the blocks in flight
 * (W4; the reclaim sent them to the arena, and every allocation carved
 * again under seg_lock). */
static void test_stream_reclaim(void **state) {
  (void)state;
  pinpool_t *pool = make("events=simulated,sim_delay_us=0");
  void *p[3];
  for (int i = 0; i < 3; i++)
    p[i] = pp_alloc_touch(pool, 4 * MiB);
  for (int i = 0; i < 3; i++) {
    PP_OK(pinpool_sim_submit(pool, 1, 1000, NULL, NULL));
    PP_OK(pinpool_record_stream(pool, p[i], 1));
    PP_OK(pinpool_free(pool, p[i]));
  }
  PP_OK(pinpool_synchronize(pool)); /* every event done, every block back */
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.cached_bytes.current == 12 * MiB && s.segments.current == 3,
            "cached %" PRIu64 " segments %" PRIu64, s.cached_bytes.current,
            s.segments.current);
  PP_CHECK_CONSISTENT(pool); /* the validator counts the slots */
  uint64_t made = s.segments.allocated, freed = s.segments.freed;
  void *q[3];
  for (int i = 0; i < 3; i++) {
    q[i] = pp_alloc_touch(pool, 4 * MiB);
    PP_ASSERT(q[i] == p[0] || q[i] == p[1] || q[i] == p[2],
              "block %d: %p is none of the freed ones", i, q[i]);
  }
  s = pp_stats_of(pool);
  PP_ASSERT(s.segments.allocated == made && s.segments.freed == freed,
            "%" PRIu64 " segments carved again, %" PRIu64 " given back to "
            "the arena: the completed blocks missed the slots",
            s.segments.allocated - made, s.segments.freed - freed);
  for (int i = 0; i < 3; i++)
    PP_OK(pinpool_free(pool, q[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* pinpool_empty_cache gives a slot's segment back too. */
static void test_empty_cache(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 4 * MiB);
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.reserved_bytes.current == 0 && s.segments.current == 0,
            "reserved %" PRIu64 " segments %" PRIu64, s.reserved_bytes.current,
            s.segments.current);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* max_reserved: the retry releases idle memory, the slot's included. */
static void test_max_reserved(void **state) {
  (void)state;
  pinpool_t *pool = make("max_reserved=8MiB");
  void *a = pp_alloc_touch(pool, 4 * MiB);
  PP_OK(pinpool_free(pool, a));
  void *b = pp_alloc_touch(pool, 6 * MiB); /* 4 + 6 > 8: only after release */
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.retries == 1 && s.reserved_bytes.current == 6 * MiB,
            "retries %" PRIu64 " reserved %" PRIu64, s.retries,
            s.reserved_bytes.current);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A slot's block of another size of the class goes back to the arena,
 * and the request is carved from its space: no new chunk, exactly the
 * requested pages. */
static void test_other_size(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 5 * MiB);
  PP_OK(pinpool_free(pool, a));
  uint64_t calls = pp_stats_of(pool).backend_alloc.count;
  void *b = pp_alloc_touch(pool, 4 * MiB + 516 * KiB); /* the same class */
  pinpool_stats_t s = pp_stats_of(pool);
  size_t bs = 0;
  PP_OK(pinpool_block_size(pool, b, &bs));
  PP_ASSERT(b == a && bs == 4 * MiB + 516 * KiB && s.segments.current == 1 &&
                s.backend_alloc.count == calls,
            "block %p (a %p) of %zu, segments %" PRIu64, b, a, bs,
            s.segments.current);
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A smaller class is carved from a slot's block's space too. */
static void test_split_in_arena(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 8 * MiB);
  PP_OK(pinpool_free(pool, a));
  uint64_t calls = pp_stats_of(pool).backend_alloc.count;
  void *b = pp_alloc_touch(pool, 1 * MiB);
  void *c = pp_alloc_touch(pool, 3 * MiB);
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.reserved_bytes.current == 8 * MiB && b == a &&
                (char *)c == (char *)a + 1 * MiB &&
                s.backend_alloc.count == calls && s.free_extents == 1 &&
                s.chunk_free_bytes == 4 * MiB &&
                s.largest_free_extent == 4 * MiB,
            "reserved %" PRIu64 " b %p c %p (a %p) extents %" PRIu64,
            s.reserved_bytes.current, b, c, a, s.free_extents);
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, c));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* With a cap, idle segments must be where trimming finds them: no slots
 * (the freed block's segment is trimmed at once with max_cached=0). */
static void test_capped(void **state) {
  (void)state;
  pinpool_t *pool = make("max_cached=1");
  void *a = pp_alloc_touch(pool, 4 * MiB);
  PP_OK(pinpool_free(pool, a));
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.segments.current == 0 && s.trimmed_segments == 1,
            "segments %" PRIu64, s.segments.current);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* The slots of the class that hold a segment, and whether any bin of
 * the class lists an idle one. */
static unsigned slots_held(pinpool_t *pool, size_t size, void **seen,
                           bool *listed) {
  unsigned cls = pp_class_index(size), n = 0;
  *listed = false;
  for (unsigned i = 0; i < pool->cfg.shards; i++) {
    pp_bin_t *bin = pp_bin(pool, cls, i);
    for (unsigned k = 0; k < PP_HOT_SLOTS; k++) {
      pp_segment_t *s = pp_load_acquire(&bin->hot[k]);
      if (s != NULL) {
        *seen = (void *)pp_load_relaxed(&s->base);
        n++;
      }
    }
    pp_mutex_lock(&bin->lock);
    *listed |= bin->idle != NULL;
    pp_mutex_unlock(&bin->lock);
  }
  return n;
}

/* White box: a freed block of a class above tcache_bytes sits in its
 * bin's slot, not in the lists, and the next allocation empties the slot
 * (every other case here would pass with the slots never used). */
static void test_slot_used(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 4 * MiB), *seen = NULL;
  free_elsewhere(pool, a);
  bool listed = true;
  PP_ASSERT(slots_held(pool, 4 * MiB, &seen, &listed) == 1 && seen == a &&
                !listed,
            "after the free: slot %p, listed %d", seen, (int)listed);
  void *b = pp_alloc_touch(pool, 4 * MiB);
  PP_ASSERT(b == a && slots_held(pool, 4 * MiB, &seen, &listed) == 0 && !listed,
            "after the allocation: %p, listed %d", b, (int)listed);
  PP_OK(pinpool_free(pool, b));
  pinpool_destroy(pool);
}

/* The per-class mark (pool.c, hot_mark) is a hint: a take skips a class
 * whose mark is clear, and a drain looks at every slot anyway. A race of a
 * put with a drain can leave a block under a cleared mark; here the mark
 * is cleared by hand. The allocation then carves elsewhere (it fails if
 * takes ignored the mark), and pinpool_empty_cache still gives the hidden
 * block back (it fails if the drain trusted the mark). */
static void test_unmarked_slot(void **state) {
  (void)state;
  pinpool_t *pool = make("reserve=16MiB");
  void *a = pp_alloc_touch(pool, 4 * MiB), *seen = NULL;
  free_elsewhere(pool, a);
  bool listed = true;
  PP_ASSERT(slots_held(pool, 4 * MiB, &seen, &listed) == 1 && seen == a,
            "after the free: slot %p", seen);
  pp_store_relaxed(&pool->hot_used[pp_class_index(4 * MiB)], 0);
  void *b = pp_alloc_touch(pool, 4 * MiB);
  PP_ASSERT(b != a, "the take used a slot its class's mark does not show");
  PP_OK(pinpool_free(pool, b));
  pp_store_relaxed(&pool->hot_used[pp_class_index(4 * MiB)], 0);
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.segments.current == 0 && s.chunk_free_bytes == 16 * MiB,
            "after empty_cache: %" PRIu64 " segments, %" PRIu64
            " bytes free in the reserve",
            s.segments.current, s.chunk_free_bytes);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* Peaks and the pairing (alloc.c, stats.c): an allocation that takes the
 * slot's block skips the peak sample only when its request is no larger
 * than the one the block was freed with and no sample came between. The
 * slack here is 1 thread x 2 x tcache_bytes = 2 MiB; each case misses by
 * more than that when its condition is left out. */
static uint64_t peak_req(pinpool_t *pool) {
  return pp_stats_of(pool).requested_bytes.peak;
}

/* A larger request of the same block (32 MiB + 4 KiB: the page-rounded
 * size) after a free of a smaller one (32 MiB + 1): the same block, a
 * higher requested peak. Without thread caches the slack is 0, so the
 * 4095 bytes must be seen. */
static void test_peak_larger_request(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("tcache_bytes=0,shards=2", &pool));
  void *a = pp_alloc_touch(pool, 32 * MiB + 1);
  PP_OK(pinpool_free(pool, a));
  void *b = pp_alloc_touch(pool, 32 * MiB + 4096);
  PP_ASSERT(b == a, "the slot's block (same size): %p, got %p", a, b);
  PP_OK(pinpool_free(pool, b));
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.peak_slack_bytes == 0 &&
                s.requested_bytes.peak >= 32 * MiB + 4096,
            "requested peak %" PRIu64 " slack %" PRIu64, s.requested_bytes.peak,
            s.peak_slack_bytes);
  pinpool_destroy(pool);
}

/* A sample between the free and the allocation (here: the miss of another
 * class) counted the slot's block as free: taking it must sample again,
 * or 32 MiB of the 96 MiB peak go unseen. */
static void test_peak_sample_between(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 32 * MiB);
  PP_OK(pinpool_free(pool, a));
  void *c = pp_alloc_touch(pool, 64 * MiB); /* a miss: samples */
  void *b = pp_alloc_touch(pool, 32 * MiB);
  PP_ASSERT(b == a, "the slot's block: %p, got %p", a, b);
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, c));
  pinpool_stats_t s = pp_stats_of(pool); /* samples: not before this */
  PP_ASSERT(s.segments.current == 2, "segments %" PRIu64, s.segments.current);
  PP_ASSERT(s.block_bytes.peak + s.peak_slack_bytes >= 96 * MiB &&
                s.requests.peak == 2,
            "block peak %" PRIu64 " requests peak %" PRIu64, s.block_bytes.peak,
            s.requests.peak);
  pinpool_destroy(pool);
}

/* White box: a paired allocation does not sample (the epoch stays), an
 * unpaired one does; the peaks stay exact for the pattern (W1, W3). */
static void test_peak_paired(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 32 * MiB);
  PP_OK(pinpool_free(pool, a));
  uint64_t e0 = pp_load_relaxed(&pool->gs.peak_epoch);
  for (int i = 0; i < 100; i++) {
    void *b = NULL;
    PP_OK(pinpool_alloc(pool, 32 * MiB, &b));
    PP_OK(pinpool_free(pool, b));
  }
  uint64_t e1 = pp_load_relaxed(&pool->gs.peak_epoch);
  PP_ASSERT(e1 == e0,
            "paired allocations sampled: epoch %" PRIu64 " -> %" PRIu64, e0,
            e1);
  /* Smaller (the same page-rounded block), paired; then larger than that
   * free: samples. */
  void *b = NULL;
  PP_OK(pinpool_alloc(pool, 32 * MiB - 4095, &b));
  PP_OK(pinpool_free(pool, b));
  PP_ASSERT(pp_load_relaxed(&pool->gs.peak_epoch) == e0, "smaller: sampled");
  PP_OK(pinpool_alloc(pool, 32 * MiB, &b));
  PP_ASSERT(pp_load_relaxed(&pool->gs.peak_epoch) == e0 + 1,
            "larger: not sampled");
  PP_OK(pinpool_free(pool, b));
  PP_ASSERT(peak_req(pool) == 32 * MiB, "requested peak %" PRIu64,
            peak_req(pool));
  pinpool_destroy(pool);
}

/* White box, oversize stacks (alloc.c): the thread that allocates a class
 * above tcache_bytes keeps the one block it frees (its cache was within
 * its budget), without the slot; a second block freed while it keeps one
 * goes to the slot; a free of any other block gives the kept one back, and
 * so does the thread's next take from the central layer (a miss, a carve).
 * Counted as cached throughout. W1's 1 GiB pair relies on the first; the
 * memory bound (one block a thread, while its cache is otherwise within
 * budget) on the others. */
static void test_oversize_stack(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 4 * MiB), *b = pp_alloc_touch(pool, 4 * MiB);
  pp_tcache_t *tc = pp_tls_way(pool->id)->tc;
  pp_tbin_t *stack = &tc->bins[pp_class_index(4 * MiB)];
  void *seen = NULL;
  bool listed = true;
  PP_ASSERT(stack->over && stack->cap == 1, "no oversize stack");
  PP_OK(pinpool_free(pool, a));
  PP_ASSERT(stack->n == 1 && slots_held(pool, 4 * MiB, &seen, &listed) == 0,
            "the first free: kept %u, %u in slots", stack->n,
            slots_held(pool, 4 * MiB, &seen, &listed));
  PP_ASSERT(pp_stats_of(pool).cached_bytes.current == 4 * MiB, "cached");
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_free(pool, b)); /* the cache is over its budget: the slot */
  PP_ASSERT(stack->n == 1 && slots_held(pool, 4 * MiB, &seen, &listed) == 1 &&
                seen == b,
            "the second free: kept %u, slot %p (b %p)", stack->n, seen, b);
  PP_ASSERT(pp_stats_of(pool).cached_bytes.current == 8 * MiB, "cached");
  PP_CHECK_CONSISTENT(pool);
  void *c = pp_alloc_touch(pool, 4 * MiB);
  PP_ASSERT(c == a && stack->n == 0, "the kept block first: %p (a %p)", c, a);
  PP_OK(pinpool_free(pool, c));
  void *small = pp_alloc_touch(pool, 64 * KiB);
  PP_OK(pinpool_free(pool, small)); /* over the budget: the largest goes */
  PP_ASSERT(stack->n == 0, "kept after another free");
  PP_CHECK_CONSISTENT(pool);
  void *d = pp_alloc_touch(pool, 4 * MiB);
  PP_OK(pinpool_free(pool, d));
  PP_ASSERT(stack->n == 1, "not kept again");
  void *e = pp_alloc_touch(pool, 2 * MiB); /* another class: a central take */
  PP_ASSERT(stack->n == 0, "kept across a take from the arena");
  PP_OK(pinpool_free(pool, e));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* Another thread takes what this one freed (the slot is the pool's, not
 * a thread's). */
typedef struct {
  pinpool_t *pool;
  void *got;
} peer_t;

static void *peer(void *arg) {
  peer_t *p = arg;
  p->got = pp_alloc_touch(p->pool, 4 * MiB);
  return NULL;
}

static void test_other_thread(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a = pp_alloc_touch(pool, 4 * MiB);
  free_elsewhere(pool, a);
  peer_t p = {pool, NULL};
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, peer, &p) == 0, "pthread_create");
  pthread_join(t, NULL);
  PP_ASSERT(p.got == a && pp_stats_of(pool).segments.current == 1, "got %p",
            p.got);
  PP_OK(pinpool_free(pool, p.got));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slot_used),
      cmocka_unit_test(test_unmarked_slot),
      cmocka_unit_test(test_oversize_stack),
      cmocka_unit_test(test_reuse),
      cmocka_unit_test(test_stream_reclaim),
      cmocka_unit_test(test_empty_cache),
      cmocka_unit_test(test_max_reserved),
      cmocka_unit_test(test_other_size),
      cmocka_unit_test(test_split_in_arena),
      cmocka_unit_test(test_capped),
      cmocka_unit_test(test_other_thread),
      cmocka_unit_test(test_peak_larger_request),
      cmocka_unit_test(test_peak_sample_between),
      cmocka_unit_test(test_peak_paired),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
