/* Size classes: the documented formula, monotonicity, the 12.5% spacing bound
 * over every class up to 2^40, limits (0, 2^60, SIZE_MAX) and the alignment
 * and non-overlap of returned blocks. */
#define _GNU_SOURCE
#include "testutil.h"

#include <stdlib.h>

/* The largest class (include/pinpool.h: "size beyond the largest class,
 * 2^60 bytes"). */
#define MAXCLASS ((size_t)1 << 60)

static size_t klass(size_t s) {
  size_t out = 0;
  int rc = pinpool_size_class(s, &out);
  if (rc != 0) {
    print_error("ERROR: pinpool_size_class(%zu) returned %d (%s): %s\n", s, rc,
                pp_code_name(rc), pinpool_last_error());
    _fail(__FILE__, __LINE__);
  }
  return out;
}

static void test_small_sizes_round_to_512(void **state) {
  (void)state;
  for (size_t s = 1; s <= 512; s++)
    PP_ASSERT(klass(s) == 512, "class(%zu) = %zu, want 512", s, klass(s));
  PP_ASSERT(klass(513) == 576, "class(513) = %zu, want 576", klass(513));
  PP_ASSERT(klass(1024) == 1024, "class(1024) = %zu", klass(1024));
  PP_ASSERT(klass(1025) == 1152, "class(1025) = %zu", klass(1025));
  PP_ASSERT(klass(4097) == 4608, "class(4097) = %zu", klass(4097));
  PP_ASSERT(klass(256 * KiB + 1) == 288 * KiB, "class(256KiB+1) = %zu",
            klass(256 * KiB + 1));
  PP_ASSERT(klass(8 * MiB) == 8 * MiB, "class(8MiB) = %zu", klass(8 * MiB));
}

/* Every size from 1 to 300000 matches the formula exactly. */
static void test_formula_dense(void **state) {
  (void)state;
  for (size_t s = 1; s <= 300000; s++) {
    size_t c = klass(s);
    size_t want = pp_ref_class(s);
    if (c != want)
      PP_FAIL("class(%zu) = %zu, want %zu", s, c, want);
  }
}

static void check_formula_at(size_t s) {
  size_t got = klass(s);
  size_t want = pp_ref_class(s);
  if (got != want)
    PP_FAIL("class(%zu) = %zu, want %zu", s, got, want);
  if (got < s)
    PP_FAIL("class(%zu) = %zu < size", s, got);
  if (s >= 512 && got - s >= s / 8 + 1)
    PP_FAIL("class(%zu) = %zu wastes %zu >= s/8+1", s, got, got - s);
}

/* Around every class boundary in [lo_e, hi_e] exponents (sizes <= max),
 * and at random sizes in [lo, max]. */
static void check_formula_range(int lo_e, int hi_e, size_t lo, size_t max,
                                uint64_t seed) {
  for (int e = lo_e; e <= hi_e; e++) {
    for (size_t k = 0; k < 8; k++) {
      size_t c = ((size_t)1 << e) + k * ((size_t)1 << (e - 3));
      size_t probes[3] = {c - 1, c, c + 1};
      for (int i = 0; i < 3; i++)
        if (probes[i] >= lo && probes[i] <= max && probes[i] != 0)
          check_formula_at(probes[i]);
    }
  }
  uint64_t rs = pp_seed(seed);
  for (int i = 0; i < 100000; i++)
    check_formula_at(pp_rand_size(&rs, lo, max));
}

/* Around every class boundary up to 2^59, and at random sizes. */
static void test_formula_boundaries_and_random(void **state) {
  (void)state;
  check_formula_range(9, 59, 1, (size_t)1 << 59, 42);
}

/* The top of the range: every class up to the largest, 2^60. */
static void test_formula_top_range(void **state) {
  (void)state;
  check_formula_range(59, 60, ((size_t)1 << 59) + 1, MAXCLASS, 43);
}

/* class() is monotone, idempotent on classes, and consecutive classes are at
 * most 12.5% apart: walk every class from 512 to 2^40. */
