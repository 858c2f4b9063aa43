/*
 * The pool validator: recomputes every count from the structures and
 * compares it with the counters (docs/verification.md). It takes every
 * pool lock in the documented order, so it is race-free even if misused,
 * but the thread caches it reads belong to their owners: call it only
 * while no other thread is inside a pinpool call on this pool.
 */
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct vstate {
  char why[256];
  bool bad;
  uint64_t alloc_bytes, alloc_req, alloc_count, cached_bytes, segment_bytes;
  uint64_t in_tcache_by_state; /* CACHED words not on a central list */
  uint64_t pending_count, pending_bytes;
  uint64_t node_segs[PP_NUMA_MAX];  /* live segments per node */
  uint64_t node_bytes[PP_NUMA_MAX]; /* their bytes */
} vstate_t;

#define VFAIL(v, ...)                                                          \
  do {                                                                         \
    if (!(v)->bad)                                                             \
      (void)snprintf((v)->why, sizeof(v)->why, __VA_ARGS__);                   \
    (v)->bad = true;                                                           \
  } while (0)

static void check_segment(pinpool_t *pool, pp_segment_t *s, vstate_t *v) {
  uintptr_t base = pp_load_relaxed(&s->base);
  size_t size = pp_load_relaxed(&s->size);
  size_t bs = pp_load_relaxed(&s->block_size);
  uint32_t nb = pp_load_relaxed(&s->nblocks);
  /* A slab's blocks are its class's size; a large block is its own
   * segment, a page multiple within its class. */
  bool geom = bs <= PP_SLAB_MAX_BLOCK
                  ? bs == pp_class_size(s->cls)
                  : nb == 1 && size == bs && bs % PP_PAGE == 0 &&
                        pp_class_index(bs) == s->cls;
  if (!geom || nb == 0 || nb * bs > size || nb > s->capacity) {
    VFAIL(v, "segment %#lx: bad geometry", (unsigned long)base);
    return;
  }
  if (pp_segmap_find(pool->map, base) != s ||
      pp_segmap_find(pool->map, base + size - 1) != s)
    VFAIL(v, "segment %#lx: not in the segment map", (unsigned long)base);
  if (s->carved > nb)
    VFAIL(v, "segment %#lx: carved %u > %u", (unsigned long)base, s->carved,
          nb);
  uint64_t cached = 0, allocated = 0, pending = 0;
  for (uint32_t i = 0; i < nb; i++) {
    uint64_t w = pp_load_relaxed(&s->word[i]);
    unsigned st = PP_WORD_STATE(w);
    if ((i >= s->carved) != (st == PP_NEVER)) {
      VFAIL(v, "segment %#lx block %u: state %u vs carved %u",
            (unsigned long)base, i, st, s->carved);
    }
    if (st == PP_ALLOCATED) {
      allocated++;
      v->alloc_req += PP_WORD_PAYLOAD(w);
      if (PP_WORD_PAYLOAD(w) == 0 || PP_WORD_PAYLOAD(w) > bs)
        VFAIL(v, "segment %#lx block %u: requested size %llu > block %zu",
              (unsigned long)base, i, (unsigned long long)PP_WORD_PAYLOAD(w),
              bs);
    } else if (st == PP_CACHED) {
      cached++;
    } else if (st == PP_PENDING) {
      pending++;
    }
    if ((w & PP_WORD_STREAMS) && st != PP_ALLOCATED)
      VFAIL(v, "segment %#lx block %u: streams bit on a free block",
            (unsigned long)base, i);
  }
  /* Walk the central free list: listed blocks must be CACHED, no cycle. */
  uint32_t listed = 0;
  for (uint32_t h = s->free_head; h != 0 && !v->bad;) {
    if (h - 1 >= s->carved || ++listed > nb) {
      VFAIL(v, "segment %#lx: free list broken", (unsigned long)base);
      break;
    }
    uint64_t w = pp_load_relaxed(&s->word[h - 1]);
    if (PP_WORD_STATE(w) != PP_CACHED)
      VFAIL(v, "segment %#lx: listed block %u not cached", (unsigned long)base,
            h - 1);
    h = (uint32_t)PP_WORD_PAYLOAD(w);
  }
  if (listed + (nb - s->carved) != s->free_count)
    VFAIL(v, "segment %#lx: free_count %u != listed %u + uncarved %u",
          (unsigned long)base, s->free_count, listed, nb - s->carved);
  if (listed > cached)
    VFAIL(v, "segment %#lx: more listed than cached", (unsigned long)base);
  v->in_tcache_by_state += cached - listed;
  int want = s->free_count == nb  ? PP_LIST_IDLE
             : s->free_count == 0 ? PP_LIST_NONE
                                  : PP_LIST_PARTIAL;
  if (want != s->list)
    VFAIL(v, "segment %#lx: on list %d, expected %d", (unsigned long)base,
          s->list, want);
  if (s->list == PP_LIST_IDLE && !(s->flags & PP_SEG_FROM_RESERVE) &&
      pp_trims(pool) && !s->in_lru)
    VFAIL(v, "segment %#lx: idle but not in the LRU", (unsigned long)base);
  if (s->list != PP_LIST_IDLE && s->in_lru)
    VFAIL(v, "segment %#lx: in the LRU but not idle", (unsigned long)base);
  v->alloc_count += allocated;
  v->alloc_bytes += allocated * bs;
  v->cached_bytes += size - (allocated + pending) * bs;
  v->pending_count += pending;
  v->pending_bytes += pending * bs;
  v->segment_bytes += size;
  /* NUMA: owned by a bin of its node, carved from its node's arena. */
  if (s->node >= pool->nnodes || s->shard >= pool->nvshards ||
      s->shard / pool->cfg.shards != s->node) {
    VFAIL(v, "segment %#lx: node %u, shard %u of %u nodes", (unsigned long)base,
          s->node, s->shard, pool->nnodes);
    return;
  }
  v->node_segs[s->node]++;
  v->node_bytes[s->node] += size;
  /* Inside one run of its node's chunks, with their flags. */
  bool held =
      pp_ext_run_holds(&pool->arena.node[s->node].ext, base, size, s->flags);
  if (!held)
    VFAIL(v,
          "segment %#lx: not inside a run of chunks of node %u with its "
          "flags",
          (unsigned long)base, s->node);
}

