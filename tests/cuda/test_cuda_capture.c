/* events=cuda and CUDA graph capture (docs/cuda.md, "Graph capture"),
 * against the fake driver's capture state.
 *
 * - record_stream on a capturing stream records no event there (the fake
 *   counts a cuEventRecord on a capturing stream: captured_records, which
 *   every test's CT_FAKE_CLEAN requires to be 0); the block is tied to the
 *   capture and is not reused, even after the capture ended, until
 *   pinpool_graph_release; then it is reused.
 * - A block freed while one of its streams captures is parked, and the
 *   event for that stream's earlier work is recorded at the release: the
 *   block still waits for the DMA queued before the capture began.
 * - pinpool_stream_graphs_release releases by stream; a block used on an
 *   ordinary stream too still waits for that stream's event.
 * - Reclaim (process_events, synchronize, the background thread) while
 *   other threads, or the reclaiming thread itself, capture in each mode
 *   (global, thread-local, relaxed) breaks no capture: the fake fails a
 *   cuEventQuery the thread's mode forbids and invalidates the capture,
 *   and counts it (capture_violations, also 0 in CT_FAKE_CLEAN).
 * - Several threads capture, tie, free and release at once.
 * - Bad input: unknown capture id, stream never seen, NULL pool or
 *   out-pointers, a pool without capture support, stream 0 during a
 *   capture: an error, and nothing changes.
 *
 * Needs the fake (its control API and capture entry points); with a real
 * driver the tests skip (scripts/gpu-check.sh exercises capture on a
 * device through pp_gpu_bench). */
#define _GNU_SOURCE
#include "cudatest.h"

#include <stdatomic.h>
#include <stdlib.h>

#define BLOCK (256 * KiB)
#define WAIT_MS 10000u

static void require_capture(void) {
  CT_REQUIRE_FAKE();
  if (ct_cu.begin_capture == NULL || ct_cu.end_capture == NULL ||
      ct_cu.graph_destroy == NULL || ct_cu.exchange_mode == NULL) {
    print_message("[  SKIP    ] the driver lacks graph capture\n");
    skip();
  }
}

/* Begin a capture on s; returns its id (through pinpool, as a user would
 * learn it). */
static uint64_t begin_(pinpool_t *pool, CUstream s, int mode, const char *file,
                       int line) {
  if (ct_cu.begin_capture(s, mode) != CUDA_SUCCESS) {
    print_error("ERROR: cuStreamBeginCapture failed\n");
    _fail(file, line);
  }
  int capturing = -1;
  uint64_t id = 0;
  ct_rc_(pinpool_stream_capture(pool, (pinpool_stream_t)s, &capturing, &id), 0,
         "pinpool_stream_capture", file, line);
  if (capturing != 1 || id == 0) {
    print_error("ERROR: capturing %d, id %llu\n", capturing,
                (unsigned long long)id);
    _fail(file, line);
  }
  return id;
}
#define BEGIN(pool, s, mode) begin_((pool), (s), (mode), __FILE__, __LINE__)

/* End the capture on s (it must not have been invalidated) and destroy
 * the graph. */
static void end_(CUstream s, const char *file, int line) {
  CUgraph g = NULL;
  CUresult r = ct_cu.end_capture(s, &g);
  if (r != CUDA_SUCCESS || g == NULL) {
    print_error("ERROR: cuStreamEndCapture returned %d (901: the capture "
                "was invalidated)\n",
                r);
    _fail(file, line);
  }
  (void)ct_cu.graph_destroy(g);
}
#define END(s) end_((s), __FILE__, __LINE__)

/* blk is not handed out (a graph holds it) / comes back. */
#define NEVER(pool, blk)                                                       \
  (void)ct_alloc_until_((pool), BLOCK, NULL, (void *const[]){(blk)}, 1,        \
                        __FILE__, __LINE__)
#define COMES_BACK(pool, blk)                                                  \
  ct_alloc_until_((pool), BLOCK, (blk), NULL, 0, __FILE__, __LINE__)

