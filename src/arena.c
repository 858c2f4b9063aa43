/*
 * The arena: every segment's memory (docs/allocation-policy.md, "Arenas").
 *
 * The backend is asked for chunks, each populated, locked and registered
 * once; segments are carved from them (extent.c: page granule, good fit,
 * coalescing) and given back to them. Slabs are carved at their size,
 * large blocks at their page-rounded request. Memory goes back to the
 * backend only as whole free chunks, only through pp_arena_release (empty
 * cache, the caps, an allocation that found max_reserved reached) and at
 * destroy: the steady state makes no backend call at all.
 *
 * Growth: a chunk is an eighth of the arena (so the arena grows by 12.5 %
 * at a time and the chunk count is logarithmic in its size), rounded up to
 * 2 MiB, between 2 MiB and 1 GiB, and at least the request rounded up to
 * 2 MiB: a request above the chunk size gets a chunk of its own. When
 * max_reserved does not allow that much, the chunk is just the request.
 *
 * Locking: the arena is under the pool's seg_lock, which every carve and
 * give already held for the segment map (pool.c: a segment is created or
 * released in one hold). No backend call is made under it (invariant 1):
 * a take that finds no room drops it and makes the chunk, and the hold
 * that puts the chunk in the arena also carves the taker's piece
 * (grow_take): never "grow, unlock, take again", in which anything that
 * releases whole free chunks could give the new one back first.
 *
 * Accounting (stats.c, validate.c): a chunk's bytes enter the pool as
 * cached (central_in) when it is made and leave (central_out) when it is
 * released; carving a segment and giving it back move idle bytes within
 * the pool and change no counter.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#ifdef PINPOOL_MUTANT_GIVE_DONTNEED
#include <sys/mman.h>
#endif

#define CHUNK_ALIGN ((size_t)2 << 20)
#define CHUNK_MIN ((size_t)2 << 20)
#define CHUNK_MAX ((size_t)1 << 30)

static size_t round_up(size_t n, size_t to) {
  return n > SIZE_MAX - (to - 1) ? SIZE_MAX & ~(to - 1)
                                 : (n + to - 1) & ~(to - 1);
}

/* ---- The backend, with the max_reserved cap ----------------------------- */

/* Claim n bytes under the cap before the backend call, so that threads
 * growing at once never pass it together. The peak is not raised here: a
 * backend call that fails hands nothing over (issue 37, D1: a failed 64 GiB
 * reservation left peak=64 GiB); reserved_counted raises it. */
static bool reserve_bytes(pinpool_t *pool, size_t n) {
  uint64_t cap = pool->cfg.max_reserved;
  uint64_t cur = pp_load_relaxed(&pool->gs.reserved_claimed);
  do {
    if (cap != 0 && (cur + n > cap || cur + n < cur))
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &pool->gs.reserved_claimed, &cur, cur + n, memory_order_relaxed,
      memory_order_relaxed));
  return true;
}

/* The backend handed over n claimed bytes: reserved, and the peak. */
static void reserved_counted(pinpool_t *pool, size_t n) {
  uint64_t cur = pp_fetch_add_relaxed(&pool->gs.reserved_cur, n) + n;
  pp_atomic_max_relaxed(&pool->gs.reserved_peak, cur);
}

/* ---- The out-of-memory retry (alloc.c, take_with_retry) -----------------
 * An allocation that found max_reserved reached releases whole free chunks
 * and tries once more. Two things decide what it releases (issue 37, third
 * review, items 2, 3, 6):
 *  - Claims in flight. The grower's chunk holds its claim from before the
 *    backend call to the hold that enters it; a released chunk holds its
 *    claim from the hold that takes it out to the backend call that gives
 *    it back. Neither is in the arena, so the retry could release neither,
 *    and an allocation that fits without grow-ahead, or once the release
 *    is done, failed. The retry waits for them (pool->arena.claims):
 *    each ends after a backend call, with no lock held by its thread that
 *    the waiter could hold (the waiter holds none). Only for those in
 *    flight when it comes (tickets): claims that begin meanwhile do not
 *    extend the wait (issue 37, fourth review, D6: beside three threads
 *    releasing in turn, an allocation the cap refused waited 3 s, as long
 *    as they ran, for a count that new claims kept up). Never from inside
 *    a callout (base.h, pp_callout): a backend call that allocates, its
 *    own thread's claim in flight (the grower's), or another's release
 *    whose backend free allocates too (D2: two empty_cache whose frees
 *    each waited for the other's claim); there the retry decides with
 *    what it sees.
 *  - Whether a release can help. The thread's last failed growth (need
 *    bytes on node, refused by the cap or by the backend: tls_miss). If
 *    the cap refused it and even every whole free chunk released would
 *    leave too little under the cap, the retry fails having released
 *    nothing (a function that fails changes nothing: 8 MiB cached were
 *    emptied before failing); else it releases only the bytes the cap
 *    lacks. A refusal of the backend itself releases every whole free
 *    chunk, as before: the system may need the memory back. */
static _Thread_local struct {
  size_t need;
  unsigned node;
  bool cap, set;
} tls_miss;
static _Thread_local bool tls_capped; /* backend_alloc's last refusal */

/* Caller holds seg_lock: the retry's hold that finds no room sees either
 * the chunk or its claim. From here to settle_end the thread is in a
 * callout (PP_CO_CLAIM): whatever it calls meanwhile (its backend call,
 * a test hook) never waits for claims, its own among them. */
static void settle_begin(pinpool_t *pool, pp_claim_t *c) {
  pp_arena_t *ar = &pool->arena;
  (void)pthread_mutex_lock(&ar->settle_mu);
  c->ticket = ++ar->claim_seq;
  c->owner = &pp_callout;
  c->next = NULL;
  c->prev = ar->claims_tail;
  if (ar->claims_tail != NULL)
    ar->claims_tail->next = c;
  else
    ar->claims = c;
  ar->claims_tail = c;
  (void)pthread_mutex_unlock(&ar->settle_mu);
  c->co_prev = pp_callout_enter(PP_CO_CLAIM);
}

static void settle_end(pinpool_t *pool, pp_claim_t *c) {
  pp_arena_t *ar = &pool->arena;
  pp_callout_leave(c->co_prev);
  (void)pthread_mutex_lock(&ar->settle_mu);
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    ar->claims = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  else
    ar->claims_tail = c->prev;
  (void)pthread_cond_broadcast(&ar->settle_cv);
  (void)pthread_mutex_unlock(&ar->settle_mu);
}

/* The oldest claim is at or below `upto`. settle_mu held. */
static bool settle_older(const pp_arena_t *ar, uint64_t upto) {
  return ar->claims != NULL && ar->claims->ticket <= upto;
}

static pp_growth_t *inflight_find_locked(pinpool_t *pool, unsigned node,
                                         size_t need);

