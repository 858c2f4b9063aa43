/*
 * A pool's life: create (configuration, providers, the central layer's
 * structures), the reference count that keeps it alive past
 * pinpool_destroy while buffers and exports hold it, teardown, and the
 * public maintenance calls (empty_cache, get_config). The central layer
 * they set up and empty is pool.c; the lock order is in pool.c's header.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reap_retry(void); /* "The reaper", below */

static _Atomic(uint64_t) next_pool_id = 1;

/* ---- Create and destroy -------------------------------------------------- */

static void pool_free_struct(pinpool_t *pool, bool streams_ready) {
  if (streams_ready)
    pp_streams_fini(pool);
  if (pool->bins != NULL) {
    size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
    for (size_t i = 0; i < nbins; i++)
      pp_mutex_destroy(&pool->bins[i].lock);
    free(pool->bins);
  }
  pp_binmaps_fini(pool);
  if (pool->arena_ready)
    pp_arena_fini(pool);
  pp_numa_fini(pool);
  pp_segmap_destroy(pool->map);
  pp_mutex_destroy(&pool->seg_lock);
  pp_mutex_destroy(&pool->trim_lock);
  pp_mutex_destroy(&pool->idle_lock);
  pp_mutex_destroy(&pool->reg_lock);
  pp_hist_fini(pool);
  /* Callouts (base.h): a provider's destroy may call pinpool, on another
   * pool (this one is gone: pp_pool_dying), under the same rules as any
   * callback (issue 37, the fifth review). */
  unsigned co = pp_callout_enter(PP_CO_EV_DESTROY);
  if (pool->has_events && pool->ev.destroy != NULL)
    pool->ev.destroy(pool->ev.ctx);
  if (pool->prov.destroy != NULL)
    pool->prov.destroy(pool->prov.ctx);
  pp_callout_leave(co);
  if (pool->cuda != NULL)
    pp_cuda_close(pool->cuda);
  pp_share_destroy(pool->share); /* after the chunks went (arena_fini) */
  free(pool);
}

static int open_providers(pinpool_t *pool, const pinpool_hooks_t *hooks) {
  const pp_config_t *cfg = &pool->cfg;
  int rc = pp_numa_check(cfg->numa_node);
  if (rc == 0) /* before anything copies the config: it decides backend */
    pp_config_auto(&pool->cfg, &pool->cuda);
  if (rc == 0 && pool->cuda == NULL &&
      (cfg->backend == PP_BACKEND_CUDA ||
       cfg->backend == PP_BACKEND_CUDA_REGISTER ||
       cfg->events == PP_EVENTS_CUDA))
    rc = pp_cuda_open(cfg, &pool->cuda);
  if (rc != 0)
    return rc;
  if (hooks != NULL && hooks->backend != NULL)
    rc = pp_backend_user_open(hooks->backend, &pool->prov);
  else if (cfg->backend == PP_BACKEND_MALLOC)
    rc = pp_backend_malloc_open(cfg, &pool->prov);
  else if (cfg->backend == PP_BACKEND_CUDA ||
           cfg->backend == PP_BACKEND_CUDA_REGISTER)
    rc = pp_backend_cuda_open(cfg, pool->cuda, &pool->prov);
  else
    rc = pp_backend_host_open(cfg, &pool->prov);
  if (rc != 0)
    return rc;
  if (hooks != NULL && hooks->events != NULL)
    rc = pp_events_user_open(hooks->events, &pool->ev);
  else if (cfg->events == PP_EVENTS_SIMULATED)
    rc = pp_events_sim_open(cfg, &pool->ev);
  else if (cfg->events == PP_EVENTS_CUDA)
    rc = pp_events_cuda_open(cfg, pool->cuda, &pool->ev);
  else
    return 0;
  pool->has_events = rc == 0;
  return rc;
}

