/*
 * The hammer: public entry points run concurrently by several threads for
 * a bounded time, with deterministic seeds. Cookies are written into every
 * block and checked before its free; blocks are handed between threads;
 * at the end (quiescent) the validator and the accounting identity run.
 *
 *   hammer [PARTS] [SECONDS] [THREADS]
 *
 * PARTS is a comma list of: alloc (alloc/free, same and other thread),
 * stats (get_stats, reset_peak_stats, get_config, block_size), empty
 * (empty_cache, thread_flush), streams (record_stream, sim_submit,
 * process_events, synchronize), trim (a small max_cached, a
 * max_cached_pct of 5 % and a max_reserved, so segments are released and
 * retried all the time; blocks above 256 KiB are carved from the
 * arena's chunks and given back to them in every configuration),
 * buffers (pinpool_buffer_*: retain, release, close, exports and their
 * release, attribute queries on a few buffers shared by every thread,
 * replaced all the time so that first attribute queries race), history
 * (pinpool_record_history switched between levels, ring sizes and stack
 * depths, cleared), snapshot (pinpool_snapshot_write_mem, each snapshot
 * checked: it parses, no block twice, the identity holds; history is kept
 * at level state at least so that block info is written and read), or all
 * (the default). The race-mutant tests (tests/mutants) run the part
 * that exercises their race under ThreadSanitizer and expect a report.
 *
 * Exit status: 0 when every check passed, 1 otherwise.
 */
#define _GNU_SOURCE
#include "pinpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "snapshot/snapcheck.h"

enum {
  P_ALLOC = 1,
  P_STATS = 2,
  P_EMPTY = 4,
  P_STREAMS = 8,
  P_TRIM = 16,
  P_BUFFERS = 32,
  P_HISTORY = 64,
  P_SNAPSHOT = 128,
  P_ALL = 255
};

#define SLOTS 64                     /* live blocks per thread */
#define EXCHANGE 16                  /* blocks in flight between threads */
#define COOKIE 0x48414d4d45524b59ull /* "HAMMERKY" */

typedef struct block {
  unsigned char *p;
  size_t n;
  uint64_t tag;
} block_t;

static pinpool_t *g_pool;
static unsigned g_parts;
static double g_seconds;
static _Atomic(int) g_failures;

/* Blocks handed from one thread to another, freed by the receiver. */
static pthread_mutex_t g_xlock = PTHREAD_MUTEX_INITIALIZER;
static block_t g_exchange[EXCHANGE];
static int g_xcount;

