/*
 * pp_snapgen: write a real snapshot of a busy pool, for the tests of the
 * snapshot tools and the benchmark of the writer.
 *
 *   pp_snapgen OUT.json [--live N] [--history N] [--threads T] [--streams]
 *                       [--depth D] [--churn N] [--no-symbols]
 *                       [--max-kib K]
 *
 * T threads (default 2) each allocate from two call sites, stage_batch and
 * stage_weights (named so that tests can look for them in the stacks),
 * sizes from 1 KiB to K KiB (default 1024, a power of two),
 * keeping N live blocks in all (default 1000) and freeing and reallocating
 * N * churn times (default 2); with --streams, blocks are used on
 * simulated streams before being freed, so some are pending. History is on
 * (level all, ring of --history entries, default 100000, depth D, default
 * 16) while they run. The snapshot is written after the threads joined
 * (the live blocks are still allocated), then the pool is destroyed.
 * Exit status 0 on success, 1 on a failed call, 2 on a usage error.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pinpool.h"

typedef struct job {
  pinpool_t *pool;
  unsigned seed;
  size_t live, churn, max_shift;
  int streams;
  void **ptrs;
  int failed;
} job_t;

static unsigned next_rand(unsigned *s) {
  *s = *s * 1103515245u + 12345u;
  return *s >> 8;
}

/* Two distinct call sites, kept out of line so that they show in stacks. */
__attribute__((noinline)) static void *stage_batch(pinpool_t *pool,
                                                   size_t size) {
  void *p = NULL;
  return pinpool_alloc(pool, size, &p) == 0 ? p : NULL;
}

__attribute__((noinline)) static void *stage_weights(pinpool_t *pool,
                                                     size_t size) {
  /* Weights are whole pages; the bodies differ, so that no compiler folds
   * the two sites into one. */
  void *p = NULL;
  return pinpool_alloc(pool, (size + 4095) & ~(size_t)4095, &p) == 0 ? p : NULL;
}

static void *one_alloc(job_t *j) {
  unsigned r = next_rand(&j->seed);
  /* Mostly small batches, some large weights: 1 KiB .. 1 MiB. */
  size_t size = ((size_t)1024 << (r % j->max_shift)) - (r % 977);
  return r % 4 == 0 ? stage_weights(j->pool, size) : stage_batch(j->pool, size);
}

static void *run(void *arg) {
  job_t *j = arg;
  for (size_t i = 0; i < j->live; i++)
    if ((j->ptrs[i] = one_alloc(j)) == NULL)
      j->failed = 1;
  for (size_t k = 0; k < j->live * j->churn; k++) {
    size_t i = next_rand(&j->seed) % j->live;
    if (j->ptrs[i] != NULL && pinpool_free(j->pool, j->ptrs[i]) != 0)
      j->failed = 1;
    if ((j->ptrs[i] = one_alloc(j)) == NULL)
      j->failed = 1;
  }
  /* With streams, an eighth of the blocks is used on a stream whose work
   * (queued by main) outlasts the run, then freed: pending blocks. */
  for (size_t i = 0; j->streams && i < j->live / 8; i++) {
    if (j->ptrs[i] == NULL)
      continue;
    if (pinpool_record_stream(j->pool, j->ptrs[i],
                              (pinpool_stream_t)(1 + i % 3)) != 0 ||
        pinpool_free(j->pool, j->ptrs[i]) != 0)
      j->failed = 1;
    j->ptrs[i] = NULL;
  }
  return NULL;
}

