/* Issue 37, the cliff: W2's placement problem alone (no chunks, slabs,
 * caches or threads), to tell what any non-moving fit can reach.
 *
 * One address range; a block is carved from its free extents (page
 * granule) and never moves; when nothing fits, the range grows at its top
 * by the shortfall (merged with a free top extent), or by pinpool's eighth
 * (growth mode 1). W2's sequence: log-uniform sizes in [lo, hi], random
 * live blocks freed until the next fits the cap; the fill ends at the first
 * operation that needs a free, then `steady` operations. Prints the range's
 * size over the cap at the fill's end and at the run's end (the held memory
 * a perfect non-moving allocator with that fit would need).
 *
 *   cc -O2 -o placement_sim placement_sim.c -lm
 *   ./placement_sim CAP_MiB LO_KiB HI_MiB STEADY FIT SPLIT_MiB SEEDS [GROWTH]
 *   FIT 0 best fit (ties: lowest address), 1 address-ordered first fit,
 *       2 best fit with blocks >= 4 MiB carved from the extent's high end;
 *   SPLIT_MiB > 0: blocks >= SPLIT in a second range of their own;
 *   GROWTH 0 the shortfall, 1 an eighth (pinpool), 2 the shortfall
 *       rounded up to 2 MiB.
 * Results: docs/allocation-policy.md, "The cliff (issue 37)". */
// placement sim: free extents in address order (array), region grows at top by
// shortfall
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "w2seq.h"
typedef struct {
  size_t a, n;
} ext;
typedef struct {
  ext f[100000];
  int nf;
  size_t top;
} region;
/* A page multiple: the sim's granule. */
static size_t logu_page(size_t lo, size_t hi) {
  return (logu(lo, hi) + 4095) & ~4095ul;
}
static int pol, gm;
static void give(region *r, size_t a, size_t n) {
  int i = 0;
  while (i < r->nf && r->f[i].a < a)
    i++;
  int ml = i > 0 && r->f[i - 1].a + r->f[i - 1].n == a;
  int mr = i < r->nf && a + n == r->f[i].a;
  if (ml && mr) {
    r->f[i - 1].n += n + r->f[i].n;
    memmove(&r->f[i], &r->f[i + 1], (r->nf - i - 1) * sizeof(ext));
    r->nf--;
  } else if (ml)
    r->f[i - 1].n += n;
  else if (mr) {
    r->f[i].a = a;
    r->f[i].n += n;
  } else {
    memmove(&r->f[i + 1], &r->f[i], (r->nf - i) * sizeof(ext));
    r->f[i] = (ext){a, n};
    r->nf++;
  }
}
static size_t take(region *r, size_t n, int big) {
  int best = -1;
  for (int i = 0; i < r->nf; i++) {
    if (r->f[i].n < n)
      continue;
    if (pol == 1) {
      best = i;
      break;
    } // first fit
    if (best < 0 || r->f[i].n < r->f[best].n)
      best = i;
    if (pol == 3 && best >= 0 && r->f[i].n == r->f[best].n && big)
      best = i; // highest among equal
  }
  if (best < 0) { // grow at top
    size_t have = 0;
    if (r->nf && r->f[r->nf - 1].a + r->f[r->nf - 1].n == r->top) {
      have = r->f[r->nf - 1].n;
    }
    size_t g = n - have;
    if (gm == 1) {
      size_t c = r->top / 8;
      c = (c + (2 << 20) - 1) & ~((size_t)(2 << 20) - 1);
      if (c < (2 << 20))
        c = 2 << 20;
      size_t o = (n + (2 << 20) - 1) & ~((size_t)(2 << 20) - 1);
      g = c > o ? c : o;
    } else if (gm == 2) {
      g = (g + (2 << 20) - 1) & ~((size_t)(2 << 20) - 1);
    }
    give(r, r->top, g);
    r->top += g;
    return take(r, n, big);
  }
  ext *e = &r->f[best];
  size_t a;
  if ((pol == 2 || pol == 3) && big) {
    a = e->a + e->n - n;
    e->n -= n;
  } else {
    a = e->a;
    e->a += n;
    e->n -= n;
  }
  if (e->n == 0) {
    memmove(e, e + 1, (r->nf - best - 1) * sizeof(ext));
    r->nf--;
  }
  return a;
}
static region R[2];
int main(int argc, char **argv) {
  size_t cap = (size_t)(atof(argv[1]) * 1048576),
         lo = (size_t)(atof(argv[2]) * 1024),
         hi = (size_t)(atof(argv[3]) * 1048576);
  int steady = atoi(argv[4]);
  pol = atoi(argv[5]);
  size_t T = (size_t)(atof(argv[6]) * 1048576);
  int seeds = atoi(argv[7]);
  gm = argc > 8 ? atoi(argv[8]) : 0;
  double sumf = 0, sume = 0;
  for (int sd = 0; sd < seeds; sd++) {
    st = 0x5eed0002u + sd * 7919u;
    memset(R, 0, sizeof R);
    size_t maxl = cap / lo + 2;
    size_t *A = malloc(maxl * 8), *S = malloc(maxl * 8);
    int *W = malloc(maxl * 4);
    size_t nl = 0, b = 0;
    long fill = -1, ns = 0;
    size_t topfill = 0;
    for (long i = 0;; i++) {
      size_t s = logu_page(lo, hi);
      if (fill < 0 && b + s > cap && nl > 0) {
        fill = i;
        topfill = R[0].top + R[1].top;
      }
      if (fill >= 0 && ns == steady)
        break;
      while (b + s > cap && nl > 0) {
        size_t k = (size_t)(unit() * nl);
        give(&R[W[k]], A[k], S[k]);
        b -= S[k];
        A[k] = A[nl - 1];
        S[k] = S[nl - 1];
        W[k] = W[nl - 1];
        nl--;
      }
      int w = (T > 0 && s >= T) ? 1 : 0;
      int big = s >= 4 * 1048576ul;
      A[nl] = take(&R[w], s, big);
      S[nl] = s;
      W[nl] = w;
      nl++;
      b += s;
      if (fill >= 0)
        ns++;
    }
    double f = (double)topfill / cap, e = (double)(R[0].top + R[1].top) / cap;
    sumf += f;
    sume += e;
    if (seeds <= 3)
      printf("seed %d fill %.3f end %.3f (regions %.0f + %.0f MiB)\n", sd, f, e,
             R[0].top / 1048576.0, R[1].top / 1048576.0);
    free(A);
    free(S);
    free(W);
  }
  printf("pol %d T %.1f: mean fill %.3f end %.3f\n", pol, T / 1048576.0,
         sumf / seeds, sume / seeds);
}