static void test_spacing_up_to_2_40(void **state) {
  (void)state;
  size_t c = klass(1);
  PP_ASSERT(c == 512, "smallest class %zu", c);
  size_t n = 0;
  while (c < ((size_t)1 << 40)) {
    PP_ASSERT(klass(c) == c, "class(%zu) = %zu: a class must map to itself", c,
              klass(c));
    PP_ASSERT(klass(c - 1) <= c, "class(%zu) = %zu > class(%zu) = %zu", c - 1,
              klass(c - 1), c, c);
    size_t next = klass(c + 1);
    PP_ASSERT(next > c, "class(%zu+1) = %zu not above %zu", c, next, c);
    PP_ASSERT((next - c) * 8 <= c,
              "classes %zu and %zu are more than 12.5%% apart", c, next);
    /* Monotone in between: the midpoint maps to next. */
    size_t mid = c + (next - c) / 2;
    PP_ASSERT(klass(mid) == next, "class(%zu) = %zu, want %zu", mid, klass(mid),
              next);
    c = next;
    n++;
  }
  PP_ASSERT(c == ((size_t)1 << 40), "walk ended at %zu", c);
  /* 8 classes per doubling from 2^9 to 2^40: 31 * 8 steps. */
  PP_ASSERT(n == 31 * 8, "%zu classes between 512 and 2^40, want %d", n,
            31 * 8);
}

static void test_monotone_random_pairs(void **state) {
  (void)state;
  uint64_t rs = pp_seed(7);
  for (int i = 0; i < 100000; i++) {
    size_t a = pp_rand_size(&rs, 1, (size_t)1 << 45);
    size_t b = pp_rand_size(&rs, 1, (size_t)1 << 45);
    if (a > b) {
      size_t t = a;
      a = b;
      b = t;
    }
    if (klass(a) > klass(b))
      PP_FAIL("not monotone: class(%zu) = %zu > class(%zu) = %zu", a, klass(a),
              b, klass(b));
  }
}

static void test_limits_and_errors(void **state) {
  (void)state;
  size_t out = 12345;
  PP_CHECK_RC(pinpool_size_class(0, &out), PINPOOL_EZEROSIZE);
  PP_ASSERT(out == 12345, "out changed to %zu on error", out);
  PP_CHECK_RC(pinpool_size_class(SIZE_MAX, &out), PINPOOL_EOVERFLOW);
  PP_CHECK_RC(pinpool_size_class(SIZE_MAX - 100, &out), PINPOOL_EOVERFLOW);
  PP_CHECK_RC(pinpool_size_class(MAXCLASS + 1, &out), PINPOOL_EOVERFLOW);
  PP_CHECK_RC(pinpool_size_class(MAXCLASS + MAXCLASS / 8, &out),
              PINPOOL_EOVERFLOW);
  PP_CHECK_RC(pinpool_size_class((size_t)1 << 62, &out), PINPOOL_EOVERFLOW);
  PP_CHECK_RC(pinpool_size_class((size_t)1 << 63, &out), PINPOOL_EOVERFLOW);
  PP_ASSERT(out == 12345, "out changed to %zu on error", out);
  PP_CHECK_RC(pinpool_size_class(16, NULL), PINPOOL_EINVAL);
}

static void test_largest_class(void **state) {
  (void)state;
  size_t out = 0;
  /* The largest class is 2^60 itself. */
  PP_OK(pinpool_size_class(MAXCLASS, &out));
  PP_ASSERT(out == MAXCLASS, "class(2^60) = %zu", out);
  PP_OK(pinpool_size_class(MAXCLASS - 1, &out));
  PP_ASSERT(out == MAXCLASS, "class(2^60-1) = %zu", out);
  PP_OK(pinpool_size_class((MAXCLASS / 8) * 7 + 1, &out));
  PP_ASSERT(out == (MAXCLASS / 16) * 15, "class(7*2^57+1) = %zu", out);
  PP_OK(pinpool_size_class(MAXCLASS / 2 + 1, &out));
  PP_ASSERT(out == MAXCLASS / 2 + MAXCLASS / 16, "class(2^59+1) = %zu", out);
}

struct blk {
  uintptr_t p;
  size_t cls; /* the block's size */
  size_t size;
  unsigned char fill;
};

static int blk_cmp(const void *a, const void *b) {
  const struct blk *x = a, *y = b;
  return x->p < y->p ? -1 : x->p > y->p;
}

