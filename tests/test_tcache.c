/*
 * The thread cache's adaptive budget (src/tcache.c, pp_tcache_shrink): a
 * thread that only frees (the consumer of a producer/consumer pair) hands
 * blocks back to the central bins instead of holding up to tcache_bytes of
 * them, where the producer would miss them and grow the pool; a thread
 * that allocates as well keeps its whole budget; a consumer that starts
 * allocating gets it back.
 *
 * White box (the budget is not public): test_consumer also checks what a
 * user sees, that the producer's next round does not grow the pool (no
 * backend call, no new arena chunk).
 * test_one_block_consumer: a thread that only frees a class whose stack
 * holds one block does not cache it at all.
 */
#include "testutil.h"

#include "internal.h" /* the calling thread's cache */

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <time.h>

#define NBLOCKS 1024
#define TB (64 * MiB) /* tcache_bytes, the default */

/* Sizes over 16 classes (64 KiB .. 512 KiB, all cached per thread), so that
 * the total, not one class's stack limit, is what fills a cache. */
static size_t size_of(unsigned i) { return 64 * KiB + (i % 16) * 28 * KiB; }

static pp_tcache_t *my_cache(pinpool_t *pool) {
  PP_ASSERT(pp_tls_way(pool->id)->pool_id == pool->id,
            "no cache for this pool here");
  return pp_tls_way(pool->id)->tc;
}

/* A pool (address space only) and NBLOCKS blocks of size_of(i) from it. */
static pinpool_t *pool_with_blocks(void **blocks) {
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("mlock=0,populate=0", &pool));
  for (unsigned i = 0; i < NBLOCKS; i++)
    PP_OK(pinpool_alloc(pool, size_of(i), &blocks[i]));
  return pool;
}

typedef struct consumer {
  pinpool_t *pool;
  void **blocks;
  pthread_barrier_t freed, done;
  uint64_t budget, held;
} consumer_t;

static void *consume(void *arg) {
  consumer_t *c = arg;
  for (unsigned i = 0; i < NBLOCKS; i++)
    PP_OK(pinpool_free(c->pool, c->blocks[i]));
  pp_tcache_t *tc = my_cache(c->pool);
  c->budget = tc->budget;
  c->held = pp_load_relaxed(&tc->bytes);
  pthread_barrier_wait(&c->freed);
  pthread_barrier_wait(&c->done); /* its cache lives while main allocates */
  return NULL;
}

/* Main allocates ~300 MiB in blocks of 16 classes, another thread frees
 * them all: its budget falls (to 4 MiB here: it halves only after 16 frees
 * with no allocation, and below that, 16 of these blocks overflow it more
 * than once) and stays above the floor, and main's second round is served
 * from what it gave back. Results are checked once the consumer has been
 * joined, so that a failure leaves no thread waiting. */
