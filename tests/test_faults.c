/*
 * Fault injection (config key fault=SITE:N[:COUNT]): for every site, N is
 * swept over every call of a representative workload. Each injected
 * failure must give the documented result, the pool must stay consistent
 * (validator, accounting identity) and keep working once the fault has
 * passed; under the asan preset LeakSanitizer checks nothing leaks.
 *
 *   alloc, populate: the allocation fails with PINPOOL_ENOMEM only when the
 *     retry fails too (COUNT=2); with COUNT=1 the retry (idle memory
 *     released, the carve tried once more: alloc.c, take_with_retry) hides
 *     it. Some N of the sweep must still end in ENOMEM.
 *   mlock: mlock=1 falls back to unlocked memory (mlock_failures);
 *     mlock=require fails with PINPOOL_ENOMEM.
 *   record, query: the free succeeds, the block stays pending forever,
 *     event_errors counts it.
 *   sset: record_stream fails with PINPOOL_ENOMEM.
 * Every public call of the workload that fails is checked to have changed
 * nothing (check_unchanged: the stats field by field, cached bytes and
 * chunks included, but for what the documented retry released), at every
 * call of every site: issue 37's class test for "a function that fails
 * changes nothing".
 */
#include "testutil.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdlib.h>

typedef struct outcome {
  unsigned enomem;     /* allocations that failed with ENOMEM */
  unsigned other;      /* other calls that failed with ENOMEM (sset) */
  unsigned unexpected; /* any other failure */
  unsigned checked;    /* failures checked to have changed nothing */
} outcome_t;

static void note(outcome_t *o, const char *what, int rc, bool enomem_ok) {
  if (rc == 0)
    return;
  if (rc == PINPOOL_ENOMEM && enomem_ok) {
    if (strcmp(what, "pinpool_alloc") == 0)
      o->enomem++;
    else
      o->other++;
    return;
  }
  o->unexpected++;
  print_error("unexpected: %s returned %s (%s)\n", what, pp_code_name(rc),
              pinpool_last_error());
}

/* A function that fails changes nothing (issue 37): the stats after a
 * failed call equal those before it, field by field, but for the
 * failure's own record (oom_count, and the backend calls it made, failed
 * ones included, in backend_alloc) and for what an allocation's documented
 * retry did before failing again (docs/api.md: idle memory released, then
 * one more try): whole free chunks given back to the backend (reserved and
 * cached bytes down by what backend_free got, as many chunks fewer, and
 * counted in trimmed_segments), idle segments given back to their chunks,
 * and the arena's free extents accordingly. Nothing else: no block, no
 * request, no peak (D1: the reserved peak of a failed reservation), no
 * locked or fallback bytes, no segment made. */
static void check_unchanged(pinpool_t *pool, const pinpool_stats_t *b,
                            const char *what, int rc, outcome_t *o) {
  pinpool_stats_t a, x;
  PP_STATS(pool, &a);
  x = a;
  PP_ASSERT(a.oom_count <= b->oom_count + 1, "%s: oom_count +%llu", what,
            (unsigned long long)(a.oom_count - b->oom_count));
  x.oom_count = b->oom_count;
  x.backend_alloc = b->backend_alloc;
  /* The calling thread's cache exists from its first call on (the slack
   * of the peaks counts the caches), whether that call failed or not. */
  x.peak_slack_bytes = b->peak_slack_bytes;
  bool retried = a.retries != b->retries;
  PP_ASSERT(a.retries <= b->retries + 1, "%s: %llu retries", what,
            (unsigned long long)(a.retries - b->retries));
  x.retries = b->retries;
  uint64_t freed = a.reserved_bytes.freed - b->reserved_bytes.freed;
  uint64_t chunks = a.backend_free.count - b->backend_free.count;
  uint64_t segs = a.segments.freed - b->segments.freed;
  if (retried) {
    x.reserved_bytes.current += freed;
    x.reserved_bytes.freed -= freed;
    x.cached_bytes.current += freed;
    x.cached_bytes.freed -= freed;
    x.segments.current += segs;
    x.segments.freed -= segs;
    x.arena_chunks += chunks;
    PP_ASSERT(a.trimmed_segments - b->trimmed_segments == chunks,
              "%s: %llu chunks trimmed, %llu given back", what,
              (unsigned long long)(a.trimmed_segments - b->trimmed_segments),
              (unsigned long long)chunks);
    x.trimmed_segments = b->trimmed_segments;
    x.backend_free = b->backend_free;
    x.chunk_free_bytes = b->chunk_free_bytes;
    x.free_extents = b->free_extents;
    x.largest_free_extent = b->largest_free_extent;
  }
  char msg[160];
  snprintf(msg, sizeof msg, "%s failing with %s", what, pp_code_name(rc));
  PP_CHECK_STATS_EQUAL(b, &x, msg);
  o->checked++;
}

