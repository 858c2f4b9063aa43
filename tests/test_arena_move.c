/*
 * Page-moving growth (src/arena.c, "Page moves"; docs/allocation-policy.md,
 * "Page-moving growth"): a miss whose bytes are free but not side by side
 * moves the free pages into one range instead of growing the arena.
 *  - moved: the piece is made of the donors' pages (their contents come
 *    with them), no backend call, reserved bytes unchanged, the live
 *    blocks around the donors untouched, the pool consistent, and every
 *    byte given back by empty_cache;
 *  - the lock drops (PP_HOOK_MOVE_RESERVED, PP_HOOK_MOVE_STEP): in each,
 *    on another thread, a release (empty_cache), a trim (a free in a pool
 *    with max_cached), an out-of-memory retry (an allocation over
 *    max_reserved), a validate and a fork whose child validates: the move
 *    still serves the piece without a backend call, and the release gives
 *    back only what is whole (another chunk), never the donors' chunk;
 *  - fault injection at every system call of the move (fault=move:N, the
 *    reservation and each donor's mremap): the allocation grows instead
 *    (move_fallbacks), no page is lost or counted twice, live data kept;
 *  - the key: page_move=1 where a pool cannot move is a configuration
 *    error that names the reason; auto there moves nothing.
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook */

#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_THREAD__)
#define UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UNDER_TSAN 1
#endif
#endif

#define PIECE (4 * MiB)
#define NPIECES 8

/* The fragmented arena: a 32 MiB chunk carved in eight 4 MiB blocks, the
 * odd ones freed (16 MiB free, no extent above 4 MiB), each block marked
 * by its number in its first byte of every page. */
typedef struct frag {
  pinpool_t *pool;
  void *b[NPIECES];
  void *other; /* EXTRA_BIG: the live block of the chunk beside */
} frag_t;

static void mark(void *p, size_t n, unsigned char v) {
  for (size_t off = 0; off < n; off += 4096)
    ((unsigned char *)p)[off] = v;
}

static size_t marked(const void *p, size_t n, unsigned char v) {
  size_t ok = 0;
  for (size_t off = 0; off < n; off += 4096)
    ok += ((const unsigned char *)p)[off] == v;
  return ok;
}

/* extra: EXTRA_FREE, a chunk of its own made after the fragmented one
 * (4 MiB: an eighth of the arena), whole and free (what a release may
 * give back): placed below the fragmented one, beside block 0, which
 * stays live, its free space joins no donor, and a move takes the three
 * highest donors (largest first, then the highest address), never it.
 * EXTRA_BIG: a live 40 MiB block in a chunk of its own made first
 * (f->other), whose free makes that chunk whole. */
enum { EXTRA_NONE, EXTRA_FREE, EXTRA_BIG };
static void frag_make(frag_t *f, const char *config, int extra) {
  memset(f, 0, sizeof *f);
  PP_OK(pinpool_create(config, &f->pool));
  if (extra == EXTRA_BIG)
    PP_OK(pinpool_alloc(f->pool, 40 * MiB, &f->other));
  void *all = NULL;
  PP_OK(pinpool_alloc(f->pool, NPIECES * PIECE, &all));
  PP_OK(pinpool_free(f->pool, all));
  for (int i = 0; i < NPIECES; i++) {
    PP_OK(pinpool_alloc(f->pool, PIECE, &f->b[i]));
    PP_ASSERT((char *)f->b[i] == (char *)all + (size_t)i * PIECE,
              "%s: block %d not carved in order from the idle chunk (%p, %p)",
              config, i, f->b[i], all);
    mark(f->b[i], PIECE, (unsigned char)(0x40 + i));
  }
  if (extra == EXTRA_FREE) {
    void *p = NULL;
    PP_OK(pinpool_alloc(f->pool, 2 * MiB, &p));
    PP_OK(pinpool_free(f->pool, p));
  }
  for (int i = 1; i < NPIECES; i += 2) {
    PP_OK(pinpool_free(f->pool, f->b[i]));
    f->b[i] = NULL;
  }
  PP_CHECK_CONSISTENT(f->pool);
}

