/*
 * Waits for another thread on the growth and release paths (issue 37,
 * s39; docs/verification.md, "Issue 37 (s39): lock drops on growth and
 * release"). Each case runs in a child of fork under a watchdog (a defect
 * here is often a hang), drives one interleaving with PP_HOOK_* points and
 * counts; nothing is timed. A bounded wait in a hook only lets a thread go
 * on when the interleaving it waits for never comes (then an assertion
 * names it).
 *  - join_windows, join_fork: a miss joins another thread's growth in
 *    flight (arena.c, grow_take) and, while that growth is held between
 *    its backend call and its entering hold, a release (empty_cache), a
 *    trim (max_cached) or an out-of-memory retry (max_reserved) gives a
 *    whole free chunk back, or the process forks (the fork waits for
 *    both).
 *  - grower_inline: the grower's chunk in flight and an inline growth it
 *    cannot hold (the miss grows its own, without waiting for the grower);
 *    an inline growth in flight and the grower (it does not grow then).
 *  - retry_inline: an allocation refused by max_reserved because another
 *    thread's inline growth had just claimed the room waits for that
 *    growth's chunk, which holds its piece (it failed before).
 *  - cancel_join, cancel_settle, cancel_poll: pthread_cancel of a thread in
 *    each of pinpool's waits; the call completes, the cancel acts after it,
 *    the pool stays valid and no lock stays held (each hung or left a record
 *    behind before).
 *  - shed_windows: grow_ahead=auto's give-back held between the hold that
 *    takes its chunk out and the backend call, and a release, a trim and
 *    an out-of-memory retry in that window.
 *  - piece_windows: the lock drops between the pieces of issue 38's bounded
 *    release walks (PP_HOOK_WALK_PIECE), with a release, a trim and an
 *    out-of-memory retry in them.
 *  - gather_windows: the same in grow_take's last look (gather_locked).
 *  - poll_wait_bounded: rev37d's v7 probe, driven: a full poll waits at
 *    most twice for the misses that take a head that never completes (it
 *    waited again for each, as long as threads kept missing).
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_* */

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define WATCHDOG_MS 60000u
/* A hook's wait, in ms, for an interleaving that may not come. */
#define BOUND_MS 10000

static const char *g_case;
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s: ", g_case);                                         \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      return 1;                                                                \
    }                                                                          \
  } while (0)

static void in_child(const char *name, int (*run)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    g_case = name;
    _exit(run());
  }
  int st = pp_wait_child(pid, WATCHDOG_MS);
  PP_ASSERT(st == 0, "%s: the child failed (%d%s)", name, st,
            st == -1 ? ": a hang, killed by the watchdog" : "");
}

/* Wait (bounded) until *flag >= v. */
static bool wait_for(atomic_int *flag, int v) {
  for (int i = 0; i < BOUND_MS && atomic_load(flag) < v; i++)
    pp_sleep_ms(1);
  return atomic_load(flag) >= v;
}

struct op {
  pinpool_t *pool;
  size_t size;
  int hold;           /* the point to hold this thread at, once */
  atomic_int held;    /* it is held there */
  atomic_int release; /* let it go */
  int rc;
  void *p;
  atomic_int returned;
  char err[256]; /* pinpool_last_error() on failure */
  pthread_t t;
};

/* ---- The hook --------------------------------------------------------------
 * Counts every point of interest; holds a thread at the point it asked for
 * (its op's hold, once, until its release) or the grower at
 * PP_HOOK_GROW_AHEAD (g_hold_ahead, once, until g_ahead_release). */
static atomic_int g_joins, g_settles, g_ahead, g_grow_calls, g_poll_waits;
static atomic_int g_ahead_held, g_ahead_release;
static atomic_int g_hold_ahead;
static atomic_int g_ahead_in_window; /* GROW_AHEAD while g_window is set */
static atomic_int g_window;
typedef struct op op_t;
static _Thread_local op_t *tl_op;         /* the allocation this thread runs */
static void (*g_poll_fn)(void);           /* at PP_HOOK_POLL_WAIT */
static _Thread_local bool tl_poll_thread; /* g_poll_fn runs on this one */

static void hook(int point) {
  switch (point) {
  case PP_HOOK_GROW_JOIN:
    atomic_fetch_add(&g_joins, 1);
    break;
  case PP_HOOK_RETRY_SETTLE:
    atomic_fetch_add(&g_settles, 1);
    break;
  case PP_HOOK_GROW_CALL:
    atomic_fetch_add(&g_grow_calls, 1);
    break;
  case PP_HOOK_GROW_AHEAD:
    atomic_fetch_add(&g_ahead, 1);
    if (atomic_load(&g_window))
      atomic_fetch_add(&g_ahead_in_window, 1);
    if (atomic_exchange(&g_hold_ahead, 0)) {
      atomic_store(&g_ahead_held, 1);
      (void)wait_for(&g_ahead_release, 1);
    }
    return;
  case PP_HOOK_POLL_WAIT:
    atomic_fetch_add(&g_poll_waits, 1);
    if (tl_poll_thread && g_poll_fn != NULL)
      g_poll_fn();
    return;
  default:
    break;
  }
  if (tl_op != NULL && tl_op->hold == point) {
    tl_op->hold = 0;
    atomic_store(&tl_op->held, 1);
    (void)wait_for(&tl_op->release, 1);
  }
}

static void hook_reset(void) {
  atomic_store(&g_joins, 0);
  atomic_store(&g_settles, 0);
  atomic_store(&g_ahead, 0);
  atomic_store(&g_grow_calls, 0);
  atomic_store(&g_poll_waits, 0);
  atomic_store(&g_hold_ahead, 0);
  atomic_store(&g_ahead_held, 0);
  atomic_store(&g_ahead_release, 0);
  atomic_store(&g_ahead_in_window, 0);
  atomic_store(&g_window, 0);
  atomic_store(&pp_test_hook, hook);
}

/* An allocation on its own thread, held at `hold` (0: nowhere). */

static void *op_run(void *arg) {
  op_t *o = arg;
  tl_op = o;
  o->rc = pinpool_alloc(o->pool, o->size, &o->p);
  if (o->rc != 0)
    (void)snprintf(o->err, sizeof o->err, "%s", pinpool_last_error());
  atomic_store(&o->returned, 1);
  /* Cancelled here at the latest (the cancel_* cases): pinpool's waits
   * are not cancellation points. */
  pthread_testcancel();
  return NULL;
}

static bool op_start(op_t *o, pinpool_t *pool, size_t size, int hold) {
  *o = (op_t){.pool = pool, .size = size, .hold = hold};
  return pthread_create(&o->t, NULL, op_run, o) == 0;
}

