/*
 * Extents: the free space of the arena's chunks (arena.c), carved and
 * coalesced at a granule (a page). Free extents never span two chunks:
 * chunks are separate backend allocations (and registrations), so a chunk
 * can go back to the backend whole once it is all free.
 *
 * Free extents only have nodes (malloc'd: metadata never lives in pinned
 * memory, invariant 4). A node sits on the list of its size's bin (the
 * pool's size classes: eight per doubling), and its first and last granule
 * point to it in its chunk's boundary map, so that a give finds its free
 * neighbours in O(1) and merges with them.
 *
 * Fit: up to FIT_LOOK extents of the request's own bin (which may hold
 * smaller ones), then the smallest non-empty bin whose every extent is
 * large enough (a bit scan over the bins' bitmap), then the rest of the
 * request's bin. The carve takes the extent's low end. So the extent used
 * is at most one bin (12.5 %) larger than a best fit's unless only the
 * request's own bin has room, a take fails only when no free extent is
 * large enough, and no time goes to long lists.
 *
 * Nothing here fails after a take succeeded: there are always at least as
 * many spare nodes as extents handed out (a take makes one if needed), so
 * the give that merges with no neighbour (the one case that needs a new
 * node) never calls malloc.
 *
 * Not thread-safe: the owner holds its lock (the arena's).
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FIT_LOOK 8

struct pp_xnode {
  uintptr_t base;
  size_t size;
  pp_xchunk_t *chunk;
  struct pp_xnode *prev, *next; /* bin list; spare list (next only) */
  unsigned bin;
};

struct pp_xchunk {
  uintptr_t base;
  size_t size;
  unsigned flags; /* the backend's PP_SEG_* for the whole chunk */
  uint64_t seq;   /* order of arrival: the oldest free chunk goes first */
  pp_xnode_t **map; /* granule -> free extent starting or ending there */
};

static unsigned bin_of(size_t size) { return pp_class_index(size); }

static size_t granules(const pp_extents_t *x, size_t bytes) {
  return bytes / x->granule;
}

static pp_xnode_t **map_at(pp_xchunk_t *c, const pp_extents_t *x,
                           uintptr_t addr) {
  return &c->map[granules(x, addr - c->base)];
}

static void bin_push(pp_extents_t *x, pp_xnode_t *n) {
  unsigned b = bin_of(n->size);
  n->bin = b;
  n->prev = NULL;
  n->next = x->bins[b];
  if (n->next != NULL)
    n->next->prev = n;
  x->bins[b] = n;
  x->nonempty[b / 64] |= (uint64_t)1 << (b % 64);
}

static void bin_remove(pp_extents_t *x, pp_xnode_t *n) {
  if (n->prev != NULL)
    n->prev->next = n->next;
  else
    x->bins[n->bin] = n->next;
  if (n->next != NULL)
    n->next->prev = n->prev;
  if (x->bins[n->bin] == NULL)
    x->nonempty[n->bin / 64] &= ~((uint64_t)1 << (n->bin % 64));
}

/* Enter n (free) into its bin and its chunk's boundary map. */
static void link_free(pp_extents_t *x, pp_xnode_t *n) {
  bin_push(x, n);
  *map_at(n->chunk, x, n->base) = n;
  *map_at(n->chunk, x, n->base + n->size - x->granule) = n;
  x->nfree++;
}

static void unlink_free(pp_extents_t *x, pp_xnode_t *n) {
  bin_remove(x, n);
  *map_at(n->chunk, x, n->base) = NULL;
  *map_at(n->chunk, x, n->base + n->size - x->granule) = NULL;
  x->nfree--;
}

static pp_xnode_t *spare_get(pp_extents_t *x) {
  pp_xnode_t *n = x->spare;
  pp_assert(n != NULL);
  x->spare = n->next;
  x->nspare--;
  return n;
}

static void spare_put(pp_extents_t *x, pp_xnode_t *n) {
  n->next = x->spare;
  x->spare = n;
  x->nspare++;
}

void pp_ext_init(pp_extents_t *x, size_t granule) {
  memset(x, 0, sizeof *x);
  x->granule = granule;
}

void pp_ext_fini(pp_extents_t *x) {
  for (unsigned b = 0; b < PP_NCLASSES; b++)
    for (pp_xnode_t *n = x->bins[b], *next; n != NULL; n = next) {
      next = n->next;
      free(n);
    }
  for (pp_xnode_t *n = x->spare, *next; n != NULL; n = next) {
    next = n->next;
    free(n);
  }
  for (size_t i = 0; i < x->nchunks; i++) {
    free(x->chunks[i]->map);
    free(x->chunks[i]);
  }
  free(x->chunks);
  memset(x, 0, sizeof *x);
}

