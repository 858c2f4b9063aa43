/*
 * pinpool_alloc and pinpool_free: the hot paths.
 *
 * Alloc hit: a pop from the calling thread's cache and one release store
 * of the block's state word. No lock, no read-modify-write.
 *
 * Free: a lock-free segment lookup, then ONE compare-and-swap on the
 * block's own state word (ALLOCATED -> CACHED), then a push on the calling
 * thread's cache. The CAS is the one read-modify-write we keep on purpose:
 * it is what makes two threads freeing the same pointer at once see one
 * success and one PINPOOL_EDOUBLEFREE, instead of both caching the block
 * and later handing it out twice (invariant 5). tests/test_doublefree_race
 * fails when it is replaced by a load and a store.
 */
#include "internal.h"

#include <stdlib.h>

static inline pp_tcache_t *tcache_get(pinpool_t *pool, int *err) {
  pp_tls_way_t *w = pp_tls_way(pool->id);
  if (pp_likely(w->pool_id == pool->id))
    return w->tc;
  return pp_tcache_get_slow(pool, err);
}

/* First use of a class in this thread: size its stack so that one class
 * holds at most an eighth of tcache_bytes (and 64 blocks); a stack of one
 * block (a class above tcache_bytes / 16) is opened only by an allocation
 * and refilled from the hot slot first (alloc_slow, free_push_slow).
 *
 * Oversize stacks. A class above tcache_bytes gets a stack of one block
 * too (in a pool without a cap), but a free keeps the block there only if
 * the cache was within its budget before it: the cache goes over its
 * budget by at most that one block, and the next free of any other block
 * finds it over and gives the largest class back first, this one. So a
 * thread that allocates and frees one huge block in a loop (W1's 1 GiB
 * pair) keeps it, with no read-modify-write but the free's claim; with the
 * hot slot alone the pair cost three (the claim and both exchanges):
 * 44-56 ns against 16 ns at 64 MiB. Any other free, or a free into a
 * cache over budget, sends such blocks to the hot slot as before, where
 * other threads can take them. What a thread may hide from the others is
 * bounded: one block, while its cache is otherwise within budget. Pools
 * with a cap do not do it: bytes in thread caches are not trimmed. */
static uint64_t tbin_cap(size_t bs, uint64_t tb) {
  uint64_t cap = tb / (8 * (uint64_t)bs);
  return cap < 1 ? 1 : cap > 64 ? 64 : cap;
}

/* tbin_cap(bs, tb) == 1, for a free's slow path: without the division,
 * and without 16 * bs, which can wrap (tb < 16 * bs). */
static inline bool tbin_one(size_t bs, uint64_t tb) { return tb / 16 < bs; }

static bool tbin_alloc(pp_tcache_t *tc, pp_tbin_t *b, size_t bs, uint64_t tb) {
  uint64_t cap = tbin_cap(bs, tb);
  pp_assert((cap == 1) == tbin_one(bs, tb));
  b->items = malloc(cap * sizeof b->items[0]);
  if (b->items == NULL)
    return false;
  b->cap = (uint32_t)cap;
  b->over = bs > tb;
  b->bs = bs;
  b->batch = (uint32_t)(cap + 1) / 2;
  /* Keep tc->used sorted, largest class first. */
  uint16_t cls = (uint16_t)(b - tc->bins);
  unsigned i = tc->nused++;
  for (; i > 0 && tc->used[i - 1] < cls; i--)
    tc->used[i] = tc->used[i - 1];
  tc->used[i] = cls;
  return true;
}

/* Inline: a class above tcache_bytes in a pool with a cap asks at every
 * slow call, and the answer is two compares. */
static inline bool tbin_init(pinpool_t *pool, pp_tcache_t *tc, pp_tbin_t *b,
                             size_t bs) {
  uint64_t tb = pool->cfg.tcache_bytes;
  return tb != 0 && (bs <= tb || !pp_trims(pool)) && tbin_alloc(tc, b, bs, tb);
}

static inline __attribute__((always_inline)) void
account_alloc(pp_tcache_t *tc, size_t req, size_t bs) {
  pp_owner_add(&tc->c.n_alloc, 1);
  pp_owner_add(&tc->c.req_alloc, req);
  pp_owner_add(&tc->c.blk_alloc, bs);
}

/* A slow allocation's own counts (slow_allocs, and the pool's misses if
 * it missed), made before account_alloc counts it in n_alloc, with a
 * release fence between: a stats sum that sees an allocation in n_alloc
 * (and then fences) also sees these, so cache_hits (n_alloc - misses) and
 * tcache_hits (n_alloc - slow_allocs) are never more than the truth; the
 * other order counted an allocation between its two counts as a hit, a
 * miss a moment later, and cache_hits went backwards (issue 38, fourth
 * review). stats.c keeps them from going backwards. Only once the
 * allocation can no longer fail: a failed one counts nowhere. */
static inline void count_slow(pinpool_t *pool, pp_tcache_t *tc, bool missed) {
  pp_owner_add(&tc->c.slow_allocs, 1);
  if (missed)
    pp_fetch_add_relaxed(&pool->gs.misses, 1);
  atomic_thread_fence(memory_order_release);
  /* The window where a reader sees the miss without its allocation:
   * test_tcache stats_hits_window stops here (a miss is not the hot path). */
  if (missed)
    pp_hook(PP_HOOK_MISS_COUNTED);
}

static inline __attribute__((always_inline)) void
account_free(pp_tcache_t *tc, size_t req, size_t bs) {
  pp_owner_add(&tc->c.n_free, 1);
  pp_owner_add(&tc->c.req_free, req);
  pp_owner_add(&tc->c.blk_free, bs);
}

