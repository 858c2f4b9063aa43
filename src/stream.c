/*
 * Stream-ordered frees (docs/streams.md).
 *
 * pinpool_record_stream attaches streams to an allocated block. When such a
 * block is freed it becomes PENDING: one event is recorded on each of its
 * streams and queued on that stream's queue. Each queue is polled in order
 * from its head, and only its head: events of one stream complete in order,
 * so a not-ready head means nothing behind it is ready either — but the
 * queues of other streams are still polled, so a slow stream never holds
 * back blocks used only by fast ones (PyTorch polls one global FIFO). When
 * the last event of a block completes, the block goes to its central bin.
 *
 * Queues exist only while they hold events: a stream's queue is made by the
 * first event queued on it, found through a hash table, and freed when its
 * last event is taken off. A poll walks the queues that hold events, never
 * every stream ever used (servers make a stream per request: a list of
 * every queue ever made cost 16x more per operation at 16,000 streams).
 *
 * Locks: the stripe locks (sset_locks) guard the per-block stream sets;
 * streams_lock guards the queues (the table, the active list, their items
 * and polling flags). None is held across a provider call (invariant 1): a
 * poller marks a queue's head as being polled, drops the lock, queries, and
 * retakes it; a queue being polled is never freed.
 *
 * Waiting (pinpool_synchronize): pending_live counts the blocks whose
 * events are not all resolved. It drops only after such a block has left
 * PENDING (cached, or, after an event error, kept PENDING for good): a
 * caller that sees 0 sees no block in transit. Each block is counted in
 * a cohort too (live_add): a synchronize cuts (live_cut: blocks freed from
 * then on enter a new cohort) and waits until its cohort and every older
 * one have no block left (live_retired), not for the blocks other threads
 * keep freeing (issue 37, the fifth review; rv3637f, D5); its passes do
 * not synchronize a queue whose head is of a newer cohort unless an older
 * item is behind it (squeue ninv). Each step O(1) under live_mu (a leaf).
 * A waiter whose remaining heads are polled by other threads sleeps on
 * sync_cv until a poller makes progress; it does not spin.
 *
 * Graph capture (docs/cuda.md, "Graph capture"): capture.c. A block used
 * on a capturing stream is tied to the capture or, freed, parked on it
 * instead of getting an event; settle (below) asks capture.c which, and a
 * release there settles a block whose last capture went (pp_stream_resume).
 */
#include "stream.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* All fields under pool->streams_lock (stream: immutable). */
typedef struct pp_squeue {
  pinpool_stream_t stream;
  pp_qitem_t *head, *tail;
  /* A thread is polling head, unlocked: 1 querying it, 2 synchronizing
   * it (waiting for it to complete). */
  unsigned char polling;
  /* The poller was inside a busy section (fork.c) when it set polling:
   * its own busy section after the query is nested and never waits at the
   * fork gate, so a full poll inside a busy section may wait for it. */
  unsigned char poller_busy;
  /* Full polls waiting for this queue's poller (process): the queue is
   * not dropped while one waits, even empty; the last one drops it. */
  unsigned wanted;
  /* The query in flight's number (qtab->qseq), and the number of the last
   * query that found the head not done (0: none since the head moved). A
   * full poll begun before such a query need not poll the head again
   * (process). */
  uint64_t qnum, not_done;
  /* Its items queued behind one of a newer cohort (pp_qitem_t.inv): while
   * none is, the head's cohort is the queue's oldest (stream.c,
   * "Waiting"). */
  uint32_t ninv;
  struct pp_squeue *hnext;       /* hash chain */
  struct pp_squeue *prev, *next; /* the active list (queues with items) */
} pp_squeue_t;

/* The stream -> queue table (pool->qtab), under streams_lock. */
typedef struct pp_qtab {
  pp_squeue_t **b; /* buckets; a power of two */
  size_t nb, n;
  /* The miss's round-robin cursor (pp_process_miss): the next queue of the
   * active list a miss polls; NULL: the list's head. Never a freed queue
   * (queue_drop_locked moves it on). */
  pp_squeue_t *cursor;
  uint64_t qseq; /* queries begun (pp_squeue_t.qnum) */
} pp_qtab_t;

/* A cohort: the blocks that entered pending_live between two cuts (a
 * synchronize's, live_cut), under pool->live_mu. */
typedef struct pp_cohort {
  uint64_t id;            /* 1, 2, ...: the order of the cuts */
  uint64_t n;             /* its blocks still in pending_live */
  struct pp_cohort *next; /* the newer one; NULL: the current cohort */
} pp_cohort_t;

/* Queue heads this thread examined, in any poll (a test hook: a miss looks
 * at a bounded number of queues, however many hold events). */
_Thread_local uint64_t pp_queue_polls PP_TLS_MODEL;

/* The provider's calls, each a callout (base.h, pp_callout): whatever
 * the provider calls from there never waits for another thread. */
static int ev_record(pinpool_t *pool, pinpool_stream_t s, void **ev) {
  unsigned co = pp_callout_enter(PP_CO_EV_RECORD);
  int rc = pool->ev.record(pool->ev.ctx, s, ev);
  pp_callout_leave(co);
  return rc;
}
static int ev_query(pinpool_t *pool, void *ev) {
  unsigned co = pp_callout_enter(PP_CO_EV_QUERY);
  int rc = pool->ev.query(pool->ev.ctx, ev);
  pp_callout_leave(co);
  return rc;
}
static int ev_sync(pinpool_t *pool, void *ev) {
  unsigned co = pp_callout_enter(PP_CO_EV_SYNC);
  int rc = pool->ev.synchronize(pool->ev.ctx, ev);
  pp_callout_leave(co);
  return rc;
}
static void ev_release(pinpool_t *pool, void *ev) {
  unsigned co = pp_callout_enter(PP_CO_EV_RELEASE);
  pool->ev.release(pool->ev.ctx, ev);
  pp_callout_leave(co);
}

static size_t qhash(pinpool_stream_t s, size_t nb) {
  uint64_t x = (uint64_t)s * 0x9e3779b97f4a7c15u;
  return (size_t)(x >> 32) & (nb - 1);
}

static pp_mutex_t *stripe(pinpool_t *pool, pp_segment_t *seg, uint32_t idx) {
  uintptr_t h = ((uintptr_t)seg >> 6) * 31u + idx;
  return &pool->sset_locks[h % 64];
}

/* ---- record_stream ------------------------------------------------------- */

static int lookup(pinpool_t *pool, void *ptr, pp_segment_t **seg_out,
                  uint32_t *idx_out) {
  uintptr_t a = (uintptr_t)ptr;
  pp_segment_t *seg = pp_segmap_find(pool->map, a);
  if (seg == NULL)
    return pp_fail(PINPOOL_ENOTOWNED,
                   "pinpool_record_stream: %p was not allocated by this pool",
                   ptr);
  uintptr_t off = a - pp_load_relaxed(&seg->base);
  size_t bs = pp_load_relaxed(&seg->block_size);
  /* Same order and codes as pinpool_free: the tail first, then interior. */
  if (off / bs >= pp_load_relaxed(&seg->nblocks))
    return pp_fail(PINPOOL_ENOTOWNED,
                   "pinpool_record_stream: %p was never handed out", ptr);
  if (off % bs != 0)
    return pp_fail(PINPOOL_EINTERIOR,
                   "pinpool_record_stream: %p is inside a block", ptr);
  *seg_out = seg;
  *idx_out = (uint32_t)(off / bs);
  return 0;
}

void pp_sset_free(pp_sset_t *set) {
  if (set != NULL && set->more != NULL) {
    for (uint32_t k = 0; k < set->more->nchunks; k++) {
      free(set->more->chunk[k]);
      free(set->more->index[k]);
    }
    free(set->more);
  }
  free(set);
}

/* The index slot of a use: Fibonacci hashing of the stream, or of the
 * capture's id (a tie to a capture is a use of its own). */
static uint32_t suse_hash(pinpool_stream_t s, uint64_t capture, bool captured,
                          unsigned bits) {
  uint64_t key = captured ? ~capture : (uint64_t)s;
  return (uint32_t)((key * 0x9e3779b97f4a7c15u) >> (64 - bits));
}

static bool suse_is(const pp_suse_t *u, pinpool_stream_t s, uint64_t capture,
                    bool captured) {
  return u->captured == captured &&
         (captured ? u->capture == capture : u->s == s);
}

/* Whether set has the use (stripe lock lk held). The first PP_SSET_CAP0
 * are compared; each chunk's index is probed. The visits count on lk's
 * meter. */
