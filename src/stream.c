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
 * Locks: the stripe locks (sset_locks) guard the per-block stream sets;
 * streams_lock guards the list of queues; each queue has its own lock.
 * None is held across a provider call (invariant 1): a poller marks a
 * queue's head as being polled, drops the lock, queries, and retakes it.
 */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct pp_sset {
  uint32_t n, cap;
  pinpool_stream_t s[];
} pp_sset_t;

/* A freed block waiting for its events. */
typedef struct pp_pending {
  pp_segment_t *seg;
  uint32_t idx;
  size_t req;
  unsigned cls;
  uint64_t freed_ns;
  _Atomic(uint32_t) remaining; /* events not yet complete */
  _Atomic(bool) failed;        /* an event failed: never reused */
} pp_pending_t;

typedef struct pp_qitem {
  void *event;
  pp_pending_t *p;
  struct pp_qitem *next;
} pp_qitem_t;

typedef struct pp_squeue {
  pinpool_stream_t stream; /* immutable */
  pp_mutex_t lock;
  pp_qitem_t *head, *tail; /* under lock */
  bool polling;            /* under lock: a thread is querying head */
  struct pp_squeue *next;  /* under pool->streams_lock; never unlinked */
} pp_squeue_t;

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
  pp_mutex_t *lk = stripe(pool, seg, idx);
  pp_mutex_lock(lk);
  /* Set the streams bit while the block is ALLOCATED, under the stripe
   * lock: a concurrent free either sees the bit (and then takes the set
   * under this lock, after we added the stream) or has already changed the
   * state, and we refuse. */
  uint64_t w = pp_load_acquire(&seg->word[idx]);
  do {
    if (PP_WORD_STATE(w) != PP_ALLOCATED) {
      pp_mutex_unlock(lk);
      if (PP_WORD_STATE(w) == PP_NEVER)
        return pp_fail(PINPOOL_ENOTOWNED,
                       "pinpool_record_stream: %p was never handed out", ptr);
      return pp_fail(PINPOOL_EDOUBLEFREE,
                     "pinpool_record_stream: %p is not allocated", ptr);
    }
  } while (!(w & PP_WORD_STREAMS) &&
           !pp_cas_acq_rel(&seg->word[idx], &w, w | PP_WORD_STREAMS));
  pp_sset_t *set = pp_load_relaxed(slot);
  bool found = false;
  for (uint32_t i = 0; set != NULL && i < set->n; i++)
    found |= set->s[i] == stream;
  if (!found && (set == NULL || set->n == set->cap)) {
    uint32_t cap = set == NULL ? 4 : set->cap * 2;
    pp_sset_t *grown = realloc(set, sizeof *set + cap * sizeof set->s[0]);
    if (grown == NULL) {
      pp_mutex_unlock(lk);
      return pp_fail(PINPOOL_ENOMEM, "pinpool_record_stream: out of memory");
    }
    if (set == NULL)
      grown->n = 0;
    grown->cap = cap;
    set = grown;
    pp_store_relaxed(slot, set);
  }
  if (!found)
    set->s[set->n++] = stream;
  pp_mutex_unlock(lk);
  return 0;
}

/* ---- Queues ----------------------------------------------------------------
 */

static pp_squeue_t *queue_for(pinpool_t *pool, pinpool_stream_t stream) {
  pp_mutex_lock(&pool->streams_lock);
  pp_squeue_t *q = pool->squeues;
  while (q != NULL && q->stream != stream)
    q = q->next;
  if (q == NULL && (q = calloc(1, sizeof *q)) != NULL) {
    q->stream = stream;
    pp_mutex_init(&q->lock);
    q->next = pool->squeues;
    pool->squeues = q;
  }
  pp_mutex_unlock(&pool->streams_lock);
  return q;
}

static void report_error(pinpool_t *pool, int err, pp_pending_t *p) {
  pp_fetch_add_relaxed(&pool->ev_errors, 1);
  bool was = atomic_exchange_explicit(&p->failed, true, memory_order_acq_rel);
  if (!was)
    pp_fetch_sub_relaxed(&pool->pending_live, 1);
  if (pool->on_error != NULL) {
    size_t bs = pp_load_relaxed(&p->seg->block_size);
    void *block = (void *)(pp_load_relaxed(&p->seg->base) + p->idx * bs);
    pool->on_error(pool->error_arg, err, pinpool_last_error(), block);
  }
}

/* A pending block's events are all done: drop its stream set (kept for
 * snapshots while it was pending), forget its allocation info, record the
 * free as completed. The caller then caches it. */
