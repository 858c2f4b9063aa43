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
 * emptied, when the block is cached again (block_done). */
enum { PP_SSET_CAP0 = 4 };
typedef struct pp_sset {
  uint32_t n, cap;
  pp_suse_t s[];
} pp_sset_t;

/* One event of a freed block, on its stream's queue (stream.c; next and
 * event_result under streams_lock). */
typedef struct pp_qitem {
  void *event;
  struct pp_pending *p;
  struct pp_qitem *next;
  int event_result; /* once taken off its queue: 1 done, < 0 error */
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