/* tc NULL: a nested call (below), which touches no thread cache. */
static int take_with_retry(pinpool_t *pool, pp_tcache_t *tc, unsigned cls,
                           size_t bs, pp_tentry_t *out, uint32_t want,
                           bool *missed, bool *polled, const void *ra) {
  /* Bounded reclaim of completed stream-ordered frees (a few queues in
   * turn, stream.c) before the bins are searched: cheap (one load) when
   * nothing is pending. A block this thread keeps in an oversize stack
   * goes back first: the take may carve from its space rather than grow
   * the arena, and the thread hides at most one such block from itself as
   * from the others. What the poll made idle counts under max_cached as a
   * free's would: *polled asks the caller for the trim (rv39c D3: 16
   * completed frees of 4 MiB stayed cached under a 1 MiB cap). */
  *polled = pp_process_miss(pool);
  if (tc != NULL)
    pp_tcache_flush_over(tc);
  /* The retry and numa_spill: a call that succeeds through them leaves no
   * trace of the refusal it recovered from (the thread's last error is put
   * back: issue 37, third review, item 10). */
  bool spill = pool->cfg.numa_spill && pool->nnodes > 1;
  unsigned node = tc != NULL ? tc->node : pp_numa_current(pool);
  unsigned shard = tc != NULL ? tc->shard : 0;
  unsigned vshard = node * pool->cfg.shards + shard;
  char before[256];
  pp_error_save(before, sizeof before);
  pp_arena_miss_clear();
  int n = pp_central_take(pool, cls, bs, vshard, out, want, missed);
  if (n == PINPOOL_ENOMEM) {
    /* max_reserved reached (or the backend is out): give back what is
     * idle, ours included, and retry exactly once; whole free chunks only
     * as many as the failed growth lacks under the cap, none if even all
     * of them could not make it fit, after the chunks whose claim is in
     * flight have settled (arena.c, "The out-of-memory retry"). */
    if (tc != NULL)
      pp_tcache_flush_all(tc);
    (void)pp_release_idle(pool);
    uint64_t budget = 0;
    if (pp_arena_retry_plan(pool, &budget)) {
      /* The plan's hold is over: a release or a trim may come before this
       * one (test_arena release_windows, RETRY_PLANNED). */
      pp_hook(PP_HOOK_RETRY_PLANNED);
      pp_fetch_add_relaxed(&pool->gs.retries, 1);
      if (budget != 0)
        pp_fetch_add_relaxed(&pool->gs.trimmed, pp_arena_release(pool, budget));
      pp_hook(PP_HOOK_OOM_RETRY);
      n = pp_central_take(pool, cls, bs, vshard, out, want, missed);
    }
    if (n > 0)
      pp_error_restore(before);
  }
  if (n == PINPOOL_ENOMEM && spill) {
    /* numa_spill=1 and this thread's node is out of memory: one block of
     * the next node that has one, handed straight out (want 1: the caller
     * then keeps none in the thread cache, which holds only its node's
     * blocks). Its free sends it home (free_push_slow). */
    char why[256];
    pp_error_save(why, sizeof why);
    for (unsigned k = 1; k < pool->nnodes && n == PINPOOL_ENOMEM; k++) {
      unsigned other = (node + k) % pool->nnodes;
      n = pp_central_take(pool, cls, bs, other * pool->cfg.shards + shard, out,
                          1, missed);
    }
    if (n > 0) {
      pp_fetch_add_relaxed(&pool->gs.numa_spill_blocks, 1);
      pp_fetch_add_relaxed(&pool->gs.numa_spill_bytes, out[0].bs);
      pp_error_restore(before);
    } else if (n == PINPOOL_ENOMEM) {
      pp_error_restore(why); /* the own node's refusal says more */
    }
  }
  if (n == PINPOOL_ENOMEM) {
    pp_fetch_add_relaxed(&pool->gs.oom, 1);
    pp_hist_event(pool, PP_H_OOM, 0, bs, 0, 0, ra);
  }
  return n;
}

/* A block of bs bytes, above max_reserved: it never fits, whatever is
 * released, so it fails before anything moves (a function that fails
 * changes nothing; the retry emptied the cache, issue 37 D6). Counted
 * and recorded as any allocation that runs out of memory. */
__attribute__((noinline)) static int above_cap(pinpool_t *pool, size_t bs,
                                               const void *ra) {
  pp_fetch_add_relaxed(&pool->gs.oom, 1);
  pp_hist_event(pool, PP_H_OOM, 0, bs, 0, 0, ra);
  return pp_fail(PINPOOL_ENOMEM,
                 "max_reserved (%llu bytes) is below the block of %zu "
                 "bytes: nothing released could make it fit",
                 (unsigned long long)pool->cfg.max_reserved, bs);
}

/* The size of the block a request of `size` bytes (class cls) gets: its
 * class's up to PP_SLAB_MAX_BLOCK, the request rounded up to a page above
 * (large blocks are carved from the arena at that size: less than a page
 * of waste per block). */
static inline size_t block_bytes(unsigned cls, size_t size) {
  return size > PP_SLAB_MAX_BLOCK
             ? (size + PP_PAGE - 1) & ~(size_t)(PP_PAGE - 1)
             : pp_class_size(cls);
}

/* The top block of stack b fits a request of `size` bytes: any block of a
 * slab class does; a large block only if it is the request rounded up to a
 * page (a block size is a page multiple: bs - size < PP_PAGE, unsigned,
 * says bs == the rounded request). */
static inline __attribute__((always_inline)) bool tbin_fits(const pp_tbin_t *b,
                                                            size_t size) {
  return size <= PP_SLAB_MAX_BLOCK || b->items[b->n - 1].bs - size < PP_PAGE;
}

/* A large class's stack whose top block is of another size: bring a block
 * of exactly bs bytes to the top, or, if there is none, give the stack's
 * blocks back to the arena (sizes that are not being asked for; their
 * space may coalesce into the block that is). Returns whether the top now
 * fits. */
static bool tbin_match(pp_tcache_t *tc, unsigned cls, size_t bs) {
  pp_tbin_t *b = &tc->bins[cls];
  for (uint32_t i = b->n; i-- > 0;) {
    if (b->items[i].bs == bs) {
      pp_tentry_t t = b->items[i];
      b->items[i] = b->items[b->n - 1];
      b->items[b->n - 1] = t;
      return true;
    }
  }
  pp_tcache_flush_bin(tc, cls, 0);
  return false;
}