static bool sset_has(pp_mutex_t *lk, const pp_sset_t *set, pinpool_stream_t s,
                     uint64_t capture, bool captured) {
  if (set == NULL)
    return false;
  uint64_t visits = 0;
  bool found = false;
#ifdef PINPOOL_MUTANT_SSET_SCAN
  /* Mutant (docs/verification.md): every use compared, as before. */
  for (uint32_t i = 0; i < set->n && !found; i++, visits++)
    found = suse_is(pp_sset_at(set, i), s, capture, captured);
#else
  for (uint32_t i = 0; i < set->n && i < PP_SSET_CAP0 && !found; i++, visits++)
    found = suse_is(&set->s[i], s, capture, captured);
  for (uint32_t k = 0; !found && set->more != NULL && k < set->more->nchunks;
       k++) {
    unsigned bits = (unsigned)__builtin_ctz(PP_SSET_CAP0) + k + 1;
    uint32_t mask = (1u << bits) - 1;
    const uint32_t *ix = set->more->index[k];
    for (uint32_t j = suse_hash(s, capture, captured, bits); ix[j] != 0;
         j = (j + 1) & mask) {
      visits++;
      if (suse_is(&set->more->chunk[k][ix[j] - 1], s, capture, captured)) {
        found = true;
        break;
      }
    }
  }
#endif
  pp_lock_visit(lk, visits);
  return found;
}

/* Append a use to set, which has room (set->n < set->cap). */
static void sset_add(pp_sset_t *set, pp_suse_t u) {
  uint32_t i = set->n++;
  set->ncaps += u.captured;
  if (i < PP_SSET_CAP0) {
    set->s[i] = u;
    return;
  }
  uint32_t r = i - PP_SSET_CAP0;
  unsigned k = 31u - (unsigned)__builtin_clz(r / PP_SSET_CAP0 + 1);
  uint32_t j = r - PP_SSET_CAP0 * ((1u << k) - 1);
  set->more->chunk[k][j] = u;
  unsigned bits = (unsigned)__builtin_ctz(PP_SSET_CAP0) + k + 1;
  uint32_t mask = (1u << bits) - 1, *ix = set->more->index[k];
  uint32_t h = suse_hash(u.s, u.capture, u.captured, bits);
  while (ix[h] != 0)
    h = (h + 1) & mask;
  ix[h] = j + 1;
}

static _Atomic(pp_sset_t *) *sset_slot(pp_segment_t *seg, uint32_t idx) {
  _Atomic(pp_sset_t *) *arr = pp_load_acquire(&seg->ssets);
  if (arr == NULL) {
    _Atomic(pp_sset_t *) *fresh = calloc(seg->capacity, sizeof *fresh);
    if (fresh == NULL)
      return NULL;
    _Atomic(pp_sset_t *) *expected = NULL;
    if (pp_cas_acq_rel(&seg->ssets, &expected, fresh)) {
      arr = fresh;
    } else {
      free(fresh); /* another thread installed one first */
      arr = expected;
    }
  }
  return &arr[idx];
}