/* A test's end, in the order the checks need: the pool is consistent and
 * the fake saw no bad call while the pool lived (no background thread
 * runs, as CT_FAKE_CLEAN wants); once the pool and the streams are gone,
 * the driver holds nothing. */
static void finish_(pinpool_t *pool, const CUstream *s, size_t ns,
                    const char *file, int line) {
  ct_rc_(pinpool_validate(pool), 0, "pinpool_validate(pool)", file, line);
  ct_fake_clean_(file, line);
  pinpool_destroy(pool);
  for (size_t i = 0; i < ns; i++)
    if (ct_cu.stream_destroy(s[i]) != CUDA_SUCCESS) {
      print_error("ERROR: cuStreamDestroy of stream %zu failed\n", i);
      _fail(file, line);
    }
  ct_fake_balanced_(file, line);
  ct_ctx_leave();
}
#define FINISH(pool, ...)                                                      \
  finish_((pool), (const CUstream[]){__VA_ARGS__},                             \
          sizeof((CUstream[]){__VA_ARGS__}) / sizeof(CUstream), __FILE__,      \
          __LINE__)

/* A snapshot names the capture that holds a block ("graphs", only on a
 * block tied to one), or, with want false, names it nowhere. */
static void graphs_in_snapshot(pinpool_t *pool, uint64_t id, bool want) {
  char *text = NULL;
  size_t len = 0;
  CT_OK(pinpool_snapshot_write_mem(pool, &text, &len,
                                   PINPOOL_SNAPSHOT_NO_SYMBOLS));
  char key[64];
  (void)snprintf(key, sizeof key, "\"graphs\":[\"0x%llx\"]",
                 (unsigned long long)id);
  bool found = strstr(text, key) != NULL;
  pinpool_snapshot_free(text);
  CT_ASSERT(found == want, "snapshot %s %s", want ? "lacks" : "still has", key);
}

/* ---- A block recorded during a capture ---------------------------------- */
static void tied_until_release(int mode) {
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0");
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));

  uint64_t id = BEGIN(pool, s, mode);
  long long records = ct_fake.get("calls:cuEventRecord");
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)s));
  CT_OK(pinpool_free(pool, blk));
  /* Nothing recorded at all: not on the capturing stream, nowhere. */
  CT_FAKE_EQ("calls:cuEventRecord", records);
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 1 && st.graph_held_blocks == 1 &&
                st.graph_held_bytes == st.pending_bytes,
            "pending %llu, graph-held %llu",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.graph_held_blocks);
  CT_ASSERT(st.events_recorded == 0, "events_recorded %llu",
            (unsigned long long)st.events_recorded);
  /* synchronize does not wait for the graph (it would wait forever). */
  CT_OK(pinpool_synchronize(pool));
  NEVER(pool, blk);
  END(s);
  /* The capture ended, the graph may still be replayed: still held. */
  CT_OK(pinpool_synchronize(pool));
  NEVER(pool, blk);
  CT_OK(pinpool_validate(pool));
  graphs_in_snapshot(pool, id, true);

  CT_OK(pinpool_graph_release(pool, id));
  CT_OK(pinpool_synchronize(pool));
  st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 0 && st.graph_held_blocks == 0 &&
                st.graph_held_bytes == 0,
            "pending %llu after the release",
            (unsigned long long)st.pending_blocks);
  CT_ASSERT(COMES_BACK(pool, blk), "blk never came back after the release");
  graphs_in_snapshot(pool, id, false);
  /* Released: the id is unknown now. */
  CT_RC(pinpool_graph_release(pool, id), PINPOOL_EINVAL);
  CT_ERROR_HAS("unknown");
  FINISH(pool, s);
}

