/*
 * Statistics (docs/stats.md).
 *
 * Counters of the hot path live in each thread cache and have one writer;
 * everything else is an atomic updated on slow paths. A reader sums them
 * under pool->reg_lock (in pieces: "The sum in pieces"), which also guards
 * the list of caches, the counters of exited threads and the peaks.
 *
 * Peaks of allocated and cached bytes are sampled, with the exact sum, at
 * every get_stats, every new segment, and whenever the bytes a thread has
 * taken from the central bins since its last sample exceed tcache_bytes.
 * Between two of its samples a thread can raise its allocated bytes only
 * by what its cache held plus what it took (each at most tcache_bytes), so
 * a peak is below the true one by at most (caches alive at once) * 2 *
 * tcache_bytes, reported as peak_slack_bytes. Frees are not sampled (they
 * lower all but cached bytes). Reserved bytes and segments are exact.
 *
 * An allocation that takes its block from a hot slot does not sample when
 * it is paired with the free that filled the slot (alloc.c): that free
 * came after the latest sample and lowered every peaked value by at least
 * what the allocation raises it, so the bound above still holds. The
 * pairing's clock is gs.peak_epoch, moved on after every sample.
 */
#include "internal.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

static void add_counters(pp_tcounters_t *dst, pp_tcounters_t *src) {
  /* Each field is a single-writer counter; a plain sum of loads. */
  pp_counter_t *d = &dst->n_alloc, *sv = &src->n_alloc;
  size_t n = sizeof(pp_tcounters_t) / sizeof(pp_counter_t);
  for (size_t i = 0; i < n; i++)
    pp_owner_add(&d[i], pp_load_relaxed(&sv[i]));
}

static void sum_counters(pp_sums_t *s, const pp_tcounters_t *c) {
  s->n_alloc += pp_load_relaxed(&c->n_alloc);
  /* n_alloc first, then an acquire fence: the slow_allocs and misses of
   * every allocation counted in it are seen after (alloc.c, count_slow;
   * pp_stats_publish), so the hit counts derived are never too high. */
  atomic_thread_fence(memory_order_acquire);
  s->n_free += pp_load_relaxed(&c->n_free);
  s->req_alloc += pp_load_relaxed(&c->req_alloc);
  s->req_free += pp_load_relaxed(&c->req_free);
  s->blk_alloc += pp_load_relaxed(&c->blk_alloc);
  s->blk_free += pp_load_relaxed(&c->blk_free);
  s->slow_allocs += pp_load_relaxed(&c->slow_allocs);
  s->slot_in += pp_load_relaxed(&c->slot_in);
  s->slot_out += pp_load_relaxed(&c->slot_out);
  s->pend_bytes += pp_load_relaxed(&c->pend_bytes);
  s->pend_blocks += pp_load_relaxed(&c->pend_blocks);
  s->rc_count += pp_load_relaxed(&c->rc_count);
  s->rc_total += pp_load_relaxed(&c->rc_total);
}

