/*
 * The extent allocator (src/extent.c) against a model: random takes and
 * gives over three chunks, the structure validated after every step
 * (bins, bitmap, boundary table, full coalescing, counts); a take succeeds
 * exactly when some free extent is large enough, from an extent of a best
 * fit's size class; ranges never overlap and stay inside their chunks;
 * everything given back leaves one extent per chunk. And the fit's bound
 * where the model rarely goes: a best fit behind more than eight smaller
 * extents of its bin. Memory is never touched: the chunks are address
 * ranges.
 */
#include "testutil.h"

#include "internal.h"

#include <stdio.h>
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

/* [a, a + n) lies in one run: one chunk, or (span) adjacent chunks 0 and 1,
 * which the model's layout puts side by side. */
static bool in_run(pp_extents_t *x, uintptr_t a, size_t n, bool span) {
  pp_xchunk_t *c0 = pp_ext_chunk_of(x, (void *)a);
  pp_xchunk_t *c1 = pp_ext_chunk_of(x, (void *)(a + n - 1));
  if (c0 == NULL || c1 == NULL)
    return false;
  if (c0 == c1)
    return true;
  uintptr_t b0, b1;
  size_t s0, s1;
  unsigned f0, f1;
  pp_ext_chunk_info(c0, &b0, &s0, &f0);
  pp_ext_chunk_info(c1, &b1, &s1, &f1);
  return span && b0 + s0 == b1 && f0 == f1;
}

/* The fit's bound (src/extent.c, "Fit"): the extent a take of n bytes
 * used (the free extent that started at p before it) is in the same size
 * class as a best fit's, the smallest free extent of at least n bytes. */
static void check_fit(const pp_range_t *f, size_t nf, size_t n, uintptr_t p,
                      int step) {
  size_t best = 0, used = 0;
  for (size_t i = 0; i < nf; i++) {
    if (f[i].size >= n && (best == 0 || f[i].size < best))
      best = f[i].size;
    if (f[i].base == p)
      used = f[i].size;
  }
  PP_ASSERT(used >= n && pp_class_index(used) == pp_class_index(best),
            "step %d: a take of %zu used an extent of %zu, a best fit is %zu",
            step, n, used, best);
}

/* span: chunks 0 and 1 are adjacent with the same flags, one run; every
 * so often the oldest free chunk is cut out of the extents (as the arena
 * gives it back to the backend) and added again. */
