/* Issue 37, the cliff: W2's size sequence for the two probes here
 * (w2_probe.c, placement_sim.c): xorshift64 seeded by the caller through
 * `st`, sizes log-uniform in [lo, hi] as bench/ draws them. */
#ifndef W2SEQ_H
#define W2SEQ_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
static uint64_t st;
static double unit(void) {
  st ^= st << 13;
  st ^= st >> 7;
  st ^= st << 17;
  return (double)(st >> 11) / 9007199254740992.0;
}
static size_t logu(size_t lo, size_t hi) {
  double l = log((double)lo), h = log((double)hi);
  size_t s = (size_t)exp(l + (h - l) * unit());
  return s < lo ? lo : s > hi ? hi : s;
}
#endif
