/*
 * Graph capture awareness of stream-ordered frees (docs/cuda.md, "Graph
 * capture"; providers with a `capture` operation: cuda). stream.c keeps
 * the stream sets, the events and their queues; this file the captures
 * blocks are tied to or parked on, and the graph release API. Recording an
 * event on a capturing stream would add a node to the graph, not mark a
 * point in time, so:
 *  - record_stream on a capturing stream ties the block to the capture (an
 *    entry of its stream set that names the capture's id) instead of
 *    adding the stream;
 *  - a free asks each of the block's streams whether it is capturing now.
 *    A block tied to a capture still known to the pool, or with a stream
 *    capturing now, is *parked*: PENDING, in no queue, not counted in
 *    pending_live (synchronize does not wait for it), linked from every
 *    capture that holds it. Nothing is recorded yet;
 *  - pinpool_graph_release (or pinpool_stream_graphs_release) forgets a
 *    capture; a block whose last holding capture went is settled again:
 *    its streams are asked again and, none capturing, one event is recorded
 *    on each (later than at the free: it covers the same work and more).
 * The captures are a list under streams_lock, indexed by id, each with its
 * streams indexed too (issue 38: both lookups walked, under streams_lock,
 * on every record_stream on a capturing stream and every free of a block
 * tied to a capture); a block's `holds` (captures
 * not yet released) is set under it, so a release and a free that race
 * either both see the link or neither does. streams_lock is the only lock
 * this file takes, never with another held nor across a provider call
 * (stream.c, "Fork", has the order of the stream locks).
 */
#include "stream.h"

#include <stdlib.h>

/* A capture a block is tied to or parked on. All under streams_lock. */
typedef struct pp_plink {
  pp_pending_t *p;
  struct pp_plink *next;
} pp_plink_t;

struct pp_capture {
  uint64_t id;
  pinpool_stream_t *streams; /* the streams it was seen on */
  uint32_t nstreams, cap;    /* cap >= nstreams + users */
  /* streams' index: sidx[j] is a stream's place in streams[] + 1, 0 empty;
   * 2 * cap slots (a power of two), so at most half full. */
  uint32_t *sidx;
  uint32_t users;     /* record_stream calls tying a block now */
  bool tied;          /* a record_stream tied a block to it */
  pp_plink_t *parked; /* the blocks it holds */
  struct pp_capture *next, *prev;
};

/* ---- Captures (under streams_lock) --------------------------------------- */

/* Fibonacci hashing into a table of cap slots (a power of two). */
static size_t chash(uint64_t key, size_t cap) {
  return (size_t)((key * 0x9e3779b97f4a7c15u) >>
                  (64 - __builtin_ctzll((unsigned long long)cap)));
}

/* The slot of capture id in pool->ctab, or the empty slot where it would
 * go; ctab_cap > 0. Probes on streams_lock's meter. */
static size_t ctab_slot(pinpool_t *pool, uint64_t id) {
  size_t mask = pool->ctab_cap - 1, j = chash(id, pool->ctab_cap);
  uint64_t probes = 1;
  while (pool->ctab[j] != NULL && pool->ctab[j]->id != id) {
    j = (j + 1) & mask;
    probes++;
  }
  pp_lock_visit(&pool->streams_lock, probes);
  return j;
}

static pp_capture_t *capture_find_locked(pinpool_t *pool, uint64_t id) {
  pp_assert_held(&pool->streams_lock);
#ifdef PINPOOL_MUTANT_CAPTURE_WALK
  /* Mutant (docs/verification.md): the list walked, as before. */
  uint64_t visits = 1;
  pp_capture_t *c = pool->captures;
  while (c != NULL && c->id != id) {
    c = c->next;
    visits++;
  }
  pp_lock_visit(&pool->streams_lock, visits);
  return c;
#else
  if (pool->ctab_cap == 0)
    return NULL;
  return pool->ctab[ctab_slot(pool, id)];
#endif
}

