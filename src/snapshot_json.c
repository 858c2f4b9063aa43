/*
 * Snapshots (docs/snapshot-format.md), part two: formatting, with no pool
 * lock held (snapshot.c gathers), and the public entry points: symbolizing
 * the stacks (symbolize.c) and writing JSON through a buffer of our own (a
 * snapshot of 100,000 blocks and 1,000,000 entries is about 100 MB of
 * text; stdio's formatted output would dominate the time).
 */
#include "snapshot.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- Output buffer --------------------------------------------------------
 * Text accumulates in `p`; with a FILE it is written out in 1 MiB pieces,
 * without one it grows into the pinpool_snapshot_write_mem result. */
typedef struct wbuf {
  char *p;
  size_t len, cap;
  FILE *f;
  int err; /* 0, or a PINPOOL_E* code already reported with pp_fail */
} wbuf_t;

#define WB_FLUSH_AT ((size_t)1 << 20)

static void wb_flush(wbuf_t *w) {
  if (w->err != 0 || w->f == NULL || w->len == 0)
    return;
  if (fwrite(w->p, 1, w->len, w->f) != w->len)
    w->err = pp_fail(PINPOOL_EBACKEND, "snapshot: write failed: %s",
                     strerror(errno));
  w->len = 0;
}

static void wb_reserve(wbuf_t *w, size_t more) {
  if (w->err != 0 || w->len + more + 1 <= w->cap)
    return;
  wb_flush(w);
  if (w->err != 0 || w->len + more + 1 <= w->cap)
    return;
  size_t cap = w->cap ? w->cap : 2 * WB_FLUSH_AT;
  while (cap < w->len + more + 1)
    cap *= 2;
  char *p = realloc(w->p, cap);
  if (p == NULL) {
    w->err = pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for text");
    return;
  }
  w->p = p;
  w->cap = cap;
}

static void wb_raw(wbuf_t *w, const char *s, size_t n) {
  wb_reserve(w, n);
  if (w->err != 0)
    return;
  memcpy(w->p + w->len, s, n);
  w->len += n;
  if (w->f != NULL && w->len >= WB_FLUSH_AT)
    wb_flush(w);
}

static void wb_lit(wbuf_t *w, const char *s) { wb_raw(w, s, strlen(s)); }

/* The hot loops (blocks, entries) format straight into the buffer: room
 * for one record is reserved first, then written through a pointer. */
#define WB_RECORD 1024 /* a block: 16 streams and 16 captures */
static char *wb_begin(wbuf_t *w) {
  wb_reserve(w, WB_RECORD);
  return w->err != 0 ? NULL : w->p + w->len;
}
static void wb_end(wbuf_t *w, char *p) {
  w->len = (size_t)(p - w->p);
  if (w->f != NULL && w->len >= WB_FLUSH_AT)
    wb_flush(w);
}
static inline char *put_u64(char *p, uint64_t v) {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  while (n > 0)
    *p++ = tmp[--n];
  return p;
}
/* Stream handles are opaque (a cudaStream_t, an id): written as strings
 * "0x..." so that any 64-bit value survives every JSON reader (integers
 * above 2^63 break some, above 2^53 lose precision in JavaScript). */
static inline char *put_handle(char *p, uint64_t v) {
  static const char hex[] = "0123456789abcdef";
  char tmp[16];
  int n = 0;
  do {
    tmp[n++] = hex[v & 15];
    v >>= 4;
  } while (v != 0);
  *p++ = '"';
  *p++ = '0';
  *p++ = 'x';
  while (n > 0)
    *p++ = tmp[--n];
  *p++ = '"';
  return p;
}
static inline char *put_mem(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}
#define PUT(p, lit) put_mem((p), (lit), sizeof(lit) - 1)