static void test_consumer(void **state) {
  (void)state;
  static void *blocks[NBLOCKS];
  pinpool_t *pool = pool_with_blocks(blocks);
  consumer_t c = {.pool = pool, .blocks = blocks};
  pthread_barrier_init(&c.freed, NULL, 2);
  pthread_barrier_init(&c.done, NULL, 2);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, consume, &c) == 0, "pthread_create");
  pthread_barrier_wait(&c.freed);
  /* Main's cache holds only the rest of its refills' batches, so nearly
   * every block of the second round comes from the central bins, the
   * arena (the large blocks the consumer gave back went there), or a new
   * arena chunk. */
  pinpool_stats_t st0 = pp_stats_of(pool);
  int rc = 0;
  for (unsigned i = 0; i < NBLOCKS && rc == 0; i++)
    rc = pinpool_alloc(pool, size_of(i), &blocks[i]);
  pinpool_stats_t st1 = pp_stats_of(pool);
  pthread_barrier_wait(&c.done);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&c.freed);
  pthread_barrier_destroy(&c.done);
  PP_OK(rc);
  PP_ASSERT(c.budget <= TB / 16 && c.budget >= TB / 64 && c.held <= TB / 16,
            "consumer: budget %" PRIu64 ", holds %" PRIu64, c.budget, c.held);
  /* What the consumer still holds (3 MiB here) fits in the room the first
   * round left in the arena (26 MiB after the second round here): the pool
   * does not grow. A consumer that kept its whole budget held 40 MiB and
   * cost a new chunk of 40 MiB (an eighth of the arena). */
  PP_ASSERT(st1.cache_misses == st0.cache_misses &&
                st1.backend_alloc.count == st0.backend_alloc.count &&
                st1.arena_chunks == st0.arena_chunks &&
                st1.reserved_bytes.current == st0.reserved_bytes.current,
            "second round grew the pool: %" PRIu64 " misses, %" PRIu64
            " backend allocations, %" PRIu64 " -> %" PRIu64 " chunks, %" PRIu64
            " -> %" PRIu64 " bytes",
            st1.cache_misses - st0.cache_misses,
            st1.backend_alloc.count - st0.backend_alloc.count, st0.arena_chunks,
            st1.arena_chunks, st0.reserved_bytes.current,
            st1.reserved_bytes.current);
  for (unsigned i = 0; i < NBLOCKS; i++)
    PP_OK(pinpool_free(pool, blocks[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* W2's sizes, scaled down by 8 with the cache (tcache_bytes=8MiB):
 * 8 KiB .. 8 MiB, doubling. */
#define MIXED_TB (8 * MiB)
static size_t wide_size(unsigned i) { return 8 * KiB << (i % 11); }

/* One thread, a live set of ~370 MiB (address space only: populate=0)
 * turned over in 4,096 runs: free 1 to 12 blocks, then allocate as many
 * of other sizes (W2's pattern, where a large request frees several blocks
 * first). Its cache overflows again and again, sometimes within a run of
 * frees; none of those shrinks is a consumer's, so the budget, read after
 * every free, never moves. (Halving at every shrink, or at every shrink
 * with no allocation since the previous one, takes it down to 128 KiB.) */
static void test_mixed_keeps_budget(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("mlock=0,populate=0,tcache_bytes=8MiB", &pool));
  static void *blocks[NBLOCKS / 4];
  for (unsigned i = 0; i < NBLOCKS / 4; i++)
    PP_OK(pinpool_alloc(pool, wide_size(i), &blocks[i]));
  pp_tcache_t *tc = my_cache(pool);
  uint64_t lowest = tc->budget, shrinks = 0;
  uint64_t rng = pp_seed(7);
  for (unsigned r = 0; r < 4 * NBLOCKS; r++) {
    unsigned run = 1 + (unsigned)(pp_rand(&rng) % 12), idx[12];
    for (unsigned k = 0; k < run; k++) {
      idx[k] = (unsigned)(pp_rand(&rng) % (NBLOCKS / 4));
      uint64_t mark = tc->shrink_frees;
      if (blocks[idx[k]] != NULL)
        PP_OK(pinpool_free(pool, blocks[idx[k]]));
      blocks[idx[k]] = NULL;
      shrinks += tc->shrink_frees != mark;
      if (tc->budget < lowest)
        lowest = tc->budget;
    }
    for (unsigned k = 0; k < run; k++)
      if (blocks[idx[k]] == NULL)
        PP_OK(pinpool_alloc(pool, wide_size(idx[k] + r), &blocks[idx[k]]));
  }
  PP_ASSERT(shrinks >= 100, "only %" PRIu64 " shrinks: nothing tested",
            shrinks);
  PP_ASSERT(lowest == MIXED_TB,
            "budget fell to %" PRIu64 " (%" PRIu64 " shrinks)", lowest,
            shrinks);
  for (unsigned i = 0; i < NBLOCKS / 4; i++)
    PP_OK(pinpool_free(pool, blocks[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A thread that was a consumer and then allocates: every refill doubles
 * its budget, back to tcache_bytes. */
static void test_recovers(void **state) {
  (void)state;
  static void *blocks[NBLOCKS];
  pinpool_t *pool = pool_with_blocks(blocks);
  for (unsigned i = 0; i < NBLOCKS; i++) /* same thread: a freer now */
    PP_OK(pinpool_free(pool, blocks[i]));
  pp_tcache_t *tc = my_cache(pool);
  PP_ASSERT(tc->budget < TB / 8, "budget %" PRIu64 " after frees only",
            tc->budget);
  for (unsigned i = 0; i < NBLOCKS; i++)
    PP_OK(pinpool_alloc(pool, size_of(i), &blocks[i]));
  PP_ASSERT(tc->budget == TB, "budget %" PRIu64 " after allocating",
            tc->budget);
  for (unsigned i = 0; i < NBLOCKS; i++)
    PP_OK(pinpool_free(pool, blocks[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* One-block stacks (alloc.c, free_push_slow and alloc_slow): with
 * tcache_bytes=8MiB, a 1 MiB class's stack holds one block. The consumer
 * thread frees what main allocates, in lock step (W3's data loader): its
 * frees must not open a stack of the class, where each would wait hidden
 * until its next free while main made a new segment; they go to the hot
 * slot, and main's refill looks there first, so it gets the block freed
 * last (still in cache), not an older one from the bin. */
#define ONE_BS (1 * MiB)
typedef struct handoff {
  pinpool_t *pool;
  void *give[2]; /* blocks main hands over, freed in this order */
  pthread_barrier_t go, done;
  bool stop;
  uint64_t held; /* the consumer's cached bytes after its frees */
} handoff_t;

static void *free_handed(void *arg) {
  handoff_t *h = arg;
  for (;;) {
    pthread_barrier_wait(&h->go);
    if (h->stop)
      break;
    for (int k = 0; k < 2; k++)
      if (h->give[k] != NULL)
        PP_OK(pinpool_free(h->pool, h->give[k]));
    h->held = pp_tls_way(h->pool->id)->pool_id == h->pool->id
                  ? pp_load_relaxed(&pp_tls_way(h->pool->id)->tc->bytes)
                  : 0;
    pthread_barrier_wait(&h->done);
  }
  return NULL;
}

static void test_one_block_consumer(void **state) {
  (void)state;
  handoff_t h = {0};
  PP_OK(pinpool_create("mlock=0,populate=0,tcache_bytes=8MiB", &h.pool));
  pthread_barrier_init(&h.go, NULL, 2);
  pthread_barrier_init(&h.done, NULL, 2);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, free_handed, &h) == 0, "pthread_create");
  /* Depth 2: main holds two blocks; each round the consumer frees the
   * older and main allocates again. */
  void *q[2];
  int rc = 0;
  uint64_t held = 0;
  PP_OK(pinpool_alloc(h.pool, ONE_BS, &q[0]));
  PP_OK(pinpool_alloc(h.pool, ONE_BS, &q[1]));
  for (unsigned r = 0; r < 200 && rc == 0; r++) {
    h.give[0] = q[r % 2];
    h.give[1] = NULL;
    pthread_barrier_wait(&h.go);
    pthread_barrier_wait(&h.done);
    held |= h.held;
    rc = pinpool_alloc(h.pool, ONE_BS, &q[r % 2]);
  }
  uint64_t segs = pp_stats_of(h.pool).segments.peak;
  /* Two at once: main's next block must be the second (the slot's). */
  void *last = q[1];
  h.give[0] = q[0];
  h.give[1] = q[1];
  pthread_barrier_wait(&h.go);
  pthread_barrier_wait(&h.done);
  void *got = NULL;
  int rc2 = pinpool_alloc(h.pool, ONE_BS, &got);
  h.stop = true;
  pthread_barrier_wait(&h.go);
  pthread_join(t, NULL);
  pthread_barrier_destroy(&h.go);
  pthread_barrier_destroy(&h.done);
  PP_OK(rc);
  PP_OK(rc2);
  PP_ASSERT(held == 0, "the consumer cached %" PRIu64 " bytes", held);
  PP_ASSERT(segs == 2, "%" PRIu64 " segments for two live blocks", segs);
  PP_ASSERT(got == last, "got %p, not the block freed last (%p)", got, last);
  PP_OK(pinpool_free(h.pool, got));
  PP_CHECK_CONSISTENT(h.pool);
  pinpool_destroy(h.pool);
}

/* A pinpool call from a TLS destructor that runs after pinpool's own (a key
 * created later: glibc runs a round of destructors in key order) makes a
 * new thread record; its pthread_setspecific makes glibc run another round
 * (up to PTHREAD_DESTRUCTOR_ITERATIONS), in which pinpool's destructor
 * retires that record too: no cache is left behind, the block freed in the
 * destructor is back in the bins, and the pool validates. */
static pthread_key_t late_key;

static void late_destructor(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 4096, &p) == 0)
    (void)pinpool_free(pool, p); /* into the recreated record's cache */
}

static void *late_thread(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 8192, &p) == 0)
    (void)pinpool_free(pool, p);
  (void)pthread_setspecific(late_key, pool);
  return NULL;
}

static void test_tls_destructor_after_ours(void **state) {
  (void)state;
  pinpool_t *warm = NULL, *pool = NULL;
  PP_OK(pinpool_create("mlock=0,populate=0", &warm));
  void *p = NULL;
  PP_OK(pinpool_alloc(warm, 4096, &p)); /* pinpool's key exists now */
  PP_OK(pinpool_free(warm, p));
  PP_ASSERT(pthread_key_create(&late_key, late_destructor) == 0, "key");
  PP_OK(pinpool_create("mlock=0,populate=0", &pool));
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, late_thread, pool) == 0, "thread");
  PP_ASSERT(pthread_join(t, NULL) == 0, "join");
  pp_mutex_lock(&pool->reg_lock);
  unsigned n = pool->rs.ncaches, most = pool->rs.max_ncaches;
  pp_mutex_unlock(&pool->reg_lock);
  PP_ASSERT(n == 0, "%u thread caches left after the thread exited", n);
  PP_ASSERT(most == 1, "the recreated record's cache was never made (%u)",
            most);
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.requests.current == 0, "a block still allocated");
  PP_ASSERT(st.requests.allocated == 2 && st.requests.freed == 2,
            "%llu allocations, %llu frees (2 each expected: the thread's "
            "and its late destructor's)",
            (unsigned long long)st.requests.allocated,
            (unsigned long long)st.requests.freed);
  PP_OK(pinpool_validate(pool));
  (void)pthread_key_delete(late_key);
  pinpool_destroy(pool);
  pinpool_destroy(warm);
}

/* An exiting thread flushes its caches without pp_global_lock (tcache.c,
 * thread_exit): while its flush waits for a bin lock of one pool, another
 * thread's first call on another pool (which takes pp_global_lock to make
 * its record and cache) goes through. Before, the flush ran under
 * pp_global_lock and that call waited for it: here, for as long as the
 * test holds the bin locks (2 s, then the test fails). */
static _Atomic(int) cached, go_exit, other_done;

static void *exit_with_cache(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 4096, &p) == 0)
    (void)pinpool_free(pool, p); /* cached: the exit flushes it */
  atomic_store(&cached, 1);
  while (!atomic_load(&go_exit))
    (void)sched_yield();
  return NULL;
}

