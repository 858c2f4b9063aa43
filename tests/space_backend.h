/*
 * A user backend of address space only: PROT_NONE, MAP_NORESERVE mappings
 * that cost no memory. The pool never touches block memory (DESIGN.md,
 * invariant 4), so a pool of hundreds of thousands of segments can be
 * built on it to count the work of each operation (tests/test_scale.c and
 * bench/scale.c, issue 38). Header-only: each program gets its own copy.
 */
#ifndef PP_SPACE_BACKEND_H
#define PP_SPACE_BACKEND_H

#include <stddef.h>
#include <sys/mman.h>

#include "pinpool.h"

static inline int pp_space_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  void *p = mmap(NULL, size, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return PINPOOL_ENOMEM;
  *out = p;
  return 0;
}

static inline void pp_space_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  (void)munmap(p, size);
}

static const pinpool_backend_t pp_space_backend = {"space", pp_space_alloc,
                                                   pp_space_free, NULL, 0};

#endif /* PP_SPACE_BACKEND_H */
