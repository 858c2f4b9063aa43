/*
 * Stream-ordered frees: a block used by work on streams is not handed out
 * again before that work completed; completion is tracked per stream (a
 * slow stream does not hold back a fast one); event errors keep a block
 * pending forever; the accounting identity holds with pending bytes.
 */
#include "testutil.h"

#include "stream.h" /* pp_queue_polls, PP_MISS_QUEUES */

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>

/* ---- A "DMA" that reads the block later, on the simulated stream -------- */
typedef struct copy {
  const unsigned char *p;
  size_t n;
  unsigned char pat;
  _Atomic(int) result; /* 0: not run, 1: saw the pattern, -1: corrupted */
} copy_t;

static void run_copy(void *arg) {
  copy_t *c = arg;
  int ok = 1;
  for (size_t i = 0; i < c->n; i += 256)
    if (c->p[i] != c->pat)
      ok = 0;
  atomic_store(&c->result, ok ? 1 : -1);
}

static void test_errors(void **state) {
  (void)state;
  pinpool_t *none, *sim;
  PP_OK(pinpool_create("events=none", &none));
  void *p;
  PP_OK(pinpool_alloc(none, 4096, &p));
  PP_CHECK_RC(pinpool_record_stream(none, p, 1), PINPOOL_EBUSY);
  PP_CHECK_RC(pinpool_sim_submit(none, 1, 0, NULL, NULL), PINPOOL_EBUSY);
  PP_OK(pinpool_free(none, p));
  pinpool_destroy(none);

  PP_OK(pinpool_create("events=simulated", &sim));
  PP_OK(pinpool_alloc(sim, 8192, &p));
  int local;
  PP_CHECK_RC(pinpool_record_stream(NULL, p, 1), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_record_stream(sim, NULL, 1), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_record_stream(sim, &local, 1), PINPOOL_ENOTOWNED);
  PP_CHECK_RC(pinpool_record_stream(sim, (char *)p + 64, 1), PINPOOL_EINTERIOR);
  PP_CHECK_RC(pinpool_process_events(NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_synchronize(NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_sim_submit(NULL, 1, 0, NULL, NULL), PINPOOL_EINVAL);
  PP_OK(pinpool_record_stream(sim, p, 7));
  PP_OK(pinpool_free(sim, p));
  /* Pending or cached: not allocated any more. */
  PP_CHECK_RC(pinpool_record_stream(sim, p, 7), PINPOOL_EDOUBLEFREE);
  PP_CHECK_RC(pinpool_free(sim, p), PINPOOL_EDOUBLEFREE);
  PP_OK(pinpool_synchronize(sim));
  PP_CHECK_CONSISTENT(sim);
  pinpool_destroy(sim);
}

/* A block whose copy is still in flight is never handed out again. */
static void test_reuse_waits_for_stream(void **state) {
  (void)state;
  pinpool_t *pool;
  /* No thread cache: every free goes to the central bin, so the block
   * would be the very next one handed out if the pool ignored streams. */
  PP_OK(
      pinpool_create("events=simulated,sim_delay_us=0,tcache_bytes=0", &pool));
  const size_t n = 64 * KiB;
  unsigned char *p;
  PP_OK(pinpool_alloc(pool, n, (void **)&p));
  memset(p, 0x5a, n);
  copy_t c = {p, n, 0x5a, 0};
  PP_OK(pinpool_sim_submit(pool, 1, 200 * 1000 * 1000ull, run_copy, &c));
  PP_OK(pinpool_record_stream(pool, p, 1));
  PP_OK(pinpool_free(pool, p));

  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 1 && st.pending_bytes == n,
            "pending %llu blocks / %llu bytes",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.pending_bytes);
  PP_ASSERT(st.reserved_bytes.current == st.block_bytes.current +
                                             st.cached_bytes.current +
                                             st.pending_bytes,
            "identity with pending");
  PP_OK(pinpool_validate(pool));

  void *got[16];
  for (int i = 0; i < 16; i++) {
    PP_OK(pinpool_alloc(pool, n, &got[i]));
    PP_ASSERT(got[i] != (void *)p, "pending block reused at allocation %d", i);
    memset(got[i], 0xee, n); /* would corrupt the copy if it were p */
  }
  PP_OK(pinpool_synchronize(pool));
  PP_ASSERT(atomic_load(&c.result) == 1, "the copy saw %d",
            atomic_load(&c.result));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 0 && st.events_completed == 1 &&
                st.events_recorded == 1 && st.reclaim.count == 1,
            "after synchronize");
  for (int i = 0; i < 16; i++)
    PP_OK(pinpool_free(pool, got[i]));
  /* Now the block is reusable: it comes back within a few allocations. */
  bool seen = false;
  void *again[32];
  for (int i = 0; i < 32; i++) {
    PP_OK(pinpool_alloc(pool, n, &again[i]));
    seen |= again[i] == (void *)p;
  }
  PP_ASSERT(seen, "the reclaimed block was never handed out again");
  for (int i = 0; i < 32; i++)
    PP_OK(pinpool_free(pool, again[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* Completion is tracked per stream: a block used only by a fast stream is
 * reclaimed while an earlier-freed block of a slow stream is still busy. */
static void test_slow_stream_does_not_block_fast(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(
      pinpool_create("events=simulated,sim_delay_us=0,tcache_bytes=0", &pool));
  void *slow, *fast;
  PP_OK(pinpool_alloc(pool, 4096, &slow));
  PP_OK(pinpool_alloc(pool, 4096, &fast));
  PP_OK(pinpool_sim_submit(pool, 100, 2000 * 1000 * 1000ull, NULL, NULL));
  PP_OK(pinpool_record_stream(pool, slow, 100));
  PP_OK(pinpool_record_stream(pool, fast, 200));
  PP_OK(pinpool_free(pool, slow)); /* freed first: a FIFO would stall */
  PP_OK(pinpool_free(pool, fast));
  pinpool_stats_t st;
  for (int i = 0; i < 200; i++) {
    PP_OK(pinpool_process_events(pool));
    PP_STATS(pool, &st);
    if (st.pending_blocks == 1)
      break;
    pp_sleep_ms(5);
  }
  PP_ASSERT(st.pending_blocks == 1 && st.events_completed == 1,
            "fast block not reclaimed while the slow stream lags: pending "
            "%llu, completed %llu",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.events_completed);
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool); /* waits for the slow stream */
}

/* A block used on two streams waits for both; the same stream twice is one
 * event. */
static void test_multiple_streams(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=0", &pool));
  void *p;
  PP_OK(pinpool_alloc(pool, 100000, &p));
  PP_OK(pinpool_sim_submit(pool, 1, 300 * 1000 * 1000ull, NULL, NULL));
  PP_OK(pinpool_record_stream(pool, p, 1));
  PP_OK(pinpool_record_stream(pool, p, 2));
  PP_OK(pinpool_record_stream(pool, p, 2));
  PP_OK(pinpool_free(pool, p));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.events_recorded == 2, "events recorded: %llu",
            (unsigned long long)st.events_recorded);
  pp_sleep_ms(50); /* stream 2 is done by now, stream 1 is not */
  PP_OK(pinpool_process_events(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 1, "reclaimed before its slow stream");
  PP_OK(pinpool_synchronize(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 0 && st.events_completed == 2,
            "after synchronize");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A block's stream set is emptied, not freed, when the block is cached
 * again, and a grown one is freed: either way the block's next use starts
 * with no streams. Reused with stream 3 only, its free records one event
 * and does not wait for the slow stream 1 of its first use. Covers sizes
 * from a slab class and from the arena, and a set grown past its first
 * size (5 streams). */
static void test_stream_set_reused_empty(void **state) {
  (void)state;
  static const size_t sizes[] = {100000, 8u << 20};
  for (size_t k = 0; k < 2; k++)
    for (unsigned nfirst = 2; nfirst <= 5; nfirst += 3) {
      pinpool_t *pool;
      /* No thread cache: the completed block is the central bin's
       * newest, handed out next. */
      PP_OK(pinpool_create("events=simulated,sim_delay_us=0,tcache_bytes=0",
                           &pool));
      void *p, *q;
      PP_OK(pinpool_alloc(pool, sizes[k], &p));
      for (unsigned s = 1; s <= nfirst; s++)
        PP_OK(pinpool_record_stream(pool, p, s == 3 ? 4 + nfirst : s));
      PP_OK(pinpool_free(pool, p));
      PP_OK(pinpool_synchronize(pool));
      PP_OK(pinpool_alloc(pool, sizes[k], &q));
      PP_ASSERT(q == p, "the same block again (size %zu)", sizes[k]);
      pinpool_stats_t st;
      PP_STATS(pool, &st);
      uint64_t rec = st.events_recorded;
      PP_OK(pinpool_sim_submit(pool, 1, 300 * 1000 * 1000ull, NULL, NULL));
      PP_OK(pinpool_record_stream(pool, q, 3));
      PP_OK(pinpool_free(pool, q));
      PP_STATS(pool, &st);
      PP_ASSERT(st.events_recorded == rec + 1,
                "%u streams before: %llu events for one stream", nfirst,
                (unsigned long long)(st.events_recorded - rec));
      for (int i = 0; i < 100 && st.pending_blocks != 0; i++) {
        pp_sleep_ms(2);
        PP_OK(pinpool_process_events(pool));
        PP_STATS(pool, &st);
      }
      PP_ASSERT(st.pending_blocks == 0,
                "waited for a stream of the block's earlier use");
      PP_CHECK_CONSISTENT(pool);
      pinpool_destroy(pool);
    }
}

/* A block freed without recorded streams is cached at once. */
static void test_no_stream_caches_at_once(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated", &pool));
  void *p;
  PP_OK(pinpool_alloc(pool, 4096, &p));
  PP_OK(pinpool_free(pool, p));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 0 && st.events_recorded == 0, "no events");
  void *q;
  PP_OK(pinpool_alloc(pool, 4096, &q));
  PP_ASSERT(q == p, "thread cache should return the same block");
  PP_OK(pinpool_free(pool, q));
  pinpool_destroy(pool);
}

/* ---- Callbacks provider with controllable events ------------------------ */
typedef struct cb_event {
  _Atomic(int) state; /* 0 pending, 1 done, -1 error */
  struct cb_event *next;
} cb_event_t;

typedef struct cb_provider {
  pthread_mutex_t mu;
  cb_event_t *all;
  _Atomic(int) released, recorded;
  _Atomic(int) fail_record;
} cb_provider_t;

static int cbp_record(void *ctx, pinpool_stream_t s, void **ev) {
  cb_provider_t *cp = ctx;
  (void)s;
  if (atomic_load(&cp->fail_record))
    return PINPOOL_EDEVICE;
  cb_event_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return PINPOOL_ENOMEM;
  pthread_mutex_lock(&cp->mu);
  e->next = cp->all;
  cp->all = e;
  pthread_mutex_unlock(&cp->mu);
  atomic_fetch_add(&cp->recorded, 1);
  *ev = e;
  return 0;
}
static int cbp_query(void *ctx, void *ev) {
  (void)ctx;
  int s = atomic_load(&((cb_event_t *)ev)->state);
  return s < 0 ? PINPOOL_EDEVICE : s;
}
static int cbp_sync(void *ctx, void *ev) {
  (void)ctx;
  cb_event_t *e = ev;
  while (atomic_load(&e->state) == 0)
    pp_sleep_ms(1);
  return atomic_load(&e->state) < 0 ? PINPOOL_EDEVICE : 0;
}
static void cbp_release(void *ctx, void *ev) {
  (void)ev;
  atomic_fetch_add(&((cb_provider_t *)ctx)->released, 1);
}

typedef struct err_seen {
  _Atomic(int) count;
  void *block;
  int err;
} err_seen_t;

static void on_error(void *arg, int err, const char *msg, void *block) {
  err_seen_t *s = arg;
  (void)msg;
  s->block = block;
  s->err = err;
  atomic_fetch_add(&s->count, 1);
}

static void test_callbacks_and_event_error(void **state) {
  (void)state;
  cb_provider_t cp = {.all = NULL};
  pthread_mutex_init(&cp.mu, NULL);
  pinpool_events_t evt = {"test-callbacks", cbp_record,  cbp_query,
                          cbp_sync,         cbp_release, &cp};
  err_seen_t seen = {0};
  pinpool_hooks_t hooks = {NULL, &evt, on_error, &seen};
  pinpool_t *pool;
  /* events= is refused when a provider is given */
  PP_CHECK_RC(pinpool_create_ex("events=simulated", &hooks, &pool),
              PINPOOL_ECONFIG);
  pinpool_events_t bad = evt;
  bad.query = NULL;
  pinpool_hooks_t bad_hooks = {NULL, &bad, NULL, NULL};
  PP_CHECK_RC(pinpool_create_ex("", &bad_hooks, &pool), PINPOOL_EINVAL);
  PP_OK(pinpool_create_ex("tcache_bytes=0", &hooks, &pool));

  void *good, *faulty;
  PP_OK(pinpool_alloc(pool, 32768, &good));
  PP_OK(pinpool_alloc(pool, 32768, &faulty));
  PP_OK(pinpool_record_stream(pool, good, 1));
  PP_OK(pinpool_record_stream(pool, faulty, 2));
  PP_OK(pinpool_free(pool, good));
  PP_OK(pinpool_free(pool, faulty));
  PP_ASSERT(atomic_load(&cp.recorded) == 2, "two events recorded");
  PP_OK(pinpool_process_events(pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 2, "nothing completed yet");

  /* events in cp.all: newest first -> faulty's, then good's */
  pthread_mutex_lock(&cp.mu);
  cb_event_t *ef = cp.all, *eg = cp.all->next;
  pthread_mutex_unlock(&cp.mu);
  atomic_store(&ef->state, -1);
  atomic_store(&eg->state, 1);
  PP_OK(pinpool_process_events(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 1 && st.event_errors == 1 &&
                st.events_completed == 1,
            "pending %llu errors %llu completed %llu",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.event_errors,
            (unsigned long long)st.events_completed);
  PP_ASSERT(atomic_load(&seen.count) == 1 && seen.block == faulty &&
                seen.err == PINPOOL_EDEVICE,
            "error callback: count %d block %p err %d",
            atomic_load(&seen.count), seen.block, seen.err);
  /* The faulty block is never handed out again, synchronize does not wait
   * for it, and the accounting still balances. */
  PP_OK(pinpool_synchronize(pool));
  void *got[64];
  for (int i = 0; i < 64; i++) {
    PP_OK(pinpool_alloc(pool, 32768, &got[i]));
    PP_ASSERT(got[i] != faulty, "faulted block reused");
  }
  for (int i = 0; i < 64; i++)
    PP_OK(pinpool_free(pool, got[i]));
  PP_CHECK_CONSISTENT(pool);
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_bytes == 32768, "faulted block stays pending");

  /* A record that fails also keeps its block pending, reported. */
  void *norec;
  PP_OK(pinpool_alloc(pool, 32768, &norec));
  PP_OK(pinpool_record_stream(pool, norec, 3));
  atomic_store(&cp.fail_record, 1);
  PP_OK(pinpool_free(pool, norec));
  PP_STATS(pool, &st);
  PP_ASSERT(st.event_errors == 2 && atomic_load(&seen.count) == 2,
            "record failure reported");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_ASSERT(atomic_load(&cp.released) == 2,
            "every recorded event released "
            "(got %d)",
            atomic_load(&cp.released));
  for (cb_event_t *e = cp.all, *n; e != NULL; e = n) {
    n = e->next;
    free(e);
  }
  pthread_mutex_destroy(&cp.mu);
}

/* The events of cp, oldest first (cp.all is newest first): n of them. */
static cb_event_t **cbp_events(cb_provider_t *cp, int n) {
  cb_event_t **ev = calloc((size_t)n, sizeof *ev);
  PP_ASSERT(ev != NULL, "out of memory");
  pthread_mutex_lock(&cp->mu);
  int i = n;
  for (cb_event_t *e = cp->all; e != NULL && i > 0; e = e->next)
    ev[--i] = e;
  pthread_mutex_unlock(&cp->mu);
  PP_ASSERT(i == 0, "%d events missing", i);
  return ev;
}

static void cbp_free_all(cb_provider_t *cp) {
  for (cb_event_t *e = cp->all, *n; e != NULL; e = n) {
    n = e->next;
    free(e);
  }
  cp->all = NULL;
}

/* pinpool_process_events and pinpool_empty_cache reclaim every completed
 * event, now (docs/api.md), not one per stream and call: 300 blocks on one
 * stream whose events have all completed leave nothing pending after one
 * call (issue 37, S1: one call left 299). An event error behind the head of
 * a queue is counted and reported by that same call. */
static void test_process_reclaims_all(void **state) {
  (void)state;
  enum { N = 300 };
  for (int use_empty = 0; use_empty < 2; use_empty++) {
    cb_provider_t cp = {.all = NULL};
    pthread_mutex_init(&cp.mu, NULL);
    pinpool_events_t evt = {"test-callbacks", cbp_record,  cbp_query,
                            cbp_sync,         cbp_release, &cp};
    err_seen_t seen = {0};
    pinpool_hooks_t hooks = {NULL, &evt, on_error, &seen};
    pinpool_t *pool;
    PP_OK(pinpool_create_ex("tcache_bytes=0", &hooks, &pool));
    void **b = calloc(N + 3, sizeof *b);
    PP_ASSERT(b != NULL, "out of memory");
    /* Every allocation first: an allocation's miss reclaims too. */
    for (int i = 0; i < N + 3; i++)
      PP_OK(pinpool_alloc(pool, 4096, &b[i]));
    for (int i = 0; i < N; i++) {
      PP_OK(pinpool_record_stream(pool, b[i], 1));
      PP_OK(pinpool_free(pool, b[i]));
    }
    /* Stream 2: done, failed, done: the error is behind the head. */
    for (int i = N; i < N + 3; i++) {
      PP_OK(pinpool_record_stream(pool, b[i], 2));
      PP_OK(pinpool_free(pool, b[i]));
    }
    cb_event_t **ev = cbp_events(&cp, N + 3);
    for (int i = 0; i < N + 3; i++)
      atomic_store(&ev[i]->state, i == N + 1 ? -1 : 1);
    if (use_empty)
      PP_OK(pinpool_empty_cache(pool));
    else
      PP_OK(pinpool_process_events(pool));
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    const char *call = use_empty ? "empty_cache" : "process_events";
    PP_ASSERT(st.pending_blocks == 1 && st.events_completed == N + 2,
              "one %s left %llu blocks pending (1 expected: the failed "
              "one), %llu of %d events completed",
              call, (unsigned long long)st.pending_blocks,
              (unsigned long long)st.events_completed, N + 2);
    PP_ASSERT(st.event_errors == 1 && atomic_load(&seen.count) == 1 &&
                  seen.block == b[N + 1] && seen.err == PINPOOL_EDEVICE,
              "%s: the error behind the head: %llu counted, callback "
              "called %d times (block %p, expected %p)",
              call, (unsigned long long)st.event_errors,
              atomic_load(&seen.count), seen.block, b[N + 1]);
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
    free(ev);
    free(b);
    cbp_free_all(&cp);
    pthread_mutex_destroy(&cp.mu);
  }
}

/* A pool of `nstreams` streams, each with one freed block whose event the
 * test controls (cp's events, oldest first, in *ev_out): the blocks are
 * small (256 bytes) so that 10,000 of them stay cheap. */
static pinpool_t *many_streams(cb_provider_t *cp, pinpool_hooks_t *hooks,
                               int nstreams, cb_event_t ***ev_out) {
  pinpool_t *pool;
  PP_OK(pinpool_create_ex("tcache_bytes=0", hooks, &pool));
  void **b = calloc((size_t)nstreams, sizeof *b);
  PP_ASSERT(b != NULL, "out of memory");
  /* Every allocation first: each one is a miss, which would poll. */
  for (int i = 0; i < nstreams; i++)
    PP_OK(pinpool_alloc(pool, 256, &b[i]));
  for (int i = 0; i < nstreams; i++) {
    PP_OK(pinpool_record_stream(pool, b[i], (pinpool_stream_t)(1000 + i)));
    PP_OK(pinpool_free(pool, b[i]));
  }
  free(b);
  *ev_out = cbp_events(cp, nstreams);
  return pool;
}

/* Queue heads examined by `misses` allocations that miss (tcache_bytes=0:
 * every allocation goes to the central bins), each freed at once. */
static uint64_t polls_of_misses(pinpool_t *pool, int misses) {
  uint64_t before = pp_queue_polls;
  for (int i = 0; i < misses; i++) {
    void *p;
    PP_OK(pinpool_alloc(pool, 256, &p));
    PP_OK(pinpool_free(pool, p));
  }
  return pp_queue_polls - before;
}

/* A cache miss polls a bounded number of stream queues, however many
 * streams hold events (issue 38, 1: every miss polled every stream whose
 * head had not completed, 10x the cost per 10x streams). Count, don't
 * time: the queue heads a miss examines, at N and 10 N streams. Then the
 * misses alone (no process_events) reclaim every completed event within a
 * lap of the round-robin cursor, though one stream never completes
 * (invariant 7: a slow stream holds back nothing). */
static void test_miss_polls_flat(void **state) {
  (void)state;
  enum { N = 1000, MISSES = 200 };
  double per_miss[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    int nstreams = k == 0 ? N : 10 * N;
    cb_provider_t cp = {.all = NULL};
    pthread_mutex_init(&cp.mu, NULL);
    pinpool_events_t evt = {"test-callbacks", cbp_record,  cbp_query,
                            cbp_sync,         cbp_release, &cp};
    pinpool_hooks_t hooks = {NULL, &evt, NULL, NULL};
    cb_event_t **ev;
    pinpool_t *pool = many_streams(&cp, &hooks, nstreams, &ev);
    per_miss[k] = (double)polls_of_misses(pool, MISSES) / MISSES;
    PP_ASSERT(per_miss[k] <= PP_MISS_QUEUES,
              "a miss polled %.1f queues per miss with %d streams holding "
              "events (at most %d expected)",
              per_miss[k], nstreams, (int)PP_MISS_QUEUES);
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.pending_blocks == (uint64_t)nstreams, "nothing completed");
    if (k == 0) {
      /* Every event completes but the first stream's. */
      for (int i = 1; i < nstreams; i++)
        atomic_store(&ev[i]->state, 1);
      int misses = 0, bound = nstreams / PP_MISS_QUEUES + 2;
      for (; misses < bound; misses++) {
        PP_STATS(pool, &st);
        if (st.pending_blocks == 1)
          break;
        (void)polls_of_misses(pool, 1);
      }
      PP_STATS(pool, &st);
      PP_ASSERT(st.pending_blocks == 1 && st.events_completed == N - 1,
                "after %d misses: %llu blocks pending, %llu events "
                "completed (the misses' cursor did not reach every queue)",
                misses, (unsigned long long)st.pending_blocks,
                (unsigned long long)st.events_completed);
      atomic_store(&ev[0]->state, 1);
    } else {
      for (int i = 0; i < nstreams; i++)
        atomic_store(&ev[i]->state, 1);
    }
    PP_OK(pinpool_process_events(pool));
    PP_STATS(pool, &st);
    PP_ASSERT(st.pending_blocks == 0, "%llu pending after process_events",
              (unsigned long long)st.pending_blocks);
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
    free(ev);
    cbp_free_all(&cp);
    pthread_mutex_destroy(&cp.mu);
  }
  PP_ASSERT(per_miss[1] <= per_miss[0],
            "queues per miss grew with the streams: %.1f at %d, %.1f at %d",
            per_miss[0], N, per_miss[1], 10 * N);
}

/* background=1 reclaims without explicit calls. */
static void test_background(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=100,background=1,"
                       "poll_us=500",
                       &pool));
  void *p;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
  PP_OK(pinpool_record_stream(pool, p, 5));
  PP_OK(pinpool_free(pool, p));
  pinpool_stats_t st;
  for (int i = 0; i < 400; i++) {
    PP_STATS(pool, &st);
    if (st.pending_blocks == 0)
      break;
    pp_sleep_ms(5);
  }
  PP_ASSERT(st.pending_blocks == 0 && st.events_completed == 1,
            "background thread did not reclaim");
  pinpool_destroy(pool);
}

/* An event released before its stream reached it must not complete a later
 * one early. The pool releases such an event when a free recorded it but
 * found no memory to queue it (fault=queue:1, the block is then never
 * reused). The simulated provider used to pool its events: the next record
 * was handed the released one, and the stream's "done" for the old item,
 * queued behind a 200 ms copy, completed the new event at 200 ms although
 * a 1.5 s copy was queued ahead of it: a block handed out while its copy
 * still ran. */
static void test_event_released_unfinished(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=0,tcache_bytes=0,"
                       "fault=queue:1",
                       &pool));
  void *a, *b;
  PP_OK(pinpool_sim_submit(pool, 5, 200 * 1000000ull, NULL, NULL));
  PP_OK(pinpool_alloc(pool, 4096, &a));
  PP_OK(pinpool_record_stream(pool, a, 5));
  PP_OK(pinpool_free(pool, a)); /* its event recorded, not queued */
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.event_errors == 1 && st.pending_blocks == 1,
            "the unqueued event: %llu errors, %llu pending",
            (unsigned long long)st.event_errors,
            (unsigned long long)st.pending_blocks);
  PP_OK(pinpool_sim_submit(pool, 5, 1500 * 1000000ull, NULL, NULL));
  PP_OK(pinpool_alloc(pool, 4096, &b));
  PP_OK(pinpool_record_stream(pool, b, 5));
  PP_OK(pinpool_free(pool, b)); /* done after both copies: ~1.7 s */
  pp_sleep_ms(500);             /* the first copy and the old item passed */
  PP_OK(pinpool_process_events(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 2 && st.events_completed == 0,
            "b's event completed before the copy queued ahead of it: "
            "%llu pending, %llu events completed",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.events_completed);
  PP_OK(pinpool_synchronize(pool));
  PP_STATS(pool, &st);
  PP_ASSERT(st.pending_blocks == 1 && st.events_completed == 1,
            "after synchronize: %llu pending, %llu completed",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.events_completed);
  pinpool_destroy(pool);
}