static void *first_call(void *arg) {
  pinpool_t *pool = arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 4096, &p) == 0)
    (void)pinpool_free(pool, p);
  atomic_store(&other_done, 1);
  return NULL;
}

static void test_exit_flush_unlocked(void **state) {
  (void)state;
  pinpool_t *a = NULL, *b = NULL;
  PP_OK(pinpool_create("mlock=0,populate=0", &a));
  PP_OK(pinpool_create("mlock=0,populate=0", &b));
  pthread_t t1, t2;
  PP_ASSERT(pthread_create(&t1, NULL, exit_with_cache, a) == 0, "thread");
  while (!atomic_load(&cached))
    (void)sched_yield();
  unsigned cls = pp_class_index(4096);
  for (unsigned s = 0; s < a->cfg.shards; s++)
    pp_mutex_lock(&pp_bin(a, cls, s)->lock);
  atomic_store(&go_exit, 1);
  struct timespec ts = {0, 100 * 1000 * 1000};
  (void)nanosleep(&ts, NULL); /* t1 is in its flush, waiting for a bin */
  PP_ASSERT(pthread_create(&t2, NULL, first_call, b) == 0, "thread");
  int done = 0;
  for (int i = 0; i < 2000 && !(done = atomic_load(&other_done)); i++) {
    ts.tv_nsec = 1000 * 1000;
    (void)nanosleep(&ts, NULL);
  }
  for (unsigned s = a->cfg.shards; s-- > 0;)
    pp_mutex_unlock(&pp_bin(a, cls, s)->lock);
  PP_ASSERT(pthread_join(t1, NULL) == 0 && pthread_join(t2, NULL) == 0, "join");
  PP_ASSERT(done, "a first call on another pool waited for an exiting "
                  "thread's flush (pp_global_lock held across it)");
  PP_OK(pinpool_validate(a));
  PP_OK(pinpool_validate(b));
  pinpool_destroy(a);
  pinpool_destroy(b);
}