int pinpool_record_stream(pinpool_t *pool, void *ptr, pinpool_stream_t stream) {
  if (pool == NULL || ptr == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_record_stream: NULL argument");
  int dying = pp_pool_dying(pool, "pinpool_record_stream");
  if (pp_unlikely(dying != 0))
    return dying;
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED, "pinpool_record_stream: a CUDA pool in "
                                    "a child of fork");
  if (!pool->has_events)
    return pp_fail(PINPOOL_EBUSY,
                   "pinpool_record_stream: the pool has no event provider "
                   "(configure events=simulated|cuda or give callbacks)");
  pp_segment_t *seg = NULL;
  uint32_t idx = 0;
  int rc = lookup(pool, ptr, &seg, &idx);
  if (rc != 0 || seg == NULL)
    return rc;
  _Atomic(pp_sset_t *) *slot = sset_slot(seg, idx);
  if (slot == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_record_stream: out of memory");
  /* A capturing stream: tie the block to the capture, never record on the
   * stream (an event there would be a node of the graph). The capture is
   * entered in the list first (pinned, so that a failure below can take it
   * out again): a free that sees the tie finds the capture. */
  uint64_t cap_id = 0;
  pp_capture_t *pin = NULL;
  rc = pp_capture_check(pool, stream, &cap_id, &pin);
  if (rc < 0)
    return rc;
  bool captured = pin != NULL;
  pp_mutex_t *lk = stripe(pool, seg, idx);
  pp_mutex_lock(lk);
  /* Set the streams bit while the block is ALLOCATED, under the stripe
   * lock: a concurrent free either sees the bit (and then takes the set
   * under this lock, after we added the stream) or has already changed the
   * state, and we refuse. The set's memory is obtained first: a call that
   * fails for want of it leaves the bit as it was (a set bit without a set
   * made the free wait for nothing and report the block as stream-used). */
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  pp_sset_t *set = pp_load_relaxed(slot);
  bool found = sset_has(lk, set, stream, cap_id, captured);
  /* Room for one use more: the set itself (the first use), or the next
   * chunk and its index (and the chunks' table, the first time); nothing
   * already there is copied. */
  pp_sset_t *fresh = NULL;
  pp_sset_more_t *more = NULL;
  pp_suse_t *chunk = NULL;
  uint32_t *index = NULL;
  uint32_t k = 0;
  if (!found && (set == NULL || set->n == set->cap)) {
    bool ok = !pp_fault_hit(&pool->cfg, PP_FAULT_SSET);
    if (ok && set == NULL) {
      ok = (fresh = malloc(sizeof *fresh)) != NULL;
    } else if (ok) {
      k = set->more == NULL ? 0 : set->more->nchunks;
      ok = k < PP_SSET_CHUNKS &&
           (set->more != NULL || (more = calloc(1, sizeof *more)) != NULL) &&
           (chunk = malloc(((size_t)PP_SSET_CAP0 << k) * sizeof *chunk)) !=
               NULL &&
           (index = calloc((size_t)2 * PP_SSET_CAP0 << k, sizeof *index)) !=
               NULL;
    }
    if (!ok) {
      pp_mutex_unlock(lk);
      free(more);
      free(chunk);
      free(index);
      pp_capture_unpin(pool, pin, stream, false);
      return pp_fail(PINPOOL_ENOMEM, "pinpool_record_stream: out of memory");
    }
  }
  do {
    if (PP_WORD_STATE(w) != PP_ALLOCATED) {
      pp_mutex_unlock(lk);
      free(fresh);
      free(more);
      free(chunk);
      free(index);
      pp_capture_unpin(pool, pin, stream, false);
      if (PP_WORD_STATE(w) == PP_NEVER)
        return pp_fail(PINPOOL_ENOTOWNED,
                       "pinpool_record_stream: %p was never handed out", ptr);
      return pp_fail(PINPOOL_EDOUBLEFREE,
                     "pinpool_record_stream: %p is not allocated", ptr);
    }
  } while (!(w & PP_WORD_STREAMS) &&
           !pp_cas_acq_rel(&seg->word[idx], &w, w | PP_WORD_STREAMS));
  if (fresh != NULL) {
    *fresh = (pp_sset_t){.n = 0, .cap = PP_SSET_CAP0, .ncaps = 0, .more = NULL};
    set = fresh;
    pp_store_relaxed(slot, set);
  }
  if (chunk != NULL) {
    if (more != NULL)
      set->more = more;
    set->more->chunk[k] = chunk;
    set->more->index[k] = index;
    set->more->nchunks = k + 1;
    set->cap += PP_SSET_CAP0 << k;
  }
  if (!found)
    sset_add(set, (pp_suse_t){stream, cap_id, captured});
  pp_mutex_unlock(lk);
  pp_capture_unpin(pool, pin, stream, true);
  return 0;
}

/* ---- Queues ----------------------------------------------------------------
 */

static pp_squeue_t **qfind(pp_qtab_t *t, pinpool_stream_t stream) {
  pp_squeue_t **pq = &t->b[qhash(stream, t->nb)];
  while (*pq != NULL && (*pq)->stream != stream)
    pq = &(*pq)->hnext;
  return pq;
}

/* Grow the table when it holds twice as many queues as buckets. Failure
 * is harmless: chains get longer. */
static void qtab_grow(pp_qtab_t *t) {
  size_t nb = t->nb * 2;
  pp_squeue_t **b = calloc(nb, sizeof(pp_squeue_t *));
  if (b == NULL)
    return;
  for (size_t i = 0; i < t->nb; i++)
    for (pp_squeue_t *q = t->b[i], *next; q != NULL; q = next) {
      next = q->hnext;
      size_t h = qhash(q->stream, nb);
      q->hnext = b[h];
      b[h] = q;
    }
  free(t->b);
  t->b = b;
  t->nb = nb;
}

/* Wake pinpool_synchronize callers waiting for progress. The check of
 * sync_waiters and the waiter's check of pending_live are both seq_cst
 * (a store-load pair each side): either the waiter sees our progress
 * before it sleeps, or we see it waiting and wake it under sync_mu. */
static void progress(pinpool_t *pool) {
  if (atomic_load(&pool->sync_waiters) == 0)
    return;
  pthread_mutex_lock(&pool->sync_mu);
  pool->sync_gen++;
  pthread_cond_broadcast(&pool->sync_cv);
  pthread_mutex_unlock(&pool->sync_mu);
}

/* Append `it` to the queue of `stream`, made if the stream has none.
 * Returns false (nothing queued) when there is no memory for a queue. */
static bool enqueue(pinpool_t *pool, pinpool_stream_t stream, pp_qitem_t *it) {
  pp_qtab_t *t = pool->qtab;
  pp_mutex_lock(&pool->streams_lock);
  pp_squeue_t **pq = qfind(t, stream);
  pp_squeue_t *q = *pq;
  if (q == NULL) {
    q = pp_fault_hit(&pool->cfg, PP_FAULT_QUEUE) ? NULL : calloc(1, sizeof *q);
    if (q == NULL) {
      pp_mutex_unlock(&pool->streams_lock);
      return false;
    }
    q->stream = stream;
    *pq = q;
    q->next = pool->squeues;
    if (q->next != NULL)
      q->next->prev = q;
    pool->squeues = q;
    if (++t->n > 2 * t->nb)
      qtab_grow(t);
  }
#ifdef PINPOOL_MUTANT_QUEUE_NO_LOCK
  /* Race mutant (docs/verification.md): the append outside the lock. */
  pp_mutex_unlock(&pool->streams_lock);
#endif
  if (q->tail != NULL) {
    /* Two frees on one stream, each counted before the other queued:
     * a cut between them leaves the older behind the newer. */
    it->inv = it->p->coh->id < q->tail->p->coh->id;
    q->ninv += it->inv;
    q->tail->next = it;
  } else {
    q->head = it;
  }
  q->tail = it;
#ifndef PINPOOL_MUTANT_QUEUE_NO_LOCK
  pp_mutex_unlock(&pool->streams_lock);
#endif
  /* A synchronize may have counted this block in pending_live and walked
   * the queues before the item was there: it must look again, or it
   * sleeps with nothing left to wake it (the API fuzzer hung so, 1 run in
   * 10 of one input). */
  progress(pool);
  return true;
}

/* Take an empty queue that nobody polls out of the table and the active
 * list, and free it. */
static void queue_drop_locked(pinpool_t *pool, pp_squeue_t *q) {
  pp_assert_held(&pool->streams_lock);
  pp_assert(q->head == NULL && !q->polling);
  pp_qtab_t *t = pool->qtab;
  pp_squeue_t **pq = qfind(t, q->stream);
  pp_assert(*pq == q);
  *pq = q->hnext;
  t->n--;
  if (t->cursor == q)
    t->cursor = q->next;
  if (q->prev != NULL)
    q->prev->next = q->next;
  else
    pool->squeues = q->next;
  if (q->next != NULL)
    q->next->prev = q->prev;
  free(q);
}

/* A block enters pending_live; returns its cohort (live_done's). */
static pp_cohort_t *live_add(pinpool_t *pool) {
  pp_mutex_lock(&pool->live_mu);
  pp_cohort_t *c = pool->live_cur;
  c->n++;
  pp_mutex_unlock(&pool->live_mu);
  atomic_fetch_add(&pool->pending_live, 1); /* seq_cst: see progress() */
  return c;
}

/* Retire the oldest cohorts while they are empty and not current: each
 * step O(1), each cohort retired once. live_mu held. */
static void live_retire_locked(pinpool_t *pool) {
  pp_assert_held(&pool->live_mu);
  pp_cohort_t *h = pool->live_head;
  while (h != pool->live_cur && h->n == 0) {
    pp_cohort_t *next = h->next;
    atomic_store(&pool->live_retired, h->id); /* seq_cst: see progress() */
    h->next = pool->live_spare;
    pool->live_spare = h;
    h = next;
  }
  pool->live_head = h;
}

/* A block's events are all resolved and it has left transit (cached, or
 * kept PENDING for good after an error): the last step, so that a caller
 * that sees pending_live at 0 (or its cohort retired) sees no block still
 * moving. */
static void live_done(pinpool_t *pool, pp_cohort_t *c) {
  atomic_fetch_sub(&pool->pending_live, 1); /* seq_cst: see progress() */
  pp_mutex_lock(&pool->live_mu);
  c->n--;
  if (c == pool->live_head)
    live_retire_locked(pool);
  pp_mutex_unlock(&pool->live_mu);
  progress(pool);
}

/* A synchronize's cut: the blocks in pending_live now are those of the
 * cohorts up to the current one, which becomes old: blocks freed from now
 * on enter a new one. *target: the newest cohort the caller waits for
 * (every block freed before the call is in it or an older one); no cut
 * when the current cohort is empty (the one before it is the target).
 * PINPOOL_ENOMEM (nothing changed) without memory for a cohort. O(1).
 *
 * Two buckets by generation (5721a9c) could not do this: the generation
 * moved on only while the other bucket was empty, so a block freed under
 * the previous generation and still pending kept it, and blocks freed
 * after the call joined the bucket the call waited for (issue 37,
 * rv3637f, D5: 3.05 s for a block freed after the call, 0.30 s without
 * the older block). */
static int live_cut(pinpool_t *pool, uint64_t *target) {
  pp_cohort_t *fresh = NULL;
  bool tried = false;
  pp_mutex_lock(&pool->live_mu);
  for (;;) {
    pp_cohort_t *cur = pool->live_cur;
    if (cur->n == 0) {
      *target = cur->id - 1;
      break;
    }
    pp_cohort_t *c = pool->live_spare;
    if (c != NULL) {
      pool->live_spare = c->next;
    } else if (fresh != NULL) {
      c = fresh;
      fresh = NULL;
    } else if (!tried) { /* malloc outside the lock; then look again */
      pp_mutex_unlock(&pool->live_mu);
      fresh = malloc(sizeof *fresh);
      tried = true;
      pp_mutex_lock(&pool->live_mu);
      continue;
    } else {
      pp_mutex_unlock(&pool->live_mu);
      return PINPOOL_ENOMEM;
    }
    *c = (pp_cohort_t){cur->id + 1, 0, NULL};
    cur->next = c;
    pool->live_cur = c;
    *target = cur->id;
    break;
  }
  if (fresh != NULL) { /* not needed after all: kept for the next cut */
    fresh->next = pool->live_spare;
    pool->live_spare = fresh;
  }
  pp_mutex_unlock(&pool->live_mu);
  return 0;
}

/* Every block of the cohorts up to target has left pending_live. */
static bool live_reached(pinpool_t *pool, uint64_t target) {
  return atomic_load(&pool->live_retired) >= target;
}

/* Count an error of `block`'s events and tell the error callback. */
static void report_error_at(pinpool_t *pool, int err, void *block) {
  pp_fetch_add_relaxed(&pool->ev_errors, 1);
  if (pool->on_error != NULL) {
    unsigned co = pp_callout_enter(PP_CO_ON_ERROR);
    pool->on_error(pool->error_arg, err, pinpool_last_error(), block);
    pp_callout_leave(co);
  }
}

static void *pending_block(const pp_pending_t *p) {
  size_t bs = pp_load_relaxed(&p->seg->block_size);
  return (void *)(pp_load_relaxed(&p->seg->base) + p->idx * bs);
}

static void report_error(pinpool_t *pool, int err, pp_pending_t *p) {
  /* The block stays in pending_live until its other events are resolved
   * too: synchronize, and so destroy, wait for every stream that may
   * still use it (an error on one stream says nothing about the others). */
  atomic_store_explicit(&p->failed, true, memory_order_release);
  report_error_at(pool, err, pending_block(p));
}

/* A pending block's events are all done: empty its stream set (kept for
 * snapshots while it was pending), forget its allocation info, record the
 * free as completed. The caller then caches it. A set of the first size
 * stays in its slot, empty, for the block's next use: the
 * record_stream / free / reuse cycle then allocates nothing for it (one
 * malloc and one free fewer an operation; the descriptor's end frees it,
 * pool.c). A grown one goes, so a block once used on many streams does not
 * keep their room. */
static void block_done(pinpool_t *pool, pp_segment_t *seg, uint32_t idx,
                       size_t bs, size_t req) {
  pp_mutex_t *lk = stripe(pool, seg, idx);
  _Atomic(pp_sset_t *) *slot = sset_slot(seg, idx); /* exists: bit was set */
  pp_mutex_lock(lk);
  pp_sset_t *set = slot != NULL ? pp_load_relaxed(slot) : NULL;
  if (set != NULL && set->cap <= PP_SSET_CAP0) {
    set->n = set->ncaps = 0;
    set = NULL;
  } else if (slot != NULL) {
    pp_store_relaxed(slot, NULL);
  }
  pp_mutex_unlock(lk);
  pp_sset_free(set);
  pp_hist_forget(seg, idx);
  if (pp_unlikely(pp_hist_level(pool) >= PINPOOL_HISTORY_ALLOC))
    pp_hist_event(pool, PP_H_FREE_COMPLETED,
                  pp_load_relaxed(&seg->base) + (uintptr_t)idx * bs, bs, req, 0,
                  NULL);
}

size_t pp_stream_list(pinpool_t *pool, pp_segment_t *seg, uint32_t idx,
                      uint64_t *out, size_t max, uint64_t *caps, size_t maxcaps,
                      size_t *ncaps) {
  size_t n = 0, nc = 0; /* a capture tie is not a stream */
  _Atomic(pp_sset_t *) *arr = pp_load_acquire(&seg->ssets);
  if (arr != NULL) {
    pp_mutex_t *lk = stripe(pool, seg, idx);
    pp_mutex_lock(lk);
    pp_sset_t *set = pp_load_relaxed(&arr[idx]);
    /* The first max streams and maxcaps captures, and the counts from the
     * set's: the walk stops once both lists are full or hold all there is
     * (issue 38: a snapshot visited every use of a block in one hold). */
    uint32_t total = set != NULL ? set->n : 0;
    uint32_t tcaps = set != NULL ? set->ncaps : 0;
    size_t ls = 0, lc = 0;
    uint32_t i = 0;
    for (; i < total &&
           ((ls < max && ls < total - tcaps) || (lc < maxcaps && lc < tcaps));
         i++) {
      const pp_suse_t *u = pp_sset_at(set, i);
      if (!u->captured && ls < max)
        out[ls++] = (uint64_t)u->s;
      else if (u->captured && lc < maxcaps)
        caps[lc++] = u->capture;
    }
    pp_lock_visit(lk, i);
    n = total - tcaps;
    nc = tcaps;
    pp_mutex_unlock(lk);
  }
  *ncaps = nc;
  return n;
}

/* A completed block goes where a plain free of it goes: a large one (a
 * segment of its own) into its bin's hot slot, where the next allocation
 * of its size takes it whole with one exchange; anything else, or a block
 * the slots refuse (a pool with a cap), to the central bins. W4's 1 MiB
 * blocks, all freed on streams, went back to the arena here and were
 * carved again under seg_lock on every allocation (1.9-2.9x slower than
 * before the arenas; docs/benchmarks.md). Not paired with a peak sample
 * (epoch UINT64_MAX never matches): the taker counts the bytes as taken. */
static void give_completed(pinpool_t *pool, pp_tentry_t *e, size_t req) {
  if (e->bs > PP_SLAB_MAX_BLOCK) {
    /* PENDING -> CACHED before the slot publishes it (release: the taker's
     * acquire sees the word with the block). */
    pp_store_release(&e->seg->word[e->idx], PP_WORD(0, PP_CACHED));
    if (pp_hot_put(pool, pp_load_relaxed(&e->seg->cls_index), e, req,
                   UINT64_MAX, NULL))
      return;
  }
  pp_central_give(pool, pp_class_index(e->bs), e, 1);
}

/* This thread's counters for `pool` (pp_tcounters_t: pending and reclaim
 * counts), NULL for a thread without a cache of it (the background
 * thread, a thread that only synchronizes): the pool's own then. */
static pp_tcounters_t *own_counters(pinpool_t *pool) {
  pp_tls_way_t *w = pp_tls_way(pool->id);
  return w->pool_id == pool->id ? &w->tc->c : NULL;
}

/* Add v to a count: to this thread's part (own, from own_counters) or,
 * without one, to the pool's (shared). */
static void count_add(pp_counter_t *own, pp_counter_t *shared, uint64_t v) {
  if (own != NULL)
    pp_owner_add(own, v);
  else
    pp_fetch_add_relaxed(shared, v);
}

/* A freed block enters (+1) or leaves (-1) the pending counts. */
static void pend_count(pinpool_t *pool, pp_tcounters_t *c, int dir, size_t bs) {
  uint64_t n = dir > 0 ? 1 : (uint64_t)-1, b = dir > 0 ? bs : 0 - (uint64_t)bs;
  count_add(c != NULL ? &c->pend_blocks : NULL, &pool->pending_blocks, n);
  count_add(c != NULL ? &c->pend_bytes : NULL, &pool->pending_bytes, b);
}

/* One event of p is done (or failed). The last one decides. */
static void event_done(pinpool_t *pool, pp_pending_t *p) {
  if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) != 1)
    return;
  if (pp_load_acquire(&p->failed)) {
    /* The device may have faulted while using the block: keep it PENDING
     * forever rather than hand out memory in an unknown state. Its other
     * streams are done with it (this is their last event): destroy may
     * give its segment back. */
    pp_cohort_t *b = p->coh;
    free(p);
    live_done(pool, b);
    return;
  }
  size_t bs = p->bs, req = p->req;
  pp_tentry_t e = {
      (void *)(pp_load_relaxed(&p->seg->base) + (uintptr_t)p->idx * bs), p->seg,
      bs, p->idx};
  pp_tcounters_t *c = own_counters(pool);
  uint64_t dt = pp_now_ns() - p->freed_ns;
  count_add(c != NULL ? &c->rc_count : NULL, &pool->rc_count, 1);
  count_add(c != NULL ? &c->rc_total : NULL, &pool->rc_total, dt);
  pp_atomic_max_relaxed(&pool->rc_max, dt); /* a load, mostly */
  block_done(pool, p->seg, p->idx, bs, req);
  pp_cohort_t *coh = p->coh;
  free(p);
  pp_hook(PP_HOOK_EVENT_DONE);
  /* PENDING -> CACHED happens inside the bin push (one store, under the
   * bin lock) or just before the hot slot takes the block, so no reader
   * ever sees the block in two states. The pending
   * counters drop after it: a synchronize that returns, and a validate
   * after it, find the block cached (they dropped before, and validate
   * failed; docs/verification.md, "Review defects", 3). */
  give_completed(pool, &e, req);
  pend_count(pool, c, -1, bs);
  live_done(pool, coh);
}