static inline __attribute__((always_inline)) int
alloc_hit(pinpool_t *pool, pp_tcache_t *tc, pp_tbin_t *b, size_t size,
          void **out, const void *ra, bool hist);

/* Out of line, so that the hit path needs no stack frame. */
__attribute__((noinline)) static int alloc_slow(pinpool_t *pool,
                                                pp_tcache_t *tc, unsigned cls,
                                                size_t size, void **out,
                                                const void *ra) {
  size_t bs = block_bytes(cls, size);
  if (pool->cfg.max_reserved != 0 && bs > pool->cfg.max_reserved)
    return above_cap(pool, bs, ra);
  if (pp_tc_stale(tc, pool))
    pp_tcache_flush_all(tc); /* pinpool_empty_cache asked for it */
  bool large = size > PP_SLAB_MAX_BLOCK;
  pp_tbin_t *b = &tc->bins[cls];
  bool missed = false, polled = false;
  int n;
  uint64_t taken; /* bytes that left the central bins for this thread */
  /* slow_allocs: counted with the allocation, never by one that fails
   * (tcache_hits, n_alloc - slow_allocs, went down on a failure: found by
   * test_faults's check that a failure changes nothing, issue 37). */
  if (large && b->n > 0 && tbin_match(tc, cls, bs)) {
    count_slow(pool, tc, false);
    return alloc_hit(pool, tc, b, size, out, ra, true);
  }
  bool stack = b->items != NULL || tbin_init(pool, tc, b, pp_class_size(cls));
  /* Large classes take one block at a time: a refill of several would
   * carve blocks of one exact size that may never be asked for again. */
  if (!stack || b->cap == 1 || large) {
    /* Bypass: straight from the central bin to the caller; also the refill
     * of a stack of one block, which would hand that block straight out
     * (it looks into the hot slot first, where a consumer's frees of the
     * class go: free_push_slow). */
    if (stack)
      pp_tcache_budget_up(tc, pool->cfg.tcache_bytes); /* a refill */
    pp_tentry_t e;
    bool paired = false;
    /* The hot slot first (pool.c): one exchange. Completed stream-ordered
     * frees are then reclaimed by the next allocation that goes on to the
     * bins (take_with_retry), not by this one. */
    if (large && pp_hot_take(pool, cls, bs, pp_tc_vshard(tc, pool), &e,
                             &tc->c.slot_out)) {
      /* Paired (stats.c): the free that filled the slot read the epoch
       * before it was counted, so no sample that has moved the epoch on
       * since saw it, and the latest sample counted this block as
       * allocated; this allocation raises no peaked value above what that
       * free lowered it by (same block, same count, a request no larger).
       * Acquire: a sample whose epoch store we could have missed would
       * have to be concurrent with this allocation. */
      paired = size <= pp_load_relaxed(&e.seg->hot_req) &&
               pp_load_acquire(&pool->gs.peak_epoch) ==
                   pp_load_relaxed(&e.seg->hot_epoch);
    } else {
      n = take_with_retry(pool, tc, cls, bs, &e, 1, &missed, &polled, ra);
      if (n < 0)
        return n;
    }
    size_t ebs = e.bs;
    pp_assert(ebs == bs);
    if (pp_hist_level(pool) != PINPOOL_HISTORY_NONE)
      pp_hist_alloc(pool, e.seg, e.idx, ebs, size, ra);
    pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
    count_slow(pool, tc, missed);
    account_alloc(tc, size, ebs);
    *out = e.ptr;
    taken = paired ? 0 : ebs;
  } else {
    /* A refill: this thread allocates (adaptive budget, tcache.c). */
    pp_tcache_budget_up(tc, pool->cfg.tcache_bytes);
    uint64_t held = pp_load_relaxed(&tc->bytes);
    uint64_t room = tc->budget > held ? tc->budget - held : 0;
    uint64_t want = room / bs;
    want = want < 1 ? 1 : want > b->batch ? b->batch : want;
    n = take_with_retry(pool, tc, cls, bs, b->items, (uint32_t)want, &missed,
                        &polled, ra);
    if (n < 0)
      return n;
    b->n = (uint32_t)n;
    pp_store_relaxed(&tc->bytes,
                     pp_load_relaxed(&tc->bytes) + (uint64_t)n * bs);
    pp_tentry_t e = b->items[--b->n];
    size_t ebs = e.bs;
    pp_assert(ebs == bs);
    pp_hist_alloc(pool, e.seg, e.idx, ebs, size, ra);
    pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
    pp_store_relaxed(&tc->bytes, pp_load_relaxed(&tc->bytes) - bs);
    count_slow(pool, tc, missed);
    account_alloc(tc, size, ebs);
    *out = e.ptr;
    taken = (uint64_t)(n - 1) * bs + ebs;
  }
  if (pool->cfg.tcache_bytes == 0)
    pp_stats_publish(pool, tc); /* paired or not: the totals (stats.c) */
  if (missed || polled)
    pp_trim_to_cap(pool); /* a new segment, or completed frees, idle bytes */
  /* Peaks (stats.c): sampled once the bytes this thread took from the bins
   * since its last sample exceed tcache_bytes, and at every new segment.
   * Until then it can have allocated at most what its cache held plus
   * those bytes: 2 x tcache_bytes, the slack reported. A sample reads every
   * thread's counters; a producer whose every allocation leaves its cache
   * would otherwise pull its consumer's counter lines over each time. */
  tc->unsampled += taken;
  if (missed || tc->unsampled > pool->cfg.tcache_bytes) {
    tc->unsampled = 0;
    pp_stats_sample_peaks(pool);
  }
  return 0;
}

/* Peaks (stats.c) for a hit on an oversize stack: the cache may hold more
 * than the slack that unsampled allocations from it are allowed (2 x
 * tcache_bytes), so such a hit is sampled unless it is paired with the free
 * that cached the block, as a hot slot's take is (alloc_slow): no sample
 * since that free (the epoch it read before it was counted), and a request
 * no larger. W1's 1 GiB pair then samples never. */
__attribute__((noinline)) static void alloc_over_sample(pinpool_t *pool,
                                                        pp_tcache_t *tc) {
  tc->unsampled = 0;
  pp_stats_sample_peaks(pool);
}

