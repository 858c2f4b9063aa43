/*
 * Extents: the free space of the arena's chunks (arena.c), carved and
 * coalesced at a granule (a page).
 *
 * Free extents only have nodes (malloc'd: metadata never lives in pinned
 * memory, invariant 4). A node sits in the tree of its size's bin (the
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
 * Bins. Each bin is an AVL tree (intrusive: the links are in the nodes,
 * so a give allocates nothing) ordered by size, then address. A bin may
 * hold extents smaller than a request of its class; the tree finds the
 * smallest one that fits in O(log n), where the list it replaces was
 * walked first-fit and, once the bin's largest extent was taken, walked
 * end to end by every request of that size (issue 38: 9.5x per 10x
 * extents). The largest free extent is the rightmost node of the top
 * non-empty bin: O(log n), not a walk of that bin (pinpool_get_stats).
 *
 * Fit: the smallest extent large enough in the request's own bin, else
 * the smallest of the smallest non-empty bin above it (a bit scan over
 * the bins' bitmap), whose every extent is large enough; among equal
 * sizes the lowest address. That is a best fit: the extent used is in the
 * same size class as a best fit's (the bound tests/test_extent.c checks
 * at every take), and a take fails only when no free extent is large
 * enough. The carve takes the extent's low end. (An earlier version
 * looked at only 8 extents of the own bin before the larger bins: a fit
 * deeper in the list was passed over for an extent of any size above, a
 * 1,152 KiB request carved from a 53 MiB extent; docs/verification.md.
 * Exact best fit measured no worse than the first fit of the lists on
 * W2's mix: docs/allocation-policy.md, "Fragmentation".)
 *
 * Free chunks. A chunk that lies wholly inside a free extent ("whole")
 * is on a list in the order it became whole (its seq), with the node of
 * the extent that holds it, so that the release of the one free the
 * longest (the caps on every free, empty_cache) takes O(1) where it
 * walked every free extent (issue 38: 616 us per free at 30,000 extents).
 * The lists change only where a chunk can become whole or stop being so,
 * each time over the chunks of the range that changed (none unless it is
 * at least the smallest chunk): a give (the chunks of the range given),
 * a take (the chunks of the range carved), a give that merges two
 * neighbours (the node of the one that spans fewer chunks goes, and its
 * whole chunks are repointed: O(log chunks) amortized), a chunk added or
 * cut out.
 *
 * The meter (x->work, arena.h) counts the elements each call visits, so
 * that tests bound the work per call by counting, not by timing.
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
  struct pp_xnode *left, *right; /* bin tree; spare list (right only) */
  unsigned bin;
  unsigned height; /* in its bin's tree: 1 for a leaf */
  unsigned flags;  /* its run's (every chunk of a run has the same) */
};

struct pp_xchunk {
  uintptr_t base;
  size_t size;
  unsigned flags; /* the backend's PP_SEG_* for the whole chunk */
  /* When the chunk last became all free (x->next_seq): the one free the
   * longest goes back to the backend first (the coldest memory). */
  uint64_t seq;
  /* Whole (wholly inside a free extent): on x->whole_head[], with the
   * node of that extent ("Free chunks"). */
  bool whole;
  struct pp_xnode *ext;
  struct pp_xchunk *wprev, *wnext;
  /* The chunk tree ("The chunk tree"): children, height, the chunks in
   * this subtree; and the address list. */
  struct pp_xchunk *cleft, *cright, *prev, *next;
  size_t count;
  unsigned cheight;
};

/* The meter: the elements a call visited, its most kept (arena.h). */
static void meter_end(const pp_extents_t *cx, uint64_t w0) {
  pp_extents_t *x = (pp_extents_t *)cx; /* a count, not the structure */
  if (x->work - w0 > x->work_max)
    x->work_max = x->work - w0;
}
#define METER(x) (((pp_extents_t *)(x))->work++)

static unsigned bin_of(size_t size) { return pp_class_index(size); }

/* The bin of a free extent: its size class, in the second half if its run
 * is to be avoided. */
static unsigned bin_of_node(const pp_extents_t *x, const pp_xnode_t *n) {
  return bin_of(n->size) + ((n->flags & x->avoid) ? PP_EXT_HALF : 0u);
}

/* ---- The chunk tree ------------------------------------------------------
 * The chunks by address: an AVL tree (the bins' kind, recursive: depth
 * under 1.44 log2 chunks) whose nodes count their subtree, so that the
 * chunks between two addresses are a difference of ranks, and a list in
 * address order (prev/next) for the walks over a range. Adding or
 * releasing a chunk rebalances one path: O(log chunks), metered. Runs are
 * not stored: a run starts at a chunk whose list neighbour below does not
 * join it (joined), an O(1) question once the chunk is found. */

static size_t ccount(const pp_xchunk_t *t) { return t != NULL ? t->count : 0; }
static unsigned cheight(const pp_xchunk_t *t) {
  return t != NULL ? t->cheight : 0;
}

static void cfix(pp_xchunk_t *t) {
  unsigned l = cheight(t->cleft), r = cheight(t->cright);
  t->cheight = 1 + (l > r ? l : r);
  t->count = 1 + ccount(t->cleft) + ccount(t->cright);
}

static pp_xchunk_t *crot_right(pp_xchunk_t *t) {
  pp_xchunk_t *l = t->cleft;
  t->cleft = l->cright;
  l->cright = t;
  cfix(t);
  cfix(l);
  return l;
}

static pp_xchunk_t *crot_left(pp_xchunk_t *t) {
  pp_xchunk_t *r = t->cright;
  t->cright = r->cleft;
  r->cleft = t;
  cfix(t);
  cfix(r);
  return r;
}

static pp_xchunk_t *cbalance(pp_extents_t *x, pp_xchunk_t *t) {
  METER(x);
  cfix(t);
  if (cheight(t->cleft) > cheight(t->cright) + 1) {
    if (cheight(t->cleft->cleft) < cheight(t->cleft->cright))
      t->cleft = crot_left(t->cleft);
    return crot_right(t);
  }
  if (cheight(t->cright) > cheight(t->cleft) + 1) {
    if (cheight(t->cright->cright) < cheight(t->cright->cleft))
      t->cright = crot_right(t->cright);
    return crot_left(t);
  }
  return t;
}

static pp_xchunk_t *cinsert(pp_extents_t *x, pp_xchunk_t *t, pp_xchunk_t *c) {
  if (t == NULL) {
    c->cleft = c->cright = NULL;
    cfix(c);
    return c;
  }
  if (c->base < t->base)
    t->cleft = cinsert(x, t->cleft, c);
  else
    t->cright = cinsert(x, t->cright, c);
  return cbalance(x, t);
}

static pp_xchunk_t *cremove_min(pp_extents_t *x, pp_xchunk_t *t,
                                pp_xchunk_t **min) {
  if (t->cleft == NULL) {
    *min = t;
    return t->cright;
  }
  t->cleft = cremove_min(x, t->cleft, min);
  return cbalance(x, t);
}

