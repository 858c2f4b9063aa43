/* Snapshot checks shared by the tests (snapcheck.h). */
#include "snapcheck.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *why, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, n, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t u(const json_t *o, const char *k) {
  return (uint64_t)json_integer_value(json_object_get(o, k));
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int is_u64(const json_t *v) {
  return json_is_integer(v) && json_integer_value(v) >= 0;
}

typedef unsigned long long ull;

/* chunks[] (optional: written since issue 21). What holds in every
 * snapshot, busy pool or not: the chunks and the free ranges are copied
 * together, in one hold of the segment lock. */
static int check_chunk_list(json_t *root, json_t *tot, snapcheck_t *out,
                            char *why, size_t n) {
  json_t *chunks = json_object_get(root, "chunks"), *c, *r;
  size_t i, j;
  uint64_t prev_end = 0;
  if (chunks == NULL)
    return 0;
  if (!json_is_array(chunks))
    return bad(why, n, "chunks is not an array");
  out->has_chunks = 1;
  json_array_foreach(chunks, i, c) {
    json_t *fr = json_object_get(c, "free");
    if (!is_u64(json_object_get(c, "address")) ||
        !is_u64(json_object_get(c, "size")) || !json_is_array(fr) ||
        !json_is_array(json_object_get(c, "flags")))
      return bad(why, n, "chunks[%zu]: address, size, flags or free missing",
                 i);
    uint64_t base = u(c, "address"), size = u(c, "size"), end = base + size;
    if (size == 0 || end < base)
      return bad(why, n, "chunks[%zu]: size %llu", i, (ull)size);
    if (i > 0 && base < prev_end)
      return bad(why, n,
                 "chunks[%zu] at %#llx overlaps chunks[%zu] or is not in "
                 "address order",
                 i, (ull)base, i - 1);
    uint64_t cur = base;
    json_array_foreach(fr, j, r) {
      json_t *a = json_array_get(r, 0), *s = json_array_get(r, 1);
      if (json_array_size(r) != 2 || !is_u64(a) || !is_u64(s))
        return bad(why, n, "chunks[%zu].free[%zu]: not [address, size]", i, j);
      uint64_t ra = (uint64_t)json_integer_value(a);
      uint64_t rs = (uint64_t)json_integer_value(s);
      if (rs == 0 || ra < cur || ra + rs > end || ra + rs < ra)
        return bad(why, n, "chunks[%zu].free[%zu] [%#llx, +%llu) is %s", i, j,
                   (ull)ra, (ull)rs,
                   rs == 0     ? "empty"
                   : ra >= cur ? "beyond the chunk's end"
                   : j > 0     ? "not after the range before it"
                               : "below the chunk");
      cur = ra + rs;
      out->chunk_free_bytes += rs;
      out->free_ranges++;
    }
    prev_end = end;
    out->chunks++;
    out->chunk_bytes += size;
  }
  if (out->chunk_free_bytes != u(tot, "chunk_free_bytes"))
    return bad(why, n,
               "chunks: the free ranges add up to %llu bytes, "
               "totals.chunk_free_bytes is %llu",
               (ull)out->chunk_free_bytes, (ull)u(tot, "chunk_free_bytes"));
  return 0;
}

