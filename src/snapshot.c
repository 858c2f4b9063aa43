/*
 * Snapshots (docs/snapshot-format.md), part one: gathering
 * (snapshot_json.c formats what is gathered here).
 *
 * Gathering holds one pool lock at a time and never for long:
 *  - seg_lock while the list of live segments and the arena's chunks and
 *    free extents are copied (a few words each), in pieces of at most
 *    PP_SNAP_PIECE elements a hold ("copied in pieces" below: what they
 *    make together; in a quiescent pool the segments and the free extents
 *    tile the chunks, tests/snapshot: snapcheck_chunks). Those are the
 *    longest holds; the longest is written out as max_hold_ns. Only
 *    segment creation and release wait for them. They copy and nothing
 *    more: the arrays are grown between them and sorted after them
 *    (tests/test_scale.c counts the elements each visits).
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

/* ---- The segments and the arena, copied in pieces (issue 38) ----------
 * One hold of seg_lock copied every segment, chunk and free extent: with
 * 100,000 free extents (and as many segments) that held it for
 * milliseconds, and every segment creation and release waited
 * (docs/benchmarks.md, "Issue 38"). Each hold now copies at most
 * PP_SNAP_PIECE elements and lets go: the segments first, from a cursor
 * that the pool moves on when it releases the segment under it (pool.c,
 * seg_release_locked), then each node's chunks and free extents from a
 * cursor that is a key (pp_ext_copy_some). What the pieces make together
 * (docs/snapshot-format.md, step 2, the argument in full):
 *  - segments: only those that existed when the copy began (new ones go
 *    to the head of the list, behind the cursor), and of those, after the
 *    block reads' generation check (read_blocks), only the ones that still
 *    exist: each existed all through the copy of the arena, so no free
 *    range copied overlaps it, and no two of them overlap.
 *  - chunks: each at most once and in address order (the cursor is an
 *    address), so no two overlap (across nodes, one that does is dropped).
 *  - free ranges: each was free when its piece was copied. One that
 *    changed between pieces can come twice in two shapes, or not at all:
 *    the ranges are sorted and those that overlap or touch are joined
 *    (their union was free piecewise and overlaps no segment reported),
 *    and what lies outside the chunks copied is cut off.
 * So no byte is in two of them; where the arena changed during the copy,
 * some bytes may be in neither. A copy during which nothing changed is
 * the one-hold copy exactly: a quiescent pool's segments and free ranges
 * tile its chunks. The totals are sums of what was copied, so the
 * accounting identity holds in every snapshot. */

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

static void cursor_drop_locked(pinpool_t *pool, pp_snap_cursor_t *sc) {
  pp_snap_cursor_t **pp = &pool->snap_cursors;
  while (*pp != sc)
    pp = &(*pp)->link;
  *pp = sc->link;
}