static int pool_new(const pp_config_t *cfg, const pinpool_hooks_t *hooks,
                    pinpool_t **out) {
  pinpool_t *pool = calloc(1, sizeof *pool);
  if (pool == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  pool->cfg = *cfg;
  pool->cfg.fault = cfg->fault_site != PP_FAULT_NONE ? &pool->fault : NULL;
  pool->cfg.pinwarn = &pool->pinwarn;
  pp_mutex_init(&pool->seg_lock);
  pp_mutex_init(&pool->trim_lock);
  pp_mutex_init(&pool->idle_lock);
  pp_mutex_init(&pool->reg_lock);
  (void)pp_hist_init(pool);
  if (hooks != NULL) {
    pool->on_error = hooks->on_error;
    pool->error_arg = hooks->error_arg;
    pool->pinwarn.on_error = hooks->on_error;
    pool->pinwarn.error_arg = hooks->error_arg;
  }
  int rc = pp_numa_init(pool);
  if (rc == 0 && cfg->shared) { /* before the providers copy the config */
    rc = pp_share_create(&pool->share);
    pool->cfg.share = pool->share;
  }
  if (rc == 0)
    rc = open_providers(pool, hooks);
  if (rc == 0 && cfg->numa == PP_NUMA_LOCAL && pool->prov.alloc_node == NULL)
    rc = pp_fail(PINPOOL_ECONFIG,
                 "config: key 'numa': backend '%s' cannot place memory on "
                 "a node (numa=local requires backend=host or "
                 "cuda-register)",
                 pool->prov.name);
  if (rc == 0)
    rc = pp_segmap_create(&pool->map);
  size_t nbins = (size_t)PP_NCLASSES * pool->nvshards;
  if (rc == 0) {
    pool->bins = aligned_alloc(64, nbins * sizeof(pp_bin_t));
    if (pool->bins == NULL) {
      rc = pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
    } else {
      memset(pool->bins, 0, nbins * sizeof(pp_bin_t));
      for (size_t i = 0; i < nbins; i++)
        pp_mutex_init(&pool->bins[i].lock);
      rc = pp_binmaps_init(pool);
    }
  }
  if (rc != 0) {
    pool_free_struct(pool, false);
    return rc;
  }
  (void)snprintf(pool->backend_name, sizeof pool->backend_name, "%s",
                 pool->prov.name);
  pool->id = pp_fetch_add_relaxed(&next_pool_id, 1);
  atomic_init(&pool->refs, 1); /* the owner's: pinpool_destroy drops it */
  rc = pp_streams_init(pool);
  if (rc != 0) {
    pool_free_struct(pool, true);
    return rc;
  }
  pool->arena_ready = true;
  rc = pp_arena_init(pool); /* the reserve chunk, if configured */
  if (rc != 0) {
    pool_free_struct(pool, true);
    return rc;
  }
  /* The grower (growahead.c) looks at the arena from now on. */
  pp_store_release(&pool->grow.ready, true);
  pp_fork_register(pool); /* fork.c: the fork handlers see it from now */
  reap_retry();
  *out = pool;
  return 0;
}

int pinpool_create(const char *config, pinpool_t **out) {
  return pinpool_create_ex(config, NULL, out);
}

int pinpool_create_with_backend(const char *config,
                                const pinpool_backend_t *backend,
                                pinpool_t **out) {
  if (backend == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_create_with_backend: backend is NULL");
  pinpool_hooks_t hooks = {backend, NULL, NULL, NULL};
  return pinpool_create_ex(config, &hooks, out);
}

int pinpool_create_ex(const char *config, const pinpool_hooks_t *hooks,
                      pinpool_t **out) {
  if (out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_create: out is NULL");
  bool ub = hooks != NULL && hooks->backend != NULL;
  bool ue = hooks != NULL && hooks->events != NULL;
  if (ub && (hooks->backend->alloc == NULL || hooks->backend->free == NULL))
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_create: backend alloc and free must be set");
  if (ue &&
      (hooks->events->record == NULL || hooks->events->query == NULL ||
       hooks->events->synchronize == NULL || hooks->events->release == NULL))
    return pp_fail(PINPOOL_EINVAL, "pinpool_create: event provider "
                                   "record, query, synchronize and release "
                                   "must be set");
  if (config == NULL)
    config = getenv("PINPOOL_CONF");
  pp_config_t cfg;
  int rc = pp_config_parse(config, ub, ue, &cfg);
  if (rc != 0)
    return rc;
  return pool_new(&cfg, hooks, out);
}

/* The pool is torn down when its last reference goes: the owner's (given
 * up by pinpool_destroy) or one held by an object that must outlive it,
 * such as a buffer (pp_pool_ref). */
void pp_pool_ref(pinpool_t *pool) { pp_fetch_add_relaxed(&pool->refs, 1); }

bool pp_pool_unref_unless_last(pinpool_t *pool) {
  uint64_t r = pp_load_relaxed(&pool->refs);
  do {
    if (r <= 1)
      return false;
    /* Release: this holder's writes before a teardown's acquire. */
  } while (!atomic_compare_exchange_weak_explicit(
      &pool->refs, &r, r - 1, memory_order_release, memory_order_relaxed));
  return true;
}

bool pp_pool_try_ref(pinpool_t *pool) {
  uint64_t r = pp_load_relaxed(&pool->refs);
  do {
    if (r == 0)
      return false;
  } while (!atomic_compare_exchange_weak_explicit(
      &pool->refs, &r, r + 1, memory_order_relaxed, memory_order_relaxed));
  return true;
}

static void pool_teardown(pinpool_t *pool);
static void pool_teardown_unregistered(pinpool_t *pool);

/* ---- The reaper -----------------------------------------------------------
 * A teardown joins the pool's own threads (pp_streams_fini: the background
 * thread; the simulated streams' destroy: their workers) and waits for its
 * events (pp_synchronize). Run on one of those threads it joined itself and
 * went on in a freed pool (issue 37, rv3637f, D4: the last buffer released
 * by an event query on the background thread after pinpool_destroy:
 * SIGSEGV; the same from the grower's backend call, or a simulated
 * stream's work). So a pool thread (pp_pool_thread) never tears down: it
 * pushes the pool here, and a detached thread of the process, started when
 * the list is not empty and gone when it is, tears it down. Nothing uses
 * the pool meanwhile (no reference is left; a call fails: pp_pool_dying),
 * and the pool thread may still be inside it: the teardown waits for that
 * thread to leave (the join), which it does, since it holds no lock of the
 * pool across the callout that dropped the reference.
 *
 * Fork: the handlers take reap_mu after the busy sections ended and
 * before the registry lock (pp_reap_fork). The reaper unregisters a pool
 * (fork.c) in the hold of reap_mu that takes it off the list: so in a
 * child, a pool still listed is registered and whole (its locks were
 * held across the fork), and the child's own reaper, started by the child
 * handler, tears that copy down; one that the parent's reaper had taken is
 * unregistered, the child's garbage, as a teardown in progress on any
 * other thread at a fork. */
static pp_mutex_t reap_mu = {.m = PTHREAD_MUTEX_INITIALIZER};
static pinpool_t *reap_list; /* reap_mu; linked through teardown_next */
static bool reaper_on;       /* reap_mu: a reaper runs, or is starting */

static void *reaper_main(void *arg) {
  (void)arg;
  pp_hook(PP_HOOK_REAP);
  pp_mutex_lock(&reap_mu);
  while (reap_list != NULL) {
    pinpool_t *pool = reap_list;
    reap_list = pool->teardown_next;
    pp_fork_unregister(pool); /* reap_mu -> registry lock (above) */
    pp_mutex_unlock(&reap_mu);
    pool_teardown_unregistered(pool);
    pp_mutex_lock(&reap_mu);
  }
  reaper_on = false;
  pp_mutex_unlock(&reap_mu);
  return NULL;
}

int (*pp_test_reaper_start_hook)(void);

/* Start a reaper; without one (no thread to be had) the list waits for
 * the next push, the next pool created (reap_retry), or the next fork
 * child, to try again. */
static void reaper_start(void) {
  pthread_attr_t a;
  pthread_t t;
  int e = pp_test_reaper_start_hook != NULL ? pp_test_reaper_start_hook() : 0;
  if (e == 0)
    e = pthread_attr_init(&a);
  if (e == 0) {
    (void)pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    e = pthread_create(&t, &a, reaper_main, NULL);
    (void)pthread_attr_destroy(&a);
  }
  if (e != 0) {
    pp_mutex_lock(&reap_mu);
    reaper_on = false;
    pp_mutex_unlock(&reap_mu);
  }
}

static void reap_push(pinpool_t *pool) {
  pp_mutex_lock(&reap_mu);
  pool->teardown_next = reap_list;
  reap_list = pool;
  bool start = !reaper_on;
  reaper_on = true;
  pp_mutex_unlock(&reap_mu);
  if (start) /* outside reap_mu: pthread_create takes libc's locks */
    reaper_start();
}

/* A pool created: a reaper whose start failed is tried again. Before, a
 * failed start stranded the listed pools until the next pool pushed
 * there, which might never come: their memory never went back (rv39c
 * D6). */
static void reap_retry(void) {
  pp_mutex_lock(&reap_mu);
  bool start = reap_list != NULL && !reaper_on;
  if (start)
    reaper_on = true;
  pp_mutex_unlock(&reap_mu);
  if (start) /* outside reap_mu, as reap_push */
    reaper_start();
}

void pp_reap_fork(int phase) {
  if (phase == PP_FORK_PREPARE) {
    pp_mutex_lock(&reap_mu);
    return;
  }
  bool start = false;
  if (phase == PP_FORK_CHILD) {
    /* The parent's reaper did not survive; the pools it had not taken
     * are this process's to tear down. */
    reaper_on = reap_list != NULL;
    start = reaper_on;
  }
  pp_mutex_unlock(&reap_mu);
  if (start)
    reaper_start();
}

/* The last reference inside a busy section (a callback of another pool's
 * call destroys this one, or releases its last buffer): the teardown waits
 * until the thread's outermost section ends. Run there, it took
 * pp_global_lock (the caches) plainly, which a fork holds while it waits
 * for this very section: a deadlock (issue 37, the fifth review, rv37e's
 * d1); and its synchronize, from inside a callout, could not wait for the
 * device. Nothing else uses the pool meanwhile (no reference is left);
 * a call on it from a callback fails (pp_pool_dying). */
void pp_pool_unref(pinpool_t *pool) {
  /* acq_rel: the thread that tears down sees every other holder's writes. */
  if (atomic_fetch_sub_explicit(&pool->refs, 1, memory_order_acq_rel) != 1)
    return;
  if (pp_pool_thread) { /* it would join itself (the reaper, above) */
    reap_push(pool);
    return;
  }
  if (pp_load_relaxed(&pp_tls.busy) != 0) {
    pool->teardown_next = pp_tls.deferred;
    pp_tls.deferred = pool;
    return;
  }
  pool_teardown(pool);
}

void pp_run_deferred(void) {
  while (pp_tls.deferred != NULL) {
    pinpool_t *pool = pp_tls.deferred;
    pp_tls.deferred = pool->teardown_next;
    pool_teardown(pool);
  }
}

int pp_pool_dying(const pinpool_t *pool, const char *fn) {
  if (pp_likely(pp_load_relaxed(&pool->refs) != 0))
    return 0;
  return pp_fail(PINPOOL_EBUSY,
                 "%s: the pool is being destroyed (called from %s that its "
                 "teardown runs)",
                 fn, pp_in_callout() ? pp_callout_name() : "a callback");
}

void pinpool_destroy(pinpool_t *pool) {
  if (pool == NULL)
    return;
  pp_pool_unref(pool);
}

static void pool_teardown(pinpool_t *pool) {
  /* First: a fork from now on neither locks nor repairs this pool (in a
   * child it is garbage, as in the parent). */
  pp_fork_unregister(pool);
  pool_teardown_unregistered(pool);
}

static void pool_teardown_unregistered(pinpool_t *pool) {
  /* Never on a thread the pool owns (pp_streams_fini joins them): */
  pp_assert(!pp_pool_thread);
  /* Wait for the device before the memory goes back to the backend: a
   * stream may still be reading a pending block. */
  (void)pp_synchronize(pool);
  pp_tcache_pool_destroy(pool);
  pp_streams_fini(pool);
  pp_segment_release_all(pool);
  pool_free_struct(pool, false);
}

/* ---- Public maintenance calls ------------------------------------------ */

int pinpool_empty_cache(pinpool_t *pool) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_empty_cache: pool is NULL");
  int dying = pp_pool_dying(pool, "pinpool_empty_cache");
  if (pp_unlikely(dying != 0))
    return dying;
  pp_hist_event(pool, PP_H_EMPTY_CACHE, 0, 0, 0, 0,
                __builtin_return_address(0));
  /* Other threads flush at their next call: their caches have no lock, so
   * only their owners may touch them (tcache.c). */
#ifdef PINPOOL_MUTANT_EPOCH_PLAIN
  /* Race mutant: the flag every hot path reads, written as a plain field
   * (PyTorch's record_history_ race). */
  (*(uint64_t *)&pool->flush_epoch)++;
#else
  atomic_fetch_add_explicit(&pool->flush_epoch, 1, memory_order_release);
#endif
#ifdef PINPOOL_MUTANT_REMOTE_DRAIN
  /* Race mutant: drain every thread's cache from here, without the owners
   * knowing. */
  pp_mutex_lock(&pool->reg_lock);
  for (pp_tcache_t *tc = pool->caches; tc != NULL; tc = tc->pool_next)
    pp_tcache_flush_all(tc);
  pp_mutex_unlock(&pool->reg_lock);
#endif
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(
        PINPOOL_EFORKED,
        "pinpool_empty_cache: a CUDA or shared pool in a child of fork");
  /* The cache before the busy section: finding it may take pp_global_lock,
   * which a fork holds while it waits for busy sections. */
  pp_tls_way_t *w = pp_tls_way(pool->id);
  int err = 0;
  pp_tcache_t *tc =
      w->pool_id == pool->id ? w->tc : pp_tcache_get_slow(pool, &err);
  if (tc == NULL)
    return err;
  /* A busy section (fork.c): draining the hot slots and releasing idle
   * segments move segments between lists and counters without one lock
   * held throughout, which no child may inherit half done. */
  pp_busy_enter();
  pp_process(pool, UINT32_MAX, false); /* reclaim what has completed */
  pp_tcache_flush_all(tc);
  (void)pp_release_idle(pool);
  pp_fetch_add_relaxed(&pool->gs.trimmed, pp_arena_release(pool, UINT64_MAX));
  pp_busy_leave();
  return 0;
}

int pinpool_get_config(pinpool_t *pool, char *buf, size_t len, size_t *needed) {
  if (pool == NULL || (buf == NULL && len != 0))
    return pp_fail(PINPOOL_EINVAL, "pinpool_get_config: NULL argument");
  const char *name =
      pool->cfg.backend == PP_BACKEND_USER ? NULL : pool->backend_name;
  size_t n = pp_config_format(&pool->cfg, name, NULL, 0);
  if (needed != NULL)
    *needed = n + 1;
  if (n + 1 > len)
    return pp_fail(PINPOOL_EOVERFLOW,
                   "pinpool_get_config: buffer of %zu bytes, %zu needed", len,
                   n + 1);
  (void)pp_config_format(&pool->cfg, name, buf, len);
  return 0;
}
