/*
 * Extents: the free space of the arena's chunks (arena.c), carved and
 * coalesced at a granule (a page).
 *
 * Free extents only have nodes (malloc'd: metadata never lives in pinned
 * memory, invariant 4). A node sits on the list of its size's bin (the
 * pool's size classes: eight per doubling), and its two ends are keys of
 * the boundary table (an open-addressing hash table: its start address,
 * and its end address tagged with bit 0), so that a give finds its free
 * neighbours in O(1) and merges with them. The table has about four slots
 * per extent that can exist, free or handed out: a few KiB for a steady
 * mix, in the cache, where the maps it replaced (a pointer per granule of
 * every chunk: 2 MiB per GiB) cost a cache miss at every end and their
 * chunk lookups were a quarter of a large block's round trip (W5).
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
 * Fit: the first extent large enough in the request's own bin (which may
 * also hold smaller ones), else one of the smallest non-empty bin above
 * it, whose every extent is large enough (a bit scan over the bins'
 * bitmap). The carve takes the extent's low end. Either way the extent
 * used is in the same size class as a best fit's, so at most one class
 * (12.5 %) larger, and a take fails only when no free extent is large
 * enough. bin_max keeps the scans of the own bin short: a bin is scanned
 * only when its largest extent may fit, and a scan that finds none makes
 * the bound exact, so a scan that fails follows the removal of the bin's
 * largest extent (tests/test_extent.c checks the class against a best fit
 * at every take). An earlier version looked at only 8 extents of the own
 * bin before the larger bins: a fit deeper in the list was passed over
 * for an extent of any size above (a 1,152 KiB request carved from a
 * 53 MiB extent; docs/verification.md). (Exact best fit and
 * address-ordered first fit measured no better on W2's mix:
 * docs/allocation-policy.md, "Fragmentation".)
 *
 * Nothing here fails after a take succeeded: there are always at least as
 * many spare nodes as extents handed out (a take makes one if needed), so
 * the give that merges with no neighbour (the one case that needs a new
 * node) never calls malloc.
 *
 * Not thread-safe: the owner holds its lock (the pool's seg_lock).
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FLAGS_OF_CHUNK (~0u) /* merge_free: the flags of b's chunk */

struct pp_xnode {
  uintptr_t base;
  size_t size;
  struct pp_xnode *prev, *next; /* bin list; spare list (next only) */
  unsigned bin;
  unsigned flags; /* its run's (every chunk of a run has the same) */
};

struct pp_xchunk {
  uintptr_t base;
  size_t size;
  unsigned flags; /* the backend's PP_SEG_* for the whole chunk */
  /* When the chunk last became all free (x->next_seq): the one free the
   * longest goes back to the backend first (the coldest memory). */
  uint64_t seq;
};

static unsigned bin_of(size_t size) { return pp_class_index(size); }

/* The bin of a free extent: its size class, in the second half if its run
 * is to be avoided. */
static unsigned bin_of_node(const pp_extents_t *x, const pp_xnode_t *n) {
  return bin_of(n->size) + ((n->flags & x->avoid) ? PP_EXT_HALF : 0u);
}

/* Index of the chunk containing a, or x->nchunks. The chunk found last is
 * tried first: a take or give looks up a few granules of one extent, most
 * in one chunk (W5: the binary search was 5 % of the time). x->last is
 * only a hint, checked against the table, so a stale one after a chunk
 * left costs a search, nothing else. */
static size_t chunk_index(const pp_extents_t *x, uintptr_t a) {
  const pp_range_t *r = x->ranges;
  size_t h = x->last;
  if (h < x->nchunks && a - r[h].base < r[h].size)
    return h;
  size_t lo = 0, hi = x->nchunks; /* the last chunk based at or below a */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r[mid].base <= a)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0 || a - r[lo - 1].base >= r[lo - 1].size)
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

static void bin_push(pp_extents_t *x, pp_xnode_t *n) {
  unsigned b = bin_of_node(x, n);
  n->bin = b;
  n->prev = NULL;
  n->next = x->bins[b];
  if (n->next != NULL)
    n->next->prev = n;
  x->bins[b] = n;
  x->nonempty[b / 64] |= (uint64_t)1 << (b % 64);
  if (n->size > x->bin_max[b])
    x->bin_max[b] = n->size;
}