/* The even blocks kept their marks. */
static void frag_live_intact(const frag_t *f) {
  for (int i = 0; i < NPIECES; i += 2)
    PP_ASSERT(marked(f->b[i], PIECE, (unsigned char)(0x40 + i)) == PIECE / 4096,
              "live block %d lost its contents", i);
}

static void frag_done(frag_t *f) {
  for (int i = 0; i < NPIECES; i += 2)
    PP_OK(pinpool_free(f->pool, f->b[i]));
  if (f->other != NULL)
    PP_OK(pinpool_free(f->pool, f->other));
  PP_CHECK_CONSISTENT(f->pool);
  PP_CHECK_EMPTIED(f->pool);
  pinpool_destroy(f->pool);
}

/* A 12 MiB piece made of donors: each of its pages carries a donor's mark
 * (an odd block's), none is a new zero page. */
static void check_moved(const void *p, size_t n, const char *what) {
  size_t from_donors = 0;
  for (int i = 1; i < NPIECES; i += 2)
    from_donors += marked(p, n, (unsigned char)(0x40 + i));
  PP_ASSERT(from_donors == n / 4096,
            "%s: %zu of %zu pages of the moved piece came from the donors",
            what, from_donors, n / 4096);
}

static void test_move_serves_miss(void **state) {
  (void)state;
  static const char *const configs[] = {
      "backend=host,mlock=0,page_move=1,tcache_bytes=0",
      "backend=host,mlock=1,page_move=1,tcache_bytes=0",
      ("backend=host,mlock=0,page_move=auto,numa=local,numa_fake_nodes=1,"
       "tcache_bytes=0")};
  struct rlimit rl;
  bool can_lock = getrlimit(RLIMIT_MEMLOCK, &rl) == 0 &&
                  (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= 256 * MiB);
  for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
    if (c == 1 && !can_lock)
      continue;
    frag_t f;
    frag_make(&f, configs[c], EXTRA_NONE);
    pinpool_stats_t before = pp_stats_of(f.pool);
    void *p = NULL;
    PP_OK(pinpool_alloc(f.pool, 3 * PIECE, &p));
    pinpool_stats_t after = pp_stats_of(f.pool);
    PP_ASSERT(after.page_moves == 1 && after.bytes_moved == 3 * PIECE &&
                  after.move_fallbacks == 0,
              "%s: %llu moves of %llu bytes, %llu fallbacks", configs[c],
              (unsigned long long)after.page_moves,
              (unsigned long long)after.bytes_moved,
              (unsigned long long)after.move_fallbacks);
    PP_ASSERT(after.backend_alloc.count == before.backend_alloc.count &&
                  after.reserved_bytes.current ==
                      before.reserved_bytes.current &&
                  after.cache_misses == before.cache_misses,
              "%s: the move called the backend or changed reserved bytes",
              configs[c]);
    PP_ASSERT(after.locked_bytes == before.locked_bytes,
              "%s: locked bytes %llu -> %llu", configs[c],
              (unsigned long long)before.locked_bytes,
              (unsigned long long)after.locked_bytes);
    check_moved(p, 3 * PIECE, configs[c]);
    frag_live_intact(&f);
    PP_CHECK_CONSISTENT(f.pool);
    memset(p, 0x11, 3 * PIECE);
    frag_live_intact(&f);
    PP_OK(pinpool_free(f.pool, p));
    frag_done(&f);
  }
}

/* A donor that is a whole chunk's free space: the move takes the chunk out
 * of the arena (pp_ext_cut drops it). 20 MiB asked of 16 MiB in the four
 * odd blocks and the 4 MiB chunk beside (EXTRA_FREE): five donors, the
 * chunk last: the 32 MiB chunk shrinks at its top (block 7) and splits
 * at blocks 5, 3 and 1, the small chunk goes, the moved pages are one:
 * three chunks more. The cut once left the chunk lookup's hint on the chunk it
 * freed; the next lookup in the same hold read it (ASan: a
 * heap-use-after-free; two threads: wrong chunks, an assertion). */