int snapcheck(const char *text, size_t len, snapcheck_t *out, char *why,
              size_t whylen) {
  memset(out, 0, sizeof *out);
  json_error_t err;
  json_t *root = json_loadb(text, len, 0, &err);
  if (root == NULL)
    return bad(why, whylen, "not JSON: line %d column %d: %s", err.line,
               err.column, err.text);
  int rc = -1;
  uint64_t *addrs = NULL;
  const char *fmt = json_string_value(json_object_get(root, "format"));
  if (fmt == NULL || strcmp(fmt, "pinpool-snapshot") != 0 ||
      u(root, "version") != 1) {
    bad(why, whylen, "format/version");
    goto done;
  }
  json_t *segs = json_object_get(root, "segments");
  json_t *stacks = json_object_get(root, "stacks");
  json_t *frames = json_object_get(root, "frames");
  json_t *tot = json_object_get(root, "totals");
  json_t *hist = json_object_get(root, "history");
  if (!json_is_array(segs) || !json_is_array(stacks) ||
      !json_is_array(frames) || !json_is_object(tot) || !json_is_object(hist)) {
    bad(why, whylen, "missing top-level keys");
    goto done;
  }
  size_t nstacks = json_array_size(stacks), nframes = json_array_size(frames);
  size_t nblk = 0, cap = 0;
  uint64_t alloc_b = 0, pend_b = 0, cached_b = 0, seg_b = 0, req_b = 0;
  uint64_t extra = 0; /* uncarved + tails */
  size_t i, j;
  json_t *sg, *b;
  json_array_foreach(segs, i, sg) {
    uint64_t size = u(sg, "size"), bs = u(sg, "block_size");
    uint64_t base = u(sg, "address"), total = u(sg, "blocks_total");
    uint64_t unc = u(sg, "uncarved_blocks"), tail = u(sg, "tail_bytes");
    json_t *blocks = json_object_get(sg, "blocks");
    if (bs == 0 || total != size / bs || tail != size - total * bs ||
        json_array_size(blocks) + unc != total) {
      bad(why, whylen, "segments[%zu]: blocks do not fill it", i);
      goto done;
    }
    seg_b += size;
    extra += unc * bs + tail;
    json_array_foreach(blocks, j, b) {
      uint64_t a = u(b, "address");
      if (a < base || a >= base + total * bs || (a - base) % bs != 0) {
        bad(why, whylen, "segments[%zu].blocks[%zu]: address", i, j);
        goto done;
      }
      if (nblk == cap) {
        cap = cap ? 2 * cap : 1024;
        uint64_t *n = realloc(addrs, cap * sizeof *n);
        if (n == NULL) {
          bad(why, whylen, "out of memory");
          goto done;
        }
        addrs = n;
      }
      addrs[nblk++] = a;
      const char *st = json_string_value(json_object_get(b, "state"));
      uint64_t req = u(b, "requested_size");
      json_t *sk = json_object_get(b, "stack");
      if (json_is_integer(sk) && (uint64_t)json_integer_value(sk) >= nstacks) {
        bad(why, whylen, "segments[%zu].blocks[%zu]: stack index", i, j);
        goto done;
      }
      if (st != NULL && strcmp(st, "allocated") == 0) {
        out->allocated++;
        alloc_b += bs;
        req_b += req;
      } else if (st != NULL && strcmp(st, "pending_free") == 0) {
        out->pending++;
        pend_b += bs;
      } else if (st != NULL && strcmp(st, "cached") == 0) {
        out->cached++;
        cached_b += bs;
      } else {
        bad(why, whylen, "segments[%zu].blocks[%zu]: state", i, j);
        goto done;
      }
      if (req > bs) {
        bad(why, whylen, "segments[%zu].blocks[%zu]: requested > size", i, j);
        goto done;
      }
    }
  }
  if (nblk > 0)
    qsort(addrs, nblk, sizeof *addrs, cmp_u64);
  for (i = 1; i < nblk; i++)
    if (addrs[i] == addrs[i - 1]) {
      bad(why, whylen, "block %#llx listed twice",
          (unsigned long long)addrs[i]);
      goto done;
    }
  uint64_t rfree = u(tot, "chunk_free_bytes");
  if (u(tot, "allocated_bytes") != alloc_b ||
      u(tot, "pending_bytes") != pend_b ||
      u(tot, "cached_bytes") != cached_b + extra + rfree ||
      u(tot, "segment_bytes") != seg_b || u(tot, "requested_bytes") != req_b ||
      u(tot, "reserved_bytes") != seg_b + rfree) {
    bad(why, whylen, "totals do not match the blocks listed");
    goto done;
  }
  if (u(tot, "reserved_bytes") != u(tot, "allocated_bytes") +
                                      u(tot, "pending_bytes") +
                                      u(tot, "cached_bytes")) {
    bad(why, whylen, "accounting identity fails in the totals");
    goto done;
  }
  if (check_chunk_list(root, tot, out, why, whylen) != 0)
    goto done;
  json_t *st;
  json_array_foreach(stacks, i, st) {
    json_t *f;
    json_array_foreach(st, j, f) {
      if (!json_is_integer(f) || (uint64_t)json_integer_value(f) >= nframes) {
        bad(why, whylen, "stacks[%zu][%zu]: frame index", i, j);
        goto done;
      }
    }
  }
  json_t *entries = json_object_get(hist, "entries"), *e;
  uint64_t prev = 0;
  json_array_foreach(entries, i, e) {
    uint64_t seq = (uint64_t)json_integer_value(json_array_get(e, 0));
    json_t *sk = json_array_get(e, 8);
    if (json_array_size(e) != 9 || (i > 0 && seq <= prev) ||
        (json_is_integer(sk) && (uint64_t)json_integer_value(sk) >= nstacks)) {
      bad(why, whylen, "history.entries[%zu]", i);
      goto done;
    }
    prev = seq;
  }
  out->segments = json_array_size(segs);
  out->blocks = nblk;
  out->allocated_bytes = alloc_b;
  out->pending_bytes = pend_b;
  out->cached_bytes = u(tot, "cached_bytes");
  out->reserved_bytes = u(tot, "reserved_bytes");
  out->requested_bytes = req_b;
  out->entries = json_array_size(entries);
  out->stacks = nstacks;
  out->frames = nframes;
  out->dropped = u(hist, "dropped");
  out->max_hold_ns = u(root, "max_hold_ns");
  out->gather_ns = u(root, "gather_ns");
  const char *rec = json_string_value(json_object_get(hist, "record"));
  snprintf(out->record, sizeof out->record, "%s", rec ? rec : "?");
  rc = 0;
done:
  free(addrs);
  json_decref(root);
  return rc;
}

