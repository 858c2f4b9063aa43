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
 * Links: every cache is on its pool's list (reg_lock + pp_global_lock) and
 * on its thread's list (pp_global_lock). Thread exit and pool destroy both
 * take pp_global_lock, so neither can free a cache the other is using.
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

_Thread_local pp_tls_t pp_tls __attribute__((tls_model("initial-exec")));

struct pp_thread {
  pp_tcache_t *caches;
};

static pp_mutex_t pp_global_lock = {.m = PTHREAD_MUTEX_INITIALIZER};
static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static _Thread_local pp_thread_t *tls_thread;

static void tbin_free(pp_tcache_t *tc) {
  for (unsigned c = 0; c < PP_NCLASSES; c++)
    free(tc->bins[c].items);
  free(tc);
}

/* Give back the oldest n - keep blocks of one class. Owner only. */
void pp_tcache_flush_bin(pp_tcache_t *tc, unsigned cls, uint32_t keep) {
  pp_tbin_t *b = &tc->bins[cls];
  if (b->n <= keep)
    return;
  uint32_t give = b->n - keep;
  uint64_t bytes = (uint64_t)give * pp_class_size(cls);
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

void pp_tcache_flush_all(pp_tcache_t *tc) {
  for (unsigned i = 0; i < tc->nused; i++)
    if (tc->bins[tc->used[i]].n > 0)
      pp_tcache_flush_bin(tc, tc->used[i], 0);
  tc->epoch = pp_load_acquire(&tc->pool->flush_epoch);
}

static void unlink_from_pool_locked(pp_tcache_t *tc) {
  pinpool_t *pool = tc->pool;
  pp_assert_held(&pool->reg_lock);
  if (tc->pool_prev != NULL)
    tc->pool_prev->pool_next = tc->pool_next;
  else
    pool->caches = tc->pool_next;
  if (tc->pool_next != NULL)
    tc->pool_next->pool_prev = tc->pool_prev;
  pool->rs.ncaches--;
}

/* pthread key destructor: the thread is exiting. Its blocks go back to the
 * central bins of pools that are still alive (a destroyed pool has already
 * removed its caches from this list). */
static void thread_exit(void *arg) {
  pp_thread_t *thr = arg;
  pp_tls.pool_id = 0;
  pp_tls.tc = NULL;
  tls_thread = NULL;
  pp_mutex_lock(&pp_global_lock);
  pp_tcache_t *tc = thr->caches;
  while (tc != NULL) {
    pp_tcache_t *next = tc->thr_next;
    pinpool_t *pool = tc->pool;
    pp_tcache_flush_all(tc);
    pp_mutex_lock(&pool->reg_lock);
    unlink_from_pool_locked(tc);
    pp_stats_fold_dead(pool, tc);
    pp_mutex_unlock(&pool->reg_lock);
    tbin_free(tc);
    tc = next;
  }
  pp_mutex_unlock(&pp_global_lock);
  /* max_cached is enforced at the next slow path of a live thread: releasing
   * segments here would call the backend under pp_global_lock. */
  free(thr);
}

static void make_key(void) {
  (void)pthread_key_create(&thread_key, thread_exit);
}

pp_tcache_t *pp_tcache_get_slow(pinpool_t *pool) {
  pp_thread_t *thr = tls_thread;
  if (thr == NULL) {
    (void)pthread_once(&thread_key_once, make_key);
    thr = calloc(1, sizeof *thr);
    if (thr == NULL)
      return NULL;
    if (pthread_setspecific(thread_key, thr) != 0) {
      free(thr);
      return NULL;
    }
    tls_thread = thr;
  }
  pp_mutex_lock(&pp_global_lock);
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
      tc->epoch = pp_load_acquire(&pool->flush_epoch);
      tc->budget = pool->cfg.tcache_bytes;
      tc->thr_next = thr->caches;
      thr->caches = tc;
      pp_mutex_lock(&pool->reg_lock);
      tc->pool_prev = NULL;
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
  if (tc != NULL) {
    pp_tls.pool_id = pool->id;
    pp_tls.tc = tc;
  }
  return tc;
}

void pp_tcache_pool_destroy(pinpool_t *pool) {
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
  pp_tcache_t *tc =
      pp_tls.pool_id == pool->id ? pp_tls.tc : pp_tcache_get_slow(pool);
  if (tc == NULL)
    return pp_fail(PINPOOL_ENOMEM, "out of memory for the thread cache");
  pp_tcache_flush_all(tc);
  pp_trim_to_cap(pool);
  return 0;
}
