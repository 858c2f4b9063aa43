/*
 * Per-thread caches: the lock-free front of the pool.
 *
 * Ownership: a thread cache (pp_tcache_t) is read and written only by the
 * thread that owns it, with two exceptions, both synchronized:
 *  - pinpool_get_stats reads its counters, which are single-writer atomics
 *    (pp_owner_add), under pool->reg_lock;
 *  - pinpool_destroy frees it, under pp_global_lock, when by contract the
 *    owner no longer uses the pool.
 * No other thread ever drains a cache: pinpool_empty_cache bumps
 * pool->flush_epoch and each owner flushes at its next call. Doing the
 * drain from another thread would need a lock or a read-modify-write on
 * every hot-path operation.
 *
 * Links: every cache is on its pool's list (reg_lock + pp_global_lock) and,
 * while its thread lives, on its thread's list (pp_global_lock); every
 * thread record is on the list of threads (pp_global_lock), which the fork
 * handlers walk. pp_global_lock is held only for these links, never for
 * per-pool work: an exiting thread detaches its caches under it, taking a
 * reference on each pool (pp_pool_try_ref, so that no destroy can free a
 * cache it is flushing), and flushes them after it has dropped it.
 *
 * Lookup: pp_tls (internal.h) caches PP_TLS_WAYS (pool id, cache) pairs;
 * only a thread's first call on a pool, or one on a pool that fell out of
 * those ways, takes pp_global_lock.
 */
#include "internal.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>

_Thread_local pp_tls_t pp_tls PP_TLS_MODEL;

struct pp_thread {
  pp_tcache_t *caches;           /* pp_global_lock */
  pp_tls_t *tls;                 /* the thread's pp_tls; immutable */
  struct pp_thread *prev, *next; /* list of threads; pp_global_lock */
};

static pp_mutex_t pp_global_lock = {.m = PTHREAD_MUTEX_INITIALIZER};
static pp_thread_t *threads; /* pp_global_lock */
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
void (*pp_test_exit_locked_hook)(void);
void (*pp_test_detached_hook)(void);

static void tbin_free(pp_tcache_t *tc) {
  for (unsigned c = 0; c < PP_NCLASSES; c++)
    free(tc->bins[c].items);
  free(tc);
}

/* Records of threads that did not survive a fork, freed by the child's
 * first pinpool call that needs pp_global_lock (pp_tcache_get_slow), not
 * by the fork handler itself: a handler that calls free() makes every
 * child of a busy parent depend on the allocator's locks being free at
 * the fork, which the sanitizers' runtimes do not ensure (ASan's
 * quarantine lock, held by a parent thread at the fork: 1 child in about
 * 1,000 hung in test_fork test_stress). Under pp_global_lock. */
static pp_thread_t *fork_garbage;

static void free_fork_garbage_locked(void) {
  pp_assert_held(&pp_global_lock);
  for (pp_thread_t *t = fork_garbage, *next; t != NULL; t = next) {
    next = t->next;
    for (pp_tcache_t *tc = t->caches, *n2; tc != NULL; tc = n2) {
      n2 = tc->thr_next;
      tbin_free(tc);
    }
    free(t);
  }
  fork_garbage = NULL;
}

/* Give back the oldest n - keep blocks of one class. Owner only. */
void pp_tcache_flush_bin(pp_tcache_t *tc, unsigned cls, uint32_t keep) {
  pp_tbin_t *b = &tc->bins[cls];
  if (b->n <= keep)
    return;
  uint32_t give = b->n - keep;
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < give; i++)
    bytes += b->items[i].bs; /* large blocks differ within a class */
  /* Bottom of the stack: the coldest blocks go back first. */
  pp_central_give(tc->pool, cls, b->items, give);
  memmove(b->items, b->items + give, keep * sizeof b->items[0]);
  b->n = keep;
  pp_store_relaxed(&tc->bytes, pp_load_relaxed(&tc->bytes) - bytes);
}

