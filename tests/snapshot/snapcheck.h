/*
 * Checks every test applies to a snapshot it wrote (tests/snapshot/
 * snapcheck.c): it parses (libjansson), the format and version are right,
 * no block is listed twice, every segment's blocks fit it exactly, every
 * stack and frame index is in range, and the accounting identity holds on
 * the totals and agrees with the blocks listed.
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
} snapcheck_t;

/* 0 if every check passes, else -1 with the first problem in why. */
int snapcheck(const char *text, size_t len, snapcheck_t *out, char *why,
              size_t whylen);

/* Does any frame of any stack name `function`? (1 yes, 0 no) */
int snapcheck_has_function(const char *text, size_t len, const char *function);

/* The state ("allocated", ...) of the block at address a, or NULL. The
 * result points into a static buffer. */
const char *snapcheck_block_state(const char *text, size_t len, uint64_t a);

#endif