/* ---- The arena of a quiescent pool (snapcheck_chunks) -------------------
 */

/* A piece of a chunk: a segment (segments[i]) or a free range
 * (chunks[i].free[j]), [a, e). */
typedef struct piece {
  uint64_t a, e;
  size_t i, j;
  int seg;
} piece_t;

typedef struct chunk_info {
  uint64_t base, end, node;
  json_t *flags;
} chunk_info_t;

static int cmp_piece(const void *x, const void *y) {
  const piece_t *p = x, *q = y;
  return p->a < q->a ? -1 : p->a > q->a;
}

static const char *piece_name(const piece_t *p, char *buf, size_t n) {
  if (p->seg)
    snprintf(buf, n, "segments[%zu] [%#llx, %#llx)", p->i, (ull)p->a,
             (ull)p->e);
  else
    snprintf(buf, n, "chunks[%zu].free[%zu] [%#llx, %#llx)", p->i, p->j,
             (ull)p->a, (ull)p->e);
  return buf;
}

/* Chunks k and k + 1 are one run: adjacent, same flags, same node. */
static int joined(const chunk_info_t *c, size_t nc, size_t k) {
  return k + 1 < nc && c[k].end == c[k + 1].base &&
         c[k].node == c[k + 1].node && json_equal(c[k].flags, c[k + 1].flags);
}

/* The pieces tile the chunks (see snapcheck.h). */
static int check_tiling(const chunk_info_t *ch, size_t nc, const piece_t *pc,
                        size_t np, snapcheck_t *out, char *why, size_t n) {
  char b1[96], b2[96];
  size_t p = 0, last = SIZE_MAX; /* last: the piece consumed last */
  int carry = 0; /* pc[p] began in the chunk before and goes on here */
  for (size_t i = 0; i < nc; i++) {
    uint64_t cur = ch[i].base, end = ch[i].end;
    if (!carry && p < np && pc[p].a < cur) {
      if (last != SIZE_MAX && pc[p].a < pc[last].e)
        return bad(why, n, "%s overlaps %s", piece_name(&pc[p], b1, sizeof b1),
                   piece_name(&pc[last], b2, sizeof b2));
      return bad(why, n, "%s lies outside every chunk (below chunks[%zu])",
                 piece_name(&pc[p], b1, sizeof b1), i);
    }
    while (cur < end) {
      if (carry) {
        carry = 0;
      } else if (p == np || pc[p].a > cur) {
        uint64_t to = p < np && pc[p].a < end ? pc[p].a : end;
        return bad(why, n,
                   "chunks[%zu]: [%#llx, %#llx) is in no segment and no "
                   "free range",
                   i, (ull)cur, (ull)to);
      } else if (pc[p].a < cur) {
        return bad(why, n, "%s overlaps %s", piece_name(&pc[p], b1, sizeof b1),
                   piece_name(&pc[last], b2, sizeof b2));
      } else if (!pc[p].seg && last != SIZE_MAX && !pc[last].seg &&
                 pc[last].i == pc[p].i && pc[last].e == pc[p].a) {
        return bad(why, n, "%s touches %s: the arena coalesces free ranges",
                   piece_name(&pc[p], b1, sizeof b1),
                   piece_name(&pc[last], b2, sizeof b2));
      }
      if (pc[p].e <= end) {
        cur = pc[p].e;
        last = p++;
        continue;
      }
      if (!pc[p].seg)
        return bad(why, n, "%s crosses the end of chunks[%zu]",
                   piece_name(&pc[p], b1, sizeof b1), i);
      if (!joined(ch, nc, i))
        return bad(why, n,
                   "%s crosses the end of chunks[%zu], and no chunk of its "
                   "run follows (adjacent, same flags and node)",
                   piece_name(&pc[p], b1, sizeof b1), i);
      out->crossing_segments++;
      carry = 1;
      cur = end;
    }
  }
  if (p < np) {
    if (last != SIZE_MAX && pc[p].a < pc[last].e)
      return bad(why, n, "%s overlaps %s", piece_name(&pc[p], b1, sizeof b1),
                 piece_name(&pc[last], b2, sizeof b2));
    return bad(why, n, "%s lies outside every chunk",
               piece_name(&pc[p], b1, sizeof b1));
  }
  return 0;
}

