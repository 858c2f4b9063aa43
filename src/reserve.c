/*
 * The reserve: one backend allocation made at pinpool_create and kept until
 * pinpool_destroy. Segments are carved from it first-fit and given back to
 * it (coalescing) instead of to the backend, so a pool with a reserve makes
 * no backend call while its working set fits.
 *
 * Free ranges are a sorted singly linked list of malloc'd nodes (metadata
 * never lives in the pinned memory, invariant 4). Segment creation and
 * release are slow paths; the list is short because segments coalesce.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>

struct pp_range {
  uintptr_t base;
  size_t size;
  pp_range_t *next;
};

void pp_reserve_init(pp_reserve_t *r, void *base, size_t size, unsigned flags) {
  pp_mutex_init(&r->lock);
  r->base = (uintptr_t)base;
  r->size = size;
  r->flags = flags;
  r->free = NULL;
  r->free_bytes = 0;
  pp_range_t *n = malloc(sizeof *n);
  if (n != NULL) { /* without a node the reserve is merely unusable */
    *n = (pp_range_t){(uintptr_t)base, size, NULL};
    r->free = n;
    r->free_bytes = size;
  }
}

void pp_reserve_fini(pp_reserve_t *r) {
  for (pp_range_t *n = r->free, *next; n != NULL; n = next) {
    next = n->next;
    free(n);
  }
  r->free = NULL;
  pp_mutex_destroy(&r->lock);
}

void *pp_reserve_take(pp_reserve_t *r, size_t size) {
  void *out = NULL;
  pp_mutex_lock(&r->lock);
  for (pp_range_t **pn = &r->free; *pn != NULL; pn = &(*pn)->next) {
    pp_range_t *n = *pn;
    if (n->size < size)
      continue;
    out = (void *)n->base;
    n->base += size;
    n->size -= size;
    if (n->size == 0) {
      *pn = n->next;
      free(n);
    }
    r->free_bytes -= size;
    break;
  }
  pp_mutex_unlock(&r->lock);
  return out;
}

void pp_reserve_give(pp_reserve_t *r, void *ptr, size_t size) {
  uintptr_t b = (uintptr_t)ptr;
  pp_mutex_lock(&r->lock);
  pp_range_t *prev = NULL, *n = r->free;
  while (n != NULL && n->base < b) {
    prev = n;
    n = n->next;
  }
  bool merged = false;
  if (prev != NULL && prev->base + prev->size == b) {
    prev->size += size;
    merged = true;
    if (n != NULL && prev->base + prev->size == n->base) {
      prev->size += n->size;
      prev->next = n->next;
      free(n);
    }
  } else if (n != NULL && b + size == n->base) {
    n->base = b;
    n->size += size;
    merged = true;
  }
  if (!merged) {
    pp_range_t *node = malloc(sizeof *node);
    if (node == NULL) {
      /* Cannot track the range: it stays reserved but unusable until
       * destroy (the region is released whole). Counted as cached by the
       * pool, so the accounting identity still holds. */
      pp_mutex_unlock(&r->lock);
      return;
    }
    *node = (pp_range_t){b, size, n};
    if (prev != NULL)
      prev->next = node;
    else
      r->free = node;
  }
  r->free_bytes += size;
  pp_mutex_unlock(&r->lock);
}

bool pp_reserve_contains(const pp_reserve_t *r, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  return p >= r->base && p - r->base < r->size;
}

size_t pp_reserve_free_bytes(pp_reserve_t *r) {
  pp_mutex_lock(&r->lock);
  size_t n = r->free_bytes;
  pp_mutex_unlock(&r->lock);
  return n;
}

bool pp_reserve_validate(pp_reserve_t *r, char *why, size_t len) {
  bool ok = true;
  size_t sum = 0;
  pp_mutex_lock(&r->lock);
  uintptr_t last_end = r->base;
  for (pp_range_t *n = r->free; n != NULL; n = n->next) {
    if (n->base < last_end || n->size == 0 ||
        n->base + n->size > r->base + r->size) {
      (void)snprintf(why, len, "reserve: free range %#lx+%zu out of order",
                     (unsigned long)n->base, n->size);
      ok = false;
      break;
    }
    if (n != r->free && n->base == last_end) {
      (void)snprintf(why, len, "reserve: adjacent ranges not coalesced");
      ok = false;
      break;
    }
    last_end = n->base + n->size;
    sum += n->size;
  }
  if (ok && sum != r->free_bytes) {
    (void)snprintf(why, len, "reserve: free bytes %zu != listed %zu",
                   r->free_bytes, sum);
    ok = false;
  }
  pp_mutex_unlock(&r->lock);
  return ok;
}