/* empty_cache reclaims what completed, then releases idle memory. */
static void test_empty_cache_reclaims(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=0", &pool));
  void *p;
  PP_OK(pinpool_alloc(pool, 4 * MiB, &p));
  PP_OK(pinpool_record_stream(pool, p, 9));
  PP_OK(pinpool_free(pool, p));
  pinpool_stats_t st;
  for (int i = 0; i < 200; i++) {
    pp_sleep_ms(2);
    PP_OK(pinpool_empty_cache(pool));
    PP_STATS(pool, &st);
    if (st.reserved_bytes.current == 0)
      break;
  }
  PP_ASSERT(st.reserved_bytes.current == 0 && st.pending_blocks == 0,
            "reserved %llu pending %llu",
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)st.pending_blocks);
  pinpool_destroy(pool);
}

/* ---- Concurrency: producers on several streams, under TSAN/ASan --------- */
static pinpool_t *g_pool;

static void *worker(void *arg) {
  long id = (long)arg;
  uint64_t rng = pp_seed((uint64_t)id + 11);
  enum { N = 600 };
  copy_t *cs = calloc(N, sizeof *cs);
  int bad = 0;
  for (int i = 0; i < N; i++) {
    size_t n = pp_rand_size(&rng, 512, 256 * KiB);
    unsigned char *b;
    PP_OK(pinpool_alloc(g_pool, n, (void **)&b));
    unsigned char pat = (unsigned char)(pp_rand(&rng) | 1);
    memset(b, pat, n);
    cs[i] = (copy_t){b, n, pat, 0};
    pinpool_stream_t s = (pinpool_stream_t)(1 + pp_rand(&rng) % 4);
    PP_OK(pinpool_sim_submit(g_pool, s, 1000 * (pp_rand(&rng) % 50), run_copy,
                             &cs[i]));
    PP_OK(pinpool_record_stream(g_pool, b, s));
    if (i % 7 == 0)
      PP_OK(pinpool_record_stream(g_pool, b, 42));
    PP_OK(pinpool_free(g_pool, b));
    if (i % 97 == 0)
      PP_OK(pinpool_empty_cache(g_pool));
  }
  PP_OK(pinpool_synchronize(g_pool));
  for (int i = 0; i < N; i++)
    bad += atomic_load(&cs[i].result) != 1;
  free(cs);
  return (void *)(intptr_t)bad;
}

