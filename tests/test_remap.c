/*
 * Remapping idle segments (config keys remap, remap_min; host backend): a
 * miss of a one-block class takes idle segments of other classes instead
 * of new memory. The nearest larger one is split (its tail stays idle as
 * segments of smaller classes), else, for a segment of at least remap_min
 * bytes, smaller ones are moved side by side and only the rest is
 * populated. Every case checks the accounting identity, that the whole new
 * block is writable, and what the backend was asked for.
 */
#include "testutil.h"

#include <inttypes.h>

/* Tests that need a block to be idle in the bins, not in a thread cache. */
#define BASE "tcache_bytes=0,shards=1"

/* A pool with BASE and `extra`; remapping as the config says (on by
 * default, gathering from 4 MiB up). */
static pinpool_t *make_plain(const char *extra) {
  char conf[256];
  snprintf(conf, sizeof conf, "%s%s%s", BASE, extra[0] ? "," : "", extra);
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(conf, &pool));
  return pool;
}

/* The same gathering for every one-block class (remap_min=0): the
 * mechanism's cases below use sizes of a few MiB. */
static pinpool_t *make(const char *extra) {
  char conf[256];
  snprintf(conf, sizeof conf, "remap_min=0%s%s", extra[0] ? "," : "", extra);
  return make_plain(conf);
}

/* Allocate sizes[0..n) and free them again: idle segments. */
static void make_idle(pinpool_t *pool, const size_t *sizes, int n, void **out) {
  for (int i = 0; i < n; i++)
    out[i] = pp_alloc_touch(pool, sizes[i]);
  for (int i = 0; i < n; i++)
    PP_OK(pinpool_free(pool, out[i]));
  PP_CHECK_CONSISTENT(pool);
}

/* An idle 8 MiB segment serves 3 MiB in place, with no backend call; its
 * 5 MiB tail (a class) is an idle segment that serves 5 MiB next. */
static void test_split(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a;
  make_idle(pool, (size_t[]){8 * MiB}, 1, &a);
  pinpool_stats_t s0 = pp_stats_of(pool);
  void *b = pp_alloc_touch(pool, 3 * MiB);
  pinpool_stats_t s1 = pp_stats_of(pool);
  PP_ASSERT(b == a, "split in place: %p vs %p", b, a);
  PP_ASSERT(s1.backend_alloc.count == s0.backend_alloc.count &&
                s1.backend_free.count == s0.backend_free.count,
            "no backend call for a split");
  PP_ASSERT(s1.remapped_segments == 1 && s1.cache_misses == s0.cache_misses + 1,
            "remapped %" PRIu64, s1.remapped_segments);
  PP_ASSERT(s1.reserved_bytes.current == 8 * MiB && s1.segments.current == 2 &&
                s1.cached_bytes.current == 5 * MiB,
            "reserved %" PRIu64 " segments %" PRIu64 " cached %" PRIu64,
            s1.reserved_bytes.current, s1.segments.current,
            s1.cached_bytes.current);
  void *c = pp_alloc_touch(pool, 5 * MiB);
  pinpool_stats_t s2 = pp_stats_of(pool);
  PP_ASSERT(c == (char *)a + 3 * MiB && s2.cache_misses == s1.cache_misses,
            "the tail serves its class: %p", c);
  size_t bs = 0;
  PP_OK(pinpool_block_size(pool, b, &bs));
  PP_ASSERT(bs == 3 * MiB, "block size %zu", bs);
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, c));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A tail is cut into at most the classes that fit; the part below the
 * one-block classes goes back to the backend. */
static void test_split_leftover(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a;
  /* 8 MiB - 2.25 MiB = 5.75 MiB: a 5.5 MiB segment, 256 KiB given back. */
  make_idle(pool, (size_t[]){8 * MiB}, 1, &a);
  void *b = pp_alloc_touch(pool, 2 * MiB + 256 * KiB);
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(b == a && s.segments.current == 2 &&
                s.reserved_bytes.current == 7 * MiB + 768 * KiB &&
                s.cached_bytes.current == 5 * MiB + 512 * KiB,
            "segments %" PRIu64 " reserved %" PRIu64 " cached %" PRIu64,
            s.segments.current, s.reserved_bytes.current,
            s.cached_bytes.current);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  s = pp_stats_of(pool);
  PP_ASSERT(s.reserved_bytes.current == 0 && s.segments.current == 0,
            "empty_cache releases every piece: %" PRIu64,
            s.reserved_bytes.current);
  pinpool_destroy(pool);
}

