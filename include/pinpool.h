/*
 * pinpool — a thread-safe caching allocator for host staging memory.
 *
 * One public header. Every function returns an int: 0 on success or a
 * negative PINPOOL_E* code; a function that fails changes nothing. The text
 * of the most recent failure in the calling thread (naming the config key,
 * the pointer, the backend errno...) is available from pinpool_last_error().
 *
 * Thread-safety: unless a function says otherwise, it may be called from any
 * number of threads at once on the same pool. pinpool_destroy() is the one
 * exception: no other thread may use the pool while, or after, it runs.
 */
#ifndef PINPOOL_H
#define PINPOOL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PINPOOL_BUILDING) && defined(__GNUC__)
#define PINPOOL_API __attribute__((visibility("default")))
#else
#define PINPOOL_API
#endif

/* ---- Version ------------------------------------------------------------ */
#define PINPOOL_VERSION_MAJOR 0
#define PINPOOL_VERSION_MINOR 1
#define PINPOOL_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define PINPOOL_VERSION                                                        \
  (PINPOOL_VERSION_MAJOR * 10000 + PINPOOL_VERSION_MINOR * 100 +               \
   PINPOOL_VERSION_PATCH)
#define PINPOOL_VERSION_STRING "0.1.0"

/* The version of the library actually loaded, as "MAJOR.MINOR.PATCH". The
 * string is static. Thread-safe. */
PINPOOL_API const char *pinpool_version(void);

/* ---- Errors ------------------------------------------------------------- */
/* Every failing call returns one of these (and sets pinpool_last_error()).
 *  PINPOOL_EINVAL      NULL pool or NULL out-pointer, or another bad argument
 *  PINPOOL_ENOMEM      max_reserved reached after one retry, or the backend
 *                      (or a metadata malloc) is out of memory
 *  PINPOOL_EZEROSIZE   pinpool_alloc with size 0
 *  PINPOOL_EOVERFLOW   size beyond the largest class, or buffer too small
 *  PINPOOL_EDOUBLEFREE the block is not allocated (freed twice)
 *  PINPOOL_ENOTOWNED   the pointer is not a block this pool handed out
 *  PINPOOL_EINTERIOR   the pointer is inside a block but not its start
 *  PINPOOL_ECONFIG     unknown config key or bad value (the message names it)
 *  PINPOOL_EBACKEND    the backend failed for a reason other than memory
 *  PINPOOL_ECORRUPT    pinpool_validate found an inconsistency
 *  PINPOOL_EBUSY       the operation is refused in the current state
 *  PINPOOL_ENODRIVER   CUDA requested but unusable: no driver library, the
 *                      toolkit's stub library, no device, or no context
 *  PINPOOL_EDEVICE     an event provider reported a device error
 *  PINPOOL_EFORKED     a pool that uses CUDA, or a shared pool, in a child
 *                      of fork(): the driver cannot be used there, and a
 *                      shared pool's memory is the parent's (docs/api.md,
 *                      "Fork")
 *  PINPOOL_ESTALE      a lend handle whose lend has ended: the block was
 *                      returned, reclaimed, freed or reused since
 *  PINPOOL_EBADHANDLE  a lend handle or descriptor that does not match:
 *                      forged, corrupt, another pool's, another file
 *  PINPOOL_ELIMIT      a process limit was reached (RLIMIT_NOFILE; the
 *                      message names it)
 *  PINPOOL_ECLOSED     the peer closed the socket
 *  PINPOOL_EPERM       a lend return refused: the handle's token is not the
 *                      lend's, or the process named is not the one the
 *                      block was lent to (counted in lend_refusals)
 *  PINPOOL_EEXITED     the peer process has exited (a lend to it refused)
 *  PINPOOL_EAGAIN      the socket would block (O_NONBLOCK, SO_RCVTIMEO):
 *                      what arrived of a message is kept, call again
 *  PINPOOL_EINTR       a signal interrupted the socket call: what arrived
 *                      of a message is kept, call again */
#define PINPOOL_OK 0
#define PINPOOL_EINVAL (-1)
#define PINPOOL_ENOMEM (-2)
#define PINPOOL_EZEROSIZE (-3)
#define PINPOOL_EOVERFLOW (-4)
#define PINPOOL_EDOUBLEFREE (-5)
#define PINPOOL_ENOTOWNED (-6)
#define PINPOOL_EINTERIOR (-7)
#define PINPOOL_ECONFIG (-8)
#define PINPOOL_EBACKEND (-9)
#define PINPOOL_ECORRUPT (-10)
#define PINPOOL_EBUSY (-11)
#define PINPOOL_ENODRIVER (-12)
#define PINPOOL_EDEVICE (-13)
#define PINPOOL_EFORKED (-14)
#define PINPOOL_ESTALE (-15)
#define PINPOOL_EBADHANDLE (-16)
#define PINPOOL_ELIMIT (-17)
#define PINPOOL_ECLOSED (-18)
#define PINPOOL_EPERM (-19)
#define PINPOOL_EEXITED (-20)
#define PINPOOL_EAGAIN (-21)
#define PINPOOL_EINTR (-22)

/* A static string naming the code ("PINPOOL_ENOMEM: out of memory ...").
 * Unknown codes give "unknown pinpool error". Thread-safe. */
PINPOOL_API const char *pinpool_strerror(int err);

/* A description of the most recent failure of a pinpool call made by the
 * calling thread (for example "config: unknown key 'max_cahced'"), or "" if
 * none failed yet. The string is thread-local and valid until the next
 * failing pinpool call in the same thread. */
PINPOOL_API const char *pinpool_last_error(void);

/* ---- Pools --------------------------------------------------------------- */
typedef struct pinpool pinpool_t; /* opaque */

/* Backend: where segments of memory come from. A table of function pointers
 * (like sqlite3_mem_methods); pinpool calls it with no pool lock held, from
 * whichever thread needs a segment, possibly from several threads at once.
 *
 * alloc: return `size` bytes (size is a multiple of 4096) aligned to at least
 *        4096 bytes, in *out. Return 0, PINPOOL_ENOMEM, or PINPOOL_EBACKEND.
 * free:  give back a range that alloc returned, with the same size.
 *        Must not fail; errors are counted but the range is forgotten.
 * ctx:   passed back to both functions.
 * page_locked: nonzero if the memory is page-locked (reported in stats). */
typedef struct pinpool_backend {
  const char *name;
  int (*alloc)(void *ctx, size_t size, void **out);
  void (*free)(void *ctx, void *ptr, size_t size);
  void *ctx;
  int page_locked;
} pinpool_backend_t;

/* A stream: an ordered queue of device work. For the cuda event provider it
 * is a CUstream (0: the legacy default stream); for the simulated provider
 * any value names a simulated stream; for callbacks, whatever they expect. */
typedef uintptr_t pinpool_stream_t;

