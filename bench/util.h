/*
 * pp_bench's lowest layer (util.c): small utilities (dying, the clock, the
 * generator, samples), the process's own measurements (faults, RSS) and
 * the options. Used by every other file of pp_bench; uses none of them.
 * Every name that crosses a file of pp_bench starts with pb_ so that none
 * can collide with pinpool's own (the program links pinpool_static).
 *
 * The helpers that sit inside timed regions (the clock, the generator,
 * pb_cpu_relax) are static inline: they were inlined into the workloads'
 * loops when everything was one file, and the timings must stay comparable
 * with earlier runs.
 */
#ifndef PP_BENCH_UTIL_H
#define PP_BENCH_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#ifndef PEER_NAME
#define PEER_NAME "glibc"
#endif
/* A substring of the path of the shared object malloc must come from. */
#ifndef PEER_LIB
#define PEER_LIB "libc.so"
#endif

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define PAGE ((size_t)4096)
#define MAX_THREADS 2
/* ---- Small utilities (util.c) -------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) void pb_die(const char *fmt,
                                                            ...);
__attribute__((noreturn)) void pb_die_pp(const char *call, int rc);
void *pb_xmalloc(size_t n);

static inline uint64_t pb_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: a small deterministic generator, seeded per workload/thread. */
typedef struct rng {
  uint64_t s;
} rng_t;

static inline uint64_t pb_rng_next(rng_t *r) {
  uint64_t z = (r->s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static inline double pb_rng_unit(rng_t *r) { /* [0, 1) */
  return (double)(pb_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static inline size_t pb_rng_below(rng_t *r, size_t n) {
  return (size_t)(pb_rng_unit(r) * (double)n);
}

size_t pb_log_uniform(rng_t *r, size_t lo, size_t hi);

/* Samples (nanoseconds), per thread. */
typedef struct samples {
  uint64_t *v;
  size_t n, cap;
} samples_t;

void pb_samples_init(samples_t *s, size_t cap);
void pb_samples_add(samples_t *s, uint64_t x);
void pb_samples_merge(samples_t *into, const samples_t *from);
double pb_samples_quantile(samples_t *s, double q);
double pb_samples_mean(const samples_t *s);
void pb_samples_free(samples_t *s);

const char *pb_size_str(size_t size, char *buf, size_t len);

/* ---- Process measurements (util.c) --------------------------------------- */

uint64_t pb_minflt_now(void);
uint64_t pb_proc_status_kib(const char *field);
extern bool pb_hwm_reset;
void pb_rss_begin(void);
uint64_t pb_rss_peak_delta(void);

static inline void pb_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/* ---- Options (util.c) ---------------------------------------------------- */

typedef struct options {
  const char *workload;
  const char *impl;
  bool touch;
  int threads;
  int case_idx;
  int rep;
  bool quick;
  const char *config; /* overrides the workload's pinpool config */
  const char *name;   /* the reported name of a malloc peer (--name) */
} options_t;

extern options_t pb_opt;

#endif