/* One segment's fields, under seg_lock. */
static void copy_seg(pp_sseg_t *g, pp_segment_t *d) {
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

/* The pieces put together (see above), with no lock held: the chunks in
 * address order without overlaps; the free ranges sorted, joined where
 * they overlap or touch, cut to the chunks' spans (adjacent chunks
 * together, so that a range crossing chunks of a run stays one). Sets
 * s->chunks, s->free_ext and their counts; 0 or PINPOOL_ENOMEM. */
static int tidy_arena(pp_snap_t *s, pp_chunk_view_t *c, size_t nc,
                      pp_range_t *f, size_t nf) {
  qsort(c, nc, sizeof *c, chunk_cmp);
  size_t k = 0;
  for (size_t i = 0; i < nc; i++)
    if (k == 0 || c[i].base >= c[k - 1].base + c[k - 1].size)
      c[k++] = c[i];
  nc = k;
  qsort(f, nf, sizeof *f, range_cmp);
  size_t m = 0;
  for (size_t i = 0; i < nf; i++) {
    if (m > 0 && f[i].base <= f[m - 1].base + f[m - 1].size) {
      uintptr_t e = f[i].base + f[i].size;
      if (e > f[m - 1].base + f[m - 1].size)
        f[m - 1].size = e - f[m - 1].base;
    } else {
      f[m++] = f[i];
    }
  }
  /* The spans, then each range cut to them (a range splits only where a
   * chunk it crossed was not copied). */
  pp_range_t *span = malloc((nc + 1) * sizeof *span);
  pp_range_t *out = malloc((m + nc + 1) * sizeof *out);
  if (span == NULL || out == NULL) {
    free(span);
    free(out);
    free(c);
    free(f);
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for the arena");
  }
  size_t ns = 0;
  for (size_t i = 0; i < nc; i++) {
    if (ns > 0 && span[ns - 1].base + span[ns - 1].size == c[i].base)
      span[ns - 1].size += c[i].size;
    else
      span[ns++] = (pp_range_t){c[i].base, c[i].size};
  }
  size_t no = 0, j = 0;
  for (size_t i = 0; i < m; i++) {
    uintptr_t a = f[i].base, e = a + f[i].size;
    while (j < ns && span[j].base + span[j].size <= a)
      j++;
    for (size_t q = j; q < ns && span[q].base < e; q++) {
      uintptr_t lo = a > span[q].base ? a : span[q].base;
      uintptr_t hi = span[q].base + span[q].size;
      hi = e < hi ? e : hi;
      if (lo < hi)
        out[no++] = (pp_range_t){lo, hi - lo};
    }
  }
  free(span);
  free(f);
  s->chunks = c;
  s->nchunks = nc;
  s->free_ext = out;
  s->nfree = no;
  s->chunk_free = 0;
  for (size_t i = 0; i < no; i++)
    s->chunk_free += out[i].size;
  return 0;
}

/* The segments, and the arena's chunks and free extents, copied in pieces
 * of at most PP_SNAP_PIECE elements, each in a hold of seg_lock (the
 * arrays grown between them), then put together with no lock held. */
static int copy_segments(pp_snap_t *s) {
  pinpool_t *pool = s->pool;
  pp_sseg_t *segs = NULL;
  pp_chunk_view_t *chunks = NULL;
  pp_range_t *fr = NULL;
  size_t cap_s = 0, cap_c = 0, cap_f = 0, ns = 0, nc = 0, nf = 0;
  pp_ext_cursor_t *cur = calloc(pool->nnodes, sizeof *cur);
  if (cur == NULL)
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for segments");
  pp_snap_cursor_t sc = {NULL, NULL};
  bool one_hold = false;
#ifdef PINPOOL_MUTANT_SNAPSHOT_ONE_HOLD
  /* Mutant (docs/verification.md): the pieces in one hold while the
   * arrays have room, as the copy was (test_scale's snapshot_hold and
   * lock_hold must fail). */
  one_hold = true;
  size_t want_s = 0, want_c = 0, want_f = 0; /* room for all, as it had */
  pp_mutex_lock(&pool->seg_lock);
  for (pp_segment_t *d = pool->all; d != NULL; d = d->all_next)
    want_s++;
  for (unsigned n = 0; n < pool->nnodes; n++) {
    want_c += pool->arena.node[n].ext.nchunks;
    want_f += pool->arena.node[n].ext.nfree;
  }
  pp_mutex_unlock(&pool->seg_lock);
  if (!pp_snap_grow((void **)&segs, &cap_s, want_s + 2 * PP_SNAP_PIECE,
                    sizeof *segs) ||
      !pp_snap_grow((void **)&chunks, &cap_c, want_c + 2 * PP_SNAP_PIECE,
                    sizeof *chunks) ||
      !pp_snap_grow((void **)&fr, &cap_f, want_f + 2 * PP_SNAP_PIECE,
                    sizeof *fr))
    abort();
#endif
  bool registered = false, locked = false, segs_done = false, done = false;
  unsigned node = 0;
  uint64_t t0 = 0, work = 0;
  while (!done) {
    if (!locked) {
      /* Room for a piece in every array, made with no lock held. */
      if (!pp_snap_grow((void **)&segs, &cap_s, ns + PP_SNAP_PIECE,
                        sizeof *segs) ||
          !pp_snap_grow((void **)&chunks, &cap_c, nc + PP_SNAP_PIECE,
                        sizeof *chunks) ||
          !pp_snap_grow((void **)&fr, &cap_f, nf + PP_SNAP_PIECE, sizeof *fr))
        break;
      /* The piece's room touched here, not first in the hold: fresh
       * pages fault (W8's longest hold went from 15 to 27 us without). */
      memset(segs + ns, 0, PP_SNAP_PIECE * sizeof *segs);
      memset(chunks + nc, 0, PP_SNAP_PIECE * sizeof *chunks);
      memset(fr + nf, 0, PP_SNAP_PIECE * sizeof *fr);
      t0 = pp_now_ns();
      pp_mutex_lock(&pool->seg_lock);
      locked = true;
      work = 0;
      if (!registered) {
        sc.next = pool->all;
        sc.link = pool->snap_cursors;
        pool->snap_cursors = &sc;
        registered = true;
      }
    }
    /* A piece: at most PP_SNAP_PIECE elements (the tests count them),
     * and no more once PP_SNAP_PIECE_NS have passed, looked at every
     * PP_SNAP_STEP (what they cost when each is a cache miss: at 100,000
     * segments and extents about 0.7 us each, so 512 of them took 300-400
     * us). */
    size_t budget = PP_SNAP_PIECE;
    uint64_t t_end = pp_now_ns() + PP_SNAP_PIECE_NS;
    while (budget > 0 && !(segs_done && node == pool->nnodes)) {
      size_t step = budget < PP_SNAP_STEP ? budget : PP_SNAP_STEP, used = 0;
      for (; !segs_done && used < step; used++) {
        pp_segment_t *d = sc.next;
        if (d == NULL) {
          segs_done = true;
          break;
        }
        copy_seg(&segs[ns++], d);
        sc.next = d->all_next;
        work++;
      }
      if (segs_done && node < pool->nnodes && used < step) {
        size_t nc0 = nc, nf0 = nf;
        work += pp_ext_copy_some(&pool->arena.node[node].ext, &cur[node],
                                 step - used, chunks, &nc, fr, &nf);
        for (size_t i = nc0; i < nc; i++)
          chunks[i].node = node;
        used += (nc - nc0) + (nf - nf0);
        if (cur[node].done)
          node++;
      }
      budget -= used;
      if (pp_now_ns() >= t_end)
        break;
    }
    done = segs_done && node == pool->nnodes;
    if (done || !one_hold || cap_s - ns < PP_SNAP_PIECE ||
        cap_c - nc < PP_SNAP_PIECE || cap_f - nf < PP_SNAP_PIECE) {
      pp_extents_t *x0 = &pool->arena.node[0].ext; /* the meter (arena.h) */
      if (work > x0->copy_max)
        x0->copy_max = work;
      if (done) {
        cursor_drop_locked(pool, &sc);
        registered = false;
      }
      pp_mutex_unlock(&pool->seg_lock);
      locked = false;
      hold_done(s, t0);
      if (!done)
        pp_hook(PP_HOOK_SNAP_PIECE);
    }
  }
  free(cur);
  if (!done) { /* out of memory growing an array, no lock held */
    if (registered) {
      pp_mutex_lock(&pool->seg_lock);
      cursor_drop_locked(pool, &sc);
      pp_mutex_unlock(&pool->seg_lock);
    }
    free(segs);
    free(chunks);
    free(fr);
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for segments");
  }
  s->segs = segs;
  s->nsegs = ns;
  return tidy_arena(s, chunks, nc, fr, nf);
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
  rc = copy_segments(s); /* and the arena's chunks and free extents */
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
    rc = pp_share_lends_copy(pool->share, &s->lends, &s->nlends,
                             &s->max_hold_ns);
    if (rc != 0)
      return rc;
  }
  s->gather_ns = pp_now_ns() - s->t0_ns;
  return 0;
}
