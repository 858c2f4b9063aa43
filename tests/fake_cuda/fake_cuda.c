/*
 * A fake CUDA driver on host memory, for testing pinpool without a GPU
 * (fake_cuda.h describes the control API).
 *
 * It is strict where pinpool could go wrong unnoticed on a real driver:
 * calls without a current context fail (and are counted), every pointer
 * freed or unregistered must be one it handed out, and contexts must be
 * retained while used. It is race-free (one mutex guards all state) so that
 * it can run under ThreadSanitizer with the library.
 *
 * Build with -DFAKE_NO_PROC_ADDRESS to leave out cuGetProcAddress, which
 * makes pinpool fall back to dlsym of the exported names.
 */
#define _GNU_SOURCE
#include "fake_cuda.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEVICES 8
#define MAX_DEPTH 32
#define MAX_INJECT 16

/* Every entry point, by exported name. */
#define FAKE_ENTRIES(X)                                                        \
  X(cuInit)                                                                    \
  X(cuDriverGetVersion)                                                        \
  X(cuGetErrorString)                                                          \
  X(cuGetErrorName)                                                            \
  X(cuGetProcAddress)                                                          \
  X(cuDeviceGetCount)                                                          \
  X(cuDeviceGet)                                                               \
  X(cuDeviceGetName)                                                           \
  X(cuDevicePrimaryCtxRetain)                                                  \
  X(cuDevicePrimaryCtxRelease_v2)                                              \
  X(cuCtxGetCurrent)                                                           \
  X(cuCtxSetCurrent)                                                           \
  X(cuCtxPushCurrent_v2)                                                       \
  X(cuCtxPopCurrent_v2)                                                        \
  X(cuCtxSynchronize)                                                          \
  X(cuMemHostAlloc)                                                            \
  X(cuMemFreeHost)                                                             \
  X(cuMemHostRegister_v2)                                                      \
  X(cuMemHostUnregister)                                                       \
  X(cuPointerGetAttribute)                                                     \
  X(cuMemAlloc_v2)                                                             \
  X(cuMemFree_v2)                                                              \
  X(cuMemcpyHtoDAsync_v2)                                                      \
  X(cuMemcpyDtoHAsync_v2)                                                      \
  X(cuStreamCreate)                                                            \
  X(cuStreamDestroy_v2)                                                        \
  X(cuStreamSynchronize)                                                       \
  X(cuEventCreate)                                                             \
  X(cuEventRecord)                                                             \
  X(cuEventQuery)                                                              \
  X(cuEventSynchronize)                                                        \
  X(cuEventDestroy_v2)                                                         \
  X(cuStreamBeginCapture_v2)                                                   \
  X(cuStreamEndCapture)                                                        \
  X(cuStreamGetCaptureInfo_v2)                                                 \
  X(cuThreadExchangeStreamCaptureMode)                                         \
  X(cuGraphDestroy)                                                            \
  X(cuGraphInstantiateWithFlags)                                               \
  X(cuGraphLaunch)                                                             \
  X(cuGraphExecDestroy)

#define AS_ENUM(n) E_##n,
enum { FAKE_ENTRIES(AS_ENUM) E_COUNT };
#define AS_NAME(n) #n,
static const char *const entry_names[] = {FAKE_ENTRIES(AS_NAME)};

/* ---- State ---------------------------------------------------------------
 * All of it under g.mu, except the per-thread context stack. */
typedef struct fstream fstream_t;

typedef struct fctx {
  int device;
  int refs;               /* primary context retains */
  fstream_t *null_stream; /* stream 0, started on first use */
} fctx_t;

typedef struct fevent {
  fctx_t *ctx;
  uint64_t recorded;  /* records so far */
  uint64_t completed; /* highest record whose marker the stream reached */
  int error;          /* the latest completed record failed with this */
  int pending_ops;    /* markers still queued: freed after the last */
  bool destroyed;
  bool captured; /* last recorded inside a capture: no time to query */
} fevent_t;

/* A capture sequence (one stream each: the fake does not join streams). */
typedef struct fcapture {
  uint64_t id;
  int mode;   /* CU_STREAM_CAPTURE_MODE_* given to cuStreamBeginCapture */
  int status; /* ACTIVE or INVALIDATED */
  const void *owner; /* the thread that began it (its tl_token) */
  long long nodes;   /* operations captured */
} fcapture_t;

enum { OP_MARKER, OP_COPY, OP_FN, OP_STOP };
typedef struct op {
  struct op *next;
  int kind;
  unsigned extra_us;
  fevent_t *ev; /* OP_MARKER */
  uint64_t seq;
  int err;
  void *dst; /* OP_COPY */
  const void *src;
  size_t n;
  void (*fn)(void *); /* OP_FN */
  void *arg;
} op_t;

struct fstream {
  fctx_t *ctx;
  pthread_t thread;
  pthread_cond_t wake;
  op_t *head, *tail;
  uint64_t queued, done;
  int delay_us;             /* < 0: g.delay_us */
  fcapture_t *cap;          /* capturing: work becomes nodes, not operations */
  struct fstream *cap_next; /* g.capturing list */
};

typedef struct range {
  uintptr_t base; /* what the caller got */
  size_t size;
  void *map; /* what to unmap / free */
  size_t map_size;
} range_t;

typedef struct ranges {
  range_t *v;
  size_t n, cap;
} ranges_t;

typedef struct inject {
  int entry; /* -1: free slot; E_cuEventRecord + async for event faults */
  unsigned countdown;
  int code;
  bool async_event;
} inject_t;

static struct {
  pthread_mutex_t mu;
  pthread_cond_t done_cv; /* broadcast whenever a stream operation ends */
  bool initialized;
  pid_t init_pid;         /* the process whose cuInit succeeded */
  long long forked_inits; /* cuInit in a fork() child of that process */
  int init_result;
  int device_count;
  int delay_us;
  int driver_version;
  int misalign;
  /* The time pinning takes: cuMemHostAlloc and cuMemHostRegister sleep
   * this many microseconds per GiB (docs/cuda.md records 0.1-0.45 s/GiB
   * on real drivers), after the driver lock is dropped. */
  long long pin_us_per_gib;
  fctx_t ctxs[MAX_DEVICES];
  long long calls[E_COUNT];
  long long ctx_errors, bad_calls, pushes, pops;
  long long live_events, live_streams;
  long long last_host_alloc_flags, last_register_flags, last_event_flags;
  long long last_proc_flags;
  long long ops_pending;
  ranges_t host, reg, dev;
  inject_t inj[MAX_INJECT];
  char hidden[1024];             /* ",a,b," for substring search */
  fstream_t *capturing;          /* streams with a capture */
  uint64_t next_capture_id;      /* ids handed out (never 0) */
  long long captured_records;    /* cuEventRecord on a capturing stream */
  long long capture_violations;  /* unsafe calls that broke a capture */
  long long captured_event_uses; /* query/sync of an event recorded in one */
  long long live_graphs;
} g = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .done_cv = PTHREAD_COND_INITIALIZER,
    .device_count = 1,
    .driver_version = 12080,
    .last_host_alloc_flags = -1,
    .last_register_flags = -1,
    .last_event_flags = -1,
    .last_proc_flags = -1,
};