static void block_done(pinpool_t *pool, pp_segment_t *seg, uint32_t idx,
                       size_t bs, size_t req) {
  pp_mutex_t *lk = stripe(pool, seg, idx);
  _Atomic(pp_sset_t *) *slot = sset_slot(seg, idx); /* exists: bit was set */
  pp_mutex_lock(lk);
  pp_sset_t *set = slot != NULL ? pp_load_relaxed(slot) : NULL;
  if (slot != NULL)
    pp_store_relaxed(slot, NULL);
  pp_mutex_unlock(lk);
  free(set);
  pp_hist_forget(seg, idx);
  if (pp_unlikely(pp_hist_level(pool) >= PINPOOL_HISTORY_ALLOC))
    pp_hist_event(pool, PP_H_FREE_COMPLETED,
                  pp_load_relaxed(&seg->base) + (uintptr_t)idx * bs, bs, req, 0,
                  NULL);
}

size_t pp_stream_list(pinpool_t *pool, pp_segment_t *seg, uint32_t idx,
                      uint64_t *out, size_t max) {
  _Atomic(pp_sset_t *) *arr = pp_load_acquire(&seg->ssets);
  if (arr == NULL)
    return 0;
  pp_mutex_t *lk = stripe(pool, seg, idx);
  pp_mutex_lock(lk);
  pp_sset_t *set = pp_load_relaxed(&arr[idx]);
  size_t n = set == NULL ? 0 : set->n;
  for (size_t i = 0; i < n && i < max; i++)
    out[i] = (uint64_t)set->s[i];
  pp_mutex_unlock(lk);
  return n;
}

/* One event of p is done (or failed). The last one decides. */
static void event_done(pinpool_t *pool, pp_pending_t *p) {
  if (atomic_fetch_sub_explicit(&p->remaining, 1, memory_order_acq_rel) != 1)
    return;
  if (pp_load_acquire(&p->failed)) {
    /* The device may have faulted while using the block: keep it PENDING
     * forever rather than hand out memory in an unknown state. */
    free(p);
    return;
  }
  size_t bs = pp_class_size(p->cls);
  pp_tentry_t e = {
      (void *)(pp_load_relaxed(&p->seg->base) + (uintptr_t)p->idx * bs), p->seg,
      p->idx};
  pp_fetch_sub_relaxed(&pool->pending_bytes, bs);
  pp_fetch_sub_relaxed(&pool->pending_blocks, 1);
  pp_fetch_sub_relaxed(&pool->pending_live, 1);
  pp_backend_timed(&pool->rc_count, &pool->rc_total, &pool->rc_max,
                   p->freed_ns);
  block_done(pool, p->seg, p->idx, bs, p->req);
  free(p);
  /* PENDING -> CACHED happens inside the bin push (one store, under the
   * bin lock), so no reader ever sees the block in two states. */
  pp_central_give(pool, pp_class_index(bs), &e, 1);
}

/* ---- Free ---------------------------------------------------------------- */