static void test_move_whole_chunk_donor(void **state) {
  (void)state;
  frag_t f;
  frag_make(&f, "backend=host,mlock=0,page_move=1,tcache_bytes=0", EXTRA_FREE);
  pinpool_stats_t before = pp_stats_of(f.pool);
  void *p = NULL;
  PP_OK(pinpool_alloc(f.pool, 5 * PIECE, &p));
  pinpool_stats_t after = pp_stats_of(f.pool);
  PP_ASSERT(after.page_moves == 1 && after.bytes_moved == 5 * PIECE &&
                after.backend_alloc.count == before.backend_alloc.count &&
                after.arena_chunks == before.arena_chunks + 3,
            "%llu moves of %llu bytes, %llu -> %llu chunks",
            (unsigned long long)after.page_moves,
            (unsigned long long)after.bytes_moved,
            (unsigned long long)before.arena_chunks,
            (unsigned long long)after.arena_chunks);
  frag_live_intact(&f);
  PP_CHECK_CONSISTENT(f.pool);
  memset(p, 0x33, 5 * PIECE);
  frag_live_intact(&f);
  PP_OK(pinpool_free(f.pool, p));
  frag_done(&f);
}

/* ---- The lock drops ----------------------------------------------------- */
enum { ACT_RELEASE, ACT_TRIM, ACT_OOM, ACT_VALIDATE, ACT_FORK, NACTS };
static const char *const act_names[NACTS] = {"release", "trim", "oom retry",
                                             "validate", "fork"};
typedef struct window {
  int point, act, fired;
  pinpool_t *pool;
  void *trim_block; /* ACT_TRIM: freed by the helper */
  int rc;
  int child_status;
  atomic_int done;
} window_t;
static window_t g_win;
static pthread_t g_main;

static void *act_run(void *arg) {
  window_t *w = arg;
  int rc = 0;
  switch (w->act) {
  case ACT_RELEASE:
    rc = pinpool_empty_cache(w->pool);
    break;
  case ACT_TRIM:
    rc = pinpool_free(w->pool, w->trim_block);
    break;
  case ACT_OOM: {
    void *p = NULL;
    rc = pinpool_alloc(w->pool, 31 * MiB, &p);
    if (rc == 0)
      rc = pinpool_free(w->pool, p);
    else if (rc == PINPOOL_ENOMEM)
      rc = 0; /* a clean refusal: the donors are not its to release */
    break;
  }
  case ACT_VALIDATE:
    rc = pinpool_validate(w->pool);
    break;
  case ACT_FORK: {
    /* The fork waits for the mover's busy section; the child sees no move
     * in flight and a consistent pool. */
    pid_t pid = fork();
    if (pid == 0)
      _exit(pinpool_validate(w->pool) == 0 ? 0 : 1);
    if (pid < 0) {
      rc = -9998;
      break;
    }
    int st = 0;
    (void)waitpid(pid, &st, 0);
    w->child_status = st;
    rc = WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -9997;
    break;
  }
  default:
    break;
  }
  w->rc = rc;
  atomic_store(&w->done, 1);
  return NULL;
}

static pthread_t g_helper;
static bool g_helper_live;

static void window_hook(int point) {
  if (point != g_win.point || !pthread_equal(pthread_self(), g_main) ||
      g_win.fired > 0)
    return;
  g_win.fired++;
  atomic_store(&g_win.done, 0);
  if (pthread_create(&g_helper, NULL, act_run, &g_win) != 0) {
    g_win.rc = -9999;
    return;
  }
  g_helper_live = true;
  /* A fork cannot end here (it waits for this thread's busy section):
   * give it a moment to reach its wait, then go on; the others end. */
  for (int i = 0; i < (g_win.act == ACT_FORK ? 20 : 10000) &&
                  atomic_load(&g_win.done) == 0;
       i++)
    pp_sleep_ms(1);
}