static inline __attribute__((always_inline)) void
alloc_over_paired(pinpool_t *pool, pp_tcache_t *tc, const pp_tbin_t *b,
                  size_t size) {
  if (!(size <= b->over_req &&
        pp_load_acquire(&pool->gs.peak_epoch) == b->over_epoch))
    alloc_over_sample(pool, tc);
}

/* A hit: pop a block of stack b and hand it out. Shared by both paths of
 * pinpool_alloc; hist: record it if history is on. */
static inline __attribute__((always_inline)) int
alloc_hit(pinpool_t *pool, pp_tcache_t *tc, pp_tbin_t *b, size_t size,
          void **out, const void *ra, bool hist) {
  pp_tentry_t e = b->items[--b->n];
  size_t bs = e.bs;
  if (hist && pp_hist_level(pool) != PINPOOL_HISTORY_NONE)
    pp_hist_alloc(pool, e.seg, e.idx, bs, size, ra);
  /* Release: whoever later reads ALLOCATED (a free on another thread, a
   * snapshot) also sees the requested size stored with it. */
  pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
  pp_store_relaxed(&tc->bytes, pp_load_relaxed(&tc->bytes) - bs);
  account_alloc(tc, size, bs);
  if (pp_unlikely(b->over))
    alloc_over_paired(pool, tc, b, size);
  *out = e.ptr;
  return 0;
}

/* ---- Nested calls --------------------------------------------------------
 * A call made while another pinpool call of the same thread is under way:
 * from a callout inside it (a backend's alloc or free, a provider's query
 * or release, the error callback), which is where user code runs. The
 * outer call may hold its thread cache half changed across the callout:
 * a refill takes blocks into its empty stack and only then sets the
 * stack's count, over whatever a nested free had pushed there and a
 * nested allocation had popped (rv37e's d6 and d8: blocks cached in no
 * list, tc->bytes off by megabytes). A thread's exit flushes its caches
 * with no record left (tcache.c, thread_exit): a nested call there made
 * a new record, whose own exit trimmed again, past the destructor
 * rounds glibc runs (rv37e's d7: 80 MiB cached for good).
 *
 * So a nested allocation or free never uses the thread's cache, and
 * needs none: a block straight from the central layer and back (as a
 * class without thread caches does), counted in the pool's shared
 * gs.nested (stats.c sums it with the pool's own parts). The test is the
 * busy depth (tcache.h, "Fork"): every call that changes a thread cache
 * does so inside a busy section, and user code runs inside one only as a
 * callout of such a call; the hit paths already leave for the general
 * ones when it is not 0. Nested calls are rare: their cost does not
 * matter, the hit paths' does. */
static inline bool nested_call(void) {
  /* A pool's own threads (the background thread, the simulated streams'
   * workers: pp_pool_thread) count as nested too: user code runs there
   * only in callouts (an event query releasing buffers), and a cache of
   * theirs is flushed by no later call of theirs, so empty_cache and
   * max_cached never reached the blocks it held (rv39c D5: 64 x 64 KiB
   * released by a background query stayed cached after empty_cache, 6 MiB
   * over max_cached=1MiB). */
  return pp_load_relaxed(&pp_tls.busy) != 0 || pp_pool_thread;
}

/* Shared counters (several threads may nest at once). Allocations: the
 * slow count first, then a release fence, then n_alloc (count_slow). */
static void nested_count_alloc(pinpool_t *pool, size_t req, size_t bs,
                               bool missed) {
  pp_tcounters_t *c = &pool->gs.nested;
  pp_fetch_add_relaxed(&c->slow_allocs, 1);
  if (missed)
    pp_fetch_add_relaxed(&pool->gs.misses, 1);
  atomic_thread_fence(memory_order_release);
  pp_fetch_add_relaxed(&c->n_alloc, 1);
  pp_fetch_add_relaxed(&c->req_alloc, req);
  pp_fetch_add_relaxed(&c->blk_alloc, bs);
}

/* pinpool_alloc nested in another call (above), in its busy section. */
__attribute__((noinline)) static int alloc_nested(pinpool_t *pool, unsigned cls,
                                                  size_t size, void **out,
                                                  const void *ra) {
  size_t bs = block_bytes(cls, size);
  if (pool->cfg.max_reserved != 0 && bs > pool->cfg.max_reserved)
    return above_cap(pool, bs, ra);
  pp_tentry_t e;
  bool missed = false, polled = false;
  int n = take_with_retry(pool, NULL, cls, bs, &e, 1, &missed, &polled, ra);
  if (n < 0)
    return n;
  pp_assert(e.bs == bs);
  if (pp_hist_level(pool) != PINPOOL_HISTORY_NONE)
    pp_hist_alloc(pool, e.seg, e.idx, bs, size, ra);
  pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
  nested_count_alloc(pool, size, bs, missed);
  *out = e.ptr;
  if (missed || polled)
    pp_trim_to_cap(pool); /* a new segment, or completed frees, idle bytes */
  /* No thread's unsampled bytes bound this one: sampled every time. */
  pp_stats_sample_peaks(pool);
  return 0;
}

/* Everything pinpool_alloc's hit path does not handle: bad arguments, a
 * thread's first call, history on, an empty bin, a pending flush. */
