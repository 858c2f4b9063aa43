/*
 * The trace of `pinpool snapshot torch` (snapshot_torch_trace.c): the
 * snapshot's history as the events memory_viz replays, and the replay
 * that leaves out those it could not place (snapshot_torch.c says why).
 * Below the pickle writer (snapshot_torch_pickle.c) and the command
 * (snapshot_torch.c); above the layout (snapshot_torch_layout.h). Names start
 * with tv_ (TV_).
 */
#ifndef PINPOOL_TOOLS_SNAPSHOT_TORCH_TRACE_H
#define PINPOOL_TOOLS_SNAPSHOT_TORCH_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot_load.h"
#include "snapshot_torch_layout.h"

/* An address map (open addressing, linear probing). */
typedef struct amap {
  uint64_t *keys, *vals;
  unsigned char *used;
  size_t cap, n; /* cap: a power of two, or 0 */
} tv_amap_t;

/* The value of key, or NULL. */
uint64_t *tv_amap_get(const tv_amap_t *m, uint64_t key);
void tv_amap_free(tv_amap_t *m);

/* What one history entry becomes. TV_EV_FREE is a free that had no separate
 * free_requested: it is written as free_requested + free_completed, the
 * pair memory_viz folds into one "free" (an unpaired free_completed would
 * be replayed as a block still waiting for its streams). */
enum {
  TV_EV_ALLOC,
  TV_EV_FREE_REQUESTED,
  TV_EV_FREE_COMPLETED,
  TV_EV_FREE,
  TV_EV_SEGMENT_ALLOC,
  TV_EV_SEGMENT_FREE,
  TV_EV_OOM,
  TV_EV_FOLDED, /* a segment event of a chunk shown inside a larger segment */
};

/* The fields used of a history entry, copied once: reading them through
 * jansson again in each pass costs more than the copy. */
typedef struct ev {
  uint64_t address, size, requested, stream, time_ns;
  int64_t stack;
  unsigned char kind, keep;
} tv_ev_t;

typedef struct events {
  tv_ev_t *v;
  size_t n;
  tv_amap_t seg_stack; /* segment address -> stack of its segment_alloc */
} tv_events_t;

/* The events of s's history, in order. 0, or -1 on ENOMEM. */
int tv_build_events(const snap_t *s, tv_events_t *out);
/* memory_viz cannot grow or shrink a segment: when chunks that a segment
 * crosses are shown as one (snapshot_torch_layout.c), their
 * segment_alloc and segment_free entries, and those of earlier chunks in
 * that range, are not written, and the segment is there from the start
 * of the trace. */
void tv_fold_segment_events(const tv_layout_t *l, tv_events_t *ev);
/* Walk the events backwards from the segments and blocks of the snapshot,
 * as memory_viz does, and clear `keep` of each event it could not replay.
 * Returns the number left out, or -1 on ENOMEM. */
long tv_replay(const snap_t *s, const tv_layout_t *l, tv_events_t *ev);

#endif /* PINPOOL_TOOLS_SNAPSHOT_TORCH_TRACE_H */