static uint64_t diff(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

/* The pool's own parts of the sums, and the cached bytes from them. */
static void sum_pool(pinpool_t *pool, pp_sums_t *out) {
  sum_counters(out, &pool->gs.nested);
  out->pend_bytes += pp_load_relaxed(&pool->pending_bytes);
  out->pend_blocks += pp_load_relaxed(&pool->pending_blocks);
  out->rc_count += pp_load_relaxed(&pool->rc_count);
  out->rc_total += pp_load_relaxed(&pool->rc_total);
  /* Hot-slot bytes are counted per thread (pool.c): a put by one thread
   * and the take by another are summed here in either order, so only the
   * total is clamped. */
  out->cached = diff(pp_load_relaxed(&pool->gs.central_in) + out->slot_in,
                     pp_load_relaxed(&pool->gs.central_out) + out->slot_out) +
                out->tc_bytes;
}

/* tcache_bytes=0 (issue 38, review item 4): every free and every central
 * allocation samples the peaks, and a sample summed every thread's
 * counters under reg_lock (67 us a pair at 1,000 threads). Instead each
 * thread adds what its counters moved since its last call to the pool's
 * totals at the end of each operation (every operation is a slow one
 * without thread caches: alloc_slow, free_push_slow, a stream-ordered
 * free), and the sample reads the totals. A total misses only operations
 * still in flight, as the walk did; an exiting thread's rest is added in
 * its fold. Wrapping differences: bytes and the pending counts may go
 * down. */
void pp_stats_publish(pinpool_t *pool, pp_tcache_t *tc) {
  pp_counter_t *c = &tc->c.n_alloc, *p = &tc->pub.n_alloc;
  pp_counter_t *t = &pool->gs.tot.n_alloc;
  size_t n = sizeof(pp_tcounters_t) / sizeof(pp_counter_t);
  /* n_alloc (the first) last, after a release fence: a sum that sees an
   * allocation in the totals sees its slow_allocs too (sum_counters). */
  for (size_t i = n; i-- > 0;) {
    if (i == 0)
      atomic_thread_fence(memory_order_release);
    uint64_t v = pp_load_relaxed(&c[i]), d = v - pp_load_relaxed(&p[i]);
    if (d != 0) {
      pp_fetch_add_relaxed(&t[i], d);
      pp_store_relaxed(&p[i], v);
    }
  }
  uint64_t b = pp_load_relaxed(&tc->bytes);
  if (b != tc->pub_bytes) {
    pp_fetch_add_relaxed(&pool->gs.tot_bytes, b - tc->pub_bytes);
    tc->pub_bytes = b;
  }
}

/* The sums from the totals (tcache_bytes=0): no thread visited. */
static void sum_published(pinpool_t *pool, pp_sums_t *out) {
  memset(out, 0, sizeof *out);
  sum_counters(out, &pool->gs.tot);
  out->tc_bytes = pp_load_relaxed(&pool->gs.tot_bytes);
  sum_pool(pool, out);
}

void pp_stats_sum(pinpool_t *pool, pp_sums_t *out) {
  pp_assert_held(&pool->reg_lock);
  memset(out, 0, sizeof *out);
  sum_counters(out, &pool->rs.dead);
  uint64_t visits = 0;
  for (pp_tcache_t *tc = pool->caches; tc != NULL; tc = tc->pool_next) {
    sum_counters(out, &tc->c);
    out->tc_bytes += pp_load_relaxed(&tc->bytes);
    visits++;
  }
  /* Every thread with a cache, in one hold: the validator's sum only
   * (a debugging call, which walks every cache's entries in this hold
   * besides); the others sum in pieces (above). */
  pp_lock_visit(&pool->reg_lock, visits);
  sum_pool(pool, out);
}

/* ---- The sum in pieces ----------------------------------------------------
 * pinpool_get_stats, pinpool_reset_peak_stats and, with thread caches, a
 * peak sample add every thread's counters. In one hold of reg_lock that
 * was linear in the threads (issue 38, the meter's findings: every thread
 * that creates or exits a cache, and every other sample, waited); now
 * PP_STATS_PIECE caches a hold, reg_lock let go between.
 *
 * The cumulative counts must never go backwards while threads exit
 * (test_tcache stats_monotonic_exits): a cache's counters are in the live
 * list or, once it has exited, in rs.dead, never in neither. A sum reads
 * rs.dead in its first hold, then walks the list from the head. The list
 * is newest first, seq falling along it, and only ever gains at the head,
 * so the caches not yet visited are exactly those at or after the walk's
 * next cache: seq <= next->seq. A cache that exits during the walk
 * (pp_stats_fold_dead, under reg_lock) and is among those adds its
 * counters to the walk's `extra` as well as to rs.dead (a visited one
 * adds to rs.dead only: the walk counted it, the next sum counts all of
 * it), and moves the walk's next on if it was next. A cache made during
 * the walk is at the head, never visited, and adds to rs.dead only if it
 * exits: its operations are all concurrent with the call. Every sum thus
 * counts each operation that ended before it began, and a later sum counts
 * everything an earlier one did. Sums may run at once: each is a record
 * on its caller's stack, on rs.walks. */
typedef struct pp_stats_walk {
  pp_tcache_t *next; /* the next cache to visit; NULL: the walk is done */
  pp_tcounters_t extra;
  struct pp_stats_walk *wnext, *wprev;
} pp_stats_walk_t;

void pp_stats_sum_pieces(pinpool_t *pool, pp_sums_t *out) {
  pp_stats_walk_t w;
  memset(&w, 0, sizeof w);
  memset(out, 0, sizeof *out);
  pp_mutex_lock(&pool->reg_lock);
  sum_counters(out, &pool->rs.dead);
  w.next = pool->caches;
  w.wnext = pool->rs.walks;
  if (w.wnext != NULL)
    w.wnext->wprev = &w;
  pool->rs.walks = &w;
  for (;;) {
    uint64_t visits = 0;
#ifdef PINPOOL_MUTANT_STATS_ONE_HOLD
    /* Mutant (docs/verification.md): every cache in one hold. */
    while (w.next != NULL) {
#else
    while (w.next != NULL && visits < PP_STATS_PIECE) {
#endif
      sum_counters(out, &w.next->c);
      out->tc_bytes += pp_load_relaxed(&w.next->bytes);
      w.next = w.next->pool_next;
      visits++;
    }
    pp_lock_visit(&pool->reg_lock, visits);
    if (w.next == NULL)
      break;
    pp_mutex_unlock(&pool->reg_lock);
    pp_hook(PP_HOOK_STATS_PIECE);
    pp_mutex_lock(&pool->reg_lock);
  }
  if (w.wprev != NULL)
    w.wprev->wnext = w.wnext;
  else
    pool->rs.walks = w.wnext;
  if (w.wnext != NULL)
    w.wnext->wprev = w.wprev;
  sum_counters(out, &w.extra);
  sum_pool(pool, out);
}

void pp_stats_fold_dead(pinpool_t *pool, pp_tcache_t *tc) {
  pp_assert_held(&pool->reg_lock);
  add_counters(&pool->rs.dead, &tc->c);
  /* The sums in progress that have not visited tc yet (above). */
  for (pp_stats_walk_t *w = pool->rs.walks; w != NULL; w = w->wnext) {
    if (w->next == NULL || tc->seq > w->next->seq)
      continue;
#ifndef PINPOOL_MUTANT_STATS_NO_EXTRA
    /* Mutant (docs/verification.md): the walk loses such a cache. */
    add_counters(&w->extra, &tc->c);
#endif
    if (w->next == tc)
      w->next = tc->pool_next; /* unlinked already; its link is kept */
  }
  pp_stats_publish(pool, tc); /* the totals: its rest */
}

/* The currents whose peaks are sampled. reg_lock held. */
typedef struct currents {
  uint64_t requests, req, blk, cached;
} currents_t;

static currents_t currents_of(const pp_sums_t *s) {
  currents_t c;
  c.requests = diff(s->n_alloc, s->n_free);
  c.req = diff(s->req_alloc, s->req_free);
  c.blk = diff(s->blk_alloc, s->blk_free);
  c.cached = s->cached;
  return c;
}

/* A sample is complete: the epoch moves on (release: a free that reads
 * the new value was counted after every load of this sample, alloc.c). */
static void next_epoch(pinpool_t *pool) {
  pp_assert_held(&pool->reg_lock);
  pp_store_release(&pool->gs.peak_epoch,
                   pp_load_relaxed(&pool->gs.peak_epoch) + 1);
}

static void update_peaks(pinpool_t *pool, const currents_t *c) {
  pp_rstats_t *r = &pool->rs;
  next_epoch(pool);
  if (c->requests > r->peak_requests)
    r->peak_requests = c->requests;
  if (c->req > r->peak_req)
    r->peak_req = c->req;
  if (c->blk > r->peak_blk)
    r->peak_blk = c->blk;
  if (c->cached > r->peak_cached)
    r->peak_cached = c->cached;
}

void pp_stats_sample_peaks(pinpool_t *pool) {
  pp_sums_t s;
#ifndef PINPOOL_MUTANT_STATS_WALK
  if (pool->cfg.tcache_bytes == 0) {
    pp_mutex_lock(&pool->reg_lock);
    sum_published(pool, &s); /* the callers published their own */
  } else
#else
  (void)sum_published; /* Mutant (docs/verification.md): the walk. */
#endif
  {
    pp_stats_sum_pieces(pool, &s); /* returns with reg_lock held */
  }
  currents_t c = currents_of(&s);
  update_peaks(pool, &c);
  pp_mutex_unlock(&pool->reg_lock);
}

void pp_backend_timed(pp_counter_t *count, pp_counter_t *total,
                      pp_counter_t *max, uint64_t t0) {
  uint64_t dt = pp_now_ns() - t0;
  pp_fetch_add_relaxed(count, 1);
  pp_fetch_add_relaxed(total, dt);
  pp_atomic_max_relaxed(max, dt);
}

static pinpool_stat_t stat_of(uint64_t alloc, uint64_t freed, uint64_t cur,
                              uint64_t peak) {
  pinpool_stat_t s = {cur, peak < cur ? cur : peak, alloc, freed};
  return s;
}

int pinpool_get_stats(pinpool_t *pool, pinpool_stats_t *out) {
  if (pool == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_get_stats: pool or out is NULL");
  int dying = pp_pool_dying(pool, "pinpool_get_stats");
  if (pp_unlikely(dying != 0))
    return dying;
  pp_gstats_t *g = &pool->gs;
  pinpool_stats_t st;
  memset(&st, 0, sizeof st);
  pp_sums_t s;
  pp_stats_sum_pieces(pool, &s); /* returns with reg_lock held */
  currents_t c = currents_of(&s);
  update_peaks(pool, &c);
  pp_rstats_t *r = &pool->rs;
  uint64_t n_alloc = s.n_alloc;
  uint64_t n_free = s.n_free;
  uint64_t blk_alloc = s.blk_alloc;
  uint64_t blk_free = s.blk_free;
  st.requests = stat_of(n_alloc, n_free, c.requests, r->peak_requests);
  st.blocks = st.requests;
  st.requested_bytes = stat_of(s.req_alloc, s.req_free, c.req, r->peak_req);
  st.block_bytes = stat_of(blk_alloc, blk_free, c.blk, r->peak_blk);
  uint64_t res_alloc = pp_load_relaxed(&g->reserved_alloc);
  uint64_t res_freed = pp_load_relaxed(&g->reserved_freed);
  /* Cached bytes grow when the backend hands over memory or a block is
   * freed (or its events complete), and shrink when a block is allocated or
   * memory is released; the current value is summed independently from where
   * bytes sit (central bins, thread caches), so current == allocated - freed is
   * the accounting identity, not a tautology. */
  /* Freed blocks still pending have not entered the cache yet. */
  uint64_t pend = s.pend_bytes;
  st.cached_bytes = stat_of(res_alloc + blk_free - pend, res_freed + blk_alloc,
                            c.cached, r->peak_cached);
  st.peak_slack_bytes =
      pp_sat_mul(pp_sat_mul(r->max_ncaches, 2), pool->cfg.tcache_bytes);
  /* The hits: differences of counts read at different moments, so misses
   * is loaded after the sum of n_alloc. An allocation counts its miss and
   * slow_allocs before n_alloc (alloc.c, count_slow), so each difference
   * is at most the true count when n_alloc was summed, and exact when no
   * allocation is between its counts. Loaded the other way round (misses
   * after the whole sum, but counted after n_alloc), an allocation
   * between its two counts was a hit in one call and a miss in the next:
   * cache_hits went backwards (issue 38, fourth review). Still, one such
   * allocation makes a difference one too low, lower than an earlier
   * call's: each hit count is reported as the largest seen, under
   * reg_lock (never above the truth, since every earlier value was
   * not). */
  st.cache_misses = pp_load_relaxed(&g->misses);
  st.cache_hits = diff(n_alloc, st.cache_misses);
  st.tcache_hits = diff(n_alloc, s.slow_allocs);
#ifndef PINPOOL_MUTANT_STATS_HITS_RAW
  /* Mutant (docs/verification.md): the differences as read; test_tcache's
   * stats_monotonic_misses must fail. */
  if (st.cache_hits < r->hits_seen)
    st.cache_hits = r->hits_seen;
  if (st.tcache_hits < r->tc_hits_seen)
    st.tcache_hits = r->tc_hits_seen;
#endif
  r->hits_seen = st.cache_hits;
  r->tc_hits_seen = st.tcache_hits;
  pp_mutex_unlock(&pool->reg_lock);
  /* The true block (and requested) bytes never exceeded the reserved peak:
   * a bound beyond that says nothing (issue 41: 512 MiB of slack beside a
   * 412 MiB reserved peak). requested <= block bytes, so this bounds both. */
  uint64_t rpk = pp_load_relaxed(&g->reserved_peak);
  uint64_t room =
      rpk > st.requested_bytes.peak ? rpk - st.requested_bytes.peak : 0;
  if (st.peak_slack_bytes > room)
    st.peak_slack_bytes = room;

  st.reserved_bytes =
      stat_of(res_alloc, res_freed, pp_load_relaxed(&g->reserved_cur),
              pp_load_relaxed(&g->reserved_peak));
  st.segments =
      stat_of(pp_load_relaxed(&g->segs_alloc), pp_load_relaxed(&g->segs_freed),
              pp_load_relaxed(&g->segs_cur), pp_load_relaxed(&g->segs_peak));
  st.pending_bytes = s.pend_bytes;
  st.pending_blocks = s.pend_blocks;
  st.events_recorded = pp_load_relaxed(&pool->ev_recorded);
  st.events_completed = pp_load_relaxed(&pool->ev_completed);
  st.event_errors = pp_load_relaxed(&pool->ev_errors);
  st.reclaim = (pinpool_duration_t){s.rc_count, s.rc_total,
                                    pp_load_relaxed(&pool->rc_max)};
  st.oom_count = pp_load_relaxed(&g->oom);
  st.retries = pp_load_relaxed(&g->retries);
  st.trimmed_segments = pp_load_relaxed(&g->trimmed);
  pp_arena_info_t ai;
  pp_arena_info(pool, &ai);
  st.arena_chunks = ai.chunks;
  st.chunk_free_bytes = ai.free_bytes;
  st.free_extents = ai.free_extents;
  st.largest_free_extent = ai.largest;
  st.history_lost_writes = pp_load_relaxed(&pool->hist.lost);
  st.graph_held_blocks = pp_load_relaxed(&pool->graph_blocks);
  st.graph_held_bytes = pp_load_relaxed(&pool->graph_bytes);
  if (pool->share != NULL) {
    pp_share_counts(pool->share, &st.lent_blocks, &st.lent_bytes);
    st.lend_refusals = pp_share_refusals(pool->share);
  }
  st.mlock_failures = pp_load_relaxed(&g->mlock_failures);
  st.fallback_bytes = pp_load_relaxed(&g->fallback_bytes);
  st.fallback_blocks = pp_load_relaxed(&g->fallback_blocks);
  st.numa_spill_blocks = pp_load_relaxed(&g->numa_spill_blocks);
  st.numa_spill_bytes = pp_load_relaxed(&g->numa_spill_bytes);
  st.locked_bytes = pp_load_relaxed(&g->locked_bytes);
  st.backend_alloc = (pinpool_duration_t){pp_load_relaxed(&g->ba_count),
                                          pp_load_relaxed(&g->ba_total),
                                          pp_load_relaxed(&g->ba_max)};
  st.backend_free = (pinpool_duration_t){pp_load_relaxed(&g->bf_count),
                                         pp_load_relaxed(&g->bf_total),
                                         pp_load_relaxed(&g->bf_max)};
  st.reserve_bytes = pool->reserve_size;
  st.max_cached = pool->cfg.max_cached;
  st.max_reserved = pool->cfg.max_reserved;
  st.backend_auto = (uint64_t)pool->cfg.backend_auto;
  st.pin_warnings = pp_load_relaxed(&pool->pinwarn.warnings);
  st.grow_ahead_chunks = pp_load_relaxed(&pool->grow.chunks);
  st.grow_ahead_bytes = pp_load_relaxed(&pool->grow.bytes);
  st.grow_ahead_hits = pp_load_relaxed(&pool->grow.hits);
  st.grow_ahead_waits_avoided = pp_load_relaxed(&pool->grow.waits_avoided);
  st.page_moves = pp_load_relaxed(&g->page_moves);
  st.bytes_moved = pp_load_relaxed(&g->bytes_moved);
  st.move_fallbacks = pp_load_relaxed(&g->move_fallbacks);
  *out = st;
  return 0;
}

/* Set *peak to *cur without losing a concurrent maximum: a thread that
 * raised cur also raises peak (pp_atomic_max_relaxed), and a plain store of
 * a cur read earlier could overwrite that new peak with an older, lower
 * value (docs/verification.md, "Review defects", 7). The peak is read
 * first and replaced only if it did not change meanwhile; otherwise both
 * are read again. */
static void reset_peak(pp_counter_t *peak, pp_counter_t *cur) {
  uint64_t old = pp_load_relaxed(peak);
  for (;;) {
    uint64_t c = pp_load_relaxed(cur);
    pp_hook(PP_HOOK_RESET_PEAK);
    if (atomic_compare_exchange_weak_explicit(
            peak, &old, c, memory_order_relaxed, memory_order_relaxed))
      return;
  }
}

int pinpool_reset_peak_stats(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_reset_peak_stats: pool is NULL");
  pp_sums_t s;
  pp_stats_sum_pieces(pool, &s); /* returns with reg_lock held */
  currents_t c = currents_of(&s);
  pool->rs.peak_requests = c.requests;
  pool->rs.peak_req = c.req;
  pool->rs.peak_blk = c.blk;
  pool->rs.peak_cached = c.cached;
  pool->rs.max_ncaches = pool->rs.ncaches;
  next_epoch(pool);
  pp_mutex_unlock(&pool->reg_lock);
  reset_peak(&pool->gs.reserved_peak, &pool->gs.reserved_cur);
  reset_peak(&pool->gs.segs_peak, &pool->gs.segs_cur);
  return 0;
}

int pinpool_numa_nodes(pinpool_t *pool, unsigned *nodes) {
  if (pool == NULL || nodes == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_numa_nodes: NULL argument");
  *nodes = pool->nnodes;
  return 0;
}

int pinpool_get_node_stats(pinpool_t *pool, unsigned node,
                           pinpool_node_stats_t *out) {
  if (pool == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_get_node_stats: NULL argument");
  if (node >= pool->nnodes)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_get_node_stats: node %u, the pool has %u", node,
                   pool->nnodes);
  pp_arena_info_t ai;
  uint64_t segs;
  pp_mutex_lock(&pool->seg_lock);
  pp_arena_node_info_locked(pool, node, &ai, &segs);
  pp_mutex_unlock(&pool->seg_lock);
  *out = (pinpool_node_stats_t){pool->place[node], ai.total, ai.chunks, segs,
                                ai.free_bytes};
  return 0;
}