static void test_record_in_capture(void **state) {
  (void)state;
  require_capture();
  tied_until_release(CU_STREAM_CAPTURE_MODE_GLOBAL);
  tied_until_release(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  tied_until_release(CU_STREAM_CAPTURE_MODE_RELAXED);
}

/* Freed (still ALLOCATED when the capture ended, freed after): the tie
 * alone holds it; released while still allocated: no hold at all. */
static void test_tie_outlives_capture(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0");
  void *a = NULL, *b = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &a));
  CT_OK(pinpool_alloc(pool, BLOCK, &b));
  uint64_t id1 = BEGIN(pool, s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CT_OK(pinpool_record_stream(pool, a, (pinpool_stream_t)s));
  CT_OK(pinpool_record_stream(pool, a, (pinpool_stream_t)s)); /* once */
  CT_OK(pinpool_record_stream(pool, b, (pinpool_stream_t)s));
  END(s);
  CT_OK(pinpool_free(pool, a)); /* after the capture: held by its graph */
  CT_ASSERT(ct_stats(pool).graph_held_blocks == 1, "a not held");
  NEVER(pool, a);
  /* Release while b is still allocated: b's tie is forgotten. */
  CT_OK(pinpool_stream_graphs_release(pool, (pinpool_stream_t)s));
  CT_RC(pinpool_stream_graphs_release(pool, (pinpool_stream_t)s),
        PINPOOL_EINVAL);
  CT_ERROR_HAS("no capture is known");
  CT_RC(pinpool_graph_release(pool, id1), PINPOOL_EINVAL);
  CT_OK(pinpool_free(pool, b));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.graph_held_blocks == 0, "b held by a released capture");
  CT_OK(pinpool_synchronize(pool));
  CT_ASSERT(ct_stats(pool).pending_blocks == 0, "still pending");
  CT_ASSERT(COMES_BACK(pool, a), "a never came back");
  CT_ASSERT(COMES_BACK(pool, b), "b never came back");
  FINISH(pool, s);
}

/* ---- A block freed while its stream captures ---------------------------- */
static void test_free_during_capture(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0");
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  /* A DMA on s, queued before the capture, still reads blk. */
  ct_gate_t *gate = ct_gate_new(NULL, NULL);
  ct_gate_queue(gate, s);
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)s));
  uint64_t id = BEGIN(pool, s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CT_OK(pinpool_free(pool, blk)); /* s captures: nothing recorded on it */
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.graph_held_blocks == 1 && st.events_recorded == 0,
            "graph-held %llu, events %llu",
            (unsigned long long)st.graph_held_blocks,
            (unsigned long long)st.events_recorded);
  END(s);
  CT_OK(pinpool_graph_release(pool, id));
  /* Now the event is recorded on s: after the DMA, which still runs. */
  st = ct_stats(pool);
  CT_ASSERT(st.graph_held_blocks == 0 && st.events_recorded == 1 &&
                st.pending_blocks == 1,
            "graph-held %llu, events %llu, pending %llu",
            (unsigned long long)st.graph_held_blocks,
            (unsigned long long)st.events_recorded,
            (unsigned long long)st.pending_blocks);
  NEVER(pool, blk);
  CT_OK(pinpool_process_events(pool));
  CT_ASSERT(ct_stats(pool).pending_blocks == 1, "left PENDING before the DMA");
  ct_gate_open(gate);
  CT_OK(pinpool_synchronize(pool));
  CT_ASSERT(ct_stats(pool).pending_blocks == 0, "still pending");
  CT_ASSERT(COMES_BACK(pool, blk), "blk never came back");
  ct_gate_free(gate);
  FINISH(pool, s);
}

/* Used on an ordinary stream (a DMA in flight) and in a capture on
 * another: after the release it still waits for the ordinary stream. Two
 * captures hold it: it goes only when both are released. */
