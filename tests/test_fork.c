/*
 * Fork (DESIGN.md, invariant 9; docs/api.md, "Fork"): a child forked while
 * other threads use pinpool can allocate from a pool it inherited and from
 * a new one, and validates; it never hangs.
 *
 * Every child runs under a deadline: a child still running after it is
 * killed and the test fails (zero hangs allowed). Children report with
 * their exit status (no cmocka in a child), and leave with _exit.
 *
 *  - exit_lock_held: deterministic. A thread exiting holds pp_global_lock
 *    (a test hook in thread_exit, src/tcache.c) at the moment of the fork;
 *    the child's first call needs that lock. Without the handlers the
 *    child deadlocks (mutant NO_ATFORK: test_fork_no_atfork).
 *  - busy_section: deterministic. A thread is inside an allocation (in its
 *    backend's alloc, which the test's backend holds for 100 ms) at the
 *    moment of the fork; without the wait for busy sections the child
 *    inherits reserved bytes that no segment holds, and its validation
 *    fails (mutant NO_BUSY_WAIT: test_fork_no_busy_wait).
 *  - stress: PINPOOL_FORK_ROUNDS forks (1,000; fewer under sanitizers)
 *    while threads allocate and free on two pools, threads are created and
 *    exit continuously, and another writes snapshots and empties a cache.
 *  - streams: simulated streams and background=1: the child's pending
 *    blocks complete and its stream-ordered frees work (both threads are
 *    restarted in the child).
 *  - cuda: a pool on the fake driver (backend and events) refuses every
 *    call in the child with PINPOOL_EFORKED, and is destroyed without a
 *    driver call.
 *  - copy_pieces: deterministic. A thread is between two pieces of a copy
 *    in pieces (each test hook of those windows: the segments, the
 *    arena's extents, the history ring, the stack table, the lends, a
 *    lend reclaim's walk) at the moment of the fork. The child has no
 *    such thread: it finds no record of that copy left in the pool,
 *    starts threads (which reuse the dead threads' stacks, where such a
 *    record lived), frees, empties the cache, snapshots and validates
 *    (issue 38, fourth review: a snapshot's cursor, kept, crashed the
 *    child's first segment release; mutant FORK_SNAP_CURSORS).
 */
#include "testutil.h"

#include "internal.h" /* pp_test_exit_locked_hook */

#include <errno.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static unsigned env_uint(const char *name, unsigned dflt) {
  const char *v = getenv(name);
  return v != NULL && *v != '\0' ? (unsigned)strtoul(v, NULL, 10) : dflt;
}

/* Fork; the child runs fn(arg) and leaves with its result as exit status.
 * Returns the child's exit status, or -1 if it was still running after
 * timeout_ms (then killed), -2 if it died of a signal. */
static int run_child(int (*fn)(void *), void *arg, unsigned timeout_ms) {
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0)
    _exit(fn(arg));
  int status = 0;
  for (unsigned waited = 0;; waited++) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    PP_ASSERT(r >= 0, "waitpid: %s", strerror(errno));
    if (r == pid)
      break;
    if (waited >= timeout_ms) {
      if (getenv("PINPOOL_FORK_GDB") != NULL) { /* debugging a hang */
        char cmd[128];
        (void)snprintf(cmd, sizeof cmd,
                       "gdb -p %d -batch -ex 'thread apply all bt' >&2",
                       (int)pid);
        (void)system(cmd);
      }
      (void)kill(pid, SIGKILL);
      (void)waitpid(pid, &status, 0);
      return -1;
    }
    pp_sleep_ms(1);
  }
  if (WIFSIGNALED(status))
    return -2;
  return WEXITSTATUS(status);
}

/* The child's checks: allocate from `inherited` (and write to the blocks),
 * free, validate; the same on a new pool; destroy both. Exit codes name
 * the failing step. */
