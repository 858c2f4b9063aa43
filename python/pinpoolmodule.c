/*
 * `pinpool._core`, the C core of the `pinpool` package (docs/python.md):
 * Pool and Buffer over the C API of include/pinpool.h, with the buffer
 * protocol and DLPack exports. python/pinpool/__init__.py re-exports it;
 * the NumPy, torch and stats helpers are Python (python/pinpool/).
 *
 * Free-threading: no mutable Python-level state. A Pool's pinpool_t and a
 * Buffer's pinpool_buffer_t (and the Pool object it keeps alive) are set
 * when the object is created and never change; everything that does
 * change (references, exports, close, lazy attributes) is a C atomic in
 * the library. The module-level default pool is published with one
 * compare-and-swap; the str keys of the dicts it returns are made at import
 * (see "Dict keys": interning them at each call raced in CPython 3.13t).
 * So the module declares Py_MOD_GIL_NOT_USED where the Python supports it,
 * and needs no critical section.
 *
 * Exports (the rules of CPython's bf_getbuffer contract, python/cpython
 * #130409, and the exporter races of JAX, NumPy and CPython):
 * - bf_getbuffer never detaches: it takes the export (non-blocking), then
 *   fills *view, and sets view->obj last; on failure view->obj = NULL and
 *   BufferError. Shape and strides point into the view itself (per export).
 * - bf_releasebuffer releases the C export and never touches view->obj.
 * - A DLPack capsule owns one C export; its deleter touches no Python
 *   object, so it runs from any thread, with or without the GIL, even
 *   after the interpreter finalized.
 * Memory stays valid while any export exists, whatever happens to the
 * Buffer (close(), garbage collection) or to the Pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dlpack.h"
#include "pinpool.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

/* ---- Errors ---------------------------------------------------------------
 * MemoryError for PINPOOL_ENOMEM, ValueError for bad arguments and config,
 * pinpool.StaleHandleError / pinpool.BadHandleError (both ValueError) for
 * lend handles, BufferError for export problems (raised by the callers),
 * RuntimeError otherwise; the message is pinpool_last_error() of this
 * thread. The two exception types are made by module_exec, once, under the
 * import lock (as the dict keys below), and never change after. */
static PyObject *StaleHandleError, *BadHandleError;

static PyObject *raise_rc(int rc, const char *what) {
  PyObject *type = PyExc_RuntimeError;
  switch (rc) {
  case PINPOOL_ESTALE:
    type = StaleHandleError;
    break;
  case PINPOOL_EBADHANDLE:
    type = BadHandleError;
    break;
  case PINPOOL_EPERM: /* a refused lend return (docs/sharing.md) */
    type = PyExc_PermissionError;
    break;
  case PINPOOL_EEXITED:
    type = PyExc_ProcessLookupError;
    break;
  case PINPOOL_EAGAIN:
    type = PyExc_BlockingIOError;
    break;
  case PINPOOL_EINTR:
    type = PyExc_InterruptedError;
    break;
  case PINPOOL_ENOMEM:
    type = PyExc_MemoryError;
    break;
  case PINPOOL_EINVAL:
  case PINPOOL_EZEROSIZE:
  case PINPOOL_EOVERFLOW:
  case PINPOOL_ECONFIG:
    type = PyExc_ValueError;
    break;
  default:
    break;
  }
  const char *msg = pinpool_last_error();
  if (msg == NULL || msg[0] == '\0')
    msg = pinpool_strerror(rc);
  PyErr_Format(type, "%s: %s", what, msg);
  return NULL;
}

/* ---- Types ------------------------------------------------------------- */

typedef struct {
  PyObject ob_base;   /* PyObject_HEAD */
  pinpool_t *pool;    /* immutable; destroyed in dealloc */
  int device_type;    /* DLPack device of its memory, immutable */
  PyObject *weaklist; /* the shared table finds a pool by its nonce */
  uintptr_t serial;   /* unique in the process, immutable: on_error's arg */
  _Atomic int pin_pending; /* a NotPinnedWarning of its own to give */
} PoolObject;

/* A block of another process's shared pool, attached here (a Buffer
 * unpickled in a worker: docs/python.md, "Shared pools"). The C library
 * has no buffer object for attached memory, so its holds live here, with
 * the same rules as pinpool_buffer_t's: `state` counts the exports and has
 * ATT_CLOSED; the block is detached exactly once, when it is closed and its
 * last export is gone. `holds` (the Buffer object and each export) frees
 * the struct itself. */
#define ATT_CLOSED (UINT64_C(1) << 63)
typedef struct attach {
  _Atomic uint64_t state;
  _Atomic int holds;
  void *ptr;
  size_t nbytes;
  pinpool_share_handle_t handle; /* immutable: sent back to the owner */
} attach_t;

typedef struct {
  PyObject ob_base;      /* PyObject_HEAD */
  pinpool_buffer_t *buf; /* one reference, immutable; NULL when attached */
  PyObject *pool;        /* the Pool (strong), immutable; NULL if attached */
  attach_t *att;         /* an attached block (buf NULL), immutable */
  void *ptr;             /* immutable copies of C facts */
  size_t nbytes, block_size;
  int device_type; /* kDLCPU or kDLCUDAHost */
  /* Owner side: the pid the block is lent to, 0 when not lent, -1 while a
   * lend is being made, LENT_CLOSING while close() runs (close_hook: a lend
   * racing it is refused). While lent, new exports and close() are refused
   * (docs/sharing.md: the owner does nothing with the bytes of a lent
   * block, and a close would leave it allocated for good). */
  _Atomic int lent;
  /* Weak references: the shared table keeps the Buffers lend_collect()
   * handed back by weak reference only, so that a dropped one is freed
   * (issue 36, the fifth review, item 2). */
  PyObject *weaklist;
} BufferObject;

#define LENT_CLOSING (-2) /* BufferObject.lent during close (close_hook) */

static PyTypeObject PoolType;
static PyTypeObject BufferType;

/* ---- Pool ---------------------------------------------------------------- */

/* backend=auto's warning that memory it meant to pin is pageable
 * (pinpool_stats_t.pin_warnings). The library calls on_error with
 * PINPOOL_ELIMIT once per process (again in a fork child), for the pool
 * that found it, possibly on a thread without the GIL (inside
 * pinpool_create, an allocation that grows the pool, or its grow_ahead
 * thread, which may run after the PoolObject is gone: exports keep the C
 * pool). The warning belongs to that pool: on_error's arg is the pool's
 * serial number, never dereferenced; on_error keeps the message
 * (pin_process_msg, written once) and names the pool in pin_owner (a
 * release store); only that pool's own Pool() or alloc() turns it into a
 * pinpool.NotPinnedWarning. The check on the allocation path is a load
 * of the pool's pin_pending and of pin_owner: no lock, no stats.
 *
 * The process's one warning (pin_given) is used up only by a warning
 * delivered (shown, recorded, or ignored by a filter). One that a filter
 * turned into an exception made its Pool() or alloc() fail and stays
 * pending (pin_pending): every later alloc() of that pool raises again
 * (the pool holds pageable memory), so that a process that made the
 * warning an error never gets pageable memory from it silently. The
 * library does not call on_error twice in a process, so a later
 * backend=auto pool that is unlocked from the start (host-unlocked) takes
 * the kept message at Pool() while the warning is not yet delivered. Two
 * threads delivering at once may both show it (both found it
 * undelivered); neither hands out pageable memory silently. A fork
 * child's own warning carries its parent's text if the parent had one
 * (the message is written once). */
static PyObject *NotPinnedWarning;
static char pin_process_msg[1024];
enum { PMSG_NONE, PMSG_WRITING, PMSG_READY };
static _Atomic int pin_process_state; /* PMSG_*: pin_process_msg's state */
static _Atomic uintptr_t pin_owner;   /* the serial of the pool told */
static _Atomic uintptr_t pool_serials;
static _Atomic int pin_given; /* the process's warning delivered */

static void on_pool_error(void *arg, int err, const char *msg, void *block) {
  (void)block;
  if (err != PINPOOL_ELIMIT || msg == NULL)
    return;
  int none = PMSG_NONE;
  if (atomic_compare_exchange_strong(&pin_process_state, &none, PMSG_WRITING)) {
    (void)snprintf(pin_process_msg, sizeof pin_process_msg, "%s", msg);
    atomic_store_explicit(&pin_process_state, PMSG_READY, memory_order_release);
  }
  /* After the message: a reader that sees its pool named sees it READY. */
  atomic_store_explicit(&pin_owner, (uintptr_t)arg, memory_order_release);
}

/* A fork child is a new process: its one warning is not given yet (the
 * library resets its on_error slot in the child too). */
static void pin_after_fork_child(void) {
  atomic_store_explicit(&pin_given, 0, memory_order_relaxed);
}

/* After Pool() or an allocation of self: 0, or -1 with the exception set
 * (the warning filtered into an error). */
static int give_pin_warning(PoolObject *self) {
  if (atomic_load_explicit(&self->pin_pending, memory_order_relaxed) == 0 &&
      atomic_load_explicit(&pin_owner, memory_order_acquire) != self->serial)
    return 0;
  uintptr_t me = self->serial;
  if (atomic_load_explicit(&pin_given, memory_order_acquire) != 0 ||
      atomic_load_explicit(&pin_process_state, memory_order_acquire) !=
          PMSG_READY) {
    atomic_store_explicit(&self->pin_pending, 0, memory_order_relaxed);
    (void)atomic_compare_exchange_strong(&pin_owner, &me, 0);
    return 0;
  }
  if (PyErr_WarnEx(NotPinnedWarning, pin_process_msg, 1) != 0) {
    /* Raised: stays pending, the next call raises again. */
    atomic_store_explicit(&self->pin_pending, 1, memory_order_relaxed);
    return -1;
  }
  atomic_store_explicit(&pin_given, 1, memory_order_release);
  atomic_store_explicit(&self->pin_pending, 0, memory_order_relaxed);
  (void)atomic_compare_exchange_strong(&pin_owner, &me, 0);
  return 0;
}

static PyObject *Pool_new(PyTypeObject *type, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"config", NULL};
  PyObject *config = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Pool", kwlist, &config))
    return NULL;
  const char *text = NULL;
  if (config != Py_None) {
    if (!PyUnicode_Check(config)) {
      PyErr_Format(PyExc_TypeError, "config must be a str or None, not %s",
                   Py_TYPE(config)->tp_name);
      return NULL;
    }
    text = PyUnicode_AsUTF8(config);
    if (text == NULL)
      return NULL;
  }
  PoolObject *self = (PoolObject *)type->tp_alloc(type, 0);
  if (self == NULL)
    return NULL;
  pinpool_t *pool = NULL;
  /* A configured reserve is allocated (and maybe pinned) here. */
  PyThreadState *ts = PyEval_SaveThread();
  self->serial = atomic_fetch_add(&pool_serials, 1) + 1;
  pinpool_hooks_t hooks = {NULL, NULL, on_pool_error, (void *)self->serial};
  int rc = pinpool_create_ex(text, &hooks, &pool);
  PyEval_RestoreThread(ts);
  if (rc != 0) {
    Py_DECREF(self);
    return raise_rc(rc, "pinpool.Pool");
  }
  self->pool = pool;
  /* Unlocked from the start after the library's one call went to
   * another pool whose warning was not delivered: this pool's own. */
  pinpool_stats_t st;
  if (atomic_load_explicit(&pin_owner, memory_order_acquire) != self->serial &&
      atomic_load_explicit(&pin_given, memory_order_acquire) == 0 &&
      atomic_load_explicit(&pin_process_state, memory_order_acquire) ==
          PMSG_READY &&
      pinpool_get_stats(pool, &st) == 0 &&
      st.backend_auto == PINPOOL_AUTO_HOST_UNLOCKED)
    atomic_store_explicit(&self->pin_pending, 1, memory_order_relaxed);
  if (give_pin_warning(self) != 0) {
    Py_DECREF(self);
    return NULL;
  }
  /* Memory pinned through the CUDA driver is kDLCUDAHost; any other host
   * memory (page-locked or not) is plain CPU memory to DLPack. */
  char cfg[1024] = "";
  (void)pinpool_get_config(pool, cfg, sizeof cfg, NULL);
  self->device_type = kDLCPU;
  if (strncmp(cfg, "backend=cuda,", 13) == 0 ||
      strncmp(cfg, "backend=cuda-register,", 22) == 0)
    self->device_type = kDLCUDAHost;
  return (PyObject *)self;
}

