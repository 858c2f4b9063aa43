/*
 * A hash index from a 64-bit key to a non-zero 64-bit value whose doubling
 * is done in pieces (issue 38, the meter's findings, item 1): the lends'
 * indexes (share.c), the peers by pid (share.c), the captures by id and
 * the streams' captures (capture.c). Each of them was rebuilt whole in
 * the hold of the operation that made it double: O(entries) in one hold
 * of the share lock or streams_lock, every free of a shared pool waiting.
 *
 * Open addressing, linear probing, at most half full, deletion by
 * shifting the run back (no tombstones). A doubling allocates the new
 * slots and keeps the old ones beside them; every later change moves
 * PP_INDEX_STEP more old slots into the new ones, and a lookup asks the
 * new slots, then the old. The old slots change only by losing entries,
 * each marked moved (a tombstone: the runs through it stay whole), so the
 * migration's cursor, a slot number, misses none. It ends long before the
 * new slots fill: a doubling starts at cap / 2 entries in 2 cap slots, and
 * ends within cap / PP_INDEX_STEP changes, which add at most that many.
 *
 * Any key; values non-zero (a value 0 is "absent"). Not thread-safe: the
 * owner's lock (meter) is held around every call; probes and moves count
 * on its meter (base.h, pp_lock_visit).
 */
#ifndef PINPOOL_INDEX_H
#define PINPOOL_INDEX_H

#include "base.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Old slots moved per change while a doubling is in progress. */
#define PP_INDEX_STEP 16

typedef struct pp_islot {
  uint64_t key, val; /* val 0: empty (key 0) or moved (key 1) */
} pp_islot_t;

typedef struct pp_index {
  pp_islot_t *t;   /* cap slots, a power of two, or NULL (cap 0) */
  size_t cap, n;   /* n: entries in all, old slots' included */
  pp_islot_t *old; /* a doubling in progress: old slots [mig, ocap) */
  size_t ocap, mig;
  pp_mutex_t *meter;
} pp_index_t;

void pp_index_init(pp_index_t *ix, pp_mutex_t *meter);
void pp_index_fini(pp_index_t *ix);
/* Room for `more` entries beyond the n there are (a doubling begun if
 * needed): false for want of memory, nothing changed. */
bool pp_index_reserve(pp_index_t *ix, size_t more);
/* The value of key, or 0. */
uint64_t pp_index_get(pp_index_t *ix, uint64_t key);
/* Enter key (absent; room reserved) with val (non-zero). */
void pp_index_put(pp_index_t *ix, uint64_t key, uint64_t val);
/* Give key (present) another value (non-zero). */
void pp_index_set(pp_index_t *ix, uint64_t key, uint64_t val);
/* Take key (present) out. */
void pp_index_del(pp_index_t *ix, uint64_t key);

#endif