/* ---- Cumulative counts while threads exit --------------------------------
 * A thread's counts live in its cache until it exits, then in the pool's
 * dead-thread totals (tcache.c, tcache_detach). get_stats sums both under
 * reg_lock: if the cache left the pool's list in one hold and its counts
 * reached the totals in another, a reader between the two missed them, and
 * a cumulative count went backwards (issue 37: that move survived the whole
 * suite, release and TSAN, since both sides are atomics). */
static void detached_pause(void) {
  /* Widen the moment after a cache left its pool's list (the test hook):
   * a fold made after it, in a later hold, is then read without fail. */
  struct timespec ts = {0, 200 * 1000};
  (void)nanosleep(&ts, NULL);
}

static void *short_lived(void *arg) {
  pinpool_t *pool = arg;
  void *p[4] = {NULL, NULL, NULL, NULL};
  intptr_t bad = 0;
  for (int i = 0; i < 4; i++)
    bad |= pinpool_alloc(pool, 4096u * (unsigned)(i + 1), &p[i]) != 0;
  for (int i = 0; i < 4; i++)
    bad |= p[i] != NULL && pinpool_free(pool, p[i]) != 0;
  return (void *)bad;
}

typedef struct spawner {
  pinpool_t *pool;
  _Atomic(int) stop, exits, bad;
} spawner_t;

