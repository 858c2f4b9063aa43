/*
 * The pool's central layer: segments, the sharded central bins, the hot
 * slots, limits and trimming. Creating and destroying a pool, its
 * reference count and the public maintenance calls are in lifecycle.c.
 *
 * Locks and their order (a lock may only be taken while holding locks to
 * its left): pp_global_lock (tcache.c) -> fork.c's registry lock ->
 * reg_lock -> seg_lock (also the arena's: arena.c) -> trim_lock -> bin
 * locks (ascending index) -> idle_lock; then the leaf locks, never held while
 * another lock is taken (stream.c's stripe, stream-list and queue locks,
 * bg_mutex, history's locks, the event provider's). Only the fork handlers hold
 * the locks of several pools at once (fork.c, in the order of its registry). No
 * provider call (mmap, munmap, mlock, driver) happens under any of them
 * (invariant 1): segments are created before their bin is locked, and
 * detached from every list before they are released.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Descriptors -------------------------------------------------------- */

/* A recycled descriptor, or NULL if its free list is empty. */
static pp_segment_t *desc_pop_locked(pinpool_t *pool, bool slab) {
  pp_assert_held(&pool->seg_lock);
  pp_segment_t **head = slab ? &pool->desc_free_slab : &pool->desc_free_large;
  pp_segment_t *d = *head;
  if (d != NULL)
    *head = d->all_next;
  return d;
}