static void wb_u64(wbuf_t *w, uint64_t v) {
  char tmp[24];
  char *e = tmp + sizeof tmp, *q = e;
  do {
    *--q = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  wb_raw(w, q, (size_t)(e - q));
}

static void wb_printf(wbuf_t *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void wb_printf(wbuf_t *w, const char *fmt, ...) {
  char tmp[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n > 0)
    wb_raw(w, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string (or null). Bytes >= 0x80 are copied: names from symbol
 * tables and file systems are UTF-8 in practice; control characters and
 * invalid bytes below 0x20 are escaped. */
static void wb_str(wbuf_t *w, const char *s) {
  if (s == NULL) {
    wb_lit(w, "null");
    return;
  }
  wb_raw(w, "\"", 1);
  const char *run = s;
  for (; *s != '\0'; s++) {
    unsigned char c = (unsigned char)*s;
    if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80)
      continue;
    if (c >= 0x80)
      continue;
    wb_raw(w, run, (size_t)(s - run));
    char esc[8];
    if (c == '"' || c == '\\') {
      esc[0] = '\\';
      esc[1] = (char)c;
      wb_raw(w, esc, 2);
    } else {
      (void)snprintf(esc, sizeof esc, "\\u%04x", c);
      wb_raw(w, esc, 6);
    }
    run = s + 1;
  }
  wb_raw(w, run, (size_t)(s - run));
  wb_raw(w, "\"", 1);
}

static void wb_key(wbuf_t *w, const char *k) {
  wb_raw(w, "\"", 1);
  wb_lit(w, k);
  wb_raw(w, "\":", 2);
}

static void wb_kv(wbuf_t *w, const char *k, uint64_t v, bool comma) {
  wb_key(w, k);
  wb_u64(w, v);
  if (comma)
    wb_raw(w, ",", 1);
}

/* ---- Stacks and frames ----------------------------------------------------
 * Only stacks referenced by a block or an entry are written, renumbered
 * densely; their addresses are symbolized once each. */

typedef struct frame_out {
  uintptr_t addr;
  pp_symbol_t sym;
} frame_out_t;

typedef struct stack_out {
  int64_t *remap; /* stack id (1-based) -> output index, -1 unused */
  size_t nused;
  uint32_t *order; /* output index -> stack id */
  uint32_t *first; /* output index -> first frame kept (after trimming) */
  uint32_t *len;   /* output index -> frames kept */
  frame_out_t *frames;
  size_t nframes, cap_frames;
  uint32_t *fidx; /* per frame of stacks.frames[]: output frame index */
  uint64_t *amap; /* open addressing over addresses: frame index + 1 */
  size_t namap;
  pp_symbolizer_t *sym;
} stack_out_t;

static void stack_out_free(stack_out_t *o) {
  free(o->remap);
  free(o->order);
  free(o->first);
  free(o->len);
  free(o->frames);
  free(o->fidx);
  free(o->amap);
  pp_symbolizer_close(o->sym);
}

static void mark(stack_out_t *o, const pp_stacks_copy_t *c, uint64_t id) {
  if (id == 0 || id > c->n || o->remap[id - 1] >= 0)
    return;
  o->remap[id - 1] = (int64_t)o->nused;
  o->order[o->nused++] = (uint32_t)id;
}

static int64_t frame_index(stack_out_t *o, uintptr_t addr, bool symbols) {
  size_t mask = o->namap - 1;
  size_t j = (size_t)((addr * 0x9e3779b97f4a7c15u) >> 20) & mask;
  for (; o->amap[j] != 0; j = (j + 1) & mask)
    if (o->frames[o->amap[j] - 1].addr == addr)
      return (int64_t)(o->amap[j] - 1);
  if (!pp_snap_grow((void **)&o->frames, &o->cap_frames, o->nframes + 1,
                    sizeof *o->frames))
    return -1;
  frame_out_t *f = &o->frames[o->nframes];
  f->addr = addr;
  f->sym = (pp_symbol_t){NULL, NULL, NULL, 0, -1};
  if (symbols && o->sym != NULL)
    pp_symbolize(o->sym, addr, &f->sym);
  o->amap[j] = ++o->nframes;
  return (int64_t)(o->nframes - 1);
}

/* A frame of the allocator itself: an exported or internal name, or,
 * with debug information, a source file in this directory. */
static bool is_ours(const pp_symbol_t *sym) {
  const char *fn = sym->function;
  if (fn != NULL &&
      (strncmp(fn, "pinpool_", 8) == 0 || strncmp(fn, "pp_", 3) == 0))
    return true;
  if (sym->file == NULL)
    return false;
  const char *me = __FILE__, *slash = strrchr(me, '/');
  return slash != NULL && me[0] == '/' &&
         strncmp(sym->file, me, (size_t)(slash + 1 - me)) == 0;
}

static int build_stacks(pp_snap_t *s, stack_out_t *o) {
  const pp_stacks_copy_t *c = &s->stacks;
  memset(o, 0, sizeof *o);
  if (c->n == 0)
    return 0;
  o->remap = malloc(c->n * sizeof *o->remap);
  o->order = malloc(c->n * sizeof *o->order);
  o->first = malloc(c->n * sizeof *o->first);
  o->len = malloc(c->n * sizeof *o->len);
  o->fidx = malloc((c->off[c->n] + 1) * sizeof *o->fidx);
  if (!o->remap || !o->order || !o->first || !o->len || !o->fidx)
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for stacks");
  for (size_t i = 0; i < c->n; i++)
    o->remap[i] = -1;
  for (size_t i = 0; i < s->nblk; i++)
    mark(o, c, s->blk[i].info >> 32);
  for (size_t i = 0; i < s->nent; i++)
    mark(o, c, s->ent[i].stack);
  size_t nf = 0;
  for (size_t k = 0; k < o->nused; k++) {
    uint32_t id = o->order[k];
    nf += (size_t)(c->off[id] - c->off[id - 1]);
  }
  o->namap = 64;
  while (o->namap < 2 * nf + 2)
    o->namap *= 2;
  o->amap = calloc(o->namap, sizeof *o->amap);
  if (o->amap == NULL)
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for frames");
  bool symbols = !(s->flags & PINPOOL_SNAPSHOT_NO_SYMBOLS);
  if (symbols)
    o->sym = pp_symbolizer_open();
  unsigned depth = s->depth;
  for (size_t k = 0; k < o->nused; k++) {
    uint32_t id = o->order[k];
    size_t a = (size_t)c->off[id - 1], n = (size_t)(c->off[id] - a);
    for (size_t j = 0; j < n; j++) {
      int64_t fi = frame_index(o, c->frames[a + j], symbols);
      if (fi < 0)
        return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for frames");
      o->fidx[a + j] = (uint32_t)fi;
    }
    /* Cut the allocator's own frames (those above the entry point when
     * the capture could not cut them: slow-path events). */
    size_t first = 0;
    if (symbols)
      for (size_t j = 0; j < n && j < 12; j++)
        if (is_ours(&o->frames[o->fidx[a + j]].sym))
          first = j + 1;
    size_t len = n - first;
    if (depth > 0 && len > depth)
      len = depth;
    o->first[k] = (uint32_t)first;
    o->len[k] = (uint32_t)len;
  }
  return 0;
}

/* ---- Writing --------------------------------------------------------------
 */

static void write_stat(wbuf_t *w, const char *k, pinpool_stat_t v, bool comma) {
  wb_key(w, k);
  wb_raw(w, "{", 1);
  wb_kv(w, "current", v.current, true);
  wb_kv(w, "peak", v.peak, true);
  wb_kv(w, "allocated", v.allocated, true);
  wb_kv(w, "freed", v.freed, false);
  wb_raw(w, comma ? "}," : "}", comma ? 2 : 1);
}

static void write_dur(wbuf_t *w, const char *k, pinpool_duration_t v,
                      bool comma) {
  wb_key(w, k);
  wb_raw(w, "{", 1);
  wb_kv(w, "count", v.count, true);
  wb_kv(w, "total_ns", v.total_ns, true);
  wb_kv(w, "max_ns", v.max_ns, false);
  wb_raw(w, comma ? "}," : "}", comma ? 2 : 1);
}

static void write_stats(wbuf_t *w, const pinpool_stats_t *t) {
  wb_lit(w, "\"stats\":{");
  write_stat(w, "requests", t->requests, true);
  write_stat(w, "requested_bytes", t->requested_bytes, true);
  write_stat(w, "blocks", t->blocks, true);
  write_stat(w, "block_bytes", t->block_bytes, true);
  write_stat(w, "reserved_bytes", t->reserved_bytes, true);
  write_stat(w, "cached_bytes", t->cached_bytes, true);
  write_stat(w, "segments", t->segments, true);
  wb_kv(w, "pending_bytes", t->pending_bytes, true);
  wb_kv(w, "pending_blocks", t->pending_blocks, true);
  wb_kv(w, "events_recorded", t->events_recorded, true);
  wb_kv(w, "events_completed", t->events_completed, true);
  wb_kv(w, "event_errors", t->event_errors, true);
  write_dur(w, "reclaim", t->reclaim, true);
  wb_kv(w, "cache_hits", t->cache_hits, true);
  wb_kv(w, "cache_misses", t->cache_misses, true);
  wb_kv(w, "tcache_hits", t->tcache_hits, true);
  wb_kv(w, "oom_count", t->oom_count, true);
  wb_kv(w, "retries", t->retries, true);
  wb_kv(w, "trimmed_segments", t->trimmed_segments, true);
  wb_kv(w, "arena_chunks", t->arena_chunks, true);
  wb_kv(w, "chunk_free_bytes", t->chunk_free_bytes, true);
  wb_kv(w, "free_extents", t->free_extents, true);
  wb_kv(w, "largest_free_extent", t->largest_free_extent, true);
  wb_kv(w, "mlock_failures", t->mlock_failures, true);
  wb_kv(w, "locked_bytes", t->locked_bytes, true);
  wb_kv(w, "fallback_bytes", t->fallback_bytes, true);
  wb_kv(w, "fallback_blocks", t->fallback_blocks, true);
  wb_kv(w, "numa_spill_blocks", t->numa_spill_blocks, true);
  wb_kv(w, "numa_spill_bytes", t->numa_spill_bytes, true);
  write_dur(w, "backend_alloc", t->backend_alloc, true);
  write_dur(w, "backend_free", t->backend_free, true);
  wb_kv(w, "peak_slack_bytes", t->peak_slack_bytes, true);
  wb_kv(w, "reserve_bytes", t->reserve_bytes, true);
  wb_kv(w, "max_cached", t->max_cached, true);
  wb_kv(w, "max_reserved", t->max_reserved, true);
  wb_kv(w, "history_lost_writes", t->history_lost_writes, true);
  wb_kv(w, "graph_held_blocks", t->graph_held_blocks, true);
  wb_kv(w, "graph_held_bytes", t->graph_held_bytes, true);
  wb_kv(w, "lent_blocks", t->lent_blocks, true);
  wb_kv(w, "lent_bytes", t->lent_bytes, true);
  wb_kv(w, "backend_auto", t->backend_auto, true);
  wb_kv(w, "pin_warnings", t->pin_warnings, true);
  wb_kv(w, "lend_refusals", t->lend_refusals, true);
  wb_kv(w, "grow_ahead_chunks", t->grow_ahead_chunks, true);
  wb_kv(w, "grow_ahead_bytes", t->grow_ahead_bytes, true);
  wb_kv(w, "grow_ahead_hits", t->grow_ahead_hits, true);
  wb_kv(w, "grow_ahead_waits_avoided", t->grow_ahead_waits_avoided, true);
  wb_kv(w, "page_moves", t->page_moves, true);
  wb_kv(w, "bytes_moved", t->bytes_moved, true);
  wb_kv(w, "move_fallbacks", t->move_fallbacks, false);
  wb_lit(w, "},\n");
}

static void write_totals(wbuf_t *w, const pp_snap_t *s) {
  uint64_t seg_bytes = 0, alloc_b = 0, alloc_n = 0, req = 0, pend_b = 0,
           pend_n = 0, cached_b = 0, cached_n = 0, uncarved = 0, tail = 0;
  for (size_t i = 0; i < s->nsegs; i++) {
    const pp_sseg_t *g = &s->segs[i];
    seg_bytes += g->size;
    uncarved += (uint64_t)g->uncarved * g->bs;
    tail += g->size - (uint64_t)g->nblocks * g->bs;
    for (size_t j = g->first; j < g->first + g->nblk; j++) {
      uint64_t wd = s->blk[j].word;
      switch (PP_WORD_STATE(wd)) {
      case PP_ALLOCATED:
        alloc_b += g->bs;
        alloc_n++;
        req += PP_WORD_PAYLOAD(wd);
        break;
      case PP_PENDING:
        pend_b += g->bs;
        pend_n++;
        break;
      default:
        cached_b += g->bs;
        cached_n++;
      }
    }
  }
  wb_lit(w, "\"totals\":{");
  wb_kv(w, "segments", s->nsegs, true);
  wb_kv(w, "segment_bytes", seg_bytes, true);
  wb_kv(w, "chunk_free_bytes", s->chunk_free, true);
  wb_kv(w, "reserved_bytes", seg_bytes + s->chunk_free, true);
  wb_kv(w, "allocated_bytes", alloc_b, true);
  wb_kv(w, "allocated_blocks", alloc_n, true);
  wb_kv(w, "requested_bytes", req, true);
  wb_kv(w, "pending_bytes", pend_b, true);
  wb_kv(w, "pending_blocks", pend_n, true);
  wb_kv(w, "cached_bytes", cached_b + uncarved + tail + s->chunk_free, true);
  wb_kv(w, "cached_blocks", cached_n, true);
  wb_kv(w, "uncarved_bytes", uncarved, true);
  wb_kv(w, "tail_bytes", tail, false);
  wb_lit(w, "},\n");
}

/* Output index of stack `id` (1-based), -1 for none. */
static int64_t stack_index(const stack_out_t *o, uint64_t id) {
  if (id == 0 || o->remap == NULL)
    return -1;
  return o->remap[id - 1];
}

static const struct {
  unsigned bit;
  const char *name;
} seg_flags[] = {{PP_SEG_LOCKED, "page_locked"},
                 {PP_SEG_LOCK_FAILED, "mlock_failed"},
                 {PP_SEG_HUGE, "huge_advised"},
                 {PP_SEG_FROM_RESERVE, "reserve"},
                 {PP_SEG_FALLBACK, "pin_fallback"}};

static void write_flags(wbuf_t *w, unsigned flags) {
  wb_lit(w, "\"flags\":[");
  const char *sep = "";
  for (size_t f = 0; f < sizeof seg_flags / sizeof seg_flags[0]; f++)
    if (flags & seg_flags[f].bit) {
      wb_lit(w, sep);
      wb_str(w, seg_flags[f].name);
      sep = ",";
    }
  wb_lit(w, "]");
}

/* The arena's chunks (memory_viz's device segments: the segments above are
 * the blocks and slabs carved from them), each with its free ranges; a
 * free extent that crosses chunks of a run is cut at their boundaries. */
static void write_chunks(wbuf_t *w, const pp_snap_t *s) {
  wb_lit(w, "\"chunks\":[");
  size_t k = 0;
  for (size_t i = 0; i < s->nchunks; i++) {
    const pp_chunk_view_t *c = &s->chunks[i];
    uintptr_t end = c->base + c->size;
    wb_lit(w, i ? ",\n{" : "\n{");
    wb_kv(w, "address", c->base, true);
    wb_kv(w, "size", c->size, true);
    wb_kv(w, "node", c->node, true);
    write_flags(w, c->flags);
    wb_lit(w, ",\"free\":[");
    while (k < s->nfree && s->free_ext[k].base + s->free_ext[k].size <= c->base)
      k++;
    const char *sep = "";
    for (size_t j = k; j < s->nfree && s->free_ext[j].base < end; j++) {
      uintptr_t a =
          s->free_ext[j].base > c->base ? s->free_ext[j].base : c->base;
      uintptr_t e = s->free_ext[j].base + s->free_ext[j].size;
      e = e < end ? e : end;
      wb_printf(w, "%s[%llu,%llu]", sep, (unsigned long long)a,
                (unsigned long long)(e - a));
      sep = ",";
    }
    wb_lit(w, "]}");
  }
  wb_lit(w, "],\n");
}

/* Blocks lent to other processes (docs/sharing.md): to whom, since when
 * (since_ns on the clock of time_ns). */
static void write_lends(wbuf_t *w, const pp_snap_t *s) {
  wb_lit(w, "\"lends\":[");
  for (size_t i = 0; i < s->nlends; i++) {
    const pp_lend_view_t *l = &s->lends[i];
    wb_lit(w, i ? ",\n{" : "{");
    wb_kv(w, "address", l->addr, true);
    wb_kv(w, "size", l->size, true);
    wb_kv(w, "chunk_id", l->chunk_id, true);
    wb_kv(w, "offset", l->offset, true);
    wb_kv(w, "generation", l->generation, true);
    wb_kv(w, "peer_pid", (uint64_t)l->peer, true);
    wb_kv(w, "since_ns", l->since_ns, true);
    wb_kv(w, "since_unix_ns", l->since_unix_ns, false);
    wb_lit(w, "}");
  }
  wb_lit(w, "],\n");
}

static void write_segments(wbuf_t *w, const pp_snap_t *s,
                           const stack_out_t *o) {
  static const char *const states[4] = {"never", "allocated", "cached",
                                        "pending_free"};
  wb_lit(w, "\"segments\":[");
  for (size_t i = 0; i < s->nsegs; i++) {
    const pp_sseg_t *g = &s->segs[i];
    wb_lit(w, i ? ",\n{" : "\n{");
    wb_kv(w, "address", g->base, true);
    wb_kv(w, "size", g->size, true);
    wb_kv(w, "block_size", g->bs, true);
    wb_kv(w, "class", g->cls, true);
    wb_kv(w, "node", g->node, true);
    wb_kv(w, "blocks_total", g->nblocks, true);
    wb_kv(w, "uncarved_blocks", g->uncarved, true);
    wb_kv(w, "tail_bytes", g->size - (uint64_t)g->nblocks * g->bs, true);
    write_flags(w, g->flags);
    wb_lit(w, ",\"blocks\":[");
    for (size_t j = g->first; j < g->first + g->nblk; j++) {
      const pp_sblk_t *b = &s->blk[j];
      unsigned st = PP_WORD_STATE(b->word);
      char *p = wb_begin(w);
      if (p == NULL)
        return;
      p = j > g->first ? PUT(p, ",\n{\"address\":") : PUT(p, "\n{\"address\":");
      p = put_u64(p, g->base + (uint64_t)b->idx * g->bs);
      p = PUT(p, ",\"state\":\"");
      p = put_mem(p, states[st], strlen(states[st]));
      p = PUT(p, "\",\"requested_size\":");
      p = put_u64(p, st == PP_CACHED ? 0 : PP_WORD_PAYLOAD(b->word));
      p = PUT(p, ",\"streams\":[");
      for (uint32_t k = 0; k < b->nstreams; k++) {
        if (k)
          *p++ = ',';
        p = put_handle(p, s->streams[b->streams + k]);
      }
      *p++ = ']';
      /* Only for a block tied to graph captures (docs/cuda.md): why a
       * pending block stays pending. */
      if (b->ncaps > 0) {
        p = PUT(p, ",\"graphs\":[");
        for (uint32_t k = 0; k < b->ncaps; k++) {
          if (k)
            *p++ = ',';
          p = put_handle(p, s->streams[b->streams + b->nstreams + k]);
        }
        *p++ = ']';
      }
      p = PUT(p, ",\"thread\":");
      if ((uint32_t)b->info != 0)
        p = put_u64(p, (uint32_t)b->info);
      else
        p = PUT(p, "null");
      p = PUT(p, ",\"stack\":");
      int64_t sid = stack_index(o, b->info >> 32);
      p = sid >= 0 ? put_u64(p, (uint64_t)sid) : PUT(p, "null");
      *p++ = '}';
      wb_end(w, p);
    }
    wb_lit(w, "]}");
  }
  wb_lit(w, "],\n");
}

static void write_frames(wbuf_t *w, const pp_snap_t *s, const stack_out_t *o) {
  wb_lit(w, "\"frames\":[");
  for (size_t i = 0; i < o->nframes; i++) {
    const frame_out_t *f = &o->frames[i];
    wb_lit(w, i ? ",\n{" : "\n{");
    wb_kv(w, "address", f->addr, true);
    wb_key(w, "function");
    wb_str(w, f->sym.function);
    wb_lit(w, ",");
    wb_kv(w, "offset", f->sym.offset, true);
    wb_key(w, "module");
    wb_str(w, f->sym.module);
    wb_lit(w, ",");
    wb_key(w, "file");
    wb_str(w, f->sym.file);
    wb_lit(w, ",\"line\":");
    if (f->sym.line >= 0)
      wb_u64(w, (uint64_t)f->sym.line);
    else
      wb_lit(w, "null");
    wb_raw(w, "}", 1);
  }
  wb_lit(w, "],\n\"stacks\":[");
  const pp_stacks_copy_t *c = &s->stacks;
  for (size_t k = 0; k < o->nused; k++) {
    uint32_t id = o->order[k];
    size_t a = (size_t)c->off[id - 1] + o->first[k];
    wb_lit(w, k ? ",\n[" : "\n[");
    for (uint32_t j = 0; j < o->len[k]; j++) {
      if (j)
        wb_raw(w, ",", 1);
      wb_u64(w, o->fidx[a + j]);
    }
    wb_raw(w, "]", 1);
  }
  wb_lit(w, "],\n");
}

static const char *const action_names[PP_H_NACTIONS] = {"segment_alloc",
                                                        "alloc",
                                                        "free_requested",
                                                        "free_completed",
                                                        "segment_free",
                                                        "empty_cache",
                                                        "oom"};
static const char *const level_names[4] = {"none", "state", "alloc", "all"};

static void write_history(wbuf_t *w, const pp_snap_t *s, const stack_out_t *o) {
  wb_lit(w, "\"history\":{\"record\":\"");
  wb_lit(w, level_names[s->level & 3]);
  wb_lit(w, "\",");
  wb_kv(w, "stack_depth", s->depth, true);
  wb_kv(w, "max_entries", s->max_entries, true);
  wb_kv(w, "recorded", s->recorded, true);
  wb_kv(w, "dropped", s->hist_dropped, true);
  wb_kv(w, "lost_writes", s->hist_lost, true);
  wb_lit(w, "\"fields\":[\"seq\",\"time_ns\",\"action\",\"address\",\"size\","
            "\"requested_size\",\"stream\",\"thread\",\"stack\"],"
            "\"entries\":[");
  pinpool_t *pool = s->pool;
  /* The clock conversion needs a span: a pool younger than 2 ms waits. */
  while (pool->hist.tsc && pp_now_ns() - pool->hist.ns0 < 2000000u) {
  }
  uint64_t clk_now = pp_hist_clock(pool), ns_now = pp_now_ns();
  /* pp_hist_to_ns, with its rate computed once. */
  uint64_t ns_one = pp_hist_to_ns(pool, clk_now, clk_now, ns_now);
  double rate = 1.0;
  if (pool->hist.tsc && clk_now > pool->hist.clk0)
    rate =
        (double)(ns_one - pool->hist.ns0) / (double)(clk_now - pool->hist.clk0);
  for (size_t i = 0; i < s->nent; i++) {
    const pp_sentry_t *e = &s->ent[i];
    unsigned action = (unsigned)(e->tid_action & 0xff);
    if (action >= PP_H_NACTIONS)
      action = PP_H_ALLOC; /* cannot happen: written by emit() only */
    uint64_t ns = e->clk;
    if (pool->hist.tsc) {
      double d = ((double)e->clk - (double)pool->hist.clk0) * rate;
      ns = d <= 0 ? pool->hist.ns0 : pool->hist.ns0 + (uint64_t)d;
    }
    char *p = wb_begin(w);
    if (p == NULL)
      return;
    p = i ? PUT(p, ",\n[") : PUT(p, "\n[");
    p = put_u64(p, e->seq);
    *p++ = ',';
    p = put_u64(p, ns);
    p = PUT(p, ",\"");
    p = put_mem(p, action_names[action], strlen(action_names[action]));
    p = PUT(p, "\",");
    p = put_u64(p, e->addr);
    *p++ = ',';
    p = put_u64(p, e->size);
    *p++ = ',';
    p = put_u64(p, e->req);
    *p++ = ',';
    p = e->stream != 0 ? put_handle(p, e->stream) : PUT(p, "null");
    *p++ = ',';
    p = put_u64(p, e->tid_action >> 8);
    *p++ = ',';
    int64_t sid = stack_index(o, e->stack);
    p = sid >= 0 ? put_u64(p, (uint64_t)sid) : PUT(p, "null");
    *p++ = ']';
    wb_end(w, p);
  }
  wb_lit(w, "]}");
}

static int write_all(pp_snap_t *s, wbuf_t *w) {
  stack_out_t o;
  int rc = build_stacks(s, &o);
  if (rc != 0) {
    stack_out_free(&o);
    return rc;
  }
  wb_lit(w, "{\"format\":\"pinpool-snapshot\",\"version\":1,"
            "\"pinpool_version\":");
  wb_str(w, pinpool_version());
  wb_lit(w, ",");
  wb_kv(w, "pid", (uint64_t)getpid(), true);
  wb_kv(w, "time_ns", s->t0_ns, true);
  wb_printf(w, "\"unix_time\":%.6f,", s->unix_time);
  wb_kv(w, "gather_ns", s->gather_ns, true);
  wb_kv(w, "max_hold_ns", s->max_hold_ns, true);
  wb_key(w, "backend");
  wb_str(w, s->pool->backend_name);
  wb_lit(w, ",");
  wb_key(w, "config");
  wb_str(w, s->config);
  wb_lit(w, ",\n");
  write_stats(w, &s->stats);
  write_totals(w, s);
  write_segments(w, s, &o);
  write_chunks(w, s);
  write_lends(w, s);
  write_frames(w, s, &o);
  write_history(w, s, &o);
  wb_lit(w, "}\n");
  stack_out_free(&o);
  return w->err;
}

static int snapshot_to(pinpool_t *pool, unsigned flags, wbuf_t *w) {
  pp_snap_t s;
  memset(&s, 0, sizeof s);
  s.pool = pool;
  s.flags = flags;
  int rc = pp_snap_gather(&s);
  if (rc == 0)
    rc = write_all(&s, w);
  pp_snap_free(&s);
  return rc;
}

static int check_args(pinpool_t *pool, const void *dst, unsigned flags,
                      const char *fn) {
  if (pool == NULL || dst == NULL)
    return pp_fail(PINPOOL_EINVAL, "%s: NULL argument", fn);
  if (flags & ~(PINPOOL_SNAPSHOT_NO_HISTORY | PINPOOL_SNAPSHOT_NO_SYMBOLS))
    return pp_fail(PINPOOL_EINVAL, "%s: unknown flags 0x%x", fn, flags);
  return 0;
}

int pinpool_snapshot_write_file(pinpool_t *pool, FILE *f, unsigned flags) {
  int rc = check_args(pool, f, flags, "pinpool_snapshot_write_file");
  if (rc != 0)
    return rc;
  wbuf_t w = {NULL, 0, 0, f, 0};
  rc = snapshot_to(pool, flags, &w);
  if (rc == 0) {
    wb_flush(&w);
    rc = w.err;
  }
  if (rc == 0 && fflush(f) != 0)
    rc = pp_fail(PINPOOL_EBACKEND, "snapshot: write failed: %s",
                 strerror(errno));
  free(w.p);
  return rc;
}

int pinpool_snapshot_write(pinpool_t *pool, const char *path, unsigned flags) {
  int rc = check_args(pool, path, flags, "pinpool_snapshot_write");
  if (rc != 0)
    return rc;
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return pp_fail(PINPOOL_EBACKEND, "pinpool_snapshot_write: %s: %s", path,
                   strerror(errno));
  rc = pinpool_snapshot_write_file(pool, f, flags);
  if (fclose(f) != 0 && rc == 0)
    rc = pp_fail(PINPOOL_EBACKEND, "pinpool_snapshot_write: %s: %s", path,
                 strerror(errno));
  if (rc != 0)
    (void)unlink(path);
  return rc;
}

int pinpool_snapshot_write_mem(pinpool_t *pool, char **out, size_t *len,
                               unsigned flags) {
  int rc = check_args(pool, out, flags, "pinpool_snapshot_write_mem");
  if (rc == 0 && len == NULL)
    rc = pp_fail(PINPOOL_EINVAL, "pinpool_snapshot_write_mem: NULL argument");
  if (rc != 0)
    return rc;
  wbuf_t w = {NULL, 0, 0, NULL, 0};
  rc = snapshot_to(pool, flags, &w);
  if (rc != 0) {
    free(w.p);
    return rc;
  }
  w.p[w.len] = '\0'; /* wb_reserve always keeps room for it */
  *out = w.p;
  *len = w.len;
  return 0;
}

void pinpool_snapshot_free(char *text) { free(text); }