/* Every public call of the workload: the stats are read before it (after
 * the completed events are reclaimed, which any call may do first), and a
 * failure is checked to have changed nothing. */
#define CALL(o, pool, what, expr, enomem_ok)                                   \
  do {                                                                         \
    pinpool_stats_t before_;                                                   \
    (void)pinpool_process_events(pool);                                        \
    PP_STATS(pool, &before_);                                                  \
    int rc_ = (expr);                                                          \
    note((o), (what), rc_, (enomem_ok));                                       \
    if (rc_ != 0)                                                              \
      check_unchanged((pool), &before_, (what), rc_, (o));                     \
  } while (0)

/* Allocations of every kind of segment, frees with and without streams,
 * reclaim, empty_cache: the calls each site can fail. */
static void workload(pinpool_t *pool, outcome_t *o) {
  static const size_t sizes[] = {4096, 100 * KiB, 1 * MiB, 3 * MiB, 20 * MiB};
  void *live[3 * 5] = {NULL};
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 5; i++) {
      void **slot = &live[round * 5 + i];
      CALL(o, pool, "pinpool_alloc", pinpool_alloc(pool, sizes[i], slot), true);
    }
    for (int i = 0; i < 5; i++) {
      void *p = live[round * 5 + i];
      if (p == NULL)
        continue;
      memset(p, 0x11, 64);
      if ((i + round) % 2 == 0)
        CALL(o, pool, "pinpool_record_stream",
             pinpool_record_stream(pool, p, (pinpool_stream_t)(1 + i % 2)),
             true);
      CALL(o, pool, "pinpool_free", pinpool_free(pool, p), false);
      live[round * 5 + i] = NULL;
    }
    CALL(o, pool, "pinpool_process_events", pinpool_process_events(pool),
         false);
    if (round == 1)
      CALL(o, pool, "pinpool_empty_cache", pinpool_empty_cache(pool), false);
  }
  CALL(o, pool, "pinpool_synchronize", pinpool_synchronize(pool), false);
}

/* After the fault: the pool is consistent and works. */
/* Allocate, allowing ENOMEM while the fault still fires (it fires for
 * COUNT calls at most, so a few attempts always get past it). */
static void *alloc_past_fault(pinpool_t *pool, size_t n, const char *config) {
  void *p = NULL;
  int rc = PINPOOL_ENOMEM;
  for (int i = 0; i < 4 && rc == PINPOOL_ENOMEM; i++)
    rc = pinpool_alloc(pool, n, &p);
  PP_ASSERT(rc == 0, "%s: still failing after the fault: %s", config,
            pinpool_last_error());
  return p;
}

static void check_after(pinpool_t *pool, const char *config) {
  PP_CHECK_CONSISTENT(pool);
  void *a = alloc_past_fault(pool, 1 * MiB, config);
  void *b = alloc_past_fault(pool, 64 * MiB, config);
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_empty_cache(pool));
  PP_CHECK_CONSISTENT(pool);
}

typedef bool (*fired_fn)(const pinpool_stats_t *st, const outcome_t *o);

static bool fired_enomem(const pinpool_stats_t *st, const outcome_t *o) {
  return o->enomem > 0 || st->retries > 0;
}
static bool fired_mlock(const pinpool_stats_t *st, const outcome_t *o) {
  (void)o;
  return st->mlock_failures > 0;
}
static bool fired_event(const pinpool_stats_t *st, const outcome_t *o) {
  (void)o;
  return st->event_errors > 0;
}
static bool fired_other(const pinpool_stats_t *st, const outcome_t *o) {
  (void)st;
  return o->other > 0;
}