/* Event provider: how the pool learns that device work on a stream that
 * used a block has finished. A table of function pointers, called with no
 * pool lock held, possibly from several threads at once.
 * record:      record an event after the work queued on `stream` so far;
 *              store it in *event. Return 0 or a negative PINPOOL_E* code.
 * query:       1 if the event completed, 0 if not yet, < 0 on a device
 *              error (the block stays PENDING forever: never reused).
 * synchronize: wait for the event; 0 or < 0 on a device error.
 * release:     the pool is done with the event (providers pool them). It
 *              may not have completed: the pool gives up on an event it
 *              could not queue (out of memory; the block is then never
 *              reused). A provider that pools events must not let the old
 *              record complete a new one (a CUDA event recorded again
 *              follows its latest record only; the simulated provider
 *              frees one once its stream and the pool are both done). */
typedef struct pinpool_events {
  const char *name;
  int (*record)(void *ctx, pinpool_stream_t stream, void **event);
  int (*query)(void *ctx, void *event);
  int (*synchronize)(void *ctx, void *event);
  void (*release)(void *ctx, void *event);
  void *ctx;
} pinpool_events_t;

/* Called (from the thread that found it) when an event reports an error:
 * `err` is the code, `msg` a description, `block` the block that stays
 * pending. Also called once per process (a fork child's first is its own),
 * with PINPOOL_ELIMIT and block NULL, when backend=auto leaves memory it
 * meant to pin pageable (msg says why and how to raise RLIMIT_MEMLOCK;
 * possibly from inside pinpool_create or a grow_ahead thread). It may
 * call back into pinpool, as a backend or event provider function may:
 * from inside any of them pinpool never waits for another thread, and
 * pinpool_validate (always), pinpool_synchronize (events still held by
 * other polls) and a thread's first call on a pool during a fork fail
 * with PINPOOL_EBUSY (docs/api.md, "Calling pinpool from a callback").
 * Not pinpool_destroy of the pool, nor fork(). */
typedef void (*pinpool_error_fn)(void *arg, int err, const char *msg,
                                 void *block);

/* Everything pinpool_create_ex can be given besides the config string.
 * NULL members mean: as the config says. */
typedef struct pinpool_hooks {
  const struct pinpool_backend *backend;
  const pinpool_events_t *events;
  pinpool_error_fn on_error;
  void *error_arg;
} pinpool_hooks_t;

/* Create a pool. `config` is "key=value,key=value" (docs/configuration.md);
 * NULL means: the environment variable PINPOOL_CONF if set, else defaults.
 * An empty string means defaults. On success stores the pool in *out.
 * Errors: PINPOOL_EINVAL (out is NULL), PINPOOL_ECONFIG (unknown key or bad
 * value; pinpool_last_error names the key), PINPOOL_ENOMEM / PINPOOL_EBACKEND
 * (the `reserve` could not be allocated). Thread-safe. */
PINPOOL_API int pinpool_create(const char *config, pinpool_t **out);

/* As pinpool_create, with a user-supplied backend (copied; the table's
 * functions and ctx must stay valid until the pool is torn down: see
 * pinpool_destroy). The `backend` config key is then not allowed. */
PINPOOL_API int pinpool_create_with_backend(const char *config,
                                            const pinpool_backend_t *backend,
                                            pinpool_t **out);

/* As pinpool_create, with any of a user backend, a user event provider
 * (the `events` key is then not allowed) and an error callback. The tables
 * are copied; their functions and contexts must stay valid until the pool
 * is torn down (see pinpool_destroy). hooks may be NULL. */
PINPOOL_API int pinpool_create_ex(const char *config,
                                  const pinpool_hooks_t *hooks,
                                  pinpool_t **out);

/* Release every segment to the backend and free the pool. Blocks still
 * allocated are released too (their pointers become invalid). NULL is a
 * no-op. Not thread-safe: no other thread may use the pool during or after
 * the call (join your threads first). Threads that used the pool may keep
 * running; their per-thread caches for this pool are dropped.
 * The teardown (and the backend and provider calls it makes) is over when
 * this returns only if no buffer, export or exiting thread of the pool
 * holds a reference then. Otherwise it runs when the last one is dropped:
 * on the thread that drops it, before that call returns; or, when that is
 * a thread the pool owns (a callback of its background thread or of a
 * simulated stream releasing the last buffer), on a process-wide reaper
 * thread, later, with no call to wait for it. A backend or provider
 * context may be freed once pinpool_destroy returned only if every buffer
 * and export was released before, from threads of yours; otherwise keep
 * it for the life of the process (docs/api.md). */
PINPOOL_API void pinpool_destroy(pinpool_t *pool);

/* ---- Allocation ------------------------------------------------------- */

/* Allocate at least `size` bytes; *out receives the block. Blocks are 64-byte
 * aligned; a block whose size class is a multiple of 4096 (4 KiB, 8 KiB and
 * every class from 32 KiB up) is 4096-byte aligned. The memory is not
 * zeroed. Errors: PINPOOL_EINVAL (pool or out NULL), PINPOOL_EZEROSIZE,
 * PINPOOL_EOVERFLOW (size beyond the largest class, 2^60 bytes),
 * PINPOOL_ENOMEM (max_reserved reached after releasing idle memory once, or
 * the backend is out of memory), PINPOOL_EBACKEND. On error *out is left
 * untouched. Thread-safe; the common case takes no lock. */
PINPOOL_API int pinpool_alloc(pinpool_t *pool, size_t size, void **out);

/* Return a block to the pool's cache. Any thread may free a block allocated
 * by any other thread. Errors (nothing changes): PINPOOL_EINVAL (pool NULL,
 * ptr NULL), PINPOOL_ENOTOWNED (not from this pool), PINPOOL_EINTERIOR (not
 * the start of a block), PINPOOL_EDOUBLEFREE (not currently allocated).
 * Thread-safe. */
PINPOOL_API int pinpool_free(pinpool_t *pool, void *ptr);

/* The usable size of an allocated block in *out: the request's size class
 * up to 256 KiB, above it the request rounded up to 4096 bytes (carved
 * from the arena). Errors as pinpool_free. Thread-safe. */
PINPOOL_API int pinpool_block_size(pinpool_t *pool, const void *ptr,
                                   size_t *out);

/* The pool's NUMA node whose memory holds an allocated block, in *out: 0
 * unless numa=local (docs/allocation-policy.md, "NUMA-local reuse");
 * pinpool_get_node_stats says which machine node that is. Errors as
 * pinpool_free. Thread-safe. */
PINPOOL_API int pinpool_block_node(pinpool_t *pool, const void *ptr,
                                   unsigned *out);

/* The size class a request of `size` bytes is rounded to, in *out, without
 * allocating (a block above 256 KiB is smaller: pinpool_block_size). Errors:
 * PINPOOL_EINVAL, PINPOOL_EZEROSIZE, PINPOOL_EOVERFLOW. */