/* ---- Free ---------------------------------------------------------------- */

static void bg_restart(pinpool_t *pool);
static void settle(pinpool_t *pool, pp_pending_t *p, const pp_sset_t *set);

/* No memory to track the events: wait for the streams here instead.
 * Correct, only slower. A block tied to a capture, or with a stream that
 * is capturing (or whose status is unknown), cannot be waited for: it is
 * kept PENDING for good, as after a failed record. */
static void wait_here(pinpool_t *pool, pp_segment_t *seg, uint32_t idx,
                      size_t bs, size_t req, const pp_sset_t *set,
                      pp_cohort_t *coh) {
  uint32_t n = set == NULL ? 0 : set->n;
  void *block = (void *)(pp_load_relaxed(&seg->base) + idx * bs);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t id = 0;
    if (pp_sset_at(set, i)->captured ||
        (pool->ev.capture != NULL &&
         pool->ev.capture(pool->ev.ctx, pp_sset_at(set, i)->s, &id) != 0)) {
      (void)pp_fail(PINPOOL_ENOMEM, "pinpool_free: out of memory to wait "
                                    "for a block used in a graph capture");
      report_error_at(pool, PINPOOL_ENOMEM, block);
      live_done(pool, coh);
      return;
    }
  }
  for (uint32_t i = 0; i < n; i++) {
    void *ev = NULL;
    if (ev_record(pool, pp_sset_at(set, i)->s, &ev) == 0) {
      (void)ev_sync(pool, ev);
      ev_release(pool, ev);
    }
  }
  pp_tentry_t e = {block, seg, bs, idx};
  block_done(pool, seg, idx, bs, req);
  give_completed(pool, &e, req);
  pend_count(pool, own_counters(pool), -1, bs);
  live_done(pool, coh);
}

