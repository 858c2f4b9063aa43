/* Issue 37, the cliff: W2's loop (one thread, log-uniform sizes, random
 * live blocks freed until the next fits the cap) on a pinpool, printing
 * the arena's own statistics before every allocation that grew it: the
 * request, the chunk it grew by, the chunks, free bytes, free extents and
 * largest free extent before the miss, and the bytes idle in caches (which
 * the miss gives back before it grows). Public API only.
 *
 *   cc -O2 -I include -o w2_probe w2_probe.c -L BUILD -lpinpool -lm
 *   ./w2_probe CAP_MiB LO_KiB HI_MiB STEADY SEED [CONFIG [VERBOSE]]
 *   VERBOSE 0: the summary line only; 1: growths after the fill; 2: all.
 * CONFIG defaults to populate=0,mlock=0,hugepages=0: the arena's placement
 * does not depend on it, and nothing is touched (a 4 GiB live set costs no
 * memory). Results: docs/allocation-policy.md, "The cliff (issue 37)". */
#include "pinpool.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "w2seq.h"
int main(int argc, char **argv) {
  size_t cap = (size_t)atof(argv[1]) * 1048576,
         lo = (size_t)atof(argv[2]) * 1024,
         hi = (size_t)atof(argv[3]) * 1048576;
  int steady = atoi(argv[4]);
  st = 0x5eed0002u ^ (uint64_t)atoi(argv[5]) * 0x9E3779B97F4A7C15ull;
  if (!st)
    st = 1;
  const char *cfg = argc > 6 ? argv[6] : "populate=0,mlock=0,hugepages=0";
  int verbose = argc > 7 ? atoi(argv[7]) : 1;
  pinpool_t *pool;
  if (pinpool_create(cfg, &pool)) {
    fprintf(stderr, "create\n");
    return 1;
  }
  size_t maxlive = cap / lo + 2;
  void **p = malloc(maxlive * 8);
  size_t *sz = malloc(maxlive * 8);
  size_t n = 0, bytes = 0;
  long fill = -1, ns = 0;
  pinpool_stats_t a, b;
  pinpool_get_stats(pool, &a);
  uint64_t resfill = 0;
  int gsteady = 0;
  uint64_t grew_steady = 0;
  for (long i = 0;; i++) {
    size_t s = logu(lo, hi);
    if (fill < 0 && bytes + s > cap && n > 0) {
      fill = i;
      pinpool_get_stats(pool, &a);
      resfill = a.reserved_bytes.current;
      if (verbose)
        printf("FILL END op %ld: reserved %.1f MiB chunks %lu free %.1f ext "
               "%lu largest %.1f live %.1f\n",
               i, a.reserved_bytes.current / 1048576.0, a.arena_chunks,
               a.chunk_free_bytes / 1048576.0, a.free_extents,
               a.largest_free_extent / 1048576.0, bytes / 1048576.0);
    }
    if (fill >= 0 && ns == steady)
      break;
    while (bytes + s > cap && n > 0) {
      size_t k = (size_t)(unit() * n);
      pinpool_free(pool, p[k]);
      bytes -= sz[k];
      p[k] = p[--n];
      sz[k] = sz[n];
    }
    pinpool_get_stats(pool, &a);
    if (pinpool_alloc(pool, s, &p[n])) {
      fprintf(stderr, "alloc fail\n");
      return 1;
    }
    sz[n++] = s;
    bytes += s;
    if (fill >= 0)
      ns++;
    pinpool_get_stats(pool, &b);
    if (b.backend_alloc.count != a.backend_alloc.count) {
      if (fill >= 0) {
        gsteady++;
        grew_steady += b.reserved_bytes.current - a.reserved_bytes.current;
      }
      if (verbose > 1 || (verbose && fill >= 0))
        printf("GROW op %ld %s req %.2f MiB chunk +%.1f MiB -> %.1f | before: "
               "chunks %lu chunkfree %.1f ext %lu largest %.2f "
               "cached-chunkfree %.1f live %.1f\n",
               i, fill >= 0 ? "steady" : "fill", s / 1048576.0,
               (b.reserved_bytes.current - a.reserved_bytes.current) /
                   1048576.0,
               b.reserved_bytes.current / 1048576.0, a.arena_chunks,
               a.chunk_free_bytes / 1048576.0, a.free_extents,
               a.largest_free_extent / 1048576.0,
               (a.cached_bytes.current - a.chunk_free_bytes) / 1048576.0,
               (bytes - s) / 1048576.0);
    }
  }
  pinpool_get_stats(pool, &b);
  printf("END fill=%ld res_fill %.1f res_end %.1f peak %.1f reqpeak %.1f "
         "held/req %.3f steady_growths %d (+%.1f MiB) chunks %lu free %.1f ext "
         "%lu largest %.1f\n",
         fill, resfill / 1048576.0, b.reserved_bytes.current / 1048576.0,
         b.reserved_bytes.peak / 1048576.0, b.requested_bytes.peak / 1048576.0,
         (double)b.reserved_bytes.peak / b.requested_bytes.peak, gsteady,
         grew_steady / 1048576.0, b.arena_chunks,
         b.chunk_free_bytes / 1048576.0, b.free_extents,
         b.largest_free_extent / 1048576.0);
  return 0;
}
