/*
 * The reserve: one backend allocation made at pinpool_create and kept until
 * pinpool_destroy. Segments are carved from it (extent.c: good fit, the low
 * end of the extent) and given back to it, coalescing, instead of to the
 * backend, so a pool with a reserve makes no backend call while its
 * working set fits. The reserve is one chunk of extents; the arenas of
 * large blocks (issue 21) will be many.
 */
#include "internal.h"

void pp_reserve_init(pp_reserve_t *r, void *base, size_t size, unsigned flags) {
  pp_mutex_init(&r->lock);
  r->base = (uintptr_t)base;
  r->size = size;
  r->flags = flags;
  pp_ext_init(&r->ext, PP_PAGE);
  /* Without memory for its metadata the reserve is merely unusable: every
   * segment comes from the backend, and the region goes back at destroy. */
  (void)pp_ext_add_chunk(&r->ext, base, size);
}

void pp_reserve_fini(pp_reserve_t *r) {
  pp_ext_fini(&r->ext);
  pp_mutex_destroy(&r->lock);
}

void *pp_reserve_take(pp_reserve_t *r, size_t size) {
  pp_mutex_lock(&r->lock);
  void *out = pp_ext_take(&r->ext, size);
  pp_mutex_unlock(&r->lock);
  return out;
}

void pp_reserve_give(pp_reserve_t *r, void *ptr, size_t size) {
  pp_mutex_lock(&r->lock);
  pp_ext_give(&r->ext, ptr, size);
  pp_mutex_unlock(&r->lock);
}

bool pp_reserve_contains(const pp_reserve_t *r, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  return p >= r->base && p - r->base < r->size;
}

size_t pp_reserve_free_bytes(pp_reserve_t *r) {
  pp_mutex_lock(&r->lock);
  size_t n = r->ext.free_bytes;
  pp_mutex_unlock(&r->lock);
  return n;
}

bool pp_reserve_validate(pp_reserve_t *r, char *why, size_t len) {
  pp_mutex_lock(&r->lock);
  bool ok = pp_ext_validate(&r->ext, why, len);
  pp_mutex_unlock(&r->lock);
  return ok;
}