__attribute__((noinline)) static int alloc_general(pinpool_t *pool, size_t size,
                                                   void **out, const void *ra) {
  if (pool == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_alloc: pool or out is NULL");
  if (size == 0)
    return pp_fail(PINPOOL_EZEROSIZE, "pinpool_alloc: size 0");
  if (size > PP_MAX_REQUEST)
    return pp_fail(PINPOOL_EOVERFLOW,
                   "pinpool_alloc: %zu bytes is beyond the largest class "
                   "(2^60)",
                   size);
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED,
                   "pinpool_alloc: a CUDA or shared pool in a child of fork");
  int dying = pp_pool_dying(pool, "pinpool_alloc");
  if (pp_unlikely(dying != 0))
    return dying;
  if (pp_unlikely(nested_call())) {
    pp_busy_enter(); /* nested: never waits (tcache.h) */
    int rc = alloc_nested(pool, pp_class_index(size), size, out, ra);
    pp_busy_leave();
    return rc;
  }
  int err = 0;
  pp_tcache_t *tc = tcache_get(pool, &err);
  if (tc == NULL)
    return err;
  unsigned cls = pp_class_index(size);
  pp_tbin_t *b = &tc->bins[cls];
  int rc;
  pp_busy_enter(); /* fork.c: a fork waits until we leave */
  /* NUMA: every allocation of a numa=local pool on several nodes comes
   * here (its caches' epochs are tagged: pool->epoch_tag), and the cache
   * follows the thread's node before it hands out a block. */
  if (pool->epoch_tag != 0)
    pp_numa_follow(pool, tc);
  if (b->n > 0 && tbin_fits(b, size) && !pp_tc_stale(tc, pool))
    rc = alloc_hit(pool, tc, b, size, out, ra, true);
  else
    rc = alloc_slow(pool, tc, cls, size, out, ra);
  pp_busy_leave();
  return rc;
}

/* alloc_slow for pinpool_alloc's hit path, which ends its busy section
 * here: the hit path then tail-calls it and keeps no state across. */
__attribute__((noinline)) static int
alloc_slow_hot(pinpool_t *pool, pp_tcache_t *tc, unsigned cls, size_t size,
               void **out, const void *ra) {
  int rc = alloc_slow(pool, tc, cls, size, out, ra);
  pp_store_release(&pp_tls.busy, 0);
  if (pp_unlikely(pp_tls.deferred != NULL))
    pp_run_deferred(); /* a callout destroyed a pool (pp_busy_leave) */
  return rc;
}

/* The hit paths' busy section (internal.h, "Fork"): busy == 0 was checked
 * with the pool id, so this is the outer section; one TLS store and a
 * load of the gate, which is up only while a fork is being prepared. */
static inline __attribute__((always_inline)) bool hot_enter(void) {
  pp_store_relaxed(&pp_tls.busy, 1);
  /* The store, then the load, for the compiler (the hardware's side is the
   * forker's membarrier): an empty asm that reads busy and "writes" the
   * gate. Unlike a signal fence it leaves every other value in its
   * register, so the hit paths keep no more state than before. */
  __asm__ volatile("" : "+m"(pp_fork_gate) : "m"(pp_tls.busy));
  if (pp_likely(pp_load_relaxed(&pp_fork_gate) == 0))
    return true;
  pp_store_relaxed(&pp_tls.busy, 0); /* the general path waits */
  return false;
}
static inline __attribute__((always_inline)) int hot_leave(int rc) {
  pp_store_release(&pp_tls.busy, 0);
  return rc;
}

/* The hit path: a pop from this thread's cache with history off. It keeps
 * so few values live that it needs no stack frame; anything else goes to
 * alloc_general (a tail call), which checks everything again. */
int pinpool_alloc(pinpool_t *pool, size_t size, void **out) {
  const void *ra = __builtin_return_address(0);
  /* size - 1 wraps for size 0: one compare rejects 0 and > 2^60. The busy
   * section starts as early as it can (pinpool_free says why). */
  pp_tls_way_t *way;
  if (pp_likely(pool != NULL && out != NULL && size - 1 < PP_MAX_REQUEST &&
                (way = pp_tls_way(pool->id))->pool_id == pool->id &&
                pp_load_relaxed(&pp_tls.busy) == 0)) {
    pp_tcache_t *tc = way->tc; /* set with pool_id, never NULL then */
    if (pp_unlikely(!hot_enter()))
      return alloc_general(pool, size, out, ra);
    pp_tbin_t *b = &tc->bins[pp_class_index(size)];
    /* History: one atomic load and a branch when it is off. */
    if (pp_likely(tc->epoch == pp_load_relaxed(&pool->flush_epoch) &&
                  pp_hist_level(pool) == PINPOOL_HISTORY_NONE)) {
      if (pp_likely(b->n > 0 && tbin_fits(b, size)))
        return hot_leave(alloc_hit(pool, tc, b, size, out, ra, false));
      /* An empty stack, or a class without one (above tcache_bytes: W1 at
       * 1 GiB, W3's 147 MiB batches): everything alloc_general would
       * check again is checked. */
      return alloc_slow_hot(pool, tc, pp_class_index(size), size, out, ra);
    }
    pp_store_relaxed(&pp_tls.busy, 0); /* alloc_general starts over */
  }
  return alloc_general(pool, size, out, ra);
}

/* The index of the block off bytes into a segment of nb blocks of bs bytes
 * (magic: its div_magic); the caller checks idx < nb and idx * bs == off. */
static inline __attribute__((always_inline)) size_t
block_idx(uintptr_t off, size_t bs, uint32_t nb, uint64_t magic) {
  return nb == 1 ? (off >= bs ? 1u : 0u) : (size_t)((off * magic) >> 42);
}

/* Block index of address a in seg, or an error: a in the segment's unused
 * tail, or not at a block's start. */
static inline __attribute__((always_inline)) int
block_index(pp_segment_t *seg, uintptr_t a, const char *fn, uint32_t *idx_out) {
  uintptr_t off = a - pp_load_relaxed(&seg->base);
  size_t bs = pp_load_relaxed(&seg->block_size);
  uint32_t nb = pp_load_relaxed(&seg->nblocks);
  size_t idx = block_idx(off, bs, nb, pp_load_relaxed(&seg->div_magic));
  if (pp_unlikely(idx >= nb))
    return pp_fail(PINPOOL_ENOTOWNED,
                   "%s: %p is in a segment's unused tail, never allocated", fn,
                   (const void *)a);
  if (pp_unlikely(idx * bs != off))
    return pp_fail(PINPOOL_EINTERIOR,
                   "%s: %p is %zu bytes into a block of %zu bytes", fn,
                   (const void *)a, (size_t)(off - idx * bs), bs);
  *idx_out = (uint32_t)idx;
  return 0;
}