/* ---- join_windows, join_fork ---------------------------------------------
 * X (4 MiB, its own chunk) is live. Thread G allocates 1 MiB: the arena is
 * full, it grows a 2 MiB chunk and is held at PP_HOOK_ARENA_GROW (chunk
 * made, not in the arena). Thread J allocates 512 KiB: it misses and joins
 * G's growth (PP_HOOK_GROW_JOIN). In that window X is freed and its chunk
 * given back (join_windows: release, trim, oom retry), or the
 * process forks (join_fork: the fork waits for G's and J's busy sections;
 * the child's pool is whole and works). Then G goes on: its entering hold
 * carves both pieces; one backend call served both. */
enum { ACT_RELEASE, ACT_TRIM, ACT_OOM, NACTS };
static const char *const act_names[NACTS] = {"release", "trim", "oom retry"};

static int join_setup_conf(const char *conf, pinpool_t **pool, void **x,
                           op_t *g, op_t *j) {
  hook_reset();
  CHECK(pinpool_create(conf, pool) == 0, "create: %s", pinpool_last_error());
  CHECK(pinpool_alloc(*pool, 4 * MiB, x) == 0, "alloc X");
  CHECK(op_start(g, *pool, MiB, PP_HOOK_ARENA_GROW), "thread G");
  CHECK(wait_for(&g->held, 1), "G never reached ARENA_GROW");
  CHECK(op_start(j, *pool, 512 * KiB, 0), "thread J");
  CHECK(wait_for(&g_joins, 1), "J did not join G's growth in flight");
  return 0;
}

static int join_setup(pinpool_t **pool, void **x, op_t *g, op_t *j) {
  return join_setup_conf("backend=host,mlock=0,populate=0,tcache_bytes=0", pool,
                         x, g, j);
}

static int join_finish(pinpool_t *pool, void *x, op_t *g, op_t *j,
                       uint64_t backend_allocs, uint64_t misses) {
  atomic_store(&g->release, 1);
  (void)pthread_join(g->t, NULL);
  (void)pthread_join(j->t, NULL);
  CHECK(g->rc == 0 && j->rc == 0, "allocations: G %d, J %d", g->rc, j->rc);
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.backend_alloc.count == backend_allocs &&
            atomic_load(&g_joins) == 1 && st.cache_misses == misses,
        "%llu backend allocations (%llu expected), %d joins, %llu misses",
        (unsigned long long)st.backend_alloc.count,
        (unsigned long long)backend_allocs, atomic_load(&g_joins),
        (unsigned long long)st.cache_misses);
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  pp_fill(g->p, MiB, 1);
  pp_fill(j->p, 512 * KiB, 2);
  CHECK(pp_filled(g->p, MiB, 1) && pp_filled(j->p, 512 * KiB, 2),
        "G's and J's blocks overlap");
  CHECK(pinpool_free(pool, g->p) == 0 && pinpool_free(pool, j->p) == 0, "free");
  if (x != NULL)
    CHECK(pinpool_free(pool, x) == 0, "free X");
  CHECK(pinpool_empty_cache(pool) == 0, "empty_cache");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  st = pp_stats_of(pool);
  CHECK(st.reserved_bytes.current == 0, "%llu bytes left reserved",
        (unsigned long long)st.reserved_bytes.current);
  pinpool_destroy(pool);
  return 0;
}

/* The window's act, on the main thread: X freed and its chunk given back
 * by pinpool_empty_cache (release), by the free itself past max_cached=2MiB
 * (trim), or by the out-of-memory retry of a 6 MiB allocation that
 * max_reserved=8MiB refuses until X's chunk is released (oom retry). */
static int join_window(int act) {
  static const char *const conf[NACTS] = {
      "backend=host,mlock=0,populate=0,tcache_bytes=0",
      "backend=host,mlock=0,populate=0,tcache_bytes=0,max_cached=2MiB",
      "backend=host,mlock=0,populate=0,tcache_bytes=0,max_reserved=8MiB"};
  pinpool_t *pool = NULL;
  void *x = NULL, *y = NULL;
  op_t g, j;
  if (join_setup_conf(conf[act], &pool, &x, &g, &j) != 0)
    return 1;
  /* The window: a whole free chunk given back while G's chunk is in
   * flight and J waits for it. */
  CHECK(pinpool_free(pool, x) == 0, "free X");
  if (act == ACT_RELEASE)
    CHECK(pinpool_empty_cache(pool) == 0, "empty_cache in the window: %s",
          pinpool_last_error());
  if (act == ACT_OOM) {
    CHECK(pinpool_alloc(pool, 6 * MiB, &y) == 0,
          "an allocation in the window: %s", pinpool_last_error());
    CHECK(pinpool_free(pool, y) == 0, "free Y");
  }
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.trimmed_segments >= 1 && st.backend_free.count == 1 &&
            atomic_load(&g.release) == 0 && atomic_load(&j.returned) == 0,
        "%s in the window: %llu chunks given back, J returned %d",
        act_names[act], (unsigned long long)st.backend_free.count,
        atomic_load(&j.returned));
  return join_finish(pool, NULL, &g, &j, act == ACT_OOM ? 3 : 2,
                     act == ACT_OOM ? 3 : 2);
}

static int join_windows_run(void) {
  for (int act = 0; act < NACTS; act++)
    if (join_window(act) != 0)
      return 1;
  return 0;
}

static void join_windows(void **state) {
  (void)state;
  in_child("join_windows", join_windows_run);
}

static atomic_int g_forking; /* the test's prepare handler ran */
static void note_fork(void) { atomic_store(&g_forking, 1); }

/* Lets G go once the fork has begun (the test's prepare handler runs
 * before pinpool's, which waits for G's and J's sections). */
static void *release_after_fork(void *arg) {
  op_t *g = arg;
  if (wait_for(&g_forking, 1))
    pp_sleep_ms(20); /* pinpool's prepare reaches its wait meanwhile */
  atomic_store(&g->release, 1);
  return NULL;
}

static int join_fork_child(pinpool_t *pool, void *x) {
  /* G's and J's allocations were done before the fork (their busy
   * sections): X, G's and J's blocks are live here, nothing in flight. */
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0 || st.requests.current != 3) {
    fprintf(stderr, "join_fork child: %llu blocks live\n",
            (unsigned long long)st.requests.current);
    return 20;
  }
  if (pinpool_validate(pool) != 0) {
    fprintf(stderr, "join_fork child: %s\n", pinpool_last_error());
    return 21;
  }
  void *q[4];
  for (int i = 0; i < 4; i++)
    if (pinpool_alloc(pool, 3 * MiB, &q[i]) != 0)
      return 22;
  for (int i = 0; i < 4; i++)
    if (pinpool_free(pool, q[i]) != 0)
      return 23;
  if (pinpool_free(pool, x) != 0 || pinpool_empty_cache(pool) != 0 ||
      pinpool_validate(pool) != 0)
    return 24;
  pinpool_destroy(pool);
  return 0;
}

