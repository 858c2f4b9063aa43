#define _GNU_SOURCE
#include "cudatest.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

ct_fake_t ct_fake;
ct_cu_t ct_cu;
bool ct_have_driver;
bool ct_is_fake;

static char *orig_libcuda; /* PINPOOL_LIBCUDA as the test runner set it */
static void abandon_gates(void);
static CUcontext entered_ctx;

void ct_init(void) {
  const char *p = getenv("PINPOOL_LIBCUDA");
  if (p != NULL && p[0] != '\0')
    orig_libcuda = strdup(p);
  void *lib = dlopen(orig_libcuda != NULL ? orig_libcuda : "libcuda.so.1",
                     RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    print_message("no CUDA driver: %s\n", dlerror());
    return;
  }
  /* Kept open: it is the library pinpool will use. */
  CU_LOAD(lib, ct_fake.set, "fake_cuda_set");
  CU_LOAD(lib, ct_fake.get, "fake_cuda_get");
  CU_LOAD(lib, ct_fake.inject, "fake_cuda_fail");
  CU_LOAD(lib, ct_fake.fail_event, "fake_cuda_fail_event");
  CU_LOAD(lib, ct_fake.hide, "fake_cuda_hide");
  CU_LOAD(lib, ct_fake.enqueue, "fake_cuda_enqueue");
  CU_LOAD(lib, ct_fake.stream_delay, "fake_cuda_stream_delay");
  CU_LOAD(lib, ct_fake.reset, "fake_cuda_reset");
  ct_is_fake = ct_fake.set != NULL && ct_fake.get != NULL &&
               ct_fake.inject != NULL && ct_fake.fail_event != NULL &&
               ct_fake.hide != NULL && ct_fake.enqueue != NULL &&
               ct_fake.stream_delay != NULL && ct_fake.reset != NULL;
  if (!ct_is_fake)
    memset(&ct_fake, 0, sizeof ct_fake);
  CU_LOAD(lib, ct_cu.init, "cuInit");
  CU_LOAD(lib, ct_cu.retain, "cuDevicePrimaryCtxRetain");
  CU_LOAD(lib, ct_cu.release, "cuDevicePrimaryCtxRelease_v2");
  CU_LOAD(lib, ct_cu.get_current, "cuCtxGetCurrent");
  CU_LOAD(lib, ct_cu.set_current, "cuCtxSetCurrent");
  CU_LOAD(lib, ct_cu.push, "cuCtxPushCurrent_v2");
  CU_LOAD(lib, ct_cu.pop, "cuCtxPopCurrent_v2");
  CU_LOAD(lib, ct_cu.stream_create, "cuStreamCreate");
  CU_LOAD(lib, ct_cu.stream_destroy, "cuStreamDestroy_v2");
  CU_LOAD(lib, ct_cu.stream_sync, "cuStreamSynchronize");
  CU_LOAD(lib, ct_cu.begin_capture, "cuStreamBeginCapture_v2");
  CU_LOAD(lib, ct_cu.end_capture, "cuStreamEndCapture");
  CU_LOAD(lib, ct_cu.capture_info, "cuStreamGetCaptureInfo_v2");
  CU_LOAD(lib, ct_cu.exchange_mode, "cuThreadExchangeStreamCaptureMode");
  CU_LOAD(lib, ct_cu.graph_destroy, "cuGraphDestroy");
  ct_have_driver = ct_cu.init != NULL && ct_cu.init(0) == CUDA_SUCCESS &&
                   ct_cu.retain != NULL && ct_cu.release != NULL &&
                   ct_cu.get_current != NULL && ct_cu.set_current != NULL &&
                   ct_cu.push != NULL && ct_cu.pop != NULL &&
                   ct_cu.stream_create != NULL &&
                   ct_cu.stream_destroy != NULL && ct_cu.stream_sync != NULL;
  print_message("CUDA driver: %s (%s)\n",
                orig_libcuda != NULL ? orig_libcuda : "libcuda.so.1",
                ct_is_fake       ? "fake"
                : ct_have_driver ? "real"
                                 : "unusable");
}

