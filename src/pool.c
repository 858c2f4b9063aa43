/*
 * The pool's central layer: segments, the sharded central bins, limits,
 * trimming, empty_cache, create and destroy.
 *
 * Locks and their order (a lock may only be taken while holding locks to
 * its left): pp_global_lock (tcache.c) -> fork.c's registry lock ->
 * reg_lock -> seg_lock -> trim_lock -> bin locks (ascending index) ->
 * idle_lock -> reserve.lock; then the leaf locks, never held while another
 * lock is taken (stream.c's stripe, stream-list and queue locks, bg_mutex,
 * history's locks, the event provider's). Only the fork handlers hold the
 * locks of several pools at once (fork.c, in the order of its registry).
 * No provider call (mmap, munmap, mlock, driver) happens under any of them
 * (invariant 1): segments are created before their bin is locked, and
 * detached from every list before they are released.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Atomic(uint64_t) next_pool_id = 1;

/* ---- Descriptors -------------------------------------------------------- */

static pp_segment_t *desc_get(pinpool_t *pool, bool slab) {
  pp_segment_t *d;
  pp_mutex_lock(&pool->seg_lock);
  pp_segment_t **head = slab ? &pool->desc_free_slab : &pool->desc_free_large;
  d = *head;
  if (d != NULL)
    *head = d->all_next;
  pp_mutex_unlock(&pool->seg_lock);
  if (d != NULL)
    return d;
  uint32_t cap = slab ? (uint32_t)PP_SLAB_MAX_BLOCKS : 1u;
  /* Aligned, so that the cache-line layout of pp_segment_t holds. */
  size_t bytes = sizeof *d + cap * sizeof(d->word[0]);
  d = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  if (d != NULL) {
    memset(d, 0, bytes);
    d->capacity = cap;
  }
  return d;
}

/* The descriptor goes to a free list, never back to malloc while the pool
 * lives: a lock-free lookup racing with the release may still read it. */
static void desc_put_locked(pinpool_t *pool, pp_segment_t *d) {
  pp_assert_held(&pool->seg_lock);
  pp_segment_t **head =
      d->capacity > 1 ? &pool->desc_free_slab : &pool->desc_free_large;
  d->all_next = *head;
  *head = d;
}

/* ---- Reserved-bytes accounting with the max_reserved cap --------------- */

static bool reserve_bytes(pinpool_t *pool, size_t n) {
  uint64_t cap = pool->cfg.max_reserved;
  uint64_t cur = pp_load_relaxed(&pool->gs.reserved_cur);
  do {
    if (cap != 0 && (cur + n > cap || cur + n < cur))
      return false;
  } while (!atomic_compare_exchange_weak_explicit(&pool->gs.reserved_cur, &cur,
                                                  cur + n, memory_order_relaxed,
                                                  memory_order_relaxed));
  pp_atomic_max_relaxed(&pool->gs.reserved_peak, cur + n);
  return true;
}

/* Bytes that entered the pool as a new segment (reserved_cur is the
 * caller's: reserve_bytes, or remap_idle for memory it recycles). */
static void account_backend_alloc(pinpool_t *pool, size_t n, unsigned flags) {
  pp_fetch_add_relaxed(&pool->gs.reserved_alloc, n);
  pp_fetch_add_relaxed(&pool->gs.central_in, n); /* new memory is idle */
  if (flags & PP_SEG_LOCKED)
    pp_fetch_add_relaxed(&pool->gs.locked_bytes, n);
}

static int backend_alloc(pinpool_t *pool, size_t size, void **mem,
                         unsigned *flags) {
  if (!reserve_bytes(pool, size))
    return pp_fail(PINPOOL_ENOMEM,
                   "max_reserved (%llu bytes) reached: %llu reserved, %zu "
                   "more needed",
                   (unsigned long long)pool->cfg.max_reserved,
                   (unsigned long long)pp_load_relaxed(&pool->gs.reserved_cur),
                   size);
  uint64_t t0 = pp_now_ns();
  int rc = pp_fault_hit(&pool->cfg, PP_FAULT_ALLOC)
               ? pp_fail(PINPOOL_ENOMEM,
                         "backend '%s': injected failure of "
                         "an allocation of %zu bytes",
                         pool->prov.name, size)
               : pool->prov.alloc(pool->prov.ctx, size, mem, flags);
  pp_backend_timed(&pool->gs.ba_count, &pool->gs.ba_total, &pool->gs.ba_max,
                   t0);
  if (rc != 0) {
    pp_fetch_sub_relaxed(&pool->gs.reserved_cur, size);
    return rc;
  }
  account_backend_alloc(pool, size, *flags);
  if (*flags & PP_SEG_LOCK_FAILED)
    pp_fetch_add_relaxed(&pool->gs.mlock_failures, 1);
  return 0;
}

/* Bytes that left the pool (idle bytes of a released segment). */
static void account_backend_free(pinpool_t *pool, size_t size, unsigned flags) {
  pp_fetch_sub_relaxed(&pool->gs.reserved_cur, size);
  pp_fetch_add_relaxed(&pool->gs.reserved_freed, size);
  pp_fetch_add_relaxed(&pool->gs.central_out, size);
  if (flags & PP_SEG_LOCKED)
    pp_fetch_sub_relaxed(&pool->gs.locked_bytes, size);
}

/* The provider's free, timed; the bytes' accounting is the caller's. */
static void provider_free(pinpool_t *pool, void *mem, size_t size) {
  uint64_t t0 = pp_now_ns();
  pool->prov.free(pool->prov.ctx, mem, size);
  pp_backend_timed(&pool->gs.bf_count, &pool->gs.bf_total, &pool->gs.bf_max,
                   t0);
}

static void backend_free(pinpool_t *pool, void *mem, size_t size,
                         unsigned flags) {
  provider_free(pool, mem, size);
  account_backend_free(pool, size, flags);
}

/* ---- Segments ----------------------------------------------------------- */

/* Small classes share a segment: 2 MiB up to 64 KiB blocks (at most 2%
 * of it lost to the tail), eight blocks (no tail) up to 256 KiB. Larger
 * classes get a segment of their own. Every segment is larger than a
 * segment-map chunk (256 KiB), which segmap.c relies on. */
static size_t seg_bytes_for(size_t bs) {
  if (bs <= ((size_t)64 << 10))
    return PP_SLAB_SIZE;
  if (bs <= PP_SLAB_MAX_BLOCK)
    return 8 * bs;
  return (bs + PP_PAGE - 1) & ~(size_t)(PP_PAGE - 1);
}

/* A small class's segments start small and grow as the class holds more:
 * 512 KiB, 1 MiB, then 2 MiB (four blocks, then eight, above 64 KiB). A
 * mix that touches many small classes a little (W2, W5) then holds a
 * quarter of a 2 MiB slab per class, not a whole one (W5: memory held
 * 3.53 -> 3.15 times the peak requested; W2 with remap_min=0: 1.16 ->
 * 1.13). The
 * price: more segments for a busy class, ~5 % of W5's speed. nsegs: the
 * class's live segments (a racy read: a size, never a correctness input). */
static size_t slab_bytes_for(size_t bs, uint64_t nsegs) {
  if (bs <= ((size_t)64 << 10))
    return nsegs >= 2 ? PP_SLAB_SIZE : (size_t)512 << 10 << nsegs;
  return (nsegs == 0 ? 4 : 8) * bs; /* > 256 KiB: bs > 64 KiB */
}

/* Below, with the trimming it resembles. */
static int remap_idle(pinpool_t *pool, unsigned cls, unsigned shard,
                      size_t size, void **mem, unsigned *flags,
                      pp_parts_t *parts);

