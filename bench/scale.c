/*
 * Micro-benchmark: the cost of each operation that issue 38 (items 2-6)
 * found proportional to the pool, at N = 1,000, 10,000 and 100,000 free
 * extents, with the exponent fitted between each N and the next
 * (log10 of the ratio: 0 flat, 1 linear). docs/benchmarks.md, "Issue 38".
 *
 *   pp_bench_scale [REPS] [N ...]   (default: 5 1000 10000 100000)
 *   PP_SCALE_OPS="stall snapshot" pp_bench_scale ...: those alone
 *
 * The pool: 2N + 1 blocks of 260 KiB (each a segment of its own, carved
 * from the arena), every other one freed and its segment given back by
 * pinpool_empty_cache: N free extents between blocks in use. The backend
 * reserves address space only (PROT_NONE, MAP_NORESERVE; the pool never
 * touches block memory), so 100,000 extents take no memory. Operations
 * (each the median of REPS runs on a fresh pool):
 *
 *   free-capped   max_cached=1MiB: alloc + free of a 260 KiB block, whose
 *                 free trims (looks for a whole free chunk to release)
 *   empty-cache   pinpool_empty_cache releasing 8 whole free chunks (each
 *                 a 2 GiB block's, allocated and freed before)
 *   snapshot      pinpool_snapshot_write_mem (no history): the whole call,
 *                 and its longest lock hold (max_hold_ns, the snapshot's)
 *   get-stats     pinpool_get_stats
 *   stall         the longest alloc + free of a block that is carved from
 *                 the arena (its size changes each time: no cache serves
 *                 it) while another thread runs empty_cache, a snapshot
 *                 and get_stats in a loop, for 1 s
 *   stall-p99     the 99th percentile of those alloc + free pairs
 *   fit-cycle     the arena's extents alone (src/extent.c): a bin of N
 *                 extents too small for a request of its class and one
 *                 that fits; alloc A, alloc B, free A, free B
 *   largest       the extents alone: the largest free extent with N
 *                 extents in the top bin (what get_stats reports)
 *   record-repeat pinpool_record_stream of a stream the block has already,
 *                 with N streams recorded on the block (events=simulated;
 *                 issue 38, the locks' meter: it scanned all N)
 *   lend-hold     N lends made in a shared pool from none: the most
 *                 elements one hold of the share lock visited (its meter;
 *                 a count, not a time: issue 38 (s39), the indexes'
 *                 doublings)
 *   lend-slowest  the slowest of those N lends (wall time)
 *   capture-hold  N graph captures entered from none (the provider's
 *                 capture query faked): the most elements one hold of
 *                 streams_lock visited
 *   graphs-release pinpool_stream_graphs_release of one stream's one
 *                 capture among N + 1 (it asked every capture)
 *   xtab-hold     2N + 1 blocks allocated from a fresh pool (the boundary
 *                 table doubles as they are: each may come back alone):
 *                 the most elements one call visited (the arena's meter)
 *
 * The extents' functions are the library's internal ones (the static
 * library exports them), with the same signatures before and after the
 * change, so that the program builds against both.
 */
#define _GNU_SOURCE
#include "internal.h"
#include "space_backend.h"

#include <math.h>
#include <pinpool.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define BLOCK ((size_t)260 * 1024)
#define GRAN ((size_t)4096)
#define MIB ((size_t)1 << 20)

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "pp_bench_scale: %s: %s\n", what, pinpool_last_error());
  exit(1);
}

typedef struct frag {
  pinpool_t *pool;
  void **live;
  size_t nlive;
} frag_t;

static void frag_make(frag_t *f, size_t n, const char *conf) {
  if (pinpool_create_with_backend(conf, &pp_space_backend, &f->pool) != 0)
    die("create");
  size_t total = 2 * n + 1;
  void **all = malloc(total * sizeof *all);
  f->live = malloc((n + 1) * sizeof *f->live);
  if (all == NULL || f->live == NULL)
    die("malloc");
  for (size_t i = 0; i < total; i++)
    if (pinpool_alloc(f->pool, BLOCK, &all[i]) != 0)
      die("alloc");
  f->nlive = 0;
  for (size_t i = 0; i < total; i++) {
    if (i % 2 == 0)
      f->live[f->nlive++] = all[i];
    else if (pinpool_free(f->pool, all[i]) != 0)
      die("free");
  }
  free(all);
  if (pinpool_empty_cache(f->pool) != 0)
    die("empty_cache");
}

