/*
 * Waits that must never wait for themselves (issue 37, third review,
 * rev37c: docs/verification.md, "Issue 37, the third review").
 *
 * Each scenario runs in a child process that the test waits for with a
 * watchdog (pp_wait_child): a deadlock fails the test instead of hanging
 * it until ctest's timeout.
 *  - fork_pollwait: a full poll inside a busy section (empty_cache) waited
 *    for a query made outside one (process_events); that poller entered a
 *    busy section after its query and waited at the fork gate, while a
 *    fork waited for the busy section: deadlock.
 *  - backend_reenter: a user backend's alloc that allocates from the same
 *    pool: the nested miss joined its own thread's growth in flight.
 *  - query_reenter: a provider's query that calls process_events: the
 *    nested full poll waited for the query its own thread was making.
 *  - validate_holds_background: pinpool_validate ran while the library's
 *    own background thread reclaimed a block (no user thread in the
 *    pool): "cached: structures hold X, counters say Y".
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_*, pp_fork_gate */

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define WATCHDOG_MS 20000u

/* Run fn in a child; its exit status must be 0 within the watchdog. */
static void in_child(int (*fn)(void), const char *what) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(fn());
  int st = pp_wait_child(pid, WATCHDOG_MS);
  PP_ASSERT(st != -1, "%s: deadlock (still running after %u ms)", what,
            WATCHDOG_MS);
  PP_ASSERT(st == 0, "%s: the child failed (%d)", what, st);
}

/* ---- A user event provider whose events are plain heap bytes ---------- */
static pinpool_t *g_pool;
static int ev_record(void *ctx, pinpool_stream_t s, void **ev) {
  (void)ctx;
  (void)s;
  *ev = malloc(1);
  return *ev != NULL ? 0 : PINPOOL_ENOMEM;
}
static int ev_sync(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  return 0;
}
static void ev_release(void *ctx, void *ev) {
  (void)ctx;
  free(ev);
}

/* A pool of the provider `query` with one block pending on stream 7. */
static int pending_pool(int (*query)(void *, void *)) {
  static pinpool_events_t evs;
  evs = (pinpool_events_t){"reenter37", ev_record,  query,
                           ev_sync,     ev_release, NULL};
  pinpool_hooks_t h = {0};
  h.events = &evs;
  if (pinpool_create_ex("backend=malloc", &h, &g_pool) != 0)
    return 10;
  void *b;
  if (pinpool_alloc(g_pool, 4096, &b) != 0 ||
      pinpool_record_stream(g_pool, b, 7) != 0)
    return 11;
  return pinpool_free(g_pool, b) == 0 ? 0 : 12;
}

static int pending_any(void) {
  pinpool_stats_t st;
  if (pinpool_get_stats(g_pool, &st) != 0)
    return -1;
  return st.pending_bytes != 0;
}

/* ---- fork_pollwait ------------------------------------------------------
 * B: process_events, its query held until a fork is under way (the gate
 * up) or done. A: empty_cache once B queries (before the fix it waited for
 * B inside its busy section: PP_HOOK_POLL_WAIT). C: forks once A waits or
 * has returned. Before the fix: C's fork waits for A's busy section, A for
 * B's query to end, B (its query done) at the fork gate. */
static _Atomic int fp_b_querying, fp_a_waiting, fp_a_done, fp_c_done;
static __thread int fp_is_b;

static int fp_query(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  if (fp_is_b) {
    atomic_store(&fp_b_querying, 1);
    while (atomic_load(&pp_fork_gate) == 0 && !atomic_load(&fp_c_done))
      pp_sleep_ms(1);
  }
  return 1;
}
static void fp_hook(int point) {
  if (point == PP_HOOK_POLL_WAIT)
    atomic_store(&fp_a_waiting, 1);
}
static void *fp_b(void *arg) {
  (void)arg;
  fp_is_b = 1;
  (void)pinpool_process_events(g_pool);
  return NULL;
}
static void *fp_a(void *arg) {
  (void)arg;
  while (!atomic_load(&fp_b_querying))
    pp_sleep_ms(1);
  (void)pinpool_empty_cache(g_pool);
  atomic_store(&fp_a_done, 1);
  return NULL;
}
static void *fp_c(void *arg) {
  (void)arg;
  while (!atomic_load(&fp_a_waiting) && !atomic_load(&fp_a_done))
    pp_sleep_ms(1);
  pid_t pid = fork();
  if (pid == 0)
    _exit(0);
  if (pid > 0)
    (void)waitpid(pid, NULL, 0);
  atomic_store(&fp_c_done, 1);
  return NULL;
}
static int fork_pollwait_run(void) {
  int rc = pending_pool(fp_query);
  if (rc != 0)
    return rc;
  atomic_store(&pp_test_hook, fp_hook);
  pthread_t a, b, c;
  pthread_create(&b, NULL, fp_b, NULL);
  pthread_create(&a, NULL, fp_a, NULL);
  pthread_create(&c, NULL, fp_c, NULL);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  pthread_join(c, NULL);
  atomic_store(&pp_test_hook, NULL);
  /* B's full poll drained the queue A skipped: nothing left pending. */
  if (pending_any() != 0)
    return 13;
  pinpool_destroy(g_pool);
  return 0;
}
static void fork_pollwait(void **state) {
  (void)state;
  in_child(fork_pollwait_run, "fork during empty_cache and process_events");
}

