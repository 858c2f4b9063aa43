/*
 * The arena's declarations (extent.c, arena.c): the free extents of the
 * chunks, and the arena that makes chunks and carves segments from them.
 * Included by internal.h, where struct pinpool holds a pp_arena_t.
 */
#ifndef PP_ARENA_H
#define PP_ARENA_H

#include "base.h"

/* ---- Extents (extent.c): free space of the arena's chunks, carved at a
 * granule and coalesced; best fit in O(log n) (size bins of trees, a
 * bitmap) and merges in O(1) (a hash table of extent ends). Not
 * thread-safe: the owner's lock (the pool's seg_lock). */
typedef struct pp_xnode pp_xnode_t;
typedef struct pp_xchunk pp_xchunk_t;
#define PP_EXT_BIN_WORDS ((PP_NCLASSES + 63) / 64)
/* Bins come in two halves: extents of chunks with none of the avoided
 * flags first, those with some (pageable fallback memory) after. */
#define PP_EXT_HALF (PP_EXT_BIN_WORDS * 64)
typedef struct pp_range {
  uintptr_t base;
  size_t size;
} pp_range_t;
typedef struct pp_xslot {
  uintptr_t key; /* 0: empty */
  pp_xnode_t *node;
} pp_xslot_t;
typedef struct pp_extents {
  size_t granule;
  /* Free extents by size class: each bin a tree ordered by size, then
   * address (extent.c, "Bins"). */
  pp_xnode_t *bins[2 * PP_EXT_HALF];
  uint64_t nonempty[2 * PP_EXT_BIN_WORDS];
  /* The chunks that lie wholly inside a free extent, oldest free first:
   * [0] those with avoided flags, [1] the others (extent.c, "Free
   * chunks"). */
  pp_xchunk_t *whole_head[2], *whole_tail[2];
  /* Flags of chunks carved only when no other has room, and released
   * first (PP_SEG_FALLBACK; 0 in the tests that do not set it). */
  unsigned avoid;
  /* The chunks by address (extent.c, "The chunk tree"): an AVL tree with
   * subtree counts (lookups and ranks in O(log chunks)) threaded by a
   * list from the lowest (walks in address order). Adding or releasing a
   * chunk is O(log chunks) in one hold (issue 38: a sorted array shifted
   * and its run starts rebuilt, O(chunks)). */
  pp_xchunk_t *ctree, *cfirst;
  size_t nchunks;
  uint64_t next_seq;
  bool span;         /* adjacent chunks with the same flags form one run */
  pp_xchunk_t *last; /* the chunk found last (extent.c, chunk_at) */
  pp_xnode_t *spare; /* >= outstanding nodes, so that a give never fails */
  size_t nspare, outstanding;
  /* The boundary table (extent.c): >= 4 slots per extent that may exist
   * (free, or handed out and given back alone), a power of two; tcount:
   * its keys, the old slots' included. A doubling in progress (issue 38
   * (s39)): the old slots otab, [omig, ocap) not yet moved; NULL: none. */
  pp_xslot_t *tab;
  size_t tcap, tcount;
  unsigned tshift; /* 64 - log2(tcap) */
  pp_xslot_t *otab;
  size_t ocap, omig;
  unsigned oshift;
  size_t min_chunk; /* at most the smallest chunk's size (extent.c) */
  size_t free_bytes, total_bytes, nfree; /* nfree: free extents */
  /* The meter (tests/test_scale.c counts with it, not with a clock):
   * elements visited (tree nodes, extents, chunks, entries copied or
   * sorted) in all, and the most in one call (work_max): each call runs
   * in one hold of the owner's lock. copy_max: the most a snapshot's copy
   * visited in one hold, its segments included (snapshot.c sets it on
   * node 0's extents). */
  uint64_t work, work_max, copy_max;
} pp_extents_t;
void pp_ext_init(pp_extents_t *x, size_t granule, bool span);
void pp_ext_fini(pp_extents_t *x);
/* [base, base + size) becomes a chunk of one free extent (granule
 * multiples) with the given flags. 0 or PINPOOL_ENOMEM (nothing changed). */
int pp_ext_add_chunk(pp_extents_t *x, void *base, size_t size, unsigned flags);
/* A free range of `size` bytes (a granule multiple), or NULL; *flags (if
 * not NULL): its chunk's. */
void *pp_ext_take(pp_extents_t *x, size_t size, unsigned *flags);
/* The low end of the largest free extent without avoided flags, at most
 * `most` bytes (a granule multiple): *size is what was taken (the extent's
 * size if smaller), or NULL (none, or no memory for the metadata: nothing
 * changed). O(log n). Page-moving growth's donors (docs/allocation-
 * policy.md, "Page-moving growth"): the largest first. */
void *pp_ext_take_largest(pp_extents_t *x, size_t most, size_t *size,
                          unsigned *flags);
