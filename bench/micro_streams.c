/*
 * Micro-benchmark: the cost of a stream-ordered free against the number of
 * streams ever used (issue 20, "Scalability cliffs"; docs/benchmarks.md).
 *
 *   pp_micro_streams [N ...]    (default: 10 100 1000 10000 100000)
 *
 * For each N, a fresh pool with a callbacks event provider whose events are
 * complete when first asked (no device: the cost is pinpool's own). First
 * N operations, each on a stream never used before; then 2,000 timed
 * operations, again each on a new stream (servers make a stream per
 * request). One operation: alloc 4 KiB, record_stream, free, and
 * process_events, which completes the event and caches the block. Prints
 * one line per N: the median over 5 repetitions of ns per operation, and
 * its ratio to the first N's.
 *
 * Before the queues were freed when empty, every stream ever used kept a
 * queue on a list that each free searched and each poll walked: the cost
 * grew with N (62 us at 1,000, 651 us at 16,000 streams in the review).
 *
 *   pp_micro_streams miss [N ...]
 *
 * The cost of a cache miss while N streams hold an event that has not
 * completed (issue 38, 1): N blocks of 256 bytes, each recorded on its own
 * stream and freed (their events never complete while timed), then 500
 * timed pairs of a 4 KiB allocation that misses (tcache_bytes=0: every
 * allocation goes to the central bins, and polls the queues first) and its
 * free. Median of 5, ns per pair. Every miss polled all N queues before
 * the round-robin cursor (1.4 ms a miss at 100,000 streams).
 */
#define _GNU_SOURCE
#include <pinpool.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int ev_record(void *ctx, pinpool_stream_t s, void **ev) {
  (void)ctx;
  *ev = (void *)(uintptr_t)(s | 1); /* no state: done when asked */
  return 0;
}
static int ev_query(void *ctx, void *ev) {
  (void)ev;
  return ctx == NULL; /* the miss mode's events never complete */
}
static int ev_sync(void *ctx, void *ev) {
  (void)ctx, (void)ev;
  return 0;
}
static void ev_release(void *ctx, void *ev) { (void)ctx, (void)ev; }

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int op(pinpool_t *pool, pinpool_stream_t s) {
  void *p;
  int rc = pinpool_alloc(pool, 4096, &p);
  if (rc == 0)
    rc = pinpool_record_stream(pool, p, s);
  if (rc == 0)
    rc = pinpool_free(pool, p);
  if (rc == 0)
    rc = pinpool_process_events(pool);
  return rc;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* ns per operation after n streams were used, or < 0 on error. */
static double run(unsigned long n) {
  pinpool_events_t ev = {"micro", ev_record,  ev_query,
                         ev_sync, ev_release, NULL};
  pinpool_hooks_t hooks = {NULL, &ev, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex("", &hooks, &pool) != 0) {
    fprintf(stderr, "create: %s\n", pinpool_last_error());
    return -1;
  }
  pinpool_stream_t s = 1;
  for (unsigned long i = 0; i < n; i++)
    if (op(pool, s++) != 0)
      goto fail;
  enum { TIMED = 2000 };
  uint64_t t0 = now_ns();
  for (int i = 0; i < TIMED; i++)
    if (op(pool, s++) != 0)
      goto fail;
  uint64_t dt = now_ns() - t0;
  pinpool_destroy(pool);
  return (double)dt / TIMED;
fail:
  fprintf(stderr, "operation failed: %s\n", pinpool_last_error());
  pinpool_destroy(pool);
  return -1;
}

/* ns per missing allocation + free while n streams hold a busy event. */
static double run_miss(unsigned long n) {
  static int busy; /* ctx: queries answer "not yet" */
  pinpool_events_t ev = {"micro-miss", ev_record,  ev_query,
                         ev_sync,      ev_release, &busy};
  pinpool_hooks_t hooks = {NULL, &ev, NULL, NULL};
  pinpool_t *pool;
  if (pinpool_create_ex("tcache_bytes=0", &hooks, &pool) != 0) {
    fprintf(stderr, "create: %s\n", pinpool_last_error());
    return -1;
  }
  void **b = calloc(n, sizeof *b);
  int rc = b == NULL ? -1 : 0;
  /* Every allocation first: each would poll the queues made so far. */
  for (unsigned long i = 0; i < n && rc == 0; i++)
    rc = pinpool_alloc(pool, 256, &b[i]);
  for (unsigned long i = 0; i < n && rc == 0; i++) {
    rc = pinpool_record_stream(pool, b[i], (pinpool_stream_t)(i + 1));
    if (rc == 0)
      rc = pinpool_free(pool, b[i]);
  }
  free(b);
  enum { TIMED = 500 };
  uint64_t t0 = now_ns();
  for (int i = 0; i < TIMED && rc == 0; i++) {
    void *p;
    rc = pinpool_alloc(pool, 4096, &p);
    if (rc == 0)
      rc = pinpool_free(pool, p);
  }
  uint64_t dt = now_ns() - t0;
  if (rc != 0)
    fprintf(stderr, "operation failed: %s\n", pinpool_last_error());
  pinpool_destroy(pool); /* synchronize: ev_sync says done */
  return rc != 0 ? -1 : (double)dt / TIMED;
}

int main(int argc, char **argv) {
  static const unsigned long def[] = {10, 100, 1000, 10000, 100000};
  unsigned long ns[32];
  int k = 0;
  bool miss = argc > 1 && strcmp(argv[1], "miss") == 0;
  for (int i = miss ? 2 : 1; i < argc && k < 32; i++)
    ns[k++] = strtoul(argv[i], NULL, 10);
  if (k == 0)
    for (k = 0; k < 5; k++)
      ns[k] = def[k];
  /* A first run, not counted: the process's first pool pays for what
   * later ones find done (2x at the first N, whatever it was). */
  if (miss && k > 0 && run_miss(ns[0]) < 0)
    return 1;
  printf("%-10s %12s %8s\n", "streams", "ns/op", "ratio");
  double first = 0;
  for (int i = 0; i < k; i++) {
    double r[5];
    for (int j = 0; j < 5; j++)
      if ((r[j] = miss ? run_miss(ns[i]) : run(ns[i])) < 0)
        return 1;
    qsort(r, 5, sizeof r[0], cmp_d);
    if (i == 0)
      first = r[2];
    printf("%-10lu %12.0f %8.2f\n", ns[i], r[2], r[2] / first);
    fflush(stdout);
  }
  return 0;
}
