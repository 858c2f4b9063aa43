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

static inline pp_tcache_t *tcache_get(pinpool_t *pool) {
  if (pp_likely(pp_tls.pool_id == pool->id))
    return pp_tls.tc;
  return pp_tcache_get_slow(pool);
}

/* First use of a class in this thread: size its stack so that one class
 * holds at most an eighth of tcache_bytes (and 64 blocks); classes larger
 * than tcache_bytes bypass the thread cache. */
static bool tbin_init(pinpool_t *pool, pp_tbin_t *b, size_t bs) {
  uint64_t tb = pool->cfg.tcache_bytes;
  if (tb == 0 || bs > tb)
    return false;
  uint64_t cap = tb / (8 * (uint64_t)bs);
  cap = cap < 1 ? 1 : cap > 64 ? 64 : cap;
  b->items = malloc(cap * sizeof b->items[0]);
  if (b->items == NULL)
    return false;
  b->cap = (uint32_t)cap;
  b->bs = bs;
  b->batch = (uint32_t)(cap + 1) / 2;
  return true;
}

static void account_alloc(pp_tcache_t *tc, size_t req, size_t bs) {
  pp_owner_add(&tc->c.n_alloc, 1);
  pp_owner_add(&tc->c.req_alloc, req);
  pp_owner_add(&tc->c.blk_alloc, bs);
}

static void account_free(pp_tcache_t *tc, size_t req, size_t bs) {
  pp_owner_add(&tc->c.n_free, 1);
  pp_owner_add(&tc->c.req_free, req);
  pp_owner_add(&tc->c.blk_free, bs);
}

static int take_with_retry(pinpool_t *pool, pp_tcache_t *tc, unsigned cls,
                           pp_tentry_t *out, uint32_t want, bool *missed,
                           const void *ra) {
  /* Bounded reclaim of completed stream-ordered frees before the bins are
   * searched: cheap (one load) when nothing is pending. */
  pp_process(pool, 64, false);
  int n = pp_central_take(pool, cls, tc->shard, out, want, missed);
  if (n == PINPOOL_ENOMEM) {
    /* max_reserved reached (or the backend is out): give back what is
     * idle, ours included, and retry exactly once. */
    pp_fetch_add_relaxed(&pool->gs.retries, 1);
    pp_tcache_flush_all(tc);
    pp_fetch_add_relaxed(&pool->gs.trimmed, pp_release_idle(pool, true));
    n = pp_central_take(pool, cls, tc->shard, out, want, missed);
  }
  if (n == PINPOOL_ENOMEM) {
    pp_fetch_add_relaxed(&pool->gs.oom, 1);
    pp_hist_event(pool, PP_H_OOM, 0, pp_class_size(cls), 0, 0, ra);
  }
  return n;
}

/* Out of line, so that the hit path needs no stack frame. */
__attribute__((noinline)) static int alloc_slow(pinpool_t *pool,
                                                pp_tcache_t *tc, unsigned cls,
                                                size_t size, void **out,
                                                const void *ra) {
  if (tc->epoch != pp_load_relaxed(&pool->flush_epoch))
    pp_tcache_flush_all(tc); /* pinpool_empty_cache asked for it */
  size_t bs = pp_class_size(cls);
  pp_tbin_t *b = &tc->bins[cls];
  bool missed = false;
  int n;
  pp_owner_add(&tc->c.slow_allocs, 1);
  if (b->items == NULL && !tbin_init(pool, b, bs)) {
    /* Bypass: straight from the central bin to the caller. */
    pp_tentry_t e;
    n = take_with_retry(pool, tc, cls, &e, 1, &missed, ra);
    if (n < 0)
      return n;
    pp_hist_alloc(pool, e.seg, e.idx, bs, size, ra);
    pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
    account_alloc(tc, size, bs);
    *out = e.ptr;
  } else {
    uint64_t room = pool->cfg.tcache_bytes - pp_load_relaxed(&tc->bytes);
    uint64_t want = room / bs;
    want = want < 1 ? 1 : want > b->batch ? b->batch : want;
    n = take_with_retry(pool, tc, cls, b->items, (uint32_t)want, &missed, ra);
    if (n < 0)
      return n;
    b->n = (uint32_t)n;
    pp_store_relaxed(&tc->bytes,
                     pp_load_relaxed(&tc->bytes) + (uint64_t)n * bs);
    pp_tentry_t e = b->items[--b->n];
    pp_hist_alloc(pool, e.seg, e.idx, bs, size, ra);
    pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
    pp_store_relaxed(&tc->bytes, pp_load_relaxed(&tc->bytes) - bs);
    account_alloc(tc, size, bs);
    *out = e.ptr;
  }
  if (missed) {
    pp_fetch_add_relaxed(&pool->gs.misses, 1);
    pp_trim_to_cap(pool); /* a new segment adds idle bytes */
  }
  pp_stats_sample_peaks(pool);
  return 0;
}