/* Take c out of the list and the index (backward shift: no tombstones). */
static void capture_unlink_locked(pinpool_t *pool, pp_capture_t *c) {
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    pool->captures = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  c->next = c->prev = NULL;
  size_t mask = pool->ctab_cap - 1, j = ctab_slot(pool, c->id);
  uint64_t probes = 0;
  for (size_t k = (j + 1) & mask; pool->ctab[k] != NULL; k = (k + 1) & mask) {
    probes++;
    size_t home = chash(pool->ctab[k]->id, pool->ctab_cap);
    if (((k - home) & mask) >= ((k - j) & mask)) {
      pool->ctab[j] = pool->ctab[k];
      j = k;
    }
  }
  pool->ctab[j] = NULL;
  pool->ncaptures--;
  pp_lock_visit(&pool->streams_lock, probes);
}

/* Room in the index for one capture more: doubled and built again (once
 * per doubling). Nothing changes if memory runs out. */
static bool ctab_room_locked(pinpool_t *pool) {
  if (2 * (pool->ncaptures + 1) <= pool->ctab_cap)
    return true;
  size_t cap = pool->ctab_cap == 0 ? 16 : 2 * pool->ctab_cap;
  pp_capture_t **t = calloc(cap, sizeof(pp_capture_t *));
  if (t == NULL)
    return false;
  free(pool->ctab);
  pool->ctab = t;
  pool->ctab_cap = cap;
  for (pp_capture_t *c = pool->captures; c != NULL; c = c->next)
    t[ctab_slot(pool, c->id)] = c;
  return true;
}

/* The slot of stream s in c's index, or the empty one where it would go. */
static size_t sidx_slot(pinpool_t *pool, const pp_capture_t *c,
                        pinpool_stream_t s) {
  size_t mask = 2 * (size_t)c->cap - 1, j = chash(s, 2 * (size_t)c->cap);
  uint64_t probes = 1;
  while (c->sidx[j] != 0 && c->streams[c->sidx[j] - 1] != s) {
    j = (j + 1) & mask;
    probes++;
  }
  pp_lock_visit(&pool->streams_lock, probes);
  return j;
}

static bool capture_has_stream_locked(pinpool_t *pool, const pp_capture_t *c,
                                      pinpool_stream_t s) {
#ifdef PINPOOL_MUTANT_CAPTURE_WALK
  pp_lock_visit(&pool->streams_lock, c->nstreams);
  for (uint32_t i = 0; i < c->nstreams; i++)
    if (c->streams[i] == s)
      return true;
  return false;
#else
  return c->cap != 0 && c->sidx[sidx_slot(pool, c, s)] != 0;
#endif
}

/* Room for `more` streams in c's list (and index): the list doubled, the
 * index built again. */
static bool capture_room_locked(pinpool_t *pool, pp_capture_t *c,
                                uint32_t more) {
  if (c->cap >= c->nstreams + c->users + more)
    return true;
  uint32_t need = c->nstreams + c->users + more, cap = 4;
  while (cap < need)
    cap *= 2;
  uint32_t *ix = calloc(2 * (size_t)cap, sizeof *ix);
  pinpool_stream_t *v =
      ix == NULL ? NULL : realloc(c->streams, cap * sizeof *v);
  if (v == NULL) {
    free(ix);
    return false;
  }
  free(c->sidx);
  c->streams = v;
  c->sidx = ix;
  c->cap = cap;
  for (uint32_t i = 0; i < c->nstreams; i++)
    c->sidx[sidx_slot(pool, c, c->streams[i])] = i + 1;
  return true;
}

static void capture_add_stream_locked(pinpool_t *pool, pp_capture_t *c,
                                      pinpool_stream_t s) {
  if (capture_has_stream_locked(pool, c, s))
    return;
  pp_assert(c->nstreams < c->cap);
  c->streams[c->nstreams++] = s;
  c->sidx[sidx_slot(pool, c, s)] = c->nstreams;
}