static void check_alignment_with(const char *conf) {
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(conf, &pool));
  static const size_t sizes[] = {
      1,      63,     64,     65,     100,     511,     512,         513,
      1000,   2048,   3000,   4000,   4095,    4096,    4097,        4608,
      5000,   8191,   12345,  12000,  20000,   24000,   40000,       65536,
      100000, 262144, 262145, 300000, MiB + 1, 2 * MiB, 3 * MiB + 5, 4 * MiB};
  enum { NS = sizeof sizes / sizeof sizes[0], REP = 24 };
  struct blk blocks[NS * REP];
  size_t n = 0;
  for (int r = 0; r < REP; r++) {
    for (size_t i = 0; i < NS; i++) {
      size_t s = sizes[i];
      if (s >= MiB && r >= 3)
        continue; /* a few large ones suffice */
      void *p = NULL;
      PP_OK(pinpool_alloc(pool, s, &p));
      /* The block: the request's class up to 256 KiB, above it the request
       * rounded up to a page (carved from the arena at that size). */
      size_t cls = pp_ref_class(s);
      size_t want = pp_ref_block(s);
      if (s == 256 * KiB + 1) /* 65 pages, not its class (288 KiB) */
        PP_ASSERT(want == 266240 && cls == 294912, "pp_ref_block(%zu) = %zu", s,
                  want);
      size_t bs = 0;
      PP_OK(pinpool_block_size(pool, p, &bs));
      PP_ASSERT(bs == want, "block_size of a %zu-byte request = %zu, want %zu",
                s, bs, want);
      PP_ASSERT(bs >= s && bs <= cls,
                "block_size %zu of a %zu-byte request: below the request or "
                "above its class %zu",
                bs, s, cls);
      PP_ASSERT((uintptr_t)p % 64 == 0, "block %p of %zu bytes not 64-aligned",
                p, s);
      /* include/pinpool.h: a block whose size class is a multiple of 4096
       * is 4096-byte aligned (every class above 256 KiB is, and so is every
       * large block's page-rounded size). */
      if (cls % 4096 == 0 || bs % 4096 == 0)
        PP_ASSERT((uintptr_t)p % 4096 == 0,
                  "block %p of class %zu (block %zu) not 4096-aligned", p, cls,
                  bs);
      /* The whole block is usable. */
      memset(p, (int)(n & 0xff), bs);
      blocks[n].p = (uintptr_t)p;
      blocks[n].cls = bs;
      blocks[n].size = s;
      blocks[n].fill = (unsigned char)(n & 0xff);
      n++;
    }
  }
  /* No two blocks overlap, and the fill of each is intact. */
  qsort(blocks, n, sizeof blocks[0], blk_cmp);
  for (size_t i = 0; i + 1 < n; i++)
    PP_ASSERT(blocks[i].p + blocks[i].cls <= blocks[i + 1].p,
              "blocks %#lx (+%zu) and %#lx overlap", (unsigned long)blocks[i].p,
              blocks[i].cls, (unsigned long)blocks[i + 1].p);
  for (size_t i = 0; i < n; i++) {
    const unsigned char *b = (const unsigned char *)blocks[i].p;
    PP_ASSERT(b[0] == blocks[i].fill && b[blocks[i].cls - 1] == blocks[i].fill,
              "block %p (%zu bytes): fill changed", (const void *)b,
              blocks[i].cls);
  }
  PP_CHECK_CONSISTENT(pool);
  for (size_t i = 0; i < n; i++)
    PP_OK(pinpool_free(pool, (void *)blocks[i].p));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_alignment_default(void **state) {
  (void)state;
  check_alignment_with("");
}

static void test_alignment_malloc_backend(void **state) {
  (void)state;
  check_alignment_with("backend=malloc");
}

static void test_alignment_no_tcache(void **state) {
  (void)state;
  check_alignment_with("tcache_bytes=0,shards=1");
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_small_sizes_round_to_512),
      cmocka_unit_test(test_formula_dense),
      cmocka_unit_test(test_formula_boundaries_and_random),
      cmocka_unit_test(test_formula_top_range),
      cmocka_unit_test(test_spacing_up_to_2_40),
      cmocka_unit_test(test_monotone_random_pairs),
      cmocka_unit_test(test_limits_and_errors),
      cmocka_unit_test(test_largest_class),
      cmocka_unit_test(test_alignment_default),
      cmocka_unit_test(test_alignment_malloc_backend),
      cmocka_unit_test(test_alignment_no_tcache),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
