/*
 * Internal declarations shared by the files of src/. Nothing here is
 * exported: cross-file names start with pp_, everything else is static.
 *
 * Layers (DESIGN.md): front end (pinpool.h) -> pool (pool.c, tcache.c,
 * segmap.c, sizeclass.c, stats.c) -> providers (backend_*.c, reserve.c).
 *
 * Split by concern: base.h (assertions, atomics, locks, errors, size
 * classes), arena.h (extents and the arena), tcache.h (thread caches and
 * the fork handshake); this file holds the rest and struct pinpool, and
 * includes them where their declarations are needed.
 */
#ifndef PP_INTERNAL_H
#define PP_INTERNAL_H

#include "base.h"
#include "index.h"

#include <semaphore.h> /* pp_growth_wait_t */

/* ---- Configuration (config.c) ------------------------------------------- */
enum { PP_MLOCK_OFF = 0, PP_MLOCK_TRY = 1, PP_MLOCK_REQUIRE = 2 };
enum { PP_PIN_ERROR = 0, PP_PIN_PAGEABLE = 1 };
enum { PP_NUMA_OFF = 0, PP_NUMA_LOCAL = 1 };
#define PP_NUMA_MAX 64 /* nodes a numa=local pool handles */
enum {
  PP_BACKEND_HOST = 0,
  PP_BACKEND_MALLOC = 1,
  PP_BACKEND_USER = 2,
  PP_BACKEND_CUDA = 3,          /* cuMemHostAlloc / cuMemFreeHost */
  PP_BACKEND_CUDA_REGISTER = 4, /* mmap + populate + cuMemHostRegister */
  PP_BACKEND_AUTO = 5,          /* the default: resolved at create (config.c) */
};
enum {
  PP_EVENTS_NONE = 0, /* record_stream is refused */
  PP_EVENTS_SIMULATED = 1,
  PP_EVENTS_CUDA = 2,
  PP_EVENTS_USER = 3, /* callbacks given to pinpool_create_ex */
};
/* cuda_flags bits: the CU_MEMHOSTALLOC_* values of the driver API. */
enum {
  PP_CUDA_PORTABLE = 0x01,
  PP_CUDA_DEVICEMAP = 0x02,
  PP_CUDA_WRITECOMBINED = 0x04,
};
typedef struct pp_config {
  int backend;
  uint64_t max_cached;     /* 0: no cap */
  unsigned max_cached_pct; /* idle central bytes <= pct % of those in use */
  uint64_t max_reserved;   /* 0: no cap */
  uint64_t reserve;
  int mlock;
  bool mlock_set;   /* the config named mlock (backend=auto then obeys it) */
  int backend_auto; /* PINPOOL_AUTO_*: what backend=auto chose, or 0 */
  /* The pool's record of backend=auto's "not pinned" warning (config.c),
   * shared through this pointer by the providers' copies (as `fault`). */
  struct pp_pinwarn *pinwarn;
  int pin_failure; /* PP_PIN_*: a CUDA backend that cannot pin */
  bool hugepages;
  bool populate;
  unsigned populate_threads;
  uint64_t populate_parallel_min; /* segments this big populate in parallel */
  uint64_t tcache_bytes;
  unsigned shards;
  int events;                /* PP_EVENTS_* */
  bool background;           /* a thread reclaims completed events */
  unsigned poll_us;          /* its poll interval */
  unsigned sim_delay_us;     /* simulated streams: time each event takes */
  unsigned cuda_flags;       /* PP_CUDA_* for backend=cuda */
  unsigned register_threads; /* populate threads for backend=cuda-register */
  uint64_t register_max;     /* the largest piece one cuMemHostRegister (or
                                cuMemHostAlloc) call is given */
  int device;                /* -1: the context current at create */
  int numa_node;             /* -1: no placement */
  /* numa=local (docs/allocation-policy.md, "NUMA-local reuse"): central
   * lists, arena and thread caches per node. numa_spill: a node out of
   * memory may take a block of another (counted). numa_fake_nodes: tests
   * only, K nodes on any machine (placement on real node k % real). */
  int numa; /* PP_NUMA_* */
  bool numa_spill;
  unsigned numa_fake_nodes; /* 0: the machine's topology */
  /* fault=SITE:N[:COUNT] (tests): fail calls N .. N+COUNT-1 at SITE. The
   * call counter lives in the pool and is shared, through this pointer, by
   * the providers' copies of the config. */
  int fault_site; /* PP_FAULT_*, 0: none */
  /* shared=1 (share.c): chunks are memfds. The pool's sharing state,
   * shared through this pointer by the providers' copies of the config
   * (as `fault`). */
  bool shared;
  struct pp_share *share;
  /* grow_ahead= (growahead.c): bytes of free headroom the background
   * grower keeps, or grow_ahead_auto (sized from the recent growth). */
  uint64_t grow_ahead;
  bool grow_ahead_auto;
  /* page_move= (arena.c, "Page moves"): PP_PMOVE_*. */
  int page_move;
  uint64_t fault_n, fault_count;
  struct pp_fault *fault;
} pp_config_t;
/* page_move=: 0, 1 (a configuration error where a pool cannot move
 * pages), auto (on where it can). */
enum { PP_PMOVE_OFF = 0, PP_PMOVE_ON = 1, PP_PMOVE_AUTO = 2 };
#define PP_PMOVE_DEFAULT PP_PMOVE_OFF
enum {
  PP_FAULT_NONE = 0,
  PP_FAULT_ALLOC,    /* a backend allocation */
  PP_FAULT_POPULATE, /* host backend: populating a segment */
  PP_FAULT_MLOCK,    /* host backend: mlock */
  PP_FAULT_RECORD,   /* an event record */
  PP_FAULT_QUERY,    /* an event query */
  PP_FAULT_REGISTER, /* backend=cuda-register: cuMemHostRegister */
  PP_FAULT_SSET,     /* record_stream: memory for a block's stream set */
  PP_FAULT_QUEUE,    /* a free: memory for a stream's event queue */
  PP_FAULT_MOVE,     /* a system call of a page move (pagemove.c) */
  PP_FAULT_SITES
};
typedef struct pp_fault {
  _Atomic(uint64_t) calls; /* calls seen at the configured site */
  _Atomic(uint64_t) fired;
} pp_fault_t;
/* True if this call at `site` must fail (fault injection; one compare when
 * no fault is configured). */
bool pp_fault_hit(const pp_config_t *cfg, int site);
/* Parse `text` over defaults. user_backend / user_events: hooks were given,
 * and the backend / events key is refused. */
int pp_config_parse(const char *text, bool user_backend, bool user_events,
                    pp_config_t *out);
/* backend=auto (docs/configuration.md, "backend=auto"): resolve
 * cfg->backend (and mlock) at create, before the providers open. A CUDA
 * driver with a device gives cuda-register and the opened driver in *cuda
 * (the pool owns it); else host, locked when RLIMIT_MEMLOCK allows (the
 * soft limit raised to the hard one first), else host unlocked with the
 * warning. Never fails: a backend that cannot be used is passed over. */
struct pp_cuda;
void pp_config_auto(pp_config_t *cfg, struct pp_cuda **cuda);
/* The warning that memory backend=auto meant to pin is pageable: counted
 * in the pool's stats (pin_warnings); the process's first one also goes
 * to the pool's on_error with PINPOOL_ELIMIT. No-op unless cfg came from
 * backend=auto. Any thread, no lock held. */