static pp_xchunk_t *cremove(pp_extents_t *x, pp_xchunk_t *t,
                            const pp_xchunk_t *c) {
  pp_assert(t != NULL);
  if (c->base < t->base) {
    t->cleft = cremove(x, t->cleft, c);
  } else if (c->base > t->base) {
    t->cright = cremove(x, t->cright, c);
  } else {
    if (t->cleft == NULL || t->cright == NULL)
      return t->cleft != NULL ? t->cleft : t->cright;
    pp_xchunk_t *m;
    pp_xchunk_t *r = cremove_min(x, t->cright, &m);
    m->cleft = t->cleft;
    m->cright = r;
    t = m;
  }
  return cbalance(x, t);
}

/* The chunk containing a, or NULL. The chunk found last is tried first: a
 * take or give looks up a few granules of one extent, most in one chunk
 * (W5: the search was 5 % of the time). x->last is only a hint, cleared
 * when its chunk goes. A lookup is not metered (it never was: its cost is
 * the depth, O(log chunks)). */
static pp_xchunk_t *chunk_at(const pp_extents_t *x, uintptr_t a) {
  pp_xchunk_t *h = x->last;
  if (h != NULL && a - h->base < h->size)
    return h;
  pp_xchunk_t *best = NULL; /* the last chunk based at or below a */
  for (pp_xchunk_t *t = x->ctree; t != NULL;)
    if (t->base <= a) {
      best = t;
      t = t->cright;
    } else {
      t = t->cleft;
    }
  if (best == NULL || a - best->base >= best->size)
    return NULL;
  ((pp_extents_t *)x)->last = best; /* a hint: see above */
  return best;
}

/* The chunks of the tree below c (c in it). */
static size_t chunk_rank(const pp_extents_t *x, const pp_xchunk_t *c) {
  size_t r = 0;
  for (const pp_xchunk_t *t = x->ctree; t != NULL;) {
    METER(x);
    if (c->base < t->base) {
      t = t->cleft;
    } else if (c->base > t->base) {
      r += ccount(t->cleft) + 1;
      t = t->cright;
    } else {
      return r + ccount(t->cleft);
    }
  }
  pp_assert(!"chunk not in the tree");
  return r;
}

pp_xchunk_t *pp_ext_chunk_of(const pp_extents_t *x, const void *p) {
  return chunk_at(x, (uintptr_t)p);
}

pp_xchunk_t *pp_ext_first(const pp_extents_t *x) { return x->cfirst; }
pp_xchunk_t *pp_ext_next(const pp_xchunk_t *c) { return c->next; }

/* Chunk a and the next one b are one run: a free extent may cross between
 * them. */
static bool joined(const pp_extents_t *x, const pp_xchunk_t *a,
                   const pp_xchunk_t *b) {
  return x->span && a != NULL && b != NULL && a->base + a->size == b->base &&
         a->flags == b->flags;
}

/* ---- The bins' trees ("Bins"): AVL, by (size, base), recursive (the
 * depth is at most 1.44 log2 of a bin's extents: under 40). ----------- */

static bool before(const pp_xnode_t *a, const pp_xnode_t *b) {
  return a->size < b->size || (a->size == b->size && a->base < b->base);
}

static unsigned height(const pp_xnode_t *n) {
  return n != NULL ? n->height : 0;
}

static pp_xnode_t *fix(pp_xnode_t *n) {
  unsigned l = height(n->left), r = height(n->right);
  n->height = 1 + (l > r ? l : r);
  return n;
}

static pp_xnode_t *rot_right(pp_xnode_t *n) {
  pp_xnode_t *l = n->left;
  n->left = l->right;
  l->right = fix(n);
  return fix(l);
}

static pp_xnode_t *rot_left(pp_xnode_t *n) {
  pp_xnode_t *r = n->right;
  n->right = r->left;
  r->left = fix(n);
  return fix(r);
}

static pp_xnode_t *rebalance(pp_xnode_t *n) {
  fix(n);
  unsigned l = height(n->left), r = height(n->right);
  if (l > r + 1) {
    if (height(n->left->left) < height(n->left->right))
      n->left = rot_left(n->left);
    return rot_right(n);
  }
  if (r > l + 1) {
    if (height(n->right->right) < height(n->right->left))
      n->right = rot_right(n->right);
    return rot_left(n);
  }
  return n;
}

static pp_xnode_t *tree_insert(pp_extents_t *x, pp_xnode_t *t, pp_xnode_t *n) {
  if (t == NULL) {
    n->left = n->right = NULL;
    n->height = 1;
    return n;
  }
  METER(x);
  if (before(n, t))
    t->left = tree_insert(x, t->left, n);
  else
    t->right = tree_insert(x, t->right, n);
  return rebalance(t);
}

static pp_xnode_t *tree_remove_min(pp_extents_t *x, pp_xnode_t *t,
                                   pp_xnode_t **min) {
  METER(x);
  if (t->left == NULL) {
    *min = t;
    return t->right;
  }
  t->left = tree_remove_min(x, t->left, min);
  return rebalance(t);
}

/* n is in t, with the key it was inserted with. */
static pp_xnode_t *tree_remove(pp_extents_t *x, pp_xnode_t *t,
                               const pp_xnode_t *n) {
  pp_assert(t != NULL);
  METER(x);
  if (t == n) {
    if (t->left == NULL)
      return t->right;
    if (t->right == NULL)
      return t->left;
    pp_xnode_t *m;
    pp_xnode_t *r = tree_remove_min(x, t->right, &m);
    m->left = t->left;
    m->right = r;
    return rebalance(m);
  }
  if (before(n, t))
    t->left = tree_remove(x, t->left, n);
  else
    t->right = tree_remove(x, t->right, n);
  return rebalance(t);
}

static pp_xnode_t *tree_min(const pp_extents_t *x, pp_xnode_t *t) {
  for (METER(x); t->left != NULL; METER(x))
    t = t->left;
  return t;
}

static pp_xnode_t *tree_max(const pp_extents_t *x, pp_xnode_t *t) {
  for (METER(x); t->right != NULL; METER(x))
    t = t->right;
  return t;
}

/* The smallest node of t of at least `size` bytes, or NULL. */
static pp_xnode_t *tree_ceil(const pp_extents_t *x, pp_xnode_t *t,
                             size_t size) {
  pp_xnode_t *best = NULL;
  while (t != NULL) {
    METER(x);
    if (t->size >= size) {
      best = t;
      t = t->left;
    } else {
      t = t->right;
    }
  }
  return best;
}

/* fn(x, node, arg) for every node of t, in order. */
static void tree_each(const pp_extents_t *x, pp_xnode_t *t,
                      void (*fn)(const pp_extents_t *, pp_xnode_t *, void *),
                      void *arg) {
  for (; t != NULL; t = t->right) {
    METER(x);
    tree_each(x, t->left, fn, arg);
    fn(x, t, arg);
  }
}

static void each_node(const pp_extents_t *x,
                      void (*fn)(const pp_extents_t *, pp_xnode_t *, void *),
                      void *arg) {
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++)
    tree_each(x, x->bins[b], fn, arg);
}

/* Most bins of a steady mix hold one extent or none (W5: about 10 free
 * extents over 40 bins): those cases skip the trees' descents. */
static bool alone(const pp_extents_t *x, const pp_xnode_t *n) {
  return x->bins[n->bin] == n && n->left == NULL && n->right == NULL;
}