static void frag_free(frag_t *f) {
  for (size_t i = 0; i < f->nlive; i++)
    (void)pinpool_free(f->pool, f->live[i]);
  free(f->live);
  pinpool_destroy(f->pool);
}

/* ---- The operations: ns per operation at n free extents ---------------- */

static double op_free_capped(size_t n) {
  frag_t f;
  frag_make(&f, n, "max_cached=1MiB,tcache_bytes=0");
  enum { R = 64 };
  uint64_t t0 = now_ns();
  for (int i = 0; i < R; i++) {
    void *p;
    if (pinpool_alloc(f.pool, BLOCK, &p) != 0 || pinpool_free(f.pool, p) != 0)
      die("free-capped");
  }
  double dt = (double)(now_ns() - t0) / R;
  frag_free(&f);
  return dt;
}

static double op_empty_cache(size_t n) {
  frag_t f;
  frag_make(&f, n, "tcache_bytes=0");
  enum { K = 8, R = 3 };
  double best = 0;
  uint64_t sum = 0;
  for (int r = 0; r < R; r++) {
    void *big[K];
    for (int k = 0; k < K; k++)
      if (pinpool_alloc(f.pool, (size_t)2 << 30, &big[k]) != 0)
        die("alloc 2 GiB");
    for (int k = 0; k < K; k++)
      (void)pinpool_free(f.pool, big[k]);
    uint64_t t0 = now_ns();
    if (pinpool_empty_cache(f.pool) != 0)
      die("empty_cache");
    sum += now_ns() - t0;
  }
  best = (double)sum / R;
  frag_free(&f);
  return best;
}

static double snap_hold_ns;

static double op_snapshot(size_t n) {
  frag_t f;
  frag_make(&f, n, "tcache_bytes=0");
  char *text;
  size_t len;
  uint64_t t0 = now_ns();
  if (pinpool_snapshot_write_mem(f.pool, &text, &len,
                                 PINPOOL_SNAPSHOT_NO_HISTORY) != 0)
    die("snapshot");
  double dt = (double)(now_ns() - t0);
  const char *h = strstr(text, "\"max_hold_ns\"");
  snap_hold_ns = h != NULL ? strtod(strchr(h, ':') + 1, NULL) : -1;
  pinpool_snapshot_free(text);
  frag_free(&f);
  return dt;
}

static double op_get_stats(size_t n) {
  frag_t f;
  frag_make(&f, n, "tcache_bytes=0");
  enum { R = 1000 };
  pinpool_stats_t st;
  uint64_t t0 = now_ns();
  for (int i = 0; i < R; i++)
    if (pinpool_get_stats(f.pool, &st) != 0)
      die("get_stats");
  double dt = (double)(now_ns() - t0) / R;
  frag_free(&f);
  return dt;
}

typedef struct loop_arg {
  pinpool_t *pool;
  _Atomic(int) stop;
} loop_arg_t;

static void *loop_ops(void *arg) {
  loop_arg_t *l = arg;
  while (!atomic_load(&l->stop)) {
    pinpool_stats_t st;
    char *text;
    size_t len;
    (void)pinpool_empty_cache(l->pool);
    if (pinpool_snapshot_write_mem(l->pool, &text, &len,
                                   PINPOOL_SNAPSHOT_NO_HISTORY) == 0)
      pinpool_snapshot_free(text);
    (void)pinpool_get_stats(l->pool, &st);
  }
  return NULL;
}