static void test_mixed_uses(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream a = ct_new_stream(), c1 = ct_new_stream(), c2 = ct_new_stream();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0");
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  ct_gate_t *gate = ct_gate_new(NULL, NULL);
  ct_gate_queue(gate, a);
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)a));
  uint64_t id1 = BEGIN(pool, c1, CU_STREAM_CAPTURE_MODE_GLOBAL);
  uint64_t id2 = BEGIN(pool, c2, CU_STREAM_CAPTURE_MODE_RELAXED);
  CT_ASSERT(id1 != id2, "capture ids %llu %llu", (unsigned long long)id1,
            (unsigned long long)id2);
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)c1));
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)c2));
  END(c1);
  END(c2);
  CT_OK(pinpool_free(pool, blk));
  CT_ASSERT(ct_stats(pool).events_recorded == 0, "recorded before release");
  CT_OK(pinpool_graph_release(pool, id2));
  CT_ASSERT(ct_stats(pool).graph_held_blocks == 1, "released by one of two");
  NEVER(pool, blk);
  CT_OK(pinpool_stream_graphs_release(pool, (pinpool_stream_t)c1));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.graph_held_blocks == 0 && st.events_recorded == 1,
            "graph-held %llu, events %llu",
            (unsigned long long)st.graph_held_blocks,
            (unsigned long long)st.events_recorded);
  NEVER(pool, blk); /* a's DMA is still held */
  ct_gate_open(gate);
  CT_OK(pinpool_synchronize(pool));
  CT_ASSERT(COMES_BACK(pool, blk), "blk never came back");
  ct_gate_free(gate);
  FINISH(pool, a, c1, c2);
}

/* A block used on more streams than settle keeps on its stack (16), one
 * of them capturing at the free. */
static void test_many_streams(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  enum { NS = 20 };
  CUstream s[NS];
  for (int i = 0; i < NS; i++)
    s[i] = ct_new_stream();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0");
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  for (int i = 0; i < NS; i++)
    CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)s[i]));
  (void)BEGIN(pool, s[NS - 1], CU_STREAM_CAPTURE_MODE_GLOBAL);
  CT_OK(pinpool_free(pool, blk));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.graph_held_blocks == 1 && st.events_recorded == 0,
            "graph-held %llu, events %llu",
            (unsigned long long)st.graph_held_blocks,
            (unsigned long long)st.events_recorded);
  END(s[NS - 1]);
  CT_OK(pinpool_stream_graphs_release(pool, (pinpool_stream_t)s[NS - 1]));
  CT_OK(pinpool_synchronize(pool));
  st = ct_stats(pool);
  CT_ASSERT(st.events_recorded == NS && st.pending_blocks == 0,
            "events %llu, pending %llu", (unsigned long long)st.events_recorded,
            (unsigned long long)st.pending_blocks);
  CT_ASSERT(COMES_BACK(pool, blk), "blk never came back");
  finish_(pool, s, NS, __FILE__, __LINE__);
}

/* ---- Reclaim while captures run --------------------------------------- */
typedef struct capturer {
  CUstream s;
  int mode;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int phase; /* 0 start, 1 capturing, 2 end it, 3 ended */
  CUresult end_rc;
} capturer_t;

static void *capture_main(void *arg) {
  capturer_t *c = arg;
  CUcontext ctx = NULL;
  (void)ct_cu.retain(&ctx, 0);
  (void)ct_cu.push(ctx);
  CUresult r = ct_cu.begin_capture(c->s, c->mode);
  (void)pthread_mutex_lock(&c->mu);
  c->phase = r == CUDA_SUCCESS ? 1 : 3;
  c->end_rc = r;
  (void)pthread_cond_broadcast(&c->cv);
  while (c->phase == 1)
    (void)pthread_cond_wait(&c->cv, &c->mu);
  (void)pthread_mutex_unlock(&c->mu);
  if (r == CUDA_SUCCESS) {
    CUgraph g = NULL;
    r = ct_cu.end_capture(c->s, &g);
    if (g != NULL)
      (void)ct_cu.graph_destroy(g);
  }
  (void)pthread_mutex_lock(&c->mu);
  c->end_rc = r;
  c->phase = 3;
  (void)pthread_mutex_unlock(&c->mu);
  CUcontext popped = NULL;
  (void)ct_cu.pop(&popped);
  (void)ct_cu.release(0);
  return NULL;
}

/* Pending blocks on stream a; another thread captures on its own stream in
 * `mode` (or this thread does, own != 0); reclaim polls and waits on the
 * events. No capture may be broken. */