static void bin_push(pp_extents_t *x, pp_xnode_t *n) {
  unsigned b = bin_of_node(x, n);
  n->bin = b;
  if (x->bins[b] == NULL) {
    n->left = n->right = NULL;
    n->height = 1;
    x->bins[b] = n;
  } else {
    x->bins[b] = tree_insert(x, x->bins[b], n);
  }
  x->nonempty[b / 64] |= (uint64_t)1 << (b % 64);
}

static void bin_remove(pp_extents_t *x, pp_xnode_t *n) {
  x->bins[n->bin] = alone(x, n) ? NULL : tree_remove(x, x->bins[n->bin], n);
  if (x->bins[n->bin] == NULL)
    x->nonempty[n->bin / 64] &= ~((uint64_t)1 << (n->bin % 64));
}

/* n (free, in its bin) becomes [base, base + size) (a carve's rest, a
 * merge): left in place when it is its bin's only extent and stays in
 * that bin, else moved (two descents and their rebalancing). */
static void bin_resize(pp_extents_t *x, pp_xnode_t *n, uintptr_t base,
                       size_t size) {
  if (alone(x, n)) {
    unsigned b = n->bin;
    n->base = base;
    n->size = size;
    METER(x);
    if (bin_of_node(x, n) == b)
      return;
    x->bins[b] = NULL;
    x->nonempty[b / 64] &= ~((uint64_t)1 << (b % 64));
  } else {
    bin_remove(x, n); /* by its key: before the key changes */
    n->base = base;
    n->size = size;
  }
  bin_push(x, n);
}

/* ---- Whole free chunks ("Free chunks") ---------------------------------- */

static unsigned whole_list(const pp_extents_t *x, const pp_xchunk_t *c) {
  return (c->flags & x->avoid) ? 0 : 1; /* avoided ones go first */
}

/* c became whole, inside n's extent: the newest. */
static void whole_add(pp_extents_t *x, pp_xchunk_t *c, pp_xnode_t *n) {
  unsigned l = whole_list(x, c);
  pp_assert(!c->whole);
  c->whole = true;
  c->ext = n;
  c->seq = x->next_seq++;
  c->wnext = NULL;
  c->wprev = x->whole_tail[l];
  if (c->wprev != NULL)
    c->wprev->wnext = c;
  else
    x->whole_head[l] = c;
  x->whole_tail[l] = c;
}

static void whole_del(pp_extents_t *x, pp_xchunk_t *c) {
  unsigned l = whole_list(x, c);
  pp_assert(c->whole);
  if (c->wprev != NULL)
    c->wprev->wnext = c->wnext;
  else
    x->whole_head[l] = c->wnext;
  if (c->wnext != NULL)
    c->wnext->wprev = c->wprev;
  else
    x->whole_tail[l] = c->wprev;
  c->whole = false;
  c->ext = NULL;
}

/* The whole chunks inside [a, e) (a free extent's range) are now in n's
 * extent. */
static void whole_repoint(pp_extents_t *x, uintptr_t a, uintptr_t e,
                          pp_xnode_t *n) {
  if (e - a < x->min_chunk)
    return; /* no chunk lies wholly inside */
  for (pp_xchunk_t *c = chunk_at(x, a); c != NULL && c->base < e; c = c->next) {
    METER(x);
    if (c->whole)
      c->ext = n;
  }
}

/* ---- The boundary table ---------------------------------------------------
 * Keys: an extent's start address, and its end address | 1 (granules are
 * at least 2 bytes, so bit 0 is free); 0 marks an empty slot. Linear
 * probing, at most half full, deletion by shifting back (no tombstones).
 *
 * A doubling is done in pieces (issue 38 (s39); it rehashed every key in
 * the hold of the operation that crossed the mark: 65,536 slots at 10,000
 * free extents): the old slots stay beside the new ones, each key entered
 * moves TAB_STEP more old slots, and a lookup asks the new slots, then
 * the old. The old slots only lose keys, each marked MOVED (key 1: no
 * extent ends at address 0), so their probe runs stay whole and the
 * migration's cursor misses none. It ends long before the new slots fill:
 * a doubling starts with at most cap / 2 keys in 2 cap slots or more, and
 * ends within cap / TAB_STEP keys entered.
 */

#define TAB_STEP 16
#define MOVED ((uintptr_t)1)

static inline uintptr_t end_key(uintptr_t end) { return end | 1; }

static inline size_t slot_home(uintptr_t key, unsigned shift) {
  /* Fibonacci hashing: the top bits of the product depend on every bit of
   * the key, the granule's zero low bits included. */
  return (size_t)((key * (uint64_t)0x9E3779B97F4A7C15u) >> shift);
}

static inline size_t tab_home(const pp_extents_t *x, uintptr_t key) {
  return slot_home(key, x->tshift);
}

/* The slot of key in t (cap slots), or NULL. */
static inline __attribute__((always_inline)) pp_xslot_t *
slot_find(pp_xslot_t *t, size_t cap, unsigned shift, uintptr_t key) {
  size_t mask = cap - 1;
  for (size_t i = slot_home(key, shift);; i = (i + 1) & mask) {
    if (t[i].key == key)
      return &t[i];
    if (t[i].key == 0)
      return NULL;
  }
}

/* The slot of key: the new slots', else the old ones' (*old set). */
static inline __attribute__((always_inline)) pp_xslot_t *
tab_slot(const pp_extents_t *x, uintptr_t key, bool *old) {
  pp_xslot_t *s = slot_find(x->tab, x->tcap, x->tshift, key);
  *old = false;
  if (__builtin_expect(s == NULL && x->otab != NULL, 0)) {
    *old = true;
    s = slot_find(x->otab, x->ocap, x->oshift, key);
  }
  return s;
}

static pp_xnode_t *tab_find(const pp_extents_t *x, uintptr_t key) {
  bool old;
  pp_xslot_t *s = tab_slot(x, key, &old);
  return s == NULL ? NULL : s->node;
}

/* Key into the new slots (absent from both; room kept). */
static inline __attribute__((always_inline)) void
slot_put(pp_extents_t *x, uintptr_t key, pp_xnode_t *n) {
  size_t mask = x->tcap - 1;
  size_t i = tab_home(x, key);
  while (x->tab[i].key != 0) {
    pp_assert(x->tab[i].key != key);
    i = (i + 1) & mask;
  }
  x->tab[i] = (pp_xslot_t){key, n};
}

/* Move up to k old slots into the new ones; the old go when all have.
 * On the meter. */
static __attribute__((noinline)) void tab_migrate(pp_extents_t *x, size_t k) {
  if (x->otab == NULL)
    return;
  size_t end = x->ocap - x->omig > k ? x->omig + k : x->ocap;
  x->work += end - x->omig;
  for (size_t i = x->omig; i < end; i++) {
    pp_xslot_t *o = &x->otab[i];
    if (o->key != 0 && o->key != MOVED) {
      slot_put(x, o->key, o->node);
      *o = (pp_xslot_t){MOVED, NULL};
    }
  }
  x->omig = end;
  if (x->omig == x->ocap) {
    free(x->otab);
    x->otab = NULL;
    x->ocap = x->omig = 0;
  }
}

static void tab_put(pp_extents_t *x, uintptr_t key, pp_xnode_t *n) {
  pp_assert(2 * (x->tcount + 1) <= x->tcap);
  if (__builtin_expect(x->otab != NULL, 0))
    tab_migrate(x, TAB_STEP);
  pp_assert(tab_find(x, key) == NULL);
  slot_put(x, key, n);
  x->tcount++;
}

