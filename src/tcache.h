/*
 * Thread caches (tcache.c) and the fork handshake that their lock-free
 * changes take part in (fork.c). Included by internal.h, after the
 * segments whose blocks the caches hold.
 */
#ifndef PP_TCACHE_H
#define PP_TCACHE_H

#include "base.h"

typedef struct pp_segment pp_segment_t;
struct pinpool;

/* ---- Thread caches (tcache.c) ------------------------------------------ */
/* A cached block. bs: its size (a large block's is its page-rounded
 * request, not its class's), so that the hit path can match a large
 * request to the exact block without reading the descriptor. */
typedef struct pp_tentry {
  void *ptr;
  pp_segment_t *seg;
  size_t bs;
  uint32_t idx;
} pp_tentry_t;

/* pinpool_free's hint: one incarnation of a segment, copied when it was
 * live (gen is its generation then; size 0: no hint). */
typedef struct pp_fhint {
  pp_segment_t *seg;
  uintptr_t base;
  size_t size, bs;
  uint64_t magic, gen;
  uint32_t nblocks;
} pp_fhint_t;

typedef struct pp_tbin {
  uint32_t n, cap, batch;
  /* A class above tcache_bytes (a stack of one block): a free keeps its
   * block only in a cache that is within its budget (alloc.c, "Oversize
   * stacks"). */
  bool over;
  size_t bs; /* the class size, so the hot path need not recompute it */
  pp_tentry_t *items; /* allocated on first use */
  /* Oversize stacks: the free that cached the block, for the peak
   * sample's pairing (alloc.c, alloc_over_paired). */
  size_t over_req;
  uint64_t over_epoch;
} pp_tbin_t;

/* Counters of one thread for one pool: written only by the owning thread
 * (pp_owner_add), read by pinpool_get_stats under pool->reg_lock. Only
 * pp_counter_t fields: stats.c sums the struct as an array. */
typedef struct pp_tcounters {
  pp_counter_t n_alloc, n_free;
  pp_counter_t req_alloc, req_free;
  pp_counter_t blk_alloc, blk_free;
  pp_counter_t slow_allocs; /* allocations that left the thread cache */
  /* Bytes this thread put into / took out of hot slots (pool.c): central
   * idle bytes like gs.central_in/out, counted here so that the pair of a
   * class without thread caches has no shared read-modify-write. */
  pp_counter_t slot_in, slot_out;
  /* Stream-ordered frees (stream.c): a pending block is counted in by the
   * thread that frees it and out by the one that reclaims it, so one
   * thread's count may wrap below zero; the sum over threads (and the
   * pool's own counters, for threads without a cache) is exact. Here, not
   * in the pool, because two threads each freeing and reclaiming blocks
   * made these pool-wide read-modify-writes a cache line both wrote every
   * operation (W4, docs/benchmarks.md). */
  pp_counter_t pend_bytes, pend_blocks;
  pp_counter_t rc_count, rc_total; /* reclaim latency; its max: the pool's */
} pp_tcounters_t;

typedef struct pp_thread pp_thread_t;
typedef struct pp_tcache {
  struct pinpool *pool;
  pp_thread_t *thread;
  unsigned shard; /* of its node's shards: 0 .. shards - 1 */
  /* numa=local: the node every block in this cache is from (the thread's
   * node when it last checked; alloc.c, "NUMA"). 0 otherwise. Owner only. */
  unsigned node;
  uint64_t epoch;          /* pool->flush_epoch seen last; owner only */
  pp_fhint_t hint;         /* segment of the last free (alloc.c); owner only */
  uint64_t unsampled;      /* bytes taken from the bins since this thread last
                              sampled the peaks (alloc.c); owner only */
  _Atomic(uint64_t) bytes; /* cached bytes held; owner writes */
  /* Bytes this cache may hold: tcache_bytes / 64 .. tcache_bytes (tcache.c,
   * "adaptive budget"); n_alloc and n_free at the last shrink. Owner only. */
  uint64_t budget, shrink_allocs, shrink_frees;
  pp_tcounters_t c;
  /* pool->reg_lock: pool's list of caches (newest first: seq falls along
   * it, stats.c). pp_global_lock: thread's list. */
  struct pp_tcache *pool_prev, *pool_next;
  uint64_t seq;
  struct pp_tcache *thr_next;
  /* Classes whose stack exists, largest first (owner only): what a shrink
   * or a flush walks instead of every class. */
  uint16_t used[PP_NCLASSES];
  unsigned nused;
  pp_tbin_t bins[PP_NCLASSES];
  /* tcache_bytes=0: c and bytes as this thread last added them to the
   * pool's totals (stats.c, pp_stats_publish). Owner only; last, off the
   * hit path's lines. */
  pp_tcounters_t pub;
  uint64_t pub_bytes;
} pp_tcache_t;

