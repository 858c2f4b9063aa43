/*
 * Growth ahead of demand (grow_ahead=; issue 37; docs/allocation-policy.md,
 * "Growth ahead of demand"). Counts, never times:
 *  - ramp_*: a live set that grows one 3 MiB block at a time. With the
 *    grower on, the test lets it catch up between steps (it waits, bounded,
 *    for the headroom the grower promises: an allocation never waits for
 *    the grower), and then no allocation after the first grows the arena
 *    on its own thread (cache_misses == 1; every other backend allocation
 *    is the grower's). Without it, they do (cache_misses > 1). On
 *    backend=host and on backend=cuda-register with the fake driver.
 *  - max_reserved: the grower fills what the cap leaves and stops there.
 *  - max_cached: the grower grows only into what the idle cap leaves (no
 *    trim gives back what it made).
 *  - release_wins: after pinpool_empty_cache the grower does not grow back
 *    what the release gave until the live set grows again.
 *  - bad_values: ECONFIG, nothing created.
 *  - fork_growing: fork while the grower's chunk is made (no lock held, a
 *    test hook holds it there): the child's pool works.
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_GROW_AHEAD */

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define STEP ((size_t)3 * MiB)
#define NSTEPS 24
#define AHEAD ((size_t)16 * MiB)

/* Wait (bounded: a loaded machine runs the grower late, never wrongly)
 * until the arena holds what the grower promises before the next step. */
static bool headroom(pinpool_t *pool, size_t bytes, size_t largest) {
  for (int i = 0; i < 10000; i++) {
    pinpool_stats_t st = pp_stats_of(pool);
    if (st.chunk_free_bytes >= bytes && st.largest_free_extent >= largest)
      return true;
    pp_sleep_ms(1);
  }
  return false;
}

/* The ramp: NSTEPS blocks of STEP bytes, each touched and kept. Returns
 * the allocations that grew the arena on this thread. */
static uint64_t ramp(const char *conf, bool ahead) {
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(conf, &pool));
  void *p[NSTEPS];
  for (int i = 0; i < NSTEPS; i++) {
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
    pp_fill(p[i], STEP, (unsigned)i);
    if (ahead)
      PP_ASSERT(headroom(pool, AHEAD, STEP), "step %d: no headroom", i);
  }
  pinpool_stats_t st = pp_stats_of(pool);
  for (int i = 0; i < NSTEPS; i++) {
    PP_ASSERT(pp_filled(p[i], STEP, (unsigned)i), "block %d changed", i);
    PP_OK(pinpool_free(pool, p[i]));
  }
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  if (ahead) {
    /* Every backend allocation but the inline ones is the grower's, and
     * the headroom was used: hits, and waits it avoided. */
    uint64_t reserve = strstr(conf, "reserve=") != NULL; /* its chunk */
    PP_ASSERT(st.backend_alloc.count ==
                  st.cache_misses + st.grow_ahead_chunks + reserve,
              "backend allocations %llu, misses %llu, grown ahead %llu",
              (unsigned long long)st.backend_alloc.count,
              (unsigned long long)st.cache_misses,
              (unsigned long long)st.grow_ahead_chunks);
    PP_ASSERT(st.grow_ahead_chunks >= 1 && st.grow_ahead_bytes >= AHEAD,
              "grown ahead: %llu chunks, %llu bytes",
              (unsigned long long)st.grow_ahead_chunks,
              (unsigned long long)st.grow_ahead_bytes);
    PP_ASSERT(st.grow_ahead_hits >= NSTEPS - 1 &&
                  (reserve || st.grow_ahead_waits_avoided >= 1),
              "hits %llu, waits avoided %llu",
              (unsigned long long)st.grow_ahead_hits,
              (unsigned long long)st.grow_ahead_waits_avoided);
  } else {
    PP_ASSERT(st.grow_ahead_chunks == 0 && st.grow_ahead_hits == 0,
              "grown ahead with grow_ahead off");
  }
  return st.cache_misses;
}

static void ramp_host(void **state) {
  (void)state;
  uint64_t off = ramp("backend=host,mlock=0", false);
  PP_ASSERT(off > 1, "without grow_ahead the ramp grew %llu times",
            (unsigned long long)off);
  uint64_t on = ramp("backend=host,mlock=0,grow_ahead=16MiB", true);
  PP_ASSERT(on == 1, "with grow_ahead: %llu allocations grew the arena",
            (unsigned long long)on);
}

/* backend=cuda-register on the fake driver (PINPOOL_LIBCUDA; the chunks
 * are registered by the grower, not by the allocating thread). */
static void ramp_cuda(void **state) {
  (void)state;
  if (getenv("PINPOOL_LIBCUDA") == NULL)
    skip();
  uint64_t off = ramp("backend=cuda-register,device=0", false);
  PP_ASSERT(off > 1, "without grow_ahead the ramp grew %llu times",
            (unsigned long long)off);
  uint64_t on = ramp("backend=cuda-register,device=0,grow_ahead=16MiB", true);
  PP_ASSERT(on == 1, "with grow_ahead: %llu allocations grew the arena",
            (unsigned long long)on);
  /* backend=cuda: one cuMemHostAlloc per chunk. */
  on = ramp("backend=cuda,device=0,grow_ahead=16MiB", true);
  PP_ASSERT(on == 1, "backend=cuda: %llu allocations grew the arena",
            (unsigned long long)on);
}

/* grow_ahead=auto: a live set that grows makes the grower grow a headroom
 * of the window's growth. */