int pinpool_alloc(pinpool_t *pool, size_t size, void **out) {
  if (pp_unlikely(pool == NULL || out == NULL))
    return pp_fail(PINPOOL_EINVAL, "pinpool_alloc: pool or out is NULL");
  if (pp_unlikely(size == 0))
    return pp_fail(PINPOOL_EZEROSIZE, "pinpool_alloc: size 0");
  if (pp_unlikely(size > PP_MAX_REQUEST))
    return pp_fail(PINPOOL_EOVERFLOW,
                   "pinpool_alloc: %zu bytes is beyond the largest class "
                   "(2^60)",
                   size);
  pp_tcache_t *tc = tcache_get(pool);
  if (pp_unlikely(tc == NULL))
    return pp_fail(PINPOOL_ENOMEM, "out of memory for the thread cache");
  unsigned cls = pp_class_index(size);
  pp_tbin_t *b = &tc->bins[cls];
  if (pp_likely(b->n > 0 && tc->epoch == pp_load_relaxed(&pool->flush_epoch))) {
    size_t bs = b->bs;
    pp_tentry_t e = b->items[--b->n];
    /* History: one atomic load and a branch when it is off. */
    if (pp_unlikely(pp_hist_level(pool) != PINPOOL_HISTORY_NONE))
      pp_hist_alloc(pool, e.seg, e.idx, bs, size, __builtin_return_address(0));
    /* Release: whoever later reads ALLOCATED (a free on another thread, a
     * snapshot) also sees the requested size stored with it. */
    pp_store_release(&e.seg->word[e.idx], PP_WORD(size, PP_ALLOCATED));
    pp_store_relaxed(&tc->bytes, pp_load_relaxed(&tc->bytes) - bs);
    account_alloc(tc, size, bs);
    *out = e.ptr;
    return 0;
  }
  return alloc_slow(pool, tc, cls, size, out, __builtin_return_address(0));
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
  uintptr_t off = a - pp_load_relaxed(&seg->base);
  size_t bs = pp_load_relaxed(&seg->block_size);
  uint32_t nb = pp_load_relaxed(&seg->nblocks);
  size_t idx = nb == 1
                   ? (off >= bs ? 1u : 0u)
                   : (size_t)((off * pp_load_relaxed(&seg->div_magic)) >> 42);
  if (idx >= nb)
    return pp_fail(PINPOOL_ENOTOWNED,
                   "%s: %p is in a segment's unused tail, never allocated", fn,
                   p);
  if (idx * bs != off)
    return pp_fail(PINPOOL_EINTERIOR,
                   "%s: %p is %zu bytes into a block of %zu bytes", fn, p,
                   (size_t)(off - idx * bs), bs);
  *seg_out = seg;
  *idx_out = (uint32_t)idx;
  return 0;
}

/* The freed block does not fit the thread cache as it is: flush first (or
 * bypass it), then trim and sample the peaks. Out of line: see alloc_slow. */