/* No lock held. Waits for the claims in flight now, none begun later. */
static void settle_wait(pinpool_t *pool) {
  pp_arena_t *ar = &pool->arena;
  if (pp_in_callout())
    return;
  (void)pthread_mutex_lock(&ar->settle_mu);
  uint64_t upto = ar->claim_seq;
#ifdef PINPOOL_MUTANT_SETTLE_COUNT
  /* Logic mutant (docs/verification.md): wait until no claim at all is in
   * flight, new ones included (D6); test_reenter_matrix settle_tickets
   * must fail. */
  upto = UINT64_MAX;
#endif
  bool wait = settle_older(ar, upto);
  (void)pthread_mutex_unlock(&ar->settle_mu);
  if (!wait)
    return;
  pp_hook(PP_HOOK_RETRY_SETTLE);
  int cs = pp_nocancel_enter(); /* base.h: not a cancellation point */
  (void)pthread_mutex_lock(&ar->settle_mu);
  while (settle_older(ar, upto))
    (void)pthread_cond_wait(&ar->settle_cv, &ar->settle_mu);
  (void)pthread_mutex_unlock(&ar->settle_mu);
  pp_nocancel_leave(cs);
}

void pp_arena_miss_clear(void) { tls_miss.set = false; }

void pp_arena_fork_child(pinpool_t *pool) {
  /* Only the forking thread survived: its own claims stay (a fork from
   * inside its backend call), in their order. */
  pp_arena_t *ar = &pool->arena;
  pp_claim_t *keep = NULL, *tail = NULL;
  for (pp_claim_t *c = ar->claims; c != NULL; c = c->next) {
    if (c->owner != &pp_callout)
      continue;
    c->prev = tail;
    if (tail != NULL)
      tail->next = c;
    else
      keep = c;
    tail = c;
  }
  if (tail != NULL)
    tail->next = NULL;
  ar->claims = keep;
  ar->claims_tail = tail;
  (void)pthread_mutex_init(&pool->arena.settle_mu, NULL);
  (void)pthread_cond_init(&pool->arena.settle_cv, NULL);
}

bool pp_arena_retry_plan(pinpool_t *pool, uint64_t *budget) {
  uint64_t cap = pool->cfg.max_reserved;
  bool capped = tls_miss.set && tls_miss.cap && cap != 0;
  size_t need = tls_miss.need;
  unsigned node = tls_miss.node;
  tls_miss.set = false;
  *budget = UINT64_MAX;
  if (!capped)
    return true; /* the backend refused, or no growth failed: everything */
  settle_wait(pool);
  uint64_t whole = 0;
  pp_mutex_lock(&pool->seg_lock);
  bool room_now = pp_ext_largest(&pool->arena.node[node].ext) >= need;
#ifndef PINPOOL_MUTANT_RETRY_NO_INFLIGHT
  /* Another thread's growth in flight on the node, with room for the
   * piece: its chunk comes, and the retry's take joins it (grow_take),
   * so that the wait is one backend call, bounded, and never from a
   * callout (grow_take joins none there). Not a claim: an inline growth
   * claims its bytes inside backend_alloc, and the retry did not see it
   * (issue 37, s39: a miss refused by the cap because another thread's
   * growth had just claimed the room failed with ENOMEM, though that
   * growth's chunk, published a moment later, held its piece). */
  room_now = room_now || inflight_find_locked(pool, node, need) != NULL;
#endif
  for (unsigned n = 0; n < pool->nnodes; n++) {
    size_t b = 0;
    (void)pp_ext_free_chunks(&pool->arena.node[n].ext, PP_SEG_FROM_RESERVE, &b);
    whole += b;
  }
  pp_mutex_unlock(&pool->seg_lock);
  uint64_t claimed = pp_load_relaxed(&pool->gs.reserved_claimed);
  uint64_t left = cap > claimed ? cap - claimed : 0;
  *budget = 0;
  if (room_now || left >= need)
    return true; /* what was in flight made room, or leaves it */
  if (pp_sat_add(left, whole) < need)
    return false;
  *budget = need - left;
  return true;
}

/* pin_failure=pageable: the CUDA backend could not pin `size` bytes (its
 * error is the thread's last error). Map them pageable instead, populated
 * and placed as the host backend would (never locked: the driver refused,
 * and mlock is the host backend's policy). On success the refusal leaves
 * no trace: the last error is what it was before the call that failed. Not
 * for a cuda chunk above register_max, which no driver pins (a
 * configuration problem, not a failure to pin), nor for an injected
 * failure of the whole backend call (fault=alloc). */
static bool pin_fallback(pinpool_t *pool, int place, size_t size,
                         const char *saved, void **mem, unsigned *flags) {
  const pp_config_t *c = &pool->cfg;
  if (c->pin_failure != PP_PIN_PAGEABLE ||
      (c->backend != PP_BACKEND_CUDA &&
       c->backend != PP_BACKEND_CUDA_REGISTER) ||
      (c->backend == PP_BACKEND_CUDA && size > c->register_max))
    return false;
  char why[256];
  pp_error_save(why, sizeof why);
  pp_config_t hc = *c;
  hc.mlock = PP_MLOCK_OFF;
  hc.numa_node = place; /* where the pinned chunk would have been */
  unsigned f = 0;
  if (pp_host_map(&hc, NULL, size, c->populate_threads, NULL, mem, &f) != 0) {
    pp_error_restore(why); /* the driver's refusal says more */
    return false;
  }
  pp_error_restore(saved);
  *flags = (f & ~(unsigned)PP_SEG_LOCKED) | PP_SEG_FALLBACK;
  return true;
}

/* A chunk for arena node `node`: bound to its real node (pool->place) by
 * the provider's alloc_node with numa=local, else placed as configured. */