/* Find the block that starts at p; on success *seg_out and *idx_out. */
static inline __attribute__((always_inline)) int
lookup_block(pinpool_t *pool, const void *p, const char *fn,
             pp_segment_t **seg_out, uint32_t *idx_out) {
  uintptr_t a = (uintptr_t)p;
  pp_segment_t *seg = pp_segmap_find(pool->map, a);
  if (seg == NULL)
    return pp_fail(PINPOOL_ENOTOWNED, "%s: %p was not allocated by this pool",
                   fn, p);
  *seg_out = seg;
  return block_index(seg, a, fn, idx_out);
}

/* The freed block does not fit the thread cache as it is: flush first (or
 * bypass it), then trim. Out of line: see alloc_slow. No peak sample: a
 * free lowers every peaked value but cached bytes, whose rise is sampled at
 * the next slow allocation or get_stats (docs/stats.md); sampling reads
 * every thread's counters, lines that a thread freeing another's blocks
 * would otherwise pull over at every flush. Without thread caches every
 * free samples, so that tcache_bytes=0 keeps exact peaks. */
__attribute__((noinline)) static int
free_push_slow(pinpool_t *pool, pp_tcache_t *tc, void *ptr, pp_segment_t *seg,
               uint32_t idx, unsigned cls, size_t req) {
  size_t bs = pp_load_relaxed(&seg->block_size);
  pp_tentry_t e = {ptr, seg, bs, idx};
  size_t cbs = pp_class_size(cls); /* the stack's class */
  pp_tbin_t *b = &tc->bins[cls];
  if (pp_tc_stale(tc, pool))
    pp_tcache_flush_all(tc); /* pinpool_empty_cache asked for it */
  /* NUMA (numa=local on several nodes: every free comes here, its cache's
   * epoch being tagged): a block of another node than the thread's goes
   * home, to its own node's central lists, never into this cache. */
  bool remote = false;
  if (pool->epoch_tag != 0) {
    pp_numa_follow(pool, tc);
#ifndef PINPOOL_MUTANT_NUMA_NO_ROUTE
    remote = seg->node != tc->node;
#endif
  }
  /* A free never opens a stack of one block (a class above a sixteenth of
   * tcache_bytes): the thread has not allocated the class, and one block
   * is all the stack would hold, hidden from the thread that does (W3's
   * consumer of 36.75 MiB batches kept one, and the producer grew the
   * pool by a fourth batch). Such a free goes where a class above
   * tcache_bytes goes; the thread's first allocation of the class opens
   * the stack. */
  /* An oversize stack keeps a block only in a cache within its budget
   * (above); a block of another node goes home (numa=local). */
  bool bypass =
      remote ||
      (b->items == NULL ? tbin_one(cbs, pool->cfg.tcache_bytes) ||
                              !tbin_init(pool, tc, b, cbs)
                        : b->over && pp_load_relaxed(&tc->bytes) > tc->budget);
  /* Read before the free is counted (the pairing in alloc_slow): a sample
   * whose epoch this reads did all its loads before our counters change.
   * Only for a hot slot: the line is written by every central take. */
  uint64_t epoch =
      bypass || b->over ? pp_load_acquire(&pool->gs.peak_epoch) : 0;
  account_free(tc, req, bs);
  if (bypass) { /* no thread cache for this class */
    if (!pp_hot_put(pool, cls, &e, req, epoch, &tc->c.slot_in))
      pp_central_give(pool, cls, &e, 1);
  } else {
    if (b->n == b->cap)
      pp_tcache_flush_bin(tc, cls, b->cap / 2);
    if (b->over) { /* alloc_over_paired */
      b->over_req = req;
      b->over_epoch = epoch;
    }
    /* An oversize block goes over the budget by itself: no shrink for
     * it (the cache was within its budget, or bypass). */
    uint64_t before = pp_load_relaxed(&tc->bytes);
    b->items[b->n++] = e;
    pp_store_relaxed(&tc->bytes, before + bs);
    if ((b->over ? before : before + bs) > tc->budget)
      pp_tcache_shrink(tc);
  }
  if (pp_trims(pool))
    pp_trim_to_cap(pool);
  if (pool->cfg.tcache_bytes == 0) {
    pp_stats_publish(pool, tc);
    pp_stats_sample_peaks(pool);
  }
  return 0;
}

/* free_push_slow for pinpool_free's hit path, which ends its busy section
 * here: the hit path then tail-calls it and keeps no state across. */
__attribute__((noinline)) static int
free_push_slow_hot(pinpool_t *pool, pp_tcache_t *tc, void *ptr,
                   pp_segment_t *seg, uint32_t idx, unsigned cls, size_t req) {
  int rc = free_push_slow(pool, tc, ptr, seg, idx, cls, req);
  pp_store_release(&pp_tls.busy, 0);
  if (pp_unlikely(pp_tls.deferred != NULL))
    pp_run_deferred(); /* a callout destroyed a pool (pp_busy_leave) */
  return rc;
}

static int state_error(const void *p, const char *fn, uint64_t w) {
  if (PP_WORD_STATE(w) == PP_NEVER)
    return pp_fail(PINPOOL_ENOTOWNED, "%s: %p was never handed out", fn, p);
  return pp_fail(PINPOOL_EDOUBLEFREE, "%s: %p is not allocated (%s)", fn, p,
                 PP_WORD_STATE(w) == PP_PENDING ? "pending" : "already free");
}

/* ALLOCATED -> CACHED on a block's state word, which was read as *w: the
 * CAS of the file comment (on failure *w is the word's new value). */
static inline __attribute__((always_inline)) bool
claim_block(_Atomic(uint64_t) *word, uint64_t *w) {
#ifdef PINPOOL_MUTANT_FREE_NO_CAS
  /* Race mutant (docs/verification.md): a load and a store instead of the
   * CAS; two concurrent frees can both succeed. */
  (void)w;
  pp_store_release(word, PP_WORD(0, PP_CACHED));
  return true;
#else
  return pp_cas_acq_rel(word, w, PP_WORD(0, PP_CACHED));
#endif
}

