/*
 * The slice of the CUDA driver API that pinpool, its tests and the GPU
 * benchmark use, declared without CUDA headers (values as in cuda.h of CUDA
 * 13.0). The fake driver defines these functions; the tests and the
 * benchmark never link them, they take them from the loaded driver with
 * dlsym (CU_LOAD below), so the same binaries run against the real one.
 */
#ifndef PP_CUDA_MIN_H
#define PP_CUDA_MIN_H

#include <stddef.h>

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_STUB_LIBRARY 34
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED 712
#define CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED 713
#define CUDA_ERROR_LAUNCH_FAILED 719
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED 900
#define CUDA_ERROR_STREAM_CAPTURE_INVALIDATED 901
#define CUDA_ERROR_STREAM_CAPTURE_IMPLICIT 906
#define CUDA_ERROR_CAPTURED_EVENT 907
#define CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD 908
#define CUDA_ERROR_UNKNOWN 999

/* CUstreamCaptureStatus, CUstreamCaptureMode */
#define CU_STREAM_CAPTURE_STATUS_NONE 0
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_STREAM_CAPTURE_STATUS_INVALIDATED 2
#define CU_STREAM_CAPTURE_MODE_GLOBAL 0
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
#define CU_STREAM_CAPTURE_MODE_RELAXED 2
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphNode_st *CUgraphNode;
typedef struct CUgraphExec_st *CUgraphExec;

#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_MEMHOSTALLOC_PORTABLE 0x1
#define CU_MEMHOSTALLOC_DEVICEMAP 0x2
#define CU_MEMHOSTALLOC_WRITECOMBINED 0x4
#define CU_MEMHOSTREGISTER_PORTABLE 0x1
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x2
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM 0x1
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_MEMORYTYPE_HOST 1
#define CU_MEMORYTYPE_DEVICE 2

/* Exported names (the _v2 ones are what cuda.h maps the plain names to). */
CUresult cuInit(unsigned flags);
CUresult cuDriverGetVersion(int *version);
CUresult cuGetErrorString(CUresult rc, const char **s);
CUresult cuGetErrorName(CUresult rc, const char **s);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                          cuuint64_t flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             cuuint64_t flags, int *status);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
CUresult cuCtxGetCurrent(CUcontext *ctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxPushCurrent_v2(CUcontext ctx);
CUresult cuCtxPopCurrent_v2(CUcontext *ctx);
CUresult cuCtxSynchronize(void);
CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags);
CUresult cuMemFreeHost(void *p);
CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags);
CUresult cuMemHostUnregister(void *p);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size);
CUresult cuMemFree_v2(CUdeviceptr dptr);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n,
                              CUstream stream);
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n,
                              CUstream stream);
CUresult cuStreamCreate(CUstream *stream, unsigned flags);
CUresult cuStreamDestroy_v2(CUstream stream);
CUresult cuStreamSynchronize(CUstream stream);
CUresult cuEventCreate(CUevent *ev, unsigned flags);
CUresult cuEventRecord(CUevent ev, CUstream stream);
CUresult cuEventQuery(CUevent ev);
CUresult cuEventSynchronize(CUevent ev);
CUresult cuEventDestroy_v2(CUevent ev);
/* Graph capture: cuStreamBeginCapture and cuStreamGetCaptureInfo as cuda.h
 * of CUDA 12.0 maps them (mode argument; graph and dependencies out). */
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode);
CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph);
CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, cuuint64_t *id,
                                   CUgraph *graph, const CUgraphNode **deps,
                                   size_t *ndeps);
CUresult cuThreadExchangeStreamCaptureMode(int *mode);
CUresult cuGraphDestroy(CUgraph graph);
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                     unsigned long long flags);
CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream);
CUresult cuGraphExecDestroy(CUgraphExec exec);

/* Set the function pointer `var` to the loaded driver's `sym` (NULL if it
 * lacks it). Declare var with the prototype above:
 *   static __typeof__(&cuCtxPushCurrent_v2) p_push;
 *   CU_LOAD(lib, p_push, "cuCtxPushCurrent_v2"); */
#define CU_LOAD(lib, var, sym)                                                 \
  do {                                                                         \
    void *cu_load_sym_ = dlsym((lib), (sym));                                  \
    memcpy(&(var), &cu_load_sym_, sizeof cu_load_sym_);                        \
  } while (0)

#endif /* PP_CUDA_MIN_H */