static int backend_alloc(pinpool_t *pool, unsigned node, void *hint,
                         size_t size, void **mem, unsigned *flags) {
  bool local = pool->cfg.numa == PP_NUMA_LOCAL;
  int place = pool->place[node];
  pp_assert(size % PP_PAGE == 0 && size > 0); /* the extents' granule */
  tls_capped = !reserve_bytes(pool, size);
  if (tls_capped)
    return pp_fail(
        PINPOOL_ENOMEM,
        "max_reserved (%llu bytes) reached: %llu reserved, %zu "
        "more needed",
        (unsigned long long)pool->cfg.max_reserved,
        (unsigned long long)pp_load_relaxed(&pool->gs.reserved_claimed), size);
  uint64_t t0 = pp_now_ns();
  *flags = 0;
  char saved[256];
  pp_error_save(saved, sizeof saved);
  bool injected = pp_fault_hit(&pool->cfg, PP_FAULT_ALLOC);
  unsigned co = pp_callout_enter(PP_CO_BACKEND_ALLOC);
  int rc = injected ? pp_fail(PINPOOL_ENOMEM,
                              "backend '%s': injected failure of "
                              "an allocation of %zu bytes",
                              pool->prov.name, size)
           : local  ? pool->prov.alloc_node(pool->prov.ctx, hint, size, place,
                                            mem, flags)
           : hint != NULL && pool->prov.alloc_at != NULL
               ? pool->prov.alloc_at(pool->prov.ctx, hint, size, mem, flags)
               : pool->prov.alloc(pool->prov.ctx, size, mem, flags);
  pp_callout_leave(co);
  if (rc != 0 && !injected &&
      pin_fallback(pool, place, size, saved, mem, flags))
    rc = 0;
  pp_backend_timed(&pool->gs.ba_count, &pool->gs.ba_total, &pool->gs.ba_max,
                   t0);
  if (rc == 0 && (uintptr_t)*mem + size > ((uintptr_t)1 << PP_MAP_ADDR_BITS)) {
    /* Segments carved from it could never be mapped (segmap.c). */
    if (*flags & PP_SEG_FALLBACK) {
      pp_host_unmap(&pool->cfg, *mem, size);
    } else {
      co = pp_callout_enter(PP_CO_BACKEND_FREE);
      pool->prov.free(pool->prov.ctx, *mem, size);
      pp_callout_leave(co);
    }
    rc = pp_fail(PINPOOL_EBACKEND,
                 "backend '%s' returned %p (%zu bytes), beyond 2^48",
                 pool->prov.name, *mem, size);
  }
  if (rc != 0) {
    pp_fetch_sub_relaxed(&pool->gs.reserved_claimed, size);
    return rc;
  }
  reserved_counted(pool, size);
  pp_fetch_add_relaxed(&pool->gs.reserved_alloc, size);
  pp_fetch_add_relaxed(&pool->gs.central_in, size); /* new memory is idle */
  if (*flags & PP_SEG_LOCKED)
    pp_fetch_add_relaxed(&pool->gs.locked_bytes, size);
  if (*flags & PP_SEG_LOCK_FAILED)
    pp_fetch_add_relaxed(&pool->gs.mlock_failures, 1);
  if (*flags & PP_SEG_FALLBACK)
    pp_fetch_add_relaxed(&pool->gs.fallback_bytes, size);
  return 0;
}

static void backend_free(pinpool_t *pool, void *mem, size_t size,
                         unsigned flags) {
  uint64_t t0 = pp_now_ns();
  if (flags & PP_SEG_FALLBACK) {
    pp_host_unmap(&pool->cfg, mem, size); /* never the driver's: pin_fallback */
    pp_fetch_sub_relaxed(&pool->gs.fallback_bytes, size);
  } else {
    unsigned co = pp_callout_enter(PP_CO_BACKEND_FREE);
    pool->prov.free(pool->prov.ctx, mem, size);
    pp_callout_leave(co);
  }
  pp_backend_timed(&pool->gs.bf_count, &pool->gs.bf_total, &pool->gs.bf_max,
                   t0);
  pp_fetch_sub_relaxed(&pool->gs.reserved_cur, size);
  pp_fetch_sub_relaxed(&pool->gs.reserved_claimed, size);
  pp_fetch_add_relaxed(&pool->gs.reserved_freed, size);
  pp_fetch_add_relaxed(&pool->gs.central_out, size);
  if (flags & PP_SEG_LOCKED)
    pp_fetch_sub_relaxed(&pool->gs.locked_bytes, size);
}

/* ---- Chunks ---------------------------------------------------------------
 */

/* Every block given back to the arena without its lock since the last
 * look: the deferred stack and the hot slots (pool.c). Caller holds
 * seg_lock, which this drops and takes again between pieces of the stack
 * (at most PP_DEFER_PIECE blocks a hold, issue 38): the hold it returns in
 * is one that found the stack empty, so the caller's decision to grow
 * still comes after every block deferred before it (issue 37, D4). */
static void gather_locked(pinpool_t *pool) {
  while ((void)pp_defer_drain_locked(pool), pp_defer_pending(pool)) {
    pp_mutex_unlock(&pool->seg_lock);
    pp_hook(PP_HOOK_WALK_PIECE);
    pp_mutex_lock(&pool->seg_lock);
  }
  (void)pp_hot_drain_locked(pool);
}

/* The size of the chunk to grow node `node` by for a carve of `need`
 * bytes (the file comment's policy). */
static size_t chunk_size(pinpool_t *pool, unsigned node, size_t need) {
  pp_arena_node_t *a = &pool->arena.node[node];
  /* Every size returned is a page multiple, whatever `need` is: the
   * grower's need is a headroom or what max_reserved leaves, any byte
   * count (issue 37, third review, item 1: max_reserved=100000000 made a
   * chunk of a non-page size, and the extents' granule check aborted the
   * grower's thread). Inline growth asks for page multiples already. */
  need = round_up(need, PP_PAGE);
  size_t size = (size_t)(pp_load_relaxed(&a->total) / 8);
  size = size < CHUNK_MIN ? CHUNK_MIN : size > CHUNK_MAX ? CHUNK_MAX : size;
  size = round_up(size, CHUNK_ALIGN);
  size_t own = round_up(need, CHUNK_ALIGN);
  if (own > size)
    size = own;
  /* backend=cuda makes a chunk with one cuMemHostAlloc, which may not be
   * larger than register_max (cuda-register registers in pieces): the
   * chunk stops there, unless the request itself is larger (which the
   * backend then refuses, with its message). */
  uint64_t rmax = pool->cfg.register_max & ~(uint64_t)(PP_PAGE - 1);
  if (pool->cfg.backend == PP_BACKEND_CUDA && size > rmax)
    size = need > rmax ? need : (size_t)rmax;
  uint64_t cap = pool->cfg.max_reserved;
  if (cap != 0 && pp_load_relaxed(&pool->gs.reserved_claimed) + size > cap)
    size = need; /* the cap decides: no more than asked for */
  return size;
}

/* Where to ask the backend for a new chunk of `size`: beside the arena if
 * that space is free (mappings grow downwards: below its lowest chunk
 * first), so that the new chunk joins a run; NULL for anywhere. */
static void *below_lowest_locked(pinpool_t *pool, pp_arena_node_t *a,
                                 size_t size) {
  pp_assert_held(&pool->seg_lock);
  if (pool->prov.alloc_at == NULL || a->ext.nchunks == 0)
    return NULL;
  uintptr_t base;
  size_t csize;
  unsigned cflags;
  pp_ext_chunk_info(pp_ext_first(&a->ext), &base, &csize, &cflags);
  return base > size + ((uintptr_t)1 << 32) ? (void *)(base - size) : NULL;
}

/* ---- Growths in flight (internal.h, pp_growth_t) -------------------------
 * Two threads that miss at once on one node grew two chunks where one
 * would hold both pieces (W2 with two threads held ~0.1x more than with
 * one: issue 37). A miss that finds a growth in flight on its node with
 * room for its piece waits for it; the growth's entering hold carves the
 * piece for it. It never waits for a growth that cannot hold its piece
 * (room is what the chunk has not promised), nor twice: a waiter woken
 * unserved (the backend refused, a release won the grower's chunk, the
 * metadata could not be had) grows on its own. The growing thread waits
 * for nothing the waiter holds (no lock; both are in busy sections, so a
 * fork waits for both, and none is in flight in a child). */

