/* events=cuda: stream-ordered reuse with CUDA events, against the fake
 * driver's asynchronous streams.
 *
 * - A block freed while a (simulated) DMA on its stream still reads it is
 *   not handed out again until the DMA is done, and the DMA reads the data
 *   the block held at free time.
 * - Streams complete out of order: a block used only on a fast stream is
 *   reused while a slow stream still holds another.
 * - An event that fails (asynchronously, or at record) keeps its block
 *   pending forever, counts in stats.event_errors and reaches on_error.
 * - Events are pooled, created without timing, and every driver call comes
 *   with the pool's context, from any thread.
 *
 * "In flight" is a gate (cudatest.h) that holds the stream until the test
 * opens it: no test depends on timing. Needs pinpool_record_stream and
 * events=cuda; if this build of pinpool lacks them, the tests skip. */
#define _GNU_SOURCE
#include "cudatest.h"

#include <stdlib.h>

#define BLOCK (256 * KiB)
#define WAIT_MS 10000u

/* Skip unless the pool supports events=cuda. */
static void require_events(void) {
  CT_REQUIRE_FAKE();
  pinpool_t *pool = NULL;
  int rc = pinpool_create("events=cuda,device=0", &pool);
  if (rc == PINPOOL_ECONFIG) {
    print_message("[  SKIP    ] events=cuda not supported by this build: "
                  "%s\n",
                  pinpool_last_error());
    skip();
  }
  CT_RC(rc, 0);
  pinpool_destroy(pool);
}

static void fill(void *p, size_t n, unsigned seed) {
  unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    b[i] = (unsigned char)(i * 31u + seed);
}

static bool check(const void *p, size_t n, unsigned seed) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i] != (unsigned char)(i * 31u + seed))
      return false;
  return true;
}

static bool nothing_pending(pinpool_t *pool, void *arg) {
  (void)arg;
  pinpool_stats_t st;
  return pinpool_get_stats(pool, &st) == 0 && st.pending_blocks == 0;
}

static bool pending_is(pinpool_t *pool, void *arg) {
  pinpool_stats_t st;
  return pinpool_get_stats(pool, &st) == 0 &&
         st.pending_blocks == *(uint64_t *)arg;
}

#define ALLOC_UNTIL(pool, want, avoid, navoid)                                 \
  ct_alloc_until_((pool), BLOCK, (want), (avoid), (navoid), __FILE__, __LINE__)

/* ---- A DMA in flight -------------------------------------------------- */
typedef struct dma {
  const void *src;
  void *dst;
  size_t n;
} dma_t;

static void dma_copy(void *arg) {
  dma_t *d = arg;
  memcpy(d->dst, d->src, d->n);
}

static void reuse_waits_for_dma(const char *conf) {
  ct_ctx_enter();
  CUstream a = ct_new_stream();
  pinpool_t *pool = CT_CREATE(conf);

  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  fill(blk, BLOCK, 7);
  unsigned char *seen = malloc(BLOCK);
  CT_ASSERT(seen != NULL, "malloc");
  memset(seen, 0, BLOCK);
  dma_t d = {blk, seen, BLOCK};
  ct_gate_t *gate = ct_gate_new(dma_copy, &d);
  ct_gate_queue(gate, a); /* the "DMA" reads blk once the gate opens */

  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)a));
  CT_OK(pinpool_free(pool, blk));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 1, "pending_blocks %llu",
            (unsigned long long)st.pending_blocks);
  CT_ASSERT(st.events_recorded == 1, "events_recorded %llu",
            (unsigned long long)st.events_recorded);

  /* While the DMA is held, no allocation may return blk. Scribble on what
   * we get: handing out blk early would corrupt what the DMA reads. */
  void *got[64];
  for (int i = 0; i < 64; i++) {
    CT_OK(pinpool_alloc(pool, BLOCK, &got[i]));
    CT_ASSERT(got[i] != blk, "block handed out while its DMA is in flight");
    memset(got[i], 0xee, BLOCK);
    if (i % 8 == 0)
      CT_OK(pinpool_process_events(pool));
  }
  for (int i = 0; i < 64; i++)
    CT_OK(pinpool_free(pool, got[i]));
  CT_ASSERT(!ct_gate_done(gate), "the gate opened by itself");
  CT_ASSERT(ct_stats(pool).pending_blocks == 1, "blk left PENDING early");

  ct_gate_open(gate);
  CT_OK(pinpool_synchronize(pool));
  st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 0, "still pending after synchronize");
  CT_ASSERT(st.events_completed == 1, "events_completed %llu",
            (unsigned long long)st.events_completed);
  CT_ASSERT(check(seen, BLOCK, 7), "the DMA read overwritten data");

  /* Now blk is an ordinary cached block again. */
  CT_ASSERT(ALLOC_UNTIL(pool, blk, NULL, 0),
            "blk never came back after its DMA completed");
  CT_OK(pinpool_validate(pool));

  ct_gate_free(gate);
  free(seen);
  pinpool_destroy(pool);
  CT_ASSERT(ct_cu.stream_destroy(a) == CUDA_SUCCESS, "cuStreamDestroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
  CT_FAKE_BALANCED();
}