/* Page moves (arena.c, "Page moves"). pp_ext_cut: a range taken before
 * (by one take), whose pages moved away, leaves its chunks (in one run):
 * the chunks shrink, go, or one is split in two, whose high side is
 * *spare (then set NULL; a struct from pp_ext_chunk_new). Never fails.
 * pp_ext_add_chunk_spare: pp_ext_add_chunk with the chunk struct given,
 * for the hold that publishes a move after at least one cut (which left
 * the spare node and the table room it needs); never fails. */
pp_xchunk_t *pp_ext_chunk_new(void);
void pp_ext_chunk_free(pp_xchunk_t *c);
void pp_ext_cut(pp_extents_t *x, void *base, size_t size, pp_xchunk_t **spare);
void pp_ext_add_chunk_spare(pp_extents_t *x, void *base, size_t size,
                            unsigned flags, pp_xchunk_t *c);
/* Give back a range taken before; merges with free neighbours. Never
 * fails. */
void pp_ext_give(pp_extents_t *x, void *ptr, size_t size);
pp_xchunk_t *pp_ext_chunk_of(const pp_extents_t *x, const void *p);
/* The chunks in address order: the lowest, then each one's next (NULL
 * after the highest). */
pp_xchunk_t *pp_ext_first(const pp_extents_t *x);
pp_xchunk_t *pp_ext_next(const pp_xchunk_t *c);
void pp_ext_chunk_info(const pp_xchunk_t *c, uintptr_t *base, size_t *size,
                       unsigned *flags);
/* Take the chunk that has been all free the longest and has none of
 * skip_flags out of x: true with its range and flags (the caller gives it
 * back to the backend), or false. */
bool pp_ext_remove_free_chunk(pp_extents_t *x, unsigned skip_flags, void **base,
                              size_t *size, unsigned *flags);
/* [base, base + size) lies in one run of chunks with these flags (the
 * validator's check of a segment). */
bool pp_ext_run_holds(const pp_extents_t *x, uintptr_t base, size_t size,
                      unsigned flags);
/* A copy of the chunks (in address order) and of the free extents (in no
 * order): malloc'd by pp_ext_view (0 or PINPOOL_ENOMEM); into the
 * caller's arrays by pp_ext_copy, which copies nothing and returns false
 * when *nchunks or *nfree (set either way) exceed their room. A copy is
 * O(chunks + extents) in one call: snapshots copy in pieces instead
 * (pp_ext_copy_some, below). */
typedef struct pp_chunk_view {
  uintptr_t base;
  size_t size;
  unsigned flags;
  unsigned node; /* set by the snapshot (snapshot.c) */
} pp_chunk_view_t;
int pp_ext_view(const pp_extents_t *x, pp_chunk_view_t **chunks,
                size_t *nchunks, pp_range_t **free_out, size_t *nfree);
bool pp_ext_copy(const pp_extents_t *x, pp_chunk_view_t *chunks,
                 size_t cap_chunks, pp_range_t *free_out, size_t cap_free,
                 size_t *nchunks, size_t *nfree);
/* A copy in pieces, one per hold of the owner's lock (snapshots, issue
 * 38: one copy of 100,000 free extents held seg_lock for milliseconds).
 * The cursor (zeroed to start) is where the copy stands: the chunks in
 * address order, then the free extents by (bin, size, address), and it is
 * a key, so the extents may change between two calls. Each call copies at
 * most `budget` elements (chunks, then free extents) after it, appending
 * to chunks[*nc...] and free_out[*nf...] (room for `budget` more in
 * each), and returns the elements it visited (the meter's count: tree
 * descents and the chunks' search included, at most 3 * budget +
 * 6 log2(extents + 2) + log2(chunks + 2) + 2). c->done: nothing is left.
 * If nothing changed between the calls, the pieces are exactly one
 * pp_ext_copy; otherwise a chunk is copied at most once and in address
 * order, and a free extent that changed may be copied twice (in two
 * shapes, which overlap) or not at all (snapshot.c makes a consistent
 * picture of that: docs/snapshot-format.md). */
typedef struct pp_ext_cursor {
  uintptr_t chunk_from; /* the next chunk: the first based at or above */
  unsigned bin;         /* the next free extent: in this bin, */
  size_t size;          /* after (size, base) when `after` */
  uintptr_t base;
  bool after, chunks_done, done;
} pp_ext_cursor_t;
uint64_t pp_ext_copy_some(const pp_extents_t *x, pp_ext_cursor_t *c,
                          size_t budget, pp_chunk_view_t *chunks, size_t *nc,
                          pp_range_t *free_out, size_t *nf);
/* Chunks all free without skip_flags, and their bytes: O(free chunks). */
size_t pp_ext_free_chunks(const pp_extents_t *x, unsigned skip_flags,
                          size_t *bytes);
/* The largest free extent: O(log extents). */
size_t pp_ext_largest(const pp_extents_t *x);
bool pp_ext_validate(const pp_extents_t *x, char *why, size_t len);

