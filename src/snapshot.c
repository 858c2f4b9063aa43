/*
 * Snapshots (docs/snapshot-format.md), part one: gathering
 * (snapshot_json.c formats what is gathered here).
 *
 * Gathering holds one pool lock at a time and never for long:
 *  - seg_lock while the list of live segments and the arena's chunks and
 *    free extents are copied (a few words each), in one hold, so that the
 *    segments and the free extents tile the chunks as they were at one
 *    moment (tests/snapshot: snapcheck_chunks). That is the longest hold;
 *    it is measured and written out as max_hold_ns. Only segment creation
 *    and release wait for it. It copies and nothing more: the arrays are
 *    allocated before it and sorted after it (tests/test_scale.c counts
 *    the elements it visits).
 *  - a stripe lock per block that has streams, to copy its stream set.
 *  - the stack table's lock while it is copied.
 * Blocks are read with no lock: each block's state word is one atomic
 * load, so a block is reported in exactly one state (invariant 2), and the
 * totals are summed from what was read, so the accounting identity holds
 * in every snapshot by construction. A segment released while its blocks
 * were read is detected by its generation and left out.
 */
#include "snapshot.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* ---- Large scratch arrays ------------------------------------------------
 * The copies of the blocks and of the history ring can be tens of MiB.
 * Unmapping that much at once holds the process's mmap lock for tens of
 * milliseconds, and a thread creating a segment (an mmap) waits for all of
 * it (measured by bench W8: 13-30 ms). So these arrays are mapped here and
 * unmapped 1 MiB at a time: each piece holds the lock for well under a
 * millisecond, and waiting threads get in between. */
#define BIG_PIECE ((size_t)1 << 20)