/* Sweep N = 1, 2, ... until a run in which the fault no longer fires. */
static void sweep(const char *base, const char *site, unsigned count,
                  fired_fn fired, bool expect_enomem) {
  unsigned n = 1, fired_runs = 0, enomem_runs = 0, checked = 0;
  for (;; n++) {
    PP_ASSERT(n < 400, "%s: the fault still fires at call %u", site, n);
    char config[256];
    snprintf(config, sizeof config, "%s,fault=%s:%u:%u", base, site, n, count);
    pinpool_t *pool;
    PP_OK(pinpool_create(config, &pool));
    outcome_t o = {0, 0, 0, 0};
    workload(pool, &o);
    pinpool_stats_t st;
    PP_STATS(pool, &st);
    PP_ASSERT(o.unexpected == 0, "%s: unexpected errors", config);
    if (!expect_enomem)
      PP_ASSERT(o.enomem == 0, "%s: %u allocations failed", config, o.enomem);
    bool hit = fired(&st, &o);
    PP_ASSERT(st.oom_count == o.enomem,
              "%s: oom_count %llu vs %u ENOMEM answers", config,
              (unsigned long long)st.oom_count, o.enomem);
    enomem_runs += o.enomem > 0 || o.other > 0;
    checked += o.checked;
    check_after(pool, config);
    pinpool_destroy(pool);
    if (!hit)
      break;
    fired_runs++;
  }
  PP_ASSERT(fired_runs > 0, "%s: the fault never fired", site);
  PP_ASSERT(!expect_enomem || enomem_runs > 0, "%s: no run ended in ENOMEM",
            site);
  PP_ASSERT(checked == 0 || enomem_runs > 0, "%s: checked without failing",
            site);
  print_message("%-8s %u calls swept, the fault fired in %u runs, %u "
                "failures checked to change nothing\n",
                site, n - 1, fired_runs, checked);
}

static const char *k_base = "events=simulated,sim_delay_us=0,tcache_bytes="
                            "256KiB,max_cached=8MiB";

static void test_alloc(void **state) {
  (void)state;
  sweep(k_base, "alloc", 2, fired_enomem, true);
  /* A single failure is hidden by the retry: nothing fails. */
  char config[256];
  snprintf(config, sizeof config, "%s,fault=alloc:1", k_base);
  pinpool_t *pool;
  PP_OK(pinpool_create(config, &pool));
  void *p;
  PP_OK(pinpool_alloc(pool, 4096, &p));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.retries == 1 && st.oom_count == 0, "retry hides one failure");
  PP_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
}

static void test_populate(void **state) {
  (void)state;
  sweep(k_base, "populate", 2, fired_enomem, true);
}

static void test_mlock(void **state) {
  (void)state;
  char base[256];
  snprintf(base, sizeof base, "%s,backend=host,mlock=1", k_base);
  sweep(base, "mlock", 1, fired_mlock, false);
  snprintf(base, sizeof base, "%s,backend=host,mlock=require", k_base);
  sweep(base, "mlock", 2, fired_enomem, true);
}

/* record_stream finds no memory for the block's stream set: ENOMEM, and
 * nothing changed (checked by the workload's CALL). */
static void test_sset(void **state) {
  (void)state;
  sweep(k_base, "sset", 1, fired_other, true);
}

static void test_record(void **state) {
  (void)state;
  sweep(k_base, "record", 1, fired_event, false);
}

static void test_query(void **state) {
  (void)state;
  sweep(k_base, "query", 1, fired_event, false);
}

/* backend=cuda-register against the fake driver (tests/fake_cuda, through
 * PINPOOL_LIBCUDA): a refused cuMemHostRegister is an allocation failure,
 * the mapping is given back, and the pool goes on. */
static void test_register(void **state) {
  (void)state;
  char base[256];
  snprintf(base, sizeof base, "%s,backend=cuda-register,device=0", k_base);
  sweep(base, "register", 2, fired_enomem, true);
}

/* The fake CUDA driver's controls (tests/fake_cuda/fake_cuda.h), looked
 * up in the library PINPOOL_LIBCUDA names, which the pool loads too. */