typedef struct pp_pinwarn {
  pinpool_error_fn on_error; /* immutable after create */
  void *error_arg;
  _Atomic(uint64_t) warnings;
} pp_pinwarn_t;
void pp_pin_warn(const pp_config_t *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Write "key=value,..." for cfg; returns the length it needs (excl. NUL). */
size_t pp_config_format(const pp_config_t *cfg, const char *backend_name,
                        char *buf, size_t len);

/* ---- Providers (backend_host.c, backend_malloc.c) -----------------------
 * Internal backends report per-segment facts through `flags`. */
enum {
  PP_SEG_LOCKED = 1u << 0,       /* page-locked */
  PP_SEG_LOCK_FAILED = 1u << 1,  /* mlock was asked for and refused */
  PP_SEG_HUGE = 1u << 2,         /* MADV_HUGEPAGE applied */
  PP_SEG_FROM_RESERVE = 1u << 3, /* carved from the reserve region */
  /* Pageable memory taken because pinning failed (pin_failure=pageable;
   * arena.c): mapped and freed by the host backend's functions. */
  PP_SEG_FALLBACK = 1u << 4,
};
typedef struct pp_provider {
  const char *name;
  void *ctx;
  int (*alloc)(void *ctx, size_t size, void **out, unsigned *flags);
  void (*free)(void *ctx, void *ptr, size_t size);
  void (*destroy)(void *ctx); /* may be NULL */
  /* May be NULL. As alloc, placed at `hint` if that range is free (else
   * anywhere): memory on both sides of a boundary between two such
   * allocations is alike, so the arena lets blocks cross it (extent.c,
   * "Runs"). A backend that registers or pins by allocation (cuda) has
   * none: a block across two registrations is not one pinned range. */
  int (*alloc_at)(void *ctx, void *hint, size_t size, void **out,
                  unsigned *flags);
  /* May be NULL (then numa=local is refused). As alloc_at, with the
   * memory bound to NUMA node `node` (mbind before the first touch) instead
   * of the configured numa_node. */
  int (*alloc_node)(void *ctx, void *hint, size_t size, int node, void **out,
                    unsigned *flags);
} pp_provider_t;
int pp_backend_host_open(const pp_config_t *cfg, pp_provider_t *out);
/* backend_host.c, shared with backend=cuda-register: anonymous mmap of
 * `size` bytes (at `hint` if that range is free and hint is not NULL),
 * 2 MiB-aligned with MADV_HUGEPAGE if cfg->hugepages, bound
 * to cfg->numa_node with mbind if >= 0, populated by `nthreads` threads
 * if cfg->populate. lock_err non-NULL: also mlock it, in the same pass (the
 * lock faults the pages in); *lock_err is 0, or the refusal's errno and
 * the segment is populated unlocked. */
int pp_host_map(const pp_config_t *cfg, void *hint, size_t size,
                unsigned nthreads, int *lock_err, void **out, unsigned *flags);
/* Undo pp_host_map (a shared pool's chunk: its memfd closed too). */
void pp_host_unmap(const pp_config_t *cfg, void *p, size_t size);
/* pagemove.c: the pages of a host chunk's free range moved to another
 * address (docs/allocation-policy.md, "Page-moving growth"; the host
 * backend's private anonymous memory only). pp_space_reserve: `size`
 * bytes of address without pages (PROT_NONE), 0 or PINPOOL_ENOMEM;
 * pp_space_release unmaps such a range. pp_pages_move: the pages of
 * [from, from + len) to [to, to + len), which must be the caller's
 * reservation (PROT_NONE, no pages); `locked`: the pages are locked, and
 * stay so at `to`. 0: moved, `from` is a hole (reserved, PROT_NONE, no
 * pages). An error: nothing moved, the pages at `from` as they were.
 * *notes either way: PP_MOVE_HOLE_OPEN (moved, but the hole is readable:
 * still reserved, empty), PP_MOVE_LOCK_LOST (the pages, wherever the
 * answer says, could not be locked again: count it as a refused mlock).
 * No lock held; the caller owns both ranges for the call. */
enum { PP_MOVE_HOLE_OPEN = 1u << 0, PP_MOVE_LOCK_LOST = 1u << 1 };
int pp_space_reserve(const pp_config_t *cfg, size_t size, void **out);
void pp_space_release(void *p, size_t size);
int pp_pages_move(const pp_config_t *cfg, void *to, void *from, size_t len,
                  bool locked, unsigned *notes);
/* 0 if NUMA node `node` exists (node 0 always does), else ECONFIG. */
int pp_numa_check(int node);
int pp_backend_malloc_open(const pp_config_t *cfg, pp_provider_t *out);
int pp_backend_user_open(const pinpool_backend_t *user, pp_provider_t *out);

/* share.c: chunks of a shared pool (docs/sharing.md). The host backend
 * makes each chunk with pp_share_chunk_new (a sealed memfd mapped
 * MAP_SHARED at *base), populates and locks it, then publishes it (or
 * aborts it); pp_share_chunk_drop unmaps and closes one. */
typedef struct pp_share pp_share_t;
typedef struct pp_schunk pp_schunk_t;
int pp_share_create(pp_share_t **out);
void pp_share_destroy(pp_share_t *s);
int pp_share_chunk_new(pp_share_t *s, size_t size, bool huge, void **base,
                       pp_schunk_t **out);
void pp_share_chunk_abort(pp_schunk_t *c);
int pp_share_chunk_publish(pp_share_t *s, pp_schunk_t *c);
void pp_share_chunk_drop(pp_share_t *s, void *base, size_t size);
/* True if ptr is lent now (pinpool_free refuses it). */
bool pp_share_is_lent(pp_share_t *s, const void *ptr);
void pp_share_counts(pp_share_t *s, uint64_t *blocks, uint64_t *bytes);
/* Lend returns refused (pinpool_stats_t.lend_refusals). */
uint64_t pp_share_refusals(pp_share_t *s);
/* The lends, copied for a snapshot (malloc'd). */
typedef struct pp_lend_view {
  uintptr_t addr;
  size_t size;
  uint64_t chunk_id, offset, generation;
  int peer;
  uint64_t since_ns, since_unix_ns;
} pp_lend_view_t;
/* A block's stream set (stream.h) freed, its chunks with it. */
struct pp_sset;
void pp_sset_free(struct pp_sset *set);
/* The lends, copied in pieces (share.c); the longest hold, if longer than
 * *hold_ns, is stored there. */
int pp_share_lends_copy(pp_share_t *s, pp_lend_view_t **out, size_t *n,
                        uint64_t *hold_ns);
/* The share lock's meter (base.h, pp_lock_meter): tests. */
uint64_t pp_share_meter(pp_share_t *s, bool reset);
/* Fork handlers (fork.c): the pool's share lock; the worker table's. */
void pp_share_fork(pp_share_t *s, int phase);
void pp_share_worker_fork(int phase);
/* Chunks this process has mapped as a worker (tests). */
size_t pp_share_worker_chunks(void);

/* ---- Event providers -----------------------------------------------------
 * Same contract as pinpool_events_t, plus destroy. Called with no pool lock
 * held (invariant 1). */
typedef struct pp_events {
  const char *name;
  void *ctx;
  int (*record)(void *ctx, pinpool_stream_t stream, void **event);
  int (*query)(void *ctx, void *event); /* 1 done, 0 not yet, < 0 error */
  int (*synchronize)(void *ctx, void *event);
  void (*release)(void *ctx, void *event);
  void (*destroy)(void *ctx); /* may be NULL */
  /* May be NULL (user callbacks: the user's own pthread_atfork). The fork
   * handlers' hook: PP_FORK_PREPARE takes the provider's locks, PARENT
   * releases them, CHILD makes the provider usable in the child (its
   * threads are gone). */
  void (*atfork)(void *ctx, int phase);
  /* May be NULL (no graph capture: simulated streams, callbacks). 1 and
   * the capture's id in *id if `stream` is capturing a graph, 0 if not,
   * < 0 on an error. stream.c never records on a capturing stream (it
   * asks capture.c first). */
  int (*capture)(void *ctx, pinpool_stream_t stream, uint64_t *id);
} pp_events_t;
enum { PP_FORK_PREPARE = 0, PP_FORK_PARENT = 1, PP_FORK_CHILD = 2 };
int pp_events_sim_open(const pp_config_t *cfg, pp_events_t *out);
int pp_events_sim_submit(void *ctx, pinpool_stream_t stream,
                         uint64_t duration_ns, void (*fn)(void *), void *arg);
int pp_events_user_open(const pinpool_events_t *user, pp_events_t *out);

/* ---- CUDA (cuda_driver.c, backend_cuda.c, events_cuda.c) ----------------
 * The driver is loaded with dlopen("libcuda.so.1") (or $PINPOOL_LIBCUDA) at
 * pinpool_create; nothing CUDA is needed to build. One pp_cuda_t per pool,
 * shared by the cuda backends and the cuda event provider. */
typedef struct pp_cuda pp_cuda_t;
/* Load and initialize the driver and pick the context (cfg->device, or the
 * one current at create). Errors: PINPOOL_ENODRIVER with a message that
 * says which: driver not found, stub library, no device, no context. */
int pp_cuda_open(const pp_config_t *cfg, pp_cuda_t **out);
void pp_cuda_close(pp_cuda_t *cuda);
/* backend=cuda or backend=cuda-register, by cfg->backend. */
int pp_backend_cuda_open(const pp_config_t *cfg, pp_cuda_t *cuda,
                         pp_provider_t *out);
int pp_events_cuda_open(const pp_config_t *cfg, pp_cuda_t *cuda,
                        pp_events_t *out);

#include "arena.h"

/* ---- Segments and blocks ------------------------------------------------
 * A block's state word: (payload << 3) | streams bit | state. Payload: the
 * requested size while ALLOCATED or PENDING; while CACHED in a central bin,
 * the index+1 of the next free block of the segment (0: end of list). The
 * streams bit (ALLOCATED only) says pinpool_record_stream attached streams.
 * Every state change is one atomic store or CAS on this word, so a reader
 * (free's double-free check, the validator, a snapshot) never sees a block
 * in two states (invariant 2). */
enum { PP_NEVER = 0, PP_ALLOCATED = 1, PP_CACHED = 2, PP_PENDING = 3 };
#define PP_WORD_STREAMS ((uint64_t)4)
#define PP_WORD(payload, state) (((uint64_t)(payload) << 3) | (state))
#define PP_WORD_STATE(w) ((unsigned)((w)&3u))
#define PP_WORD_PAYLOAD(w) ((w) >> 3)

enum { PP_LIST_NONE = 0, PP_LIST_PARTIAL, PP_LIST_IDLE };

typedef struct pp_segment pp_segment_t;
struct pp_segment {
  /* Cache-line layout: the fields every free reads (found through the map or
   * the hint) come first and are written only while the segment is being
   * created or released; the ones the bin lock guards, written at every
   * central take and give, are on a line of their own; the block words
   * start on another. A thread freeing another thread's blocks then misses
   * only on the word it changes, not on a header line the other thread has
   * just written. */

  /* Read without a lock by pinpool_free's lookup. Descriptors are never
   * freed while the pool lives (recycled per capacity), so a stale lookup
   * reads a live descriptor; the fields are atomics because a recycle may
   * rewrite them while such a reader looks (see segmap.c). */
  _Atomic(uintptr_t) base;
  _Atomic(size_t) size;
  _Atomic(size_t) block_size;
  /* ceil(2^42 / block_size): offset / block_size by a multiply. Exact for
   * offsets below 2^21 (every multi-block segment is <= 2 MiB) and blocks
   * up to 2^18 bytes: 42 >= 21 + 18 bits. */
  _Atomic(uint64_t) div_magic;
  _Atomic(uint32_t) nblocks;
  _Atomic(uint32_t) cls_index; /* == cls, readable without the bin lock */
  uint32_t capacity; /* length of word[]; immutable for the descriptor */
  /* Written before the segment is published, never while it is live:
   * cls and shard (whose bin owns it), flags (PP_SEG_*), and parts (below
   * gen). */
  unsigned cls, shard;
  unsigned flags;
  /* Bumped under pool->seg_lock when the segment is published and when it
   * is released (odd while live): a snapshot reading blocks without the
   * lock checks it did not change meanwhile (snapshot.c); pinpool_free's
   * hint as well; pp_segmap_find reads the bounds under it. On the
   * first line with the lookup's fields: a free that misses its hint reads
   * both (W5: one cache miss fewer per such free). */
  _Atomic(uint64_t) gen;
  /* The NUMA node of its chunk (0 unless numa=local): written before the
   * segment is published, as cls and shard. Off the first line, which is
   * full: only numa=local's slow paths read it. */
  unsigned node;

  /* Streams recorded on each block (stream.c): one pointer per block,
   * installed once with a CAS, then read and written under the stripe
   * lock of (segment, block). Kept across recycling. */
  _Atomic(_Atomic(struct pp_sset *) *) ssets;

  /* History (history.c): per block, the allocation's (stack id << 32 |
   * thread id), 0 when unknown. Installed once with a CAS, kept across
   * recycling; each word is one atomic, written by the allocating thread
   * and read by snapshots (PyTorch read such fields under another lock). */
  _Atomic(_Atomic(uint64_t) *) info;

  /* Under the lock of bin (cls, shard). */
  _Alignas(64) uint32_t carved; /* blocks [0, carved) handed out once */
  uint32_t free_count; /* blocks in this bin: listed free + never carved */
  uint32_t free_head;  /* index+1 of the first listed free block */
  int list;            /* PP_LIST_*: which list of the bin holds it */
  pp_segment_t *prev, *next;

  /* Under pool->idle_lock: the pool-wide LRU of idle segments, kept only
   * when a cap is set (it is what trimming walks). */
  pp_segment_t *lru_prev, *lru_next;
  bool in_lru;

  /* Under pool->seg_lock: every live segment; descriptor free list. */
  pp_segment_t *all_prev, *all_next;

  /* Written by the thread whose free puts the segment's block into a hot
   * slot, read by the thread whose exchange takes it: the request the
   * block was freed with, and the peak epoch read before that free was
   * counted (alloc.c, stats.c). Relaxed atomics: the slot's acq_rel
   * exchange orders the write before the read; atomics so that no plain
   * field is shared between threads outside a lock (DESIGN.md, 3). */
  _Atomic(uint64_t) hot_req, hot_epoch;
  /* The deferred stack (pool.c, "Deferred gives"): written by the pushing
   * thread before its release CAS, read by the draining thread after its
   * acquire exchange. */
  _Atomic(struct pp_segment *) defer_next;

  _Alignas(64) _Atomic(uint64_t) word[];
};
/* The lookup's line holds gen too (see above). */
_Static_assert(offsetof(struct pp_segment, gen) + sizeof(uint64_t) <= 64,
               "gen must share the first cache line with base and size");

/* ---- Segment map (segmap.c): pointer -> segment without a lock. -------- */
#define PP_MAP_CHUNK_SHIFT 18
#define PP_MAP_ADDR_BITS 48
#define PP_MAP_L2_BITS 15
#define PP_MAP_L1_LEN                                                          \
  ((size_t)1 << (PP_MAP_ADDR_BITS - PP_MAP_CHUNK_SHIFT - PP_MAP_L2_BITS))
#define PP_MAP_L2_LEN ((size_t)1 << PP_MAP_L2_BITS)
typedef struct pp_map_entry {
  _Atomic(pp_segment_t *) slot[2];
} pp_map_entry_t;
typedef struct pp_segmap {
  _Atomic(pp_map_entry_t *) l1[PP_MAP_L1_LEN];
} pp_segmap_t;
int pp_segmap_create(pp_segmap_t **out);
void pp_segmap_destroy(pp_segmap_t *map);
int pp_segmap_insert(pp_segmap_t *map, pp_segment_t *seg); /* under seg_lock */
void pp_segmap_remove(pp_segmap_t *map, pp_segment_t *seg);
/* Inline: pinpool_free's lookup. Acquire pairs with the release store that
 * published the descriptor (segmap.c explains the stale-lookup case). */
static inline pp_segment_t *pp_segmap_find(pp_segmap_t *m, uintptr_t p) {
  if (p >= ((uintptr_t)1 << PP_MAP_ADDR_BITS))
    return NULL;
  uintptr_t chunk = p >> PP_MAP_CHUNK_SHIFT;
  pp_map_entry_t *leaf = pp_load_acquire(&m->l1[chunk >> PP_MAP_L2_BITS]);
  if (leaf == NULL)
    return NULL;
  pp_map_entry_t *e = &leaf[chunk & (PP_MAP_L2_LEN - 1)];
  for (int i = 0; i < 2; i++) {
    pp_segment_t *s = pp_load_acquire(&e->slot[i]);
    if (s != NULL) {
      /* The bounds are read as a pair under gen, as a seqlock: the other
       * slot's segment may be released and its descriptor republished
       * elsewhere meanwhile, and an old base with a new size (or the
       * reverse) can cover p, a block of the live segment in this slot's
       * neighbour (the lookup then failed with ENOTOWNED, seen in
       * test_stress). gen is odd while an incarnation is live; it changes
       * (release, publish) before the bounds are rewritten. */
      uint64_t g = pp_load_acquire(&s->gen);
      uintptr_t b = pp_load_relaxed(&s->base);
      size_t n = pp_load_relaxed(&s->size);
      atomic_thread_fence(memory_order_acquire);
      if ((g & 1) != 0 && p >= b && p - b < n && pp_load_relaxed(&s->gen) == g)
        return s;
    }
  }
  return NULL;
}

#include "tcache.h"

/* ---- History (history.c) ------------------------------------------------
 * A ring of fixed-size entries, written without a lock: a writer claims a
 * sequence number with one fetch-add and fills its slot under a per-slot
 * sequence word (odd: being written; 2*seq+2: entry seq complete), so a
 * snapshot copies entries while others keep writing and skips any it saw
 * half written. Every field is an atomic: no reader ever sees a torn
 * value, and ThreadSanitizer sees no plain access to reason about. */
enum {
  PP_H_SEGMENT_ALLOC = 0,
  PP_H_ALLOC,
  PP_H_FREE_REQUESTED,
  PP_H_FREE_COMPLETED,
  PP_H_SEGMENT_FREE,
  PP_H_EMPTY_CACHE,
  PP_H_OOM,
  PP_H_NACTIONS
};
typedef struct pp_hslot {
  _Atomic(uint64_t) seq;
  _Atomic(uint64_t) time; /* pp_hist_clock() units */
  _Atomic(uint64_t) addr, size, req, stream;
  _Atomic(uint64_t) tid_action; /* thread id << 8 | action */
  _Atomic(uint64_t) stack;      /* stack id, 0: none */
} pp_hslot_t;
typedef struct pp_hring {
  struct pp_hring *retired_next;       /* under hist.lock */
  uint64_t mask;                       /* capacity - 1; immutable */
  _Alignas(64) _Atomic(uint64_t) head; /* next sequence number */
  _Alignas(64) pp_hslot_t slots[];
} pp_hring_t;
typedef struct pp_stacktab pp_stacktab_t;
typedef struct pp_history {
  /* The level every hot path reads (relaxed: a thread that sees it late
   * records one event more or less, never a torn one). */
  _Atomic(unsigned) level;
  _Atomic(unsigned) depth;
  _Atomic(pp_hring_t *) ring;    /* never NULL again once set */
  _Atomic(uint64_t) max_entries; /* entries a snapshot keeps */
  _Atomic(uint64_t) base_seq;    /* entries before it were cleared */
  /* Entries dropped because their slot was still being written by a
   * writer a lap behind (emit); never reset. */
  pp_counter_t lost;
  _Atomic(pp_stacktab_t *) stacks;
  pp_mutex_t lock;     /* record_history; the retired list */
  pp_hring_t *retired; /* replaced rings, freed at destroy (late writers) */
  bool tsc;            /* clock is the invariant TSC; immutable */
  uint64_t clk0, ns0;  /* a (clock, ns) pair taken at create; immutable */
} pp_history_t;

/* A bit per bin (its index in pool->bins) in `low`, and a bit per word of
 * `low` in `top`, which may be set for a word that is 0 (cleared by the
 * walk that finds it so: pool.c, "Bin summaries"). */
typedef struct pp_binmap {
  _Atomic(uint64_t) *low, *top;
  size_t ntop; /* words of top */
} pp_binmap_t;

/* ---- The pool ----------------------------------------------------------- */
/* Cache-line aligned so that neighbouring bins never share a line. */
#define PP_HOT_SLOTS 4 /* large blocks kept whole per bin (pool.c) */
typedef struct pp_bin {
  _Alignas(64) pp_mutex_t lock;
  pp_segment_t *partial; /* some free blocks, some in use */
  pp_segment_t *idle;    /* every block free in this bin */
  /* PP_BIN_PARTIAL | PP_BIN_IDLE: which lists are non-empty. Written under
   * the lock whenever they change, read without it as a hint: a thread
   * looking for a block skips a bin that says it has none instead of taking
   * its lock (a miss tries every shard, most of them empty bins). A stale
   * "empty" costs at worst a segment that was not needed; a stale "non-empty" a
   * lock. */
  _Atomic(unsigned) avail;
  /* One-block segments whose block was freed, outside the lists: the
   * next allocation of exactly that size takes one with a compare-and-swap
   * and no lock (pool.c, "Hot slots"; no cap set; classes above
   * tcache_bytes, frees of a class above tcache_bytes / 16 by a thread
   * without its stack, completed stream-ordered frees). */
  _Atomic(struct pp_segment *) hot[PP_HOT_SLOTS];
} pp_bin_t;
enum { PP_BIN_PARTIAL = 1, PP_BIN_IDLE = 2 };

/* Accounting not owned by a thread cache; atomics updated on slow paths. */
typedef struct pp_gstats {
  pp_counter_t reserved_cur, reserved_peak, reserved_alloc, reserved_freed;
  /* reserved_cur and the backend allocations in flight: what max_reserved
   * is checked against (arena.c, reserve_bytes); reserved_cur and its peak
   * count only memory the backend handed over. */
  pp_counter_t reserved_claimed;
  pp_counter_t segs_cur, segs_peak, segs_alloc, segs_freed;
  /* Bytes into/out of central idle; hot-slot moves by a thread with a
   * cache are in its pp_tcounters_t slot_in/slot_out instead (pool.c). */
  pp_counter_t central_in, central_out;
  /* Bumped (release, under reg_lock) after each peak sample and reset:
   * a free into a hot slot and the allocation that takes it compare it
   * (alloc.c, "paired"). */
  pp_counter_t peak_epoch;
  pp_counter_t misses, oom, retries, trimmed;
  /* Page moves (arena.c, "Page moves"): fragmentation misses served by
   * moving free pages, their bytes, and those that fell back to growth. */
  pp_counter_t page_moves, bytes_moved, move_fallbacks;
  pp_counter_t mlock_failures, locked_bytes;
  /* Pageable fallback (pin_failure=pageable): bytes of such chunks held
   * now, and the blocks of the live segments carved from them (written
   * under seg_lock). */
  pp_counter_t fallback_bytes, fallback_blocks;
  /* numa=local, numa_spill=1: blocks (and their bytes) handed to a thread
   * from another node's memory because its own node was out of memory. */
  pp_counter_t numa_spill_blocks, numa_spill_bytes;
  pp_counter_t ba_count, ba_total, ba_max, bf_count, bf_total, bf_max;
  /* tcache_bytes=0: every thread's counters, added by each thread at the
   * end of each of its operations (stats.c, pp_stats_publish), so that a
   * peak sample reads these instead of every thread's (issue 38). */
  pp_tcounters_t tot;
  pp_counter_t tot_bytes;
  /* The counts of calls nested in another call of the same thread (from
   * a callout inside it: alloc.c, "Nested calls"), which use no thread
   * cache; shared (fetch-and-add), summed with the pool's own parts. */
  pp_tcounters_t nested;
} pp_gstats_t;

/* Peaks and the counters of threads that have exited; under reg_lock. */
typedef struct pp_rstats {
  pp_tcounters_t dead;
  uint64_t peak_requests, peak_req, peak_blocks, peak_blk, peak_cached;
  unsigned ncaches, max_ncaches;
  /* The largest cache_hits and tcache_hits reported (stats.c). */
  uint64_t hits_seen, tc_hits_seen;
  /* The next cache's place in the list (pp_tcache_t.seq), and the sums of
   * the caches in progress (stats.c, "The sum in pieces"). */
  uint64_t next_seq;
  struct pp_stats_walk *walks;
} pp_rstats_t;

/* A growth in flight (arena.c, grow_take and pp_arena_grow_ahead): a
 * chunk being made with no lock held, for `node`. A miss on that node
 * whose piece fits in `room` (the chunk's bytes not yet promised) waits
 * for it instead of growing a chunk of its own: it joins `waiters`, and
 * the hold that enters the chunk carves every waiter's piece (served) or,
 * if the chunk never comes, wakes it unserved (it then grows itself,
 * without waiting again). Records live on the growing and waiting
 * threads' stacks; the list is under seg_lock. */
typedef struct pp_growth_wait {
  size_t need;
  void *mem;      /* served: the piece */
  unsigned flags; /* served: its chunk's flags */
  bool served;
  sem_t done; /* posted once, after the hold that decides */
  struct pp_growth_wait *next;
} pp_growth_wait_t;
typedef struct pp_growth {
  unsigned node;
  size_t room;
  pp_growth_wait_t *waiters;
  struct pp_growth *next;
  bool ahead; /* the grower's: a waiter's carve uses grown-ahead bytes */
} pp_growth_t;

/* The background grower (growahead.c; docs/allocation-policy.md, "Growth
 * ahead of demand"). */
#define PP_GROW_SAMPLES 8
typedef struct pp_grow_node {
  /* Under seg_lock: bytes the grower put in this node's arena that no
   * carve has used yet, and the largest carve since the grower's last
   * sample. */
  uint64_t unused;
  uint64_t max_carve;
  /* The grower's own (only its thread touches them): the node's demand
   * (bytes carved from its chunks) and largest carve, one sample per
   * eighth of the window. */
  uint64_t used[PP_GROW_SAMPLES], carve[PP_GROW_SAMPLES];
} pp_grow_node_t;
typedef struct pp_grow {
  pp_grow_node_t *node; /* [nnodes]; NULL when grow_ahead is off */
  /* Set once create has made the arena (lifecycle.c): the grower looks at
   * nothing before. */
  _Atomic(bool) ready;
  /* The grower's own: when it last looked and sampled, the sample slot,
   * grow.releases at its last look, and its pause (a release won:
   * nothing grown ahead until the demand passes pause_used). */
  uint64_t last_ns, sample_ns, start_ns; /* start_ns: the last resume */
  unsigned slot;
  uint64_t releases_seen, pause_used;
  bool paused;
  /* Chunks pp_arena_release gave back (under seg_lock, in the hold that
   * takes the chunk out): a release is seen by the grower's next look, and
   * by the hold that would enter a chunk made after the look. */
  uint64_t releases;
  /* pinpool_stats_t.grow_ahead_*. */
  pp_counter_t chunks, bytes, hits, waits_avoided;
  /* Held by the grower from its backend call to the hold that enters the
   * chunk, and by pinpool_validate throughout (pp_grow_lock): the
   * grower's chunk is counted before the arena has it. Taken before any
   * pool lock; made anew in a child of fork (no grower there). */
  pthread_mutex_t mu;
  /* Under seg_lock: the growths in flight, every node's (pp_growth_t; for
   * every pool, grow_ahead or not). None at a fork: each is made inside a
   * busy section. */
  pp_growth_t *inflight;
} pp_grow_t;

struct pinpool {
  uint64_t id;       /* unique for the process lifetime; never reused */
  pp_counter_t refs; /* owner + objects that outlive pinpool_destroy */
  /* A teardown deferred to the end of this thread's busy section
   * (lifecycle.c, pp_pool_unref): the next such pool. */
  struct pinpool *teardown_next;
  /* shared=1: lends (share.c); NULL otherwise. Immutable. Next to id:
   * pinpool_free's hit path reads it (a shared pool's frees check lends). */
  struct pp_share *share;
  pp_config_t cfg;
  pp_provider_t prov;
  char backend_name[32];

  /* PP_NCLASSES * nvshards bins, cache-line separated. A bin's shard is
   * a "virtual shard": node * cfg.shards + the shard within the node, so
   * that every node has its own central lists (numa=local; one node
   * otherwise, where this is cfg.shards). */
  pp_bin_t *bins;
  /* Per class: some bin's hot slot may hold a block (pool.c, "Hot
   * slots"): set by a put after its exchange and hot_map's bit, cleared
   * by a drain before it empties a bin of the class (the drain trusts
   * hot_map, never this mark: docs/verification.md). A hint, so that a
   * take of a class whose slots are all empty (most large sizes of a mix:
   * W5) reads one byte instead of a cache line per shard. */
  _Atomic(uint8_t) hot_used[PP_NCLASSES];
  /* Which bins hold something (pool.c, "Bin summaries"): idle_map, the
   * bins whose idle list is non-empty (exact under each bin's lock);
   * hot_map, bins whose hot slots may hold a block (set by a put, cleared
   * by the drain that empties them). A release of idle memory and a drain
   * of the hot slots visit those bins, not all PP_NCLASSES * nvshards
   * (issue 38, review item 7). */
  pp_binmap_t idle_map, hot_map;
  unsigned nnodes;   /* 1, or the nodes of numa=local; immutable */
  unsigned nvshards; /* cfg.shards * nnodes; immutable */
  /* numa=local with nnodes > 1: PP_EPOCH_NUMA, or'ed into every thread
   * cache's epoch so that it never equals flush_epoch and the hit paths
   * (which compare the two) send every call to the general paths, where
   * the thread's node is checked. 0 otherwise: the hit paths are those of
   * a pool without NUMA, instruction for instruction. Immutable. */
  uint64_t epoch_tag;
  /* The topology, read once at create (numa.c): the node of each CPU, and
   * the real node each node's memory is bound to. Immutable. */
  unsigned ncpus;
  uint16_t *cpu_node;
  int place[PP_NUMA_MAX];

  /* Large one-block segments given back and not yet released to the
   * arena (pool.c, "Deferred gives"): a stack pushed without a lock,
   * emptied whole under seg_lock. Its own line: the freeing thread writes
   * it, the carving thread empties it. */
  _Alignas(64) _Atomic(struct pp_segment *) deferred;
  _Alignas(64) pp_mutex_t seg_lock; /* all, desc_free_* */
  pp_segment_t *all;
  /* Snapshots copying `all` over several holds (snapshot.c): each one's
   * next segment, which a release of that segment moves on (pool.c). */
  struct pp_snap_cursor *snap_cursors;
  pp_segment_t *desc_free_slab, *desc_free_large;
  pp_segmap_t *map;

  pp_mutex_t trim_lock; /* serializes detaching idle segments for release */
  pp_mutex_t idle_lock; /* LRU of idle segments */
  pp_segment_t *lru_head, *lru_tail;
  pp_counter_t cls_segs[PP_NCLASSES]; /* live segments per class */

  pp_arena_t arena;
  uint64_t reserve_size; /* the reserve chunk's bytes; immutable */
  bool has_reserve;
  bool page_move;   /* page_move= resolved at create (arena.c); immutable */
  bool arena_ready; /* the arena initialized: pool_free_struct ends it */

  pp_mutex_t reg_lock; /* tcache list, rstats */
  pp_tcache_t *caches;
  pp_rstats_t rs;

  _Atomic(uint64_t) flush_epoch;
  _Atomic(unsigned) next_shard;
  pp_history_t hist;
  pp_gstats_t gs;

  pp_fault_t fault;     /* fault injection counters (config key fault) */
  pp_pinwarn_t pinwarn; /* backend=auto's warning (cfg.pinwarn points here) */

  /* Stream-ordered frees (stream.c). */
  pp_events_t ev;
  bool has_events;
  pinpool_error_fn on_error;
  void *error_arg;
  pp_cuda_t *cuda;
  pp_mutex_t sset_locks[64];
  pp_mutex_t streams_lock;   /* the stream queues: qtab, squeues, items */
  struct pp_qtab *qtab;      /* stream -> queue, for queues with events */
  struct pp_squeue *squeues; /* the queues with events (active list) */
  /* The part of the pending and reclaim counts kept by threads without a
   * cache of this pool (pp_tcounters_t has the rest; pp_stats_sum adds). */
  pp_counter_t pending_bytes, pending_blocks;
  /* Graph capture (capture.c): the captures blocks are tied to,
   * under streams_lock; the pending blocks parked on them (counted in
   * pending_* too). */
  struct pp_capture *captures;
  /* The captures by id (index.h; issue 38: a lookup walked the list),
   * and by stream (scix: a stream's first link to a capture seen on it,
   * capture.c; pinpool_stream_graphs_release walked every capture);
   * cpins: record_stream calls that may add a stream to a capture
   * (room is kept in scix for each). */
  pp_index_t ctab, scix;
  size_t ncaptures, cpins;
  pp_counter_t graph_blocks, graph_bytes;
  /* Pending blocks whose events are not all resolved, or that are still
   * moving out of PENDING; seq_cst (stream.c, "Waiting"). */
  _Atomic(uint64_t) pending_live;
  /* pinpool_synchronize's bound (stream.c, "Waiting"): the cohorts of
   * pending_live's blocks, from the oldest not retired (live_head) to the
   * one blocks enter now (live_cur), and recycled ones (live_spare), under
   * live_mu (a leaf lock); live_retired: the id of the newest cohort that
   * has, as has every older one, no block left in pending_live. */
  pp_mutex_t live_mu;
  struct pp_cohort *live_head, *live_cur, *live_spare;
  _Atomic(uint64_t) live_retired;
  /* pinpool_synchronize's sleep: sync_gen (under sync_mu, a leaf lock)
   * counts progress made while sync_waiters > 0. */
  pthread_mutex_t sync_mu;
  pthread_cond_t sync_cv;
  uint64_t sync_gen;
  _Atomic(unsigned) sync_waiters;
  pp_counter_t ev_recorded, ev_completed, ev_errors;
  /* Reclaim latency: count and total as pending_bytes (the part of
   * threads without a cache); the max, the whole pool's. */
  pp_counter_t rc_count, rc_total, rc_max;
  pthread_t bg_thread;
  bool bg_running; /* a bg_thread runs (this process's: false in a child) */
  /* A child of fork: the background thread did not survive. The next
   * stream-ordered free starts one (stream.c); until then the slow paths
   * reclaim inline, as with background=0. */
  _Atomic(bool) bg_restart;
  /* A child of fork of a pool that uses CUDA (backend or events): the
   * driver cannot be used, every call fails with PINPOOL_EFORKED. */
  bool forked_cuda;
  struct pinpool *reg_prev, *reg_next; /* fork.c's registry */
  pthread_mutex_t bg_mutex;
  pthread_cond_t bg_cond;
  bool bg_stop; /* under bg_mutex */
  /* Under bg_mutex: validators holding the background thread off
   * (pp_bg_hold), and whether it is in a pass (reclaim, grower). */
  unsigned bg_held;
  bool bg_in_pass;
  pp_grow_t grow; /* grow_ahead= (growahead.c) */
};

/* A snapshot's place in `all` between two holds of seg_lock: the next
 * segment to copy (NULL: the end). New segments go to the head, so a
 * copy sees only those that existed when it began (snapshot.c). */
typedef struct pp_snap_cursor {
  pp_segment_t *next;
  struct pp_snap_cursor *link;
} pp_snap_cursor_t;

/* A cap on idle bytes is set (max_cached or max_cached_pct): idle segments
 * are kept in the LRU that trimming walks. */
static inline bool pp_trims(const struct pinpool *pool) {
  return pool->cfg.max_cached != 0 || pool->cfg.max_cached_pct != 0;
}

static inline pp_bin_t *pp_bin(struct pinpool *pool, unsigned cls,
                               unsigned shard) {
  return &pool->bins[(size_t)cls * pool->nvshards + shard];
}

/* ---- NUMA (numa.c) -------------------------------------------------------
 * The high bit of a thread cache's epoch: see struct pinpool's epoch_tag. */
#define PP_EPOCH_NUMA ((uint64_t)1 << 63)
/* The cache missed a pinpool_empty_cache (its epoch, tag aside, is not the
 * pool's): slow paths only. */
static inline bool pp_tc_stale(const pp_tcache_t *tc,
                               const struct pinpool *pool) {
  return (tc->epoch & ~PP_EPOCH_NUMA) != pp_load_relaxed(&pool->flush_epoch);
}
/* The virtual shard (bin index within a class) of the cache's node. */
static inline unsigned pp_tc_vshard(const pp_tcache_t *tc,
                                    const struct pinpool *pool) {
  return tc->node * pool->cfg.shards + tc->shard;
}
/* Read the topology (cpu_node, place, nnodes, nvshards, epoch_tag). */
int pp_numa_init(struct pinpool *pool);
void pp_numa_fini(struct pinpool *pool);
/* The calling thread's node: the test hook's answer if one is set, else
 * the node of the CPU it runs on (sched_getcpu). < nnodes. */
unsigned pp_numa_current(const struct pinpool *pool);
/* numa=local, nnodes > 1: the calling thread's node changed since its cache
 * last looked: flush the cache (its blocks go home) and adopt the new
 * node. Owner only, in a busy section. */
void pp_numa_follow(struct pinpool *pool, pp_tcache_t *tc);
/* Test hook (tests/test_numa_local.c): the calling thread's node, or < 0
 * for the CPU's. NULL outside tests. */
typedef int (*pp_test_numa_fn)(void);
extern _Atomic(pp_test_numa_fn) pp_test_numa_node;

/* pool.c: the central layer used by the thread caches. */
/* Take up to `want` blocks of class `cls` into out[]; returns the count
 * (>= 1) or a negative error. `shard` is a virtual shard (struct pinpool's
 * bins): only the bins of its node are searched, and a new segment is
 * carved from that node's arena (pp_hot_take: the same shards). A large class
 * (above PP_SLAB_MAX_BLOCK) takes one block of exactly `bs` bytes (the
 * page-rounded request), from the hot slot or carved from the arena; a slab
 * class's bs is its size. */
int pp_central_take(struct pinpool *pool, unsigned cls, size_t bs,
                    unsigned shard, pp_tentry_t *out, uint32_t want,
                    bool *missed);
/* Hot slots (pool.c): put e (a one-block segment's block, freed with
 * request req after reading peak_epoch as epoch) into its bin's slot, or
 * false when it does not qualify; take the block of a slot of class cls,
 * trying shard first (out->seg->hot_req and hot_epoch are the put's). The
 * bytes are counted in the calling thread's `ctr` (tc->c.slot_in or
 * slot_out), or in gs.central_in/out when ctr is NULL. */
bool pp_hot_put(struct pinpool *pool, unsigned cls, const pp_tentry_t *e,
                uint64_t req, uint64_t epoch, pp_counter_t *ctr);
bool pp_hot_take(struct pinpool *pool, unsigned cls, size_t bs, unsigned shard,
                 pp_tentry_t *out, pp_counter_t *ctr);
unsigned pp_hot_drain(struct pinpool *pool);        /* blocks drained */
unsigned pp_hot_drain_locked(struct pinpool *pool); /* seg_lock held */
/* Releases the deferred gives (pool.c) to the arena: blocks drained. The
 * _locked one: caller holds seg_lock; at most a piece (PP_DEFER_PIECE) in
 * the hold, pp_defer_pending says whether some are left. pp_defer_drain:
 * all of them, a piece a hold. */
unsigned pp_defer_drain(struct pinpool *pool);
unsigned pp_defer_drain_locked(struct pinpool *pool);
bool pp_defer_pending(struct pinpool *pool);
/* Give `n` cached blocks of class `cls` back to their segments' bins. */
void pp_central_give(struct pinpool *pool, unsigned cls, pp_tentry_t *in,
                     uint32_t n);
/* Release idle segments while cached bytes outside the reserve exceed the
 * max_cached cap. Takes and drops locks itself; call with none held. */
void pp_trim_to_cap(struct pinpool *pool);
/* After a full poll cached completed blocks: pp_trim_to_cap in a busy
 * section, unless inside a callout (pool.c). */
void pp_trim_after_poll(struct pinpool *pool);

/* Give every idle segment and hot-slot block back to the arena (no memory
 * leaves the pool: pp_arena_release does that). Call with no lock held. */
unsigned pp_release_idle(struct pinpool *pool);
/* The bins' summaries (pool.c): made at create (0 or PINPOOL_ENOMEM),
 * freed at destroy (NULL fields: nothing to free). */
int pp_binmaps_init(struct pinpool *pool);
void pp_binmaps_fini(struct pinpool *pool);
void pp_segment_release_all(struct pinpool *pool); /* destroy only */

/* lifecycle.c: keep the pool alive past pinpool_destroy (buffers, exports). */
void pp_pool_ref(struct pinpool *pool);
void pp_pool_unref(struct pinpool *pool);
/* A reference unless the last one is already gone (a teardown has begun). */
bool pp_pool_try_ref(struct pinpool *pool);
/* Drop a reference unless it is the last (which pp_pool_unref drops). */
bool pp_pool_unref_unless_last(struct pinpool *pool);
/* A thread a pool owns (its background thread: background=1 and the
 * grower; the simulated streams' workers) sets this at its start. Such a
 * thread never runs a teardown, of any pool: the last reference dropped
 * on it hands the pool to the process's reaper (lifecycle.c), since the
 * teardown joins the pool's own threads (issue 37, rv3637f, D4). */
#define pp_pool_thread (pp_tls.pool_thread)
/* fork.c's handlers: the reaper's lock and list (lifecycle.c). */
void pp_reap_fork(int phase);
/* Tests: a non-zero return fails the reaper's start with that error, as
 * a failed pthread_create (lifecycle.c, reaper_start). */
extern int (*pp_test_reaper_start_hook)(void);
/* The pool is being torn down (no reference left): a call from a callback
 * that the teardown runs (a backend free, the provider's destroy) fails
 * with PINPOOL_EBUSY, naming `fn`; 0 otherwise. */
int pp_pool_dying(const struct pinpool *pool, const char *fn);

/* growahead.c: the grower's state (at create, before the streams) and
 * its end; one look (the background thread's loop); the carve hook
 * (arena.c, seg_lock held). */
int pp_grow_init(struct pinpool *pool);
void pp_grow_fini(struct pinpool *pool);
void pp_grow_tick(struct pinpool *pool);
void pp_grow_carved_locked(struct pinpool *pool, unsigned node, size_t size);
/* A carve from a chunk an allocation grew (seg_lock held): the window's
 * largest carve only (no grown-ahead byte was used). */
void pp_grow_noted_locked(struct pinpool *pool, unsigned node, size_t size);
void pp_grow_lock(struct pinpool *pool); /* no-op when grow_ahead is off */
void pp_grow_unlock(struct pinpool *pool);
void pp_grow_fork_child(struct pinpool *pool);
/* stream.c: a child of fork whose parent ran the background thread starts
 * its own (no-op otherwise). No lock held. arena.c calls it at a growth:
 * a pool without events has no stream-ordered free to do it. */
void pp_bg_restart(struct pinpool *pool);
/* pinpool_validate: hold the library's background thread off (on: wait
 * for its pass in progress to end; off: let it go on). No lock held. */
void pp_bg_hold(struct pinpool *pool, bool on);
/* arena.c, for the grower: a chunk of at least `need` bytes (the growth
 * policy's size, at most `room`) made with no lock held and put in node's
 * arena whole and free in one hold of seg_lock. 0 (*size, *flags set), 1
 * if `room` cannot hold a chunk of 2 MiB and `least` bytes (a chunk that
 * holds none of the largest carves would only fragment the cap's room),
 * 2 if a release came after the grower's
 * look (grow.releases moved from `releases`: the chunk went back), 3 if a
 * growth is in flight on the node (the grower looks again once it is in:
 * the room it read did not count that chunk), or an error; nothing
 * changed unless 0. */
int pp_arena_grow_ahead(struct pinpool *pool, unsigned node, size_t need,
                        size_t least, uint64_t room, uint64_t releases,
                        size_t *size, unsigned *flags);
/* arena.c, for the grower (grow_ahead=auto, demand flat for a window):
 * give node's oldest whole free chunk back to the backend if it is at most
 * `most` bytes, no growth is in flight on the node, and the largest free
 * extent left is at least `largest`. Its size, or 0 (nothing changed).
 * Counted in trimmed_segments, not in grow.releases: the grower's own
 * give-back does not pause it. */
size_t pp_arena_shed(struct pinpool *pool, unsigned node, uint64_t most,
                     uint64_t largest);
/* pool.c: the bytes the idle caps (max_cached, max_cached_pct) leave for
 * more idle memory before a trim (UINT64_MAX: no cap). */
uint64_t pp_cache_room(struct pinpool *pool);

/* stream.c */
int pp_streams_init(struct pinpool *pool); /* after ev is set */
void pp_streams_fini(struct pinpool *pool);
/* Fork handlers' part (fork.c): the stream locks and the background
 * thread's mutex (PP_FORK_*). */
void pp_streams_fork(struct pinpool *pool, int phase);
/* The free of an ALLOCATED block with the streams bit: word `w` as read;
 * tc NULL for a nested call (alloc.c, "Nested calls"). */
/* pinpool_synchronize past its checks (a teardown's, with no reference
 * left). */
int pp_synchronize(struct pinpool *pool);
int pp_stream_free(struct pinpool *pool, pp_tcache_t *tc, pp_segment_t *seg,
                   uint32_t idx, uint64_t w, const void *ra);
/* Poll every stream queue; up to `budget` completions. wait: synchronize. */
void pp_process(struct pinpool *pool, unsigned budget, bool wait);
/* An allocation's miss: poll a bounded number of queues, in turn. */
bool pp_process_miss(struct pinpool *pool);

/* stats.c */
/* pp_tcounters_t summed over live and exited threads, as plain integers
 * (one reader, under reg_lock), the bytes held in thread caches, and the
 * cached bytes of the pool (stats and the validator read the same sum). */
typedef struct pp_sums {
  uint64_t n_alloc, n_free, req_alloc, req_free, blk_alloc, blk_free;
  uint64_t slow_allocs;
  uint64_t slot_in, slot_out;
  uint64_t pend_bytes, pend_blocks, rc_count, rc_total;
  uint64_t tc_bytes;
  uint64_t cached; /* central idle (bins and hot slots) + tc_bytes */
} pp_sums_t;
void pp_stats_sum(struct pinpool *pool, pp_sums_t *out); /* reg_lock held */
/* The same sum, the caches visited in holds of reg_lock of at most
 * PP_STATS_PIECE; takes reg_lock and returns with it held. */
#define PP_STATS_PIECE 64
void pp_stats_sum_pieces(struct pinpool *pool, pp_sums_t *out);
void pp_stats_fold_dead(struct pinpool *pool, pp_tcache_t *tc);
void pp_stats_sample_peaks(struct pinpool *pool);
/* tcache_bytes=0: tc's counters into gs.tot (owner, no lock). */
void pp_stats_publish(struct pinpool *pool, pp_tcache_t *tc);
void pp_backend_timed(pp_counter_t *count, pp_counter_t *total,
                      pp_counter_t *max, uint64_t t0);

/* history.c */
int pp_hist_init(struct pinpool *pool);
void pp_hist_fini(struct pinpool *pool);
#ifdef PINPOOL_MUTANT_HISTORY_FLAG_PLAIN
/* Race mutant (docs/verification.md): the level as a plain field, read by
 * every allocation while pinpool_record_history writes it (PyTorch's
 * record_history_ race). */
#define pp_hist_level(pool) (*(volatile unsigned *)&(pool)->hist.level)
#else
#define pp_hist_level(pool) pp_load_relaxed(&(pool)->hist.level)
#endif
/* An allocation of block idx of seg (level >= STATE): remembers thread and
 * stack for snapshots, and records an alloc entry (level >= ALLOC). Called
 * before the block's word becomes ALLOCATED (release), so a snapshot that
 * reads ALLOCATED also reads this allocation's info or a later one. */
void pp_hist_alloc(struct pinpool *pool, pp_segment_t *seg, uint32_t idx,
                   size_t bs, size_t req, const void *ra);
/* Any other entry; does nothing below level ALLOC. */
void pp_hist_event(struct pinpool *pool, int action, uintptr_t addr,
                   size_t size, size_t req, uint64_t stream, const void *ra);
/* ra: the return address of the public entry point (its caller), where the
 * captured stack is cut so that it starts in the caller's code; NULL when
 * unknown (deep in a slow path: snapshot_json.c then cuts by symbol name). */
/* The block went back to the cache: forget its allocation info. One load
 * when history was never on for the segment. */
static inline void pp_hist_forget(pp_segment_t *seg, uint32_t idx) {
  _Atomic(uint64_t) *info = pp_load_acquire(&seg->info);
  if (pp_unlikely(info != NULL)) {
#ifdef PINPOOL_MUTANT_BLOCKINFO_PLAIN
    *(uint64_t *)&info[idx] = 0;
#else
    pp_store_relaxed(&info[idx], 0);
#endif
  }
}
/* Read by snapshots. */
uint64_t pp_hist_to_ns(const struct pinpool *pool, uint64_t clk,
                       uint64_t clk_now, uint64_t ns_now);
uint64_t pp_hist_clock(const struct pinpool *pool);
/* The stack table, copied in pieces under its lock for a snapshot (stack
 * ids are 1-based: stack id's frames are frames[off[id - 1], off[id])).
 * The longest hold, if longer than *hold_ns, is stored there. */
typedef struct pp_stacks_copy {
  uintptr_t *frames; /* all frames, stack after stack */
  uint64_t *off;     /* stack i (0-based) is frames[off[i], off[i+1]) */
  size_t n;          /* stacks */
} pp_stacks_copy_t;
int pp_stacks_copy(struct pinpool *pool, pp_stacks_copy_t *out,
                   uint64_t *hold_ns);
/* The stack table lock's meter (tests). */
uint64_t pp_stacks_meter(struct pinpool *pool, bool reset);
void pp_stacks_copy_free(pp_stacks_copy_t *c);
/* Linux thread id of the caller, cached. */
uint32_t pp_thread_id(void);

/* stream.c, for snapshots: the streams recorded on (or awaited by) block
 * idx of seg, read under its stripe lock; up to max into out, returns the
 * count (which may exceed max). The ids of the graph captures the block is
 * tied to likewise: up to maxcaps into caps, their count in *ncaps. */
size_t pp_stream_list(struct pinpool *pool, pp_segment_t *seg, uint32_t idx,
                      uint64_t *out, size_t max, uint64_t *caps, size_t maxcaps,
                      size_t *ncaps);

/* symbolize.c: names for return addresses, when a snapshot is written. */
typedef struct pp_symbol {
  const char *function, *module, *file; /* NULL: unknown; owned by sym */
  uint64_t offset;
  int64_t line; /* -1: unknown */
} pp_symbol_t;
typedef struct pp_symbolizer pp_symbolizer_t;
pp_symbolizer_t *pp_symbolizer_open(void); /* NULL: out of memory */
void pp_symbolize(pp_symbolizer_t *s, uintptr_t addr, pp_symbol_t *out);
void pp_symbolizer_close(pp_symbolizer_t *s);

#endif /* PP_INTERNAL_H */