/* Over its budget: give back whole bins, largest class first, until at
 * most half of the budget is held. Largest first: they are the most bytes
 * per block moved, and the fewest blocks to fetch again later; the small
 * classes, where a cache matters most per byte, stay warm. (Flushing
 * everything instead made every next allocation a miss.) Owner only.
 *
 * Adaptive budget. A thread that freed at least 16 blocks and allocated
 * none since its previous shrink is a consumer (of a producer/consumer
 * pair, W5): its cache only hides blocks that the producer then misses and
 * allocates anew. Its budget halves at each such shrink, down to
 * tcache_bytes / 64, so that it hands blocks back in batches of a few
 * hundred KiB or MiB. A shrink after at least one allocation per four
 * frees, and every refill (alloc.c), double it again, up to tcache_bytes.
 * Weaker tests of "consumer" caught W2's single thread, which frees
 * several blocks before each large allocation: with "no refill since the
 * last shrink", or "fewer than one allocation per four frees", its budget
 * drifted down and W2 fell from ~13,000 to 2,000-4,000 operations a
 * second in some runs. W5 with two threads: peak reserved over peak
 * requested 2.3-3.2 -> 1.7-2.1, blocks a second 1.2-2.0 M -> 2.9-3.1 M
 * (docs/benchmarks.md). */
void pp_tcache_shrink(pp_tcache_t *tc) {
  uint64_t tb = tc->pool->cfg.tcache_bytes;
  uint64_t na = pp_load_relaxed(&tc->c.n_alloc);
  uint64_t nf = pp_load_relaxed(&tc->c.n_free);
  uint64_t da = na - tc->shrink_allocs, df = nf - tc->shrink_frees;
  tc->shrink_allocs = na;
  tc->shrink_frees = nf;
  if (da == 0 && df >= 16)
    tc->budget = tc->budget / 2 >= tb / 64 ? tc->budget / 2 : tc->budget;
  else if (da * 4 >= df)
    pp_tcache_budget_up(tc, tb);
  uint64_t target = tc->budget / 2;
  for (unsigned i = 0; i < tc->nused; i++) {
    if (pp_load_relaxed(&tc->bytes) <= target)
      break;
    if (tc->bins[tc->used[i]].n > 0)
      pp_tcache_flush_bin(tc, tc->used[i], 0);
  }
}

/* tc->used lists the largest classes first, so the oversize stacks lead:
 * the loop stops at the first other one (one compare when there is none). */
void pp_tcache_flush_over(pp_tcache_t *tc) {
  for (unsigned i = 0; i < tc->nused && tc->bins[tc->used[i]].over; i++)
    if (tc->bins[tc->used[i]].n > 0)
      pp_tcache_flush_bin(tc, tc->used[i], 0);
}

/* Emptied through pp_tcache_flush_all, which also marks any pending
 * flush (pinpool_empty_cache) as done: the cache holds nothing to flush. */
unsigned pp_tcache_give_own(pinpool_t *pool) {
  pp_tls_way_t *way = pp_tls_way(pool->id);
  if (way->pool_id != pool->id)
    return 0; /* no cache, or not in the way (a victim): nothing given */
  pp_tcache_t *tc = way->tc;
  unsigned n = 0;
  for (unsigned i = 0; i < tc->nused; i++)
    n += tc->bins[tc->used[i]].n;
  pp_tcache_flush_all(tc);
  return n;
}

void pp_tcache_flush_all(pp_tcache_t *tc) {
  for (unsigned i = 0; i < tc->nused; i++)
    if (tc->bins[tc->used[i]].n > 0)
      pp_tcache_flush_bin(tc, tc->used[i], 0);
  tc->epoch = pp_load_acquire(&tc->pool->flush_epoch) | tc->pool->epoch_tag;
}

static void unlink_from_pool(pp_tcache_t *tc) {
  pinpool_t *pool = tc->pool;
  if (tc->pool_prev != NULL)
    tc->pool_prev->pool_next = tc->pool_next;
  else
    pool->caches = tc->pool_next;
  if (tc->pool_next != NULL)
    tc->pool_next->pool_prev = tc->pool_prev;
  pool->rs.ncaches--;
}

static void unlink_from_pool_locked(pp_tcache_t *tc) {
  pp_assert_held(&tc->pool->reg_lock);
  unlink_from_pool(tc);
}

static void thread_unlink_locked(pp_thread_t *thr) {
  pp_assert_held(&pp_global_lock);
  if (thr->prev != NULL)
    thr->prev->next = thr->next;
  else
    threads = thr->next;
  if (thr->next != NULL)
    thr->next->prev = thr->prev;
}

