/*
 * The allocator's core after the review rv3637f (issue 37;
 * docs/verification.md, "Issue 37, rv3637f"). Each case runs in a child
 * under a watchdog (a crash or a hang fails the case, naming it); nothing
 * is timed: the windows are opened by callbacks that wait for the test,
 * and what is checked is counted.
 *
 * D4: the last reference of a pool dropped on one of the pool's own
 *     threads (the background thread's event query, the grower's backend
 *     call, a simulated stream's work): the teardown joined that very
 *     thread and went on in a freed pool. Now the process's reaper tears
 *     it down: every chunk goes back, on a thread that is not the one
 *     that dropped the reference; and a fork while the reaper has not yet
 *     taken the pool leaves the child a pool its own reaper tears down.
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_* */

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WATCHDOG_MS 60000u

/* Wait (1 ms steps, at most the watchdog's time) until *flag is set. */
static int wait_flag(atomic_int *flag) {
  for (unsigned i = 0; i < WATCHDOG_MS && !atomic_load(flag); i++)
    pp_sleep_ms(1);
  return atomic_load(flag);
}

/* Runs one scenario in a child under the watchdog. */
static void in_child(const char *name, int (*run)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(run());
  int st = pp_wait_child(pid, WATCHDOG_MS);
  PP_ASSERT(st == 0, "%s: the child failed (%d)", name, st);
}

/* ---- D4: the last buffer released on a pool's own thread ---------------- */

/* One scenario's state. The callback that releases runs on a pool thread
 * (never on main: main's own calls reach the callbacks too). */
static struct {
  pthread_t main;
  atomic_int armed, entered, destroyed, released;
  atomic_int allocs, frees;
  pinpool_buffer_t *buf;
  pthread_mutex_t mu; /* guards releaser, freer */
  pthread_t releaser, freer;
} d4;

static void d4_reset(void) {
  d4.main = pthread_self();
  atomic_store(&d4.armed, 0);
  atomic_store(&d4.entered, 0);
  atomic_store(&d4.destroyed, 0);
  atomic_store(&d4.released, 0);
  atomic_store(&d4.allocs, 0);
  atomic_store(&d4.frees, 0);
  d4.buf = NULL;
  (void)pthread_mutex_init(&d4.mu, NULL);
}

/* On a pool thread, armed, once: tell the test, wait for its
 * pinpool_destroy, then drop the pool's last reference here. */
static void d4_maybe_release(void) {
  if (!atomic_load(&d4.armed) || pthread_equal(pthread_self(), d4.main) ||
      atomic_exchange(&d4.entered, 1))
    return;
  if (!wait_flag(&d4.destroyed))
    return;
  pthread_mutex_lock(&d4.mu);
  d4.releaser = pthread_self();
  pthread_mutex_unlock(&d4.mu);
  if (pinpool_buffer_release(d4.buf) == 0)
    atomic_store(&d4.released, 1);
}

static int d4_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  d4_maybe_release();
  if (posix_memalign(out, 4096, size) != 0)
    return PINPOOL_ENOMEM;
  atomic_fetch_add(&d4.allocs, 1);
  return 0;
}
static void d4_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  (void)size;
  free(p);
  pthread_mutex_lock(&d4.mu);
  d4.freer = pthread_self();
  pthread_mutex_unlock(&d4.mu);
  atomic_fetch_add(&d4.frees, 1);
}
static int d4_record(void *ctx, pinpool_stream_t s, void **e) {
  (void)ctx;
  (void)s;
  *e = malloc(1);
  return *e != NULL ? 0 : PINPOOL_ENOMEM;
}
static int d4_query(void *ctx, void *e) {
  (void)ctx;
  (void)e;
  d4_maybe_release();
  return 1;
}
static int d4_sync(void *ctx, void *e) {
  (void)ctx;
  (void)e;
  return 0;
}
static void d4_evfree(void *ctx, void *e) {
  (void)ctx;
  free(e);
}
static const pinpool_backend_t d4_backend = {"user", d4_alloc, d4_free, NULL,
                                             0};
static const pinpool_events_t d4_events = {"user",  d4_record, d4_query,
                                           d4_sync, d4_evfree, NULL};

/* Every chunk back (the teardown's end, nearly), on a thread that is not
 * the pool thread that released. 0, or a code naming what failed. */