static void *spawn_loop(void *arg) {
  spawner_t *sp = arg;
  while (!atomic_load(&sp->stop)) {
    pthread_t t[2];
    int n = 0;
    for (; n < 2; n++)
      if (pthread_create(&t[n], NULL, short_lived, sp->pool) != 0)
        break;
    for (int i = 0; i < n; i++) {
      void *r = NULL;
      (void)pthread_join(t[i], &r);
      atomic_fetch_add(&sp->bad, r != NULL);
    }
    atomic_fetch_add(&sp->exits, n);
  }
  return NULL;
}

/* The cumulative fields of st, in an array (their names in cum_names):
 * the counts, and those derived as differences of counts read at
 * different moments (cache_hits, tcache_hits: issue 38, fourth review). */
enum { NCUM = 15 };
static const char *const cum_names[NCUM] = {"requests.allocated",
                                            "requests.freed",
                                            "requested_bytes.allocated",
                                            "requested_bytes.freed",
                                            "block_bytes.allocated",
                                            "block_bytes.freed",
                                            "cache_hits",
                                            "cache_misses",
                                            "tcache_hits",
                                            "reserved_bytes.allocated",
                                            "reserved_bytes.freed",
                                            "segments.allocated",
                                            "segments.freed",
                                            "cached_bytes.allocated",
                                            "cached_bytes.freed"};