/* A cache whose thread is gone: its blocks back to the central bins, its
 * counters into the pool's dead-thread totals, off the pool's list (the
 * caller frees it). The caller owns tc (its thread is exiting, or did not
 * survive a fork) and keeps the pool alive.
 *
 * The unlink and the fold are one reg_lock hold: a stats reader (which sums
 * the live caches and the dead totals under reg_lock) counts this thread's
 * operations once, in one place or the other, never in neither, so the
 * cumulative counts never go backwards while threads exit. Both sides are
 * atomics, so no sanitizer sees a fold made after the unlock
 * (test_tcache: stats_monotonic_exits, mutant FOLD_UNLOCKED). */
static void tcache_detach(pp_tcache_t *tc) {
  pinpool_t *pool = tc->pool;
  pp_tcache_flush_all(tc);
  pp_mutex_lock(&pool->reg_lock);
  unlink_from_pool_locked(tc);
#ifndef PINPOOL_MUTANT_FOLD_UNLOCKED
  pp_stats_fold_dead(pool, tc);
#endif
  pp_mutex_unlock(&pool->reg_lock);
  if (pp_test_detached_hook != NULL)
    pp_test_detached_hook();
#ifdef PINPOOL_MUTANT_FOLD_UNLOCKED
  /* Logic mutant (docs/verification.md): the fold in a hold of its own,
   * after the unlink's. */
  pp_mutex_lock(&pool->reg_lock);
  pp_stats_fold_dead(pool, tc);
  pp_mutex_unlock(&pool->reg_lock);
#endif
}

/* pthread key destructor: the thread is exiting. Its blocks go back to the
 * central bins of pools that are still alive (a destroyed pool has already
 * removed its caches from this list).
 *
 * pp_global_lock is held only to detach the caches: each pool is pinned by
 * a reference, then the caches are flushed with per-pool locks only. A
 * pool whose last reference is already gone is being torn down by another
 * thread, which is waiting for pp_global_lock to free our cache: free it
 * here instead (no flush: its memory goes back with the pool).
 *
 * A pinpool call from a destructor that runs after this one (a later key
 * of the same round, another library's) finds no record (pp_tls.thr is
 * cleared) and makes a new one, whose pthread_setspecific makes glibc run
 * another round of destructors (up to PTHREAD_DESTRUCTOR_ITERATIONS, 4),
 * which runs this again for the new record (test_tcache:
 * tls_destructor_after_ours). */
static void thread_exit(void *arg) {
  pp_thread_t *thr = arg;
  for (unsigned i = 0; i < PP_TLS_WAYS; i++)
    pp_tls.way[i] = (pp_tls_way_t){0, NULL};
  for (unsigned i = 0; i < PP_TLS_VICTIMS; i++)
    pp_tls.victim[i] = (pp_tls_way_t){0, NULL};
  pp_tls.thr = NULL;
  pp_mutex_lock(&pp_global_lock);
  if (pp_test_exit_locked_hook != NULL)
    pp_test_exit_locked_hook();
  pp_tcache_t *flush = NULL;
  for (pp_tcache_t *tc = thr->caches, *next; tc != NULL; tc = next) {
    next = tc->thr_next;
    pinpool_t *pool = tc->pool;
    if (pp_pool_try_ref(pool)) {
      tc->thr_next = flush;
      flush = tc;
    } else {
      pp_mutex_lock(&pool->reg_lock);
      unlink_from_pool_locked(tc);
      pp_mutex_unlock(&pool->reg_lock);
      tbin_free(tc);
    }
  }
  thr->caches = NULL;
  /* A busy section (fork.c): a fork waits for the flush. No gate check:
   * the gate is only ever up while its forker holds pp_global_lock. */
  unsigned d = pp_load_relaxed(&pp_tls.busy);
  pp_store_relaxed(&pp_tls.busy, d + 1);
  pp_mutex_unlock(&pp_global_lock);
  /* Each reference is dropped in the section too unless it is the last:
   * a child forked after the section then holds no reference of a thread
   * that did not survive (its pinpool_destroy tears the pool down). */
  for (pp_tcache_t *tc = flush; tc != NULL; tc = tc->thr_next) {
    tcache_detach(tc);
    /* The flush made its bytes idle in the pool: the caps apply to them
     * now, as pinpool_thread_flush trims (issue 37, third review, item 8:
     * 12 MiB stayed cached under max_cached=4MiB until another thread's
     * next free). Only in a pool with a cap (a pool without one keeps the
     * deferred gives for the next carve: pool.c), and not in a CUDA or
     * shared pool's child of fork, which gives nothing back. */
    if (pp_trims(tc->pool) && !tc->pool->forked_cuda) {
      (void)pp_defer_drain(tc->pool);
      pp_trim_to_cap(tc->pool);
    }
    if (pp_pool_unref_unless_last(tc->pool))
      tc->pool = NULL;
  }
  pp_busy_leave();
  /* Outside the section: a last reference may tear the pool down, which
   * takes pp_global_lock (a forker holding it waits for busy == 0). */
  for (pp_tcache_t *tc = flush, *next; tc != NULL; tc = next) {
    next = tc->thr_next;
    pinpool_t *pool = tc->pool;
    tbin_free(tc);
    if (pool != NULL)
      pp_pool_unref(pool);
  }
  pp_mutex_lock(&pp_global_lock);
  thread_unlink_locked(thr);
  pp_mutex_unlock(&pp_global_lock);
  free(thr);
}

