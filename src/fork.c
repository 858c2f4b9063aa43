/*
 * Fork: a process that forks while other threads use pinpool gets a child
 * whose pools work (DESIGN.md, invariant 9; docs/api.md, "Fork").
 *
 * As jemalloc and mimalloc do, the pthread_atfork handlers take every lock
 * before the fork and release them after it, in the parent and in the
 * child; the child then repairs what did not survive:
 *  - prepare: tcache.c's pp_global_lock and its wait for every busy
 *    section to end (internal.h, "Fork": no thread cache is half updated,
 *    no block is between two lists), then the registry lock (no pool is
 *    created or torn down; taken after the wait, so that a backend
 *    callback inside a section may create a pool), then each pool's locks
 *    in the order of pool.c's
 *    comment (reg_lock -> seg_lock -> trim_lock -> bins -> idle_lock ->
 *    reserve), then the leaf locks, which are never held while another
 *    lock is taken (the stripe, stream and queue locks, the background
 *    thread's mutex, history's locks, the event provider's own);
 *  - parent: all released, in reverse;
 *  - child: all released; the condition variables made anew (their
 *    waiters are gone, and glibc's destroy would wait for them); the
 *    background and simulated-stream threads marked gone and restarted
 *    lazily (stream.c, events_sim.c); the caches of threads that did not
 *    survive retired as if they had exited (tcache.c); a pool that uses
 *    CUDA cut off from the driver (every call: PINPOOL_EFORKED).
 *
 * No pinpool call may be made from a pthread_atfork handler, a signal
 * handler, or a pinpool callback that forks (docs/api.md).
 */
#include "internal.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

static pp_mutex_t pools_lock = {.m = PTHREAD_MUTEX_INITIALIZER};
static pinpool_t *pools; /* live pools, newest first; pools_lock */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static bool membarrier_ok; /* written once, in atfork_init */

static void fork_prepare(void);
static void fork_parent(void);
static void fork_child(void);