/* ---- The arena (arena.c): every segment's memory. Chunks come from the
 * backend (populated, locked, registered once) and go back to it only
 * whole and all free, by pinpool_empty_cache, the caps, an allocation
 * that found max_reserved reached, and destroy; segments (slabs, and large
 * blocks at their page-rounded size) are carved from them and given back,
 * coalescing. The reserve is a chunk that never goes back
 * (PP_SEG_FROM_RESERVE). ----------------------------------------------- */
typedef struct pp_arena_node {
  pp_extents_t ext; /* under the pool's seg_lock */
  /* Read without the lock by the growth policy (a size, not a
   * correctness input). */
  pp_counter_t total;
  /* Live segments carved from this node's chunks; under seg_lock. */
  uint64_t segs;
  /* The donors of page moves in flight (arena.c, "Page moves"): out of
   * the free extents, still in their chunks, idle; under seg_lock. */
  uint64_t moving;
} pp_arena_node_t;
/* One arena per NUMA node (numa=local; one node otherwise): a node's
 * segments are carved only from its own chunks, which the backend bound to
 * that node before their first touch. */
typedef struct pp_arena {
  pp_arena_node_t *node; /* [pool->nnodes] */
  /* Chunks whose max_reserved claim is not yet matched by the arena
   * (arena.c, "The out-of-memory retry"): the grower's chunk between its
   * claim and the hold that enters it, a released chunk between the hold
   * that takes it out and the backend call that drops its claim. Each in
   * a busy section, so none at a fork. An allocation's retry waits for
   * them (settle_cv, under settle_mu) before it decides what to release. */
  /* Listed in the order they began (tickets), under settle_mu; a waiter
   * waits only for those listed when it came (issue 37, fourth review,
   * D6: new claims kept a count of them up for as long as other threads
   * released). */
  struct pp_claim *claims, *claims_tail;
  uint64_t claim_seq; /* the last ticket given */
  pthread_mutex_t settle_mu;
  pthread_cond_t settle_cv;
} pp_arena_t;
/* A claim in flight: on its thread's stack, from settle_begin to
 * settle_end (arena.c). */
typedef struct pp_claim {
  uint64_t ticket;
  struct pp_claim *prev, *next;
  const void *owner; /* its thread's &pp_callout (a fork keeps its own) */
  unsigned co_prev;  /* pp_callout_enter's */
} pp_claim_t;
struct pinpool;
/* At create: the reserve chunk, if configured. */
int pp_arena_init(struct pinpool *pool);
/* At teardown: every chunk back to the backend. */
void pp_arena_fini(struct pinpool *pool);
/* A carve that never grows the arena nor releases idle slabs: false if no
 * free extent is large enough. Caller holds seg_lock (the arena's lock). */
bool pp_arena_take_now(struct pinpool *pool, unsigned node, size_t size,
                       void **mem, unsigned *flags);
/* `size` bytes (a page multiple) carved from a chunk, a new chunk made if
 * none has room (*grew set): 0 with *mem and *flags (the chunk's), or an
 * error. No lock held; takes the arena's. */
int pp_arena_take(struct pinpool *pool, unsigned node, size_t size, void **mem,
                  unsigned *flags, bool *grew);
/* Caller holds seg_lock. */
void pp_arena_give_locked(struct pinpool *pool, unsigned node, void *mem,
                          size_t size);
/* Give whole free chunks (never the reserve) back to the backend, oldest
 * first, until `budget` bytes went back; returns the chunks released. No
 * lock held. */
unsigned pp_arena_release(struct pinpool *pool, uint64_t budget);
/* The out-of-memory retry (alloc.c): what to release before the second
 * try, from this thread's last failed growth. False: nothing released
 * could make that growth fit under max_reserved (the retry fails with
 * nothing released). True with *budget: the bytes of whole free chunks to
 * release (0: none, the cap leaves room now; UINT64_MAX: every one, the
 * backend refused). Waits (no lock held) for the chunks whose claim is in
 * flight. pp_arena_miss_clear forgets the thread's last failed growth. */
bool pp_arena_retry_plan(struct pinpool *pool, uint64_t *budget);
void pp_arena_miss_clear(void);
/* A child of fork: no claim is in flight (each is in a busy section, and
 * the threads that held one are gone); the wait's lock and condition are
 * made anew. */
void pp_arena_fork_child(struct pinpool *pool);
typedef struct pp_arena_info {
  uint64_t chunks, total, free_bytes, free_extents, largest, moving;
} pp_arena_info_t;
/* Summed over the nodes; one node's (node < nnodes) with the _node one. */
void pp_arena_info(struct pinpool *pool, pp_arena_info_t *out);
void pp_arena_info_locked(struct pinpool *pool, pp_arena_info_t *out);
void pp_arena_node_info_locked(struct pinpool *pool, unsigned node,
                               pp_arena_info_t *out, uint64_t *segs);
/* Caller holds seg_lock. */
bool pp_arena_validate_locked(struct pinpool *pool, char *why, size_t len);

#endif /* PP_ARENA_H */
