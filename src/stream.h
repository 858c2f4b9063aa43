/*
 * Stream-ordered frees, internal: what stream.c (stream sets, events,
 * queues, settling, reclaim) and capture.c (graph capture: ties, parking,
 * graph release) both know: a block's stream set, a freed block waiting
 * for its events, and the calls each makes into the other. Nothing here is
 * exported.
 */
#ifndef PINPOOL_STREAM_H
#define PINPOOL_STREAM_H

#include "internal.h"

/* One use of a block: a stream, or (captured) the capture of that id, seen
 * on that stream. One allocation (pool.c frees it with free()). */
typedef struct pp_suse {
  pinpool_stream_t s;
  uint64_t capture;
  bool captured;
} pp_suse_t;

/* A block's uses, under its stripe lock. Made with room for PP_SSET_CAP0
 * by the block's first record_stream; one of that size stays in its slot,
 * emptied, when the block is cached again (block_done). Uses past the
 * first PP_SSET_CAP0 go to chunks (more): chunk k holds PP_SSET_CAP0 << k,
 * with an index of its own (open addressing, twice its size, never
 * rehashed), so that record_stream finds a stream already recorded in
 * O(log S) probes and a growth copies nothing (issue 38: it scanned every
 * use of the block, O(S) a call under the stripe lock; a doubled array
 * copied all of them). pp_sset_at reads use i. */
enum { PP_SSET_CAP0 = 4, PP_SSET_CHUNKS = 28 };
typedef struct pp_sset_more {
  uint32_t nchunks;
  pp_suse_t *chunk[PP_SSET_CHUNKS];
  uint32_t *index[PP_SSET_CHUNKS]; /* a use's place in its chunk + 1 */
} pp_sset_more_t;
typedef struct pp_sset {
  uint32_t n, cap;
  uint32_t ncaps;       /* of the n, ties to a capture */
  pp_sset_more_t *more; /* NULL: cap is PP_SSET_CAP0 */
  pp_suse_t s[PP_SSET_CAP0];
} pp_sset_t;

/* Use i of set (i < set->n): the first PP_SSET_CAP0 in s, use
 * PP_SSET_CAP0 * (2^k - 1) + j of the rest at chunk k, place j. */
static inline const pp_suse_t *pp_sset_at(const pp_sset_t *set, uint32_t i) {
  if (i < PP_SSET_CAP0)
    return &set->s[i];
  uint32_t r = i - PP_SSET_CAP0;
  unsigned k = 31u - (unsigned)__builtin_clz(r / PP_SSET_CAP0 + 1);
  return &set->more->chunk[k][r - PP_SSET_CAP0 * ((1u << k) - 1)];
}

/* One event of a freed block, on its stream's queue (stream.c; next and
 * event_result under streams_lock). */
typedef struct pp_qitem {
  void *event;
  struct pp_pending *p;
  struct pp_qitem *next;
  int event_result; /* once taken off its queue: 1 done, < 0 error */
  /* Queued behind an item of a newer cohort (stream.c, "Waiting"). */
  bool inv;
} pp_qitem_t;

/* A freed block waiting for its events: one allocation with room for an
 * event on each of its uses (items[i] for set->s[i]; a capture's unused),
 * so a stream-ordered free allocates once, however many streams. Freed by
 * the last of its events (event_done) or by the pool's end. */
typedef struct pp_pending {
  pp_segment_t *seg;
  uint32_t idx;
  size_t req;
  size_t bs; /* the block's size (a large block's is not its class's) */
  uint64_t freed_ns;
  _Atomic(uint32_t) remaining; /* events not yet complete */
  _Atomic(bool) failed;        /* an event failed: never reused */
  _Atomic(uint32_t) holds;     /* parked: captures not yet released */
  struct pp_cohort *coh;       /* its cohort (stream.c, "Waiting") */
  pp_qitem_t items[];
} pp_pending_t;

/* A capture a block is tied to or parked on (capture.c). */
typedef struct pp_capture pp_capture_t;

/* What a free (or the release of a block's last capture) does with each
 * use of the block: record an event on the stream, park the block on the
 * capture, or give up on the stream (its capture status is unknown). */
enum { PP_USE_RECORD = 0, PP_USE_CAPTURING = 1, PP_USE_FAILED = 2 };

/* stream.c */
/* A miss's poll (pp_process_miss): at most PP_MISS_QUEUES queues, in turn
 * from a round-robin cursor, and at most PP_MISS_BUDGET completions. */
enum { PP_MISS_QUEUES = 4, PP_MISS_BUDGET = 64 };
/* Queue heads the calling thread has examined, in every poll so far (a
 * test hook: test_streams counts a miss's). */
extern _Thread_local uint64_t pp_queue_polls PP_TLS_MODEL;
/* A parked block's last capture was released: settle it again. */
void pp_stream_resume(pinpool_t *pool, pp_pending_t *p);

/* capture.c */
/* record_stream's check of `stream`, before it takes the block's stripe
 * lock: capturing, the capture's id in *cap_id and the capture entered and
 * pinned in *pin (pp_capture_unpin ends it); not capturing, *pin NULL.
 * < 0 on an error (the provider's, or out of memory): nothing pinned. */
int pp_capture_check(pinpool_t *pool, pinpool_stream_t stream, uint64_t *cap_id,
                     pp_capture_t **pin);
void pp_capture_unpin(pinpool_t *pool, pp_capture_t *c, pinpool_stream_t stream,
                      bool tied);
/* settle's question, no lock held: use[i] and ids[i] for each use of set;
 * true if any use is a capture (a tie, or a stream capturing now). */
bool pp_capture_classify(pinpool_t *pool, const pp_sset_t *set, uint8_t *use,
                         uint64_t *ids);
uint32_t pp_capture_park(pinpool_t *pool, pp_pending_t *p, const pp_sset_t *set,
                         uint8_t *use, const uint64_t *ids, bool *oom_out);
/* pp_streams_fini's part: the captures never released. */
void pp_captures_fini(pinpool_t *pool);

#endif /* PINPOOL_STREAM_H */