static int child_main(void *arg) {
  pinpool_t *inherited = arg;
  void *p[16];
  for (int i = 0; i < 16; i++) {
    if (pinpool_alloc(inherited, 512u << (i % 12), &p[i]) != 0)
      return 10;
    memset(p[i], 0xa5, 512);
  }
  for (int i = 0; i < 16; i++)
    if (pinpool_free(inherited, p[i]) != 0)
      return 11;
  if (pinpool_validate(inherited) != 0)
    return 12;
  pinpool_t *fresh = NULL;
  if (pinpool_create("backend=host,mlock=0,populate=0", &fresh) != 0)
    return 13;
  for (int i = 0; i < 16; i++)
    if (pinpool_alloc(fresh, 4096u << (i % 8), &p[i]) != 0)
      return 14;
  for (int i = 0; i < 16; i++)
    if (pinpool_free(fresh, p[i]) != 0)
      return 15;
  if (pinpool_validate(fresh) != 0)
    return 16;
  pinpool_destroy(fresh);
  if (pinpool_validate(inherited) != 0)
    return 17;
  pinpool_destroy(inherited);
  return 0;
}

static void check_child(int rc, const char *what) {
  PP_ASSERT(rc != -1, "%s: the child hung (killed after its deadline)", what);
  PP_ASSERT(rc != -2, "%s: the child died of a signal", what);
  PP_ASSERT(rc == 0, "%s: the child failed at step %d (%s)", what, rc,
            rc == 12 || rc == 17 ? "validate of the inherited pool" : "");
}

/* ---- exit_lock_held -------------------------------------------------- */

static sem_t hook_in;
static _Atomic(int) hook_armed;

static void hold_global_lock(void) {
  if (!atomic_exchange(&hook_armed, 0))
    return;
  (void)sem_post(&hook_in);
  pp_sleep_ms(200); /* the fork happens meanwhile */
}

static void *alloc_and_exit(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 4096, &p) == 0)
    (void)pinpool_free(pool, p);
  return NULL; /* thread_exit runs the hook, holding pp_global_lock */
}

static void test_exit_lock_held(void **state) {
  (void)state;
  pinpool_t *a = NULL, *b = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0", &a));
  /* the child's first */
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0", &b));
  PP_ASSERT(sem_init(&hook_in, 0, 0) == 0, "sem_init");
  pp_test_exit_locked_hook = hold_global_lock;
  atomic_store(&hook_armed, 1);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, alloc_and_exit, a) == 0, "thread");
  while (sem_wait(&hook_in) != 0) {
  }
  /* The thread holds pp_global_lock now, for 200 ms. */
  int rc = run_child(child_main, b, 5000);
  PP_ASSERT(pthread_join(t, NULL) == 0, "join");
  pp_test_exit_locked_hook = NULL;
  check_child(rc, "fork while an exiting thread holds the global lock");
  PP_OK(pinpool_validate(a));
  PP_OK(pinpool_validate(b));
  pinpool_destroy(a);
  pinpool_destroy(b);
  (void)sem_destroy(&hook_in);
}

/* ---- busy_section ---------------------------------------------------- */

static sem_t backend_in;
static _Atomic(int) backend_armed;

static int slow_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  void *p = NULL;
  if (posix_memalign(&p, 4096, size) != 0)
    return PINPOOL_ENOMEM;
  *out = p;
  return 0;
}
static void slow_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)size;
  if (atomic_exchange(&backend_armed, 0)) {
    (void)sem_post(&backend_in);
    pp_sleep_ms(100); /* the fork happens meanwhile */
  }
  free(ptr);
}

/* A chunk made, then released by empty_cache: the backend's free of it is
 * slow, the fork comes then. (Not the allocation's backend call: the
 * reserved bytes count a chunk only once the backend handed it over, so
 * the pool is consistent during that call; issue 37, D1.) */
static void *alloc_one(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 1 * MiB, &p) == 0) /* a miss: the backend */
    (void)pinpool_free(pool, p);
  atomic_store(&backend_armed, 1);
  (void)pinpool_empty_cache(pool);
  return NULL;
}

static int child_validate(void *arg) {
  pinpool_t *pool = arg;
  if (pinpool_validate(pool) != 0)
    return 12;
  return child_main(pool);
}