static void tab_del(pp_extents_t *x, uintptr_t key) {
  bool old;
  pp_xslot_t *s = tab_slot(x, key, &old);
  pp_assert(s != NULL);
  x->tcount--;
  if (old) {
    *s = (pp_xslot_t){MOVED, NULL}; /* the old slots' runs stay whole */
    return;
  }
  size_t mask = x->tcap - 1;
  size_t i = (size_t)(s - x->tab);
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
}

/* Point the existing key at another node. */
static void tab_set(pp_extents_t *x, uintptr_t key, pp_xnode_t *n) {
  bool old;
  pp_xslot_t *s = tab_slot(x, key, &old);
  pp_assert(s != NULL);
  s->node = n;
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
  /* A doubling starts when the last has ended (above); should one not
   * have, the rest moves here. */
  tab_migrate(x, SIZE_MAX);
  x->otab = x->tab;
  x->ocap = x->tcap;
  x->oshift = x->tshift;
  x->omig = 0;
  x->tab = t;
  x->tcap = cap;
  x->tshift = 64u - (unsigned)__builtin_ctzll(cap);
  if (x->otab == NULL)
    x->ocap = 0;
#ifdef PINPOOL_MUTANT_XTAB_ONE_HOLD
  /* Mutant (docs/verification.md): every old slot in this hold. */
  tab_migrate(x, SIZE_MAX);
#endif
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
  x->spare = n->right;
  x->nspare--;
  return n;
}

static void spare_put(pp_extents_t *x, pp_xnode_t *n) {
  n->right = x->spare;
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

static void tree_free(pp_xnode_t *t) {
  while (t != NULL) {
    pp_xnode_t *r = t->right;
    tree_free(t->left);
    free(t);
    t = r;
  }
}

void pp_ext_fini(pp_extents_t *x) {
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++)
    tree_free(x->bins[b]);
  for (pp_xnode_t *n = x->spare, *next; n != NULL; n = next) {
    next = n->right;
    free(n);
  }
  for (pp_xchunk_t *c = x->cfirst, *next; c != NULL; c = next) {
    next = c->next;
    free(c);
  }
  free(x->tab);
  free(x->otab);
  memset(x, 0, sizeof *x);
}

/* Address a (a granule boundary) is where a run starts: extents may not
 * merge across it. Asked only when a free neighbour was found there: the
 * chunk at a starts there and does not join the one below (O(log
 * chunks), no table of run starts to rebuild). */
static bool run_starts_at(const pp_extents_t *x, uintptr_t a) {
  const pp_xchunk_t *c = chunk_at(x, a);
  return c == NULL || (c->base == a && !joined(x, c->prev, c));
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

/* The chunks [a, e) (a free extent's range, in one run) overlaps: two
 * ranks, not a walk. */
static size_t chunks_spanned(const pp_extents_t *x, uintptr_t a, uintptr_t e) {
  if (e - a < x->min_chunk)
    return 1; /* no chunk lies wholly inside */
  return chunk_rank(x, chunk_at(x, e - x->granule)) -
         chunk_rank(x, chunk_at(x, a)) + 1;
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
    /* One node goes (the only merge that changes the node of an extent
     * that may hold whole chunks): the one whose extent spans fewer
     * chunks, whose whole chunks are repointed to the other. Always the
     * right one was O(chunks) a give once a long run of whole chunks lay
     * right of a carve (issue 38, review item 3: many chunks near
     * max_reserved, each just its request); the smaller side makes it
     * O(log chunks) amortized (a chunk is repointed only into an extent
     * at least twice the chunks it left). */
#ifdef PINPOOL_MUTANT_EXT_REPOINT_RIGHT
    /* Mutant (docs/verification.md): the right node always goes;
     * test_scale's chunks_cycle must fail. */
    bool keep_right = false;
    (void)chunks_spanned;
#else
    bool keep_right = chunks_spanned(x, left->base, b) <
                      chunks_spanned(x, e, right->base + right->size);
#endif
    pp_xnode_t *keep = keep_right ? right : left;
    pp_xnode_t *gone = keep_right ? left : right;
    uintptr_t base = left->base;
    size_t total = left->size + size + right->size;
    bin_remove(x, gone);
    tab_del(x, end_key(b));
    tab_del(x, e);
    if (keep_right)
      tab_set(x, left->base, right);
    else
      tab_set(x, end_key(right->base + right->size), left);
    whole_repoint(x, gone->base, gone->base + gone->size, keep);
    bin_resize(x, keep, base, total);
    spare_put(x, gone);
    x->nfree--;
    return keep;
  }
  if (left != NULL) {
    tab_del(x, end_key(b));
    tab_put(x, end_key(e), left);
    bin_resize(x, left, left->base, left->size + size);
    return left;
  }
  if (right != NULL) {
    tab_del(x, e);
    tab_put(x, b, right);
    bin_resize(x, right, b, right->size + size);
    return right;
  }
  if (flags == FLAGS_OF_CHUNK) /* a give: its chunk's, looked up once */
    flags = chunk_at(x, b)->flags;
  pp_xnode_t *n = spare_get(x);
  *n = (pp_xnode_t){b, size, NULL, NULL, 0, 0, flags};
  link_free(x, n);
  return n;
}

/* c becomes the chunk [base, base + size): in the tree by address and in
 * the address list next to the chunk below it, found in the tree it just
 * entered (O(log chunks)). Its free range is the caller's to add. */
static void chunk_link(pp_extents_t *x, pp_xchunk_t *c, void *base, size_t size,
                       unsigned flags) {
  *c = (pp_xchunk_t){.base = (uintptr_t)base, .size = size, .flags = flags};
  x->ctree = cinsert(x, x->ctree, c);
  pp_xchunk_t *below = NULL;
  for (pp_xchunk_t *t = x->ctree; t != NULL;)
    if (t->base < c->base) {
      below = t;
      t = t->cright;
    } else {
      t = t->cleft;
    }
  c->prev = below;
  c->next = below != NULL ? below->next : x->cfirst;
  if (c->next != NULL)
    c->next->prev = c;
  if (below != NULL)
    below->next = c;
  else
    x->cfirst = c;
  x->nchunks++;
  if (x->min_chunk == 0 || size < x->min_chunk)
    x->min_chunk = size;
}

int pp_ext_add_chunk(pp_extents_t *x, void *base, size_t size, unsigned flags) {
  uint64_t w0 = x->work;
  pp_assert(size > 0 && size % x->granule == 0 &&
            (uintptr_t)base % x->granule == 0);
  pp_xchunk_t *c = malloc(sizeof *c);
  pp_xnode_t *n = malloc(sizeof *n);
  if (c == NULL || n == NULL || !room_for_one_more(x)) {
    free(c);
    free(n);
    return PINPOOL_ENOMEM;
  }
  chunk_link(x, c, base, size, flags);
  /* A new free range: it merges with a free end of a neighbour it joins. */
  spare_put(x, n);
  whole_add(x, c, merge_free(x, c->base, size, flags));
  x->free_bytes += size;
  x->total_bytes += size;
  meter_end(x, w0);
  return 0;
}

