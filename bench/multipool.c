/*
 * pp_bench_multipool: the cost of a thread that alternates between pools
 * (issue 20: thread caches are looked up per pool, docs/benchmarks.md,
 * "Several pools per thread").
 *
 * One thread; N pools (1, 2, 4, 8, 9: one more than the thread's cache
 * ways); pair i allocates 4 KiB from pool i % N, writes a byte, frees it.
 * Prints the median over repetitions (cases interleaved) of the ns per
 * pair, its ratio to N = 1, and the fastest repetition. Built twice: against
 * the static library (pp_bench_multipool) and the shared one
 * (pp_bench_multipool_so), whose TLS model differs.
 *
 *   pp_bench_multipool [pairs per rep, default 5000000] [reps, default 11]
 *                      [N: only that many pools]
 * NOTOUCH=1 in the environment: the blocks are not written (what the
 * pools' own state costs, without the blocks' cache lines).
 *
 * Each N also gets a like-for-like row "1xN": one pool, N blocks written
 * in rotation (N - 1 held, one freed and taken again each pair: the thread
 * cache hands the same block back), so the blocks' cache footprint is the
 * same as with N pools and only the pools' own cost differs.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pinpool.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  (void)clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void *volatile sink;
static int touch = 1; /* NOTOUCH=1: blocks are not written */

/* One pool, n blocks of 4 KiB written in rotation. */
static double run_blocks(pinpool_t *pool, unsigned n, uint64_t pairs) {
  void *held[9];
  for (unsigned i = 0; i < n; i++)
    if (pinpool_alloc(pool, 4096, &held[i]) != 0) {
      fprintf(stderr, "pinpool_alloc: %s\n", pinpool_last_error());
      exit(1);
    }
  uint64_t t0 = now_ns();
  unsigned k = 0;
  for (uint64_t i = 0; i < pairs; i++) {
    (void)pinpool_free(pool, held[k]);
    void *p = NULL;
    if (pinpool_alloc(pool, 4096, &p) != 0) {
      fprintf(stderr, "pinpool_alloc: %s\n", pinpool_last_error());
      exit(1);
    }
    if (touch)
      *(volatile char *)p = 1;
    held[k] = p;
    k = k + 1 == n ? 0 : k + 1;
  }
  double dt = (double)(now_ns() - t0) / (double)pairs;
  for (unsigned i = 0; i < n; i++)
    (void)pinpool_free(pool, held[i]);
  return dt;
}

static double run(pinpool_t **pools, unsigned n, uint64_t pairs) {
  uint64_t t0 = now_ns();
  unsigned k = 0;
  for (uint64_t i = 0; i < pairs; i++) {
    void *p = NULL;
    if (pinpool_alloc(pools[k], 4096, &p) != 0) {
      fprintf(stderr, "pinpool_alloc: %s\n", pinpool_last_error());
      exit(1);
    }
    if (touch)
      *(volatile char *)p = 1;
    sink = p;
    (void)pinpool_free(pools[k], p);
    k = k + 1 == n ? 0 : k + 1;
  }
  return (double)(now_ns() - t0) / (double)pairs;
}

int main(int argc, char **argv) {
  touch = getenv("NOTOUCH") == NULL;
  uint64_t pairs = argc > 1 ? strtoull(argv[1], NULL, 10) : 5000000u;
  unsigned reps = argc > 2 ? (unsigned)strtoul(argv[2], NULL, 10) : 11;
  static unsigned ns[] = {1, 2, 4, 8, 9};
  pinpool_t *pools[9];
  for (unsigned i = 0; i < 9; i++)
    if (pinpool_create("mlock=0", &pools[i]) != 0) {
      fprintf(stderr, "pinpool_create: %s\n", pinpool_last_error());
      return 1;
    }
  unsigned NC = sizeof ns / sizeof ns[0], only = 0;
  if (argc > 3) {
    only = (unsigned)strtoul(argv[3], NULL, 10);
    NC = 1;
  }
  static double t[5][64], tb[5][64];
  if (only != 0)
    ns[0] = only > 9 ? 9 : only;
  reps = reps > 64 ? 64 : reps;
  for (unsigned c = 0; c < NC; c++)
    (void)run(pools, ns[c], pairs / 10); /* warm every way */
  /* Cases interleaved within each repetition: a slow spell of the
   * machine hits every case, not one. */
  for (unsigned r = 0; r < reps; r++)
    for (unsigned c = 0; c < NC; c++) {
      t[c][r] = run(pools, ns[c], pairs);
      tb[c][r] = run_blocks(pools[0], ns[c], pairs);
    }
  double base = 0;
  printf("pools\tns/pair\tratio\tmin\t1xN ns\tN pools / 1xN\n");
  for (unsigned c = 0; c < NC; c++) {
    qsort(t[c], reps, sizeof t[c][0], cmp_double);
    qsort(tb[c], reps, sizeof tb[c][0], cmp_double);
    double med = t[c][reps / 2], medb = tb[c][reps / 2];
    if (c == 0)
      base = med;
    printf("%u\t%.2f\t%.3f\t%.2f\t%.2f\t%.3f\n", ns[c], med, med / base,
           t[c][0], medb, med / medb);
  }
  for (unsigned i = 0; i < 9; i++)
    pinpool_destroy(pools[i]);
  return 0;
}