/* Nothing larger idle: smaller idle segments, largest first, moved side by
 * side; the last one's unneeded tail stays idle. */
static void test_gather(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *old[3];
  make_idle(pool, (size_t[]){1 * MiB, 1 * MiB, 1 * MiB}, 3, old);
  pinpool_stats_t s0 = pp_stats_of(pool);
  void *b = pp_alloc_touch(pool, 2 * MiB + 512 * KiB);
  pinpool_stats_t s1 = pp_stats_of(pool);
  PP_ASSERT(s1.remapped_segments == 3, "remapped %" PRIu64,
            s1.remapped_segments);
  PP_ASSERT(s1.reserved_bytes.current == 3 * MiB && s1.segments.current == 2 &&
                s1.cached_bytes.current == 512 * KiB &&
                s1.backend_free.count == s0.backend_free.count,
            "reserved %" PRIu64 " segments %" PRIu64 " cached %" PRIu64,
            s1.reserved_bytes.current, s1.segments.current,
            s1.cached_bytes.current);
  /* The old blocks are gone (the tail left in place is a new segment, whose
   * start is no old block's start). */
  for (int i = 0; i < 3; i++) {
    int rc = pinpool_free(pool, old[i]);
    PP_ASSERT(rc == PINPOOL_ENOTOWNED || rc == PINPOOL_EINTERIOR ||
                  rc == PINPOOL_EDOUBLEFREE,
              "old block %d: %s", i, pp_code_name(rc));
  }
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A segment made of moved pieces is moved again piece by piece (each lies
 * in one kernel mapping: a move across mappings needs Linux 6.17). */
static void test_regather(void **state) {
  (void)state;
  pinpool_t *pool = make("mlock=1");
  void *old[2];
  make_idle(pool, (size_t[]){1 * MiB, 1 * MiB}, 2, old);
  void *x = pp_alloc_touch(pool, 2 * MiB); /* two parts */
  void *y = pp_alloc_touch(pool, 1 * MiB); /* new: nothing is idle */
  PP_OK(pinpool_free(pool, x));
  PP_OK(pinpool_free(pool, y));
  void *b = pp_alloc_touch(pool, 3 * MiB); /* 2 MiB (two parts) + 1 MiB */
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 4 && s.segments.current == 1 &&
                s.reserved_bytes.current == 3 * MiB &&
                s.backend_free.count == 0,
            "remapped %" PRIu64 " segments %" PRIu64 " reserved %" PRIu64,
            s.remapped_segments, s.segments.current, s.reserved_bytes.current);
  if (s.mlock_failures == 0)
    PP_ASSERT(s.locked_bytes == 3 * MiB, "locked %" PRIu64, s.locked_bytes);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* Every split adds a cut that no move removes: split 8 MiB in two (at a
 * point that moves every time) and gather it back, over and over, and the
 * 8 MiB segment's parts grow until
 * one piece no longer fits PP_PARTS_MAX; it is then released and the new
 * segment populated afresh (trimmed_segments counts it). The validator
 * checks the parts of every segment all along. */
static void test_parts_bounded(void **state) {
  (void)state;
  pinpool_t *pool = make("");
  void *a;
  make_idle(pool, (size_t[]){8 * MiB}, 1, &a);
  uint64_t trimmed = 0;
  for (int cycle = 0; cycle < 200 && trimmed == 0; cycle++) {
    /* 2, 2.5, 3, 3.5, 4 MiB: the rest (6 .. 4 MiB) is a class too */
    size_t cut = 2 * MiB + (size_t)(cycle % 5) * 512 * KiB;
    void *head = pp_alloc_touch(pool, cut); /* splits the 8 MiB one */
    PP_OK(pinpool_free(pool, head));
    void *whole = pp_alloc_touch(pool, 8 * MiB); /* gathers both back */
    PP_OK(pinpool_free(pool, whole));
    if (cycle % 10 == 0)
      PP_CHECK_CONSISTENT(pool);
    trimmed = pp_stats_of(pool).trimmed_segments;
  }
#ifdef PARTS_BOUND_4
  /* The variant built with PP_PARTS_MAX 4 (tests/CMakeLists.txt); 64, the
   * real bound, takes more cuts than 16 split points can make. */
  PP_ASSERT(trimmed > 0, "the parts never reached the bound");
#endif
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.reserved_bytes.current <= 16 * MiB, "reserved %" PRIu64,
            s.reserved_bytes.current);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* Less idle than asked: the one piece grows (only the rest populated). */
static void grow_case(const char *extra) {
  pinpool_t *pool = make(extra);
  void *a;
  make_idle(pool, (size_t[]){1 * MiB}, 1, &a);
  pinpool_stats_t s0 = pp_stats_of(pool);
  void *b = pp_alloc_touch(pool, 4 * MiB);
  pinpool_stats_t s1 = pp_stats_of(pool);
  PP_ASSERT(s1.remapped_segments == 1 &&
                s1.backend_alloc.count == s0.backend_alloc.count + 1 &&
                s1.reserved_bytes.current == 4 * MiB &&
                s1.segments.current == 1,
            "[%s] remapped %" PRIu64 " reserved %" PRIu64, extra,
            s1.remapped_segments, s1.reserved_bytes.current);
  if (s1.mlock_failures == 0 && strstr(extra, "mlock=1") != NULL)
    PP_ASSERT(s1.locked_bytes == 4 * MiB, "[%s] locked %" PRIu64, extra,
              s1.locked_bytes);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_grow(void **state) {
  (void)state;
  grow_case("");
  grow_case("mlock=1");
  grow_case("populate=0");
}

/* Locked memory stays locked through a split and a gather. */
static void test_locked(void **state) {
  (void)state;
  pinpool_t *pool = make("mlock=1");
  void *old[3];
  make_idle(pool, (size_t[]){6 * MiB, 1 * MiB, 1 * MiB}, 3, old);
  void *b = pp_alloc_touch(pool, 3 * MiB); /* split of the 6 MiB one */
  pinpool_stats_t s = pp_stats_of(pool);
  if (s.mlock_failures == 0)
    PP_ASSERT(s.locked_bytes == s.reserved_bytes.current,
              "locked %" PRIu64 " of %" PRIu64, s.locked_bytes,
              s.reserved_bytes.current);
  void *c = pp_alloc_touch(pool, 5 * MiB); /* 3 + 1 + 1 MiB, moved */
  s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 4, "remapped %" PRIu64, s.remapped_segments);
  if (s.mlock_failures == 0)
    PP_ASSERT(s.locked_bytes == s.reserved_bytes.current,
              "locked %" PRIu64 " of %" PRIu64, s.locked_bytes,
              s.reserved_bytes.current);
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, c));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* Where remapping is off or impossible, a miss maps new memory (and
 * borrowing serves every one-block class): 1 MiB is 24 classes below the
 * idle 8 MiB, beyond borrowing. */
