/*
 * The ground every file of src/ stands on: assertion levels, atomics with
 * the memory order in their name, locks, test hooks, errors and the size
 * classes. Included by internal.h; nothing here knows about a pool.
 */
#ifndef PP_BASE_H
#define PP_BASE_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include "pinpool.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- Assertions ---------------------------------------------------------
 * PINPOOL_DEBUG=1: internal assertions and lock-held preconditions
 * (pp_assert_held); 2: also the expensive ones. Release builds: none. The
 * validator (pinpool_validate) needs a quiescent pool, so the tests call
 * it at quiescent points rather than the slow paths. */
#ifndef PINPOOL_DEBUG
#define PINPOOL_DEBUG 0
#endif
void pp_assert_fail(const char *expr, const char *file, int line);
#if PINPOOL_DEBUG >= 1
#define pp_assert(x) ((x) ? (void)0 : pp_assert_fail(#x, __FILE__, __LINE__))
#else
#define pp_assert(x) ((void)0)
#endif
#if PINPOOL_DEBUG >= 2
#define pp_assert_expensive(x) pp_assert(x)
#else
#define pp_assert_expensive(x) ((void)0)
#endif

/* The TLS model of pinpool's thread-local state: the compiler's default
 * for position-independent code (global-dynamic; the build asks for the
 * TLSDESC dialect where the compiler has it, -mtls-dialect=gnu2: one call
 * that returns an offset kept in a register, no __tls_get_addr). Not
 * initial-exec: that marks the shared library and the Python module
 * STATIC_TLS, and dlopen then fails once other libraries have used up the
 * static TLS surplus ("cannot allocate memory in static TLS block"). An
 * executable that links the static library still gets local-exec: the
 * linker relaxes the accesses (docs/api.md, "Loading"; test_dlopen_tls). */
#ifndef PP_TLS_MODEL
#if defined(PINPOOL_TLS_INITIAL_EXEC) && PINPOOL_TLS_INITIAL_EXEC
/* cmake -DPINPOOL_TLS_INITIAL_EXEC=ON: for a libpinpool.so that is only
 * ever linked at startup, never dlopen'ed (docs/api.md, "Loading"). */
#define PP_TLS_MODEL __attribute__((tls_model("initial-exec")))
#else
#define PP_TLS_MODEL
#endif
#endif

#define pp_likely(x) __builtin_expect(!!(x), 1)
#define pp_unlikely(x) __builtin_expect(!!(x), 0)

/* ---- Atomics: the memory order is part of the name (as mimalloc). ------- */
#define pp_load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
#define pp_load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define pp_store_relaxed(p, v)                                                 \
  atomic_store_explicit((p), (v), memory_order_relaxed)
#define pp_store_release(p, v)                                                 \
  atomic_store_explicit((p), (v), memory_order_release)
#define pp_fetch_add_relaxed(p, v)                                             \
  atomic_fetch_add_explicit((p), (v), memory_order_relaxed)
#define pp_fetch_sub_relaxed(p, v)                                             \
  atomic_fetch_sub_explicit((p), (v), memory_order_relaxed)
#define pp_xchg_acq_rel(p, v)                                                  \
  atomic_exchange_explicit((p), (v), memory_order_acq_rel)
#define pp_cas_acq_rel(p, expected, desired)                                   \
  atomic_compare_exchange_strong_explicit(                                     \
      (p), (expected), (desired), memory_order_acq_rel, memory_order_acquire)
/* A counter with a single writer (its owning thread) and any number of
 * readers: a load and a store, no read-modify-write. Readers see a value
 * that some moment had; nobody else ever writes, so no update is lost. */
#ifdef PINPOOL_MUTANT_COUNTER_PLAIN
/* Race mutant (docs/verification.md): the counters as plain fields, read
 * by pinpool_get_stats on another thread. */
#define pp_owner_add(p, v) ((void)(*(uint64_t *)(p) += (v)))
#else
#define pp_owner_add(p, v) pp_store_relaxed((p), pp_load_relaxed(p) + (v))
#endif

