/*
 * Size classes: 512 bytes, then eight classes per doubling, so consecutive
 * classes are at most 12.5% apart (docs/allocation-policy.md). A class is
 * 2^e + k * 2^(e-3) for e >= 9, k = 0..7; index (e - 9) * 8 + k.
 */
#include "internal.h"

unsigned pp_class_index(size_t size) {
  pp_assert(size >= 1 && size <= PP_MAX_REQUEST);
  if (size <= PP_MIN_BLOCK)
    return 0;
  /* x in [2^e, 2^(e+1)); m = top four bits of x, in 8..15. The class is
   * (m + 1) << (e - 3): the smallest class >= size. */
  size_t x = size - 1;
  unsigned e = 63u - (unsigned)__builtin_clzll((unsigned long long)x);
  unsigned m = (unsigned)(x >> (e - 3));
  return (e - 9) * 8 + (m - 8) + 1;
}

size_t pp_class_size(unsigned idx) {
  pp_assert(idx < PP_NCLASSES);
  unsigned e = 9 + idx / 8, k = idx % 8;
  return ((size_t)1 << e) + (size_t)k * ((size_t)1 << (e - 3));
}

int pinpool_size_class(size_t size, size_t *out) {
  if (out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_size_class: out is NULL");
  if (size == 0)
    return pp_fail(PINPOOL_EZEROSIZE, "pinpool_size_class: size 0");
  if (size > PP_MAX_REQUEST)
    return pp_fail(PINPOOL_EOVERFLOW,
                   "pinpool_size_class: %zu bytes is beyond the largest "
                   "class (2^61)",
                   size);
  *out = pp_class_size(pp_class_index(size));
  return PINPOOL_OK;
}