static void test_busy_section(void **state) {
  (void)state;
  pinpool_backend_t be = {"slow", slow_alloc, slow_free, NULL, 0};
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend("", &be, &pool));
  PP_ASSERT(sem_init(&backend_in, 0, 0) == 0, "sem_init");
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, alloc_one, pool) == 0, "thread");
  while (sem_wait(&backend_in) != 0) {
  }
  /* The thread is inside pinpool_empty_cache, between taking a whole
   * free chunk out of the arena and the backend's free of it (the
   * reserved bytes still count it), for 100 ms. */
  int rc = run_child(child_validate, pool, 5000);
  PP_ASSERT(pthread_join(t, NULL) == 0, "join");
  check_child(rc, "fork while a thread is inside empty_cache");
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
  (void)sem_destroy(&backend_in);
}

/* ---- stress ----------------------------------------------------------- */

typedef struct stress {
  pinpool_t *a, *b;
  _Atomic(int) stop;
  _Atomic(uint64_t) ops, threads, snapshots;
} stress_t;

/* Allocate and free on both pools, alternating (the thread cache ways). */
static void churn(stress_t *s, uint64_t *seed, unsigned n) {
  void *held[32] = {0};
  pinpool_t *owner[32] = {0};
  for (unsigned i = 0; i < n; i++) {
    unsigned k = (unsigned)(pp_rand(seed) % 32);
    if (held[k] != NULL) {
      (void)pinpool_free(owner[k], held[k]);
      held[k] = NULL;
    } else {
      pinpool_t *pool = (pp_rand(seed) & 1) ? s->a : s->b;
      size_t size = pp_rand_size(seed, 512, 512 * KiB);
      if (pinpool_alloc(pool, size, &held[k]) == 0)
        owner[k] = pool;
      else
        held[k] = NULL;
    }
  }
  for (unsigned k = 0; k < 32; k++)
    if (held[k] != NULL)
      (void)pinpool_free(owner[k], held[k]);
  atomic_fetch_add(&s->ops, n);
}

static void *worker(void *arg) {
  stress_t *s = arg;
  uint64_t seed = pp_seed((uint64_t)(uintptr_t)&seed);
  while (!atomic_load(&s->stop))
    churn(s, &seed, 256);
  return NULL;
}

static void *short_lived(void *arg) {
  stress_t *s = arg;
  uint64_t seed = pp_seed((uint64_t)(uintptr_t)&seed);
  churn(s, &seed, 64);
  return NULL; /* exits with blocks in both caches: thread_exit flushes */
}

static void *spawner(void *arg) {
  stress_t *s = arg;
  while (!atomic_load(&s->stop)) {
    pthread_t t;
    if (pthread_create(&t, NULL, short_lived, s) == 0) {
      (void)pthread_join(t, NULL);
      atomic_fetch_add(&s->threads, 1);
    }
  }
  return NULL;
}

/* Snapshots of pool a, and every tenth round pinpool_empty_cache of pool
 * b (hot slots drained, idle segments detached and released) and a
 * thread flush of a (trimming b's cap happens on the others' frees). */
static void *snapshotter(void *arg) {
  stress_t *s = arg;
  for (unsigned round = 0; !atomic_load(&s->stop); round++) {
    if (round % 10 == 9) {
      (void)pinpool_empty_cache(s->b);
      (void)pinpool_thread_flush(s->a);
    }
    char *text = NULL;
    size_t len = 0;
    if (pinpool_snapshot_write_mem(s->a, &text, &len,
                                   PINPOOL_SNAPSHOT_NO_SYMBOLS) == 0) {
      pinpool_snapshot_free(text);
      atomic_fetch_add(&s->snapshots, 1);
    }
    pp_sleep_ms(2);
  }
  return NULL;
}

/* PINPOOL_FORK_CHILD_WORK=0 (the sanitizer presets): children leave at
 * once. The sanitizers of clang 14 do not hold their own allocator's locks
 * across fork (TSAN: llvm-project#96600, LLVM 19), so a child of a busy
 * parent can deadlock in their free(), in the runtime, not in pinpool
 * (seen: TSAN's MetaMap::FreeRange, ASan's SizeClassAllocator64, about 1
 * child in 600), and TSAN stops checking in a child of a multithreaded
 * parent anyway. (pinpool's own child handler calls no free() for that
 * reason: it defers the dead threads' records to the child's first call;
 * with the frees in it, ASan's quarantine lock hung 1 child in 1,000
 * here.) What they check here is the parent: the handlers against
 * the threads around them; the deterministic cases' children, forked
 * while the other threads sleep, still run under them. */