/* The hint's segment is still the incarnation the hint copied (below). */
static inline __attribute__((always_inline)) bool
hint_current(pp_segment_t *seg, const pp_fhint_t *h) {
#ifdef PINPOOL_MUTANT_HINT_NO_GEN
  /* Mutant (docs/verification.md): the check left out. */
  (void)seg;
  (void)h;
  return true;
#else
  return pp_load_relaxed(&seg->gen) == h->gen;
#endif
}

/* A free of a block of oversize stack b into a cache holding `before`
 * bytes: kept if the stack is empty and the cache within its budget
 * (alloc.c, "Oversize stacks"); the epoch is read before the free is
 * counted (alloc_over_paired). A free that then takes the slow path (a
 * pending flush) records the pairing again there. */
static inline __attribute__((always_inline)) bool
over_keeps(pinpool_t *pool, pp_tcache_t *tc, pp_tbin_t *b, uint64_t before,
           size_t req) {
  if (!b->over || b->n != 0 || before > tc->budget)
    return false;
  b->over_epoch = pp_load_acquire(&pool->gs.peak_epoch);
  b->over_req = req;
  return true;
}

/* The block (seg, idx) at ptr, whose state word was read as w, goes back
 * to the caller's cache tc. Shared by both paths of pinpool_free; hist:
 * write the free_completed entry if history is at ALLOC or above (the
 * general path); !hist: the hit path, whose busy section ends here. */
static inline __attribute__((always_inline)) int
free_block(pinpool_t *pool, pp_tcache_t *tc, void *ptr, pp_segment_t *seg,
           uint32_t idx, uint64_t w, const void *ra, bool hist) {
  size_t req = (size_t)PP_WORD_PAYLOAD(w);
  size_t bs = pp_load_relaxed(&seg->block_size);
  unsigned cls = pp_load_relaxed(&seg->cls_index);
  pp_hist_forget(seg, idx);
  if (hist && pp_hist_level(pool) >= PINPOOL_HISTORY_ALLOC)
    pp_hist_event(pool, PP_H_FREE_COMPLETED, (uintptr_t)ptr, bs, req, 0, ra);
  pp_tbin_t *b = &tc->bins[cls];
  uint64_t bytes = pp_load_relaxed(&tc->bytes) + bs;
  /* An oversize block never passes the budget test; over_keeps says
   * whether its stack keeps it (and records the pairing). */
  if (pp_likely(((b->n < b->cap && bytes <= tc->budget) ||
                 over_keeps(pool, tc, b, bytes - bs, req)) &&
                tc->epoch == pp_load_relaxed(&pool->flush_epoch))) {
    account_free(tc, req, bs);
    b->items[b->n++] = (pp_tentry_t){ptr, seg, bs, idx};
    pp_store_relaxed(&tc->bytes, bytes);
    if (!hist) /* the hit path: its busy section ends here */
      pp_store_release(&pp_tls.busy, 0);
    return 0;
  }
  if (!hist) /* the hit path's busy section ends there */
    return free_push_slow_hot(pool, tc, ptr, seg, idx, cls, req);
  return free_push_slow(pool, tc, ptr, seg, idx, cls, req); /* counts it */
}

/* pinpool_free nested in another call ("Nested calls"), in its busy
 * section: the block goes where a class without a thread cache sends it
 * (a hot slot, or the central bins), counted in gs.nested. */
static int free_nested(pinpool_t *pool, void *ptr, pp_segment_t *seg,
                       uint32_t idx, const void *ra) {
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  do {
    if (PP_WORD_STATE(w) != PP_ALLOCATED)
      return state_error(ptr, "pinpool_free", w);
    if (w & PP_WORD_STREAMS) /* used on streams: stream-ordered free */
      return pp_stream_free(pool, NULL, seg, idx, w, ra);
  } while (!claim_block(&seg->word[idx], &w));
  size_t req = (size_t)PP_WORD_PAYLOAD(w);
  size_t bs = pp_load_relaxed(&seg->block_size);
  unsigned cls = pp_load_relaxed(&seg->cls_index);
  pp_hist_forget(seg, idx);
  if (pp_hist_level(pool) >= PINPOOL_HISTORY_ALLOC)
    pp_hist_event(pool, PP_H_FREE_COMPLETED, (uintptr_t)ptr, bs, req, 0, ra);
  /* Read before the free is counted (the pairing in alloc_slow). */
  uint64_t epoch = pp_load_acquire(&pool->gs.peak_epoch);
  pp_tcounters_t *c = &pool->gs.nested;
  pp_fetch_add_relaxed(&c->n_free, 1);
  pp_fetch_add_relaxed(&c->req_free, req);
  pp_fetch_add_relaxed(&c->blk_free, bs);
  pp_tentry_t e = {ptr, seg, bs, idx};
  if (!pp_hot_put(pool, cls, &e, req, epoch, NULL))
    pp_central_give(pool, cls, &e, 1);
  if (pp_trims(pool))
    pp_trim_to_cap(pool);
  return 0;
}

/* Everything pinpool_free's hit path does not handle: bad arguments, no
 * hint or a wrong one, a thread's first call, streams, history, a race
 * with another free of the same block. */
static int free_claimed(pinpool_t *pool, pp_tcache_t *tc, void *ptr,
                        pp_segment_t *seg, uint32_t idx, const void *ra);
__attribute__((noinline)) static int free_general(pinpool_t *pool, void *ptr,
                                                  const void *ra) {
  if (pool == NULL || ptr == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_free: pool or ptr is NULL");
  int rc = pp_pool_dying(pool, "pinpool_free");
  if (pp_unlikely(rc != 0))
    return rc;
  pp_segment_t *seg = NULL;
  uint32_t idx = 0;
  rc = lookup_block(pool, ptr, "pinpool_free", &seg, &idx);
  if (rc != 0)
    return rc;
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED,
                   "pinpool_free: a CUDA or shared pool in a child of fork");
  /* A lent block is the worker's until it comes back (docs/sharing.md). A
   * free racing with a lend of the same block is the caller's race. */
  if (pp_unlikely(pool->share != NULL) && pp_share_is_lent(pool->share, ptr))
    return pp_fail(PINPOOL_EBUSY,
                   "pinpool_free: block %p is lent to another process "
                   "(pinpool_lend_return or pinpool_lend_reclaim first)",
                   ptr);
  if (pp_unlikely(nested_call())) {
    pp_busy_enter(); /* nested: never waits (tcache.h) */
    rc = free_nested(pool, ptr, seg, idx, ra);
    pp_busy_leave();
    return rc;
  }
  /* The cache only now, so that a pointer that is not ours creates
   * nothing; but before the state flips, after which we must not fail. */
  int err = 0;
  pp_tcache_t *tc = tcache_get(pool, &err);
  if (tc == NULL)
    return err;
  pp_busy_enter(); /* fork.c: a fork waits until we leave */
  rc = free_claimed(pool, tc, ptr, seg, idx, ra);
  pp_busy_leave();
  return rc;
}