typedef _Atomic(uint64_t) pp_counter_t;

/* Saturating arithmetic for sums and products of configured sizes, which
 * may be anything up to 2^64 - 1 (a wrapped cap trimmed every segment). */
static inline uint64_t pp_sat_add(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}
static inline uint64_t pp_sat_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}
void pp_atomic_max_relaxed(pp_counter_t *p, uint64_t v);

/* ---- Locks ---------------------------------------------------------------
 * A pthread mutex that, in debug builds, records its owner so that every
 * "caller holds lock X" precondition can be asserted (as SQLite does). */
typedef struct pp_mutex {
  pthread_mutex_t m;
  /* The lock's meter (issue 38; docs/verification.md, "Issue 38, the
   * locks' meter"): elements visited in the current hold (pp_lock_visit)
   * and the most in one hold since the last pp_lock_meter reset; and the
   * total over all holds (pp_lock_meter_total), which catches a walk
   * proportional to the pool that is done in bounded pieces. Written
   * only under the lock. In every build, so that the counting tests run in
   * every variant; a path that visits nothing pays one load and a
   * predicted branch at unlock. */
  uint64_t visits, visits_max, visits_total;
#if PINPOOL_DEBUG >= 1
  _Atomic(unsigned long) owner;
#endif
} pp_mutex_t;
void pp_mutex_init(pp_mutex_t *m);
void pp_mutex_destroy(pp_mutex_t *m);
/* Inline: a slow path takes several of these per block. */
static inline void pp_mutex_lock(pp_mutex_t *m) {
  (void)pthread_mutex_lock(&m->m);
#if PINPOOL_DEBUG >= 1
  pp_store_relaxed(&m->owner, (unsigned long)pthread_self());
#endif
}
static inline bool pp_mutex_trylock(pp_mutex_t *m) {
  if (pthread_mutex_trylock(&m->m) != 0)
    return false;
#if PINPOOL_DEBUG >= 1
  pp_store_relaxed(&m->owner, (unsigned long)pthread_self());
#endif
  return true;
}
static inline void pp_mutex_unlock(pp_mutex_t *m) {
#if PINPOOL_DEBUG >= 1
  pp_store_relaxed(&m->owner, 0);
#endif
  if (__builtin_expect(m->visits != 0, 0))
    m->visits = 0; /* the hold ends: its count went to visits_max */
  (void)pthread_mutex_unlock(&m->m);
}
/* The meter: a hold of m visited n more elements (entries, streams,
 * threads, bins, lends, table slots: whatever the path walks, one per
 * element, so that a walk proportional to the pool shows as a count
 * proportional to it). Caller holds m. A loop counts into a local and
 * calls this once after it. tests/test_scale_locks.c reads the maxima. */
static inline void pp_lock_visit(pp_mutex_t *m, uint64_t n) {
  m->visits += n;
  m->visits_total += n;
  if (m->visits > m->visits_max)
    m->visits_max = m->visits;
}
/* The most elements one hold of m visited since the last reset (taken
 * under m; reset: start again from 0). For tests and benchmarks. */
static inline uint64_t pp_lock_meter(pp_mutex_t *m, bool reset) {
  (void)pthread_mutex_lock(&m->m);
  uint64_t v = m->visits_max;
  if (reset)
    m->visits_max = 0;
  (void)pthread_mutex_unlock(&m->m);
  return v;
}
/* Every element any hold of m visited since the last reset: a per-call
 * cost, where pp_lock_meter is a per-hold one. */
static inline uint64_t pp_lock_meter_total(pp_mutex_t *m, bool reset) {
  (void)pthread_mutex_lock(&m->m);
  uint64_t v = m->visits_total;
  if (reset)
    m->visits_total = 0;
  (void)pthread_mutex_unlock(&m->m);
  return v;
}
#if PINPOOL_DEBUG >= 1
bool pp_mutex_held(pp_mutex_t *m);
#define pp_assert_held(m) pp_assert(pp_mutex_held(m))
#else
#define pp_assert_held(m) ((void)0)
#endif

