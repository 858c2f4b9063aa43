/*
 * Size classes: 512 bytes, then eight classes per doubling, so consecutive
 * classes are at most 12.5% apart (docs/allocation-policy.md). A class is
 * 2^e + k * 2^(e-3) for e >= 9, k = 0..7; index (e - 9) * 8 + k.
 */
#include "internal.h"

int pinpool_size_class(size_t size, size_t *out) {
  if (out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_size_class: out is NULL");
  if (size == 0)
    return pp_fail(PINPOOL_EZEROSIZE, "pinpool_size_class: size 0");
  if (size > PP_MAX_REQUEST)
    return pp_fail(PINPOOL_EOVERFLOW,
                   "pinpool_size_class: %zu bytes is beyond the largest "
                   "class (2^60)",
                   size);
  *out = pp_class_size(pp_class_index(size));
  return PINPOOL_OK;
}
