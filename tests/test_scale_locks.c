/*
 * Costs that stay flat as the pool grows, counted on the locks (issue 38,
 * docs/verification.md, "Issue 38, the locks' meter"): every pp_mutex_t
 * counts the elements one hold visits (src/base.h, pp_lock_visit), and
 * each test here builds a pool with N and 10 N of something (lends,
 * stacks, streams on one block) and asserts that the most elements one
 * hold of the lock concerned visited grows at most logarithmically. The
 * arena's own meter (tests/test_scale.c) counts only extent operations,
 * which is why the walks these tests catch went unseen.
 *
 * Each test fails with its mutant (tests/CMakeLists.txt), which restores
 * the old walk: LEND_WALK (a free looks for its block among every lend, a
 * snapshot copies every lend in one hold), STACKS_ONE_HOLD (a snapshot
 * copies the whole stack table in one hold), SSET_SCAN (record_stream
 * looks for the stream among every stream of the block), INDEX_ONE_HOLD
 * (the lends' and captures' indexes rebuilt whole at a doubling),
 * PEER_WALK (the peer records walked by id and pid), GRAPHS_WALK
 * (pinpool_stream_graphs_release asks every capture).
 */
#include "testutil.h"

#include "internal.h"
#include "stream.h"

#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* What a hold may visit with n elements when it is logarithmic in n, or
 * one snapshot piece (piece: the most a piece copies). */
static uint64_t log_bound(size_t n, uint64_t piece) {
  uint64_t b = (uint64_t)(6 * log2((double)n + 2)) + 32;
  return b > piece ? b : piece;
}

/* w[1] (at n[1] = 10 n[0]) within the bound and not above 2 w[0] + 32. */
static void check_growth(const char *what, const size_t n[2],
                         const uint64_t w[2], uint64_t piece) {
  printf("%s: most elements in one hold: %llu at %zu, %llu at %zu\n", what,
         (unsigned long long)w[0], n[0], (unsigned long long)w[1], n[1]);
  for (int i = 0; i < 2; i++)
    PP_ASSERT(w[i] <= log_bound(n[i], piece),
              "%s: a hold visited %llu elements at %zu: more than "
              "logarithmic (%llu)",
              what, (unsigned long long)w[i], n[i],
              (unsigned long long)log_bound(n[i], piece));
  PP_ASSERT(w[1] <= 2 * w[0] + 32,
            "%s: %llu elements in a hold at %zu, %llu at %zu: more than "
            "logarithmic",
            what, (unsigned long long)w[1], n[1], (unsigned long long)w[0],
            n[0]);
}

/* Occurrences of needle in text. */
static size_t count_of(const char *text, const char *needle) {
  size_t n = 0;
  for (const char *p = strstr(text, needle); p != NULL;
       p = strstr(p + 1, needle))
    n++;
  return n;
}

/* A child process to lend to: alive, never attaches; gone with the test,
 * even one that fails (ctest waits for the output pipe it shares). */
static pid_t borrower(void) {
  pid_t child = fork();
  PP_ASSERT(child >= 0, "fork");
  if (child == 0) {
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(120);
    pause();
    _exit(0);
  }
  return child;
}

/* ---- (5) Lends ----------------------------------------------------------
 * A shared pool's every free asks whether its block is lent, under the
 * share lock: that walked every lend (3.9 us a free at 3,000 lends), and a
 * snapshot copied every lend in one hold. Now an index by block, and the
 * copy in pieces of 256 (src/share.c). */
static void test_lends(void **state) {
  (void)state;
  pid_t child = borrower();
  const size_t n[2] = {300, 3000};
  uint64_t w[2], wsnap[2];
  for (int r = 0; r < 2; r++) {
    pinpool_t *pool;
    PP_OK(pinpool_create(
        "shared=1,backend=host,mlock=0,populate=0,tcache_bytes=0", &pool));
    void **blk = calloc(n[r] * 4, sizeof *blk);
    PP_ASSERT(blk != NULL, "out of memory");
    pinpool_share_handle_t hs[50];
    void *hb[50];
    size_t lent = 0, k = 0;
    while (lent < n[r] && k < n[r] * 4) {
      pinpool_share_handle_t h;
      int fd;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &blk[k]));
      /* EBUSY: the chunk has its most lends (128); the next chunk then. */
      int rc = pinpool_lend(pool, blk[k++], child, &h, &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
      if (rc == 0 && lent < 50) {
        hs[lent] = h;
        hb[lent] = blk[k - 1];
      }
      lent += rc == 0;
    }
    PP_ASSERT(lent == n[r], "%zu lends of %zu", lent, n[r]);
    (void)pp_share_meter(pool->share, true);
    /* Frees of blocks not lent, and lends made and returned. */
    for (int i = 0; i < 200; i++) {
      void *p;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      PP_OK(pinpool_free(pool, p));
    }
    for (int i = 0; i < 50; i++) { /* returned, lent again */
      int fd;
      PP_OK(pinpool_lend_return(pool, &hs[i], child));
      PP_OK(pinpool_lend(pool, hb[i], child, &hs[i], &fd));
    }
    w[r] = pp_share_meter(pool->share, true);
    char *text;
    size_t len;
    PP_OK(pinpool_snapshot_write_mem(pool, &text, &len,
                                     PINPOOL_SNAPSHOT_NO_HISTORY));
    wsnap[r] = pp_share_meter(pool->share, false);
    /* The copy is whole: every lend listed once. */
    size_t listed = count_of(text, "\"peer_pid\"");
    PP_ASSERT(listed == n[r], "the snapshot lists %zu lends of %zu", listed,
              n[r]);
    pinpool_snapshot_free(text);
    pinpool_destroy(pool);
    free(blk);
  }
  kill(child, SIGKILL);
  (void)waitpid(child, NULL, 0);
  check_growth("lends: frees, lends and returns", n, w, 0);
  check_growth("lends: a snapshot's copy", n, wsnap, 256);
}

