/*
 * Extents: the free space of the arena's chunks (arena.c), carved and
 * coalesced at a granule (a page).
 *
 * Free extents only have nodes (malloc'd: metadata never lives in pinned
 * memory, invariant 4). A node sits on the list of its size's bin (the
 * pool's size classes: eight per doubling), and its first and last granule
 * point to it in the boundary maps of the chunks that hold them, so that a
 * give finds its free neighbours in O(log chunks) and merges with them.
 *
 * Runs. With x->span set (a backend whose memory is the same on both
 * sides of a chunk boundary: the host backend's mappings), chunks that
 * are adjacent in the address space and have the same flags form a run,
 * and a free extent may cross their boundaries: the arena then fragments
 * like one region, not like many small ones (a block larger than what is
 * left of any chunk still fits the space two neighbours left free). A
 * chunk stays the unit the backend gets back: one that lies wholly inside
 * a free extent is cut out of it (pp_ext_remove_free_chunk). Without
 * span (memory registered with a driver chunk by chunk) every chunk is a
 * run of its own.
 *
 * Fit: up to FIT_LOOK extents of the request's own bin (which may hold
 * smaller ones), then the smallest non-empty bin whose every extent is
 * large enough (a bit scan over the bins' bitmap), then the rest of the
 * request's bin. The carve takes the extent's low end. So the extent used
 * is at most one bin (12.5 %) larger than a best fit's unless only the
 * request's own bin has room, a take fails only when no free extent is
 * large enough, and no time goes to long lists. (Exact best fit and
 * address-ordered first fit measured no better on W2's mix:
 * docs/allocation-policy.md, "Fragmentation".)
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
  struct pp_xnode *prev, *next; /* bin list; spare list (next only) */
  unsigned bin;
};

struct pp_xchunk {
  uintptr_t base;
  size_t size;
  unsigned flags; /* the backend's PP_SEG_* for the whole chunk */
  /* When the chunk last became all free (x->next_seq): the one free the
   * longest goes back to the backend first (the coldest memory). */
  uint64_t seq;
  pp_xnode_t **map; /* granule -> free extent starting or ending there */
};

static unsigned bin_of(size_t size) { return pp_class_index(size); }

static size_t granules(const pp_extents_t *x, size_t bytes) {
  return bytes / x->granule;
}

/* Index of the chunk containing a, or x->nchunks. The chunk found last is
 * tried first: a take or give looks up a few granules of one extent, most
 * in one chunk (W5: the binary search was 5 % of the time). x->last is
 * only a hint, checked against the table, so a stale one after a chunk
 * left costs a search, nothing else. */
static size_t chunk_index(const pp_extents_t *x, uintptr_t a) {
  size_t h = x->last;
  if (h < x->nchunks && a - x->chunks[h]->base < x->chunks[h]->size)
    return h;
  size_t lo = 0, hi = x->nchunks; /* the last chunk based at or below a */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->chunks[mid]->base <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || a - x->chunks[lo - 1]->base >= x->chunks[lo - 1]->size)
    return x->nchunks;
  ((pp_extents_t *)x)->last = lo - 1; /* a hint: see above */
  return lo - 1;
}

pp_xchunk_t *pp_ext_chunk_of(const pp_extents_t *x, const void *p) {
  size_t i = chunk_index(x, (uintptr_t)p);
  return i < x->nchunks ? x->chunks[i] : NULL;
}

/* Chunks i and i + 1 are one run: a free extent may cross between them. */
static bool joined(const pp_extents_t *x, size_t i) {
  if (!x->span || i + 1 >= x->nchunks)
    return false;
  const pp_xchunk_t *a = x->chunks[i], *b = x->chunks[i + 1];
  return a->base + a->size == b->base && a->flags == b->flags;
}