/* free_general after the checks, in its busy section. */
static int free_claimed(pinpool_t *pool, pp_tcache_t *tc, void *ptr,
                        pp_segment_t *seg, uint32_t idx, const void *ra) {
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  do {
    if (PP_WORD_STATE(w) != PP_ALLOCATED)
      return state_error(ptr, "pinpool_free", w);
    if (w & PP_WORD_STREAMS) /* used on streams: stream-ordered free */
      return pp_stream_free(pool, tc, seg, idx, w, ra);
  } while (!claim_block(&seg->word[idx], &w));
  /* The block is ours now and stays in this thread's cache until we give
   * it back, so seg cannot be released meanwhile: these fields and gen are
   * those of one live incarnation. */
  tc->hint = (pp_fhint_t){seg,
                          pp_load_relaxed(&seg->base),
                          pp_load_relaxed(&seg->size),
                          pp_load_relaxed(&seg->block_size),
                          pp_load_relaxed(&seg->div_magic),
                          pp_load_relaxed(&seg->gen),
                          pp_load_relaxed(&seg->nblocks)};
  return free_block(pool, tc, ptr, seg, idx, w, ra, true);
}

/* The hit path: the block is in the segment of this thread's last free
 * (the hint), is allocated, has no streams, and history is below ALLOC. It
 * needs no stack frame; anything else goes to free_general, which starts
 * over.
 *
 * The hint is a copy of the segment's bounds and geometry taken while it
 * was live, with its generation (bumped under seg_lock when a segment is
 * published and when it is released). It skips the segment map's three
 * dependent loads and the descriptor's fields: only gen and the block's
 * word are read. Why an equal gen is enough: ptr is allocated (a correct
 * free), so its own segment S is live. If the hint's incarnation covers ptr
 * and is not S, it was released before S got these addresses, and that
 * release's gen bump happened before ptr was allocated, hence before this
 * free: a relaxed load must see it (read coherence), so gen differs. A
 * stale hint whose descriptor now serves another segment (whose block
 * idx may be allocated) is thus never used (test_backend.c:
 * free_hint_recycled fails without this check). */
int pinpool_free(pinpool_t *pool, void *ptr) {
  const void *ra = __builtin_return_address(0);
  uintptr_t a = (uintptr_t)ptr;
  /* The busy section starts first: its store then commits while the hint
   * is checked, instead of holding up the claim's locked instruction
   * (which waits for every earlier store). */
  pp_tls_way_t *way;
  /* A shared pool's frees take the general path, which checks lends. */
  if (pp_likely(pool != NULL && ptr != NULL && pool->share == NULL &&
                (way = pp_tls_way(pool->id))->pool_id == pool->id &&
                pp_load_relaxed(&pp_tls.busy) == 0)) {
    pp_tcache_t *tc = way->tc;
    if (pp_unlikely(!hot_enter()))
      return free_general(pool, ptr, ra);
    const pp_fhint_t *h = &tc->hint;
    uintptr_t off = a - h->base;
    if (pp_likely(off < h->size)) {
      pp_segment_t *seg = h->seg;
      size_t bs = h->bs;
      size_t idx = block_idx(off, bs, h->nblocks, h->magic);
      if (pp_likely(idx < h->nblocks && idx * bs == off &&
                    hint_current(seg, h) &&
                    pp_hist_level(pool) < PINPOOL_HISTORY_ALLOC)) {
        uint64_t w = pp_load_acquire(&seg->word[idx]);
        if (pp_likely(PP_WORD_STATE(w) == PP_ALLOCATED &&
                      !(w & PP_WORD_STREAMS) &&
                      claim_block(&seg->word[idx], &w)))
          /* History is below ALLOC (checked above): no entry to write. */
          /* Its slow part ends the busy section itself (a tail call). */
          return free_block(pool, tc, ptr, seg, (uint32_t)idx, w, ra, false);
      }
    }
    pp_store_relaxed(&pp_tls.busy, 0); /* free_general starts over */
  }
  return free_general(pool, ptr, ra);
}

int pinpool_block_size(pinpool_t *pool, const void *ptr, size_t *out) {
  if (pool == NULL || ptr == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_block_size: NULL argument");
  pp_segment_t *seg = NULL;
  uint32_t idx = 0;
  int rc = lookup_block(pool, ptr, "pinpool_block_size", &seg, &idx);
  if (rc != 0)
    return rc;
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  if (PP_WORD_STATE(w) != PP_ALLOCATED)
    return state_error(ptr, "pinpool_block_size", w);
  *out = pp_load_relaxed(&seg->block_size);
  return 0;
}

int pinpool_block_node(pinpool_t *pool, const void *ptr, unsigned *out) {
  if (pool == NULL || ptr == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_block_node: NULL argument");
  pp_segment_t *seg = NULL;
  uint32_t idx = 0;
  int rc = lookup_block(pool, ptr, "pinpool_block_node", &seg, &idx);
  if (rc != 0 || seg == NULL) /* seg is set when the lookup succeeds */
    return rc;
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  if (PP_WORD_STATE(w) != PP_ALLOCATED)
    return state_error(ptr, "pinpool_block_node", w);
  /* Allocated (acquire): the segment is live and its node, written before
   * it was published, is this incarnation's. */
  *out = seg->node;
  return 0;
}