static _Thread_local fctx_t *tl_stack[MAX_DEPTH];
static _Thread_local int tl_depth;
/* The thread's capture interaction mode (cuThreadExchangeStreamCaptureMode;
 * GLOBAL by default), and an address that names the thread. */
static _Thread_local int tl_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static _Thread_local char tl_token;

static void lock(void) { (void)pthread_mutex_lock(&g.mu); }
static void unlock(void) { (void)pthread_mutex_unlock(&g.mu); }

static void set_hidden_locked(const char *names) {
  g.hidden[0] = '\0';
  if (names != NULL && names[0] != '\0')
    (void)snprintf(g.hidden, sizeof g.hidden, ",%s,", names);
}

__attribute__((constructor)) static void fake_init(void) {
  for (int i = 0; i < MAX_INJECT; i++)
    g.inj[i].entry = -1;
  for (int i = 0; i < MAX_DEVICES; i++)
    g.ctxs[i].device = i;
  const char *d = getenv("FAKE_CUDA_DELAY_US");
  if (d != NULL)
    g.delay_us = atoi(d);
  const char *pin = getenv("FAKE_CUDA_PIN_US_PER_GIB");
  if (pin != NULL)
    g.pin_us_per_gib = atoll(pin);
  set_hidden_locked(getenv("FAKE_CUDA_HIDE"));
}

/* ---- Ranges ----------------------------------------------------------- */
static int ranges_add(ranges_t *r, range_t x) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 64;
    range_t *v = realloc(r->v, cap * sizeof *v);
    if (v == NULL)
      return -1;
    r->v = v;
    r->cap = cap;
  }
  r->v[r->n++] = x;
  return 0;
}

/* Index of the range starting at p, or -1. */
static long ranges_find(const ranges_t *r, uintptr_t p) {
  for (size_t i = 0; i < r->n; i++)
    if (r->v[i].base == p)
      return (long)i;
  return -1;
}

/* Index of a range containing [p, p+n), or -1. */
static long ranges_containing(const ranges_t *r, uintptr_t p, size_t n) {
  for (size_t i = 0; i < r->n; i++)
    if (p >= r->v[i].base && n <= r->v[i].size &&
        p - r->v[i].base <= r->v[i].size - n)
      return (long)i;
  return -1;
}

static bool ranges_overlap(const ranges_t *r, uintptr_t p, size_t n) {
  for (size_t i = 0; i < r->n; i++)
    if (p < r->v[i].base + r->v[i].size && r->v[i].base < p + n)
      return true;
  return false;
}

static range_t ranges_take(ranges_t *r, long i) {
  range_t x = r->v[i];
  r->v[i] = r->v[--r->n];
  return x;
}

static long long ranges_bytes(const ranges_t *r) {
  long long b = 0;
  for (size_t i = 0; i < r->n; i++)
    b += (long long)r->v[i].size;
  return b;
}

/* ---- Entry bookkeeping -------------------------------------------------- */
enum { NEED_INIT = 1, NEED_CTX = 2 };

static fctx_t *current(void) {
  return tl_depth > 0 ? tl_stack[tl_depth - 1] : NULL;
}

static bool valid_ctx_locked(const fctx_t *c) {
  for (int i = 0; i < g.device_count && i < MAX_DEVICES; i++)
    if (c == &g.ctxs[i])
      return c->refs > 0;
  return false;
}

/* Count the call, then fail it if injected, before cuInit, or without a
 * usable current context. Returns with g.mu held. */
static CUresult enter_locked(int id, int need) {
  lock();
  g.calls[id]++;
  /* Every armed injection counts this call, even when one fires. */
  CUresult injected = CUDA_SUCCESS;
  for (int i = 0; i < MAX_INJECT; i++) {
    inject_t *in = &g.inj[i];
    if (in->entry == id && !in->async_event && --in->countdown == 0) {
      in->entry = -1;
      if (injected == CUDA_SUCCESS)
        injected = in->code;
    }
  }
  if (injected != CUDA_SUCCESS)
    return injected;
  if ((need & NEED_INIT) && !g.initialized)
    return CUDA_ERROR_NOT_INITIALIZED;
  if ((need & NEED_CTX) &&
      (current() == NULL || !valid_ctx_locked(current()))) {
    g.ctx_errors++;
    return CUDA_ERROR_INVALID_CONTEXT;
  }
  return CUDA_SUCCESS;
}

/* enter_locked, for calls that need nothing more under the lock. */
static CUresult enter(int id, int need) {
  CUresult rc = enter_locked(id, need);
  unlock();
  return rc;
}