static int d4_check_torn_down(void) {
  for (unsigned i = 0; i < WATCHDOG_MS; i++) {
    if (atomic_load(&d4.frees) == atomic_load(&d4.allocs))
      break;
    pp_sleep_ms(1);
  }
  if (atomic_load(&d4.frees) != atomic_load(&d4.allocs))
    return 20; /* not torn down */
  pthread_mutex_lock(&d4.mu);
  bool same = pthread_equal(d4.freer, d4.releaser) != 0;
  pthread_mutex_unlock(&d4.mu);
  return same ? 21 : 0; /* torn down on the pool's own thread */
}

/* Make the pool, the buffer, open the window with `start`, destroy while
 * the pool thread waits inside its callback. */
static int d4_run(const char *conf, bool events, int (*start)(pinpool_t *)) {
  d4_reset();
  pinpool_hooks_t hooks = {&d4_backend, events ? &d4_events : NULL, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex(conf, &hooks, &pool) != 0)
    return 2;
  atomic_store(&d4.armed, 1);
  if (pinpool_buffer_alloc(pool, 4096, &d4.buf) != 0)
    return 3;
  if (start != NULL && start(pool) != 0)
    return 4;
  if (!wait_flag(&d4.entered))
    return 5;            /* the pool thread never called back */
  pinpool_destroy(pool); /* the buffer keeps the pool */
  atomic_store(&d4.destroyed, 1);
  if (!wait_flag(&d4.released))
    return 6;
  return d4_check_torn_down();
}

/* A block pending on the user's event: the background thread queries it. */
static int d4_pending_block(pinpool_t *pool) {
  void *x;
  if (pinpool_alloc(pool, 8192, &x) != 0 ||
      pinpool_record_stream(pool, x, 7) != 0 || pinpool_free(pool, x) != 0)
    return 1;
  return 0;
}
static int bg_query_run(void) {
  return d4_run("background=1,poll_us=1000", true, d4_pending_block);
}
static void last_ref_on_background(void **state) {
  (void)state;
  in_child("last_ref_on_background", bg_query_run);
}

/* The grower grows ahead of the buffer's demand: its backend call. */
static int grower_run(void) { return d4_run("grow_ahead=64MiB", false, NULL); }
static void last_ref_on_grower(void **state) {
  (void)state;
  in_child("last_ref_on_grower", grower_run);
}

/* A simulated stream's work (pinpool_sim_submit's fn) on its worker. */
static void sim_work(void *arg) {
  (void)arg;
  d4_maybe_release();
}
static int d4_submit(pinpool_t *pool) {
  return pinpool_sim_submit(pool, 3, 0, sim_work, NULL);
}
static int sim_run(void) {
  return d4_run("events=simulated", false, d4_submit);
}
static void last_ref_on_sim_stream(void **state) {
  (void)state;
  in_child("last_ref_on_sim_stream", sim_run);
}

/* A fork while the pool waits on the reaper's list (PP_HOOK_REAP holds the
 * parent's reaper before it takes it): the child's copy is torn down by the
 * child's own reaper, the parent's by the parent's. */
static pid_t reap_parent;
static atomic_int reap_held, reap_go;
static void reap_hook(int point) {
  if (point != PP_HOOK_REAP || getpid() != reap_parent)
    return;
  atomic_store(&reap_held, 1);
  (void)wait_flag(&reap_go);
}
/* Only the chunks: the child's new threads may reuse the parent's thread
 * descriptors (glibc reclaims the stacks of the threads a fork left). */
static int fork_child_part(void) {
  for (unsigned i = 0; i < WATCHDOG_MS; i++) {
    if (atomic_load(&d4.frees) == atomic_load(&d4.allocs))
      return 0;
    pp_sleep_ms(1);
  }
  return 40; /* the child's copy never torn down */
}
static int reap_fork_run(void) {
  reap_parent = getpid();
  atomic_store(&reap_held, 0);
  atomic_store(&reap_go, 0);
  atomic_store(&pp_test_hook, reap_hook);
  d4_reset();
  pinpool_hooks_t hooks = {&d4_backend, &d4_events, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex("background=1,poll_us=1000", &hooks, &pool) != 0)
    return 2;
  atomic_store(&d4.armed, 1);
  if (pinpool_buffer_alloc(pool, 4096, &d4.buf) != 0 ||
      d4_pending_block(pool) != 0)
    return 3;
  if (!wait_flag(&d4.entered))
    return 5;
  pinpool_destroy(pool);
  atomic_store(&d4.destroyed, 1);
  if (!wait_flag(&d4.released) || !wait_flag(&reap_held))
    return 6;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return 7;
  if (pid == 0)
    _exit(fork_child_part());
  int st = pp_wait_child(pid, WATCHDOG_MS);
  atomic_store(&reap_go, 1);
  if (st != 0)
    return st > 0 ? st : 8;
  int rc = d4_check_torn_down();
  atomic_store(&pp_test_hook, NULL);
  return rc;
}
static void reaper_fork(void **state) {
  (void)state;
  in_child("reaper_fork", reap_fork_run);
}