static void ramp_auto(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,grow_ahead=auto", &pool));
  void *p[8];
  for (int i = 0; i < 8; i++)
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
  /* Room for the largest carve at least (the window's growth, 24 MiB, only
   * while the window lasts: a loaded machine may run the grower later). */
  PP_ASSERT(headroom(pool, STEP, STEP), "auto: no headroom");
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.grow_ahead_chunks >= 1 && st.cache_misses >= 1,
            "auto: nothing grown ahead of a growing live set");
  for (int i = 0; i < 8; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* The grower fills what max_reserved leaves, and stops there: the cap is
 * reached by the grower's chunks, never passed, and the allocations that
 * fit under it then find room without growing or retrying. */
static void max_reserved(void **state) {
  (void)state;
  const uint64_t cap = 32 * MiB;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,grow_ahead=24MiB,"
                       "max_reserved=32MiB",
                       &pool));
  void *p[9];
  PP_OK(pinpool_alloc(pool, STEP, &p[0]));
  pinpool_stats_t st = pp_stats_of(pool);
  for (int i = 0; i < 5000 && st.grow_ahead_chunks == 0; i++) {
    pp_sleep_ms(1);
    st = pp_stats_of(pool);
  }
  for (int i = 1; i < 4; i++)
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
  for (int i = 0; i < 5000 && st.reserved_bytes.current + 2 * MiB <= cap; i++) {
    pp_sleep_ms(1);
    st = pp_stats_of(pool);
    PP_ASSERT(st.reserved_bytes.current <= cap, "%llu reserved",
              (unsigned long long)st.reserved_bytes.current);
  }
  PP_ASSERT(st.reserved_bytes.current + 2 * MiB > cap,
            "the grower stopped at %llu of %llu",
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)cap);
  /* The grower's last chunk is counted as reserved before the hold that
   * enters it (and counts it): validate waits for that hold (grow.mu).
   * Without it, a loaded run read 1 chunk here and 2 below. */
  PP_OK(pinpool_validate(pool));
  st = pp_stats_of(pool);
  /* Stopped: a few more looks change nothing. */
  pp_sleep_ms(20);
  pinpool_stats_t st2 = pp_stats_of(pool);
  PP_ASSERT(st2.grow_ahead_chunks == st.grow_ahead_chunks &&
                st2.reserved_bytes.peak <= cap,
            "grower went on: %llu chunks, peak %llu",
            (unsigned long long)st2.grow_ahead_chunks,
            (unsigned long long)st2.reserved_bytes.peak);
  /* What is free under the cap serves the live set without the backend. */
  uint64_t free_blocks = st2.largest_free_extent / STEP;
  for (int i = 4; i < 9 && (uint64_t)(i - 4) < free_blocks; i++)
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
  st = pp_stats_of(pool);
  PP_ASSERT(st.cache_misses == 1 && st.retries == 0 && st.oom_count == 0,
            "misses %llu, retries %llu, oom %llu",
            (unsigned long long)st.cache_misses, (unsigned long long)st.retries,
            (unsigned long long)st.oom_count);
  PP_ASSERT(st.reserved_bytes.peak <= cap, "peak %llu",
            (unsigned long long)st.reserved_bytes.peak);
  for (int i = 0; i < 9 && (i < 4 || (uint64_t)(i - 4) < free_blocks); i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* max_cached: the grower grows only into what the cap leaves
 * (pp_cache_room), so a trim never gives back what it made: the free space
 * in chunks stays within the cap at every look, no chunk is trimmed, and
 * the grower still grows (into the room there is). */
static void max_cached(void **state) {
  (void)state;
  const uint64_t cap = 8 * MiB;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,grow_ahead=auto,max_cached=8MiB",
                       &pool));
  void *p[6];
  for (int i = 0; i < 6; i++) {
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
    uint64_t chunks = pp_stats_of(pool).grow_ahead_chunks;
    for (int j = 0; j < 50; j++) { /* the grower's looks */
      pinpool_stats_t st = pp_stats_of(pool);
      PP_ASSERT(st.chunk_free_bytes <= cap,
                "step %d: %llu bytes free in chunks, max_cached %llu", i,
                (unsigned long long)st.chunk_free_bytes,
                (unsigned long long)cap);
      if (st.grow_ahead_chunks > chunks)
        break;
      pp_sleep_ms(1);
    }
  }
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.grow_ahead_chunks >= 1, "nothing grown ahead under the cap");
  PP_ASSERT(st.trimmed_segments == 0, "%llu chunks trimmed",
            (unsigned long long)st.trimmed_segments);
  for (int i = 0; i < 6; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* A release wins: after empty_cache the grower does not grow back what it
 * gave until the live set grows (else the two would loop), and then it
 * does. */
static void release_wins(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,grow_ahead=16MiB", &pool));
  void *p[3];
  PP_OK(pinpool_alloc(pool, STEP, &p[0]));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "no headroom");
  PP_OK(pinpool_empty_cache(pool));
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.chunk_free_bytes < AHEAD, "empty_cache left %llu free",
            (unsigned long long)st.chunk_free_bytes);
  /* Many looks of the grower (one a millisecond): none grows. */
  pp_sleep_ms(50);
  pinpool_stats_t st2 = pp_stats_of(pool);
  PP_ASSERT(st2.grow_ahead_chunks == st.grow_ahead_chunks &&
                st2.reserved_bytes.current == st.reserved_bytes.current,
            "the grower undid empty_cache: %llu -> %llu chunks",
            (unsigned long long)st.grow_ahead_chunks,
            (unsigned long long)st2.grow_ahead_chunks);
  /* New demand: the grower comes back. */
  PP_OK(pinpool_alloc(pool, STEP, &p[1]));
  PP_OK(pinpool_alloc(pool, STEP, &p[2]));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "the grower did not resume");
  st = pp_stats_of(pool);
  PP_ASSERT(st.grow_ahead_chunks > st2.grow_ahead_chunks, "not resumed");
  for (int i = 0; i < 3; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

static void bad(const char *conf, const char *key) {
  pinpool_t *pool = (pinpool_t *)(uintptr_t)0x1234;
  int rc = pinpool_create(conf, &pool);
  PP_ASSERT(rc == PINPOOL_ECONFIG, "\"%s\": %d", conf, rc);
  PP_ASSERT(pool == (pinpool_t *)(uintptr_t)0x1234, "\"%s\": *out changed",
            conf);
  const char *le = pinpool_last_error();
  PP_ASSERT(le != NULL && strstr(le, key) != NULL, "\"%s\": message %s", conf,
            le ? le : "(null)");
}

static void good(const char *conf, const char *shown) {
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(conf, &pool));
  char buf[1024];
  PP_OK(pinpool_get_config(pool, buf, sizeof buf, NULL));
  if (shown != NULL)
    PP_ASSERT(strstr(buf, shown) != NULL, "\"%s\" shows \"%s\"", conf, buf);
  else
    PP_ASSERT(strstr(buf, "grow_ahead") == NULL, "\"%s\" shows \"%s\"", conf,
              buf);
  pinpool_destroy(pool);
}