static void test_reuse_waits_for_dma(void **state) {
  (void)state;
  require_events();
  reuse_waits_for_dma("backend=cuda,device=0,events=cuda");
  reuse_waits_for_dma("backend=cuda-register,device=0,events=cuda");
  /* Host memory with CUDA events works too. */
  reuse_waits_for_dma("backend=host,device=0,events=cuda");
}

/* The same with stream 0 (the legacy default stream). */
static void test_default_stream(void **state) {
  (void)state;
  require_events();
  ct_ctx_enter();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0,events=cuda");
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  ct_gate_t *gate = ct_gate_new(NULL, NULL);
  ct_gate_queue(gate, NULL);
  CT_OK(pinpool_record_stream(pool, blk, 0));
  CT_OK(pinpool_free(pool, blk));
  for (int i = 0; i < 8; i++) {
    CT_OK(pinpool_process_events(pool));
    CT_ASSERT(ct_stats(pool).pending_blocks == 1, "stream 0 event ignored");
  }
  ct_gate_open(gate);
  CT_ASSERT(ct_wait_until(pool, nothing_pending, NULL, WAIT_MS),
            "stream 0 event never completed");
  ct_gate_free(gate);
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

/* ---- Out of order across streams ------------------------------------- */
static void test_streams_out_of_order(void **state) {
  (void)state;
  require_events();
  ct_ctx_enter();
  CUstream slow = ct_new_stream(), fast = ct_new_stream();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0,events=cuda");
  ct_gate_t *gate = ct_gate_new(NULL, NULL);
  ct_gate_queue(gate, slow); /* slow lags until the gate opens */

  void *a = NULL, *b = NULL, *both = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &a));
  CT_OK(pinpool_alloc(pool, BLOCK, &b));
  CT_OK(pinpool_alloc(pool, BLOCK, &both));
  CT_OK(pinpool_record_stream(pool, a, (pinpool_stream_t)slow));
  CT_OK(pinpool_record_stream(pool, b, (pinpool_stream_t)fast));
  CT_OK(pinpool_record_stream(pool, both, (pinpool_stream_t)fast));
  CT_OK(pinpool_record_stream(pool, both, (pinpool_stream_t)slow));
  CT_OK(pinpool_record_stream(pool, both, (pinpool_stream_t)fast)); /* once */
  /* a first: a single FIFO would make b wait behind it. */
  CT_OK(pinpool_free(pool, a));
  CT_OK(pinpool_free(pool, both));
  CT_OK(pinpool_free(pool, b));
  CT_ASSERT(ct_stats(pool).events_recorded == 4, "events_recorded %llu",
            (unsigned long long)ct_stats(pool).events_recorded);

  uint64_t two = 2;
  CT_ASSERT(ct_wait_until(pool, pending_is, &two, WAIT_MS),
            "the fast stream's block was held back by the slow stream");
  /* b is reusable now; a and both are not. */
  void *lagging[2] = {a, both};
  CT_ASSERT(ALLOC_UNTIL(pool, b, lagging, 2),
            "the fast stream's block did not come back");
  CT_ASSERT(ct_stats(pool).pending_blocks == 2,
            "lagging blocks released early");

  ct_gate_open(gate);
  CT_OK(pinpool_synchronize(pool));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 0 && st.events_completed == 4,
            "pending %llu, completed %llu",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.events_completed);
  CT_ASSERT(st.reclaim.count == 3, "reclaim.count %llu",
            (unsigned long long)st.reclaim.count);
  CT_OK(pinpool_validate(pool));
  ct_gate_free(gate);
  pinpool_destroy(pool);
  CT_ASSERT(ct_cu.stream_destroy(slow) == CUDA_SUCCESS, "destroy");
  CT_ASSERT(ct_cu.stream_destroy(fast) == CUDA_SUCCESS, "destroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

/* ---- Event errors ------------------------------------------------------- */
typedef struct errlog {
  pthread_mutex_t mu;
  int calls;
  int err;
  void *block;
  char msg[256];
} errlog_t;

static void on_error(void *arg, int err, const char *msg, void *block) {
  errlog_t *l = arg;
  pthread_mutex_lock(&l->mu);
  l->calls++;
  l->err = err;
  l->block = block;
  (void)snprintf(l->msg, sizeof l->msg, "%s", msg != NULL ? msg : "");
  pthread_mutex_unlock(&l->mu);
}

static bool one_error(pinpool_t *pool, void *arg) {
  (void)arg;
  pinpool_stats_t st;
  return pinpool_get_stats(pool, &st) == 0 && st.event_errors == 1;
}

/* `arm` makes the next event fail; the block must never come back. */
static void event_error(void (*arm)(void), const char *needle) {
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  errlog_t log = {.calls = 0};
  pthread_mutex_init(&log.mu, NULL);
  pinpool_hooks_t hooks = {NULL, NULL, on_error, &log};
  pinpool_t *pool = CT_CREATE_EX("backend=cuda,device=0,events=cuda", &hooks);
  void *blk = NULL, *ok = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  CT_OK(pinpool_alloc(pool, BLOCK, &ok));
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)s));
  CT_OK(pinpool_record_stream(pool, ok, (pinpool_stream_t)s));
  arm();
  CT_OK(pinpool_free(pool, blk));
  CT_OK(pinpool_free(pool, ok));

  CT_ASSERT(ct_wait_until(pool, one_error, NULL, WAIT_MS),
            "the event error was not reported");
  CT_OK(pinpool_synchronize(pool)); /* returns despite the failed block */
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.event_errors == 1, "event_errors %llu",
            (unsigned long long)st.event_errors);
  pthread_mutex_lock(&log.mu);
  CT_ASSERT(log.calls == 1, "on_error called %d times", log.calls);
  CT_ASSERT(log.block == blk, "on_error got block %p, not %p", log.block, blk);
  CT_ASSERT(log.err < 0, "on_error got err %d", log.err);
  CT_ASSERT(strstr(log.msg, needle) != NULL, "on_error message \"%s\"",
            log.msg);
  pthread_mutex_unlock(&log.mu);

  /* The good block comes back; the failed one never does. */
  CT_ASSERT(ALLOC_UNTIL(pool, ok, &blk, 1),
            "the block with a good event did not come back");
  CT_ASSERT(!ALLOC_UNTIL(pool, NULL, &blk, 1), "unreachable");
  CT_OK(pinpool_empty_cache(pool));
  CT_ASSERT(ct_stats(pool).reserved_bytes.current > 0,
            "the segment of the failed block was released");
  CT_OK(pinpool_validate(pool));
  pinpool_destroy(pool); /* releases it with everything else */
  CT_ASSERT(ct_cu.stream_destroy(s) == CUDA_SUCCESS, "destroy");
  pthread_mutex_destroy(&log.mu);
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

