/*
 * Growth ahead of demand (issue 37; docs/benchmarks.md, "Grow-ahead"): a
 * live set that ramps up slowly and then holds, as a training run's pinned
 * buffers do, against a backend whose pinning costs what a driver's does
 * (the fake driver's pin_us_per_gib; docs/cuda.md records 0.1-0.45 s/GiB).
 *
 * One thread. Each step: "compute" (a sleep of STEP_US), two cached pairs
 * (alloc + free of 64 KiB and of 2 MiB, timed: the floor an allocation
 * can reach), then
 * allocations until the live set reaches its target for this moment: the
 * peak times elapsed / ramp during the ramp, the peak during the hold, in
 * blocks of 256 KiB - 4 MiB (one in four of 4 - 64 KiB); during the hold
 * one random live block is replaced per step. Every allocation is timed.
 *
 *   pp_bench_growahead CONFIG RAMP_MS HOLD_MS PEAK_MIB SEED
 *
 * One line of JSON: the ramp's and the hold's allocations (count, p50,
 * p99, max in ns), the cached pair's median, the allocations that grew
 * the arena on this thread (cache_misses: each waited on the backend; in
 * all and by the ramp's end),
 * the grower's counts, the reserved peak, the live peak, and the bytes
 * held beyond it. bench/growahead.sh runs it with and without grow_ahead.
 */
#define _GNU_SOURCE
#include "pinpool.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STEP_US 200
/* The ramp's first 10 ms: the pool's first growth, which nothing can
 * grow ahead of (the grower follows demand), and the grower's first
 * chunk. ramp_warm_max_ns is the ramp's max after them. */