/* ---- D5: synchronize waits only for what was pending at its call -------
 * Events completed by hand: stream s's events complete when done[s] is
 * set; a synchronize callback counts its calls per stream and waits for
 * done[s] (at most the watchdog's time). */
#define NS 8
static atomic_int ev_done[NS], ev_synced[NS], d5_cut;
static pthread_t d5_p_tid;
static atomic_int d5_p_armed, d5_p_held, d5_p_go;
static pinpool_t *d5_pool;
static int d5_record(void *ctx, pinpool_stream_t s, void **e) {
  (void)ctx;
  int *v = malloc(sizeof *v);
  if (v == NULL)
    return PINPOOL_ENOMEM;
  *v = (int)s;
  *e = v;
  return 0;
}
static int d5_query(void *ctx, void *e) {
  (void)ctx;
  return atomic_load(&ev_done[*(int *)e]);
}
static int d5_sync(void *ctx, void *e) {
  (void)ctx;
  int s = *(int *)e;
  atomic_fetch_add(&ev_synced[s], 1);
  (void)wait_flag(&ev_done[s]);
  return 0;
}
static void d5_release(void *ctx, void *e) {
  (void)ctx;
  free(e);
}
static const pinpool_events_t d5_events = {"manual", d5_record,  d5_query,
                                           d5_sync,  d5_release, NULL};
static void d5_hook(int point) {
  if (point == PP_HOOK_SYNC_CUT)
    atomic_fetch_add(&d5_cut, 1);
  if (point == PP_HOOK_FREE_COUNTED && atomic_load(&d5_p_armed) &&
      pthread_equal(pthread_self(), d5_p_tid)) {
    atomic_store(&d5_p_held, 1);
    (void)wait_flag(&d5_p_go);
  }
}
static void d5_reset(void) {
  for (int i = 0; i < NS; i++) {
    atomic_store(&ev_done[i], 0);
    atomic_store(&ev_synced[i], 0);
  }
  atomic_store(&d5_cut, 0);
  atomic_store(&d5_p_armed, 0);
  atomic_store(&d5_p_held, 0);
  atomic_store(&d5_p_go, 0);
  atomic_store(&pp_test_hook, d5_hook);
}
static int free_on(pinpool_stream_t s) {
  void *x;
  if (pinpool_alloc(d5_pool, 4096, &x) != 0 ||
      pinpool_record_stream(d5_pool, x, s) != 0 ||
      pinpool_free(d5_pool, x) != 0)
    return -1;
  return 0;
}
static atomic_int sync_rc[2], sync_ret[2];
static void *sync_thread(void *arg) {
  int i = (int)(intptr_t)arg;
  atomic_store(&sync_rc[i], pinpool_synchronize(d5_pool));
  atomic_store(&sync_ret[i], 1);
  return NULL;
}
static void start_sync(pthread_t *t, int i) {
  atomic_store(&sync_rc[i], 1);
  atomic_store(&sync_ret[i], 0);
  (void)pthread_create(t, NULL, sync_thread, (void *)(intptr_t)i);
}
/* Wait for synchronize i to return, up to 5 s (it may be waiting for what
 * it must not: the caller then completes everything, and fails). */
static bool sync_returned(int i) {
  for (int ms = 0; ms < 5000 && !atomic_load(&sync_ret[i]); ms++)
    pp_sleep_ms(1);
  return atomic_load(&sync_ret[i]) != 0;
}
static void complete_all(void) {
  for (int i = 0; i < NS; i++)
    atomic_store(&ev_done[i], 1);
}
static int d5_end(int rc, pthread_t *t, int nt) {
  complete_all();
  for (int i = 0; i < nt; i++)
    (void)pthread_join(t[i], NULL);
  atomic_store(&pp_test_hook, NULL);
  if (rc == 0 &&
      (pinpool_synchronize(d5_pool) != 0 || pinpool_validate(d5_pool) != 0))
    rc = 59;
  pinpool_destroy(d5_pool);
  return rc;
}