int pp_stream_free(pinpool_t *pool, pp_tcache_t *tc, pp_segment_t *seg,
                   uint32_t idx, uint64_t w, const void *ra) {
  if (pp_unlikely(pp_load_relaxed(&pool->bg_restart)))
    bg_restart(pool); /* a child of fork: the first pending block */
  /* ALLOCATED(+streams) -> PENDING, keeping the requested size: the one
   * CAS that decides between this free and a concurrent double free. */
  do {
    if (PP_WORD_STATE(w) != PP_ALLOCATED)
      return pp_fail(PINPOOL_EDOUBLEFREE, "pinpool_free: block not allocated");
  } while (!pp_cas_acq_rel(&seg->word[idx], &w,
                           PP_WORD(PP_WORD_PAYLOAD(w), PP_PENDING)));
  size_t req = (size_t)PP_WORD_PAYLOAD(w);
  size_t bs = pp_load_relaxed(&seg->block_size);
  if (tc != NULL) {
    pp_owner_add(&tc->c.n_free, 1);
    pp_owner_add(&tc->c.req_free, req);
    pp_owner_add(&tc->c.blk_free, bs);
  } else { /* a nested call (alloc.c, "Nested calls"): shared counts */
    pp_fetch_add_relaxed(&pool->gs.nested.n_free, 1);
    pp_fetch_add_relaxed(&pool->gs.nested.req_free, req);
    pp_fetch_add_relaxed(&pool->gs.nested.blk_free, bs);
  }
  pend_count(pool, tc != NULL ? &tc->c : NULL, +1, bs);
  if (pool->cfg.tcache_bytes == 0 && tc != NULL)
    pp_stats_publish(pool, tc); /* the totals (stats.c) */
  pp_cohort_t *coh = live_add(pool);
  pp_hook(PP_HOOK_FREE_COUNTED);

  /* The set stays in its slot while the block is PENDING, so a snapshot
   * can list the streams awaited; nobody changes it meanwhile (record_stream
   * refuses a block that is not ALLOCATED), and event_done removes it. */
  pp_mutex_t *lk = stripe(pool, seg, idx);
  _Atomic(pp_sset_t *) *slot = sset_slot(seg, idx); /* exists: bit set */
  pp_mutex_lock(lk);
  pp_sset_t *set = pp_load_relaxed(slot);
  pp_mutex_unlock(lk);
  if (pp_unlikely(pp_hist_level(pool) >= PINPOOL_HISTORY_ALLOC))
    pp_hist_event(pool, PP_H_FREE_REQUESTED,
                  pp_load_relaxed(&seg->base) + (uintptr_t)idx * bs, bs, req,
                  set != NULL && set->n > 0 ? (uint64_t)set->s[0].s : 0, ra);

  pp_pending_t *p =
      malloc(sizeof *p + (set == NULL ? 0 : set->n) * sizeof p->items[0]);
  if (p == NULL) {
    wait_here(pool, seg, idx, bs, req, set, coh);
    return 0;
  }
  *p = (pp_pending_t){.seg = seg,
                      .idx = idx,
                      .req = req,
                      .bs = bs,
                      .freed_ns = pp_now_ns(),
                      .coh = coh};
  atomic_init(&p->remaining, 0);
  atomic_init(&p->failed, false);
  atomic_init(&p->holds, 0);
  settle(pool, p, set);
  return 0;
}

/* ---- Settling a freed block ------------------------------------------------
 * What a free (or the release of a block's last capture) does with each
 * use of the block (PP_USE_*, stream.h). */

/* Record one event on each stream of `set` and queue it; streams marked
 * PP_USE_FAILED count as events that could not be recorded. None of them is
 * capturing: settle parks such a block instead. */
static void start_events(pinpool_t *pool, pp_pending_t *p, const pp_sset_t *set,
                         const uint8_t *use) {
  uint32_t n = set == NULL ? 0 : set->n, nstreams = 0;
  for (uint32_t i = 0; i < n; i++)
    nstreams += !pp_sset_at(set, i)->captured;
  /* +1 for this function: the block cannot complete before every event
   * is queued, however fast the streams are. p is this thread's alone
   * here (a parked block is off every capture's list). */
  atomic_store_explicit(&p->remaining, nstreams + 1, memory_order_relaxed);
  uint32_t dropped = 0; /* events that could not be recorded */
  for (uint32_t i = 0; i < n; i++) {
    if (pp_sset_at(set, i)->captured)
      continue; /* a capture already released: its graph is gone */
    if (use[i] != PP_USE_RECORD) {
      report_error(pool, PINPOOL_EDEVICE, p);
      dropped++;
      continue;
    }
    pinpool_stream_t stream = pp_sset_at(set, i)->s;
    void *ev = NULL;
    int rc = pp_fault_hit(&pool->cfg, PP_FAULT_RECORD)
                 ? pp_fail(PINPOOL_EDEVICE, "injected failure of an event "
                                            "record")
                 : ev_record(pool, stream, &ev);
    pp_qitem_t *it = rc == 0 ? &p->items[i] : NULL;
    if (it != NULL) {
      *it = (pp_qitem_t){ev, p, NULL, 0, false};
      /* Counted before a poller can complete it (completed <= recorded). */
      pp_fetch_add_relaxed(&pool->ev_recorded, 1);
      if (!enqueue(pool, stream, it)) {
        pp_fetch_sub_relaxed(&pool->ev_recorded, 1);
        it = NULL;
      }
    }
    if (it == NULL) {
      if (rc == 0)
        ev_release(pool, ev);
      if (rc == 0)
        rc = pp_fail(PINPOOL_ENOMEM, "pinpool_free: out of memory for an "
                                     "event");
      /* An event we could not record: we cannot know when the stream is
       * done with the block, so it is never reused. */
      report_error(pool, rc, p);
      dropped++;
      continue;
    }
  }
  /* Our +1 is still held, so this cannot reach zero. */
  atomic_fetch_sub_explicit(&p->remaining, dropped, memory_order_acq_rel);
  event_done(pool, p); /* drop our +1; caches the block if all are done */
}

/* A freed block, counted in pending_live, or a parked one whose last
 * capture was just released (counted again): ask each of its streams
 * whether it is capturing (no lock held; pp_capture_classify), then, under
 * streams_lock, link the block to every capture that holds it: its ties to
 * captures not yet released, and the captures its streams are in now
 * (pp_capture_park). Held by none, its events are recorded; else it is
 * parked and leaves pending_live. p and set may be gone once streams_lock
 * is dropped with holds (a release on another thread may settle and cache
 * the block at once). */
static void settle(pinpool_t *pool, pp_pending_t *p, const pp_sset_t *set) {
  pp_cohort_t *coh = p->coh; /* p may be gone once parked */
  uint32_t n = set == NULL ? 0 : set->n;
  uint8_t use_buf[16];
  uint64_t id_buf[16];
  uint8_t *use = n > 16 ? malloc(n) : use_buf;
  uint64_t *ids = n > 16 ? malloc(n * sizeof *ids) : id_buf;
  if (use == NULL || ids == NULL) {
    /* Nothing known of the streams: none can be recorded on. */
    if (use != NULL && use != use_buf)
      free(use);
    if (ids != NULL && ids != id_buf)
      free(ids);
    (void)pp_fail(PINPOOL_ENOMEM, "pinpool_free: out of memory");
    report_error(pool, PINPOOL_ENOMEM, p); /* kept PENDING for good */
    /* No event: our +1 is the last, the failed block leaves pending_live. */
    atomic_store_explicit(&p->remaining, 1, memory_order_relaxed);
    event_done(pool, p);
    return;
  }
  bool any = pp_capture_classify(pool, set, use, ids);
  uint32_t holds = 0;
  bool oom = false;
  void *block = pending_block(p);
  if (any)
    holds = pp_capture_park(pool, p, set, use, ids, &oom);
  if (oom) {
    (void)pp_fail(PINPOOL_ENOMEM, "pinpool_free: out of memory to park a "
                                  "block on its capture");
    report_error_at(pool, PINPOOL_ENOMEM, block);
  }
  if (holds > 0) {
    /* Parked: synchronize does not wait for it (only a release can let it
     * go). Neither p nor set may be touched any more. */
    live_done(pool, coh);
  } else {
    start_events(pool, p, set, use);
  }
  if (use != use_buf)
    free(use);
  if (ids != id_buf)
    free(ids);
}

/* A parked block's last capture was released (capture.c): settle it
 * again. */