static void bad_values(void **state) {
  (void)state;
  bad("backend=host,grow_ahead=", "grow_ahead");
  bad("backend=host,grow_ahead=lots", "grow_ahead");
  bad("backend=host,grow_ahead=-1", "grow_ahead");
  bad("backend=host,grow_ahead=autoo", "grow_ahead");
  bad("backend=host,grow_ahead=64XiB", "grow_ahead");
  bad("backend=host,grow_ahead=99999999999999999999", "grow_ahead");
  bad("backend=host,grow_ahead=64MiB,max_reserved=32MiB", "max_reserved");
  bad("backend=host,grow_ahead=64MiB,max_cached=32MiB", "max_cached");
  bad("backend=host,grow_ahead=auto,grow_ahead=0", "grow_ahead");
  good("backend=host,grow_ahead=0", NULL);
  good("backend=host,grow_ahead=off", NULL);
  good("backend=host,grow_ahead=auto", ",grow_ahead=auto");
  good("backend=host,grow_ahead=AUTO", ",grow_ahead=auto");
  good("backend=host,grow_ahead=64MiB", ",grow_ahead=67108864");
}

/* ---- Fork while the grower makes a chunk ---------------------------------
 * The hook runs on the grower's thread with no pool lock held, between the
 * backend call (the chunk counted as reserved) and the hold that enters
 * the chunk: it stays there 100 ms, and the parent forks meanwhile. The
 * fork must wait for the grower to finish (a busy section, fork.c), or the
 * child counts a chunk its arena lacks (validate: "reserved: chunks hold
 * ..."). The child has no grower (threads do not survive fork) and its
 * pool works: allocations, frees, validate, destroy. */
static atomic_int fork_phase; /* 1: grower in the window */

static void hold_grower(int point) {
  if (point != PP_HOOK_GROW_AHEAD || atomic_load(&fork_phase) != 0)
    return;
  atomic_store(&fork_phase, 1);
  pp_sleep_ms(100);
}

static int child_work(pinpool_t *pool) {
  void *q[12];
  for (int i = 0; i < 12; i++) {
    if (pinpool_alloc(pool, STEP, &q[i]) != 0)
      return 10 + i;
    pp_fill(q[i], STEP, 100u + (unsigned)i);
  }
  for (int i = 0; i < 12; i++) {
    if (!pp_filled(q[i], STEP, 100u + (unsigned)i))
      return 30 + i;
    if (pinpool_free(pool, q[i]) != 0)
      return 50;
  }
  if (pinpool_empty_cache(pool) != 0)
    return 51;
  if (pinpool_validate(pool) != 0) {
    fprintf(stderr, "child: %s\n", pinpool_last_error());
    return 54;
  }
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0)
    return 52;
  if (st.requests.current != 1)
    return 53;
  pinpool_destroy(pool);
  return 0;
}

static void fork_growing(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  atomic_store(&fork_phase, 0);
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=16MiB",
                       &pool));
  atomic_store(&pp_test_hook, hold_grower);
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, STEP, &p));
  for (int i = 0; i < 10000 && atomic_load(&fork_phase) != 1; i++)
    pp_sleep_ms(1);
  PP_ASSERT(atomic_load(&fork_phase) == 1, "the grower never grew");
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    atomic_store(&pp_test_hook, NULL);
    _exit(child_work(pool));
  }
  int rc = pp_wait_child(pid, 30000);
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(rc == 0, "child: %d", rc);
  /* The parent's grower finished its chunk. */
  PP_ASSERT(headroom(pool, AHEAD, STEP), "parent: no headroom");
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* A child of fork of a pool without events: no stream-ordered free ever
 * restarts the background thread there, so the child's first growth does
 * (it grew inline for its life before: grow_ahead silently off). */
static int child_grows(pinpool_t *pool, uint64_t parent_chunks) {
  void *q[12];
  int n = 0, rc = 0;
  for (; n < 12; n++) { /* past the parent's headroom: an inline growth */
    if (pinpool_alloc(pool, STEP, &q[n]) != 0)
      return 10;
    if (pp_stats_of(pool).cache_misses > 1)
      break;
  }
  pinpool_stats_t st = pp_stats_of(pool);
  if (st.cache_misses < 2)
    rc = 11;
  for (int i = 0; rc == 0 && i < 10000; i++) {
    st = pp_stats_of(pool);
    if (st.grow_ahead_chunks > parent_chunks && st.chunk_free_bytes >= AHEAD)
      break;
    pp_sleep_ms(1);
  }
  if (rc == 0 && st.grow_ahead_chunks <= parent_chunks) {
    fprintf(stderr,
            "child: nothing grown ahead (%llu chunks, as the "
            "parent's)\n",
            (unsigned long long)st.grow_ahead_chunks);
    rc = 12;
  }
  for (int i = 0; i < n + (n < 12); i++)
    if (pinpool_free(pool, q[i]) != 0)
      rc = 13;
  if (pinpool_validate(pool) != 0)
    rc = 14;
  pinpool_destroy(pool);
  return rc;
}