void ct_rc_(int got, int expected, const char *expr, const char *file,
            int line) {
  if (got == expected)
    return;
  print_error("ERROR: %s returned %d, expected %d; last_error: \"%s\"\n", expr,
              got, expected, pinpool_last_error());
  _fail(file, line);
}

void ct_error_has_(const char *needle, const char *file, int line) {
  const char *e = pinpool_last_error();
  if (e != NULL && strstr(e, needle) != NULL)
    return;
  print_error("ERROR: last_error \"%s\" does not contain \"%s\"\n",
              e != NULL ? e : "(null)", needle);
  _fail(file, line);
}

void ct_fake_eq_(const char *key, long long want, const char *file, int line) {
  if (!ct_is_fake)
    return;
  long long got = ct_fake.get(key);
  if (got == want)
    return;
  print_error("ERROR: fake driver %s = %lld, expected %lld\n", key, got, want);
  _fail(file, line);
}

void ct_fake_clean_(const char *file, int line) {
  if (!ct_is_fake)
    return;
  ct_fake_eq_("ctx_errors", 0, file, line);
  ct_fake_eq_("bad_calls", 0, file, line);
  ct_fake_eq_("captured_records", 0, file, line);
  ct_fake_eq_("capture_violations", 0, file, line);
  ct_fake_eq_("captured_event_uses", 0, file, line);
  /* The test's own ct_ctx_enter is the one push allowed to stay. */
  ct_fake_eq_("unpopped", entered_ctx != NULL ? 1 : 0, file, line);
}

void ct_fake_balanced_(const char *file, int line) {
  if (!ct_is_fake)
    return;
  ct_fake_clean_(file, line);
  ct_fake_eq_("live_host_allocs", 0, file, line);
  ct_fake_eq_("live_registrations", 0, file, line);
  ct_fake_eq_("live_events", 0, file, line);
  ct_fake_eq_("primary_refs", entered_ctx != NULL ? 1 : 0, file, line);
}

int ct_setup(void **state) {
  (void)state;
  if (ct_is_fake)
    ct_fake.reset();
  return 0;
}

static void restore_libcuda(void) {
  if (orig_libcuda != NULL)
    (void)setenv("PINPOOL_LIBCUDA", orig_libcuda, 1);
  else
    (void)unsetenv("PINPOOL_LIBCUDA");
}

int ct_teardown(void **state) {
  (void)state;
  abandon_gates();
  ct_ctx_leave(); /* a failed test may not have */
  restore_libcuda();
  if (ct_is_fake)
    ct_fake.reset();
  return 0;
}

int ct_create_with_lib(const char *path, const char *conf, pinpool_t **out) {
  /* setenv is not thread-safe: the tests call this with no other thread of
   * theirs running (the fake's stream workers never read the env). */
  if (path != NULL)
    (void)setenv("PINPOOL_LIBCUDA", path, 1);
  else
    (void)unsetenv("PINPOOL_LIBCUDA");
  int rc = pinpool_create(conf, out);
  restore_libcuda();
  return rc;
}

pinpool_t *ct_create_(const char *conf, const pinpool_hooks_t *hooks,
                      const char *file, int line) {
  pinpool_t *pool = NULL;
  ct_rc_(pinpool_create_ex(conf, hooks, &pool), 0, conf, file, line);
  return pool;
}

pinpool_stats_t ct_stats(pinpool_t *pool) {
  pinpool_stats_t st;
  memset(&st, 0, sizeof st);
  CT_OK(pinpool_get_stats(pool, &st));
  return st;
}