/* The capture `id`, entered if new; NULL when out of memory. */
static pp_capture_t *capture_get_locked(pinpool_t *pool, uint64_t id) {
  pp_capture_t *c = capture_find_locked(pool, id);
  if (c != NULL)
    return c;
  c = calloc(1, sizeof *c);
  if (c == NULL || !ctab_room_locked(pool)) {
    free(c);
    return NULL;
  }
  c->id = id;
  c->next = pool->captures;
  if (c->next != NULL)
    c->next->prev = c;
  pool->captures = c;
  pool->ctab[ctab_slot(pool, id)] = c;
  pool->ncaptures++;
  return c;
}

static void capture_free(pp_capture_t *c) {
  free(c->streams);
  free(c->sidx);
  free(c);
}

/* record_stream: the capture `id`, entered if new, with room for the
 * stream; held (users) until pp_capture_unpin. NULL when out of memory. */
static pp_capture_t *capture_pin(pinpool_t *pool, uint64_t id) {
  pp_mutex_lock(&pool->streams_lock);
  pp_capture_t *c = capture_get_locked(pool, id);
  if (c != NULL && !capture_room_locked(pool, c, 1)) {
    if (!c->tied && c->users == 0 && c->parked == NULL && c->nstreams == 0) {
      capture_unlink_locked(pool, c);
      capture_free(c);
    }
    c = NULL;
  }
  if (c != NULL)
    c->users++;
  pp_mutex_unlock(&pool->streams_lock);
  return c;
}

/* The end of a record_stream that pinned c: tied, the block is tied to it
 * and `stream` joins its streams; not tied (the call failed), a capture
 * entered for nothing is taken out again: a failing call changes nothing. */
void pp_capture_unpin(pinpool_t *pool, pp_capture_t *c, pinpool_stream_t stream,
                      bool tied) {
  if (c == NULL)
    return;
  pp_mutex_lock(&pool->streams_lock);
  if (tied) {
    c->tied = true;
    capture_add_stream_locked(pool, c, stream); /* room: capture_pin */
  }
  c->users--;
  if (!c->tied && c->users == 0 && c->parked == NULL && c->nstreams == 0) {
    capture_unlink_locked(pool, c);
    capture_free(c);
  }
  pp_mutex_unlock(&pool->streams_lock);
}