static void atfork_init(void) {
  /* Registered before the first pool exists; a process that never makes
   * a pool pays nothing at fork. */
  membarrier_ok = syscall(SYS_membarrier,
                          MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
#ifndef PINPOOL_MUTANT_NO_ATFORK
  (void)pthread_atfork(fork_prepare, fork_parent, fork_child);
#else
  /* Mutant (docs/verification.md): no handlers at all. */
  (void)fork_prepare;
  (void)fork_parent;
  (void)fork_child;
#endif
}

void pp_fork_barrier(void) {
  if (membarrier_ok &&
      syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
    return;
  /* Without the expedited command: the global one (a grace period,
   * milliseconds; only at fork). */
  if (syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0)
    return;
  atomic_thread_fence(memory_order_seq_cst); /* best effort */
}

void pp_fork_register(pinpool_t *pool) {
  (void)pthread_once(&atfork_once, atfork_init);
  pp_mutex_lock(&pools_lock);
  pool->reg_prev = NULL;
  pool->reg_next = pools;
  if (pools != NULL)
    pools->reg_prev = pool;
  pools = pool;
  pp_mutex_unlock(&pools_lock);
}

void pp_fork_unregister(pinpool_t *pool) {
  pp_mutex_lock(&pools_lock);
  if (pool->reg_prev != NULL)
    pool->reg_prev->reg_next = pool->reg_next;
  else
    pools = pool->reg_next;
  if (pool->reg_next != NULL)
    pool->reg_next->reg_prev = pool->reg_prev;
  pp_mutex_unlock(&pools_lock);
}

static void pool_lock_all(pinpool_t *pool) {
  pp_mutex_lock(&pool->reg_lock);
  pp_mutex_lock(&pool->seg_lock);
  pp_mutex_lock(&pool->trim_lock);
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  for (size_t i = 0; i < nbins; i++)
    pp_mutex_lock(&pool->bins[i].lock);
  pp_mutex_lock(&pool->idle_lock);
  /* Leaves. */
  pp_streams_fork(pool, PP_FORK_PREPARE);
  pp_hist_fork_lock(pool);
  if (pool->share != NULL)
    pp_share_fork(pool->share, PP_FORK_PREPARE);
  if (pool->has_events && pool->ev.atfork != NULL)
    pool->ev.atfork(pool->ev.ctx, PP_FORK_PREPARE);
}

static void pool_unlock_all(pinpool_t *pool, int phase) {
  if (pool->has_events && pool->ev.atfork != NULL)
    pool->ev.atfork(pool->ev.ctx, phase);
  if (pool->share != NULL)
    pp_share_fork(pool->share, phase);
  pp_hist_fork_unlock(pool);
  pp_streams_fork(pool, phase);
  pp_mutex_unlock(&pool->idle_lock);
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  for (size_t i = nbins; i-- > 0;)
    pp_mutex_unlock(&pool->bins[i].lock);
  pp_mutex_unlock(&pool->trim_lock);
  pp_mutex_unlock(&pool->seg_lock);
  /* A stats sum in progress on another thread does not go on in the
   * child: its record (on that thread's stack) is forgotten. */
  if (phase == PP_FORK_CHILD)
    pool->rs.walks = NULL;
  pp_mutex_unlock(&pool->reg_lock);
}

static void fork_prepare(void) {
  pp_tcache_fork_prepare();
  pp_reap_fork(PP_FORK_PREPARE); /* lifecycle.c: before the registry */
  pp_mutex_lock(&pools_lock);
  for (pinpool_t *p = pools; p != NULL; p = p->reg_next)
    pool_lock_all(p);
  pp_share_worker_fork(PP_FORK_PREPARE); /* a leaf */
}

static void fork_parent(void) {
  pp_share_worker_fork(PP_FORK_PARENT);
  /* Any order: nothing else runs until pools_lock goes. */
  for (pinpool_t *p = pools; p != NULL; p = p->reg_next)
    pool_unlock_all(p, PP_FORK_PARENT);
  pp_mutex_unlock(&pools_lock);
  pp_reap_fork(PP_FORK_PARENT);
  pp_tcache_fork_parent();
}

/* ---- CUDA (and shared pools) in the child ------------------------------
 * The driver's state does not survive fork (CUDA's documentation: a child
 * must not use a context of its parent), and the driver marks pinned
 * memory MADV_DONTFORK, so the child may not even have the pages. The
 * pool's provider and events are replaced by these: nothing is handed
 * out, nothing is given back to the driver, and destroy frees only the
 * pool's own metadata. */
static int forked_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  (void)ctx;
  (void)out;
  (void)flags;
  return pp_fail(
      PINPOOL_EFORKED,
      "a CUDA or shared pool in a child of fork: cannot allocate %zu bytes",
      size);
}
static int forked_alloc_node(void *ctx, void *hint, size_t size, int node,
                             void **out, unsigned *flags) {
  (void)hint;
  (void)node;
  return forked_alloc(ctx, size, out, flags);
}
static void forked_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)ptr;
  (void)size;
}
static int forked_record(void *ctx, pinpool_stream_t s, void **event) {
  (void)ctx;
  (void)s;
  (void)event;
  return pp_fail(PINPOOL_EFORKED, "a CUDA or shared pool in a child of fork");
}
static int forked_query(void *ctx, void *event) {
  (void)ctx;
  (void)event;
  return pp_fail(PINPOOL_EFORKED, "a CUDA or shared pool in a child of fork");
}
static void forked_release(void *ctx, void *event) {
  (void)ctx;
  (void)event;
}

static _Atomic(uint64_t) child_ids = (uint64_t)1 << 62;