static void arm_async_fault(void) {
  CT_ASSERT(ct_fake.fail_event(1, CUDA_ERROR_LAUNCH_FAILED) == 0, "arm");
}
static void arm_query_error(void) {
  CT_ASSERT(ct_fake.inject("cuEventQuery", 1, CUDA_ERROR_ILLEGAL_ADDRESS) == 0,
            "arm");
}
static void arm_record_error(void) {
  CT_ASSERT(ct_fake.inject("cuEventRecord", 1, CUDA_ERROR_LAUNCH_FAILED) == 0,
            "arm");
}

static void test_event_error(void **state) {
  (void)state;
  require_events();
  /* The device faulted while the block was in use. */
  event_error(arm_async_fault, "CUDA_ERROR_LAUNCH_FAILED");
  ct_fake.reset();
  /* cuEventQuery itself failed. */
  event_error(arm_query_error, "CUDA_ERROR_ILLEGAL_ADDRESS");
  ct_fake.reset();
  /* The event could not even be recorded. */
  event_error(arm_record_error, "cuEventRecord");
}

/* ---- Pooling, flags, threads ------------------------------------------ */
static void test_events_pooled(void **state) {
  (void)state;
  require_events();
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0,events=cuda");
  for (int i = 0; i < 200; i++) {
    void *p = NULL;
    CT_OK(pinpool_alloc(pool, 4096 << (i % 4), &p));
    CT_OK(pinpool_record_stream(pool, p, (pinpool_stream_t)s));
    CT_OK(pinpool_free(pool, p));
    if (i % 10 == 9)
      CT_OK(pinpool_synchronize(pool));
  }
  CT_OK(pinpool_synchronize(pool));
  long long created = ct_fake.get("calls:cuEventCreate");
  CT_ASSERT(created > 0 && created <= 10,
            "%lld cuEventCreate calls for 200 frees", created);
  CT_FAKE_EQ("calls:cuEventRecord", 200);
  CT_FAKE_EQ("last_event_flags", CU_EVENT_DISABLE_TIMING);
  CT_FAKE_EQ("live_events", created);
  pinpool_destroy(pool);
  CT_FAKE_EQ("live_events", 0);
  CT_ASSERT(ct_cu.stream_destroy(s) == CUDA_SUCCESS, "destroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

typedef struct ev_worker {
  pinpool_t *pool;
  CUstream streams[3];
  pthread_t tid;
  unsigned seed;
  int failures;
} ev_worker_t;

/* Threads with no context record, free, reallocate and poll at once. */
static void *ev_worker_main(void *arg) {
  ev_worker_t *w = arg;
  for (int it = 0; it < 300; it++) {
    void *p = NULL;
    size_t size = (size_t)512 << (rand_r(&w->seed) % 10);
    if (pinpool_alloc(w->pool, size, &p) != 0) {
      w->failures++;
      continue;
    }
    memset(p, it & 0xff, size);
    unsigned k = rand_r(&w->seed) % 4; /* 0..3 streams */
    for (unsigned j = 0; j < k; j++)
      if (pinpool_record_stream(w->pool, p,
                                (pinpool_stream_t)w->streams[j % 3]) != 0)
        w->failures++;
    if (pinpool_free(w->pool, p) != 0)
      w->failures++;
    if (it % 16 == 0 && pinpool_process_events(w->pool) != 0)
      w->failures++;
  }
  return NULL;
}

static void test_events_from_threads(void **state) {
  (void)state;
  require_events();
  ct_ctx_enter();
  CUstream s[3] = {ct_new_stream(), ct_new_stream(), NULL};
  CT_ASSERT(ct_fake.stream_delay(s[0], 50) == 0, "delay");
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0,events=cuda,background=1,"
                              "poll_us=200");
  ev_worker_t w[4];
  for (int i = 0; i < 4; i++) {
    w[i] = (ev_worker_t){pool, {s[0], s[1], s[2]}, 0, (unsigned)i + 11u, 0};
    CT_ASSERT(pthread_create(&w[i].tid, NULL, ev_worker_main, &w[i]) == 0,
              "pthread_create");
  }
  for (int i = 0; i < 4; i++)
    (void)pthread_join(w[i].tid, NULL);
  for (int i = 0; i < 4; i++)
    CT_ASSERT(w[i].failures == 0, "thread %d: %d failed calls", i,
              w[i].failures);
  CT_OK(pinpool_synchronize(pool));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 0 && st.event_errors == 0,
            "pending %llu, errors %llu", (unsigned long long)st.pending_blocks,
            (unsigned long long)st.event_errors);
  CT_ASSERT(st.events_completed == st.events_recorded,
            "recorded %llu, completed %llu",
            (unsigned long long)st.events_recorded,
            (unsigned long long)st.events_completed);
  CT_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  CT_ASSERT(ct_cu.stream_destroy(s[0]) == CUDA_SUCCESS, "destroy");
  CT_ASSERT(ct_cu.stream_destroy(s[1]) == CUDA_SUCCESS, "destroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

int main(void) {
  ct_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_reuse_waits_for_dma, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_default_stream, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_streams_out_of_order, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_event_error, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_events_pooled, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_events_from_threads, ct_setup,
                                      ct_teardown),
  };
  return cmocka_run_group_tests_name("cuda_events", tests, NULL, NULL);
}