static void Pool_dealloc(PoolObject *self) {
  if (self->weaklist != NULL)
    PyObject_ClearWeakRefs((PyObject *)self);
  pinpool_t *pool = self->pool;
  self->pool = NULL;
  if (pool != NULL) {
    /* Buffers keep their Pool alive, so none is left here; exports may
     * be, and keep the C pool until they are released. Tearing down waits
     * for pending stream work: without the GIL. */
    PyThreadState *ts = PyEval_SaveThread();
    pinpool_destroy(pool);
    PyEval_RestoreThread(ts);
  }
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *new_buffer(PyObject *pool_obj, pinpool_buffer_t *buf);

/* nbytes as a size: an int >= 1 (the library checks the upper bound). */
static int parse_size(PyObject *arg, size_t *out) {
  PyObject *n = PyNumber_Index(arg);
  if (n == NULL)
    return -1;
  Py_ssize_t v = PyLong_AsSsize_t(n);
  Py_DECREF(n);
  if (v == -1 && PyErr_Occurred()) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return -1;
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "Pool.alloc: nbytes is out of range");
    return -1;
  }
  if (v <= 0) {
    PyErr_Format(PyExc_ValueError,
                 "Pool.alloc: nbytes must be positive, not %zd", v);
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

static PyObject *pool_alloc(PyObject *pool_obj, PyObject *arg) {
  PoolObject *self = (PoolObject *)pool_obj;
  size_t n;
  if (parse_size(arg, &n) != 0)
    return NULL;
  pinpool_buffer_t *buf = NULL;
  /* May call the backend (mmap, mlock, cuMemHostAlloc: milliseconds). */
  PyThreadState *ts = PyEval_SaveThread();
  int rc = pinpool_buffer_alloc(self->pool, n, &buf);
  PyEval_RestoreThread(ts);
  if (rc != 0)
    return raise_rc(rc, "Pool.alloc");
  PyObject *b = new_buffer(pool_obj, buf);
  if (b != NULL && give_pin_warning(self) != 0)
    Py_CLEAR(b);
  return b;
}

static PyObject *Pool_alloc(PyObject *self, PyObject *arg) {
  return pool_alloc(self, arg);
}

/* A call that may block, made with the GIL released. */
static PyObject *pool_call(PoolObject *self, int (*fn)(pinpool_t *),
                           const char *what) {
  PyThreadState *ts = PyEval_SaveThread();
  int rc = fn(self->pool);
  PyEval_RestoreThread(ts);
  if (rc != 0)
    return raise_rc(rc, what);
  Py_RETURN_NONE;
}

static PyObject *Pool_empty_cache(PyObject *self, PyObject *unused) {
  (void)unused;
  return pool_call((PoolObject *)self, pinpool_empty_cache, "Pool.empty_cache");
}

static PyObject *Pool_process_events(PyObject *self, PyObject *unused) {
  (void)unused;
  return pool_call((PoolObject *)self, pinpool_process_events,
                   "Pool.process_events");
}

static PyObject *Pool_synchronize(PyObject *self, PyObject *unused) {
  (void)unused;
  return pool_call((PoolObject *)self, pinpool_synchronize, "Pool.synchronize");
}

/* ---- CUDA graph capture (docs/cuda.md, "Graph capture") ---------------- */
static int parse_stream(PyObject *arg, pinpool_stream_t *out);

static PyObject *Pool_stream_capture(PyObject *self, PyObject *arg) {
  pinpool_stream_t s;
  if (parse_stream(arg, &s) != 0)
    return NULL;
  int capturing = 0;
  uint64_t id = 0;
  int rc =
      pinpool_stream_capture(((PoolObject *)self)->pool, s, &capturing, &id);
  if (rc != 0)
    return raise_rc(rc, "Pool.stream_capture");
  if (!capturing)
    Py_RETURN_NONE;
  return PyLong_FromUnsignedLongLong((unsigned long long)id);
}

static PyObject *Pool_graph_release(PyObject *self, PyObject *arg) {
  if (!PyLong_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "capture_id must be an int, not %.100s",
                 Py_TYPE(arg)->tp_name);
    return NULL;
  }
  unsigned long long id = PyLong_AsUnsignedLongLong(arg);
  if (id == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "capture_id must be an int >= 0");
    return NULL;
  }
  /* Settling the released blocks records events (driver calls). */
  PyThreadState *ts = PyEval_SaveThread();
  int rc = pinpool_graph_release(((PoolObject *)self)->pool, (uint64_t)id);
  PyEval_RestoreThread(ts);
  if (rc != 0)
    return raise_rc(rc, "Pool.graph_release");
  Py_RETURN_NONE;
}

static PyObject *Pool_stream_graphs_release(PyObject *self, PyObject *arg) {
  pinpool_stream_t s;
  if (parse_stream(arg, &s) != 0)
    return NULL;
  PyThreadState *ts = PyEval_SaveThread();
  int rc = pinpool_stream_graphs_release(((PoolObject *)self)->pool, s);
  PyEval_RestoreThread(ts);
  if (rc != 0)
    return raise_rc(rc, "Pool.stream_graphs_release");
  Py_RETURN_NONE;
}

static PyObject *Pool_reset_peak_stats(PyObject *self, PyObject *unused) {
  (void)unused;
  return pool_call((PoolObject *)self, pinpool_reset_peak_stats,
                   "Pool.reset_peak_stats");
}

/* ---- Dict keys --------------------------------------------------------------
 * The keys of the dicts that stats() and the attributes return, made once
 * when the module is executed (interned; immortal on a free-threaded build)
 * and kept for the life of the process. Not PyDict_SetItemString: it makes
 * and interns a new str at every call, and on CPython 3.13 free-threaded
 * two threads interning the same new string at once race inside the
 * interpreter (intern_common sets the refcount of a string another thread
 * already holds with a plain store: python/cpython#129701). ThreadSanitizer
 * showed it (tests/freethreaded) when threads built their first attributes
 * dicts at once; with the keys made at import no call interns anything. */
static const char *const dict_key_names[] = {
    /* stat_dict, duration_dict */
    "current", "peak", "allocated", "freed", "count", "total_ns", "max_ns",
    /* Pool_stats */
    "requests", "requested_bytes", "blocks", "block_bytes", "reserved_bytes",
    "cached_bytes", "segments", "pending_bytes", "pending_blocks",
    "events_recorded", "events_completed", "event_errors", "cache_hits",
    "cache_misses", "tcache_hits", "oom_count", "retries", "trimmed_segments",
    "arena_chunks", "chunk_free_bytes", "free_extents", "largest_free_extent",
    "history_lost_writes", "mlock_failures", "locked_bytes", "fallback_bytes",
    "fallback_blocks", "peak_slack_bytes", "reserve_bytes", "max_cached",
    "max_reserved", "reclaim", "backend_alloc", "backend_free",
    "graph_held_blocks", "graph_held_bytes", "numa_spill_blocks",
    "numa_spill_bytes", "lent_blocks", "lent_bytes", "backend_auto",
    "pin_warnings", "lend_refusals", "grow_ahead_chunks", "grow_ahead_bytes",
    "grow_ahead_hits", "grow_ahead_waits_avoided", "page_moves", "bytes_moved",
    "move_fallbacks",
    /* attrs_dict */
    "host_accessible", "device_accessible", "device_id", "page_locked",
    "numa_node", "huge_pages", "huge_advised", "backend"};
#define N_DICT_KEYS (sizeof dict_key_names / sizeof dict_key_names[0])

/* Written by module_exec only (under the import lock, before any other
 * thread can call into the module) and only where still NULL. */
static PyObject *dict_keys[N_DICT_KEYS];

static int make_dict_keys(void) {
  for (size_t i = 0; i < N_DICT_KEYS; i++) {
    if (dict_keys[i] != NULL)
      continue; /* executed before (the module imported again) */
    dict_keys[i] = PyUnicode_InternFromString(dict_key_names[i]);
    if (dict_keys[i] == NULL)
      return -1;
  }
  return 0;
}

/* The key made at import for `name` (borrowed), or NULL with SystemError
 * for a name missing from dict_key_names (a test of every dict finds it). */
static PyObject *dict_key(const char *name) {
  for (size_t i = 0; i < N_DICT_KEYS; i++)
    if (strcmp(dict_key_names[i], name) == 0)
      return dict_keys[i];
  PyErr_Format(PyExc_SystemError,
               "pinpool: dict key '%s' missing from dict_key_names", name);
  return NULL;
}

static int set_obj(PyObject *d, const char *name, PyObject *o) {
  if (o == NULL)
    return -1;
  PyObject *key = dict_key(name);
  int rc = key != NULL ? PyDict_SetItem(d, key, o) : -1;
  Py_DECREF(o);
  return rc;
}

static int set_u64(PyObject *d, const char *name, uint64_t v) {
  return set_obj(d, name, PyLong_FromUnsignedLongLong(v));
}

static PyObject *stat_dict(const pinpool_stat_t *s) {
  PyObject *d = PyDict_New();
  if (d == NULL || set_u64(d, "current", s->current) ||
      set_u64(d, "peak", s->peak) || set_u64(d, "allocated", s->allocated) ||
      set_u64(d, "freed", s->freed)) {
    Py_XDECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *duration_dict(const pinpool_duration_t *s) {
  PyObject *d = PyDict_New();
  if (d == NULL || set_u64(d, "count", s->count) ||
      set_u64(d, "total_ns", s->total_ns) || set_u64(d, "max_ns", s->max_ns)) {
    Py_XDECREF(d);
    return NULL;
  }
  return d;
}

static PyObject *Pool_stats(PyObject *obj, PyObject *unused) {
  (void)unused;
  PoolObject *self = (PoolObject *)obj;
  pinpool_stats_t st;
  int rc = pinpool_get_stats(self->pool, &st);
  if (rc != 0)
    return raise_rc(rc, "Pool.stats");
  PyObject *d = PyDict_New();
  if (d == NULL)
    return NULL;
  const struct {
    const char *name;
    const pinpool_stat_t *s;
  } stats[] = {{"requests", &st.requests},
               {"requested_bytes", &st.requested_bytes},
               {"blocks", &st.blocks},
               {"block_bytes", &st.block_bytes},
               {"reserved_bytes", &st.reserved_bytes},
               {"cached_bytes", &st.cached_bytes},
               {"segments", &st.segments}};
  const struct {
    const char *name;
    uint64_t v;
  } counts[] = {{"pending_bytes", st.pending_bytes},
                {"pending_blocks", st.pending_blocks},
                {"events_recorded", st.events_recorded},
                {"events_completed", st.events_completed},
                {"event_errors", st.event_errors},
                {"cache_hits", st.cache_hits},
                {"cache_misses", st.cache_misses},
                {"tcache_hits", st.tcache_hits},
                {"oom_count", st.oom_count},
                {"retries", st.retries},
                {"trimmed_segments", st.trimmed_segments},
                {"arena_chunks", st.arena_chunks},
                {"chunk_free_bytes", st.chunk_free_bytes},
                {"free_extents", st.free_extents},
                {"largest_free_extent", st.largest_free_extent},
                {"history_lost_writes", st.history_lost_writes},
                {"mlock_failures", st.mlock_failures},
                {"locked_bytes", st.locked_bytes},
                {"fallback_bytes", st.fallback_bytes},
                {"fallback_blocks", st.fallback_blocks},
                {"peak_slack_bytes", st.peak_slack_bytes},
                {"reserve_bytes", st.reserve_bytes},
                {"max_cached", st.max_cached},
                {"max_reserved", st.max_reserved},
                {"graph_held_blocks", st.graph_held_blocks},
                {"graph_held_bytes", st.graph_held_bytes},
                {"numa_spill_blocks", st.numa_spill_blocks},
                {"numa_spill_bytes", st.numa_spill_bytes},
                {"lent_blocks", st.lent_blocks},
                {"lent_bytes", st.lent_bytes},
                {"lend_refusals", st.lend_refusals},
                {"pin_warnings", st.pin_warnings},
                {"grow_ahead_chunks", st.grow_ahead_chunks},
                {"grow_ahead_bytes", st.grow_ahead_bytes},
                {"grow_ahead_hits", st.grow_ahead_hits},
                {"grow_ahead_waits_avoided", st.grow_ahead_waits_avoided},
                {"page_moves", st.page_moves},
                {"bytes_moved", st.bytes_moved},
                {"move_fallbacks", st.move_fallbacks}};
  for (size_t i = 0; i < sizeof stats / sizeof stats[0]; i++)
    if (set_obj(d, stats[i].name, stat_dict(stats[i].s)) != 0)
      goto fail;
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++)
    if (set_u64(d, counts[i].name, counts[i].v) != 0)
      goto fail;
  /* backend=auto's choice by name (docs/python.md, "Statistics"). */
  static const char *const auto_names[] = {"", "cuda-register", "host-locked",
                                           "host-unlocked"};
  if (set_obj(d, "backend_auto",
              PyUnicode_FromString(st.backend_auto < 4
                                       ? auto_names[st.backend_auto]
                                       : "unknown")) != 0)
    goto fail;
  if (set_obj(d, "reclaim", duration_dict(&st.reclaim)) != 0 ||
      set_obj(d, "backend_alloc", duration_dict(&st.backend_alloc)) != 0 ||
      set_obj(d, "backend_free", duration_dict(&st.backend_free)) != 0)
    goto fail;
  return d;
fail:
  Py_DECREF(d);
  return NULL;
}

static PyObject *Pool_get_config(PyObject *obj, void *closure) {
  (void)closure;
  PoolObject *self = (PoolObject *)obj;
  char small[512];
  size_t need = 0;
  int rc = pinpool_get_config(self->pool, small, sizeof small, &need);
  if (rc == 0)
    return PyUnicode_FromString(small);
  if (rc != PINPOOL_EOVERFLOW)
    return raise_rc(rc, "Pool.config");
  char *big = PyMem_Malloc(need);
  if (big == NULL)
    return PyErr_NoMemory();
  rc = pinpool_get_config(self->pool, big, need, NULL);
  PyObject *s =
      rc == 0 ? PyUnicode_FromString(big) : raise_rc(rc, "Pool.config");
  PyMem_Free(big);
  return s;
}

/* record_history(enabled="all", max_entries=0, stack_depth=16,
 * clear=False): enabled is None/False (off), True ("all"), or one of
 * "state", "alloc", "all" (as PyTorch's _record_memory_history). */
static PyObject *Pool_record_history(PyObject *self, PyObject *args,
                                     PyObject *kw) {
  static char *kwlist[] = {"enabled", "max_entries", "stack_depth", "clear",
                           NULL};
  PyObject *enabled = Py_True;
  long long max_entries = 0, depth = 16;
  int clear = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|OLLp:record_history", kwlist,
                                   &enabled, &max_entries, &depth, &clear))
    return NULL;
  pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 0, 0, clear};
  if (enabled == Py_None || enabled == Py_False) {
    o.record = PINPOOL_HISTORY_NONE;
  } else if (enabled == Py_True) {
    o.record = PINPOOL_HISTORY_ALL;
  } else if (PyUnicode_Check(enabled)) {
    const char *e = PyUnicode_AsUTF8(enabled);
    if (e == NULL)
      return NULL;
    if (strcmp(e, "state") == 0)
      o.record = PINPOOL_HISTORY_STATE;
    else if (strcmp(e, "alloc") == 0)
      o.record = PINPOOL_HISTORY_ALLOC;
    else if (strcmp(e, "all") == 0)
      o.record = PINPOOL_HISTORY_ALL;
    else
      return PyErr_Format(PyExc_ValueError,
                          "Pool.record_history: enabled must be None, True, "
                          "False, 'state', 'alloc' or 'all', not '%s'",
                          e);
  } else {
    return PyErr_Format(PyExc_TypeError,
                        "Pool.record_history: enabled must be None, a bool "
                        "or a str, not %.100s",
                        Py_TYPE(enabled)->tp_name);
  }
  if (max_entries < 0)
    return PyErr_Format(PyExc_ValueError,
                        "Pool.record_history: max_entries must be >= 0, "
                        "not %lld",
                        max_entries);
  if (depth < 0 || depth > 64)
    return PyErr_Format(PyExc_ValueError,
                        "Pool.record_history: stack_depth must be in 0..64, "
                        "not %lld",
                        depth);
  o.max_entries = (size_t)max_entries;
  o.stack_depth = (unsigned)depth;
  int rc = pinpool_record_history(
      ((PoolObject *)self)->pool,
      o.record == PINPOOL_HISTORY_NONE && !clear ? NULL : &o);
  if (rc != 0)
    return raise_rc(rc, "Pool.record_history");
  Py_RETURN_NONE;
}