static int join_fork_run(void) {
  pinpool_t *pool = NULL;
  void *x = NULL;
  op_t g, j;
  if (join_setup(&pool, &x, &g, &j) != 0)
    return 1;
  atomic_store(&g_forking, 0);
  CHECK(pthread_atfork(note_fork, NULL, NULL) == 0, "pthread_atfork");
  pthread_t r;
  CHECK(pthread_create(&r, NULL, release_after_fork, &g) == 0, "thread");
  pid_t pid = fork();
  if (pid == 0) {
    atomic_store(&pp_test_hook, NULL);
    _exit(join_fork_child(pool, x));
  }
  CHECK(pid > 0, "fork: %s", strerror(errno));
  (void)pthread_join(r, NULL);
  int st = pp_wait_child(pid, 30000);
  CHECK(st == 0,
        "the child forked while a growth and its joiner were in "
        "flight failed (%d)",
        st);
  return join_finish(pool, x, &g, &j, 2, 2);
}

static void join_fork(void **state) {
  (void)state;
  in_child("join_fork", join_fork_run);
}

/* ---- grower_inline ---------------------------------------------------------
 * 1. The grower's first chunk (16 MiB) is held at PP_HOOK_GROW_AHEAD; the
 *    main thread allocates 24 MiB, which that chunk cannot hold: it grows
 *    its own chunk and returns while the grower is still held (it never
 *    waits for a growth that cannot serve it). Then the grower's chunk
 *    enters (no release came), and every backend allocation is a miss's or
 *    the grower's.
 * 2. An inline growth held at PP_HOOK_GROW_CALL (in flight, not yet
 *    claimed) while the main thread takes the headroom below the target:
 *    the grower, looking meanwhile, grows nothing (an allocation's growth
 *    in flight: its chunk's tail is not in the room the grower reads, and
 *    the two chunks together could pass a cap); once that growth is in,
 *    it grows again. */
static bool ahead_room(pinpool_t *pool, size_t bytes) {
  for (int i = 0; i < BOUND_MS; i++) {
    if (pp_stats_of(pool).chunk_free_bytes >= bytes)
      return true;
    pp_sleep_ms(1);
  }
  return false;
}

static pinpool_t *ahead_pool(void) {
  pinpool_t *pool = NULL;
  if (pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=0,"
                     "grow_ahead=16MiB",
                     &pool) != 0)
    fprintf(stderr, "create: %s\n", pinpool_last_error());
  return pool;
}

static int grower_inline_run(void) {
  /* 1. The grower's chunk in flight, an inline growth beside it. */
  hook_reset();
  pinpool_t *pool = ahead_pool();
  CHECK(pool != NULL, "create");
  atomic_store(&g_hold_ahead, 1);
  void *p[8];
  int n = 0;
  CHECK(pinpool_alloc(pool, 3 * MiB, &p[n++]) == 0, "first alloc");
  CHECK(wait_for(&g_ahead_held, 1), "the grower never grew");
  pinpool_stats_t st0 = pp_stats_of(pool);
  CHECK(pinpool_alloc(pool, 24 * MiB, &p[n++]) == 0,
        "24 MiB beside the grower's chunk in flight: %s", pinpool_last_error());
  int released = atomic_load(&g_ahead_release);
  pinpool_stats_t st1 = pp_stats_of(pool);
  atomic_store(&g_ahead_release, 1);
  CHECK(released == 0 && atomic_load(&g_joins) == 0 &&
            st1.cache_misses == st0.cache_misses + 1,
        "the 24 MiB miss waited for the grower's 16 MiB chunk (joins %d, "
        "returned after the grower went on: %d)",
        atomic_load(&g_joins), released);
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  st1 = pp_stats_of(pool);
  CHECK(st1.grow_ahead_chunks >= 1 && st1.trimmed_segments == 0,
        "the grower's chunk beside an inline growth: %llu grown ahead, %llu "
        "given back",
        (unsigned long long)st1.grow_ahead_chunks,
        (unsigned long long)st1.trimmed_segments);
  for (int i = 0; i < n; i++)
    CHECK(pinpool_free(pool, p[i]) == 0, "free");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  pinpool_destroy(pool);

  /* 2. An inline growth in flight, the grower below its target. */
  hook_reset();
  pool = ahead_pool();
  CHECK(pool != NULL, "create");
  n = 0;
  CHECK(pinpool_alloc(pool, 3 * MiB, &p[n++]) == 0, "first alloc");
  CHECK(ahead_room(pool, 16 * MiB), "no headroom");
  op_t g;
  CHECK(op_start(&g, pool, 64 * MiB, PP_HOOK_GROW_CALL), "thread G");
  CHECK(wait_for(&g.held, 1), "G never reached GROW_CALL");
  atomic_store(&g_window, 1);
  for (int i = 0; i < 4; i++) /* the headroom falls below the target */
    CHECK(pinpool_alloc(pool, 3 * MiB, &p[n++]) == 0, "headroom alloc");
  pinpool_stats_t st2 = pp_stats_of(pool);
  pp_sleep_ms(50); /* the grower looks once a millisecond */
  atomic_store(&g_window, 0);
  int in_window = atomic_load(&g_ahead_in_window);
  atomic_store(&g.release, 1);
  (void)pthread_join(g.t, NULL);
  CHECK(g.rc == 0, "G: %s", g.err);
  CHECK(st2.chunk_free_bytes < 16 * MiB && st2.cache_misses == 1,
        "the window: %llu bytes free, %llu misses",
        (unsigned long long)st2.chunk_free_bytes,
        (unsigned long long)st2.cache_misses);
  CHECK(in_window == 0,
        "the grower grew %d chunks while an allocation's growth was in "
        "flight",
        in_window);
  CHECK(ahead_room(pool, 16 * MiB), "the grower did not grow after it");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  atomic_store(&pp_test_hook, NULL);
  for (int i = 0; i < n; i++)
    CHECK(pinpool_free(pool, p[i]) == 0, "free");
  CHECK(pinpool_free(pool, g.p) == 0, "free G");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  pinpool_destroy(pool);
  return 0;
}

static void grower_inline(void **state) {
  (void)state;
  in_child("grower_inline", grower_inline_run);
}

/* ---- retry_inline ------------------------------------------------------
 * max_reserved=6MiB, an empty pool. R allocates 1 MiB and is held at
 * PP_HOOK_GROW_CALL (its 2 MiB growth in flight, nothing claimed; its room
 * of 1 MiB cannot hold G's piece). G allocates 4 MiB + 4 KiB: a 6 MiB
 * chunk of its own, claimed, held at PP_HOOK_ARENA_GROW. R goes on: the
 * cap refuses its 2 MiB. G's chunk will hold R's piece (2 MiB - 4 KiB
 * free): R must get it (joining G's growth) rather than fail. Before, the
 * retry waited only for claims (releases, the grower's chunks) and saw
 * nothing to wait for: ENOMEM. */