static void make_key(void) {
  (void)pthread_key_create(&thread_key, thread_exit);
}

/* pp_global_lock, for a thread record or a cache. Outside a busy section
 * a fork holding it is waited for. Inside one (a callout from it: the
 * exit trim's backend free, a backend alloc, a query, that calls a pool
 * this thread has no cache of, or has no record any more) it is not: the
 * forker holds the lock while it waits for this very section to end
 * (issue 37, fourth review, D3). It is then refused (false), and the
 * call fails with PINPOOL_EBUSY, changing nothing. The gate is up only
 * while a forker holds the lock, so a refusal is always such a fork. */
static bool global_lock_busy(void) {
  if (pp_load_relaxed(&pp_tls.busy) != 0) {
    for (unsigned spins = 0; !pp_mutex_trylock(&pp_global_lock); spins++) {
      if (pp_load_acquire(&pp_fork_gate) != 0)
        return false;
      if (spins > 64)
        (void)sched_yield();
    }
    return true;
  }
  pp_mutex_lock(&pp_global_lock);
  return true;
}

static int refused(const char *what) {
  return pp_fail(PINPOOL_EBUSY,
                 "%s: called from %s inside a busy section, which a fork "
                 "waits for, and the thread has no %s to use meanwhile "
                 "(docs/api.md, \"Calling pinpool from a callback\")",
                 what, pp_in_callout() ? pp_callout_name() : "pinpool",
                 pp_tls.thr == NULL ? "record" : "cache of this pool");
}

/* Inside a busy section with no record: the thread's exit flushing its
 * caches (thread_exit), whose callouts (the trim's backend free) may call
 * pinpool. Such a call makes no record: one made there was flushed by an
 * exit of its own, whose trim called the backend free again, which made
 * another, past the destructor rounds glibc runs; the last one's cache
 * was never flushed (rv37e's d7: 80 MiB kept under max_cached=4MiB).
 * An allocation or free there needs no cache (alloc.c, "Nested calls"). */
static bool exiting(void) {
  return pp_tls.thr == NULL && pp_load_relaxed(&pp_tls.busy) != 0;
}

/* pp_thread_get; *busy_refused set when a fork refused it (above). NULL
 * too during the thread's exit (exiting, above). */
static pp_thread_t *thread_get(bool *busy_refused) {
  pp_thread_t *thr = pp_tls.thr;
  if (thr != NULL)
    return thr;
  if (exiting())
    return NULL;
  (void)pthread_once(&thread_key_once, make_key);
  thr = calloc(1, sizeof *thr);
  if (thr == NULL)
    return NULL;
  if (pthread_setspecific(thread_key, thr) != 0) {
    free(thr);
    return NULL;
  }
  thr->tls = &pp_tls;
  if (!global_lock_busy()) {
    (void)pthread_setspecific(thread_key, NULL);
    free(thr);
    *busy_refused = true;
    return NULL;
  }
  thr->next = threads;
  if (threads != NULL)
    threads->prev = thr;
  threads = thr;
  pp_mutex_unlock(&pp_global_lock);
  pp_tls.thr = thr;
  return thr;
}

pp_thread_t *pp_thread_get(void) {
  bool busy_refused = false;
  return thread_get(&busy_refused);
}

/* (id, tc) into its way; the pair there goes to a victim slot (round
 * robin: the oldest eviction is overwritten). */
static void tls_install(uint64_t id, pp_tcache_t *tc) {
  pp_tls_way_t *w = pp_tls_way(id);
  if (w->pool_id != 0) {
    pp_tls.victim[pp_tls.victim_next] = *w;
    pp_tls.victim_next = (pp_tls.victim_next + 1) % PP_TLS_VICTIMS;
  }
  *w = (pp_tls_way_t){id, tc};
}

