/*
 * cudapeer — loading the CUDA driver for the benchmarks' GPU peers
 * (cudapeer.h).
 */
#define _GNU_SOURCE
#include "cudapeer.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_min.h"

static struct {
  __typeof__(&cuInit) init;
  __typeof__(&cuDriverGetVersion) version;
  __typeof__(&cuGetErrorName) err_name;
  __typeof__(&cuDeviceGetCount) device_count;
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuDeviceGetName) device_name;
  __typeof__(&cuDevicePrimaryCtxRetain) retain;
  __typeof__(&cuCtxSetCurrent) set_current;
  __typeof__(&cuMemHostAlloc) host_alloc;
  __typeof__(&cuMemFreeHost) free_host;
} cu;

/* Written once inside open_once (pthread_once orders it before every
 * reader that returns from cudapeer_open). */
static CUcontext g_ctx;
static int g_rc = -1;
static char g_why[256];
static char g_desc[320];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static _Thread_local CUresult t_last;

static const char *err_name(CUresult rc) {
  const char *s = NULL;
  if (cu.err_name != NULL && cu.err_name(rc, &s) == CUDA_SUCCESS && s != NULL)
    return s;
  /* The toolkit's stub library answers every call, this one included,
   * with an error: name the codes a probe meets without it. */
  switch (rc) {
  case CUDA_ERROR_STUB_LIBRARY:
    return "CUDA_ERROR_STUB_LIBRARY (the toolkit's stub, not a driver)";
  case CUDA_ERROR_NO_DEVICE:
    return "CUDA_ERROR_NO_DEVICE";
  case CUDA_ERROR_NOT_INITIALIZED:
    return "CUDA_ERROR_NOT_INITIALIZED";
  default:
    return "unknown CUDA error";
  }
}

/* Fail open_once with a reason; returns -1. */
static int refuse(const char *what, CUresult rc) {
  if (rc == CUDA_SUCCESS)
    snprintf(g_why, sizeof g_why, "%s", what);
  else
    snprintf(g_why, sizeof g_why, "%s: %s (%d)", what, err_name(rc), rc);
  return -1;
}

static int open_driver(void) {
  const char *path = getenv("PINPOOL_LIBCUDA");
  if (path == NULL || path[0] == '\0')
    path = "libcuda.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    const char *e = dlerror();
    snprintf(g_why, sizeof g_why, "no CUDA driver (%s)", e ? e : path);
    return -1;
  }
  /* Kept loaded for the process's life: contexts and pinned memory live
   * in it until exit. */
  CU_LOAD(lib, cu.init, "cuInit");
  CU_LOAD(lib, cu.version, "cuDriverGetVersion");
  CU_LOAD(lib, cu.err_name, "cuGetErrorName");
  CU_LOAD(lib, cu.device_count, "cuDeviceGetCount");
  CU_LOAD(lib, cu.device_get, "cuDeviceGet");
  CU_LOAD(lib, cu.device_name, "cuDeviceGetName");
  CU_LOAD(lib, cu.retain, "cuDevicePrimaryCtxRetain");
  CU_LOAD(lib, cu.set_current, "cuCtxSetCurrent");
  CU_LOAD(lib, cu.host_alloc, "cuMemHostAlloc");
  CU_LOAD(lib, cu.free_host, "cuMemFreeHost");
  if (cu.init == NULL || cu.version == NULL || cu.device_count == NULL ||
      cu.device_get == NULL || cu.device_name == NULL || cu.retain == NULL ||
      cu.set_current == NULL || cu.host_alloc == NULL || cu.free_host == NULL)
    return refuse("the CUDA driver lacks an entry point the peers need",
                  CUDA_SUCCESS);
  CUresult rc = cu.init(0);
  if (rc != CUDA_SUCCESS)
    return refuse("cuInit", rc);
  int n = 0;
  rc = cu.device_count(&n);
  if (rc != CUDA_SUCCESS)
    return refuse("cuDeviceGetCount", rc);
  if (n < 1)
    return refuse("no CUDA device", CUDA_SUCCESS);
  CUdevice dev = 0;
  if ((rc = cu.device_get(&dev, 0)) != CUDA_SUCCESS)
    return refuse("cuDeviceGet(0)", rc);
  char name[256] = "";
  if ((rc = cu.device_name(name, (int)sizeof name, dev)) != CUDA_SUCCESS)
    return refuse("cuDeviceGetName", rc);
  if ((rc = cu.retain(&g_ctx, dev)) != CUDA_SUCCESS)
    return refuse("cuDevicePrimaryCtxRetain", rc);
  int version = 0;
  (void)cu.version(&version);
  snprintf(g_desc, sizeof g_desc, "%s, driver %d.%d", name, version / 1000,
           version % 1000 / 10);
  return 0;
}

static void open_once(void) { g_rc = open_driver(); }

int cudapeer_open(char *why, size_t len) {
  (void)pthread_once(&g_once, open_once);
  if (g_rc != 0) {
    if (why != NULL && len > 0)
      snprintf(why, len, "%s", g_why);
    return -1;
  }
  if (cudapeer_enter() != 0) {
    if (why != NULL && len > 0)
      snprintf(why, len, "cuCtxSetCurrent: %s", cudapeer_last_error());
    return -1;
  }
  return 0;
}

const char *cudapeer_describe(void) { return g_desc; }

int cudapeer_enter(void) {
  if (g_rc != 0)
    return -1;
  t_last = cu.set_current(g_ctx);
  return t_last == CUDA_SUCCESS ? 0 : -1;
}

void *cudapeer_host_alloc(size_t size) {
  void *p = NULL;
  t_last = cu.host_alloc(&p, size, CU_MEMHOSTALLOC_PORTABLE);
  return t_last == CUDA_SUCCESS ? p : NULL;
}

int cudapeer_free_host(void *p) {
  t_last = cu.free_host(p);
  return t_last == CUDA_SUCCESS ? 0 : -1;
}

const char *cudapeer_last_error(void) { return err_name(t_last); }