static void no_remap_case(const char *extra, unsigned borrow) {
  pinpool_t *pool = make_plain(extra);
  void *a;
  make_idle(pool, (size_t[]){8 * MiB}, 1, &a);
  void *b = pp_alloc_touch(pool, 1 * MiB);
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 0 && s.segments.current == 2 &&
                s.reserved_bytes.current == 9 * MiB,
            "[%s] remapped %" PRIu64 " segments %" PRIu64, extra,
            s.remapped_segments, s.segments.current);
  char conf[1024];
  PP_OK(pinpool_get_config(pool, conf, sizeof conf, NULL));
  char want[32];
  snprintf(want, sizeof want, ",borrow=%u,", borrow);
  PP_ASSERT(strstr(conf, want) != NULL, "[%s] %s", extra, conf);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_off(void **state) {
  (void)state;
  no_remap_case("remap=0", 16);
  no_remap_case("hugepages=1", 16); /* on, but cannot */
  no_remap_case("backend=malloc", 16);
  no_remap_case("remap=0,borrow=0", 0);
  /* Remapping on, but below remap_min a split follows borrowing only. */
  no_remap_case("borrow=0", 0);
  pinpool_t *pool = make_plain("");
  char conf[1024];
  PP_OK(pinpool_get_config(pool, conf, sizeof conf, NULL));
  PP_ASSERT(strstr(conf, ",borrow=16,remap=1,remap_min=4194304,") != NULL, "%s",
            conf);
  pinpool_destroy(pool);
}