static void bg_restart(pinpool_t *pool);

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
  pp_owner_add(&tc->c.n_free, 1);
  pp_owner_add(&tc->c.req_free, req);
  pp_owner_add(&tc->c.blk_free, bs);
  pp_fetch_add_relaxed(&pool->pending_bytes, bs);
  pp_fetch_add_relaxed(&pool->pending_blocks, 1);
  pp_fetch_add_relaxed(&pool->pending_live, 1);

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
                  set != NULL && set->n > 0 ? (uint64_t)set->s[0] : 0, ra);

  pp_pending_t *p = malloc(sizeof *p);
  uint32_t n = set == NULL ? 0 : set->n;
  if (p == NULL) {
    /* No memory to track the events: wait for the streams here instead.
     * Correct, only slower. */
    for (uint32_t i = 0; i < n; i++) {
      void *ev = NULL;
      if (pool->ev.record(pool->ev.ctx, set->s[i], &ev) == 0) {
        (void)pool->ev.synchronize(pool->ev.ctx, ev);
        pool->ev.release(pool->ev.ctx, ev);
      }
    }
    pp_fetch_sub_relaxed(&pool->pending_bytes, bs);
    pp_fetch_sub_relaxed(&pool->pending_blocks, 1);
    pp_fetch_sub_relaxed(&pool->pending_live, 1);
    pp_tentry_t e = {(void *)(pp_load_relaxed(&seg->base) + idx * bs), seg,
                     idx};
    block_done(pool, seg, idx, bs, req);
    pp_central_give(pool, pp_class_index(bs), &e, 1);
    return 0;
  }
  *p = (pp_pending_t){.seg = seg,
                      .idx = idx,
                      .req = req,
                      .cls = pp_class_index(bs),
                      .freed_ns = pp_now_ns()};
  /* +1 for this function: the block cannot complete before every event
   * is queued, however fast the streams are. */
  atomic_init(&p->remaining, n + 1);
  atomic_init(&p->failed, false);
  uint32_t dropped = 0; /* events that could not be recorded */
  for (uint32_t i = 0; i < n; i++) {
    void *ev = NULL;
    int rc = pp_fault_hit(&pool->cfg, PP_FAULT_RECORD)
                 ? pp_fail(PINPOOL_EDEVICE, "injected failure of an event "
                                            "record")
                 : pool->ev.record(pool->ev.ctx, set->s[i], &ev);
    pp_squeue_t *q = rc == 0 ? queue_for(pool, set->s[i]) : NULL;
    pp_qitem_t *it = q != NULL ? malloc(sizeof *it) : NULL;
    if (it == NULL) {
      if (rc == 0)
        pool->ev.release(pool->ev.ctx, ev);
      if (rc == 0)
        rc = pp_fail(PINPOOL_ENOMEM, "pinpool_free: out of memory for an "
                                     "event");
      /* An event we could not record: we cannot know when the stream is
       * done with the block, so it is never reused. */
      report_error(pool, rc, p);
      dropped++;
      continue;
    }
    pp_fetch_add_relaxed(&pool->ev_recorded, 1);
    *it = (pp_qitem_t){ev, p, NULL};
#ifndef PINPOOL_MUTANT_QUEUE_NO_LOCK
    pp_mutex_lock(&q->lock);
#endif
    if (q->tail != NULL)
      q->tail->next = it;
    else
      q->head = it;
    q->tail = it;
#ifndef PINPOOL_MUTANT_QUEUE_NO_LOCK
    pp_mutex_unlock(&q->lock);
#endif
  }
  /* Our +1 is still held, so this cannot reach zero. */
  atomic_fetch_sub_explicit(&p->remaining, dropped, memory_order_acq_rel);
  event_done(pool, p); /* drop our +1; caches the block if all are done */
  return 0;
}

/* ---- Polling ---------------------------------------------------------------
 */

void pp_process(pinpool_t *pool, unsigned budget, bool wait) {
  if (!pool->has_events || pp_load_relaxed(&pool->pending_live) == 0)
    return;
  pp_mutex_lock(&pool->streams_lock);
  pp_squeue_t *first = pool->squeues; /* queues are never unlinked */
  pp_mutex_unlock(&pool->streams_lock);
  for (pp_squeue_t *q = first; q != NULL && budget > 0;) {
    pp_mutex_lock(&q->lock);
    pp_qitem_t *it = q->polling ? NULL : q->head;
    if (it == NULL) {
      pp_mutex_unlock(&q->lock);
      pp_mutex_lock(&pool->streams_lock);
      q = q->next;
      pp_mutex_unlock(&pool->streams_lock);
      continue;
    }
    q->polling = true;
    pp_mutex_unlock(&q->lock);
    int r = wait ? pool->ev.synchronize(pool->ev.ctx, it->event)
            : pp_fault_hit(&pool->cfg, PP_FAULT_QUERY)
                ? pp_fail(PINPOOL_EDEVICE, "injected failure of an event query")
                : pool->ev.query(pool->ev.ctx, it->event);
    if (wait && r == 0)
      r = 1;
    /* From taking the item off its queue to caching its block: a busy
     * section (fork.c), so no child inherits a block between the two.
     * Nested in an allocation's section, or a thread without a record (out
     * of memory for one): no section of its own. */
    bool busy = pp_thread_get() != NULL;
    if (busy)
      pp_busy_enter();
    pp_mutex_lock(&q->lock);
    q->polling = false;
    if (r != 0) {
      q->head = it->next;
      if (q->head == NULL)
        q->tail = NULL;
    }
    pp_mutex_unlock(&q->lock);
    if (r == 0) { /* head not done: nothing behind it on this stream is */
      if (busy)
        pp_busy_leave();
      pp_mutex_lock(&pool->streams_lock);
      q = q->next;
      pp_mutex_unlock(&pool->streams_lock);
      continue;
    }
    pool->ev.release(pool->ev.ctx, it->event);
    if (r == 1) {
      pp_fetch_add_relaxed(&pool->ev_completed, 1);
    } else {
      report_error(pool, r < 0 ? r : PINPOOL_EDEVICE, it->p);
    }
    event_done(pool, it->p);
    if (busy)
      pp_busy_leave();
    free(it);
    budget--;
  }
}

