/*
 * `pinpool snapshot torch`, in layers, each calling only those below it:
 * snapshot_torch.c (the command), snapshot_torch_pickle.c (the segments,
 * blocks and trace as PyTorch's pickle), snapshot_torch_trace.c (the
 * history as memory_viz's events, and their replay), and
 * snapshot_torch_layout.c, this header's: which segments the pickle lists
 * and which blocks make up each one (the memory layout memory_viz draws;
 * docs/snapshot-format.md, "PyTorch memory_viz").
 */
#ifndef PINPOOL_TOOLS_SNAPSHOT_TORCH_LAYOUT_H
#define PINPOOL_TOOLS_SNAPSHOT_TORCH_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot_load.h"

/* One memory_viz segment: a chunk of the arena (or consecutive chunks
 * that a pinpool segment crosses: a block must lie in one segment), or
 * one pinpool segment (a snapshot without `chunks`, or a segment in no
 * chunk listed). */
typedef struct tv_seg {
  uint64_t address, size;
  size_t seg_first, seg_end;     /* the pinpool segments inside */
  size_t chunk_first, chunk_end; /* its chunks; equal: not a chunk */
  uint64_t max_block_size;       /* of those segments; 0 for none */
} tv_seg_t;

typedef struct tv_layout {
  tv_seg_t *v; /* in address order, disjoint */
  size_t n;
  int by_chunk;   /* the segments are the snapshot's chunks */
  size_t outside; /* pinpool segments in no chunk, shown on their own */
  char note[256]; /* for standard error: segments in no chunk, or the
                     chunks not used; "" for none */
} tv_layout_t;

/* One memory_viz block: the blocks of a segment tile it in address
 * order. state is SNAP_ALLOCATED, SNAP_PENDING or SNAP_CACHED (shown
 * inactive, as is everything that is not a listed block). */
typedef struct tv_block {
  uint64_t address, size, requested;
  int state;
  int64_t stack; /* -1: none (always for inactive blocks) */
} tv_block_t;

/* Check what the layout relies on (segments in address order and
 * disjoint, each one's blocks inside it in address order, chunks in
 * address order and disjoint) and lay the snapshot out. 0, or -1 with a
 * message naming the segment, block or chunk (or ENOMEM) in err. */
int tv_layout(const snap_t *s, const char *name, tv_layout_t *out, char *err,
              size_t errlen);
void tv_layout_free(tv_layout_t *l);

/* Does [address, address + size) overlap a segment of l made of two
 * chunks or more? (1 yes, 0 no) */
int tv_in_joined(const tv_layout_t *l, uint64_t address, uint64_t size);

/* Call fn for each block of g, in address order. */
void tv_blocks(const snap_t *s, const tv_seg_t *g,
               void (*fn)(void *ctx, const tv_block_t *b), void *ctx);

#endif /* PINPOOL_TOOLS_SNAPSHOT_TORCH_LAYOUT_H */