int pp_ext_add_chunk(pp_extents_t *x, void *base, size_t size,
                     unsigned flags) {
  pp_assert(size > 0 && size % x->granule == 0 &&
            (uintptr_t)base % x->granule == 0);
  pp_xchunk_t *c = malloc(sizeof *c);
  pp_xnode_t *n = malloc(sizeof *n);
  pp_xchunk_t **cs =
      realloc(x->chunks, (x->nchunks + 1) * sizeof(pp_xchunk_t *));
  if (cs != NULL)
    x->chunks = cs;
  if (c == NULL || n == NULL || cs == NULL ||
      (c->map = calloc(granules(x, size), sizeof(pp_xnode_t *))) == NULL) {
    free(c);
    free(n);
    return PINPOOL_ENOMEM;
  }
  c->base = (uintptr_t)base;
  c->size = size;
  c->flags = flags;
  c->seq = x->next_seq++;
  /* Sorted by address, for pp_ext_chunk_of's binary search. */
  size_t i = x->nchunks++;
  for (; i > 0 && x->chunks[i - 1]->base > c->base; i--)
    x->chunks[i] = x->chunks[i - 1];
  x->chunks[i] = c;
  *n = (pp_xnode_t){(uintptr_t)base, size, c, NULL, NULL, 0};
  link_free(x, n);
  x->free_bytes += size;
  x->total_bytes += size;
  return 0;
}

/* The node of a free extent of at least `size` bytes, or NULL. */
static pp_xnode_t *fit(pp_extents_t *x, size_t size) {
  unsigned b = bin_of(size);
  int k = 0;
  for (pp_xnode_t *n = x->bins[b]; n != NULL && k < FIT_LOOK; n = n->next, k++)
    if (n->size >= size)
      return n;
  /* Bins above b hold only extents larger than class(b) >= size. */
  for (unsigned w = (b + 1) / 64; w < PP_EXT_BIN_WORDS; w++) {
    uint64_t m = x->nonempty[w];
    if (w == (b + 1) / 64)
      m &= ~(uint64_t)0 << ((b + 1) % 64);
    if (m != 0)
      return x->bins[w * 64 + (unsigned)__builtin_ctzll(m)];
  }
  /* Last resort: the rest of b's list (a take fails only when no free
   * extent is large enough). */
  for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next)
    if (n->size >= size)
      return n;
  return NULL;
}

void *pp_ext_take(pp_extents_t *x, size_t size, unsigned *flags) {
  if (size == 0 || size % x->granule != 0)
    return NULL;
  pp_xnode_t *n = fit(x, size);
  if (n == NULL)
    return NULL;
  if (x->nspare <= x->outstanding) { /* the node this extent's give may need */
    pp_xnode_t *spare = malloc(sizeof *spare);
    if (spare == NULL)
      return NULL;
    spare_put(x, spare);
  }
  uintptr_t out = n->base;
  unlink_free(x, n);
  if (n->size > size) {
    n->base += size;
    n->size -= size;
    link_free(x, n);
  } else {
    spare_put(x, n);
  }
  x->free_bytes -= size;
  x->outstanding++;
  if (flags != NULL)
    *flags = n->chunk->flags;
  return (void *)out;
}

pp_xchunk_t *pp_ext_chunk_of(const pp_extents_t *x, const void *p) {
  uintptr_t a = (uintptr_t)p;
  size_t lo = 0, hi = x->nchunks; /* the last chunk based at or below a */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->chunks[mid]->base <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return NULL;
  pp_xchunk_t *c = x->chunks[lo - 1];
  return a - c->base < c->size ? c : NULL;
}

/* The chunk's one free extent if the chunk is all free, else NULL. */
static pp_xnode_t *whole_free(const pp_extents_t *x, pp_xchunk_t *c) {
  pp_xnode_t *n = c->map[0];
  (void)x;
  return n != NULL && n->base == c->base && n->size == c->size ? n : NULL;
}

bool pp_ext_remove_free_chunk(pp_extents_t *x, unsigned skip_flags,
                              void **base, size_t *size, unsigned *flags) {
  size_t best = SIZE_MAX;
  for (size_t i = 0; i < x->nchunks; i++) {
    pp_xchunk_t *c = x->chunks[i];
    if (!(c->flags & skip_flags) && whole_free(x, c) != NULL &&
        (best == SIZE_MAX || c->seq < x->chunks[best]->seq))
      best = i;
  }
  if (best == SIZE_MAX)
    return false;
  pp_xchunk_t *c = x->chunks[best];
  pp_xnode_t *n = whole_free(x, c);
  unlink_free(x, n);
  spare_put(x, n);
  while (x->nspare > x->outstanding + 4)
    free(spare_get(x));
  x->free_bytes -= c->size;
  x->total_bytes -= c->size;
  memmove(&x->chunks[best], &x->chunks[best + 1],
          (x->nchunks - best - 1) * sizeof(pp_xchunk_t *));
  x->nchunks--;
  *base = (void *)c->base;
  *size = c->size;
  *flags = c->flags;
  free(c->map);
  free(c);
  return true;
}