/* NULL: *err is the failure's code, its message recorded (out of memory,
 * or PINPOOL_EBUSY: inside a busy section while a fork waits for it). */
pp_tcache_t *pp_tcache_get_slow(struct pinpool *pool, int *err);
/* The adaptive budget doubles, up to tcache_bytes tb (tcache.c). */
static inline void pp_tcache_budget_up(pp_tcache_t *tc, uint64_t tb) {
  tc->budget = tc->budget <= tb / 2 ? tc->budget * 2 : tb; /* no wrap */
}
/* The calling thread's state, reachable in one TLS access.
 *
 * Thread caches: way[id % PP_TLS_WAYS] holds the (pool id, cache) pair of
 * the pool used last among those whose id falls there (direct-mapped: one
 * TLS compare on the hot path, whichever pool); victim[] the pairs evicted
 * from the ways, searched on a miss and swapped back (tcache.c). A thread
 * that alternates between up to PP_TLS_WAYS pools of consecutive ids (or
 * any PP_TLS_VICTIMS + 1 pools) never takes the process-wide lock. Pool
 * ids are never reused, so a stale entry for a destroyed pool can never
 * match a live one (its tc is never read).
 *
 * busy: how deep the thread is in sections the fork handler waits for
 * (pp_busy_enter, fork.c): written by the owner, read by a forking thread.
 * thr: the thread's record (tcache.c), NULL before its first cache. */
#define PP_TLS_WAYS 8
#define PP_TLS_VICTIMS 8
typedef struct pp_tls_way {
  uint64_t pool_id;
  pp_tcache_t *tc;
} pp_tls_way_t;
typedef struct pp_tls {
  pp_tls_way_t way[PP_TLS_WAYS];
  _Atomic(unsigned) busy;
  /* A thread a pool owns (internal.h, pp_pool_thread): set once at its
   * start, read by its own calls only. Beside busy so that the entry
   * points' nested check (alloc.c nested_call) reads one line. */
  bool pool_thread;
  unsigned victim_next; /* the victim slot the next eviction takes */
  pp_thread_t *thr;
  /* Pools whose last reference went inside a busy section: torn down
   * when the outermost section ends (lifecycle.c, pp_pool_unref). */
  struct pinpool *deferred;
  pp_tls_way_t victim[PP_TLS_VICTIMS];
} pp_tls_t;
extern _Thread_local pp_tls_t pp_tls PP_TLS_MODEL;
/* The way of pool id `id` in this thread's pp_tls. */
static inline pp_tls_way_t *pp_tls_way(uint64_t id) {
  return &pp_tls.way[id & (PP_TLS_WAYS - 1)];
}
/* ---- Fork (fork.c, tcache.c) ---------------------------------------------
 * A pinpool operation that changes a thread cache or moves a block between
 * lists without a pool lock (the hot paths, a cache flush, a reclaimed
 * event) runs inside a busy section; a fork waits until no thread is inside
 * one, then takes every lock, so the child inherits no half-done
 * operation (DESIGN.md, invariant 9). The handshake is an asymmetric
 * Dekker: the thread stores busy, then loads pp_fork_gate with only a
 * compiler barrier between; the forking thread stores the gate, runs
 * membarrier(2) (a full barrier on every CPU running this process), then
 * reads every thread's busy. Either the thread sees the gate (and waits
 * for the fork outside the section) or the forker sees busy (and waits for
 * the section to end). The hot paths pay two TLS stores and one load. */