/* ---- Test hooks (testhook.c) -------------------------------------------
 * Named points on slow paths where a test can stop a thread to force one
 * interleaving deterministically (docs/verification.md: a race is proven
 * fixed by a test that replays it, not by a lucky stress run). NULL outside
 * tests: one acquire load per point, and no point is on a hot path. Tests
 * reach pp_test_hook through the static library (hidden in the shared one). */
enum {
  PP_HOOK_HIST_CLAIMED = 1, /* emit: slot claimed, before any field */
  PP_HOOK_HIST_FIELDS,      /* emit: half of the fields written */
  PP_HOOK_HIST_PUBLISH,     /* emit: every field written, not yet published */
  PP_HOOK_SNAP_HISTORY,     /* snapshot: ring bounds read, entries not yet */
  PP_HOOK_EVENT_DONE,       /* last event of a block done, block not cached */
  PP_HOOK_RESET_PEAK,       /* reset_peak_stats: a peak read, not yet set */
  PP_HOOK_ATTR_BUSY,        /* buffer_attrs: computing, others must wait */
  PP_HOOK_FREE_COUNTED,     /* stream free: pending_live counted, no event
                               queued yet */
  PP_HOOK_ARENA_LAP,        /* arena take: a lap after a miss, lock not
                               yet taken */
  PP_HOOK_HUGE_ADVISED,     /* host map: MADV_HUGEPAGE applied to a new
                               segment, none of its pages touched yet */
  PP_HOOK_POPULATE,         /* host map: populating (or mlock-populating)
                               a new segment starts, caller's thread */
  PP_HOOK_POPULATE_JOB,     /* host map: one share of that population
                               starts, on the thread that runs it */
  PP_HOOK_SNAP_SEGMENTS,    /* snapshot: stats read, segments and chunks
                               not yet copied */
  PP_HOOK_SNAP_PIECE,       /* snapshot: between two holds of its copy of
                               the segments and the arena (no lock) */
  /* The lock drops of the growth and release paths (arena.c, pool.c,
   * alloc.c); tests/test_arena.c runs a release, a trim and an
   * out-of-memory retry in each. */
  PP_HOOK_ARENA_GROW,    /* arena take: the backend made the new chunk,
                            not yet in the arena (no lock) */
  PP_HOOK_SEG_CARVED,    /* segment creation: the arena grew and carved
                            the piece, segment not yet published */
  PP_HOOK_OOM_RETRY,     /* allocation: max_reserved reached, idle memory
                            released, the retry's take not yet made */
  PP_HOOK_RETRY_SETTLE,  /* allocation: max_reserved reached, about to
                            wait for the chunks whose claim is in flight
                            (arena.c, "The out-of-memory retry"; no lock) */
  PP_HOOK_POLL_WAIT,     /* full event poll: about to wait for another
                            thread's query of a queue's head (stream.c,
                            process; no lock) */
  PP_HOOK_GROW_SHED,     /* grower: a whole free chunk out of the arena,
                            beyond auto's target, not yet given back (no
                            lock) */
  PP_HOOK_ARENA_RELEASE, /* release: a whole free chunk out of the arena,
                            not yet given to the backend */
  PP_HOOK_IDLE_DETACHED, /* release, trim: idle segments detached from
                            their bins or hot slots, not yet given to the
                            arena */
  PP_HOOK_SHARE_IO,      /* pinpool_share_send/recv: the table of kept
                            part-messages locked (share_worker.c) */
  PP_HOOK_GROW_AHEAD,    /* grower: the backend made a chunk ahead of
                            demand, not yet in the arena (no lock) */
  PP_HOOK_GROW_JOIN,     /* arena take: a miss joined a growth in flight
                            and is about to wait for it (no lock) */
  PP_HOOK_WALK_PIECE,    /* a walk in bounded holds, between two of them
                            (arena.c gather_locked, pool.c pp_defer_drain,
                            release_batch, trim_yield; no lock) */
  PP_HOOK_RETRY_PLANNED, /* allocation: max_reserved reached, the retry's
                            plan made (what to release, under seg_lock),
                            nothing released yet (alloc.c; no lock) */
  PP_HOOK_GROW_CALL,     /* arena take: a growth registered in flight
                            (others may join it), its backend call not
                            yet made, nor its bytes claimed (no lock) */
  PP_HOOK_SNAP_TABLE,    /* snapshot: between two holds of its copy of the
                            lends or the stack table (no lock) */
  PP_HOOK_VALIDATE_HOLD, /* validate: about to wait for the background
                            thread's pass to end (stream.c, no lock) */
  PP_HOOK_RECLAIM_PIECE, /* lend reclaim: between two holds of its walk
                            of the lends (share.c, no lock) */
  PP_HOOK_MISS_COUNTED,  /* allocation: its miss counted, the allocation
                            itself not yet (alloc.c, count_slow; no lock) */
  PP_HOOK_STATS_PIECE,   /* stats sum: between two holds of reg_lock in
                            its walk of the thread caches (stats.c, no
                            lock) */
  PP_HOOK_SHARE_CLOSER,  /* a closer thread: a peer's descriptor taken off
                            the queue, not closed yet (share_worker.c, no
                            lock) */
  PP_HOOK_REAP,          /* reaper: started, no pool taken off its list
                            yet (lifecycle.c; no lock) */
  PP_HOOK_MOVE_RESERVED, /* page move: donors taken out of the free
                            extents, the target's address not yet reserved
                            (arena.c, "Page moves"; no lock) */
  PP_HOOK_MOVE_STEP,     /* page move: before each donor's mremap (no
                            lock) */
  PP_HOOK_SYNC_CUT,      /* synchronize: its cohort cut, no pass yet
                            (stream.c; no lock) */
};
typedef void (*pp_test_hook_fn)(int point);
extern _Atomic(pp_test_hook_fn) pp_test_hook;
static inline void pp_hook(int point) {
  pp_test_hook_fn f = atomic_load_explicit(&pp_test_hook, memory_order_acquire);
  if (pp_unlikely(f != NULL))
    f(point);
}