static int child_exit(void *arg) {
  (void)arg;
  return 0;
}

static void test_stress(void **state) {
  (void)state;
  unsigned rounds = env_uint("PINPOOL_FORK_ROUNDS", 1000);
  int (*child)(void *) =
      env_uint("PINPOOL_FORK_CHILD_WORK", 1) ? child_main : child_exit;
  unsigned deadline = env_uint("PINPOOL_FORK_DEADLINE_MS", 10000);
  stress_t s = {0};
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,tcache_bytes=4MiB",
                       &s.a));
  PP_OK(
      pinpool_create("backend=host,mlock=0,populate=0,max_cached=16MiB", &s.b));
  pinpool_history_options_t h = {PINPOOL_HISTORY_ALLOC, 4096, 0, 0};
  PP_OK(pinpool_record_history(s.a, &h));
  pthread_t th[5];
  void *(*fn[5])(void *) = {worker, worker, spawner, spawner, snapshotter};
  for (int i = 0; i < 5; i++)
    PP_ASSERT(pthread_create(&th[i], NULL, fn[i], &s) == 0, "thread");
  unsigned hung = 0, failed = 0;
  int first_rc = 0;
  for (unsigned r = 0; r < rounds; r++) {
    int rc = run_child(child, r % 2 ? s.a : s.b, deadline);
    hung += rc == -1;
    if (rc != 0 && failed++ == 0)
      first_rc = rc;
  }
  atomic_store(&s.stop, 1);
  for (int i = 0; i < 5; i++)
    PP_ASSERT(pthread_join(th[i], NULL) == 0, "join");
  print_message("%u forks; meanwhile %llu operations, %llu threads, %llu "
                "snapshots\n",
                rounds, (unsigned long long)atomic_load(&s.ops),
                (unsigned long long)atomic_load(&s.threads),
                (unsigned long long)atomic_load(&s.snapshots));
  PP_ASSERT(hung == 0, "%u of %u children hung", hung, rounds);
  PP_ASSERT(failed == 0, "%u of %u children failed (first: step %d)", failed,
            rounds, first_rc);
  PP_ASSERT(atomic_load(&s.threads) > 0, "no thread exited meanwhile");
  PP_OK(pinpool_validate(s.a));
  PP_OK(pinpool_validate(s.b));
  pinpool_destroy(s.a);
  pinpool_destroy(s.b);
}

/* ---- streams ---------------------------------------------------------- */

static int child_streams(void *arg) {
  pinpool_t *pool = arg;
  /* The parent's pending blocks: their worker is restarted. */
  if (pinpool_synchronize(pool) != 0)
    return 20;
  if (pinpool_validate(pool) != 0)
    return 21;
  for (int i = 0; i < 8; i++) {
    void *p = NULL;
    if (pinpool_alloc(pool, 64 * KiB, &p) != 0)
      return 22;
    if (pinpool_record_stream(pool, p, (pinpool_stream_t)(1 + i % 2)) != 0)
      return 23;
    if (pinpool_free(pool, p) != 0) /* restarts the background thread */
      return 24;
  }
  if (pinpool_synchronize(pool) != 0)
    return 25;
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0 || st.pending_blocks != 0)
    return 26;
  if (pinpool_validate(pool) != 0)
    return 27;
  pinpool_destroy(pool); /* joins the restarted threads */
  return 0;
}

