/* Multi-threaded stress: 4 worker threads allocate random sizes (64 B ..
 * 4 MiB), write a cookie (thread id, serial, size) at the start and the end
 * of each block, and hand about half of their blocks to another thread
 * through a mutex-protected queue to be freed there. Every free checks the
 * cookie first (a block handed out twice, or overlapping blocks, break it).
 * A fifth thread reads stats, resets peaks, asks for the config and empties
 * the cache meanwhile. Bounded by time (PINPOOL_STRESS_SECONDS per
 * configuration, default 0.7) and by iterations. At the end: join, free
 * everything, exact totals, the accounting identity, validate, and
 * empty_cache leaves nothing reserved.
 *
 * The test's own code is race-free: queues under mutexes, flags atomic. */
#define _GNU_SOURCE
#include "testutil.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

enum {
  NTHREADS = 4,
  QCAP = 32,
  LOCAL_MAX = 48,
  MAX_ITERS = 200000,
};

#define COOKIE_MAGIC 0xC0FFEE42u

struct cookie {
  uint32_t magic;
  uint32_t tid;
  uint64_t serial;
  uint64_t size;
};

struct item {
  unsigned char *p;
  size_t size;
  uint32_t tid;
  uint64_t serial;
};

struct queue {
  pthread_mutex_t mu;
  struct item items[QCAP];
  size_t head, n;
};

struct ctx {
  pinpool_t *pool;
  struct queue q[NTHREADS];
  atomic_int stop;
  atomic_int failures;
  pthread_mutex_t fail_mu;
  char first_failure[512];
  pthread_barrier_t start;
  double seconds;
};

struct worker {
  struct ctx *c;
  uint32_t tid;
  pthread_t thread;
  /* results, read by main after join */
  uint64_t allocs, frees, bytes_alloc, bytes_freed, handed;
};