/* rv3637f's sync_window, by hand: B pending on stream 1 while X
 * synchronizes (X's cut); A freed on stream 2; S synchronizes (its cut),
 * and inside S's wait for A, C is freed on stream 3. B and A complete, C
 * never does (until the end): S returns, C still pending, C's event never
 * synchronized. Before: S waited for C (two buckets: B's kept the
 * generation, C joined A's bucket), and its next pass synchronized C. */
static int window_run(void) {
  d5_reset();
  pinpool_hooks_t h = {NULL, &d5_events, NULL, NULL};
  if (pinpool_create_ex("backend=malloc", &h, &d5_pool) != 0)
    return 2;
  pthread_t t[2];
  if (free_on(1) != 0)
    return 3;
  start_sync(&t[0], 0); /* X */
  if (!wait_flag(&ev_synced[1]))
    return d5_end(4, t, 1);
  if (free_on(2) != 0)
    return d5_end(5, t, 1);
  start_sync(&t[1], 1); /* S */
  if (!wait_flag(&ev_synced[2]))
    return d5_end(6, t, 2);
  if (free_on(3) != 0) /* C: after S's cut (S is in its pass) */
    return d5_end(7, t, 2);
  atomic_store(&ev_done[1], 1);
  atomic_store(&ev_done[2], 1);
  if (!sync_returned(0) || !sync_returned(1))
    return d5_end(10, t, 2); /* waited for C */
  pinpool_stats_t st;
  if (atomic_load(&sync_rc[0]) != 0 || atomic_load(&sync_rc[1]) != 0 ||
      pinpool_get_stats(d5_pool, &st) != 0)
    return d5_end(11, t, 2);
  if (st.pending_blocks != 1 || atomic_load(&ev_synced[3]) != 0)
    return d5_end(12, t, 2); /* C: pending, and not waited for */
  return d5_end(0, t, 2);
}
static void sync_window(void **state) {
  (void)state;
  in_child("sync_window", window_run);
}

/* Two frees on one stream across a cut, queued in the other order: D
 * (freed first, counted before S's cut) is held at PP_HOOK_FREE_COUNTED
 * while S cuts and E (after the cut) is queued; then D queues behind E. S
 * must wait for D, so it must synchronize E (a head of a newer cohort,
 * with an older item behind it): else nobody polls, and S sleeps. */
static void *d5_p(void *arg) {
  (void)arg;
  (void)free_on(5);
  return NULL;
}
static int inversion_run(void) {
  d5_reset();
  pinpool_hooks_t h = {NULL, &d5_events, NULL, NULL};
  if (pinpool_create_ex("backend=malloc", &h, &d5_pool) != 0)
    return 2;
  pthread_t t[2];
  atomic_store(&d5_p_armed, 1);
  (void)pthread_create(&d5_p_tid, NULL, d5_p, NULL);
  t[0] = d5_p_tid;
  if (!wait_flag(&d5_p_held))
    return d5_end(3, t, 1);
  start_sync(&t[1], 1); /* S */
  if (!wait_flag(&d5_cut))
    return d5_end(4, t, 2);
  if (free_on(5) != 0) /* E: queued first, newer cohort */
    return d5_end(5, t, 2);
  atomic_store(&d5_p_go, 1); /* D queues behind E */
  for (int ms = 0; ms < 5000 && !atomic_load(&ev_synced[5]); ms++)
    pp_sleep_ms(1);
  if (!atomic_load(&ev_synced[5]))
    return d5_end(6, t, 2); /* S never synchronized stream 5 */
  atomic_store(&ev_done[5], 1);
  if (!sync_returned(1) || atomic_load(&sync_rc[1]) != 0)
    return d5_end(7, t, 2);
  return d5_end(0, t, 2);
}
static void sync_inversion(void **state) {
  (void)state;
  in_child("sync_inversion", inversion_run);
}

/* ---- D6: max_cached after a poll completes stream-ordered frees -------
 * 16 blocks of 4 MiB freed on stream 1 (manual events, d5's), completed,
 * then reclaimed by `how`: the caps apply to what became idle, and the
 * identities of docs/stats.md hold. In this process (no window to open:
 * a quiescent pool, the cmocka checks). */