typedef int (*fake_fail_fn)(const char *entry, unsigned nth, int code);
typedef long long (*fake_get_fn)(const char *key);
static bool fake_driver(fake_fail_fn *inject, fake_get_fn *get) {
  const char *lib = getenv("PINPOOL_LIBCUDA");
  void *h = lib != NULL ? dlopen(lib, RTLD_NOW) : NULL;
  if (h == NULL)
    return false;
  *(void **)inject = dlsym(h, "fake_cuda_fail");
  *(void **)get = dlsym(h, "fake_cuda_get");
  return *inject != NULL && *get != NULL;
}

/* A reserve the driver refused at create (pin_failure=pageable) is a
 * fallback chunk like any other: the first released when all free, and
 * the arena's next chunk asks the driver again (docs/cuda.md, "When
 * pinning fails"). Issue 37, D2: the fallback became the reserve, which is
 * never released, so one refusal at create left the pool pageable for its
 * whole life. For both CUDA backends, one refusal each. */
static void test_reserve_refused(void **state) {
  (void)state;
  fake_fail_fn inject;
  fake_get_fn get;
  if (!fake_driver(&inject, &get)) {
    print_message("test_reserve_refused: no fake CUDA driver, skipped\n");
    return;
  }
  static const char *const be[2][2] = {{"cuda", "cuMemHostAlloc"},
                                       {"cuda-register", "cuMemHostRegister"}};
  for (int i = 0; i < 2; i++) {
    char config[160];
    snprintf(config, sizeof config,
             "backend=%s,device=0,pin_failure=pageable,reserve=4MiB,"
             "tcache_bytes=0",
             be[i][0]);
    PP_ASSERT(inject(be[i][1], 1, 2 /* CUDA_ERROR_OUT_OF_MEMORY */) == 0,
              "arm the fake");
    pinpool_t *pool = NULL;
    PP_OK(pinpool_create(config, &pool));
    pinpool_stats_t st = pp_stats_of(pool);
    PP_ASSERT(st.fallback_bytes == 4 * MiB && st.locked_bytes == 0,
              "%s: fallback %llu, locked %llu", be[i][0],
              (unsigned long long)st.fallback_bytes,
              (unsigned long long)st.locked_bytes);
    void *p = NULL;
    PP_OK(pinpool_alloc(pool, 1 * MiB, &p)); /* carved from it */
    PP_OK(pinpool_free(pool, p));
    PP_OK(pinpool_empty_cache(pool));
    st = pp_stats_of(pool);
    PP_ASSERT(st.fallback_bytes == 0 && st.reserved_bytes.current == 0,
              "%s: the refused reserve was kept: %llu bytes pageable", be[i][0],
              (unsigned long long)st.fallback_bytes);
    PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
    st = pp_stats_of(pool);
    PP_ASSERT(st.fallback_bytes == 0 && st.locked_bytes > 0,
              "%s: the next chunk not pinned: fallback %llu, locked %llu",
              be[i][0], (unsigned long long)st.fallback_bytes,
              (unsigned long long)st.locked_bytes);
    PP_OK(pinpool_free(pool, p));
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
    PP_ASSERT(get("bad_calls") == 0, "the driver saw bad calls");
  }
}

/* A reserve that cannot be allocated fails create cleanly. */
static void test_reserve_at_create(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_CHECK_RC(pinpool_create("reserve=8MiB,fault=alloc:1", &pool),
              PINPOOL_ENOMEM);
  PP_ASSERT(pool == NULL, "no pool after a failed create");
  PP_CHECK_RC(pinpool_create("fault=nowhere:1", &pool), PINPOOL_ECONFIG);
  PP_CHECK_RC(pinpool_create("fault=alloc:0", &pool), PINPOOL_ECONFIG);
  PP_CHECK_RC(pinpool_create("fault=alloc", &pool), PINPOOL_ECONFIG);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_alloc),
      cmocka_unit_test(test_populate),
      cmocka_unit_test(test_mlock),
      cmocka_unit_test(test_sset),
      cmocka_unit_test(test_record),
      cmocka_unit_test(test_query),
      cmocka_unit_test(test_register),
      cmocka_unit_test(test_reserve_at_create),
      cmocka_unit_test(test_reserve_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