static void reclaim_during_capture(const char *conf, int mode, bool own) {
  ct_ctx_enter();
  CUstream a = ct_new_stream(), cs = ct_new_stream();
  pinpool_t *pool = CT_CREATE(conf);
  enum { N = 8 };
  void *blk[N];
  ct_gate_t *gate = ct_gate_new(NULL, NULL);
  ct_gate_queue(gate, a);
  for (int i = 0; i < N; i++) {
    CT_OK(pinpool_alloc(pool, BLOCK, &blk[i]));
    CT_OK(pinpool_record_stream(pool, blk[i], (pinpool_stream_t)a));
    CT_OK(pinpool_free(pool, blk[i]));
  }
  capturer_t c = {.s = cs, .mode = mode};
  (void)pthread_mutex_init(&c.mu, NULL);
  (void)pthread_cond_init(&c.cv, NULL);
  pthread_t t;
  if (own) {
    CT_ASSERT(ct_cu.begin_capture(cs, mode) == CUDA_SUCCESS, "begin");
  } else {
    CT_ASSERT(pthread_create(&t, NULL, capture_main, &c) == 0, "thread");
    (void)pthread_mutex_lock(&c.mu);
    while (c.phase == 0)
      (void)pthread_cond_wait(&c.cv, &c.mu);
    (void)pthread_mutex_unlock(&c.mu);
    CT_ASSERT(c.phase == 1, "cuStreamBeginCapture: %d", c.end_rc);
  }
  /* Poll (queries) while the DMA is held, then wait (synchronize). */
  for (int i = 0; i < 20; i++) {
    CT_OK(pinpool_process_events(pool));
    void *p = NULL;
    CT_OK(pinpool_alloc(pool, BLOCK, &p)); /* the slow path reclaims too */
    CT_OK(pinpool_free(pool, p));
  }
  ct_gate_open(gate);
  CT_OK(pinpool_synchronize(pool));
  CT_FAKE_EQ("capture_violations", 0); /* no query broke the capture */
  CT_ASSERT(ct_stats(pool).pending_blocks == 0, "still pending");
  if (own) {
    END(cs);
  } else {
    (void)pthread_mutex_lock(&c.mu);
    c.phase = 2;
    (void)pthread_cond_broadcast(&c.cv);
    (void)pthread_mutex_unlock(&c.mu);
    (void)pthread_join(t, NULL);
    CT_ASSERT(c.end_rc == CUDA_SUCCESS,
              "the capture was broken: cuStreamEndCapture returned %d",
              c.end_rc);
  }
  CT_FAKE_EQ("capture_violations", 0);
  ct_gate_free(gate);
  (void)pthread_mutex_destroy(&c.mu);
  (void)pthread_cond_destroy(&c.cv);
  CT_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  CT_FAKE_CLEAN();
  CT_ASSERT(ct_cu.stream_destroy(a) == CUDA_SUCCESS &&
                ct_cu.stream_destroy(cs) == CUDA_SUCCESS,
            "cuStreamDestroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

static void test_reclaim_during_capture(void **state) {
  (void)state;
  require_capture();
  static const int modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL,
                              CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                              CU_STREAM_CAPTURE_MODE_RELAXED};
  for (int m = 0; m < 3; m++) {
    reclaim_during_capture("events=cuda,device=0", modes[m], false);
    reclaim_during_capture("events=cuda,device=0", modes[m], true);
    reclaim_during_capture("events=cuda,device=0,background=1,poll_us=50",
                           modes[m], false);
  }
}

/* The fake itself: an unsafe call in a forbidding mode breaks a capture
 * (so the test above would see it). */
static void test_fake_detects_violation(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  CT_ASSERT(ct_cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
                CUDA_SUCCESS,
            "begin");
  __typeof__(&cuEventCreate) create = NULL;
  __typeof__(&cuEventQuery) query = NULL;
  __typeof__(&cuEventDestroy_v2) destroy = NULL;
  void *lib = dlopen(getenv("PINPOOL_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD);
  CT_ASSERT(lib != NULL, "dlopen");
  CU_LOAD(lib, create, "cuEventCreate");
  CU_LOAD(lib, query, "cuEventQuery");
  CU_LOAD(lib, destroy, "cuEventDestroy_v2");
  CUevent ev = NULL;
  CT_ASSERT(create(&ev, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS, "create");
  CT_ASSERT(query(ev) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "query");
  CT_FAKE_EQ("capture_violations", 1);
  CUgraph g = NULL;
  CT_ASSERT(ct_cu.end_capture(s, &g) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
            "end");
  int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  CT_ASSERT(ct_cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) ==
                    CUDA_SUCCESS &&
                ct_cu.exchange_mode(&mode) == CUDA_SUCCESS &&
                query(ev) == CUDA_SUCCESS &&
                ct_cu.exchange_mode(&mode) == CUDA_SUCCESS,
            "relaxed query");
  END(s);
  (void)destroy(ev);
  (void)dlclose(lib);
  ct_fake.reset();
  CT_ASSERT(ct_cu.stream_destroy(s) == CUDA_SUCCESS, "cuStreamDestroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

/* ---- Several threads -------------------------------------------------- */
typedef struct worker {
  pinpool_t *pool;
  int mode;
  int rounds;
  _Atomic(uint64_t) *ids; /* published for the releaser */
  _Atomic(int) *nids;
  int failures;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  CUcontext ctx = NULL;
  (void)ct_cu.retain(&ctx, 0);
  (void)ct_cu.push(ctx);
  CUstream s = NULL;
  if (ct_cu.stream_create(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS)
    w->failures++;
  for (int r = 0; r < w->rounds && s != NULL; r++) {
    void *blk[4];
    int capturing = 0;
    uint64_t id = 0;
    if (ct_cu.begin_capture(s, w->mode) != CUDA_SUCCESS ||
        pinpool_stream_capture(w->pool, (pinpool_stream_t)s, &capturing, &id) !=
            0 ||
        capturing != 1) {
      w->failures++;
      break;
    }
    for (int i = 0; i < 4; i++) {
      if (pinpool_alloc(w->pool, BLOCK, &blk[i]) != 0 ||
          pinpool_record_stream(w->pool, blk[i], (pinpool_stream_t)s) != 0)
        w->failures++;
      if (i % 2 == 0 && pinpool_free(w->pool, blk[i]) != 0) /* in capture */
        w->failures++;
    }
    CUgraph g = NULL;
    if (ct_cu.end_capture(s, &g) != CUDA_SUCCESS)
      w->failures++;
    if (g != NULL)
      (void)ct_cu.graph_destroy(g);
    for (int i = 1; i < 4; i += 2)
      if (pinpool_free(w->pool, blk[i]) != 0)
        w->failures++;
    /* Half the captures are released here, half by another thread. */
    if (r % 2 == 0) {
      if (pinpool_graph_release(w->pool, id) != 0)
        w->failures++;
    } else {
      int k = atomic_fetch_add(w->nids, 1);
      atomic_store(&w->ids[k], id);
    }
  }
  if (s != NULL)
    (void)ct_cu.stream_destroy(s);
  CUcontext popped = NULL;
  (void)ct_cu.pop(&popped);
  (void)ct_cu.release(0);
  return NULL;
}

typedef struct releaser {
  pinpool_t *pool;
  _Atomic(uint64_t) *ids;
  _Atomic(int) *nids;
  _Atomic(bool) *stop;
  int released, failures;
} releaser_t;

static void *releaser_main(void *arg) {
  releaser_t *r = arg;
  for (;;) {
    bool stop = atomic_load(r->stop);
    int n = atomic_load(r->nids);
    while (r->released < n) {
      uint64_t id;
      while ((id = atomic_load(&r->ids[r->released])) == 0) {
      }
      if (pinpool_graph_release(r->pool, id) != 0)
        r->failures++;
      r->released++;
    }
    if (stop && r->released == atomic_load(r->nids))
      break;
    (void)pinpool_process_events(r->pool);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0,background=1,poll_us=20");
  enum { T = 4, ROUNDS = 25 };
  static _Atomic(uint64_t) ids[T * ROUNDS];
  for (int i = 0; i < T * ROUNDS; i++)
    atomic_init(&ids[i], 0);
  _Atomic(int) nids;
  atomic_init(&nids, 0);
  _Atomic(bool) stop;
  atomic_init(&stop, false);
  static const int modes[T] = {
      CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
      CU_STREAM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_GLOBAL};
  worker_t w[T];
  pthread_t tw[T], tr;
  releaser_t rel = {pool, ids, &nids, &stop, 0, 0};
  CT_ASSERT(pthread_create(&tr, NULL, releaser_main, &rel) == 0, "thread");
  for (int i = 0; i < T; i++) {
    w[i] = (worker_t){pool, modes[i], ROUNDS, ids, &nids, 0};
    CT_ASSERT(pthread_create(&tw[i], NULL, worker_main, &w[i]) == 0, "thread");
  }
  for (int i = 0; i < T; i++) {
    (void)pthread_join(tw[i], NULL);
    CT_ASSERT(w[i].failures == 0, "worker %d: %d failures (%s)", i,
              w[i].failures, pinpool_last_error());
  }
  atomic_store(&stop, true);
  (void)pthread_join(tr, NULL);
  CT_ASSERT(rel.failures == 0, "releaser: %d failures", rel.failures);
  CT_OK(pinpool_synchronize(pool));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.pending_blocks == 0 && st.graph_held_blocks == 0,
            "pending %llu, graph-held %llu",
            (unsigned long long)st.pending_blocks,
            (unsigned long long)st.graph_held_blocks);
  CT_ASSERT(st.events_recorded == 0, "an event was recorded: %llu",
            (unsigned long long)st.events_recorded);
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

/* ---- Bad input ------------------------------------------------------- */
static void test_bad_input(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream s = ct_new_stream(), other = ct_new_stream();
  pinpool_t *pool = CT_CREATE("events=cuda,device=0");
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  uint64_t id = BEGIN(pool, s, CU_STREAM_CAPTURE_MODE_RELAXED);
  CT_OK(pinpool_record_stream(pool, blk, (pinpool_stream_t)s));
  CT_OK(pinpool_free(pool, blk));
  pinpool_stats_t before = ct_stats(pool);

  int capturing = 0;
  uint64_t got = 0;
  CT_RC(pinpool_graph_release(NULL, id), PINPOOL_EINVAL);
  CT_RC(pinpool_graph_release(pool, id + 1000), PINPOOL_EINVAL);
  CT_ERROR_HAS("unknown");
  CT_RC(pinpool_stream_graphs_release(NULL, (pinpool_stream_t)s),
        PINPOOL_EINVAL);
  CT_RC(pinpool_stream_graphs_release(pool, (pinpool_stream_t)other),
        PINPOOL_EINVAL);
  CT_RC(pinpool_stream_capture(NULL, (pinpool_stream_t)s, &capturing, &got),
        PINPOOL_EINVAL);
  CT_RC(pinpool_stream_capture(pool, (pinpool_stream_t)s, NULL, &got),
        PINPOOL_EINVAL);
  CT_RC(pinpool_stream_capture(pool, (pinpool_stream_t)s, &capturing, NULL),
        PINPOOL_EINVAL);
  /* Stream 0 while a capture runs: the driver will not say. */
  void *b2 = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &b2));
  CT_RC(pinpool_record_stream(pool, b2, 0), PINPOOL_EDEVICE);
  CT_ERROR_HAS("CUDA_ERROR_STREAM_CAPTURE_IMPLICIT");
  CT_RC(pinpool_stream_capture(pool, 0, &capturing, &got), PINPOOL_EDEVICE);
  CT_OK(pinpool_free(pool, b2)); /* not stream-used: cached at once */
  /* A capture query the driver fails: record_stream fails, no change. */
  CT_ASSERT(ct_fake.inject("cuStreamGetCaptureInfo", 1, CUDA_ERROR_UNKNOWN) ==
                0,
            "inject");
  CT_OK(pinpool_alloc(pool, BLOCK, &b2));
  CT_RC(pinpool_record_stream(pool, b2, (pinpool_stream_t)other),
        PINPOOL_EDEVICE);
  CT_OK(pinpool_free(pool, b2));
  pinpool_stats_t after = ct_stats(pool);
  CT_ASSERT(after.pending_blocks == before.pending_blocks &&
                after.graph_held_blocks == before.graph_held_blocks &&
                after.events_recorded == before.events_recorded,
            "a failed call changed the pool");
  END(s);
  CT_OK(pinpool_graph_release(pool, id)); /* still known after all that */
  CT_OK(pinpool_synchronize(pool));
  CT_OK(pinpool_validate(pool));

  /* A pool whose provider has no capture. */
  pinpool_t *sim = CT_CREATE("events=simulated");
  CT_RC(pinpool_stream_capture(sim, 1, &capturing, &got), PINPOOL_EBUSY);
  CT_RC(pinpool_graph_release(sim, 1), PINPOOL_EINVAL);
  CT_RC(pinpool_stream_graphs_release(sim, 1), PINPOOL_EINVAL);
  pinpool_destroy(sim);

  FINISH(pool, s, other);
}

/* A block used on the legacy stream 0, freed while a capture runs: the
 * driver will not give stream 0's status (a blocking stream captures) and
 * a record there would break the capture: nothing is recorded, the block
 * is kept for good, counted and reported, and the capture survives. */
static int errors_seen;
static void on_error(void *arg, int err, const char *msg, void *block) {
  (void)arg;
  (void)msg;
  (void)block;
  if (err == PINPOOL_EDEVICE)
    errors_seen++;
}

static void test_legacy_stream_during_capture(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  pinpool_hooks_t hooks = {NULL, NULL, on_error, NULL};
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create_ex("events=cuda,device=0", &hooks, &pool));
  void *blk = NULL;
  CT_OK(pinpool_alloc(pool, BLOCK, &blk));
  CT_OK(pinpool_record_stream(pool, blk, 0));
  errors_seen = 0;
  uint64_t id = BEGIN(pool, s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  CT_OK(pinpool_free(pool, blk));
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.event_errors == 1 && st.pending_blocks == 1 &&
                st.graph_held_blocks == 0 && st.events_recorded == 0 &&
                errors_seen == 1,
            "event_errors %llu, pending %llu, reported %d",
            (unsigned long long)st.event_errors,
            (unsigned long long)st.pending_blocks, errors_seen);
  CT_OK(pinpool_synchronize(pool)); /* does not wait for it */
  END(s);
  CT_RC(pinpool_graph_release(pool, id), PINPOOL_EINVAL); /* never tied */
  NEVER(pool, blk);
  FINISH(pool, s);
}

/* A pool destroyed with blocks still held by graphs gives everything back. */
static void test_destroy_while_held(void **state) {
  (void)state;
  require_capture();
  ct_ctx_enter();
  CUstream s = ct_new_stream();
  pinpool_t *pool = CT_CREATE("backend=cuda,device=0,events=cuda");
  void *blk[3];
  (void)BEGIN(pool, s, CU_STREAM_CAPTURE_MODE_GLOBAL);
  for (int i = 0; i < 3; i++) {
    CT_OK(pinpool_alloc(pool, BLOCK, &blk[i]));
    CT_OK(pinpool_record_stream(pool, blk[i], (pinpool_stream_t)s));
    CT_OK(pinpool_free(pool, blk[i]));
  }
  END(s);
  CT_ASSERT(ct_stats(pool).graph_held_blocks == 3, "not held");
  CT_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  CT_ASSERT(ct_cu.stream_destroy(s) == CUDA_SUCCESS, "cuStreamDestroy");
  CT_FAKE_BALANCED();
  ct_ctx_leave();
}

/* argv[1], if given: run only the tests matching this cmocka pattern (the
 * mutant builds run the test that must fail against them). */
int main(int argc, char **argv) {
  ct_init();
  if (argc > 1)
    cmocka_set_test_filter(argv[1]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_record_in_capture, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_tie_outlives_capture, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_free_during_capture, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_mixed_uses, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_many_streams, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_reclaim_during_capture, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_fake_detects_violation, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_threads, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_bad_input, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_legacy_stream_during_capture,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_destroy_while_held, ct_setup,
                                      ct_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