static uint64_t rnd(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void fail(const char *what, int rc) {
  if (atomic_fetch_add(&g_failures, 1) < 10)
    fprintf(stderr, "hammer: %s: %s (%s)\n", what, pinpool_strerror(rc),
            pinpool_last_error());
}

static void write_cookie(block_t *b) {
  uint64_t c = COOKIE ^ b->tag;
  memcpy(b->p, &c, sizeof c);
  memcpy(b->p + b->n - sizeof c, &c, sizeof c);
}

static void check_and_free(block_t *b) {
  uint64_t c = COOKIE ^ b->tag, h, t;
  memcpy(&h, b->p, sizeof h);
  memcpy(&t, b->p + b->n - sizeof t, sizeof t);
  if (h != c || t != c)
    fail("cookie overwritten while the block was live", 0);
  int rc = pinpool_free(g_pool, b->p);
  if (rc != 0)
    fail("pinpool_free", rc);
  b->p = NULL;
}

static void copy_done(void *arg) { (void)arg; }

static void op_alloc(uint64_t *s, block_t *slots, unsigned tid) {
  block_t *b = &slots[rnd(s) % SLOTS];
  if (b->p != NULL) {
    /* Hand it to another thread: a quarter of the blocks, and every one
     * above 4 MiB (the hot slots' hand-offs). */
    if (rnd(s) % 4 == 0 || b->n > 4 * 1024 * 1024) {
      pthread_mutex_lock(&g_xlock);
      if (g_xcount < EXCHANGE) {
        g_exchange[g_xcount++] = *b;
        b->p = NULL;
      }
      pthread_mutex_unlock(&g_xlock);
      if (b->p == NULL)
        return;
    }
    if ((g_parts & P_STREAMS) && rnd(s) % 3 == 0) {
      pinpool_stream_t st = 1 + rnd(s) % 3;
      int rc = pinpool_sim_submit(g_pool, st, rnd(s) % 20000, copy_done, NULL);
      if (rc == 0)
        rc = pinpool_record_stream(g_pool, b->p, st);
      if (rc != 0)
        fail("record_stream", rc);
    }
    check_and_free(b);
    return;
  }
  /* 16 B .. 8 MiB, log-uniform-ish; odd threads stay below 4 MiB (the
   * tcache_bytes of the untrimmed parts): they never open an oversize
   * stack (src/alloc.c), so the larger blocks they receive from the
   * others go through the hot slots, to be taken by another thread. */
  size_t n = (size_t)16 << (rnd(s) % ((tid & 1) ? 18 : 19));
  n += rnd(s) % n;
  if (n > 4 * 1024 * 1024) /* a few sizes: a slot's block fits a request */
    n &= ~(size_t)(256 * 1024 - 1);
  void *p;
  int rc = pinpool_alloc(g_pool, n, &p);
  if (rc == PINPOOL_ENOMEM && (g_parts & P_TRIM))
    return; /* max_reserved is part of this workload */
  if (rc != 0) {
    fail("pinpool_alloc", rc);
    return;
  }
  *b = (block_t){p, n, rnd(s) ^ tid};
  write_cookie(b);
}

static void op_receive(void) {
  block_t b = {NULL, 0, 0};
  pthread_mutex_lock(&g_xlock);
  if (g_xcount > 0)
    b = g_exchange[--g_xcount];
  pthread_mutex_unlock(&g_xlock);
  if (b.p != NULL)
    check_and_free(&b);
}

static void op_stats(uint64_t *s, block_t *slots) {
  pinpool_stats_t st;
  int rc = pinpool_get_stats(g_pool, &st);
  if (rc != 0)
    fail("get_stats", rc);
  if (rnd(s) % 16 == 0 && (rc = pinpool_reset_peak_stats(g_pool)) != 0)
    fail("reset_peak_stats", rc);
  char buf[64];
  size_t need;
  rc = pinpool_get_config(g_pool, buf, sizeof buf, &need);
  if (rc != 0 && rc != PINPOOL_EOVERFLOW)
    fail("get_config", rc);
  block_t *b = &slots[rnd(s) % SLOTS];
  size_t bs;
  if (b->p != NULL && (rc = pinpool_block_size(g_pool, b->p, &bs)) != 0)
    fail("block_size", rc);
}

static void op_empty(uint64_t *s) {
  int rc =
      rnd(s) % 2 ? pinpool_empty_cache(g_pool) : pinpool_thread_flush(g_pool);
  if (rc != 0)
    fail("empty_cache/thread_flush", rc);
}

static void op_streams(uint64_t *s) {
  int rc =
      rnd(s) % 8 ? pinpool_process_events(g_pool) : pinpool_synchronize(g_pool);
  if (rc != 0)
    fail("process_events/synchronize", rc);
  /* Graph capture on simulated streams: no provider capture, no capture
   * ever known: each call fails the same way, whatever runs meanwhile. */
  if (rnd(s) % 32 == 0) {
    int capturing;
    uint64_t id;
    pinpool_stream_t st = (pinpool_stream_t)(rnd(s) % 4);
    if ((rc = pinpool_stream_capture(g_pool, st, &capturing, &id)) !=
        PINPOOL_EBUSY)
      fail("stream_capture", rc);
    if ((rc = pinpool_graph_release(g_pool, rnd(s))) != PINPOOL_EINVAL)
      fail("graph_release", rc);
    if ((rc = pinpool_stream_graphs_release(g_pool, st)) != PINPOOL_EINVAL)
      fail("stream_graphs_release", rc);
  }
}

static void op_history(uint64_t *s) {
  uint64_t x = rnd(s);
  /* With snapshots on, never below state: the block info must be written
   * for the snapshot part to read it. */
  int lo = (g_parts & P_SNAPSHOT) ? PINPOOL_HISTORY_STATE : 0;
  pinpool_history_options_t o = {lo + (int)(x % (unsigned)(4 - lo)),
                                 (size_t)(512 << (x % 4)), (unsigned)(x % 9),
                                 (int)(x % 11 == 0)};
  int rc = pinpool_record_history(g_pool, x % 7 == 0 && lo == 0 ? NULL : &o);
  if (rc != 0)
    fail("record_history", rc);
}

static _Atomic(long) g_snapshots;

static void op_snapshot(uint64_t *s) {
  char *text = NULL;
  size_t len = 0;
  unsigned flags = rnd(s) % 4 ? PINPOOL_SNAPSHOT_NO_SYMBOLS : 0;
  int rc = pinpool_snapshot_write_mem(g_pool, &text, &len, flags);
  if (rc != 0) {
    fail("snapshot_write_mem", rc);
    return;
  }
  snapcheck_t c;
  char why[256];
  if (snapcheck(text, len, &c, why, sizeof why) != 0) {
    fprintf(stderr, "hammer: snapshot: %s\n", why);
    fail("snapshot check", 0);
  }
  pinpool_snapshot_free(text);
  atomic_fetch_add(&g_snapshots, 1);
}

/* Buffers shared by every thread; a slot owns one reference. */
#define BUFSLOTS 4
#define HELD 4 /* exports a thread keeps */
static pthread_mutex_t g_block = PTHREAD_MUTEX_INITIALIZER;
static pinpool_buffer_t *g_bufs[BUFSLOTS];

static void replace_slot(uint64_t *s, unsigned k) {
  pinpool_buffer_t *nb = NULL;
  int rc = pinpool_buffer_alloc(g_pool, 64 + rnd(s) % 100000, &nb);
  if (rc == PINPOOL_ENOMEM && (g_parts & P_TRIM))
    return;
  if (rc != 0) {
    fail("buffer_alloc", rc);
    return;
  }
  pthread_mutex_lock(&g_block);
  pinpool_buffer_t *old = g_bufs[k];
  g_bufs[k] = nb;
  pthread_mutex_unlock(&g_block);
  if (old != NULL && (rc = pinpool_buffer_release(old)) != 0)
    fail("buffer_release (slot)", rc);
}

static void op_buffers(uint64_t *s, const pinpool_export_t **held,
                       unsigned tid) {
  unsigned k = (unsigned)(rnd(s) % BUFSLOTS);
  pthread_mutex_lock(&g_block);
  pinpool_buffer_t *b = g_bufs[k];
  int rc = b != NULL ? pinpool_buffer_retain(b) : 0;
  pthread_mutex_unlock(&g_block);
  if (rc != 0) {
    fail("buffer_retain", rc);
    return;
  }
  if (b == NULL) {
    replace_slot(s, k);
    return;
  }
  unsigned op = (unsigned)(rnd(s) % 16);
  unsigned h = (unsigned)(rnd(s) % HELD);
  if (op < 5) { /* export (dropping an older one) and write through it */
    if (held[h] != NULL && (rc = pinpool_export_release(held[h])) != 0)
      fail("export_release", rc);
    held[h] = NULL;
    rc = pinpool_buffer_export(b, 0, &held[h]);
    if (rc == 0) /* each thread writes its own byte: exports share memory */
      ((volatile unsigned char *)held[h]->ptr)[tid % held[h]->size] =
          (unsigned char)h;
    else if (rc != PINPOOL_EBUSY) /* EBUSY: closed */
      fail("buffer_export", rc);
  } else if (op < 11) { /* attributes: the first query races */
    pinpool_mem_attrs_t a;
    rc = pinpool_buffer_attrs(b, &a);
    if (rc == 0 && (a.host_accessible != 1 || a.backend == NULL))
      fail("buffer_attrs: partial result", 0);
    else if (rc != 0 && rc != PINPOOL_EBUSY)
      fail("buffer_attrs", rc);
  } else if (op < 13) {
    replace_slot(s, k);
  } else if (op == 13) {
    if ((rc = pinpool_buffer_close(b)) != 0)
      fail("buffer_close", rc);
  } else if (op == 14 && (g_parts & P_STREAMS)) {
    rc = pinpool_buffer_record_stream(b, 1 + rnd(s) % 3);
    if (rc != 0 && rc != PINPOOL_EBUSY)
      fail("buffer_record_stream", rc);
  } else {
    size_t n;
    int closed;
    if ((rc = pinpool_buffer_exports(b, &n)) != 0 ||
        (rc = pinpool_buffer_closed(b, &closed)) != 0)
      fail("buffer_exports/closed", rc);
  }
  if ((rc = pinpool_buffer_release(b)) != 0)
    fail("buffer_release", rc);
}

static void *worker(void *arg) {
  unsigned tid = (unsigned)(uintptr_t)arg;
  uint64_t s = 0x9e3779b97f4a7c15ull * (tid + 1);
  block_t slots[SLOTS];
  memset(slots, 0, sizeof slots);
  const pinpool_export_t *held[HELD] = {NULL};
  double end = now_s() + g_seconds;
  for (unsigned i = 0;; i++) {
    if ((i & 255) == 0 && now_s() > end)
      break;
    unsigned r = (unsigned)(rnd(&s) % 100);
    /* Buffers: half the calls when alone (the mutant tests), else 4%. */
    if ((g_parts & P_BUFFERS) && r >= (g_parts == P_BUFFERS ? 50u : 96u)) {
      op_buffers(&s, held, tid);
      continue;
    }
    /* Every part needs blocks in flight; the other calls by part. */
    if (r < 70)
      op_alloc(&s, slots, tid);
    else if (r < 80)
      op_receive();
    else if (r < 82 && (g_parts & P_HISTORY))
      op_history(&s);
    else if (r == 82 && tid == 0 && (g_parts & P_SNAPSHOT))
      op_snapshot(&s);
    else if (r < 88 && (g_parts & P_STATS))
      op_stats(&s, slots);
    else if (r < 90 && (g_parts & (P_EMPTY | P_TRIM)))
      op_empty(&s);
    else if (r >= 90 && r < 96 && (g_parts & P_STREAMS))
      op_streams(&s);
  }
  for (int i = 0; i < SLOTS; i++)
    if (slots[i].p != NULL)
      check_and_free(&slots[i]);
  for (int i = 0; i < HELD; i++) {
    int rc;
    if (held[i] != NULL && (rc = pinpool_export_release(held[i])) != 0)
      fail("export_release", rc);
  }
  return NULL;
}

static unsigned parse_parts(const char *arg) {
  static const struct {
    const char *name;
    unsigned bit;
  } names[] = {
      {"alloc", P_ALLOC},     {"stats", P_STATS},       {"empty", P_EMPTY},
      {"streams", P_STREAMS}, {"trim", P_TRIM},         {"buffers", P_BUFFERS},
      {"history", P_HISTORY}, {"snapshot", P_SNAPSHOT}, {"all", P_ALL}};
  unsigned parts = 0;
  char *copy = strdup(arg), *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t;
       t = strtok_r(NULL, ",", &save)) {
    size_t i = 0;
    while (i < sizeof names / sizeof names[0] && strcmp(names[i].name, t) != 0)
      i++;
    if (i == sizeof names / sizeof names[0]) {
      fprintf(stderr, "hammer: unknown part '%s'\n", t);
      free(copy);
      exit(2);
    }
    parts |= names[i].bit;
  }
  free(copy);
  return parts;
}