/* A growth in flight on `node` with room for `need` bytes, or NULL. */
static pp_growth_t *inflight_find_locked(pinpool_t *pool, unsigned node,
                                         size_t need) {
  pp_assert_held(&pool->seg_lock);
  for (pp_growth_t *g = pool->grow.inflight; g != NULL; g = g->next)
    if (g->node == node && g->room >= need)
      return g;
  return NULL;
}

static void inflight_del_locked(pinpool_t *pool, pp_growth_t *g) {
  pp_assert_held(&pool->seg_lock);
  pp_growth_t **pp = &pool->grow.inflight;
  while (*pp != g)
    pp = &(*pp)->next;
  *pp = g->next;
}

/* The growth's chunk is in the arena (or `entered` false: it never came):
 * carve each waiter's piece, out of the list. Returns the waiters, to be
 * woken after the hold (inflight_wake). */
static pp_growth_wait_t *inflight_end_locked(pinpool_t *pool, pp_growth_t *g,
                                             bool entered) {
  inflight_del_locked(pool, g);
  for (pp_growth_wait_t *w = g->waiters; w != NULL; w = w->next) {
    void *p = NULL;
    if (entered) {
      p = pp_ext_take(&pool->arena.node[g->node].ext, w->need, &w->flags);
      if (p != NULL && g->ahead)
        pp_grow_carved_locked(pool, g->node, w->need); /* growahead.c */
      else if (p != NULL)
        pp_grow_noted_locked(pool, g->node, w->need);
    }
    w->mem = p;
    w->served = p != NULL;
  }
  return g->waiters;
}

/* No lock held. A waiter's record is gone once it is posted. */
static void inflight_wake(pp_growth_wait_t *w) {
  while (w != NULL) {
    pp_growth_wait_t *next = w->next;
    (void)sem_post(&w->done);
    w = next;
  }
}

/* Wait for the growth joined; true if it served the piece. */
static bool inflight_wait(pp_growth_wait_t *w, void **mem, unsigned *flags) {
  pp_hook(PP_HOOK_GROW_JOIN);
  /* Not a cancellation point (base.h): cancelled here, the thread left
   * its record on its dead stack in the growth's waiters, and its busy
   * section open. */
  int cs = pp_nocancel_enter();
  while (sem_wait(&w->done) != 0)
    ; /* EINTR */
  pp_nocancel_leave(cs);
  (void)sem_destroy(&w->done);
  if (!w->served)
    return false;
  *mem = w->mem;
  *flags = w->flags;
  return true;
}

/* ---- Page moves (docs/allocation-policy.md, "Page-moving growth") ------
 * A fragmentation miss (the node's free bytes would hold the request, no
 * free extent does) with page_move on moves the pages of the largest free
 * extents (the donors, each at least MOVE_MIN_PIECE but the last) side by
 * side into a new address range instead of asking the backend for a
 * chunk: no page is made, locked or registered, no reserved byte added.
 * Chunks stay runs of pages: the donors' ranges leave their chunks
 * (pp_ext_cut: a chunk shrinks, goes or splits) and their address goes
 * back to the kernel once the publishing hold has cut them; the moved
 * pages are a chunk of their own. So reserved bytes are the chunks' sizes
 * as before, a chunk with moved pages is released like any other, and no
 * address without pages is kept (the design's holes, which needed a
 * second extent map, address chunks and their own release, are not
 * needed: a chunk is given back with munmap of its range, whatever
 * mapping it came from). Each donor moves with pp_pages_move (unlock,
 * MREMAP_DONTUNMAP, PROT_NONE, lock at the target): its hole keeps the
 * address ours until the cut is published, then is unmapped. A plain
 * mremap, which unmaps the donor at once, let another thread's target
 * reservation land on a donor not yet cut (two chunks over one range:
 * W2 with two threads crashed).
 *
 * Locks. The deciding hold (grow_take's, after its last look) takes the
 * donors out of the free extents (counted in the node's `moving`, idle:
 * validate counts them) and allocates the chunk structs the publishing
 * hold will need, so that hold cannot fail. No release, trim or
 * out-of-memory retry can give a donor's chunk back meanwhile (a chunk
 * with a range taken is not whole), no other carve or move takes a
 * donor. With no lock: the target's address is reserved
 * (PP_HOOK_MOVE_RESERVED before) and each donor moved into it in turn
 * (PP_HOOK_MOVE_STEP before each). The publishing hold cuts the moved
 * donors out of their chunks, enters the moved pages as a chunk, carves
 * the requester's piece from it (the rule of grow_take: never "move,
 * unlock, take again"), and gives back the donors not moved. The move runs
 * in the allocating thread's busy section: a fork waits for it.
 *
 * A step that fails (the reservation, or donor k's move, which changes
 * nothing when it fails; pagemove.c): the donors before k are published as
 * moved (a chunk of free pages), the others given back where they were, the
 * target's unused address unmapped, and the miss grows as without moves
 * (move_fallbacks). Pages change place, never count. */
#define MOVE_PIECES 16
#define MOVE_MIN_PIECE ((size_t)256 << 10)

typedef struct move_plan {
  unsigned n, flags;
  void *from[MOVE_PIECES];
  size_t len[MOVE_PIECES];
  pp_xchunk_t *spare[MOVE_PIECES + 1]; /* a split per donor, the target */
} move_plan_t;

/* Deciding hold: the donors for `need` bytes, or false with nothing
 * changed. */
static bool move_plan_locked(pinpool_t *pool, unsigned node, size_t need,
                             move_plan_t *m) {
  pp_arena_node_t *a = &pool->arena.node[node];
  pp_assert_held(&pool->seg_lock);
  /* Not fragmentation when the bytes are not there. (A rule that moved
   * only with an eighth of the node free beyond `need` was tried on W2:
   * memory held 1.07 -> 1.21 at 256 MiB, the time no better:
   * docs/benchmarks.md, "Page-moving growth".) */
  if (a->ext.free_bytes < need)
    return false;
  size_t left = need;
  m->n = 0;
  m->flags = 0;
  while (left > 0 && m->n < MOVE_PIECES) {
    size_t got = 0;
    unsigned f = 0;
    void *d = pp_ext_take_largest(&a->ext, left, &got, &f);
    if (d == NULL)
      break;
    /* Donors of one kind (the moved pages are one chunk with one set of
     * flags: locked or not, the reserve's or not); none so small that a
     * piece's four mappings and a system call buy little. */
    if ((got < MOVE_MIN_PIECE && got < left) || (m->n > 0 && f != m->flags)) {
      pp_ext_give(&a->ext, d, got);
      break;
    }
    m->flags = f;
    m->from[m->n] = d;
    m->len[m->n] = got;
    m->n++;
    left -= got;
  }
  bool ok = left == 0;
  for (unsigned i = 0; i <= m->n; i++)
    m->spare[i] = ok ? pp_ext_chunk_new() : NULL;
  for (unsigned i = 0; i <= m->n && ok; i++)
    ok = m->spare[i] != NULL;
  if (!ok) {
    for (unsigned i = 0; i < m->n; i++)
      pp_ext_give(&a->ext, m->from[i], m->len[i]);
    for (unsigned i = 0; i <= m->n; i++)
      pp_ext_chunk_free(m->spare[i]);
    return false;
  }
#ifndef PINPOOL_MUTANT_MOVE_UNCOUNTED
  a->moving += need;
#else
  /* Mutant (docs/verification.md): the donors in flight counted nowhere;
   * test_arena_move's move_windows must fail (validate in the window). */
  (void)a;
#endif
  return true;
}