static void fork_child_grows(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=16MiB",
                       &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, STEP, &p));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "parent: no headroom");
  uint64_t chunks = pp_stats_of(pool).grow_ahead_chunks;
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0)
    _exit(child_grows(pool, chunks));
  int rc = pp_wait_child(pid, 30000);
  PP_ASSERT(rc == 0, "child: %d", rc);
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- The grower's lock drop (issue 37's class test) ----------------------
 * The grower makes its chunk with no lock held and enters it in one hold of
 * seg_lock (pp_arena_grow_ahead). PP_HOOK_GROW_AHEAD stops it in between,
 * on its own thread; another thread then runs, in that window, a release
 * (pinpool_empty_cache), a trim (frees past max_cached) or an allocation
 * whose out-of-memory retry releases (max_reserved). Each gives a whole
 * free chunk back in the window, so the release wins: the grower's chunk
 * goes back unused, not entered (test_arena runs the same acts in the
 * allocating thread's windows). Then the pool is consistent, the backend
 * got back all it gave, once, and the grower counted nothing it lost. */
enum { GW_RELEASE, GW_TRIM, GW_OOM, GW_NACTS };
static const char *const gw_names[GW_NACTS] = {"release", "trim", "oom retry"};
typedef struct gw {
  int act, rc;
  atomic_int fired;
  atomic_int ready; /* the main thread's setup is done */
  pinpool_t *pool;
  void *blk[2]; /* GW_TRIM: freed in the window */
  /* GW_OOM: the act's retry waits for the grower's chunk (arena.c, "The
   * out-of-memory retry"), so it cannot end in the window: the hook lets
   * the grower go on once it waits (PP_HOOK_RETRY_SETTLE), and the main
   * thread joins it (late). */
  atomic_int done, waiting;
  pthread_t late;
  bool late_set;
  /* The hook has returned: late and late_set are written, and the act is
   * done or waits for the grower, which goes on. The main thread reads
   * them, joins the act and validates only after this (before, it could
   * validate while the act ran, and fail on counters in motion). */
  atomic_int hook_done;
  atomic_int setup_joined; /* a setup allocation joined the grower's chunk */
} gw_t;
static gw_t g_gw;

static void *gw_run(void *arg) {
  gw_t *w = arg;
  if (w->act == GW_RELEASE) {
    w->rc = pinpool_empty_cache(w->pool);
  } else if (w->act == GW_TRIM) {
    for (int i = 0; i < 2 && w->rc == 0; i++)
      w->rc = pinpool_free(w->pool, w->blk[i]);
  } else { /* larger than the grower's chunk: never waits for it */
    void *p = NULL;
    w->rc = pinpool_alloc(w->pool, 40 * MiB, &p);
    if (w->rc == 0)
      w->rc = pinpool_free(w->pool, p);
  }
  atomic_store(&w->done, 1);
  return NULL;
}

/* The grower's first chunk, in its window: wait (bounded) for the main
 * thread's setup, then run the act on another thread. */
static void gw_hook(int point) {
  if (point == PP_HOOK_RETRY_SETTLE) {
    atomic_store(&g_gw.waiting, 1);
    return;
  }
  if (point == PP_HOOK_GROW_JOIN) {
    if (atomic_load(&g_gw.ready) == 0)
      atomic_store(&g_gw.setup_joined, 1);
    return;
  }
  if (point != PP_HOOK_GROW_AHEAD || atomic_load(&g_gw.fired) != 0)
    return;
  /* The main thread's setup can miss and join this very chunk (a miss
   * waits for a growth in flight that holds its piece): holding the
   * chunk for the setup would then hold the setup. Let this chunk go;
   * the setup's demand makes the grower grow again, after it. */
  for (int i = 0; i < 30000 && atomic_load(&g_gw.ready) == 0; i++) {
    if (atomic_exchange(&g_gw.setup_joined, 0) != 0)
      return;
    pp_sleep_ms(1);
  }
  atomic_store(&g_gw.fired, 1);
  pthread_t t;
  if (pthread_create(&t, NULL, gw_run, &g_gw) != 0) {
    g_gw.rc = -9999;
    atomic_store(&g_gw.hook_done, 1);
    return;
  }
  for (int i = 0; i < 10000 && atomic_load(&g_gw.done) == 0 &&
                  atomic_load(&g_gw.waiting) == 0;
       i++)
    pp_sleep_ms(1);
  if (atomic_load(&g_gw.done) != 0) {
    (void)pthread_join(t, NULL);
  } else {
    g_gw.late = t;
    g_gw.late_set = true;
  }
  atomic_store(&g_gw.hook_done, 1);
}

/* The first demand wakes the grower, whose first chunk the hook holds
 * while the main thread sets up what the act gives back: release and oom
 * retry, a 10 MiB block freed (its chunk whole and free once the act
 * gathers it); trim, two 12 MiB blocks (a chunk each) kept, which the act
 * frees: 24 MiB cached over max_cached=22MiB. oom retry: 40 MiB with 26
 * claimed, past max_reserved=60MiB until the retry releases the 10 MiB
 * chunk. */
static void grower_window(int act) {
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_backend_t be = cb_table(&cb, 1);
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend(
      act == GW_TRIM  ? "tcache_bytes=0,grow_ahead=16MiB,max_cached=22MiB"
      : act == GW_OOM ? "tcache_bytes=0,grow_ahead=16MiB,max_reserved=60MiB"
                      : "tcache_bytes=0,grow_ahead=16MiB",
      &be, &pool));
  g_gw = (gw_t){.act = act, .pool = pool};
  atomic_store(&pp_test_hook, gw_hook);
  void *a = NULL;
  if (act == GW_TRIM) {
    PP_OK(pinpool_alloc(pool, 12 * MiB, &g_gw.blk[0]));
    PP_OK(pinpool_alloc(pool, 12 * MiB, &g_gw.blk[1]));
  } else {
    PP_OK(pinpool_alloc(pool, 10 * MiB, &a));
    PP_OK(pinpool_free(pool, a));
  }
  pinpool_stats_t sw = pp_stats_of(pool);
  atomic_store(&g_gw.ready, 1);
  for (int i = 0; i < 10000 && atomic_load(&g_gw.fired) == 0; i++)
    pp_sleep_ms(1);
  PP_ASSERT(atomic_load(&g_gw.fired) == 1, "%s: the grower never grew",
            gw_names[act]);
  for (int i = 0; i < 30000 && atomic_load(&g_gw.hook_done) == 0; i++)
    pp_sleep_ms(1);
  PP_ASSERT(atomic_load(&g_gw.hook_done) == 1, "%s: the hook never returned",
            gw_names[act]);
  if (g_gw.late_set)
    (void)pthread_join(g_gw.late, NULL);
  PP_OK(pinpool_validate(pool)); /* waits for the grower's hold */
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(g_gw.rc == 0, "%s in the grower's window: %s", gw_names[act],
            pp_code_name(g_gw.rc));
  pinpool_stats_t st = pp_stats_of(pool);
  /* A whole free chunk went in the window: the grower's chunk went back
   * (counted neither as grown ahead nor as reserved). The retry instead
   * waits for the grower's chunk, which enters, and then releases the
   * 10 MiB chunk the cap lacks (issue 37, third review, item 2). */
  PP_ASSERT(st.trimmed_segments > sw.trimmed_segments &&
                st.grow_ahead_chunks - sw.grow_ahead_chunks ==
                    (act == GW_OOM ? 1u : 0u),
            "%s in the grower's window: %llu chunks released, %llu grown "
            "ahead",
            gw_names[act],
            (unsigned long long)(st.trimmed_segments - sw.trimmed_segments),
            (unsigned long long)(st.grow_ahead_chunks - sw.grow_ahead_chunks));
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  PP_CHECK_CB_BALANCED(&cb);
  cb_fini(&cb);
}

