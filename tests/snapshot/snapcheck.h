/*
 * Checks every test applies to a snapshot it wrote (tests/snapshot/
 * snapcheck.c): it parses (libjansson), the format and version are right,
 * no block is listed twice, every segment's blocks fit it exactly, every
 * stack and frame index is in range, the accounting identity holds on
 * the totals and agrees with the blocks listed, and the arena's `chunks`
 * (when the snapshot has them) are in address order, each one's free
 * ranges in order inside it, their sum `totals.chunk_free_bytes`.
 *
 * snapcheck_chunks adds what holds only in a snapshot of a quiescent pool
 * (the chunks are copied in one hold of the segment lock, the segments in
 * another): the segments and the free ranges tile the chunks exactly, and
 * the stats' arena fields agree with the chunks.
 */
#ifndef PP_TESTS_SNAPCHECK_H
#define PP_TESTS_SNAPCHECK_H

#include <stddef.h>
#include <stdint.h>

typedef struct snapcheck {
  uint64_t segments, blocks, allocated, pending, cached; /* block counts */
  uint64_t allocated_bytes, pending_bytes, cached_bytes, reserved_bytes;
  uint64_t requested_bytes, entries, stacks, frames, dropped;
  uint64_t max_hold_ns, gather_ns;
  char record[8]; /* history.record */
  /* The arena (0 when the snapshot has no `chunks`: written before issue
   * 21). free_ranges counts the entries of chunks[].free. */
  int has_chunks;
  uint64_t chunks, chunk_bytes, chunk_free_bytes, free_ranges;
  /* Filled by snapcheck_chunks only: segments that cross from a chunk into
   * the next one of its run, and the free ranges with those cut at a
   * chunk boundary of a run joined again. */
  uint64_t crossing_segments, joined_ranges;
} snapcheck_t;

/* 0 if every check passes, else -1 with the first problem in why. */
int snapcheck(const char *text, size_t len, snapcheck_t *out, char *why,
              size_t whylen);

/* snapcheck, and then the layout of a quiescent pool's arena: 0 if it
 * holds, else -1 with the first problem in why.
 *  - Per chunk, in address order, the segments and the free ranges in it
 *    cover it exactly: no byte is in two of them, none in neither.
 *  - Every segment lies in one chunk, or in consecutive chunks of one run
 *    (adjacent, with the same flags and node: a run's extents may cross a
 *    chunk boundary, docs/allocation-policy.md "Runs"); no free range
 *    crosses a chunk's end (the writer cuts them there), and two free
 *    ranges of one chunk never touch (the arena coalesces them).
 *  - stats.arena_chunks is the number of chunks, stats.reserved_bytes.
 *    current their bytes (and totals.reserved_bytes), stats.segments.current
 *    the number of segments, stats.chunk_free_bytes the sum of the free
 *    ranges; stats.free_extents and stats.largest_free_extent count the
 *    free ranges either as listed or with the pieces cut at a run's chunk
 *    boundary joined again (the arena joins them only for backends whose
 *    chunks may form runs; the snapshot does not say which).
 * A snapshot without `chunks` fails. */
int snapcheck_chunks(const char *text, size_t len, snapcheck_t *out, char *why,
                     size_t whylen);

/* snapcheck, and what holds in every snapshot with `chunks`, busy pool or
 * not (docs/snapshot-format.md, step 2: the copy in pieces): no byte is in
 * two of the segments and free ranges, and every free range lies in a
 * chunk listed. 0 if it holds, else -1 with the first problem in why. */
int snapcheck_disjoint(const char *text, size_t len, snapcheck_t *out,
                       char *why, size_t whylen);

/* Does any frame of any stack name `function`? (1 yes, 0 no) */
int snapcheck_has_function(const char *text, size_t len, const char *function);

/* The state ("allocated", ...) of the block at address a, or NULL. The
 * result points into a static buffer. */
const char *snapcheck_block_state(const char *text, size_t len, uint64_t a);

#endif
