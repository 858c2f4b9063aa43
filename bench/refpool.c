/*
 * refpool — PyTorch's CachingHostAllocator policy, reimplemented in C from
 * its description for the benchmarks (refpool.h explains the policy).
 *
 * Lock order, as upstream: blocks_mutex -> block mutex. The free-list and
 * events mutexes are never held together with another lock.
 */
#define _GNU_SOURCE
#include "refpool.h"
#include "refutil.h"

#include <pthread.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define RP_BUCKETS 64
#define RP_MAX_STREAMS 8
#define RP_MIN_SIZE ((size_t)4096)

typedef struct rp_block {
  pthread_mutex_t mutex;
  size_t size;          /* immutable */
  void *ptr;            /* immutable */
  bool allocated;       /* under mutex */
  unsigned event_count; /* under mutex */
  unsigned nstreams;    /* under mutex */
  uintptr_t streams[RP_MAX_STREAMS];
  uint64_t freed_ns; /* under mutex: when freed with streams */
} rp_block_t;

typedef struct rp_free_list {
  alignas(64) pthread_mutex_t mutex;
  rp_block_t **v; /* LIFO stack */
  size_t n, cap;
} rp_free_list_t;

typedef struct rp_event_item {
  refpool_event_t ev;
  rp_block_t *block;
} rp_event_item_t;

struct refpool {
  rp_free_list_t free_list[RP_BUCKETS];

  alignas(64) pthread_mutex_t blocks_mutex;
  rp_block_t **set; /* open addressing; never shrinks, no deletions */
  size_t set_cap, set_n;
  uint64_t reserved, reserved_peak, backend_allocs; /* under blocks_mutex */

  alignas(64) pthread_mutex_t events_mutex;
  rp_event_item_t *ring; /* deque: front = newest, back = oldest */
  size_t ring_cap, ring_head, ring_len;

  atomic_uint_fast64_t mlock_failures;
  atomic_uint_fast64_t reclaim_count, reclaim_total_ns;
  refpool_events_t events;
  bool has_events;
  refpool_backend_t backend; /* immutable; NULL members: mmap + mlock */
};

/* ---- Backend: cudaHostAlloc or its CPU analogue -------------------------- */

static void *backend_alloc(refpool_t *rp, size_t size) {
  bool mlock_failed = false;
  void *p = ref_backend_alloc(&rp->backend, size, &mlock_failed);
  if (mlock_failed)
    atomic_fetch_add_explicit(&rp->mlock_failures, 1, memory_order_relaxed);
  return p;
}

static void backend_free(refpool_t *rp, void *p, size_t size) {
  ref_backend_free(&rp->backend, p, size);
}

/* ---- Helpers ------------------------------------------------------------- */

static size_t pow2_ceil(size_t size) {
  size_t r = RP_MIN_SIZE;
  while (r < size)
    r <<= 1;
  return r;
}

static unsigned size_index(size_t pow2) {
  unsigned i = 0;
  while (((size_t)1 << i) < pow2)
    i++;
  return i;
}

