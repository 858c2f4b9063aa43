/*
 * rmmpool — a reference pinned-host pool for the benchmarks, written from
 * the published description of RAPIDS RMM's pool_memory_resource on top of
 * its stream_ordered_memory_resource (shared/reference/large-block-arenas.md
 * §3; RMM's documentation: "a coalescing best-fit suballocator which uses a
 * pool of memory allocated from an upstream memory resource"). No RMM code
 * was used; only the policy:
 *
 *  - the pool is a set of large regions ("chunks") from the upstream
 *    resource, each populated and locked once when it is obtained (here
 *    mmap(MAP_POPULATE) + mlock, the CPU analogue of RMM's
 *    pinned_host_memory_resource; or the caller's backend);
 *  - the pool starts with `initial` bytes (0: nothing until the first
 *    request) and grows, when no free block fits, by one chunk of
 *    max(request, current pool size): it doubles; no maximum;
 *  - requests are rounded up to 256 bytes (RMM's allocation alignment);
 *  - free blocks sit in an address-ordered free list; allocation takes the
 *    best fit (the smallest free block that fits, the lowest address on a
 *    tie: a linear scan, as RMM's min_element) and splits off the rest;
 *    a freed block is inserted in address order and merged with its free
 *    neighbours, except across chunk boundaries (blocks of different
 *    upstream allocations never merge);
 *  - stream-ordered: one free list per stream; a block freed on a stream
 *    goes to that stream's list. Allocation on a stream tries its own list,
 *    then takes the best fit of another stream's list, then merges every
 *    other stream's list into its own (so that their neighbours coalesce)
 *    and retries, then grows the pool;
 *  - one mutex guards everything (the upstream call included, as RMM's
 *    expand under its lock); memory goes back to the upstream only at
 *    destroy.
 *
 * Host adaptation of the stream ordering: RMM lets a block freed on a
 * stream be reused at once by later work on that stream (the device orders
 * it), and by another stream after a device-side event wait. A host pool's
 * blocks are written by the CPU as soon as they are handed out, so a block
 * freed with an event (rmmpool_free(..., record=1)) waits in its stream's
 * FIFO until the event completed, and only then joins the stream's free
 * list (FIFO per stream: a slow stream never holds back another's blocks).
 */
#ifndef PINPOOL_BENCH_RMMPOOL_H
#define PINPOOL_BENCH_RMMPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "refpool.h" /* refpool_events_t, refpool_backend_t */

typedef struct rmmpool rmmpool_t;

typedef struct rmmpool_stats {
  uint64_t reserved_bytes; /* chunks held from the upstream, now */
  uint64_t reserved_peak;
  uint64_t chunks;
  uint64_t backend_allocs;
  uint64_t backend_frees;
  uint64_t mlock_failures;
  uint64_t free_blocks;    /* in every stream's free list */
  uint64_t largest_free;   /* bytes */
  uint64_t pending_blocks; /* freed with an event not yet complete */
  uint64_t steals;         /* allocations served from another stream's list */
  uint64_t list_merges;    /* times the other streams' lists were merged */
  uint64_t reclaim_count;  /* blocks whose event completed */
  uint64_t reclaim_total_ns;
} rmmpool_stats_t;

/* initial: bytes of the first chunk, made at create (0: none). events may
 * be NULL (no frees with record); backend may be NULL (mmap + mlock).
 * Returns 0 or -1. */
int rmmpool_create(size_t initial, const refpool_events_t *events,
                   const refpool_backend_t *backend, rmmpool_t **out);
/* Releases every chunk. */
void rmmpool_destroy(rmmpool_t *rp);

/* A block of at least size bytes for work on `stream` (0: the default
 * stream); NULL if the upstream failed. */
void *rmmpool_alloc(rmmpool_t *rp, size_t size, uintptr_t stream);
/* Give back a block of rmmpool_alloc's `size` on `stream`. record: work
 * queued on the stream so far may still use it (an event is recorded; the
 * block is reused only after it completed). */
void rmmpool_free(rmmpool_t *rp, void *p, size_t size, uintptr_t stream,
                  bool record);
void rmmpool_get_stats(rmmpool_t *rp, rmmpool_stats_t *out);

#endif