static int retry_inline_run(void) {
  hook_reset();
  pinpool_t *pool = NULL;
  CHECK(pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=0,"
                       "max_reserved=6MiB",
                       &pool) == 0,
        "create: %s", pinpool_last_error());
  op_t r, g;
  CHECK(op_start(&r, pool, MiB, PP_HOOK_GROW_CALL), "thread R");
  CHECK(wait_for(&r.held, 1), "R never reached GROW_CALL");
  CHECK(op_start(&g, pool, 4 * MiB + 4 * KiB, PP_HOOK_ARENA_GROW), "thread G");
  CHECK(wait_for(&g.held, 1), "G never reached ARENA_GROW");
  CHECK(atomic_load(&g_joins) == 0, "G joined R's growth");
  /* R goes on; G stays held until R has joined its growth or returned. */
  atomic_store(&r.release, 1);
  for (int i = 0; i < BOUND_MS && atomic_load(&g_joins) == 0 &&
                  atomic_load(&r.returned) == 0;
       i++)
    pp_sleep_ms(1);
  int r_returned = atomic_load(&r.returned);
  atomic_store(&g.release, 1);
  (void)pthread_join(r.t, NULL);
  (void)pthread_join(g.t, NULL);
  (void)r_returned;
  CHECK(r.rc == 0,
        "an allocation the cap refused while another thread's growth, whose "
        "chunk holds its piece, was in flight failed: %s",
        r.err);
  CHECK(g.rc == 0, "G: %d", g.rc);
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.backend_alloc.count == 1 && st.oom_count == 0 &&
            atomic_load(&g_joins) == 1,
        "%llu backend allocations, %llu out of memory, %d joins",
        (unsigned long long)st.backend_alloc.count,
        (unsigned long long)st.oom_count, atomic_load(&g_joins));
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  CHECK(pinpool_free(pool, r.p) == 0 && pinpool_free(pool, g.p) == 0, "free");
  CHECK(pinpool_empty_cache(pool) == 0, "empty_cache");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  pinpool_destroy(pool);
  return 0;
}

static void retry_inline(void **state) {
  (void)state;
  in_child("retry_inline", retry_inline_run);
}

/* ---- cancel_join, cancel_settle, cancel_poll ------------------------------
 * pthread_cancel (deferred) of a thread while it waits in pinpool for
 * another thread: the wait is not a cancellation point (base.h,
 * pp_nocancel_enter), so the call completes and the cancel acts at the
 * thread's next cancellation point (op_run's pthread_testcancel). Then the
 * pool is valid, its locks are free (the thread that was waited for ends:
 * the watchdog would catch a hang), and a fork does not hang on the
 * cancelled thread's busy section. Before: cancel_join left the waiter's
 * record on a dead stack and its busy section open (the fork hung);
 * cancel_settle and cancel_poll died in pthread_cond_wait holding its
 * mutex (the thread waited for hung). */
static int cancel_check(pinpool_t *pool, op_t *v) {
  void *ret = NULL;
  (void)pthread_join(v->t, &ret);
  CHECK(atomic_load(&v->returned) == 1,
        "the thread cancelled in a pinpool wait never returned from "
        "pinpool_alloc");
  CHECK(ret == PTHREAD_CANCELED, "the cancel was lost");
  CHECK(v->rc == 0, "the cancelled thread's allocation: %s", v->err);
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  fflush(NULL);
  pid_t pid = fork(); /* waits for every busy section */
  if (pid == 0)
    _exit(pinpool_validate(pool) == 0 ? 0 : 1);
  CHECK(pid > 0 && pp_wait_child(pid, 10000) == 0, "fork after the cancel");
  CHECK(pinpool_free(pool, v->p) == 0, "free the cancelled thread's block");
  CHECK(pinpool_empty_cache(pool) == 0, "empty_cache");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  return 0;
}

static int cancel_join_run(void) {
  pinpool_t *pool = NULL;
  void *x = NULL;
  op_t g, j;
  if (join_setup(&pool, &x, &g, &j) != 0) /* J waits for G's growth */
    return 1;
  CHECK(pthread_cancel(j.t) == 0, "pthread_cancel");
  pp_sleep_ms(20); /* a cancellation point would act now */
  atomic_store(&g.release, 1);
  (void)pthread_join(g.t, NULL);
  CHECK(g.rc == 0, "G: %d", g.rc);
  if (cancel_check(pool, &j) != 0)
    return 1;
  CHECK(pinpool_free(pool, g.p) == 0 && pinpool_free(pool, x) == 0, "free");
  pinpool_destroy(pool);
  return 0;
}

static void cancel_join(void **state) {
  (void)state;
  in_child("cancel_join", cancel_join_run);
}

/* A release (empty_cache) held at PP_HOOK_ARENA_RELEASE with its claim in
 * flight; the victim's allocation is refused by max_reserved and its retry
 * waits for that claim (PP_HOOK_RETRY_SETTLE). */
static atomic_int rel_held, rel_release;
static void *release_run(void *arg) {
  pinpool_t *pool = arg;
  (void)pinpool_empty_cache(pool);
  return NULL;
}
static void hold_release(int point) {
  if (point == PP_HOOK_ARENA_RELEASE && atomic_load(&rel_held) == 0) {
    atomic_store(&rel_held, 1);
    (void)wait_for(&rel_release, 1);
    return;
  }
  hook(point);
}

static int cancel_settle_run(void) {
  hook_reset();
  atomic_store(&rel_held, 0);
  atomic_store(&rel_release, 0);
  pinpool_t *pool = NULL;
  CHECK(pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=0,"
                       "max_reserved=16MiB",
                       &pool) == 0,
        "create: %s", pinpool_last_error());
  void *a = NULL, *b = NULL;
  CHECK(pinpool_alloc(pool, 8 * MiB, &a) == 0, "alloc A");
  CHECK(pinpool_alloc(pool, 8 * MiB, &b) == 0, "alloc B");
  CHECK(pinpool_free(pool, a) == 0, "free A");
  atomic_store(&pp_test_hook, hold_release);
  pthread_t e;
  CHECK(pthread_create(&e, NULL, release_run, pool) == 0, "thread E");
  CHECK(wait_for(&rel_held, 1), "the release never reached ARENA_RELEASE");
  op_t v;
  CHECK(op_start(&v, pool, 4 * MiB, 0), "thread V");
  CHECK(wait_for(&g_settles, 1), "V's retry did not wait for the claim");
  CHECK(pthread_cancel(v.t) == 0, "pthread_cancel");
  pp_sleep_ms(20); /* a cancellation point would act now */
  atomic_store(&rel_release, 1);
  (void)pthread_join(e, NULL);
  if (cancel_check(pool, &v) != 0)
    return 1;
  CHECK(pinpool_free(pool, b) == 0, "free B");
  pinpool_destroy(pool);
  return 0;
}

static void cancel_settle(void **state) {
  (void)state;
  in_child("cancel_settle", cancel_settle_run);
}

/* ---- A user event provider whose queries can be held ---------------------
 * Every event stays not done until synchronized. While pq_gate is set, the
 * n-th query waits (bounded) until pq_released >= n. */