static void move_window(int point, int act) {
  frag_t f;
  /* trim: max_cached_pct=100 (idle bytes at most those in use): under it
   * until the helper frees the 40 MiB block, whose chunk the trim then
   * gives back; oom retry: 36 MiB reserved, the helper's 31 MiB fits
   * max_reserved once the other chunk is released. */
  frag_make(&f,
            act == ACT_TRIM ? "backend=host,mlock=0,page_move=1,tcache_bytes=0,"
                              "max_cached_pct=100"
            : act == ACT_OOM
                ? "backend=host,mlock=0,page_move=1,tcache_bytes=0,"
                  "max_reserved=64MiB"
                : "backend=host,mlock=0,page_move=1,tcache_bytes=0",
            act == ACT_TRIM ? EXTRA_BIG : EXTRA_FREE);
  if (act == ACT_TRIM) {
    g_win.trim_block = f.other;
    f.other = NULL;
  }
  g_win.pool = f.pool;
  g_win.point = point;
  g_win.act = act;
  g_win.fired = 0;
  g_win.rc = 0;
  g_helper_live = false;
  g_main = pthread_self();
  pinpool_stats_t before = pp_stats_of(f.pool);
  void *p = NULL;
  atomic_store(&pp_test_hook, window_hook);
  int rc = pinpool_alloc(f.pool, 3 * PIECE, &p);
  atomic_store(&pp_test_hook, NULL);
  if (g_helper_live)
    (void)pthread_join(g_helper, NULL);
  PP_ASSERT(rc == 0, "%s in the window before %s: the allocation failed: %s",
            act_names[act],
            point == PP_HOOK_MOVE_RESERVED ? "the reservation" : "a mremap",
            pinpool_last_error());
  PP_ASSERT(g_win.fired == 1 && g_win.rc == 0, "%s in the window: fired %d, %s",
            act_names[act], g_win.fired, pp_code_name(g_win.rc));
  pinpool_stats_t after = pp_stats_of(f.pool);
  /* Served by the move: the release in the window found only the other
   * chunk whole (the donors' chunk has a range taken), and the mover
   * called no backend. */
  PP_ASSERT(after.page_moves == 1 && after.move_fallbacks == 0,
            "%s in the window: %llu moves, %llu fallbacks", act_names[act],
            (unsigned long long)after.page_moves,
            (unsigned long long)after.move_fallbacks);
  PP_ASSERT(after.backend_alloc.count == before.backend_alloc.count ||
                act == ACT_OOM,
            "%s in the window: the mover grew the arena", act_names[act]);
  if (act == ACT_RELEASE || act == ACT_TRIM || act == ACT_OOM)
    PP_ASSERT(
        after.trimmed_segments == before.trimmed_segments + 1,
        "%s in the window: %llu chunks released (the other chunk, "
        "alone)",
        act_names[act],
        (unsigned long long)(after.trimmed_segments - before.trimmed_segments));
  /* The piece is the best fit of the arena as the publishing hold finds
   * it: with the helper's 32 MiB chunk beside the moved one (the oom
   * retry's growth, its block's free still in a hot slot) a merged extent
   * may lend it a page of that chunk. No page of it is a live block's. */
  if (act != ACT_OOM)
    check_moved(p, 3 * PIECE, act_names[act]);
  for (int i = 0; i < NPIECES; i += 2)
    PP_ASSERT(marked(p, 3 * PIECE, (unsigned char)(0x40 + i)) == 0,
              "%s: the piece holds pages of live block %d", act_names[act], i);
  frag_live_intact(&f);
  PP_CHECK_CONSISTENT(f.pool);
  PP_OK(pinpool_free(f.pool, p));
  frag_done(&f);
}

static void test_move_windows(void **state) {
  (void)state;
  static const int points[] = {PP_HOOK_MOVE_RESERVED, PP_HOOK_MOVE_STEP};
  for (size_t i = 0; i < sizeof points / sizeof points[0]; i++)
    for (int act = 0; act < NACTS; act++) {
#ifdef UNDER_TSAN
      if (act == ACT_FORK)
        continue; /* TSAN stops checking in a child of a threaded process */
#endif
      move_window(points[i], act);
    }
}

/* ---- A step that fails ---------------------------------------------------
 * The move's system calls (unlocked: src/pagemove.c): the reservation
 * (1), then for each of the three 4 MiB donors its mremap and the
 * mprotect of its hole (2 - 7). Failing the reservation or a mremap: the
 * allocation grows instead, what moved before the failure is a chunk of
 * free pages, the rest are where they were; nothing lost. A failed
 * mprotect only leaves the hole readable until it is unmapped: the move
 * goes on. N = 8 fails nothing. */