static void extent_model(bool span) {
  static const size_t chunk_size[NCH] = {64 * MiB, 4 * MiB, 160 * MiB};
  static const uintptr_t chunk_base[NCH] = {
      (uintptr_t)1 << 40, ((uintptr_t)1 << 40) + 64 * MiB, (uintptr_t)3 << 40};
  pp_extents_t x;
  pp_ext_init(&x, G, span);
  size_t total = 0;
  for (int c = 0; c < NCH; c++) {
    PP_OK(pp_ext_add_chunk(&x, (void *)chunk_base[c], chunk_size[c], 0));
    total += chunk_size[c];
  }
  check(&x, "init", 0);
  PP_ASSERT(x.nfree == (span ? NCH - 1u : NCH),
            "adjacent chunks merged: %d (span %d)", (int)x.nfree, (int)span);
  int removed = 0, crossed = 0;
  live_t *lv = calloc(MAXLIVE, sizeof *lv);
  size_t nlive = 0, held = 0;
  uint64_t rng = pp_seed(42);
  for (int step = 0; step < 20000; step++) {
    bool take = nlive == 0 || (nlive < MAXLIVE && pp_rand(&rng) % 100 < 55);
    if (take) {
      size_t n = (pp_rand_size(&rng, G, 24 * MiB) + G - 1) / G * G;
      size_t largest = pp_ext_largest(&x);
      pp_chunk_view_t *cv;
      pp_range_t *fv;
      size_t ncv, nfv;
      PP_OK(pp_ext_view(&x, &cv, &ncv, &fv, &nfv));
      /* One take in ten is page-moving growth's donor take: the low end
       * of the largest extent, at most n bytes. */
      bool donor = pp_rand(&rng) % 10 == 0;
      size_t got = 0;
      void *p = donor ? pp_ext_take_largest(&x, n, &got, NULL)
                      : pp_ext_take(&x, n, NULL);
      if (p != NULL && !donor)
        check_fit(fv, nfv, n, (uintptr_t)p, step);
      bool from_largest = false;
      for (size_t i = 0; donor && p != NULL && i < nfv; i++)
        from_largest |= fv[i].base == (uintptr_t)p && fv[i].size == largest;
      free(cv);
      free(fv);
      if (donor) {
        PP_ASSERT((p != NULL) == (largest > 0) &&
                      (p == NULL ||
                       (from_largest && got == (n < largest ? n : largest))),
                  "step %d: donor take of at most %zu -> %p, %zu bytes, with "
                  "a largest extent of %zu (its low end: %d)",
                  step, n, p, got, largest, (int)from_largest);
        n = got;
      } else {
        PP_ASSERT((p != NULL) == (largest >= n),
                  "step %d: take of %zu -> %p with a largest extent of %zu",
                  step, n, p, largest);
      }
      if (p != NULL) {
        uintptr_t a = (uintptr_t)p;
        PP_ASSERT(in_run(&x, a, n, span) && a % G == 0,
                  "step %d: %p+%zu outside one run", step, p, n);
        crossed +=
            pp_ext_chunk_of(&x, p) != pp_ext_chunk_of(&x, (char *)p + n - 1);
        lv[nlive++] = (live_t){a, n};
        held += n;
      }
    } else {
      size_t i = (size_t)(pp_rand(&rng) % nlive);
      pp_ext_give(&x, (void *)lv[i].p, lv[i].n);
      held -= lv[i].n;
      lv[i] = lv[--nlive];
    }
    if (step % 97 == 0) {
      /* The arena's release: a chunk wholly free goes, then comes back. */
      void *cb;
      size_t cs;
      unsigned cf;
      size_t fb = 0, nf = pp_ext_free_chunks(&x, 0, &fb);
      if (pp_ext_remove_free_chunk(&x, 0, &cb, &cs, &cf)) {
        removed++;
        check(&x, "removed", step);
        PP_ASSERT(nf >= 1 && fb >= cs && x.total_bytes == total - cs,
                  "step %d: removed %zu of %zu free chunk bytes", step, cs, fb);
        for (size_t i = 0; i < nlive; i++)
          PP_ASSERT(lv[i].p + lv[i].n <= (uintptr_t)cb ||
                        lv[i].p >= (uintptr_t)cb + cs,
                    "step %d: a removed chunk held a live range", step);
        PP_OK(pp_ext_add_chunk(&x, cb, cs, cf));
        check(&x, "added back", step);
      } else {
        PP_ASSERT(nf == 0, "step %d: %zu free chunks, none removed", step, nf);
      }
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
  PP_ASSERT(x.nfree == (span ? NCH - 1u : NCH) && x.free_bytes == total &&
                pp_ext_largest(&x) == 160 * MiB,
            "after giving everything back: %zu extents, %zu bytes", x.nfree,
            x.free_bytes);
  PP_ASSERT(x.nspare <= 64, "%zu spare nodes kept", x.nspare);
  /* Every chunk free: all of them go, the run cut apart. */
  void *cb;
  size_t cs;
  unsigned cf;
  int n = 0;
  while (pp_ext_remove_free_chunk(&x, 0, &cb, &cs, &cf)) {
    n++;
    check(&x, "emptied", n);
  }
  PP_ASSERT(n == NCH && x.nchunks == 0 && x.free_bytes == 0 && x.nfree == 0,
            "%d chunks removed, %zu left", n, x.nchunks);
  PP_ASSERT(removed > 0 && (!span || crossed > 0),
            "the model removed %d chunks, crossed a boundary %d times", removed,
            crossed);
  free(lv);
  pp_ext_fini(&x);
}

static void test_extent_model(void **state) {
  (void)state;
  extent_model(false);
}

static void test_extent_model_runs(void **state) {
  (void)state;
  extent_model(true);
}

/* The donor take (page-moving growth): the largest extent's low end, cut
 * to what is asked; never an extent of avoided flags (pageable fallback
 * memory is not moved into pinned memory), however large; NULL and
 * nothing changed when only such extents are free. */
static void test_extent_take_largest(void **state) {
  (void)state;
  pp_extents_t x;
  pp_ext_init(&x, G, false);
  x.avoid = 1;
  uintptr_t b = (uintptr_t)1 << 40;
  PP_OK(pp_ext_add_chunk(&x, (void *)b, 4 * G, 0));
  PP_OK(pp_ext_add_chunk(&x, (void *)(b + 8 * G), 6 * G, 0));
  PP_OK(pp_ext_add_chunk(&x, (void *)(b + 32 * G), 64 * G, 1)); /* avoided */
  size_t got = 0;
  unsigned f = 9;
  char *p = pp_ext_take_largest(&x, 4 * G, &got, &f);
  PP_ASSERT(p == (char *)b + 8 * G && got == 4 * G && f == 0,
            "the 6-granule extent's low 4: %p, %zu", (void *)p, got);
  char *q = pp_ext_take_largest(&x, 64 * G, &got, NULL);
  PP_ASSERT(q == (char *)b && got == 4 * G, "then the 4-granule one whole");
  char *r = pp_ext_take_largest(&x, 64 * G, &got, NULL);
  PP_ASSERT(r == (char *)b + 12 * G && got == 2 * G, "then the rest");
  check(&x, "taken", 0);
  size_t free0 = x.free_bytes, nfree0 = x.nfree;
  PP_ASSERT(pp_ext_take_largest(&x, 4 * G, &got, NULL) == NULL &&
                x.free_bytes == free0 && x.nfree == nfree0,
            "only avoided extents left: none taken");
  PP_ASSERT(pp_ext_take_largest(&x, G / 2, &got, NULL) == NULL,
            "not a granule multiple");
  pp_ext_give(&x, p, 4 * G);
  pp_ext_give(&x, q, 4 * G);
  pp_ext_give(&x, r, 2 * G);
  check(&x, "given back", 0);
  PP_ASSERT(x.nfree == 3 && x.free_bytes == 74 * G, "all free again");
  pp_ext_fini(&x);
}

/* Runs (span): a block may cross the boundary of adjacent chunks with the
 * same flags, never of chunks with other flags or a gap between them; a
 * chunk wholly free inside an extent is cut out of it, leaving both sides
 * free; the oldest free chunk goes first. */
static void test_extent_runs(void **state) {
  (void)state;
  pp_extents_t x;
  pp_ext_init(&x, G, true);
  uintptr_t b = (uintptr_t)1 << 40;
  PP_OK(pp_ext_add_chunk(&x, (void *)b, 4 * G, 0));
  PP_OK(pp_ext_add_chunk(&x, (void *)(b + 4 * G), 4 * G, 0));
  PP_OK(pp_ext_add_chunk(&x, (void *)(b + 8 * G), 4 * G, 1));  /* other flags */
  PP_OK(pp_ext_add_chunk(&x, (void *)(b + 16 * G), 4 * G, 0)); /* a gap */
  check(&x, "init", 0);
  PP_ASSERT(x.nfree == 3 && pp_ext_largest(&x) == 8 * G, "one run of two");
  unsigned f = 9;
  char *p = pp_ext_take(&x, 6 * G, &f);
  PP_ASSERT(p == (char *)b && f == 0, "6 granules across the boundary");
  PP_ASSERT(pp_ext_take(&x, 5 * G, NULL) == NULL, "no 5 across flags or gap");
  char *q = pp_ext_take(&x, 2 * G, NULL);
  PP_ASSERT(q == (char *)b + 6 * G, "the run's rest");
  pp_ext_give(&x, p, 6 * G);
  check(&x, "given", 1);
  PP_ASSERT(x.nfree == 3, "merged across the boundary");
  /* Chunk 0 wholly free, chunk 1 not: only chunk 0 (and the others) can
   * go; freeing q makes chunk 1 free, the newest. */
  size_t fb = 0;
  PP_ASSERT(pp_ext_free_chunks(&x, 0, &fb) == 3 && fb == 12 * G,
            "free chunks %zu", fb);
  pp_ext_give(&x, q, 2 * G);
  void *cb;
  size_t cs;
  unsigned cf;
  /* Oldest free first: chunks 2 and 3 (free since added), then 0, 1. */
  PP_ASSERT(pp_ext_remove_free_chunk(&x, 0, &cb, &cs, &cf) &&
                cb == (void *)(b + 8 * G) && cf == 1,
            "the oldest free chunk first: %p", cb);
  PP_ASSERT(pp_ext_remove_free_chunk(&x, 0, &cb, &cs, &cf) &&
                cb == (void *)(b + 16 * G),
            "then the next: %p", cb);
  /* Cut chunk 0 out of the run's one extent: chunk 1 stays free. */
  PP_ASSERT(pp_ext_remove_free_chunk(&x, 0, &cb, &cs, &cf) && cb == (void *)b &&
                cs == 4 * G,
            "chunk 0: %p", cb);
  check(&x, "cut", 2);
  PP_ASSERT(x.nfree == 1 && x.free_bytes == 4 * G &&
                pp_ext_take(&x, 4 * G, NULL) == (char *)b + 4 * G,
            "chunk 1 alone: %zu extents", x.nfree);
  pp_ext_fini(&x);
}

/* Coalescing in every shape: with the left, the right, both, none. */
static void test_extent_merges(void **state) {
  (void)state;
  pp_extents_t x;
  pp_ext_init(&x, G, false);
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

/* A best fit deep in the request's own bin, behind more than eight
 * smaller extents of that bin, and a far larger extent in another bin:
 * the take uses the fit (the fit looked at only eight extents of the own
 * bin before the larger bins, and carved a 1,152 KiB request from the
 * 53 MiB extent). */
static void test_extent_fit_deep(void **state) {
  (void)state;
  enum { SMALL = 9 };
  const size_t req = 1152 * KiB, small = 1028 * KiB;
  pp_extents_t x;
  pp_ext_init(&x, G, false);
  uintptr_t base = (uintptr_t)1 << 40;
  PP_OK(pp_ext_add_chunk(&x, (void *)base, 64 * MiB, 0));
  PP_ASSERT(pp_class_index(small) == pp_class_index(req),
            "one bin for both sizes");
  void *fit = pp_ext_take(&x, req, NULL);
  PP_ASSERT(pp_ext_take(&x, G, NULL) != NULL, "separator");
  void *s[SMALL];
  for (int i = 0; i < SMALL; i++) {
    s[i] = pp_ext_take(&x, small, NULL);
    PP_ASSERT(s[i] != NULL && pp_ext_take(&x, G, NULL) != NULL, "small %d", i);
  }
  /* The fit first: the smaller ones are pushed ahead of it in the bin. */
  pp_ext_give(&x, fit, req);
  for (int i = 0; i < SMALL; i++)
    pp_ext_give(&x, s[i], small);
  size_t largest = pp_ext_largest(&x);
  PP_ASSERT(largest > 32 * MiB, "a large extent remains: %zu", largest);
  void *got = pp_ext_take(&x, req, NULL);
  PP_ASSERT(got == fit, "the best fit %p was passed over for %p", fit, got);
  PP_ASSERT(pp_ext_largest(&x) == largest, "the large extent was cut");
  /* Now no extent of the bin fits: the scan fails, the bound becomes
   * exact, and the next take goes straight to the larger bin. */
  void *big = pp_ext_take(&x, req, NULL);
  PP_ASSERT(big != NULL && pp_ext_largest(&x) == largest - req,
            "the larger extent serves the next one");
  check(&x, "deep fit", 0);
  pp_ext_fini(&x);
}

/* The boundary table (an open-addressing hash of extent ends) at scale:
 * 8,192 islands make it grow several times and collide; giving the gaps
 * back in a scattered order deletes two keys and merges at every step,
 * which exercises the shift-back deletion in every cluster shape. Lookups
 * after a wrong deletion miss an extent's end: the validator's table check
 * and the merges (one extent at the end) both fail then. */
static void test_extent_table(void **state) {
  (void)state;
  enum { N = 16384 };
  pp_extents_t x;
  pp_ext_init(&x, G, true);
  uintptr_t base = (uintptr_t)1 << 40;
  PP_OK(pp_ext_add_chunk(&x, (void *)base, (size_t)N * G, 0));
  for (size_t i = 0; i < N; i++)
    PP_ASSERT(pp_ext_take(&x, G, NULL) == (char *)(base + i * G), "take %zu",
              i);
  for (size_t i = 0; i < N; i += 2)
    pp_ext_give(&x, (void *)(base + i * G), G);
  PP_ASSERT(x.nfree == N / 2, "%zu islands", x.nfree);
  check(&x, "islands", 0);
  /* The odd granules, in a scattered order (a stride coprime to N / 2). */
  for (size_t k = 0; k < N / 2; k++) {
    size_t i = 2 * ((k * 1237) % (N / 2)) + 1;
    pp_ext_give(&x, (void *)(base + i * G), G);
    if (k % 1024 == 0)
      check(&x, "gaps", (int)k);
  }
  check(&x, "all given back", 0);
  PP_ASSERT(x.nfree == 1 && pp_ext_largest(&x) == (size_t)N * G &&
                x.tcount == 2,
            "one extent: %zu, %zu keys", x.nfree, x.tcount);
  pp_ext_fini(&x);
}

/* ---- Work that stays flat as the extents grow (issue 38) -----------------
 * Counted with the meter (x.work: the elements a call visits), at N and
 * 10 N free extents, built the same way each time. A mutant that restores
 * a walk fails its test (tests/CMakeLists.txt): EXT_BIN_WALK fit_scale,
 * EXT_LARGEST_WALK largest_scale, EXT_CHUNK_WALK chunk_scale. */

static const size_t scale_n[2] = {1000, 10000};

/* A call's work at most logarithmic in n: a few descents of a tree of n
 * nodes (AVL: at most 1.44 log2 n deep) and the chunk table's upkeep. */
static uint64_t log_bound(size_t n, size_t chunks) {
  size_t lg = 0;
  while (((size_t)1 << lg) < n + 2)
    lg++;
  return 8 * (uint64_t)lg + 2 * chunks + 32;
}

static void check_growth(const char *what, const uint64_t w[2], size_t chunks) {
  printf("%s: %llu elements at %zu free extents, %llu at %zu\n", what,
         (unsigned long long)w[0], scale_n[0], (unsigned long long)w[1],
         scale_n[1]);
  for (int i = 0; i < 2; i++)
    PP_ASSERT(w[i] <= log_bound(scale_n[i], chunks),
              "%s visited %llu elements at %zu free extents: more than "
              "logarithmic (%llu)",
              what, (unsigned long long)w[i], scale_n[i],
              (unsigned long long)log_bound(scale_n[i], chunks));
  PP_ASSERT(w[1] <= 2 * w[0] + 32,
            "%s: %llu elements at 10x the free extents, %llu before", what,
            (unsigned long long)w[1], (unsigned long long)w[0]);
}

/* n free extents of `small` bytes in one chunk at base, each followed by
 * a granule in use; then one of `big` (given back first), and the rest
 * of the chunk (`tail` bytes) free. Returns the big one's address. */
static uintptr_t islands(pp_extents_t *x, uintptr_t base, size_t n,
                         size_t small, size_t big, size_t tail) {
  size_t total = n * (small + G) + big + G + tail;
  PP_OK(pp_ext_add_chunk(x, (void *)base, total, 0));
  for (size_t i = 0; i < n; i++) {
    PP_ASSERT(pp_ext_take(x, small, NULL) == (void *)(base + i * (small + G)),
              "island %zu", i);
    PP_ASSERT(pp_ext_take(x, G, NULL) != NULL, "separator %zu", i);
  }
  uintptr_t b = (uintptr_t)pp_ext_take(x, big, NULL);
  PP_ASSERT(b != 0 && pp_ext_take(x, G, NULL) != NULL, "the big one");
  pp_ext_give(x, (void *)b, big); /* first: deepest in a list */
  for (size_t i = 0; i < n; i++)
    pp_ext_give(x, (void *)(base + i * (small + G)), small);
  return b;
}

/* Item 4: a bin of n extents too small for a request of its class and
 * one that fits; the alloc A, alloc B, free A, free B cycle. The list was
 * walked first-fit to its end for A, and again for B once A had taken
 * the bin's largest (9.5x per 10x n); the tree finds the fit or its
 * absence in O(log n). The fit stays a best fit (check_fit). */
static void test_extent_fit_scale(void **state) {
  (void)state;
  const size_t small = MiB + G, big = MiB + 16 * G; /* one class */
  PP_ASSERT(pp_class_index(small) == pp_class_index(big), "one bin");
  uint64_t w[2];
  for (int i = 0; i < 2; i++) {
    pp_extents_t x;
    pp_ext_init(&x, G, false);
    uintptr_t b =
        islands(&x, (uintptr_t)1 << 44, scale_n[i], small, big, 64 * MiB);
    check(&x, "islands", i);
    uint64_t most = 0;
    for (int r = 0; r < 8; r++) {
      uint64_t w0 = x.work;
      void *a = pp_ext_take(&x, big, NULL);
      most = x.work - w0 > most ? x.work - w0 : most;
      PP_ASSERT(a == (void *)b, "round %d: the fit %p, not %p", r, (void *)b,
                a);
      w0 = x.work;
      void *c = pp_ext_take(&x, big, NULL); /* from the tail: none fits */
      most = x.work - w0 > most ? x.work - w0 : most;
      PP_ASSERT(c != NULL && (uintptr_t)c > b, "round %d: B from the tail", r);
      w0 = x.work;
      pp_ext_give(&x, a, big);
      pp_ext_give(&x, c, big);
      most = x.work - w0 > most ? x.work - w0 : most;
    }
    check(&x, "cycled", i);
    w[i] = most;
    pp_ext_fini(&x);
  }
  check_growth("the fit (alloc A, alloc B, free A, free B)", w, 1);
}

/* Item 5: the largest free extent with n extents in the top bin: the
 * bin's list was walked (10x per 10x n, under seg_lock in get_stats). */
static void test_extent_largest_scale(void **state) {
  (void)state;
  uint64_t w[2];
  for (int i = 0; i < 2; i++) {
    pp_extents_t x;
    pp_ext_init(&x, G, false);
    /* n of 2 MiB + 1 granule and one of 2 MiB + 2: all in one bin, the
     * top one. */
    uintptr_t b = islands(&x, (uintptr_t)1 << 44, scale_n[i], 2 * MiB + G,
                          2 * MiB + 2 * G, 0);
    (void)b;
    uint64_t w0 = x.work;
    size_t largest = pp_ext_largest(&x);
    w[i] = x.work - w0;
    PP_ASSERT(largest == 2 * MiB + 2 * G, "largest %zu", largest);
    pp_ext_fini(&x);
  }
  check_growth("the largest free extent", w, 1);
}

/* Item 2 (and 3): n free extents in one chunk, and two chunks wholly free
 * beside it: finding that the oldest goes, that the next goes, that none
 * is left, and counting them walked every free extent (616 us per free
 * with max_cached, at 30,000 extents). */
static void test_extent_chunk_scale(void **state) {
  (void)state;
  uint64_t w[2];
  for (int i = 0; i < 2; i++) {
    pp_extents_t x;
    pp_ext_init(&x, G, true);
    uintptr_t base = (uintptr_t)1 << 44;
    (void)islands(&x, base, scale_n[i], 2 * G, 3 * G, 0);
    PP_OK(pp_ext_add_chunk(&x, (void *)(base - 8 * MiB), 4 * MiB, 0));
    PP_OK(pp_ext_add_chunk(&x, (void *)(base + ((uintptr_t)1 << 40)), 4 * MiB,
                           0));
    check(&x, "chunks", i);
    uint64_t w0 = x.work, most = 0;
    size_t bytes;
    PP_ASSERT(pp_ext_free_chunks(&x, 0, &bytes) == 2 && bytes == 8 * MiB,
              "two free chunks");
    most = x.work - w0;
    void *cb;
    size_t cs;
    unsigned cf;
    for (int k = 0; k < 3; k++) {
      w0 = x.work;
      bool ok = pp_ext_remove_free_chunk(&x, 0, &cb, &cs, &cf);
      most = x.work - w0 > most ? x.work - w0 : most;
      PP_ASSERT(ok == (k < 2) && (!ok || cs == 4 * MiB), "release %d", k);
      PP_ASSERT(!ok || cb == (void *)(k == 0 ? base - 8 * MiB
                                             : base + ((uintptr_t)1 << 40)),
                "release %d: the oldest first, not %p", k, cb);
    }
    check(&x, "released", i);
    w[i] = most;
    pp_ext_fini(&x);
  }
  check_growth("the release of a free chunk", w, 3);
}

int main(int argc, char **argv) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test(test_extent_table),
      cmocka_unit_test(test_extent_model),
      cmocka_unit_test(test_extent_model_runs),
      cmocka_unit_test(test_extent_take_largest),
      cmocka_unit_test(test_extent_runs),
      cmocka_unit_test(test_extent_merges),
      cmocka_unit_test(test_extent_fit_deep),
      cmocka_unit_test(test_extent_fit_scale),
      cmocka_unit_test(test_extent_largest_scale),
      cmocka_unit_test(test_extent_chunk_scale),
  };
  return pp_run_selected("test_extent", all, sizeof all / sizeof all[0], argc,
                         argv);
}