__attribute__((noinline)) static int
free_push_slow(pinpool_t *pool, pp_tcache_t *tc, pp_tentry_t e, unsigned cls) {
  size_t bs = pp_class_size(cls);
  pp_tbin_t *b = &tc->bins[cls];
  if (tc->epoch != pp_load_relaxed(&pool->flush_epoch))
    pp_tcache_flush_all(tc); /* pinpool_empty_cache asked for it */
  if (b->items == NULL && !tbin_init(pool, b, bs)) {
    pp_central_give(pool, cls, &e, 1); /* no thread cache for this class */
  } else {
    if (b->n == b->cap)
      pp_tcache_flush_bin(tc, cls, b->cap / 2);
    b->items[b->n++] = e;
    pp_store_relaxed(&tc->bytes, pp_load_relaxed(&tc->bytes) + bs);
    if (pp_load_relaxed(&tc->bytes) > pool->cfg.tcache_bytes)
      pp_tcache_flush_all(tc);
  }
  pp_trim_to_cap(pool);
  pp_stats_sample_peaks(pool);
  return 0;
}

static int state_error(const void *p, const char *fn, uint64_t w) {
  if (PP_WORD_STATE(w) == PP_NEVER)
    return pp_fail(PINPOOL_ENOTOWNED, "%s: %p was never handed out", fn, p);
  return pp_fail(PINPOOL_EDOUBLEFREE, "%s: %p is not allocated (%s)", fn, p,
                 PP_WORD_STATE(w) == PP_PENDING ? "pending" : "already free");
}

int pinpool_free(pinpool_t *pool, void *ptr) {
  if (pp_unlikely(pool == NULL || ptr == NULL))
    return pp_fail(PINPOOL_EINVAL, "pinpool_free: pool or ptr is NULL");
  pp_segment_t *seg = NULL;
  uint32_t idx = 0;
  int rc = lookup_block(pool, ptr, "pinpool_free", &seg, &idx);
  if (rc != 0)
    return rc;
  /* The cache first: once the state flips we must not fail. */
  pp_tcache_t *tc = tcache_get(pool);
  if (pp_unlikely(tc == NULL))
    return pp_fail(PINPOOL_ENOMEM, "out of memory for the thread cache");
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  do {
    if (PP_WORD_STATE(w) != PP_ALLOCATED)
      return state_error(ptr, "pinpool_free", w);
    if (w & PP_WORD_STREAMS) /* used on streams: stream-ordered free */
      return pp_stream_free(pool, tc, seg, idx, w, __builtin_return_address(0));
#ifdef PINPOOL_MUTANT_FREE_NO_CAS
    /* Race mutant (docs/verification.md): a load and a store instead of
     * the CAS; two concurrent frees can both succeed. */
    pp_store_release(&seg->word[idx], PP_WORD(0, PP_CACHED));
  } while (0);
#else
  } while (!pp_cas_acq_rel(&seg->word[idx], &w, PP_WORD(0, PP_CACHED)));
#endif

  size_t req = (size_t)PP_WORD_PAYLOAD(w);
  size_t bs = pp_load_relaxed(&seg->block_size);
  unsigned cls = pp_load_relaxed(&seg->cls_index);
  pp_hist_forget(seg, idx);
  if (pp_unlikely(pp_hist_level(pool) >= PINPOOL_HISTORY_ALLOC))
    pp_hist_event(pool, PP_H_FREE_COMPLETED, (uintptr_t)ptr, bs, req, 0,
                  __builtin_return_address(0));
  account_free(tc, req, bs);
  pp_tbin_t *b = &tc->bins[cls];
  uint64_t bytes = pp_load_relaxed(&tc->bytes) + bs;
  if (pp_likely(b->n < b->cap && bytes <= pool->cfg.tcache_bytes &&
                tc->epoch == pp_load_relaxed(&pool->flush_epoch))) {
    b->items[b->n++] = (pp_tentry_t){ptr, seg, idx};
    pp_store_relaxed(&tc->bytes, bytes);
    return 0;
  }
  return free_push_slow(pool, tc, (pp_tentry_t){ptr, seg, idx}, cls);
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