static void bin_remove(pp_extents_t *x, pp_xnode_t *n) {
  if (n->prev != NULL)
    n->prev->next = n->next;
  else
    x->bins[n->bin] = n->next;
  if (n->next != NULL)
    n->next->prev = n->prev;
  if (x->bins[n->bin] == NULL) {
    x->nonempty[n->bin / 64] &= ~((uint64_t)1 << (n->bin % 64));
    x->bin_max[n->bin] = 0;
  }
}

/* ---- The boundary table ---------------------------------------------------
 * Keys: an extent's start address, and its end address | 1 (granules are
 * at least 2 bytes, so bit 0 is free); 0 marks an empty slot. Linear
 * probing, at most half full, deletion by shifting back (no tombstones).
 */

static inline uintptr_t end_key(uintptr_t end) { return end | 1; }

static inline size_t tab_home(const pp_extents_t *x, uintptr_t key) {
  /* Fibonacci hashing: the top bits of the product depend on every bit of
   * the key, the granule's zero low bits included. */
  return (size_t)((key * (uint64_t)0x9E3779B97F4A7C15u) >> x->tshift);
}

static pp_xnode_t *tab_find(const pp_extents_t *x, uintptr_t key) {
  size_t mask = x->tcap - 1;
  for (size_t i = tab_home(x, key);; i = (i + 1) & mask) {
    if (x->tab[i].key == key)
      return x->tab[i].node;
    if (x->tab[i].key == 0)
      return NULL;
  }
}

static void tab_put(pp_extents_t *x, uintptr_t key, pp_xnode_t *n) {
  size_t mask = x->tcap - 1;
  pp_assert(2 * (x->tcount + 1) <= x->tcap);
  size_t i = tab_home(x, key);
  while (x->tab[i].key != 0) {
    pp_assert(x->tab[i].key != key);
    i = (i + 1) & mask;
  }
  x->tab[i] = (pp_xslot_t){key, n};
  x->tcount++;
}

static void tab_del(pp_extents_t *x, uintptr_t key) {
  size_t mask = x->tcap - 1;
  size_t i = tab_home(x, key);
  while (x->tab[i].key != key) {
    pp_assert(x->tab[i].key != 0);
    i = (i + 1) & mask;
  }
  /* Shift back every later entry of the cluster that may move into the
   * hole: one whose home is not cyclically in (hole, its slot]. */
  for (size_t j = (i + 1) & mask; x->tab[j].key != 0; j = (j + 1) & mask) {
    size_t h = tab_home(x, x->tab[j].key);
    if (((j - h) & mask) >= ((j - i) & mask)) {
      x->tab[i] = x->tab[j];
      i = j;
    }
  }
  x->tab[i] = (pp_xslot_t){0, NULL};
  x->tcount--;
}

/* Point the existing key at another node. */
static void tab_set(pp_extents_t *x, uintptr_t key, pp_xnode_t *n) {
  size_t mask = x->tcap - 1;
  size_t i = tab_home(x, key);
  while (x->tab[i].key != key) {
    pp_assert(x->tab[i].key != 0);
    i = (i + 1) & mask;
  }
  x->tab[i].node = n;
}

/* Room for the ends of `extents` extents (at most half full). */
static bool tab_reserve(pp_extents_t *x, size_t extents) {
  size_t need = 4 * extents;
  if (need <= x->tcap)
    return true;
  size_t cap = x->tcap == 0 ? 64 : x->tcap;
  while (cap < need)
    cap *= 2;
  pp_xslot_t *t = calloc(cap, sizeof *t);
  if (t == NULL)
    return false;
  pp_xslot_t *old = x->tab;
  size_t ocap = x->tcap;
  x->tab = t;
  x->tcap = cap;
  x->tshift = 64u - (unsigned)__builtin_ctzll(cap);
  x->tcount = 0;
  for (size_t i = 0; i < ocap; i++)
    if (old[i].key != 0)
      tab_put(x, old[i].key, old[i].node);
  free(old);
  return true;
}

/* Room for every extent that can exist once one more is made: each one
 * handed out may come back as an extent of its own. Called before any
 * change by every operation that may add an extent (and may fail), so
 * that a give never needs to allocate. */