/* ---- Streams ------------------------------------------------------------ */
static void sleep_us(unsigned us) {
  if (us == 0)
    return;
  struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void complete_marker_locked(op_t *o) {
  fevent_t *ev = o->ev;
  if (o->seq > ev->completed)
    ev->completed = o->seq;
  if (o->seq == ev->recorded)
    ev->error = o->err;
  if (--ev->pending_ops == 0 && ev->destroyed)
    free(ev);
}

static void *stream_main(void *arg) {
  fstream_t *s = arg;
  lock();
  for (;;) {
    while (s->head == NULL)
      (void)pthread_cond_wait(&s->wake, &g.mu);
    op_t *o = s->head;
    s->head = o->next;
    if (s->head == NULL)
      s->tail = NULL;
    if (o->kind == OP_STOP) {
      free(o);
      break;
    }
    unsigned us =
        (unsigned)(s->delay_us >= 0 ? s->delay_us : g.delay_us) + o->extra_us;
    unlock();
    sleep_us(us);
    /* The "DMA": outside the lock, as a device would not wait for us. */
    if (o->kind == OP_COPY)
      memcpy(o->dst, o->src, o->n);
    else if (o->kind == OP_FN && o->fn != NULL)
      o->fn(o->arg);
    lock();
    if (o->kind == OP_MARKER)
      complete_marker_locked(o);
    s->done++;
    g.ops_pending--;
    (void)pthread_cond_broadcast(&g.done_cv);
    free(o);
  }
  unlock();
  return NULL;
}

static fstream_t *stream_new_locked(fctx_t *ctx) {
  fstream_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
  s->ctx = ctx;
  s->delay_us = -1;
  (void)pthread_cond_init(&s->wake, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    (void)pthread_cond_destroy(&s->wake);
    free(s);
    return NULL;
  }
  return s;
}

/* Stream 0 of ctx. Never stopped: it lives as long as the process (the
 * library is linked -z nodelete, so its code does too). */
static fstream_t *null_stream_locked(fctx_t *ctx) {
  if (ctx->null_stream == NULL)
    ctx->null_stream = stream_new_locked(ctx);
  return ctx->null_stream;
}

static fstream_t *resolve_stream_locked(CUstream stream) {
  if (stream != NULL)
    return (fstream_t *)(void *)stream;
  fctx_t *c = current();
  return null_stream_locked(c != NULL ? c : &g.ctxs[0]);
}

static void push_op_locked(fstream_t *s, op_t *o) {
  o->next = NULL;
  if (s->tail != NULL)
    s->tail->next = o;
  else
    s->head = o;
  s->tail = o;
  if (o->kind != OP_STOP) {
    s->queued++;
    g.ops_pending++;
  }
  (void)pthread_cond_signal(&s->wake);
}

/* ---- Capture ------------------------------------------------------------
 * As the driver documents cuThreadExchangeStreamCaptureMode: a thread in
 * mode GLOBAL may not make a potentially unsafe call (here: cuEventQuery,
 * cuEventSynchronize) while it has a capture of its own not begun RELAXED,
 * or while any other thread has one begun GLOBAL; THREAD_LOCAL only minds
 * its own; RELAXED minds none. Such a call fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures it
 * conflicts with (counted: capture_violations). */
/* Work for stream s (copies, graph launches): while s captures, a node of
 * the graph and nothing runs now; else *o, set to `op`, goes to the
 * stream's worker, which then owns it (*o becomes NULL). */
static void queue_or_capture_locked(fstream_t *s, op_t **o, op_t op) {
  if (s->cap != NULL) {
    s->cap->nodes++;
    return;
  }
  **o = op;
  push_op_locked(s, *o);
  *o = NULL;
}

static CUresult unsafe_call_locked(void) {
  if (tl_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
    return CUDA_SUCCESS;
  bool bad = false;
  for (fstream_t *s = g.capturing; s != NULL; s = s->cap_next) {
    fcapture_t *c = s->cap;
    bool mine = c->owner == &tl_token;
    if ((mine && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED) ||
        (!mine && tl_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
         c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL)) {
      c->status = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
      bad = true;
    }
  }
  if (!bad)
    return CUDA_SUCCESS;
  g.capture_violations++;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

/* ---- Errors ------------------------------------------------------------- */
typedef struct err_desc {
  int code;
  const char *name, *text;
} err_desc_t;
static const err_desc_t errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in "
     "the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED",
     "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED",
     "pointer does not correspond to a registered memory region"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {906, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking "
     "stream"},
    {907, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing "
     "stream"},
    {908, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another "
     "thread"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const err_desc_t *find_error(CUresult rc) {
  for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
    if (errors[i].code == rc)
      return &errors[i];
  return NULL;
}

/* cuGetErrorString and cuGetErrorName: the same lookup, either field. */
static CUresult describe_error(int id, CUresult rc, const char **s, bool name) {
  (void)enter(id, 0);
  const err_desc_t *e = find_error(rc);
  *s = e == NULL ? NULL : name ? e->name : e->text;
  return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult rc, const char **s) {
  return describe_error(E_cuGetErrorString, rc, s, false);
}

CUresult cuGetErrorName(CUresult rc, const char **s) {
  return describe_error(E_cuGetErrorName, rc, s, true);
}

/* ---- Init, devices, contexts ------------------------------------------ */
CUresult cuInit(unsigned flags) {
  CUresult rc = enter_locked(E_cuInit, 0);
  if (rc == CUDA_SUCCESS && flags != 0)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    rc = g.init_result;
  /* CUDA does not support fork(): a driver initialized in the parent is
   * unusable in the child, whose calls fail (or hang) on real drivers.
   * Here the child's cuInit is counted and fails. */
  if (rc == CUDA_SUCCESS && g.initialized && g.init_pid != getpid()) {
    g.forked_inits++;
    rc = CUDA_ERROR_NOT_INITIALIZED;
  }
  if (rc == CUDA_SUCCESS) {
    g.initialized = true;
    g.init_pid = getpid();
  }
  unlock();
  return rc;
}

CUresult cuDriverGetVersion(int *version) {
  CUresult rc = enter_locked(E_cuDriverGetVersion, 0);
  if (rc == CUDA_SUCCESS)
    *version = g.driver_version;
  unlock();
  return rc;
}

CUresult cuDeviceGetCount(int *count) {
  CUresult rc = enter_locked(E_cuDeviceGetCount, NEED_INIT);
  if (rc == CUDA_SUCCESS)
    *count = g.device_count;
  unlock();
  return rc;
}

/* enter_locked for an entry point that takes a device ordinal. */
static CUresult enter_device_locked(int id, int dev) {
  CUresult rc = enter_locked(id, NEED_INIT);
  if (rc == CUDA_SUCCESS && (dev < 0 || dev >= g.device_count))
    rc = CUDA_ERROR_INVALID_DEVICE;
  return rc;
}

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
  CUresult rc = enter_device_locked(E_cuDeviceGet, ordinal);
  if (rc == CUDA_SUCCESS)
    *dev = ordinal;
  unlock();
  return rc;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
  CUresult rc = enter_locked(E_cuDeviceGetName, NEED_INIT);
  if (rc == CUDA_SUCCESS && (dev < 0 || dev >= g.device_count || len <= 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    (void)snprintf(name, (size_t)len, "pinpool fake CUDA device %d", dev);
  unlock();
  return rc;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
  CUresult rc = enter_device_locked(E_cuDevicePrimaryCtxRetain, dev);
  if (rc == CUDA_SUCCESS) {
    g.ctxs[dev].refs++;
    *ctx = (CUcontext)(void *)&g.ctxs[dev];
  }
  unlock();
  return rc;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  CUresult rc = enter_locked(E_cuDevicePrimaryCtxRelease_v2, NEED_INIT);
  if (rc == CUDA_SUCCESS && (dev < 0 || dev >= MAX_DEVICES))
    rc = CUDA_ERROR_INVALID_DEVICE;
  if (rc == CUDA_SUCCESS && g.ctxs[dev].refs == 0) {
    g.bad_calls++;
    rc = CUDA_ERROR_INVALID_CONTEXT;
  }
  if (rc == CUDA_SUCCESS)
    g.ctxs[dev].refs--;
  unlock();
  return rc;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) {
  CUresult rc = enter(E_cuCtxGetCurrent, NEED_INIT);
  if (rc == CUDA_SUCCESS)
    *ctx = (CUcontext)(void *)current();
  return rc;
}

CUresult cuCtxSetCurrent(CUcontext ctx) {
  fctx_t *c = (fctx_t *)(void *)ctx;
  CUresult rc = enter_locked(E_cuCtxSetCurrent, NEED_INIT);
  if (rc == CUDA_SUCCESS && c != NULL && !valid_ctx_locked(c)) {
    g.ctx_errors++;
    rc = CUDA_ERROR_INVALID_CONTEXT;
  }
  unlock();
  if (rc != CUDA_SUCCESS)
    return rc;
  /* As the driver: replace the top of the stack (NULL empties that slot). */
  if (c == NULL) {
    if (tl_depth > 0)
      tl_depth--;
  } else if (tl_depth > 0) {
    tl_stack[tl_depth - 1] = c;
  } else {
    tl_stack[tl_depth++] = c;
  }
  return CUDA_SUCCESS;
}

CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  fctx_t *c = (fctx_t *)(void *)ctx;
  CUresult rc = enter_locked(E_cuCtxPushCurrent_v2, NEED_INIT);
  if (rc == CUDA_SUCCESS && (c == NULL || !valid_ctx_locked(c))) {
    g.ctx_errors++;
    rc = CUDA_ERROR_INVALID_CONTEXT;
  }
  if (rc == CUDA_SUCCESS && tl_depth == MAX_DEPTH) {
    g.bad_calls++;
    rc = CUDA_ERROR_INVALID_VALUE;
  }
  if (rc == CUDA_SUCCESS) {
    g.pushes++;
    tl_stack[tl_depth++] = c;
  }
  unlock();
  return rc;
}

CUresult cuCtxPopCurrent_v2(CUcontext *ctx) {
  CUresult rc = enter_locked(E_cuCtxPopCurrent_v2, NEED_INIT);
  if (rc == CUDA_SUCCESS && tl_depth == 0) {
    g.bad_calls++;
    rc = CUDA_ERROR_INVALID_CONTEXT;
  }
  if (rc == CUDA_SUCCESS) {
    g.pops++;
    fctx_t *c = tl_stack[--tl_depth];
    if (ctx != NULL)
      *ctx = (CUcontext)(void *)c;
  }
  unlock();
  return rc;
}

/* Wait until every stream has run dry (the fake does not track which
 * context queued what: stricter than the driver, never looser). */
CUresult cuCtxSynchronize(void) {
  CUresult rc = enter_locked(E_cuCtxSynchronize, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS)
    while (g.ops_pending > 0)
      (void)pthread_cond_wait(&g.done_cv, &g.mu);
  unlock();
  return rc;
}

/* ---- Host memory ------------------------------------------------------- */
/* pin_us_per_gib: the cost of pinning `size` bytes, slept with no lock. */
static void pin_sleep(long long us_per_gib, size_t size) {
  if (us_per_gib <= 0)
    return;
  uint64_t ns = (uint64_t)((double)us_per_gib * 1000.0 * (double)size /
                           (double)(1ull << 30));
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

CUresult cuMemHostAlloc(void **p, size_t size, unsigned flags) {
  CUresult rc = enter_locked(E_cuMemHostAlloc, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (p == NULL || size == 0 || (flags & ~7u) != 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    g.last_host_alloc_flags = flags;
    size_t off = g.misalign ? 64 : 0;
    size_t len = (size + off + 4095) & ~(size_t)4095;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      range_t r = {(uintptr_t)m + off, size, m, len};
      if (ranges_add(&g.host, r) != 0) {
        (void)munmap(m, len);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
      } else {
        *p = (void *)r.base;
      }
    }
  }
  long long pin = g.pin_us_per_gib;
  unlock();
  if (rc == CUDA_SUCCESS)
    pin_sleep(pin, size);
  return rc;
}

/* The entry points that give back a range (cuMemFreeHost,
 * cuMemHostUnregister, cuMemFree_v2): `p` must start one of `rs`, else the
 * call is a bad one and fails with `unknown`. The range taken goes to
 * *out ({0} if none), for the caller to unmap or free outside the lock. */
static CUresult give_back_range(int id, ranges_t *rs, uintptr_t p,
                                CUresult unknown, range_t *out) {
  CUresult rc = enter_locked(id, NEED_INIT | NEED_CTX);
  *out = (range_t){0, 0, NULL, 0};
  if (rc == CUDA_SUCCESS) {
    long i = ranges_find(rs, p);
    if (i < 0) {
      g.bad_calls++;
      rc = unknown;
    } else {
      *out = ranges_take(rs, i);
    }
  }
  unlock();
  return rc;
}

CUresult cuMemFreeHost(void *p) {
  range_t r;
  CUresult rc = give_back_range(E_cuMemFreeHost, &g.host, (uintptr_t)p,
                                CUDA_ERROR_INVALID_VALUE, &r);
  if (r.map != NULL)
    (void)munmap(r.map, r.map_size);
  return rc;
}

CUresult cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
  CUresult rc = enter_locked(E_cuMemHostRegister_v2, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (p == NULL || size == 0 || (flags & ~0xfu) != 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && ranges_overlap(&g.reg, (uintptr_t)p, size)) {
    g.bad_calls++;
    rc = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
  }
  if (rc == CUDA_SUCCESS) {
    g.last_register_flags = flags;
    range_t r = {(uintptr_t)p, size, NULL, 0};
    if (ranges_add(&g.reg, r) != 0)
      rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  long long pin = g.pin_us_per_gib;
  unlock();
  if (rc == CUDA_SUCCESS)
    pin_sleep(pin, size);
  return rc;
}

CUresult cuMemHostUnregister(void *p) {
  range_t r; /* the caller's memory: nothing to unmap */
  return give_back_range(E_cuMemHostUnregister, &g.reg, (uintptr_t)p,
                         CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, &r);
}

/* What the driver knows of any address inside a range it allocated or
 * registered (interior pointers included: the driver answers for every
 * byte of a registration), or of device memory. */
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr) {
  CUresult rc = enter_locked(E_cuPointerGetAttribute, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && data == NULL)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    uintptr_t p = (uintptr_t)ptr;
    int type = ranges_containing(&g.host, p, 1) >= 0 ||
                       ranges_containing(&g.reg, p, 1) >= 0
                   ? CU_MEMORYTYPE_HOST
               : ranges_containing(&g.dev, p, 1) >= 0 ? CU_MEMORYTYPE_DEVICE
                                                      : 0;
    if (type == 0)
      rc = CUDA_ERROR_INVALID_VALUE; /* not memory the driver knows */
    else if (attribute == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
      *(unsigned *)data = (unsigned)type;
    else if (attribute == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
      *(int *)data = current()->device;
    else
      rc = CUDA_ERROR_INVALID_VALUE;
  }
  unlock();
  return rc;
}

/* ---- Device memory and copies ------------------------------------------ */
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
  CUresult rc = enter_locked(E_cuMemAlloc_v2, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (dptr == NULL || size == 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    void *m = malloc(size);
    range_t r = {(uintptr_t)m, size, m, size};
    if (m == NULL || ranges_add(&g.dev, r) != 0) {
      free(m);
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      *dptr = (CUdeviceptr)r.base;
    }
  }
  unlock();
  return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) {
  range_t r;
  CUresult rc = give_back_range(E_cuMemFree_v2, &g.dev, (uintptr_t)dptr,
                                CUDA_ERROR_INVALID_VALUE, &r);
  free(r.map);
  return rc;
}

static CUresult copy_async(int id, void *dst, const void *src, size_t n,
                           uintptr_t dev_side, CUstream stream) {
  CUresult rc = enter_locked(id, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && ranges_containing(&g.dev, dev_side, n) < 0)
    rc = CUDA_ERROR_INVALID_VALUE;
  op_t *o = NULL;
  fstream_t *s = NULL;
  if (rc == CUDA_SUCCESS) {
    s = resolve_stream_locked(stream);
    o = calloc(1, sizeof *o);
    if (s == NULL || o == NULL)
      rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  if (rc == CUDA_SUCCESS && s->ctx != current()) {
    g.ctx_errors++;
    rc = CUDA_ERROR_INVALID_CONTEXT;
  }
  if (rc == CUDA_SUCCESS)
    queue_or_capture_locked(
        s, &o, (op_t){.kind = OP_COPY, .dst = dst, .src = src, .n = n});
  unlock();
  free(o);
  return rc;
}

CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n,
                              CUstream stream) {
  return copy_async(E_cuMemcpyHtoDAsync_v2, (void *)(uintptr_t)dst, src, n,
                    (uintptr_t)dst, stream);
}

CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n,
                              CUstream stream) {
  return copy_async(E_cuMemcpyDtoHAsync_v2, dst, (const void *)(uintptr_t)src,
                    n, (uintptr_t)src, stream);
}

/* ---- Streams ------------------------------------------------------------- */
CUresult cuStreamCreate(CUstream *stream, unsigned flags) {
  CUresult rc = enter_locked(E_cuStreamCreate, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (stream == NULL || (flags & ~1u) != 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    fstream_t *s = stream_new_locked(current());
    if (s == NULL) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      g.live_streams++;
      *stream = (CUstream)(void *)s;
    }
  }
  unlock();
  return rc;
}

CUresult cuStreamDestroy_v2(CUstream stream) {
  fstream_t *s = (fstream_t *)(void *)stream;
  op_t *stop = calloc(1, sizeof *stop);
  CUresult rc = enter_locked(E_cuStreamDestroy_v2, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (s == NULL || stop == NULL))
    rc = s == NULL ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    /* Queued work still runs, as on a device; the worker stops after. */
    stop->kind = OP_STOP;
    push_op_locked(s, stop);
    stop = NULL;
    g.live_streams--;
  }
  unlock();
  free(stop);
  if (rc == CUDA_SUCCESS) {
    (void)pthread_join(s->thread, NULL);
    (void)pthread_cond_destroy(&s->wake);
    free(s);
  }
  return rc;
}

CUresult cuStreamSynchronize(CUstream stream) {
  CUresult rc = enter_locked(E_cuStreamSynchronize, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS) {
    fstream_t *s = resolve_stream_locked(stream);
    if (s == NULL)
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    else
      while (s->done < s->queued)
        (void)pthread_cond_wait(&g.done_cv, &g.mu);
  }
  unlock();
  return rc;
}

/* ---- Events ------------------------------------------------------------ */
CUresult cuEventCreate(CUevent *ev, unsigned flags) {
  CUresult rc = enter_locked(E_cuEventCreate, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (ev == NULL || (flags & ~0xfu) != 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    fevent_t *e = calloc(1, sizeof *e);
    if (e == NULL) {
      rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
      e->ctx = current();
      g.last_event_flags = flags;
      g.live_events++;
      *ev = (CUevent)(void *)e;
    }
  }
  unlock();
  return rc;
}

static bool event_usable_locked(const fevent_t *e) {
  if (e != NULL && !e->destroyed)
    return true;
  g.bad_calls++;
  return false;
}

CUresult cuEventRecord(CUevent ev, CUstream stream) {
  fevent_t *e = (fevent_t *)(void *)ev;
  op_t *o = calloc(1, sizeof *o);
  CUresult rc = enter_locked(E_cuEventRecord, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && !event_usable_locked(e))
    rc = CUDA_ERROR_INVALID_HANDLE;
  fstream_t *s = NULL;
  if (rc == CUDA_SUCCESS) {
    s = resolve_stream_locked(stream);
    if (s == NULL || o == NULL)
      rc = CUDA_ERROR_OUT_OF_MEMORY;
  }
  /* The event, the stream and the current context must agree. */
  if (rc == CUDA_SUCCESS && (s->ctx != current() || e->ctx != current())) {
    g.ctx_errors++;
    rc = CUDA_ERROR_INVALID_CONTEXT;
  }
  if (rc == CUDA_SUCCESS && s->cap != NULL) {
    /* In a capture an event record is a node of the graph: it marks no
     * point in time, and the event may not be queried until recorded again
     * outside a capture. */
    s->cap->nodes++;
    e->captured = true;
    g.captured_records++;
  } else if (rc == CUDA_SUCCESS) {
    int err = 0;
    e->captured = false;
    for (int i = 0; i < MAX_INJECT; i++) {
      inject_t *in = &g.inj[i];
      if (in->entry == E_cuEventRecord && in->async_event &&
          --in->countdown == 0) {
        in->entry = -1;
        if (err == 0)
          err = in->code;
      }
    }
    *o = (op_t){.kind = OP_MARKER, .ev = e, .seq = ++e->recorded, .err = err};
    e->error = 0;
    e->pending_ops++;
    push_op_locked(s, o);
    o = NULL;
  }
  unlock();
  free(o);
  return rc;
}

/* cuEventQuery and cuEventSynchronize: the same checks; a query answers
 * NOT_READY where a synchronize waits. */
static CUresult event_status(int id, CUevent ev, bool wait) {
  fevent_t *e = (fevent_t *)(void *)ev;
  CUresult rc = enter_locked(id, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && !event_usable_locked(e))
    rc = CUDA_ERROR_INVALID_HANDLE;
  if (rc == CUDA_SUCCESS)
    rc = unsafe_call_locked();
  if (rc == CUDA_SUCCESS && e->captured) {
    g.captured_event_uses++;
    rc = CUDA_ERROR_CAPTURED_EVENT;
  } else if (rc == CUDA_SUCCESS) {
    while (wait && e->completed < e->recorded)
      (void)pthread_cond_wait(&g.done_cv, &g.mu);
    rc = e->completed < e->recorded ? CUDA_ERROR_NOT_READY : e->error;
  }
  unlock();
  return rc;
}

CUresult cuEventQuery(CUevent ev) {
  return event_status(E_cuEventQuery, ev, false);
}

CUresult cuEventSynchronize(CUevent ev) {
  return event_status(E_cuEventSynchronize, ev, true);
}

CUresult cuEventDestroy_v2(CUevent ev) {
  fevent_t *e = (fevent_t *)(void *)ev;
  CUresult rc = enter_locked(E_cuEventDestroy_v2, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && !event_usable_locked(e))
    rc = CUDA_ERROR_INVALID_HANDLE;
  bool free_now = false;
  if (rc == CUDA_SUCCESS) {
    /* As the driver: a pending record still completes; the memory goes
     * when its last marker is done. */
    e->destroyed = true;
    free_now = e->pending_ops == 0;
    g.live_events--;
  }
  unlock();
  if (free_now)
    free(e);
  return rc;
}

/* ---- Graph capture --------------------------------------------------------
 */
CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  fstream_t *s = (fstream_t *)(void *)stream;
  CUresult rc = enter_locked(E_cuStreamBeginCapture_v2, NEED_INIT | NEED_CTX);
  fcapture_t *c = NULL;
  if (rc == CUDA_SUCCESS && (mode < 0 || mode > 2))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && s == NULL) /* the legacy stream cannot capture */
    rc = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (rc == CUDA_SUCCESS && s->cap != NULL)
    rc = CUDA_ERROR_ILLEGAL_STATE;
  if (rc == CUDA_SUCCESS && (c = calloc(1, sizeof *c)) == NULL)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    *c = (fcapture_t){++g.next_capture_id, mode,
                      CU_STREAM_CAPTURE_STATUS_ACTIVE, &tl_token, 0};
    s->cap = c;
    s->cap_next = g.capturing;
    g.capturing = s;
  }
  unlock();
  return rc;
}

CUresult cuStreamEndCapture(CUstream stream, CUgraph *graph) {
  fstream_t *s = (fstream_t *)(void *)stream;
  CUresult rc = enter_locked(E_cuStreamEndCapture, NEED_INIT | NEED_CTX);
  fcapture_t *c = NULL;
  if (rc == CUDA_SUCCESS && (graph == NULL || s == NULL))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS && s->cap == NULL)
    rc = CUDA_ERROR_ILLEGAL_STATE;
  if (rc == CUDA_SUCCESS && s->cap->mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
      s->cap->owner != &tl_token)
    rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  if (rc == CUDA_SUCCESS) {
    c = s->cap;
    s->cap = NULL;
    for (fstream_t **ps = &g.capturing; *ps != NULL; ps = &(*ps)->cap_next)
      if (*ps == s) {
        *ps = s->cap_next;
        break;
      }
    *graph = NULL;
    if (c->status != CU_STREAM_CAPTURE_STATUS_ACTIVE) {
      rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    } else {
      long long *nodes = malloc(sizeof *nodes); /* the "graph" */
      if (nodes == NULL) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
      } else {
        *nodes = c->nodes;
        g.live_graphs++;
        *graph = (CUgraph)(void *)nodes;
      }
    }
  }
  unlock();
  free(c);
  return rc;
}

