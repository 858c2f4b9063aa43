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

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(last_ref_on_background),
      cmocka_unit_test(last_ref_on_grower),
      cmocka_unit_test(last_ref_on_sim_stream),
      cmocka_unit_test(reaper_fork),
  };
  return pp_run_selected("test_core39", all, sizeof all / sizeof all[0], argc,
                         argv);
}
