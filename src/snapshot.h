/*
 * Snapshots, internal: what snapshot.c gathers from a live pool (with the
 * pool's locks, one at a time) and snapshot_json.c formats (with none).
 * Nothing here is exported.
 */
#ifndef PINPOOL_SNAPSHOT_H
#define PINPOOL_SNAPSHOT_H

#include "internal.h"

/* The most segments, chunks and free extents a snapshot copies in one
 * hold of seg_lock (snapshot.c, "copied in pieces"), so that a thread
 * creating or releasing a segment never waits for the whole of a large
 * pool's copy (tests/test_scale.c counts it); and a piece ends sooner
 * once it has taken PP_SNAP_PIECE_NS, looked at every PP_SNAP_STEP
 * elements (a piece of cache misses: 512 elements took 300-400 us at
 * 100,000 segments and extents; 64 take about 45 us). */
#define PP_SNAP_PIECE 512
#define PP_SNAP_STEP 64
#define PP_SNAP_PIECE_NS 40000u

typedef struct pp_sseg {
  pp_segment_t *d;
  uint64_t gen, base, size, bs;
  uint32_t nblocks, uncarved;
  unsigned cls, flags, node;
  size_t first, nblk; /* its blocks: blk[first, first + nblk) */
} pp_sseg_t;

typedef struct pp_sblk {
  uint64_t word, info;
  uint32_t idx, nstreams, ncaps; /* captures follow the streams */
  size_t streams;                /* offset into streams[] */
} pp_sblk_t;

typedef struct pp_sentry {
  uint64_t seq, clk, addr, size, req, stream, tid_action, stack;
} pp_sentry_t;

typedef struct pp_snap {
  pinpool_t *pool;
  unsigned flags;
  uint64_t t0_ns, max_hold_ns, gather_ns;
  double unix_time;
  pinpool_stats_t stats;
  char *config;
  uint64_t chunk_free;
  pp_chunk_view_t *chunks; /* the arena, read in one hold of its lock */
  size_t nchunks;
  pp_range_t *free_ext;
  size_t nfree;
  pp_sseg_t *segs;
  size_t nsegs;
  pp_sblk_t *blk; /* big_alloc'ed, cap_blk entries */
  size_t nblk, cap_blk;
  uint64_t *streams;
  size_t nstreams, cap_streams;
  pp_sentry_t *ent; /* big_alloc'ed, cap_ent entries */
  size_t nent, cap_ent;
  uint64_t recorded, hist_dropped, max_entries;
  uint64_t hist_lost; /* history.lost when the ring was copied */
  unsigned level, depth;
  pp_stacks_copy_t stacks;
  pp_lend_view_t *lends; /* shared pools: blocks lent now */
  size_t nlends;
} pp_snap_t;

/* Fill s (zeroed, with pool and flags set): 0 or an error; either way
 * pp_snap_free(s) after. Takes the pool's locks one at a time. */
int pp_snap_gather(pp_snap_t *s);
void pp_snap_free(pp_snap_t *s);
/* Grow *p (malloc'd, *cap elements of elem bytes) to hold need: false if
 * out of memory (nothing changed). */
bool pp_snap_grow(void **p, size_t *cap, size_t need, size_t elem);

#endif