/* No lock held. The move planned, published: 0 with *mem (the requester's
 * piece, carved in the publishing hold), or an error after which the
 * caller grows (nothing lost: "A step that fails" above). */
static int move_run(pinpool_t *pool, unsigned node, size_t need, move_plan_t *m,
                    void **mem, unsigned *flags) {
  pp_arena_node_t *a = &pool->arena.node[node];
  pp_hook(PP_HOOK_MOVE_RESERVED);
  void *to = NULL;
  int rc = pp_space_reserve(&pool->cfg, need, &to);
  if (rc == 0 && (uintptr_t)to + need > ((uintptr_t)1 << PP_MAP_ADDR_BITS)) {
    pp_space_release(to, need); /* segments there could not be mapped */
    rc = pp_fail(PINPOOL_EBACKEND, "page move: address %p beyond 2^48", to);
  }
  unsigned k = 0;
  size_t moved = 0;
  bool locked = (m->flags & PP_SEG_LOCKED) != 0;
  for (; rc == 0 && k < m->n; k++) {
    pp_hook(PP_HOOK_MOVE_STEP);
    unsigned notes = 0;
    rc = pp_pages_move(&pool->cfg, (char *)to + moved, m->from[k], m->len[k],
                       locked, &notes);
    if (notes & PP_MOVE_LOCK_LOST) /* the pages, free, unlocked */
      pp_fetch_add_relaxed(&pool->gs.mlock_failures, 1);
    if (rc != 0)
      break;
    moved += m->len[k];
  }
  void *p = NULL;
  pp_mutex_lock(&pool->seg_lock);
  /* The cuts first: they leave the spare node and the table room that
   * the chunk's entry and the carve need (extent.c, pp_ext_cut). */
  for (unsigned i = 0; i < k; i++) {
    pp_ext_cut(&a->ext, m->from[i], m->len[i], &m->spare[i]);
    pp_hist_event(pool, PP_H_SEGMENT_FREE, (uintptr_t)m->from[i], m->len[i], 0,
                  0, NULL);
  }
  if (moved > 0) {
    pp_ext_add_chunk_spare(&a->ext, to, moved, m->flags, m->spare[m->n]);
    m->spare[m->n] = NULL;
    pp_hist_event(pool, PP_H_SEGMENT_ALLOC, (uintptr_t)to, moved, 0, 0, NULL);
  }
  if (moved == need) {
    /* Two donors at least (the miss found no extent of `need`): the cuts
     * left room for this carve too, which cannot fail. */
    p = pp_ext_take(&a->ext, need, flags);
    pp_assert(p != NULL);
    pp_grow_noted_locked(pool, node, need);
  }
  for (unsigned i = k; i < m->n; i++)
    pp_ext_give(&a->ext, m->from[i], m->len[i]);
#ifndef PINPOOL_MUTANT_MOVE_UNCOUNTED
  a->moving -= need;
#endif
  pp_store_relaxed(&a->total, a->ext.total_bytes);
  pp_mutex_unlock(&pool->seg_lock);
  for (unsigned i = 0; i <= m->n; i++)
    pp_ext_chunk_free(m->spare[i]);
  /* The moved donors' ranges, out of the arena since the hold above: the
   * holes the moves left (mapped, empty) kept their address ours until
   * then, so that no chunk or target of another thread could be placed
   * there while the extents still counted them (two threads moving at
   * once: a target landed on a donor moved and not yet cut). */
  for (unsigned i = 0; i < k; i++)
    pp_space_release(m->from[i], m->len[i]);
  if (to != NULL && moved < need && rc != 0)
    pp_space_release((char *)to + moved, need - moved);
  if (moved > 0) {
    pp_fetch_add_relaxed(&pool->gs.page_moves, 1);
    pp_fetch_add_relaxed(&pool->gs.bytes_moved, moved);
  }
  if (p == NULL) {
    pp_fetch_add_relaxed(&pool->gs.move_fallbacks, 1);
    return rc;
  }
  *mem = p;
  return 0;
}

/* Growth: the last look, then a new chunk, whose piece of `need` bytes
 * goes to the caller in the same hold of seg_lock that puts the chunk in
 * the arena. Until that hold the chunk is the backend's and this thread's
 * alone, and after it the piece is carved: no release (empty_cache,
 * another thread's trim or out-of-memory retry) can give the chunk back
 * before the caller has its piece, so one request grows the arena at most
 * once. The last look, in the hold that decides to grow, gathers every
 * block given back since the miss (deferred or in a hot slot: the caller's
 * release ran before that) so the arena never grows past one. No lock
 * held; takes seg_lock. */