static atomic_int pq_gate, pq_entered, pq_released;
static int pq_record(void *c, pinpool_stream_t s, void **ev) {
  (void)c;
  (void)s;
  *ev = calloc(1, sizeof(int));
  return *ev != NULL ? 0 : PINPOOL_ENOMEM;
}
static int pq_query(void *c, void *ev) {
  (void)c;
  if (atomic_load(&pq_gate)) {
    int n = atomic_fetch_add(&pq_entered, 1) + 1;
    for (int i = 0;
         i < BOUND_MS && atomic_load(&pq_gate) && atomic_load(&pq_released) < n;
         i++)
      pp_sleep_ms(1);
  }
  return *(int *)ev;
}
static int pq_sync(void *c, void *ev) {
  (void)c;
  *(int *)ev = 1;
  return 0;
}
static void pq_release(void *c, void *ev) {
  (void)c;
  free(ev);
}
static const pinpool_events_t pq_events = {"user",  pq_record,  pq_query,
                                           pq_sync, pq_release, NULL};

/* A pool with one pending block on stream 7 whose event never completes
 * (until synchronized). */
static int pq_pool(pinpool_t **pool) {
  atomic_store(&pq_gate, 0);
  atomic_store(&pq_entered, 0);
  atomic_store(&pq_released, 0);
  pinpool_hooks_t h = {NULL, &pq_events, NULL, NULL};
  CHECK(pinpool_create_ex("tcache_bytes=0", &h, pool) == 0, "create: %s",
        pinpool_last_error());
  void *p = NULL;
  CHECK(pinpool_alloc(*pool, 4096, &p) == 0, "alloc");
  CHECK(pinpool_record_stream(*pool, p, 7) == 0, "record");
  CHECK(pinpool_free(*pool, p) == 0, "free");
  return 0;
}

/* A miss: its poll queries the head (held by the gate). */
static void *miss_once(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, MiB, &p) == 0)
    (void)pinpool_free(pool, p);
  return NULL;
}

typedef struct pe_op {
  pinpool_t *pool;
  int rc;
  atomic_int returned;
  pthread_t t;
} pe_op_t;
static void *process_run(void *arg) {
  pe_op_t *o = arg;
  o->rc = pinpool_process_events(o->pool);
  atomic_store(&o->returned, 1);
  pthread_testcancel();
  return NULL;
}

static int cancel_poll_run(void) {
  hook_reset();
  pinpool_t *pool = NULL;
  if (pq_pool(&pool) != 0)
    return 1;
  atomic_store(&pq_gate, 1);
  pthread_t m;
  CHECK(pthread_create(&m, NULL, miss_once, pool) == 0, "thread M");
  CHECK(wait_for(&pq_entered, 1), "the miss never queried the head");
  pe_op_t v = {.pool = pool};
  CHECK(pthread_create(&v.t, NULL, process_run, &v) == 0, "thread V");
  CHECK(wait_for(&g_poll_waits, 1), "the full poll did not wait");
  CHECK(pthread_cancel(v.t) == 0, "pthread_cancel");
  pp_sleep_ms(20);           /* a cancellation point would act now */
  atomic_store(&pq_gate, 0); /* every query returns: not done */
  (void)pthread_join(m, NULL);
  void *ret = NULL;
  (void)pthread_join(v.t, &ret);
  CHECK(atomic_load(&v.returned) == 1,
        "the thread cancelled in the full poll's wait never returned from "
        "pinpool_process_events");
  CHECK(ret == PTHREAD_CANCELED && v.rc == 0, "cancel lost, or rc %d", v.rc);
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  CHECK(pinpool_process_events(pool) == 0, "process_events");
  CHECK(pinpool_synchronize(pool) == 0, "synchronize");
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.pending_blocks == 0, "%llu blocks pending after synchronize",
        (unsigned long long)st.pending_blocks);
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  pinpool_destroy(pool);
  return 0;
}

static void cancel_poll(void **state) {
  (void)state;
  in_child("cancel_poll", cancel_poll_run);
}

/* ---- poll_wait_bounded (rev37d's v7) -----------------------------------
 * Two threads miss continuously (each miss queries the head, which never
 * completes). A process_events meets the head held by one miss's query and
 * waits (PP_HOOK_POLL_WAIT); there the hook lets that query end and waits
 * until the other thread's next miss has begun a query of the same head:
 * the poll, woken, finds the head held again. Up to PW_LIMIT times. A full
 * poll promises the events completed before the call: once a query begun
 * after the call found the head not done, it moves on. At most 2 waits
 * (one for a query begun before it, one for a query begun after); it
 * waited PW_LIMIT times before, and as long as misses came in v7. */
#define PW_LIMIT 20
static atomic_int pw_stop;
static void *miss_loop(void *arg) {
  pinpool_t *pool = arg;
  while (!atomic_load(&pw_stop)) {
    /* Four blocks at once: the hot slots hold fewer, the others go to
     * the bins (take_with_retry), whose miss polls. */
    void *p[4];
    int n = 0;
    while (n < 4 && pinpool_alloc(pool, MiB, &p[n]) == 0)
      n++;
    while (n > 0)
      (void)pinpool_free(pool, p[--n]);
  }
  return NULL;
}
static atomic_int pw_waits;
static void pw_at_wait(void) {
  int k = atomic_fetch_add(&pw_waits, 1) + 1;
  if (k >= PW_LIMIT) {
    atomic_store(&pq_gate, 0);
    return;
  }
  /* The query the poll waits for ends; the next one begins. */
  int next = atomic_load(&pq_released) + 2;
  atomic_fetch_add(&pq_released, 1);
  (void)wait_for(&pq_entered, next);
}

static int poll_wait_bounded_run(void) {
  hook_reset();
  pinpool_t *pool = NULL;
  if (pq_pool(&pool) != 0)
    return 1;
  atomic_store(&pw_stop, 0);
  atomic_store(&pw_waits, 0);
  atomic_store(&pq_gate, 1);
  pthread_t m[2];
  for (int i = 0; i < 2; i++)
    CHECK(pthread_create(&m[i], NULL, miss_loop, pool) == 0, "thread");
  CHECK(wait_for(&pq_entered, 1), "no miss queried the head");
  g_poll_fn = pw_at_wait;
  tl_poll_thread = true;
  int rc = pinpool_process_events(pool);
  tl_poll_thread = false;
  g_poll_fn = NULL;
  int waits = atomic_load(&pw_waits);
  atomic_store(&pq_gate, 0);
  atomic_store(&pw_stop, 1);
  for (int i = 0; i < 2; i++)
    (void)pthread_join(m[i], NULL);
  CHECK(rc == 0, "process_events: %d", rc);
  CHECK(waits >= 1, "the full poll never waited for a miss's query");
  CHECK(waits <= 2,
        "one process_events waited %d times for misses that took a head "
        "that never completes",
        waits);
  CHECK(pinpool_synchronize(pool) == 0, "synchronize");
  CHECK(pinpool_validate(pool) == 0, "validate: %s", pinpool_last_error());
  pinpool_destroy(pool);
  return 0;
}