/* The lends' copy in pieces keeps its promise (docs/snapshot-format.md):
 * between pieces (PP_HOOK_SNAP_TABLE) lends already copied and lends not
 * yet copied are returned and new ones made; a lend that lives through
 * the copy is listed once, no lend twice. A return fills its place in
 * lends[] with the last lend: without the cursor's care (src/share.c,
 * lend_end) a lend not yet copied lands among the copied ones and is
 * never listed. */
#define PL_N 1000
static struct {
  pinpool_t *pool;
  pid_t child;
  pinpool_share_handle_t h[PL_N + 64];
  void *blk[PL_N + 64];
  bool ended[PL_N + 64];
  size_t n; /* lends made */
  int calls;
} pl;

static void pieces_hook(int point) {
  if (point != PP_HOOK_SNAP_TABLE || pl.calls++ >= 3)
    return;
  /* Returned: 8 of the first lends (copied already after the first
   * piece), 8 of the last ones (not yet); made: 8 new ones. */
  for (int j = 0; j < 8; j++) {
    size_t a = (size_t)pl.calls * 8 + (size_t)j, b = PL_N - 1 - a;
    PP_OK(pinpool_lend_return(pl.pool, &pl.h[a], pl.child));
    PP_OK(pinpool_lend_return(pl.pool, &pl.h[b], pl.child));
    pl.ended[a] = pl.ended[b] = true;
  }
  for (int j = 0; j < 8 && pl.n < PL_N + 64; j++) {
    int fd;
    PP_OK(pinpool_alloc(pl.pool, 4 * KiB, &pl.blk[pl.n]));
    int rc = pinpool_lend(pl.pool, pl.blk[pl.n], pl.child, &pl.h[pl.n], &fd);
    PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
    if (rc == 0)
      pl.n++;
  }
}

static void test_lends_pieces(void **state) {
  (void)state;
  memset(&pl, 0, sizeof pl);
  pl.child = borrower();
  PP_OK(pinpool_create(
      "shared=1,backend=host,mlock=0,populate=0,tcache_bytes=0", &pl.pool));
  while (pl.n < PL_N) {
    int fd;
    PP_OK(pinpool_alloc(pl.pool, 4 * KiB, &pl.blk[pl.n]));
    int rc = pinpool_lend(pl.pool, pl.blk[pl.n], pl.child, &pl.h[pl.n], &fd);
    PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
    if (rc == 0)
      pl.n++;
  }
  size_t before = pl.n;
  atomic_store(&pp_test_hook, pieces_hook);
  char *text;
  size_t len;
  PP_OK(pinpool_snapshot_write_mem(pl.pool, &text, &len,
                                   PINPOOL_SNAPSHOT_NO_HISTORY));
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(pl.calls >= 3, "the copy took %d pieces", pl.calls);
  /* Times each lend is listed, by generation. */
  unsigned seen[PL_N + 64] = {0};
  const char *p = strstr(text, "\"lends\":[");
  PP_ASSERT(p != NULL, "no lends in the snapshot");
  const char *end = strchr(p, ']');
  for (p = strstr(p, "\"generation\":"); p != NULL && p < end;
       p = strstr(p + 1, "\"generation\":")) {
    uint64_t g = strtoull(p + strlen("\"generation\":"), NULL, 10);
    size_t i = 0;
    while (i < pl.n && pl.h[i].generation != g)
      i++;
    PP_ASSERT(i < pl.n, "generation %llu listed, never lent",
              (unsigned long long)g);
    seen[i]++;
  }
  for (size_t i = 0; i < pl.n; i++) {
    PP_ASSERT(seen[i] <= 1, "lend %zu listed %u times", i, seen[i]);
    PP_ASSERT(seen[i] == 1 || pl.ended[i] || i >= before,
              "lend %zu (generation %llu) lived through the copy and is not "
              "listed",
              i, (unsigned long long)pl.h[i].generation);
  }
  pinpool_snapshot_free(text);
  pinpool_destroy(pl.pool);
  kill(pl.child, SIGKILL);
  (void)waitpid(pl.child, NULL, 0);
}

/* ---- Returns and reclaims --------------------------------------------
 * A return named its lend by generation and walked the lends to find it;
 * a reclaim examined every lend in one hold of the share lock, while every
 * free of the pool waited on it. Now an index by generation, and the
 * reclaim's walk in holds of 256 lends (src/share.c). N lends to one
 * process: the last 50 returned (the walk found them last), then a reclaim
 * of another process's lends (none: all N examined) and of the exited. */