/* snapshot(path=None, *, history=True, symbols=True): write the JSON
 * snapshot to path and return None, or return it as a str. */
static PyObject *Pool_snapshot(PyObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"path", "history", "symbols", NULL};
  PyObject *path = Py_None;
  int history = 1, symbols = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|O$pp:snapshot", kwlist, &path,
                                   &history, &symbols))
    return NULL;
  unsigned flags = (history ? 0u : PINPOOL_SNAPSHOT_NO_HISTORY) |
                   (symbols ? 0u : PINPOOL_SNAPSHOT_NO_SYMBOLS);
  pinpool_t *pool = ((PoolObject *)self)->pool;
  int rc;
  if (path == Py_None) {
    char *text = NULL;
    size_t len = 0;
    Py_BEGIN_ALLOW_THREADS rc =
        pinpool_snapshot_write_mem(pool, &text, &len, flags);
    Py_END_ALLOW_THREADS if (rc != 0) return raise_rc(rc, "Pool.snapshot");
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
    pinpool_snapshot_free(text);
    return s;
  }
  PyObject *bytes = NULL;
  if (!PyUnicode_FSConverter(path, &bytes))
    return NULL;
  const char *p = PyBytes_AS_STRING(bytes);
  Py_BEGIN_ALLOW_THREADS rc = pinpool_snapshot_write(pool, p, flags);
  Py_END_ALLOW_THREADS Py_DECREF(bytes);
  if (rc == PINPOOL_EBACKEND) /* the file: an OSError, as open() raises */
    return PyErr_Format(PyExc_OSError, "Pool.snapshot: %s",
                        pinpool_last_error());
  if (rc != 0)
    return raise_rc(rc, "Pool.snapshot");
  Py_RETURN_NONE;
}

static PyObject *Pool_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef(self);
}

static PyObject *Pool_exit(PyObject *self, PyObject *args) {
  (void)args;
  PyObject *r = Pool_empty_cache(self, NULL);
  if (r == NULL)
    return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static PyObject *Pool_repr(PyObject *self) {
  PyObject *cfg = Pool_get_config(self, NULL);
  if (cfg == NULL)
    return NULL;
  PyObject *r = PyUnicode_FromFormat("<pinpool.Pool %U>", cfg);
  Py_DECREF(cfg);
  return r;
}

/* ---- Methods written in Python ----------------------------------------------
 * empty, zeros, memory_stats and memory_summary build NumPy arrays, torch
 * tensors and text tables: Python's job. They live in pinpool/_pool.py and
 * are methods of this type so that every Pool has them, default_pool()'s
 * included, and the type stays the one the module defines. The module is
 * looked up at each call (sys.modules after the first; the import system
 * serializes a concurrent first import), never cached here: no mutable
 * state in this file. */
static PyObject *call_python_in(const char *module, const char *name,
                                PyObject *self, PyObject *args, PyObject *kw) {
  PyObject *mod = PyImport_ImportModule(module);
  if (mod == NULL)
    return NULL;
  PyObject *fn = PyObject_GetAttrString(mod, name);
  Py_DECREF(mod);
  if (fn == NULL)
    return NULL;
  Py_ssize_t n = PyTuple_GET_SIZE(args);
  PyObject *full = PyTuple_New(n + 1);
  if (full == NULL) {
    Py_DECREF(fn);
    return NULL;
  }
  PyTuple_SET_ITEM(full, 0, Py_NewRef(self));
  for (Py_ssize_t i = 0; i < n; i++)
    PyTuple_SET_ITEM(full, i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  PyObject *r = PyObject_Call(fn, full, kw);
  Py_DECREF(full);
  Py_DECREF(fn);
  return r;
}

static PyObject *call_python(const char *name, PyObject *self, PyObject *args,
                             PyObject *kw) {
  return call_python_in("pinpool._pool", name, self, args, kw);
}

#define PY_METHOD(cname, pyname)                                               \
  static PyObject *cname(PyObject *self, PyObject *args, PyObject *kw) {       \
    return call_python(pyname, self, args, kw);                                \
  }
/* The sharing methods (pinpool/_share.py keeps the owner's table of lent
 * Buffers, which is mutable Python state, under its own lock). */
#define SHARE_METHOD(cname, pyname)                                            \
  static PyObject *cname(PyObject *self, PyObject *args, PyObject *kw) {       \
    return call_python_in("pinpool._share", pyname, self, args, kw);           \
  }
PY_METHOD(Pool_empty, "empty")
PY_METHOD(Pool_zeros, "zeros")
PY_METHOD(Pool_memory_stats, "memory_stats")
PY_METHOD(Pool_memory_summary, "memory_summary")
SHARE_METHOD(Pool_lend_reclaim, "lend_reclaim")
SHARE_METHOD(Pool_lend_reclaim_exited, "lend_reclaim_exited")
SHARE_METHOD(Pool_lend_collect, "lend_collect")
SHARE_METHOD(Buffer_lend, "lend")
SHARE_METHOD(Buffer_reduce, "reduce_buffer")

/* ---- Sharing primitives (private: pinpool/_share.py calls them) ---------
 * A handle travels as the 96 bytes of pinpool_share_handle_t. */
static int parse_handle(PyObject *arg, pinpool_share_handle_t *h) {
  if (!PyBytes_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "a share handle must be bytes, not %.100s",
                 Py_TYPE(arg)->tp_name);
    return -1;
  }
  if (PyBytes_GET_SIZE(arg) != (Py_ssize_t)sizeof *h) {
    PyErr_Format(BadHandleError,
                 "a share handle is %zu bytes, not %zd: not a pinpool handle",
                 sizeof *h, PyBytes_GET_SIZE(arg));
    return -1;
  }
  memcpy(h, PyBytes_AS_STRING(arg), sizeof *h);
  return 0;
}

/* _lend_refused(): a return refused by the Python side (pinpool/_share.py:
 * its sender unproven, or an answer naming another lend) counted in
 * lend_refusals with the library's own refusals. */
static PyObject *Pool__lend_refused(PyObject *self, PyObject *unused) {
  (void)unused;
  int rc = pinpool_lend_refused(((PoolObject *)self)->pool);
  if (rc != 0)
    return raise_rc(rc, "Pool");
  Py_RETURN_NONE;
}

/* A candidate generation and its place in the caller's list. */
typedef struct {
  uint64_t gen;
  Py_ssize_t i;
} cand_t;

static int cand_cmp(const void *a, const void *b) {
  uint64_t x = ((const cand_t *)a)->gen, y = ((const cand_t *)b)->gen;
  return (x > y) - (x < y);
}

/* The place of generation g among the n sorted candidates, or -1; *visits
 * counts the candidates compared. */
static Py_ssize_t cand_find(const cand_t *c, Py_ssize_t n, uint64_t g,
                            unsigned long long *visits) {
#ifdef PINPOOL_MUTANT_RECLAIM_MATCH_WALK
  /* Mutant (docs/verification.md): every candidate compared, as before. */
  for (Py_ssize_t k = 0; k < n; k++) {
    ++*visits;
    if (c[k].gen == g)
      return c[k].i;
  }
  return -1;
#else
  Py_ssize_t lo = 0, hi = n;
  while (lo < hi) {
    Py_ssize_t mid = lo + (hi - lo) / 2;
    ++*visits;
    if (c[mid].gen < g)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < n && c[lo].gen == g ? c[lo].i : -1;
#endif
}

/* _lend_reclaim(peer, flags, candidates, table, meter=None) -> list: end
 * the lends that pinpool_lend_reclaim_list selects (peer: a pid, -1 every
 * peer, -2 the exited; flags: PINPOOL_RECLAIM_LIVE or 0) and drop them
 * from table (pinpool._share's: key (nonce, generation) -> a record whose
 * first field is the lent Buffer), marking each Buffer not lent, in the
 * same step: no Python code runs between the C library's ending a lend
 * and the table's losing it, so an asynchronous exception
 * (KeyboardInterrupt, a raising signal handler: CPython runs them as soon
 * as a C call returns) cannot leave Buffers that say lent, in a table that
 * says lent, for lends the library has ended (issue 36, rvpy39 D2;
 * _lend_into does the same for a lend). candidates: the table's keys to
 * consider (the caller's pool's). The result has one entry per candidate:
 * its Buffer where that lend was ended, else None. Everything that can
 * fail is made before the first lend ends, and nothing after can fail:
 * the C table and the caller's table change together or not at all
 * (docs/sharing.md). Each ended lend is found among the candidates, sorted
 * once, by a binary search (issue 38, the meter's findings, item 4: every
 * candidate was compared for each, O(lends^2) with the GIL and the Python
 * table's lock held: 3,000 lends, 4.5 million comparisons). meter (tests):
 * a list, to which the number of candidates compared is appended. */
static PyObject *Pool__lend_reclaim(PyObject *self, PyObject *args) {
  int peer;
  unsigned flags;
  PyObject *cands, *table, *meter = Py_None;
  if (!PyArg_ParseTuple(args, "iIO!O!|O:_lend_reclaim", &peer, &flags,
                        &PyList_Type, &cands, &PyDict_Type, &table, &meter))
    return NULL;
  if (meter != Py_None && !PyList_Check(meter))
    return PyErr_Format(PyExc_TypeError, "_lend_reclaim: meter is a list");
  Py_ssize_t nc = PyList_GET_SIZE(cands);
  cand_t *gens = PyMem_Malloc(((size_t)nc + 1) * sizeof *gens);
  if (gens == NULL)
    return PyErr_NoMemory();
  PyObject *keys = PyList_GetSlice(cands, 0, nc); /* ours: cands may change */
  if (keys == NULL) {
    PyMem_Free(gens);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < nc; i++) {
    PyObject *k = PyList_GET_ITEM(keys, i);
    if (!PyTuple_CheckExact(k) || PyTuple_GET_SIZE(k) != 2 ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(k, 0)) ||
        !PyLong_CheckExact(PyTuple_GET_ITEM(k, 1))) {
      /* exact ints: hashing and comparing them runs no Python code */
      PyMem_Free(gens);
      Py_DECREF(keys);
      return PyErr_Format(PyExc_TypeError,
                          "_lend_reclaim: a candidate is not a lend's key");
    }
    gens[i].gen = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(k, 1));
    gens[i].i = i;
    if (gens[i].gen == (uint64_t)-1 && PyErr_Occurred()) {
      PyMem_Free(gens);
      Py_DECREF(keys);
      return NULL;
    }
  }
  qsort(gens, (size_t)nc, sizeof *gens, cand_cmp);
  PyObject *out = PyList_New(nc);
  enum { CAP = 256 };
  pinpool_lend_info_t *info = PyMem_Malloc(CAP * sizeof *info);
  if (out == NULL || info == NULL) {
    Py_XDECREF(out);
    Py_DECREF(keys);
    PyMem_Free(gens);
    PyMem_Free(info);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < nc; i++)
    PyList_SET_ITEM(out, i, Py_NewRef(Py_None));
  unsigned long long visits = 0;
  int rc = 0;
  size_t n = 0;
  do { /* CAP at a time; each batch ends and reports together */
    rc = pinpool_lend_reclaim_list(((PoolObject *)self)->pool, peer, flags,
                                   info, CAP, &n);
    for (size_t k = 0; rc == 0 && k < n; k++) {
      Py_ssize_t i = cand_find(gens, nc, info[k].generation, &visits);
      if (i < 0)
        continue;
      PyObject *key = PyList_GET_ITEM(keys, i);
      PyObject *rec = NULL; /* a strong reference (free-threaded) */
#if PY_VERSION_HEX >= 0x030D0000
      if (PyDict_GetItemRef(table, key, &rec) < 0)
        rec = NULL;
#else
      rec = Py_XNewRef(PyDict_GetItemWithError(table, key));
#endif
      PyObject *b = rec != NULL && PyTuple_Check(rec) &&
                            PyTuple_GET_SIZE(rec) >= 1 &&
                            Py_IS_TYPE(PyTuple_GET_ITEM(rec, 0), &BufferType)
                        ? PyTuple_GET_ITEM(rec, 0)
                        : NULL;
      if (b != NULL) {
        PyObject *old = PyList_GET_ITEM(out, i);
        PyList_SET_ITEM(out, i, Py_NewRef(b));
        Py_DECREF(old);
        atomic_store_explicit(&((BufferObject *)b)->lent, 0,
                              memory_order_release);
      }
      /* Deleting an existing key allocates nothing; the record's last
       * reference may go (the Buffer is held by `out`). */
      if (rec != NULL && PyDict_DelItem(table, key) != 0)
        PyErr_Clear();
      Py_XDECREF(rec);
      PyErr_Clear(); /* a lookup that failed: nothing to drop */
    }
  } while (rc == 0 && n == CAP);
  PyMem_Free(gens);
  PyMem_Free(info);
  Py_DECREF(keys);
  if (meter != Py_None) {
    /* A test's reading, never the result: a failure to note it is
     * dropped (nothing may fail once a lend has ended). */
    PyObject *count = PyLong_FromUnsignedLongLong(visits);
    if (count == NULL || PyList_Append(meter, count) != 0)
      PyErr_Clear();
    Py_XDECREF(count);
  }
  if (rc != 0) { /* before any lend of the failing batch ended */
    /* Earlier batches' lends ended and left the table with them: their
     * Buffers are in `out`, which the error drops (still open: a
     * reclaim's Buffers are the caller's to close). */
    Py_DECREF(out);
    return raise_rc(rc, "Pool.lend_reclaim");
  }
  return out;
}