#define CAP ((uint64_t)4 << 20)
static void cap_after(int how) {
  d5_reset();
  atomic_store(&pp_test_hook, NULL);
  pinpool_hooks_t h = {NULL, &d5_events, NULL, NULL};
  const char *conf = how == 2 ? "backend=malloc,max_cached=4MiB,"
                                "background=1,poll_us=1000"
                              : "backend=malloc,max_cached=4MiB";
  PP_OK(pinpool_create_ex(conf, &h, &d5_pool));
  void *x[16];
  for (int i = 0; i < 16; i++) {
    PP_OK(pinpool_alloc(d5_pool, 4 * MiB, &x[i]));
    PP_OK(pinpool_record_stream(d5_pool, x[i], 1));
  }
  for (int i = 0; i < 16; i++)
    PP_OK(pinpool_free(d5_pool, x[i]));
  pinpool_stats_t st = pp_stats_of(d5_pool);
  PP_ASSERT(st.pending_blocks == 16, "%llu pending",
            (unsigned long long)st.pending_blocks);
  uint64_t trimmed0 = st.trimmed_segments;
  atomic_store(&ev_done[1], 1);
  if (how == 0) {
    PP_OK(pinpool_synchronize(d5_pool));
  } else if (how == 1) {
    PP_OK(pinpool_process_events(d5_pool));
  } else if (how == 3) {
    /* An allocation's miss poll reclaims them (rv39c D3: 70 MiB stayed
     * cached under the cap, the 4 MiB taken from what became idle). */
    PP_OK(pinpool_alloc(d5_pool, 4 * MiB, &x[0]));
  } else { /* the background thread's pass: wait for its reclaim */
    for (unsigned i = 0; i < WATCHDOG_MS; i++) {
      st = pp_stats_of(d5_pool);
      if (st.pending_blocks == 0 && st.cached_bytes.current <= CAP)
        break;
      pp_sleep_ms(1);
    }
    /* A pass may still be between its release and the counts of it
     * (trimmed_segments): validate waits for the pass to end, and no
     * later pass has anything to trim. */
    PP_OK(pinpool_validate(d5_pool));
  }
  st = pp_stats_of(d5_pool);
  PP_ASSERT(st.pending_blocks == 0 && st.pending_bytes == 0,
            "%llu blocks pending", (unsigned long long)st.pending_blocks);
  PP_ASSERT(st.cached_bytes.current <= CAP,
            "cached %llu over max_cached %llu after the %s",
            (unsigned long long)st.cached_bytes.current,
            (unsigned long long)CAP,
            how == 0   ? "synchronize"
            : how == 1 ? "process_events"
            : how == 3 ? "allocation's poll"
                       : "background pass");
  PP_ASSERT(st.reserved_bytes.current == st.block_bytes.current +
                                             st.cached_bytes.current +
                                             st.pending_bytes,
            "reserved %llu != blocks %llu + cached %llu + pending %llu",
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)st.block_bytes.current,
            (unsigned long long)st.cached_bytes.current,
            (unsigned long long)st.pending_bytes);
  PP_ASSERT(st.trimmed_segments > trimmed0, "nothing trimmed (%llu)",
            (unsigned long long)st.trimmed_segments);
  PP_CHECK_CONSISTENT(d5_pool);
  if (how == 3)
    PP_OK(pinpool_free(d5_pool, x[0]));
  pinpool_destroy(d5_pool);
}
static void cap_after_synchronize(void **state) {
  (void)state;
  cap_after(0);
}
static void cap_after_process_events(void **state) {
  (void)state;
  cap_after(1);
}
static void cap_after_background(void **state) {
  (void)state;
  cap_after(2);
}
static void cap_after_allocation(void **state) {
  (void)state;
  cap_after(3);
}

/* rv39c D1: the same window, with another thread alive at the fork that
 * holds a thread cache of the listed pool. The child retires that thread's
 * record (fork_garbage, freed by the child's first call that takes the
 * thread lock); its cache of the listed pool was left linked in the
 * pool's list, which the child's reaper then walked: freed memory (ASan:
 * heap-use-after-free; release: SIGSEGV in about 1 child of 3). The child
 * holds its own reaper at PP_HOOK_REAP until it has made that call, so the
 * order is the failing one every time. */