static void test_move_each_call_fails(void **state) {
  (void)state;
  for (unsigned n = 1; n <= 8; n++) {
    char config[160];
    (void)snprintf(config, sizeof config,
                   "backend=host,mlock=0,page_move=1,tcache_bytes=0,"
                   "fault=move:%u",
                   n);
    frag_t f;
    frag_make(&f, config, EXTRA_NONE);
    pinpool_stats_t before = pp_stats_of(f.pool);
    void *p = NULL;
    PP_OK(pinpool_alloc(f.pool, 3 * PIECE, &p));
    pinpool_stats_t after = pp_stats_of(f.pool);
    bool failed = n == 1 || n == 2 || n == 4 || n == 6;
    uint64_t moved = n == 1 ? 0 : failed ? (n - 2) / 2 * PIECE : 3 * PIECE;
    PP_ASSERT(after.move_fallbacks == (failed ? 1u : 0u) &&
                  after.page_moves == (moved > 0 ? 1u : 0u) &&
                  after.bytes_moved == moved,
              "fault=move:%u: %llu moves of %llu bytes, %llu fallbacks", n,
              (unsigned long long)after.page_moves,
              (unsigned long long)after.bytes_moved,
              (unsigned long long)after.move_fallbacks);
    PP_ASSERT(after.backend_alloc.count ==
                  before.backend_alloc.count + (failed ? 1 : 0),
              "fault=move:%u: %llu backend allocations for one miss", n,
              (unsigned long long)(after.backend_alloc.count -
                                   before.backend_alloc.count));
    if (!failed)
      check_moved(p, 3 * PIECE, config);
    frag_live_intact(&f);
    PP_CHECK_CONSISTENT(f.pool);
    memset(p, 0x22, 3 * PIECE);
    frag_live_intact(&f);
    PP_OK(pinpool_free(f.pool, p));
    frag_done(&f);
  }
}

/* ---- The key ------------------------------------------------------------ */
static void test_move_config(void **state) {
  (void)state;
  static const char *const refused[] = {
      "backend=malloc,page_move=1", "backend=host,hugepages=1,page_move=1",
      "backend=host,shared=1,page_move=1", "backend=host,page_move=2",
      "backend=host,page_move=yes"};
  for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
    pinpool_t *pool = NULL;
    PP_ASSERT(pinpool_create(refused[i], &pool) == PINPOOL_ECONFIG &&
                  pool == NULL,
              "'%s' was not a configuration error", refused[i]);
    PP_ASSERT(strstr(pinpool_last_error(), "page_move") != NULL,
              "'%s': the error does not name the key: %s", refused[i],
              pinpool_last_error());
  }
  /* auto where a pool cannot move: no moves, the miss grows. */
  frag_t f;
  frag_make(&f, "backend=host,hugepages=1,page_move=auto,tcache_bytes=0",
            EXTRA_NONE);
  void *p = NULL;
  PP_OK(pinpool_alloc(f.pool, 3 * PIECE, &p));
  pinpool_stats_t st = pp_stats_of(f.pool);
  PP_ASSERT(st.page_moves == 0 && st.move_fallbacks == 0,
            "hugepages=1, page_move=auto moved pages");
  PP_OK(pinpool_free(f.pool, p));
  frag_done(&f);
  /* The key in the pool's configuration string, when not the default. */
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,page_move=1", &pool));
  char buf[1024];
  PP_ASSERT(pinpool_get_config(pool, buf, sizeof buf, NULL) == 0 &&
                strstr(buf, ",page_move=1") != NULL,
            "page_move=1 missing from '%s'", buf);
  pinpool_destroy(pool);
  PP_OK(pinpool_create("backend=host", &pool));
  PP_ASSERT(pinpool_get_config(pool, buf, sizeof buf, NULL) == 0 &&
                strstr(buf, "page_move") == NULL,
            "the default's string names page_move: '%s'", buf);
  pinpool_destroy(pool);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_move_serves_miss),
      cmocka_unit_test(test_move_whole_chunk_donor),
      cmocka_unit_test(test_move_windows),
      cmocka_unit_test(test_move_each_call_fails),
      cmocka_unit_test(test_move_config),
  };
  return pp_run_selected("test_arena_move", tests,
                         sizeof tests / sizeof tests[0], argc, argv);
}