PINPOOL_API int pinpool_size_class(size_t size, size_t *out);

/* Return idle memory to the backend: the calling thread's cache is flushed,
 * every other thread's cache is asked to flush at its next pinpool call, and
 * every segment with no allocated block is released (except the `reserve`,
 * which is kept). Thread-safe. */
PINPOOL_API int pinpool_empty_cache(pinpool_t *pool);

/* Flush the calling thread's cache for this pool into the shared bins, its
 * large blocks back into the arena (done automatically at thread exit).
 * Thread-safe. */
PINPOOL_API int pinpool_thread_flush(pinpool_t *pool);

/* ---- Stream-ordered frees ---------------------------------------------
 * A block used by device work on streams is freed at once by the caller but
 * handed out again only after that work completed: pinpool_free records one
 * event per stream the block was recorded on and the block stays PENDING
 * until every one of them has completed (docs/streams.md). */

/* Mark that work queued on `stream` uses the allocated block `ptr`. Any
 * number of streams per block; the same stream twice counts once.
 * Errors: PINPOOL_EINVAL, PINPOOL_ENOTOWNED, PINPOOL_EINTERIOR,
 * PINPOOL_EDOUBLEFREE (block not allocated), PINPOOL_EBUSY (the pool has
 * no event provider: events=none), PINPOOL_ENOMEM. Thread-safe. */
PINPOOL_API int pinpool_record_stream(pinpool_t *pool, void *ptr,
                                      pinpool_stream_t stream);

/* Reclaim pending blocks whose events have completed (each stream is
 * polled in order, and a slow stream never holds back another). Returns 0;
 * device errors are counted and reported through the error callback.
 * Thread-safe. */
PINPOOL_API int pinpool_process_events(pinpool_t *pool);

/* Wait until no block is pending (except blocks whose events failed, which
 * stay pending forever, and blocks held by CUDA graph captures not yet
 * released: below). Thread-safe. */
PINPOOL_API int pinpool_synchronize(pinpool_t *pool);

/* ---- CUDA graph capture (events=cuda; docs/cuda.md, "Graph capture") ----
 * Recording an event on a stream that is capturing a graph would add a
 * node to the graph instead of marking a point in time, and a graph may
 * be replayed any number of times until it is destroyed. So, with the cuda
 * event provider:
 *  - pinpool_record_stream on a capturing stream records nothing on it: the
 *    block is tied to the capture (by the capture's id, the one
 *    cuStreamGetCaptureInfo / cudaStreamGetCaptureInfo reports);
 *  - pinpool_free of a block that is tied to a capture not yet released,
 *    or that has a stream capturing at that moment, records nothing
 *    either: the block stays PENDING (stats graph_held_blocks/_bytes;
 *    pinpool_synchronize does not wait for it) until every such capture
 *    is released. Then the block follows the usual stream-ordered path:
 *    an event is recorded on each of its (non-capturing) streams.
 * Release a capture once no graph instantiated from it can run any more:
 * after cuGraphExecDestroy of its executable graphs and after their last
 * launch completed (for example after cuStreamSynchronize of the launch
 * stream). pinpool never calls cuEventQuery or cuEventSynchronize on an
 * event recorded in a capture, and it makes those calls in the relaxed
 * capture mode, so they never invalidate a capture running on any thread.
 * Captures the pool never heard of are not an error of the graph: a capture
 * during which no pool block was recorded on or freed is simply unknown. */

/* Whether `stream` is capturing now (a capture invalidated but not yet
 * ended counts): *capturing 1 and its id in *capture_id, or 0 and 0. Call it
 * before cuStreamEndCapture to learn the id to release later (or ask the driver
 * yourself). Errors: PINPOOL_EINVAL (a NULL argument), PINPOOL_EBUSY (the event
 * provider knows no capture: not events=cuda), PINPOOL_EDEVICE (the driver's
 * answer, e.g. the legacy stream 0 while a blocking stream captures),
 * PINPOOL_EFORKED. Thread-safe. */
PINPOOL_API int pinpool_stream_capture(pinpool_t *pool, pinpool_stream_t stream,
                                       int *capturing, uint64_t *capture_id);

/* Every graph made from capture `capture_id` is destroyed and will not run
 * again: its blocks may be reused once the events of their other streams
 * complete. Errors (nothing changes): PINPOOL_EINVAL (pool NULL; a capture
 * the pool does not know: none of its blocks was recorded on or freed
 * during it, or it was released already), PINPOOL_EBUSY (another thread is
 * tying a block to it right now: the capture has not ended),
 * PINPOOL_EFORKED. Thread-safe: any thread, concurrently with frees,
 * record_stream and reclaim on others. */
PINPOOL_API int pinpool_graph_release(pinpool_t *pool, uint64_t capture_id);

/* pinpool_graph_release of every capture the pool saw on `stream` (the
 * stream given to pinpool_record_stream, or a stream of a freed block,
 * while it was capturing): "all graphs captured on this stream are
 * destroyed". Errors (nothing changes): PINPOOL_EINVAL (pool NULL, no
 * capture known on the stream), PINPOOL_EBUSY, PINPOOL_EFORKED. */
PINPOOL_API int pinpool_stream_graphs_release(pinpool_t *pool,
                                              pinpool_stream_t stream);

/* events=simulated only: queue fn(arg) on the simulated stream, to run on
 * its worker thread after `duration_ns` of simulated device time, after
 * everything queued on that stream before. fn may be NULL. Errors:
 * PINPOOL_EINVAL, PINPOOL_EBUSY (not a simulated pool), PINPOOL_ENOMEM. */
PINPOOL_API int pinpool_sim_submit(pinpool_t *pool, pinpool_stream_t stream,
                                   uint64_t duration_ns, void (*fn)(void *),
                                   void *arg);

/* ---- Statistics ------------------------------------------------------- */
typedef struct pinpool_stat {
  uint64_t current;   /* now */
  uint64_t peak;      /* highest `current` since create or reset_peak */
  uint64_t allocated; /* accumulated increases since create */
  uint64_t freed;     /* accumulated decreases since create */
} pinpool_stat_t;

typedef struct pinpool_duration {
  uint64_t count;    /* calls */
  uint64_t total_ns; /* summed wall time */
  uint64_t max_ns;   /* longest call */
} pinpool_duration_t;