/* Bin i's bit in map m, and its word's in the top level (a bit may be set
 * there for a word that is 0, never clear for one that is not). */
static bool map_has(pp_binmap_t *m, size_t i) {
  size_t w = i / 64;
  bool low = (pp_load_relaxed(&m->low[w]) >> (i % 64)) & 1;
  bool top = (pp_load_relaxed(&m->top[w / 64]) >> (w % 64)) & 1;
  return low && top;
}

static void check_bins(pinpool_t *pool, vstate_t *v) {
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  for (size_t i = 0; i < nbins && !v->bad; i++) {
    pp_bin_t *bin = &pool->bins[i];
    pp_mutex_lock(&bin->lock);
    pp_segment_t *lists[2] = {bin->partial, bin->idle};
    int tags[2] = {PP_LIST_PARTIAL, PP_LIST_IDLE};
    for (int l = 0; l < 2; l++) {
      for (pp_segment_t *s = lists[l]; s != NULL; s = s->next) {
        size_t idx = (size_t)s->cls * pool->nvshards + s->shard;
        if (idx != i || s->list != tags[l]) {
          VFAIL(v, "bin %zu: holds a segment of bin %zu (list %d)", i, idx,
                s->list);
          break;
        }
      }
    }
    unsigned want = (bin->partial != NULL ? PP_BIN_PARTIAL : 0u) |
                    (bin->idle != NULL ? PP_BIN_IDLE : 0u);
    if (pp_load_relaxed(&bin->avail) != want)
      VFAIL(v, "bin %zu: avail %u, lists say %u", i,
            pp_load_relaxed(&bin->avail), want);
    /* The bins' summary (pool.c, "Bin summaries"): exact for idle lists. */
    if (map_has(&pool->idle_map, i) != (bin->idle != NULL))
      VFAIL(v, "bin %zu: idle_map says %d, its idle list %s", i,
            (int)map_has(&pool->idle_map, i),
            bin->idle != NULL ? "holds some" : "is empty");
    pp_mutex_unlock(&bin->lock);
  }
}