static atomic_int cacher_ready, cacher_go, child_called;
static pinpool_t *cacher_pool;
static void *cacher_main(void *arg) {
  (void)arg;
  void *p;
  /* A small block freed: the thread's cache of the pool keeps it. */
  if (pinpool_alloc(cacher_pool, 256, &p) == 0)
    (void)pinpool_free(cacher_pool, p);
  atomic_store(&cacher_ready, 1);
  (void)wait_flag(&cacher_go); /* alive at the fork */
  return NULL;
}
static void reap_cache_hook(int point) {
  if (point != PP_HOOK_REAP)
    return;
  if (getpid() == reap_parent) {
    atomic_store(&reap_held, 1);
    (void)wait_flag(&reap_go);
  } else {
    (void)wait_flag(&child_called);
  }
}
static int fork_cache_child(void) {
  /* The child's first call that takes the thread lock: a cache of a pool
   * of its own frees the records of the threads the fork left. */
  pinpool_t *own;
  void *p;
  if (pinpool_create("", &own) != 0)
    return 41;
  if (pinpool_alloc(own, 256, &p) != 0 || pinpool_free(own, p) != 0)
    return 42;
  pinpool_destroy(own);
  atomic_store(&child_called, 1); /* the child's reaper may go on now */
  return fork_child_part();
}
static int reap_fork_cache_run(void) {
  reap_parent = getpid();
  atomic_store(&reap_held, 0);
  atomic_store(&reap_go, 0);
  atomic_store(&cacher_ready, 0);
  atomic_store(&cacher_go, 0);
  atomic_store(&child_called, 0);
  atomic_store(&pp_test_hook, reap_cache_hook);
  d4_reset();
  pinpool_hooks_t hooks = {&d4_backend, &d4_events, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex("background=1,poll_us=1000", &hooks, &pool) != 0)
    return 2;
  cacher_pool = pool;
  pthread_t cacher;
  if (pthread_create(&cacher, NULL, cacher_main, NULL) != 0)
    return 9;
  int rc = 0;
  if (!wait_flag(&cacher_ready)) {
    rc = 10;
    goto out;
  }
  atomic_store(&d4.armed, 1);
  if (pinpool_buffer_alloc(pool, 4096, &d4.buf) != 0 ||
      d4_pending_block(pool) != 0) {
    rc = 3;
    goto out;
  }
  if (!wait_flag(&d4.entered)) {
    rc = 5;
    goto out;
  }
  pinpool_destroy(pool);
  atomic_store(&d4.destroyed, 1);
  if (!wait_flag(&d4.released) || !wait_flag(&reap_held)) {
    rc = 6;
    goto out;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    rc = 7;
    goto out;
  }
  if (pid == 0)
    _exit(fork_cache_child());
  int st = pp_wait_child(pid, WATCHDOG_MS);
  if (st != 0)
    rc = st > 0 ? st : 8;
out:
  atomic_store(&reap_go, 1);
  atomic_store(&cacher_go, 1);
  (void)pthread_join(cacher, NULL);
  if (rc == 0)
    rc = d4_check_torn_down();
  atomic_store(&pp_test_hook, NULL);
  return rc;
}
static void reaper_fork_thread_cache(void **state) {
  (void)state;
  in_child("reaper_fork_thread_cache", reap_fork_cache_run);
}

/* rv39c D5: buffers released by the background thread's event query (the
 * "release when the device is done" pattern) went into that thread's own
 * thread cache, which no later call of that thread flushes: empty_cache
 * gave nothing back. Now a pool thread's calls use no thread cache (as
 * nested calls): after empty_cache nothing is cached. */