static void test_returns(void **state) {
  (void)state;
  pid_t a = borrower(), b = borrower();
  const size_t n[2] = {300, 3000};
  uint64_t w[2], wrc[2];
  for (int r = 0; r < 2; r++) {
    pinpool_t *pool;
    PP_OK(pinpool_create(
        "shared=1,backend=host,mlock=0,populate=0,tcache_bytes=0", &pool));
    pinpool_share_handle_t *h = calloc(n[r], sizeof *h);
    PP_ASSERT(h != NULL, "out of memory");
    size_t lent = 0;
    while (lent < n[r]) {
      void *p;
      int fd;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      int rc = pinpool_lend(pool, p, a, &h[lent], &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
      lent += rc == 0;
    }
    (void)pp_share_meter(pool->share, true);
    for (size_t i = n[r]; i-- > n[r] - 50;)
      PP_OK(pinpool_lend_return(pool, &h[i], a));
    /* Returned already: refused, nothing changed. */
    PP_ASSERT(pinpool_lend_return(pool, &h[n[r] - 1], a) == PINPOOL_ESTALE,
              "a second return was not refused as stale");
    w[r] = pp_share_meter(pool->share, true);
    size_t cnt = 99;
    PP_OK(pinpool_lend_reclaim(pool, b, PINPOOL_RECLAIM_LIVE, &cnt));
    PP_ASSERT(cnt == 0, "reclaimed %zu lends of a process with none", cnt);
    PP_OK(pinpool_lend_reclaim_exited(pool, 0, &cnt));
    PP_ASSERT(cnt == 0, "reclaimed %zu lends of a live process", cnt);
    wrc[r] = pp_share_meter(pool->share, true);
    PP_OK(pinpool_lend_reclaim(
        pool, a, PINPOOL_RECLAIM_LIVE | PINPOOL_RECLAIM_FREE, &cnt));
    PP_ASSERT(cnt == n[r] - 50, "reclaimed %zu lends of %zu", cnt, n[r] - 50);
    pinpool_stats_t st;
    PP_OK(pinpool_get_stats(pool, &st));
    PP_ASSERT(st.lent_blocks == 0, "%llu blocks still lent",
              (unsigned long long)st.lent_blocks);
    free(h);
    pinpool_destroy(pool);
  }
  kill(a, SIGKILL);
  kill(b, SIGKILL);
  (void)waitpid(a, NULL, 0);
  (void)waitpid(b, NULL, 0);
  check_growth("lends: returns by generation", n, w, 0);
  check_growth("lends: a reclaim's walk", n, wrc, 256);
}

/* The reclaim's walk in pieces ends every lend that lives through it:
 * between pieces (PP_HOOK_RECLAIM_PIECE) lends below the walk and above it
 * are returned and new ones made, which moves lends[] about (a return
 * fills its place with the last lend). */
#define RP_N 1000
static struct {
  pinpool_t *pool;
  pid_t child;
  pinpool_share_handle_t h[RP_N];
  bool returned[RP_N];
  size_t made; /* lends made between pieces */
  int calls;
} rp;

static void reclaim_hook(int point) {
  if (point != PP_HOOK_RECLAIM_PIECE || rp.calls++ >= 3)
    return;
  for (int j = 0; j < 8; j++) {
    size_t lo = (size_t)rp.calls * 8 + (size_t)j, hi = RP_N - 1 - lo;
    PP_OK(pinpool_lend_return(rp.pool, &rp.h[lo], rp.child));
    rp.returned[lo] = true;
    /* The top: ended by the walk already (ESTALE), or returned here. */
    int rc = pinpool_lend_return(rp.pool, &rp.h[hi], rp.child);
    PP_ASSERT(rc == 0 || rc == PINPOOL_ESTALE, "return: %d", rc);
    rp.returned[hi] = rc == 0;
  }
  for (int j = 0; j < 8; j++) {
    void *p;
    int fd;
    pinpool_share_handle_t h;
    PP_OK(pinpool_alloc(rp.pool, 4 * KiB, &p));
    int rc = pinpool_lend(rp.pool, p, rp.child, &h, &fd);
    PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
    rp.made += rc == 0;
  }
}

static void test_reclaim_pieces(void **state) {
  (void)state;
  memset(&rp, 0, sizeof rp);
  rp.child = borrower();
  PP_OK(pinpool_create(
      "shared=1,backend=host,mlock=0,populate=0,tcache_bytes=0", &rp.pool));
  for (size_t i = 0; i < RP_N;) {
    void *p;
    int fd;
    PP_OK(pinpool_alloc(rp.pool, 4 * KiB, &p));
    int rc = pinpool_lend(rp.pool, p, rp.child, &rp.h[i], &fd);
    PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
    i += rc == 0;
  }
  atomic_store(&pp_test_hook, reclaim_hook);
  size_t cnt;
  PP_OK(pinpool_lend_reclaim(rp.pool, rp.child, PINPOOL_RECLAIM_LIVE, &cnt));
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(rp.calls >= 3, "the walk took %d pieces", rp.calls + 1);
  /* Every lend that lived through the reclaim was ended by it. */
  for (size_t i = 0; i < RP_N; i++)
    if (!rp.returned[i])
      PP_ASSERT(pinpool_lend_return(rp.pool, &rp.h[i], rp.child) ==
                    PINPOOL_ESTALE,
                "lend %zu lived through the reclaim and was not ended", i);
  pinpool_stats_t st;
  PP_OK(pinpool_get_stats(rp.pool, &st));
  PP_ASSERT(st.lent_blocks <= rp.made,
            "%llu lends left, %zu made during the reclaim",
            (unsigned long long)st.lent_blocks, rp.made);
  pinpool_destroy(rp.pool);
  kill(rp.child, SIGKILL);
  (void)waitpid(rp.child, NULL, 0);
}

/* ---- (1) The stack table -------------------------------------------------
 * With history on, every allocation interns its stack under the stack
 * table's lock; a snapshot copied the whole table in one hold of it (2^16
 * call patterns: 0.3-0.5 s, another thread's allocation waited 426 ms).
 * Now pieces of at most 256 stacks or 4,096 frames (src/history.c).
 * N distinct stacks: go() calls A or B by the bits of i, 14 deep. */
static pinpool_t *stk_pool;
static void __attribute__((noinline)) stk_go(unsigned bits, int d);
static void __attribute__((noinline)) stk_leaf(void) {
  void *b;
  PP_OK(pinpool_alloc(stk_pool, 4 * KiB, &b));
  PP_OK(pinpool_free(stk_pool, b));
  __asm__ volatile("");
}
static void __attribute__((noinline)) stk_a(unsigned bits, int d) {
  stk_go(bits, d);
  __asm__ volatile("");
}
static void __attribute__((noinline)) stk_b(unsigned bits, int d) {
  stk_go(bits, d);
  __asm__ volatile("");
}
static void __attribute__((noinline)) stk_go(unsigned bits, int d) {
  if (d == 0)
    stk_leaf();
  else if (bits & 1)
    stk_a(bits >> 1, d - 1);
  else
    stk_b(bits >> 1, d - 1);
  __asm__ volatile("");
}

static int stk_pieces;
static void stacks_hook(int point) {
  if (point != PP_HOOK_SNAP_TABLE)
    return;
  stk_pieces++;
  stk_go((unsigned)stk_pieces, 14); /* an allocation between pieces */
}

static void test_stacks(void **state) {
  (void)state;
  const size_t n[2] = {1000, 10000};
  uint64_t w[2];
  for (int r = 0; r < 2; r++) {
    PP_OK(pinpool_create("backend=host,mlock=0,populate=0", &stk_pool));
    pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 1000, 64, 0};
    PP_OK(pinpool_record_history(stk_pool, &o));
    for (unsigned i = 0; i < n[r]; i++)
      stk_go(i, 14);
    (void)pp_stacks_meter(stk_pool, true);
    stk_pieces = 0;
    atomic_store(&pp_test_hook, stacks_hook);
    char *text;
    size_t len;
    PP_OK(pinpool_snapshot_write_mem(stk_pool, &text, &len,
                                     PINPOOL_SNAPSHOT_NO_HISTORY |
                                         PINPOOL_SNAPSHOT_NO_SYMBOLS));
    atomic_store(&pp_test_hook, NULL);
    w[r] = pp_stacks_meter(stk_pool, false);
    printf("stacks: %zu call patterns, the copy in %d pieces\n", n[r],
           stk_pieces + 1);
    pinpool_snapshot_free(text);
    pinpool_destroy(stk_pool);
  }
  /* A piece: 256 stacks or 4,096 frames, and the stack that passes them. */
  check_growth("stacks: a snapshot's copy", n, w, 256 + 4096 + 64);
}