int main(int argc, char **argv) {
  g_parts = parse_parts(argc > 1 ? argv[1] : "all");
  g_seconds = argc > 2 ? atof(argv[2]) : 2.0;
  unsigned nthreads = argc > 3 ? (unsigned)atoi(argv[3]) : 4;
  if (nthreads < 1 || nthreads > 64)
    nthreads = 4;
  char config[200];
  snprintf(config, sizeof config, "%s%s",
           (g_parts & P_STREAMS) ? "events=simulated,sim_delay_us=20,"
                                   "background=1,poll_us=200,"
                                 : "",
           /* Carving and coalescing in the arena racing with trims. */
           (g_parts & P_TRIM) ? "max_cached=4MiB,max_cached_pct=5,"
                                "max_reserved=96MiB,tcache_bytes=1MiB,shards=2"
                              : "tcache_bytes=4MiB"); /* above: hot slots */
  int rc = pinpool_create(config, &g_pool);
  if (rc != 0) {
    fail("pinpool_create", rc);
    return 1;
  }
  if (g_parts & P_SNAPSHOT) {
    pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 4096, 4, 0};
    if ((rc = pinpool_record_history(g_pool, &o)) != 0)
      fail("record_history", rc);
  }
  pthread_t t[64];
  for (unsigned i = 0; i < nthreads; i++)
    pthread_create(&t[i], NULL, worker, (void *)(uintptr_t)i);
  for (unsigned i = 0; i < nthreads; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < g_xcount; i++)
    check_and_free(&g_exchange[i]);
  g_xcount = 0;
  for (int k = 0; k < BUFSLOTS; k++) {
    if (g_bufs[k] != NULL && (rc = pinpool_buffer_release(g_bufs[k])) != 0)
      fail("buffer_release (end)", rc);
    g_bufs[k] = NULL;
  }
  if ((rc = pinpool_synchronize(g_pool)) != 0)
    fail("synchronize", rc);
  if ((rc = pinpool_validate(g_pool)) != 0)
    fail("validate", rc);
  pinpool_stats_t st;
  if ((rc = pinpool_get_stats(g_pool, &st)) != 0)
    fail("get_stats", rc);
  else if (st.reserved_bytes.current != st.block_bytes.current +
                                            st.cached_bytes.current +
                                            st.pending_bytes ||
           st.blocks.current != 0)
    fail("accounting identity after the run", 0);
  if ((rc = pinpool_empty_cache(g_pool)) != 0 ||
      (rc = pinpool_validate(g_pool)) != 0)
    fail("empty_cache + validate", rc);
  printf("hammer: parts %#x, %u threads, %.1f s: %llu allocations, %ld "
         "snapshots, %llu chunks released, %llu grew the arena, %s\n",
         g_parts, nthreads, g_seconds,
         (unsigned long long)st.requests.allocated, atomic_load(&g_snapshots),
         (unsigned long long)st.trimmed_segments,
         (unsigned long long)st.cache_misses,
         atomic_load(&g_failures) ? "FAILED" : "ok");
  pinpool_destroy(g_pool);
  return atomic_load(&g_failures) ? 1 : 0;
}
