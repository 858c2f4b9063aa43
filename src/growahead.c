/*
 * Growth ahead of demand (grow_ahead=; docs/allocation-policy.md, "Growth
 * ahead of demand").
 *
 * The pool's background thread (stream.c, bg_main) looks here at most
 * once per millisecond and keeps a headroom of free space in each arena
 * node, made (populated, locked, registered) before an allocation needs
 * it, so that a steady or slowly growing workload never waits for the
 * backend on its own thread:
 *  - grow_ahead=BYTES: at least BYTES free in the node;
 *  - grow_ahead=auto: at least what the node's demand (bytes carved from
 *    its chunks) grew by over the last window, the longer of 250 ms and
 *    four mean backend allocations: one window of the recent growth rate;
 *  - and in both, a free extent at least as large as the largest carve of
 *    the window, so that the next large block finds room whole.
 * One chunk per look, of the size the growth policy would give the next
 * growth (arena.c, chunk_size), made with no lock held and entered in one
 * short hold of seg_lock (pp_arena_grow_ahead): the hot path never waits
 * for the grower, and the grower never holds a lock an allocation needs
 * across a backend call.
 *
 * Caps: a chunk grown ahead must fit under max_reserved (what is left of
 * it, claimed bytes counted) and under the idle caps (max_cached,
 * max_cached_pct: pp_cache_room), so the grower never makes memory that a
 * trim would give back at once. A chunk that came back unlocked (mlock
 * refused: RLIMIT_MEMLOCK) or pageable (the driver refused to pin) stays,
 * as inline growth would keep it, and pauses the grower.
 *
 * Who wins against a release: the release. Any chunk given back to the
 * backend (pinpool_empty_cache, a max_cached trim, an out-of-memory retry;
 * counted in grow.releases in the hold that takes it out of the arena)
 * pauses the grower until the demand passes what it was at that moment:
 * memory a release gave back is grown again only for new demand, so a
 * trim and the grower never loop. A chunk the grower was making when the
 * release came goes back unused (pp_arena_grow_ahead). The grower never
 * touches a block in use.
 *
 * auto gives back: once the demand has not grown over a whole window, the
 * free bytes beyond the largest extent the target keeps, up to what the
 * grower grew and no carve used, go back a whole chunk per look
 * (pp_arena_shed), in a busy section and under mu as a growth is.
 *
 * A miss while the grower's chunk is in flight waits for it if its piece
 * fits (arena.c, "Growths in flight"): the chunk's entering hold carves
 * it. Such a chunk is kept even if a release came meanwhile: the waiter
 * would otherwise grow one of its own.
 *
 * Fork: a chunk is made inside a busy section, so a fork waits until it
 * is in the arena (or not made): the child never counts a chunk its arena
 * lacks. The thread does not survive into the child (stream.c,
 * pp_streams_fork); a child whose pool uses CUDA never grows ahead
 * (forked_cuda), others get the thread back at their first inline growth
 * (arena.c, grow_take) or first stream-ordered free.
 */
#include "internal.h"

#include <stdlib.h>

#define LOOK_NS 1000000ull         /* at most one look per millisecond */
#define WINDOW_MIN_NS 250000000ull /* the window of grow_ahead=auto */