pp_tcache_t *pp_tcache_get_slow(pinpool_t *pool, int *err) {
  /* The victims first: no lock, no shared write. Found: swapped with the
   * pair in its way. */
  for (unsigned i = 0; i < PP_TLS_VICTIMS; i++) {
    if (pp_tls.victim[i].pool_id == pool->id) {
      pp_tls_way_t *w = pp_tls_way(pool->id), found = pp_tls.victim[i];
      pp_tls.victim[i] = *w;
      *w = found;
      return found.tc;
    }
  }
  if (exiting()) {
    *err = pp_fail(PINPOOL_EBUSY,
                   "pinpool: called from %s run by the thread's exit, which "
                   "has no thread cache left to use (docs/api.md, \"Calling "
                   "pinpool from a callback\")",
                   pp_callout_name());
    return NULL;
  }
  bool busy_refused = false;
  pp_thread_t *thr = thread_get(&busy_refused);
  if (thr == NULL || !global_lock_busy()) {
    *err = busy_refused || thr != NULL
               ? refused("pinpool")
               : pp_fail(PINPOOL_ENOMEM, "out of memory for the thread cache");
    return NULL;
  }
  if (pp_unlikely(fork_garbage != NULL))
    free_fork_garbage_locked();
  pp_tcache_t *tc = thr->caches;
  while (tc != NULL && tc->pool != pool)
    tc = tc->thr_next;
  if (tc == NULL) {
    tc = calloc(1, sizeof *tc);
    if (tc != NULL) {
      tc->pool = pool;
      tc->thread = thr;
      tc->shard = atomic_fetch_add_explicit(&pool->next_shard, 1,
                                            memory_order_relaxed) %
                  pool->cfg.shards;
      tc->epoch = pp_load_acquire(&pool->flush_epoch) | pool->epoch_tag;
      tc->node = pp_numa_current(pool);
      tc->budget = pool->cfg.tcache_bytes;
      tc->thr_next = thr->caches;
      thr->caches = tc;
      pp_mutex_lock(&pool->reg_lock);
      tc->pool_prev = NULL;
      tc->seq = pool->rs.next_seq++;
      tc->pool_next = pool->caches;
      if (pool->caches != NULL)
        pool->caches->pool_prev = tc;
      pool->caches = tc;
      if (++pool->rs.ncaches > pool->rs.max_ncaches)
        pool->rs.max_ncaches = pool->rs.ncaches;
      pp_mutex_unlock(&pool->reg_lock);
    }
  }
  pp_mutex_unlock(&pp_global_lock);
  if (tc == NULL) {
    *err = pp_fail(PINPOOL_ENOMEM, "out of memory for the thread cache");
    return NULL;
  }
  tls_install(pool->id, tc);
  return tc;
}

void pp_tcache_pool_destroy(pinpool_t *pool) {
  /* The tearing-down thread's own pair, whose cache is freed below: a call
   * from a callback of the teardown must not find it on a hit path (it
   * fails in the general one: pp_pool_dying). Other threads' pairs are
   * never matched again (the id is not reused). */
  for (unsigned i = 0; i < PP_TLS_WAYS; i++)
    if (pp_tls.way[i].pool_id == pool->id)
      pp_tls.way[i] = (pp_tls_way_t){0, NULL};
  for (unsigned i = 0; i < PP_TLS_VICTIMS; i++)
    if (pp_tls.victim[i].pool_id == pool->id)
      pp_tls.victim[i] = (pp_tls_way_t){0, NULL};
  pp_mutex_lock(&pp_global_lock);
  pp_mutex_lock(&pool->reg_lock);
  pp_tcache_t *tc = pool->caches;
  while (tc != NULL) {
    pp_tcache_t *next = tc->pool_next;
    pp_tcache_t **pp = &tc->thread->caches;
    while (*pp != tc)
      pp = &(*pp)->thr_next;
    *pp = tc->thr_next;
    tbin_free(tc);
    tc = next;
  }
  pool->caches = NULL;
  pp_mutex_unlock(&pool->reg_lock);
  pp_mutex_unlock(&pp_global_lock);
}

