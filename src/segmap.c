/*
 * The segment map: which segment holds a pointer, found without a lock on
 * every pinpool_free. A two-level radix tree over 256 KiB chunks of the
 * 48-bit address space. Every segment is larger than a chunk, so a chunk
 * overlaps at most two segments: the one covering the chunk's first byte
 * (slot 0) and one starting inside it (slot 1).
 *
 * Concurrency: insert and remove run under pool->seg_lock (one writer at a
 * time); find runs concurrently with them. Entries are published with
 * release stores after the descriptor is filled in, and read with acquire
 * loads. A lookup that races with the removal of its segment (a stale or
 * double free racing with empty_cache) can still read the descriptor: the
 * pool never frees descriptors while it lives, only recycles them. The
 * range check alone is not enough against a recycled descriptor: an old
 * base read with a new size (or the reverse) can cover a block of the
 * live segment in the chunk's other slot (tests/test_segmap_race.c). So
 * the bounds are read as a pair under the descriptor's gen, used as a
 * seqlock: odd while an incarnation is live, bumped at release and again
 * at publication, with release fences ordering the bumps and the bounds
 * (pool.c, seg_publish; internal.h, pp_segmap_find).
 */
#include "internal.h"

#include <stdlib.h>

#define CHUNK_SHIFT PP_MAP_CHUNK_SHIFT
#define ADDR_BITS PP_MAP_ADDR_BITS
#define L2_BITS PP_MAP_L2_BITS
#define L1_LEN PP_MAP_L1_LEN
#define L2_LEN PP_MAP_L2_LEN
typedef pp_map_entry_t leaf_entry_t;

int pp_segmap_create(pp_segmap_t **out) {
  /* calloc of 256 KiB: untouched pages stay unbacked until used. */
  pp_segmap_t *m = calloc(1, sizeof *m);
  if (m == NULL)
    return pp_fail(PINPOOL_ENOMEM, "segment map: out of memory");
  *out = m;
  return 0;
}

void pp_segmap_destroy(pp_segmap_t *m) {
  if (m == NULL)
    return;
  for (size_t i = 0; i < L1_LEN; i++) {
    leaf_entry_t *leaf = pp_load_relaxed(&m->l1[i]);
    if (leaf != NULL) /* most slots are empty: skip 32768 free(NULL) */
      free(leaf);
  }
  free(m);
}

static leaf_entry_t *entry_for(pp_segmap_t *m, uintptr_t chunk, bool create) {
  size_t i1 = (size_t)(chunk >> L2_BITS), i2 = (size_t)(chunk & (L2_LEN - 1));
  leaf_entry_t *leaf = pp_load_acquire(&m->l1[i1]);
  if (leaf == NULL) {
    if (!create)
      return NULL;
    leaf = calloc(L2_LEN, sizeof *leaf);
    if (leaf == NULL)
      return NULL;
    pp_store_release(&m->l1[i1], leaf);
  }
  return &leaf[i2];
}

/* Chunks first..last of a segment at base: each chunk's slot for it (1 in
 * a chunk it starts inside, 0 otherwise) from `was` to `to`. One leaf
 * lookup per leaf, not per chunk: a 64 MiB block spans 256 chunks, and
 * large blocks are made and released at every arena carve (W5). */
static void map_set(pp_segmap_t *m, uintptr_t first, uintptr_t last,
                    uintptr_t base, pp_segment_t *to, pp_segment_t *was) {
  for (uintptr_t c = first; c <= last;) {
    leaf_entry_t *leaf = entry_for(m, c, false);
    pp_assert(leaf != NULL);
    size_t i2 = (size_t)(c & (L2_LEN - 1));
    uintptr_t end = c + (L2_LEN - i2) - 1; /* this leaf's last chunk */
    if (end > last)
      end = last;
    for (; c <= end; c++, leaf++) {
      int slot = (base <= (c << CHUNK_SHIFT)) ? 0 : 1;
      pp_assert(pp_load_relaxed(&leaf->slot[slot]) == was);
      (void)was;
      pp_store_release(&leaf->slot[slot], to);
    }
  }
}

int pp_segmap_insert(pp_segmap_t *m, pp_segment_t *seg) {
  uintptr_t base = pp_load_relaxed(&seg->base);
  size_t size = pp_load_relaxed(&seg->size);
  pp_assert(size > ((size_t)1 << CHUNK_SHIFT));
  if (base + size > ((uintptr_t)1 << ADDR_BITS) || base + size < base)
    return pp_fail(PINPOOL_EBACKEND,
                   "backend returned an address beyond 2^48: %p", (void *)base);
  uintptr_t first = base >> CHUNK_SHIFT,
            last = (base + size - 1) >> CHUNK_SHIFT;
  /* Create every leaf first so that a failure leaves nothing half-done. */
  for (uintptr_t c = first; c <= last; c += (uintptr_t)L2_LEN) {
    if (entry_for(m, c, true) == NULL)
      return pp_fail(PINPOOL_ENOMEM, "segment map: out of memory");
  }
  if (entry_for(m, last, true) == NULL)
    return pp_fail(PINPOOL_ENOMEM, "segment map: out of memory");
  /* Slot 1 of the first chunk if the segment starts inside it, slot 0 of
   * every later one. */
  map_set(m, first, last, base, seg, NULL);
  return 0;
}

void pp_segmap_remove(pp_segmap_t *m, pp_segment_t *seg) {
  uintptr_t base = pp_load_relaxed(&seg->base);
  size_t size = pp_load_relaxed(&seg->size);
  uintptr_t first = base >> CHUNK_SHIFT,
            last = (base + size - 1) >> CHUNK_SHIFT;
  map_set(m, first, last, base, NULL, seg);
}
