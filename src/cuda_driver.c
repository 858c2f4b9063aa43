/*
 * Loading the CUDA driver: dlopen("libcuda.so.1") (or $PINPOOL_LIBCUDA),
 * cuInit, entry points through cuGetProcAddress when the driver has it
 * (else dlsym of the versioned names cuda.h maps to), then the context the
 * pool will use: device N's primary context, or the one current at create.
 *
 * Every failure is PINPOOL_ENODRIVER with a message saying which, because
 * "no driver", "stub library", "no device" and "no context" are fixed in
 * different places (install a driver, fix LD_LIBRARY_PATH, pick a machine,
 * set device=N).
 */
#include "cuda_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The driver API version whose signatures cuda_driver.h declares. Asking
 * cuGetProcAddress for this version pins each name to that ABI even when a
 * newer driver has since added a _v3 with other arguments. */
#define PP_CUDA_API_VERSION 12000

_Static_assert(sizeof(void *) == sizeof(pp_cu_result_t(*)(void)),
               "entry points are stored through void *");

typedef struct entry {
  const char *name; /* as cuGetProcAddress wants it */
  const char *sym;  /* the exported name cuda.h maps `name` to */
  size_t off;       /* member of pp_cuda_t */
} entry_t;

#define ENTRY(fn, sym)                                                         \
  { #fn, sym, offsetof(pp_cuda_t, fn) }
static const entry_t entries[] = {
    ENTRY(cuDeviceGetCount, "cuDeviceGetCount"),
    ENTRY(cuDeviceGet, "cuDeviceGet"),
    ENTRY(cuCtxGetCurrent, "cuCtxGetCurrent"),
    ENTRY(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
    ENTRY(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
    ENTRY(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    ENTRY(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    ENTRY(cuMemHostAlloc, "cuMemHostAlloc"),
    ENTRY(cuMemFreeHost, "cuMemFreeHost"),
    ENTRY(cuMemHostRegister, "cuMemHostRegister_v2"),
    ENTRY(cuMemHostUnregister, "cuMemHostUnregister"),
    ENTRY(cuEventCreate, "cuEventCreate"),
    ENTRY(cuEventRecord, "cuEventRecord"),
    ENTRY(cuEventQuery, "cuEventQuery"),
    ENTRY(cuEventSynchronize, "cuEventSynchronize"),
    ENTRY(cuEventDestroy, "cuEventDestroy_v2"),
    ENTRY(cuStreamGetCaptureInfo, "cuStreamGetCaptureInfo_v2"),
    ENTRY(cuThreadExchangeStreamCaptureMode,
          "cuThreadExchangeStreamCaptureMode"),
};
#define NENTRIES (sizeof entries / sizeof entries[0])

typedef pp_cu_result_t (*getproc2_fn)(const char *, void **, int, pp_cu_u64_t,
                                      int *);
typedef pp_cu_result_t (*getproc1_fn)(const char *, void **, int, pp_cu_u64_t);

/* dlsym hands back an object pointer; POSIX guarantees it converts to the
 * function pointer it names. memcpy avoids type-punning through casts. */
static void set_fn(pp_cuda_t *c, size_t off, void *sym) {
  memcpy((char *)c + off, &sym, sizeof sym);
}

static void resolve(pp_cuda_t *c) {
  getproc2_fn gp2 = NULL;
  getproc1_fn gp1 = NULL;
  void *s = dlsym(c->lib, "cuGetProcAddress_v2");
  memcpy(&gp2, &s, sizeof s);
  if (gp2 == NULL) {
    s = dlsym(c->lib, "cuGetProcAddress");
    memcpy(&gp1, &s, sizeof s);
  }
  int version = PP_CUDA_API_VERSION;
  if (c->driver_version > 0 && c->driver_version < version)
    version = c->driver_version;
  for (size_t i = 0; i < NENTRIES; i++) {
    void *fn = NULL;
    /* A driver with cuGetProcAddress is asked only through it: for each
     * name it picks the variant of our ABI version with legacy stream-0
     * semantics, which guessing an exported name cannot promise. */
    if (gp2 != NULL) {
      int status = 0;
      if (gp2(entries[i].name, &fn, version,
              PP_CU_GET_PROC_ADDRESS_LEGACY_STREAM, &status) != PP_CU_SUCCESS)
        fn = NULL;
    } else if (gp1 != NULL) {
      if (gp1(entries[i].name, &fn, version,
              PP_CU_GET_PROC_ADDRESS_LEGACY_STREAM) != PP_CU_SUCCESS)
        fn = NULL;
    } else {
      fn = dlsym(c->lib, entries[i].sym);
    }
    set_fn(c, entries[i].off, fn);
  }
}

const char *pp_cuda_strerror(const pp_cuda_t *cuda, pp_cu_result_t rc,
                             char *buf, size_t len) {
  const char *name = NULL, *desc = NULL;
  if (cuda->cuGetErrorName == NULL ||
      cuda->cuGetErrorName(rc, &name) != PP_CU_SUCCESS)
    name = NULL;
  if (cuda->cuGetErrorString == NULL ||
      cuda->cuGetErrorString(rc, &desc) != PP_CU_SUCCESS)
    desc = NULL;
  if (name != NULL && desc != NULL)
    (void)snprintf(buf, len, "%s (%s)", name, desc);
  else if (name != NULL || desc != NULL)
    (void)snprintf(buf, len, "%s (%d)", name != NULL ? name : desc, rc);
  else
    (void)snprintf(buf, len, "CUDA error %d", rc);
  return buf;
}

pp_cu_result_t pp_cuda_push(const pp_cuda_t *cuda) {
  return cuda->cuCtxPushCurrent(cuda->ctx);
}

void pp_cuda_pop(const pp_cuda_t *cuda) {
  pp_cu_ctx_t popped = NULL;
  (void)cuda->cuCtxPopCurrent(&popped);
}

int pp_cuda_check_config(const pp_config_t *cfg) {
  if (cfg->backend == PP_BACKEND_CUDA && cfg->numa_node >= 0)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: key 'numa_node': numa_node requires backend=host "
                   "or cuda-register (cuMemHostAlloc cannot place memory)");
  return 0;
}

/* Everything after cuInit succeeded: devices and the context. */
static int pick_context(pp_cuda_t *c, const pp_config_t *cfg) {
  char err[128];
  int rc;
  if ((rc = PP_CUDA_REQUIRE(c, cuDeviceGetCount)) != 0 ||
      (rc = PP_CUDA_REQUIRE(c, cuDeviceGet)) != 0 ||
      (rc = PP_CUDA_REQUIRE(c, cuCtxGetCurrent)) != 0 ||
      (rc = PP_CUDA_REQUIRE(c, cuCtxPushCurrent)) != 0 ||
      (rc = PP_CUDA_REQUIRE(c, cuCtxPopCurrent)) != 0)
    return rc;
  int count = 0;
  pp_cu_result_t cr = c->cuDeviceGetCount(&count);
  if (cr == PP_CU_ERROR_NO_DEVICE || (cr == PP_CU_SUCCESS && count <= 0))
    return pp_fail(PINPOOL_ENODRIVER, "no CUDA device");
  if (cr != PP_CU_SUCCESS)
    return pp_fail(PINPOOL_ENODRIVER, "cuDeviceGetCount: %s",
                   pp_cuda_strerror(c, cr, err, sizeof err));
  if (cfg->device < 0) {
    /* The caller's context: we neither own it nor keep it alive. */
    pp_cu_ctx_t cur = NULL;
    cr = c->cuCtxGetCurrent(&cur);
    if (cr != PP_CU_SUCCESS || cur == NULL)
      return pp_fail(PINPOOL_ENODRIVER,
                     "no current CUDA context (set device=N)");
    c->ctx = cur;
    return 0;
  }
  if (cfg->device >= count)
    return pp_fail(PINPOOL_ENODRIVER,
                   "device=%d out of range (%d CUDA device%s)", cfg->device,
                   count, count == 1 ? "" : "s");
  if ((rc = PP_CUDA_REQUIRE(c, cuDevicePrimaryCtxRetain)) != 0 ||
      (rc = PP_CUDA_REQUIRE(c, cuDevicePrimaryCtxRelease)) != 0)
    return rc;
  cr = c->cuDeviceGet(&c->dev, cfg->device);
  if (cr != PP_CU_SUCCESS)
    return pp_fail(PINPOOL_ENODRIVER, "cuDeviceGet(%d): %s", cfg->device,
                   pp_cuda_strerror(c, cr, err, sizeof err));
  /* The primary context is the one the runtime API (and so most libraries)
   * uses for the device: memory we pin is visible to them. */
  cr = c->cuDevicePrimaryCtxRetain(&c->ctx, c->dev);
  if (cr != PP_CU_SUCCESS)
    return pp_fail(PINPOOL_ENODRIVER, "cuDevicePrimaryCtxRetain(%d): %s",
                   cfg->device, pp_cuda_strerror(c, cr, err, sizeof err));
  c->primary_held = true;
  return 0;
}

/* The process in which pinpool's cuInit succeeded (its pid, 0: none yet),
 * and whether this process is a fork() child of one (cuda_forked, set by
 * the atfork child handler, registered before the first cuInit). CUDA
 * does not support fork, and a driver call in such a child (cuInit
 * included) fails or hangs: pinpool does not make one there; a pool that
 * needs CUDA fails, and backend=auto chooses host. The fork is what
 * counts, not the pid: a child in a new PID namespace may have its
 * parent's pid (both pid 1). An initialization by other code of the
 * parent (a framework's) is not seen here (docs/configuration.md,
 * "backend=auto"). */
static _Atomic(int) cuda_init_pid;
static _Atomic(bool) cuda_forked;
static pthread_once_t cuda_atfork_once = PTHREAD_ONCE_INIT;

static void cuda_fork_child(void) {
  if (atomic_load_explicit(&cuda_init_pid, memory_order_relaxed) != 0)
    atomic_store_explicit(&cuda_forked, true, memory_order_relaxed);
}

static void cuda_atfork(void) {
  (void)pthread_atfork(NULL, NULL, cuda_fork_child);
}

int pp_cuda_open(const pp_config_t *cfg, pp_cuda_t **out) {
  int rc = pp_cuda_check_config(cfg);
  if (rc != 0)
    return rc;
  if (atomic_load_explicit(&cuda_forked, memory_order_relaxed))
    return pp_fail(PINPOOL_ENODRIVER,
                   "CUDA was initialized in process %d, which forked this "
                   "one: a forked child cannot use it (CUDA does not "
                   "support fork)",
                   atomic_load_explicit(&cuda_init_pid, memory_order_relaxed));
  (void)pthread_once(&cuda_atfork_once, cuda_atfork);
  const char *path = getenv("PINPOOL_LIBCUDA");
  if (path == NULL || path[0] == '\0')
    path = "libcuda.so.1";
  pp_cuda_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return pp_fail(PINPOOL_ENOMEM, "CUDA: out of memory");
  c->device = cfg->device;
  c->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (c->lib == NULL) {
    const char *why = dlerror();
    rc = pp_fail(PINPOOL_ENODRIVER, "CUDA driver not found (%s)",
                 why != NULL ? why : path);
    free(c);
    return rc;
  }
  set_fn(c, offsetof(pp_cuda_t, cuInit), dlsym(c->lib, "cuInit"));
  set_fn(c, offsetof(pp_cuda_t, cuDriverGetVersion),
         dlsym(c->lib, "cuDriverGetVersion"));
  set_fn(c, offsetof(pp_cuda_t, cuGetErrorString),
         dlsym(c->lib, "cuGetErrorString"));
  set_fn(c, offsetof(pp_cuda_t, cuGetErrorName),
         dlsym(c->lib, "cuGetErrorName"));
  if ((rc = PP_CUDA_REQUIRE(c, cuInit)) != 0) {
    (void)dlclose(c->lib);
    free(c);
    return rc;
  }
  pp_cu_result_t cr = c->cuInit(0);
  if (cr != PP_CU_SUCCESS) {
    char err[128];
    if (cr == PP_CU_ERROR_STUB_LIBRARY)
      rc = pp_fail(PINPOOL_ENODRIVER,
                   "CUDA stub library: no GPU driver installed (%s)", path);
    else if (cr == PP_CU_ERROR_NO_DEVICE)
      rc = pp_fail(PINPOOL_ENODRIVER, "no CUDA device");
    else
      rc = pp_fail(PINPOOL_ENODRIVER,
                   "CUDA driver failed to initialize: cuInit: %s",
                   pp_cuda_strerror(c, cr, err, sizeof err));
    (void)dlclose(c->lib);
    free(c);
    return rc;
  }
  atomic_store_explicit(&cuda_init_pid, (int)getpid(), memory_order_relaxed);
  /* From here on the library stays loaded for the life of the process: an
   * initialized driver keeps threads and handlers inside it, and unloading
   * it under them would crash. dlopen counts references, so later pools
   * share this mapping. */
  if (c->cuDriverGetVersion == NULL ||
      c->cuDriverGetVersion(&c->driver_version) != PP_CU_SUCCESS)
    c->driver_version = 0;
  resolve(c);
  rc = pick_context(c, cfg);
  if (rc != 0) {
    free(c);
    return rc;
  }
  *out = c;
  return 0;
}

void pp_cuda_close(pp_cuda_t *cuda) {
  if (cuda == NULL)
    return;
  if (cuda->primary_held)
    (void)cuda->cuDevicePrimaryCtxRelease(cuda->dev);
  free(cuda);
}