static double stall_p99_ns; /* the last op_stall's 99th percentile */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static double op_stall(size_t n) {
  frag_t f;
  frag_make(&f, n, "tcache_bytes=0");
  loop_arg_t l = {f.pool, 0};
  pthread_t t;
  if (pthread_create(&t, NULL, loop_ops, &l) != 0)
    die("thread");
  uint64_t worst = 0, t_end = now_ns() + 1000000000u; /* 1 s */
  size_t cap = (size_t)1 << 22, got = 0;
  uint64_t *lat = malloc(cap * sizeof *lat);
  if (lat == NULL)
    die("stall: out of memory");
  for (size_t i = 0; now_ns() < t_end; i++) {
    /* A size of its own each time (up to 4 MiB in pages): carved. */
    size_t size = BLOCK + (i % 997) * GRAN;
    void *p;
    uint64_t t0 = now_ns();
    if (pinpool_alloc(f.pool, size, &p) != 0 || pinpool_free(f.pool, p) != 0)
      die("stall");
    uint64_t dt = now_ns() - t0;
    worst = dt > worst ? dt : worst;
    if (got < cap)
      lat[got++] = dt;
  }
  qsort(lat, got, sizeof *lat, cmp_u64);
  stall_p99_ns = got > 0 ? (double)lat[got * 99 / 100] : 0;
  free(lat);
  atomic_store(&l.stop, 1);
  pthread_join(t, NULL);
  frag_free(&f);
  return (double)worst;
}

/* n extents of `small` and one of `big` (given back first: the deepest
 * of a list), and `tail` bytes free after them, in one chunk. */
static uintptr_t islands(pp_extents_t *x, size_t n, size_t small, size_t big,
                         size_t tail) {
  uintptr_t base = (uintptr_t)1 << 44;
  if (pp_ext_add_chunk(x, (void *)base, n * (small + GRAN) + big + GRAN + tail,
                       0) != 0)
    die("add_chunk");
  for (size_t i = 0; i < n; i++)
    if (pp_ext_take(x, small, NULL) == NULL ||
        pp_ext_take(x, GRAN, NULL) == NULL)
      die("take");
  void *b = pp_ext_take(x, big, NULL);
  if (b == NULL || pp_ext_take(x, GRAN, NULL) == NULL)
    die("take");
  pp_ext_give(x, b, big);
  for (size_t i = 0; i < n; i++)
    pp_ext_give(x, (void *)(base + i * (small + GRAN)), small);
  return (uintptr_t)b;
}

static double op_fit_cycle(size_t n) {
  pp_extents_t x;
  pp_ext_init(&x, GRAN, false);
  const size_t small = MIB + GRAN, big = MIB + 16 * GRAN;
  (void)islands(&x, n, small, big, 64 * MIB);
  enum { R = 200 };
  uint64_t t0 = now_ns();
  for (int i = 0; i < R; i++) {
    void *a = pp_ext_take(&x, big, NULL);
    void *b = pp_ext_take(&x, big, NULL);
    if (a == NULL || b == NULL)
      die("fit");
    pp_ext_give(&x, a, big);
    pp_ext_give(&x, b, big);
  }
  double dt = (double)(now_ns() - t0) / R;
  pp_ext_fini(&x);
  return dt;
}

static double op_largest(size_t n) {
  pp_extents_t x;
  pp_ext_init(&x, GRAN, false);
  (void)islands(&x, n, 2 * MIB + GRAN, 2 * MIB + 2 * GRAN, 0);
  enum { R = 200 };
  size_t got = 0;
  uint64_t t0 = now_ns();
  for (int i = 0; i < R; i++)
    got += pp_ext_largest(&x);
  double dt = (double)(now_ns() - t0) / R;
  if (got != R * (2 * MIB + 2 * GRAN))
    die("largest");
  pp_ext_fini(&x);
  return dt;
}

/* ---- Driver ---------------------------------------------------------------
 */

static double op_record_repeat(size_t n) {
  pinpool_t *pool;
  if (pinpool_create("backend=host,mlock=0,populate=0,events=simulated,"
                     "sim_delay_us=0",
                     &pool) != 0)
    die("record-repeat: create");
  void *b;
  if (pinpool_alloc(pool, 4096, &b) != 0)
    die("record-repeat: alloc");
  for (size_t i = 1; i <= n; i++)
    if (pinpool_record_stream(pool, b, (pinpool_stream_t)i) != 0)
      die("record-repeat: record");
  enum { R = 1000 };
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < R; i++)
    if (pinpool_record_stream(pool, b, (pinpool_stream_t)(1 + i % n)) != 0)
      die("record-repeat: again");
  double dt = (double)(now_ns() - t0) / R;
  if (pinpool_free(pool, b) != 0 || pinpool_synchronize(pool) != 0)
    die("record-repeat: free");
  pinpool_destroy(pool);
  return dt;
}