/* ---- Callouts: user code run from inside pinpool ------------------------
 * One thread-local record (issue 37, fourth review): how deep this thread
 * is in code pinpool calls out to (a backend's alloc and free, an event
 * provider's record, query, synchronize, release and destroy, the error
 * callback), or in a max_reserved claim of its own (arena.c: the span
 * from a chunk's claim to its backend call's end). Raised around every
 * such call, on every path; a callout nests (a backend free that allocates
 * from a pool whose backend alloc runs).
 *
 * The rule it enforces: from inside a callout, pinpool never waits for
 * another thread. Each wait the library adds for another thread (a miss
 * joining a growth in flight, the out-of-memory retry's wait for claims, a
 * full poll's wait for a querier, validate's hold on the background
 * thread, synchronize's sleep for progress, the thread record's
 * pp_global_lock inside a busy section) is skipped there, or fails with
 * PINPOOL_EBUSY where skipping would break what the call promises
 * (docs/api.md, "Calling pinpool from a callback"). The thread that waits
 * could be the one the callout's caller must come back to, or one that
 * waits for that caller (the cycles of rev37d's v1-v5). */
enum {
  PP_CO_NONE = 0,
  PP_CO_BACKEND_ALLOC,
  PP_CO_BACKEND_FREE,
  PP_CO_EV_RECORD,
  PP_CO_EV_QUERY,
  PP_CO_EV_SYNC,
  PP_CO_EV_RELEASE,
  PP_CO_EV_DESTROY,
  PP_CO_ON_ERROR,
  PP_CO_CLAIM, /* no user code: this thread holds a reservation claim */
};
typedef struct pp_callout {
  unsigned depth; /* nested callouts */
  unsigned kind;  /* the innermost's PP_CO_* */
  int cancel;     /* the cancel state the outermost callout found */
} pp_callout_t;
extern _Thread_local pp_callout_t pp_callout PP_TLS_MODEL;