static bool room_for_one_more(pp_extents_t *x) {
  return tab_reserve(x, x->nfree + x->outstanding + 1);
}

/* Enter n (free) into its bin and the boundary table. */
static void link_free(pp_extents_t *x, pp_xnode_t *n) {
  bin_push(x, n);
  tab_put(x, n->base, n);
  tab_put(x, end_key(n->base + n->size), n);
  x->nfree++;
}

static void unlink_free(pp_extents_t *x, pp_xnode_t *n) {
  bin_remove(x, n);
  tab_del(x, n->base);
  tab_del(x, end_key(n->base + n->size));
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
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++)
    for (pp_xnode_t *n = x->bins[b], *next; n != NULL; n = next) {
      next = n->next;
      free(n);
    }
  for (pp_xnode_t *n = x->spare, *next; n != NULL; n = next) {
    next = n->next;
    free(n);
  }
  for (size_t i = 0; i < x->nchunks; i++)
    free(x->chunks[i]);
  free(x->chunks);
  free(x->ranges);
  free(x->runs);
  free(x->tab);
  memset(x, 0, sizeof *x);
}

/* Address a (a granule boundary) is where a run starts: extents may not
 * merge across it. Asked only when a free neighbour was found there: a
 * binary search of the run starts (one for the host backend's arena, whose
 * chunks are placed side by side). */
static bool run_starts_at(const pp_extents_t *x, uintptr_t a) {
  size_t lo = 0, hi = x->nruns;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (x->runs[mid] < a)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < x->nruns && x->runs[lo] == a;
}

/* After the chunks changed: their run starts (x->runs has room for
 * nchunks). */
static void runs_rebuild(pp_extents_t *x) {
  x->nruns = 0;
  for (size_t i = 0; i < x->nchunks; i++)
    if (i == 0 || !joined(x, i - 1))
      x->runs[x->nruns++] = x->ranges[i].base;
}

/* The free extent that ends at a (left) or starts at a (right), in the same
 * run as the granule on a's other side, or NULL. */
static pp_xnode_t *left_of(const pp_extents_t *x, uintptr_t a) {
  pp_xnode_t *n = tab_find(x, end_key(a));
  return n != NULL && !run_starts_at(x, a) ? n : NULL;
}

static pp_xnode_t *right_of(const pp_extents_t *x, uintptr_t a) {
  pp_xnode_t *n = tab_find(x, a);
  return n != NULL && !run_starts_at(x, a) ? n : NULL;
}

/* Merge [b, b + size) (free, in no extent, in a run with these flags) with
 * its free neighbours into one extent (a spare node for it when it has no
 * left neighbour). */