void pp_stream_resume(pinpool_t *pool, pp_pending_t *p) {
  pp_fetch_sub_relaxed(&pool->graph_bytes, p->bs);
  pp_fetch_sub_relaxed(&pool->graph_blocks, 1);
  p->coh = live_add(pool);
  pp_mutex_t *lk = stripe(pool, p->seg, p->idx);
  _Atomic(pp_sset_t *) *slot = sset_slot(p->seg, p->idx); /* exists */
  pp_mutex_lock(lk);
  pp_sset_t *set = slot != NULL ? pp_load_relaxed(slot) : NULL;
  pp_mutex_unlock(lk);
  settle(pool, p, set);
}

/* ---- Polling ---------------------------------------------------------------
 */

/* Resolve the events taken off the queues (no lock held): release them,
 * count them, and let their blocks go when it was their last. An item is
 * part of its block's record, which event_done may free: nothing of it is
 * read after that call. */
static void finish(pinpool_t *pool, pp_qitem_t *done) {
  while (done != NULL) {
    pp_qitem_t *it = done;
    done = it->next;
    int r = it->event_result;
    pp_pending_t *p = it->p;
    ev_release(pool, it->event);
    if (r == 1)
      pp_fetch_add_relaxed(&pool->ev_completed, 1);
    else
      report_error(pool, r < 0 ? r : PINPOOL_EDEVICE, p);
    event_done(pool, p);
  }
}

/* A miss's turn (take_with_retry): the next queue under the round-robin
 * cursor, which moves on past it (after the last queue, to the head of the
 * list); NULL once `left` turns are used. streams_lock held. */
static pp_squeue_t *miss_next(pinpool_t *pool, size_t *left) {
  pp_assert_held(&pool->streams_lock);
  if (*left == 0)
    return NULL;
  (*left)--;
  pp_qtab_t *t = pool->qtab;
  pp_squeue_t *q = t->cursor != NULL ? t->cursor : pool->squeues;
  t->cursor = q != NULL ? q->next : NULL;
  return q;
}

/* Poll the heads of the queues that hold events: up to `budget`
 * completions. wait: synchronize each head instead of querying it.
 *
 * nq == 0, a full poll (process_events, empty_cache, synchronize, the
 * background thread): one pass over the active list, from its head. nq >
 * 0, a miss's poll: at most nq queues (never the same one twice), taken in
 * turn from the round-robin cursor, so that a miss costs the same with 10
 * or 100,000 streams holding events (issue 38, 1: every miss walked them
 * all, 1.4 ms at 100,000) and the cursor's laps still reach every queue:
 * a queue ahead of the cursor is polled within (queues ahead) / nq misses,
 * whatever its stream, a slow one's included (invariant 7).
 *
 * Either way each queue is drained before its turn ends: a head that
 * completed is taken off and the next one polled at once, so a full poll
 * reclaims every completed event of every queue, not one a queue (issue
 * 37, S1: 300 completed events on one stream took 300 calls, and an error
 * behind the head went unreported until then). A head that has not
 * completed ends the queue's turn: nothing behind it on that stream has
 * completed either. A completed item is taken off under the lock and
 * resolved at the next unlock (finish); the walk goes on from the queue
 * after it (which is still listed: only this pass's own drop can unlink a
 * queue while the lock is held; the cursor is moved past a dropped queue)
 * and never restarts. */
static void process(pinpool_t *pool, unsigned budget, bool wait, size_t nq,
                    uint64_t upto) {
  pp_qitem_t *done = NULL; /* taken off since the last unlock: one */
  bool done_busy = false;  /* in a busy section for it */
  uint64_t polls = 0;
  pp_mutex_lock(&pool->streams_lock);
  bool full = nq == 0;
  uint64_t begun = pool->qtab->qseq; /* queries begun before this poll */
#ifdef PINPOOL_MUTANT_MISS_FULL_WALK
  /* Logic mutant (docs/verification.md): a miss walks every queue again. */
  full = true;
#endif
  size_t left = full || nq > pool->qtab->n ? pool->qtab->n : nq;
  pp_squeue_t *q = full ? pool->squeues : miss_next(pool, &left);
  while (q != NULL && budget > 0) {
    pp_qitem_t *it = q->head;
    polls++;
    if (full && it == NULL && q->wanted == 0 && !q->polling) {
      /* Emptied by a poller while a full poll waited for it. */
      pp_squeue_t *next = q->next;
      queue_drop_locked(pool, q);
      q = next;
      continue;
    }
#ifndef PINPOOL_MUTANT_POLL_CHASE
    if (full && !wait && it != NULL && q->not_done > begun) {
      /* The head was found not done by a query begun after this poll
       * began: nothing on this stream completed before the call, which is
       * all a full poll that queries promises (one that synchronizes
       * waits for every head itself). Without this a full poll waited again
       * for every miss that took the head meanwhile, for as long as
       * threads kept missing (issue 37, s39: rev37d's v7 probe, driven by
       * a hook, 20 waits in one process_events; at most 2 now,
       * tests/test_waits37.c poll_wait_bounded). */
      q = q->next;
      continue;
    }
#else
    /* Logic mutant (docs/verification.md): a full poll waits for every
     * query it meets; test_waits37's poll_wait_bounded must fail. */
    (void)begun;
#endif
    if (full && it != NULL && q->polling == 1 && !pp_in_callout() &&
        (q->poller_busy || pp_load_relaxed(&pp_tls.busy) == 0)) {
      /* Another thread queries its head: a miss (which stops at its
       * budget, PP_MISS_BUDGET) or another full poll. Wait for that query
       * and drain the queue here: a full poll reclaims every completed
       * event, now (issue 37, third review, item 7: 300 completed events
       * stayed pending after process_events, 236 after both calls, when
       * a miss held the queue). Not for a head being synchronized
       * (polling 2): it has not completed, nor has anything behind it,
       * and its poller drains the queue when it does.
       *
       * Not from inside a busy section for a poller outside one
       * (issue 37, third review, fork deadlock): that poller enters a
       * section after its query, before it clears polling, and so waits
       * at the fork gate while a fork waits for this section. Such a
       * poller is a full poll itself (process_events, the background
       * thread), which drains the queue; a miss is always inside an
       * allocation's section, so empty_cache still waits for a miss. Nor
       * from inside a callout (base.h, pp_callout): a provider's query
       * (its own queue's poller could be itself, or wait for it), a
       * backend call (whose caller's query may be what it would wait
       * for: issue 37, fourth review, D5), any. docs/streams.md. */
      q->wanted++;
      atomic_fetch_add(&pool->sync_waiters, 1); /* seq_cst: progress() */
      pthread_mutex_lock(&pool->sync_mu);
      uint64_t gen = pool->sync_gen;
      pthread_mutex_unlock(&pool->sync_mu);
      pp_mutex_unlock(&pool->streams_lock);
      finish(pool, done);
      if (done_busy)
        pp_busy_leave();
      done = NULL;
      done_busy = false;
      pp_hook(PP_HOOK_POLL_WAIT);
      /* The poller clears polling under streams_lock, which this thread
       * held when it read gen, and then calls progress(). Not a
       * cancellation point (base.h, pp_nocancel_enter). */
      int cs = pp_nocancel_enter();
      pthread_mutex_lock(&pool->sync_mu);
      while (pool->sync_gen == gen)
        pthread_cond_wait(&pool->sync_cv, &pool->sync_mu);
      pthread_mutex_unlock(&pool->sync_mu);
      pp_nocancel_leave(cs);
      atomic_fetch_sub(&pool->sync_waiters, 1);
      pp_mutex_lock(&pool->streams_lock);
      q->wanted--;
      continue; /* the same queue: polled again, or dropped if empty */
    }
    if (it == NULL || q->polling || (it->p->coh->id > upto && q->ninv == 0)) {
      /* upto (a synchronize's): a head of a newer cohort, with nothing
       * older behind it, is not waited for: blocks freed after the call
       * (issue 37, rv3637f, D5). */
      q = full ? q->next : miss_next(pool, &left);
      continue;
    }
    q->polling = wait ? 2 : 1; /* q is not freed while set, by anyone */
    q->qnum = ++pool->qtab->qseq;
    q->poller_busy = pp_load_relaxed(&pp_tls.busy) != 0;
    pp_mutex_unlock(&pool->streams_lock);
    finish(pool, done);
    if (done_busy)
      pp_busy_leave();
    done = NULL;
    done_busy = false;
    int r = wait ? ev_sync(pool, it->event)
            : pp_fault_hit(&pool->cfg, PP_FAULT_QUERY)
                ? pp_fail(PINPOOL_EDEVICE, "injected failure of an event query")
                : ev_query(pool, it->event);
    if (wait && r == 0)
      r = 1;
    /* From taking a resolved item off its queue to caching its block (in
     * finish, at the next unlock): a busy section (fork.c), so no child
     * inherits a block that left its queue and not PENDING. Entered before
     * the lock (a thread that waits at the fork gate holds none). Nested
     * in an allocation's section, it only deepens it; a thread without a
     * record (out of memory for one) has no section. */
    bool busy = r != 0 && pp_thread_get() != NULL;
    if (busy)
      pp_busy_enter();
    pp_mutex_lock(&pool->streams_lock);
    q->polling = 0;
    /* A synchronize that found this head busy may now wait on it itself;
     * a full poll waiting for the queue may drain it. */
    progress(pool);
    if (r == 0) {
      /* Not done: nothing behind the head on this stream is either. */
      q->not_done = q->qnum;
      q = full ? q->next : miss_next(pool, &left);
      continue;
    }
    q->head = it->next;
    q->not_done = 0; /* a new head, not yet polled */
    q->ninv -= it->inv;
    it->event_result = r;
    it->next = NULL;
    done = it;
    done_busy = busy;
    budget--;
    if (q->head != NULL)
      continue; /* the same queue: its next head may have completed too */
    q->tail = NULL;
    pp_squeue_t *next = q->next;
    if (q->wanted == 0)           /* else the last full poll waiting drops it */
      queue_drop_locked(pool, q); /* moves the cursor past q */
    q = full ? next : miss_next(pool, &left);
  }
  pp_mutex_unlock(&pool->streams_lock);
  pp_queue_polls += polls;
  finish(pool, done);
  if (done_busy)
    pp_busy_leave();
}