static void check_tcaches(pinpool_t *pool, vstate_t *v) {
  uint64_t entries = 0;
  for (pp_tcache_t *tc = pool->caches; tc != NULL; tc = tc->pool_next) {
    uint64_t bytes = 0;
    for (unsigned c = 0; c < PP_NCLASSES; c++) {
      pp_tbin_t *b = &tc->bins[c];
      if (b->n > b->cap)
        VFAIL(v, "thread cache: class %u holds %u > cap %u", c, b->n, b->cap);
      for (uint32_t i = 0; i < b->n; i++) {
        pp_tentry_t *e = &b->items[i];
        size_t bs = pp_load_relaxed(&e->seg->block_size);
        uintptr_t want = pp_load_relaxed(&e->seg->base) + e->idx * bs;
        if (bs != e->bs ||
            (bs <= PP_SLAB_MAX_BLOCK ? bs != pp_class_size(c)
                                     : pp_class_index(bs) != c) ||
            (uintptr_t)e->ptr != want ||
            PP_WORD_STATE(pp_load_relaxed(&e->seg->word[e->idx])) != PP_CACHED)
          VFAIL(v, "thread cache: bad entry %p in class %u", e->ptr, c);
        /* numa=local: a thread cache holds only its node's blocks. */
        if (e->seg->node != tc->node)
          VFAIL(v, "thread cache of node %u: holds %p of node %u", tc->node,
                e->ptr, e->seg->node);
        bytes += bs;
      }
      entries += b->n;
    }
    if (bytes != pp_load_relaxed(&tc->bytes))
      VFAIL(v, "thread cache: holds %llu bytes, counter says %llu",
            (unsigned long long)bytes,
            (unsigned long long)pp_load_relaxed(&tc->bytes));
  }
  /* The bins' hot slots (pool.c) hold blocks outside the lists as well. */
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  for (size_t j = 0; j < nbins * PP_HOT_SLOTS; j++) {
    size_t i = j / PP_HOT_SLOTS;
    pp_segment_t *s = pp_load_relaxed(&pool->bins[i].hot[j % PP_HOT_SLOTS]);
    if (s == NULL)
      continue;
    pp_bin_t *bin = pp_bin(pool, s->cls, s->shard);
    if (!map_has(&pool->hot_map, i))
      VFAIL(v, "hot slot %zu: a block, and no bit in hot_map", i);
    pp_mutex_lock(&bin->lock);
    if (bin != &pool->bins[i] || pp_load_relaxed(&s->nblocks) != 1 ||
        s->list != PP_LIST_NONE || s->free_count != 0 ||
        PP_WORD_STATE(pp_load_relaxed(&s->word[0])) != PP_CACHED)
      VFAIL(v, "hot slot %zu: bad segment %p", i,
            (void *)pp_load_relaxed(&s->base));
    pp_mutex_unlock(&bin->lock);
    entries++;
  }
  /* So do the deferred gives (pool.c): one-block segments, their block
   * cached. The validator runs with the pool quiescent: nobody pushes. A
   * stack longer than the cached blocks not yet accounted for is a cycle
   * or a stray link: reported, not walked forever. */
  for (pp_segment_t *s = pp_load_acquire(&pool->deferred); s != NULL;
       s = pp_load_relaxed(&s->defer_next)) {
    if (entries >= v->in_tcache_by_state) {
      VFAIL(v,
            "deferred gives: more blocks than the %llu cached and "
            "unlisted (a cycle?)",
            (unsigned long long)v->in_tcache_by_state);
      return;
    }
    if (pp_load_relaxed(&s->nblocks) != 1 || s->list != PP_LIST_NONE ||
        s->free_count != 0 ||
        PP_WORD_STATE(pp_load_relaxed(&s->word[0])) != PP_CACHED)
      VFAIL(v, "deferred give: bad segment %p",
            (void *)pp_load_relaxed(&s->base));
    entries++;
  }
  if (entries != v->in_tcache_by_state)
    VFAIL(v,
          "%llu blocks in thread caches, hot slots and deferred gives, "
          "%llu cached but "
          "unlisted",
          (unsigned long long)entries,
          (unsigned long long)v->in_tcache_by_state);
}