/* The stack table's doublings: each rehashed every stack in the hold of
 * the intern that crossed the mark (8,191 slots at 10,000 stacks). Now the
 * old slots stay until each intern has moved 64 more (src/history.c). N
 * distinct stacks interned, all of them again (found, old slots or new:
 * no stack added), the meter over both. */
static size_t stacks_count(pinpool_t *pool) {
  pp_stacks_copy_t c;
  uint64_t hold = 0;
  PP_OK(pp_stacks_copy(pool, &c, &hold));
  size_t n = c.n;
  pp_stacks_copy_free(&c);
  return n;
}

static void test_stacks_growth(void **state) {
  (void)state;
  const size_t n[2] = {1000, 10000};
  uint64_t w[2];
  for (int r = 0; r < 2; r++) {
    PP_OK(pinpool_create("backend=host,mlock=0,populate=0", &stk_pool));
    pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 1000, 64, 0};
    PP_OK(pinpool_record_history(stk_pool, &o));
    (void)pp_stacks_meter(stk_pool, true);
    size_t count[2];
    w[r] = 0;
    for (int pass = 0; pass < 2; pass++) { /* one call site: same stacks */
      for (unsigned i = 0; i < n[r]; i++)
        stk_go(i, 14);
      uint64_t m = pp_stacks_meter(stk_pool, false);
      w[r] = m > w[r] ? m : w[r];
      count[pass] = stacks_count(stk_pool); /* a copy: off the meter */
      (void)pp_stacks_meter(stk_pool, true);
    }
    size_t made = count[0], again = count[1];
    PP_ASSERT(made >= n[r] && again == made,
              "%zu stacks after %zu call patterns, %zu after the same again",
              made, n[r], again);
    pinpool_destroy(stk_pool);
  }
  /* An intern: its probes and the 64 stacks it moves. */
  check_growth("stacks: interns through the table's doublings", n, w, 64);
}

/* ---- (6) record_stream ---------------------------------------------------
 * record_stream looked for the stream among every stream of the block
 * under its stripe lock (O(S) a call; 12.6 us a repeated call at S =
 * 20,000), and a full set was copied into one twice its size. Now chunks,
 * each with its own index (src/stream.h): O(log S) probes, no copy. A
 * snapshot's list of the block's streams stops at the 16 it lists (it
 * visited all S). The free still records one event on each stream. */
static uint64_t stripes_meter(pinpool_t *pool, bool reset) {
  uint64_t m = 0;
  for (int i = 0; i < 64; i++) {
    uint64_t v = pp_lock_meter(&pool->sset_locks[i], reset);
    m = v > m ? v : m;
  }
  return m;
}

static void test_record(void **state) {
  (void)state;
  const size_t n[2] = {500, 5000};
  uint64_t w[2];
  for (int r = 0; r < 2; r++) {
    pinpool_t *pool;
    PP_OK(pinpool_create("backend=host,mlock=0,populate=0,events=simulated,"
                         "sim_delay_us=0",
                         &pool));
    void *b;
    PP_OK(pinpool_alloc(pool, 4 * KiB, &b));
    (void)stripes_meter(pool, true);
    for (size_t i = 1; i <= n[r]; i++)
      PP_OK(pinpool_record_stream(pool, b, (pinpool_stream_t)i));
    for (size_t i = 1; i <= n[r]; i += 7) /* recorded already */
      PP_OK(pinpool_record_stream(pool, b, (pinpool_stream_t)i));
    /* A snapshot lists the block's first 16 streams, no more. */
    char *text;
    size_t len;
    PP_OK(pinpool_snapshot_write_mem(pool, &text, &len,
                                     PINPOOL_SNAPSHOT_NO_HISTORY));
    pinpool_snapshot_free(text);
    w[r] = stripes_meter(pool, false);
    pinpool_stats_t a, z;
    PP_OK(pinpool_get_stats(pool, &a));
    PP_OK(pinpool_free(pool, b));
    PP_OK(pinpool_synchronize(pool));
    PP_OK(pinpool_get_stats(pool, &z));
    PP_ASSERT(z.events_recorded - a.events_recorded == n[r],
              "the free recorded %llu events for %zu streams",
              (unsigned long long)(z.events_recorded - a.events_recorded),
              n[r]);
    pinpool_destroy(pool);
  }
  check_growth("record_stream", n, w, 0);
}

/* ---- Captures ------------------------------------------------------------
 * record_stream on a capturing stream and the free of a block tied to a
 * capture looked the capture up in a list of every capture not yet
 * released, and the stream up in a list of every stream the capture was
 * seen on, under streams_lock (src/capture.c). Now an index by id and one
 * by stream per capture. The provider's capture query is faked here (the
 * simulated provider has none): stream s < 2^20 captures alone, as capture
 * s; streams from 2^20 up are all in capture 2^20. */