static void cut_off_cuda(pinpool_t *pool) {
  pool->forked_cuda = true;
  /* A fresh id: no thread cache way (pp_tls) of the forking thread
   * matches, so every call reaches a general path that refuses. */
  pool->id = pp_fetch_add_relaxed(&child_ids, 1);
  pool->prov = (pp_provider_t){pool->prov.name,  NULL, forked_alloc,
                               forked_free,      NULL, NULL,
                               forked_alloc_node};
  if (pool->has_events)
    pool->ev = (pp_events_t){pool->ev.name, NULL,         forked_record,
                             forked_query,  forked_query, forked_release,
                             NULL,          NULL,         NULL};
  pool->cuda = NULL; /* the driver's handle is the parent's */
}

/* In the child only the forking thread lives. Every record of work in
 * progress that lives on another thread's stack, or names another thread,
 * is that thread's, and nothing in the child will ever finish or
 * unregister it: each is reset here, with the pool's locks still held
 * (issue 38, fourth review: a snapshot's cursor, left on the dead
 * snapshot thread's stack, was written through by every segment release
 * in the child once a new thread reused that stack; SIGSEGV).
 * test_fork's copy_pieces forks in each copy-in-pieces window below and
 * checks the child.
 *  Copies in pieces, the pool's lock dropped between pieces:
 *  - the segments' copy (snapshot.c, copy_segments): its pp_snap_cursor_t
 *    on the snapshot thread's stack, on pool->snap_cursors, which every
 *    segment release moves on (pool.c): reset here;
 *  - the arena's chunks and free extents (extent.c, pp_ext_copy_some): a
 *    cursor of addresses and sizes on the snapshot's heap, which nothing
 *    in the pool points at: nothing to reset (its memory is lost);
 *  - the lends' copy (share.c, pp_share_lends_copy): s->copying and
 *    copy_next, under copy_lock held across the pieces: reset, the lock
 *    made anew, by pp_share_fork;
 *  - the stack table's copy (history.c, pp_stacks_copy) and the history
 *    ring's (snapshot.c, copy_history): indices in the copier's frame,
 *    the table only appends: nothing registered;
 *  - a lend reclaim's walk (share.c, reclaim): a local index, "no shared
 *    cursor": nothing registered;
 *  - the trims and releases in pieces of trim_lock (pool.c, trim_yield)
 *    and the deferred stack's drain (pp_defer_drain): what a piece
 *    detached is in the releaser's local batch, in no list: nothing
 *    registered (those segments stay out of every list in the child).
 *  Other records that name a thread, reset by the handlers they name:
 *  - the background thread, a validator's hold and a pass in progress
 *    (bg_running, bg_held, bg_in_pass), synchronize's waiters, the event
 *    queues' pollers (squeue polling, wanted): pp_streams_fork;
 *  - a growth in flight (grow.inflight) and the grower's mutex:
 *    pp_grow_fork_child; the out-of-memory retry's list of claims in
 *    flight (the forking thread's own kept): pp_arena_fork_child;
 *  - the thread caches of threads that did not survive, busy sections and
 *    the cached thread id: pp_tcache_fork_child;
 *  - the simulated streams' thread: events_sim.c's atfork. */
static void fork_child(void) {
  pp_share_worker_fork(PP_FORK_CHILD);
  for (pinpool_t *p = pools; p != NULL; p = p->reg_next) {
#ifndef PINPOOL_MUTANT_FORK_SNAP_CURSORS
    /* Mutant (docs/verification.md): the cursors kept; test_fork's
     * copy_pieces must fail. seg_lock is held (fork_prepare). */
    p->snap_cursors = NULL;
#endif
    pool_unlock_all(p, PP_FORK_CHILD);
    /* A shared pool's chunks are MAP_SHARED: a block the child handed out
     * would be memory the parent uses. The child may attach lent blocks
     * with the descriptors it inherited (docs/sharing.md) instead. */
    if (p->cuda != NULL || p->share != NULL)
      cut_off_cuda(p);
  }
  pp_mutex_unlock(&pools_lock);
  pp_tcache_fork_child();      /* releases pp_global_lock */
  pp_reap_fork(PP_FORK_CHILD); /* may start the child's reaper: last */
}