static void test_streams(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=host,mlock=0,populate=0,events=simulated,"
                       "sim_delay_us=20000,background=1,poll_us=100",
                       &pool));
  /* Start both streams' workers and let them settle first: a thread still
   * starting at the fork may hold a sanitizer runtime's allocator lock
   * (clang 14's ASan allocates in thread start-up and does not take its
   * locks around fork: the child then hangs in calloc, in the runtime). */
  for (int i = 0; i < 2; i++) {
    void *p = NULL;
    PP_OK(pinpool_alloc(pool, 64 * KiB, &p));
    PP_OK(pinpool_record_stream(pool, p, (pinpool_stream_t)(1 + i)));
    PP_OK(pinpool_free(pool, p));
  }
  PP_OK(pinpool_synchronize(pool));
  for (int i = 0; i < 8; i++) {
    void *p = NULL;
    PP_OK(pinpool_alloc(pool, 64 * KiB, &p));
    PP_OK(pinpool_record_stream(pool, p, (pinpool_stream_t)(1 + i % 2)));
    PP_OK(pinpool_free(pool, p)); /* pending for 20 ms */
  }
  int rc = run_child(child_streams, pool, 10000);
  check_child(rc, "fork with pending blocks and a background thread");
  PP_OK(pinpool_synchronize(pool));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- cuda ------------------------------------------------------------- */

static void *cuda_block;

static int child_cuda(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 4096, &p) != PINPOOL_EFORKED)
    return 30;
  if (pinpool_free(pool, cuda_block) != PINPOOL_EFORKED)
    return 31;
  if (pinpool_thread_flush(pool) != PINPOOL_EFORKED)
    return 32;
  if (pinpool_record_stream(pool, cuda_block, 1) != PINPOOL_EFORKED)
    return 35;
  if (pinpool_synchronize(pool) != 0) /* no driver call, no wait */
    return 36;
  pinpool_destroy(pool); /* no driver call; must not hang or crash */
  return 0;
}

/* Then a host pool works as usual. */
static int child_cuda_then_host(void *arg) {
  int rc = child_cuda(arg);
  if (rc != 0)
    return rc;
  pinpool_t *host = NULL;
  if (pinpool_create("backend=host,mlock=0,populate=0", &host) != 0)
    return 34;
  return child_main(host);
}

static void test_cuda(void **state) {
  (void)state;
  if (getenv("PINPOOL_LIBCUDA") == NULL)
    skip(); /* the fake driver (tests/fake_cuda) */
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("backend=cuda,device=0,events=cuda", &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 4096, &p));
  PP_OK(pinpool_alloc(pool, 8192, &cuda_block));
  PP_OK(pinpool_free(pool, p));
  int rc = run_child(child_cuda_then_host, pool, 5000);
  check_child(rc, "a CUDA pool in the child");
  PP_OK(pinpool_free(pool, cuda_block));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- copy_pieces ------------------------------------------------------ */

enum { PC_SEGS, PC_EXTENTS, PC_HISTORY, PC_STACKS, PC_LENDS, PC_RECLAIM };
#define PC_MAX 1400
static struct {
  pinpool_t *pool;
  int kind, point;
  unsigned nth;
  _Atomic(unsigned) calls;
  sem_t at, go;
  void *blk[PC_MAX];
  size_t nblk;
  bool shared;
} pc;

static void piece_hook(int point) {
  if (point != pc.point || atomic_fetch_add(&pc.calls, 1) + 1 != pc.nth)
    return;
  (void)sem_post(&pc.at);
  while (sem_wait(&pc.go) != 0) {
  }
}

static void *piece_op(void *arg) {
  (void)arg;
  intptr_t rc;
  if (pc.kind == PC_RECLAIM) {
    size_t n = 0;
    rc = pinpool_lend_reclaim_exited(pc.pool, 0, &n);
  } else {
    char *text = NULL;
    size_t len = 0;
    rc = pinpool_snapshot_write_mem(pc.pool, &text, &len,
                                    PINPOOL_SNAPSHOT_NO_SYMBOLS);
    if (rc == 0)
      pinpool_snapshot_free(text);
  }
  return (void *)rc;
}

/* Distinct stacks for the stack table (history with stacks): one per
 * value of `bits`' low d bits. */
static void __attribute__((noinline)) pc_go(unsigned bits, int d);
static void __attribute__((noinline)) pc_leaf(void) {
  void *b;
  PP_OK(pinpool_alloc(pc.pool, 4 * KiB, &b));
  PP_OK(pinpool_free(pc.pool, b));
  __asm__ volatile("");
}
static void __attribute__((noinline)) pc_a(unsigned bits, int d) {
  pc_go(bits, d);
  __asm__ volatile("");
}
static void __attribute__((noinline)) pc_b(unsigned bits, int d) {
  pc_go(bits, d);
  __asm__ volatile("");
}
static void __attribute__((noinline)) pc_go(unsigned bits, int d) {
  if (d == 0)
    pc_leaf();
  else if (bits & 1)
    pc_a(bits >> 1, d - 1);
  else
    pc_b(bits >> 1, d - 1);
  __asm__ volatile("");
}