static void test_concurrent(void **state) {
  (void)state;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=20,background=1,"
                       "poll_us=300",
                       &g_pool));
  pthread_t t[3];
  for (long i = 0; i < 3; i++)
    pthread_create(&t[i], NULL, worker, (void *)i);
  intptr_t bad = 0;
  for (int i = 0; i < 3; i++) {
    void *r;
    pthread_join(t[i], &r);
    bad += (intptr_t)r;
  }
  PP_ASSERT(bad == 0, "%ld copies saw their block overwritten", (long)bad);
  PP_CHECK_CONSISTENT(g_pool);
  pinpool_stats_t st;
  PP_STATS(g_pool, &st);
  PP_ASSERT(st.events_completed == st.events_recorded && st.pending_blocks == 0,
            "recorded %llu completed %llu",
            (unsigned long long)st.events_recorded,
            (unsigned long long)st.events_completed);
  pinpool_destroy(g_pool);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_reuse_waits_for_stream),
      cmocka_unit_test(test_slow_stream_does_not_block_fast),
      cmocka_unit_test(test_multiple_streams),
      cmocka_unit_test(test_stream_set_reused_empty),
      cmocka_unit_test(test_no_stream_caches_at_once),
      cmocka_unit_test(test_callbacks_and_event_error),
      cmocka_unit_test(test_process_reclaims_all),
      cmocka_unit_test(test_miss_polls_flat),
      cmocka_unit_test(test_background),
      cmocka_unit_test(test_event_released_unfinished),
      cmocka_unit_test(test_empty_cache_reclaims),
      cmocka_unit_test(test_concurrent),
  };
  return pp_run_selected("test_streams", tests, sizeof tests / sizeof tests[0],
                         argc, argv);
}
