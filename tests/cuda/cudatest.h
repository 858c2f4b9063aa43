/*
 * Helpers for the CUDA tests (cmocka): the driver the tests run against
 * (the fake one from tests/fake_cuda, or a real one), its control API when
 * it is the fake, checks that the fake saw every call balanced, and a gate
 * that holds a stream until a test opens it.
 *
 * The tests load the driver the way pinpool does, dlopen($PINPOOL_LIBCUDA
 * or libcuda.so.1), which gives them the very library pinpool uses.
 */
#ifndef PP_CUDATEST_H
#define PP_CUDATEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "fake_cuda.h"
#include "pinpool.h"

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * KiB)

/* The control API of the fake driver; every member NULL with a real one. */
typedef struct ct_fake {
  __typeof__(&fake_cuda_set) set;
  __typeof__(&fake_cuda_get) get;
  __typeof__(&fake_cuda_fail) inject; /* "fail" is a cmocka macro */
  __typeof__(&fake_cuda_fail_event) fail_event;
  __typeof__(&fake_cuda_hide) hide;
  __typeof__(&fake_cuda_enqueue) enqueue;
  __typeof__(&fake_cuda_stream_delay) stream_delay;
  __typeof__(&fake_cuda_reset) reset;
} ct_fake_t;

/* Driver entry points the tests call themselves. */
typedef struct ct_cu {
  __typeof__(&cuInit) init;
  __typeof__(&cuDevicePrimaryCtxRetain) retain;
  __typeof__(&cuDevicePrimaryCtxRelease_v2) release;
  __typeof__(&cuCtxGetCurrent) get_current;
  __typeof__(&cuCtxSetCurrent) set_current;
  __typeof__(&cuCtxPushCurrent_v2) push;
  __typeof__(&cuCtxPopCurrent_v2) pop;
  __typeof__(&cuStreamCreate) stream_create;
  __typeof__(&cuStreamDestroy_v2) stream_destroy;
  __typeof__(&cuStreamSynchronize) stream_sync;
  /* Graph capture (NULL if the driver lacks them). */
  __typeof__(&cuStreamBeginCapture_v2) begin_capture;
  __typeof__(&cuStreamEndCapture) end_capture;
  __typeof__(&cuStreamGetCaptureInfo_v2) capture_info;
  __typeof__(&cuThreadExchangeStreamCaptureMode) exchange_mode;
  __typeof__(&cuGraphDestroy) graph_destroy;
} ct_cu_t;

extern ct_fake_t ct_fake;
extern ct_cu_t ct_cu;
extern bool ct_have_driver; /* a driver library loaded and cuInit worked */
extern bool ct_is_fake;     /* ... and it is the fake */

/* Load the driver (once); call first in main(). */
void ct_init(void);

/* Skip the calling test unless the driver is the fake / any driver. */
#define CT_REQUIRE_FAKE()                                                      \
  do {                                                                         \
    if (!ct_is_fake) {                                                         \
      print_message("[  SKIP    ] needs the fake CUDA driver\n");              \
      skip();                                                                  \
    }                                                                          \
  } while (0)
#define CT_REQUIRE_DRIVER()                                                    \
  do {                                                                         \
    if (!ct_have_driver) {                                                     \
      print_message("[  SKIP    ] needs a CUDA driver\n");                     \
      skip();                                                                  \
    }                                                                          \
  } while (0)

#define CT_FAIL(...)                                                           \
  do {                                                                         \
    print_error("ERROR: " __VA_ARGS__);                                        \
    print_error("\n");                                                         \
    _fail(__FILE__, __LINE__);                                                 \
  } while (0)
#define CT_ASSERT(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      print_error("ERROR: `%s` is false: ", #cond);                            \
      CT_FAIL(__VA_ARGS__);                                                    \
    }                                                                          \
  } while (0)

