/*
 * The computations of `pinpool snapshot summary` and `pinpool snapshot
 * diff` (snapshot_summarize.c): the live allocation sites, and every
 * number of the summary in one pass over a snapshot. Private to
 * snapshot_summarize.c, snapshot_summary.c and snapshot_diff.c; every name
 * starts with snap_ (SNAP_).
 */
#ifndef PINPOOL_TOOLS_SNAPSHOT_SUMMARIZE_H
#define PINPOOL_TOOLS_SNAPSHOT_SUMMARIZE_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot_load.h"

#define SNAP_NFLAGS 4
/* The segment flags, in the order of the summary's counts. */
extern const char *const snap_flag_names[SNAP_NFLAGS];

#define SITE_LEN 1024
#define SNAP_MAX_PROBLEMS 10

typedef struct problems {
  size_t n; /* all found; the first SNAP_MAX_PROBLEMS are kept */
  char msg[SNAP_MAX_PROBLEMS][200];
} snap_problems_t;

/* The totals object's fields. */
typedef struct totals {
  uint64_t segments, segment_bytes, chunk_free, reserved, allocated,
      allocated_blocks, requested, pending, pending_blocks, cached,
      cached_blocks, uncarved, tail;
} snap_totals_t;

typedef struct summary {
  snap_totals_t t; /* as written */
  snap_totals_t r; /* recomputed from the segments and blocks */
  uint64_t flag_segments[SNAP_NFLAGS], flag_bytes[SNAP_NFLAGS];
  uint64_t noflag_segments, noflag_bytes;
  uint64_t uncarved_blocks;
  uint64_t live_requested; /* allocated + pending_free */
  /* Fragmentation: free memory in segments is cached blocks + uncarved
   * blocks (tails cannot hold a block). */
  uint64_t largest_run;      /* bytes of adjacent free blocks */
  uint64_t largest_run_bs;   /* their block size */
  uint64_t largest_run_addr; /* segment address */
  /* Free space that is whole: idle segments' free blocks and wholly free
   * chunks (empty_cache returns them as they are), and the largest free
   * piece of the rest (a run in a segment with live blocks, or a free
   * range of a chunk in use). */
  uint64_t whole_free, part_largest;
  uint64_t arena_free;    /* the chunks' free ranges (`chunks[].free`) */
  uint64_t used_segments; /* with a live block and free blocks */
  uint64_t free_in_used;  /* free block bytes in them */
  uint64_t idle_segments, idle_bytes; /* no live block */
  /* Addresses of the segments with a live block (sorted by snap_summarize): a
   * chunk none of whose segments is busy is idle, and its free ranges are
   * returned with its idle segments, whole. */
  uint64_t *busy;
  size_t nbusy, busy_cap;
  int busy_oom;
  snap_problems_t problems;
  /* history */
  uint64_t actions[SNAP_NACTIONS];
  uint64_t min_time, max_time, first_seq, last_seq, seq_gaps;
} snap_summary_t;

/* The totals object as written. */
void snap_read_totals(const snap_t *s, snap_totals_t *t);
/* Live blocks per site, sorted by name (snap_live_sites sorts them by
 * bytes). 0, or -1 when memory runs out. */
int snap_sites_by_name(const snap_t *s, snap_site_stat_t **out, size_t *n);
/* Every number of the summary, in one pass over the segments and blocks
 * and one over the history. 0, or -1 when memory runs out. */
int snap_summarize(const snap_t *s, snap_summary_t *m);

#endif /* PINPOOL_TOOLS_SNAPSHOT_SUMMARIZE_H */