static void grower_windows(void **state) {
  (void)state;
  for (int act = 0; act < GW_NACTS; act++)
    grower_window(act);
}

/* Failure injection at the grower's backend call (fault=alloc:2: the
 * first call is the inline growth): nothing changes (reserved and cached
 * bytes, chunks, the grower's counts), the pool stays consistent, the
 * grower pauses (no call after it until the demand grows), and then
 * grows again. */
static void grower_fault(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  atomic_store(&pp_test_hook, NULL);
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=16MiB,"
                       "fault=alloc:2",
                       &pool));
  void *p[2];
  PP_OK(pinpool_alloc(pool, STEP, &p[0]));
  pinpool_stats_t st = pp_stats_of(pool);
  for (int i = 0; i < 10000 && st.backend_alloc.count < 2; i++) {
    pp_sleep_ms(1);
    st = pp_stats_of(pool);
  }
  PP_ASSERT(st.backend_alloc.count == 2, "the grower never called: %llu",
            (unsigned long long)st.backend_alloc.count);
  pp_sleep_ms(20); /* its looks: it pauses */
  PP_OK(pinpool_validate(pool));
  pinpool_stats_t st2 = pp_stats_of(pool);
  PP_ASSERT(st2.backend_alloc.count == 2 && st2.grow_ahead_chunks == 0 &&
                st2.grow_ahead_bytes == 0 &&
                st2.reserved_bytes.current == 4 * MiB &&
                st2.reserved_bytes.peak == 4 * MiB &&
                st2.chunk_free_bytes == 1 * MiB && st2.cache_misses == 1 &&
                st2.oom_count == 0 && st2.trimmed_segments == 0,
            "after the grower's refused call: %llu backend calls, %llu grown "
            "ahead, reserved %llu (peak %llu), %llu free",
            (unsigned long long)st2.backend_alloc.count,
            (unsigned long long)st2.grow_ahead_chunks,
            (unsigned long long)st2.reserved_bytes.current,
            (unsigned long long)st2.reserved_bytes.peak,
            (unsigned long long)st2.chunk_free_bytes);
  PP_CHECK_CONSISTENT(pool);
  /* New demand: the grower tries again, and the fault is spent. */
  PP_OK(pinpool_alloc(pool, STEP, &p[1]));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "the grower did not resume");
  for (int i = 0; i < 2; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A large block that grew the arena inline is a carve the grower sees: it
 * makes an extent of its size, and the next such block finds room. Before,
 * only carves that found room were seen (the window's largest carve stayed
 * 3 MiB): every 24 MiB block grew inline. */
static void inline_carve_seen(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  atomic_store(&pp_test_hook, NULL);
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=16MiB",
                       &pool));
  void *p[3];
  PP_OK(pinpool_alloc(pool, STEP, &p[0]));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "no headroom");
  PP_OK(pinpool_alloc(pool, 24 * MiB, &p[1])); /* past it: inline */
  bool room = headroom(pool, AHEAD, 24 * MiB);
  PP_OK(pinpool_alloc(pool, 24 * MiB, &p[2]));
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(room && st.cache_misses == 2,
            "no room made for a second 24 MiB block (%llu allocations grew "
            "inline, largest free extent %llu)",
            (unsigned long long)st.cache_misses,
            (unsigned long long)st.largest_free_extent);
  for (int i = 0; i < 3; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- Documented behaviour without a test before (issue 37, item 4) ------
 * max_cached_pct: the grower grows only into what the cap leaves (pct of
 * the bytes in use), so no trim gives back what it made. */
static void max_cached_pct(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  atomic_store(&pp_test_hook, NULL);
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=16MiB,"
                       "max_cached_pct=100",
                       &pool));
  void *p[8];
  for (int i = 0; i < 8; i++) {
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
    uint64_t chunks = pp_stats_of(pool).grow_ahead_chunks;
    for (int j = 0; j < 50; j++) { /* the grower's looks */
      pinpool_stats_t st = pp_stats_of(pool);
      uint64_t cap = st.block_bytes.current;
      /* An inline growth's tail may pass the cap (its trim follows);
       * the grower's chunk never does. */
      PP_ASSERT(st.chunk_free_bytes <= cap + 2 * MiB,
                "step %d: %llu bytes free in chunks, 100%% of %llu in use", i,
                (unsigned long long)st.chunk_free_bytes,
                (unsigned long long)st.block_bytes.current);
      if (st.grow_ahead_chunks > chunks)
        break;
      pp_sleep_ms(1);
    }
  }
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.grow_ahead_chunks >= 1,
            "nothing grown ahead under the cap (%llu in use, %llu free, "
            "%llu cached, %llu misses)",
            (unsigned long long)st.block_bytes.current,
            (unsigned long long)st.chunk_free_bytes,
            (unsigned long long)st.cached_bytes.current,
            (unsigned long long)st.cache_misses);
  PP_ASSERT(st.trimmed_segments == 0, "%llu chunks trimmed",
            (unsigned long long)st.trimmed_segments);
  for (int i = 0; i < 8; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* A chunk the driver refused to pin (fault=register on the fake driver's
 * second registration, the grower's; pin_failure=pageable) is kept as an
 * inline growth keeps it: counted as grown ahead and as fallback bytes,
 * and the grower makes no other call while the demand is flat. The next
 * chunk, once the demand grows, is pinned (a refusal is not remembered). */
static void pageable_kept(void **state) {
  (void)state;
  if (getenv("PINPOOL_LIBCUDA") == NULL)
    skip();
  atomic_store(&pp_test_hook, NULL);
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=cuda-register,device=0,pin_failure=pageable,"
                       "grow_ahead=16MiB,fault=register:2",
                       &pool));
  void *p[8];
  int n = 0;
  PP_OK(pinpool_alloc(pool, STEP, &p[n++]));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "no headroom");
  pp_sleep_ms(20); /* the grower's looks: nothing more */
  PP_OK(pinpool_validate(pool));
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.grow_ahead_chunks == 1 && st.backend_alloc.count == 2 &&
                st.fallback_bytes == st.grow_ahead_bytes,
            "%llu grown ahead (%llu bytes), %llu backend calls, %llu "
            "fallback bytes",
            (unsigned long long)st.grow_ahead_chunks,
            (unsigned long long)st.grow_ahead_bytes,
            (unsigned long long)st.backend_alloc.count,
            (unsigned long long)st.fallback_bytes);
  /* The demand grows past the headroom: the grower's next chunk. */
  while (n < 8 && pp_stats_of(pool).grow_ahead_chunks == 1)
    PP_OK(pinpool_alloc(pool, STEP, &p[n++]));
  PP_ASSERT(headroom(pool, AHEAD, STEP), "no headroom again");
  st = pp_stats_of(pool);
  PP_ASSERT(st.grow_ahead_chunks >= 2 &&
                st.fallback_bytes < st.grow_ahead_bytes,
            "the grower's next chunk: %llu grown ahead, %llu of %llu bytes "
            "pageable",
            (unsigned long long)st.grow_ahead_chunks,
            (unsigned long long)st.fallback_bytes,
            (unsigned long long)st.grow_ahead_bytes);
  for (int i = 0; i < n; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* numa=local (fake nodes): the grower grows the node whose demand grew,
 * and no other. */
static _Thread_local int nl_node = -1;
static int nl_hook(void) { return nl_node; }

static void numa_local_node(void **state) {
  (void)state;
  atomic_store(&pp_test_hook, NULL);
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,numa=local,"
                       "numa_fake_nodes=2,grow_ahead=16MiB",
                       &pool));
  atomic_store(&pp_test_numa_node, nl_hook);
  nl_node = 1;
  void *p[4];
  bool ok = true;
  pinpool_node_stats_t n0 = {0}, n1 = {0};
  for (int i = 0; i < 4 && ok; i++) {
    PP_OK(pinpool_alloc(pool, STEP, &p[i]));
    ok = false;
    for (int j = 0; j < 10000 && !ok; j++) {
      PP_OK(pinpool_get_node_stats(pool, 1, &n1));
      ok = n1.chunk_free_bytes >= AHEAD;
      if (!ok)
        pp_sleep_ms(1);
    }
  }
  PP_OK(pinpool_get_node_stats(pool, 0, &n0));
  pinpool_stats_t st = pp_stats_of(pool);
  nl_node = -1;
  atomic_store(&pp_test_numa_node, NULL);
  PP_ASSERT(ok && n0.arena_chunks == 0 && st.cache_misses == 1,
            "node 1's demand: node 1 %llu bytes free, node 0 %llu chunks, "
            "%llu allocations grew inline",
            (unsigned long long)n1.chunk_free_bytes,
            (unsigned long long)n0.arena_chunks,
            (unsigned long long)st.cache_misses);
  for (int i = 0; i < 4; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* The first allocations at t = 0 grow inline: nothing grows ahead of a
 * demand not yet seen (docs/allocation-policy.md). reserve= makes the
 * first chunk at create; with it, no allocation of the ramp grows inline. */
static void reserve_first(void **state) {
  (void)state;
  atomic_store(&pp_test_hook, NULL);
  uint64_t misses =
      ramp("backend=host,mlock=0,reserve=16MiB,grow_ahead=16MiB", true);
  PP_ASSERT(misses == 0, "with reserve=: %llu allocations grew inline",
            (unsigned long long)misses);
}

/* ---- auto gives back (issue 37) ------------------------------------------
 * After one big jump, auto's headroom (the window's growth) stayed for the
 * pool's life. Once the demand has stayed flat for a window, the grower
 * gives back whole free chunks beyond its target, up to what it grew and
 * no carve used (counted by the hook PP_HOOK_GROW_SHED), never a block in
 * use, and grows again when the demand does. */
static atomic_int shed_count;
static atomic_int shed_grown; /* growths by the grower after the first shed */

static void count_shed(int point) {
  if (point == PP_HOOK_GROW_SHED)
    atomic_fetch_add(&shed_count, 1);
  else if (point == PP_HOOK_GROW_AHEAD && atomic_load(&shed_count) != 0)
    atomic_fetch_add(&shed_grown, 1);
}

static void auto_gives_back(void **state) {
  (void)state;
  enum { JUMP = 16, MORE = 48 };
  const size_t bs = 4 * MiB;
  pinpool_t *pool = NULL;
  PP_OK(
      pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=auto", &pool));
  atomic_store(&shed_count, 0);
  atomic_store(&shed_grown, 0);
  atomic_store(&pp_test_hook, count_shed);
  void *p[JUMP + MORE];
  for (int i = 0; i < JUMP; i++) { /* the jump: 64 MiB at once */
    PP_OK(pinpool_alloc(pool, bs, &p[i]));
    pp_fill(p[i], 4096, (unsigned)i);
  }
  PP_ASSERT(headroom(pool, 2 * bs, bs), "no headroom after the jump");
  pinpool_stats_t st = pp_stats_of(pool);
  uint64_t most = 0; /* the most free bytes seen */
  /* Flat: the grower's looks give back what the target no longer needs
   * (bounded wait: a loaded machine runs them late, never wrongly). */
  for (int i = 0; i < 10000; i++) {
    st = pp_stats_of(pool);
    if (st.chunk_free_bytes > most)
      most = st.chunk_free_bytes;
    if (atomic_load(&shed_count) >= 1 && st.chunk_free_bytes < most)
      break;
    pp_sleep_ms(1);
  }
  PP_ASSERT(atomic_load(&shed_count) >= 1 && st.chunk_free_bytes < most,
            "flat demand: %d chunks given back by the grower, %llu bytes "
            "free (at most %llu; %llu grown ahead in %llu chunks)",
            atomic_load(&shed_count), (unsigned long long)st.chunk_free_bytes,
            (unsigned long long)most, (unsigned long long)st.grow_ahead_bytes,
            (unsigned long long)st.grow_ahead_chunks);
  /* The jump's headroom: at most the demand (the window's scaling is
   * bounded by it), and a chunk's rounding. It was bounded by the arena's
   * size, which its own chunks raised: 480 MiB ahead of a 64 MiB jump. */
  PP_ASSERT(most <= 2 * JUMP * bs, "%llu bytes ahead of a jump of %llu",
            (unsigned long long)most, (unsigned long long)(JUMP * bs));
  /* The hook runs before the backend call and its counts; validate waits
   * for the grower's give-back in flight (grow.mu). */
  int sheds = atomic_load(&shed_count);
  PP_OK(pinpool_validate(pool));
  st = pp_stats_of(pool);
  PP_ASSERT(st.trimmed_segments >= (uint64_t)sheds &&
                st.backend_free.count >= (uint64_t)sheds,
            "given back: %llu trimmed, %llu backend frees, %d sheds",
            (unsigned long long)st.trimmed_segments,
            (unsigned long long)st.backend_free.count, sheds);
  PP_ASSERT(atomic_load(&shed_grown) == 0,
            "the grower grew %d chunks back while the demand was flat",
            atomic_load(&shed_grown));
  for (int i = 0; i < JUMP; i++)
    PP_ASSERT(pp_filled(p[i], 4096, (unsigned)i), "block %d changed", i);
  PP_OK(pinpool_validate(pool));
  /* The demand grows again: so does the headroom (a block at a time until
   * the grower grows, each followed by a few of its looks). */
  uint64_t chunks = pp_stats_of(pool).grow_ahead_chunks;
  int n = JUMP;
  while (n < JUMP + MORE && pp_stats_of(pool).grow_ahead_chunks == chunks) {
    PP_OK(pinpool_alloc(pool, bs, &p[n++]));
    for (int i = 0; i < 20 && pp_stats_of(pool).grow_ahead_chunks == chunks;
         i++)
      pp_sleep_ms(1);
  }
  PP_ASSERT(pp_stats_of(pool).grow_ahead_chunks > chunks,
            "the grower did not grow again (%d more blocks)", n - JUMP);
  atomic_store(&pp_test_hook, NULL);
  for (int i = 0; i < n; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- A miss waits for a growth in flight (issue 37) ----------------------
 * Two threads that miss at once on a full arena grew two chunks where one
 * holds both pieces. The hook holds the first growth of a round in flight
 * (no lock held, chunk made, not yet in the arena) until the other thread
 * has decided: it joined (PP_HOOK_GROW_JOIN), grew a chunk of its own
 * (PP_HOOK_ARENA_GROW: the defect), or its allocation returned. The wait
 * is bounded (a decision that never comes lets the growth go on): the
 * assertions count, never time. */
static atomic_int jn_holding;   /* a growth of this round is held */
static atomic_int jn_decided;   /* the other side decided */
static atomic_int jn_grown;     /* growths on allocating threads */
static atomic_int jn_joins;     /* misses that joined a growth */
static atomic_int jn_point;     /* the point whose first hit is held */
static _Thread_local int jn_me; /* this thread holds the round's growth */

static void join_hook(int point) {
  if (point == PP_HOOK_GROW_JOIN) {
    atomic_fetch_add(&jn_joins, 1);
    atomic_store(&jn_decided, 1);
    return;
  }
  if (point != PP_HOOK_ARENA_GROW && point != PP_HOOK_GROW_AHEAD)
    return;
  if (point == PP_HOOK_ARENA_GROW)
    atomic_fetch_add(&jn_grown, 1);
  if (point != atomic_load(&jn_point))
    return;
  int zero = 0;
  if (!atomic_compare_exchange_strong(&jn_holding, &zero, 1)) {
    atomic_store(&jn_decided, 1); /* a second growth: the other side's */
    return;
  }
  jn_me = 1;
  for (int i = 0; i < 5000 && atomic_load(&jn_decided) == 0; i++)
    pp_sleep_ms(1);
}

typedef struct jn_arg {
  pinpool_t *pool;
  pthread_barrier_t *bar;
  int rounds;
  void **p;
} jn_arg_t;

static void *jn_thread(void *arg) {
  jn_arg_t *a = arg;
  for (int r = 0; r < a->rounds; r++) {
    (void)pthread_barrier_wait(a->bar);
    jn_me = 0;
    if (pinpool_alloc(a->pool, MiB, &a->p[r]) != 0)
      a->p[r] = NULL;
    if (!jn_me)
      atomic_store(&jn_decided, 1); /* this side's allocation returned */
    (void)pthread_barrier_wait(a->bar);
    /* Main resets the round between the two waits' successors. */
    (void)pthread_barrier_wait(a->bar);
  }
  return NULL;
}

/* `nthreads` threads that each allocate 1 MiB per round (at once, the
 * hook holding each round's first growth), 2 * rounds blocks in all: the
 * reserved peak, and in *doubled the rounds in which two chunks were
 * grown. The arena's chunks are whole MiB pairs (2 MiB at least, rounded
 * to 2 MiB), so a round either fits whole or finds the arena full: then
 * both threads miss, and one chunk holds both pieces. */
static uint64_t join_ramp(int nthreads, int rounds, int *doubled) {
  pinpool_t *pool = NULL;
  PP_OK(
      pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=0", &pool));
  void *p[2][64];
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, (unsigned)nthreads + 1);
  jn_arg_t args[2];
  pthread_t t[2];
  atomic_store(&jn_point, PP_HOOK_ARENA_GROW);
  *doubled = 0;
  for (int i = 0; i < nthreads; i++) {
    args[i] = (jn_arg_t){pool, &bar, rounds * 2 / nthreads, p[i]};
    PP_ASSERT(pthread_create(&t[i], NULL, jn_thread, &args[i]) == 0,
              "pthread_create");
  }
  atomic_store(&pp_test_hook, join_hook);
  for (int r = 0; r < rounds * 2 / nthreads; r++) {
    atomic_store(&jn_holding, 0);
    atomic_store(&jn_decided, nthreads == 1); /* alone: nothing to wait for */
    atomic_store(&jn_grown, 0);
    (void)pthread_barrier_wait(&bar);
    (void)pthread_barrier_wait(&bar); /* the round's allocations returned */
    if (atomic_load(&jn_grown) > 1)
      ++*doubled; /* both threads grew a chunk in this round */
    (void)pthread_barrier_wait(&bar);
  }
  for (int i = 0; i < nthreads; i++)
    pthread_join(t[i], NULL);
  atomic_store(&pp_test_hook, NULL);
  pthread_barrier_destroy(&bar);
  pinpool_stats_t st = pp_stats_of(pool);
  for (int i = 0; i < nthreads; i++)
    for (int r = 0; r < rounds * 2 / nthreads; r++) {
      PP_ASSERT(p[i][r] != NULL, "thread %d round %d: allocation failed", i, r);
      PP_OK(pinpool_free(pool, p[i][r]));
    }
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  return st.reserved_bytes.peak;
}

static void join_inflight(void **state) {
  (void)state;
  atomic_store(&jn_joins, 0);
  int d1 = 0, d2 = 0;
  uint64_t one = join_ramp(1, 24, &d1);
  uint64_t two = join_ramp(2, 24, &d2);
  /* One thread: the arena grows at a full round, by one chunk. Two: the
   * same, the second miss waiting for the first's chunk. */
  PP_ASSERT(d2 == 0 && atomic_load(&jn_joins) >= 1,
            "48 blocks of 1 MiB: in %d of 24 rounds two chunks grown by two "
            "threads at once (%d misses joined a growth)",
            d2, atomic_load(&jn_joins));
  PP_ASSERT(two == one, "reserved peak %llu with two threads, %llu with one",
            (unsigned long long)two, (unsigned long long)one);
}

/* The grower's chunk in flight: an allocation that misses meanwhile takes
 * its piece from it instead of growing inline. */
static void join_grower(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,grow_ahead=16MiB",
                       &pool));
  atomic_store(&jn_holding, 0);
  atomic_store(&jn_decided, 0);
  atomic_store(&jn_joins, 0);
  atomic_store(&jn_point, PP_HOOK_GROW_AHEAD);
  atomic_store(&pp_test_hook, join_hook);
  void *p[3];
  PP_OK(pinpool_alloc(pool, STEP, &p[0])); /* the first growth: inline */
  for (int i = 0; i < 10000 && atomic_load(&jn_holding) == 0; i++)
    pp_sleep_ms(1);
  PP_ASSERT(atomic_load(&jn_holding) == 1, "the grower never grew");
  /* The arena (one 4 MiB chunk) has no room for two more. */
  PP_OK(pinpool_alloc(pool, STEP, &p[1]));
  atomic_store(&jn_decided, 1);
  PP_OK(pinpool_alloc(pool, STEP, &p[2]));
  atomic_store(&pp_test_hook, NULL);
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.cache_misses == 1 && atomic_load(&jn_joins) == 1,
            "%llu allocations grew the arena while the grower's chunk was "
            "in flight (%d joined it)",
            (unsigned long long)st.cache_misses, atomic_load(&jn_joins));
  PP_ASSERT(st.backend_alloc.count == 1 + st.grow_ahead_chunks,
            "backend allocations %llu, grown ahead %llu",
            (unsigned long long)st.backend_alloc.count,
            (unsigned long long)st.grow_ahead_chunks);
  for (int i = 0; i < 3; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(bad_values),        cmocka_unit_test(ramp_host),
      cmocka_unit_test(ramp_cuda),         cmocka_unit_test(ramp_auto),
      cmocka_unit_test(max_reserved),      cmocka_unit_test(max_cached),
      cmocka_unit_test(release_wins),      cmocka_unit_test(fork_growing),
      cmocka_unit_test(join_inflight),     cmocka_unit_test(join_grower),
      cmocka_unit_test(fork_child_grows),  cmocka_unit_test(auto_gives_back),
      cmocka_unit_test(grower_windows),    cmocka_unit_test(grower_fault),
      cmocka_unit_test(inline_carve_seen), cmocka_unit_test(max_cached_pct),
      cmocka_unit_test(pageable_kept),     cmocka_unit_test(numa_local_node),
      cmocka_unit_test(reserve_first),
  };
  return pp_run_selected("test_growahead", all, sizeof all / sizeof all[0],
                         argc, argv);
}