static void cumulative(const pinpool_stats_t *st, uint64_t v[NCUM]) {
  v[0] = st->requests.allocated;
  v[1] = st->requests.freed;
  v[2] = st->requested_bytes.allocated;
  v[3] = st->requested_bytes.freed;
  v[4] = st->block_bytes.allocated;
  v[5] = st->block_bytes.freed;
  v[6] = st->cache_hits;
  v[7] = st->cache_misses;
  v[8] = st->tcache_hits;
  v[9] = st->reserved_bytes.allocated;
  v[10] = st->reserved_bytes.freed;
  v[11] = st->segments.allocated;
  v[12] = st->segments.freed;
  v[13] = st->cached_bytes.allocated;
  v[14] = st->cached_bytes.freed;
}

/* Reads pool's stats until stop() says so; the first cumulative count
 * that went backwards (-1: none) in *back, was and now. */
static int read_monotonic(pinpool_t *pool, bool (*stop)(void *), void *arg,
                          uint64_t *was, uint64_t *now, uint64_t *reads) {
  uint64_t prev[NCUM] = {0};
  int back = -1;
  while (!stop(arg) && back < 0) {
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    uint64_t v[NCUM];
    cumulative(&st, v);
    for (int i = 0; i < NCUM && back < 0; i++)
      if (v[i] < prev[i]) {
        back = i;
        *was = prev[i];
        *now = v[i];
      }
    memcpy(prev, v, sizeof prev);
    (*reads)++;
  }
  return back;
}

static bool exits_done(void *arg) {
  spawner_t *sp = arg;
  return atomic_load(&sp->exits) >= 1000;
}