/* In the child: a new thread's stack is most likely one of the dead
 * threads' (glibc keeps them for reuse), so a record left there is
 * overwritten; it also allocates and frees. */
static void *scribble(void *arg) {
  volatile unsigned char buf[256 * 1024];
  memset((unsigned char *)buf, 0x5a, sizeof buf);
  intptr_t bad = 0;
  if (!pc.shared) {
    void *p;
    bad = pinpool_alloc(arg, 64 * KiB, &p) != 0 || pinpool_free(arg, p) != 0;
  }
  return (void *)(bad | (buf[7] != 0x5a));
}

static int child_pieces(void *arg) {
  pinpool_t *pool = arg;
  atomic_store(&pp_test_hook, NULL);
  /* The class: nothing of a thread that is not in the child is left. */
  if (pool->snap_cursors != NULL)
    return 40;
  pthread_t t[8];
  for (int i = 0; i < 8; i++)
    if (pthread_create(&t[i], NULL, scribble, pool) != 0)
      return 41;
  intptr_t bad = 0;
  for (int i = 0; i < 8; i++) {
    void *r = NULL;
    (void)pthread_join(t[i], &r);
    bad |= (intptr_t)r;
  }
  if (bad)
    return 42;
  /* A shared pool is cut off in the child; its lends stay the parent's. */
  for (size_t i = 0; i < pc.nblk && !pc.shared; i++)
    if (pc.blk[i] != NULL && pinpool_free(pool, pc.blk[i]) != 0)
      return 43;
  int rc = pinpool_empty_cache(pool);
  if (rc != 0 && !(pc.shared && rc == PINPOOL_EFORKED))
    return 44; /* releases segments: moves the snapshots' cursors on */
  char *text = NULL;
  size_t len = 0;
  if (pinpool_snapshot_write_mem(pool, &text, &len,
                                 PINPOOL_SNAPSHOT_NO_SYMBOLS) != 0)
    return 45;
  pinpool_snapshot_free(text);
  if (pinpool_validate(pool) != 0)
    return 46;
  return 0;
}

static pid_t pc_borrower(void) {
  pid_t child = fork();
  PP_ASSERT(child >= 0, "fork: %s", strerror(errno));
  if (child == 0) {
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(120);
    pause();
    _exit(0);
  }
  return child;
}