static pp_xnode_t *merge_free(pp_extents_t *x, uintptr_t b, size_t size,
                              unsigned flags) {
  uintptr_t e = b + size;
  pp_xnode_t *left = left_of(x, b), *right = right_of(x, e);
  /* Only the keys that change are touched (the table is most of a give's
   * time): the ends that meet at b and e go, the outer ends stay. */
  if (left != NULL && right != NULL) {
    bin_remove(x, left);
    bin_remove(x, right);
    tab_del(x, end_key(b));
    tab_del(x, e);
    tab_set(x, end_key(right->base + right->size), left);
    left->size += size + right->size;
    bin_push(x, left);
    spare_put(x, right);
    x->nfree--;
    return left;
  }
  if (left != NULL) {
    bin_remove(x, left);
    tab_del(x, end_key(b));
    tab_put(x, end_key(e), left);
    left->size += size;
    bin_push(x, left);
    return left;
  }
  if (right != NULL) {
    bin_remove(x, right);
    tab_del(x, e);
    tab_put(x, b, right);
    right->base = b;
    right->size += size;
    bin_push(x, right);
    return right;
  }
  if (flags == FLAGS_OF_CHUNK) /* a give: its chunk's, looked up once */
    flags = x->chunks[chunk_index(x, b)]->flags;
  pp_xnode_t *n = spare_get(x);
  *n = (pp_xnode_t){b, size, NULL, NULL, 0, flags};
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
  pp_range_t *rs = realloc(x->ranges, (x->nchunks + 1) * sizeof(pp_range_t));
  if (rs != NULL)
    x->ranges = rs;
  uintptr_t *ru = realloc(x->runs, (x->nchunks + 1) * sizeof(uintptr_t));
  if (ru != NULL)
    x->runs = ru;
  if (c == NULL || n == NULL || cs == NULL || rs == NULL || ru == NULL ||
      !room_for_one_more(x)) {
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
  for (; i > 0 && x->chunks[i - 1]->base > c->base; i--) {
    x->chunks[i] = x->chunks[i - 1];
    x->ranges[i] = x->ranges[i - 1];
  }
  x->chunks[i] = c;
  x->ranges[i] = (pp_range_t){c->base, size};
  runs_rebuild(x);
  /* A new free range: it merges with a free end of a neighbour it joins. */
  spare_put(x, n);
  (void)merge_free(x, c->base, size, flags);
  x->free_bytes += size;
  x->total_bytes += size;
  if (x->min_chunk == 0 || size < x->min_chunk)
    x->min_chunk = size;
  return 0;
}

/* The node of a free extent of at least `size` bytes in the half of the
 * bins that starts at `half`, or NULL ("Fit" above). */
static pp_xnode_t *fit_in(pp_extents_t *x, size_t size, unsigned half) {
  unsigned b = half + bin_of(size);
  if (x->bin_max[b] >= size) {
    size_t most = 0;
    for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next) {
      if (n->size >= size)
        return n;
      most = n->size > most ? n->size : most;
    }
    x->bin_max[b] = most; /* exact now: no scan until a larger one comes */
  }
  /* Bins above b hold only extents larger than class(b) >= size. */
  for (unsigned w = (b + 1) / 64; w < half / 64 + PP_EXT_BIN_WORDS; w++) {
    uint64_t m = x->nonempty[w];
    if (w == (b + 1) / 64)
      m &= ~(uint64_t)0 << ((b + 1) % 64);
    if (m != 0)
      return x->bins[w * 64 + (unsigned)__builtin_ctzll(m)];
  }
  return NULL;
}

/* The preferred memory first: pageable fallback chunks serve a request
 * only when no pinned extent is large enough. */
static pp_xnode_t *fit(pp_extents_t *x, size_t size) {
  pp_xnode_t *n = fit_in(x, size, 0);
  return n != NULL || x->avoid == 0 ? n : fit_in(x, size, PP_EXT_HALF);
}

void *pp_ext_take(pp_extents_t *x, size_t size, unsigned *flags) {
  if (size == 0 || size % x->granule != 0)
    return NULL;
  pp_xnode_t *n = fit(x, size);
  if (n == NULL)
    return NULL;
  /* The node and the table room this extent's give may need. */
  if (!room_for_one_more(x))
    return NULL;
  if (x->nspare <= x->outstanding) {
    pp_xnode_t *spare = malloc(sizeof *spare);
    if (spare == NULL)
      return NULL;
    spare_put(x, spare);
  }
  uintptr_t out = n->base;
  unsigned nflags = n->flags;
  if (n->size > size) { /* the low end goes: only the start key moves */
    bin_remove(x, n);
    tab_del(x, out);
    n->base += size;
    n->size -= size;
    tab_put(x, n->base, n);
    bin_push(x, n);
  } else {
    unlink_free(x, n);
    spare_put(x, n);
  }
  x->free_bytes -= size;
  x->outstanding++;
  if (flags != NULL)
    *flags = nflags;
  return (void *)out;
}

void pp_ext_give(pp_extents_t *x, void *ptr, size_t size) {
  uintptr_t b = (uintptr_t)ptr;
  pp_assert(size % x->granule == 0 && chunk_index(x, b) < x->nchunks &&
            chunk_index(x, b + size - x->granule) < x->nchunks);
  pp_assert(x->outstanding > 0 && x->nspare >= x->outstanding);
  x->outstanding--;
  pp_xnode_t *n = merge_free(x, b, size, FLAGS_OF_CHUNK);
  x->free_bytes += size;
  /* The chunks the range touched that are all free from now (none unless
   * the extent is at least as large as the smallest chunk). */
  for (size_t i = n->size < x->min_chunk ? x->nchunks : chunk_index(x, b);
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
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++)
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
  uint64_t key; /* pick_oldest's order */
  size_t count, bytes;
} oldest_t;