#define D5_N 16
static _Atomic(pinpool_buffer_t *) bgr_bufs[D5_N];
static atomic_int bgr_go, bgr_released, bgr_on_main;
static int bgr_query(void *ctx, void *e) {
  (void)ctx;
  (void)e;
  if (!atomic_load(&bgr_go))
    return 0;
  if (pthread_equal(pthread_self(), d4.main))
    atomic_store(&bgr_on_main, 1);
  for (int i = 0; i < D5_N; i++) {
    pinpool_buffer_t *b = atomic_exchange(&bgr_bufs[i], NULL);
    if (b != NULL && pinpool_buffer_release(b) == 0)
      atomic_fetch_add(&bgr_released, 1);
  }
  return 1;
}
static int bg_release_run(void) {
  d4_reset();
  atomic_store(&bgr_go, 0);
  atomic_store(&bgr_released, 0);
  atomic_store(&bgr_on_main, 0);
  static const pinpool_events_t ev = {"user",  d4_record, bgr_query,
                                      d4_sync, d4_evfree, NULL};
  pinpool_hooks_t hooks = {NULL, &ev, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex("backend=malloc,background=1,poll_us=1000", &hooks,
                        &pool) != 0)
    return 2;
  for (int i = 0; i < D5_N; i++) {
    pinpool_buffer_t *b;
    if (pinpool_buffer_alloc(pool, 65536, &b) != 0)
      return 3;
    atomic_store(&bgr_bufs[i], b);
  }
  atomic_store(&bgr_go, 1);
  if (d4_pending_block(pool) != 0) /* the background thread polls it */
    return 4;
  for (unsigned i = 0; i < WATCHDOG_MS && atomic_load(&bgr_released) < D5_N;
       i++)
    pp_sleep_ms(1);
  if (atomic_load(&bgr_released) != D5_N)
    return 5;
  if (pinpool_synchronize(pool) != 0 || pinpool_empty_cache(pool) != 0)
    return 6;
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0)
    return 7;
  int rc = 0;
  if (st.cached_bytes.current != 0) {
    fprintf(stderr, "bg_release: %llu bytes cached after empty_cache%s\n",
            (unsigned long long)st.cached_bytes.current,
            atomic_load(&bgr_on_main) ? " (a query ran on main)" : "");
    rc = 30;
  }
  pinpool_destroy(pool);
  return rc;
}
static void bg_release_empty_cache(void **state) {
  (void)state;
  in_child("bg_release_empty_cache", bg_release_run);
}

/* rv39c D6: the reaper's start fails (pthread_create: EAGAIN, injected by
 * pp_test_reaper_start_hook) when the pool is pushed on its list: the pool
 * stayed there for good unless another pool was pushed. Now the next pool
 * created starts the reaper again, and the listed pool is torn down. */
static atomic_int reaper_fails, reaper_starts;
static int reaper_start_fault(void) {
  atomic_fetch_add(&reaper_starts, 1);
  return atomic_load(&reaper_fails) > 0 &&
                 atomic_fetch_sub(&reaper_fails, 1) > 0
             ? EAGAIN
             : 0;
}
static int reaper_retry_run(void) {
  atomic_store(&reaper_fails, 1);
  atomic_store(&reaper_starts, 0);
  pp_test_reaper_start_hook = reaper_start_fault;
  d4_reset();
  pinpool_hooks_t hooks = {&d4_backend, &d4_events, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex("background=1,poll_us=1000", &hooks, &pool) != 0)
    return 2;
  atomic_store(&d4.armed, 1);
  if (pinpool_buffer_alloc(pool, 4096, &d4.buf) != 0 ||
      d4_pending_block(pool) != 0)
    return 3;
  if (!wait_flag(&d4.entered))
    return 5;
  pinpool_destroy(pool);
  atomic_store(&d4.destroyed, 1);
  if (!wait_flag(&d4.released))
    return 6;
  /* The push tried once, and failed (before the release returned). */
  if (atomic_load(&reaper_starts) != 1 || atomic_load(&reaper_fails) != 0)
    return 50;
  pinpool_t *other;
  if (pinpool_create("", &other) != 0)
    return 51;
  int rc = d4_check_torn_down();
  pinpool_destroy(other);
  pp_test_reaper_start_hook = NULL;
  return rc;
}
static void reaper_start_fails(void **state) {
  (void)state;
  in_child("reaper_start_fails", reaper_retry_run);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(last_ref_on_background),
      cmocka_unit_test(last_ref_on_grower),
      cmocka_unit_test(last_ref_on_sim_stream),
      cmocka_unit_test(reaper_fork),
      cmocka_unit_test(sync_window),
      cmocka_unit_test(sync_inversion),
      cmocka_unit_test(cap_after_synchronize),
      cmocka_unit_test(cap_after_process_events),
      cmocka_unit_test(cap_after_background),
      cmocka_unit_test(cap_after_allocation),
      cmocka_unit_test(reaper_fork_thread_cache),
      cmocka_unit_test(bg_release_empty_cache),
      cmocka_unit_test(reaper_start_fails),
  };
  return pp_run_selected("test_core39", all, sizeof all / sizeof all[0], argc,
                         argv);
}
