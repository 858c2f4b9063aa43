/*
 * The memory layout of `pinpool snapshot torch` (snapshot_torch_layout.h):
 * which segments memory_viz gets, and the blocks that tile each one.
 *
 * PyTorch's device segments are what its allocator got from cudaMalloc,
 * with the blocks it split them into and the gaps between. pinpool's
 * counterpart is the arena's chunk (what the backend gave), with the
 * segments carved from it (slabs, and one per large block) and its free
 * ranges: so when the snapshot lists `chunks`, each chunk is a memory_viz
 * segment whose blocks are, in address order, the blocks of the segments
 * in it and the free space between them (docs/snapshot-format.md). Two
 * details:
 *  - A segment may cross from a chunk into the next one of its run
 *    (docs/allocation-policy.md, "Runs"); memory_viz needs a block inside
 *    one segment, so chunks that a segment crosses are shown as one.
 *  - The library copies the chunks, the segments and the free ranges in
 *    pieces that never list a byte twice, and every segment listed lies
 *    in chunks listed (src/snapshot.c; docs/snapshot-format.md, step 2),
 *    but snapshots written before 2026-12-03 copied the chunks and the
 *    segments in two holds: a segment created between them may lie in no
 *    chunk listed. It is shown on its own (as in older snapshots); one
 *    that lies partly in a chunk would overlap it, and then every segment
 *    is shown on its own. Either way a note says so. (A segment released
 *    while the library copied is left out of any snapshot: its space is
 *    drawn as free, as is space the pool changed during the copy.)
 * A snapshot without `chunks` (written before issue 21) shows each
 * pinpool segment as a memory_viz segment.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_torch_layout.h"

/* The viewer lays a segment's blocks end to end from its address, so the
 * segments must not overlap and each one's blocks must be in address order
 * inside it (the format says so; the loader checks only types). */
static int check_segments(const snap_t *s, const char *name, char *err,
                          size_t errlen) {
  uint64_t prev_end = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const json_t *seg = snap_segment(s, i);
    uint64_t addr = snap_u64(seg, "address"), size = snap_u64(seg, "size");
    uint64_t bsize = snap_u64(seg, "block_size"), cursor = addr;
    size_t nb = snap_segment_nblocks(s, i);
    if (addr + size < addr) {
      snprintf(err, errlen,
               "%s: segments[%zu].size: the segment ends beyond 2^64", name, i);
      return -1;
    }
    if (i > 0 && addr < prev_end) {
      snprintf(err, errlen,
               "%s: segments[%zu].address: overlaps segments[%zu] or is "
               "not in address order",
               name, i, i - 1);
      return -1;
    }
    prev_end = addr + size;
    for (size_t j = 0; j < nb; j++) {
      snap_block_t b;
      snap_block(s, i, j, &b);
      if (b.address < cursor || b.address - addr > size ||
          size - (b.address - addr) < bsize) {
        snprintf(err, errlen,
                 "%s: segments[%zu].blocks[%zu].address: 0x%" PRIx64 " is %s",
                 name, i, j, b.address,
                 b.address < cursor ? (j == 0 ? "below the segment"
                                              : "not after the previous block")
                                    : "not a whole block inside the segment");
        return -1;
      }
      cursor = b.address + bsize;
    }
  }
  return 0;
}

/* The chunks become segments too: the same rules. */
static int check_chunks(const snap_t *s, const char *name, char *err,
                        size_t errlen) {
  uint64_t prev_end = 0;
  for (size_t i = 0; i < s->nchunks; i++) {
    snap_chunk_t c;
    snap_chunk(s, i, &c);
    if (c.address + c.size < c.address) {
      snprintf(err, errlen, "%s: chunks[%zu].size: the chunk ends beyond 2^64",
               name, i);
      return -1;
    }
    if (i > 0 && c.address < prev_end) {
      snprintf(err, errlen,
               "%s: chunks[%zu].address: overlaps chunks[%zu] or is not in "
               "address order",
               name, i, i - 1);
      return -1;
    }
    prev_end = c.address + c.size;
  }
  return 0;
}

static int nomem(const char *name, char *err, size_t errlen) {
  snprintf(err, errlen, "%s: out of memory", name);
  return -1;
}

static tv_seg_t own_segment(const snap_t *s, size_t i) {
  const json_t *seg = snap_segment(s, i);
  return (tv_seg_t){
      snap_u64(seg, "address"),   snap_u64(seg, "size"), i, i + 1, 0, 0,
      snap_u64(seg, "block_size")};
}