int pp_capture_check(pinpool_t *pool, pinpool_stream_t stream, uint64_t *cap_id,
                     pp_capture_t **pin) {
  *pin = NULL;
#ifdef PINPOOL_MUTANT_NO_CAPTURE_CHECK
  /* Mutant (docs/verification.md): no capture check, the stream is kept
   * as an ordinary one and an event is recorded on it at the free. */
  if (false) {
#else
  if (pool->ev.capture != NULL) {
#endif
    int rc = pool->ev.capture(pool->ev.ctx, stream, cap_id);
    if (rc < 0)
      return rc;
    if (rc == 1 && (*pin = capture_pin(pool, *cap_id)) == NULL)
      return pp_fail(PINPOOL_ENOMEM, "pinpool_record_stream: out of memory");
  }
  return 0;
}

/* ---- Settling a freed block (stream.c's settle) -------------------------- */

bool pp_capture_classify(pinpool_t *pool, const pp_sset_t *set, uint8_t *use,
                         uint64_t *ids) {
  uint32_t n = set == NULL ? 0 : set->n;
  bool any = false;
#ifdef PINPOOL_MUTANT_NO_CAPTURE_CHECK
  (void)pool; /* unused: the mutant asks no stream (below) */
  (void)ids;
#endif
  for (uint32_t i = 0; i < n; i++) {
    use[i] = PP_USE_RECORD;
    if (pp_sset_at(set, i)->captured) {
      any = true;
      continue;
    }
#ifndef PINPOOL_MUTANT_NO_CAPTURE_CHECK
    /* The mutant (above) leaves this check out too. */
    if (pool->ev.capture != NULL) {
      int r = pool->ev.capture(pool->ev.ctx, pp_sset_at(set, i)->s, &ids[i]);
      use[i] = r < 0    ? PP_USE_FAILED
               : r == 1 ? PP_USE_CAPTURING
                        : PP_USE_RECORD;
      any |= r == 1;
    }
#endif
  }
  return any;
}

/* settle's part under streams_lock: link the freed block p to every capture
 * that holds it: its ties to captures not yet released, and the captures
 * its streams are in now (use[i] PP_USE_CAPTURING, the capture's id in
 * ids[i]). For want of memory, *oom_out is set, p is marked failed, and a
 * capturing use that could not be linked becomes PP_USE_FAILED. Returns the
 * captures p was linked to (its holds); > 0, p is parked, counted in
 * graph_blocks/graph_bytes, and p and set may be gone once this returns (a
 * release on another thread may settle and cache the block at once). */
uint32_t pp_capture_park(pinpool_t *pool, pp_pending_t *p, const pp_sset_t *set,
                         uint8_t *use, const uint64_t *ids, bool *oom_out) {
  uint32_t n = set == NULL ? 0 : set->n;
  uint32_t holds = 0;
  bool oom = false;
  pp_mutex_lock(&pool->streams_lock);
  for (uint32_t i = 0; i < n; i++) {
    pp_capture_t *c = NULL;
    if (pp_sset_at(set, i)->captured) {
      c = capture_find_locked(pool, pp_sset_at(set, i)->capture);
    } else if (use[i] == PP_USE_CAPTURING) {
      c = capture_get_locked(pool, ids[i]);
      if (c != NULL && !capture_room_locked(pool, c, 1))
        c = NULL; /* an empty capture entered here stays: harmless */
      if (c == NULL) {
        oom = true;
        use[i] = PP_USE_FAILED;
        continue;
      }
      capture_add_stream_locked(pool, c, pp_sset_at(set, i)->s);
    }
    if (c == NULL || (c->parked != NULL && c->parked->p == p))
      continue; /* released already, or holds this block already */
    pp_plink_t *l = malloc(sizeof *l);
    if (l == NULL) {
      oom = true;
      if (use[i] == PP_USE_CAPTURING)
        use[i] = PP_USE_FAILED;
      continue;
    }
    *l = (pp_plink_t){p, c->parked};
    c->parked = l;
    holds++;
  }
  if (oom) /* under the lock: p may be settled elsewhere once it drops */
    atomic_store_explicit(&p->failed, true, memory_order_release);
  atomic_store_explicit(&p->holds, holds, memory_order_relaxed);
  if (holds > 0) {
    pp_fetch_add_relaxed(&pool->graph_bytes, p->bs);
    pp_fetch_add_relaxed(&pool->graph_blocks, 1);
  }
  pp_mutex_unlock(&pool->streams_lock);
  *oom_out = oom;
  return holds;
}

/* ---- Graph release ------------------------------------------------------- */

/* Forget captures (a list off pool->captures): each parked block whose
 * last capture this was is settled. */
static void release_captures(pinpool_t *pool, pp_capture_t *list) {
  while (list != NULL) {
    pp_capture_t *c = list;
    list = c->next;
    for (pp_plink_t *l = c->parked, *next; l != NULL; l = next) {
      next = l->next;
      pp_pending_t *p = l->p;
      free(l);
      if (atomic_fetch_sub_explicit(&p->holds, 1, memory_order_acq_rel) == 1)
        pp_stream_resume(pool, p);
    }
    capture_free(c);
  }
}

int pinpool_graph_release(pinpool_t *pool, uint64_t capture_id) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_graph_release: pool is NULL");
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED, "pinpool_graph_release: a CUDA pool in "
                                    "a child of fork");
  pp_mutex_lock(&pool->streams_lock);
  pp_capture_t *c = capture_find_locked(pool, capture_id);
  bool busy = c != NULL && c->users > 0;
  if (c != NULL && !busy)
    capture_unlink_locked(pool, c); /* its next is NULL now: a list of one */
  pp_mutex_unlock(&pool->streams_lock);
  if (c == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_graph_release: capture %llu is unknown to the "
                   "pool (no block was recorded on or freed from a stream "
                   "capturing it, or it was released already)",
                   (unsigned long long)capture_id);
  if (busy) /* not taken: a record_stream is tying a block to it */
    return pp_fail(PINPOOL_EBUSY,
                   "pinpool_graph_release: capture %llu is being recorded "
                   "on by another thread (the capture has not ended)",
                   (unsigned long long)capture_id);
  release_captures(pool, c);
  return 0;
}