void pp_ext_chunk_info(const pp_xchunk_t *c, uintptr_t *base, size_t *size,
                       unsigned *flags) {
  *base = c->base;
  *size = c->size;
  *flags = c->flags;
}

size_t pp_ext_free_chunks(const pp_extents_t *x, unsigned skip_flags,
                          size_t *bytes) {
  size_t n = 0;
  *bytes = 0;
  for (size_t i = 0; i < x->nchunks; i++)
    if (!(x->chunks[i]->flags & skip_flags) &&
        whole_free(x, x->chunks[i]) != NULL) {
      n++;
      *bytes += x->chunks[i]->size;
    }
  return n;
}


void pp_ext_give(pp_extents_t *x, void *ptr, size_t size) {
  uintptr_t b = (uintptr_t)ptr;
  pp_xchunk_t *c = pp_ext_chunk_of(x, ptr);
  pp_assert(c != NULL && size % x->granule == 0 &&
            b + size <= c->base + c->size);
  pp_xnode_t *left = NULL, *right = NULL;
  if (b > c->base) {
    left = *map_at(c, x, b - x->granule);
    if (left != NULL && left->base + left->size != b)
      left = NULL; /* a free extent starting there, not ending */
  }
  if (b + size < c->base + c->size) {
    right = *map_at(c, x, b + size);
    if (right != NULL && right->base != b + size)
      right = NULL;
  }
  pp_assert(x->outstanding > 0 && x->nspare >= x->outstanding);
  x->outstanding--;
  pp_xnode_t *n;
  if (left != NULL) {
    unlink_free(x, left);
    left->size += size;
    n = left;
  } else {
    n = spare_get(x);
    *n = (pp_xnode_t){b, size, c, NULL, NULL, 0};
  }
  if (right != NULL) {
    unlink_free(x, right);
    n->size += right->size;
    spare_put(x, right);
  }
  link_free(x, n);
  x->free_bytes += size;
  while (x->nspare > x->outstanding + 4) /* a few kept for the next takes */
    free(spare_get(x));
}

size_t pp_ext_largest(const pp_extents_t *x) {
  for (unsigned w = PP_EXT_BIN_WORDS; w-- > 0;) {
    uint64_t m = x->nonempty[w];
    if (m == 0)
      continue;
    unsigned b = w * 64 + 63u - (unsigned)__builtin_clzll(m);
    size_t best = 0;
    for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next)
      if (n->size > best)
        best = n->size;
    return best;
  }
  return 0;
}

bool pp_ext_validate(const pp_extents_t *x, char *why, size_t len) {
  size_t sum = 0, count = 0;
  for (unsigned b = 0; b < PP_NCLASSES; b++) {
    bool bit = (x->nonempty[b / 64] >> (b % 64)) & 1;
    if (bit != (x->bins[b] != NULL)) {
      (void)snprintf(why, len, "extents: bin %u bitmap %d", b, (int)bit);
      return false;
    }
    for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next) {
      pp_xchunk_t *c = n->chunk;
      if (n->bin != b || bin_of(n->size) != b || n->size == 0 ||
          n->size % x->granule != 0 || n->base < c->base ||
          n->base + n->size > c->base + c->size) {
        (void)snprintf(why, len, "extents: free extent %#lx+%zu misplaced",
                       (unsigned long)n->base, n->size);
        return false;
      }
      if (*map_at(c, x, n->base) != n ||
          *map_at(c, x, n->base + n->size - x->granule) != n) {
        (void)snprintf(why, len, "extents: boundary map of %#lx+%zu",
                       (unsigned long)n->base, n->size);
        return false;
      }
      /* Fully coalesced: no free neighbour on either side. */
      pp_xnode_t *l =
          n->base > c->base ? *map_at(c, x, n->base - x->granule) : NULL;
      pp_xnode_t *r = n->base + n->size < c->base + c->size
                          ? *map_at(c, x, n->base + n->size)
                          : NULL;
      if ((l != NULL && l->base + l->size == n->base) ||
          (r != NULL && r->base == n->base + n->size)) {
        (void)snprintf(why, len, "extents: %#lx+%zu has a free neighbour",
                       (unsigned long)n->base, n->size);
        return false;
      }
      sum += n->size;
      count++;
    }
  }
  if (sum != x->free_bytes || count != x->nfree) {
    (void)snprintf(why, len,
                   "extents: %zu free bytes in %zu extents listed, "
                   "%zu in %zu counted",
                   sum, count, x->free_bytes, x->nfree);
    return false;
  }
  return true;
}
