/*
 * What the two reference pools (refpool.c: PyTorch's policy, rmmpool.c:
 * RMM's) share: utilities, not policy. The clock their reclaim statistics
 * use, the pinned backend both emulate, and the doubling of the FIFO rings
 * that hold their pending events. Header-only, so that test_rmmpool links
 * rmmpool.c alone.
 */
#ifndef PINPOOL_BENCH_REFUTIL_H
#define PINPOOL_BENCH_REFUTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "refpool.h"

static inline uint64_t ref_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The caller's backend if it passed one (refpool-cuda: cuMemHostAlloc), else
 * the CPU analogue of cudaHostAlloc: populated pages, locked. A refused lock
 * (RLIMIT_MEMLOCK) leaves the pages usable: *mlock_failed tells the pool,
 * which counts it. */
static inline void *ref_backend_alloc(const refpool_backend_t *be, size_t size,
                                      bool *mlock_failed) {
  if (be->alloc != NULL)
    return be->alloc(be->ctx, size);
  void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  if (mlock(p, size) != 0)
    *mlock_failed = true;
  return p;
}

static inline void ref_backend_free(const refpool_backend_t *be, void *p,
                                    size_t size) {
  if (be->free != NULL) {
    be->free(be->ctx, p, size);
    return;
  }
  (void)munlock(p, size);
  (void)munmap(p, size);
}

/* A full FIFO ring of *cap items of elem bytes starting at *head, doubled
 * (an empty one gets `first`): its n items move to the front, in order, and
 * the old buffer is freed. NULL, the ring unchanged, if memory ran out. */
static inline void *ref_ring_grow(void *ring, size_t *head, size_t n,
                                  size_t *cap, size_t elem, size_t first) {
  size_t ncap = *cap ? *cap * 2 : first;
  char *nv = malloc(ncap * elem);
  if (nv == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++)
    memcpy(nv + i * elem, (char *)ring + ((*head + i) % *cap) * elem, elem);
  free(ring);
  *cap = ncap;
  *head = 0;
  return nv;
}

#endif