CUstream ct_new_stream(void) {
  CUstream s = NULL;
  CT_ASSERT(ct_cu.stream_create(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS,
            "cuStreamCreate");
  return s;
}

bool ct_alloc_until_(pinpool_t *pool, size_t size, const void *want,
                     void *const *avoid, int navoid, const char *file,
                     int line) {
  enum { MAX = 256 };
  void *got[MAX];
  bool found = false;
  int n = 0;
  for (; n < MAX && !found; n++) {
    ct_rc_(pinpool_alloc(pool, size, &got[n]), 0, "pinpool_alloc", file, line);
    for (int i = 0; i < navoid; i++)
      if (got[n] == avoid[i]) {
        print_error("ERROR: block %p handed out while it must not be\n",
                    got[n]);
        _fail(file, line);
      }
    memset(got[n], 0xee, size);
    found = want != NULL && got[n] == want;
  }
  for (int i = 0; i < n; i++)
    ct_rc_(pinpool_free(pool, got[i]), 0, "pinpool_free", file, line);
  return found;
}

void ct_ctx_enter(void) {
  CUcontext c = NULL;
  if (ct_cu.retain(&c, 0) != CUDA_SUCCESS || ct_cu.push(c) != CUDA_SUCCESS)
    CT_FAIL("cannot make device 0's primary context current");
  entered_ctx = c;
}

void ct_ctx_leave(void) {
  CUcontext c = NULL;
  if (entered_ctx == NULL)
    return;
  (void)ct_cu.pop(&c);
  (void)ct_cu.release(0);
  entered_ctx = NULL;
}

struct ct_gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
  bool queued;
  void (*then)(void *); /* under mu: teardown clears it */
  void *arg;
  _Atomic(int) done; /* set after `then` ran */
  struct ct_gate *next;
};

/* Gates not yet freed; only the test thread touches the list. */
static ct_gate_t *gates;

static void gate_main(void *arg) {
  ct_gate_t *g = arg;
  (void)pthread_mutex_lock(&g->mu);
  while (!g->open)
    (void)pthread_cond_wait(&g->cv, &g->mu);
  void (*then)(void *) = g->then;
  (void)pthread_mutex_unlock(&g->mu);
  if (then != NULL)
    then(g->arg);
  atomic_store_explicit(&g->done, 1, memory_order_release);
}

ct_gate_t *ct_gate_new(void (*then)(void *), void *arg) {
  ct_gate_t *g = calloc(1, sizeof *g);
  if (g == NULL)
    CT_FAIL("out of memory");
  (void)pthread_mutex_init(&g->mu, NULL);
  (void)pthread_cond_init(&g->cv, NULL);
  g->then = then;
  g->arg = arg;
  atomic_init(&g->done, 0);
  g->next = gates;
  gates = g;
  return g;
}

void ct_gate_queue(ct_gate_t *g, CUstream stream) {
  if (ct_fake.enqueue(stream, gate_main, g, 0) != 0)
    CT_FAIL("fake_cuda_enqueue failed");
  g->queued = true;
}

void ct_gate_open(ct_gate_t *g) {
  (void)pthread_mutex_lock(&g->mu);
  g->open = true;
  (void)pthread_cond_broadcast(&g->cv);
  (void)pthread_mutex_unlock(&g->mu);
}

bool ct_gate_done(ct_gate_t *g) {
  return atomic_load_explicit(&g->done, memory_order_acquire) != 0;
}

void ct_gate_free(ct_gate_t *g) {
  if (g->queued) {
    ct_gate_open(g);
    while (!ct_gate_done(g))
      ct_sleep_ms(1);
  }
  for (ct_gate_t **pp = &gates; *pp != NULL; pp = &(*pp)->next)
    if (*pp == g) {
      *pp = g->next;
      break;
    }
  (void)pthread_cond_destroy(&g->cv);
  (void)pthread_mutex_destroy(&g->mu);
  free(g);
}

/* After a failed test: release its streams without running its callbacks. */
static void abandon_gates(void) {
  while (gates != NULL) {
    ct_gate_t *g = gates;
    (void)pthread_mutex_lock(&g->mu);
    g->then = NULL;
    (void)pthread_mutex_unlock(&g->mu);
    ct_gate_free(g);
  }
}

void ct_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

bool ct_wait_until(pinpool_t *pool, bool (*cond)(pinpool_t *, void *),
                   void *arg, unsigned ms) {
  for (unsigned waited = 0;; waited++) {
    (void)pinpool_process_events(pool);
    if (cond(pool, arg))
      return true;
    if (waited >= ms)
      return false;
    ct_sleep_ms(1);
  }
}