/* Remapping (config remap, a provider that can move memory): a miss of a
 * one-block class may make its segment of idle segments of other classes.
 * A segment of at least remap_min bytes may be gathered from smaller ones
 * (moved side by side: system calls); a smaller one only split from a
 * larger idle one (no system call), and only after borrowing found
 * nothing: a split takes the larger class's segment for good (a borrowed
 * block goes back to its class), so without borrowing to serve the near
 * misses a steady mix splits at every miss (docs/allocation-policy.md says why,
 * with the measurements: a steady mix of small sizes churns when it gathers,
 * and with borrow=0 when it splits). */
static bool pool_remaps(const pinpool_t *pool) {
  return pool->cfg.remap && pool->prov.remap != NULL;
}
static bool remap_gathers(const pinpool_t *pool, size_t seg_size) {
  return pool_remaps(pool) && seg_size >= pool->cfg.remap_min;
}
static bool remap_splits(const pinpool_t *pool, size_t seg_size) {
  return remap_gathers(pool, seg_size) ||
         (pool_remaps(pool) && pool->cfg.borrow > 0);
}

/* Make d a live segment of class cls over [mem, mem + size), owned by bin
 * (cls, shard): in the map and the list of all segments, in no bin list.
 * parts: its mappings, n == 0 for one. On failure d is recycled and the
 * memory given back. No lock held. */
static int seg_publish(pinpool_t *pool, pp_segment_t *d, void *mem, size_t size,
                       unsigned cls, unsigned shard, unsigned flags,
                       const pp_parts_t *parts) {
  size_t bs = pp_class_size(cls);
  uint32_t nblocks = (uint32_t)(size / bs);
  /* A recycled descriptor: its release bumped gen (seg_lock, taken by
   * desc_get since). The fence orders that bump before the new bounds, so
   * that a lookup reading one of them sees gen change (pp_segmap_find). */
  atomic_thread_fence(memory_order_release);
  pp_store_relaxed(&d->base, (uintptr_t)mem);
  pp_store_relaxed(&d->size, size);
  pp_store_relaxed(&d->block_size, bs);
  pp_store_relaxed(&d->nblocks, nblocks);
  pp_store_relaxed(&d->div_magic, (((uint64_t)1 << 42) + bs - 1) / bs);
  pp_store_relaxed(&d->cls_index, cls);
  /* A recycled descriptor: its release bumped gen (under seg_lock, which
   * desc_get took since). The fence orders that before the words below, so
   * a snapshot that reads one of them also sees the new gen and drops the
   * segment it was reading (snapshot.c). It also orders the bounds above
   * before this publication's gen bump (below), which a lookup reads with
   * acquire (pp_segmap_find). */
  atomic_thread_fence(memory_order_release);
  for (uint32_t i = 0; i < nblocks; i++)
    pp_store_relaxed(&d->word[i], PP_WORD(0, PP_NEVER));
  d->cls = cls;
  d->shard = shard;
  d->carved = 0;
  d->free_count = nblocks;
  d->free_head = 0;
  d->list = PP_LIST_NONE;
  d->prev = d->next = NULL;
  d->lru_prev = d->lru_next = NULL;
  d->in_lru = false;
  d->flags = flags;
  if (parts->n > 0)
    d->parts = *parts;
  else /* made by the provider: one mapping */
    d->parts = (pp_parts_t){1, {size}};

  pp_mutex_lock(&pool->seg_lock);
  int rc = pp_segmap_insert(pool->map, d); /* publishes d (release) */
  if (rc == 0) {
    pp_store_relaxed(&d->gen, pp_load_relaxed(&d->gen) + 1);
    d->all_prev = NULL;
    d->all_next = pool->all;
    if (pool->all != NULL)
      pool->all->all_prev = d;
    pool->all = d;
  } else {
    desc_put_locked(pool, d);
  }
  pp_mutex_unlock(&pool->seg_lock);
  if (rc != 0) {
    if (flags & PP_SEG_FROM_RESERVE)
      pp_reserve_give(&pool->reserve, mem, size);
    else
      backend_free(pool, mem, size, flags);
    return rc;
  }
  if (bs > PP_SLAB_MAX_BLOCK)
    pp_atomic_max_relaxed(&pool->top_cls, cls);
  pp_fetch_add_relaxed(&pool->parts_total, d->parts.n);
  pp_fetch_add_relaxed(&pool->cls_segs[cls], 1);
  pp_fetch_add_relaxed(&pool->gs.segs_alloc, 1);
  uint64_t n = pp_fetch_add_relaxed(&pool->gs.segs_cur, 1) + 1;
  pp_atomic_max_relaxed(&pool->gs.segs_peak, n);
  pp_hist_event(pool, PP_H_SEGMENT_ALLOC, (uintptr_t)mem, size, 0, 0, NULL);
  return 0;
}

/* Create a segment for class `cls`, owned by bin (cls, shard). Called with
 * no lock held; the segment is live and in the map but in no bin list. */
static int seg_create(pinpool_t *pool, unsigned cls, unsigned shard,
                      pp_segment_t **out) {
  size_t bs = pp_class_size(cls);
  bool slab = bs <= PP_SLAB_MAX_BLOCK;
  size_t size = slab ? slab_bytes_for(bs, pp_load_relaxed(&pool->cls_segs[cls]))
                     : seg_bytes_for(bs);
  pp_segment_t *d = desc_get(pool, slab);
  if (d == NULL)
    return pp_fail(PINPOOL_ENOMEM, "out of memory for segment metadata");

  void *mem = NULL;
  unsigned flags = 0;
  pp_parts_t parts = {0, {0}}; /* none: one part */
  if (pool->has_reserve && (mem = pp_reserve_take(&pool->reserve, size))) {
    flags = pool->reserve.flags | PP_SEG_FROM_RESERVE;
  } else {
    int rc = !slab && remap_splits(pool, size)
                 ? remap_idle(pool, cls, shard, size, &mem, &flags, &parts)
                 : 1;
    if (rc != 0)
      rc = backend_alloc(pool, size, &mem, &flags);
    if (rc != 0) {
      pp_mutex_lock(&pool->seg_lock);
      desc_put_locked(pool, d);
      pp_mutex_unlock(&pool->seg_lock);
      return rc;
    }
  }
  int rc = seg_publish(pool, d, mem, size, cls, shard, flags, &parts);
  if (rc == 0)
    *out = d;
  return rc;
}

/* Take d, detached (in no bin list, not in the LRU, every block free), out
 * of the segment map and the list of all segments, and recycle its
 * descriptor: lookups and snapshots no longer find it (one racing with this
 * sees the gen bump). Its memory is the caller's. Called with no lock. */
static void seg_unpublish(pinpool_t *pool, pp_segment_t *d) {
  uintptr_t base = pp_load_relaxed(&d->base);
  size_t size = pp_load_relaxed(&d->size);
  unsigned nparts = d->parts.n; /* d is recycled below */
  unsigned cls = d->cls;
  pp_mutex_lock(&pool->seg_lock);
  pp_store_relaxed(&d->gen, pp_load_relaxed(&d->gen) + 1);
  pp_segmap_remove(pool->map, d);
  if (d->all_prev != NULL)
    d->all_prev->all_next = d->all_next;
  else
    pool->all = d->all_next;
  if (d->all_next != NULL)
    d->all_next->all_prev = d->all_prev;
  desc_put_locked(pool, d);
  pp_mutex_unlock(&pool->seg_lock);
  pp_fetch_sub_relaxed(&pool->gs.segs_cur, 1);
  pp_fetch_add_relaxed(&pool->gs.segs_freed, 1);
  pp_fetch_sub_relaxed(&pool->parts_total, nparts);
  pp_fetch_sub_relaxed(&pool->cls_segs[cls], 1);
  pp_hist_event(pool, PP_H_SEGMENT_FREE, base, size, 0, 0, NULL);
}

/* Release a detached segment to its provider. Called with no lock held. */
static void seg_release(pinpool_t *pool, pp_segment_t *d) {
  uintptr_t base = pp_load_relaxed(&d->base);
  size_t size = pp_load_relaxed(&d->size);
  unsigned flags = d->flags;
  seg_unpublish(pool, d);
  if (flags & PP_SEG_FROM_RESERVE)
    pp_reserve_give(&pool->reserve, (void *)base, size);
  else
    backend_free(pool, (void *)base, size, flags);
}

