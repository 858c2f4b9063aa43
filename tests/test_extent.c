/*
 * The extent allocator (src/extent.c) against a model: random takes and
 * gives over three chunks, the structure validated after every step
 * (bins, bitmap, boundary maps, full coalescing, counts); a take succeeds
 * exactly when some free extent is large enough; ranges never overlap and
 * stay inside their chunks; everything given back leaves one extent per
 * chunk. Memory is never touched: the chunks are address ranges.
 */
#include "testutil.h"

#include "internal.h"

#include <stdlib.h>

enum { G = 4096, NCH = 3, MAXLIVE = 400 };

typedef struct live {
  uintptr_t p;
  size_t n;
} live_t;

static int cmp_live(const void *a, const void *b) {
  const live_t *x = a, *y = b;
  return x->p < y->p ? -1 : x->p > y->p;
}

static void check(pp_extents_t *x, const char *when, int step) {
  char why[256] = "";
  PP_ASSERT(pp_ext_validate(x, why, sizeof why), "%s %d: %s", when, step, why);
}

static void test_extent_model(void **state) {
  (void)state;
  static const size_t chunk_size[NCH] = {64 * MiB, 4 * MiB, 160 * MiB};
  static const uintptr_t chunk_base[NCH] = {
      (uintptr_t)1 << 40, ((uintptr_t)1 << 40) + 64 * MiB, (uintptr_t)3 << 40};
  pp_extents_t x;
  pp_ext_init(&x, G);
  size_t total = 0;
  for (int c = 0; c < NCH; c++) {
    PP_OK(pp_ext_add_chunk(&x, (void *)chunk_base[c], chunk_size[c], 0));
    total += chunk_size[c];
  }
  check(&x, "init", 0);
  PP_ASSERT(x.nfree == NCH, "adjacent chunks are not merged");
  live_t *lv = calloc(MAXLIVE, sizeof *lv);
  size_t nlive = 0, held = 0;
  uint64_t rng = pp_seed(42);
  for (int step = 0; step < 20000; step++) {
    bool take = nlive == 0 || (nlive < MAXLIVE && pp_rand(&rng) % 100 < 55);
    if (take) {
      size_t n = (pp_rand_size(&rng, G, 24 * MiB) + G - 1) / G * G;
      size_t largest = pp_ext_largest(&x);
      void *p = pp_ext_take(&x, n, NULL);
      PP_ASSERT((p != NULL) == (largest >= n),
                "step %d: take of %zu -> %p with a largest extent of %zu", step,
                n, p, largest);
      if (p != NULL) {
        uintptr_t a = (uintptr_t)p;
        pp_xchunk_t *c = pp_ext_chunk_of(&x, p);
        PP_ASSERT(c != NULL && pp_ext_chunk_of(&x, (char *)p + n - 1) == c &&
                      a % G == 0,
                  "step %d: %p+%zu outside one chunk", step, p, n);
        lv[nlive++] = (live_t){a, n};
        held += n;
      }
    } else {
      size_t i = (size_t)(pp_rand(&rng) % nlive);
      pp_ext_give(&x, (void *)lv[i].p, lv[i].n);
      held -= lv[i].n;
      lv[i] = lv[--nlive];
    }
    PP_ASSERT(x.free_bytes + held == total, "step %d: %zu free + %zu held",
              step, x.free_bytes, held);
    if (step % 7 == 0 || step > 19900)
      check(&x, "step", step);
    if (step % 500 == 0 && nlive > 1) {
      qsort(lv, nlive, sizeof *lv, cmp_live);
      for (size_t i = 1; i < nlive; i++)
        PP_ASSERT(lv[i - 1].p + lv[i - 1].n <= lv[i].p,
                  "step %d: ranges overlap", step);
    }
  }
  while (nlive > 0) {
    pp_ext_give(&x, (void *)lv[nlive - 1].p, lv[nlive - 1].n);
    nlive--;
  }
  check(&x, "drained", 0);
  PP_ASSERT(x.nfree == NCH && x.free_bytes == total &&
                pp_ext_largest(&x) == 160 * MiB,
            "after giving everything back: %zu extents, %zu bytes", x.nfree,
            x.free_bytes);
  PP_ASSERT(x.nspare <= 4, "%zu spare nodes kept", x.nspare);
  free(lv);
  pp_ext_fini(&x);
}

/* Coalescing in every shape: with the left, the right, both, none. */
static void test_extent_merges(void **state) {
  (void)state;
  pp_extents_t x;
  pp_ext_init(&x, G);
  uintptr_t base = (uintptr_t)1 << 40;
  PP_OK(pp_ext_add_chunk(&x, (void *)base, 10 * G, 0));
  char *p[10];
  for (int i = 0; i < 10; i++) {
    p[i] = pp_ext_take(&x, G, NULL);
    PP_ASSERT(p[i] == (char *)base + (size_t)i * G, "low end first");
  }
  PP_ASSERT(pp_ext_take(&x, G, NULL) == NULL && x.nfree == 0, "full");
  pp_ext_give(&x, p[2], G); /* none */
  pp_ext_give(&x, p[4], G); /* none */
  PP_ASSERT(x.nfree == 2, "two islands");
  pp_ext_give(&x, p[3], G); /* both */
  PP_ASSERT(x.nfree == 1 && pp_ext_largest(&x) == 3 * G, "merged both");
  pp_ext_give(&x, p[5], G); /* left */
  pp_ext_give(&x, p[1], G); /* right */
  PP_ASSERT(x.nfree == 1 && pp_ext_largest(&x) == 5 * G, "merged 1..5");
  char why[256];
  PP_ASSERT(pp_ext_validate(&x, why, sizeof why), "%s", why);
  /* A take of 5 granules fits exactly; of 6 does not. */
  PP_ASSERT(pp_ext_take(&x, 6 * G, NULL) == NULL, "no 6-granule extent");
  PP_ASSERT(pp_ext_take(&x, 5 * G, NULL) == p[1], "exact fit");
  PP_ASSERT(pp_ext_take(&x, 3 * G, NULL) == NULL, "nothing left");
  PP_ASSERT(pp_ext_take(&x, 1000, NULL) == NULL, "not a granule multiple");
  pp_ext_fini(&x);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_extent_model),
      cmocka_unit_test(test_extent_merges),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