/* A grow needs room under max_reserved; a split or a move does not. */
static void test_max_reserved(void **state) {
  (void)state;
  pinpool_t *pool = make("max_reserved=4MiB");
  void *a;
  make_idle(pool, (size_t[]){3 * MiB}, 1, &a);
  void *b = pp_alloc_touch(pool, 4 * MiB); /* 3 -> 4 MiB: fits */
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.retries == 0 && s.remapped_segments == 1 &&
                s.reserved_bytes.current == 4 * MiB,
            "retries %" PRIu64 " reserved %" PRIu64, s.retries,
            s.reserved_bytes.current);
  PP_OK(pinpool_free(pool, b));
  void *c = NULL;
  PP_CHECK_RC(pinpool_alloc(pool, 5 * MiB, &c), PINPOOL_ENOMEM);
  PP_CHECK_CONSISTENT(pool);
  void *d = pp_alloc_touch(pool, 1 * MiB); /* still usable */
  PP_OK(pinpool_free(pool, d));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A failed remap gives the idle pieces back and maps new memory. */
static void fault_case(const char *fault) {
  pinpool_t *pool = make(fault);
  void *a;
  make_idle(pool, (size_t[]){1 * MiB}, 1, &a);
  void *b = pp_alloc_touch(pool, 4 * MiB);
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 0 && s.backend_free.count == 1 &&
                s.segments.current == 1 &&
                s.reserved_bytes.current == 4 * MiB && s.retries == 0 &&
                s.segments.freed == 1,
            "[%s] remapped %" PRIu64 " backend_free %" PRIu64
            " reserved %" PRIu64 " retries %" PRIu64,
            fault, s.remapped_segments, s.backend_free.count,
            s.reserved_bytes.current, s.retries);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_faults(void **state) {
  (void)state;
  fault_case("fault=alloc:2");    /* the remap itself */
  fault_case("fault=populate:2"); /* populating what it grows by */
}

/* Segments carved from the reserve are never remapped. */
static void test_reserve_kept(void **state) {
  (void)state;
  pinpool_t *pool = make("reserve=4MiB");
  void *a;
  make_idle(pool, (size_t[]){3 * MiB}, 1, &a);
  void *b = pp_alloc_touch(pool, 2 * MiB);
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 0, "remapped %" PRIu64, s.remapped_segments);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A pool that lives in its reserve: its segments are never remapped, so
 * from remap_min up borrowing still serves a miss (else: ENOMEM). */