/* docs/stats.md explains each field and how exact it is. */
typedef struct pinpool_stats {
  pinpool_stat_t requests;        /* count of live allocations */
  pinpool_stat_t requested_bytes; /* bytes asked for by the caller (exact) */
  pinpool_stat_t blocks;          /* count of allocated blocks (== requests) */
  pinpool_stat_t block_bytes;     /* bytes of allocated blocks (rounded) */
  pinpool_stat_t reserved_bytes;  /* bytes obtained from the backend */
  pinpool_stat_t cached_bytes;    /* idle bytes inside reserved segments */
  pinpool_stat_t segments;        /* count of segments held */
  uint64_t pending_bytes;         /* awaiting device events (stream-ordered) */
  uint64_t pending_blocks;        /* blocks awaiting device events */
  uint64_t events_recorded;       /* events recorded by pinpool_free */
  uint64_t events_completed;      /* of those, seen complete */
  uint64_t event_errors;          /* of those, failed: block kept pending */
  pinpool_duration_t reclaim;     /* free of a stream-used block -> cached */
  uint64_t cache_hits;            /* allocations served without the backend */
  uint64_t cache_misses;          /* allocations that grew the arena */
  uint64_t tcache_hits;           /* of cache_hits: from the thread cache */
  uint64_t oom_count;             /* allocations that failed with ENOMEM */
  uint64_t retries;               /* max_reserved hit, idle memory released */
  uint64_t trimmed_segments; /* chunks released: caps, retry, empty_cache */
  uint64_t mlock_failures;   /* segments that could not be locked */
  uint64_t locked_bytes;     /* reserved bytes that are page-locked */
  /* pin_failure=pageable (docs/cuda.md, "When pinning fails"): reserved
   * bytes that are pageable because the driver could not pin them, and
   * the blocks (allocated or cached) carved from them. */
  uint64_t fallback_bytes;
  uint64_t fallback_blocks;
  pinpool_duration_t backend_alloc; /* backend alloc calls */
  pinpool_duration_t backend_free;  /* backend free calls */
  uint64_t peak_slack_bytes; /* the block_bytes / requested_bytes peaks may be
                                below the true peak by at most this much */
  uint64_t reserve_bytes;    /* configured reserve kept for the pool's life */
  uint64_t max_cached;       /* configured caps (0 = none) */
  uint64_t max_reserved;
  /* The arena (docs/allocation-policy.md, "Arenas"): the chunks the
   * backend gave, and the free space inside them, which is what
   * fragmentation is made of. */
  uint64_t arena_chunks;        /* chunks held now (the reserve included) */
  uint64_t chunk_free_bytes;    /* bytes free inside chunks (cached) */
  uint64_t free_extents;        /* free ranges those bytes are in */
  uint64_t largest_free_extent; /* the largest block carved without growing */
  uint64_t history_lost_writes; /* history entries not recorded: their ring
                                   slot was still being written by a writer
                                   a whole lap behind (docs/stats.md) */
  uint64_t graph_held_blocks;   /* of pending_blocks: held by CUDA graph
                                   captures not yet released */
  uint64_t graph_held_bytes;    /* their bytes (of pending_bytes) */
  /* numa=local with numa_spill=1 (docs/allocation-policy.md, "NUMA-local
   * reuse"): allocations served from another node's memory because the
   * thread's node was out of memory, and their block bytes. */
  uint64_t numa_spill_blocks;
  uint64_t numa_spill_bytes;
  /* shared=1 (docs/sharing.md): blocks lent to other processes now, and
   * their bytes (of block_bytes: a lent block is allocated). */
  uint64_t lent_blocks;
  uint64_t lent_bytes;
  /* backend=auto, the default (docs/configuration.md, "backend=auto"):
   * what it chose, PINPOOL_AUTO_* (0: the backend was named), and the
   * times this pool found memory it meant to pin pageable (auto chose
   * host unlocked: 1 at create; each chunk whose mlock failed: 1 more).
   * The process's first such finding also calls the pool's on_error with
   * PINPOOL_ELIMIT and block NULL (pinpool_create_ex). */
  uint64_t backend_auto;
  uint64_t pin_warnings;
  /* shared=1: lend returns refused since the pool was created (a wrong
   * token, another peer, a stale or forged handle); each changed nothing
   * (docs/sharing.md, "Threat model"). */
  uint64_t lend_refusals;
  /* grow_ahead= (docs/allocation-policy.md, "Growth ahead of demand"):
   * chunks and bytes the background grower made ahead of demand, the
   * carves served while grown-ahead bytes were unused (hits), and of
   * those the carves that the free bytes outside them could not have
   * held: each would have grown the arena on the allocating thread. */
  uint64_t grow_ahead_chunks;
  uint64_t grow_ahead_bytes;
  uint64_t grow_ahead_hits;
  uint64_t grow_ahead_waits_avoided;
  /* page_move= (docs/allocation-policy.md, "Page-moving growth"): misses
   * served by moving free pages side by side instead of growing, the
   * bytes moved, and moves that fell back to growth (a step failed). */
  uint64_t page_moves;
  uint64_t bytes_moved;
  uint64_t move_fallbacks;
} pinpool_stats_t;

/* pinpool_stats_t.backend_auto. */
enum {
  PINPOOL_AUTO_NONE = 0,          /* a backend was named: nothing chosen */
  PINPOOL_AUTO_CUDA_REGISTER = 1, /* a CUDA driver and device */
  PINPOOL_AUTO_HOST_LOCKED = 2,   /* host, mlock: RLIMIT_MEMLOCK allows it */
  PINPOOL_AUTO_HOST_UNLOCKED = 3  /* host, pageable: the limit does not */
};

/* Fill *out. `current` values are exact when no other thread is inside a
 * pinpool call on this pool; while others allocate, each field is a recent
 * value (fields are not a single atomic picture). Thread-safe. */
PINPOOL_API int pinpool_get_stats(pinpool_t *pool, pinpool_stats_t *out);

/* One NUMA node of a numa=local pool (docs/stats.md, "Per node"); a pool
 * without numa=local has one node, 0, which holds everything. Exact while
 * no other thread is inside a pinpool call on this pool; otherwise one
 * consistent picture of the node (read under one lock). */
typedef struct pinpool_node_stats {
  int os_node;               /* the machine's node its memory is bound to;
                                -1: none (numa=off without numa_node) */
  uint64_t reserved_bytes;   /* bytes of the chunks placed on it */
  uint64_t arena_chunks;     /* those chunks */
  uint64_t segments;         /* live segments carved from them */
  uint64_t chunk_free_bytes; /* bytes free inside them */
} pinpool_node_stats_t;

/* The number of nodes of the pool (1 unless numa=local) into *nodes.
 * Errors: PINPOOL_EINVAL. Thread-safe. */
PINPOOL_API int pinpool_numa_nodes(pinpool_t *pool, unsigned *nodes);

/* Node `node`'s stats into *out. Errors: PINPOOL_EINVAL (NULL argument,
 * or node >= the pool's nodes). Thread-safe. */
PINPOOL_API int pinpool_get_node_stats(pinpool_t *pool, unsigned node,
                                       pinpool_node_stats_t *out);

/* Set every peak to its current value. Thread-safe. */
PINPOOL_API int pinpool_reset_peak_stats(pinpool_t *pool);

/* Check every internal invariant (segment map, free lists, block states, the
 * accounting identity reserved == allocated + cached + pending). Returns 0 or
 * PINPOOL_ECORRUPT with the first problem in pinpool_last_error(). Call it
 * only while no other thread uses the pool. */