static int grow_take(pinpool_t *pool, unsigned node, size_t need, void **mem,
                     unsigned *flags, bool *grew, bool may_join,
                     bool may_move) {
  pp_arena_node_t *a = &pool->arena.node[node];
  size_t size = chunk_size(pool, node, need);
  void *hint = NULL;
  pp_growth_t self = {node, size - need, NULL, NULL, false};
  pp_growth_wait_t w = {need, NULL, 0, false, {{0}}, NULL};
  pp_growth_t *join = NULL;
  pp_mutex_lock(&pool->seg_lock);
  gather_locked(pool);
  void *p = pp_ext_take(&a->ext, need, flags);
  if (p != NULL)
    pp_grow_carved_locked(pool, node, need); /* growahead.c: hits */
#ifndef PINPOOL_MUTANT_GROW_NO_JOIN
  /* Never from inside a callout (base.h): the growth joined could be
   * this thread's own (a backend alloc that allocates), or one whose
   * backend call waits for what this thread's caller holds (D5: a query
   * that allocates joined a growth whose backend alloc polled, and that
   * full poll waited for the query). */
  if (p == NULL && may_join && !pp_in_callout() &&
      (join = inflight_find_locked(pool, node, need)) != NULL &&
      sem_init(&w.done, 0, 0) == 0) {
    join->room -= need;
    w.next = join->waiters;
    join->waiters = &w;
  } else {
    join = NULL;
  }
#else
  /* Mutant (docs/verification.md): every miss grows its own chunk;
   * test_growahead's join_inflight and join_grower must fail. */
  (void)may_join;
#endif
  /* A fragmentation miss moves pages rather than grow ("Page moves"):
   * never from inside a callout (a backend call's allocation is the
   * backend's own business, and a move's hooks must not run there). */
  move_plan_t mv;
  bool move = p == NULL && join == NULL && may_move && pool->page_move &&
              !pp_in_callout() && move_plan_locked(pool, node, need, &mv);
  if (p == NULL && join == NULL && !move) {
    hint = below_lowest_locked(pool, a, size);
    self.next = pool->grow.inflight;
    pool->grow.inflight = &self;
  }
  pp_mutex_unlock(&pool->seg_lock);
  if (p != NULL) {
    *mem = p;
    return 0;
  }
  if (join != NULL) {
    if (inflight_wait(&w, mem, flags))
      return 0; /* another thread's growth carved it: this one grew nothing */
    return grow_take(pool, node, need, mem, flags, grew, false, may_move);
  }
  if (move) {
    if (move_run(pool, node, need, &mv, mem, flags) == 0)
      return 0; /* no chunk made: *grew stays false */
    return grow_take(pool, node, need, mem, flags, grew, may_join, false);
  }
  /* A child of fork whose parent grew ahead: the grower's thread comes
   * back at the child's first growth (stream.c). */
  if (pool->grow.node != NULL && !pool->forked_cuda)
    pp_bg_restart(pool);
  pp_hook(PP_HOOK_GROW_CALL);
  void *cmem = NULL;
  unsigned cflags = 0;
  int rc = backend_alloc(pool, node, hint, size, &cmem, &cflags);
  if (rc != 0) {
    tls_miss.need = need; /* the retry's plan (pp_arena_retry_plan) */
    tls_miss.node = node;
    tls_miss.cap = tls_capped;
    tls_miss.set = true;
    pp_mutex_lock(&pool->seg_lock);
    pp_growth_wait_t *ws = inflight_end_locked(pool, &self, false);
    pp_mutex_unlock(&pool->seg_lock);
    inflight_wake(ws);
    return rc;
  }
  pp_hook(PP_HOOK_ARENA_GROW);
  pp_growth_wait_t *ws = NULL;
  pp_mutex_lock(&pool->seg_lock);
  rc = pp_ext_add_chunk(&a->ext, cmem, size, cflags);
  if (rc == 0) {
    pp_store_relaxed(&a->total, a->ext.total_bytes);
    /* Under the lock that every carve takes: no carve from the chunk, nor
     * its history, comes first. History's locks are leaves, taken after
     * seg_lock (the fork handlers' order too); growth only. */
    pp_hist_event(pool, PP_H_SEGMENT_ALLOC, (uintptr_t)cmem, size, 0, 0, NULL);
    /* The deferred stack, as at every carve: the piece is the best fit
     * of the arena as it is (the new chunk holds `need` bytes whole, so
     * there is one). The hot slots were looked at in the hold that
     * decided to grow; draining them again here would only break up
     * blocks kept whole for their size. */
    (void)pp_defer_drain_locked(pool);
#ifdef PINPOOL_MUTANT_GROW_RETAKE
    /* Mutant (docs/verification.md): "grow, unlock, take again", the
     * pattern of issue 37's D4 and D5; test_arena's growth windows must
     * fail. */
    p = NULL;
#else
    p = pp_ext_take(&a->ext, need, flags);
    pp_assert(p != NULL);
    pp_grow_noted_locked(pool, node, need); /* the grower sees its size */
#endif
  }
  /* The waiters' pieces after this thread's, in the same hold: no release
   * comes between the chunk's entry and their carves either. */
  ws = inflight_end_locked(pool, &self, rc == 0);
  pp_mutex_unlock(&pool->seg_lock);
  inflight_wake(ws);
  if (rc != 0) {
    backend_free(pool, cmem, size, cflags);
    return pp_fail(PINPOOL_ENOMEM, "out of memory for the arena's metadata");
  }
  *grew = true;
#ifdef PINPOOL_MUTANT_GROW_RETAKE
  pp_hook(PP_HOOK_ARENA_LAP);
  return grow_take(pool, node, need, mem, flags, grew, false, false);
#else
  *mem = p;
  return 0;
#endif
}

/* numa=local: each node gets a reserve of `reserve` bytes, on it. */
int pp_arena_init(pinpool_t *pool) {
  pool->arena.node = calloc(pool->nnodes, sizeof *pool->arena.node);
  if (pool->arena.node == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  (void)pthread_mutex_init(&pool->arena.settle_mu, NULL);
  (void)pthread_cond_init(&pool->arena.settle_cv, NULL);
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_arena_node_t *a = &pool->arena.node[n];
    pp_ext_init(&a->ext, PP_PAGE, pool->prov.alloc_at != NULL);
    a->ext.avoid = PP_SEG_FALLBACK; /* carved last, released first */
  }
  /* page_move= ("Page moves"): the host backend's private anonymous
   * chunks only. Not a CUDA backend's (a registration is of an address
   * range: pages moved out of it are no longer registered where the
   * device looks), not malloc's or a user backend's (not the pool's
   * mappings to move), not a shared pool's (a memfd's pages lent by
   * offset), not with hugepages=1 (pieces not 2 MiB-aligned split huge
   * pages). Resolved here, where backend=auto has chosen. */
  const pp_config_t *c = &pool->cfg;
  const char *no_move = c->backend != PP_BACKEND_HOST ? "needs backend=host"
                        : c->shared    ? "is not supported with shared=1"
                        : c->hugepages ? "is not supported with hugepages=1"
                                       : NULL;
  if (c->page_move == PP_PMOVE_ON && no_move != NULL)
    return pp_fail(PINPOOL_ECONFIG, "config: key 'page_move=1' %s", no_move);
  pool->page_move = c->page_move != PP_PMOVE_OFF && no_move == NULL;
  if (pool->cfg.reserve == 0)
    return 0;
  size_t size = round_up(pool->cfg.reserve, PP_PAGE);
  /* Every node gets a reserve (numa=local): the cap is checked against
   * all of them before the first is mapped, a configuration error (issue
   * 37, D3: node 0's was mapped, populated and given back, and create
   * failed with ENOMEM). config.c checks one reserve against the cap. */
  uint64_t cap = pool->cfg.max_reserved;
  uint64_t all = pp_sat_mul(size, pool->nnodes);
  if (cap != 0 && all > cap)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: key 'reserve' (%zu bytes on each of %u nodes, "
                   "%llu in all) exceeds 'max_reserved' (%llu)",
                   size, pool->nnodes, (unsigned long long)all,
                   (unsigned long long)cap);
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_arena_node_t *a = &pool->arena.node[n];
    void *mem = NULL;
    unsigned flags = 0;
    int rc = backend_alloc(pool, n, NULL, size, &mem, &flags);
    if (rc != 0)
      return rc; /* pp_arena_fini gives back the nodes' reserves made */
    /* A reserve the driver refused to pin (pin_failure=pageable) is a
     * fallback chunk like any other, not the reserve: the first released
     * when all free, after which the arena's next chunk asks the driver
     * again (docs/cuda.md: a refusal is not remembered). Kept as the
     * reserve, it was never released, and one refusal at create left the
     * pool pageable for its life (issue 37, D2). */
    bool keep = !(flags & PP_SEG_FALLBACK);
    if (pp_ext_add_chunk(&a->ext, mem, size,
                         keep ? flags | PP_SEG_FROM_RESERVE : flags) != 0) {
      backend_free(pool, mem, size, flags);
      return pp_fail(PINPOOL_ENOMEM,
                     "out of memory for the reserve's metadata");
    }
    pp_store_relaxed(&a->total, size);
    if (keep) {
      pool->reserve_size += size;
      pool->has_reserve = true;
    }
  }
  return 0;
}

