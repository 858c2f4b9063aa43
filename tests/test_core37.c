/*
 * The allocator's core after issue 37's third review (docs/verification.md,
 * "Issue 37, the third review"). Counts, never times: a thread is held in
 * a lock-drop window by the test hook (src/base.h, PP_HOOK_*), and a wait
 * for the background grower is bounded (a loaded machine runs it late,
 * never wrongly) and then asserted.
 *  - chunk_pages: every size asked of the backend is a page multiple,
 *    whatever max_reserved and grow_ahead leave (item 1).
 *  - grow_ahead_bounds: grow_ahead above the machine's memory is
 *    PINPOOL_ECONFIG; a headroom above the largest chunk is made a chunk
 *    per look, never asked of the backend whole (item 1).
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_* */
#include "space_backend.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- A recording backend: address space only (space_backend.h), every
 * size asked counted. ---------------------------------------------------- */
static atomic_ullong rb_calls, rb_odd, rb_max;

static int rb_alloc(void *ctx, size_t size, void **out) {
  atomic_fetch_add(&rb_calls, 1);
  if (size % 4096 != 0)
    atomic_fetch_add(&rb_odd, 1);
  unsigned long long m = atomic_load(&rb_max);
  while (size > m && !atomic_compare_exchange_weak(&rb_max, &m, size))
    ;
  /* Mapped whole pages; the size freed is the one asked for. */
  return pp_space_alloc(ctx, (size + 4095) & ~(size_t)4095, out);
}

static void rb_free(void *ctx, void *p, size_t size) {
  pp_space_free(ctx, p, (size + 4095) & ~(size_t)4095);
}

static const pinpool_backend_t rb_backend = {"recording", rb_alloc, rb_free,
                                             NULL, 0};

static void rb_reset(void) {
  atomic_store(&rb_calls, 0);
  atomic_store(&rb_odd, 0);
  atomic_store(&rb_max, 0);
}

/* Bounded wait for a condition on the pool's stats. */
typedef bool (*stats_pred_t)(const pinpool_stats_t *st, uint64_t arg);
static bool wait_stats(pinpool_t *pool, stats_pred_t pred, uint64_t arg) {
  for (int i = 0; i < 10000; i++) {
    pinpool_stats_t st = pp_stats_of(pool);
    if (pred(&st, arg))
      return true;
    pp_sleep_ms(1);
  }
  return false;
}

/* ---- Item 1: a chunk of a size the cap leaves ----------------------------
 * The grower asked chunk_size for what max_reserved leaves (any byte
 * count) or for a headroom that is not a page multiple, and chunk_size
 * returned it unrounded when the policy's chunk would pass the cap: the
 * debug build's granule assertion aborted the grower's thread, a release
 * build's validate failed. The recording backend sees every size, inline
 * growth's and the grower's. */
#define CAP_ODD 17400000ull /* not a page multiple */
#define AHEAD_ODD 3000000ull

static bool grown_to_cap(const pinpool_stats_t *st, uint64_t cap) {
  /* The grower stops when the cap leaves less than a chunk (2 MiB); a
   * headroom of AHEAD_ODD before that. */
  return st->chunk_free_bytes >= AHEAD_ODD ||
         st->reserved_bytes.current + 2 * MiB > cap;
}

static void chunk_pages_run(const char *conf, uint64_t cap, int blocks) {
  rb_reset();
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend(conf, &rb_backend, &pool));
  void *p[16] = {0};
  for (int i = 0; i < blocks; i++) {
    PP_OK(pinpool_alloc(pool, MiB, &p[i]));
    PP_ASSERT(wait_stats(pool, grown_to_cap, cap), "%s: block %d: no headroom",
              conf, i);
  }
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(atomic_load(&rb_odd) == 0,
            "%s: %llu of %llu backend allocations not a page multiple", conf,
            atomic_load(&rb_odd), atomic_load(&rb_calls));
  PP_ASSERT(st.reserved_bytes.current + 2 * MiB > cap &&
                st.reserved_bytes.current <= cap,
            "%s: reserved %llu under a cap of %llu", conf,
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)cap);
  PP_OK(pinpool_validate(pool));
  for (int i = 0; i < blocks; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_empty_cache(pool));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

static void chunk_pages(void **state) {
  (void)state;
  /* The room the cap leaves is the last chunk's size. */
  chunk_pages_run("max_reserved=17400000,grow_ahead=3000000", CAP_ODD, 14);
  /* A page-multiple cap: the headroom (not a page multiple) is. */
  chunk_pages_run("max_reserved=16MiB,grow_ahead=3000000", 16 * MiB, 13);
}

/* ---- Item 1: grow_ahead's bounds ---------------------------------------- */
static bool headroom_at_least(const pinpool_stats_t *st, uint64_t bytes) {
  return st->chunk_free_bytes >= bytes;
}

static void grow_ahead_bounds(void **state) {
  (void)state;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  PP_ASSERT(pages > 0 && psz > 0, "no physical memory size");
  uint64_t phys = (uint64_t)pages * (uint64_t)psz;
  char conf[128];
  pinpool_t *pool = NULL;
  (void)snprintf(conf, sizeof conf, "backend=host,grow_ahead=%llu",
                 (unsigned long long)phys + 1);
  PP_CHECK_RC(pinpool_create(conf, &pool), PINPOOL_ECONFIG);
  PP_ASSERT(pool == NULL, "a pool was made");
  PP_ASSERT(strstr(pinpool_last_error(), "grow_ahead") != NULL, "error: %s",
            pinpool_last_error());
  PP_CHECK_RC(
      pinpool_create("backend=host,grow_ahead=18446744073709551615", &pool),
      PINPOOL_ECONFIG);
  PP_ASSERT(pool == NULL, "a pool was made");
  /* At the bound: accepted (address space only, nothing grown). */
  (void)snprintf(conf, sizeof conf, "grow_ahead=%llu",
                 (unsigned long long)phys);
  PP_OK(pinpool_create_with_backend(conf, &rb_backend, &pool));
  pinpool_destroy(pool);
  pool = NULL;
  /* 3 GiB ahead on address space: made a chunk of at most 1 GiB (the
   * growth policy's largest) per look; the whole headroom was asked of
   * the backend at every look before. */
  if (phys < 4 * GiB)
    return;
  rb_reset();
  PP_OK(pinpool_create_with_backend("grow_ahead=3GiB", &rb_backend, &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, MiB, &p)); /* the first growth: inline */
  PP_ASSERT(wait_stats(pool, headroom_at_least, 3 * GiB), "no headroom");
  PP_ASSERT(atomic_load(&rb_max) <= GiB,
            "the backend was asked for %llu bytes at once",
            atomic_load(&rb_max));
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(chunk_pages),
      cmocka_unit_test(grow_ahead_bounds),
  };
  return pp_run_selected("test_core37", all, sizeof all / sizeof all[0], argc,
                         argv);
}