/* Thread cancellation (docs/api.md, "Thread cancellation"): nothing
 * pinpool waits on, nor any callout, is a cancellation point. A thread
 * cancelled in a wait (sem_wait, pthread_cond_wait) or in user code that
 * pinpool called left its records linked in the pool (a growth's waiter on
 * its dead stack, a claim), its busy section open (every later fork hung)
 * or, from pthread_cond_wait, the wait's mutex held for good. With
 * cancellation disabled there, a request made meanwhile acts at the
 * thread's first cancellation point after the call (issue 37, s39;
 * tests/test_waits37.c cancel_*). */
static inline int pp_nocancel_enter(void) {
  int old = PTHREAD_CANCEL_DISABLE;
#ifndef PINPOOL_MUTANT_CANCEL_POINTS
  (void)pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
#else
  /* Logic mutant (docs/verification.md): the waits and the callouts are
   * cancellation points again; test_waits37's cancel_* must fail. */
#endif
  return old;
}
static inline void pp_nocancel_leave(int old) {
  int was;
  if (old != PTHREAD_CANCEL_DISABLE)
    (void)pthread_setcancelstate(old, &was);
}

/* Returns the enclosing kind, for pp_callout_leave. */
static inline unsigned pp_callout_enter(unsigned kind) {
  unsigned prev = pp_callout.kind;
  if (pp_callout.depth++ == 0)
    pp_callout.cancel = pp_nocancel_enter();
  pp_callout.kind = kind;
  return prev;
}
static inline void pp_callout_leave(unsigned prev) {
  pp_callout.kind = prev;
  if (--pp_callout.depth == 0)
    pp_nocancel_leave(pp_callout.cancel);
}
static inline bool pp_in_callout(void) { return pp_callout.depth != 0; }
/* "a backend free callback" and the like: the innermost callout. */
const char *pp_callout_name(void);
/* PINPOOL_EBUSY, with a message naming `what` and the callout. */
int pp_callout_refuse(const char *what);

/* ---- Errors (error.c) ----------------------------------------------------
 * pp_fail records a message for pinpool_last_error() and returns `code`. */
/* The calling thread's last-error message, saved and put back: a failure
 * that pinpool recovers from internally leaves no trace (arena.c). */
void pp_error_save(char *buf, size_t len);
void pp_error_restore(const char *buf);
int pp_fail(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
uint64_t pp_now_ns(void);

/* ---- Size classes (sizeclass.c) ----------------------------------------- */
#define PP_MIN_BLOCK 512u
#define PP_MAX_REQUEST ((size_t)1 << 60)
#define PP_NCLASSES 409 /* 512 .. 2^60, eight classes per doubling */
#define PP_SLAB_SIZE ((size_t)2 << 20)
#define PP_SLAB_MAX_BLOCK ((size_t)256 << 10) /* larger: own segment */
#define PP_SLAB_MAX_BLOCKS (PP_SLAB_SIZE / PP_MIN_BLOCK)
#define PP_PAGE 4096u
/* Inline: both run on every allocation and free. */
static inline unsigned pp_class_index(size_t size) {
  if (size <= PP_MIN_BLOCK)
    return 0;
  /* x in [2^e, 2^(e+1)); m = top four bits of x, in 8..15. The class is
   * (m + 1) << (e - 3): the smallest class >= size. */
  size_t x = size - 1;
  unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)x);
  unsigned m = (unsigned)(x >> (e - 3));
  return (e - 9) * 8 + (m - 8) + 1;
}
static inline size_t pp_class_size(unsigned idx) {
  unsigned e = 9 + idx / 8, k = idx % 8;
  return ((size_t)1 << e) + (size_t)k * ((size_t)1 << (e - 3));
}

#endif /* PP_BASE_H */