static void poll_wait_bounded(void **state) {
  (void)state;
  in_child("poll_wait_bounded", poll_wait_bounded_run);
}

/* ---- shed_windows ----------------------------------------------------------
 * grow_ahead=auto gives back chunks it grew once the demand stays flat
 * (pp_arena_shed): a chunk out of the arena in one hold of seg_lock, then
 * given to the backend with no lock held, its claim in flight. The grower
 * is held there (PP_HOOK_GROW_SHED, its first give-back) while another
 * thread runs a release (pinpool_empty_cache), a trim (frees past
 * max_cached) or an allocation that max_reserved refuses (its retry waits
 * for the give-back's claim: the hook lets the grower go once it waits).
 * Then the pool is consistent, every chunk went back once (nothing stays
 * reserved after the last free and empty_cache). */
static atomic_int sh_hold, sh_fired, sh_act_done, sh_hook_done;
static int sh_act, sh_rc;
static pinpool_t *sh_pool;
static void *sh_blk[16];
static pthread_t sh_late;
static bool sh_late_set;

static void *shed_act_run(void *arg) {
  (void)arg;
  int rc = 0;
  if (sh_act == ACT_RELEASE) { /* half the jump freed, then released */
    for (int i = 8; i < 16 && rc == 0; i++) {
      rc = pinpool_free(sh_pool, sh_blk[i]);
      sh_blk[i] = NULL;
    }
    if (rc == 0)
      rc = pinpool_empty_cache(sh_pool);
  } else if (sh_act == ACT_TRIM) {
    for (int i = 0; i < 8 && rc == 0; i++) {
      rc = pinpool_free(sh_pool, sh_blk[i]);
      sh_blk[i] = NULL;
    }
  } else { /* under the cap, above what it leaves: refused, retried */
    void *p = NULL;
    rc = pinpool_alloc(sh_pool, 156 * MiB, &p);
    if (rc == 0)
      rc = pinpool_free(sh_pool, p);
    else if (rc == PINPOOL_ENOMEM)
      rc = 0; /* a clean failure: nothing the release could make fit */
  }
  sh_rc = rc;
  atomic_store(&sh_act_done, 1);
  return NULL;
}

static void shed_hook(int point) {
  if (point != PP_HOOK_GROW_SHED || !atomic_exchange(&sh_hold, 0)) {
    hook(point);
    return;
  }
  atomic_store(&sh_fired, 1);
  pthread_t t;
  if (pthread_create(&t, NULL, shed_act_run, NULL) != 0) {
    sh_rc = -9999;
    atomic_store(&sh_hook_done, 1);
    return;
  }
  for (int i = 0; i < BOUND_MS && atomic_load(&sh_act_done) == 0 &&
                  atomic_load(&g_settles) == 0;
       i++)
    pp_sleep_ms(1);
  if (atomic_load(&sh_act_done) != 0) {
    (void)pthread_join(t, NULL);
  } else {
    sh_late = t;
    sh_late_set = true;
  }
  atomic_store(&sh_hook_done, 1);
}

static int shed_window(int act) {
  static const char *const conf[NACTS] = {
      "backend=host,mlock=0,populate=0,tcache_bytes=0,grow_ahead=auto",
      "backend=host,mlock=0,populate=0,tcache_bytes=0,grow_ahead=auto,"
      "max_cached=64MiB",
      "backend=host,mlock=0,populate=0,tcache_bytes=0,grow_ahead=auto,"
      "max_reserved=160MiB"};
  hook_reset();
  sh_act = act;
  sh_rc = 0;
  sh_late_set = false;
  atomic_store(&sh_hold, 0);
  atomic_store(&sh_fired, 0);
  atomic_store(&sh_act_done, 0);
  atomic_store(&sh_hook_done, 0);
  CHECK(pinpool_create(conf[act], &sh_pool) == 0, "create: %s",
        pinpool_last_error());
  pinpool_t *pool = sh_pool;
  for (int i = 0; i < 16; i++) /* the jump: 64 MiB at once */
    CHECK(pinpool_alloc(pool, 4 * MiB, &sh_blk[i]) == 0, "jump");
  atomic_store(&sh_hold, 1);
  atomic_store(&pp_test_hook, shed_hook);
  /* Flat from now on: the grower's give-back comes within a window. */
  for (int i = 0; i < 3 * BOUND_MS && atomic_load(&sh_hook_done) == 0; i++)
    pp_sleep_ms(1);
  CHECK(atomic_load(&sh_fired) == 1, "%s: the grower gave nothing back",
        act_names[act]);
  CHECK(atomic_load(&sh_hook_done) == 1, "%s: the hook never returned",
        act_names[act]);
  if (sh_late_set)
    (void)pthread_join(sh_late, NULL);
  CHECK(pinpool_validate(pool) == 0, "%s: validate: %s", act_names[act],
        pinpool_last_error()); /* waits for the give-back (grow.mu) */
  atomic_store(&pp_test_hook, NULL);
  CHECK(sh_rc == 0, "%s in the grower's give-back: %d", act_names[act], sh_rc);
  CHECK(act == ACT_OOM || !sh_late_set,
        "%s: did not end in the grower's give-back window", act_names[act]);
  CHECK(act != ACT_OOM || atomic_load(&g_settles) >= 1,
        "oom retry: the retry did not wait for the give-back's claim");
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.trimmed_segments >= 1 + (act != ACT_OOM),
        "%s: %llu chunks given back", act_names[act],
        (unsigned long long)st.trimmed_segments);
  for (int i = 0; i < 16; i++)
    if (sh_blk[i] != NULL)
      CHECK(pinpool_free(pool, sh_blk[i]) == 0, "free");
  CHECK(pinpool_empty_cache(pool) == 0, "empty_cache");
  CHECK(pinpool_validate(pool) == 0, "%s: validate: %s", act_names[act],
        pinpool_last_error());
  st = pp_stats_of(pool);
  CHECK(st.reserved_bytes.current == 0 && st.chunk_free_bytes == 0,
        "%s: %llu bytes reserved after the last free and empty_cache",
        act_names[act], (unsigned long long)st.reserved_bytes.current);
  pinpool_destroy(pool);
  return 0;
}

static int shed_windows_run(void) {
  for (int act = 0; act < NACTS; act++)
    if (shed_window(act) != 0)
      return 1;
  return 0;
}

static void shed_windows(void **state) {
  (void)state;
  in_child("shed_windows", shed_windows_run);
}