void pp_arena_fini(pinpool_t *pool) {
  if (pool->arena.node == NULL)
    return;
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_arena_node_t *a = &pool->arena.node[n];
    /* Teardown: every segment was released (pp_segment_release_all gave
     * nothing back to the arena: the chunks go whole). */
    for (const pp_xchunk_t *c = pp_ext_first(&a->ext); c != NULL;
         c = pp_ext_next(c)) {
      uintptr_t base;
      size_t size;
      unsigned flags;
      pp_ext_chunk_info(c, &base, &size, &flags);
      backend_free(pool, (void *)base, size, flags);
    }
    pp_ext_fini(&a->ext);
  }
  (void)pthread_cond_destroy(&pool->arena.settle_cv);
  (void)pthread_mutex_destroy(&pool->arena.settle_mu);
  free(pool->arena.node);
  pool->arena.node = NULL;
}

int pp_arena_take(pinpool_t *pool, unsigned node, size_t size, void **mem,
                  unsigned *flags, bool *grew) {
  pp_arena_node_t *a = &pool->arena.node[node];
  pp_assert(size % PP_PAGE == 0 && size > 0);
  pp_mutex_lock(&pool->seg_lock);
  (void)pp_defer_drain_locked(pool);
  void *p = pp_ext_take(&a->ext, size, flags);
  if (p != NULL)
    pp_grow_carved_locked(pool, node, size); /* growahead.c: hits */
  pp_mutex_unlock(&pool->seg_lock);
  if (p != NULL) {
    *mem = p;
    return 0;
  }
  /* A miss gives the calling thread's cached blocks, then idle slabs and
   * hot slots' blocks back to their chunks (they may coalesce into room)
   * before the arena grows. The thread's cache first: a large stack keeps
   * blocks of sizes not asked for lately, and the small stacks' blocks
   * keep their slabs from going idle; W2's thread grew the arena past both
   * (docs/allocation-policy.md, "Growth"). grow_take looks once more, with
   * what other threads gave back meanwhile, in the hold that decides. */
  (void)pp_tcache_give_own(pool);
  (void)pp_release_idle(pool);
  pp_hook(PP_HOOK_ARENA_LAP);
  return grow_take(pool, node, size, mem, flags, grew, true, true);
}

bool pp_arena_take_now(pinpool_t *pool, unsigned node, size_t size, void **mem,
                       unsigned *flags) {
  pp_arena_node_t *a = &pool->arena.node[node];
  pp_assert(size % PP_PAGE == 0 && size > 0);
  pp_assert_held(&pool->seg_lock);
  void *p = pp_ext_take(&a->ext, size, flags);
  if (p != NULL)
    pp_grow_carved_locked(pool, node, size); /* growahead.c: hits */
  *mem = p;
  return p != NULL;
}

void pp_arena_give_locked(pinpool_t *pool, unsigned node, void *mem,
                          size_t size) {
  pp_assert_held(&pool->seg_lock);
#ifdef PINPOOL_MUTANT_GIVE_DONTNEED
  /* Mutant (docs/verification.md): the pages of every range given back
   * go back to the kernel too; test_arena's steady_pages must fail. */
  (void)madvise(mem, size, MADV_DONTNEED);
#endif
  pp_ext_give(&pool->arena.node[node].ext, mem, size);
}

/* Nodes in turn, oldest free chunk of each first: a budget spread over the
 * nodes rather than one node emptied first (a cap is the pool's, not a
 * node's). */
unsigned pp_arena_release(pinpool_t *pool, uint64_t budget) {
  unsigned n = 0, dry = 0;
  uint64_t got = 0;
  for (unsigned node = 0; got < budget && dry < pool->nnodes;
       node = node + 1 < pool->nnodes ? node + 1 : 0) {
    pp_arena_node_t *a = &pool->arena.node[node];
    void *base;
    size_t size;
    unsigned flags;
    pp_claim_t claim;
    pp_mutex_lock(&pool->seg_lock);
    bool ok = pp_ext_remove_free_chunk(&a->ext, PP_SEG_FROM_RESERVE, &base,
                                       &size, &flags);
    if (ok) {
      pp_store_relaxed(&a->total, a->ext.total_bytes);
      pool->grow.releases++;      /* growahead.c: a release pauses the grower */
      settle_begin(pool, &claim); /* its claim until backend_free */
    }
    pp_mutex_unlock(&pool->seg_lock);
    if (!ok) {
      dry++;
      continue;
    }
    dry = 0;
    pp_hook(PP_HOOK_ARENA_RELEASE);
    /* Before the backend may hand the range to another thread's growth,
     * whose SEGMENT_ALLOC must come after this in the history. */
    pp_hist_event(pool, PP_H_SEGMENT_FREE, (uintptr_t)base, size, 0, 0, NULL);
    backend_free(pool, base, size, flags);
    settle_end(pool, &claim);
    got += size;
    n++;
  }
  return n;
}

void pp_arena_node_info_locked(pinpool_t *pool, unsigned node,
                               pp_arena_info_t *out, uint64_t *segs) {
  pp_arena_node_t *a = &pool->arena.node[node];
  pp_assert_held(&pool->seg_lock);
  out->chunks = a->ext.nchunks;
  out->total = a->ext.total_bytes;
  out->free_bytes = a->ext.free_bytes;
  out->free_extents = a->ext.nfree;
  out->largest = pp_ext_largest(&a->ext);
  out->moving = a->moving;
  if (segs != NULL)
    *segs = a->segs;
}

void pp_arena_info_locked(pinpool_t *pool, pp_arena_info_t *out) {
  *out = (pp_arena_info_t){0, 0, 0, 0, 0, 0};
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_arena_info_t i;
    pp_arena_node_info_locked(pool, n, &i, NULL);
    out->chunks += i.chunks;
    out->total += i.total;
    out->free_bytes += i.free_bytes;
    out->free_extents += i.free_extents;
    out->moving += i.moving;
    if (i.largest > out->largest)
      out->largest = i.largest;
  }
}

void pp_arena_info(pinpool_t *pool, pp_arena_info_t *out) {
  pp_mutex_lock(&pool->seg_lock);
  pp_arena_info_locked(pool, out);
  pp_mutex_unlock(&pool->seg_lock);
}