int pinpool_process_events(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_process_events: pool is NULL");
  pp_process(pool, UINT32_MAX, false);
  return 0;
}

int pinpool_synchronize(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_synchronize: pool is NULL");
  /* Another thread may be polling a head: it will finish it shortly. */
  while (pp_load_relaxed(&pool->pending_live) != 0) {
    pp_process(pool, UINT32_MAX, true);
    if (pp_load_relaxed(&pool->pending_live) != 0)
      (void)sched_yield();
  }
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

static void *bg_main(void *arg) {
  pinpool_t *pool = arg;
  pthread_mutex_lock(&pool->bg_mutex);
  while (!pool->bg_stop) {
    pthread_mutex_unlock(&pool->bg_mutex);
    pp_process(pool, UINT32_MAX, false);
    pthread_mutex_lock(&pool->bg_mutex);
    if (pool->bg_stop)
      break;
    struct timespec ts;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t ns = (uint64_t)ts.tv_nsec + (uint64_t)pool->cfg.poll_us * 1000u;
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
  (void)pthread_mutex_init(&pool->bg_mutex, NULL);
  (void)pthread_cond_init(&pool->bg_cond, NULL);
  if (pool->has_events && pool->cfg.background) {
    int e = pthread_create(&pool->bg_thread, NULL, bg_main, pool);
    if (e != 0)
      return pp_fail(PINPOOL_ENOMEM,
                     "background=1: cannot start the reclaim thread: %s",
                     strerror(e));
    pool->bg_running = true;
  }
  return 0;
}

void pp_streams_fini(pinpool_t *pool) {
  if (pool->bg_running) {
    pthread_mutex_lock(&pool->bg_mutex);
    pool->bg_stop = true;
    pthread_cond_signal(&pool->bg_cond);
    pthread_mutex_unlock(&pool->bg_mutex);
    (void)pthread_join(pool->bg_thread, NULL);
    pool->bg_running = false;
  }
  /* destroy: nobody else uses the pool. Queued events are released; their
   * blocks go down with their segments. */
  for (pp_squeue_t *q = pool->squeues, *next; q != NULL; q = next) {
    next = q->next;
    for (pp_qitem_t *it = q->head, *n2; it != NULL; it = n2) {
      n2 = it->next;
      pool->ev.release(pool->ev.ctx, it->event);
      if (atomic_fetch_sub_explicit(&it->p->remaining, 1,
                                    memory_order_acq_rel) == 1)
        free(it->p);
      free(it);
    }
    pp_mutex_destroy(&q->lock);
    free(q);
  }
  pool->squeues = NULL;
  for (int i = 0; i < 64; i++)
    pp_mutex_destroy(&pool->sset_locks[i]);
  pp_mutex_destroy(&pool->streams_lock);
  (void)pthread_mutex_destroy(&pool->bg_mutex);
  (void)pthread_cond_destroy(&pool->bg_cond);
}

/* ---- Fork (fork.c) ---------------------------------------------------------
 * The leaf locks of this file: none is held while another lock is taken. */
void pp_streams_fork(pinpool_t *pool, int phase) {
  if (phase == PP_FORK_PREPARE) {
    for (int i = 0; i < 64; i++)
      pp_mutex_lock(&pool->sset_locks[i]);
    pp_mutex_lock(&pool->streams_lock);
    for (pp_squeue_t *q = pool->squeues; q != NULL; q = q->next)
      pp_mutex_lock(&q->lock);
    pthread_mutex_lock(&pool->bg_mutex);
    return;
  }
  if (phase == PP_FORK_CHILD) {
    /* Its waiters are gone: a new condition variable (glibc's destroy
     * would wait for them forever). */
    (void)pthread_cond_init(&pool->bg_cond, NULL);
    if (pool->bg_running) {
      pool->bg_running = false; /* not this process's thread */
      pp_store_relaxed(&pool->bg_restart, true);
    }
  }
  pthread_mutex_unlock(&pool->bg_mutex);
  for (pp_squeue_t *q = pool->squeues; q != NULL; q = q->next) {
    if (phase == PP_FORK_CHILD)
      q->polling = false; /* its poller is gone; no poll is in flight */
    pp_mutex_unlock(&q->lock);
  }
  pp_mutex_unlock(&pool->streams_lock);
  for (int i = 64; i-- > 0;)
    pp_mutex_unlock(&pool->sset_locks[i]);
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