static void piece_case(const char *name, int kind, int point, unsigned nth) {
  memset(&pc, 0, sizeof pc);
  pc.kind = kind;
  pc.point = point;
  pc.nth = nth;
  pc.shared = kind == PC_LENDS || kind == PC_RECLAIM;
  PP_OK(pinpool_create(pc.shared ? "shared=1,backend=host,mlock=0,"
                                   "populate=0,tcache_bytes=0"
                                 : "backend=host,mlock=0,populate=0",
                       &pc.pool));
  pid_t peer = -1;
  switch (kind) {
  case PC_SEGS: /* more segments than a piece */
    for (; pc.nblk < 600; pc.nblk++)
      PP_OK(pinpool_alloc(pc.pool, 1 * MiB, &pc.blk[pc.nblk]));
    break;
  case PC_EXTENTS: /* then more free extents than a piece, past the
                      segments' copy (the second piece) */
    for (; pc.nblk < PC_MAX; pc.nblk++)
      PP_OK(pinpool_alloc(pc.pool, 1 * MiB, &pc.blk[pc.nblk]));
    for (size_t i = 1; i < pc.nblk; i += 2) {
      PP_OK(pinpool_free(pc.pool, pc.blk[i]));
      pc.blk[i] = NULL;
    }
    PP_OK(pinpool_empty_cache(pc.pool));
    break;
  case PC_HISTORY:
  case PC_STACKS: {
    pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 4096,
                                   kind == PC_STACKS ? 32 : 0, 0};
    PP_OK(pinpool_record_history(pc.pool, &o));
    for (unsigned i = 0; i < (kind == PC_STACKS ? 1024u : 64u); i++)
      pc_go(i, 10);
    for (; pc.nblk < 16; pc.nblk++)
      PP_OK(pinpool_alloc(pc.pool, 1 * MiB, &pc.blk[pc.nblk]));
    break;
  }
  case PC_LENDS:
  case PC_RECLAIM:
    peer = pc_borrower();
    /* More lends than a piece (a chunk's lend slots may run out first:
     * those blocks stay unlent). */
    for (size_t lent = 0; lent < 600 && pc.nblk < PC_MAX; pc.nblk++) {
      pinpool_share_handle_t h;
      int fd;
      PP_OK(pinpool_alloc(pc.pool, 4 * KiB, &pc.blk[pc.nblk]));
      int rc = pinpool_lend(pc.pool, pc.blk[pc.nblk], peer, &h, &fd);
      PP_ASSERT(rc == 0 || rc == PINPOOL_EBUSY, "lend: %d (%s)", rc,
                pinpool_last_error());
      lent += rc == 0;
    }
    if (kind == PC_RECLAIM) { /* the borrower exits: its lends reclaimable */
      (void)kill(peer, SIGKILL);
      (void)waitpid(peer, NULL, 0);
      peer = -1;
    }
    break;
  }
  PP_ASSERT(sem_init(&pc.at, 0, 0) == 0 && sem_init(&pc.go, 0, 0) == 0,
            "sem_init");
  atomic_store(&pp_test_hook, piece_hook);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, piece_op, NULL) == 0, "thread");
  while (sem_wait(&pc.at) != 0) {
  }
  int rc = run_child(child_pieces, pc.pool, 20000);
  (void)sem_post(&pc.go);
  void *r = NULL;
  PP_ASSERT(pthread_join(t, &r) == 0, "join");
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(r == NULL, "%s: the copy failed: %d", name, (int)(intptr_t)r);
  PP_ASSERT(rc != 40,
            "%s: the child inherited a snapshot's cursor on the "
            "stack of a thread it does not have",
            name);
  check_child(rc, name);
  if (pc.shared)
    PP_OK(pinpool_lend_reclaim(pc.pool, -1, PINPOOL_RECLAIM_LIVE, NULL));
  for (size_t i = 0; i < pc.nblk; i++)
    if (pc.blk[i] != NULL)
      PP_OK(pinpool_free(pc.pool, pc.blk[i]));
  PP_OK(pinpool_validate(pc.pool));
  pinpool_destroy(pc.pool);
  if (peer > 0) {
    (void)kill(peer, SIGKILL);
    (void)waitpid(peer, NULL, 0);
  }
  (void)sem_destroy(&pc.at);
  (void)sem_destroy(&pc.go);
}

static void test_copy_pieces(void **state) {
  (void)state;
  piece_case("fork between pieces of the segments' copy", PC_SEGS,
             PP_HOOK_SNAP_PIECE, 1);
  piece_case("fork between pieces of the extents' copy", PC_EXTENTS,
             PP_HOOK_SNAP_PIECE, 2);
  piece_case("fork while the history ring is copied", PC_HISTORY,
             PP_HOOK_SNAP_HISTORY, 1);
  piece_case("fork between pieces of the stack table's copy", PC_STACKS,
             PP_HOOK_SNAP_TABLE, 1);
  piece_case("fork between pieces of the lends' copy", PC_LENDS,
             PP_HOOK_SNAP_TABLE, 1);
  piece_case("fork between pieces of a lend reclaim", PC_RECLAIM,
             PP_HOOK_RECLAIM_PIECE, 1);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(test_exit_lock_held),
      cmocka_unit_test(test_busy_section),
      cmocka_unit_test(test_streams),
      cmocka_unit_test(test_cuda),
      cmocka_unit_test(test_copy_pieces),
      cmocka_unit_test(test_stress),
  };
  return pp_run_selected("test_fork", all, sizeof all / sizeof all[0], argc,
                         argv);
}