bool pp_arena_validate_locked(pinpool_t *pool, char *why, size_t len) {
  pp_assert_held(&pool->seg_lock);
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_arena_node_t *a = &pool->arena.node[n];
    if (!pp_ext_validate(&a->ext, why, len))
      return false;
    if (pp_load_relaxed(&a->total) != a->ext.total_bytes) {
      (void)snprintf(
          why, len, "arena node %u: %zu bytes in chunks, counter says %llu", n,
          a->ext.total_bytes, (unsigned long long)pp_load_relaxed(&a->total));
      return false;
    }
  }
  return true;
}

/* ---- Growth ahead of demand (growahead.c) ------------------------------
 * The grower's chunk is made as grow_take makes one: with no lock held,
 * then put in the arena in one hold of seg_lock. It goes in whole and
 * free, so a release may give it back at once: that is the release's
 * right (the grower then pauses, growahead.c), and no carve is in flight
 * on it. The allocating thread never waits for this: it takes seg_lock
 * only for the short hold that enters the chunk. */
int pp_arena_grow_ahead(pinpool_t *pool, unsigned node, size_t need,
                        size_t least, uint64_t room, uint64_t releases,
                        size_t *size_out, unsigned *flags) {
  pp_arena_node_t *a = &pool->arena.node[node];
  /* One chunk per look, no larger than the policy's largest unless the
   * window's largest carve is: a headroom of many GiB is made a chunk per
   * look, not asked of the backend whole at every look. */
  if (need > CHUNK_MAX)
    need = CHUNK_MAX;
  size_t size = chunk_size(pool, node, need > least ? need : least);
  if (size > room)
    size = (size_t)(room & ~(uint64_t)(CHUNK_ALIGN - 1));
  if (size < CHUNK_MIN || size < least)
    return 1; /* a cap leaves no room for a chunk, or for a useful one */
  /* In flight from this hold on: a miss meanwhile waits for this chunk
   * rather than grow one of its own (grow_take). */
  pp_growth_t self = {node, size, NULL, NULL, true};
  pp_claim_t claim;
  pp_mutex_lock(&pool->seg_lock);
  /* An allocation's growth in flight: its chunk's free tail is not in the
   * room the grower read, and the two chunks together could pass a cap
   * (test_growahead max_cached under TSAN: 9 MiB free under an 8 MiB
   * max_cached, and the next trim gave the grower's chunk back). */
  if (inflight_find_locked(pool, node, 0) != NULL) {
    pp_mutex_unlock(&pool->seg_lock);
    return 3;
  }
  void *hint = below_lowest_locked(pool, a, size);
  self.next = pool->grow.inflight;
  pool->grow.inflight = &self;
  settle_begin(pool, &claim); /* its claim, until the chunk is in the arena */
  pp_mutex_unlock(&pool->seg_lock);
  void *cmem = NULL;
  unsigned cflags = 0;
  int rc = backend_alloc(pool, node, hint, size, &cmem, &cflags);
  if (rc != 0) {
    pp_mutex_lock(&pool->seg_lock);
    pp_growth_wait_t *ws = inflight_end_locked(pool, &self, false);
    pp_mutex_unlock(&pool->seg_lock);
    inflight_wake(ws);
    settle_end(pool, &claim);
    return rc;
  }
  pp_hook(PP_HOOK_GROW_AHEAD);
  pp_mutex_lock(&pool->seg_lock);
  /* A release since the grower looked wins (growahead.c): the chunk goes
   * back unused rather than undo what the release gave; unless a miss
   * waits for it, which would otherwise grow a chunk of its own (the
   * chunk enters as that growth would have). */
  bool lost = pool->grow.releases != releases && self.waiters == NULL;
  rc = lost ? 0 : pp_ext_add_chunk(&a->ext, cmem, size, cflags);
  if (rc == 0 && !lost) {
    pp_store_relaxed(&a->total, a->ext.total_bytes);
    pp_hist_event(pool, PP_H_SEGMENT_ALLOC, (uintptr_t)cmem, size, 0, 0, NULL);
    pool->grow.node[node].unused += size;
    /* Counted in the hold that enters it: no reader of the arena sees the
     * chunk before its count (test_growahead release_wins saw the headroom
     * and not yet the chunk). */
    pp_fetch_add_relaxed(&pool->grow.chunks, 1);
    pp_fetch_add_relaxed(&pool->grow.bytes, size);
  }
  pp_growth_wait_t *ws = inflight_end_locked(pool, &self, rc == 0 && !lost);
  pp_mutex_unlock(&pool->seg_lock);
  inflight_wake(ws);
  if (lost || rc != 0)
    backend_free(pool, cmem, size, cflags);
  settle_end(pool, &claim);
  if (lost)
    return 2;
  if (rc != 0)
    return pp_fail(PINPOOL_ENOMEM, "out of memory for the arena's metadata");
  *size_out = size;
  *flags = cflags;
  return 0;
}

/* The grower's give-back (growahead.c, "auto gives back"): the chunk is
 * taken out in one hold (put back in it if it is too large or held the
 * extent the target needs), then given to the backend with no lock held,
 * as pp_arena_release does. Never with a growth in flight on the node:
 * that growth found no room, and the chunk given back might have been the
 * room the next miss needs. */
size_t pp_arena_shed(pinpool_t *pool, unsigned node, uint64_t most,
                     uint64_t largest) {
  pp_arena_node_t *a = &pool->arena.node[node];
  void *base = NULL;
  size_t size = 0;
  unsigned flags = 0;
  pp_claim_t claim;
  pp_mutex_lock(&pool->seg_lock);
  bool ok = inflight_find_locked(pool, node, 0) == NULL &&
            pp_ext_remove_free_chunk(&a->ext, PP_SEG_FROM_RESERVE, &base, &size,
                                     &flags);
  if (ok && (size > most || pp_ext_largest(&a->ext) < largest) &&
      pp_ext_add_chunk(&a->ext, base, size, flags) == 0)
    ok = false; /* back as it was (its age aside): nothing given */
  /* (Put back failed, out of memory for the metadata: the chunk is
   * whole and free, and goes back to the backend after all.) */
  if (ok) {
    pp_store_relaxed(&a->total, a->ext.total_bytes);
    pp_grow_node_t *g = &pool->grow.node[node];
    g->unused -= g->unused < size ? g->unused : size;
    settle_begin(pool, &claim); /* until backend_free, as a release's */
  }
  pp_mutex_unlock(&pool->seg_lock);
  if (!ok)
    return 0;
  pp_hook(PP_HOOK_GROW_SHED);
  pp_hist_event(pool, PP_H_SEGMENT_FREE, (uintptr_t)base, size, 0, 0, NULL);
  backend_free(pool, base, size, flags);
  settle_end(pool, &claim);
  pp_fetch_add_relaxed(&pool->gs.trimmed, 1);
  return size;
}