PINPOOL_API int pinpool_validate(pinpool_t *pool);

/* Write the resolved configuration ("key=value,...") into buf (NUL
 * terminated). Errors: PINPOOL_EINVAL, PINPOOL_EOVERFLOW (buffer too small;
 * *needed says how many bytes). `needed` may be NULL. Thread-safe. */
PINPOOL_API int pinpool_get_config(pinpool_t *pool, char *buf, size_t len,
                                   size_t *needed);

/* ---- History and snapshots (docs/snapshot-format.md) --------------------
 * pinpool_record_history switches the allocation history on or off, at any
 * time, from any thread; threads allocating meanwhile see the change at
 * their next call (the level is one atomic every hot path reads).
 *   record  PINPOOL_HISTORY_NONE   off: nothing recorded (the default)
 *           PINPOOL_HISTORY_STATE  each allocated block remembers its
 *                                  allocating thread and call stack, shown
 *                                  by snapshots; no history entries
 *           PINPOOL_HISTORY_ALLOC  STATE, plus a history entry for every
 *                                  event; stacks for alloc, segment_alloc
 *                                  and oom entries
 *           PINPOOL_HISTORY_ALL    ALLOC, with stacks for every entry
 *   max_entries   ring size: the newest max_entries entries are kept (1 to
 *                 2^26; 0 keeps the current size, 100000 at first)
 *   stack_depth   frames captured per stack, 0 to 64 (0: no stacks)
 *   clear         nonzero: drop the entries recorded so far
 * Entries: segment_alloc, alloc, free_requested (a stream-ordered free
 * waiting for its events), free_completed, segment_free, empty_cache, oom;
 * each with address, block size, requested size, stream, thread id, a
 * monotonic time in ns and a stack id. Stacks are return addresses, taken
 * with libunwind's unw_backtrace (dlopen'ed; backtrace(3) without it) and
 * symbolized only when a snapshot is written.
 * opts NULL: the same as record = PINPOOL_HISTORY_NONE (entries are kept).
 * Errors (nothing changes): PINPOOL_EINVAL (pool NULL, a value out of
 * range), PINPOOL_ENOMEM (no memory for the ring). Thread-safe. */
enum {
  PINPOOL_HISTORY_NONE = 0,
  PINPOOL_HISTORY_STATE = 1,
  PINPOOL_HISTORY_ALLOC = 2,
  PINPOOL_HISTORY_ALL = 3,
};
typedef struct pinpool_history_options {
  int record;
  size_t max_entries;
  unsigned stack_depth;
  int clear;
} pinpool_history_options_t;
PINPOOL_API int pinpool_record_history(pinpool_t *pool,
                                       const pinpool_history_options_t *opts);

/* Snapshot flags. */
#define PINPOOL_SNAPSHOT_NO_HISTORY 1u /* leave the history ring out */
#define PINPOOL_SNAPSHOT_NO_SYMBOLS 2u /* frames as addresses only */

/* Write a snapshot of the pool as JSON (docs/snapshot-format.md): every
 * segment and block with its state, the allocating thread and stack where
 * history was on, the stats, the configuration and the history ring.
 * Each block is read once, atomically, so no block appears in two states
 * and the totals satisfy reserved = allocated + pending + cached. Other
 * threads keep allocating meanwhile; no lock is held while blocks are read
 * or text is formatted (the longest hold is copying the segment list).
 *   pinpool_snapshot_write       to the file `path` (created or truncated;
 *                                on error the file is removed)
 *   pinpool_snapshot_write_file  to an open stream (not closed)
 *   pinpool_snapshot_write_mem   to a NUL-terminated string in *out, of
 *                                *len bytes; free it with
 *                                pinpool_snapshot_free
 * Errors: PINPOOL_EINVAL (NULL argument, unknown flags), PINPOOL_ENOMEM,
 * PINPOOL_EBACKEND (the file could not be opened or written; the message
 * has the system error). Thread-safe. */
PINPOOL_API int pinpool_snapshot_write(pinpool_t *pool, const char *path,
                                       unsigned flags);
PINPOOL_API int pinpool_snapshot_write_file(pinpool_t *pool, FILE *f,
                                            unsigned flags);
PINPOOL_API int pinpool_snapshot_write_mem(pinpool_t *pool, char **out,
                                           size_t *len, unsigned flags);
PINPOOL_API void pinpool_snapshot_free(char *text);

/* ---- Buffers -----------------------------------------------------------
 * A buffer is a reference-counted handle to one block of a pool: the
 * pointer, the block size, the size asked for, the pool, and the memory's
 * attributes. Its block goes back to the pool (through pinpool_free, so
 * stream-ordered when streams were recorded) when the buffer is closed and
 * its last export is released; closing happens explicitly
 * (pinpool_buffer_close) or when the last reference is released. This
 * happens on whichever thread drops the last hold: any thread may release
 * a buffer or an export that another thread created.
 *
 * References and exports:
 *  - pinpool_buffer_alloc returns a buffer with one reference. Every
 *    reference is given up with pinpool_buffer_release.
 *  - An export (pinpool_buffer_export) is a consumer's hold on the memory,
 *    with its own immutable descriptor (pointer, size, shape, strides):
 *    while it exists the memory stays valid even if the owner closes the
 *    buffer or releases its last reference.
 *  - Close is once-only and never frees memory that an export still holds:
 *    it refuses new exports at once and returns the block when the last
 *    export goes (a deferred free, never a use after free).
 *  References, exports and the closed flag live in one atomic word, so two
 *  threads dropping the last reference and the last export at once free
 *  the block exactly once, and an export can never slip in after close.
 *
 * Buffers and pinpool_destroy: every buffer (and so every export) holds a
 * reference on its pool. pinpool_destroy(pool) gives up the owner's
 * reference; the pool is torn down (segments released to the backend)
 * only when that AND the last buffer/export of the pool are gone, on the
 * thread that drops the last one. Between the two, buffers and exports
 * stay fully usable (release, export, attributes, record_stream); the
 * owner must not make any other call on the pool after pinpool_destroy.
 *
 * Thread-safety: every function below may be called from any number of
 * threads at once on the same buffer, as long as the caller holds a
 * reference (or, for pinpool_export_release, the export) for the duration
 * of the call. Errors: PINPOOL_EINVAL for a NULL argument or bad flags; a
 * function that fails changes nothing. Using a buffer after its last
 * reference and export are released is undefined (it is freed). */
typedef struct pinpool_buffer pinpool_buffer_t; /* opaque */

/* Allocate `size` bytes from `pool` as a buffer with one reference.
 * Errors: as pinpool_alloc (PINPOOL_EINVAL, PINPOOL_EZEROSIZE,
 * PINPOOL_EOVERFLOW, PINPOOL_ENOMEM, PINPOOL_EBACKEND). *out is untouched
 * on error. Thread-safe. */