static void record_failure(struct ctx *c, const char *fmt, ...) {
  pthread_mutex_lock(&c->fail_mu);
  if (atomic_fetch_add(&c->failures, 1) == 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->first_failure, sizeof c->first_failure, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&c->fail_mu);
  atomic_store(&c->stop, 1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void write_cookies(const struct item *it) {
  struct cookie ck = {COOKIE_MAGIC, it->tid, it->serial, it->size};
  memcpy(it->p, &ck, sizeof ck);
  memcpy(it->p + it->size - sizeof ck, &ck, sizeof ck);
}

/* Check the cookies and free; `who` is the freeing thread. */
static int check_and_free(struct ctx *c, const struct item *it, uint32_t who) {
  struct cookie h, t;
  memcpy(&h, it->p, sizeof h);
  memcpy(&t, it->p + it->size - sizeof t, sizeof t);
  if (h.magic != COOKIE_MAGIC || h.tid != it->tid || h.serial != it->serial ||
      h.size != it->size || memcmp(&h, &t, sizeof h) != 0) {
    record_failure(c,
                   "thread %u: block %p (%zu bytes, from thread %u serial "
                   "%" PRIu64 ") has a corrupt cookie: head {%x,%u,%" PRIu64
                   ",%" PRIu64 "} tail {%x,%u,%" PRIu64 ",%" PRIu64 "}",
                   who, (void *)it->p, it->size, it->tid, it->serial, h.magic,
                   h.tid, h.serial, h.size, t.magic, t.tid, t.serial, t.size);
    return -1;
  }
  size_t bs = 0;
  int rc = pinpool_block_size(c->pool, it->p, &bs);
  if (rc != 0 || !pp_ref_block_ok(it->size, bs)) {
    record_failure(c, "thread %u: block_size(%p) = %d, %zu; want 0, %zu%s: %s",
                   who, (void *)it->p, rc, bs, pp_ref_class(it->size),
                   pp_ref_class(it->size) > 256 * KiB
                       ? " (or up to 16 classes larger)"
                       : "",
                   rc != 0 ? pinpool_last_error() : "wrong size");
    return -1;
  }
  /* Spoil the cookie so a second hand-out of this block is noticed. */
  memset(it->p, 0, sizeof(struct cookie));
  rc = pinpool_free(c->pool, it->p);
  if (rc != 0) {
    record_failure(c, "thread %u: free(%p) = %d (%s): %s", who, (void *)it->p,
                   rc, pp_code_name(rc), pinpool_last_error());
    return -1;
  }
  return 0;
}

static int q_push(struct queue *q, const struct item *it) {
  pthread_mutex_lock(&q->mu);
  int ok = q->n < QCAP;
  if (ok) {
    q->items[(q->head + q->n) % QCAP] = *it;
    q->n++;
  }
  pthread_mutex_unlock(&q->mu);
  return ok;
}

static int q_pop(struct queue *q, struct item *it) {
  pthread_mutex_lock(&q->mu);
  int ok = q->n > 0;
  if (ok) {
    *it = q->items[q->head];
    q->head = (q->head + 1) % QCAP;
    q->n--;
  }
  pthread_mutex_unlock(&q->mu);
  return ok;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  struct ctx *c = w->c;
  uint64_t rs = pp_seed(1000 + w->tid);
  struct item local[LOCAL_MAX];
  size_t nlocal = 0;
  uint64_t serial = 0;
  pthread_barrier_wait(&c->start);
  double deadline = now_s() + c->seconds;

  for (long iter = 0; iter < MAX_ITERS && !atomic_load(&c->stop); iter++) {
    if ((iter & 63) == 0 && now_s() > deadline)
      break;
    uint64_t r = pp_rand(&rs) % 100;
    struct item it;
    if (r < 25) {
      if (q_pop(&c->q[w->tid], &it)) {
        if (check_and_free(c, &it, w->tid) != 0)
          break;
        w->frees++;
        w->bytes_freed += it.size;
      }
    } else if (r < 62 && nlocal < LOCAL_MAX) {
      it.size = pp_rand_size(&rs, 64, 4 * MiB);
      it.tid = w->tid;
      it.serial = ++serial;
      void *p = NULL;
      int rc = pinpool_alloc(c->pool, it.size, &p);
      if (rc != 0) {
        record_failure(c, "thread %u: alloc(%zu) = %d (%s): %s", w->tid,
                       it.size, rc, pp_code_name(rc), pinpool_last_error());
        break;
      }
      it.p = p;
      w->allocs++;
      w->bytes_alloc += it.size;
      write_cookies(&it);
      int handed = 0;
      if (pp_rand(&rs) & 1) {
        uint32_t to =
            (w->tid + 1 + (uint32_t)(pp_rand(&rs) % (NTHREADS - 1))) % NTHREADS;
        handed = q_push(&c->q[to], &it);
        w->handed += (uint64_t)handed;
      }
      if (!handed)
        local[nlocal++] = it;
    } else if (nlocal > 0) {
      size_t k = (size_t)(pp_rand(&rs) % nlocal);
      it = local[k];
      local[k] = local[--nlocal];
      if (check_and_free(c, &it, w->tid) != 0)
        break;
      w->frees++;
      w->bytes_freed += it.size;
    }
    if (r == 99 && (pp_rand(&rs) % 64) == 0) {
      int rc = pinpool_thread_flush(c->pool);
      if (rc != 0) {
        record_failure(c, "thread %u: thread_flush = %d", w->tid, rc);
        break;
      }
    }
  }
  for (size_t k = 0; k < nlocal; k++) {
    if (check_and_free(c, &local[k], w->tid) != 0)
      break;
    w->frees++;
    w->bytes_freed += local[k].size;
  }
  return NULL;
}

static void *monitor_main(void *arg) {
  struct ctx *c = arg;
  char buf[1024];
  unsigned n = 0;
  pthread_barrier_wait(&c->start);
  while (!atomic_load(&c->stop)) {
    pinpool_stats_t st;
    int rc = pinpool_get_stats(c->pool, &st);
    if (rc != 0) {
      record_failure(c, "monitor: get_stats = %d", rc);
      break;
    }
    n++;
    if (n % 8 == 0 && (rc = pinpool_reset_peak_stats(c->pool)) != 0) {
      record_failure(c, "monitor: reset_peak_stats = %d", rc);
      break;
    }
    if (n % 16 == 0 &&
        (rc = pinpool_get_config(c->pool, buf, sizeof buf, NULL)) != 0) {
      record_failure(c, "monitor: get_config = %d", rc);
      break;
    }
    if (n % 32 == 0 && (rc = pinpool_empty_cache(c->pool)) != 0) {
      record_failure(c, "monitor: empty_cache = %d", rc);
      break;
    }
    usleep(1000);
  }
  return NULL;
}

static double stress_seconds(void) {
  const char *e = getenv("PINPOOL_STRESS_SECONDS");
  if (e != NULL && *e != '\0') {
    double v = strtod(e, NULL);
    if (v > 0 && v < 3600)
      return v;
  }
  return 0.7;
}

static void stress_with(const char *conf) {
  struct ctx *c = calloc(1, sizeof *c);
  PP_ASSERT(c != NULL, "calloc");
  c->seconds = stress_seconds();
  pthread_mutex_init(&c->fail_mu, NULL);
  for (int i = 0; i < NTHREADS; i++)
    pthread_mutex_init(&c->q[i].mu, NULL);
  PP_OK(pinpool_create(conf, &c->pool));
  pthread_barrier_init(&c->start, NULL, NTHREADS + 1);

  struct worker w[NTHREADS];
  memset(w, 0, sizeof w);
  for (int i = 0; i < NTHREADS; i++) {
    w[i].c = c;
    w[i].tid = (uint32_t)i;
    PP_ASSERT(pthread_create(&w[i].thread, NULL, worker_main, &w[i]) == 0,
              "pthread_create");
  }
  pthread_t mon;
  PP_ASSERT(pthread_create(&mon, NULL, monitor_main, c) == 0, "pthread_create");
  for (int i = 0; i < NTHREADS; i++)
    pthread_join(w[i].thread, NULL);
  atomic_store(&c->stop, 1);
  pthread_join(mon, NULL);

  if (atomic_load(&c->failures) != 0)
    PP_FAIL("[%s] %d failure(s); first: %s", conf, atomic_load(&c->failures),
            c->first_failure);

  /* Blocks still queued: freed here, after their cookies are checked. */
  uint64_t allocs = 0, frees = 0, bytes_alloc = 0, bytes_freed = 0, handed = 0;
  for (int i = 0; i < NTHREADS; i++) {
    struct item it;
    while (q_pop(&c->q[i], &it)) {
      PP_ASSERT(check_and_free(c, &it, 99) == 0, "[%s] %s", conf,
                c->first_failure);
      frees++;
      bytes_freed += it.size;
    }
  }
  for (int i = 0; i < NTHREADS; i++) {
    allocs += w[i].allocs;
    frees += w[i].frees;
    bytes_alloc += w[i].bytes_alloc;
    bytes_freed += w[i].bytes_freed;
    handed += w[i].handed;
  }
  PP_ASSERT(allocs == frees && bytes_alloc == bytes_freed,
            "test bookkeeping: %" PRIu64 " allocs, %" PRIu64 " frees", allocs,
            frees);
  PP_ASSERT(allocs > 100 && handed > 10,
            "[%s] too little work: %" PRIu64 " allocations, %" PRIu64
            " handed over",
            conf, allocs, handed);

  pinpool_stats_t st;
  PP_STATS(c->pool, &st);
  PP_ASSERT(st.requests.current == 0 && st.requested_bytes.current == 0 &&
                st.block_bytes.current == 0 && st.blocks.current == 0,
            "[%s] live after freeing all: %" PRIu64 " requests, %" PRIu64
            " bytes",
            conf, st.requests.current, st.requested_bytes.current);
  PP_ASSERT(st.requests.allocated == allocs && st.requests.freed == frees,
            "[%s] requests allocated/freed %" PRIu64 "/%" PRIu64
            ", want %" PRIu64,
            conf, st.requests.allocated, st.requests.freed, allocs);
  PP_ASSERT(st.requested_bytes.allocated == bytes_alloc &&
                st.requested_bytes.freed == bytes_freed,
            "[%s] requested_bytes allocated/freed %" PRIu64 "/%" PRIu64
            ", want %" PRIu64,
            conf, st.requested_bytes.allocated, st.requested_bytes.freed,
            bytes_alloc);
  PP_CHECK_CONSISTENT(c->pool);
  /* Every worker exited, so their caches are flushed: nothing stays. */
  PP_OK(pinpool_empty_cache(c->pool));
  PP_STATS(c->pool, &st);
  PP_ASSERT(st.reserved_bytes.current == 0 && st.segments.current == 0 &&
                st.cached_bytes.current == 0,
            "[%s] after empty_cache: reserved %" PRIu64 ", segments %" PRIu64
            ", cached %" PRIu64,
            conf, st.reserved_bytes.current, st.segments.current,
            st.cached_bytes.current);
  PP_CHECK_CONSISTENT(c->pool);
  print_message("[%s] %" PRIu64 " allocations (%" PRIu64
                " handed to another thread), %" PRIu64 " cache hits\n",
                conf, allocs, handed, st.cache_hits);
  pinpool_destroy(c->pool);
  pthread_barrier_destroy(&c->start);
  for (int i = 0; i < NTHREADS; i++)
    pthread_mutex_destroy(&c->q[i].mu);
  pthread_mutex_destroy(&c->fail_mu);
  free(c);
}

static void test_stress_default(void **state) {
  (void)state;
  stress_with("");
}

static void test_stress_no_tcache_one_shard_capped(void **state) {
  (void)state;
  stress_with("tcache_bytes=0,shards=1,max_cached=16MiB");
}

static void test_stress_small_tcache(void **state) {
  (void)state;
  stress_with("tcache_bytes=64KiB,shards=2,backend=malloc");
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_stress_default),
      cmocka_unit_test(test_stress_no_tcache_one_shard_capped),
      cmocka_unit_test(test_stress_small_tcache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