extern _Atomic(unsigned) pp_fork_gate;
void pp_busy_wait_fork(void); /* tcache.c: leave, wait for the fork, enter */
/* Enter a busy section. The thread has a record (pp_tls.thr): the forking
 * thread finds busy through it. */
static inline void pp_busy_enter(void) {
  unsigned d = pp_load_relaxed(&pp_tls.busy);
  pp_store_relaxed(&pp_tls.busy, d + 1);
  atomic_signal_fence(memory_order_seq_cst); /* the store, then the load */
  /* Nested (a callback inside a section): the forker already waits for
   * the outer one. */
  if (pp_unlikely(pp_load_relaxed(&pp_fork_gate) != 0) && d == 0)
    pp_busy_wait_fork();
}
void pp_run_deferred(void); /* lifecycle.c: the deferred teardowns */
/* Release: everything the section wrote is seen by the forker that reads
 * busy == 0 (acquire), so the child sees it too. The outermost section's
 * end runs the teardowns deferred inside it. */
static inline void pp_busy_leave(void) {
  unsigned d = pp_load_relaxed(&pp_tls.busy) - 1;
  pp_store_release(&pp_tls.busy, d);
  if (pp_unlikely(d == 0 && pp_tls.deferred != NULL))
    pp_run_deferred();
}
/* The calling thread's record, created if needed (NULL: out of memory,
 * or refused inside a busy section while a fork waits for it: tcache.c,
 * global_lock_busy). Takes pp_global_lock. */
pp_thread_t *pp_thread_get(void);
/* tcache.c's part of the fork handlers: the global lock, the busy wait;
 * in the child, the caches of the threads that did not survive. */
void pp_tcache_fork_prepare(void);
void pp_tcache_fork_parent(void);
void pp_tcache_fork_child(void);
/* fork.c: the registry of live pools that the handlers walk. */
void pp_fork_register(struct pinpool *pool);
void pp_fork_unregister(struct pinpool *pool);
void pp_fork_barrier(void); /* a full barrier on every thread (membarrier) */
/* history.c: its locks, and the cached thread id, for the fork handlers. */
void pp_hist_fork_lock(struct pinpool *pool);
void pp_hist_fork_unlock(struct pinpool *pool);
void pp_thread_id_reset(void);
/* Test hook (tests/test_fork.c): called by an exiting thread while it
 * holds pp_global_lock. NULL outside that test. */
extern void (*pp_test_exit_locked_hook)(void);
/* Test hook (tests/test_tcache.c): called by a thread retiring its cache
 * of a pool (exit, a child of fork) just after the cache left the pool's
 * list, reg_lock released. NULL outside that test. */
extern void (*pp_test_detached_hook)(void);

void pp_tcache_flush_bin(pp_tcache_t *tc, unsigned cls, uint32_t keep);
void pp_tcache_flush_all(pp_tcache_t *tc);
void pp_tcache_shrink(pp_tcache_t *tc);
/* Give back the blocks of oversize stacks (alloc.c): before a take from the
 * central layer, which may carve from their space or grow the arena. */
void pp_tcache_flush_over(pp_tcache_t *tc);
/* Every block the calling thread caches for `pool` back to the central
 * layer (pp_arena_take, before it grows: large blocks may coalesce into
 * room, small ones may leave their slabs idle); returns the blocks given.
 * Never while the caller is inside a change of one of its stacks: alloc.c
 * takes large blocks one at a time, outside the stack, and refills a
 * small stack only when it is empty. */
unsigned pp_tcache_give_own(struct pinpool *pool);
void pp_tcache_pool_destroy(struct pinpool *pool);

#endif /* PP_TCACHE_H */