PINPOOL_API int pinpool_buffer_alloc(pinpool_t *pool, size_t size,
                                     pinpool_buffer_t **out);

/* Add a reference. Errors: PINPOOL_EINVAL (NULL, or no reference left: the
 * buffer is kept alive only by exports), PINPOOL_EOVERFLOW (2^31 - 1
 * references). Retaining a closed buffer is allowed. */
PINPOOL_API int pinpool_buffer_retain(pinpool_buffer_t *buf);

/* Give up a reference. The last one closes the buffer (as
 * pinpool_buffer_close); the buffer itself is freed when no reference and
 * no export remain. Errors: PINPOOL_EINVAL (NULL, or no reference left). */
PINPOOL_API int pinpool_buffer_release(pinpool_buffer_t *buf);

/* Close: refuse new exports from now on and give the block back to the pool
 * now, or when the last export is released. Idempotent: closing a closed
 * buffer returns 0 and does nothing. The references stay (release them as
 * usual); accessors still work, but the memory must no longer be touched
 * except through an export obtained before the close. */
PINPOOL_API int pinpool_buffer_close(pinpool_buffer_t *buf);

/* pinpool_record_stream for the buffer's block: its free (at close) waits
 * for the work queued on `stream` so far. The block is held for the
 * duration of the call, so a concurrent close cannot free it under us.
 * Errors: PINPOOL_EINVAL, PINPOOL_EBUSY (closed, or the pool has no event
 * provider), PINPOOL_ENOMEM. */
PINPOOL_API int pinpool_buffer_record_stream(pinpool_buffer_t *buf,
                                             pinpool_stream_t stream);

/* Accessors: immutable facts, valid for the life of the buffer (also after
 * close). ptr: the block's first byte. size: the block's usable size (its
 * size class). requested_size: the size given to pinpool_buffer_alloc.
 * pool: the pool it came from (valid while the buffer is held, even after
 * pinpool_destroy; make no call on it then except through the buffer).
 * Errors: PINPOOL_EINVAL (a NULL argument). */
PINPOOL_API int pinpool_buffer_ptr(const pinpool_buffer_t *buf, void **out);
PINPOOL_API int pinpool_buffer_size(const pinpool_buffer_t *buf, size_t *out);
PINPOOL_API int pinpool_buffer_requested_size(const pinpool_buffer_t *buf,
                                              size_t *out);
PINPOOL_API int pinpool_buffer_pool(const pinpool_buffer_t *buf,
                                    pinpool_t **out);

/* State queries, each a single atomic read (a value the buffer had at some
 * moment of the call): the number of live exports (including the short
 * internal holds of record_stream and attribute queries in progress),
 * and whether the buffer is closed (1) or open (0). Errors: PINPOOL_EINVAL. */
PINPOOL_API int pinpool_buffer_exports(const pinpool_buffer_t *buf,
                                       size_t *out);
PINPOOL_API int pinpool_buffer_closed(const pinpool_buffer_t *buf, int *out);

/* Memory attributes. Those the pool knows at allocation are set then
 * (host_accessible, page_locked, huge_advised, backend, and numa_node for
 * a pool placed with numa_node=N; device_accessible and device_id for a
 * pool without a CUDA driver). The others are computed on the first query,
 * once, by whichever thread asks first; threads asking meanwhile wait for
 * that result (never a half-written one). A query that fails (a driver
 * error) leaves them uncomputed, to be tried again by the next query.
 *   host_accessible    1: the CPU can access it (every backend)
 *   device_accessible  1: a CUDA device can access it (pinned through the
 *                      driver: backend=cuda or cuda-register); 0: no;
 *                      -1: unknown (a user backend)
 *   device_id          CUDA device ordinal of the pool's context (queried
 *                      with cuPointerGetAttribute where the driver has it,
 *                      else the `device` key); -1: none or unknown
 *   page_locked        1: the segment is page-locked (mlock, or pinned by
 *                      the driver, or a user backend that says so)
 *   numa_node          node of the page holding the block's first byte;
 *                      -1: unknown, or no page there yet (not cached: the
 *                      next query looks again once memory is touched)
 *   huge_pages         1: the page holding the block's first byte is a
 *                      huge page (transparent or hugetlbfs; asked with
 *                      PAGEMAP_SCAN, or /proc/self/smaps for the whole
 *                      mapping before Linux 6.7); 0: a base page; -1:
 *                      unknown, or no page there yet (as numa_node)
 *   huge_advised       1: MADV_HUGEPAGE was applied (hugepages=1)
 *   backend            the pool's backend name ("host", "malloc", "cuda",
 *                      "cuda-register", or a user backend's name); valid
 *                      while the buffer is held */
typedef struct pinpool_mem_attrs {
  int host_accessible;
  int device_accessible;
  int device_id;
  int page_locked;
  int numa_node;
  int huge_pages;
  int huge_advised;
  const char *backend;
} pinpool_mem_attrs_t;

/* Fill *out. Errors: PINPOOL_EINVAL, PINPOOL_EBUSY (the buffer is closed
 * and the lazy attributes were never computed), PINPOOL_EBACKEND (the
 * driver query failed; retried by the next call). Thread-safe; the first
 * call makes a few system calls (and asks the driver for a CUDA pool),
 * later ones are a few loads. */
PINPOOL_API int pinpool_buffer_attrs(pinpool_buffer_t *buf,
                                     pinpool_mem_attrs_t *out);

/* An export: one consumer's hold on the memory of a buffer, with its own
 * descriptor, allocated for this export alone and never written after
 * pinpool_buffer_export returns (no scratch space shared between exports:
 * two consumers can never see each other's shape or flags). Describes the
 * requested bytes as a 1-D array of bytes. */
typedef struct pinpool_export {
  void *ptr;          /* first byte (the block's) */
  size_t size;        /* bytes: the buffer's requested size */
  int readonly;       /* 1 if exported with PINPOOL_EXPORT_READONLY */
  int ndim;           /* 1 */
  int64_t shape[1];   /* {size} */
  int64_t strides[1]; /* {1}: in elements of one byte (DLPack convention) */
  pinpool_buffer_t *buffer; /* the exported buffer (not a reference) */
} pinpool_export_t;

/* The consumer promises not to write through this export. */
#define PINPOOL_EXPORT_READONLY 1u

/* Create an export of `buf` (flags: 0 or PINPOOL_EXPORT_READONLY) in *out.
 * Errors: PINPOOL_EINVAL (NULL, unknown flags), PINPOOL_EBUSY (the buffer
 * is closed), PINPOOL_EOVERFLOW (2^31 - 1 exports), PINPOOL_ENOMEM. */
PINPOOL_API int pinpool_buffer_export(pinpool_buffer_t *buf, unsigned flags,
                                      const pinpool_export_t **out);