static void *big_alloc(size_t bytes) {
  if (bytes == 0)
    bytes = 1;
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void big_free(void *p, size_t bytes) {
  if (p == NULL)
    return;
  if (bytes == 0)
    bytes = 1;
  size_t len = (bytes + PP_PAGE - 1) & ~(size_t)(PP_PAGE - 1);
  for (size_t off = 0; off < len; off += BIG_PIECE)
    (void)munmap((char *)p + off,
                 len - off < BIG_PIECE ? len - off : BIG_PIECE);
}

void pp_snap_free(pp_snap_t *s) {
  free(s->config);
  free(s->chunks);
  free(s->free_ext);
  free(s->segs);
  big_free(s->blk, s->cap_blk * sizeof *s->blk);
  free(s->streams);
  big_free(s->ent, s->cap_ent * sizeof *s->ent);
  pp_stacks_copy_free(&s->stacks);
  free(s->lends);
}

static void hold_done(pp_snap_t *s, uint64_t t0) {
  uint64_t dt = pp_now_ns() - t0;
  if (dt > s->max_hold_ns)
    s->max_hold_ns = dt;
}

/* The arena's chunks and free extents of every node, into arrays with
 * room for cap_c and cap_f: false if they had too little (*nc, *nf: what
 * was needed). Caller holds seg_lock: a copy, no sort, no allocation. */
static bool copy_arena_locked(pinpool_t *pool, pp_chunk_view_t *c, size_t cap_c,
                              pp_range_t *f, size_t cap_f, size_t *nc,
                              size_t *nf) {
  bool fits = true;
  *nc = *nf = 0;
  for (unsigned n = 0; n < pool->nnodes; n++) {
    pp_extents_t *x = &pool->arena.node[n].ext;
    size_t k = 0, m = 0;
    if (fits &&
        pp_ext_copy(x, c + *nc, cap_c - *nc, f + *nf, cap_f - *nf, &k, &m)) {
      for (size_t i = 0; i < k; i++)
        c[*nc + i].node = n;
    } else {
      fits = false;
      k = x->nchunks;
      m = x->nfree;
    }
    *nc += k;
    *nf += m;
  }
  return fits;
}

static int range_cmp(const void *a, const void *b) {
  uintptr_t x = ((const pp_range_t *)a)->base;
  uintptr_t y = ((const pp_range_t *)b)->base;
  return x < y ? -1 : x > y;
}

static int chunk_cmp(const void *a, const void *b) {
  uintptr_t x = ((const pp_chunk_view_t *)a)->base;
  uintptr_t y = ((const pp_chunk_view_t *)b)->base;
  return x < y ? -1 : x > y;
}

/* The segments, and the arena's chunks and free extents, copied in one
 * hold of seg_lock (they tile each other as at one moment), into arrays
 * allocated before it; sorted after it (issue 38: the view sorted up to
 * 100,000 free extents in the hold, 38 ms). The arena's sizes come from a
 * hold of their own, O(nodes); when they grew in between, the copy finds
 * too little room and the next attempt has more. */
static int copy_segments(pp_snap_t *s) {
  pinpool_t *pool = s->pool;
  size_t want_c = 0, want_f = 0;
  pp_mutex_lock(&pool->seg_lock);
  for (unsigned n = 0; n < pool->nnodes; n++) {
    want_c += pool->arena.node[n].ext.nchunks;
    want_f += pool->arena.node[n].ext.nfree;
  }
  pp_mutex_unlock(&pool->seg_lock);
  for (int attempt = 0; attempt < 16; attempt++) {
    size_t cap = (size_t)pp_load_relaxed(&pool->gs.segs_cur) + 64;
    size_t cap_c = want_c + 16, cap_f = want_f + want_f / 8 + 64;
    pp_sseg_t *segs = malloc(cap * sizeof *segs);
    pp_chunk_view_t *chunks = malloc(cap_c * sizeof *chunks);
    pp_range_t *fr = malloc(cap_f * sizeof *fr);
    if (segs == NULL || chunks == NULL || fr == NULL) {
      free(segs);
      free(chunks);
      free(fr);
      return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for segments");
    }
    /* Touched here, not first in the hold: fresh pages fault (a 100,000
     * extent copy is 1.6 MB, 400 faults). */
    memset(segs, 0, cap * sizeof *segs);
    memset(chunks, 0, cap_c * sizeof *chunks);
    memset(fr, 0, cap_f * sizeof *fr);
    size_t n = 0, nc = 0, nf = 0;
    bool fits = true;
    uint64_t t0 = pp_now_ns();
    pp_mutex_lock(&pool->seg_lock);
    for (pp_segment_t *d = pool->all; d != NULL; d = d->all_next) {
      if (n == cap) {
        fits = false;
        break;
      }
      pp_sseg_t *g = &segs[n++];
      g->d = d;
      g->gen = pp_load_relaxed(&d->gen);
      g->base = pp_load_relaxed(&d->base);
      g->size = pp_load_relaxed(&d->size);
      g->bs = pp_load_relaxed(&d->block_size);
      g->nblocks = pp_load_relaxed(&d->nblocks);
      g->cls = pp_load_relaxed(&d->cls_index);
      g->flags = d->flags; /* written before publication, under seg_lock */
      g->node = d->node;   /* likewise */
    }
    if (fits)
      fits = copy_arena_locked(pool, chunks, cap_c, fr, cap_f, &nc, &nf);
    pp_mutex_unlock(&pool->seg_lock);
    hold_done(s, t0);
    if (fits) {
      /* Out of the hold: the chunks and the free extents in address
       * order (each node's chunks are, the nodes' are interleaved). */
      if (pool->nnodes > 1)
        qsort(chunks, nc, sizeof *chunks, chunk_cmp);
      qsort(fr, nf, sizeof *fr, range_cmp);
      s->segs = segs;
      s->nsegs = n;
      s->chunks = chunks;
      s->nchunks = nc;
      s->free_ext = fr;
      s->nfree = nf;
      s->chunk_free = 0;
      for (size_t i = 0; i < s->nfree; i++)
        s->chunk_free += s->free_ext[i].size;
      return 0;
    }
    free(segs);
    free(chunks);
    free(fr);
    want_c = nc > want_c ? nc : want_c;
    want_f = nf > want_f ? nf : want_f;
  }
  return pp_fail(PINPOOL_EBUSY, "snapshot: segments kept being created");
}

bool pp_snap_grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return true;
  size_t c = *cap ? *cap : 1024;
  while (c < need)
    c *= 2;
  void *q = realloc(*p, c * elem);
  if (q == NULL)
    return false;
  *p = q;
  *cap = c;
  return true;
}

static uint64_t load_word(pp_segment_t *d, uint32_t i) {
#ifdef PINPOOL_MUTANT_SNAPSHOT_PLAIN
  /* Race mutant (docs/verification.md): the state read as a plain field
   * while allocating threads store it (PyTorch's getSegments read block
   * fields under a lock their writers did not hold). */
  return *(volatile uint64_t *)&d->word[i];
#else
  return pp_load_acquire(&d->word[i]);
#endif
}

