/*
 * The cuda event provider: one CUevent per (block, stream) use, recorded
 * when the block is freed.
 *
 * Events are pooled. cuEventCreate takes a driver lock and costs
 * microseconds; a busy pipeline frees thousands of stream-used blocks a
 * second, so released events go on a free list and are recorded again.
 * Timing is disabled: a timing event makes cuEventQuery and
 * cuEventSynchronize slower and we only ask "done yet?".
 *
 * The free list has its own mutex (not a pool lock); it is never held
 * across a driver call, since driver calls take driver-global locks and
 * cuEventSynchronize can block for as long as the device runs.
 *
 * Graph capture (docs/cuda.md, "Graph capture"): `capture` asks the driver
 * whether a stream is capturing (cuStreamGetCaptureInfo), so that stream.c
 * never records on one. Query and synchronize run in the relaxed capture
 * mode (cuThreadExchangeStreamCaptureMode, the previous mode restored
 * after): our events are never recorded inside a capture, and in the
 * default global mode a cuEventQuery from any thread while another thread
 * captures in global mode (or from a thread that is itself capturing)
 * would be an unsafe call that invalidates that capture.
 */
#include "cuda_driver.h"

#include <stdio.h>
#include <stdlib.h>

/* What the pool holds as `event`: the CUevent and its links. */
typedef struct cu_event {
  pp_cu_event_t ev;
  struct cu_event *next_free; /* under lock, while on the free list */
  struct cu_event *next_all;  /* under lock; every event ever created */
} cu_event_t;

typedef struct events_ctx {
  const pp_cuda_t *cuda; /* owned by the pool, outlives the provider */
  pp_mutex_t lock;
  cu_event_t *free; /* released events, ready to be recorded again */
  cu_event_t *all;  /* so destroy finds events the pool never released */
} events_ctx_t;

static int device_error(const events_ctx_t *e, pp_cu_result_t cr,
                        const char *call) {
  char err[128];
  return pp_fail(cr == PP_CU_ERROR_OUT_OF_MEMORY ? PINPOOL_ENOMEM
                                                 : PINPOOL_EDEVICE,
                 "cuda events: %s: %s", call,
                 pp_cuda_strerror(e->cuda, cr, err, sizeof err));
}

static void put_free(events_ctx_t *e, cu_event_t *n) {
  pp_mutex_lock(&e->lock);
  n->next_free = e->free;
  e->free = n;
  pp_mutex_unlock(&e->lock);
}

static int ev_record(void *ctx, pinpool_stream_t stream, void **event) {
  events_ctx_t *e = ctx;
  pp_mutex_lock(&e->lock);
  cu_event_t *n = e->free;
  if (n != NULL)
    e->free = n->next_free;
  pp_mutex_unlock(&e->lock);

  pp_cu_result_t cr = pp_cuda_push(e->cuda);
  if (cr != PP_CU_SUCCESS) {
    if (n != NULL)
      put_free(e, n);
    return device_error(e, cr, "cuCtxPushCurrent");
  }
  if (n == NULL) {
    n = calloc(1, sizeof *n);
    if (n == NULL) {
      pp_cuda_pop(e->cuda);
      return pp_fail(PINPOOL_ENOMEM, "cuda events: out of memory");
    }
    cr = e->cuda->cuEventCreate(&n->ev, PP_CU_EVENT_DISABLE_TIMING);
    if (cr != PP_CU_SUCCESS) {
      pp_cuda_pop(e->cuda);
      free(n);
      return device_error(e, cr, "cuEventCreate");
    }
    pp_mutex_lock(&e->lock);
    n->next_all = e->all;
    e->all = n;
    pp_mutex_unlock(&e->lock);
  }
  cr = e->cuda->cuEventRecord(n->ev, (pp_cu_stream_t)stream);
  pp_cuda_pop(e->cuda);
  if (cr != PP_CU_SUCCESS) {
    /* A failed record leaves the event as it was: fit to record again. */
    put_free(e, n);
    return device_error(e, cr, "cuEventRecord");
  }
  *event = n;
  return 0;
}

/* Push the pool's context and switch the calling thread to the relaxed
 * capture mode; *mode receives the thread's mode to restore (leave). */
static pp_cu_result_t enter(const events_ctx_t *e, int *mode) {
  pp_cu_result_t cr = pp_cuda_push(e->cuda);
  if (cr != PP_CU_SUCCESS)
    return cr;
#ifdef PINPOOL_MUTANT_NO_RELAXED_MODE
  /* Mutant (docs/verification.md): query in the thread's own mode. */
  *mode = PP_CU_STREAM_CAPTURE_MODE_GLOBAL;
#else
  *mode = PP_CU_STREAM_CAPTURE_MODE_RELAXED;
#endif
  cr = e->cuda->cuThreadExchangeStreamCaptureMode(mode);
  if (cr != PP_CU_SUCCESS)
    pp_cuda_pop(e->cuda);
  return cr;
}

static void leave(const events_ctx_t *e, int mode) {
  (void)e->cuda->cuThreadExchangeStreamCaptureMode(&mode);
  pp_cuda_pop(e->cuda);
}