static void test_stats_monotonic_exits(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("mlock=0,populate=0", &pool));
  pp_test_detached_hook = detached_pause; /* before any thread starts */
  spawner_t sp = {.pool = pool};
  pthread_t spawner;
  PP_ASSERT(pthread_create(&spawner, NULL, spawn_loop, &sp) == 0, "thread");
  uint64_t reads = 0, was = 0, now = 0;
  int back = read_monotonic(pool, exits_done, &sp, &was, &now, &reads);
  atomic_store(&sp.stop, 1);
  PP_ASSERT(pthread_join(spawner, NULL) == 0, "join");
  pp_test_detached_hook = NULL;
  PP_ASSERT(back < 0,
            "a cumulative count went backwards while threads exited: %s "
            "%" PRIu64 " then %" PRIu64 " (read %" PRIu64 ", %d exits)",
            back < 0 ? "" : cum_names[back], was, now, reads,
            atomic_load(&sp.exits));
  PP_ASSERT(atomic_load(&sp.bad) == 0, "an exiting thread's call failed");
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  int exits = atomic_load(&sp.exits);
  PP_ASSERT(st.requests.allocated == 4u * (unsigned)exits &&
                st.requests.freed == st.requests.allocated,
            "%d threads made 4 allocations each: %" PRIu64 " counted, "
            "%" PRIu64 " freed",
            exits, st.requests.allocated, st.requests.freed);
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* Another thread misses (a block larger than any cached, then
 * empty_cache) while stats are read: no cumulative count goes backwards.
 * cache_hits did: allocations - cache_misses, with the allocations summed
 * before cache_misses was loaded, and an allocation counted before its
 * miss (issue 38, fourth review: rv38's h1, dozens of times in 4 s). */
typedef struct misser {
  pinpool_t *pool;
  _Atomic(int) stop, rounds, bad;
} misser_t;

static void *miss_loop(void *arg) {
  misser_t *m = arg;
  while (!atomic_load(&m->stop)) {
    void *p = NULL, *q = NULL;
    int bad = pinpool_alloc(m->pool, 8 * MiB, &p) != 0 ||
              pinpool_alloc(m->pool, 4 * KiB, &q) != 0 ||
              pinpool_free(m->pool, q) != 0 || pinpool_free(m->pool, p) != 0 ||
              pinpool_empty_cache(m->pool) != 0;
    atomic_fetch_add(&m->bad, bad);
    atomic_fetch_add(&m->rounds, 1);
  }
  return NULL;
}

static bool misses_done(void *arg) {
  misser_t *m = arg;
#ifdef PP_SANITIZED
  return atomic_load(&m->rounds) >= 300; /* TSAN: ~0.1 s a round */
#else
  return atomic_load(&m->rounds) >= 20000;
#endif
}

static void test_stats_monotonic_misses(void **state) {
  (void)state;
  const char *confs[2] = {"mlock=0,populate=0",
                          "mlock=0,populate=0,tcache_bytes=0"};
  for (int c = 0; c < 2; c++) {
    pinpool_t *pool;
    PP_OK(pinpool_create(confs[c], &pool));
    misser_t m = {.pool = pool};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
      PP_ASSERT(pthread_create(&t[i], NULL, miss_loop, &m) == 0, "thread");
    uint64_t reads = 0, was = 0, now = 0;
    int back = read_monotonic(pool, misses_done, &m, &was, &now, &reads);
    atomic_store(&m.stop, 1);
    for (int i = 0; i < 2; i++)
      PP_ASSERT(pthread_join(t[i], NULL) == 0, "join");
    PP_ASSERT(back < 0,
              "[%s] a cumulative count went backwards while threads missed: "
              "%s %" PRIu64 " then %" PRIu64 " (read %" PRIu64 ", %d rounds)",
              confs[c], back < 0 ? "" : cum_names[back], was, now, reads,
              atomic_load(&m.rounds));
    PP_ASSERT(atomic_load(&m.bad) == 0, "a misser's call failed");
    /* Quiescent: the differences exact again. */
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(st.cache_hits + st.cache_misses == st.requests.allocated &&
                  st.tcache_hits <= st.cache_hits,
              "[%s] hits %" PRIu64 " + misses %" PRIu64 " != allocations "
              "%" PRIu64 " (tcache hits %" PRIu64 ")",
              confs[c], st.cache_hits, st.cache_misses, st.requests.allocated,
              st.tcache_hits);
    PP_OK(pinpool_validate(pool));
    pinpool_destroy(pool);
  }
}

/* The same class, deterministically: a thread stops between counting its
 * miss and counting its allocation (PP_HOOK_MISS_COUNTED), and stats are
 * read before and inside that window. A raw difference reads one hit
 * fewer inside it; the reported counts must not go back. The stress test
 * above needs a preemption in that window, which a quiet machine may not
 * give (mutant STATS_HITS_RAW fails this one every time). */
static pthread_mutex_t hw_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hw_cv = PTHREAD_COND_INITIALIZER;
static _Thread_local bool hw_armed;
static int hw_arrived, hw_released;

static void hw_hook(int point) {
  if (point != PP_HOOK_MISS_COUNTED || !hw_armed)
    return;
  hw_armed = false;
  pthread_mutex_lock(&hw_mu);
  hw_arrived = 1;
  pthread_cond_broadcast(&hw_cv);
  while (!hw_released)
    pthread_cond_wait(&hw_cv, &hw_mu);
  pthread_mutex_unlock(&hw_mu);
}

typedef struct hw_arg {
  pinpool_t *pool;
  void *p;
  int rc;
} hw_arg_t;

static void *hw_miss(void *arg) {
  hw_arg_t *a = arg;
  hw_armed = true;
  a->rc = pinpool_alloc(a->pool, 8 * MiB, &a->p); /* larger than any cached */
  return NULL;
}

static void test_stats_hits_window(void **state) {
  (void)state;
  const char *confs[2] = {"mlock=0,populate=0",
                          "mlock=0,populate=0,tcache_bytes=0"};
  for (int c = 0; c < 2; c++) {
    pinpool_t *pool;
    PP_OK(pinpool_create(confs[c], &pool));
    /* Some hits first: a raw difference would go from >= 1 to one less. */
    for (int i = 0; i < 4; i++) {
      void *p;
      PP_OK(pinpool_alloc(pool, 4 * KiB, &p));
      PP_OK(pinpool_free(pool, p));
    }
    pinpool_stats_t before, inside = {0}, after;
    PP_STATS(pool, &before);
    PP_ASSERT(before.cache_hits >= 1, "[%s] no hit to lose", confs[c]);
    hw_arrived = hw_released = 0;
    atomic_store(&pp_test_hook, hw_hook);
    hw_arg_t a = {.pool = pool};
    pthread_t t;
    PP_ASSERT(pthread_create(&t, NULL, hw_miss, &a) == 0, "thread");
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 10;
    pthread_mutex_lock(&hw_mu);
    int rc = 0;
    while (!hw_arrived && rc == 0)
      rc = pthread_cond_timedwait(&hw_cv, &hw_mu, &dl);
    bool arrived = hw_arrived != 0;
    pthread_mutex_unlock(&hw_mu);
    if (arrived)
      PP_STATS(pool, &inside);
    pthread_mutex_lock(&hw_mu);
    hw_released = 1;
    pthread_cond_broadcast(&hw_cv);
    pthread_mutex_unlock(&hw_mu);
    PP_ASSERT(pthread_join(t, NULL) == 0, "join");
    atomic_store(&pp_test_hook, NULL);
    PP_ASSERT(arrived, "[%s] the miss never reached PP_HOOK_MISS_COUNTED",
              confs[c]);
    PP_OK(a.rc);
    PP_ASSERT(inside.cache_misses == before.cache_misses + 1,
              "[%s] the window's miss was not counted yet", confs[c]);
    PP_ASSERT(inside.cache_hits >= before.cache_hits &&
                  inside.tcache_hits >= before.tcache_hits,
              "[%s] hits went backwards in a miss's window: cache_hits %" PRIu64
              " then %" PRIu64 ", tcache_hits %" PRIu64 " then %" PRIu64,
              confs[c], before.cache_hits, inside.cache_hits,
              before.tcache_hits, inside.tcache_hits);
    PP_OK(pinpool_free(pool, a.p));
    PP_STATS(pool, &after);
    PP_ASSERT(after.cache_hits + after.cache_misses == after.requests.allocated,
              "[%s] hits %" PRIu64 " + misses %" PRIu64
              " != allocations %" PRIu64,
              confs[c], after.cache_hits, after.cache_misses,
              after.requests.allocated);
    PP_OK(pinpool_validate(pool));
    pinpool_destroy(pool);
  }
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_consumer),
      cmocka_unit_test(test_mixed_keeps_budget),
      cmocka_unit_test(test_recovers),
      cmocka_unit_test(test_one_block_consumer),
      cmocka_unit_test(test_tls_destructor_after_ours),
      cmocka_unit_test(test_exit_flush_unlocked),
      cmocka_unit_test(test_stats_monotonic_exits),
      cmocka_unit_test(test_stats_monotonic_misses),
      cmocka_unit_test(test_stats_hits_window),
  };
  return pp_run_selected("test_tcache", tests, sizeof tests / sizeof tests[0],
                         argc, argv);
}