static uint64_t load_info(_Atomic(uint64_t) *info, uint32_t i) {
  if (info == NULL)
    return 0;
#ifdef PINPOOL_MUTANT_BLOCKINFO_PLAIN
  return *(volatile uint64_t *)&info[i];
#else
  return pp_load_relaxed(&info[i]);
#endif
}

static int read_blocks(pp_snap_t *s, pp_sseg_t *g) {
  pp_segment_t *d = g->d;
  g->first = s->nblk;
  g->nblk = 0;
  g->uncarved = 0;
  _Atomic(uint64_t) *info = pp_load_acquire(&d->info);
  pp_assert(s->nblk + g->nblocks <= s->cap_blk); /* sized by gather() */
  for (uint32_t i = 0; i < g->nblocks; i++) {
    uint64_t w = load_word(d, i);
    unsigned st = PP_WORD_STATE(w);
    if (st == PP_NEVER) {
      g->uncarved++;
      continue;
    }
    pp_sblk_t *b = &s->blk[s->nblk++];
    b->word = w;
    b->idx = i;
    b->info = st == PP_CACHED ? 0 : load_info(info, i);
    b->nstreams = b->ncaps = 0;
    b->streams = s->nstreams;
    if (st == PP_PENDING || (st == PP_ALLOCATED && (w & PP_WORD_STREAMS))) {
      uint64_t tmp[32]; /* 16 streams, then 16 captures */
      size_t nc = 0;
      size_t n = pp_stream_list(s->pool, d, i, tmp, 16, tmp + 16, 16, &nc);
      if (n > 16)
        n = 16; /* a block used on more streams lists the first 16 */
      if (nc > 16)
        nc = 16; /* and the first 16 captures */
      memmove(tmp + n, tmp + 16, nc * sizeof tmp[0]);
      /* n + nc can be 0 (the events completed between the word and the
       * list reads): nothing to copy, and s->streams may still be NULL. */
      if (n + nc > 0) {
        if (!pp_snap_grow((void **)&s->streams, &s->cap_streams,
                          s->nstreams + n + nc, sizeof *s->streams))
          return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory");
        memcpy(&s->streams[s->nstreams], tmp, (n + nc) * sizeof tmp[0]);
        s->nstreams += n + nc;
      }
      b->nstreams = (uint32_t)n;
      b->ncaps = (uint32_t)nc;
    }
    g->nblk++;
  }
  /* Seqlock check: a release (or a release and reuse) during the reads
   * bumped gen before it changed any word we could have read. By the C11
   * model, not only by the hardware: every store of a word of a live
   * segment is a release (or acq_rel CAS) and was preceded (in
   * happens-before) by the publication's gen bump; our acquire load of such
   * a word therefore makes that bump visible to the load below. The words
   * reset to NEVER at publication are ordered after the release's bump by
   * the release fence in seg_publish before their relaxed stores, which
   * synchronizes with our acquire load of one. */
  atomic_thread_fence(memory_order_acquire);
  if (pp_load_relaxed(&d->gen) != g->gen) {
    s->nblk = g->first;
    g->nblk = 0;
    return 1; /* left out */
  }
  return 0;
}

