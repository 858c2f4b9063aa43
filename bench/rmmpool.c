/*
 * rmmpool — RMM's pool_memory_resource policy (stream-ordered), written in
 * C from its description for the benchmarks (rmmpool.h explains the
 * policy and its host adaptation).
 *
 * Data structures: per stream, the free list is an array of blocks sorted
 * by address (binary search to insert, then merge with the neighbours;
 * RMM's std::list needs a linear search: the array is, if anything,
 * cheaper) and best fit is a linear scan; pending blocks wait in a FIFO per
 * stream. The chunks are in an array sorted by address (a freed block
 * starts a chunk iff its address is a chunk's start: such a block never
 * merges with the block before it).
 */
#define _GNU_SOURCE
#include "rmmpool.h"
#include "refutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define RMM_ALIGN ((size_t)256)
#define RMM_PAGE ((size_t)4096)
#define RMM_MAX_STREAMS 16

typedef struct rm_block {
  char *ptr;
  size_t size;
  bool head; /* starts a chunk: never merges with the block before it */
} rm_block_t;

typedef struct rm_pending {
  rm_block_t b;
  refpool_event_t ev;
  uint64_t freed_ns;
} rm_pending_t;

typedef struct rm_stream {
  uintptr_t id;
  rm_block_t *free; /* sorted by ptr */
  size_t nfree, capfree;
  rm_pending_t *pend; /* FIFO ring */
  size_t phead, pn, pcap;
} rm_stream_t;

typedef struct rm_chunk {
  char *ptr;
  size_t size;
} rm_chunk_t;

struct rmmpool {
  pthread_mutex_t mutex;
  rm_stream_t streams[RMM_MAX_STREAMS];
  int nstreams;
  rm_chunk_t *chunks; /* sorted by ptr */
  size_t nchunks, capchunks;
  uint64_t reserved, reserved_peak, backend_allocs, mlock_failures;
  uint64_t steals, list_merges, reclaim_count, reclaim_total_ns;
  refpool_events_t events;
  bool has_events;
  refpool_backend_t backend;
};

static bool grow_array(void **v, size_t *cap, size_t n, size_t elem) {
  if (n < *cap)
    return true;
  size_t ncap = *cap ? *cap * 2 : 64;
  void *nv = realloc(*v, ncap * elem);
  if (nv == NULL)
    return false;
  *v = nv;
  *cap = ncap;
  return true;
}

/* ---- Upstream ------------------------------------------------------------ */

static void *upstream_alloc(rmmpool_t *rp, size_t size) {
  bool mlock_failed = false;
  void *p = ref_backend_alloc(&rp->backend, size, &mlock_failed);
  if (mlock_failed)
    rp->mlock_failures++;
  return p;
}

static void upstream_free(rmmpool_t *rp, void *p, size_t size) {
  ref_backend_free(&rp->backend, p, size);
}

/* ---- Free lists (caller holds the mutex) --------------------------------- */

/* Index of the first block at an address >= p. */
static size_t lower_bound(const rm_block_t *v, size_t n, const char *p) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v[mid].ptr < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Insert b in address order, merged with its free neighbours. */
static bool list_insert(rm_stream_t *s, rm_block_t b) {
  size_t i = lower_bound(s->free, s->nfree, b.ptr);
  bool prev =
      i > 0 && s->free[i - 1].ptr + s->free[i - 1].size == b.ptr && !b.head;
  bool next =
      i < s->nfree && b.ptr + b.size == s->free[i].ptr && !s->free[i].head;
  if (prev && next) {
    s->free[i - 1].size += b.size + s->free[i].size;
    memmove(&s->free[i], &s->free[i + 1],
            (s->nfree - i - 1) * sizeof s->free[0]);
    s->nfree--;
    return true;
  }
  if (prev) {
    s->free[i - 1].size += b.size;
    return true;
  }
  if (next) {
    s->free[i].ptr = b.ptr;
    s->free[i].size += b.size;
    s->free[i].head = b.head;
    return true;
  }
  if (!grow_array((void **)&s->free, &s->capfree, s->nfree, sizeof b))
    return false; /* the block is lost to the pool (out of bookkeeping) */
  memmove(&s->free[i + 1], &s->free[i], (s->nfree - i) * sizeof s->free[0]);
  s->free[i] = b;
  s->nfree++;
  return true;
}

/* Best fit: the smallest block of at least size bytes, the lowest address
 * among equals. Returns its index or SIZE_MAX. */