/* ---- Page-moving growth's chunk upkeep (arena.c, "Page moves") ---------
 * A move takes free ranges out of their chunks (the donors) and makes the
 * moved pages a chunk of their own at the target: chunks are runs of
 * pages, never of address without pages, so reserved bytes stay the sum of
 * the chunks' sizes and a chunk goes back to the backend whole as before
 * (munmap of any page range of the host backend's private mappings). */

pp_xchunk_t *pp_ext_chunk_new(void) { return malloc(sizeof(pp_xchunk_t)); }
void pp_ext_chunk_free(pp_xchunk_t *c) { free(c); }

/* c is whole if one free extent holds it: one that starts at its base
 * (the range below was just cut: nothing free crosses it) or ends at its
 * end (likewise above). */
static void whole_if_free(pp_extents_t *x, pp_xchunk_t *c, bool cut_below) {
  uintptr_t cb = c->base, ce = c->base + c->size;
  pp_xnode_t *n = cut_below ? tab_find(x, cb) : tab_find(x, end_key(ce));
  if (n != NULL && n->base <= cb && ce <= n->base + n->size && !c->whole)
    whole_add(x, c, n);
}

static void chunk_unlink(pp_extents_t *x, pp_xchunk_t *c) {
  x->ctree = cremove(x, x->ctree, c);
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    x->cfirst = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  x->nchunks--;
}

/* The part [a, e) of chunk c, taken (neither free nor whole), leaves it. */
static void cut_one(pp_extents_t *x, pp_xchunk_t *c, uintptr_t a, uintptr_t e,
                    pp_xchunk_t **spare) {
  uintptr_t cb = c->base, ce = c->base + c->size;
  pp_assert(!c->whole && cb <= a && a < e && e <= ce);
  if (a == cb && e == ce) {
    chunk_unlink(x, c);
    free(c);
    return;
  }
  if (a == cb) { /* the low end: c keeps its place in the tree's order */
    c->base = e;
    c->size = (size_t)(ce - e);
    whole_if_free(x, c, true);
  } else if (e == ce) {
    c->size = (size_t)(a - cb);
    whole_if_free(x, c, false);
  } else { /* the middle: the high side is a chunk of its own */
    pp_xchunk_t *h = *spare;
    pp_assert(h != NULL);
    *spare = NULL;
    *h = (pp_xchunk_t){.base = e, .size = (size_t)(ce - e), .flags = c->flags};
    c->size = (size_t)(a - cb);
    x->ctree = cinsert(x, x->ctree, h);
    h->prev = c;
    h->next = c->next;
    if (h->next != NULL)
      h->next->prev = h;
    c->next = h;
    x->nchunks++;
    whole_if_free(x, c, false);
    whole_if_free(x, h, true);
    if (h->size < x->min_chunk)
      x->min_chunk = h->size;
  }
  if (c->size < x->min_chunk)
    x->min_chunk = c->size;
}

void pp_ext_cut(pp_extents_t *x, void *base, size_t size, pp_xchunk_t **spare) {
  uint64_t w0 = x->work;
  uintptr_t a = (uintptr_t)base, e = a + size;
  pp_assert(size > 0 && size % x->granule == 0 && x->outstanding > 0);
  x->last = NULL; /* a hint into chunks that change or go */
  pp_xchunk_t *c = chunk_at(x, a);
  pp_assert(c != NULL);
  while (c != NULL && c->base < e) {
    METER(x);
    pp_xchunk_t *next = c->next;
    uintptr_t ca = c->base > a ? c->base : a;
    uintptr_t ce = c->base + c->size < e ? c->base + c->size : e;
    pp_assert(ca == a || ca == c->base);
    cut_one(x, c, ca, ce, spare);
    if (ce == e)
      break;
    pp_assert(next != NULL && next->base == ce); /* one run: no gap */
    c = next;
  }
  x->outstanding--;
  x->total_bytes -= size;
  if (x->nchunks == 0)
    x->min_chunk = 0;
  x->last = NULL; /* the lookup above set it to a chunk that may be gone */
  meter_end(x, w0);
}

void pp_ext_add_chunk_spare(pp_extents_t *x, void *base, size_t size,
                            unsigned flags, pp_xchunk_t *c) {
  uint64_t w0 = x->work;
  pp_assert(size > 0 && size % x->granule == 0 &&
            (uintptr_t)base % x->granule == 0);
  /* The move's cuts left the node and the table room (arena.c). */
  pp_assert(x->nspare > x->outstanding &&
            4 * (x->nfree + x->outstanding + 1) <= x->tcap);
  chunk_link(x, c, base, size, flags);
  whole_add(x, c, merge_free(x, c->base, size, flags));
  x->free_bytes += size;
  x->total_bytes += size;
  meter_end(x, w0);
}

#ifdef PINPOOL_MUTANT_EXT_BIN_WALK
typedef struct fit_walk {
  size_t size;
  pp_xnode_t *fit;
} fit_walk_t;
static void first_fit(const pp_extents_t *x, pp_xnode_t *n, void *arg) {
  fit_walk_t *w = arg;
  (void)x;
  if (w->fit == NULL && n->size >= w->size)
    w->fit = n;
}
#endif

/* The node of a free extent of at least `size` bytes in the half of the
 * bins that starts at `half`, or NULL ("Fit" above). */
static pp_xnode_t *fit_in(pp_extents_t *x, size_t size, unsigned half) {
  unsigned b = half + bin_of(size);
#ifdef PINPOOL_MUTANT_EXT_BIN_WALK
  /* Mutant (docs/verification.md): the own bin walked end to end, as the
   * list was once its largest extent had gone (test_extent's fit_scale
   * must fail). */
  fit_walk_t wk = {size, NULL};
  tree_each(x, x->bins[b], first_fit, &wk);
  pp_xnode_t *n = wk.fit;
  (void)tree_ceil;
#else
  pp_xnode_t *n = tree_ceil(x, x->bins[b], size);
#endif
  if (n != NULL)
    return n;
  /* Bins above b hold only extents larger than class(b) >= size. */
  for (unsigned w = (b + 1) / 64; w < half / 64 + PP_EXT_BIN_WORDS; w++) {
    uint64_t m = x->nonempty[w];
    if (w == (b + 1) / 64)
      m &= ~(uint64_t)0 << ((b + 1) % 64);
    if (m != 0)
      return tree_min(x, x->bins[w * 64 + (unsigned)__builtin_ctzll(m)]);
  }
  return NULL;
}

/* The preferred memory first: pageable fallback chunks serve a request
 * only when no pinned extent is large enough. */
static pp_xnode_t *fit(pp_extents_t *x, size_t size) {
  pp_xnode_t *n = fit_in(x, size, 0);
  return n != NULL || x->avoid == 0 ? n : fit_in(x, size, PP_EXT_HALF);
}

/* Carve the low `size` bytes of free extent n (meter started at w0). */
static void *take_node(pp_extents_t *x, pp_xnode_t *n, size_t size,
                       unsigned *flags, uint64_t w0) {
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
  /* The whole chunks of the range carved are whole no more (none unless
   * the extent is at least the smallest chunk). */
  for (pp_xchunk_t *c = n->size < x->min_chunk ? NULL : chunk_at(x, out);
       c != NULL && c->base < out + size; c = c->next) {
    METER(x);
    if (c->whole)
      whole_del(x, c);
  }
  if (n->size > size) { /* the low end goes: only the start key moves */
    tab_del(x, out);
    bin_resize(x, n, out + size, n->size - size);
    tab_put(x, n->base, n);
  } else {
    unlink_free(x, n);
    spare_put(x, n);
  }
  x->free_bytes -= size;
  x->outstanding++;
  if (flags != NULL)
    *flags = nflags;
  meter_end(x, w0);
  return (void *)out;
}