int pinpool_validate(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_validate: pool is NULL");
  int dying = pp_pool_dying(pool, "pinpool_validate");
  if (pp_unlikely(dying != 0))
    return dying;
  /* From inside a callout (base.h) the pool is in the middle of the call
   * that made it (a chunk out of the arena still reserved, a growth's
   * chunk not yet in it), and the check would wait for the background
   * thread, whose pass may be waiting for this thread's caller (issue
   * 37, fourth review, D1: validate in a query the background poll
   * waited for), or take grow.mu, which the grower holds across the
   * backend call that called it (D4). */
  if (pp_in_callout())
    return pp_callout_refuse("pinpool_validate");
  vstate_t *v = calloc(1, sizeof *v);
  if (v == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_validate: out of memory");
  /* The library's own thread (background=1, grow_ahead) is held off for
   * the whole check: the user cannot stop it, and its reclaim is not one
   * hold of any lock validate takes. Before pp_grow_lock, which a pass
   * may take. */
  pp_bg_hold(pool, true);
  /* grow_ahead: the grower counts its chunk before the hold that enters
   * it; validate waits for it (growahead.c, pp_grow_lock). */
  pp_grow_lock(pool);
  pp_mutex_lock(&pool->reg_lock);
  pp_mutex_lock(&pool->seg_lock);
  pp_mutex_lock(&pool->trim_lock);
  /* One bin lock at a time (in the documented order under seg_lock and
   * trim_lock): holding all of them at once would exceed what lock-order
   * checkers such as TSAN's deadlock detector track. */
  uint64_t nsegs = 0;
  for (pp_segment_t *s = pool->all; s != NULL && !v->bad; s = s->all_next) {
    pp_bin_t *bin = pp_bin(pool, s->cls, s->shard);
    pp_mutex_lock(&bin->lock);
    pp_mutex_lock(&pool->idle_lock);
    check_segment(pool, s, v);
    pp_mutex_unlock(&pool->idle_lock);
    pp_mutex_unlock(&bin->lock);
    nsegs++;
  }
  check_bins(pool, v);
  check_tcaches(pool, v);
  pp_mutex_lock(&pool->idle_lock);
  uint64_t lru_n = 0;
  for (pp_segment_t *s = pool->lru_head; s != NULL; s = s->lru_next)
    if (++lru_n > nsegs) {
      VFAIL(v, "LRU longer than the segment list");
      break;
    }
  pp_mutex_unlock(&pool->idle_lock);
  /* The arena: its extents are sound, and every chunk byte is in a
   * segment or a free extent. */
  char why[160];
  if (!pp_arena_validate_locked(pool, why, sizeof why))
    VFAIL(v, "%s", why);
  pp_arena_info_t ai;
  pp_arena_info_locked(pool, &ai);
  /* A page move in flight (arena.c, "Page moves") holds its donors out of
   * the free extents, idle and still in their chunks: counted, not waited
   * for. */
  if (!v->bad && ai.total != v->segment_bytes + ai.free_bytes + ai.moving)
    VFAIL(v,
          "arena: %llu bytes in chunks, %llu in segments + %llu free + %llu "
          "moving",
          (unsigned long long)ai.total, (unsigned long long)v->segment_bytes,
          (unsigned long long)ai.free_bytes, (unsigned long long)ai.moving);
  v->cached_bytes += ai.free_bytes + ai.moving;
  /* Per node: the segment counts the stats report, and every chunk byte of
   * a node in its segments or free. */
  for (unsigned n = 0; n < pool->nnodes && !v->bad; n++) {
    pp_arena_info_t ni;
    uint64_t segs;
    pp_arena_node_info_locked(pool, n, &ni, &segs);
    if (segs != v->node_segs[n])
      VFAIL(v, "node %u: %llu segments listed, counter says %llu", n,
            (unsigned long long)v->node_segs[n], (unsigned long long)segs);
    else if (ni.total != v->node_bytes[n] + ni.free_bytes + ni.moving)
      VFAIL(v,
            "node %u: %llu bytes in chunks, %llu in segments + %llu free + "
            "%llu moving",
            n, (unsigned long long)ni.total,
            (unsigned long long)v->node_bytes[n],
            (unsigned long long)ni.free_bytes, (unsigned long long)ni.moving);
  }
  pp_sums_t sums;
  pp_stats_sum(pool, &sums);
  pp_mutex_unlock(&pool->trim_lock);
  pp_mutex_unlock(&pool->seg_lock);
  pp_mutex_unlock(&pool->reg_lock);

  pp_gstats_t *g = &pool->gs;
  uint64_t reserved = pp_load_relaxed(&g->reserved_cur);
  uint64_t blk = sums.blk_alloc - sums.blk_free;
  uint64_t req = sums.req_alloc - sums.req_free;
  uint64_t cnt = sums.n_alloc - sums.n_free;
  uint64_t cached = sums.cached;
  if (!v->bad && nsegs != pp_load_relaxed(&g->segs_cur))
    VFAIL(v, "%llu segments listed, counter says %llu",
          (unsigned long long)nsegs,
          (unsigned long long)pp_load_relaxed(&g->segs_cur));
  if (!v->bad && ai.total != reserved)
    VFAIL(v, "reserved: chunks hold %llu, counter says %llu",
          (unsigned long long)ai.total, (unsigned long long)reserved);
  if (!v->bad &&
      (v->alloc_bytes != blk || v->alloc_req != req || v->alloc_count != cnt))
    VFAIL(v,
          "allocated: blocks hold %llu bytes (%llu requested, %llu blocks), "
          "counters say %llu (%llu, %llu)",
          (unsigned long long)v->alloc_bytes, (unsigned long long)v->alloc_req,
          (unsigned long long)v->alloc_count, (unsigned long long)blk,
          (unsigned long long)req, (unsigned long long)cnt);
  if (!v->bad && v->cached_bytes != cached)
    VFAIL(v, "cached: structures hold %llu bytes, counters say %llu",
          (unsigned long long)v->cached_bytes, (unsigned long long)cached);
  uint64_t pend = sums.pend_bytes;
  if (!v->bad &&
      (v->pending_bytes != pend || v->pending_count != sums.pend_blocks))
    VFAIL(v,
          "pending: %llu blocks of %llu bytes in segments, counters say "
          "%llu bytes",
          (unsigned long long)v->pending_count,
          (unsigned long long)v->pending_bytes, (unsigned long long)pend);
  if (!v->bad && reserved != blk + cached + pend)
    VFAIL(v,
          "identity broken: reserved %llu != allocated %llu + cached %llu + "
          "pending %llu",
          (unsigned long long)reserved, (unsigned long long)blk,
          (unsigned long long)cached, (unsigned long long)pend);
  pp_grow_unlock(pool);
  pp_bg_hold(pool, false);
  int rc = 0;
  if (v->bad)
    rc = pp_fail(PINPOOL_ECORRUPT, "pinpool_validate: %s", v->why);
  free(v);
  return rc;
}