static unsigned release_batch(pinpool_t *pool, pp_segment_t *batch) {
  unsigned n = 0;
  while (batch != NULL) {
    pp_segment_t *next = batch->next;
    seg_release(pool, batch);
    batch = next;
    n++;
  }
  return n;
}

/* ---- Bin lists ------------------------------------------------------------
 */

static void list_remove(pp_segment_t **head, pp_segment_t *s) {
  if (s->prev != NULL)
    s->prev->next = s->next;
  else
    *head = s->next;
  if (s->next != NULL)
    s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static void list_push(pp_segment_t **head, pp_segment_t *s) {
  s->prev = NULL;
  s->next = *head;
  if (*head != NULL)
    (*head)->prev = s;
  *head = s;
}

static void lru_remove_locked(pinpool_t *pool, pp_segment_t *s) {
  pp_assert_held(&pool->idle_lock);
  if (!s->in_lru)
    return;
  if (s->lru_prev != NULL)
    s->lru_prev->lru_next = s->lru_next;
  else
    pool->lru_head = s->lru_next;
  if (s->lru_next != NULL)
    s->lru_next->lru_prev = s->lru_prev;
  else
    pool->lru_tail = s->lru_prev;
  s->lru_prev = s->lru_next = NULL;
  s->in_lru = false;
}

/* Publish which lists of bin are non-empty (pp_bin_t.avail). Bin lock held. */
static void bin_publish(pp_bin_t *bin) {
  pp_assert_held(&bin->lock);
  pp_store_relaxed(&bin->avail, (bin->partial != NULL ? PP_BIN_PARTIAL : 0u) |
                                    (bin->idle != NULL ? PP_BIN_IDLE : 0u));
}

/* Move s to the list matching its free count. Caller holds its bin lock. */
static void seg_relist(pinpool_t *pool, pp_bin_t *bin, pp_segment_t *s) {
  pp_assert_held(&bin->lock);
  uint32_t nb = pp_load_relaxed(&s->nblocks);
  int want = s->free_count == nb  ? PP_LIST_IDLE
             : s->free_count == 0 ? PP_LIST_NONE
                                  : PP_LIST_PARTIAL;
  if (want == s->list)
    return; /* no list changed: avail is still right */
  if (s->list == PP_LIST_PARTIAL)
    list_remove(&bin->partial, s);
  else if (s->list == PP_LIST_IDLE)
    list_remove(&bin->idle, s);
  /* The LRU exists for max_cached (trimming oldest first); without a cap,
   * idle segments are found in the bins, and no segment pays for the LRU
   * lock every time it goes idle and back (the one-block segments of large
   * classes do at every central give and take). pp_trims: a cap is set. */
  bool lru = pp_trims(pool) && !(s->flags & PP_SEG_FROM_RESERVE);
  if (s->list == PP_LIST_IDLE && lru) {
    pp_mutex_lock(&pool->idle_lock);
    lru_remove_locked(pool, s);
    pp_mutex_unlock(&pool->idle_lock);
  }
  s->list = want;
  if (want == PP_LIST_PARTIAL) {
    list_push(&bin->partial, s);
  } else if (want == PP_LIST_IDLE) {
    list_push(&bin->idle, s);
    if (lru) { /* the reserve is kept: never trimmed */
      pp_mutex_lock(&pool->idle_lock);
      s->lru_next = NULL;
      s->lru_prev = pool->lru_tail;
      if (pool->lru_tail != NULL)
        pool->lru_tail->lru_next = s;
      else
        pool->lru_head = s;
      pool->lru_tail = s;
      s->in_lru = true;
      pp_mutex_unlock(&pool->idle_lock);
    }
  }
  bin_publish(bin);
}

/* Pop one free block of s. Caller holds the bin lock; s->free_count > 0. */
static pp_tentry_t seg_pop(pp_segment_t *s) {
  uint32_t idx;
  if (s->free_head != 0) {
    idx = s->free_head - 1;
    uint64_t w = pp_load_relaxed(&s->word[idx]);
    pp_assert(PP_WORD_STATE(w) == PP_CACHED);
    s->free_head = (uint32_t)PP_WORD_PAYLOAD(w);
  } else {
    idx = s->carved++;
    pp_assert(idx < pp_load_relaxed(&s->nblocks));
  }
  /* The block stays CACHED (now in a thread's hands) until allocated.
   * Release, as every store of a state word after the segment's
   * publication: a snapshot that reads it (acquire) also sees the gen bumps
   * before it, so its generation re-check drops a segment that was recycled
   * while it read (snapshot.c, read_blocks). Relaxed, that ordering held on
   * x86 and ARMv8 but not by the C11 model (docs/verification.md). */
  pp_store_release(&s->word[idx], PP_WORD(0, PP_CACHED));
  s->free_count--;
  size_t bs = pp_load_relaxed(&s->block_size);
  pp_tentry_t e = {(void *)(pp_load_relaxed(&s->base) + idx * bs), s, idx};
  return e;
}

#if PINPOOL_DEBUG >= 2
/* A block pushed twice would later be handed out twice. O(free list). */
static bool seg_listed(pp_segment_t *s, uint32_t idx) {
  for (uint32_t h = s->free_head; h != 0;
       h = (uint32_t)PP_WORD_PAYLOAD(pp_load_relaxed(&s->word[h - 1])))
    if (h == idx + 1)
      return true;
  return false;
}
#endif

static void seg_push(pp_segment_t *s, uint32_t idx) {
  pp_assert_expensive(!seg_listed(s, idx));
  /* Release: see seg_pop. */
  pp_store_release(&s->word[idx], PP_WORD(s->free_head, PP_CACHED));
  s->free_head = idx + 1;
  s->free_count++;
}

static uint32_t take_from_bin(pinpool_t *pool, pp_bin_t *bin, pp_tentry_t *out,
                              uint32_t want) {
  uint32_t n = 0;
  size_t bytes = 0;
  if (pp_load_relaxed(&bin->avail) == 0)
    return 0; /* nothing free here (a hint: see pp_bin_t.avail) */
#ifndef PINPOOL_MUTANT_BIN_NO_LOCK
  pp_mutex_lock(&bin->lock);
#endif
  while (n < want) {
    /* Partial segments first: keep idle ones whole so they can be trimmed. */
    pp_segment_t *s = bin->partial != NULL ? bin->partial : bin->idle;
    if (s == NULL)
      break;
    while (n < want && s->free_count > 0) {
      out[n++] = seg_pop(s);
      bytes += pp_load_relaxed(&s->block_size);
    }
    seg_relist(pool, bin, s);
  }
#ifndef PINPOOL_MUTANT_BIN_NO_LOCK
  pp_mutex_unlock(&bin->lock);
#else
  /* Race mutant: a refill that forgets the bin lock. */
#endif
  if (bytes != 0)
    pp_fetch_add_relaxed(&pool->gs.central_out, bytes);
  return n;
}

/* A miss of a class with one-block segments: rather than a new segment,
 * the block of an idle segment at most cfg.borrow classes larger (16, the
 * default: at most 4 times the size; 8: twice). The pool holds fewer, fuller
 * segments and calls the backend less, at the price of a larger block than the
 * class while it is allocated; freed, it goes back to its own class. A segment
 * partly in use has no free block (one block), so only idle ones qualify.
 * Returns 1 with *out, or 0. The caller must not put the block in a thread
 * cache stack of class cls. */
static int central_borrow(pinpool_t *pool, unsigned cls, unsigned shard,
                          pp_tentry_t *out) {
  unsigned ns = pool->cfg.shards;
  for (unsigned c = cls + 1; c <= cls + pool->cfg.borrow && c < PP_NCLASSES;
       c++) {
    if (pp_hot_take(pool, c, shard, out, NULL)) {
      pp_fetch_add_relaxed(&pool->gs.borrowed, 1);
      return 1;
    }
    for (unsigned i = 0; i < ns; i++) {
      pp_bin_t *bin = pp_bin(pool, c, (shard + i) % ns);
      if (!(pp_load_relaxed(&bin->avail) & PP_BIN_IDLE))
        continue;
      pp_mutex_lock(&bin->lock);
      pp_segment_t *s = bin->idle;
      if (s != NULL) {
        *out = seg_pop(s);
        seg_relist(pool, bin, s);
      }
      pp_mutex_unlock(&bin->lock);
      if (s != NULL) {
        pp_fetch_add_relaxed(&pool->gs.central_out, pp_class_size(c));
        pp_fetch_add_relaxed(&pool->gs.borrowed, 1);
        return 1;
      }
    }
  }
  return 0;
}

int pp_central_take(pinpool_t *pool, unsigned cls, unsigned shard,
                    pp_tentry_t *out, uint32_t want, bool *missed) {
  unsigned ns = pool->cfg.shards;
  for (unsigned i = 0; i < ns; i++) {
    uint32_t n =
        take_from_bin(pool, pp_bin(pool, cls, (shard + i) % ns), out, want);
    if (n > 0)
      return (int)n;
  }
  /* A bin's hot slot (a class without thread caches takes it before it
   * comes here; this is for any other path). */
  if (pp_hot_take(pool, cls, shard, out, NULL))
    return 1;
  /* A segment that remapping may gather is not served by borrowing: a
   * split or a gather serves the miss without the larger block's waste.
   * Except with a reserve, whose segments are never remapped: in a pool
   * that lives in its reserve, borrowing is what reuses them. */
  size_t bs = pp_class_size(cls);
  if (bs > PP_SLAB_MAX_BLOCK &&
      (!remap_gathers(pool, seg_bytes_for(bs)) || pool->has_reserve) &&
      central_borrow(pool, cls, shard, out))
    return 1;
  pp_segment_t *s = NULL;
  int rc = seg_create(pool, cls, shard, &s);
  if (rc != 0 || s == NULL)
    return rc;
  *missed = true;
  pp_bin_t *bin = pp_bin(pool, cls, shard);
  uint32_t n = 0;
  pp_mutex_lock(&bin->lock);
  while (n < want && s->free_count > 0)
    out[n++] = seg_pop(s);
  seg_relist(pool, bin, s);
  pp_mutex_unlock(&bin->lock);
  pp_fetch_add_relaxed(&pool->gs.central_out, n * bs);
  return (int)n;
}

void pp_central_give(pinpool_t *pool, unsigned cls, pp_tentry_t *in,
                     uint32_t n) {
  size_t bs = pp_class_size(cls);
  unsigned ns = pool->cfg.shards;
  /* Read every block's shard before the first push: once a block is back
   * in its bin, its segment may go idle and be released (and its descriptor
   * recycled for another bin) by another thread, so the entry must not be
   * looked at again. */
  uint8_t shard_of[64];
  while (n > 0) {
    uint32_t m = n < 64 ? n : 64;
    uint64_t used = 0;
    /* Counted before the pushes, so that a trimmer releasing one of these
     * segments never sees more bytes leave the bins than entered them. */
    pp_fetch_add_relaxed(&pool->gs.central_in, (uint64_t)m * bs);
    for (uint32_t i = 0; i < m; i++) {
      shard_of[i] = (uint8_t)in[i].seg->shard;
      used |= (uint64_t)1 << shard_of[i];
    }
    /* One lock acquisition per shard that owns some of the blocks: a
     * consumer returning a producer's blocks pays per batch, not per
     * block. */
    for (unsigned s = 0; s < ns; s++) {
      if (!(used & ((uint64_t)1 << s)))
        continue;
      pp_bin_t *bin = pp_bin(pool, cls, s);
      pp_mutex_lock(&bin->lock);
      for (uint32_t i = 0; i < m; i++) {
        if (shard_of[i] != s)
          continue;
        seg_push(in[i].seg, in[i].idx);
        seg_relist(pool, bin, in[i].seg);
      }
      pp_mutex_unlock(&bin->lock);
    }
    in += m;
    n -= m;
  }
}

/* ---- Hot slots -------------------------------------------------------------
 * A class above tcache_bytes has no thread cache: every allocation and
 * free would take its bin lock (W1 at 1 GiB: 185 ns a pair). (Nor does a
 * class above tcache_bytes / 16 for a thread that only frees it: alloc.c,
 * "one-block stacks"; its frees come here too.) Each bin keeps
 * instead the last one-block segment freed into it in an atomic slot; an
 * allocation takes it with one exchange. The block counts as central idle
 * memory, like a block in the lists (put and take counted in the moving
 * thread's slot_in / slot_out, or in central_in / central_out for a path
 * without a thread cache: hot_count), but its segment is in none: whatever
 * needs every idle segment in the lists (releasing idle memory, remapping)
 * drains the slots first (pp_hot_drain), and pools with a cap (which trim from
 * the lists on every free) do not use them. */

/* The slot's exchanges order the block's hand-off: the putter's last use
 * of the memory (and its CACHED word) before the taker's first. */
#ifdef PINPOOL_MUTANT_HOT_RELAXED
/* Race mutant (docs/verification.md): relaxed exchanges; the block's
 * memory then passes between threads with no happens-before. */
#define hot_xchg(p, v) atomic_exchange_explicit((p), (v), memory_order_relaxed)
#else
#define hot_xchg(p, v) pp_xchg_acq_rel((p), (v))
#endif

/* Empty bin's slot: the segment it held, or NULL. */
static pp_segment_t *hot_grab(pp_bin_t *bin) {
  if (pp_load_relaxed(&bin->hot) == NULL)
    return NULL; /* the common case, without a write to the line */
  return hot_xchg(&bin->hot, NULL);
}

/* Push s's block into its bin; it was counted as central idle already
 * (at its put). */
static void hot_return(pinpool_t *pool, pp_segment_t *s) {
  pp_bin_t *bin = pp_bin(pool, s->cls, s->shard);
  pp_mutex_lock(&bin->lock);
  seg_push(s, 0);
  seg_relist(pool, bin, s);
  pp_mutex_unlock(&bin->lock);
}

/* Counting: a slot's block is central idle memory, but counted (by the
 * thread that moves it) in a per-thread counter: summed with central_in
 * and central_out where cached bytes are read (stats.c, validate.c). Only
 * pools without a cap use slots, so trimming's central_cached never needs
 * them. */
static void hot_count(pp_counter_t *ctr, pp_counter_t *global, uint64_t bytes) {
  if (ctr != NULL)
    pp_owner_add(ctr, bytes);
  else
    pp_fetch_add_relaxed(global, bytes);
}

bool pp_hot_put(pinpool_t *pool, unsigned cls, const pp_tentry_t *e,
                uint64_t req, uint64_t epoch, pp_counter_t *ctr) {
  pp_segment_t *s = e->seg;
  if (pp_trims(pool) || pp_load_relaxed(&s->nblocks) != 1)
    return false;
  pp_bin_t *bin = pp_bin(pool, cls, s->shard);
  hot_count(ctr, &pool->gs.central_in, pp_class_size(cls));
  pp_store_relaxed(&s->hot_req, req);
  pp_store_relaxed(&s->hot_epoch, epoch);
  /* Release: the taker sees the block's CACHED word and the segment. */
  pp_segment_t *old = hot_xchg(&bin->hot, s);
  if (old != NULL)
    hot_return(pool, old);
  return true;
}

bool pp_hot_take(pinpool_t *pool, unsigned cls, unsigned shard,
                 pp_tentry_t *out, pp_counter_t *ctr) {
  unsigned ns = pool->cfg.shards;
  for (unsigned i = 0, sh = shard; i < ns; i++, sh = sh + 1 < ns ? sh + 1 : 0) {
    pp_segment_t *s = hot_grab(pp_bin(pool, cls, sh));
    if (s == NULL)
      continue;
    hot_count(ctr, &pool->gs.central_out, pp_class_size(cls));
    *out = (pp_tentry_t){(void *)pp_load_relaxed(&s->base), s, 0};
    return true;
  }
  return false;
}

void pp_hot_drain(pinpool_t *pool) {
  unsigned lo = pp_class_index(PP_SLAB_MAX_BLOCK) + 1;
  unsigned top = (unsigned)pp_load_relaxed(&pool->top_cls);
  for (unsigned c = lo; c <= top; c++)
    for (unsigned i = 0; i < pool->cfg.shards; i++) {
      pp_segment_t *s = hot_grab(pp_bin(pool, c, i));
      if (s != NULL)
        hot_return(pool, s);
    }
}

/* ---- Trimming and releasing idle memory --------------------------------- */

/* Detach the first idle segment of bin (class c, shard i) whose flags are
 * *flags (any, if *flags is UINT_MAX, which becomes the segment's) and that
 * spans at most max_parts mappings, as trimming does; NULL if none.
 * Segments carved from the reserve stay. trim_lock held: as in
 * detach_oldest, no other releaser can hold a segment we detach. */
static pp_segment_t *detach_idle_of(pinpool_t *pool, unsigned c, unsigned i,
                                    unsigned *flags, unsigned max_parts) {
  pp_assert_held(&pool->trim_lock);
  pp_bin_t *bin = pp_bin(pool, c, i);
  if (!(pp_load_relaxed(&bin->avail) & PP_BIN_IDLE))
    return NULL;
  pp_mutex_lock(&bin->lock);
  pp_segment_t *s = bin->idle;
  while (s != NULL &&
         ((s->flags & PP_SEG_FROM_RESERVE) ||
          (*flags != UINT_MAX && s->flags != *flags) || s->parts.n > max_parts))
    s = s->next;
  if (s != NULL) {
    list_remove(&bin->idle, s);
    s->list = PP_LIST_NONE;
    bin_publish(bin);
    if (pp_trims(pool)) {
      pp_mutex_lock(&pool->idle_lock);
      lru_remove_locked(pool, s);
      pp_mutex_unlock(&pool->idle_lock);
    }
    *flags = s->flags;
  }
  pp_mutex_unlock(&bin->lock);
  return s;
}

/* Idle one-block segments of other classes to make a segment of `size`
 * bytes (class cls) from, detached into seg[] (at most PP_REMAP_MAX);
 * returns how many, 0 if none qualifies. Which ones:
 *   1. the nearest larger one: split, it needs no system call at all (its
 *      tail stays idle as segments of smaller classes: carve_rest);
 *   2. else, if the size is at least remap_min (remap_gathers), the
 *      nearest smaller ones, largest first, until they add up to
 *      the size: moved side by side, only the rest populated. Their parts
 *      add up, plus one for a grown tail: at most PP_PARTS_MAX. One whose
 *      parts do not fit any more (or, past PP_PARTS_BUDGET for the pool,
 *      any of more than one part) is detached into *drop (linked through
 *      ->next) for release instead, and the new segment grows by its
 *      size: moves never merge mappings, and every split adds a cut, so
 *      without this the pool's mappings would only multiply; populating
 *      afresh is what brings them back to one.
 * All share one set of flags (locked or not): one kind of memory. */
static unsigned remap_gather(pinpool_t *pool, unsigned cls, size_t size,
                             pp_segment_t **seg, pp_segment_t **drop) {
  unsigned lo = pp_class_index(PP_SLAB_MAX_BLOCK) + 1; /* one-block classes */
  unsigned top = (unsigned)pp_load_relaxed(&pool->top_cls);
  unsigned ns = pool->cfg.shards;
  unsigned n = 0, flags = UINT_MAX, parts = 1; /* the tail's */
  size_t got = 0;
  pp_hot_drain(pool); /* their segments in the lists, as candidates */
  pp_mutex_lock(&pool->trim_lock);
  for (unsigned c = cls + 1; n == 0 && c <= top; c++)
    for (unsigned i = 0; n == 0 && i < ns; i++)
      if ((seg[n] = detach_idle_of(pool, c, i, &flags, PP_PARTS_MAX)) != NULL)
        n++;
  /* Below remap_min only a split: see remap_gathers. */
  bool split = n > 0 || !remap_gathers(pool, size);
  for (unsigned c = cls; !split && got < size && parts < PP_PARTS_MAX &&
                         n < PP_REMAP_MAX && c-- > lo;)
    for (unsigned i = 0; i < ns && got < size && n < PP_REMAP_MAX; i++) {
      pp_segment_t *s;
      while (got < size && n < PP_REMAP_MAX &&
             (s = detach_idle_of(pool, c, i, &flags, PP_PARTS_MAX)) != NULL) {
        got += pp_load_relaxed(&s->size);
        if (parts + s->parts.n > PP_PARTS_MAX ||
            (s->parts.n > 1 &&
             pp_load_relaxed(&pool->parts_total) > PP_PARTS_BUDGET)) {
          s->next = *drop;
          *drop = s;
          continue;
        }
        seg[n++] = s;
        parts += s->parts.n;
      }
    }
  pp_mutex_unlock(&pool->trim_lock);
  return n;
}

/* Recycled bytes entering the pool as a new segment: as a backend
 * allocation, but no cap applies (the pool held them a moment ago). */
static void account_recycled(pinpool_t *pool, size_t n, unsigned flags) {
  uint64_t cur = pp_fetch_add_relaxed(&pool->gs.reserved_cur, n) + n;
  pp_atomic_max_relaxed(&pool->gs.reserved_peak, cur);
  account_backend_alloc(pool, n, flags);
}

/* Cut the parts pc[0 .. n) after `len` bytes (at most their sum): returns
 * m, the parts pc[0 .. m) now hold exactly len bytes (the last shortened
 * if cut), and rest[0 .. *nrest) the bytes after them, in order. */
static unsigned cut_parts(pp_piece_t *pc, unsigned n, size_t len,
                          pp_piece_t *rest, unsigned *nrest) {
  unsigned m = 0;
  *nrest = 0;
  for (; m < n && len > 0; m++) {
    if (pc[m].size > len) {
      rest[(*nrest)++] = (pp_piece_t){(char *)pc[m].p + len, pc[m].size - len};
      pc[m].size = len;
    }
    len -= pc[m].size;
  }
  for (unsigned i = m; i < n; i++)
    rest[(*nrest)++] = pc[i];
  return m;
}

static void parts_of(const pp_piece_t *pc, unsigned m, pp_parts_t *out) {
  out->n = m;
  for (unsigned i = 0; i < m; i++)
    out->len[i] = pc[i].size;
}

/* The parts pc[0 .. n), the tail cut off recycled segments, become idle
 * segments of the largest one-block classes that fit (at most 4, largest
 * first), in bins of `shard`; what is left (less than a class step, or
 * below the one-block classes) goes back to the provider. Returns whether
 * a provider call was made. The bytes were accounted as released. */
static bool carve_rest(pinpool_t *pool, pp_piece_t *pc, unsigned n,
                       unsigned flags, unsigned shard) {
  pp_piece_t buf[2][PP_PARTS_MAX];
  size_t len = 0;
  for (unsigned i = 0; i < n; i++)
    len += pc[i].size;
  for (int k = 0; k < 4 && len > PP_SLAB_MAX_BLOCK; k++) {
    unsigned c = pp_class_index(len);
    while (seg_bytes_for(pp_class_size(c)) > len)
      c--;
    size_t sz = seg_bytes_for(pp_class_size(c));
    if (pp_class_size(c) <= PP_SLAB_MAX_BLOCK)
      break;
    pp_segment_t *d = desc_get(pool, false);
    if (d == NULL)
      break;
    pp_piece_t *next = buf[k & 1];
    unsigned nnext = 0;
    pp_parts_t parts;
    parts_of(pc, cut_parts(pc, n, sz, next, &nnext), &parts);
    account_recycled(pool, sz, flags);
    if (seg_publish(pool, d, pc[0].p, sz, c, shard, flags, &parts) == 0) {
      pp_bin_t *bin = pp_bin(pool, c, shard);
      pp_mutex_lock(&bin->lock);
      seg_relist(pool, bin, d); /* every block free: the idle list */
      pp_mutex_unlock(&bin->lock);
    } /* else seg_publish gave the bytes back, accounted */
    pc = next;
    n = nnext;
    len -= sz;
  }
  for (unsigned i = 0; i < n; i++)
    pool->prov.free(pool->prov.ctx, pc[i].p, pc[i].size);
  return n > 0;
}

/* A remap failed after its n segments' bytes were accounted as released:
 * give back the pieces the provider still has not (pc[0 .. np)), count the
 * segments as backend frees (segments.freed == backend_free.count +
 * remapped_segments) and undo the reservation of `grow`. */
static int remap_failed(pinpool_t *pool, const pp_piece_t *pc, unsigned np,
                        unsigned n, size_t grow, int rc) {
  for (unsigned i = 0; i < np; i++)
    pool->prov.free(pool->prov.ctx, pc[i].p, pc[i].size);
  pp_fetch_add_relaxed(&pool->gs.bf_count, n);
  pp_fetch_sub_relaxed(&pool->gs.reserved_cur, grow);
  return rc;
}

/* A miss of a one-block class (config remap, a provider with remap): idle
 * segments of other classes are made into this one (remap_gather) instead
 * of mapping new memory beside them. Their pages are resident and locked
 * already, so only what a grow adds is populated, and idle bytes that no
 * class of the current mix asks for become the block that is asked for: a
 * drifting mix no longer keeps idle segments of every class it ever used
 * (docs/allocation-policy.md). The provider moves parts, never a range
 * across kernel mappings. Returns 0 with *mem, *flags and *parts, 1 if
 * nothing was idle, or an error: the pieces were then given back and the
 * caller maps new memory. */
static int remap_idle(pinpool_t *pool, unsigned cls, unsigned shard,
                      size_t size, void **mem, unsigned *flags,
                      pp_parts_t *parts) {
  pp_segment_t *seg[PP_REMAP_MAX];
  pp_piece_t pc[PP_PARTS_MAX] = {{NULL, 0}}, rest[PP_PARTS_MAX];
  pp_segment_t *drop = NULL;
  unsigned n = remap_gather(pool, cls, size, seg, &drop);
  pp_fetch_add_relaxed(&pool->gs.trimmed, release_batch(pool, drop));
  if (n == 0)
    return 1;
  unsigned fl = seg[0]->flags, np = 0;
  size_t total = 0;
  for (unsigned i = 0; i < n; i++) {
    char *base = (char *)pp_load_relaxed(&seg[i]->base);
    for (unsigned k = 0; k < seg[i]->parts.n; k++) {
      pc[np++] = (pp_piece_t){base, seg[i]->parts.len[k]};
      base += seg[i]->parts.len[k];
    }
    total += pp_load_relaxed(&seg[i]->size);
    seg_unpublish(pool, seg[i]);
  }
  size_t grow = size > total ? size - total : 0;
  int rc = 0;
  if (!reserve_bytes(pool, grow)) {
    rc = pp_fail(PINPOOL_ENOMEM,
                 "max_reserved (%llu bytes) reached: %llu reserved, %zu "
                 "more needed",
                 (unsigned long long)pool->cfg.max_reserved,
                 (unsigned long long)pp_load_relaxed(&pool->gs.reserved_cur),
                 grow);
    grow = 0; /* nothing reserved to undo */
  } else if (pp_fault_hit(&pool->cfg, PP_FAULT_ALLOC)) {
    rc = pp_fail(PINPOOL_ENOMEM,
                 "backend '%s': injected failure of remapping %u segments "
                 "into %zu bytes",
                 pool->prov.name, n, size);
  }
  /* From here the pieces' bytes count as released (after the cap check
   * above, which must see them); what becomes a segment again is counted
   * in as new (account_recycled). */
  account_backend_free(pool, total, fl);
  if (rc != 0)
    return remap_failed(pool, pc, np, n, grow, rc);
  /* The parts of the new segment; more than needed: the rest stays where
   * it is, for carve_rest. */
  unsigned nrest = 0;
  unsigned m = cut_parts(pc, np, size - grow, rest, &nrest);
  pp_assert(m >= 1 && m <= np);
  uint64_t t0 = pp_now_ns();
  bool called = m > 1 || grow > 0;
  void *p = pc[0].p; /* one part, in place: no system call */
  if (called)
    rc = pool->prov.remap(pool->prov.ctx, pc, m, size, &p, &fl);
  if (rc != 0) /* the provider gave pc[0 .. m) back; rest is ours */
    return remap_failed(pool, rest, nrest, n, grow, rc);
  account_backend_alloc(pool, grow, fl); /* reserve_bytes counted it */
  account_recycled(pool, size - grow, fl);
  pp_fetch_add_relaxed(&pool->gs.remapped, n);
  parts_of(pc, m, parts);
  if (grow > 0) /* moved or grown in place: a part more, at most */
    parts->len[parts->n++] = grow;
  if (nrest > 0)
    called |= carve_rest(pool, rest, nrest, fl, shard);
  if (called)
    pp_backend_timed(&pool->gs.ba_count, &pool->gs.ba_total, &pool->gs.ba_max,
                     t0);
  *mem = p;
  *flags = fl;
  return 0;
}

/* Detach s, an idle segment of the LRU that the caller removed from the LRU
 * under trim_lock, from its bin. Returns false if it was reused meanwhile. */
static bool detach_idle(pinpool_t *pool, pp_segment_t *s) {
  pp_assert_held(&pool->trim_lock);
  pp_bin_t *bin = pp_bin(pool, s->cls, s->shard);
  bool ok = false;
  pp_mutex_lock(&bin->lock);
  if (s->list == PP_LIST_IDLE) {
    list_remove(&bin->idle, s);
    s->list = PP_LIST_NONE;
    bin_publish(bin);
    /* s may have been reused and gone idle again after we took it off the
     * LRU, which put it back on: take it off again, or the LRU would keep
     * a released descriptor. */
    pp_mutex_lock(&pool->idle_lock);
    lru_remove_locked(pool, s);
    pp_mutex_unlock(&pool->idle_lock);
    ok = true;
  }
  pp_mutex_unlock(&bin->lock);
  return ok;
}

static uint64_t central_cached(pinpool_t *pool) {
  uint64_t in = pp_load_relaxed(&pool->gs.central_in);
  uint64_t out = pp_load_relaxed(&pool->gs.central_out);
  return in > out ? in - out : 0;
}

/* Detach up to the oldest idle segments from the LRU. `budget`: bytes to
 * free (UINT64_MAX: all). Returns a batch linked through ->next. */
static pp_segment_t *detach_oldest(pinpool_t *pool, uint64_t budget) {
  pp_segment_t *batch = NULL;
  uint64_t got = 0;
  pp_mutex_lock(&pool->trim_lock);
  while (got < budget) {
    pp_mutex_lock(&pool->idle_lock);
    pp_segment_t *s = pool->lru_head;
    if (s != NULL)
      lru_remove_locked(pool, s);
    pp_mutex_unlock(&pool->idle_lock);
    if (s == NULL)
      break;
    /* trim_lock keeps every other releaser away, so s stays live: it can
     * only have been taken back into use, which detach_idle sees. */
    if (detach_idle(pool, s)) {
      s->next = batch;
      batch = s;
      got += pp_load_relaxed(&s->size);
    }
  }
  pp_mutex_unlock(&pool->trim_lock);
  return batch;
}

void pp_trim_to_cap(pinpool_t *pool) {
  if (!pp_trims(pool))
    return;
  uint64_t exempt = pool->has_reserve ? pool->reserve.size : 0;
  uint64_t cached = central_cached(pool);
  uint64_t cap = pool->cfg.max_cached != 0 ? pool->cfg.max_cached : UINT64_MAX;
  if (pool->cfg.max_cached_pct != 0) {
    /* Relative cap: idle bytes in the bins at most pct % of the bytes
     * outside them (allocated, pending, in thread caches). Both terms are
     * read without a lock; a trim decided on slightly stale values
     * releases a segment more or less, never a block in use. */
    uint64_t res = pp_load_relaxed(&pool->gs.reserved_cur);
    uint64_t used = res > cached ? res - cached : 0;
    uint64_t rel = pp_sat_mul(used / 100, pool->cfg.max_cached_pct);
    if (rel < cap)
      cap = rel;
  }
  /* Saturating: a cap near 2^64 plus the reserve wrapped to a small number
   * and trimmed every idle segment (docs/verification.md, "Review
   * defects", 6). */
  uint64_t limit = pp_sat_add(cap, exempt);
  if (cached <= limit)
    return;
  pp_segment_t *batch = detach_oldest(pool, cached - limit);
  pp_fetch_add_relaxed(&pool->gs.trimmed, release_batch(pool, batch));
}

unsigned pp_release_idle(pinpool_t *pool, bool keep_reserve) {
  pp_hot_drain(pool);
  pp_segment_t *batch = detach_oldest(pool, UINT64_MAX);
  /* What the LRU does not hold: every idle segment when there is no
   * max_cached (no LRU), and those carved from the reserve (giving them
   * back coalesces the reserve for large requests). Walk the bins. */
  if (!pp_trims(pool) || (pool->has_reserve && !keep_reserve)) {
    pp_mutex_lock(&pool->trim_lock);
    size_t nbins = (size_t)PP_NCLASSES * pool->cfg.shards;
    for (size_t i = 0; i < nbins; i++) {
      pp_bin_t *bin = &pool->bins[i];
      pp_mutex_lock(&bin->lock);
      for (pp_segment_t *s = bin->idle, *next; s != NULL; s = next) {
        next = s->next;
        if (keep_reserve && (s->flags & PP_SEG_FROM_RESERVE))
          continue;
        list_remove(&bin->idle, s);
        s->list = PP_LIST_NONE;
        pp_mutex_lock(&pool->idle_lock);
        lru_remove_locked(pool, s);
        pp_mutex_unlock(&pool->idle_lock);
        s->next = batch;
        batch = s;
      }
      bin_publish(bin);
      pp_mutex_unlock(&bin->lock);
    }
    pp_mutex_unlock(&pool->trim_lock);
  }
  return release_batch(pool, batch);
}

static void free_desc(pp_segment_t *s) {
  free(pp_load_relaxed(&s->info));
  _Atomic(struct pp_sset *) *arr = pp_load_relaxed(&s->ssets);
  if (arr != NULL) {
    for (uint32_t i = 0; i < s->capacity; i++)
      free(pp_load_relaxed(&arr[i]));
    free(arr);
  }
  free(s);
}

void pp_segment_release_all(pinpool_t *pool) {
  /* destroy: no other thread uses the pool; release without detaching. */
  pp_segment_t *s = pool->all;
  while (s != NULL) {
    pp_segment_t *next = s->all_next;
    uintptr_t base = pp_load_relaxed(&s->base);
    size_t size = pp_load_relaxed(&s->size);
    if (!(s->flags & PP_SEG_FROM_RESERVE))
      backend_free(pool, (void *)base, size, s->flags);
    free_desc(s);
    s = next;
  }
  pool->all = NULL;
  pp_segment_t *lists[2] = {pool->desc_free_slab, pool->desc_free_large};
  for (int i = 0; i < 2; i++) {
    for (s = lists[i]; s != NULL;) {
      pp_segment_t *next = s->all_next;
      free_desc(s);
      s = next;
    }
  }
  pool->desc_free_slab = pool->desc_free_large = NULL;
}

/* ---- Create and destroy -------------------------------------------------- */

static void pool_free_struct(pinpool_t *pool, bool streams_ready) {
  if (streams_ready)
    pp_streams_fini(pool);
  if (pool->bins != NULL) {
    size_t nbins = (size_t)PP_NCLASSES * pool->cfg.shards;
    for (size_t i = 0; i < nbins; i++)
      pp_mutex_destroy(&pool->bins[i].lock);
    free(pool->bins);
  }
  pp_segmap_destroy(pool->map);
  pp_mutex_destroy(&pool->seg_lock);
  pp_mutex_destroy(&pool->trim_lock);
  pp_mutex_destroy(&pool->idle_lock);
  pp_mutex_destroy(&pool->reg_lock);
  pp_hist_fini(pool);
  if (pool->has_events && pool->ev.destroy != NULL)
    pool->ev.destroy(pool->ev.ctx);
  if (pool->prov.destroy != NULL)
    pool->prov.destroy(pool->prov.ctx);
  if (pool->cuda != NULL)
    pp_cuda_close(pool->cuda);
  free(pool);
}

static int open_providers(pinpool_t *pool, const pinpool_hooks_t *hooks) {
  const pp_config_t *cfg = &pool->cfg;
  int rc = pp_numa_check(cfg->numa_node);
  if (rc == 0 && (cfg->backend == PP_BACKEND_CUDA ||
                  cfg->backend == PP_BACKEND_CUDA_REGISTER ||
                  cfg->events == PP_EVENTS_CUDA))
    rc = pp_cuda_open(cfg, &pool->cuda);
  if (rc != 0)
    return rc;
  if (hooks != NULL && hooks->backend != NULL)
    rc = pp_backend_user_open(hooks->backend, &pool->prov);
  else if (cfg->backend == PP_BACKEND_MALLOC)
    rc = pp_backend_malloc_open(cfg, &pool->prov);
  else if (cfg->backend == PP_BACKEND_CUDA ||
           cfg->backend == PP_BACKEND_CUDA_REGISTER)
    rc = pp_backend_cuda_open(cfg, pool->cuda, &pool->prov);
  else
    rc = pp_backend_host_open(cfg, &pool->prov);
  if (rc != 0)
    return rc;
  if (hooks != NULL && hooks->events != NULL)
    rc = pp_events_user_open(hooks->events, &pool->ev);
  else if (cfg->events == PP_EVENTS_SIMULATED)
    rc = pp_events_sim_open(cfg, &pool->ev);
  else if (cfg->events == PP_EVENTS_CUDA)
    rc = pp_events_cuda_open(cfg, pool->cuda, &pool->ev);
  else
    return 0;
  pool->has_events = rc == 0;
  return rc;
}

static int pool_new(const pp_config_t *cfg, const pinpool_hooks_t *hooks,
                    pinpool_t **out) {
  pinpool_t *pool = calloc(1, sizeof *pool);
  if (pool == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  pool->cfg = *cfg;
  pool->cfg.fault = cfg->fault_site != PP_FAULT_NONE ? &pool->fault : NULL;
  pp_mutex_init(&pool->seg_lock);
  pp_mutex_init(&pool->trim_lock);
  pp_mutex_init(&pool->idle_lock);
  pp_mutex_init(&pool->reg_lock);
  (void)pp_hist_init(pool);
  if (hooks != NULL) {
    pool->on_error = hooks->on_error;
    pool->error_arg = hooks->error_arg;
  }
  int rc = open_providers(pool, hooks);
  if (rc == 0)
    rc = pp_segmap_create(&pool->map);
  size_t nbins = (size_t)PP_NCLASSES * cfg->shards;
  if (rc == 0) {
    pool->bins = aligned_alloc(64, nbins * sizeof(pp_bin_t));
    if (pool->bins == NULL) {
      rc = pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
    } else {
      memset(pool->bins, 0, nbins * sizeof(pp_bin_t));
      for (size_t i = 0; i < nbins; i++)
        pp_mutex_init(&pool->bins[i].lock);
    }
  }
  if (rc != 0) {
    pool_free_struct(pool, false);
    return rc;
  }
  (void)snprintf(pool->backend_name, sizeof pool->backend_name, "%s",
                 pool->prov.name);
  pool->id = pp_fetch_add_relaxed(&next_pool_id, 1);
  atomic_init(&pool->refs, 1); /* the owner's: pinpool_destroy drops it */
  rc = pp_streams_init(pool);
  if (rc != 0) {
    pool_free_struct(pool, true);
    return rc;
  }
  if (cfg->reserve > 0) {
    size_t size = (cfg->reserve + PP_PAGE - 1) & ~(uint64_t)(PP_PAGE - 1);
    void *mem = NULL;
    unsigned flags = 0;
    rc = backend_alloc(pool, size, &mem, &flags);
    if (rc != 0) {
      pool_free_struct(pool, true);
      return rc;
    }
    if ((uintptr_t)mem + size > ((uintptr_t)1 << PP_MAP_ADDR_BITS)) {
      /* Segments carved from it could never be mapped (segmap.c). */
      backend_free(pool, mem, size, flags);
      pool_free_struct(pool, true);
      return pp_fail(PINPOOL_EBACKEND,
                     "backend returned the reserve at %p, beyond 2^48", mem);
    }
    pp_reserve_init(&pool->reserve, mem, size, flags);
    pool->has_reserve = true;
  }
  pp_fork_register(pool); /* fork.c: the fork handlers see it from now */
  *out = pool;
  return 0;
}

int pinpool_create(const char *config, pinpool_t **out) {
  return pinpool_create_ex(config, NULL, out);
}

int pinpool_create_with_backend(const char *config,
                                const pinpool_backend_t *backend,
                                pinpool_t **out) {
  if (backend == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_create_with_backend: backend is NULL");
  pinpool_hooks_t hooks = {backend, NULL, NULL, NULL};
  return pinpool_create_ex(config, &hooks, out);
}

int pinpool_create_ex(const char *config, const pinpool_hooks_t *hooks,
                      pinpool_t **out) {
  if (out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_create: out is NULL");
  bool ub = hooks != NULL && hooks->backend != NULL;
  bool ue = hooks != NULL && hooks->events != NULL;
  if (ub && (hooks->backend->alloc == NULL || hooks->backend->free == NULL))
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_create: backend alloc and free must be set");
  if (ue &&
      (hooks->events->record == NULL || hooks->events->query == NULL ||
       hooks->events->synchronize == NULL || hooks->events->release == NULL))
    return pp_fail(PINPOOL_EINVAL, "pinpool_create: event provider "
                                   "record, query, synchronize and release "
                                   "must be set");
  if (config == NULL)
    config = getenv("PINPOOL_CONF");
  pp_config_t cfg;
  int rc = pp_config_parse(config, ub, ue, &cfg);
  if (rc != 0)
    return rc;
  return pool_new(&cfg, hooks, out);
}

/* The pool is torn down when its last reference goes: the owner's (given
 * up by pinpool_destroy) or one held by an object that must outlive it,
 * such as a buffer (pp_pool_ref). */
void pp_pool_ref(pinpool_t *pool) { pp_fetch_add_relaxed(&pool->refs, 1); }

bool pp_pool_unref_unless_last(pinpool_t *pool) {
  uint64_t r = pp_load_relaxed(&pool->refs);
  do {
    if (r <= 1)
      return false;
    /* Release: this holder's writes before a teardown's acquire. */
  } while (!atomic_compare_exchange_weak_explicit(
      &pool->refs, &r, r - 1, memory_order_release, memory_order_relaxed));
  return true;
}

bool pp_pool_try_ref(pinpool_t *pool) {
  uint64_t r = pp_load_relaxed(&pool->refs);
  do {
    if (r == 0)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &pool->refs, &r, r + 1, memory_order_relaxed, memory_order_relaxed));
  return true;
}

static void pool_teardown(pinpool_t *pool);

void pp_pool_unref(pinpool_t *pool) {
  /* acq_rel: the thread that tears down sees every other holder's writes. */
  if (atomic_fetch_sub_explicit(&pool->refs, 1, memory_order_acq_rel) == 1)
    pool_teardown(pool);
}

void pinpool_destroy(pinpool_t *pool) {
  if (pool == NULL)
    return;
  pp_pool_unref(pool);
}

static void pool_teardown(pinpool_t *pool) {
  /* First: a fork from now on neither locks nor repairs this pool (in a
   * child it is garbage, as in the parent). */
  pp_fork_unregister(pool);
  /* Wait for the device before the memory goes back to the backend: a
   * stream may still be reading a pending block. */
  (void)pinpool_synchronize(pool);
  pp_tcache_pool_destroy(pool);
  pp_streams_fini(pool);
  pp_segment_release_all(pool);
  if (pool->has_reserve) {
    backend_free(pool, (void *)pool->reserve.base, pool->reserve.size,
                 pool->reserve.flags);
    pp_reserve_fini(&pool->reserve);
  }
  pool_free_struct(pool, false);
}

/* ---- Public maintenance calls ------------------------------------------ */

int pinpool_empty_cache(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_empty_cache: pool is NULL");
  pp_hist_event(pool, PP_H_EMPTY_CACHE, 0, 0, 0, 0,
                __builtin_return_address(0));
  /* Other threads flush at their next call: their caches have no lock, so
   * only their owners may touch them (tcache.c). */
#ifdef PINPOOL_MUTANT_EPOCH_PLAIN
  /* Race mutant: the flag every hot path reads, written as a plain field
   * (PyTorch's record_history_ race). */
  (*(uint64_t *)&pool->flush_epoch)++;
#else
  atomic_fetch_add_explicit(&pool->flush_epoch, 1, memory_order_release);
#endif
#ifdef PINPOOL_MUTANT_REMOTE_DRAIN
  /* Race mutant: drain every thread's cache from here, without the owners
   * knowing. */
  pp_mutex_lock(&pool->reg_lock);
  for (pp_tcache_t *tc = pool->caches; tc != NULL; tc = tc->pool_next)
    pp_tcache_flush_all(tc);
  pp_mutex_unlock(&pool->reg_lock);
#endif
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED,
                   "pinpool_empty_cache: a CUDA pool in a child of fork");
  /* The cache before the busy section: finding it may take pp_global_lock,
   * which a fork holds while it waits for busy sections. */
  pp_tls_way_t *w = pp_tls_way(pool->id);
  pp_tcache_t *tc = w->pool_id == pool->id ? w->tc : pp_tcache_get_slow(pool);
  if (tc == NULL)
    return pp_fail(PINPOOL_ENOMEM, "out of memory for the thread cache");
  /* A busy section (fork.c): draining the hot slots and releasing idle
   * segments move segments between lists and counters without one lock
   * held throughout, which no child may inherit half done. */
  pp_busy_enter();
  pp_process(pool, UINT32_MAX, false); /* reclaim what has completed */
  pp_tcache_flush_all(tc);
  pp_trim_to_cap(pool);
  (void)pp_release_idle(pool, false);
  pp_busy_leave();
  return 0;
}

int pinpool_get_config(pinpool_t *pool, char *buf, size_t len, size_t *needed) {
  if (pool == NULL || (buf == NULL && len != 0))
    return pp_fail(PINPOOL_EINVAL, "pinpool_get_config: NULL argument");
  const char *name =
      pool->cfg.backend == PP_BACKEND_USER ? NULL : pool->backend_name;
  size_t n = pp_config_format(&pool->cfg, name, NULL, 0);
  if (needed != NULL)
    *needed = n + 1;
  if (n + 1 > len)
    return pp_fail(PINPOOL_EOVERFLOW,
                   "pinpool_get_config: buffer of %zu bytes, %zu needed", len,
                   n + 1);
  (void)pp_config_format(&pool->cfg, name, buf, len);
  return 0;
}