static int ev_query(void *ctx, void *event) {
  const events_ctx_t *e = ctx;
  const cu_event_t *n = event;
  int mode = 0;
  pp_cu_result_t cr = enter(e, &mode);
  if (cr != PP_CU_SUCCESS)
    return device_error(e, cr, "cuThreadExchangeStreamCaptureMode");
  cr = e->cuda->cuEventQuery(n->ev);
  leave(e, mode);
  if (cr == PP_CU_SUCCESS)
    return 1;
  if (cr == PP_CU_ERROR_NOT_READY)
    return 0;
  /* Out of memory here is still a failed event, not an allocation error. */
  char err[128];
  return pp_fail(PINPOOL_EDEVICE, "cuda events: cuEventQuery: %s",
                 pp_cuda_strerror(e->cuda, cr, err, sizeof err));
}

static int ev_synchronize(void *ctx, void *event) {
  const events_ctx_t *e = ctx;
  const cu_event_t *n = event;
  int mode = 0;
  pp_cu_result_t cr = enter(e, &mode);
  if (cr != PP_CU_SUCCESS)
    return device_error(e, cr, "cuThreadExchangeStreamCaptureMode");
  cr = e->cuda->cuEventSynchronize(n->ev);
  leave(e, mode);
  if (cr == PP_CU_SUCCESS)
    return 0;
  char err[128];
  return pp_fail(PINPOOL_EDEVICE, "cuda events: cuEventSynchronize: %s",
                 pp_cuda_strerror(e->cuda, cr, err, sizeof err));
}

/* 1 and the capture's id in *id if `stream` is capturing (or its capture
 * was invalidated and not yet ended: recording there is no better), 0 if
 * not, < 0 on a driver error (the legacy stream 0 while another thread
 * captures on a blocking stream: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). */
static int ev_capture(void *ctx, pinpool_stream_t stream, uint64_t *id) {
  const events_ctx_t *e = ctx;
  pp_cu_result_t cr = pp_cuda_push(e->cuda);
  if (cr != PP_CU_SUCCESS)
    return device_error(e, cr, "cuCtxPushCurrent");
  int status = PP_CU_STREAM_CAPTURE_STATUS_NONE;
  pp_cu_u64_t cid = 0;
  cr = e->cuda->cuStreamGetCaptureInfo((pp_cu_stream_t)stream, &status, &cid,
                                       NULL, NULL, NULL);
  pp_cuda_pop(e->cuda);
  if (cr != PP_CU_SUCCESS) {
    char err[128];
    return pp_fail(PINPOOL_EDEVICE, "cuda events: cuStreamGetCaptureInfo: %s",
                   pp_cuda_strerror(e->cuda, cr, err, sizeof err));
  }
  if (status == PP_CU_STREAM_CAPTURE_STATUS_NONE)
    return 0;
  *id = (uint64_t)cid;
  return 1;
}

static void ev_release(void *ctx, void *event) { put_free(ctx, event); }

static void ev_destroy(void *ctx) {
  events_ctx_t *e = ctx;
  /* Single-threaded (pool destroy): no lock needed, but the fields are
   * "under lock", so take it for the reader's sake; it costs nothing. */
  pp_mutex_lock(&e->lock);
  cu_event_t *all = e->all;
  e->all = e->free = NULL;
  pp_mutex_unlock(&e->lock);
  bool pushed = all != NULL && pp_cuda_push(e->cuda) == PP_CU_SUCCESS;
  while (all != NULL) {
    cu_event_t *next = all->next_all;
    if (pushed)
      (void)e->cuda->cuEventDestroy(all->ev);
    free(all);
    all = next;
  }
  if (pushed)
    pp_cuda_pop(e->cuda);
  pp_mutex_destroy(&e->lock);
  free(e);
}

int pp_events_cuda_open(const pp_config_t *cfg, pp_cuda_t *cuda,
                        pp_events_t *out) {
  (void)cfg;
  int rc;
  if ((rc = PP_CUDA_REQUIRE(cuda, cuEventCreate)) != 0 ||
      (rc = PP_CUDA_REQUIRE(cuda, cuEventRecord)) != 0 ||
      (rc = PP_CUDA_REQUIRE(cuda, cuEventQuery)) != 0 ||
      (rc = PP_CUDA_REQUIRE(cuda, cuEventSynchronize)) != 0 ||
      (rc = PP_CUDA_REQUIRE(cuda, cuEventDestroy)) != 0 ||
      (rc = PP_CUDA_REQUIRE(cuda, cuStreamGetCaptureInfo)) != 0 ||
      (rc = PP_CUDA_REQUIRE(cuda, cuThreadExchangeStreamCaptureMode)) != 0)
    return rc;
  events_ctx_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return pp_fail(PINPOOL_ENOMEM, "cuda events: out of memory");
  e->cuda = cuda;
  pp_mutex_init(&e->lock);
  // cppcheck-suppress memleak ; ownership passes to *out (ctx)
  /* No fork hook: a child never uses this provider (fork.c replaces it,
   * and the driver cannot be used there). */
  *out = (pp_events_t){"cuda",         e,          ev_record,  ev_query,
                       ev_synchronize, ev_release, ev_destroy, NULL,
                       ev_capture};
  return 0;
}