/* The stats' arena fields against the chunks (see snapcheck.h). */
static int check_arena_stats(json_t *root, const chunk_info_t *ch, size_t nc,
                             const piece_t *pc, size_t np, size_t nsegs,
                             snapcheck_t *out, char *why, size_t n) {
  json_t *st = json_object_get(root, "stats");
  static const char *const need[] = {"arena_chunks", "chunk_free_bytes",
                                     "free_extents", "largest_free_extent"};
  for (size_t k = 0; k < sizeof need / sizeof need[0]; k++)
    if (!is_u64(json_object_get(st, need[k])))
      return bad(why, n, "stats.%s missing", need[k]);
  uint64_t raw = 0, raw_max = 0, merged = 0, merged_max = 0, run = 0;
  const piece_t *prev = NULL;
  for (size_t k = 0; k < np; k++) {
    const piece_t *f = &pc[k];
    if (f->seg)
      continue;
    raw++;
    raw_max = f->e - f->a > raw_max ? f->e - f->a : raw_max;
    /* Cut by the writer at a chunk boundary of a run: one extent. */
    if (prev != NULL && prev->e == f->a && prev->i + 1 == f->i &&
        joined(ch, nc, prev->i)) {
      run += f->e - f->a;
      out->joined_ranges++;
    } else {
      merged++;
      run = f->e - f->a;
    }
    merged_max = run > merged_max ? run : merged_max;
    prev = f;
  }
  uint64_t sc = u(st, "arena_chunks"), sf = u(st, "chunk_free_bytes");
  uint64_t se = u(st, "free_extents"), sl = u(st, "largest_free_extent");
  uint64_t sr = u(json_object_get(st, "reserved_bytes"), "current");
  uint64_t ss = u(json_object_get(st, "segments"), "current");
  uint64_t tr = u(json_object_get(root, "totals"), "reserved_bytes");
  if (sc != nc)
    return bad(why, n, "stats.arena_chunks %llu, %zu chunks listed", (ull)sc,
               nc);
  if (sr != out->chunk_bytes || tr != out->chunk_bytes)
    return bad(why, n,
               "the chunks hold %llu bytes: stats.reserved_bytes.current "
               "%llu, totals.reserved_bytes %llu",
               (ull)out->chunk_bytes, (ull)sr, (ull)tr);
  if (ss != nsegs)
    return bad(why, n, "stats.segments.current %llu, %zu segments listed",
               (ull)ss, nsegs);
  if (sf != out->chunk_free_bytes)
    return bad(why, n,
               "stats.chunk_free_bytes %llu, the free ranges add up to %llu",
               (ull)sf, (ull)out->chunk_free_bytes);
  if (!((se == raw && sl == raw_max) || (se == merged && sl == merged_max)))
    return bad(why, n,
               "stats.free_extents %llu and largest_free_extent %llu: the "
               "free ranges are %llu (largest %llu), %llu (largest %llu) with "
               "the pieces of a run joined",
               (ull)se, (ull)sl, (ull)raw, (ull)raw_max, (ull)merged,
               (ull)merged_max);
  return 0;
}

/* The snapshot's pieces (every chunk's free ranges, then every segment)
 * into pc, sorted by address; with ch, each chunk's bounds too. pc holds
 * the free ranges and segments snapcheck counted. */