static void pick_oldest(const pp_extents_t *x, pp_xnode_t *n, size_t i,
                        void *arg) {
  oldest_t *o = arg;
  o->count++;
  o->bytes += x->chunks[i]->size;
  /* Chunks to avoid (pageable fallbacks) go first, then the one free the
   * longest. */
  uint64_t key = x->chunks[i]->seq |
                 ((x->chunks[i]->flags & x->avoid) ? 0 : (uint64_t)1 << 63);
  if (o->n == NULL || key < o->key)
    *o = (oldest_t){n, i, key, o->count, o->bytes};
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
  unsigned nflags = n->flags;
  if (split) { /* nothing changed if this fails: the chunk stays */
    if (!room_for_one_more(x))
      return false;
    if (x->nspare <= x->outstanding) {
      pp_xnode_t *spare = malloc(sizeof *spare);
      if (spare == NULL)
        return false;
      spare_put(x, spare);
    }
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
  memmove(&x->ranges[o.i], &x->ranges[o.i + 1],
          (x->nchunks - o.i - 1) * sizeof(pp_range_t));
  x->nchunks--;
  runs_rebuild(x);
  x->min_chunk = 0;
  for (size_t i = 0; i < x->nchunks; i++)
    if (x->min_chunk == 0 || x->ranges[i].size < x->min_chunk)
      x->min_chunk = x->ranges[i].size;
  if (right != NULL) {
    *right = (pp_xnode_t){ce, (size_t)(ne - ce), NULL, NULL, 0, nflags};
    link_free(x, right);
  }
  spare_trim(x);
  *base = (void *)c->base;
  *size = c->size;
  *flags = c->flags;
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
                             x->chunks[i]->flags, 0};
  size_t n = 0;
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++)
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
  size_t best = 0;
  for (unsigned half = 0; half < 2; half++)
    for (unsigned w = PP_EXT_BIN_WORDS; w-- > 0;) {
      uint64_t m = x->nonempty[half * PP_EXT_BIN_WORDS + w];
      if (m == 0)
        continue;
      unsigned b =
          half * PP_EXT_HALF + w * 64 + 63u - (unsigned)__builtin_clzll(m);
      for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next)
        if (n->size > best)
          best = n->size;
      break;
    }
  return best;
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
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++) {
    bool bit = (x->nonempty[b / 64] >> (b % 64)) & 1;
    if (bit != (x->bins[b] != NULL)) {
      (void)snprintf(why, len, "extents: bin %u bitmap %d", b, (int)bit);
      return false;
    }
    for (pp_xnode_t *n = x->bins[b]; n != NULL; n = n->next) {
      if (n->size > x->bin_max[b]) {
        (void)snprintf(why, len,
                       "extents: %#lx+%zu above its bin's bound %zu (a fit "
                       "would be passed over)",
                       (unsigned long)n->base, n->size, x->bin_max[b]);
        return false;
      }
      if (n->bin != b || bin_of_node(x, n) != b || n->size == 0 ||
          n->size % x->granule != 0 ||
          !in_one_run(x, n->base, n->base + n->size)) {
        (void)snprintf(why, len, "extents: free extent %#lx+%zu misplaced",
                       (unsigned long)n->base, n->size);
        return false;
      }
      if (tab_find(x, n->base) != n ||
          tab_find(x, end_key(n->base + n->size)) != n) {
        (void)snprintf(why, len, "extents: boundary table of %#lx+%zu",
                       (unsigned long)n->base, n->size);
        return false;
      }
      size_t ci = chunk_index(x, n->base);
      if (n->flags != x->chunks[ci]->flags) {
        (void)snprintf(why, len, "extents: %#lx+%zu has flags %#x, its run %#x",
                       (unsigned long)n->base, n->size, n->flags,
                       x->chunks[ci]->flags);
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
  if (sum != x->free_bytes || count != x->nfree || x->tcount != 2 * count) {
    (void)snprintf(why, len,
                   "extents: %zu free bytes in %zu extents listed, "
                   "%zu in %zu counted, %zu boundary keys",
                   sum, count, x->free_bytes, x->nfree, x->tcount);
    return false;
  }
  return true;
}