static pp_segment_t *desc_new(bool slab) {
  uint32_t cap = slab ? (uint32_t)PP_SLAB_MAX_BLOCKS : 1u;
  /* Aligned, so that the cache-line layout of pp_segment_t holds. */
  size_t bytes = sizeof(pp_segment_t) + cap * sizeof(_Atomic(uint64_t));
  pp_segment_t *d = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
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

/* ---- Segments -----------------------------------------------------------
 *
 * A segment is created and released in one hold of seg_lock, which also
 * guards the arena: the descriptor, the carve or the give, the segment map
 * and the list of all segments at once. A large block is a segment of its
 * own, so W5's mix of large sizes creates and releases one per operation
 * (docs/benchmarks.md, "W5": five lock holds per block before). Only a
 * carve that needs the arena to grow (or idle slabs given back first)
 * leaves the lock: growth populates memory (invariant 1). */

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

/* A counter that only seg_lock's holder writes: a load and a store, no
 * read-modify-write (lock-free readers see a value it had). */
static inline void locked_add(pp_counter_t *c, uint64_t v) {
  pp_store_relaxed(c, pp_load_relaxed(c) + v);
}

/* Make d a live segment of class cls over [mem, mem + size), blocks of
 * bs bytes (the class size; a large block's page-rounded request), owned
 * by bin (cls, shard): in the map and the list of all segments, in no bin
 * list. On failure d is recycled and the memory given back to the arena.
 * Caller holds seg_lock. */
static int seg_publish_locked(pinpool_t *pool, pp_segment_t *d, void *mem,
                              size_t size, unsigned cls, size_t bs,
                              unsigned shard, unsigned flags) {
  pp_assert_held(&pool->seg_lock);
  uint32_t nblocks = (uint32_t)(size / bs);
  /* A recycled descriptor: its release bumped gen (under seg_lock). The
   * fence orders that bump before the new bounds, so that a lookup reading
   * one of them sees gen change (pp_segmap_find). */
  atomic_thread_fence(memory_order_release);
  pp_store_relaxed(&d->base, (uintptr_t)mem);
  pp_store_relaxed(&d->size, size);
  pp_store_relaxed(&d->block_size, bs);
  pp_store_relaxed(&d->nblocks, nblocks);
  pp_store_relaxed(&d->div_magic, (((uint64_t)1 << 42) + bs - 1) / bs);
  pp_store_relaxed(&d->cls_index, cls);
  /* The fence orders that gen bump before the words below, so a snapshot
   * that reads one of them also sees the new gen and drops the segment it
   * was reading (snapshot.c). It also orders the bounds above before this
   * publication's gen bump (below), which a lookup reads with acquire
   * (pp_segmap_find). */
  atomic_thread_fence(memory_order_release);
  for (uint32_t i = 0; i < nblocks; i++)
    pp_store_relaxed(&d->word[i], PP_WORD(0, PP_NEVER));
  d->cls = cls;
  d->shard = shard;
  d->node = shard / pool->cfg.shards; /* the node whose arena mem is from */
  d->carved = 0;
  d->free_count = nblocks;
  d->free_head = 0;
  d->list = PP_LIST_NONE;
  d->prev = d->next = NULL;
  d->lru_prev = d->lru_next = NULL;
  d->in_lru = false;
  d->flags = flags;

  int rc = pp_segmap_insert(pool->map, d); /* publishes d (release) */
  if (rc != 0) {
    desc_put_locked(pool, d);
    pp_arena_give_locked(pool, d->node, mem, size);
    return rc;
  }
  pool->arena.node[d->node].segs++;
  pp_store_relaxed(&d->gen, pp_load_relaxed(&d->gen) + 1);
  d->all_prev = NULL;
  d->all_next = pool->all;
  if (pool->all != NULL)
    pool->all->all_prev = d;
  pool->all = d;
  locked_add(&pool->cls_segs[cls], 1);
  if (flags & PP_SEG_FALLBACK)
    locked_add(&pool->gs.fallback_blocks, nblocks);
  locked_add(&pool->gs.segs_alloc, 1);
  locked_add(&pool->gs.segs_cur, 1);
  pp_atomic_max_relaxed(&pool->gs.segs_peak,
                        pp_load_relaxed(&pool->gs.segs_cur));
  return 0;
}

static void seg_release_locked(pinpool_t *pool, pp_segment_t *d);

/* ---- Deferred gives --------------------------------------------------------
 * A large block given back (a thread cache's flush, a displaced hot slot)
 * is pushed on pool->deferred with one compare-and-swap and no lock; the
 * next thread that holds seg_lock to carve a segment releases the stack
 * to the arena first, a piece of at most PP_DEFER_PIECE blocks a hold,
 * where the blocks coalesce before the carve looks for room. So the arena
 * is about as coalesced at every carve as if each give had taken the lock
 * (a carve after a burst of frees may look before the rest of the burst
 * is in), and a thread that only frees (a consumer of
 * another thread's blocks: W3, W5) never takes seg_lock, nor touches the
 * arena's extents, boundary table and segment map, which stay in the
 * carving thread's cache. A deferred block is central idle memory, like a
 * hot slot's; whatever needs every idle byte in the arena (an arena about
 * to grow, pp_release_idle) drains the whole stack first, in pieces: the
 * hold that decides to grow is one that found it empty (arena.c,
 * gather_locked). Pools with a cap, which trim on every free, give at
 * once. Blocks leave the stack only under seg_lock (pp_defer_drain_locked),
 * so no pop can meet a recycled top (no ABA). */
#ifdef PINPOOL_MUTANT_DEFER_RELAXED
/* Race mutant (docs/verification.md): the stack pushed and emptied with
 * relaxed ordering; a block's memory then passes from the freeing thread
 * to the carving one with no happens-before. */
#define defer_cas(p, e, v)                                                     \
  atomic_compare_exchange_strong_explicit((p), (e), (v), memory_order_relaxed, \
                                          memory_order_relaxed)
#define defer_load(p) atomic_load_explicit((p), memory_order_relaxed)
#else
/* Release (push): the freeing thread's last use of the block and its
 * defer_next link before the drain; acquire (the drain's load of the top,
 * and its CAS) pairs with it. */
#define defer_cas(p, e, v) pp_cas_acq_rel((p), (e), (v))
#define defer_load(p) pp_load_acquire(p)
#endif

static void defer_push(pinpool_t *pool, pp_segment_t *first,
                       pp_segment_t *last) {
  pp_segment_t *top = pp_load_relaxed(&pool->deferred);
  do
    pp_store_relaxed(&last->defer_next, top);
  while (!defer_cas(&pool->deferred, &top, first));
}

/* A drain releases at most PP_DEFER_PIECE blocks in one hold of seg_lock
 * (issue 38: one carve released the whole stack, 2,000 segments in
 * 677 us, while every other carve waited). The blocks come off the top:
 * only seg_lock's holder takes any, so the chain below the top is stable
 * (pushers change only the top) and the top read cannot be a recycled one
 * (ABA): a block leaves the stack only under the lock held here. */
#define PP_DEFER_PIECE 32

unsigned pp_defer_drain_locked(pinpool_t *pool) {
  pp_assert_held(&pool->seg_lock);
  if (pp_load_relaxed(&pool->deferred) == NULL)
    return 0; /* the common case: no write to the line */
#ifdef PINPOOL_MUTANT_DEFER_ONE_HOLD
  /* Mutant (docs/verification.md): the whole stack in one hold, as before
   * the pieces; test_scale's defer_hold must fail. */
  const unsigned piece = UINT32_MAX;
#else
  const unsigned piece = PP_DEFER_PIECE;
#endif
  /* Acquire (and the CAS's on failure): the pushes' links. */
  pp_segment_t *top = defer_load(&pool->deferred), *last, *rest;
  unsigned n;
  do {
    last = top;
    for (n = 1; n < piece; n++) {
      pp_segment_t *next = pp_load_relaxed(&last->defer_next);
      if (next == NULL)
        break;
      last = next;
    }
    rest = pp_load_relaxed(&last->defer_next);
  } while (!defer_cas(&pool->deferred, &top, rest));
  pp_lock_visit(&pool->seg_lock, n);
  pp_segment_t *s = top;
  for (unsigned k = 0; k < n; k++) {
    pp_segment_t *next = pp_load_relaxed(&s->defer_next);
    seg_release_locked(pool, s);
    s = next;
  }
  return n;
}

bool pp_defer_pending(pinpool_t *pool) {
  return pp_load_relaxed(&pool->deferred) != NULL;
}

/* Every block deferred before the call, a piece a hold. A thread that
 * keeps pushing only makes it take more holds: each piece it drains was
 * freed by some allocation, so the laps end. */
unsigned pp_defer_drain(pinpool_t *pool) {
  unsigned n = 0;
  while (pp_load_relaxed(&pool->deferred) != NULL) {
    if (n != 0)
      pp_hook(PP_HOOK_WALK_PIECE); /* between two pieces */
    pp_mutex_lock(&pool->seg_lock);
    n += pp_defer_drain_locked(pool);
    pp_mutex_unlock(&pool->seg_lock);
  }
  return n;
}

/* Create a segment for class `cls` (blocks of bs bytes: see
 * seg_publish_locked), owned by bin (cls, shard), carved from the arena.
 * Called with no lock held; the segment is live and in the map but in no
 * bin list. */
static int seg_create(pinpool_t *pool, unsigned cls, size_t bs, unsigned shard,
                      pp_segment_t **out, bool *grew) {
  bool slab = bs <= PP_SLAB_MAX_BLOCK;
  size_t size =
      slab ? slab_bytes_for(bs, pp_load_relaxed(&pool->cls_segs[cls])) : bs;
  void *mem = NULL;
  unsigned flags = 0;
  unsigned node = shard / pool->cfg.shards; /* carved from its node's arena */
  int rc;
  /* The common case: a recycled descriptor and room in the arena. */
  pp_mutex_lock(&pool->seg_lock);
  (void)pp_defer_drain_locked(pool);
  pp_segment_t *d = desc_pop_locked(pool, slab);
  if (d != NULL && pp_arena_take_now(pool, node, size, &mem, &flags)) {
    rc = seg_publish_locked(pool, d, mem, size, cls, bs, shard, flags);
    pp_mutex_unlock(&pool->seg_lock);
    if (rc == 0)
      *out = d;
    return rc;
  }
  pp_mutex_unlock(&pool->seg_lock);
  if (d == NULL && (d = desc_new(slab)) == NULL)
    return pp_fail(PINPOOL_ENOMEM, "out of memory for segment metadata");
  bool g = false;
  rc = pp_arena_take(pool, node, size, &mem, &flags, &g); /* may grow */
  /* The piece is carved: no release can give its chunk back. */
  if (g) {
    *grew = true;
    pp_hook(PP_HOOK_SEG_CARVED);
  }
  pp_mutex_lock(&pool->seg_lock);
  if (rc != 0)
    desc_put_locked(pool, d);
  else
    rc = seg_publish_locked(pool, d, mem, size, cls, bs, shard, flags);
  pp_mutex_unlock(&pool->seg_lock);
  if (rc == 0)
    *out = d;
  return rc;
}

/* Take d, detached (in no bin list, not in the LRU, every block free), out
 * of the segment map and the list of all segments, recycle its descriptor
 * (lookups and snapshots no longer find it; one racing with this sees the
 * gen bump) and give its memory back to the arena. Caller holds seg_lock. */
static void seg_release_locked(pinpool_t *pool, pp_segment_t *d) {
  pp_assert_held(&pool->seg_lock);
  uintptr_t base = pp_load_relaxed(&d->base);
  size_t size = pp_load_relaxed(&d->size);
  unsigned cls = d->cls;
  unsigned node = d->node;
  uint64_t fallback =
      (d->flags & PP_SEG_FALLBACK) ? pp_load_relaxed(&d->nblocks) : 0;
  pp_store_relaxed(&d->gen, pp_load_relaxed(&d->gen) + 1);
  pp_segmap_remove(pool->map, d);
  /* A snapshot whose copy would go on from d goes on from its successor
   * (d's all_next is the descriptor free list's once it is recycled). */
#ifndef PINPOOL_MUTANT_SNAP_CURSOR_STALE
  /* Mutant (docs/verification.md): the cursor left on d; the snapshot's
   * copy walks on into the free list (snapshot_chunks' pieces must fail). */
  for (pp_snap_cursor_t *c = pool->snap_cursors; c != NULL; c = c->link)
    if (c->next == d)
      c->next = d->all_next;
#endif
  if (d->all_prev != NULL)
    d->all_prev->all_next = d->all_next;
  else
    pool->all = d->all_next;
  if (d->all_next != NULL)
    d->all_next->all_prev = d->all_prev;
  desc_put_locked(pool, d);
  locked_add(&pool->gs.segs_cur, (uint64_t)-1);
  locked_add(&pool->gs.segs_freed, 1);
  locked_add(&pool->gs.fallback_blocks, (uint64_t)0 - fallback);
  locked_add(&pool->cls_segs[cls], (uint64_t)-1);
  pool->arena.node[node].segs--;
  pp_arena_give_locked(pool, node, (void *)base, size);
}

/* Release a detached segment (see seg_release_locked). No lock held. */
static void seg_release(pinpool_t *pool, pp_segment_t *d) {
  pp_mutex_lock(&pool->seg_lock);
  seg_release_locked(pool, d);
  pp_mutex_unlock(&pool->seg_lock);
}

/* A batch linked through ->next, 32 to a hold of seg_lock (an
 * empty_cache of thousands of slabs would otherwise keep every segment
 * creation and snapshot waiting for all of them). */
static unsigned release_batch(pinpool_t *pool, pp_segment_t *batch) {
  unsigned n = 0;
  if (batch != NULL)
    pp_hook(PP_HOOK_IDLE_DETACHED);
  while (batch != NULL) {
    if (n != 0)
      pp_hook(PP_HOOK_WALK_PIECE); /* between two holds of 32 */
    pp_mutex_lock(&pool->seg_lock);
    for (unsigned k = 0; k < 32 && batch != NULL; k++, n++) {
      pp_segment_t *next = batch->next;
      seg_release_locked(pool, batch);
      batch = next;
    }
    pp_mutex_unlock(&pool->seg_lock);
  }
  return n;
}

/* ---- Bin summaries ----------------------------------------------------------
 * A walk of every bin (PP_NCLASSES * nvshards: 26,176 with shards=64,
 * 209,408 with 8 nodes besides) read a cache line per bin: 2.2 ms for an
 * empty_cache of an empty pool, 7.7 ms for an allocation that grew the
 * arena (issue 38, review item 7). A release of idle memory and a drain
 * of the hot slots now visit only the bins their map (pp_binmap_t) shows:
 * the top words, the words of low they mark, the bins those mark.
 *
 * Every access to a map is sequentially consistent, and so are the hot
 * slots' put and the drain's look at a slot: a setter writes its bin's
 * state (the slot, the idle list), then reads the map; a walker clears the
 * map, then reads the bins' state. Of two such threads at least one sees
 * the other's write (the store-buffering shape, which acquire and release
 * alone allow): either the setter sees its bit clear and sets it again, or
 * the walker sees the block. On x86 a sequentially consistent load is a
 * plain load and the read-modify-writes are locked either way, so this
 * costs the put nothing there. A top bit is cleared only by a walk that
 * found its word 0, which then reads the word again (the same shape with
 * a setter that found the top bit set). */

#define MAP_SC memory_order_seq_cst

int pp_binmaps_init(pinpool_t *pool) {
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  size_t nlow = (nbins + 63) / 64, ntop = (nlow + 63) / 64;
  pp_binmap_t *maps[2] = {&pool->idle_map, &pool->hot_map};
  for (int i = 0; i < 2; i++) {
    maps[i]->low = calloc(nlow, sizeof *maps[i]->low);
    maps[i]->top = calloc(ntop, sizeof *maps[i]->top);
    maps[i]->ntop = ntop;
    if (maps[i]->low == NULL || maps[i]->top == NULL)
      return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  }
  return 0;
}

void pp_binmaps_fini(pinpool_t *pool) {
  pp_binmap_t *maps[2] = {&pool->idle_map, &pool->hot_map};
  for (int i = 0; i < 2; i++) {
    free(maps[i]->low);
    free(maps[i]->top);
    maps[i]->low = maps[i]->top = NULL;
  }
}

static size_t bin_index(pinpool_t *pool, const pp_bin_t *bin) {
  return (size_t)(bin - pool->bins);
}

/* Bin i holds something: its bit, and its word's, set (read first: a line
 * is written only on a change). */
static void map_set(pp_binmap_t *m, size_t i) {
  size_t w = i / 64;
  uint64_t bit = (uint64_t)1 << (i % 64), wbit = (uint64_t)1 << (w % 64);
  if (!(atomic_load_explicit(&m->low[w], MAP_SC) & bit))
    (void)atomic_fetch_or_explicit(&m->low[w], bit, MAP_SC);
  if (!(atomic_load_explicit(&m->top[w / 64], MAP_SC) & wbit))
    (void)atomic_fetch_or_explicit(&m->top[w / 64], wbit, MAP_SC);
}

/* Bin i holds nothing (idle_map, under its lock): its bit only; the top
 * bit goes when a walk finds the word 0. */
static void map_clear(pp_binmap_t *m, size_t i) {
  (void)atomic_fetch_and_explicit(&m->low[i / 64], ~((uint64_t)1 << (i % 64)),
                                  MAP_SC);
}

/* Word w of low is 0, as the walk read it: its top bit goes, unless a
 * setter came in between. */
static void map_top_clear(pp_binmap_t *m, size_t w) {
  uint64_t wbit = (uint64_t)1 << (w % 64);
  (void)atomic_fetch_and_explicit(&m->top[w / 64], ~wbit, MAP_SC);
  if (atomic_load_explicit(&m->low[w], MAP_SC) != 0)
    (void)atomic_fetch_or_explicit(&m->top[w / 64], wbit, MAP_SC);
}

/* A walk of the map: the marked bins' indices into out (room for 64, a
 * word of low), one word at a time. take: the word is emptied as it is
 * read (the hot slots' drain, which then empties those bins); otherwise
 * only read (idle_map, which each bin's lock keeps exact). *visits: the
 * words read. */
typedef struct map_walk {
  size_t t, w;  /* the next top word; the word of low being walked */
  uint64_t top; /* the rest of top word t-1 */
} map_walk_t;

static unsigned map_next(pp_binmap_t *m, map_walk_t *k, bool take,
                         size_t out[64], uint64_t *visits) {
  for (;;) {
    while (k->top == 0) {
      if (k->t >= m->ntop)
        return 0;
      (*visits)++;
      k->top = atomic_load_explicit(&m->top[k->t++], MAP_SC);
    }
    size_t w = (k->t - 1) * 64 + (size_t)__builtin_ctzll(k->top);
    k->top &= k->top - 1;
    (*visits)++;
    uint64_t low = take ? atomic_exchange_explicit(&m->low[w], 0, MAP_SC)
                        : atomic_load_explicit(&m->low[w], MAP_SC);
    if (take || low == 0)
      map_top_clear(m, w);
    unsigned n = 0;
    for (; low != 0; low &= low - 1)
      out[n++] = w * 64 + (size_t)__builtin_ctzll(low);
    if (n > 0)
      return n;
  }
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

/* Publish which lists of bin are non-empty (pp_bin_t.avail, and its bit
 * of idle_map when its idle list became empty or non-empty). Bin lock
 * held. */
static void bin_publish(pinpool_t *pool, pp_bin_t *bin) {
  pp_assert_held(&bin->lock);
  unsigned old = pp_load_relaxed(&bin->avail);
  unsigned now = (bin->partial != NULL ? PP_BIN_PARTIAL : 0u) |
                 (bin->idle != NULL ? PP_BIN_IDLE : 0u);
  pp_store_relaxed(&bin->avail, now);
  if ((old ^ now) & PP_BIN_IDLE) {
    if (now & PP_BIN_IDLE)
      map_set(&pool->idle_map, bin_index(pool, bin));
    else
      map_clear(&pool->idle_map, bin_index(pool, bin));
  }
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
  bin_publish(pool, bin);
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
  pp_tentry_t e = {(void *)(pp_load_relaxed(&s->base) + idx * bs), s, bs, idx};
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

/* A large block of bs bytes carved for the caller: a segment of its own,
 * handed out at once (no bin list ever holds it: freed, it goes to the hot
 * slot or straight back to the arena). Nobody else can see its fields
 * before the block is handed out, so no bin lock is needed. */
static int large_take(pinpool_t *pool, unsigned cls, size_t bs, unsigned shard,
                      pp_tentry_t *out, bool *missed) {
  pp_segment_t *s = NULL;
  int rc = seg_create(pool, cls, bs, shard, &s, missed);
  if (rc != 0 || s == NULL)
    return rc != 0 ? rc : PINPOOL_ENOMEM;
  s->carved = 1;
  s->free_count = 0;
  /* Release: see seg_pop. */
  pp_store_release(&s->word[0], PP_WORD(0, PP_CACHED));
  pp_fetch_add_relaxed(&pool->gs.central_out, bs);
  *out = (pp_tentry_t){(void *)pp_load_relaxed(&s->base), s, bs, 0};
  return 1;
}

int pp_central_take(pinpool_t *pool, unsigned cls, size_t bs, unsigned shard,
                    pp_tentry_t *out, uint32_t want, bool *missed) {
  if (bs > PP_SLAB_MAX_BLOCK) {
    /* The hot slot (a class without thread caches takes it before it
     * comes here; this is for any other path), then the arena. */
    if (pp_hot_take(pool, cls, bs, shard, out, NULL))
      return 1;
    return large_take(pool, cls, bs, shard, out, missed);
  }
  /* The shards of the caller's node only (numa=local: a node's blocks
   * are handed only to its threads; one node otherwise). */
  unsigned ns = pool->cfg.shards, first = shard - shard % ns;
  for (unsigned i = 0; i < ns; i++) {
    uint32_t n = take_from_bin(
        pool, pp_bin(pool, cls, first + (shard - first + i) % ns), out, want);
    if (n > 0)
      return (int)n;
  }
  pp_segment_t *s = NULL;
  int rc = seg_create(pool, cls, bs, shard, &s, missed);
  if (rc != 0 || s == NULL)
    return rc;
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
  if (bs > PP_SLAB_MAX_BLOCK) {
    /* Large blocks go back to the arena at once, where they coalesce
     * with their free neighbours: a block of another size may be carved
     * from the space next time. Still idle bytes: counted in. */
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < n; i++)
      bytes += in[i].bs;
    pp_fetch_add_relaxed(&pool->gs.central_in, bytes);
    if (!pp_trims(pool) && n > 0) { /* "Deferred gives" */
      for (uint32_t i = 0; i + 1 < n; i++)
        pp_store_relaxed(&in[i].seg->defer_next, in[i + 1].seg);
      defer_push(pool, in[0].seg, in[n - 1].seg);
      return;
    }
    pp_mutex_lock(&pool->seg_lock);
    for (uint32_t i = 0; i < n; i++)
      seg_release_locked(pool, in[i].seg);
    pp_mutex_unlock(&pool->seg_lock);
    return;
  }
  /* Read every block's shard before the first push: once a block is back
   * in its bin, its segment may go idle and be released (and its descriptor
   * recycled for another bin) by another thread, so the entry must not be
   * looked at again. The shard is the segment's own (a virtual shard
   * of its node: struct pinpool's bins), so a block always goes home,
   * whichever thread frees it. */
  uint16_t shard_of[64];
  while (n > 0) {
    uint32_t m = n < 64 ? n : 64;
    uint64_t done = 0;
    /* Counted before the pushes, so that a trimmer releasing one of these
     * segments never sees more bytes leave the bins than entered them. */
    pp_fetch_add_relaxed(&pool->gs.central_in, (uint64_t)m * bs);
    for (uint32_t i = 0; i < m; i++)
      shard_of[i] = (uint16_t)in[i].seg->shard;
    /* One lock acquisition per shard that owns some of the blocks: a
     * consumer returning a producer's blocks pays per batch, not per
     * block. */
    for (uint32_t j = 0; j < m; j++) {
      if (done & ((uint64_t)1 << j))
        continue;
      unsigned s = shard_of[j];
      pp_bin_t *bin = pp_bin(pool, cls, s);
      pp_mutex_lock(&bin->lock);
      for (uint32_t i = j; i < m; i++) {
        if (shard_of[i] != s)
          continue;
        done |= (uint64_t)1 << i;
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
 * A large class above tcache_bytes has no thread cache: every allocation
 * and free would go to the arena's lock (W1 at 1 GiB). (Nor does a class
 * above tcache_bytes / 16 for a thread that only frees it: alloc.c,
 * "one-block stacks"; its frees come here too, and so do large blocks a
 * stream-ordered free completes.) Each bin keeps instead the last
 * PP_HOT_SLOTS large blocks freed into it in atomic slots; an allocation
 * of exactly one's size takes it with one compare-and-swap. Several slots,
 * not one: a consumer that frees a producer's blocks a few at a time (W3's
 * batches at depth 2-4, W4's blocks in flight) displaced all but the last
 * from a single slot, and the producer carved each again under seg_lock,
 * which both threads share (3x W3's time at two threads). A slot's block
 * counts as central idle memory, like free space in the arena (put and
 * take counted in the moving thread's slot_in / slot_out, or in
 * central_in / central_out for a path without a thread cache: hot_count);
 * a block pushed out of its slot goes back to the arena (deferred), still
 * idle.
 * Whatever needs every idle byte in the arena drains the slots first
 * (pp_hot_drain): an arena about to grow, and releasing idle memory; so a
 * slot never makes the pool hold more, it only keeps a block whole for its
 * size. Pools with a cap (which trim on every free) do not use them. */

/* The slots' exchanges order the block's hand-off: the putter's last use
 * of the memory (and its CACHED word) before the taker's first. */
#ifdef PINPOOL_MUTANT_HOT_RELAXED
/* Race mutant (docs/verification.md): relaxed exchanges; the block's
 * memory then passes between threads with no happens-before. */
#define hot_xchg(p, v) atomic_exchange_explicit((p), (v), memory_order_relaxed)
#define hot_cas(p, e, v)                                                       \
  atomic_compare_exchange_strong_explicit((p), (e), (v), memory_order_relaxed, \
                                          memory_order_relaxed)
#define hot_put_xchg hot_xchg
#define hot_put_cas hot_cas
#define hot_peek(p) atomic_load_explicit((p), memory_order_relaxed)
#else
#define hot_xchg(p, v) pp_xchg_acq_rel((p), (v))
#define hot_cas(p, e, v) pp_cas_acq_rel((p), (e), (v))
/* A put's exchanges and the drain's look at a slot: sequentially
 * consistent, for the bins' summary ("Bin summaries"; the same
 * instructions on x86). */
#define hot_put_xchg(p, v) atomic_exchange_explicit((p), (v), MAP_SC)
#define hot_put_cas(p, e, v)                                                   \
  atomic_compare_exchange_strong_explicit((p), (e), (v), MAP_SC, MAP_SC)
#define hot_peek(p) atomic_load_explicit((p), MAP_SC)
#endif

/* Empty a slot: the segment it held, or NULL. */
static pp_segment_t *hot_grab(_Atomic(pp_segment_t *) *slot) {
  if (hot_peek(slot) == NULL)
    return NULL; /* the common case, without a write to the line */
  return hot_xchg(slot, NULL);
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

/* After the exchange that filled a slot. Read first: the line is written
 * only on a change. A race with a drain (pp_hot_drain) can leave a block
 * under a cleared mark; takes then miss it (a carve instead) until the
 * next drain, which looks at every slot, gives it back: never a block
 * lost, and never a growth past it (the arena drains before it grows). */
static void hot_mark(pinpool_t *pool, unsigned cls) {
  if (pp_load_relaxed(&pool->hot_used[cls]) == 0)
    pp_store_relaxed(&pool->hot_used[cls], 1);
}

bool pp_hot_put(pinpool_t *pool, unsigned cls, const pp_tentry_t *e,
                uint64_t req, uint64_t epoch, pp_counter_t *ctr) {
  pp_segment_t *s = e->seg;
  if (pp_trims(pool) || pp_load_relaxed(&s->nblocks) != 1)
    return false;
  pp_bin_t *bin = pp_bin(pool, cls, s->shard);
  hot_count(ctr, &pool->gs.central_in, e->bs);
  pp_store_relaxed(&s->hot_req, req);
  pp_store_relaxed(&s->hot_epoch, epoch);
  /* Release (both): the taker sees the block's CACHED word and the
   * segment. An empty slot first; when all are full, one chosen by the
   * block's address is displaced. */
  for (unsigned k = 0; k < PP_HOT_SLOTS; k++) {
    pp_segment_t *none = NULL;
    if (pp_load_relaxed(&bin->hot[k]) == NULL &&
        hot_put_cas(&bin->hot[k], &none, s)) {
      map_set(&pool->hot_map, bin_index(pool, bin));
      hot_mark(pool, cls);
      return true;
    }
  }
  unsigned k = (unsigned)(((uintptr_t)s >> 6) % PP_HOT_SLOTS);
  pp_segment_t *old = hot_put_xchg(&bin->hot[k], s);
  map_set(&pool->hot_map, bin_index(pool, bin));
  hot_mark(pool, cls);
  if (old != NULL)              /* idle either way: no count changes */
    defer_push(pool, old, old); /* "Deferred gives" */
  return true;
}

bool pp_hot_take(pinpool_t *pool, unsigned cls, size_t bs, unsigned shard,
                 pp_tentry_t *out, pp_counter_t *ctr) {
  /* The mark is a hint (hot_mark): a block it does not show, like one put
   * after the scan, is missed; the caller carves instead. */
  if (pp_load_relaxed(&pool->hot_used[cls]) == 0)
    return false;
  /* The caller's node's shards only (see pp_central_take). */
  unsigned ns = pool->cfg.shards, first = shard - shard % ns;
  for (unsigned i = 0; i < ns; i++) {
    pp_bin_t *bin = pp_bin(pool, cls, first + (shard - first + i) % ns);
    /* Last slot first: puts fill them from the first, so this takes the
     * block freed last (its pages the likeliest in the CPU's caches). */
    for (unsigned k = PP_HOT_SLOTS; k-- > 0;) {
      /* Acquire: the size is read before the segment is ours, so the
       * descriptor's initialization (a new one is memset by desc_new) must
       * happen before that read: the put's release pairs with this load
       * (relaxed, TSAN reported the race in test_stress). Another thread
       * may take the segment first (the CAS then fails) or even recycle
       * its descriptor into this slot again (the CAS succeeds on a block
       * of another size, checked below). */
      pp_segment_t *s = pp_load_acquire(&bin->hot[k]);
      if (s == NULL || pp_load_relaxed(&s->block_size) != bs ||
          !hot_cas(&bin->hot[k], &s, NULL))
        continue;
      if (pp_load_relaxed(&s->block_size) != bs) {
        seg_release(pool, s); /* the rare recycled one: idle either way */
        continue;
      }
      hot_count(ctr, &pool->gs.central_out, bs);
      *out = (pp_tentry_t){(void *)pp_load_relaxed(&s->base), s, bs, 0};
      return true;
    }
  }
  return false;
}

/* Bin i's slots emptied into the arena. */
static unsigned hot_drain_bin(pinpool_t *pool, size_t i, bool locked) {
  unsigned n = 0;
  /* Its class's mark first, as a put sets it last (hot_mark): a block put
   * after this is marked again. */
  unsigned c = (unsigned)(i / pool->nvshards);
  if (pp_load_relaxed(&pool->hot_used[c]) != 0)
    pp_store_relaxed(&pool->hot_used[c], 0);
  for (unsigned k = 0; k < PP_HOT_SLOTS; k++) {
    pp_segment_t *s = hot_grab(&pool->bins[i].hot[k]);
    if (s != NULL) {
      if (locked) {
        seg_release_locked(pool, s);
      } else {
        pp_hook(PP_HOOK_IDLE_DETACHED); /* in no slot, not in the arena */
        seg_release(pool, s);
      }
      n++;
    }
  }
  return n;
}

/* locked: the caller holds seg_lock (an arena about to grow looks at the
 * slots in the hold that decides: arena.c, grow_take), whose meter counts
 * the map's words and the bins visited. The bins of hot_map only ("Bin
 * summaries"): a block put in a race with an earlier drain is still under
 * a set bit, so this drain finds it (the old walk looked at every slot of
 * every large class up to the largest ever used, in every shard, for that
 * reason). */
static unsigned hot_drain(pinpool_t *pool, bool locked) {
  unsigned n = 0;
  uint64_t visits = 0;
#ifdef PINPOOL_MUTANT_BINS_FULL_WALK
  /* Mutant (docs/verification.md): every slot of every large class in
   * every shard, as before the map; test_scale's bins_walk must fail. */
  unsigned lo = pp_class_index(PP_SLAB_MAX_BLOCK) + 1;
  for (size_t i = (size_t)lo * pool->nvshards;
       i < (size_t)PP_NCLASSES * pool->nvshards; i++, visits++)
    n += hot_drain_bin(pool, i, locked);
#else
  map_walk_t k = {0, 0, 0};
  size_t bins[64];
  for (unsigned m; (m = map_next(&pool->hot_map, &k, true, bins, &visits));)
    for (unsigned j = 0; j < m; j++, visits++)
      n += hot_drain_bin(pool, bins[j], locked);
#endif
  if (locked)
    pp_lock_visit(&pool->seg_lock, visits);
  return n;
}

unsigned pp_hot_drain(pinpool_t *pool) { return hot_drain(pool, false); }

unsigned pp_hot_drain_locked(pinpool_t *pool) {
  pp_assert_held(&pool->seg_lock);
  return hot_drain(pool, true);
}

/* ---- Trimming and releasing idle memory --------------------------------- */

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
    bin_publish(pool, bin);
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
static void trim_yield(pinpool_t *pool, uint64_t *visits);
static pp_segment_t *detach_oldest(pinpool_t *pool, uint64_t budget) {
  pp_segment_t *batch = NULL;
  uint64_t got = 0, visits = 0;
  pp_mutex_lock(&pool->trim_lock);
  for (; got < budget; visits++, trim_yield(pool, &visits)) {
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
  pp_lock_visit(&pool->trim_lock, visits);
  pp_mutex_unlock(&pool->trim_lock);
  return batch;
}

/* The idle bytes the caps allow with `cached` idle now (UINT64_MAX: no
 * cap). */
static uint64_t cache_limit(pinpool_t *pool, uint64_t cached) {
  uint64_t exempt = pool->has_reserve ? pool->reserve_size : 0;
  uint64_t lim = pool->cfg.max_cached != 0 ? pool->cfg.max_cached : UINT64_MAX;
  if (pool->cfg.max_cached_pct != 0) {
    /* Relative cap: idle bytes at most pct % of the bytes in use
     * (allocated, pending, in thread caches). Both terms are read
     * without a lock; a trim decided on slightly stale values releases
     * a chunk more or less, never a block in use. */
    uint64_t res = pp_load_relaxed(&pool->gs.reserved_cur);
    uint64_t used = res > cached ? res - cached : 0;
    uint64_t rel = pp_sat_mul(used / 100, pool->cfg.max_cached_pct);
    if (rel < lim)
      lim = rel;
  }
  /* Saturating: a cap near 2^64 plus the reserve wrapped to a small
   * number and trimmed everything (docs/verification.md, "Review
   * defects", 6). */
  return pp_sat_add(lim, exempt);
}

uint64_t pp_cache_room(pinpool_t *pool) {
  if (!pp_trims(pool))
    return UINT64_MAX;
  uint64_t cached = central_cached(pool);
  uint64_t limit = cache_limit(pool, cached);
  return limit > cached ? limit - cached : 0;
}

void pp_trim_to_cap(pinpool_t *pool) {
  if (!pp_trims(pool))
    return;
  for (int pass = 0; pass < 2; pass++) {
    uint64_t cached = central_cached(pool);
    uint64_t limit = cache_limit(pool, cached);
    if (cached <= limit)
      return;
    /* Whole free chunks first; then idle slabs, oldest first, go back to
     * their chunks, which may free some whole. */
    if (pass == 0)
      pp_fetch_add_relaxed(&pool->gs.trimmed,
                           pp_arena_release(pool, cached - limit));
    else {
      pp_segment_t *batch = detach_oldest(pool, cached - limit);
      if (batch == NULL)
        return;
      (void)release_batch(pool, batch);
      pp_fetch_add_relaxed(&pool->gs.trimmed,
                           pp_arena_release(pool, cached - limit));
    }
  }
}

/* A full poll (pinpool_process_events, pinpool_synchronize, the
 * background thread's pass) cached the blocks whose events completed:
 * idle bytes the caps apply to, as a free's (issue 37, rv3637f, D6: 64
 * stream-ordered frees of 4 MiB completed by a synchronize left 289 MB
 * cached under max_cached=4MiB until a free that bypassed the cache). In
 * a busy section, as a free's trim (fork.c). Not from inside a callout
 * (base.h, pp_callout): the call that ran it may be in the middle of a
 * growth or a release whose chunks a trim would take (issue 37, D5); the
 * next trim (a free, a poll) catches up. Nor in a CUDA or shared pool's
 * child of fork, which gives nothing back. */
void pp_trim_after_poll(pinpool_t *pool) {
  if (!pp_trims(pool) || pp_in_callout() || pool->forked_cuda)
    return;
  if (pp_tls.thr == NULL && pp_thread_get() == NULL)
    return; /* no record (out of memory): no section, no trim */
  pp_busy_enter();
  pp_trim_to_cap(pool);
  pp_busy_leave();
}

/* trim_lock's holds: at most PP_TRIM_PIECE elements (bins, segments,
 * the maps' words) each, then the lock is dropped and taken again, so
 * that a trim on a free (detach_oldest) never waits for a release of every
 * idle segment of the pool (issue 38, review). What a hold detached is the
 * releaser's alone (in no list): nothing needs the lock across holds. */
#ifdef PINPOOL_MUTANT_BINS_FULL_WALK
/* Mutant (docs/verification.md): the walk in one hold, as before;
 * test_scale's idle_pieces must fail. */
#define PP_TRIM_PIECE UINT64_MAX
#else
#define PP_TRIM_PIECE 64
#endif

static void trim_yield(pinpool_t *pool, uint64_t *visits) {
  if (*visits < PP_TRIM_PIECE)
    return;
  pp_lock_visit(&pool->trim_lock, *visits);
  *visits = 0;
  pp_mutex_unlock(&pool->trim_lock);
  pp_hook(PP_HOOK_WALK_PIECE);
  pp_mutex_lock(&pool->trim_lock);
}

/* Bin i's idle segments onto *batch: false if some are left (a piece
 * ended: the caller yields and comes back). trim_lock held. */
static bool take_bin_idle(pinpool_t *pool, size_t i, pp_segment_t **batch,
                          uint64_t *visits) {
  pp_bin_t *bin = &pool->bins[i];
  (*visits)++;
  if (!(pp_load_relaxed(&bin->avail) & PP_BIN_IDLE))
    return true;
  pp_mutex_lock(&bin->lock);
  pp_segment_t *s = bin->idle, *next;
  for (; s != NULL && *visits < PP_TRIM_PIECE; s = next, (*visits)++) {
    next = s->next;
    list_remove(&bin->idle, s);
    s->list = PP_LIST_NONE;
    pp_mutex_lock(&pool->idle_lock);
    lru_remove_locked(pool, s);
    pp_mutex_unlock(&pool->idle_lock);
    s->next = *batch;
    *batch = s;
  }
  bin_publish(pool, bin);
  pp_mutex_unlock(&bin->lock);
  return s == NULL;
}

unsigned pp_release_idle(pinpool_t *pool) {
  unsigned drained = pp_hot_drain(pool) + pp_defer_drain(pool);
  pp_segment_t *batch = detach_oldest(pool, UINT64_MAX);
  /* What the LRU does not hold: every idle segment when there is no cap
   * (no LRU), and those carved from the reserve. The bins that idle_map
   * shows ("Bin summaries"), a piece a hold of trim_lock. */
  pp_mutex_lock(&pool->trim_lock);
  uint64_t visits = 0;
#ifdef PINPOOL_MUTANT_BINS_FULL_WALK
  /* Mutant (docs/verification.md): every bin looked at, as before the
   * map; test_scale's bins_walk must fail. */
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  for (size_t i = 0; i < nbins; i++)
    while (!take_bin_idle(pool, i, &batch, &visits))
      trim_yield(pool, &visits);
  (void)map_next;
#else
  map_walk_t k = {0, 0, 0};
  size_t bins[64];
  for (unsigned m; (m = map_next(&pool->idle_map, &k, false, bins, &visits));)
    for (unsigned j = 0; j < m; j++) {
      while (!take_bin_idle(pool, bins[j], &batch, &visits))
        trim_yield(pool, &visits);
      trim_yield(pool, &visits);
    }
#endif
  pp_lock_visit(&pool->trim_lock, visits);
  pp_mutex_unlock(&pool->trim_lock);
  return drained + release_batch(pool, batch);
}

static void free_desc(pp_segment_t *s) {
  free(pp_load_relaxed(&s->info));
  _Atomic(struct pp_sset *) *arr = pp_load_relaxed(&s->ssets);
  if (arr != NULL) {
    for (uint32_t i = 0; i < s->capacity; i++)
      pp_sset_free(pp_load_relaxed(&arr[i]));
    free(arr);
  }
  free(s);
}

void pp_segment_release_all(pinpool_t *pool) {
  /* destroy: no other thread uses the pool; release without detaching. */
  pp_segment_t *s = pool->all;
  while (s != NULL) {
    pp_segment_t *next = s->all_next;
    free_desc(s); /* its memory goes with its chunk (pp_arena_fini) */
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