/* A child to lend to: it waits to be killed. */
static pid_t borrower(void) {
  pid_t c = fork();
  if (c < 0)
    die("fork");
  if (c == 0) {
    alarm(600);
    pause();
    _exit(0);
  }
  return c;
}

static double lend_slowest_ns;

static double op_lend_hold(size_t n) {
  pid_t child = borrower();
  pinpool_t *pool;
  if (pinpool_create("shared=1,backend=host,mlock=0,populate=0,"
                     "tcache_bytes=0",
                     &pool) != 0)
    die("lend-hold: create");
  (void)pp_share_meter(pool->share, true);
  uint64_t slowest = 0;
  for (size_t lent = 0; lent < n;) {
    void *p;
    pinpool_share_handle_t h;
    int fd;
    if (pinpool_alloc(pool, 4096, &p) != 0)
      die("lend-hold: alloc");
    uint64_t t0 = now_ns();
    int rc = pinpool_lend(pool, p, child, &h, &fd);
    uint64_t dt = now_ns() - t0;
    if (rc != 0 && rc != PINPOOL_EBUSY) /* EBUSY: a full chunk */
      die("lend-hold: lend");
    if (rc == 0 && dt > slowest)
      slowest = dt;
    lent += rc == 0;
  }
  double v = (double)pp_share_meter(pool->share, false);
  lend_slowest_ns = (double)slowest;
  pinpool_destroy(pool);
  kill(child, SIGKILL);
  (void)waitpid(child, NULL, 0);
  return v;
}

static int fake_capture(void *ctx, pinpool_stream_t stream, uint64_t *id) {
  (void)ctx;
  *id = (uint64_t)stream;
  return 1;
}

static double graphs_release_ns;

static double op_capture_hold(size_t n) {
  pinpool_t *pool;
  if (pinpool_create("backend=host,mlock=0,populate=0,events=simulated,"
                     "sim_delay_us=0,tcache_bytes=0",
                     &pool) != 0)
    die("capture-hold: create");
  pool->ev.capture = fake_capture;
  (void)pp_lock_meter(&pool->streams_lock, true);
  for (size_t i = 1; i <= n + 1; i++) {
    void *b;
    if (pinpool_alloc(pool, 4096, &b) != 0 ||
        pinpool_record_stream(pool, b, (pinpool_stream_t)i) != 0 ||
        pinpool_free(pool, b) != 0)
      die("capture-hold: capture");
  }
  double v = (double)pp_lock_meter(&pool->streams_lock, false);
  uint64_t t0 = now_ns();
  if (pinpool_stream_graphs_release(pool, (pinpool_stream_t)(n / 2)) != 0)
    die("graphs-release");
  graphs_release_ns = (double)(now_ns() - t0);
  pool->ev.capture = NULL;
  for (size_t i = 1; i <= n + 1; i++)
    if (i != n / 2 && pinpool_graph_release(pool, (uint64_t)i) != 0)
      die("capture-hold: release");
  if (pinpool_synchronize(pool) != 0)
    die("capture-hold: synchronize");
  pinpool_destroy(pool);
  return v;
}