/* The boundary-map slot of granule a (inside some chunk). */
static pp_xnode_t **slot(const pp_extents_t *x, uintptr_t a) {
  size_t i = chunk_index(x, a);
  pp_assert(i < x->nchunks);
  pp_xchunk_t *c = x->chunks[i];
  return &c->map[granules(x, a - c->base)];
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

/* Enter n (free) into its bin and the boundary maps. */
static void link_free(pp_extents_t *x, pp_xnode_t *n) {
  bin_push(x, n);
  *slot(x, n->base) = n;
  *slot(x, n->base + n->size - x->granule) = n;
  x->nfree++;
}

static void unlink_free(pp_extents_t *x, pp_xnode_t *n) {
  bin_remove(x, n);
  *slot(x, n->base) = NULL;
  *slot(x, n->base + n->size - x->granule) = NULL;
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

/* Spare nodes beyond what the extents out may need go back to malloc
 * only in bulk: a steady mix takes and gives without calling malloc or
 * free at all (each costs a lock of the allocator's, and a child of fork
 * whose parent's threads were churning nodes met the sanitizers'
 * allocator locks held: tests/test_fork.c). */
static void spare_trim(pp_extents_t *x) {
  if (x->nspare <= x->outstanding + 64)
    return;
  while (x->nspare > x->outstanding + 16)
    free(spare_get(x));
}

void pp_ext_init(pp_extents_t *x, size_t granule, bool span) {
  memset(x, 0, sizeof *x);
  x->granule = granule;
  x->span = span;
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

/* The free extent whose last granule is just below a (left) or whose first
 * is at a (right), in the same run as the granule beside it, or NULL. */
static pp_xnode_t *left_of(const pp_extents_t *x, uintptr_t a) {
  size_t i = chunk_index(x, a - x->granule);
  if (i == x->nchunks)
    return NULL;
  const pp_xchunk_t *c = x->chunks[i];
  if (a - x->granule < c->base || (a == c->base + c->size && !joined(x, i)))
    return NULL;
  pp_xnode_t *n = c->map[granules(x, a - x->granule - c->base)];
  return n != NULL && n->base + n->size == a ? n : NULL;
}

static pp_xnode_t *right_of(const pp_extents_t *x, uintptr_t a) {
  size_t i = chunk_index(x, a);
  if (i == x->nchunks ||
      (a == x->chunks[i]->base && (i == 0 || !joined(x, i - 1))))
    return NULL;
  const pp_xchunk_t *c = x->chunks[i];
  pp_xnode_t *n = c->map[granules(x, a - c->base)];
  return n != NULL && n->base == a ? n : NULL;
}

/* Merge [b, b + size) (free, in no extent) with its free neighbours into
 * one extent; n0: a spare node for it when it has no left neighbour. */
static pp_xnode_t *merge_free(pp_extents_t *x, uintptr_t b, size_t size) {
  pp_xnode_t *left = left_of(x, b), *right = right_of(x, b + size);
  pp_xnode_t *n;
  if (left != NULL) {
    unlink_free(x, left);
    left->size += size;
    n = left;
  } else {
    n = spare_get(x);
    *n = (pp_xnode_t){b, size, NULL, NULL, 0};
  }
  if (right != NULL) {
    unlink_free(x, right);
    n->size += right->size;
    spare_put(x, right);
  }
  link_free(x, n);
  return n;
}

int pp_ext_add_chunk(pp_extents_t *x, void *base, size_t size, unsigned flags) {
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
  /* Sorted by address, for chunk_index's binary search. */
  size_t i = x->nchunks++;
  for (; i > 0 && x->chunks[i - 1]->base > c->base; i--)
    x->chunks[i] = x->chunks[i - 1];
  x->chunks[i] = c;
  /* A new free range: it merges with a free end of a neighbour it joins. */
  spare_put(x, n);
  (void)merge_free(x, c->base, size);
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
  if (flags != NULL) /* every chunk of a run has the same flags */
    *flags = x->chunks[chunk_index(x, out)]->flags;
  return (void *)out;
}

void pp_ext_give(pp_extents_t *x, void *ptr, size_t size) {
  uintptr_t b = (uintptr_t)ptr;
  pp_assert(size % x->granule == 0 && chunk_index(x, b) < x->nchunks &&
            chunk_index(x, b + size - x->granule) < x->nchunks);
  pp_assert(x->outstanding > 0 && x->nspare >= x->outstanding);
  x->outstanding--;
  pp_xnode_t *n = merge_free(x, b, size);
  x->free_bytes += size;
  /* The chunks the range touched that are all free from now. */
  for (size_t i = chunk_index(x, b);
       i < x->nchunks && x->chunks[i]->base < b + size; i++) {
    pp_xchunk_t *c = x->chunks[i];
    if (n->base <= c->base && c->base + c->size <= n->base + n->size)
      c->seq = x->next_seq++;
  }
  spare_trim(x);
}

void pp_ext_chunk_info(const pp_xchunk_t *c, uintptr_t *base, size_t *size,
                       unsigned *flags) {
  *base = c->base;
  *size = c->size;
  *flags = c->flags;
}

/* Calls fn(x, extent, chunk index, arg) for every chunk that lies wholly
 * inside a free extent and has none of skip_flags. */
static void each_free_chunk(const pp_extents_t *x, unsigned skip_flags,
                            void (*fn)(const pp_extents_t *, pp_xnode_t *,
                                       size_t, void *),
                            void *arg) {
  for (unsigned b = 0; b < PP_NCLASSES; b++)
    for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next)
      for (size_t i = chunk_index(x, n->base);
           i < x->nchunks && x->chunks[i]->base < n->base + n->size; i++) {
        const pp_xchunk_t *c = x->chunks[i];
        if (!(c->flags & skip_flags) && n->base <= c->base &&
            c->base + c->size <= n->base + n->size)
          fn(x, n, i, arg);
      }
}

typedef struct oldest {
  pp_xnode_t *n;
  size_t i;
  uint64_t seq;
  size_t count, bytes;
} oldest_t;

static void pick_oldest(const pp_extents_t *x, pp_xnode_t *n, size_t i,
                        void *arg) {
  oldest_t *o = arg;
  o->count++;
  o->bytes += x->chunks[i]->size;
  if (o->n == NULL || x->chunks[i]->seq < o->seq)
    *o = (oldest_t){n, i, x->chunks[i]->seq, o->count, o->bytes};
}

bool pp_ext_remove_free_chunk(pp_extents_t *x, unsigned skip_flags, void **base,
                              size_t *size, unsigned *flags) {
  oldest_t o = {NULL, 0, 0, 0, 0};
  each_free_chunk(x, skip_flags, pick_oldest, &o);
  if (o.n == NULL)
    return false;
  pp_xchunk_t *c = x->chunks[o.i];
  pp_xnode_t *n = o.n;
  uintptr_t nb = n->base, ne = n->base + n->size;
  uintptr_t cb = c->base, ce = c->base + c->size;
  /* Cut the chunk out of its extent: what is left on either side stays
   * free (in the neighbouring chunks of the run). */
  bool split = ce < ne && nb < cb; /* free on both sides: a node more */
  if (split && x->nspare <= x->outstanding) {
    pp_xnode_t *spare = malloc(sizeof *spare);
    if (spare == NULL)
      return false; /* nothing changed: the chunk stays */
    spare_put(x, spare);
  }
  unlink_free(x, n);
  pp_xnode_t *right = NULL;
  if (nb < cb) {
    n->size = (size_t)(cb - nb);
    link_free(x, n);
    if (split)
      right = spare_get(x);
  } else if (ce < ne) {
    right = n;
  } else {
    spare_put(x, n);
  }
  x->free_bytes -= c->size;
  x->total_bytes -= c->size;
  memmove(&x->chunks[o.i], &x->chunks[o.i + 1],
          (x->nchunks - o.i - 1) * sizeof(pp_xchunk_t *));
  x->nchunks--;
  if (right != NULL) { /* after the chunk left the table: slot() */
    *right = (pp_xnode_t){ce, (size_t)(ne - ce), NULL, NULL, 0};
    link_free(x, right);
  }
  spare_trim(x);
  *base = (void *)c->base;
  *size = c->size;
  *flags = c->flags;
  free(c->map);
  free(c);
  return true;
}

size_t pp_ext_free_chunks(const pp_extents_t *x, unsigned skip_flags,
                          size_t *bytes) {
  oldest_t o = {NULL, 0, 0, 0, 0};
  each_free_chunk(x, skip_flags, pick_oldest, &o);
  *bytes = o.bytes;
  return o.count;
}

static int range_cmp(const void *a, const void *b) {
  const pp_range_t *x = a, *y = b;
  return x->base < y->base ? -1 : x->base > y->base;
}

int pp_ext_view(const pp_extents_t *x, pp_chunk_view_t **chunks,
                size_t *nchunks, pp_range_t **free_out, size_t *nfree) {
  pp_chunk_view_t *c = malloc((x->nchunks + 1) * sizeof *c);
  pp_range_t *f = malloc((x->nfree + 1) * sizeof *f);
  if (c == NULL || f == NULL) {
    free(c);
    free(f);
    return PINPOOL_ENOMEM;
  }
  for (size_t i = 0; i < x->nchunks; i++)
    c[i] = (pp_chunk_view_t){x->chunks[i]->base, x->chunks[i]->size,
                             x->chunks[i]->flags};
  size_t n = 0;
  for (unsigned b = 0; b < PP_NCLASSES; b++)
    for (pp_xnode_t *e = x->bins[b]; e != NULL; e = e->next)
      f[n++] = (pp_range_t){e->base, e->size};
  qsort(f, n, sizeof *f, range_cmp);
  *chunks = c;
  *nchunks = x->nchunks;
  *free_out = f;
  *nfree = n;
  return 0;
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

/* [a, e) lies in one run of chunks. */
static bool in_one_run(const pp_extents_t *x, uintptr_t a, uintptr_t e);
bool pp_ext_run_holds(const pp_extents_t *x, uintptr_t base, size_t size,
                      unsigned flags) {
  size_t i = chunk_index(x, base);
  return i < x->nchunks && x->chunks[i]->flags == flags &&
         in_one_run(x, base, base + size);
}
static bool in_one_run(const pp_extents_t *x, uintptr_t a, uintptr_t e) {
  size_t i = chunk_index(x, a), j = chunk_index(x, e - x->granule);
  if (i == x->nchunks || j == x->nchunks)
    return false;
  for (size_t k = i; k < j; k++)
    if (!joined(x, k))
      return false;
  return true;
}

bool pp_ext_validate(const pp_extents_t *x, char *why, size_t len) {
  size_t sum = 0, count = 0;
  for (size_t i = 0; i + 1 < x->nchunks; i++)
    if (x->chunks[i]->base + x->chunks[i]->size > x->chunks[i + 1]->base) {
      (void)snprintf(why, len, "extents: chunks %#lx and %#lx overlap",
                     (unsigned long)x->chunks[i]->base,
                     (unsigned long)x->chunks[i + 1]->base);
      return false;
    }
  for (unsigned b = 0; b < PP_NCLASSES; b++) {
    bool bit = (x->nonempty[b / 64] >> (b % 64)) & 1;
    if (bit != (x->bins[b] != NULL)) {
      (void)snprintf(why, len, "extents: bin %u bitmap %d", b, (int)bit);
      return false;
    }
    for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next) {
      if (n->bin != b || bin_of(n->size) != b || n->size == 0 ||
          n->size % x->granule != 0 ||
          !in_one_run(x, n->base, n->base + n->size)) {
        (void)snprintf(why, len, "extents: free extent %#lx+%zu misplaced",
                       (unsigned long)n->base, n->size);
        return false;
      }
      if (*slot(x, n->base) != n ||
          *slot(x, n->base + n->size - x->granule) != n) {
        (void)snprintf(why, len, "extents: boundary map of %#lx+%zu",
                       (unsigned long)n->base, n->size);
        return false;
      }
      /* Fully coalesced: no free neighbour on either side in its run. */
      if (left_of(x, n->base) != NULL ||
          right_of(x, n->base + n->size) != NULL) {
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