/* The docstrings are what help() shows: each starts with the signature
 * (CPython's "name($self, ...)\n--\n\n" form, which inspect.signature
 * reads; tests/python/test_stub.py checks it against pinpool/__init__.pyi)
 * and says what the call does, raises, and how it may be used from several
 * threads (docs/python.md has the whole contract). */
#define KW_METHOD(name, fn, doc)                                               \
  { name, (PyCFunction)(void (*)(void))(fn), METH_VARARGS | METH_KEYWORDS, doc }

static PyMethodDef Pool_methods[] = {
    {"alloc", Pool_alloc, METH_O,
     "alloc($self, nbytes, /)\n--\n\n"
     "Allocate nbytes bytes of the pool's memory as a Buffer.\n\n"
     "nbytes: an int >= 1; the block is rounded up to a size class\n"
     "(Buffer.block_size), only nbytes of it are exported. The block goes\n"
     "back to the pool when the Buffer is closed (or collected) and its\n"
     "last export (memoryview, ndarray, tensor, DLPack capsule) is gone.\n\n"
     "Raises ValueError (nbytes <= 0 or too large), TypeError (not an\n"
     "int), MemoryError (max_reserved reached after one retry, or the\n"
     "backend is out of memory), RuntimeError (any other backend error).\n\n"
     "Thread-safe: concurrent with every call on the pool; the GIL is\n"
     "released while the memory is allocated."},
    KW_METHOD("empty", Pool_empty,
              "empty($self, shape, dtype=None)\n--\n\n"
              "A new uninitialized array on pool memory, without a copy.\n\n"
              "shape: an int or a sequence of ints >= 0. dtype: a NumPy dtype\n"
              "(or anything numpy.dtype() takes; None: float64) gives a\n"
              "numpy.ndarray; a torch.dtype (torch.float32, ...) gives a CPU\n"
              "torch.Tensor (torch is imported only then). The block goes\n"
              "back to the pool when the array or tensor, and every view of\n"
              "it, is gone.\n\n"
              "Raises ValueError (a negative dimension, a size beyond the\n"
              "pool's limit), TypeError (shape or dtype of the wrong type),\n"
              "MemoryError (as alloc), ImportError (NumPy, or torch for a\n"
              "torch dtype, is not installed).\n\n"
              "Thread-safe, as alloc."),
    KW_METHOD("zeros", Pool_zeros,
              "zeros($self, shape, dtype=None)\n--\n\n"
              "As empty(), filled with zeros.\n\n"
              "Raises as empty(). Thread-safe, as alloc."),
    {"empty_cache", Pool_empty_cache, METH_NOARGS,
     "empty_cache($self, /)\n--\n\n"
     "Return idle (cached) memory to the backend.\n\n"
     "Blocks in use and blocks waiting on streams are kept. Raises\n"
     "RuntimeError if the backend fails.\n\n"
     "Thread-safe: concurrent with allocations (the GIL is released); the\n"
     "caches of other threads are flushed at their next call."},
    {"stats", Pool_stats, METH_NOARGS,
     "stats($self, /)\n--\n\n"
     "Every statistic of the pool (pinpool_stats_t), as a dict.\n\n"
     "Counters are ints; the fields with a current and a peak are dicts\n"
     "{'current', 'peak', 'allocated', 'freed'}; durations are dicts\n"
     "{'count', 'total_ns', 'max_ns'} (docs/stats.md). memory_stats()\n"
     "gives the same numbers under torch.cuda.memory_stats() keys.\n\n"
     "Thread-safe: each value is recent; the dict is not one atomic\n"
     "picture while other threads allocate."},
    KW_METHOD("memory_stats", Pool_memory_stats,
              "memory_stats($self)\n--\n\n"
              "The statistics under torch.cuda.memory_stats() keys, for the\n"
              "keys that mean the same thing here, as a dict sorted by key:\n"
              "'allocated_bytes.all.current', 'reserved_bytes.all.peak',\n"
              "'num_alloc_retries', 'num_ooms', ... (docs/python.md has the\n"
              "mapping; stats() has every statistic).\n\n"
              "Thread-safe, as stats()."),
    KW_METHOD("memory_summary", Pool_memory_summary,
              "memory_summary($self)\n--\n\n"
              "A readable table of memory_stats(), as\n"
              "torch.cuda.memory_summary() prints it, plus the pool's\n"
              "configuration, as a str.\n\n"
              "Thread-safe, as stats()."),
    {"reset_peak_stats", Pool_reset_peak_stats, METH_NOARGS,
     "reset_peak_stats($self, /)\n--\n\n"
     "Set every peak to its current value.\n\n"
     "Thread-safe: concurrent with everything."},
    {"process_events", Pool_process_events, METH_NOARGS,
     "process_events($self, /)\n--\n\n"
     "Reclaim the blocks whose recorded stream work has completed.\n\n"
     "Thread-safe: concurrent with everything; the GIL is released."},
    {"stream_capture", Pool_stream_capture, METH_O,
     "stream_capture($self, stream, /)\n--\n\n"
     "The id of the CUDA graph capture running on stream (an int handle\n"
     "or an object with a cuda_stream attribute), or None when it is not\n"
     "capturing: the id to give graph_release once the graphs made from\n"
     "the capture are destroyed. Raises RuntimeError on a pool without\n"
     "events=cuda (or a driver error), TypeError for a bad stream.\n"
     "Thread-safe."},
    {"graph_release", Pool_graph_release, METH_O,
     "graph_release($self, capture_id, /)\n--\n\n"
     "Every graph made from this capture is destroyed and its last launch\n"
     "completed: blocks recorded on or freed from a stream during the\n"
     "capture can be reused once their other streams are done.\n"
     "Raises ValueError for a capture the pool does not know (nothing of\n"
     "it was recorded, or it was released already). Thread-safe; the GIL\n"
     "is released."},
    {"stream_graphs_release", Pool_stream_graphs_release, METH_O,
     "stream_graphs_release($self, stream, /)\n--\n\n"
     "graph_release of every capture the pool saw on stream. Raises\n"
     "ValueError if it saw none. Thread-safe; the GIL is released."},
    {"synchronize", Pool_synchronize, METH_NOARGS,
     "synchronize($self, /)\n--\n\n"
     "Wait until no block is pending on a stream.\n\n"
     "Blocks whose events failed stay pending forever and are not waited\n"
     "for. Thread-safe: the GIL is released while waiting."},
    KW_METHOD("record_history", Pool_record_history,
              "record_history($self, enabled=True, max_entries=0, "
              "stack_depth=16, clear=False)\n--\n\n"
              "Switch the allocation history, as PyTorch's\n"
              "_record_memory_history.\n\n"
              "enabled: None or False (off), 'state' (blocks remember their\n"
              "allocating thread and stack), 'alloc' (plus history entries),\n"
              "'all' or True (stacks for every entry). max_entries: the ring\n"
              "size (0: keep the current one, 100000 at first). stack_depth:\n"
              "0..64 frames. clear: drop what was recorded.\n\n"
              "Raises ValueError (an unknown level, a value out of range),\n"
              "TypeError (a wrong type).\n\n"
              "Thread-safe: other threads see the new level at their next\n"
              "allocation."),
    KW_METHOD("snapshot", Pool_snapshot,
              "snapshot($self, path=None, *, history=True, symbols=True)"
              "\n--\n\n"
              "Write a JSON snapshot of every segment and block to path and\n"
              "return None, or return it as a str when path is None\n"
              "(docs/snapshot-format.md; json.loads() gives a dict).\n\n"
              "history: include the history ring; symbols: name the frames\n"
              "of the recorded stacks. Raises OSError (path cannot be\n"
              "written), RuntimeError (any other failure).\n\n"
              "Thread-safe: taken while other threads keep allocating; the\n"
              "GIL is released while it is written."),
    KW_METHOD("lend_reclaim", Pool_lend_reclaim,
              "lend_reclaim($self, pid=None, *, free=False, live=False)\n"
              "--\n\n"
              "End the lends of this pool to the processes that had pid\n"
              "(None: any pid) and have exited, as if each block had been\n"
              "sent back: for a worker that died. live=True also ends the\n"
              "lends to the live process pid names (None: every lend): the\n"
              "caller vouches that it writes them no more. The owner's\n"
              "Buffers of those blocks are usable again; free=True closes\n"
              "them too. Returns the number of lends ended.\n\n"
              "Raises ValueError (pid <= 0 or >= 2**31, a pool without\n"
              "shared=1),\n"
              "TypeError (pid not an int).\n\n"
              "Thread-safe; a worker still attached keeps its mapping but\n"
              "its handle is stale from now on."),
    KW_METHOD("lend_reclaim_exited", Pool_lend_reclaim_exited,
              "lend_reclaim_exited($self, *, free=False)\n--\n\n"
              "lend_reclaim for every process lent to that has exited (a\n"
              "pidfd check, immune to pid reuse; a zombie counts as exited).\n"
              "Does not wait. Returns the number of lends ended.\n\n"
              "Raises ValueError (a pool without shared=1). Thread-safe."),
    KW_METHOD("lend_collect", Pool_lend_collect,
              "lend_collect($self, grace=None)\n--\n\n"
              "Read the returns queued on this process's return socket and\n"
              "give back this pool's Buffers whose lends they ended and whose\n"
              "pickles cannot come any more: a return whose loading raised\n"
              "BlockingIOError or OSError here (multiprocessing's Queue.get\n"
              "drops the bytes) ends at a later drain, and this is where its\n"
              "Buffer comes back. grace (seconds): also the ended lends whose\n"
              "proof was read at least that long ago with no pickle since (a\n"
              "worker that died between its proof and its pickle). A pickle\n"
              "of a return handed back here that comes all the same loads as\n"
              "the same Buffer once, while it is open and not lent again;\n"
              "otherwise StaleHandleError, never counted (docs/python.md,\n"
              "\"Shared pools\"). The Buffers are not kept alive here.\n\n"
              "Raises BlockingIOError or OSError as a returned pickle's\n"
              "loading does when it has nothing to give (what was read is\n"
              "kept: call again later), ValueError (a pool without shared=1,\n"
              "grace < 0), TypeError (grace not a number). Thread-safe."),
    {"_lend_reclaim", Pool__lend_reclaim, METH_VARARGS, NULL},
    {"_lend_refused", Pool__lend_refused, METH_NOARGS, NULL},
    {"__enter__", Pool_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nReturn the pool."},
    {"__exit__", Pool_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc_value, traceback, /)\n--\n\n"
     "Call empty_cache(); the pool itself lives on. Returns False."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Pool_getset[] = {
    {"config", Pool_get_config, NULL,
     "The resolved configuration, 'key=value,...' (every key, defaults\n"
     "included; docs/configuration.md). Read-only; thread-safe.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject PoolType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pinpool.Pool",
    .tp_basicsize = sizeof(PoolObject),
    .tp_dealloc = (destructor)Pool_dealloc,
    .tp_weaklistoffset = offsetof(PoolObject, weaklist),
    .tp_repr = Pool_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Pool(config=None)\n--\n\n"
        "A caching allocator of pinned (page-locked) host memory.\n\n"
        "config: 'key=value,...' (docs/configuration.md), for example\n"
        "'max_cached=1GiB,mlock=1' or 'backend=cuda,device=0'; None reads\n"
        "the PINPOOL_CONF environment variable, '' means the defaults.\n"
        "A configured reserve is allocated here (the GIL is released).\n\n"
        "Raises ValueError (a bad config: the message names the key),\n"
        "TypeError (config not a str), MemoryError, RuntimeError (the\n"
        "backend, e.g. backend=cuda without a driver).\n\n"
        "Every method may be called from any number of threads at once, on\n"
        "a GIL or a free-threaded build. The pool is torn down when this\n"
        "object and every Buffer and export of its memory are gone. As a\n"
        "context manager it calls empty_cache() on exit.",
    .tp_methods = Pool_methods,
    .tp_getset = Pool_getset,
    .tp_new = Pool_new,
};

/* ---- The default pool ---------------------------------------------------- */

/* Created on first use from PINPOOL_CONF, published with one CAS: racing
 * first calls each build a pool, one wins, the others drop theirs. */
static _Atomic(PyObject *) default_pool_obj;

#ifdef PINPOOL_MUTANT_DEFAULT_POOL_PLAIN
/* Race mutant (tests/freethreaded, docs/verification.md): the default pool
 * published as a plain pointer, checked and then set, as lazy module state
 * is often written for the GIL. Free-threaded, racing first calls read and
 * write it at once (and may each keep a pool); ThreadSanitizer must say so. */
static PyObject *get_default_pool(void) {
  PyObject **plain = (PyObject **)&default_pool_obj;
  if (*plain != NULL)
    return Py_NewRef(*plain);
  PyObject *fresh = PyObject_CallNoArgs((PyObject *)&PoolType);
  if (fresh == NULL)
    return NULL;
  if (*plain == NULL) {
    *plain = fresh;
    return Py_NewRef(fresh);
  }
  Py_DECREF(fresh);
  return Py_NewRef(*plain);
}
#else
static PyObject *get_default_pool(void) {
  PyObject *p = atomic_load_explicit(&default_pool_obj, memory_order_acquire);
  if (p != NULL)
    return Py_NewRef(p);
  PyObject *fresh = PyObject_CallNoArgs((PyObject *)&PoolType);
  if (fresh == NULL)
    return NULL;
  PyObject *expected = NULL;
  if (atomic_compare_exchange_strong_explicit(&default_pool_obj, &expected,
                                              fresh, memory_order_acq_rel,
                                              memory_order_acquire))
    return Py_NewRef(fresh); /* the module keeps `fresh`'s reference */
  Py_DECREF(fresh);
  return Py_NewRef(expected);
}
#endif

static PyObject *mod_default_pool(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  return get_default_pool();
}

static PyObject *mod_alloc(PyObject *m, PyObject *arg) {
  (void)m;
  PyObject *pool = get_default_pool();
  if (pool == NULL)
    return NULL;
  PyObject *r = pool_alloc(pool, arg);
  Py_DECREF(pool);
  return r;
}

/* ---- Buffer ---------------------------------------------------------------
 */

static PyObject *new_buffer(PyObject *pool_obj, pinpool_buffer_t *buf) {
  BufferObject *self = PyObject_New(BufferObject, &BufferType);
  if (self == NULL) {
    (void)pinpool_buffer_release(buf);
    return NULL;
  }
  self->buf = buf;
  self->pool = Py_NewRef(pool_obj);
  self->att = NULL;
  self->weaklist = NULL;
  atomic_init(&self->lent, 0);
  (void)pinpool_buffer_ptr(buf, &self->ptr);
  (void)pinpool_buffer_requested_size(buf, &self->nbytes);
  (void)pinpool_buffer_size(buf, &self->block_size);
  self->device_type = ((PoolObject *)pool_obj)->device_type;
  return (PyObject *)self;
}

/* ---- Attached blocks (a worker's side of a lend) ------------------------ */

static void att_put(attach_t *a) {
  if (atomic_fetch_sub_explicit(&a->holds, 1, memory_order_acq_rel) == 1)
    free(a);
}

/* Closed and no export left: unmap (the library refcounts the chunk). */
static void att_detach(attach_t *a) { (void)pinpool_share_detach(a->ptr); }

/* Once-only; detaches now if nothing is exported, else at the last
 * export's release. Returns 1 if this call closed it. */
static int att_close(attach_t *a) {
  uint64_t old =
      atomic_fetch_or_explicit(&a->state, ATT_CLOSED, memory_order_acq_rel);
  if (old & ATT_CLOSED)
    return 0;
  if (old == 0)
    att_detach(a);
  return 1;
}

/* An export of attached memory: a pinpool_export_t (buffer NULL, which no
 * export of the library has) followed by its attach. */
typedef struct att_export {
  pinpool_export_t e; /* first: the pointer callers hold */
  attach_t *a;
} att_export_t;

static int att_export(attach_t *a, unsigned flags,
                      const pinpool_export_t **out) {
  uint64_t s = atomic_load_explicit(&a->state, memory_order_acquire);
  do {
    if (s & ATT_CLOSED)
      return PINPOOL_EBUSY;
  } while (!atomic_compare_exchange_weak_explicit(
      &a->state, &s, s + 1, memory_order_acq_rel, memory_order_acquire));
  att_export_t *x = calloc(1, sizeof *x);
  if (x == NULL) {
    if (atomic_fetch_sub_explicit(&a->state, 1, memory_order_acq_rel) ==
        (ATT_CLOSED | 1))
      att_detach(a);
    return PINPOOL_ENOMEM;
  }
  atomic_fetch_add_explicit(&a->holds, 1, memory_order_relaxed);
  x->a = a;
  x->e.ptr = a->ptr;
  x->e.size = a->nbytes;
  x->e.readonly = (flags & PINPOOL_EXPORT_READONLY) != 0;
  x->e.ndim = 1;
  x->e.shape[0] = (int64_t)a->nbytes;
  x->e.strides[0] = 1;
  x->e.buffer = NULL;
  *out = &x->e;
  return 0;
}

/* Release an export of either kind, from any thread, touching no Python
 * object (the DLPack deleters call it). */
static void export_release(const pinpool_export_t *e) {
  if (e->buffer != NULL) {
    (void)pinpool_export_release(e);
    return;
  }
  att_export_t *x = (att_export_t *)(uintptr_t)e;
  attach_t *a = x->a;
  free(x);
  if (atomic_fetch_sub_explicit(&a->state, 1, memory_order_acq_rel) ==
      (ATT_CLOSED | 1))
    att_detach(a);
  att_put(a);
}

static void Buffer_dealloc(BufferObject *self) {
  /* Our reference: the last one closes the buffer; exports keep the
   * memory. The Pool goes after (it may be the pool's last owner). An
   * attached block is detached (now, or at its last export's release). */
  if (self->weaklist != NULL)
    PyObject_ClearWeakRefs((PyObject *)self);
  if (self->att != NULL) {
    (void)att_close(self->att);
    att_put(self->att);
  } else {
    (void)pinpool_buffer_release(self->buf);
  }
  Py_XDECREF(self->pool);
  PyObject_Free(self);
}

static int buffer_closed(BufferObject *self) {
  if (self->att != NULL)
    return (atomic_load_explicit(&self->att->state, memory_order_acquire) &
            ATT_CLOSED) != 0;
  int closed = 1;
  (void)pinpool_buffer_closed(self->buf, &closed);
  return closed;
}

/* Take an export of the buffer's memory, or set BufferError/MemoryError
 * and return -1. Refused while the block is lent to another process. */
static int take_export(BufferObject *self, unsigned flags,
                       const pinpool_export_t **out) {
  int lent = atomic_load_explicit(&self->lent, memory_order_acquire);
  if (lent == LENT_CLOSING) { /* close_hook: closed a moment from now */
    PyErr_SetString(PyExc_BufferError, "pinpool.Buffer is closed");
    return -1;
  }
  if (lent != 0) {
    PyErr_Format(PyExc_BufferError,
                 "pinpool.Buffer is lent to process %d: its bytes are the "
                 "worker's until it is returned or reclaimed",
                 lent);
    return -1;
  }
  int rc = self->att != NULL ? att_export(self->att, flags, out)
                             : pinpool_buffer_export(self->buf, flags, out);
  if (rc == 0)
    return 0;
  if (rc == PINPOOL_EBUSY)
    PyErr_SetString(PyExc_BufferError, "pinpool.Buffer is closed");
  else if (rc == PINPOOL_ENOMEM)
    PyErr_NoMemory();
  else
    PyErr_Format(PyExc_BufferError, "pinpool.Buffer: %s", pinpool_last_error());
  return -1;
}

/* The buffer protocol. The export is taken first (non-blocking: we never
 * detach while the view is being filled), then the view is filled, and
 * view->obj set last. */
static int Buffer_getbuffer(PyObject *obj, Py_buffer *view, int flags) {
  BufferObject *self = (BufferObject *)obj;
  const pinpool_export_t *e = NULL;
  if (take_export(self, 0, &e) != 0) {
    view->obj = NULL;
    return -1;
  }
  view->buf = e->ptr;
  view->len = (Py_ssize_t)e->size;
  view->readonly = e->readonly;
  view->itemsize = 1;
  view->format = (flags & PyBUF_FORMAT) ? "B" : NULL;
  view->ndim = 1;
  /* Per export: they point into this view, not into shared storage. */
  view->shape = (flags & PyBUF_ND) ? &view->len : NULL;
  view->strides =
      (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? &view->itemsize : NULL;
  view->suboffsets = NULL;
  view->internal = (void *)(uintptr_t)e;
  view->obj = Py_NewRef(obj); /* last */
  return 0;
}

static void Buffer_releasebuffer(PyObject *obj, Py_buffer *view) {
  (void)obj; /* view->obj is the caller's to release */
  export_release((const pinpool_export_t *)view->internal);
}

static PyBufferProcs Buffer_as_buffer = {Buffer_getbuffer,
                                         Buffer_releasebuffer};

/* ---- DLPack ------------------------------------------------------------ */

typedef struct dl_ctx {
  DLManagedTensorVersioned v; /* one of v and l is handed out */
  DLManagedTensor l;
  const pinpool_export_t *exp;
  int64_t shape[1], strides[1];
} dl_ctx_t;

/* The deleters: no Python object is touched, so any thread may call them,
 * holding the GIL or not, during or after interpreter finalization. */
static void dl_delete_versioned(DLManagedTensorVersioned *m) {
  dl_ctx_t *c = m->manager_ctx;
  export_release(c->exp);
  free(c);
}

static void dl_delete_legacy(DLManagedTensor *m) {
  dl_ctx_t *c = m->manager_ctx;
  export_release(c->exp);
  free(c);
}

static const char DL_NAME[] = "dltensor";
static const char DL_USED[] = "used_dltensor";
static const char DLV_NAME[] = "dltensor_versioned";
static const char DLV_USED[] = "used_dltensor_versioned";

/* A capsule nobody consumed: delete the tensor. Keeps any pending error. */
static void dl_capsule_destructor(PyObject *capsule) {
  if (PyCapsule_IsValid(capsule, DL_USED) ||
      PyCapsule_IsValid(capsule, DLV_USED))
    return;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  if (PyCapsule_IsValid(capsule, DLV_NAME)) {
    DLManagedTensorVersioned *m = PyCapsule_GetPointer(capsule, DLV_NAME);
    if (m != NULL && m->deleter != NULL)
      m->deleter(m);
  } else if (PyCapsule_IsValid(capsule, DL_NAME)) {
    DLManagedTensor *m = PyCapsule_GetPointer(capsule, DL_NAME);
    if (m != NULL && m->deleter != NULL)
      m->deleter(m);
  }
  if (PyErr_Occurred())
    PyErr_WriteUnraisable(capsule);
  PyErr_Restore(type, value, tb);
}

/* Parse a 2-tuple of ints. 0, or -1 with TypeError naming `what`. */
static int parse_pair(PyObject *o, const char *what, long *a, long *b) {
  if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 2) {
    PyErr_Format(PyExc_TypeError, "%s must be a tuple of two ints", what);
    return -1;
  }
  *a = PyLong_AsLong(PyTuple_GET_ITEM(o, 0));
  if (*a == -1 && PyErr_Occurred())
    return -1;
  *b = PyLong_AsLong(PyTuple_GET_ITEM(o, 1));
  if (*b == -1 && PyErr_Occurred())
    return -1;
  return 0;
}

/* A copy of the buffer's bytes in a new buffer of the same pool. */
static int copy_buffer(BufferObject *self, pinpool_buffer_t **out) {
  if (self->att != NULL) {
    PyErr_SetString(PyExc_BufferError,
                    "__dlpack__(copy=True): an attached buffer has no pool "
                    "to copy into (copy it in the owner)");
    return -1;
  }
  pinpool_t *pool = ((PoolObject *)self->pool)->pool;
  pinpool_buffer_t *copy = NULL;
  const pinpool_export_t *src = NULL;
  if (take_export(self, PINPOOL_EXPORT_READONLY, &src) != 0)
    return -1;
  int rc;
  PyThreadState *ts = PyEval_SaveThread();
  rc = pinpool_buffer_alloc(pool, self->nbytes, &copy);
  if (rc == 0) {
    void *dst = NULL;
    (void)pinpool_buffer_ptr(copy, &dst);
    memcpy(dst, src->ptr, src->size);
  }
  PyEval_RestoreThread(ts);
  export_release(src);
  if (rc != 0) {
    raise_rc(rc, "Buffer.__dlpack__(copy=True)");
    return -1;
  }
  *out = copy;
  return 0;
}

static PyObject *Buffer_dlpack(PyObject *obj, PyObject *args, PyObject *kw) {
  BufferObject *self = (BufferObject *)obj;
  static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
  PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None;
  PyObject *copy = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist,
                                   &stream, &max_version, &dl_device, &copy))
    return NULL;
  /* stream: host memory needs no producer-side synchronization: None, or
   * -1 ("no synchronization"). Anything else is refused (use
   * record_stream() to make the block's reuse wait for a stream). */
  if (stream != Py_None) {
    if (!PyLong_Check(stream)) {
      PyErr_SetString(PyExc_TypeError, "stream must be an int or None");
      return NULL;
    }
    long s = PyLong_AsLong(stream);
    if (s == -1 && PyErr_Occurred())
      return NULL;
    if (s != -1) {
      PyErr_Format(PyExc_BufferError,
                   "stream=%ld: pinpool buffers are host memory and take "
                   "only stream=None or -1 (see Buffer.record_stream)",
                   s);
      return NULL;
    }
  }
  bool versioned = false;
  if (max_version != Py_None) {
    long major, minor;
    if (parse_pair(max_version, "max_version", &major, &minor) != 0)
      return NULL;
    versioned = major >= 1;
  }
  int32_t dev_type = self->device_type;
  if (dl_device != Py_None) {
    long type, id;
    if (parse_pair(dl_device, "dl_device", &type, &id) != 0)
      return NULL;
    /* Pinned memory is also CPU memory: kDLCPU needs no copy. */
    if (id == 0 && (type == dev_type || type == kDLCPU)) {
      dev_type = (int32_t)type;
    } else {
      PyErr_Format(PyExc_BufferError,
                   "dl_device=(%ld, %ld): a pinpool buffer is host memory "
                   "(device (%d, 0)) and is not copied to other devices",
                   type, id, (int)self->device_type);
      return NULL;
    }
  }
  int want_copy = 0;
  if (copy != Py_None) {
    want_copy = PyObject_IsTrue(copy);
    if (want_copy < 0)
      return NULL;
  }

  dl_ctx_t *c = calloc(1, sizeof *c);
  if (c == NULL)
    return PyErr_NoMemory();
  if (!want_copy) {
    if (take_export(self, 0, &c->exp) != 0) {
      free(c);
      return NULL;
    }
  } else {
    pinpool_buffer_t *src = NULL;
    if (copy_buffer(self, &src) != 0) {
      free(c);
      return NULL;
    }
    int rc = pinpool_buffer_export(src, 0, &c->exp);
    /* the export holds the copy from now on */
    (void)pinpool_buffer_release(src);
    if (rc != 0) {
      free(c);
      raise_rc(rc, "Buffer.__dlpack__");
      return NULL;
    }
  }
  c->shape[0] = c->exp->shape[0];
  c->strides[0] = 1;
  DLTensor t = {
      .data = c->exp->ptr,
      .device = {dev_type, 0},
      .ndim = 1,
      .dtype = {kDLUInt, 8, 1},
      .shape = c->shape,
      .strides = c->strides,
      .byte_offset = 0,
  };
  void *tensor;
  const char *name;
  if (versioned) {
    c->v.version = (DLPackVersion){PP_DLPACK_MAJOR, PP_DLPACK_MINOR};
    c->v.manager_ctx = c;
    c->v.deleter = dl_delete_versioned;
    c->v.flags = want_copy ? DLPACK_FLAG_BITMASK_IS_COPIED : 0;
    c->v.dl_tensor = t;
    tensor = &c->v;
    name = DLV_NAME;
  } else {
    c->l.manager_ctx = c;
    c->l.deleter = dl_delete_legacy;
    c->l.dl_tensor = t;
    tensor = &c->l;
    name = DL_NAME;
  }
  PyObject *capsule = PyCapsule_New(tensor, name, dl_capsule_destructor);
  if (capsule == NULL) {
    export_release(c->exp);
    free(c);
  }
  return capsule;
}

static PyObject *Buffer_dlpack_device(PyObject *obj, PyObject *unused) {
  (void)unused;
  return Py_BuildValue("(ii)", ((BufferObject *)obj)->device_type, 0);
}

/* Tests only (close_hook, tests/python/test_share_hostile.py): called by
 * Buffer.close with the buffer in the window between its lend check and
 * the close, so that a test replays a lend racing the close (free-threaded
 * Python runs them at once) deterministically on any interpreter. NULL
 * otherwise: one atomic load per close. Set and cleared by one thread
 * while no close runs. */
static _Atomic(PyObject *) close_hook;

static PyObject *mod_set_close_hook(PyObject *m, PyObject *fn) {
  (void)m; /* close_hook */
  PyObject *old = atomic_exchange_explicit(
      &close_hook, fn == Py_None ? NULL : Py_NewRef(fn), memory_order_acq_rel);
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

static PyObject *Buffer_close(PyObject *obj, PyObject *unused) {
  (void)unused;
  BufferObject *self = (BufferObject *)obj;
  if (self->att != NULL) {
    (void)att_close(self->att);
    Py_RETURN_NONE;
  }
  /* The lend check and the close are one step for a concurrent lend:
   * `lent` goes 0 -> LENT_CLOSING first, so a lend racing the close (free-
   * threaded Python) fails its own compare-and-swap, and a lend already
   * under way (-1) makes the close refuse. Otherwise one could close a
   * block that a lend made just after the check (its free refused: the
   * block allocated for good), or lend a block the close had just freed. */
  int lent = 0;
  if (!atomic_compare_exchange_strong_explicit(&self->lent, &lent, LENT_CLOSING,
                                               memory_order_acq_rel,
                                               memory_order_acquire)) {
    if (lent < 0)
      return PyErr_Format(PyExc_BufferError,
                          "Buffer.close: the block is being lent or closed "
                          "by another thread");
    return PyErr_Format(PyExc_BufferError,
                        "Buffer.close: the block is lent to process %d; "
                        "close it once it is returned or reclaimed "
                        "(Pool.lend_reclaim)",
                        lent);
  }
  PyObject *hook = atomic_load_explicit(&close_hook, memory_order_acquire);
  if (hook != NULL) { /* close_hook */
    PyObject *r = PyObject_CallOneArg(hook, obj);
    if (r == NULL) {
      atomic_store_explicit(&self->lent, 0, memory_order_release);
      return NULL;
    }
    Py_DECREF(r);
  }
  int rc = pinpool_buffer_close(self->buf);
  /* Closed (or not, on error): a lend from now on sees buffer_closed. */
  atomic_store_explicit(&self->lent, 0, memory_order_release);
  if (rc != 0)
    return raise_rc(rc, "Buffer.close");
  Py_RETURN_NONE;
}

/* The stream handle of `arg`: an int, or an object with a `cuda_stream`
 * attribute that is one (torch.cuda.Stream, cupy's and cuda-python's
 * streams), so that PyTorch code passes its stream as it would to
 * Tensor.record_stream. 0, or -1 with TypeError/ValueError. */
static int parse_stream(PyObject *arg, pinpool_stream_t *out) {
  PyObject *handle;
  if (PyLong_Check(arg)) {
    handle = Py_NewRef(arg);
  } else {
    handle = PyObject_GetAttrString(arg, "cuda_stream");
    if (handle == NULL) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError))
        return -1;
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "stream must be an int (a handle) or have a "
                   "'cuda_stream' attribute (torch.cuda.Stream), not %.100s",
                   Py_TYPE(arg)->tp_name);
      return -1;
    }
    if (!PyLong_Check(handle)) {
      PyErr_Format(PyExc_TypeError,
                   "stream.cuda_stream must be an int, not "
                   "%.100s",
                   Py_TYPE(handle)->tp_name);
      Py_DECREF(handle);
      return -1;
    }
  }
  unsigned long long s = PyLong_AsUnsignedLongLong(handle);
  Py_DECREF(handle);
  if (s == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "stream must be an int >= 0");
    return -1;
  }
  *out = (pinpool_stream_t)s;
  return 0;
}