/* expr must return `expected`; the failure shows pinpool_last_error(). */
#define CT_RC(expr, expected)                                                  \
  ct_rc_((expr), (expected), #expr, __FILE__, __LINE__)
#define CT_OK(expr) CT_RC(expr, 0)
void ct_rc_(int got, int expected, const char *expr, const char *file,
            int line);

/* pinpool_last_error() must contain `needle`. */
#define CT_ERROR_HAS(needle) ct_error_has_((needle), __FILE__, __LINE__)
void ct_error_has_(const char *needle, const char *file, int line);

/* Fake counter `key` (fake_cuda_get) must equal `want`. */
#define CT_FAKE_EQ(key, want) ct_fake_eq_((key), (want), __FILE__, __LINE__)
void ct_fake_eq_(const char *key, long long want, const char *file, int line);

/* With the fake: no call without a context, no bad call, every context
 * push popped (but ct_ctx_enter's), no event recorded on a capturing
 * stream, no unsafe call that broke a capture, no query of an event
 * recorded in one. Without it: nothing. Call it when no
 * thread is inside a pool call (no background thread either). */
#define CT_FAKE_CLEAN() ct_fake_clean_(__FILE__, __LINE__)
void ct_fake_clean_(const char *file, int line);

/* With the fake, after every pool is destroyed: nothing left allocated,
 * registered, created or retained, and CT_FAKE_CLEAN. */
#define CT_FAKE_BALANCED() ct_fake_balanced_(__FILE__, __LINE__)
void ct_fake_balanced_(const char *file, int line);

/* cmocka setup/teardown: reset the fake's settings before each test and
 * restore PINPOOL_LIBCUDA after it. */
int ct_setup(void **state);
int ct_teardown(void **state);

/* Run pinpool_create with PINPOOL_LIBCUDA set to `path` (NULL: unset)
 * for the call only. */
int ct_create_with_lib(const char *path, const char *conf, pinpool_t **out);

/* pinpool_create_ex(conf, hooks) must succeed; the failure names the
 * caller's line and shows pinpool_last_error(). */
#define CT_CREATE(conf) ct_create_((conf), NULL, __FILE__, __LINE__)
#define CT_CREATE_EX(conf, hooks)                                              \
  ct_create_((conf), (hooks), __FILE__, __LINE__)
pinpool_t *ct_create_(const char *conf, const pinpool_hooks_t *hooks,
                      const char *file, int line);

/* pinpool_get_stats, which must succeed. */
pinpool_stats_t ct_stats(pinpool_t *pool);

/* A non-blocking stream in the current context, which must be created. */
CUstream ct_new_stream(void);

/* Allocate `size`-byte blocks until `want` comes back (up to 256; want
 * NULL: all 256), failing if one of avoid[0..navoid) does; write each,
 * free them all. Returns whether `want` came back. */
bool ct_alloc_until_(pinpool_t *pool, size_t size, const void *want,
                     void *const *avoid, int navoid, const char *file,
                     int line);

/* The test thread gets device 0's primary context current (retained), and
 * gives it back. For tests that create streams. */
void ct_ctx_enter(void);
void ct_ctx_leave(void);

/* A gate: a host operation queued on a fake stream that holds the stream
 * until the test opens it, then runs `then(arg)`. Deterministic "the DMA is
 * still in flight" without sleeping. Gates live on the heap and are
 * tracked: if a test fails while one is closed, ct_teardown opens it
 * (without running `then`, whose data may be gone) so that no later test
 * waits on a stream held forever. */
typedef struct ct_gate ct_gate_t;
ct_gate_t *ct_gate_new(void (*then)(void *), void *arg);
void ct_gate_queue(ct_gate_t *g, CUstream stream);
void ct_gate_open(ct_gate_t *g);
bool ct_gate_done(ct_gate_t *g); /* `then` has run */
/* Opens the gate if queued, waits until its operation finished, frees. */
void ct_gate_free(ct_gate_t *g);

/* Call pinpool_process_events until cond(arg) holds or `ms` pass; returns
 * whether it held. */
bool ct_wait_until(pinpool_t *pool, bool (*cond)(pinpool_t *, void *),
                   void *arg, unsigned ms);

void ct_sleep_ms(unsigned ms);

#endif /* PP_CUDATEST_H */
