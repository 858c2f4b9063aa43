/*
 * refpool — a reference pinned-host caching pool for the benchmarks, written
 * from the published description of PyTorch's CachingHostAllocator
 * (aten/src/ATen/core/CachingHostAllocator.h; see
 * shared/reference/pytorch-host-allocator.md):
 *
 *  - every request is rounded up to the next power of two (4 KiB at least:
 *    the backend maps whole pages) and served by a block of exactly that
 *    size; a block is its own backend allocation (block = segment), never
 *    split or coalesced;
 *  - 64 free lists indexed by log2(size), each with its own mutex, used LIFO;
 *  - a set of known blocks under one mutex (blocks_mutex_), checked by
 *    record_stream;
 *  - a block mutex guarding `allocated`, `event_count` and the stream set;
 *  - stream-ordered frees: one event per recorded stream, pushed onto ONE
 *    global FIFO under events_mutex_; every allocation first polls that
 *    FIFO from its oldest event and stops at the first event that is not
 *    ready (head-of-line blocking, as upstream without background threads);
 *  - no provider call (mmap, mlock, event record/query) under a pool lock.
 *
 * The backend is mmap(MAP_POPULATE) + mlock per block and munlock + munmap
 * per release, the CPU analogue of cudaHostAlloc / cudaFreeHost, unless
 * the caller passes another (the benchmark's refpool-cuda: cuMemHostAlloc /
 * cuMemFreeHost, as upstream).
 *
 * Events come from the caller (the benchmark's simulated streams).
 */
#ifndef PINPOOL_BENCH_REFPOOL_H
#define PINPOOL_BENCH_REFPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct refpool refpool_t;

/* An event: which stream, and a provider-defined position on it. */
typedef struct refpool_event {
  uintptr_t stream;
  uint64_t ticket;
} refpool_event_t;

/* Event provider. record: fill *ev for work queued on `stream` so far;
 * query: 1 if the event completed, 0 if not yet. Called with no pool lock
 * held. */
typedef struct refpool_events {
  int (*record)(void *ctx, uintptr_t stream, refpool_event_t *ev);
  int (*query)(void *ctx, const refpool_event_t *ev);
  void *ctx;
} refpool_events_t;

typedef struct refpool_stats {
  uint64_t reserved_bytes; /* bytes held from the backend, now */
  uint64_t reserved_peak;
  uint64_t blocks; /* blocks held (= segments) */
  uint64_t backend_allocs;
  uint64_t backend_frees;
  uint64_t mlock_failures;
  uint64_t events_pending; /* events in the FIFO, now */
  /* Blocks freed with streams and cached once their events completed:
   * count, and summed time from the free to the caching (instrumentation
   * for the benchmarks; PyTorch keeps no such statistic). */
  uint64_t reclaim_count;
  uint64_t reclaim_total_ns;
} refpool_stats_t;

/* Where blocks come from: alloc returns size bytes (NULL on failure), free
 * gives them back; both called with no pool lock held. */
typedef struct refpool_backend {
  void *(*alloc)(void *ctx, size_t size);
  void (*free)(void *ctx, void *p, size_t size);
  void *ctx;
} refpool_backend_t;

/* events may be NULL (then record_stream fails); backend may be NULL
 * (mmap + mlock). Returns 0 or -1. */
int refpool_create(const refpool_events_t *events,
                   const refpool_backend_t *backend, refpool_t **out);
/* Releases every block, allocated or not. */
void refpool_destroy(refpool_t *rp);

/* Returns the block's memory (NULL if the backend failed) and, in *ctx, the
 * block handle that refpool_free and refpool_record_stream take (PyTorch's
 * DataPtr carries the same context). */
void *refpool_alloc(refpool_t *rp, size_t size, void **ctx);
void refpool_free(refpool_t *rp, void *ctx);
/* Mark that work on `stream` uses the block. Returns 0, or -1 if ctx is not
 * a block of this pool or there is no event provider. */
int refpool_record_stream(refpool_t *rp, void *ptr, void *ctx,
                          uintptr_t stream);
/* Poll the global FIFO (done at the start of every allocation). */
void refpool_process_events(refpool_t *rp);
void refpool_get_stats(refpool_t *rp, refpool_stats_t *out);

#endif
