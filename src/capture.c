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

/* A capture's link into the list of the captures seen on one of its
 * streams (pool->scix has the list's first): pinpool_stream_graphs_release
 * finds a stream's captures without a walk of every capture (issue 38,
 * the meter's findings, item 3). A stream is in a capture's streams once,
 * so the links of one list are in different captures. */
typedef struct pp_slink {
  struct pp_capture *c;
  pinpool_stream_t s;
  struct pp_slink *prev, *next;
} pp_slink_t;

struct pp_capture {
  uint64_t id;
  pinpool_stream_t *streams; /* the streams it was seen on */
  pp_slink_t *links;         /* links[i]: streams[i]'s */
  uint32_t nstreams, cap;    /* cap >= nstreams + users */
  /* streams' index (index.h): a stream's place in streams[] + 1. */
  pp_index_t sidx;
  uint32_t users;     /* record_stream calls tying a block now */
  bool tied;          /* a record_stream tied a block to it */
  pp_plink_t *parked; /* the blocks it holds */
  struct pp_capture *next, *prev;
};

/* ---- Captures (under streams_lock) --------------------------------------- */

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
  return (pp_capture_t *)(uintptr_t)pp_index_get(&pool->ctab, id);
#endif
}

/* Take link l out of its stream's list. */
static void slink_remove(pinpool_t *pool, pp_slink_t *l) {
  if (l->prev != NULL)
    l->prev->next = l->next;
  else if (l->next != NULL)
    pp_index_set(&pool->scix, l->s, (uintptr_t)l->next);
  else
    pp_index_del(&pool->scix, l->s);
  if (l->next != NULL)
    l->next->prev = l->prev;
}

/* Take c out of the list and the indexes: O(c's streams). */
static void capture_unlink_locked(pinpool_t *pool, pp_capture_t *c) {
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    pool->captures = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  c->next = c->prev = NULL;
  pp_index_del(&pool->ctab, c->id);
  for (uint32_t i = 0; i < c->nstreams; i++)
    slink_remove(pool, &c->links[i]);
  pp_lock_visit(&pool->streams_lock, c->nstreams);
  pool->ncaptures--;
}

static bool capture_has_stream_locked(pinpool_t *pool, pp_capture_t *c,
                                      pinpool_stream_t s) {
#ifdef PINPOOL_MUTANT_CAPTURE_WALK
  pp_lock_visit(&pool->streams_lock, c->nstreams);
  for (uint32_t i = 0; i < c->nstreams; i++)
    if (c->streams[i] == s)
      return true;
  return false;
#else
  (void)pool;
  return pp_index_get(&c->sidx, s) != 0;
#endif
}

/* Room for `more` streams in c (its list, links and index) and in the
 * pool's index of streams, beyond those that pinned record_stream calls
 * may add. Nothing visible changes if memory runs out. */
static bool capture_room_locked(pinpool_t *pool, pp_capture_t *c,
                                uint32_t more) {
  if (!pp_index_reserve(&c->sidx, (size_t)c->users + more) ||
      !pp_index_reserve(&pool->scix, pool->cpins + more))
    return false;
  if (c->cap >= c->nstreams + c->users + more)
    return true;
  uint32_t need = c->nstreams + c->users + more, cap = 4;
  while (cap < need)
    cap *= 2;
  pp_slink_t *nl = malloc(cap * sizeof *nl);
  pinpool_stream_t *v =
      nl == NULL ? NULL : realloc(c->streams, cap * sizeof *v);
  if (v == NULL) {
    free(nl);
    return false;
  }
  c->streams = v;
  /* The links move: their neighbours (other captures') and the lists'
   * firsts follow. O(c's streams), c's own size. */
  for (uint32_t i = 0; i < c->nstreams; i++) {
    pp_slink_t *l = &nl[i];
    *l = c->links[i];
    if (l->prev != NULL)
      l->prev->next = l;
    else
      pp_index_set(&pool->scix, l->s, (uintptr_t)l);
    if (l->next != NULL)
      l->next->prev = l;
  }
  pp_lock_visit(&pool->streams_lock, c->nstreams);
  free(c->links);
  c->links = nl;
  c->cap = cap;
  return true;
}

static void capture_add_stream_locked(pinpool_t *pool, pp_capture_t *c,
                                      pinpool_stream_t s) {
  if (capture_has_stream_locked(pool, c, s))
    return;
  pp_assert(c->nstreams < c->cap);
  uint32_t i = c->nstreams++;
  c->streams[i] = s;
  pp_index_put(&c->sidx, s, (uint64_t)i + 1);
  pp_slink_t *l = &c->links[i];
  pp_slink_t *first = (pp_slink_t *)(uintptr_t)pp_index_get(&pool->scix, s);
  *l = (pp_slink_t){c, s, NULL, first};
  if (first != NULL) {
    first->prev = l;
    pp_index_set(&pool->scix, s, (uintptr_t)l);
  } else {
    pp_index_put(&pool->scix, s, (uintptr_t)l);
  }
}

/* The capture `id`, entered if new; NULL when out of memory. */
static pp_capture_t *capture_get_locked(pinpool_t *pool, uint64_t id) {
  pp_capture_t *c = capture_find_locked(pool, id);
  if (c != NULL)
    return c;
  c = calloc(1, sizeof *c);
  if (c == NULL || !pp_index_reserve(&pool->ctab, 1)) {
    free(c);
    return NULL;
  }
  c->id = id;
  pp_index_init(&c->sidx, &pool->streams_lock);
  c->next = pool->captures;
  if (c->next != NULL)
    c->next->prev = c;
  pool->captures = c;
  pp_index_put(&pool->ctab, id, (uintptr_t)c);
  pool->ncaptures++;
  return c;
}

static void capture_free(pp_capture_t *c) {
  free(c->streams);
  free(c->links);
  pp_index_fini(&c->sidx);
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
  if (c != NULL) {
    c->users++;
    pool->cpins++;
  }
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
  pool->cpins--;
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
  /* The stream's captures, from its list (scix): O(the captures seen on
   * it and their streams), under streams_lock (docs/streams.md, "Costs").
   * None taken if one is busy: a failing call changes nothing. */
  pp_mutex_lock(&pool->streams_lock);
  uint64_t visits = 0;
#ifndef PINPOOL_MUTANT_GRAPHS_WALK
  pp_slink_t *first =
      (pp_slink_t *)(uintptr_t)pp_index_get(&pool->scix, stream);
  for (pp_slink_t *l = first; l != NULL && !busy; l = l->next) {
    visits++;
    busy = l->c->users > 0;
  }
  for (pp_slink_t *l = first; l != NULL && !busy;
       l = (pp_slink_t *)(uintptr_t)pp_index_get(&pool->scix, stream)) {
    pp_capture_t *c = l->c;
    capture_unlink_locked(pool, c); /* its link l goes: the next is first */
    c->next = list;
    list = c;
  }
#else
  /* Mutant (docs/verification.md): every capture asked, as before. */
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
#endif
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
  pp_index_fini(&pool->ctab);
  pp_index_fini(&pool->scix);
  pool->ncaptures = pool->cpins = 0;
}
