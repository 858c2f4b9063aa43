/*
 * The CUDA driver API as pinpool sees it: the few types, constants and entry
 * points it calls, declared here so that building needs no CUDA header or
 * library (the driver is loaded with dlopen at pinpool_create). Shared by
 * cuda_driver.c, backend_cuda.c and events_cuda.c; nothing here is exported.
 *
 * Values are those of cuda.h (checked against CUDA 13.0).
 */
#ifndef PP_CUDA_DRIVER_H
#define PP_CUDA_DRIVER_H

#include "internal.h"

typedef int pp_cu_result_t;             /* CUresult */
typedef int pp_cu_device_t;             /* CUdevice */
typedef void *pp_cu_ctx_t;              /* CUcontext */
typedef void *pp_cu_stream_t;           /* CUstream */
typedef void *pp_cu_event_t;            /* CUevent */
typedef unsigned long long pp_cu_u64_t; /* cuuint64_t */

enum {
  PP_CU_SUCCESS = 0,
  PP_CU_ERROR_INVALID_VALUE = 1,
  PP_CU_ERROR_OUT_OF_MEMORY = 2,
  PP_CU_ERROR_NOT_INITIALIZED = 3,
  PP_CU_ERROR_STUB_LIBRARY = 34,
  PP_CU_ERROR_NO_DEVICE = 100,
  PP_CU_ERROR_INVALID_CONTEXT = 201,
  PP_CU_ERROR_NOT_FOUND = 500,
  PP_CU_ERROR_NOT_READY = 600,
};
/* CUstreamCaptureStatus and CUstreamCaptureMode. */
enum {
  PP_CU_STREAM_CAPTURE_STATUS_NONE = 0,
  PP_CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  PP_CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
};
enum {
  PP_CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  PP_CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  PP_CU_STREAM_CAPTURE_MODE_RELAXED = 2,
};
enum { PP_CU_EVENT_DISABLE_TIMING = 0x2 };
enum {
  PP_CU_MEMHOSTREGISTER_PORTABLE = 0x1,
  PP_CU_MEMHOSTREGISTER_DEVICEMAP = 0x2,
};
/* cuGetProcAddress flags: the legacy default stream for stream 0, as
 * pinpool.h documents, whatever the driver's default mode. */
enum { PP_CU_GET_PROC_ADDRESS_LEGACY_STREAM = 0x1 };

struct pp_cuda {
  void *lib;          /* dlopen handle, never closed once cuInit succeeded */
  int driver_version; /* cuDriverGetVersion, 0 if unknown */
  int device;         /* cfg->device: -1 means ctx is the caller's context */
  pp_cu_device_t dev;
  pp_cu_ctx_t ctx;   /* every driver call on behalf of the pool runs in it */
  bool primary_held; /* ctx is dev's primary context, retained by us */

  /* Entry points; NULL when the driver lacks one. Immutable after open. */
  pp_cu_result_t (*cuInit)(unsigned flags);
  pp_cu_result_t (*cuDriverGetVersion)(int *version);
  pp_cu_result_t (*cuGetErrorString)(pp_cu_result_t rc, const char **s);
  pp_cu_result_t (*cuGetErrorName)(pp_cu_result_t rc, const char **s);
  pp_cu_result_t (*cuDeviceGetCount)(int *count);
  pp_cu_result_t (*cuDeviceGet)(pp_cu_device_t *dev, int ordinal);
  pp_cu_result_t (*cuCtxGetCurrent)(pp_cu_ctx_t *ctx);
  pp_cu_result_t (*cuCtxPushCurrent)(pp_cu_ctx_t ctx);
  pp_cu_result_t (*cuCtxPopCurrent)(pp_cu_ctx_t *ctx);
  pp_cu_result_t (*cuDevicePrimaryCtxRetain)(pp_cu_ctx_t *ctx,
                                             pp_cu_device_t dev);
  pp_cu_result_t (*cuDevicePrimaryCtxRelease)(pp_cu_device_t dev);
  pp_cu_result_t (*cuMemHostAlloc)(void **p, size_t size, unsigned flags);
  pp_cu_result_t (*cuMemFreeHost)(void *p);
  pp_cu_result_t (*cuMemHostRegister)(void *p, size_t size, unsigned flags);
  pp_cu_result_t (*cuMemHostUnregister)(void *p);
  pp_cu_result_t (*cuEventCreate)(pp_cu_event_t *ev, unsigned flags);
  pp_cu_result_t (*cuEventRecord)(pp_cu_event_t ev, pp_cu_stream_t stream);
  pp_cu_result_t (*cuEventQuery)(pp_cu_event_t ev);
  pp_cu_result_t (*cuEventSynchronize)(pp_cu_event_t ev);
  pp_cu_result_t (*cuEventDestroy)(pp_cu_event_t ev);
  /* Graph capture (events_cuda.c): the CUDA 12.0 signature of
   * cuStreamGetCaptureInfo (exported as cuStreamGetCaptureInfo_v2; CUDA
   * 11.3's, before the _v3 of 12.3 added edge data); graph, dependencies
   * and their count may be NULL. */
  pp_cu_result_t (*cuStreamGetCaptureInfo)(pp_cu_stream_t stream, int *status,
                                           pp_cu_u64_t *id, void **graph,
                                           const void ***deps, size_t *ndeps);
  pp_cu_result_t (*cuThreadExchangeStreamCaptureMode)(int *mode);
};

/* Make the pool's context current on the calling thread, and undo it.
 * Every driver call made for the pool sits between the two, so that it
 * works from any thread and leaves the caller's own context stack as it
 * found it. pp_cuda_push returns a CUresult. */
pp_cu_result_t pp_cuda_push(const pp_cuda_t *cuda);
void pp_cuda_pop(const pp_cuda_t *cuda);

/* "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for rc, written into buf. */
const char *pp_cuda_strerror(const pp_cuda_t *cuda, pp_cu_result_t rc,
                             char *buf, size_t len);

/* 0 if the driver has entry point `fn` (a member above), else
 * PINPOOL_ENODRIVER "CUDA driver lacks <fn>". */
#define PP_CUDA_REQUIRE(cuda, fn)                                              \
  ((cuda)->fn != NULL                                                          \
       ? 0                                                                     \
       : pp_fail(PINPOOL_ENODRIVER, "CUDA driver lacks %s", #fn))

/* Configuration that no CUDA backend can honour (numa_node with
 * backend=cuda): PINPOOL_ECONFIG, else 0. Checked before the driver loads,
 * so the answer does not depend on the machine having one. */
int pp_cuda_check_config(const pp_config_t *cfg);

#endif /* PP_CUDA_DRIVER_H */