static int usage(void) {
  fprintf(stderr, "usage: pp_snapgen OUT.json [--live N] [--history N] "
                  "[--threads T] [--streams] [--depth D] [--churn N] "
                  "[--no-symbols] [--max-kib K]\n");
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 2 || argv[1][0] == '-')
    return usage();
  const char *out = argv[1];
  size_t live = 1000, history = 100000, threads = 2, depth = 16, churn = 2;
  size_t max_kib = 1024;
  int streams = 0;
  unsigned flags = 0;
  for (int i = 2; i < argc; i++) {
    size_t *dst = NULL;
    if (strcmp(argv[i], "--streams") == 0) {
      streams = 1;
      continue;
    }
    if (strcmp(argv[i], "--no-symbols") == 0) {
      flags |= PINPOOL_SNAPSHOT_NO_SYMBOLS;
      continue;
    }
    if (strcmp(argv[i], "--live") == 0)
      dst = &live;
    else if (strcmp(argv[i], "--history") == 0)
      dst = &history;
    else if (strcmp(argv[i], "--threads") == 0)
      dst = &threads;
    else if (strcmp(argv[i], "--depth") == 0)
      dst = &depth;
    else if (strcmp(argv[i], "--churn") == 0)
      dst = &churn;
    else if (strcmp(argv[i], "--max-kib") == 0)
      dst = &max_kib;
    if (dst == NULL || i + 1 >= argc)
      return usage();
    char *end = NULL;
    unsigned long long v = strtoull(argv[++i], &end, 10);
    if (end == argv[i] || *end != '\0')
      return usage();
    *dst = (size_t)v;
  }
  size_t max_shift = 1;
  while (((size_t)1 << max_shift) <= max_kib && max_shift < 30)
    max_shift++;
  if (threads < 1 || threads > 64 || live < threads || max_kib < 1)
    return usage();

  pinpool_t *pool = NULL;
  int rc =
      pinpool_create(streams ? "events=simulated,sim_delay_us=0" : "", &pool);
  if (rc != 0) {
    fprintf(stderr, "pp_snapgen: pinpool_create: %s\n", pinpool_last_error());
    return 1;
  }
  pinpool_history_options_t ho = {PINPOOL_HISTORY_ALL, history, (unsigned)depth,
                                  0};
  if ((rc = pinpool_record_history(pool, &ho)) != 0) {
    fprintf(stderr, "pp_snapgen: pinpool_record_history: %s\n",
            pinpool_last_error());
    return 1;
  }
  /* Two seconds of simulated work on each stream: events recorded during
   * the run complete after it, so their blocks are pending in the
   * snapshot (pinpool_destroy waits for them). */
  for (uintptr_t s = 1; streams && s <= 3; s++)
    if (pinpool_sim_submit(pool, (pinpool_stream_t)s, 2000000000u, NULL,
                           NULL) != 0) {
      fprintf(stderr, "pp_snapgen: pinpool_sim_submit: %s\n",
              pinpool_last_error());
      return 1;
    }
  pthread_t *tids = calloc(threads, sizeof *tids);
  job_t *jobs = calloc(threads, sizeof *jobs);
  int failed = tids == NULL || jobs == NULL;
  for (size_t t = 0; !failed && t < threads; t++) {
    jobs[t] = (job_t){pool,
                      (unsigned)(t * 7919 + 1),
                      live / threads,
                      churn,
                      max_shift,
                      streams,
                      calloc(live / threads, sizeof(void *)),
                      0};
    if (jobs[t].ptrs == NULL ||
        pthread_create(&tids[t], NULL, run, &jobs[t]) != 0)
      failed = 1;
  }
  for (size_t t = 0; !failed && t < threads; t++) {
    pthread_join(tids[t], NULL);
    failed |= jobs[t].failed;
  }
  if (failed) {
    fprintf(stderr, "pp_snapgen: allocation failed: %s\n",
            pinpool_last_error());
    return 1;
  }
  (void)pinpool_empty_cache(pool); /* an empty_cache entry */
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  /* PP_SNAPGEN_REPEAT=N: write it N times (profiling the writer). */
  const char *rep = getenv("PP_SNAPGEN_REPEAT");
  for (int k = rep != NULL ? atoi(rep) : 1; k > 1 && rc == 0; k--)
    rc = pinpool_snapshot_write(pool, out, flags);
  rc = rc != 0 ? rc : pinpool_snapshot_write(pool, out, flags);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (getenv("PP_SNAPGEN_TIME") != NULL)
    printf("snapshot written in %.3f s\n",
           (double)(t1.tv_sec - t0.tv_sec) +
               (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
  if (rc != 0) {
    fprintf(stderr, "pp_snapgen: pinpool_snapshot_write: %s\n",
            pinpool_last_error());
    return 1;
  }
  for (size_t t = 0; t < threads; t++) {
    for (size_t i = 0; i < jobs[t].live; i++)
      if (jobs[t].ptrs[i] != NULL)
        (void)pinpool_free(pool, jobs[t].ptrs[i]);
    free(jobs[t].ptrs);
  }
  free(jobs);
  free(tids);
  pinpool_destroy(pool);
  return 0;
}