static int by_segment(const snap_t *s, tv_layout_t *out) {
  out->v = malloc((s->nsegments + 1) * sizeof *out->v);
  if (out->v == NULL)
    return -1;
  for (size_t i = 0; i < s->nsegments; i++)
    out->v[i] = own_segment(s, i);
  out->n = s->nsegments;
  return 0;
}

/* Where each segment goes: 1 inside chunks (and the chunks it crosses
 * joined), 0 outside every chunk; -1 if one lies partly in a chunk. */
static int place_segments(const snap_t *s, const uint64_t *base,
                          const uint64_t *end, unsigned char *join,
                          unsigned char *inside, size_t *bad) {
  size_t nc = s->nchunks;
  for (size_t i = 0; i < s->nsegments; i++) {
    const json_t *seg = snap_segment(s, i);
    uint64_t a = snap_u64(seg, "address"), e = a + snap_u64(seg, "size");
    size_t lo = 0, hi = nc; /* the first chunk starting above a */
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (base[mid] <= a)
        lo = mid + 1;
      else
        hi = mid;
    }
    if (lo == 0 || a >= end[lo - 1]) { /* a is in no chunk */
      inside[i] = 0;
      if (lo < nc && base[lo] < e) {
        *bad = i;
        return -1;
      }
      continue;
    }
    size_t k = lo - 1, k2 = k;
    while (e > end[k2] && k2 + 1 < nc && base[k2 + 1] == end[k2])
      k2++;
    if (e > end[k2]) {
      *bad = i;
      return -1;
    }
    for (size_t j = k; j < k2; j++)
      join[j] = 1;
    inside[i] = 1;
  }
  return 0;
}

static int by_chunk(const snap_t *s, const char *name, tv_layout_t *out,
                    char *err, size_t errlen) {
  size_t nc = s->nchunks, ns = s->nsegments, bad = 0, n = 0, si = 0;
  uint64_t *base = malloc((nc + 1) * sizeof *base);
  uint64_t *end = malloc((nc + 1) * sizeof *end);
  unsigned char *join = calloc(nc + 1, 1), *inside = calloc(ns + 1, 1);
  int rc = -1;
  if (base == NULL || end == NULL || join == NULL || inside == NULL) {
    nomem(name, err, errlen);
    goto done;
  }
  for (size_t k = 0; k < nc; k++) {
    snap_chunk_t c;
    snap_chunk(s, k, &c);
    base[k] = c.address;
    end[k] = c.address + c.size;
  }
  if (place_segments(s, base, end, join, inside, &bad) != 0) {
    snprintf(out->note, sizeof out->note,
             "segments[%zu] lies partly outside the chunks listed (a "
             "snapshot taken while the pool was busy): every segment is "
             "shown on its own, as for a snapshot without chunks",
             bad);
    if (by_segment(s, out) != 0)
      nomem(name, err, errlen);
    else
      rc = 0;
    goto done;
  }
  for (size_t i = 0; i < ns; i++)
    out->outside += !inside[i];
  out->v = malloc((nc + out->outside + 1) * sizeof *out->v);
  if (out->v == NULL) {
    nomem(name, err, errlen);
    goto done;
  }
  /* Groups of joined chunks and the segments outside them, in address
   * order; the segments inside a group are the ones in its range. */
  for (size_t k = 0; k < nc || si < ns;) {
    if (si < ns && !inside[si] &&
        (k == nc || snap_u64(snap_segment(s, si), "address") < base[k])) {
      out->v[n++] = own_segment(s, si++);
      continue;
    }
    if (k == nc) { /* cannot happen: the segments left are inside chunks */
      si++;
      continue;
    }
    size_t k2 = k;
    while (join[k2])
      k2++;
    tv_seg_t g = {base[k], end[k2] - base[k], si, si, k, k2 + 1, 0};
    while (si < ns && snap_u64(snap_segment(s, si), "address") < end[k2]) {
      uint64_t bs = snap_u64(snap_segment(s, si), "block_size");
      g.max_block_size = bs > g.max_block_size ? bs : g.max_block_size;
      si++;
    }
    g.seg_end = si;
    out->v[n++] = g;
    k = k2 + 1;
  }
  out->n = n;
  out->by_chunk = 1;
  if (out->outside > 0)
    snprintf(out->note, sizeof out->note,
             "%zu segment%s in no chunk listed (a snapshot taken while "
             "the pool was busy): shown as segments of their own",
             out->outside, out->outside == 1 ? " lies" : "s lie");
  rc = 0;
done:
  free(base);
  free(end);
  free(join);
  free(inside);
  return rc;
}