static size_t best_fit(const rm_stream_t *s, size_t size) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < s->nfree; i++)
    if (s->free[i].size >= size &&
        (best == SIZE_MAX || s->free[i].size < s->free[best].size))
      best = i;
  return best;
}

/* Take size bytes from the front of free block i of s; the rest stays. */
static char *take(rm_stream_t *s, size_t i, size_t size) {
  char *p = s->free[i].ptr;
  if (s->free[i].size == size) {
    memmove(&s->free[i], &s->free[i + 1],
            (s->nfree - i - 1) * sizeof s->free[0]);
    s->nfree--;
  } else {
    s->free[i].ptr += size;
    s->free[i].size -= size;
    s->free[i].head = false;
  }
  return p;
}

static bool is_chunk_start(const rmmpool_t *rp, const char *p) {
  size_t lo = 0, hi = rp->nchunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (rp->chunks[mid].ptr < p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < rp->nchunks && rp->chunks[lo].ptr == p;
}

static rm_stream_t *get_stream(rmmpool_t *rp, uintptr_t id) {
  for (int i = 0; i < rp->nstreams; i++)
    if (rp->streams[i].id == id)
      return &rp->streams[i];
  if (rp->nstreams == RMM_MAX_STREAMS)
    return NULL;
  rm_stream_t *s = &rp->streams[rp->nstreams++];
  memset(s, 0, sizeof *s);
  s->id = id;
  return s;
}

/* Move the blocks whose events completed into their streams' lists (each
 * stream's FIFO from its oldest, up to the first not yet complete). */
static void process_pending(rmmpool_t *rp) {
  for (int k = 0; k < rp->nstreams; k++) {
    rm_stream_t *s = &rp->streams[k];
    while (s->pn > 0) {
      rm_pending_t *it = &s->pend[s->phead];
      if (rp->events.query(rp->events.ctx, &it->ev) != 1)
        break;
      rp->reclaim_count++;
      rp->reclaim_total_ns += ref_now_ns() - it->freed_ns;
      (void)list_insert(s, it->b);
      s->phead = (s->phead + 1) % s->pcap;
      s->pn--;
    }
  }
}

/* Add a chunk of `size` bytes to stream s's list. */
static bool grow(rmmpool_t *rp, rm_stream_t *s, size_t size) {
  if (!grow_array((void **)&rp->chunks, &rp->capchunks, rp->nchunks,
                  sizeof rp->chunks[0]))
    return false;
  char *p = upstream_alloc(rp, size);
  if (p == NULL)
    return false;
  size_t i = 0;
  while (i < rp->nchunks && rp->chunks[i].ptr < p)
    i++;
  memmove(&rp->chunks[i + 1], &rp->chunks[i],
          (rp->nchunks - i) * sizeof rp->chunks[0]);
  rp->chunks[i] = (rm_chunk_t){p, size};
  rp->nchunks++;
  rp->reserved += size;
  if (rp->reserved > rp->reserved_peak)
    rp->reserved_peak = rp->reserved;
  rp->backend_allocs++;
  return list_insert(s, (rm_block_t){p, size, true});
}

/* ---- API ----------------------------------------------------------------- */

int rmmpool_create(size_t initial, const refpool_events_t *events,
                   const refpool_backend_t *backend, rmmpool_t **out) {
  if (backend != NULL && (backend->alloc == NULL) != (backend->free == NULL))
    return -1;
  rmmpool_t *rp = calloc(1, sizeof *rp);
  if (rp == NULL)
    return -1;
  pthread_mutex_init(&rp->mutex, NULL);
  if (events != NULL) {
    rp->events = *events;
    rp->has_events = true;
  }
  if (backend != NULL)
    rp->backend = *backend;
  if (initial > 0) {
    size_t sz = (initial + RMM_PAGE - 1) & ~(RMM_PAGE - 1);
    if (!grow(rp, get_stream(rp, 0), sz)) {
      rmmpool_destroy(rp);
      return -1;
    }
  }
  *out = rp;
  return 0;
}

void rmmpool_destroy(rmmpool_t *rp) {
  if (rp == NULL)
    return;
  for (size_t i = 0; i < rp->nchunks; i++)
    upstream_free(rp, rp->chunks[i].ptr, rp->chunks[i].size);
  for (int k = 0; k < rp->nstreams; k++) {
    free(rp->streams[k].free);
    free(rp->streams[k].pend);
  }
  free(rp->chunks);
  pthread_mutex_destroy(&rp->mutex);
  free(rp);
}

void *rmmpool_alloc(rmmpool_t *rp, size_t size, uintptr_t stream) {
  size = size == 0 ? RMM_ALIGN : (size + RMM_ALIGN - 1) & ~(RMM_ALIGN - 1);
  char *p = NULL;
  pthread_mutex_lock(&rp->mutex);
  if (rp->has_events)
    process_pending(rp);
  rm_stream_t *s = get_stream(rp, stream);
  if (s == NULL)
    goto out;
  size_t i = best_fit(s, size);
  if (i != SIZE_MAX) {
    p = take(s, i, size);
    goto out;
  }
  /* Another stream's list (RMM: with a device-side wait on its event;
   * here those blocks are complete already). */
  for (int k = 0; k < rp->nstreams; k++) {
    rm_stream_t *o = &rp->streams[k];
    if (o == s)
      continue;
    i = best_fit(o, size);
    if (i != SIZE_MAX) {
      rp->steals++;
      p = take(o, i, size);
      goto out;
    }
  }
  /* Merge every other list into this one, so that neighbours coalesce. */
  bool merged = false;
  for (int k = 0; k < rp->nstreams; k++) {
    rm_stream_t *o = &rp->streams[k];
    if (o == s || o->nfree == 0)
      continue;
    for (size_t j = 0; j < o->nfree; j++)
      (void)list_insert(s, o->free[j]);
    o->nfree = 0;
    merged = true;
  }
  if (merged) {
    rp->list_merges++;
    i = best_fit(s, size);
    if (i != SIZE_MAX) {
      p = take(s, i, size);
      goto out;
    }
  }
  /* Grow by max(request, pool size). */
  size_t g = size > rp->reserved ? size : (size_t)rp->reserved;
  g = (g + RMM_PAGE - 1) & ~(RMM_PAGE - 1);
  if (grow(rp, s, g)) {
    i = best_fit(s, size);
    if (i != SIZE_MAX)
      p = take(s, i, size);
  }
out:
  pthread_mutex_unlock(&rp->mutex);
  return p;
}

/* A full FIFO ring doubled, its items kept in order. */
static bool grow_pending(rm_stream_t *s) {
  rm_pending_t *nv =
      ref_ring_grow(s->pend, &s->phead, s->pn, &s->pcap, sizeof *nv, 64);
  if (nv == NULL)
    return false;
  s->pend = nv;
  return true;
}

void rmmpool_free(rmmpool_t *rp, void *ptr, size_t size, uintptr_t stream,
                  bool record) {
  size = size == 0 ? RMM_ALIGN : (size + RMM_ALIGN - 1) & ~(RMM_ALIGN - 1);
  pthread_mutex_lock(&rp->mutex);
  rm_stream_t *s = get_stream(rp, stream);
  if (s == NULL)
    s = &rp->streams[0]; /* more streams than planned: share the first */
  rm_block_t b = {ptr, size, is_chunk_start(rp, ptr)};
  if (record && rp->has_events) {
    rm_pending_t it = {b, {stream, 0}, ref_now_ns()};
    if (rp->events.record(rp->events.ctx, stream, &it.ev) == 0 &&
        (s->pn < s->pcap || grow_pending(s))) {
      s->pend[(s->phead + s->pn) % s->pcap] = it;
      s->pn++;
      pthread_mutex_unlock(&rp->mutex);
      return;
    }
    /* No event or no room for it: treated as complete. */
  }
  (void)list_insert(s, b);
  pthread_mutex_unlock(&rp->mutex);
}

void rmmpool_get_stats(rmmpool_t *rp, rmmpool_stats_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&rp->mutex);
  out->reserved_bytes = rp->reserved;
  out->reserved_peak = rp->reserved_peak;
  out->chunks = rp->nchunks;
  out->backend_allocs = rp->backend_allocs;
  out->mlock_failures = rp->mlock_failures;
  out->steals = rp->steals;
  out->list_merges = rp->list_merges;
  out->reclaim_count = rp->reclaim_count;
  out->reclaim_total_ns = rp->reclaim_total_ns;
  for (int k = 0; k < rp->nstreams; k++) {
    const rm_stream_t *s = &rp->streams[k];
    out->free_blocks += s->nfree;
    out->pending_blocks += s->pn;
    for (size_t i = 0; i < s->nfree; i++)
      if (s->free[i].size > out->largest_free)
        out->largest_free = s->free[i].size;
  }
  pthread_mutex_unlock(&rp->mutex);
}