#define CAP_SHARED ((pinpool_stream_t)1 << 20)
static bool cap_on;
static int fake_capture(void *ctx, pinpool_stream_t stream, uint64_t *id) {
  (void)ctx;
  if (!cap_on)
    return 0;
  *id = stream < CAP_SHARED ? (uint64_t)stream : (uint64_t)CAP_SHARED;
  return 1;
}

static void test_captures(void **state) {
  (void)state;
  const size_t n[2] = {500, 5000};
  uint64_t w[2], wg[2];
  for (int r = 0; r < 2; r++) {
    pinpool_t *pool;
    PP_OK(pinpool_create("backend=host,mlock=0,populate=0,events=simulated,"
                         "sim_delay_us=0,tcache_bytes=0",
                         &pool));
    pool->ev.capture = fake_capture;
    cap_on = true;
    void **blk = calloc(n[r] + 2, sizeof *blk);
    PP_ASSERT(blk != NULL, "out of memory");
    /* n captures, one block tied to each; then n streams of one capture. */
    for (size_t i = 0; i < n[r]; i++) {
      PP_OK(pinpool_alloc(pool, 4 * KiB, &blk[i]));
      PP_OK(pinpool_record_stream(pool, blk[i], (pinpool_stream_t)(i + 1)));
    }
    PP_OK(pinpool_alloc(pool, 4 * KiB, &blk[n[r]]));
    for (size_t i = 0; i < n[r]; i++)
      PP_OK(pinpool_record_stream(pool, blk[n[r]], CAP_SHARED + i));
    (void)pp_lock_meter(&pool->streams_lock, true);
    /* The first capture made is the list's last; the shared capture's
     * streams seen again; a free parks its block on two captures. */
    PP_OK(pinpool_alloc(pool, 4 * KiB, &blk[n[r] + 1]));
    PP_OK(pinpool_record_stream(pool, blk[n[r] + 1], 1));
    PP_OK(pinpool_record_stream(pool, blk[n[r] + 1], CAP_SHARED + 1));
    PP_OK(pinpool_free(pool, blk[n[r] + 1]));
    PP_OK(pinpool_record_stream(pool, blk[0], CAP_SHARED));
    PP_OK(pinpool_free(pool, blk[0]));
    w[r] = pp_lock_meter(&pool->streams_lock, false);
    /* Everything parked, then released: nothing held, every block back. */
    for (size_t i = 1; i <= n[r]; i++)
      PP_OK(pinpool_free(pool, blk[i]));
    pinpool_stats_t st;
    PP_OK(pinpool_get_stats(pool, &st));
    PP_ASSERT(st.graph_held_blocks == n[r] + 2, "%llu blocks parked, not %zu",
              (unsigned long long)st.graph_held_blocks, n[r] + 2);
    cap_on = false;
    /* The captures of stream 2 (capture 2 alone) among n + 1: asked every
     * capture before (issue 38, the meter's findings, item 3). */
    (void)pp_lock_meter(&pool->streams_lock, true);
    PP_OK(pinpool_stream_graphs_release(pool, 2));
    wg[r] = pp_lock_meter(&pool->streams_lock, false);
    PP_ASSERT(pinpool_stream_graphs_release(pool, 2) == PINPOOL_EINVAL,
              "stream 2's captures released twice");
    PP_OK(pinpool_stream_graphs_release(pool, CAP_SHARED + 7));
    for (size_t i = 1; i <= n[r]; i++)
      if (i != 2)
        PP_OK(pinpool_graph_release(pool, (uint64_t)i));
    PP_ASSERT(pinpool_graph_release(pool, 1) == PINPOOL_EINVAL,
              "a capture released twice");
    PP_OK(pinpool_synchronize(pool));
    PP_OK(pinpool_get_stats(pool, &st));
    PP_ASSERT(st.graph_held_blocks == 0 && st.requests.current == 0,
              "%llu blocks parked, %llu allocated after every release",
              (unsigned long long)st.graph_held_blocks,
              (unsigned long long)st.requests.current);
    free(blk);
    pinpool_destroy(pool);
  }
  check_growth("captures: record_stream and free", n, w, 0);
  check_growth("captures: stream_graphs_release of one capture", n, wg, 0);
}

/* The most a hold may visit for an index doubling in progress: a lend
 * changes two indexes twice (a reserve, a put), each moving at most
 * PP_INDEX_STEP old slots and probing once or more for each. */
#define INDEX_HOLD (8 * PP_INDEX_STEP + 32)

/* ---- Index doublings ---------------------------------------------------
 * The lends' indexes and the captures' (src/index.h) were rebuilt whole
 * in the hold that made them double: every lend, or every capture, in one
 * hold of the share lock or streams_lock (issue 38, the meter's findings,
 * item 1). Now PP_INDEX_STEP old slots move per change. Counted from the
 * pool's start: N lends; N captures. */