static size_t hash_ptr(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

/* Caller holds blocks_mutex. */
static bool set_contains(const refpool_t *rp, const rp_block_t *b) {
  if (rp->set_cap == 0)
    return false;
  for (size_t i = hash_ptr(b, rp->set_cap);; i = (i + 1) & (rp->set_cap - 1)) {
    if (rp->set[i] == b)
      return true;
    if (rp->set[i] == NULL)
      return false;
  }
}

/* Caller holds blocks_mutex. */
static int set_insert(refpool_t *rp, rp_block_t *b) {
  if ((rp->set_n + 1) * 2 > rp->set_cap) {
    size_t ncap = rp->set_cap ? rp->set_cap * 2 : 64;
    rp_block_t **nset = calloc(ncap, sizeof *nset);
    if (nset == NULL)
      return -1;
    for (size_t j = 0; j < rp->set_cap; j++) {
      if (rp->set[j] == NULL)
        continue;
      size_t i = hash_ptr(rp->set[j], ncap);
      while (nset[i] != NULL)
        i = (i + 1) & (ncap - 1);
      nset[i] = rp->set[j];
    }
    free(rp->set);
    rp->set = nset;
    rp->set_cap = ncap;
  }
  size_t i = hash_ptr(b, rp->set_cap);
  while (rp->set[i] != NULL)
    i = (i + 1) & (rp->set_cap - 1);
  rp->set[i] = b;
  rp->set_n++;
  return 0;
}

/* Push a block on its free list (LIFO). */
static void cache_block(refpool_t *rp, rp_block_t *b) {
  rp_free_list_t *fl = &rp->free_list[size_index(b->size)];
  pthread_mutex_lock(&fl->mutex);
  if (fl->n == fl->cap) {
    size_t ncap = fl->cap ? fl->cap * 2 : 16;
    rp_block_t **nv = realloc(fl->v, ncap * sizeof *nv);
    if (nv == NULL) { /* cannot cache it: the block is lost to the pool */
      pthread_mutex_unlock(&fl->mutex);
      return;
    }
    fl->v = nv;
    fl->cap = ncap;
  }
  fl->v[fl->n++] = b;
  pthread_mutex_unlock(&fl->mutex);
}

static rp_block_t *get_free_block(refpool_t *rp, size_t size) {
  rp_free_list_t *fl = &rp->free_list[size_index(size)];
  rp_block_t *b = NULL;
  pthread_mutex_lock(&fl->mutex);
  if (fl->n > 0)
    b = fl->v[--fl->n];
  pthread_mutex_unlock(&fl->mutex);
  if (b != NULL) {
    pthread_mutex_lock(&b->mutex);
    b->allocated = true;
    pthread_mutex_unlock(&b->mutex);
  }
  return b;
}

/* ---- Event FIFO (caller holds events_mutex) ------------------------------ */

static int ring_grow(refpool_t *rp) {
  rp_event_item_t *nr = ref_ring_grow(rp->ring, &rp->ring_head, rp->ring_len,
                                      &rp->ring_cap, sizeof *nr, 256);
  if (nr == NULL)
    return -1;
  rp->ring = nr;
  return 0;
}

static int ring_push_front(refpool_t *rp, rp_event_item_t it) {
  if (rp->ring_len == rp->ring_cap && ring_grow(rp) != 0)
    return -1;
  rp->ring_head = (rp->ring_head + rp->ring_cap - 1) % rp->ring_cap;
  rp->ring[rp->ring_head] = it;
  rp->ring_len++;
  return 0;
}

static int ring_push_back(refpool_t *rp, rp_event_item_t it) {
  if (rp->ring_len == rp->ring_cap && ring_grow(rp) != 0)
    return -1;
  rp->ring[(rp->ring_head + rp->ring_len) % rp->ring_cap] = it;
  rp->ring_len++;
  return 0;
}

static bool ring_pop_back(refpool_t *rp, rp_event_item_t *out) {
  if (rp->ring_len == 0)
    return false;
  rp->ring_len--;
  *out = rp->ring[(rp->ring_head + rp->ring_len) % rp->ring_cap];
  return true;
}

/* ---- API ----------------------------------------------------------------- */

int refpool_create(const refpool_events_t *events,
                   const refpool_backend_t *backend, refpool_t **out) {
  if (backend != NULL && (backend->alloc == NULL) != (backend->free == NULL))
    return -1; /* both or neither */
  refpool_t *rp = aligned_alloc(64, (sizeof *rp + 63) / 64 * 64);
  if (rp == NULL)
    return -1;
  memset(rp, 0, sizeof *rp);
  for (unsigned i = 0; i < RP_BUCKETS; i++)
    pthread_mutex_init(&rp->free_list[i].mutex, NULL);
  pthread_mutex_init(&rp->blocks_mutex, NULL);
  pthread_mutex_init(&rp->events_mutex, NULL);
  atomic_init(&rp->mlock_failures, 0);
  atomic_init(&rp->reclaim_count, 0);
  atomic_init(&rp->reclaim_total_ns, 0);
  if (events != NULL) {
    rp->events = *events;
    rp->has_events = true;
  }
  if (backend != NULL)
    rp->backend = *backend;
  *out = rp;
  return 0;
}

void refpool_destroy(refpool_t *rp) {
  if (rp == NULL)
    return;
  for (size_t i = 0; i < rp->set_cap; i++) {
    rp_block_t *b = rp->set[i];
    if (b == NULL)
      continue;
    backend_free(rp, b->ptr, b->size);
    pthread_mutex_destroy(&b->mutex);
    free(b);
  }
  free(rp->set);
  for (unsigned i = 0; i < RP_BUCKETS; i++) {
    free(rp->free_list[i].v);
    pthread_mutex_destroy(&rp->free_list[i].mutex);
  }
  free(rp->ring);
  pthread_mutex_destroy(&rp->blocks_mutex);
  pthread_mutex_destroy(&rp->events_mutex);
  free(rp);
}

/* Upstream process_events(): take the oldest event; if it is not ready, put
 * it back and stop (head-of-line blocking); else count it off its block and
 * cache the block when its last event completed. */
void refpool_process_events(refpool_t *rp) {
  if (!rp->has_events)
    return;
  for (;;) {
    rp_event_item_t it;
    bool have;
    pthread_mutex_lock(&rp->events_mutex);
    have = ring_pop_back(rp, &it);
    pthread_mutex_unlock(&rp->events_mutex);
    if (!have)
      return;
    if (rp->events.query(rp->events.ctx, &it.ev) != 1) {
      pthread_mutex_lock(&rp->events_mutex);
      (void)ring_push_back(rp, it); /* cannot fail: the slot was just freed */
      pthread_mutex_unlock(&rp->events_mutex);
      return;
    }
    bool available = false;
    uint64_t freed = 0;
    pthread_mutex_lock(&it.block->mutex);
    if (--it.block->event_count == 0) {
      available = true;
      freed = it.block->freed_ns;
    }
    pthread_mutex_unlock(&it.block->mutex);
    if (available) {
      cache_block(rp, it.block);
      atomic_fetch_add_explicit(&rp->reclaim_count, 1, memory_order_relaxed);
      atomic_fetch_add_explicit(&rp->reclaim_total_ns, ref_now_ns() - freed,
                                memory_order_relaxed);
    }
  }
}

void *refpool_alloc(refpool_t *rp, size_t size, void **ctx) {
  refpool_process_events(rp);
  size_t round = pow2_ceil(size);
  rp_block_t *b = get_free_block(rp, round);
  if (b != NULL) {
    *ctx = b;
    return b->ptr;
  }
  /* Slow path: a new block, from the backend, with no lock held. */
  void *p = backend_alloc(rp, round);
  if (p == NULL)
    return NULL;
  b = calloc(1, sizeof *b);
  if (b == NULL) {
    backend_free(rp, p, round);
    return NULL;
  }
  pthread_mutex_init(&b->mutex, NULL);
  b->size = round;
  b->ptr = p;
  b->allocated = true;
  pthread_mutex_lock(&rp->blocks_mutex);
  if (set_insert(rp, b) != 0) {
    pthread_mutex_unlock(&rp->blocks_mutex);
    backend_free(rp, p, round);
    pthread_mutex_destroy(&b->mutex);
    free(b);
    return NULL;
  }
  rp->reserved += round;
  if (rp->reserved > rp->reserved_peak)
    rp->reserved_peak = rp->reserved;
  rp->backend_allocs++;
  pthread_mutex_unlock(&rp->blocks_mutex);
  *ctx = b;
  return p;
}

void refpool_free(refpool_t *rp, void *ctx) {
  rp_block_t *b = ctx;
  uintptr_t streams[RP_MAX_STREAMS];
  unsigned n;
  pthread_mutex_lock(&b->mutex);
  b->allocated = false;
  n = b->nstreams;
  memcpy(streams, b->streams, n * sizeof streams[0]);
  b->event_count += n;
  b->nstreams = 0;
  if (n > 0)
    b->freed_ns = ref_now_ns();
  pthread_mutex_unlock(&b->mutex);
  if (n == 0) {
    cache_block(rp, b);
    return;
  }
  /* Record the events outside any lock, then queue them (newest at front). */
  rp_event_item_t items[RP_MAX_STREAMS];
  for (unsigned i = 0; i < n; i++) {
    items[i].block = b;
    if (rp->events.record(rp->events.ctx, streams[i], &items[i].ev) != 0)
      items[i].ev = (refpool_event_t){streams[i], 0}; /* treat as done */
  }
  pthread_mutex_lock(&rp->events_mutex);
  for (unsigned i = 0; i < n; i++)
    (void)ring_push_front(rp, items[i]); /* on ENOMEM the block leaks */
  pthread_mutex_unlock(&rp->events_mutex);
}

int refpool_record_stream(refpool_t *rp, void *ptr, void *ctx,
                          uintptr_t stream) {
  rp_block_t *b = ctx;
  int rc = -1;
  (void)ptr;
  if (!rp->has_events)
    return -1;
  pthread_mutex_lock(&rp->blocks_mutex);
  if (set_contains(rp, b)) {
    pthread_mutex_lock(&b->mutex);
    unsigned i = 0;
    while (i < b->nstreams && b->streams[i] != stream)
      i++;
    if (i < b->nstreams) {
      rc = 0;
    } else if (b->nstreams < RP_MAX_STREAMS) {
      b->streams[b->nstreams++] = stream;
      rc = 0;
    }
    pthread_mutex_unlock(&b->mutex);
  }
  pthread_mutex_unlock(&rp->blocks_mutex);
  return rc;
}

void refpool_get_stats(refpool_t *rp, refpool_stats_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&rp->blocks_mutex);
  out->reserved_bytes = rp->reserved;
  out->reserved_peak = rp->reserved_peak;
  out->blocks = rp->set_n;
  out->backend_allocs = rp->backend_allocs;
  pthread_mutex_unlock(&rp->blocks_mutex);
  pthread_mutex_lock(&rp->events_mutex);
  out->events_pending = rp->ring_len;
  pthread_mutex_unlock(&rp->events_mutex);
  out->mlock_failures =
      atomic_load_explicit(&rp->mlock_failures, memory_order_relaxed);
  out->reclaim_count =
      atomic_load_explicit(&rp->reclaim_count, memory_order_relaxed);
  out->reclaim_total_ns =
      atomic_load_explicit(&rp->reclaim_total_ns, memory_order_relaxed);
}