#define WARM_NS 10000000ull
#define MAXLIVE 65536

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t rng(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

typedef struct lat {
  uint64_t *v;
  size_t n, cap;
} lat_t;

static void lat_add(lat_t *l, uint64_t ns) {
  if (l->n == l->cap) {
    l->cap = l->cap ? l->cap * 2 : 4096;
    l->v = realloc(l->v, l->cap * sizeof *l->v);
    if (l->v == NULL) {
      perror("realloc");
      exit(2);
    }
  }
  l->v[l->n++] = ns;
}

static uint64_t lat_q(lat_t *l, double q) {
  if (l->n == 0)
    return 0;
  size_t i = (size_t)(q * (double)(l->n - 1) + 0.5);
  return l->v[i];
}

static size_t block_size(uint64_t *s) {
  uint64_t r = rng(s);
  if (r % 4 == 0)
    return (size_t)(4096 + (r >> 8) % (60 * 1024));
  return (size_t)(256 * 1024 + (r >> 8) % (3840 * 1024));
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s CONFIG RAMP_MS HOLD_MS PEAK_MIB SEED\n",
            argv[0]);
    return 2;
  }
  const char *conf = argv[1];
  uint64_t ramp_ns = strtoull(argv[2], NULL, 10) * 1000000u;
  uint64_t hold_ns = strtoull(argv[3], NULL, 10) * 1000000u;
  uint64_t peak = strtoull(argv[4], NULL, 10) << 20;
  uint64_t seed = strtoull(argv[5], NULL, 10) * 2654435761u + 1;
  pinpool_t *pool = NULL;
  if (pinpool_create(conf, &pool) != 0) {
    fprintf(stderr, "pinpool_create(%s): %s\n", conf, pinpool_last_error());
    return 1;
  }
  static void *live[MAXLIVE];
  static size_t live_sz[MAXLIVE];
  size_t nlive = 0;
  uint64_t live_bytes = 0;
  lat_t ramp = {0}, hold = {0}, pair = {0}, pair_large = {0};
  uint64_t ramp_warm_max = 0, ramp_misses = UINT64_MAX;
  bool debug = getenv("GA_DEBUG") != NULL;
  uint64_t t0 = now_ns();
  for (;;) {
    uint64_t el = now_ns() - t0;
    if (el >= ramp_ns + hold_ns)
      break;
    struct timespec st = {0, STEP_US * 1000};
    nanosleep(&st, NULL);
    bool in_ramp = el < ramp_ns;
    lat_t *l = in_ramp ? &ramp : &hold;
    if (!in_ramp && ramp_misses == UINT64_MAX) { /* the ramp ends */
      pinpool_stats_t d;
      if (pinpool_get_stats(pool, &d) != 0)
        goto fail;
      ramp_misses = d.cache_misses;
    }
    /* The cached pair. */
    void *q = NULL;
    uint64_t a = now_ns();
    if (pinpool_alloc(pool, 64 * 1024, &q) != 0 || pinpool_free(pool, q) != 0)
      goto fail;
    lat_add(&pair, now_ns() - a);
    a = now_ns();
    if (pinpool_alloc(pool, 2 << 20, &q) != 0 || pinpool_free(pool, q) != 0)
      goto fail;
    lat_add(&pair_large, now_ns() - a);
    if (!in_ramp && nlive > 0) { /* the hold: replace one live block */
      size_t i = (size_t)(rng(&seed) % nlive);
      live_bytes -= live_sz[i];
      if (pinpool_free(pool, live[i]) != 0)
        goto fail;
      live[i] = live[--nlive];
      live_sz[i] = live_sz[nlive];
    }
    uint64_t target =
        in_ramp ? (uint64_t)((double)peak * (double)el / (double)ramp_ns)
                : peak;
    while (live_bytes < target && nlive < MAXLIVE) {
      size_t sz = block_size(&seed);
      void *p = NULL;
      a = now_ns();
      if (pinpool_alloc(pool, sz, &p) != 0)
        goto fail;
      uint64_t ns = now_ns() - a;
      lat_add(l, ns);
      if (in_ramp && el >= WARM_NS && ns > ramp_warm_max)
        ramp_warm_max = ns;
      if (debug && ns > 500000) { /* GA_DEBUG=1: the slow ones, why */
        pinpool_stats_t d;
        (void)pinpool_get_stats(pool, &d);
        fprintf(stderr,
                "%.3f s %s: %zu bytes %llu us, misses %llu free %llu largest "
                "%llu grown %llu\n",
                (double)el / 1e9, in_ramp ? "ramp" : "hold", sz,
                (unsigned long long)(ns / 1000),
                (unsigned long long)d.cache_misses,
                (unsigned long long)d.chunk_free_bytes,
                (unsigned long long)d.largest_free_extent,
                (unsigned long long)d.grow_ahead_chunks);
      }
      ((volatile char *)p)[0] = 1;
      live[nlive] = p;
      live_sz[nlive++] = sz;
      live_bytes += sz;
    }
  }
  pinpool_stats_t s;
  if (pinpool_get_stats(pool, &s) != 0)
    goto fail;
  qsort(ramp.v, ramp.n, sizeof *ramp.v, cmp_u64);
  qsort(hold.v, hold.n, sizeof *hold.v, cmp_u64);
  qsort(pair.v, pair.n, sizeof *pair.v, cmp_u64);
  qsort(pair_large.v, pair_large.n, sizeof *pair_large.v, cmp_u64);
  uint64_t held = s.reserved_bytes.peak > s.requested_bytes.peak
                      ? s.reserved_bytes.peak - s.requested_bytes.peak
                      : 0;
  printf("{\"config\":\"%s\",\"ramp_allocs\":%zu,\"ramp_p50_ns\":%llu,"
         "\"ramp_p99_ns\":%llu,\"ramp_max_ns\":%llu,\"hold_allocs\":%zu,"
         "\"ramp_warm_max_ns\":%llu,"
         "\"hold_p99_ns\":%llu,\"hold_max_ns\":%llu,\"pair_p50_ns\":%llu,"
         "\"pair_2mib_p50_ns\":%llu,"
         "\"misses\":%llu,\"ramp_misses\":%llu,\"backend_allocs\":%llu,"
         "\"backend_alloc_ns\":%llu,"
         "\"grown_ahead_chunks\":%llu,\"grown_ahead_bytes\":%llu,"
         "\"hits\":%llu,\"waits_avoided\":%llu,\"reserved_peak\":%llu,"
         "\"live_peak\":%llu,\"held_beyond_peak\":%llu}\n",
         conf, ramp.n, (unsigned long long)lat_q(&ramp, 0.5),
         (unsigned long long)lat_q(&ramp, 0.99),
         (unsigned long long)lat_q(&ramp, 1.0), hold.n,
         (unsigned long long)ramp_warm_max,
         (unsigned long long)lat_q(&hold, 0.99),
         (unsigned long long)lat_q(&hold, 1.0),
         (unsigned long long)lat_q(&pair, 0.5),
         (unsigned long long)lat_q(&pair_large, 0.5),
         (unsigned long long)s.cache_misses, (unsigned long long)ramp_misses,
         (unsigned long long)s.backend_alloc.count,
         (unsigned long long)s.backend_alloc.total_ns,
         (unsigned long long)s.grow_ahead_chunks,
         (unsigned long long)s.grow_ahead_bytes,
         (unsigned long long)s.grow_ahead_hits,
         (unsigned long long)s.grow_ahead_waits_avoided,
         (unsigned long long)s.reserved_bytes.peak,
         (unsigned long long)s.requested_bytes.peak, (unsigned long long)held);
  for (size_t i = 0; i < nlive; i++)
    (void)pinpool_free(pool, live[i]);
  pinpool_destroy(pool);
  free(ramp.v);
  free(hold.v);
  free(pair.v);
  free(pair_large.v);
  return 0;
fail:
  fprintf(stderr, "%s: %s\n", conf, pinpool_last_error());
  return 1;
}