static double op_xtab_hold(size_t n) {
  pinpool_t *pool;
  if (pinpool_create_with_backend("tcache_bytes=0", &pp_space_backend, &pool) !=
      0)
    die("xtab-hold: create");
  size_t total = 2 * n + 1;
  void **all = malloc(total * sizeof *all);
  if (all == NULL)
    die("malloc");
  for (size_t i = 0; i < total; i++)
    if (pinpool_alloc(pool, BLOCK, &all[i]) != 0)
      die("xtab-hold: alloc");
  uint64_t most = 0;
  pp_mutex_lock(&pool->seg_lock);
  for (unsigned k = 0; k < pool->nnodes; k++)
    if (pool->arena.node[k].ext.work_max > most)
      most = pool->arena.node[k].ext.work_max;
  pp_mutex_unlock(&pool->seg_lock);
  for (size_t i = 0; i < total; i++)
    if (pinpool_free(pool, all[i]) != 0)
      die("xtab-hold: free");
  free(all);
  pinpool_destroy(pool);
  return (double)most;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

typedef struct op {
  const char *name, *unit;
  double (*fn)(size_t);
  double scale; /* ns to unit */
} op_t;

int main(int argc, char **argv) {
  int reps = argc > 1 ? atoi(argv[1]) : 5;
  size_t ns[8] = {1000, 10000, 100000};
  int nn = 3;
  if (argc > 2) {
    nn = 0;
    for (int i = 2; i < argc && nn < 8; i++)
      ns[nn++] = (size_t)strtoull(argv[i], NULL, 10);
  }
  if (reps < 1)
    reps = 1;
  const op_t ops[] = {
      {"free-capped", "us", op_free_capped, 1e-3},
      {"empty-cache", "ms", op_empty_cache, 1e-6},
      {"snapshot", "ms", op_snapshot, 1e-6},
      {"snapshot-hold", "us", NULL, 1e-3},
      {"get-stats", "us", op_get_stats, 1e-3},
      {"stall", "ms", op_stall, 1e-6},
      {"stall-p99", "us", NULL, 1e-3},
      {"fit-cycle", "us", op_fit_cycle, 1e-3},
      {"largest", "us", op_largest, 1e-3},
      {"record-repeat", "us", op_record_repeat, 1e-3},
      {"lend-hold", "elements", op_lend_hold, 1},
      {"lend-slowest", "us", NULL, 1e-3},
      {"capture-hold", "elements", op_capture_hold, 1},
      {"xtab-hold", "elements", op_xtab_hold, 1},
      {"graphs-release", "us", NULL, 1e-3},
  };
  enum { NOPS = sizeof ops / sizeof ops[0] };
  /* PP_SCALE_OPS="stall snapshot": only the operations named (and those
   * measured with them: stall-p99, snapshot-hold, lend-slowest,
   * graphs-release); the others read 0. */
  const char *only = getenv("PP_SCALE_OPS");
  double med[NOPS][8];
  for (int k = 0; k < nn; k++) {
    double v[NOPS][16];
    for (int r = 0; r < reps && r < 16; r++)
      for (int o = 0; o < (int)NOPS; o++) {
        if (ops[o].fn == NULL) { /* the op before it measured these */
          const char *m = ops[o].name;
          v[o][r] = strcmp(m, "stall-p99") == 0        ? stall_p99_ns
                    : strcmp(m, "lend-slowest") == 0   ? lend_slowest_ns
                    : strcmp(m, "graphs-release") == 0 ? graphs_release_ns
                                                       : snap_hold_ns;
          continue;
        }
        if (only != NULL && strstr(only, ops[o].name) == NULL) {
          v[o][r] = 0; /* not asked for */
          continue;
        }
        v[o][r] = ops[o].fn(ns[k]);
      }
    for (int o = 0; o < (int)NOPS; o++) {
      qsort(v[o], (size_t)(reps < 16 ? reps : 16), sizeof v[o][0], cmp_d);
      med[o][k] = v[o][(reps < 16 ? reps : 16) / 2];
    }
    fprintf(stderr, "N = %zu done\n", ns[k]);
  }
  printf("| operation | unit |");
  for (int k = 0; k < nn; k++)
    printf(" N = %zu |", ns[k]);
  for (int k = 1; k < nn; k++)
    printf(" exponent %zu-%zu |", ns[k - 1], ns[k]);
  printf("\n|---|---|");
  for (int k = 0; k < 2 * nn - 1; k++)
    printf("---|");
  printf("\n");
  for (int o = 0; o < (int)NOPS; o++) {
    printf("| %s | %s |", ops[o].name, ops[o].unit);
    for (int k = 0; k < nn; k++)
      printf(" %.4g |", med[o][k] * ops[o].scale);
    for (int k = 1; k < nn; k++)
      printf(" %.2f |", log10(med[o][k] / med[o][k - 1]) /
                            log10((double)ns[k] / (double)ns[k - 1]));
    printf("\n");
  }
  return 0;
}