static PyObject *Buffer_record_stream(PyObject *obj, PyObject *arg) {
  BufferObject *self = (BufferObject *)obj;
  pinpool_stream_t s;
  if (parse_stream(arg, &s) != 0)
    return NULL;
  if (self->att != NULL) {
    PyErr_SetString(PyExc_ValueError,
                    "Buffer.record_stream: an attached buffer (another "
                    "process's block) has no streams; record them in the "
                    "owner");
    return NULL;
  }
  int rc = pinpool_buffer_record_stream(self->buf, s);
  if (rc == PINPOOL_EBUSY && buffer_closed(self)) {
    PyErr_SetString(PyExc_ValueError, "Buffer.record_stream: closed buffer");
    return NULL;
  }
  if (rc != 0)
    return raise_rc(rc, "Buffer.record_stream");
  Py_RETURN_NONE;
}

static PyObject *Buffer_enter(PyObject *self, PyObject *unused) {
  (void)unused;
  return Py_NewRef(self);
}

static PyObject *Buffer_exit(PyObject *self, PyObject *args) {
  (void)args;
  PyObject *r = Buffer_close(self, NULL);
  if (r == NULL)
    return NULL;
  Py_DECREF(r);
  Py_RETURN_FALSE;
}

static Py_ssize_t Buffer_len(PyObject *obj) {
  return (Py_ssize_t)((BufferObject *)obj)->nbytes;
}