void pp_process(pinpool_t *pool, unsigned budget, bool wait) {
  if (!pool->has_events || pp_load_relaxed(&pool->pending_live) == 0)
    return;
  process(pool, budget, wait, 0, UINT64_MAX);
}

bool pp_process_miss(pinpool_t *pool) {
  if (!pool->has_events)
    return false;
  uint64_t before = pp_load_relaxed(&pool->pending_live);
  if (before == 0)
    return false;
  process(pool, PP_MISS_BUDGET, false, PP_MISS_QUEUES, UINT64_MAX);
  /* Fewer pending: blocks (this poll's or another thread's) became idle,
   * which the caller's trim must see (rv39c D3). A guess either way under
   * concurrent frees: a trim that finds nothing over the cap costs a
   * check. */
  return pp_load_relaxed(&pool->pending_live) < before;
}

int pinpool_process_events(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_process_events: pool is NULL");
  int dying = pp_pool_dying(pool, "pinpool_process_events");
  if (pp_unlikely(dying != 0))
    return dying;
  pp_process(pool, UINT32_MAX, false);
  if (pool->has_events)
    pp_trim_after_poll(pool); /* what completed is idle now */
  return 0;
}

int pinpool_synchronize(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_synchronize: pool is NULL");
  int dying = pp_pool_dying(pool, "pinpool_synchronize");
  if (pp_unlikely(dying != 0))
    return dying;
  int rc = pp_synchronize(pool);
  if (pool->has_events)
    pp_trim_after_poll(pool); /* what completed is idle now */
  return rc;
}

/* A synchronize's wait is over: its cohorts retired (have: it cut), or,
 * without a cut (no memory for a cohort), nothing pending at all. */
static bool sync_done(pinpool_t *pool, bool have, uint64_t target) {
  return have ? live_reached(pool, target)
              : atomic_load(&pool->pending_live) == 0;
}

int pp_synchronize(pinpool_t *pool) {
  if (!pool->has_events)
    return 0;
  /* Only the blocks freed before the call (docs/streams.md): those of the
   * cohorts up to the cut (live_cut); the passes below do not wait for a
   * head of a newer cohort either (process, upto). Waiting for
   * pending_live == 0 also waited for every block freed meanwhile: beside
   * a thread that kept freeing, as long as it did (rv37e's d3: 2.9 s,
   * every earlier block done in 20 ms). Without memory for a cut, the
   * fallback: nothing pending at all, or a cut made later (each round
   * tries again); both wait for more, never for less. */
  uint64_t target = 0;
  bool have = live_cut(pool, &target) == 0;
  pp_hook(PP_HOOK_SYNC_CUT);
  if (pp_in_callout()) {
    /* One pass that synchronizes every head no other poll holds, and no
     * sleep for other threads' progress: the head this thread's own
     * query holds (a query that synchronizes) would never complete, and
     * another poller may wait for this thread's caller. What is left is
     * PINPOOL_EBUSY: the promise (no block freed before the call still
     * pending) is not kept. */
    process(pool, UINT32_MAX, true, 0, have ? target : UINT64_MAX);
    uint64_t left = atomic_load(&pool->pending_live);
    if (!sync_done(pool, have, target))
      return pp_fail(PINPOOL_EBUSY,
                     "pinpool_synchronize: called from inside %s, blocks "
                     "freed before the call still pending (%llu in all) on "
                     "events other polls hold "
                     "(it would wait for another thread: docs/api.md, "
                     "\"Calling pinpool from a callback\")",
                     pp_callout_name(), (unsigned long long)left);
    return 0;
  }
  /* A waiter from the start: progress made by others during a pass below
   * bumps sync_gen, so it is not slept through. */
  atomic_fetch_add(&pool->sync_waiters, 1);
  for (;;) {
    if (!have)
      have = live_cut(pool, &target) == 0;
    pthread_mutex_lock(&pool->sync_mu);
    uint64_t gen = pool->sync_gen;
    pthread_mutex_unlock(&pool->sync_mu);
    if (sync_done(pool, have, target))
      break;
    process(pool, UINT32_MAX, true, 0, have ? target : UINT64_MAX);
    /* What is left is polled by other threads (or completing in event_done
     * on them): sleep until one of them makes progress. */
    int cs = pp_nocancel_enter(); /* base.h: not a cancellation point */
    pthread_mutex_lock(&pool->sync_mu);
    while (pool->sync_gen == gen && !sync_done(pool, have, target))
      pthread_cond_wait(&pool->sync_cv, &pool->sync_mu);
    pthread_mutex_unlock(&pool->sync_mu);
    pp_nocancel_leave(cs);
  }
  atomic_fetch_sub(&pool->sync_waiters, 1);
  return 0;
}

int pinpool_sim_submit(pinpool_t *pool, pinpool_stream_t stream,
                       uint64_t duration_ns, void (*fn)(void *), void *arg) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_sim_submit: pool is NULL");
  if (!pool->has_events || pool->cfg.events != PP_EVENTS_SIMULATED)
    return pp_fail(PINPOOL_EBUSY,
                   "pinpool_sim_submit: the pool does not use simulated "
                   "streams (events=simulated)");
  return pp_events_sim_submit(pool->ev.ctx, stream, duration_ns, fn, arg);
}

/* ---- Background reclaim ----------------------------------------------------
 */

/* The thread of background=1 (event reclaim) and of grow_ahead= (the
 * grower, growahead.c): either or both. */
static bool bg_reclaims(const pinpool_t *pool) {
  return pool->has_events && pool->cfg.background;
}

static void *bg_main(void *arg) {
  pinpool_t *pool = arg;
  pp_pool_thread = true; /* no teardown here: it joins this thread */
  /* The grower alone looks once a millisecond (growahead.c, LOOK_NS). */
  unsigned us = bg_reclaims(pool) ? pool->cfg.poll_us : 1000u;
  pthread_mutex_lock(&pool->bg_mutex);
  while (!pool->bg_stop) {
    if (pool->bg_held != 0) {
      /* pinpool_validate runs: a reclaim moves blocks between lists and
       * counters without one lock held throughout (issue 37, third
       * review: validate failed in fork children and parents with
       * background=1, a thread the user cannot stop). */
      (void)pthread_cond_wait(&pool->bg_cond, &pool->bg_mutex);
      continue;
    }
    pool->bg_in_pass = true;
    pthread_mutex_unlock(&pool->bg_mutex);
    if (bg_reclaims(pool)) {
      pp_process(pool, UINT32_MAX, false);
      /* What completed is idle now. This thread starts before
       * pinpool_create has made the arena (lifecycle.c), and a trim reads
       * it: not before the create published it (grow.ready, release).
       * TSAN saw the first pass's trim read arena.node being written. */
      if (pp_load_acquire(&pool->grow.ready))
        pp_trim_after_poll(pool);
    }
    pp_grow_tick(pool);
    pthread_mutex_lock(&pool->bg_mutex);
    pool->bg_in_pass = false;
    if (pool->bg_held != 0)
      (void)pthread_cond_broadcast(&pool->bg_cond);
    if (pool->bg_stop)
      break;
    struct timespec ts;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)us * 1000u;
    ts.tv_sec += (time_t)(ns / 1000000000u);
    ts.tv_nsec = (long)(ns % 1000000000u);
    (void)pthread_cond_timedwait(&pool->bg_cond, &pool->bg_mutex, &ts);
  }
  pthread_mutex_unlock(&pool->bg_mutex);
  return NULL;
}