/* Release an export, from any thread, exactly once: the descriptor is
 * freed, and so are the block and the buffer if this was their last hold.
 * Errors: PINPOOL_EINVAL (NULL). */
PINPOOL_API int pinpool_export_release(const pinpool_export_t *exp);

/* ---- Sharing with other processes (docs/sharing.md) ----------------------
 * A pool created with shared=1 backs its chunks with sealed memfds. Its
 * owner lends an allocated block to another process: the handle below plus
 * the chunk's descriptor (and the read-only, write-sealed descriptor of the
 * chunk's control area), passed over a Unix socket (pinpool_share_send /
 * pinpool_share_recv) or inherited by a child forked after the chunk was
 * made (handle.owner_fd and owner_ctl_fd are then valid in the child). The
 * worker attaches the handle (the chunk is mapped once per process), fills
 * the block, detaches and sends the handle back; the owner calls
 * pinpool_lend_return naming the process it came from, and may then read,
 * record streams on and free the block. While a block is lent,
 * pinpool_free refuses it (PINPOOL_EBUSY).
 *
 * The handle is plain data, fixed size, meant to be copied byte for byte
 * between processes of the same machine. generation identifies one lend
 * (never 0, never reused by the pool): a handle whose lend has ended is
 * refused at attach with PINPOOL_ESTALE. token is the lend's secret (128
 * bits from getrandom): a return is accepted only with it, and only from
 * the process the block was lent to. Version 2 (128 bytes) replaced the
 * 96-byte version 1, whose returns anyone could forge. */
#define PINPOOL_SHARE_MAGIC 0x68737070u /* "ppsh" */
#define PINPOOL_SHARE_VERSION 2u
typedef struct pinpool_share_handle {
  uint32_t magic;       /* PINPOOL_SHARE_MAGIC */
  uint32_t version;     /* PINPOOL_SHARE_VERSION */
  uint64_t nonce;       /* the owning pool's random identity */
  int32_t owner_pid;    /* the owner's process id (information) */
  int32_t owner_fd;     /* the chunk's descriptor number in the owner */
  uint64_t chunk_id;    /* the chunk, within the pool */
  uint64_t chunk_size;  /* its bytes (the chunk's memfd is this size) */
  uint64_t dev, ino;    /* the memfd's st_dev and st_ino */
  uint64_t offset;      /* the block, from the chunk's start */
  uint64_t length;      /* its bytes (its block size) */
  uint64_t generation;  /* the lend */
  uint32_t slot;        /* the lend's slot in the chunk's control area */
  int32_t owner_ctl_fd; /* the control area's descriptor number in the
                           owner (read-only, sealed against writes) */
  uint64_t ctl_ino;     /* the control area memfd's st_ino (st_dev: dev) */
  uint8_t token[16];    /* the lend's secret: a return must carry it */
  uint32_t reserved[4]; /* 0 */
} pinpool_share_handle_t;

/* Owner: lend the allocated block `ptr` of a shared pool to process `peer`
 * (its pid, > 0): the lend is recorded against the process that pid names
 * now, through a pidfd the pool holds (never the number: a later process
 * that gets the same pid is another peer). Fills *handle and stores the
 * chunk's descriptor in *fd: the pool's own (close-on-exec, do not close
 * it; valid while the block is lent), to send with pinpool_share_send or
 * to leave to a child forked later. Errors (nothing changes):
 * PINPOOL_EINVAL (NULL argument, peer <= 0, the pool is not shared, peer
 * is the id of a thread that leads no process),
 * PINPOOL_EEXITED (no process has that pid, or it has exited: a zombie),
 * PINPOOL_ENOTOWNED / PINPOOL_EINTERIOR / PINPOOL_EDOUBLEFREE (as
 * pinpool_free), PINPOOL_EBUSY (lent already, or the chunk's lend slots
 * are all in use), PINPOOL_ELIMIT (no descriptor for the peer's pidfd),
 * PINPOOL_ENOMEM, PINPOOL_EBACKEND (no pidfd_open or getrandom),
 * PINPOOL_EFORKED. Thread-safe; lending a block while another thread
 * frees it is the caller's race. */
PINPOOL_API int pinpool_lend(pinpool_t *pool, void *ptr, int peer,
                             pinpool_share_handle_t *handle, int *fd);

/* Owner: pinpool_lend to the process named by `pidfd` (pidfd_open, or
 * SO_PEERPIDFD of a connected socket): no window in which the pid could
 * name another process. The pool keeps its own duplicate. Errors as
 * pinpool_lend (PINPOOL_EINVAL: pidfd is not a pidfd). */
PINPOOL_API int pinpool_lend_pidfd(pinpool_t *pool, void *ptr, int pidfd,
                                   pinpool_share_handle_t *handle, int *fd);

/* Owner: process `peer` (a pid) handed the block back (it sent the handle
 * back): the lend ends, the handle becomes stale, the block is the owner's
 * again (still allocated). Accepted only if the handle's token is the
 * lend's and `peer` names, now, the live process the lend was recorded
 * against. A refused return changes nothing and is counted in
 * pinpool_stats_t.lend_refusals. Errors: PINPOOL_EINVAL (NULL handle,
 * peer <= 0), PINPOOL_EBADHANDLE (not this pool's, or fields that do not
 * describe the lend), PINPOOL_ESTALE (the lend ended already),
 * PINPOOL_EPERM (another token, another process, or the borrower has
 * exited: its lends end by reclaim), PINPOOL_EFORKED. (Version 1 took no
 * peer and accepted any handle with the right generation.) */
PINPOOL_API int pinpool_lend_return(pinpool_t *pool,
                                    const pinpool_share_handle_t *handle,
                                    int peer);

/* Owner: pinpool_lend_return from the process `pidfd` names (not
 * consumed): SO_PEERPIDFD of the socket the handle came on, taken when it
 * is read. Accepted with the lend's token if that process is the one the
 * lend was recorded against, alive, a zombie or reaped (Linux 6.9+: a
 * pidfd's pidfs inode names one process): a process that took a dead
 * borrower's pid is refused even once it has exited too, which
 * pinpool_lend_return, given a number, cannot tell. Without pidfs, as
 * pinpool_lend_return with the pid the pidfd names. Errors: as
 * pinpool_lend_return; PINPOOL_EINVAL (pidfd is not a process's pidfd; or,
 * without pidfs, its process has been reaped). */
PINPOOL_API int pinpool_lend_return_pidfd(pinpool_t *pool,
                                          const pinpool_share_handle_t *handle,
                                          int pidfd);

/* Owner: count in pinpool_stats_t.lend_refusals a return the caller
 * refused by a check of its own, one the library cannot make (the sender
 * of a return that came over a channel not proven to be the borrower; an
 * answer naming a lend it was not sent for): so that lend_refusals counts
 * every refused return, the library's and its callers' (the Python
 * module's). Nothing else changes. Errors: PINPOOL_EINVAL (pool NULL or
 * not shared=1). */