int pinpool_stream_graphs_release(pinpool_t *pool, pinpool_stream_t stream) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_stream_graphs_release: pool is NULL");
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED, "pinpool_stream_graphs_release: a CUDA "
                                    "pool in a child of fork");
  pp_capture_t *list = NULL;
  bool busy = false;
  /* Every capture asked whether it was seen on the stream (one probe
   * each): linear in the captures not yet released, under streams_lock
   * (docs/streams.md, "Costs"). None taken if one is busy: a failing call
   * changes nothing. */
  pp_mutex_lock(&pool->streams_lock);
  uint64_t visits = 0;
  for (pp_capture_t *c = pool->captures; c != NULL && !busy; c = c->next) {
    visits++;
    busy = c->users > 0 && capture_has_stream_locked(pool, c, stream);
  }
  for (pp_capture_t *c = pool->captures, *next; c != NULL && !busy; c = next) {
    next = c->next;
    visits++;
    if (!capture_has_stream_locked(pool, c, stream))
      continue;
    capture_unlink_locked(pool, c);
    c->next = list;
    list = c;
  }
  pp_lock_visit(&pool->streams_lock, visits);
  pp_mutex_unlock(&pool->streams_lock);
  if (busy)
    return pp_fail(PINPOOL_EBUSY,
                   "pinpool_stream_graphs_release: a capture on stream %#llx "
                   "is being recorded on by another thread (it has not "
                   "ended)",
                   (unsigned long long)stream);
  if (list == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_stream_graphs_release: no capture is known on "
                   "stream %#llx (no block was recorded on or freed from it "
                   "while it captured, or its captures were released)",
                   (unsigned long long)stream);
  release_captures(pool, list);
  return 0;
}

int pinpool_stream_capture(pinpool_t *pool, pinpool_stream_t stream,
                           int *capturing, uint64_t *capture_id) {
  if (pool == NULL || capturing == NULL || capture_id == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_stream_capture: NULL argument");
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED, "pinpool_stream_capture: a CUDA pool in "
                                    "a child of fork");
  if (!pool->has_events || pool->ev.capture == NULL)
    return pp_fail(PINPOOL_EBUSY,
                   "pinpool_stream_capture: the pool's event provider has no "
                   "graph capture (events=cuda has)");
  uint64_t id = 0;
  int r = pool->ev.capture(pool->ev.ctx, stream, &id);
  if (r < 0)
    return r;
  *capturing = r;
  *capture_id = r == 1 ? id : 0;
  return 0;
}

void pp_captures_fini(pinpool_t *pool) {
  /* Captures never released: their parked blocks go with the segments. */
  for (pp_capture_t *c = pool->captures, *next; c != NULL; c = next) {
    next = c->next;
    for (pp_plink_t *l = c->parked, *n2; l != NULL; l = n2) {
      n2 = l->next;
      if (atomic_fetch_sub_explicit(&l->p->holds, 1, memory_order_acq_rel) == 1)
        free(l->p);
      free(l);
    }
    capture_free(c);
  }
  pool->captures = NULL;
  free(pool->ctab);
  pool->ctab = NULL;
  pool->ctab_cap = pool->ncaptures = 0;
}