static int copy_history(pp_snap_t *s) {
  pp_history_t *h = &s->pool->hist;
  /* The ring, its base and the settings are read together under hist.lock,
   * under which pinpool_record_history changes them together (a clear
   * moves the base to the head; a larger ring starts at the old head, which
   * becomes the base). Read apart, a clear between the head and the base
   * made base > head and the entry count wrapped: a spurious ENOMEM
   * (docs/verification.md, "Review defects", 2). The head is read after
   * the lock: it only grows, and the base was the ring's head when it was
   * set, so base <= head. A short hold: record_history maps rings before
   * it takes the lock. */
  uint64_t t0 = pp_now_ns();
  pp_mutex_lock(&h->lock);
  s->level = pp_load_relaxed(&h->level);
  s->depth = pp_load_relaxed(&h->depth);
  s->max_entries = pp_load_relaxed(&h->max_entries);
  pp_hring_t *r = pp_load_acquire(&h->ring);
  uint64_t base = pp_load_relaxed(&h->base_seq);
  pp_mutex_unlock(&h->lock);
  hold_done(s, t0);
  s->hist_lost = pp_load_relaxed(&h->lost);
  if (r == NULL)
    return 0;
  pp_hook(PP_HOOK_SNAP_HISTORY);
  uint64_t head = pp_load_acquire(&r->head);
  pp_assert(head >= base);
  uint64_t keep = s->max_entries < r->mask + 1 ? s->max_entries : r->mask + 1;
  uint64_t start = head > keep ? head - keep : 0;
  if (start < base)
    start = base;
  s->recorded = head - base;
  if (s->flags & PINPOOL_SNAPSHOT_NO_HISTORY) {
    s->hist_dropped = s->recorded;
    return 0;
  }
  s->cap_ent = (size_t)(head - start + 1);
  s->ent = big_alloc(s->cap_ent * sizeof *s->ent);
  if (s->ent == NULL) {
    s->cap_ent = 0;
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for history");
  }
  for (uint64_t q = start; q < head; q++) {
    pp_hslot_t *sl = &r->slots[q & r->mask];
    uint64_t s1 = pp_load_acquire(&sl->seq);
    if (s1 != 2 * q + 2)
      continue; /* being written, or already overwritten by a newer one */
    pp_sentry_t e;
    e.seq = q;
    e.clk = pp_load_relaxed(&sl->time);
    e.addr = pp_load_relaxed(&sl->addr);
    e.size = pp_load_relaxed(&sl->size);
    e.req = pp_load_relaxed(&sl->req);
    e.stream = pp_load_relaxed(&sl->stream);
    e.tid_action = pp_load_relaxed(&sl->tid_action);
    e.stack = pp_load_relaxed(&sl->stack);
    atomic_thread_fence(memory_order_acquire);
    if (pp_load_relaxed(&sl->seq) != s1)
      continue;
    s->ent[s->nent++] = e;
  }
  s->hist_dropped = s->recorded - s->nent;
  return 0;
}

static int seg_cmp(const void *a, const void *b) {
  const pp_sseg_t *x = a, *y = b;
  return x->base < y->base ? -1 : x->base > y->base;
}

int pp_snap_gather(pp_snap_t *s) {
  pinpool_t *pool = s->pool;
  struct timespec rt;
  (void)clock_gettime(CLOCK_REALTIME, &rt);
  s->unix_time = (double)rt.tv_sec + (double)rt.tv_nsec / 1e9;
  s->t0_ns = pp_now_ns();
  uint64_t t0 = pp_now_ns();
  int rc = pinpool_get_stats(pool, &s->stats); /* holds reg_lock inside */
  hold_done(s, t0);
  if (rc != 0)
    return rc;
  size_t need = 0;
  (void)pinpool_get_config(pool, NULL, 0, &need);
  s->config = malloc(need);
  if (s->config == NULL || pinpool_get_config(pool, s->config, need, NULL) != 0)
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory");
  pp_hook(PP_HOOK_SNAP_SEGMENTS);
  rc = copy_segments(s); /* and the chunks, in the same hold */
  if (rc != 0)
    return rc;
  /* Room for every block of every segment copied: no growing (and no
   * large realloc) while reading. */
  size_t total = 0;
  for (size_t i = 0; i < s->nsegs; i++)
    total += s->segs[i].nblocks;
  s->cap_blk = total;
  s->blk = big_alloc(total * sizeof *s->blk);
  if (s->blk == NULL) {
    s->cap_blk = 0;
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for blocks");
  }
  size_t kept = 0;
  for (size_t i = 0; i < s->nsegs; i++) {
    rc = read_blocks(s, &s->segs[i]);
    if (rc < 0)
      return rc;
    if (rc == 0)
      s->segs[kept++] = s->segs[i];
  }
  s->nsegs = kept;
  qsort(s->segs, s->nsegs, sizeof *s->segs, seg_cmp);
  rc = copy_history(s);
  if (rc != 0)
    return rc;
  rc = pp_stacks_copy(pool, &s->stacks, &s->max_hold_ns);
  if (rc != 0)
    return rc;
  if (pool->share != NULL) {
    t0 = pp_now_ns();
    rc = pp_share_lends_copy(pool->share, &s->lends, &s->nlends);
    hold_done(s, t0);
    if (rc != 0)
      return rc;
  }
  s->gather_ns = pp_now_ns() - s->t0_ns;
  return 0;
}