static PyObject *Buffer_get_nbytes(PyObject *obj, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(((BufferObject *)obj)->nbytes);
}

static PyObject *Buffer_get_block_size(PyObject *obj, void *closure) {
  (void)closure;
  return PyLong_FromSize_t(((BufferObject *)obj)->block_size);
}

static PyObject *Buffer_get_ptr(PyObject *obj, void *closure) {
  (void)closure;
  BufferObject *self = (BufferObject *)obj;
  if (buffer_closed(self)) {
    PyErr_SetString(PyExc_ValueError, "Buffer.ptr: closed buffer");
    return NULL;
  }
  return PyLong_FromVoidPtr(self->ptr);
}

static PyObject *Buffer_get_pool(PyObject *obj, void *closure) {
  (void)closure;
  PyObject *pool = ((BufferObject *)obj)->pool;
  if (pool == NULL) /* attached: the pool lives in another process */
    Py_RETURN_NONE;
  return Py_NewRef(pool);
}

static PyObject *Buffer_get_closed(PyObject *obj, void *closure) {
  (void)closure;
  return PyBool_FromLong(buffer_closed((BufferObject *)obj));
}

static PyObject *Buffer_get_exports(PyObject *obj, void *closure) {
  (void)closure;
  BufferObject *self = (BufferObject *)obj;
  size_t n = 0;
  if (self->att != NULL)
    n = (size_t)(atomic_load_explicit(&self->att->state, memory_order_acquire) &
                 ~ATT_CLOSED);
  else
    (void)pinpool_buffer_exports(self->buf, &n);
  return PyLong_FromSize_t(n);
}

static int get_attrs(PyObject *obj, pinpool_mem_attrs_t *a) {
  BufferObject *self = (BufferObject *)obj;
  if (self->att != NULL) {
    /* Host memory another process locked (and maybe registered): not
     * locked here (mlock is per mapping), and no device in a worker. */
    *a = (pinpool_mem_attrs_t){.host_accessible = 1,
                               .device_accessible = 0,
                               .device_id = -1,
                               .page_locked = 0,
                               .numa_node = -1,
                               .huge_pages = -1,
                               .huge_advised = 0,
                               .backend = "attached"};
    return 0;
  }
  int rc = pinpool_buffer_attrs(self->buf, a);
  if (rc == PINPOOL_EBUSY) {
    PyErr_SetString(PyExc_ValueError,
                    "Buffer attributes: closed buffer (never queried)");
    return -1;
  }
  if (rc != 0) {
    raise_rc(rc, "Buffer attributes");
    return -1;
  }
  return 0;
}

/* 1/0 as bool, -1 (unknown) as None. */
static PyObject *tri(int v) {
  if (v < 0)
    Py_RETURN_NONE;
  return PyBool_FromLong(v);
}

static PyObject *attrs_dict(const pinpool_mem_attrs_t *a) {
  PyObject *d = PyDict_New();
  if (d == NULL || set_obj(d, "host_accessible", tri(a->host_accessible)) ||
      set_obj(d, "device_accessible", tri(a->device_accessible)) ||
      set_obj(d, "device_id", PyLong_FromLong(a->device_id)) ||
      set_obj(d, "page_locked", tri(a->page_locked)) ||
      set_obj(d, "numa_node", PyLong_FromLong(a->numa_node)) ||
      set_obj(d, "huge_pages", tri(a->huge_pages)) ||
      set_obj(d, "huge_advised", tri(a->huge_advised)) ||
      set_obj(d, "backend", PyUnicode_FromString(a->backend))) {
    Py_XDECREF(d);
    return NULL;
  }
  return d;
}

enum {
  A_ALL,
  A_HOST,
  A_DEVICE,
  A_DEVICE_ID,
  A_LOCKED,
  A_NUMA,
  A_HUGE,
  A_BACKEND
};

static PyObject *Buffer_get_attr(PyObject *obj, void *closure) {
  pinpool_mem_attrs_t a;
  if (get_attrs(obj, &a) != 0)
    return NULL;
  switch ((int)(intptr_t)closure) {
  case A_HOST:
    return tri(a.host_accessible);
  case A_DEVICE:
    return tri(a.device_accessible);
  case A_DEVICE_ID:
    return PyLong_FromLong(a.device_id);
  case A_LOCKED:
    return tri(a.page_locked);
  case A_NUMA:
    return PyLong_FromLong(a.numa_node);
  case A_HUGE:
    return tri(a.huge_pages);
  case A_BACKEND:
    return PyUnicode_FromString(a.backend);
  default:
    return attrs_dict(&a);
  }
}