void *pp_ext_take(pp_extents_t *x, size_t size, unsigned *flags) {
  if (size == 0 || size % x->granule != 0)
    return NULL;
  uint64_t w0 = x->work;
  pp_xnode_t *n = fit(x, size);
  if (n == NULL) {
    meter_end(x, w0);
    return NULL;
  }
  return take_node(x, n, size, flags, w0);
}

void *pp_ext_take_largest(pp_extents_t *x, size_t most, size_t *size,
                          unsigned *flags) {
  if (most == 0 || most % x->granule != 0)
    return NULL;
  uint64_t w0 = x->work;
  /* The top non-empty bin of the first half, its tree's last node: the
   * extents with avoided flags (pageable fallback memory) are not taken,
   * as they are not moved into pinned memory. */
  for (unsigned w = PP_EXT_BIN_WORDS; w-- > 0;) {
    uint64_t m = x->nonempty[w];
    if (m == 0)
      continue;
    pp_xnode_t *n =
        tree_max(x, x->bins[w * 64 + 63u - (unsigned)__builtin_clzll(m)]);
    size_t got = n->size < most ? n->size : most;
    void *p = take_node(x, n, got, flags, w0);
    if (p != NULL)
      *size = got;
    return p;
  }
  meter_end(x, w0);
  return NULL;
}

void pp_ext_give(pp_extents_t *x, void *ptr, size_t size) {
  uintptr_t b = (uintptr_t)ptr;
  pp_assert(size % x->granule == 0 && chunk_at(x, b) != NULL &&
            chunk_at(x, b + size - x->granule) != NULL);
  pp_assert(x->outstanding > 0 && x->nspare >= x->outstanding);
  uint64_t w0 = x->work;
  x->outstanding--;
  pp_xnode_t *n = merge_free(x, b, size, FLAGS_OF_CHUNK);
  x->free_bytes += size;
  /* The chunks the range touched that are all free from now (none unless
   * the extent is at least as large as the smallest chunk): whole, the
   * newest. */
  for (pp_xchunk_t *c = n->size < x->min_chunk ? NULL : chunk_at(x, b);
       c != NULL && c->base < b + size; c = c->next) {
    METER(x);
    if (n->base <= c->base && c->base + c->size <= n->base + n->size)
      whole_add(x, c, n);
  }
  spare_trim(x);
  meter_end(x, w0);
}

void pp_ext_chunk_info(const pp_xchunk_t *c, uintptr_t *base, size_t *size,
                       unsigned *flags) {
  *base = c->base;
  *size = c->size;
  *flags = c->flags;
}

#ifdef PINPOOL_MUTANT_EXT_CHUNK_WALK
/* Mutant (docs/verification.md): the chunk to release found as before the
 * lists, by walking every free extent for the chunks that lie wholly
 * inside one, the oldest kept (test_extent's chunk_scale and test_scale's
 * free_capped and empty_cache must fail). Same choice as the lists. */
typedef struct oldest {
  unsigned skip;
  pp_xchunk_t *c;
  uint64_t key;
} oldest_t;
static void pick_oldest(const pp_extents_t *x, pp_xnode_t *n, void *arg) {
  oldest_t *o = arg;
  for (pp_xchunk_t *c = chunk_at(x, n->base);
       c != NULL && c->base < n->base + n->size; c = c->next) {
    METER(x);
    if ((c->flags & o->skip) || c->base < n->base ||
        c->base + c->size > n->base + n->size)
      continue;
    uint64_t key = c->seq | ((c->flags & x->avoid) ? 0 : (uint64_t)1 << 63);
    if (o->c == NULL || key < o->key) {
      o->c = c;
      o->key = key;
    }
  }
}
#endif

/* The whole chunk free the longest without skip_flags: the avoided ones
 * (pageable fallbacks) first. Passes over only chunks with skip_flags (the
 * arena's: the reserve, one per node). */
static pp_xchunk_t *oldest_whole(const pp_extents_t *x, unsigned skip_flags) {
#ifdef PINPOOL_MUTANT_EXT_CHUNK_WALK
  oldest_t o = {skip_flags, NULL, 0};
  each_node(x, pick_oldest, &o);
  return o.c;
#else
  for (unsigned l = 0; l < 2; l++)
    for (pp_xchunk_t *c = x->whole_head[l]; c != NULL; c = c->wnext) {
      METER(x);
      if (!(c->flags & skip_flags))
        return c;
    }
  return NULL;
#endif
}