static void test_reserve_borrows(void **state) {
  (void)state;
  pinpool_t *pool = make_plain("reserve=8MiB,max_reserved=8MiB");
  void *a;
  make_idle(pool, (size_t[]){5 * MiB}, 1, &a);
  void *b = pp_alloc_touch(pool, 4 * MiB + 512 * KiB); /* 3 MiB left: no fit */
  size_t bs = 0;
  PP_OK(pinpool_block_size(pool, b, &bs));
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(b == a && bs == 5 * MiB && s.borrowed_blocks == 1 &&
                s.remapped_segments == 0,
            "borrowed %" PRIu64 " block %zu", s.borrowed_blocks, bs);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* remap_min (4 MiB by default): a segment below it is never gathered
 * from smaller idle ones, borrowing serves it first, else a larger idle one
 * is split (not with borrow=0: test_off); from remap_min up a miss gathers
 * and never borrows. */
static void test_remap_min(void **state) {
  (void)state;
  pinpool_t *pool = make_plain(""); /* the defaults */
  void *a[2];
  make_idle(pool, (size_t[]){1 * MiB, 1 * MiB}, 2, a);
  void *b = pp_alloc_touch(pool, 2 * MiB); /* below: no gather, new memory */
  pinpool_stats_t s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 0 && s.segments.current == 3 &&
                s.reserved_bytes.current == 4 * MiB,
            "below: remapped %" PRIu64 " segments %" PRIu64,
            s.remapped_segments, s.segments.current);
  PP_OK(pinpool_free(pool, b));
  b = pp_alloc_touch(pool, 4 * MiB); /* at it: 2 + 1 + 1 MiB gathered */
  s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 3 && s.segments.current == 1 &&
                s.reserved_bytes.current == 4 * MiB && s.borrowed_blocks == 0,
            "at: remapped %" PRIu64 " segments %" PRIu64 " reserved %" PRIu64,
            s.remapped_segments, s.segments.current, s.reserved_bytes.current);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  /* 3.5 MiB: one class below the idle 4 MiB one, so borrowed whole */
  b = pp_alloc_touch(pool, 3 * MiB + 512 * KiB);
  size_t bs = 0;
  PP_OK(pinpool_block_size(pool, b, &bs));
  s = pp_stats_of(pool);
  PP_ASSERT(s.borrowed_blocks == 1 && s.remapped_segments == 3 && bs == 4 * MiB,
            "borrow: borrowed %" PRIu64 " block %zu", s.borrowed_blocks, bs);
  PP_OK(pinpool_free(pool, b));
  /* 512 KiB: 24 classes below, beyond borrow: the 4 MiB one is split */
  uint64_t calls = s.backend_alloc.count;
  b = pp_alloc_touch(pool, 512 * KiB);
  s = pp_stats_of(pool);
  PP_ASSERT(s.remapped_segments == 4 && s.segments.current == 2 &&
                s.reserved_bytes.current == 4 * MiB &&
                s.backend_alloc.count == calls,
            "split: remapped %" PRIu64 " segments %" PRIu64,
            s.remapped_segments, s.segments.current);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);

  /* From remap_min up a larger idle block is split, not borrowed. */
  pool = make_plain("");
  make_idle(pool, (size_t[]){5 * MiB}, 1, a);
  b = pp_alloc_touch(pool, 4 * MiB + 512 * KiB);
  PP_OK(pinpool_block_size(pool, b, &bs));
  s = pp_stats_of(pool);
  PP_ASSERT(s.borrowed_blocks == 0 && s.remapped_segments == 1 &&
                bs == 4 * MiB + 512 * KiB && s.segments.current == 2,
            "above: borrowed %" PRIu64 " remapped %" PRIu64 " block %zu",
            s.borrowed_blocks, s.remapped_segments, bs);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A drifting mix of large sizes: idle memory of classes no longer asked
 * for is reused, so the pool holds less than without remap: with the
 * defaults (segments from 4 MiB gathered, smaller ones split) and with
 * every one-block class gathering (usually less still, but not always: with
 * a bound of 4 parts, test_remap_parts4, more; so not asserted). */
static void test_drift(void **state) {
  (void)state;
  static const char *const confs[3] = {"remap=0", "", "remap_min=0"};
  uint64_t peak[3];
  for (int on = 0; on < 3; on++) {
    pinpool_t *pool = make_plain(confs[on]);
    uint64_t r = pp_seed(7);
    enum { LIVE = 8 };
    void *live[LIVE] = {NULL};
    for (int step = 0; step < 400; step++) {
      int k = (int)(pp_rand(&r) % LIVE);
      if (live[k] != NULL)
        PP_OK(pinpool_free(pool, live[k]));
      /* 300 KiB .. 8 MiB, log-uniform-ish */
      size_t n = (size_t)300 * KiB << (pp_rand(&r) % 5);
      n += pp_rand(&r) % n;
      live[k] = pp_alloc_touch(pool, n);
      if (step % 50 == 0)
        PP_CHECK_CONSISTENT(pool);
    }
    for (int k = 0; k < LIVE; k++)
      PP_OK(pinpool_free(pool, live[k]));
    PP_CHECK_CONSISTENT(pool);
    peak[on] = pp_stats_of(pool).reserved_bytes.peak;
    pinpool_destroy(pool);
  }
  print_message("drift: reserved peak %" PRIu64 " MiB without remap, %" PRIu64
                " MiB with the defaults, %" PRIu64 " MiB with remap_min=0\n",
                peak[0] >> 20, peak[1] >> 20, peak[2] >> 20);
  PP_ASSERT(peak[1] < peak[0] && peak[2] < peak[0],
            "reserved peaks %" PRIu64 " / %" PRIu64 " / %" PRIu64, peak[0],
            peak[1], peak[2]);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_split),
      cmocka_unit_test(test_split_leftover),
      cmocka_unit_test(test_gather),
      cmocka_unit_test(test_remap_min),
      cmocka_unit_test(test_reserve_borrows),
      cmocka_unit_test(test_grow),
      cmocka_unit_test(test_locked),
      cmocka_unit_test(test_off),
      cmocka_unit_test(test_max_reserved),
      cmocka_unit_test(test_faults),
      cmocka_unit_test(test_reserve_kept),
      cmocka_unit_test(test_drift),
      cmocka_unit_test(test_regather),
      cmocka_unit_test(test_parts_bounded),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