/* ---- piece_windows ---------------------------------------------------------
 * Issue 38 split the release walks into bounded holds: the deferred
 * stack 32 blocks a hold of seg_lock (pp_defer_drain, and grow_take's last
 * look), the idle segments given back 32 a hold (release_batch), the trim
 * walk 64 elements a hold of trim_lock (trim_yield). Between two holds no
 * lock is held (PP_HOOK_WALK_PIECE). The main thread's pinpool_empty_cache
 * is stopped at its first such drop, and another thread runs a release, a
 * trim or an out-of-memory retry there; then everything went back once.
 *  - slabs: 72 idle slabs (one block of each slab class allocated, all
 *    freed): release_batch's and trim_yield's drops.
 *  - deferred: 40 large blocks freed into a pool without max_cached, whose
 *    large frees are deferred: pp_defer_drain's drops. A trimming pool
 *    defers nothing, so only the release and the retry run there. */
#define PC_MAX 6 /* firings with an act */
static atomic_int pc_fired, pc_done, pc_waiting;
static _Thread_local bool tl_pc_main;
static int pc_act, pc_rc;
static uint64_t pc_trimmed; /* ACT_TRIM: chunks its free gave back */
static pinpool_t *pc_pool;
static void *pc_keep[PC_MAX]; /* ACT_TRIM: one freed a window, past the cap */
static pthread_t pc_late[PC_MAX];
static int pc_nlate;

static void *piece_act_run(void *arg) {
  int k = (int)(intptr_t)arg;
  int rc = 0;
  if (pc_act == ACT_RELEASE) {
    rc = pinpool_empty_cache(pc_pool);
  } else if (pc_act == ACT_TRIM) {
    uint64_t before = pp_stats_of(pc_pool).trimmed_segments;
    rc = pinpool_free(pc_pool, pc_keep[k]);
    pc_keep[k] = NULL;
    pc_trimmed += pp_stats_of(pc_pool).trimmed_segments - before;
  } else {
    void *p = NULL;
    rc = pinpool_alloc(pc_pool, 40 * MiB, &p);
    if (rc == 0)
      rc = pinpool_free(pc_pool, p);
    else if (rc == PINPOOL_ENOMEM)
      rc = 0; /* the window may hold what it needs: a clean failure */
  }
  if (rc != 0)
    pc_rc = rc;
  atomic_store(&pc_done, 1);
  return NULL;
}

static void piece_hook(int point) {
  if (point == PP_HOOK_RETRY_SETTLE && !tl_pc_main)
    atomic_store(&pc_waiting, 1);
  if (point != PP_HOOK_WALK_PIECE || !tl_pc_main)
    return;
  int k = atomic_fetch_add(&pc_fired, 1);
  if (k >= PC_MAX)
    return;
  atomic_store(&pc_done, 0);
  atomic_store(&pc_waiting, 0);
  pthread_t t;
  if (pthread_create(&t, NULL, piece_act_run, (void *)(intptr_t)k) != 0) {
    pc_rc = -9999;
    return;
  }
  for (int i = 0; i < BOUND_MS && atomic_load(&pc_done) == 0 &&
                  atomic_load(&pc_waiting) == 0;
       i++)
    pp_sleep_ms(1);
  if (atomic_load(&pc_done) != 0)
    (void)pthread_join(t, NULL);
  else
    pc_late[pc_nlate++] = t;
}

static int piece_window(bool deferred, int act) {
  static const char *const conf[NACTS] = {
      "backend=host,mlock=0,populate=0,tcache_bytes=0",
      /* 42 MiB cached once the slabs are idle: each keep block's free
       * passes the cap */
      "backend=host,mlock=0,populate=0,tcache_bytes=0,max_cached=44MiB",
      "backend=host,mlock=0,populate=0,tcache_bytes=0,max_reserved=64MiB"};
  const char *what = deferred ? "deferred" : "slabs";
  hook_reset();
  atomic_store(&pp_test_hook, NULL);
  pc_act = act;
  pc_rc = 0;
  memset(pc_keep, 0, sizeof pc_keep);
  pc_trimmed = 0;
  pc_nlate = 0;
  atomic_store(&pc_fired, 0);
  atomic_store(&pc_done, 0);
  atomic_store(&pc_waiting, 0);
  CHECK(pinpool_create(conf[act], &pc_pool) == 0, "create: %s",
        pinpool_last_error());
  pinpool_t *pool = pc_pool;
  enum { N = 72 };
  void *p[N];
  int n = 0;
  if (deferred) { /* one class: the hot slot keeps one, the rest defer */
    for (; n < 40; n++)
      CHECK(pinpool_alloc(pool, 300 * KiB, &p[n]) == 0, "alloc");
  } else { /* one block of each slab class: a slab each */
    for (size_t bs = 512; bs <= 256 * KiB && n < N; bs = pp_ref_class(bs + 1))
      CHECK(pinpool_alloc(pool, bs, &p[n++]) == 0, "alloc %zu", bs);
  }
  if (act == ACT_TRIM) /* 4 MiB each, freed in a window past max_cached */
    for (int i = 0; i < PC_MAX; i++)
      CHECK(pinpool_alloc(pool, 4 * MiB, &pc_keep[i]) == 0, "alloc keep");
  for (int i = 0; i < n; i++)
    CHECK(pinpool_free(pool, p[i]) == 0, "free");
  tl_pc_main = true;
  atomic_store(&pp_test_hook, piece_hook);
  int rc = pinpool_empty_cache(pool);
  atomic_store(&pp_test_hook, NULL);
  tl_pc_main = false;
  for (int i = 0; i < pc_nlate; i++)
    (void)pthread_join(pc_late[i], NULL);
  CHECK(rc == 0, "%s, %s: empty_cache: %s", what, act_names[act],
        pinpool_last_error());
  /* At least one (an act that releases takes the rest of the idle
   * slabs: main's walk then has fewer pieces; the trim's run 3). */
  CHECK(atomic_load(&pc_fired) >= 1,
        "%s, %s: empty_cache dropped a lock between pieces %d times", what,
        act_names[act], atomic_load(&pc_fired));
  CHECK(pc_rc == 0, "%s, %s in the window: %d", what, act_names[act], pc_rc);
  CHECK(act != ACT_TRIM || pc_trimmed >= 1,
        "%s, trim: the free in the window trimmed nothing", what);
  CHECK(pinpool_validate(pool) == 0, "%s, %s: validate: %s", what,
        act_names[act], pinpool_last_error());
  for (int i = 0; i < PC_MAX; i++)
    if (pc_keep[i] != NULL)
      CHECK(pinpool_free(pool, pc_keep[i]) == 0, "free keep");
  CHECK(pinpool_empty_cache(pool) == 0, "empty_cache");
  CHECK(pinpool_validate(pool) == 0, "%s, %s: validate: %s", what,
        act_names[act], pinpool_last_error());
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.reserved_bytes.current == 0 && st.requests.current == 0,
        "%s, %s: %llu bytes reserved, %llu blocks live at the end", what,
        act_names[act], (unsigned long long)st.reserved_bytes.current,
        (unsigned long long)st.requests.current);
  pinpool_destroy(pool);
  return 0;
}