bool pp_ext_remove_free_chunk(pp_extents_t *x, unsigned skip_flags, void **base,
                              size_t *size, unsigned *flags) {
  uint64_t w0 = x->work;
  pp_xchunk_t *c = oldest_whole(x, skip_flags);
  if (c == NULL) {
    meter_end(x, w0);
    return false;
  }
  pp_xnode_t *n = c->ext;
  pp_assert(chunk_at(x, c->base) == c && n != NULL && n->base <= c->base &&
            c->base + c->size <= n->base + n->size);
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
  /* n keeps the side that spans more chunks; the whole chunks of the
   * other are repointed to a new node. The left side always kept was
   * O(chunks) a release once a long run of whole chunks lay right of the
   * cut (issue 38); the smaller side makes a chunk repointed only into an
   * extent at most half the chunks of the one it left. */
  uintptr_t kb = nb, ke = cb, ob = ce, oe = ne; /* kept, other */
#ifdef PINPOOL_MUTANT_EXT_CUT_LEFT
  /* Mutant (docs/verification.md): the left side always kept; test_scale
   * release_many must fail. */
  if (!(nb < cb)) {
#else
  if (!(nb < cb) ||
      (split && chunk_rank(x, chunk_at(x, ne - x->granule)) - chunk_rank(x, c) >
                    chunk_rank(x, c) - chunk_rank(x, chunk_at(x, nb)))) {
#endif
    kb = ce;
    ke = ne;
    ob = nb;
    oe = nb < cb ? cb : nb;
  }
  whole_del(x, c);
  unlink_free(x, n);
  if (kb < ke) {
    *n = (pp_xnode_t){kb, (size_t)(ke - kb), NULL, NULL, 0, 0, nflags};
    link_free(x, n);
  } else {
    spare_put(x, n);
  }
  x->free_bytes -= c->size;
  x->total_bytes -= c->size;
  /* Out of the tree and the list: O(log chunks). */
  x->ctree = cremove(x, x->ctree, c);
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    x->cfirst = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  if (x->last == c)
    x->last = NULL;
  x->nchunks--;
  /* min_chunk stays a lower bound (a larger one would need a walk): a
   * range below it holds no chunk wholly, and one above it at most two
   * partly (the walks that test it stay O(chunks spanned)). */
  if (x->nchunks == 0)
    x->min_chunk = 0;
  if (ob < oe) {
    pp_xnode_t *o = spare_get(x);
    *o = (pp_xnode_t){ob, (size_t)(oe - ob), NULL, NULL, 0, 0, nflags};
    link_free(x, o);
    whole_repoint(x, ob, oe, o);
  }
  spare_trim(x);
  *base = (void *)c->base;
  *size = c->size;
  *flags = c->flags;
  free(c);
  meter_end(x, w0);
  return true;
}

size_t pp_ext_free_chunks(const pp_extents_t *x, unsigned skip_flags,
                          size_t *bytes) {
  uint64_t w0 = x->work;
  size_t count = 0;
  *bytes = 0;
  for (unsigned l = 0; l < 2; l++)
    for (const pp_xchunk_t *c = x->whole_head[l]; c != NULL; c = c->wnext) {
      METER(x);
      if (!(c->flags & skip_flags)) {
        count++;
        *bytes += c->size;
      }
    }
  meter_end(x, w0);
  return count;
}

typedef struct copy_out {
  pp_range_t *f;
  size_t n;
} copy_out_t;

static void copy_node(const pp_extents_t *x, pp_xnode_t *e, void *arg) {
  copy_out_t *o = arg;
  (void)x;
  o->f[o->n++] = (pp_range_t){e->base, e->size};
}

bool pp_ext_copy(const pp_extents_t *x, pp_chunk_view_t *chunks,
                 size_t cap_chunks, pp_range_t *free_out, size_t cap_free,
                 size_t *nchunks, size_t *nfree) {
  *nchunks = x->nchunks;
  *nfree = x->nfree;
  if (x->nchunks > cap_chunks || x->nfree > cap_free)
    return false;
  size_t i = 0;
  for (const pp_xchunk_t *k = x->cfirst; k != NULL; k = k->next, i++) {
    METER(x);
    chunks[i] = (pp_chunk_view_t){k->base, k->size, k->flags, 0};
  }
  copy_out_t o = {free_out, 0};
  each_node(x, copy_node, &o);
  pp_assert(o.n == x->nfree);
  return true;
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
  (void)pp_ext_copy(x, c, x->nchunks, f, x->nfree, nchunks, nfree);
  *chunks = c;
  *free_out = f;
  return 0;
}

/* ---- A copy over several holds (snapshots: arena.h, pp_ext_copy_some).
 * The cursor is a key, not a pointer: each call finds its place again by
 * a descent (O(log n)), so nothing the extents did between two calls can
 * leave it dangling. */

/* Up to k nodes of t after *key (every node when key is NULL), in order,
 * into out; *last: the last one copied. An explicit stack: a bin's tree
 * is at most 1.44 log2 n deep ("Bins"), under 64. */
static size_t tree_copy_after(const pp_extents_t *x, pp_xnode_t *t,
                              const pp_xnode_t *key, pp_range_t *out, size_t k,
                              const pp_xnode_t **last) {
  pp_xnode_t *stack[64];
  unsigned sp = 0;
  while (t != NULL) { /* the path to the first node after key */
    METER(x);
    if (key == NULL || before(key, t)) {
      pp_assert(sp < 64);
      stack[sp++] = t;
      t = t->left;
    } else {
      t = t->right;
    }
  }
  size_t n = 0;
  while (sp > 0 && n < k) {
    const pp_xnode_t *c = stack[--sp];
    out[n++] = (pp_range_t){c->base, c->size};
    *last = c;
    for (t = c->right; t != NULL; t = t->left) {
      METER(x);
      pp_assert(sp < 64);
      stack[sp++] = t;
    }
  }
  return n;
}

uint64_t pp_ext_copy_some(const pp_extents_t *x, pp_ext_cursor_t *c,
                          size_t budget, pp_chunk_view_t *chunks, size_t *nc,
                          pp_range_t *free_out, size_t *nf) {
  uint64_t w0 = x->work;
  size_t got = 0;
  if (!c->chunks_done) {
    const pp_xchunk_t *k = NULL; /* the first chunk at or above from */
    for (const pp_xchunk_t *t = x->ctree; t != NULL;) {
      METER(x);
      if (t->base < c->chunk_from) {
        t = t->cright;
      } else {
        k = t;
        t = t->cleft;
      }
    }
    for (; k != NULL && got < budget; k = k->next, got++) {
      METER(x);
      chunks[(*nc)++] = (pp_chunk_view_t){k->base, k->size, k->flags, 0};
      c->chunk_from = k->base + k->size;
    }
    c->chunks_done = k == NULL;
  }
  while (c->chunks_done && !c->done && got < budget) {
    if (c->bin >= 2 * PP_EXT_HALF) {
      c->done = true;
      break;
    }
    pp_xnode_t key;
    key.base = c->base;
    key.size = c->size;
    const pp_xnode_t *last = NULL;
    size_t want = budget - got;
    size_t n = tree_copy_after(x, x->bins[c->bin], c->after ? &key : NULL,
                               free_out + *nf, want, &last);
    *nf += n;
    got += n;
    if (n == want) { /* maybe more in this bin: after the last one */
      c->after = true;
      c->size = last->size;
      c->base = last->base;
    } else {
      c->bin++;
      c->after = false;
    }
  }
  return x->work - w0;
}

#ifdef PINPOOL_MUTANT_EXT_LARGEST_WALK
static void keep_largest(const pp_extents_t *x, pp_xnode_t *n, void *arg) {
  (void)x;
  if (n->size > *(size_t *)arg)
    *(size_t *)arg = n->size;
}
#endif

size_t pp_ext_largest(const pp_extents_t *x) {
  uint64_t w0 = x->work;
  size_t best = 0;
  for (unsigned half = 0; half < 2; half++)
    for (unsigned w = PP_EXT_BIN_WORDS; w-- > 0;) {
      uint64_t m = x->nonempty[half * PP_EXT_BIN_WORDS + w];
      if (m == 0)
        continue;
      unsigned b =
          half * PP_EXT_HALF + w * 64 + 63u - (unsigned)__builtin_clzll(m);
#ifdef PINPOOL_MUTANT_EXT_LARGEST_WALK
      /* Mutant (docs/verification.md): the top bin walked end to end, as
       * its list was (test_extent's largest_scale must fail). */
      tree_each(x, x->bins[b], keep_largest, &best);
      (void)tree_max;
#else
      size_t top = tree_max(x, x->bins[b])->size; /* the tree's last */
      if (top > best)
        best = top;
#endif
      break;
    }
  meter_end(x, w0);
  return best;
}

/* [a, e) lies in one run of chunks. */
static bool in_one_run(const pp_extents_t *x, uintptr_t a, uintptr_t e);
bool pp_ext_run_holds(const pp_extents_t *x, uintptr_t base, size_t size,
                      unsigned flags) {
  const pp_xchunk_t *c = chunk_at(x, base);
  return c != NULL && c->flags == flags && in_one_run(x, base, base + size);
}
static bool in_one_run(const pp_extents_t *x, uintptr_t a, uintptr_t e) {
  const pp_xchunk_t *c = chunk_at(x, a), *last = chunk_at(x, e - x->granule);
  if (c == NULL || last == NULL)
    return false;
  for (; c != last; c = c->next)
    if (!joined(x, c, c->next))
      return false;
  return true;
}

typedef struct vctx {
  char *why;
  size_t len;
  size_t sum, count, covered;
  bool bad;
} vctx_t;

static bool vfail(vctx_t *v, const char *fmt, uintptr_t base, size_t size) {
  (void)snprintf(v->why, v->len, fmt, (unsigned long)base, size);
  v->bad = true;
  return false;
}

/* One free extent of bin b. */
static bool check_node(const pp_extents_t *x, const pp_xnode_t *n, unsigned b,
                       vctx_t *v) {
  if (n->bin != b || bin_of_node(x, n) != b || n->size == 0 ||
      n->size % x->granule != 0 || !in_one_run(x, n->base, n->base + n->size))
    return vfail(v, "extents: free extent %#lx+%zu misplaced", n->base,
                 n->size);
  if (tab_find(x, n->base) != n || tab_find(x, end_key(n->base + n->size)) != n)
    return vfail(v, "extents: boundary table of %#lx+%zu", n->base, n->size);
  const pp_xchunk_t *first = chunk_at(x, n->base);
  if (n->flags != first->flags)
    return vfail(v, "extents: %#lx+%zu has other flags than its run", n->base,
                 n->size);
  /* Fully coalesced: no free neighbour on either side in its run. */
  if (left_of(x, n->base) != NULL || right_of(x, n->base + n->size) != NULL)
    return vfail(v, "extents: %#lx+%zu has a free neighbour", n->base, n->size);
  /* Every chunk wholly inside is whole, with this node. */
  for (const pp_xchunk_t *c = first; c != NULL && c->base < n->base + n->size;
       c = c->next) {
    if (c->base < n->base || c->base + c->size > n->base + n->size)
      continue;
    if (!c->whole || c->ext != n)
      return vfail(v, "extents: chunk %#lx+%zu all free but not listed whole",
                   c->base, c->size);
    v->covered++;
  }
  v->sum += n->size;
  v->count++;
  return true;
}

/* The tree t of bin b: ordered strictly between lo and hi (NULL: none),
 * heights right, balanced; its height, or 0 on a failure (v->bad). */
static unsigned check_tree(const pp_extents_t *x, const pp_xnode_t *t,
                           unsigned b, const pp_xnode_t *lo,
                           const pp_xnode_t *hi, vctx_t *v) {
  if (t == NULL || v->bad)
    return 0;
  if ((lo != NULL && !before(lo, t)) || (hi != NULL && !before(t, hi))) {
    (void)vfail(v, "extents: %#lx+%zu out of its bin's order", t->base,
                t->size);
    return 0;
  }
  unsigned l = check_tree(x, t->left, b, lo, t, v);
  if (v->bad || !check_node(x, t, b, v))
    return 0;
  unsigned r = check_tree(x, t->right, b, t, hi, v);
  if (v->bad)
    return 0;
  unsigned h = 1 + (l > r ? l : r);
  if (t->height != h || l > r + 1 || r > l + 1) {
    (void)vfail(v, "extents: %#lx+%zu unbalanced in its bin's tree", t->base,
                t->size);
    return 0;
  }
  return h;
}

/* The chunk tree t: ordered strictly between lo and hi (0: none), counts
 * and heights right, balanced; its height, or 0 on a failure (*bad). */
static unsigned check_ctree(const pp_xchunk_t *t, uintptr_t lo, uintptr_t hi,
                            bool *bad) {
  if (t == NULL || *bad)
    return 0;
  unsigned l = check_ctree(t->cleft, lo, t->base, bad);
  unsigned r = check_ctree(t->cright, t->base, hi, bad);
  unsigned h = 1 + (l > r ? l : r);
  if ((lo != 0 && t->base <= lo) || (hi != 0 && t->base >= hi) ||
      t->cheight != h || l > r + 1 || r > l + 1 ||
      t->count != 1 + ccount(t->cleft) + ccount(t->cright))
    *bad = true;
  return *bad ? 0 : h;
}

bool pp_ext_validate(const pp_extents_t *x, char *why, size_t len) {
  bool tbad = false;
  (void)check_ctree(x->ctree, 0, 0, &tbad);
  if (tbad) {
    (void)snprintf(why, len, "extents: the chunk tree is broken");
    return false;
  }
  size_t nlist = 0;
  for (const pp_xchunk_t *c = x->cfirst; c != NULL; c = c->next, nlist++)
    if ((c->next != NULL &&
         (c->base + c->size > c->next->base || c->next->prev != c)) ||
        (c->prev == NULL) != (c == x->cfirst) || chunk_at(x, c->base) != c) {
      (void)snprintf(why, len, "extents: chunks %#lx and %#lx overlap",
                     (unsigned long)c->base,
                     (unsigned long)(c->next != NULL ? c->next->base : 0));
      return false;
    }
  if (nlist != x->nchunks || ccount(x->ctree) != x->nchunks) {
    (void)snprintf(why, len, "extents: %zu chunks listed, %zu in the tree, %zu",
                   nlist, ccount(x->ctree), x->nchunks);
    return false;
  }
  /* Chunks are runs of pages (page moves cut them, "Page-moving growth's
   * chunk upkeep"): their sizes sum to the bytes counted. */
  size_t csum = 0;
  for (const pp_xchunk_t *c = x->cfirst; c != NULL; c = c->next)
    csum += c->size;
  if (csum != x->total_bytes) {
    (void)snprintf(why, len, "extents: chunks hold %zu bytes, %zu counted",
                   csum, x->total_bytes);
    return false;
  }
  vctx_t v = {why, len, 0, 0, 0, false};
  for (unsigned b = 0; b < 2 * PP_EXT_HALF; b++) {
    bool bit = (x->nonempty[b / 64] >> (b % 64)) & 1;
    if (bit != (x->bins[b] != NULL)) {
      (void)snprintf(why, len, "extents: bin %u bitmap %d", b, (int)bit);
      return false;
    }
    (void)check_tree(x, x->bins[b], b, NULL, NULL, &v);
    if (v.bad)
      return false;
  }
  if (v.sum != x->free_bytes || v.count != x->nfree ||
      x->tcount != 2 * v.count) {
    (void)snprintf(why, len,
                   "extents: %zu free bytes in %zu extents listed, "
                   "%zu in %zu counted, %zu boundary keys",
                   v.sum, v.count, x->free_bytes, x->nfree, x->tcount);
    return false;
  }
  /* The whole lists: exactly the chunks found above, oldest first. */
  size_t flagged = 0, listed = 0;
  for (const pp_xchunk_t *c = x->cfirst; c != NULL; c = c->next)
    flagged += c->whole;
  for (unsigned l = 0; l < 2; l++) {
    const pp_xchunk_t *prev = NULL;
    for (const pp_xchunk_t *c = x->whole_head[l]; c != NULL; c = c->wnext) {
      if (!c->whole || whole_list(x, c) != l || c->wprev != prev ||
          (prev != NULL && prev->seq >= c->seq) || ++listed > x->nchunks) {
        (void)snprintf(why, len, "extents: whole list %u broken at %#lx", l,
                       (unsigned long)c->base);
        return false;
      }
      prev = c;
    }
    if (x->whole_tail[l] != prev) {
      (void)snprintf(why, len, "extents: whole list %u's tail", l);
      return false;
    }
  }
  if (flagged != v.covered || listed != v.covered) {
    (void)snprintf(why, len,
                   "extents: %zu chunks all free, %zu marked whole, %zu "
                   "listed",
                   v.covered, flagged, listed);
    return false;
  }
  return true;
}