/* The key of a lend in pinpool._share's table: (pool nonce, generation). */
static PyObject *lend_key(const pinpool_share_handle_t *h) {
  return Py_BuildValue("(KK)", (unsigned long long)h->nonce,
                       (unsigned long long)h->generation);
}

/* _lend_into(pid, pidfd, table, record) -> key: Buffer.lend's C call
 * (pinpool_lend to pid, or pinpool_lend_pidfd where pidfd >= 0: the
 * process pid names) and pinpool._share's table entry for it,
 * table[(nonce, generation)] = record(buf, pid, handle, fd, ctl_fd), as
 * one step: no Python code runs between them (the record is built by
 * tuple's own tp_new, not by the namedtuple's Python __new__), so that
 * no asynchronous exception (KeyboardInterrupt, a raising SIGALRM
 * handler) can leave a lend in C that the table lacks (issue 36, third
 * review, item 4). If the entry cannot be made (MemoryError), the lend is
 * returned again: the call changes nothing. It is the only lending call
 * (the former _lend, whose caller filled the table after it, is gone). Returns
 * the key, which the table holds (no allocation after the entry is made). */
static PyObject *Buffer__lend_into(PyObject *obj, PyObject *args) {
  BufferObject *self = (BufferObject *)obj;
  int peer, pidfd;
  PyObject *table, *rtype;
  if (!PyArg_ParseTuple(args, "iiO!O!:_lend_into", &peer, &pidfd, &PyDict_Type,
                        &table, &PyType_Type, &rtype))
    return NULL;
  if (!PyType_IsSubtype((PyTypeObject *)rtype, &PyTuple_Type))
    return PyErr_Format(PyExc_TypeError, "_lend_into: record is not a tuple");
  if (self->att != NULL)
    return PyErr_Format(PyExc_TypeError,
                        "Buffer.lend: an attached buffer is another "
                        "process's block; only its owner lends it");
  if (peer <= 0)
    return PyErr_Format(PyExc_ValueError,
                        "Buffer.lend: pid must be > 0, not %d", peer);
  int expected = 0;
  if (!atomic_compare_exchange_strong_explicit(&self->lent, &expected, -1,
                                               memory_order_acq_rel,
                                               memory_order_acquire)) {
    if (expected == LENT_CLOSING) /* close_hook: the close wins */
      return PyErr_Format(PyExc_ValueError,
                          "Buffer.lend: the buffer is being closed");
    return PyErr_Format(PyExc_BufferError,
                        "Buffer.lend: the block is lent already (to %d)",
                        expected);
  }
  if (buffer_closed(self)) {
    atomic_store_explicit(&self->lent, 0, memory_order_release);
    return PyErr_Format(PyExc_ValueError, "Buffer.lend: closed buffer");
  }
  pinpool_t *pool = ((PoolObject *)self->pool)->pool;
  pinpool_share_handle_t h;
  int fd = -1;
  int rc = pidfd >= 0 ? pinpool_lend_pidfd(pool, self->ptr, pidfd, &h, &fd)
                      : pinpool_lend(pool, self->ptr, peer, &h, &fd);
  if (rc != 0) {
    atomic_store_explicit(&self->lent, 0, memory_order_release);
    return raise_rc(rc, "Buffer.lend");
  }
  PyObject *key = lend_key(&h);
  PyObject *fields =
      key == NULL ? NULL
                  : Py_BuildValue("(Oiy#ii)", obj, peer, (const char *)&h,
                                  (Py_ssize_t)sizeof h, fd, h.owner_ctl_fd);
  PyObject *targs = fields == NULL ? NULL : PyTuple_Pack(1, fields);
  PyObject *rec = targs == NULL
                      ? NULL
                      : PyTuple_Type.tp_new((PyTypeObject *)rtype, targs, NULL);
  Py_XDECREF(targs);
  if (rec == NULL || PyDict_SetItem(table, key, rec) != 0) {
    /* Undone: the lend's own token and peer, so the return is accepted. */
    int back = pidfd >= 0 ? pinpool_lend_return_pidfd(pool, &h, pidfd)
                          : pinpool_lend_return(pool, &h, peer);
    (void)back;
    atomic_store_explicit(&self->lent, 0, memory_order_release);
    Py_XDECREF(key);
    Py_XDECREF(fields);
    Py_XDECREF(rec);
    return NULL;
  }
  atomic_store_explicit(&self->lent, peer, memory_order_release);
  Py_DECREF(fields);
  Py_DECREF(rec);
  return key; /* the table's own key object */
}

/* After a return pinpool accepted: the table's entry goes with it, in C
 * (no Python code between the two: item 4 above). key was made before
 * the return, so nothing here can fail; an entry already gone is fine. */
static void lend_untable(PyObject *table, PyObject *key) {
  if (table != NULL && PyDict_DelItem(table, key) != 0)
    PyErr_Clear();
}

/* _lend_return(handle, peer[, table]): pinpool_lend_return from process
 * peer; the block is ours again, and table (pinpool._share's) loses the
 * lend's entry in the same step. */
/* The two returns' one body: parse (handle, peer[, table]) with fmt, end
 * the lend by `by_pidfd` (pinpool_lend_return_pidfd) or by pid, then drop
 * the table's entry and mark the buffer ours again. */
static PyObject *lend_return_common(PyObject *obj, PyObject *args,
                                    const char *fmt, bool by_pidfd) {
  BufferObject *self = (BufferObject *)obj;
  PyObject *hobj, *table = NULL, *ended = NULL, *ekey = NULL, *eval = NULL;
  int peer;
  if (!PyArg_ParseTuple(args, fmt, &hobj, &peer, &PyDict_Type, &table,
                        &PyDict_Type, &ended, &ekey, &eval))
    return NULL;
  if (ended != NULL && (ekey == NULL || eval == NULL))
    return PyErr_Format(PyExc_TypeError, "_lend_return: outcome incomplete");
  pinpool_share_handle_t h;
  if (parse_handle(hobj, &h) != 0)
    return NULL;
  if (self->att != NULL || self->ptr == NULL)
    return PyErr_Format(PyExc_TypeError, "not an owner's buffer");
  PyObject *key = lend_key(&h);
  if (key == NULL)
    return NULL;
  /* The outcome, ended[ekey] = eval, is recorded before the return (it
   * may allocate) and taken out again if the return is refused: the lend
   * ends together with its record, no Python code between them (as the
   * table's entry: an asynchronous exception right after this call
   * cannot leave an ended lend whose Buffer no table holds; rvpy39 D2). A
   * key already there is left as it is. */
  int fresh = 0;
  if (ended != NULL) {
    int has = PyDict_Contains(ended, ekey);
    if (has < 0 || (has == 0 && PyDict_SetItem(ended, ekey, eval) != 0)) {
      Py_DECREF(key);
      return NULL;
    }
    fresh = has == 0;
  }
  pinpool_t *pool = ((PoolObject *)self->pool)->pool;
  int rc = by_pidfd ? pinpool_lend_return_pidfd(pool, &h, peer)
                    : pinpool_lend_return(pool, &h, peer);
  if (rc != 0) {
    Py_DECREF(key);
    if (fresh && PyDict_DelItem(ended, ekey) != 0)
      PyErr_Clear();
    return raise_rc(rc, "returned Buffer");
  }
  lend_untable(table, key);
  Py_DECREF(key);
  atomic_store_explicit(&self->lent, 0, memory_order_release);
  Py_RETURN_NONE;
}

static PyObject *Buffer__lend_return(PyObject *obj, PyObject *args) {
  return lend_return_common(obj, args, "Oi|O!O!OO:_lend_return", false);
}

/* _lend_return_pidfd(handle, pidfd): pinpool_lend_return_pidfd from the
 * process pidfd names (SO_PEERPIDFD of the return's connection); the
 * block is ours again. */
static PyObject *Buffer__lend_return_pidfd(PyObject *obj, PyObject *args) {
  return lend_return_common(obj, args, "Oi|O!O!OO:_lend_return_pidfd", true);
}

/* _close_unexported(): close an attached buffer only if nothing is
 * exported from it, in one step: the state goes from exactly 0 (open, no
 * export) to ATT_CLOSED, and the block is detached at once; else
 * BufferError (a live export) or ValueError (closed already), and nothing
 * changes. A worker sending its block back used to read `exports` and
 * then close: a view taken by another thread in between survived the
 * close (att_close only defers the detach), the proof was sent, and the
 * view wrote into the block the owner had reused (issue 36, rvpy39 D1). */
static PyObject *Buffer__close_unexported(PyObject *obj, PyObject *unused) {
  (void)unused;
  attach_t *a = ((BufferObject *)obj)->att;
  if (a == NULL)
    return PyErr_Format(PyExc_TypeError, "not an attached buffer");
  uint64_t s = 0;
  if (!atomic_compare_exchange_strong_explicit(&a->state, &s, ATT_CLOSED,
                                               memory_order_acq_rel,
                                               memory_order_acquire)) {
    if (s == ATT_CLOSED) /* exports win: a closed one can only lose them */
      return PyErr_Format(PyExc_ValueError,
                          "cannot send back a closed shared Buffer");
    s &= ~ATT_CLOSED;
    return PyErr_Format(PyExc_BufferError,
                        "cannot send back a shared Buffer with %llu live "
                        "export(s) (memoryview, ndarray, tensor): release "
                        "them first",
                        (unsigned long long)s);
  }
  att_detach(a);
  Py_RETURN_NONE;
}

/* _attached_handle(): the handle of an attached buffer, else None. */
static PyObject *Buffer__attached_handle(PyObject *obj, PyObject *unused) {
  (void)unused;
  attach_t *a = ((BufferObject *)obj)->att;
  if (a == NULL)
    Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char *)&a->handle, sizeof a->handle);
}

static PyObject *Buffer_get_lent_to(PyObject *obj, void *closure) {
  (void)closure;
  int lent =
      atomic_load_explicit(&((BufferObject *)obj)->lent, memory_order_acquire);
  if (lent <= 0)
    Py_RETURN_NONE;
  return PyLong_FromLong(lent);
}

static PyObject *Buffer_get_attached(PyObject *obj, void *closure) {
  (void)closure;
  return PyBool_FromLong(((BufferObject *)obj)->att != NULL);
}

static PyObject *Buffer_repr(PyObject *obj) {
  BufferObject *self = (BufferObject *)obj;
  return PyUnicode_FromFormat("<pinpool.Buffer nbytes=%zu ptr=%p%s>",
                              self->nbytes, self->ptr,
                              buffer_closed(self) ? " closed" : "");
}

static PyMethodDef Buffer_methods[] = {
    KW_METHOD("lend", Buffer_lend,
              "lend($self, pid)\n--\n\n"
              "Lend the block of a shared=1 pool to process pid (its worker)\n"
              "before sending the buffer to it (queue.put, pickle): the pid\n"
              "is what Pool.lend_reclaim(pid) and Pool.lend_reclaim_exited()\n"
              "reclaim by if that process dies. A buffer pickled without a\n"
              "lend is lent to this process itself (docs/python.md, \"Shared\n"
              "pools\"). While lent, the owner's buffer refuses new exports\n"
              "and close(); it is the owner's again when the worker sends it\n"
              "back (unpickled here) or the lend is reclaimed.\n\n"
              "Raises ValueError (pid <= 0, a thread's id that is not its\n"
              "process's, a pool without shared=1, a closed buffer),\n"
              "ProcessLookupError (no such process, or it\n"
              "has exited), BufferError (lent already), TypeError (an\n"
              "attached buffer: only the owner lends).\n\n"
              "Thread-safe: of concurrent lends of one buffer, one wins."),
    {"_lend_into", Buffer__lend_into, METH_VARARGS, NULL},
    {"_lend_return", Buffer__lend_return, METH_VARARGS, NULL},
    {"_lend_return_pidfd", Buffer__lend_return_pidfd, METH_VARARGS, NULL},
    {"_attached_handle", Buffer__attached_handle, METH_NOARGS, NULL},
    {"_close_unexported", Buffer__close_unexported, METH_NOARGS, NULL},
    KW_METHOD("__reduce__", Buffer_reduce, NULL),
    KW_METHOD("__dlpack__", Buffer_dlpack,
              "__dlpack__($self, *, stream=None, max_version=None, "
              "dl_device=None, copy=None)\n--\n\n"
              "A DLPack capsule of the bytes: a 1-D uint8 tensor of nbytes\n"
              "elements (numpy.from_dlpack, torch.from_dlpack).\n\n"
              "stream: None or -1 (host memory needs no synchronization; use\n"
              "record_stream). max_version: None or below (1, 0) gives a\n"
              "'dltensor' capsule, (1, x) a 'dltensor_versioned' one.\n"
              "dl_device: None, the buffer's own device or (kDLCPU, 0).\n"
              "copy: True copies the bytes into a new block of the pool.\n\n"
              "Raises BufferError (closed buffer, another device, another\n"
              "stream), TypeError (a malformed argument), MemoryError.\n\n"
              "Thread-safe: concurrent with close(); the capsule holds the\n"
              "memory until its consumer releases it, on any thread."),
    {"__dlpack_device__", Buffer_dlpack_device, METH_NOARGS,
     "__dlpack_device__($self, /)\n--\n\n"
     "(kDLCUDAHost, 0) for memory pinned through the CUDA driver, else\n"
     "(kDLCPU, 0). Thread-safe."},
    {"close", Buffer_close, METH_NOARGS,
     "close($self, /)\n--\n\n"
     "Give the block back to the pool: now if nothing is exported, else\n"
     "when the last export (memoryview, array, tensor, capsule) is\n"
     "released. New exports are refused from now on. Idempotent.\n\n"
     "Thread-safe: exactly one of concurrent calls closes; an export that\n"
     "races with it either gets in first (and keeps the memory) or raises\n"
     "BufferError."},
    {"record_stream", Buffer_record_stream, METH_O,
     "record_stream($self, stream, /)\n--\n\n"
     "Make the block's reuse, after close(), wait for the work queued on\n"
     "stream so far (as torch.Tensor.record_stream).\n\n"
     "stream: an int handle (a CUstream for events=cuda, any value for\n"
     "events=simulated) or an object with a 'cuda_stream' int attribute\n"
     "(torch.cuda.Stream).\n\n"
     "Raises ValueError (closed buffer, negative handle), TypeError (not a\n"
     "stream), RuntimeError (the pool has no event provider: events=none).\n\n"
     "Thread-safe: the block is held for the call, so a concurrent close()\n"
     "cannot free it first."},
    {"__enter__", Buffer_enter, METH_NOARGS,
     "__enter__($self, /)\n--\n\nReturn the buffer."},
    {"__exit__", Buffer_exit, METH_VARARGS,
     "__exit__($self, exc_type, exc_value, traceback, /)\n--\n\n"
     "Call close(). Returns False."},
    {NULL, NULL, 0, NULL}};