int pinpool_thread_flush(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_thread_flush: pool is NULL");
  int dying = pp_pool_dying(pool, "pinpool_thread_flush");
  if (pp_unlikely(dying != 0))
    return dying;
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED,
                   "pinpool_thread_flush: a CUDA or shared pool in a "
                   "child of fork");
  pp_tls_way_t *w = pp_tls_way(pool->id);
  int err = 0;
  pp_tcache_t *tc =
      w->pool_id == pool->id ? w->tc : pp_tcache_get_slow(pool, &err);
  if (tc == NULL)
    return err;
  /* Trimming too: it detaches idle segments, then releases them (fork.c
   * must not see one between the two). */
  pp_busy_enter();
  pp_tcache_flush_all(tc);
  /* Its large blocks (and any other thread's given back meanwhile) into
   * the arena now, not at the next carve (pool.c, "Deferred gives"): the
   * caller asked for them to be back, and the arena's stats then say so. */
  (void)pp_defer_drain(pool);
  pp_trim_to_cap(pool);
  pp_busy_leave();
  return 0;
}

/* ---- Fork (fork.c calls these in its handlers) ---------------------------
 */

_Atomic(unsigned) pp_fork_gate;

void pp_busy_wait_fork(void) {
  for (;;) {
    pp_store_release(&pp_tls.busy, 0);
    /* The gate is up only while a forker holds pp_global_lock: taking it
     * waits for that fork to be over. */
    while (pp_load_acquire(&pp_fork_gate) != 0) {
      pp_mutex_lock(&pp_global_lock);
      pp_mutex_unlock(&pp_global_lock);
    }
    pp_store_relaxed(&pp_tls.busy, 1);
    atomic_signal_fence(memory_order_seq_cst);
    if (pp_load_relaxed(&pp_fork_gate) == 0)
      return;
  }
}

void pp_tcache_fork_prepare(void) {
  pp_mutex_lock(&pp_global_lock);
  pp_store_relaxed(&pp_fork_gate, 1);
  pp_fork_barrier(); /* fork.c: membarrier */
  /* No thread can start or end a thread record now; wait for every busy
   * section to end. A section holds no lock on entry, so the pool locks it
   * needs are free of us (we take them after this). */
  for (pp_thread_t *t = threads; t != NULL; t = t->next) {
#ifdef PINPOOL_MUTANT_NO_BUSY_WAIT
    /* Mutant (docs/verification.md): locks only, no wait for sections. */
    break;
#endif
    if (t->tls == &pp_tls)
      continue;
    for (unsigned spins = 0; pp_load_acquire(&t->tls->busy) != 0; spins++)
      if (spins > 64)
        (void)sched_yield();
  }
}

void pp_tcache_fork_parent(void) {
  pp_store_relaxed(&pp_fork_gate, 0);
  pp_mutex_unlock(&pp_global_lock);
}

/* The child: every other thread is gone. Their caches are retired as if
 * they had exited (the blocks back to the bins, the counters folded), with
 * this process's only thread as their owner now. A cache of a pool with no
 * reference left (nobody will use it here) is only unlinked, and freed
 * with its thread's record (fork_garbage). Unlinked all the same: such a
 * pool may still be on the reaper's list, whole, and the child's reaper
 * walks its caches (pp_tcache_pool_destroy) after the child's first call
 * freed the record (rv39c D1: heap-use-after-free, SIGSEGV in about 1
 * child of 3; test_core39 reaper_fork_thread_cache). The unlink takes no
 * lock: this is the only thread; a listed pool's locks were held across
 * the fork and released (fork.c), and a pool whose teardown had begun is
 * unregistered: its reg_lock may be held by a thread that is gone, and
 * nothing in the child reads its list (its teardown, on a thread that is
 * gone too, never runs here). Other pool locks are usable (fork.c
 * released them). */
void pp_tcache_fork_child(void) {
  pp_store_relaxed(&pp_fork_gate, 0);
  pp_thread_id_reset();
  for (pp_thread_t *t = threads, *next; t != NULL; t = next) {
    next = t->next;
    if (t->tls == &pp_tls)
      continue;
    for (pp_tcache_t *tc = t->caches; tc != NULL; tc = tc->thr_next)
      if (pp_load_relaxed(&tc->pool->refs) != 0)
        tcache_detach(tc);
      else
        unlink_from_pool(tc);
    thread_unlink_locked(t);
    t->next = fork_garbage;
    fork_garbage = t;
  }
  pp_mutex_unlock(&pp_global_lock);
}