/* ---- backend_reenter ---------------------------------------------------- */
static __thread int br_depth;
static int br_nested, br_nested_ok;
static int br_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  if (g_pool != NULL && br_depth == 0) {
    br_depth = 1;
    void *q;
    br_nested++;
    if (pinpool_alloc(g_pool, 4096, &q) == 0) {
      br_nested_ok++;
      (void)pinpool_free(g_pool, q);
    }
    br_depth = 0;
  }
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return PINPOOL_ENOMEM;
  *out = m;
  return 0;
}
static void br_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  (void)munmap(p, size);
}
static int backend_reenter_run(void) {
  pinpool_backend_t be = {"reenter37", br_alloc, br_free, NULL, 0};
  if (pinpool_create_with_backend("", &be, &g_pool) != 0)
    return 10;
  void *b;
  if (pinpool_alloc(g_pool, 1 << 20, &b) != 0)
    return 11;
  /* The nested request was served (by a growth of its own). */
  if (br_nested < 1 || br_nested_ok != br_nested)
    return 12;
  if (pinpool_free(g_pool, b) != 0 || pinpool_validate(g_pool) != 0)
    return 13;
  pinpool_destroy(g_pool);
  return 0;
}
static void backend_reenter(void **state) {
  (void)state;
  in_child(backend_reenter_run, "a backend alloc that allocates");
}

/* ---- query_reenter ------------------------------------------------------ */
static __thread int qr_depth;
static int qr_nested;
static int qr_query(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  if (qr_depth == 0) {
    qr_depth = 1;
    qr_nested++;
    (void)pinpool_process_events(g_pool);
    qr_depth = 0;
  }
  return 1;
}
static int query_reenter_run(void) {
  int rc = pending_pool(qr_query);
  if (rc != 0)
    return rc;
  if (pinpool_process_events(g_pool) != 0 || qr_nested != 1)
    return 13;
  if (pending_any() != 0)
    return 14;
  pinpool_destroy(g_pool);
  return 0;
}
static void query_reenter(void **state) {
  (void)state;
  in_child(query_reenter_run, "a query that calls process_events");
}

/* ---- validate_holds_background -----------------------------------------
 * The background thread is held in a reclaim (PP_HOOK_EVENT_DONE: the
 * block's last event done, the block not yet cached) until validate
 * waits for it (PP_HOOK_VALIDATE_HOLD) or has returned. Validate must
 * return only after that pass: the block is cached, nothing pending,
 * when it returns (before the fix it ran beside the pass, which is how
 * r7's children and parent saw "cached: structures hold X, counters say
 * Y"; the window that showed it is inside the bin and hot-slot pushes). */
static _Atomic int vh_ready, vh_in_window, vh_waiting, vh_done;
static pthread_t vh_main;
static int vh_query(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  return atomic_load(&vh_ready);
}
static void vh_hook(int point) {
  if (point == PP_HOOK_VALIDATE_HOLD)
    atomic_store(&vh_waiting, 1);
  if (point != PP_HOOK_EVENT_DONE || pthread_equal(pthread_self(), vh_main))
    return;
  atomic_store(&vh_in_window, 1);
  while (!atomic_load(&vh_waiting) && !atomic_load(&vh_done))
    pp_sleep_ms(1);
}
static int validate_holds_background_run(void) {
  static pinpool_events_t evs;
  evs = (pinpool_events_t){"reenter37", ev_record,  vh_query,
                           ev_sync,     ev_release, NULL};
  pinpool_hooks_t h = {0};
  h.events = &evs;
  if (pinpool_create_ex("backend=malloc,background=1", &h, &g_pool) != 0)
    return 10;
  void *b;
  if (pinpool_alloc(g_pool, 4096, &b) != 0 ||
      pinpool_record_stream(g_pool, b, 7) != 0 || pinpool_free(g_pool, b))
    return 11;
  vh_main = pthread_self();
  atomic_store(&pp_test_hook, vh_hook);
  atomic_store(&vh_ready, 1);
  while (!atomic_load(&vh_in_window))
    pp_sleep_ms(1);
  int rc = pinpool_validate(g_pool);
  int left = pending_any(); /* before the hook may let the pass go */
  atomic_store(&vh_done, 1);
  if (rc != 0) {
    fprintf(stderr, "validate during the background reclaim: %s\n",
            pinpool_last_error());
    return 12;
  }
  if (left != 0) {
    fprintf(stderr, "validate returned during the background thread's "
                    "reclaim (a block still pending)\n");
    return 14;
  }
  atomic_store(&pp_test_hook, NULL);
  while (pending_any() != 0)
    pp_sleep_ms(1);
  if (pinpool_validate(g_pool) != 0)
    return 13;
  pinpool_destroy(g_pool);
  return 0;
}
static void validate_holds_background(void **state) {
  (void)state;
  in_child(validate_holds_background_run,
           "validate while the background thread reclaims");
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(fork_pollwait),
      cmocka_unit_test(backend_reenter),
      cmocka_unit_test(query_reenter),
      cmocka_unit_test(validate_holds_background),
  };
  return pp_run_selected("reenter37", all, sizeof all / sizeof all[0], argc,
                         argv);
}