CUresult cuStreamGetCaptureInfo_v2(CUstream stream, int *status, cuuint64_t *id,
                                   CUgraph *graph, const CUgraphNode **deps,
                                   size_t *ndeps) {
  fstream_t *s = (fstream_t *)(void *)stream;
  CUresult rc = enter_locked(E_cuStreamGetCaptureInfo_v2, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && status == NULL)
    rc = CUDA_ERROR_INVALID_VALUE;
  /* The legacy stream while a capture runs (the fake takes every stream
   * as blocking): the driver refuses to answer. */
  if (rc == CUDA_SUCCESS && s == NULL && g.capturing != NULL)
    rc = CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  if (rc == CUDA_SUCCESS) {
    fcapture_t *c = s != NULL ? s->cap : NULL;
    *status = c != NULL ? c->status : CU_STREAM_CAPTURE_STATUS_NONE;
    if (id != NULL && c != NULL)
      *id = c->id;
    if (graph != NULL)
      *graph = NULL;
    if (deps != NULL)
      *deps = NULL;
    if (ndeps != NULL)
      *ndeps = 0;
  }
  unlock();
  return rc;
}

CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
  CUresult rc = enter(E_cuThreadExchangeStreamCaptureMode, NEED_INIT);
  if (rc == CUDA_SUCCESS && (mode == NULL || *mode < 0 || *mode > 2))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    int old = tl_capture_mode;
    tl_capture_mode = *mode;
    *mode = old;
  }
  return rc;
}