int pp_grow_init(pinpool_t *pool) {
  if (pool->cfg.grow_ahead == 0 && !pool->cfg.grow_ahead_auto)
    return 0;
  pool->grow.node = calloc(pool->nnodes, sizeof *pool->grow.node);
  if (pool->grow.node == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  /* Paused at 0: the first demand is the pool's own growth; the grower
   * starts once there is some (an idle pool holds nothing ahead). */
  pool->grow.paused = true;
  pool->grow.pause_used = 0;
  (void)pthread_mutex_init(&pool->grow.mu, NULL);
  return 0;
}

void pp_grow_fini(pinpool_t *pool) {
  if (pool->grow.node == NULL)
    return;
  (void)pthread_mutex_destroy(&pool->grow.mu);
  free(pool->grow.node);
  pool->grow.node = NULL;
}

void pp_grow_lock(pinpool_t *pool) {
  if (pool->grow.node != NULL)
    (void)pthread_mutex_lock(&pool->grow.mu);
}

void pp_grow_unlock(pinpool_t *pool) {
  if (pool->grow.node != NULL)
    (void)pthread_mutex_unlock(&pool->grow.mu);
}

/* The child's grower starts at its first growth (arena.c, grow_take); a
 * validate of the parent may have held mu. No growth was in flight (each
 * is in a busy section). */
void pp_grow_fork_child(pinpool_t *pool) {
  pool->grow.inflight = NULL;
  if (pool->grow.node != NULL)
    (void)pthread_mutex_init(&pool->grow.mu, NULL);
}

/* A carve of `size` bytes from node's chunks (arena.c, seg_lock held):
 * the largest carve, and the grown-ahead bytes it used. A carve is a hit
 * while grown-ahead bytes remain unused; it avoided a wait when the free
 * bytes outside them could not have held it. Released chunks take their
 * unused bytes with them: those are never more than the free bytes. */
void pp_grow_carved_locked(pinpool_t *pool, unsigned node, size_t size) {
  if (pool->grow.node == NULL)
    return;
  pp_grow_node_t *g = &pool->grow.node[node];
  if (size > g->max_carve)
    g->max_carve = size;
  uint64_t free_before = pool->arena.node[node].ext.free_bytes + size;
  if (g->unused > free_before)
    g->unused = free_before;
  if (g->unused == 0)
    return;
  pp_fetch_add_relaxed(&pool->grow.hits, 1);
  if (free_before - g->unused < size)
    pp_fetch_add_relaxed(&pool->grow.waits_avoided, 1);
  g->unused -= g->unused < size ? g->unused : size;
}

/* Before, only the carves that found room were seen: a large block that
 * grew the arena inline left max_carve as it was, and the grower never
 * made room for the next one of its size (test_growahead
 * inline_carve_seen: every 24 MiB block grew inline). */
void pp_grow_noted_locked(pinpool_t *pool, unsigned node, size_t size) {
  if (pool->grow.node != NULL && size > pool->grow.node[node].max_carve)
    pool->grow.node[node].max_carve = size;
}

typedef struct look {
  uint64_t used, free, largest, carve, total, unused;
} look_t;

static uint64_t cap_room(pinpool_t *pool) {
  uint64_t cap = pool->cfg.max_reserved;
  if (cap == 0)
    return UINT64_MAX;
  uint64_t claimed = pp_load_relaxed(&pool->gs.reserved_claimed);
  return cap > claimed ? cap - claimed : 0;
}

static uint64_t window_ns(pinpool_t *pool) {
  uint64_t n = pp_load_relaxed(&pool->gs.ba_count);
  uint64_t mean = n == 0 ? 0 : pp_load_relaxed(&pool->gs.ba_total) / n;
  uint64_t w = pp_sat_mul(mean, 4);
  return w > WINDOW_MIN_NS ? w : WINDOW_MIN_NS;
}

/* The headroom node n should have now, and the largest extent it needs.
 * auto: the demand's growth over the window's samples, scaled up to a
 * whole window while the grower has followed the demand for less (a ramp
 * that has just begun: its first 30 ms of growth stand for 250), but not
 * past the demand itself (bytes in use from the node's chunks). The
 * largest extent: the window's largest carve, and room for up to three
 * more of it (at most an eighth of the arena: the growth policy's next
 * chunk), so that the carves made while the grower's chunk is being
 * made (registration: milliseconds) still find room whole. */
static void target(pinpool_t *pool, unsigned n, const look_t *l, uint64_t now,
                   uint64_t *bytes, uint64_t *largest, uint64_t *max_carve) {
  pp_grow_node_t *g = &pool->grow.node[n];
  uint64_t low = l->used, carve = l->carve;
  for (unsigned i = 0; i < PP_GROW_SAMPLES; i++) {
    if (g->used[i] < low)
      low = g->used[i];
    if (g->carve[i] > carve)
      carve = g->carve[i];
  }
  if (pool->cfg.grow_ahead_auto) {
    uint64_t w = window_ns(pool), span = now - pool->grow.start_ns;
    if (span < w / PP_GROW_SAMPLES)
      span = w / PP_GROW_SAMPLES;
    uint64_t grew = l->used - low;
    *bytes =
        span >= w ? grew : (uint64_t)((double)grew * (double)w / (double)span);
    /* The scaling never asks for more than the demand itself. Not the
     * arena's size, which the grower's own chunks raise: a jump of 64 MiB
     * in a millisecond (scaled by 8) grew 480 MiB ahead, each chunk
     * lifting the bound for the next (test_growahead auto_gives_back). */
    uint64_t most = grew > l->used ? grew : l->used;
    if (*bytes > most)
      *bytes = most;
  } else {
    *bytes = pool->cfg.grow_ahead;
  }
  uint64_t more = pp_sat_mul(carve, 3);
  if (more > l->total / 8)
    more = l->total / 8;
  *largest = pp_sat_add(carve, more);
  *max_carve = carve;
}

void pp_grow_tick(pinpool_t *pool) {
  pp_grow_t *gr = &pool->grow;
  if (gr->node == NULL || !pp_load_acquire(&gr->ready) || pool->forked_cuda)
    return;
  uint64_t now = pp_now_ns();
  if (now - gr->last_ns < LOOK_NS)
    return;
  gr->last_ns = now;
  look_t l[PP_NUMA_MAX] = {{0}}; /* nnodes of them are read */
  uint64_t used_all = 0;
  pp_mutex_lock(&pool->seg_lock);
  /* In the hold that reads the arena: a release is seen with its effect. */
  uint64_t releases = gr->releases;
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_arena_info_t ai;
    pp_arena_node_info_locked(pool, n, &ai, NULL);
    l[n] =
        (look_t){ai.total - ai.free_bytes, ai.free_bytes, ai.largest,
                 gr->node[n].max_carve,    ai.total,      gr->node[n].unused};
    used_all += l[n].used;
  }
  bool sample = now - gr->sample_ns >= window_ns(pool) / PP_GROW_SAMPLES;
  if (sample)
    for (unsigned n = 0; n < pool->nnodes; n++)
      gr->node[n].max_carve = 0;
  pp_mutex_unlock(&pool->seg_lock);
  if (sample) {
    gr->sample_ns = now;
    gr->slot = (gr->slot + 1) % PP_GROW_SAMPLES;
    for (unsigned n = 0; n < pool->nnodes; n++) {
      gr->node[n].used[gr->slot] = l[n].used;
      gr->node[n].carve[gr->slot] = l[n].carve;
    }
  }
  if (releases != gr->releases_seen) { /* a release won: pause */
    gr->releases_seen = releases;
#ifndef PINPOOL_MUTANT_GROW_NO_PAUSE
    gr->paused = true;
    gr->pause_used = used_all;
    return;
#else
    /* Mutant (docs/verification.md): the grower grows back what a
     * release gave; test_growahead's release_wins must fail. */
#endif
  }
  if (gr->paused) {
    if (used_all <= gr->pause_used)
      return;
    gr->paused = false;
    gr->start_ns = now;
  }
  for (unsigned n = 0; n < pool->nnodes; n++) {
    /* A node with no demand yet holds nothing ahead (numa=local: a fixed
     * headroom went to every node once any had demand; test_growahead
     * numa_local_node). */
    if (l[n].used == 0 && l[n].unused == 0)
      continue;
    uint64_t bytes, largest, carve;
    target(pool, n, &l[n], now, &bytes, &largest, &carve);
    /* auto gives back: the demand has not grown over a whole window (no
     * sample of it is below the demand now), so its target is only the
     * largest extent; free bytes beyond that, up to what the grower grew
     * and no carve used, go back a whole chunk per look (pp_arena_shed:
     * never one a growth in flight may need, never the extent the target
     * keeps, so the next look does not grow it again). A release pauses
     * the grower before this: the two never fight. */
    if (pool->cfg.grow_ahead_auto && bytes == 0 && l[n].free > largest) {
      uint64_t most = l[n].free - largest;
      if (most > l[n].unused)
        most = l[n].unused;
      /* In a busy section and under mu, as the grower's growth: a fork,
       * or a validate, between the hold that takes the chunk out and the
       * backend call would count a chunk the arena lacks. */
      if (most != 0 && (pp_tls.thr != NULL || pp_thread_get() != NULL)) {
        pp_busy_enter();
        pp_grow_lock(pool);
        size_t shed = pp_arena_shed(pool, n, most, largest);
        pp_grow_unlock(pool);
        pp_busy_leave();
        if (shed != 0)
          return; /* one chunk per look */
      }
    }
    uint64_t need = bytes > l[n].free ? bytes - l[n].free : 0;
    if (l[n].largest < largest && need < largest)
      need = largest;
    if (need == 0)
      continue;
    uint64_t room = cap_room(pool), croom = pp_cache_room(pool);
    if (croom < room)
      room = croom;
    if (need > room)
      need = room; /* what the caps allow, if a chunk fits */
    size_t size = 0;
    unsigned flags = 0;
    /* A busy section (fork.c), as an allocation's growth is in one: the
     * backend's chunk is counted before the hold that enters it, and a
     * child forked in between would count a chunk its arena lacks. A
     * fork waits for the section; the record that lets it find this
     * thread's busy count is made first (it takes pp_global_lock, which
     * a fork holds while it waits). */
    if (pp_tls.thr == NULL && pp_thread_get() == NULL)
      return;
#ifndef PINPOOL_MUTANT_GROW_NO_BUSY
    pp_busy_enter();
#endif
    pp_grow_lock(pool);
    /* A chunk that holds none of the window's largest carves would only
     * cut the caps' room into pieces (the first test_growahead max_cached
     * run: a 2 MiB chunk under max_cached=4MiB, of no use to 3 MiB
     * blocks, and trimmed at the next inline growth). */
    int rc = pp_arena_grow_ahead(pool, n, (size_t)need, (size_t)carve, room,
                                 releases, &size, &flags);
    pp_grow_unlock(pool);
#ifndef PINPOOL_MUTANT_GROW_NO_BUSY
    pp_busy_leave();
#else
    /* Mutant (docs/verification.md): no busy section; test_growahead's
     * fork_growing must fail. */
#endif
    if (rc == 3)
      return;      /* an allocation's growth in flight: look again after it */
    if (rc != 0) { /* at a cap, a release came, or the backend refused */
      gr->paused = true;
      gr->pause_used = used_all; /* wait for demand */
      return;
    }
    if (flags & (PP_SEG_LOCK_FAILED | PP_SEG_FALLBACK)) {
      /* RLIMIT_MEMLOCK or the driver said no: a memory cap. Kept (as an
       * inline growth would keep it); nothing more until demand grows. */
      gr->paused = true;
      gr->pause_used = used_all;
    }
    return; /* one chunk per look: stop and destroy are never kept long */
  }
}