int tv_layout(const snap_t *s, const char *name, tv_layout_t *out, char *err,
              size_t errlen) {
  memset(out, 0, sizeof *out);
  if (check_segments(s, name, err, errlen) != 0 ||
      check_chunks(s, name, err, errlen) != 0)
    return -1;
  if (s->chunks == NULL)
    return by_segment(s, out) == 0 ? 0 : nomem(name, err, errlen);
  if (by_chunk(s, name, out, err, errlen) != 0) {
    tv_layout_free(out);
    return -1;
  }
  return 0;
}

void tv_layout_free(tv_layout_t *l) {
  free(l->v);
  memset(l, 0, sizeof *l);
}

int tv_in_joined(const tv_layout_t *l, uint64_t address, uint64_t size) {
  uint64_t end = address + size < address ? UINT64_MAX : address + size;
  size_t lo = 0, hi = l->n; /* the first segment ending above address */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (l->v[mid].address + l->v[mid].size <= address)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (; lo < l->n && l->v[lo].address < end; lo++)
    if (l->v[lo].chunk_end - l->v[lo].chunk_first >= 2)
      return 1;
  return 0;
}

/* The blocks of pinpool segment i: every listed block, and inactive blocks
 * for what is not listed (a gap between listed blocks; after the last
 * one, the blocks never handed out and the tail). */
static void segment_blocks(const snap_t *s, size_t i,
                           void (*fn)(void *, const tv_block_t *), void *ctx) {
  const json_t *seg = snap_segment(s, i);
  uint64_t addr = snap_u64(seg, "address"), size = snap_u64(seg, "size");
  uint64_t bsize = snap_u64(seg, "block_size"), cursor = addr;
  size_t nb = snap_segment_nblocks(s, i);
  for (size_t j = 0; j < nb; j++) {
    snap_block_t b;
    snap_block(s, i, j, &b);
    if (b.address > cursor)
      fn(ctx, &(tv_block_t){cursor, b.address - cursor, 0, SNAP_CACHED, -1});
    int cached = b.state == SNAP_CACHED;
    fn(ctx, &(tv_block_t){b.address, bsize, cached ? 0 : b.requested, b.state,
                          cached ? -1 : b.stack});
    cursor = b.address + bsize;
  }
  if (cursor < addr + size)
    fn(ctx, &(tv_block_t){cursor, addr + size - cursor, 0, SNAP_CACHED, -1});
}

/* Free space of the chunks [from, to): one block per chunk it is in (the
 * writer cuts a free range at a chunk boundary too). */
static void chunk_gaps(const snap_t *s, size_t *k, size_t k_end, uint64_t from,
                       uint64_t to, void (*fn)(void *, const tv_block_t *),
                       void *ctx) {
  while (from < to) {
    snap_chunk_t c;
    snap_chunk(s, *k, &c);
    while (c.address + c.size <= from && *k + 1 < k_end)
      snap_chunk(s, ++*k, &c);
    uint64_t cut = c.address + c.size < to ? c.address + c.size : to;
    if (cut <= from) /* cannot happen: the group's chunks cover it */
      cut = to;
    fn(ctx, &(tv_block_t){from, cut - from, 0, SNAP_CACHED, -1});
    from = cut;
  }
}

void tv_blocks(const snap_t *s, const tv_seg_t *g,
               void (*fn)(void *ctx, const tv_block_t *b), void *ctx) {
  if (g->chunk_first == g->chunk_end) {
    for (size_t i = g->seg_first; i < g->seg_end; i++)
      segment_blocks(s, i, fn, ctx);
    return;
  }
  uint64_t cursor = g->address;
  size_t k = g->chunk_first;
  for (size_t i = g->seg_first; i < g->seg_end; i++) {
    const json_t *seg = snap_segment(s, i);
    uint64_t a = snap_u64(seg, "address");
    chunk_gaps(s, &k, g->chunk_end, cursor, a, fn, ctx);
    segment_blocks(s, i, fn, ctx);
    cursor = a + snap_u64(seg, "size");
  }
  chunk_gaps(s, &k, g->chunk_end, cursor, g->address + g->size, fn, ctx);
}