PINPOOL_API int pinpool_lend_refused(pinpool_t *pool);

/* Reclaim flags: PINPOOL_RECLAIM_FREE also pinpool_frees every reclaimed
 * block. PINPOOL_RECLAIM_LIVE also ends lends to processes that are still
 * alive (by default only lends to exited processes end: a live one may
 * still write the block, so ending its lend would let the owner hand out
 * memory it writes). */
#define PINPOOL_RECLAIM_FREE 1u
#define PINPOOL_RECLAIM_LIVE 2u
/* Peers for pinpool_lend_reclaim_list besides a pid. */
#define PINPOOL_PEER_ALL (-1)
#define PINPOOL_PEER_EXITED (-2) /* = PINPOOL_PEER_ALL without LIVE */

/* Owner: end the lends to the processes that had pid `peer` and have
 * exited (-1: to every process that has exited); with
 * PINPOOL_RECLAIM_LIVE also to the live process `peer` names (-1: every
 * lend); with PINPOOL_RECLAIM_FREE also free the blocks. Exit is seen
 * through the pool's pidfd of each peer (a zombie has exited). *count
 * (may be NULL): lends ended. Errors: PINPOOL_EINVAL (peer 0 or < -1,
 * unknown flags, not shared), PINPOOL_EFORKED; with PINPOOL_RECLAIM_FREE,
 * the first error of a free (the lends are ended anyway). */
PINPOOL_API int pinpool_lend_reclaim(pinpool_t *pool, int peer, unsigned flags,
                                     size_t *count);

/* Owner: pinpool_lend_reclaim(pool, -1, flags without LIVE, count): every
 * lend to a process that has exited. Does not wait. */
PINPOOL_API int pinpool_lend_reclaim_exited(pinpool_t *pool, unsigned flags,
                                            size_t *count);

/* One lend that a reclaim ended. */
typedef struct pinpool_lend_info {
  void *ptr;           /* the block */
  uint64_t length;     /* its block size */
  uint64_t generation; /* the lend's (the handle's) */
  int32_t peer;        /* the pid it was lent to */
  uint32_t reserved;   /* 0 */
} pinpool_lend_info_t;

/* Owner: pinpool_lend_reclaim that says exactly which lends it ended: at
 * most `cap` of them, in ended[0 .. *count) (call again while *count ==
 * cap). peer: a pid, PINPOOL_PEER_ALL or PINPOOL_PEER_EXITED. The lends
 * reported are ended in one hold of the pool's share lock; a failure
 * before ends none. Errors: as pinpool_lend_reclaim, and PINPOOL_EINVAL
 * (ended NULL, cap 0, count NULL). */
PINPOOL_API int pinpool_lend_reclaim_list(pinpool_t *pool, int peer,
                                          unsigned flags,
                                          pinpool_lend_info_t *ended,
                                          size_t cap, size_t *count);

/* Whether `handle` names a lend of a shared pool this process created
 * and has not destroyed: 1 yes, 0 no (another process's pool; and in a
 * child of fork, the parent's pools are not the child's), PINPOOL_EINVAL
 * (NULL). By the pool's nonce, never a pid: an owner and a worker in two
 * pid namespaces may have one pid number. Thread-safe. */
PINPOOL_API int pinpool_share_owns(const pinpool_share_handle_t *handle);

/* Worker: map the block of `handle` and store its address in *out. fd is
 * the chunk's descriptor as received (not consumed: close it when you
 * like, the mapping stays); -1 is allowed if this process has the chunk
 * mapped already (another attached block of it). The control area's
 * descriptor is the one received with the handle (pinpool_share_recv keeps
 * it), else the inherited handle.owner_ctl_fd. The descriptor is checked
 * first: an open memfd, read-write, of the handle's inode, the handle's
 * size, sealed against shrinking and growing. Then the control area (its
 * own memfd, sealed against writes): the pool's nonce, the chunk's id, and
 * the lend itself. Errors (nothing mapped or changed): PINPOOL_EINVAL (NULL
 * argument, no descriptor and the chunk not mapped), PINPOOL_EBADHANDLE
 * (forged or corrupt handle, wrong descriptor, a file that is not the
 * chunk, missing seals, no control area), PINPOOL_ESTALE (the lend has
 * ended), PINPOOL_ENOMEM / PINPOOL_EBACKEND (mmap). Thread-safe; works in
 * any process, the owner's included. */
PINPOOL_API int pinpool_share_attach(const pinpool_share_handle_t *handle,
                                     int fd, void **out);
/* Worker: pinpool_share_attach with the control area's descriptor given
 * (ctl_fd, not consumed; -1: as pinpool_share_attach). */
PINPOOL_API int pinpool_share_attach_ctl(const pinpool_share_handle_t *handle,
                                         int fd, int ctl_fd, void **out);

/* Worker: forget an attached block (the address pinpool_share_attach
 * gave); the chunk is unmapped when its last attached block goes. Send the
 * handle back to the owner after this. Errors: PINPOOL_EINVAL (NULL, not
 * attached). Thread-safe. */
PINPOOL_API int pinpool_share_detach(void *ptr);

/* Send a handle, and the descriptor fd (>= 0) with it, over a connected
 * Unix socket (SCM_RIGHTS); fd -1 sends the handle alone (a return). The
 * owner's own handle also carries its control area's descriptor. Receive
 * one with pinpool_share_recv: *fd is the descriptor received
 * (close-on-exec; the caller owns it) or -1.
 *
 * Framing: one message is the handle's bytes. A stream socket may carry it
 * in pieces: the pieces received so far are kept per socket (and a piece
 * sent so far, per socket, by pinpool_share_send) until the message is
 * complete; a call that cannot finish returns PINPOOL_EAGAIN (the socket
 * is non-blocking, or SO_RCVTIMEO/SO_SNDTIMEO expired) or PINPOOL_EINTR (a
 * signal), nothing lost: call again (pinpool_share_send with the same
 * handle and fd) when poll says so. Errors: PINPOOL_EINVAL,
 * PINPOOL_ECLOSED (the peer closed the socket), PINPOOL_ELIMIT (a
 * descriptor limit: the receiver's RLIMIT_NOFILE, in which case the
 * handle is consumed and its descriptor lost, or the sender's in-flight
 * limit), PINPOOL_EBADHANDLE (not a pinpool handle, or too many
 * descriptors: all closed, the message consumed), PINPOOL_EAGAIN,
 * PINPOOL_EINTR, PINPOOL_EBACKEND (another socket error). */
PINPOOL_API int
pinpool_share_send(int sock, const pinpool_share_handle_t *handle, int fd);
PINPOOL_API int pinpool_share_recv(int sock, pinpool_share_handle_t *handle,
                                   int *fd);

#ifdef __cplusplus
}
#endif
#endif /* PINPOOL_H */