/* cuGraphDestroy and cuGraphExecDestroy: both are a heap node count that
 * counts in live_graphs. */
static CUresult graph_free(int id, void *graph) {
  CUresult rc = enter_locked(id, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && graph == NULL)
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS)
    g.live_graphs--;
  unlock();
  if (rc == CUDA_SUCCESS)
    free(graph);
  return rc;
}

CUresult cuGraphDestroy(CUgraph graph) {
  return graph_free(E_cuGraphDestroy, (void *)graph);
}

/* An executable graph runs nothing (the fake keeps no nodes' work): a
 * launch is one operation on the stream, after the stream's delay. */
CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                     unsigned long long flags) {
  CUresult rc =
      enter_locked(E_cuGraphInstantiateWithFlags, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (exec == NULL || graph == NULL || flags != 0))
    rc = CUDA_ERROR_INVALID_VALUE;
  long long *x = rc == CUDA_SUCCESS ? malloc(sizeof *x) : NULL;
  if (rc == CUDA_SUCCESS && x == NULL)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS) {
    *x = *(long long *)(void *)graph;
    g.live_graphs++; /* an exec counts as a graph until destroyed */
    *exec = (CUgraphExec)(void *)x;
  }
  unlock();
  return rc;
}

CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  op_t *o = calloc(1, sizeof *o);
  CUresult rc = enter_locked(E_cuGraphLaunch, NEED_INIT | NEED_CTX);
  if (rc == CUDA_SUCCESS && (exec == NULL || o == NULL))
    rc = exec == NULL ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_OUT_OF_MEMORY;
  fstream_t *s = rc == CUDA_SUCCESS ? resolve_stream_locked(stream) : NULL;
  if (rc == CUDA_SUCCESS && s == NULL)
    rc = CUDA_ERROR_OUT_OF_MEMORY;
  if (rc == CUDA_SUCCESS)
    queue_or_capture_locked(s, &o, (op_t){.kind = OP_FN});
  unlock();
  free(o);
  return rc;
}