static void test_index_growth(void **state) {
  (void)state;
  pid_t child = borrower();
  const size_t n[2] = {300, 3000}, nc[2] = {500, 5000};
  uint64_t w[2], wc[2];
  for (int r = 0; r < 2; r++) {
    pinpool_t *pool;
    PP_OK(pinpool_create(
        "shared=1,backend=host,mlock=0,populate=0,tcache_bytes=0", &pool));
    (void)pp_share_meter(pool->share, true);
    size_t lent = 0;
    pinpool_share_handle_t h;
    while (lent < n[r]) {
      void *p;
      int fd;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      int rc = pinpool_lend(pool, p, child, &h, &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
      lent += rc == 0;
    }
    w[r] = pp_share_meter(pool->share, false);
    /* Every lend still found: the last by generation, all by block. */
    PP_OK(pinpool_lend_return(pool, &h, child));
    size_t cnt = 0;
    PP_OK(pinpool_lend_reclaim(
        pool, child, PINPOOL_RECLAIM_LIVE | PINPOOL_RECLAIM_FREE, &cnt));
    PP_ASSERT(cnt == n[r] - 1, "reclaimed %zu lends of %zu", cnt, n[r] - 1);
    pinpool_destroy(pool);

    PP_OK(pinpool_create("backend=host,mlock=0,populate=0,events=simulated,"
                         "sim_delay_us=0,tcache_bytes=0",
                         &pool));
    pool->ev.capture = fake_capture;
    cap_on = true;
    (void)pp_lock_meter(&pool->streams_lock, true);
    void *one, *many;
    for (size_t i = 0; i < nc[r]; i++) {
      PP_OK(pinpool_alloc(pool, 4 * KiB, &one));
      PP_OK(pinpool_record_stream(pool, one, (pinpool_stream_t)(i + 1)));
      PP_OK(pinpool_free(pool, one)); /* parked on capture i + 1 */
    }
    wc[r] = pp_lock_meter(&pool->streams_lock, false);
    /* One capture on N streams (not counted: a capture's streams are its
     * own size, as a block's are the free's), released by one of them. */
    PP_OK(pinpool_alloc(pool, 4 * KiB, &many));
    for (size_t i = 0; i < nc[r]; i++)
      PP_OK(pinpool_record_stream(pool, many, CAP_SHARED + i));
    PP_OK(pinpool_free(pool, many));
    cap_on = false;
    for (size_t i = 1; i <= nc[r]; i++)
      PP_OK(pinpool_graph_release(pool, (uint64_t)i));
    PP_OK(pinpool_stream_graphs_release(pool, CAP_SHARED + nc[r] - 1));
    PP_OK(pinpool_synchronize(pool));
    pinpool_stats_t st;
    PP_OK(pinpool_get_stats(pool, &st));
    PP_ASSERT(st.graph_held_blocks == 0 && st.requests.current == 0,
              "%llu blocks parked, %llu allocated after every release",
              (unsigned long long)st.graph_held_blocks,
              (unsigned long long)st.requests.current);
    pinpool_destroy(pool);
  }
  kill(child, SIGKILL);
  (void)waitpid(child, NULL, 0);
  check_growth("index doublings: lends", n, w, INDEX_HOLD);
  check_growth("index doublings: captures", nc, wc, INDEX_HOLD);
}

/* The index against a model (src/index.c): puts, sets, gets and deletes
 * through many doublings, with keys that are its own markers (0, 1) and
 * colliding ones; a lookup during a doubling asks both slot arrays. */
static void test_index_model(void **state) {
  (void)state;
  enum { K = 4096 };
  static uint64_t keys[K], vals[K];
  pp_index_t ix;
  pp_index_init(&ix, NULL);
  uint64_t rnd = 88172645463325252u;
  for (size_t i = 0; i < K; i++)
    keys[i] = i < 4 ? (uint64_t[]){0, 1, UINT64_MAX, 2}[i]
                    : (i % 3 == 0 ? (uint64_t)i << 40 : (uint64_t)i * 4096);
  size_t live = 0;
  for (int op = 0; op < 200000; op++) {
    rnd ^= rnd << 13, rnd ^= rnd >> 7, rnd ^= rnd << 17;
    size_t i = (size_t)(rnd % K);
    /* Mostly adding early, mostly taking out late: grows, then shrinks. */
    bool add = (rnd >> 32) % 100 < (op < 120000 ? 70u : 30u);
    PP_ASSERT(pp_index_get(&ix, keys[i]) == vals[i],
              "key %#llx: %llu, not %llu", (unsigned long long)keys[i],
              (unsigned long long)pp_index_get(&ix, keys[i]),
              (unsigned long long)vals[i]);
    if (vals[i] == 0 && add) {
      PP_ASSERT(pp_index_reserve(&ix, 1), "out of memory");
      vals[i] = (uint64_t)op + 1;
      pp_index_put(&ix, keys[i], vals[i]);
      live++;
    } else if (vals[i] != 0 && add) {
      vals[i] = (uint64_t)op + 7;
      pp_index_set(&ix, keys[i], vals[i]);
    } else if (vals[i] != 0) {
      pp_index_del(&ix, keys[i]);
      vals[i] = 0;
      live--;
    }
    PP_ASSERT(ix.n == live, "%zu entries, %zu entered", ix.n, live);
  }
  for (size_t i = 0; i < K; i++)
    PP_ASSERT(pp_index_get(&ix, keys[i]) == vals[i], "key %#llx at the end",
              (unsigned long long)keys[i]);
  pp_index_fini(&ix);
}

/* ---- Peers -------------------------------------------------------------
 * Every lend, return, end and reclaimed lend looked its peer record up by
 * walking the records (by id, by pid: a poll each), and every new record
 * polled every record to prune the exited (issue 38, the meter's findings,
 * item 2). Now a lend points at its record, the records are indexed by
 * pid, and a new record prunes a few in turn. N processes with a lend
 * each; then lends to and returns from the last, and a new process. */
static void test_peers(void **state) {
  (void)state;
  const size_t n[2] = {30, 300};
  uint64_t w[2];
  for (int r = 0; r < 2; r++) {
    pid_t *kid = calloc(n[r] + 1, sizeof *kid);
    PP_ASSERT(kid != NULL, "out of memory");
    for (size_t i = 0; i <= n[r]; i++)
      kid[i] = borrower();
    pinpool_t *pool;
    PP_OK(pinpool_create(
        "shared=1,backend=host,mlock=0,populate=0,tcache_bytes=0", &pool));
    for (size_t i = 0; i < n[r];) {
      void *p;
      int fd;
      pinpool_share_handle_t h;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      int rc = pinpool_lend(pool, p, kid[i], &h, &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
      i += rc == 0;
    }
    (void)pp_share_meter(pool->share, true);
    pinpool_share_handle_t hs[20];
    for (size_t j = 0; j < 20;) {
      void *p;
      int fd;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      int rc = pinpool_lend(pool, p, kid[n[r] - 1], &hs[j], &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
      j += rc == 0;
    }
    for (size_t j = 0; j < 20; j++)
      PP_OK(pinpool_lend_return(pool, &hs[j], kid[n[r] - 1]));
    for (int done = 0; !done;) { /* a new process: a new record */
      void *p;
      int fd;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      int rc = pinpool_lend(pool, p, kid[n[r]], &hs[0], &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d", rc);
      done = rc == 0;
    }
    w[r] = pp_share_meter(pool->share, false);
    /* The processes exit: a reclaim ends their lends and closes their
     * records' pidfds, every one of them. */
    int fds = pp_count_fds();
    for (size_t i = 0; i <= n[r]; i++) {
      kill(kid[i], SIGKILL);
      (void)waitpid(kid[i], NULL, 0);
    }
    size_t cnt = 0;
    PP_OK(pinpool_lend_reclaim_exited(pool, PINPOOL_RECLAIM_FREE, &cnt));
    PP_ASSERT(cnt == n[r] + 1, "reclaimed %zu lends of %zu", cnt, n[r] + 1);
    int left = pp_count_fds();
    PP_ASSERT(left <= fds - (int)(n[r] + 1),
              "%d descriptors open after the reclaim, %d before: the exited "
              "peers' pidfds were not all closed",
              left, fds);
    pinpool_destroy(pool);
    free(kid);
  }
  check_growth("peers: lends to and returns from one of n", n, w, INDEX_HOLD);
}

/* ---- (4) Peaks without thread caches -------------------------------------
 * With tcache_bytes=0 every free and every central allocation samples the
 * peaks, and a sample summed every thread's counters under reg_lock (67 us
 * a pair at 1,000 threads). Now each thread adds its own to the pool's
 * totals at the end of the operation and a sample reads those (src/stats.c).
 * T threads with a cache of the pool wait while this one allocates and
 * frees; the peaks stay exact (3 blocks at most, from none). */
static pthread_barrier_t thr_bar;
static pinpool_t *thr_pool;
static void *thr_main(void *arg) {
  (void)arg;
  void *p;
  PP_OK(pinpool_alloc(thr_pool, 4 * KiB, &p)); /* its cache */
  PP_OK(pinpool_free(thr_pool, p));
  pthread_barrier_wait(&thr_bar); /* made */
  pthread_barrier_wait(&thr_bar); /* measured */
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  const size_t n[2] = {20, 200};
  uint64_t w[2], tot[2];
  for (int r = 0; r < 2; r++) {
    PP_OK(pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=0",
                         &thr_pool));
    pthread_t *t = calloc(n[r], sizeof *t);
    PP_ASSERT(t != NULL, "out of memory");
    PP_ASSERT(pthread_barrier_init(&thr_bar, NULL, (unsigned)n[r] + 1) == 0,
              "barrier");
    for (size_t i = 0; i < n[r]; i++)
      PP_ASSERT(pthread_create(&t[i], NULL, thr_main, NULL) == 0, "thread");
    pthread_barrier_wait(&thr_bar);
    PP_OK(pinpool_reset_peak_stats(thr_pool)); /* nothing allocated now */
    pinpool_stats_t a, z;
    PP_OK(pinpool_get_stats(thr_pool, &a));
    (void)pp_lock_meter(&thr_pool->reg_lock, true);
    (void)pp_lock_meter_total(&thr_pool->reg_lock, true);
    for (int i = 0; i < 100; i++) {
      void *p[3];
      for (int j = 0; j < 3; j++)
        PP_OK(pinpool_alloc(thr_pool, (size_t)(4 + j) * KiB, &p[j]));
      for (int j = 0; j < 3; j++)
        PP_OK(pinpool_free(thr_pool, p[j]));
    }
    w[r] = pp_lock_meter(&thr_pool->reg_lock, false);
    tot[r] = pp_lock_meter_total(&thr_pool->reg_lock, false) / 600;
    PP_OK(pinpool_get_stats(thr_pool, &z));
    pthread_barrier_wait(&thr_bar);
    for (size_t i = 0; i < n[r]; i++)
      PP_ASSERT(pthread_join(t[i], NULL) == 0, "join");
    (void)pthread_barrier_destroy(&thr_bar);
    free(t);
    /* Exact peaks (docs/stats.md, tcache_bytes=0): none, then 3. */
    PP_ASSERT(a.requests.peak == 0 && z.requests.peak == 3,
              "requests peak %llu then %llu, not 0 then 3",
              (unsigned long long)a.requests.peak,
              (unsigned long long)z.requests.peak);
    PP_ASSERT(
        z.requests.allocated - a.requests.allocated == 300,
        "%llu allocations counted, not 300",
        (unsigned long long)(z.requests.allocated - a.requests.allocated));
    pinpool_destroy(thr_pool);
  }
  check_growth("threads: a free's and an allocation's peak sample", n, w, 0);
  /* Per operation, not per hold: a walk of every thread in pieces of 64
   * (the sums' pieces) keeps each hold bounded but costs each sample
   * every thread; the pool-wide totals cost none. */
  check_growth("threads: a peak sample's elements per operation", n, tot, 0);
}

/* ---- Sums of every thread's counters ----------------------------------
 * pinpool_get_stats, pinpool_reset_peak_stats and, with thread caches, a
 * peak sample (once a thread took tcache_bytes from the central bins) add
 * every thread's counters: that was one hold of reg_lock, which every
 * thread's first allocation and its exit take. Now PP_STATS_PIECE (64)
 * caches a hold (src/stats.c, "The sum in pieces"). */
#define SUM_T 200
static struct {
  pinpool_t *pool;
  pthread_t t[SUM_T];
  sem_t go[SUM_T];
  bool joined[SUM_T];
  int calls;
  uint64_t made_during; /* allocations by threads made between pieces */
} sm;

static void *sum_thread(void *arg) {
  size_t i = (size_t)(uintptr_t)arg;
  void *p[10];
  for (int j = 0; j < 10; j++) /* into the cache, and out */
    PP_OK(pinpool_alloc(sm.pool, 4 * KiB, &p[j]));
  for (int j = 0; j < 10; j++)
    PP_OK(pinpool_free(sm.pool, p[j]));
  while (sem_wait(&sm.go[i]) != 0)
    ;
  return NULL;
}

static void *sum_brief(void *arg) {
  (void)arg;
  void *p;
  PP_OK(pinpool_alloc(sm.pool, 4 * KiB, &p));
  PP_OK(pinpool_free(sm.pool, p));
  return NULL;
}

static void sum_start(size_t t) {
  for (size_t i = 0; i < t; i++) {
    PP_ASSERT(sem_init(&sm.go[i], 0, 0) == 0, "sem_init");
    sm.joined[i] = false;
    PP_ASSERT(
        pthread_create(&sm.t[i], NULL, sum_thread, (void *)(uintptr_t)i) == 0,
        "thread");
  }
}

static void sum_end(size_t i) {
  if (sm.joined[i])
    return;
  PP_ASSERT(sem_post(&sm.go[i]) == 0, "sem_post");
  PP_ASSERT(pthread_join(sm.t[i], NULL) == 0, "join");
  sm.joined[i] = true;
}

/* Each waits until its cache is made: its first allocation counted. */
static void sum_wait_made(pinpool_t *pool, uint64_t allocs) {
  for (;;) {
    pinpool_stats_t st;
    PP_OK(pinpool_get_stats(pool, &st));
    if (st.requests.allocated >= allocs)
      return;
    usleep(1000);
  }
}

static void test_sums(void **state) {
  (void)state;
  const size_t n[2] = {SUM_T / 10, SUM_T};
  uint64_t w[2];
  for (int r = 0; r < 2; r++) {
    PP_OK(pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=65536",
                         &sm.pool));
    sum_start(n[r]);
    sum_wait_made(sm.pool, 10 * n[r]);
    (void)pp_lock_meter(&sm.pool->reg_lock, true);
    pinpool_stats_t a, z;
    PP_OK(pinpool_get_stats(sm.pool, &a));
    PP_OK(pinpool_reset_peak_stats(sm.pool));
    /* Past tcache_bytes from the central bins: peak samples. */
    void *p[64];
    for (int j = 0; j < 64; j++)
      PP_OK(pinpool_alloc(sm.pool, 8 * KiB, &p[j]));
    for (int j = 0; j < 64; j++)
      PP_OK(pinpool_free(sm.pool, p[j]));
    PP_OK(pinpool_get_stats(sm.pool, &z));
    w[r] = pp_lock_meter(&sm.pool->reg_lock, false);
    PP_ASSERT(a.requests.allocated == 10 * n[r] &&
                  z.requests.allocated == 10 * n[r] + 64,
              "%llu then %llu allocations counted, not %zu then %zu",
              (unsigned long long)a.requests.allocated,
              (unsigned long long)z.requests.allocated, 10 * n[r],
              10 * n[r] + 64);
    /* Sampled: never above the truth (docs/stats.md). */
    PP_ASSERT(z.requests.peak >= 1 && z.requests.peak <= 64,
              "requests peak %llu, 64 blocks at most",
              (unsigned long long)z.requests.peak);
    for (size_t i = 0; i < n[r]; i++)
      sum_end(i);
    pinpool_destroy(sm.pool);
  }
  check_growth("sums: get_stats, reset_peak_stats, a peak sample", n, w,
               PP_STATS_PIECE);
}

/* Threads exit between the pieces of a sum: 8 of the newest (the head of
 * the list, visited in the first piece) and 8 of the oldest (not visited
 * yet), and 4 new threads come and go. The sum is exact: every operation
 * that ended before the call, once (an exit's counters move to the
 * exited threads' totals, which the sum read in its first hold); the new
 * threads' are concurrent and not counted; the next sum counts them. */
static void sum_pieces_hook(int point) {
  if (point != PP_HOOK_STATS_PIECE || sm.calls++ != 0)
    return;
  for (size_t j = 0; j < 8; j++) {
    sum_end(SUM_T - 1 - j);
    sum_end(j);
  }
  for (int j = 0; j < 4; j++) {
    pthread_t t;
    PP_ASSERT(pthread_create(&t, NULL, sum_brief, NULL) == 0, "thread");
    PP_ASSERT(pthread_join(t, NULL) == 0, "join");
    sm.made_during++;
  }
}

static void test_sum_pieces(void **state) {
  (void)state;
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=65536",
                       &sm.pool));
  sum_start(SUM_T);
  sum_wait_made(sm.pool, 10 * SUM_T);
  pinpool_stats_t a, z;
  sm.calls = 0;
  sm.made_during = 0;
  atomic_store(&pp_test_hook, sum_pieces_hook);
  PP_OK(pinpool_get_stats(sm.pool, &a));
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(sm.calls >= 1, "the sum took one piece");
  PP_OK(pinpool_get_stats(sm.pool, &z));
  PP_ASSERT(a.requests.allocated == 10 * SUM_T &&
                a.requests.freed == 10 * SUM_T,
            "threads exited during the sum: %llu allocations and %llu frees "
            "counted, not %d",
            (unsigned long long)a.requests.allocated,
            (unsigned long long)a.requests.freed, 10 * SUM_T);
  PP_ASSERT(z.requests.allocated == 10 * SUM_T + sm.made_during,
            "the next sum: %llu allocations counted, not %llu",
            (unsigned long long)z.requests.allocated,
            (unsigned long long)(10 * SUM_T + sm.made_during));
  for (size_t i = 0; i < SUM_T; i++)
    sum_end(i);
  pinpool_destroy(sm.pool);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(test_lends),       cmocka_unit_test(test_lends_pieces),
      cmocka_unit_test(test_returns),     cmocka_unit_test(test_reclaim_pieces),
      cmocka_unit_test(test_captures),    cmocka_unit_test(test_index_growth),
      cmocka_unit_test(test_index_model), cmocka_unit_test(test_peers),
      cmocka_unit_test(test_sums),        cmocka_unit_test(test_sum_pieces),
      cmocka_unit_test(test_stacks),      cmocka_unit_test(test_stacks_growth),
      cmocka_unit_test(test_record),      cmocka_unit_test(test_threads),
  };
  return pp_run_selected("test_scale_locks", all, sizeof all / sizeof all[0],
                         argc, argv);
}