static int piece_windows_run(void) {
  for (int act = 0; act < NACTS; act++)
    if (piece_window(false, act) != 0)
      return 1;
  for (int act = 0; act < NACTS; act++)
    if (act != ACT_TRIM && piece_window(true, act) != 0)
      return 1;
  return 0;
}

static void piece_windows(void **state) {
  (void)state;
  in_child("piece_windows", piece_windows_run);
}

/* ---- gather_windows
 * ---------------------------------------------------------- grow_take's last
 * look gathers every block deferred since the miss, 32 a hold (gather_locked,
 * PP_HOOK_WALK_PIECE between two). The main thread's 32 MiB miss is stopped at
 * PP_HOOK_ARENA_LAP, where another thread frees 40 blocks of 300 KiB (one to
 * the hot slot, 39 deferred: a pool without max_cached); the last look then
 * drops seg_lock after its first piece, and there another thread runs a release
 * or an out-of-memory retry (a trim cannot: a trimming pool defers nothing).
 * The allocation succeeds having grown the arena once, and everything goes back
 * once. */
static atomic_int ga_lapped, ga_fired;
static pinpool_t *ga_pool;
static void *ga_blk[40];
static int ga_act, ga_rc;
static pthread_t ga_late;
static bool ga_late_set;

static void *ga_free_run(void *arg) {
  (void)arg;
  for (int i = 0; i < 40; i++)
    if (pinpool_free(ga_pool, ga_blk[i]) != 0)
      ga_rc = -1;
  return NULL;
}

static void *ga_act_run(void *arg) {
  (void)arg;
  int rc;
  if (ga_act == ACT_RELEASE) {
    rc = pinpool_empty_cache(ga_pool);
  } else {
    void *p = NULL;
    rc = pinpool_alloc(ga_pool, 56 * MiB, &p);
    if (rc == 0)
      rc = pinpool_free(ga_pool, p);
    else if (rc == PINPOOL_ENOMEM)
      rc = 0; /* nothing it could release makes it fit: a clean failure */
  }
  if (rc != 0)
    ga_rc = rc;
  atomic_store(&pc_done, 1);
  return NULL;
}

static void gather_hook(int point) {
  if (point == PP_HOOK_RETRY_SETTLE && !tl_pc_main)
    atomic_store(&pc_waiting, 1);
  if (!tl_pc_main)
    return;
  pthread_t t;
  if (point == PP_HOOK_ARENA_LAP && atomic_exchange(&ga_lapped, 1) == 0) {
    if (pthread_create(&t, NULL, ga_free_run, NULL) == 0)
      (void)pthread_join(t, NULL);
    return;
  }
  if (point != PP_HOOK_WALK_PIECE || atomic_load(&ga_lapped) == 0 ||
      atomic_exchange(&ga_fired, 1) != 0)
    return;
  atomic_store(&pc_done, 0);
  atomic_store(&pc_waiting, 0);
  if (pthread_create(&t, NULL, ga_act_run, NULL) != 0) {
    ga_rc = -9999;
    return;
  }
  for (int i = 0; i < BOUND_MS && atomic_load(&pc_done) == 0 &&
                  atomic_load(&pc_waiting) == 0;
       i++)
    pp_sleep_ms(1);
  if (atomic_load(&pc_done) != 0) {
    (void)pthread_join(t, NULL);
  } else {
    ga_late = t;
    ga_late_set = true;
  }
}

static int gather_window(int act) {
  hook_reset();
  atomic_store(&pp_test_hook, NULL);
  ga_act = act;
  ga_rc = 0;
  ga_late_set = false;
  atomic_store(&ga_lapped, 0);
  atomic_store(&ga_fired, 0);
  CHECK(pinpool_create(act == ACT_OOM
                           ? "backend=host,mlock=0,populate=0,tcache_bytes=0,"
                             "max_reserved=64MiB"
                           : "backend=host,mlock=0,populate=0,tcache_bytes=0",
                       &ga_pool) == 0,
        "create: %s", pinpool_last_error());
  pinpool_t *pool = ga_pool;
  for (int i = 0; i < 40; i++)
    CHECK(pinpool_alloc(pool, 300 * KiB, &ga_blk[i]) == 0, "alloc");
  pinpool_stats_t s0 = pp_stats_of(pool);
  tl_pc_main = true;
  atomic_store(&pp_test_hook, gather_hook);
  void *m = NULL;
  int rc = pinpool_alloc(pool, 32 * MiB, &m);
  atomic_store(&pp_test_hook, NULL);
  tl_pc_main = false;
  if (ga_late_set)
    (void)pthread_join(ga_late, NULL);
  CHECK(rc == 0, "%s: the 32 MiB allocation: %s", act_names[act],
        pinpool_last_error());
  CHECK(atomic_load(&ga_lapped) == 1 && atomic_load(&ga_fired) == 1,
        "%s: the last look dropped no lock between pieces (lap %d)",
        act_names[act], atomic_load(&ga_lapped));
  CHECK(ga_rc == 0, "%s in the window: %d", act_names[act], ga_rc);
  pinpool_stats_t st = pp_stats_of(pool);
  CHECK(st.cache_misses == s0.cache_misses + 1,
        "%s: the 32 MiB allocation grew the arena %llu times", act_names[act],
        (unsigned long long)(st.cache_misses - s0.cache_misses));
  CHECK(pinpool_validate(pool) == 0, "%s: validate: %s", act_names[act],
        pinpool_last_error());
  CHECK(pinpool_free(pool, m) == 0, "free");
  CHECK(pinpool_empty_cache(pool) == 0, "empty_cache");
  CHECK(pinpool_validate(pool) == 0, "%s: validate: %s", act_names[act],
        pinpool_last_error());
  st = pp_stats_of(pool);
  CHECK(st.reserved_bytes.current == 0 && st.requests.current == 0,
        "%s: %llu bytes reserved at the end", act_names[act],
        (unsigned long long)st.reserved_bytes.current);
  pinpool_destroy(pool);
  return 0;
}

static int gather_windows_run(void) {
  if (gather_window(ACT_RELEASE) != 0 || gather_window(ACT_OOM) != 0)
    return 1;
  return 0;
}

static void gather_windows(void **state) {
  (void)state;
  in_child("gather_windows", gather_windows_run);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(join_windows),   cmocka_unit_test(join_fork),
      cmocka_unit_test(grower_inline),  cmocka_unit_test(retry_inline),
      cmocka_unit_test(cancel_join),    cmocka_unit_test(cancel_settle),
      cmocka_unit_test(cancel_poll),    cmocka_unit_test(poll_wait_bounded),
      cmocka_unit_test(shed_windows),   cmocka_unit_test(piece_windows),
      cmocka_unit_test(gather_windows),
  };
  return pp_run_selected("test_waits37", all, sizeof all / sizeof all[0], argc,
                         argv);
}