static void gather_pieces(json_t *root, chunk_info_t *ch, piece_t *pc,
                          size_t np) {
  json_t *c, *r, *sg;
  size_t i, j, k = 0;
  json_array_foreach(json_object_get(root, "chunks"), i, c) {
    if (ch != NULL)
      ch[i] = (chunk_info_t){u(c, "address"), u(c, "address") + u(c, "size"),
                             u(c, "node"), json_object_get(c, "flags")};
    json_array_foreach(json_object_get(c, "free"), j, r) {
      uint64_t a = (uint64_t)json_integer_value(json_array_get(r, 0));
      pc[k++] = (piece_t){
          a, a + (uint64_t)json_integer_value(json_array_get(r, 1)), i, j, 0};
    }
  }
  json_array_foreach(json_object_get(root, "segments"), i, sg) {
    uint64_t a = u(sg, "address");
    pc[k++] = (piece_t){a, a + u(sg, "size"), i, 0, 1};
  }
  qsort(pc, np, sizeof *pc, cmp_piece);
}

int snapcheck_chunks(const char *text, size_t len, snapcheck_t *out, char *why,
                     size_t whylen) {
  if (snapcheck(text, len, out, why, whylen) != 0)
    return -1;
  if (!out->has_chunks)
    return bad(why, whylen, "no chunks (a snapshot written before issue 21)");
  json_t *root = json_loadb(text, len, 0, NULL);
  size_t nc = json_array_size(json_object_get(root, "chunks"));
  size_t nsegs = json_array_size(json_object_get(root, "segments"));
  size_t np = nsegs + (size_t)out->free_ranges;
  chunk_info_t *ch = calloc(nc + 1, sizeof *ch);
  piece_t *pc = calloc(np + 1, sizeof *pc);
  int rc = -1;
  if (root == NULL || ch == NULL || pc == NULL) {
    bad(why, whylen, "out of memory");
    goto done;
  }
  gather_pieces(root, ch, pc, np);
  if (check_tiling(ch, nc, pc, np, out, why, whylen) == 0 &&
      check_arena_stats(root, ch, nc, pc, np, nsegs, out, why, whylen) == 0)
    rc = 0;
done:
  free(ch);
  free(pc);
  json_decref(root);
  return rc;
}

int snapcheck_disjoint(const char *text, size_t len, snapcheck_t *out,
                       char *why, size_t whylen) {
  if (snapcheck(text, len, out, why, whylen) != 0)
    return -1;
  if (!out->has_chunks)
    return bad(why, whylen, "no chunks (a snapshot written before issue 21)");
  json_t *root = json_loadb(text, len, 0, NULL);
  size_t nsegs = json_array_size(json_object_get(root, "segments"));
  size_t np = nsegs + (size_t)out->free_ranges;
  piece_t *pc = calloc(np + 1, sizeof *pc);
  int rc = -1;
  char b1[96], b2[96];
  if (root == NULL || pc == NULL) {
    bad(why, whylen, "out of memory");
    goto done;
  }
  gather_pieces(root, NULL, pc, np);
  size_t far = SIZE_MAX; /* the piece reaching furthest so far */
  for (size_t p = 0; p < np; p++) {
    if (far != SIZE_MAX && pc[p].a < pc[far].e) {
      bad(why, whylen, "%s overlaps %s", piece_name(&pc[p], b1, sizeof b1),
          piece_name(&pc[far], b2, sizeof b2));
      goto done;
    }
    if (far == SIZE_MAX || pc[p].e > pc[far].e)
      far = p;
  }
  rc = 0;
done:
  free(pc);
  json_decref(root);
  return rc;
}

int snapcheck_has_function(const char *text, size_t len, const char *function) {
  json_t *root = json_loadb(text, len, 0, NULL);
  int found = 0;
  size_t i;
  json_t *f;
  json_array_foreach(json_object_get(root, "frames"), i, f) {
    const char *fn = json_string_value(json_object_get(f, "function"));
    if (fn != NULL && strcmp(fn, function) == 0)
      found = 1;
  }
  json_decref(root);
  return found;
}

const char *snapcheck_block_state(const char *text, size_t len, uint64_t a) {
  static char state[32];
  const char *res = NULL;
  json_t *root = json_loadb(text, len, 0, NULL);
  size_t i, j;
  json_t *sg, *b;
  json_array_foreach(json_object_get(root, "segments"), i, sg) {
    json_array_foreach(json_object_get(sg, "blocks"), j, b) {
      if (u(b, "address") == a) {
        snprintf(state, sizeof state, "%s",
                 json_string_value(json_object_get(b, "state")));
        res = state;
      }
    }
  }
  json_decref(root);
  return res;
}