int pp_streams_init(pinpool_t *pool) {
  for (int i = 0; i < 64; i++)
    pp_mutex_init(&pool->sset_locks[i]);
  pp_mutex_init(&pool->streams_lock);
  pp_index_init(&pool->ctab, &pool->streams_lock);
  pp_index_init(&pool->scix, &pool->streams_lock);
  pp_mutex_init(&pool->live_mu);
  (void)pthread_mutex_init(&pool->bg_mutex, NULL);
  (void)pthread_cond_init(&pool->bg_cond, NULL);
  (void)pthread_mutex_init(&pool->sync_mu, NULL);
  (void)pthread_cond_init(&pool->sync_cv, NULL);
  atomic_init(&pool->sync_waiters, 0);
  pool->sync_gen = 0;
  pool->squeues = NULL;
  pool->qtab = calloc(1, sizeof *pool->qtab);
  if (pool->qtab != NULL) {
    pool->qtab->nb = 16;
    pool->qtab->b = calloc(pool->qtab->nb, sizeof(pp_squeue_t *));
  }
  pool->live_cur = pool->live_head = calloc(1, sizeof(pp_cohort_t));
  if (pool->live_cur != NULL)
    pool->live_cur->id = 1; /* live_retired 0: none before it */
  if (pool->qtab == NULL || pool->qtab->b == NULL || pool->live_cur == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  int rc = pp_grow_init(pool);
  if (rc != 0)
    return rc;
  if (bg_reclaims(pool) || pool->grow.node != NULL) {
    int e = pthread_create(&pool->bg_thread, NULL, bg_main, pool);
    if (e != 0)
      return pp_fail(
          PINPOOL_ENOMEM, "%s: cannot start the background thread: %s",
          bg_reclaims(pool) ? "background=1" : "grow_ahead", strerror(e));
    pool->bg_running = true;
  }
  return 0;
}

void pp_streams_fini(pinpool_t *pool) {
  if (pool->bg_running) {
    pthread_mutex_lock(&pool->bg_mutex);
    pool->bg_stop = true;
    pthread_cond_broadcast(&pool->bg_cond); /* validators wait on it too */
    pthread_mutex_unlock(&pool->bg_mutex);
    (void)pthread_join(pool->bg_thread, NULL);
    pool->bg_running = false;
  }
  pp_grow_fini(pool);
  /* destroy (after synchronize: the queues are empty) or a failed create
   * (no event was ever queued). */
  for (pp_squeue_t *q = pool->squeues, *next; q != NULL; q = next) {
    next = q->next;
    /* An item is part of its block's record: the last one frees it.
     * The items of one queue belong to different blocks. */
    for (pp_qitem_t *it = q->head, *n2; it != NULL; it = n2) {
      n2 = it->next;
      pp_pending_t *p = it->p;
      ev_release(pool, it->event);
      if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) ==
          1)
        free(p);
    }
    free(q);
  }
  pool->squeues = NULL;
  pp_captures_fini(pool);
  /* The cohorts: their blocks went with the queues (or never came). */
  for (pp_cohort_t *c = pool->live_head, *next; c != NULL; c = next) {
    next = c->next;
    free(c);
  }
  for (pp_cohort_t *c = pool->live_spare, *next; c != NULL; c = next) {
    next = c->next;
    free(c);
  }
  pool->live_head = pool->live_cur = pool->live_spare = NULL;
  pp_mutex_destroy(&pool->live_mu);
  if (pool->qtab != NULL) {
    free(pool->qtab->b);
    free(pool->qtab);
    pool->qtab = NULL;
  }
  (void)pthread_mutex_destroy(&pool->sync_mu);
  (void)pthread_cond_destroy(&pool->sync_cv);
  for (int i = 0; i < 64; i++)
    pp_mutex_destroy(&pool->sset_locks[i]);
  pp_mutex_destroy(&pool->streams_lock);
  (void)pthread_mutex_destroy(&pool->bg_mutex);
  (void)pthread_cond_destroy(&pool->bg_cond);
}

/* ---- Fork (fork.c) ---------------------------------------------------------
 * This file's locks, in their order: the stripes and streams_lock are never
 * held together; streams_lock -> sync_mu (progress); bg_mutex and live_mu
 * alone. No
 * other pool lock is taken while one of them is held. */
void pp_streams_fork(pinpool_t *pool, int phase) {
  if (phase == PP_FORK_PREPARE) {
    for (int i = 0; i < 64; i++)
      pp_mutex_lock(&pool->sset_locks[i]);
    pp_mutex_lock(&pool->streams_lock);
    pthread_mutex_lock(&pool->bg_mutex);
    pthread_mutex_lock(&pool->sync_mu);
    pp_mutex_lock(&pool->live_mu);
    return;
  }
  if (phase == PP_FORK_CHILD) {
    /* Their waiters are gone: new condition variables (glibc's destroy
     * would wait for them forever). */
    (void)pthread_cond_init(&pool->bg_cond, NULL);
    (void)pthread_cond_init(&pool->sync_cv, NULL);
    /* Neither the background thread nor a validator survived. */
    pool->bg_held = 0;
    pool->bg_in_pass = false;
    /* The forking thread is in no synchronize; nobody else survived. */
    atomic_store(&pool->sync_waiters, 0);
    pp_grow_fork_child(pool);  /* growahead.c */
    pp_arena_fork_child(pool); /* arena.c */
    if (pool->bg_running) {
      pool->bg_running = false; /* not this process's thread */
      pp_store_relaxed(&pool->bg_restart, true);
    }
    /* Their pollers are gone; no poll is in flight. */
    for (pp_squeue_t *q = pool->squeues; q != NULL; q = q->next) {
      q->polling = 0;
      q->wanted = 0;
    }
  }
  pp_mutex_unlock(&pool->live_mu);
  pthread_mutex_unlock(&pool->sync_mu);
  pthread_mutex_unlock(&pool->bg_mutex);
  pp_mutex_unlock(&pool->streams_lock);
  for (int i = 64; i-- > 0;)
    pp_mutex_unlock(&pool->sset_locks[i]);
}

/* pinpool_validate holds the background thread off (on) and lets it go
 * (off): it waits for a pass in progress to end, and no pass starts while
 * held (issue 37, third review). Counted, so validators may overlap. */
void pp_bg_hold(pinpool_t *pool, bool on) {
  pthread_mutex_lock(&pool->bg_mutex);
  if (on) {
    pool->bg_held++;
    /* Never from inside a callout (pinpool_validate refuses there): the
     * background thread's own pass runs only library code and callouts,
     * so this is never that thread, and no pass waits for this one. */
    pp_assert(!pp_in_callout());
    if (pool->bg_in_pass)
      pp_hook(PP_HOOK_VALIDATE_HOLD);
    int cs = pp_nocancel_enter(); /* base.h: not a cancellation point */
    while (pool->bg_in_pass)
      (void)pthread_cond_wait(&pool->bg_cond, &pool->bg_mutex);
    pp_nocancel_leave(cs);
  } else if (--pool->bg_held == 0) {
    (void)pthread_cond_broadcast(&pool->bg_cond);
  }
  pthread_mutex_unlock(&pool->bg_mutex);
}

/* A child of fork whose parent ran the background thread: start this
 * process's own (until then the slow paths reclaim inline). */
static void bg_restart(pinpool_t *pool) {
  pthread_mutex_lock(&pool->bg_mutex);
  if (pp_load_relaxed(&pool->bg_restart) && !pool->bg_stop) {
    pp_store_relaxed(&pool->bg_restart, false);
    if (pthread_create(&pool->bg_thread, NULL, bg_main, pool) == 0)
      pool->bg_running = true;
  }
  pthread_mutex_unlock(&pool->bg_mutex);
}

void pp_bg_restart(pinpool_t *pool) {
  if (pp_unlikely(pp_load_relaxed(&pool->bg_restart)))
    bg_restart(pool);
}