CUresult cuGraphExecDestroy(CUgraphExec exec) {
  return graph_free(E_cuGraphExecDestroy, (void *)exec);
}

/* ---- cuGetProcAddress ------------------------------------------------- */
#ifndef FAKE_NO_PROC_ADDRESS
/* Function pointers travel as void * (as through the real
 * cuGetProcAddress); void (*)(void) is the generic function type. */
static void *fnp(void (*f)(void)) {
  void *p;
  memcpy(&p, &f, sizeof p);
  return p;
}

static void *lookup(const char *name) {
#define L(base, f)                                                             \
  if (strcmp(name, base) == 0)                                                 \
    return fnp((void (*)(void))f);
  L("cuInit", cuInit)
  L("cuDriverGetVersion", cuDriverGetVersion)
  L("cuGetErrorString", cuGetErrorString)
  L("cuGetErrorName", cuGetErrorName)
  L("cuDeviceGetCount", cuDeviceGetCount)
  L("cuDeviceGet", cuDeviceGet)
  L("cuDeviceGetName", cuDeviceGetName)
  L("cuDevicePrimaryCtxRetain", cuDevicePrimaryCtxRetain)
  L("cuDevicePrimaryCtxRelease", cuDevicePrimaryCtxRelease_v2)
  L("cuCtxGetCurrent", cuCtxGetCurrent)
  L("cuCtxSetCurrent", cuCtxSetCurrent)
  L("cuCtxPushCurrent", cuCtxPushCurrent_v2)
  L("cuCtxPopCurrent", cuCtxPopCurrent_v2)
  L("cuCtxSynchronize", cuCtxSynchronize)
  L("cuMemHostAlloc", cuMemHostAlloc)
  L("cuMemFreeHost", cuMemFreeHost)
  L("cuMemHostRegister", cuMemHostRegister_v2)
  L("cuMemHostUnregister", cuMemHostUnregister)
  L("cuPointerGetAttribute", cuPointerGetAttribute)
  L("cuMemAlloc", cuMemAlloc_v2)
  L("cuMemFree", cuMemFree_v2)
  L("cuMemcpyHtoDAsync", cuMemcpyHtoDAsync_v2)
  L("cuMemcpyDtoHAsync", cuMemcpyDtoHAsync_v2)
  L("cuStreamCreate", cuStreamCreate)
  L("cuStreamDestroy", cuStreamDestroy_v2)
  L("cuStreamSynchronize", cuStreamSynchronize)
  L("cuEventCreate", cuEventCreate)
  L("cuEventRecord", cuEventRecord)
  L("cuEventQuery", cuEventQuery)
  L("cuEventSynchronize", cuEventSynchronize)
  L("cuEventDestroy", cuEventDestroy_v2)
  L("cuStreamBeginCapture", cuStreamBeginCapture_v2)
  L("cuStreamEndCapture", cuStreamEndCapture)
  L("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2)
  L("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode)
  L("cuGraphDestroy", cuGraphDestroy)
  L("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags)
  L("cuGraphLaunch", cuGraphLaunch)
  L("cuGraphExecDestroy", cuGraphExecDestroy)
#undef L
  return NULL;
}

static CUresult get_proc(const char *symbol, void **pfn, int version,
                         cuuint64_t flags, int *status) {
  CUresult rc = enter_locked(E_cuGetProcAddress, 0);
  void *fn = NULL;
  /* As the driver (cuda.h): a version newer than the driver is an error,
   * an unknown symbol is not (success, NULL, status "not found"). */
  if (rc == CUDA_SUCCESS && (symbol == NULL || pfn == NULL || version < 1000 ||
                             version > g.driver_version))
    rc = CUDA_ERROR_INVALID_VALUE;
  if (rc == CUDA_SUCCESS) {
    g.last_proc_flags = (long long)flags;
    char key[128];
    (void)snprintf(key, sizeof key, ",%s,", symbol);
    if (strstr(g.hidden, key) == NULL)
      fn = lookup(symbol);
  }
  unlock();
  if (pfn != NULL)
    *pfn = fn;
  if (status != NULL)
    *status = fn != NULL ? 0 : 1;
  return rc;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                          cuuint64_t flags) {
  return get_proc(symbol, pfn, version, flags, NULL);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             cuuint64_t flags, int *status) {
  return get_proc(symbol, pfn, version, flags, status);
}
#endif

/* ---- Control API --------------------------------------------------------- */
static int find_entry(const char *name) {
  for (int i = 0; i < E_COUNT; i++) {
    size_t n = strlen(name);
    if (strcmp(entry_names[i], name) == 0 ||
        (strncmp(entry_names[i], name, n) == 0 &&
         strcmp(entry_names[i] + n, "_v2") == 0))
      return i;
  }
  return -1;
}

int fake_cuda_set(const char *key, long long value) {
  int rc = 0;
  lock();
  if (strcmp(key, "init_result") == 0)
    g.init_result = (int)value;
  else if (strcmp(key, "device_count") == 0 && value >= 0 &&
           value <= MAX_DEVICES)
    g.device_count = (int)value;
  else if (strcmp(key, "delay_us") == 0 && value >= 0 && value < 10000000)
    g.delay_us = (int)value;
  else if (strcmp(key, "driver_version") == 0)
    g.driver_version = (int)value;
  else if (strcmp(key, "misalign") == 0)
    g.misalign = value != 0;
  else if (strcmp(key, "pin_us_per_gib") == 0 && value >= 0 &&
           value <= 100000000)
    g.pin_us_per_gib = value;
  else
    rc = -1;
  unlock();
  return rc;
}

/* The counters of g that fake_cuda_get reads under their own name. */
#define COUNTER(name)                                                          \
  { #name, &g.name }
static const struct {
  const char *key;
  const long long *value;
} plain_counters[] = {
    COUNTER(live_events),
    COUNTER(live_streams),
    COUNTER(ctx_errors),
    COUNTER(bad_calls),
    COUNTER(pushes),
    COUNTER(pops),
    COUNTER(last_host_alloc_flags),
    COUNTER(last_register_flags),
    COUNTER(last_event_flags),
    COUNTER(last_proc_flags),
    COUNTER(ops_pending),
    COUNTER(captured_records),
    COUNTER(capture_violations),
    COUNTER(captured_event_uses),
    COUNTER(live_graphs),
    COUNTER(forked_inits),
};
#undef COUNTER

static bool plain_counter_locked(const char *key, long long *v) {
  for (size_t i = 0; i < sizeof plain_counters / sizeof plain_counters[0]; i++)
    if (strcmp(key, plain_counters[i].key) == 0) {
      *v = *plain_counters[i].value;
      return true;
    }
  return false;
}

long long fake_cuda_get(const char *key) {
  long long v = -1;
  lock();
  if (plain_counter_locked(key, &v)) {
    /* v is set */
  } else if (strncmp(key, "calls:", 6) == 0) {
    int i = find_entry(key + 6);
    if (i >= 0)
      v = g.calls[i];
  } else if (strcmp(key, "live_host_allocs") == 0) {
    v = (long long)g.host.n;
  } else if (strcmp(key, "live_registrations") == 0) {
    v = (long long)g.reg.n;
  } else if (strcmp(key, "live_device_allocs") == 0) {
    v = (long long)g.dev.n;
  } else if (strcmp(key, "host_alloc_bytes") == 0) {
    v = ranges_bytes(&g.host);
  } else if (strcmp(key, "registered_bytes") == 0) {
    v = ranges_bytes(&g.reg);
  } else if (strcmp(key, "unpopped") == 0) {
    v = g.pushes - g.pops;
  } else if (strcmp(key, "primary_refs") == 0) {
    v = 0;
    for (int i = 0; i < MAX_DEVICES; i++)
      v += g.ctxs[i].refs;
  } else if (strcmp(key, "has_proc_address") == 0) {
#ifdef FAKE_NO_PROC_ADDRESS
    v = 0;
#else
    v = 1;
#endif
  } else if (strcmp(key, "live_captures") == 0) {
    v = 0;
    for (fstream_t *s = g.capturing; s != NULL; s = s->cap_next)
      v++;
  }
  unlock();
  return v;
}

int fake_cuda_registration(const void *p, void **base, size_t *size) {
  lock();
  long i = ranges_containing(&g.reg, (uintptr_t)p, 1);
  range_t r = i >= 0 ? g.reg.v[i] : (range_t){0, 0, NULL, 0};
  unlock();
  if (i < 0)
    return -1;
  if (base != NULL)
    *base = (void *)r.base;
  if (size != NULL)
    *size = r.size;
  return 0;
}

static int arm(int entry, unsigned nth, int code, bool async_event) {
  if (entry < 0 || nth == 0)
    return -1;
  int rc = -1;
  lock();
  for (int i = 0; i < MAX_INJECT; i++) {
    if (g.inj[i].entry < 0) {
      g.inj[i] = (inject_t){entry, nth, code, async_event};
      rc = 0;
      break;
    }
  }
  unlock();
  return rc;
}

int fake_cuda_fail(const char *entry, unsigned nth, int code) {
  return arm(find_entry(entry), nth, code, false);
}

int fake_cuda_fail_event(unsigned nth, int code) {
  return arm(E_cuEventRecord, nth, code, true);
}

int fake_cuda_hide(const char *names) {
  lock();
  set_hidden_locked(names);
  unlock();
  return 0;
}

int fake_cuda_enqueue(CUstream stream, void (*fn)(void *), void *arg,
                      unsigned delay_us) {
  op_t *o = calloc(1, sizeof *o);
  if (o == NULL)
    return -1;
  *o = (op_t){.kind = OP_FN, .fn = fn, .arg = arg, .extra_us = delay_us};
  lock();
  fstream_t *s = resolve_stream_locked(stream);
  if (s != NULL)
    push_op_locked(s, o);
  unlock();
  if (s == NULL) {
    free(o);
    return -1;
  }
  return 0;
}

int fake_cuda_stream_delay(CUstream stream, int delay_us) {
  lock();
  fstream_t *s = resolve_stream_locked(stream);
  if (s != NULL)
    s->delay_us = delay_us < 0 ? -1 : delay_us;
  unlock();
  return s != NULL ? 0 : -1;
}

void fake_cuda_reset(void) {
  lock();
  for (int i = 0; i < MAX_INJECT; i++)
    g.inj[i].entry = -1;
  g.hidden[0] = '\0';
  g.init_result = 0;
  g.device_count = 1;
  g.delay_us = 0;
  g.misalign = 0;
  g.driver_version = 12080;
  memset(g.calls, 0, sizeof g.calls);
  g.ctx_errors = g.bad_calls = g.forked_inits = 0;
  g.captured_records = g.capture_violations = g.captured_event_uses = 0;
  g.last_host_alloc_flags = g.last_register_flags = -1;
  g.last_event_flags = g.last_proc_flags = -1;
  unlock();
}