/* Read-only attributes; each doc ends with what makes it thread-safe. */
#define ATTR(name, id, doc)                                                    \
  { name, Buffer_get_attr, NULL, doc, (void *)(intptr_t)(id) }
#define LAZY                                                                   \
  " Computed once, on the first query of any attribute (others\n"              \
  "wait for it); ValueError if the buffer was closed before."
static PyGetSetDef Buffer_getset[] = {
    {"nbytes", Buffer_get_nbytes, NULL,
     "The bytes asked for (== len(buf)). Immutable.", NULL},
    {"block_size", Buffer_get_block_size, NULL,
     "The usable bytes of the block (its size class, >= nbytes). Immutable.",
     NULL},
    {"ptr", Buffer_get_ptr, NULL,
     "The address of the first byte, as an int. ValueError once closed.", NULL},
    {"pool", Buffer_get_pool, NULL,
     "The Pool it came from (kept alive by the buffer). Immutable.", NULL},
    {"closed", Buffer_get_closed, NULL,
     "True after close() (or once collected). One atomic read.", NULL},
    {"exports", Buffer_get_exports, NULL,
     "The live exports (memoryviews, DLPack capsules and their consumers).\n"
     "One atomic read: may change as soon as it is read.",
     NULL},
    {"lent_to", Buffer_get_lent_to, NULL,
     "Owner side: the pid the block is lent to, or None. One atomic read.",
     NULL},
    {"attached", Buffer_get_attached, NULL,
     "True for a buffer unpickled in another process than its pool's\n"
     "(a worker's view of a lent block; pool is None). Immutable.",
     NULL},
    ATTR("attributes", A_ALL,
         "Every memory attribute (and 'huge_advised'), as a dict." LAZY),
    ATTR("host_accessible", A_HOST, "True: the CPU can access it." LAZY),
    ATTR("device_accessible", A_DEVICE,
         "True: a CUDA device can access it; None: unknown." LAZY),
    ATTR("device_id", A_DEVICE_ID, "The CUDA device ordinal, -1 if none." LAZY),
    ATTR("page_locked", A_LOCKED, "True: page-locked (pinned)." LAZY),
    ATTR("numa_node", A_NUMA,
         "The NUMA node of the first page, -1 if unknown or not yet "
         "backed." LAZY),
    ATTR("huge_pages", A_HUGE,
         "True: the first page is a huge page; None: unknown." LAZY),
    ATTR("backend", A_BACKEND,
         "The pool's backend: 'host', 'malloc', 'cuda', ..." LAZY),
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods Buffer_as_sequence = {.sq_length = Buffer_len};

static PyTypeObject BufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "pinpool.Buffer",
    .tp_basicsize = sizeof(BufferObject),
    .tp_dealloc = (destructor)Buffer_dealloc,
    .tp_weaklistoffset = offsetof(BufferObject, weaklist),
    .tp_repr = Buffer_repr,
    .tp_as_sequence = &Buffer_as_sequence,
    .tp_as_buffer = &Buffer_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "One block of a Pool's memory, made by Pool.alloc (not directly).\n\n"
        "Exports its bytes, writable and without a copy, through the buffer\n"
        "protocol (memoryview, numpy.frombuffer, pinpool.asarray) and DLPack\n"
        "(numpy.from_dlpack, torch.from_dlpack). The memory stays valid while\n"
        "any export exists, whatever happens to the Buffer or its Pool.\n"
        "len(buf) is nbytes; as a context manager it closes on exit.\n\n"
        "Every method and attribute may be used from any number of threads\n"
        "at once; the bytes themselves are yours to synchronize.",
    .tp_methods = Buffer_methods,
    .tp_getset = Buffer_getset,
};

/* ---- Module ---------------------------------------------------------------
 */

/* _attach(handle, fd, ctl_fd, nbytes) -> Buffer: a worker's Buffer on a
 * lent block (pinpool_share_attach_ctl; the descriptors are not
 * consumed). */
static PyObject *mod_attach(PyObject *m, PyObject *args) {
  (void)m;
  PyObject *hobj, *nobj;
  int fd, ctl_fd;
  if (!PyArg_ParseTuple(args, "OiiO:_attach", &hobj, &fd, &ctl_fd, &nobj))
    return NULL;
  pinpool_share_handle_t h;
  if (parse_handle(hobj, &h) != 0)
    return NULL;
  if (!PyLong_Check(nobj) || PyBool_Check(nobj))
    return PyErr_Format(PyExc_TypeError, "nbytes must be an int, not %.100s",
                        Py_TYPE(nobj)->tp_name);
  Py_ssize_t nbytes = PyLong_AsSsize_t(nobj);
  if (nbytes == -1 && PyErr_Occurred()) { /* before: OverflowError */
    if (!PyErr_ExceptionMatches(PyExc_OverflowError))
      return NULL;
    PyErr_Clear();
    return PyErr_Format(PyExc_ValueError,
                        "nbytes %R is out of range (the lent block has %llu "
                        "bytes)",
                        nobj, (unsigned long long)h.length);
  }
  if (nbytes <= 0 || (uint64_t)nbytes > h.length)
    return PyErr_Format(BadHandleError,
                        "nbytes %zd does not fit the lent block (%llu bytes)",
                        nbytes, (unsigned long long)h.length);
  attach_t *a = calloc(1, sizeof *a);
  if (a == NULL)
    return PyErr_NoMemory();
  BufferObject *self = PyObject_New(BufferObject, &BufferType);
  if (self == NULL) {
    free(a);
    return NULL;
  }
  void *p = NULL;
  PyThreadState *ts = PyEval_SaveThread(); /* mmap, fstat */
  int rc = pinpool_share_attach_ctl(&h, fd, ctl_fd, &p);
  PyEval_RestoreThread(ts);
  if (rc != 0) {
    free(a);
    self->att = NULL;
    self->buf = NULL;
    self->pool = NULL;
    PyObject_Free(self);
    return raise_rc(rc, "attaching a shared Buffer");
  }
  atomic_init(&a->state, 0);
  atomic_init(&a->holds, 1);
  a->ptr = p;
  a->nbytes = (size_t)nbytes;
  a->handle = h;
  self->buf = NULL;
  self->pool = NULL;
  self->att = a;
  self->ptr = p;
  self->nbytes = (size_t)nbytes;
  self->block_size = (size_t)h.length;
  self->device_type = kDLCPU; /* a worker never uses CUDA */
  self->weaklist = NULL;
  atomic_init(&self->lent, 0);
  return (PyObject *)self;
}

/* share_worker.c's, not public API (this module links the static library):
 * close a descriptor a peer sent without waiting on the peer (a memory
 * file at once, anything else on the process's closer thread), and, for
 * tests, wait until that thread has closed what it was given. */
void pp_share_close_received(int fd);
void pp_share_closer_flush(void);

/* _close_received(fd): pinpool._fds.close_received. The descriptor is
 * consumed. */
static PyObject *mod_close_received(PyObject *m, PyObject *arg) {
  (void)m;
  long fd = PyLong_AsLong(arg);
  if (fd == -1 && PyErr_Occurred())
    return NULL;
  if (fd < 0 || fd > INT_MAX)
    return PyErr_Format(PyExc_ValueError, "_close_received: bad descriptor %ld",
                        fd);
  Py_BEGIN_ALLOW_THREADS pp_share_close_received((int)fd);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *mod_closer_flush(PyObject *m, PyObject *unused) {
  (void)m;
  (void)unused;
  Py_BEGIN_ALLOW_THREADS pp_share_closer_flush();
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

/* _share_owns(handle) -> bool: pinpool_share_owns (the handle names a
 * pool this process created; never by pid: issue 36, third round). */
static PyObject *mod_share_owns(PyObject *m, PyObject *hobj) {
  (void)m;
  pinpool_share_handle_t h;
  if (parse_handle(hobj, &h) != 0)
    return NULL;
  int rc = pinpool_share_owns(&h);
  if (rc < 0)
    return raise_rc(rc, "_share_owns");
  return PyBool_FromLong(rc);
}

static PyMethodDef module_methods[] = {
    {"_attach", mod_attach, METH_VARARGS, NULL},
    {"_share_owns", mod_share_owns, METH_O, NULL},
    {"_close_received", mod_close_received, METH_O, NULL},
    {"_closer_flush", mod_closer_flush, METH_NOARGS, NULL},
    {"_set_close_hook", mod_set_close_hook, METH_O, NULL},
    {"default_pool", mod_default_pool, METH_NOARGS,
     "default_pool()\n--\n\n"
     "The process-wide Pool, created at the first call with the\n"
     "configuration of PINPOOL_CONF (the defaults if unset).\n\n"
     "Raises as Pool() for a bad PINPOOL_CONF. Thread-safe: concurrent\n"
     "first calls race to create it, one wins (a compare-and-swap), every\n"
     "caller gets the same object."},
    {"alloc", mod_alloc, METH_O,
     "alloc(nbytes, /)\n--\n\n"
     "default_pool().alloc(nbytes): a Buffer of nbytes bytes.\n\n"
     "Raises as Pool.alloc. Thread-safe."},
    {NULL, NULL, 0, NULL}};

static int module_exec(PyObject *m) {
  static _Atomic int atfork_done;
  if (atomic_exchange(&atfork_done, 1) == 0 &&
      pthread_atfork(NULL, NULL, pin_after_fork_child) != 0) {
    PyErr_SetString(PyExc_OSError, "pinpool: pthread_atfork failed");
    return -1;
  }
  if (make_dict_keys() < 0 || PyType_Ready(&PoolType) < 0 ||
      PyType_Ready(&BufferType) < 0)
    return -1;
  if (StaleHandleError == NULL)
    StaleHandleError = PyErr_NewExceptionWithDoc(
        "pinpool.StaleHandleError",
        "A shared Buffer's lend has ended (the block was returned, "
        "reclaimed, or freed and reused since it was sent).",
        PyExc_ValueError, NULL);
  if (BadHandleError == NULL)
    BadHandleError = PyErr_NewExceptionWithDoc(
        "pinpool.BadHandleError",
        "A shared Buffer's handle or descriptor does not describe a lend "
        "(forged, corrupt, another pool's, another file).",
        PyExc_ValueError, NULL);
  if (NotPinnedWarning == NULL)
    NotPinnedWarning = PyErr_NewExceptionWithDoc(
        "pinpool.NotPinnedWarning",
        "backend=auto could not page-lock the pool's memory (no CUDA "
        "driver, and RLIMIT_MEMLOCK too low): it is pageable. The message "
        "says how to raise the limit. Given once per process.",
        PyExc_RuntimeWarning, NULL);
  if (StaleHandleError == NULL || BadHandleError == NULL ||
      NotPinnedWarning == NULL ||
      PyModule_AddObjectRef(m, "NotPinnedWarning", NotPinnedWarning) < 0 ||
      PyModule_AddObjectRef(m, "StaleHandleError", StaleHandleError) < 0 ||
      PyModule_AddObjectRef(m, "BadHandleError", BadHandleError) < 0)
    return -1;
  if (PyModule_AddObjectRef(m, "Pool", (PyObject *)&PoolType) < 0 ||
      PyModule_AddObjectRef(m, "Buffer", (PyObject *)&BufferType) < 0 ||
      PyModule_AddStringConstant(m, "__version__", pinpool_version()) < 0 ||
      PyModule_AddIntConstant(m, "kDLCPU", kDLCPU) < 0 ||
      PyModule_AddIntConstant(m, "kDLCUDAHost", kDLCUDAHost) < 0)
    return -1;
  return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, (void *)module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* Static types and a process-wide default pool: one interpreter. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    /* Free-threaded builds: no GIL needed (see the top of this file). */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pinpool._core",
    .m_doc = "The C core of the pinpool package (import pinpool, not this): "
             "Pool and Buffer over include/pinpool.h.",
    .m_size = 0,
    .m_methods = module_methods,
    .m_slots = module_slots,
};

PyMODINIT_FUNC PyInit__core(void);
PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&module_def); }
