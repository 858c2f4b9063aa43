/*
 * `pinpool snapshot summary FILE` and `pinpool snapshot diff A B`.
 *
 * summary: what the pool holds (segments by flag, blocks by state), how
 * much is lost to rounding and to fragmentation, whether the accounting
 * identities of docs/snapshot-format.md hold (exit 1 if not), the history
 * ring in numbers, and the allocation sites holding the most live memory.
 * diff: live memory per allocation site in two snapshots, largest growth
 * first, for leak hunting.
 *
 * Every number is computed in one pass over the blocks and one over the
 * history (sites: a sort), so big snapshots cost little beyond parsing.
 * The input may be anything the loader accepts, including nonsense values
 * (the fuzz target feeds it such): sums are unsigned and wrap rather than
 * overflow, and nothing is indexed by a value read from the file without
 * a bound.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "snapshot_load.h"

#define NFLAGS 4
static const char *const flag_names[NFLAGS] = {"page_locked", "huge_advised",
                                               "mlock_failed", "reserve"};

#define SITE_LEN 1024
#define MAX_PROBLEMS 10

/* ---- live sites --------------------------------------------------------- */

typedef struct stack_acc {
  uint64_t bytes, blocks, requested;
} stack_acc_t;

static int by_name(const void *pa, const void *pb) {
  const snap_site_stat_t *a = pa, *b = pb;
  return strcmp(a->site, b->site);
}

static int by_bytes(const void *pa, const void *pb) {
  const snap_site_stat_t *a = pa, *b = pb;
  if (a->bytes != b->bytes)
    return a->bytes > b->bytes ? -1 : 1;
  if (a->blocks != b->blocks)
    return a->blocks > b->blocks ? -1 : 1;
  return strcmp(a->site, b->site);
}

void snap_sites_free(snap_site_stat_t *v, size_t n) {
  if (v == NULL)
    return;
  for (size_t i = 0; i < n; i++)
    free(v[i].site);
  free(v);
}

/* Sites sorted by name, equal names merged: stacks that differ only in
 * outer frames are one site, and the two files of a diff index their
 * stacks differently, so the name is the key. */
static int sites_by_name(const snap_t *s, snap_site_stat_t **out,
                         size_t *nout) {
  stack_acc_t *acc = calloc(s->nstacks + 1, sizeof *acc);
  snap_site_stat_t *v = NULL;
  size_t n = 0, m = 0;
  char buf[SITE_LEN];
  *out = NULL;
  *nout = 0;
  if (acc == NULL)
    return -1;
  for (size_t seg = 0; seg < s->nsegments; seg++) {
    size_t nb = snap_segment_nblocks(s, seg);
    for (size_t i = 0; i < nb; i++) {
      snap_block_t b;
      snap_block(s, seg, i, &b);
      if (b.state == SNAP_CACHED)
        continue;
      /* slot 0: no stack; the loader bounds b.stack by nstacks. */
      stack_acc_t *a = &acc[b.stack < 0 || (uint64_t)b.stack >= s->nstacks
                                ? 0
                                : (size_t)b.stack + 1];
      a->bytes += b.size;
      a->blocks++;
      a->requested += b.requested;
    }
  }
  for (size_t k = 0; k <= s->nstacks; k++)
    n += acc[k].blocks > 0;
  if (n > 0) {
    v = calloc(n, sizeof *v);
    if (v == NULL) {
      free(acc);
      return -1;
    }
  }
  for (size_t k = 0; k <= s->nstacks; k++) {
    if (acc[k].blocks == 0)
      continue;
    snap_site(s, (int64_t)k - 1, buf, sizeof buf);
    v[m].site = strdup(buf);
    if (v[m].site == NULL) {
      snap_sites_free(v, m);
      free(acc);
      return -1;
    }
    v[m].bytes = acc[k].bytes;
    v[m].blocks = acc[k].blocks;
    v[m].requested = acc[k].requested;
    m++;
  }
  free(acc);
  if (n > 1)
    qsort(v, n, sizeof *v, by_name);
  /* Merge runs of equal names into their first element. */
  m = 0;
  for (size_t k = 0; k < n; k++) {
    if (m > 0 && strcmp(v[m - 1].site, v[k].site) == 0) {
      v[m - 1].bytes += v[k].bytes;
      v[m - 1].blocks += v[k].blocks;
      v[m - 1].requested += v[k].requested;
      free(v[k].site);
    } else {
      v[m++] = v[k];
    }
  }
  *out = v;
  *nout = m;
  return 0;
}

int snap_live_sites(const snap_t *s, snap_site_stat_t **out, size_t *n) {
  if (sites_by_name(s, out, n) != 0)
    return -1;
  if (*n > 1)
    qsort(*out, *n, sizeof **out, by_bytes);
  return 0;
}

/* ---- one pass over segments, blocks and history ------------------------- */

typedef struct problems {
  size_t n; /* all found; the first MAX_PROBLEMS are kept */
  char msg[MAX_PROBLEMS][200];
} problems_t;

static void problem(problems_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void problem(problems_t *p, const char *fmt, ...) {
  va_list ap;
  if (p->n < MAX_PROBLEMS) {
    va_start(ap, fmt);
    (void)vsnprintf(p->msg[p->n], sizeof p->msg[0], fmt, ap);
    va_end(ap);
  }
  p->n++;
}

/* The totals object's fields. */
typedef struct totals {
  uint64_t segments, segment_bytes, chunk_free, reserved, allocated,
      allocated_blocks, requested, pending, pending_blocks, cached,
      cached_blocks, uncarved, tail;
} totals_t;

typedef struct summary {
  totals_t t; /* as written */
  totals_t r; /* recomputed from the segments and blocks */
  uint64_t flag_segments[NFLAGS], flag_bytes[NFLAGS];
  uint64_t noflag_segments, noflag_bytes;
  uint64_t uncarved_blocks;
  uint64_t live_requested; /* allocated + pending_free */
  /* Fragmentation: free memory in segments is cached blocks + uncarved
   * blocks (tails cannot hold a block). */
  uint64_t largest_run;      /* bytes of adjacent free blocks */
  uint64_t largest_run_bs;   /* their block size */
  uint64_t largest_run_addr; /* segment address */
  /* Free space that is whole: idle segments' free blocks and wholly free
   * chunks (empty_cache returns them as they are), and the largest free
   * piece of the rest (a run in a segment with live blocks, or a free
   * range of a chunk in use). */
  uint64_t whole_free, part_largest;
  uint64_t arena_free;    /* the chunks' free ranges (`chunks[].free`) */
  uint64_t used_segments; /* with a live block and free blocks */
  uint64_t free_in_used;  /* free block bytes in them */
  uint64_t idle_segments, idle_bytes; /* no live block */
  /* Addresses of the segments with a live block (sorted by summarize): a
   * chunk none of whose segments is busy is idle, and its free ranges are
   * returned with its idle segments, whole. */
  uint64_t *busy;
  size_t nbusy, busy_cap;
  int busy_oom;
  problems_t problems;
  /* history */
  uint64_t actions[SNAP_NACTIONS];
  uint64_t min_time, max_time, first_seq, last_seq, seq_gaps;
} summary_t;

static void read_totals(const snap_t *s, totals_t *t) {
  const json_t *o = json_object_get(s->root, "totals");
  t->segments = snap_u64(o, "segments");
  t->segment_bytes = snap_u64(o, "segment_bytes");
  t->chunk_free = snap_u64(o, "chunk_free_bytes");
  t->reserved = snap_u64(o, "reserved_bytes");
  t->allocated = snap_u64(o, "allocated_bytes");
  t->allocated_blocks = snap_u64(o, "allocated_blocks");
  t->requested = snap_u64(o, "requested_bytes");
  t->pending = snap_u64(o, "pending_bytes");
  t->pending_blocks = snap_u64(o, "pending_blocks");
  t->cached = snap_u64(o, "cached_bytes");
  t->cached_blocks = snap_u64(o, "cached_blocks");
  t->uncarved = snap_u64(o, "uncarved_bytes");
  t->tail = snap_u64(o, "tail_bytes");
}

static void summarize_segment(const snap_t *s, size_t seg, summary_t *m,
                              uint64_t *prev_end) {
  const json_t *o = snap_segment(s, seg);
  const json_t *flags = json_object_get(o, "flags");
  uint64_t addr = snap_u64(o, "address"), size = snap_u64(o, "size");
  uint64_t bs = snap_u64(o, "block_size"), total = snap_u64(o, "blocks_total");
  uint64_t unc = snap_u64(o, "uncarved_blocks"),
           tail = snap_u64(o, "tail_bytes");
  size_t nb = snap_segment_nblocks(s, seg), nflags = json_array_size(flags);
  uint64_t run = 0, live = 0, free_bytes = 0, next = 0, seg_run = 0;
  int any_flag = 0, in_run = 0;

  m->r.segments++;
  m->r.segment_bytes += size;
  m->r.uncarved += unc * bs;
  m->r.tail += tail;
  m->uncarved_blocks += unc;
  for (size_t k = 0; k < nflags; k++) {
    const char *f = json_string_value(json_array_get(flags, k));
    for (size_t j = 0; f != NULL && j < NFLAGS; j++)
      if (strcmp(f, flag_names[j]) == 0) {
        m->flag_segments[j]++;
        m->flag_bytes[j] += size;
        any_flag = 1;
      }
  }
  if (!any_flag) {
    m->noflag_segments++;
    m->noflag_bytes += size;
  }

  if (seg > 0 && addr < *prev_end)
    problem(&m->problems,
            "segments[%zu]: address 0x%" PRIx64 " overlaps or precedes the "
            "segment before it (ends at 0x%" PRIx64 ")",
            seg, addr, *prev_end);
  *prev_end = addr + size;
  /* bs >= 512 (loader), so the division is safe. */
  if (total != size / bs || tail != size - total * bs)
    problem(&m->problems,
            "segments[%zu]: blocks_total %" PRIu64 ", tail_bytes %" PRIu64
            " do not split size %" PRIu64 " into blocks of %" PRIu64,
            seg, total, tail, size, bs);
  if (size != bs * ((uint64_t)nb + unc) + tail)
    problem(&m->problems,
            "segments[%zu]: size %" PRIu64 " != block_size %" PRIu64
            " * (%zu listed + %" PRIu64 " uncarved blocks) + tail %" PRIu64,
            seg, size, bs, nb, unc, tail);

  for (size_t i = 0; i < nb; i++) {
    snap_block_t b;
    snap_block(s, seg, i, &b);
    uint64_t off = b.address - addr;
    if (b.address < addr || off % bs != 0 || off / bs >= total ||
        (i > 0 && b.address < next))
      problem(&m->problems,
              "segments[%zu].blocks[%zu]: address 0x%" PRIx64
              " is not a block of the segment, in address order",
              seg, i, b.address);
    if (b.state != SNAP_CACHED && b.requested > b.size)
      problem(&m->problems,
              "segments[%zu].blocks[%zu]: requested_size %" PRIu64
              " > block_size %" PRIu64,
              seg, i, b.requested, b.size);
    switch (b.state) {
    case SNAP_ALLOCATED:
      m->r.allocated += b.size;
      m->r.allocated_blocks++;
      m->r.requested += b.requested;
      break;
    case SNAP_PENDING:
      m->r.pending += b.size;
      m->r.pending_blocks++;
      break;
    default:
      m->r.cached += b.size;
      m->r.cached_blocks++;
      break;
    }
    if (b.state == SNAP_CACHED) {
      /* A run of free blocks is broken by a live block or a gap. */
      run = in_run && b.address == next ? run + b.size : b.size;
      in_run = 1;
      free_bytes += b.size;
    } else {
      live++;
      m->live_requested += b.requested;
      in_run = 0;
      run = 0;
    }
    if (in_run && run > seg_run)
      seg_run = run;
    if (in_run && run > m->largest_run) {
      m->largest_run = run;
      m->largest_run_bs = bs;
      m->largest_run_addr = addr;
    }
    next = b.address + bs;
  }
  /* Blocks are carved in address order, so the uncarved ones follow the
   * listed blocks and extend a run of free blocks at the end. */
  if (unc > 0) {
    run = (nb == 0 || in_run) ? run + unc * bs : unc * bs;
    free_bytes += unc * bs;
    if (run > seg_run)
      seg_run = run;
    if (run > m->largest_run) {
      m->largest_run = run;
      m->largest_run_bs = bs;
      m->largest_run_addr = addr;
    }
  }
  if (live == 0)
    m->whole_free += free_bytes;
  else if (seg_run > m->part_largest)
    m->part_largest = seg_run;
  if (live != 0 && m->nbusy == m->busy_cap) {
    size_t cap = m->busy_cap == 0 ? 64 : 2 * m->busy_cap;
    uint64_t *b = realloc(m->busy, cap * sizeof *b);
    if (b == NULL)
      m->busy_oom = 1;
    else {
      m->busy = b;
      m->busy_cap = cap;
    }
  }
  if (live != 0 && m->nbusy < m->busy_cap)
    m->busy[m->nbusy++] = addr;
  if (live == 0) {
    m->idle_segments++;
    m->idle_bytes += size;
  } else if (free_bytes > 0) {
    m->used_segments++;
    m->free_in_used += free_bytes;
  }
}

static void check_totals(summary_t *m) {
  const totals_t *t = &m->t, *r = &m->r;
  static const struct {
    const char *name;
    size_t off;
  } fields[] = {
      {"segments", offsetof(totals_t, segments)},
      {"segment_bytes", offsetof(totals_t, segment_bytes)},
      {"allocated_bytes", offsetof(totals_t, allocated)},
      {"allocated_blocks", offsetof(totals_t, allocated_blocks)},
      {"requested_bytes", offsetof(totals_t, requested)},
      {"pending_bytes", offsetof(totals_t, pending)},
      {"pending_blocks", offsetof(totals_t, pending_blocks)},
      {"cached_blocks", offsetof(totals_t, cached_blocks)},
      {"cached_bytes", offsetof(totals_t, cached)},
      {"uncarved_bytes", offsetof(totals_t, uncarved)},
      {"tail_bytes", offsetof(totals_t, tail)},
  };
  if (t->reserved != t->allocated + t->pending + t->cached)
    problem(&m->problems,
            "totals: reserved_bytes %" PRIu64 " != allocated %" PRIu64
            " + pending %" PRIu64 " + cached %" PRIu64,
            t->reserved, t->allocated, t->pending, t->cached);
  if (t->reserved != t->segment_bytes + t->chunk_free)
    problem(&m->problems,
            "totals: reserved_bytes %" PRIu64 " != segment_bytes %" PRIu64
            " + chunk_free_bytes %" PRIu64,
            t->reserved, t->segment_bytes, t->chunk_free);
  for (size_t k = 0; k < sizeof fields / sizeof fields[0]; k++) {
    uint64_t a, b;
    memcpy(&a, (const char *)t + fields[k].off, sizeof a);
    memcpy(&b, (const char *)r + fields[k].off, sizeof b);
    if (a != b)
      problem(&m->problems,
              "totals.%s %" PRIu64 " != %" PRIu64 " summed from the segments",
              fields[k].name, a, b);
  }
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* A segment with a live block starts in [address, address + size). */
static int chunk_busy(const summary_t *m, uint64_t address, uint64_t size) {
  size_t lo = 0, hi = m->nbusy;
  while (lo < hi) { /* the first busy segment at or above address */
    size_t mid = lo + (hi - lo) / 2;
    if (m->busy[mid] < address)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < m->nbusy && m->busy[lo] - address < size;
}

/* 0, or -1 out of memory. */
static int summarize(const snap_t *s, summary_t *m) {
  uint64_t prev_end = 0;
  memset(m, 0, sizeof *m);
  read_totals(s, &m->t);
  for (size_t seg = 0; seg < s->nsegments; seg++)
    summarize_segment(s, seg, m, &prev_end);
  if (m->busy_oom)
    return -1;
  if (m->nbusy > 1)
    qsort(m->busy, m->nbusy, sizeof *m->busy, cmp_u64);
  for (size_t i = 0; i < s->nchunks; i++) {
    snap_chunk_t c;
    uint64_t largest = 0, free_bytes = 0;
    snap_chunk(s, i, &c);
    for (size_t j = 0; j < c.nfree; j++) {
      uint64_t a, n;
      snap_chunk_free(s, i, j, &a, &n);
      free_bytes += n;
      if (n > largest)
        largest = n;
    }
    m->arena_free += free_bytes;
    /* Wholly free, or all its segments idle: empty_cache returns the
     * chunk whole (issue 41, second round: an idle pool's chunks with
     * idle segments read 9 % fragmented, their free ranges as parts). */
    if (free_bytes == c.size || !chunk_busy(m, c.address, c.size))
      m->whole_free += free_bytes;
    else if (largest > m->part_largest)
      m->part_largest = largest;
  }
  /* Cached memory is everything reserved and not live; the reserve's free
   * ranges are not in any segment, so they come from the totals. */
  m->r.chunk_free = m->t.chunk_free;
  m->r.cached += m->r.uncarved + m->r.tail + m->r.chunk_free;
  m->r.reserved = m->r.segment_bytes + m->r.chunk_free;
  check_totals(m);

  for (size_t i = 0; i < s->nentries; i++) {
    snap_entry_t e;
    snap_entry(s, i, &e);
    if (e.action >= 0 && e.action < SNAP_NACTIONS)
      m->actions[e.action]++;
    if (i == 0 || e.time_ns < m->min_time)
      m->min_time = e.time_ns;
    if (i == 0 || e.time_ns > m->max_time)
      m->max_time = e.time_ns;
    if (i == 0)
      m->first_seq = e.seq;
    else if (e.seq > m->last_seq + 1)
      m->seq_gaps += e.seq - m->last_seq - 1;
    m->last_seq = e.seq;
  }
  return 0;
}

/* ---- text output ----------------------------------------------------------
 */

static double pct(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * (double)part / (double)whole;
}

/* Fragmentation on free space (1 - largest free piece / free bytes, in
 * segments and in the arena's chunks), where free space that is whole
 * (idle segments, wholly free chunks) counts as one piece with the largest:
 * the share of the free bytes that lies in pieces a request of the largest
 * piece's size could not use. An idle pool whose free space is whole
 * segments and chunks reads 0 % (issue 41 found one reported as 91 %
 * fragmented, the pool's one largest run against all its free space). */
static double fragmentation(const summary_t *m, uint64_t free_seg) {
  uint64_t free_all = free_seg + m->arena_free;
  return free_all == 0 ? 0.0
                       : 100.0 - pct(m->whole_free + m->part_largest, free_all);
}

/* "NUMBER  (HUMAN)" with the number right-aligned in `w` columns. */
static void put_bytes(FILE *out, int w, uint64_t v) {
  char h[CLI_BYTES_LEN];
  fprintf(out, "%*" PRIu64 "  (%s)", w, v, cli_format_bytes((double)v, h));
}

static void put_row(FILE *out, const char *label, uint64_t count,
                    uint64_t bytes) {
  fprintf(out, "  %-16s %10" PRIu64 " ", label, count);
  put_bytes(out, 14, bytes);
  fputc('\n', out);
}

static void put_time(FILE *out, const snap_t *s) {
  double ut = json_number_value(json_object_get(s->root, "unix_time"));
  char when[64] = "";
  char g[CLI_BYTES_LEN], h[CLI_BYTES_LEN];
  /* Far-off values would overflow time_t (or gmtime's year). */
  if (ut >= 0 && ut < 1e11) {
    time_t secs = (time_t)ut;
    struct tm tm;
    if (gmtime_r(&secs, &tm) != NULL)
      (void)strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  }
  fprintf(out, "  time      %s (unix %.3f, monotonic %.3f s)\n",
          when[0] ? when : "?", ut, (double)snap_u64(s->root, "time_ns") / 1e9);
  fprintf(out, "  gathered  in %s, pool lock held at most %s\n",
          cli_format_ns((double)snap_u64(s->root, "gather_ns"), g),
          cli_format_ns((double)snap_u64(s->root, "max_hold_ns"), h));
}

static const char *root_str(const snap_t *s, const char *key) {
  const char *v = json_string_value(json_object_get(s->root, key));
  return v != NULL ? v : "?";
}

/* The stats are read before the blocks; in a busy pool they differ. */
static void put_stats_check(FILE *out, const snap_t *s, const totals_t *t) {
  const json_t *st = json_object_get(s->root, "stats");
  const struct {
    const char *name;
    uint64_t stat, total;
  } pairs[] = {
      {"reserved_bytes",
       snap_u64(json_object_get(st, "reserved_bytes"), "current"), t->reserved},
      {"block_bytes", snap_u64(json_object_get(st, "block_bytes"), "current"),
       t->allocated},
      {"cached_bytes", snap_u64(json_object_get(st, "cached_bytes"), "current"),
       t->cached},
      {"pending_bytes", snap_u64(st, "pending_bytes"), t->pending},
      {"segments", snap_u64(json_object_get(st, "segments"), "current"),
       t->segments},
  };
  int differ = 0;
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    if (pairs[k].stat == pairs[k].total)
      continue;
    fprintf(out, "%s%s %" PRIu64 " (totals %" PRIu64 ")",
            differ ? ", "
                   : "  stats     differ from the totals (read "
                     "before the blocks while threads ran): ",
            pairs[k].name, pairs[k].stat, pairs[k].total);
    differ = 1;
  }
  fprintf(out, differ ? "\n" : "  stats     agree with the totals\n");
}

static void put_sites(FILE *out, const snap_site_stat_t *v, size_t n,
                      size_t top) {
  size_t shown = top == 0 || top > n ? n : top;
  fprintf(out,
          "\ntop %zu of %zu allocation sites by live bytes "
          "(allocated + pending_free)\n",
          shown, n);
  if (n == 0) {
    fprintf(out, "  (no live blocks)\n");
    return;
  }
  fprintf(out, "  %14s  %-12s %8s %14s  %s\n", "live bytes", "", "blocks",
          "requested", "site");
  for (size_t i = 0; i < shown; i++) {
    char h[CLI_BYTES_LEN], paren[CLI_BYTES_LEN + 2];
    (void)snprintf(paren, sizeof paren, "(%s)",
                   cli_format_bytes((double)v[i].bytes, h));
    fprintf(out, "  %14" PRIu64 "  %-12s %8" PRIu64 " %14" PRIu64 "  %s\n",
            v[i].bytes, paren, v[i].blocks, v[i].requested, v[i].site);
  }
}

static void write_summary_text(const snap_t *s, const char *name,
                               const summary_t *m, const snap_site_stat_t *v,
                               size_t n, size_t top, FILE *out) {
  const totals_t *t = &m->t, *r = &m->r;
  const json_t *h = json_object_get(s->root, "history");
  uint64_t free_seg = r->cached - r->tail - r->chunk_free;
  uint64_t waste = r->allocated - r->requested;
  char hb[CLI_BYTES_LEN];

  fprintf(out, "snapshot %s\n", name);
  fprintf(out, "  pinpool   %s, pid %" PRIu64 ", backend %s\n",
          root_str(s, "pinpool_version"), snap_u64(s->root, "pid"),
          root_str(s, "backend"));
  fprintf(out, "  config    %s\n", root_str(s, "config"));
  put_time(out, s);

  fprintf(out, "\nsegments  %" PRIu64 ", %" PRIu64 " bytes (%s)\n", r->segments,
          r->segment_bytes, cli_format_bytes((double)r->segment_bytes, hb));
  fprintf(out, "  %-16s %10s %14s\n", "by flag", "segments", "bytes");
  for (size_t k = 0; k < NFLAGS; k++)
    put_row(out, flag_names[k], m->flag_segments[k], m->flag_bytes[k]);
  put_row(out, "(no flags)", m->noflag_segments, m->noflag_bytes);
  fprintf(out, "  %-16s %10s ", "free in chunks", "");
  put_bytes(out, 14, t->chunk_free);
  fprintf(out, "\n");

  fprintf(out, "\nblocks by state\n  %-16s %10s %14s\n", "", "blocks", "bytes");
  put_row(out, "allocated", r->allocated_blocks, r->allocated);
  put_row(out, "pending_free", r->pending_blocks, r->pending);
  put_row(out, "cached", r->cached_blocks,
          r->cached - r->uncarved - r->tail - r->chunk_free);
  put_row(out, "uncarved", m->uncarved_blocks, r->uncarved);
  fprintf(out, "  %-16s %10s ", "segment tails", "");
  put_bytes(out, 14, r->tail);
  fprintf(out, "\n");

  fprintf(out,
          "\nrounding waste (allocated blocks): %" PRIu64
          " bytes (%s), %.2f %% of %" PRIu64 " block bytes; requested %" PRIu64
          "\n",
          waste, cli_format_bytes((double)waste, hb), pct(waste, r->allocated),
          r->allocated, r->requested);

  fprintf(out,
          "\nfragmentation (free blocks in segments: cached + uncarved)\n");
  fprintf(out, "  free in segments  ");
  put_bytes(out, 14, free_seg);
  fprintf(out, "\n  largest free run  ");
  put_bytes(out, 14, m->largest_run);
  if (m->largest_run > 0)
    fprintf(out,
            ": %" PRIu64 " adjacent blocks of %" PRIu64
            " in segment 0x%" PRIx64,
            m->largest_run / m->largest_run_bs, m->largest_run_bs,
            m->largest_run_addr);
  fprintf(out,
          "\n  fragmentation     %13.2f %%  (1 - largest free piece / free in "
          "segments and chunks; idle segments and free chunks are whole)\n",
          fragmentation(m, free_seg));
  fprintf(out, "  in used segments  ");
  put_bytes(out, 14, m->free_in_used);
  fprintf(out,
          ": free blocks in %" PRIu64 " segments with live blocks "
          "(empty_cache cannot return them)\n",
          m->used_segments);
  fprintf(out, "  idle segments     ");
  put_bytes(out, 14, m->idle_bytes);
  fprintf(out, ": %" PRIu64 " segments without live blocks\n",
          m->idle_segments);

  fprintf(out, "\naccounting\n");
  fprintf(out,
          "  reserved  %" PRIu64 " = allocated %" PRIu64 " + pending %" PRIu64
          " + cached %" PRIu64 "\n",
          t->reserved, t->allocated, t->pending, t->cached);
  fprintf(out,
          "  cached    %" PRIu64 " = cached blocks %" PRIu64
          " + uncarved %" PRIu64 " + tails %" PRIu64
          " + free in chunks %" PRIu64 "\n",
          r->cached, r->cached - r->uncarved - r->tail - r->chunk_free,
          r->uncarved, r->tail, r->chunk_free);
  put_stats_check(out, s, t);
  for (size_t k = 0; k < m->problems.n && k < MAX_PROBLEMS; k++)
    fprintf(out, "  MISMATCH  %s\n", m->problems.msg[k]);
  if (m->problems.n > MAX_PROBLEMS)
    fprintf(out, "  MISMATCH  ... and %zu more\n",
            m->problems.n - MAX_PROBLEMS);
  if (m->problems.n == 0)
    fprintf(out, "  identity OK\n");
  else
    fprintf(out, "  identity FAILED (%zu problems)\n", m->problems.n);

  fprintf(out,
          "\nhistory   record %s, stack depth %" PRIu64 ", ring of %" PRIu64
          " entries\n",
          json_string_value(json_object_get(h, "record")),
          snap_u64(h, "stack_depth"), snap_u64(h, "max_entries"));
  fprintf(out,
          "  entries   %zu kept, %" PRIu64 " recorded, %" PRIu64 " dropped\n",
          s->nentries, snap_u64(h, "recorded"), snap_u64(h, "dropped"));
  if (s->nentries > 0)
    fprintf(out,
            "  span      %s (time_ns %" PRIu64 "..%" PRIu64 ", seq %" PRIu64
            "..%" PRIu64 ", %" PRIu64 " missing)\n",
            cli_format_ns((double)(m->max_time - m->min_time), hb), m->min_time,
            m->max_time, m->first_seq, m->last_seq, m->seq_gaps);
  for (int k = 0; k < SNAP_NACTIONS; k++)
    fprintf(out, "  %-16s %10" PRIu64 "\n", snap_action_names[k],
            m->actions[k]);

  put_sites(out, v, n, top);
}

/* ---- JSON output ----------------------------------------------------------
 */

/* json_int_t is signed: values above INT64_MAX (only from nonsense input,
 * as sums wrap) come out negative rather than failing. */
static json_t *jint(uint64_t v) { return json_integer((json_int_t)v); }

/* A JSON string of a file name, which need not be UTF-8 (json_string
 * refuses those): other bytes than ASCII become '?'. */
static json_t *jname(const char *name) {
  json_t *v = json_string(name);
  char *copy;
  if (v != NULL || (copy = strdup(name)) == NULL)
    return v;
  for (char *c = copy; *c != '\0'; c++)
    if ((unsigned char)*c >= 0x80)
      *c = '?';
  v = json_string(copy);
  free(copy);
  return v;
}

static void jset(json_t *o, const char *key, json_t *v) {
  (void)json_object_set_new(o, key, v);
}

static json_t *jcount(uint64_t blocks, uint64_t bytes) {
  json_t *o = json_object();
  jset(o, "blocks", jint(blocks));
  jset(o, "bytes", jint(bytes));
  return o;
}

static json_t *jsites(const snap_site_stat_t *v, size_t n, size_t top) {
  json_t *a = json_array();
  size_t shown = top == 0 || top > n ? n : top;
  for (size_t i = 0; i < shown; i++) {
    json_t *o = json_object();
    jset(o, "site", json_string(v[i].site));
    jset(o, "bytes", jint(v[i].bytes));
    jset(o, "blocks", jint(v[i].blocks));
    jset(o, "requested", jint(v[i].requested));
    (void)json_array_append_new(a, o);
  }
  return a;
}

static json_t *summary_json(const snap_t *s, const char *name,
                            const summary_t *m, const snap_site_stat_t *v,
                            size_t n, size_t top) {
  const totals_t *r = &m->r;
  const json_t *h = json_object_get(s->root, "history");
  uint64_t free_seg = r->cached - r->tail - r->chunk_free;
  json_t *o = json_object(), *x;

  jset(o, "file", jname(name));
  jset(o, "pid", jint(snap_u64(s->root, "pid")));
  jset(o, "pinpool_version", json_string(root_str(s, "pinpool_version")));
  jset(o, "backend", json_string(root_str(s, "backend")));
  jset(o, "config", json_string(root_str(s, "config")));
  jset(o, "time_ns", jint(snap_u64(s->root, "time_ns")));
  jset(o, "unix_time",
       json_real(json_number_value(json_object_get(s->root, "unix_time"))));

  x = json_object();
  jset(x, "count", jint(r->segments));
  jset(x, "bytes", jint(r->segment_bytes));
  for (size_t k = 0; k < NFLAGS; k++)
    jset(x, flag_names[k], jcount(m->flag_segments[k], m->flag_bytes[k]));
  jset(x, "no_flags", jcount(m->noflag_segments, m->noflag_bytes));
  jset(x, "chunk_free_bytes", jint(r->chunk_free));
  jset(o, "segments", x);

  x = json_object();
  jset(x, "allocated", jcount(r->allocated_blocks, r->allocated));
  jset(x, "pending_free", jcount(r->pending_blocks, r->pending));
  jset(x, "cached",
       jcount(r->cached_blocks,
              r->cached - r->uncarved - r->tail - r->chunk_free));
  jset(x, "uncarved", jcount(m->uncarved_blocks, r->uncarved));
  jset(x, "tail_bytes", jint(r->tail));
  jset(o, "blocks", x);

  x = json_object();
  jset(x, "requested_bytes", jint(r->requested));
  jset(x, "block_bytes", jint(r->allocated));
  jset(x, "waste_bytes", jint(r->allocated - r->requested));
  jset(x, "waste_percent",
       json_real(pct(r->allocated - r->requested, r->allocated)));
  jset(o, "rounding", x);

  x = json_object();
  jset(x, "free_bytes", jint(free_seg));
  jset(x, "largest_run_bytes", jint(m->largest_run));
  jset(x, "whole_free_bytes", jint(m->whole_free));
  jset(x, "arena_free_bytes", jint(m->arena_free));
  jset(x, "largest_part_bytes", jint(m->part_largest));
  jset(x, "fragmentation_percent", json_real(fragmentation(m, free_seg)));
  jset(x, "free_in_used_segments_bytes", jint(m->free_in_used));
  jset(x, "used_segments", jint(m->used_segments));
  jset(x, "idle_segments", jint(m->idle_segments));
  jset(x, "idle_bytes", jint(m->idle_bytes));
  jset(o, "fragmentation", x);

  x = json_object();
  jset(x, "ok", json_boolean(m->problems.n == 0));
  jset(x, "problem_count", jint(m->problems.n));
  json_t *p = json_array();
  for (size_t k = 0; k < m->problems.n && k < MAX_PROBLEMS; k++)
    (void)json_array_append_new(p, json_string(m->problems.msg[k]));
  jset(x, "problems", p);
  jset(o, "identity", x);

  x = json_object();
  jset(x, "record",
       json_string(json_string_value(json_object_get(h, "record"))));
  jset(x, "entries", jint(s->nentries));
  jset(x, "recorded", jint(snap_u64(h, "recorded")));
  jset(x, "dropped", jint(snap_u64(h, "dropped")));
  jset(x, "span_ns", jint(s->nentries > 0 ? m->max_time - m->min_time : 0));
  json_t *acts = json_object();
  for (int k = 0; k < SNAP_NACTIONS; k++)
    jset(acts, snap_action_names[k], jint(m->actions[k]));
  jset(x, "actions", acts);
  jset(o, "history", x);

  jset(o, "site_count", jint(n));
  jset(o, "sites", jsites(v, n, top));
  return o;
}

/* Write j (and a newline) to out and drop it; -1 if it could not be made. */
static int dump_json(json_t *j, FILE *out) {
  int rc = j != NULL && json_dumpf(j, out, JSON_INDENT(2)) == 0 ? 0 : -1;
  if (rc == 0)
    fputc('\n', out);
  json_decref(j);
  return rc;
}

int snap_summary_write(const snap_t *s, const char *name, FILE *out, size_t top,
                       int json) {
  summary_t *m = malloc(sizeof *m);
  snap_site_stat_t *v = NULL;
  size_t n = 0;
  int rc;
  if (m == NULL || snap_live_sites(s, &v, &n) != 0) {
    free(m);
    fprintf(stderr, "pinpool snapshot summary: %s: out of memory\n", name);
    return CLI_EXIT_FAIL;
  }
  if (summarize(s, m) != 0) {
    free(m->busy);
    free(m);
    snap_sites_free(v, n);
    fprintf(stderr, "pinpool snapshot summary: %s: out of memory\n", name);
    return CLI_EXIT_FAIL;
  }
  rc = m->problems.n == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
  if (json) {
    if (dump_json(summary_json(s, name, m, v, n, top), out) != 0) {
      fprintf(stderr, "pinpool snapshot summary: %s: out of memory\n", name);
      rc = CLI_EXIT_FAIL;
    }
  } else {
    write_summary_text(s, name, m, v, n, top, out);
  }
  snap_sites_free(v, n);
  free(m->busy);
  free(m);
  return rc;
}

/* ---- diff -------------------------------------------------------------------
 */

typedef struct site_delta {
  const char *site; /* borrowed from the site lists */
  uint64_t a_bytes, b_bytes, a_blocks, b_blocks;
  int64_t d_bytes, d_blocks;
} site_delta_t;

static int by_growth(const void *pa, const void *pb) {
  const site_delta_t *a = pa, *b = pb;
  if (a->d_bytes != b->d_bytes)
    return a->d_bytes > b->d_bytes ? -1 : 1;
  if (a->d_blocks != b->d_blocks)
    return a->d_blocks > b->d_blocks ? -1 : 1;
  return strcmp(a->site, b->site);
}

/* Merge two name-sorted site lists into deltas, largest growth first. */
static site_delta_t *join_sites(const snap_site_stat_t *a, size_t na,
                                const snap_site_stat_t *b, size_t nb,
                                size_t *nout) {
  site_delta_t *d = calloc(na + nb + 1, sizeof *d);
  size_t i = 0, j = 0, n = 0;
  if (d == NULL)
    return NULL;
  while (i < na || j < nb) {
    int c = i == na ? 1 : j == nb ? -1 : strcmp(a[i].site, b[j].site);
    site_delta_t *x = &d[n++];
    if (c <= 0) {
      x->site = a[i].site;
      x->a_bytes = a[i].bytes;
      x->a_blocks = a[i].blocks;
      i++;
    }
    if (c >= 0) {
      x->site = b[j].site;
      x->b_bytes = b[j].bytes;
      x->b_blocks = b[j].blocks;
      j++;
    }
    x->d_bytes = (int64_t)(x->b_bytes - x->a_bytes);
    x->d_blocks = (int64_t)(x->b_blocks - x->a_blocks);
  }
  if (n > 1)
    qsort(d, n, sizeof *d, by_growth);
  *nout = n;
  return d;
}

enum {
  T_RESERVED,
  T_ALLOCATED,
  T_PENDING,
  T_CACHED,
  T_LIVE_BLOCKS,
  T_SEGMENTS,
  T_N
};
static const char *const total_names[T_N] = {"reserved",     "allocated",
                                             "pending_free", "cached",
                                             "live_blocks",  "segments"};

static void diff_totals(const snap_t *s, uint64_t v[T_N]) {
  totals_t t;
  read_totals(s, &t);
  v[T_RESERVED] = t.reserved;
  v[T_ALLOCATED] = t.allocated;
  v[T_PENDING] = t.pending;
  v[T_CACHED] = t.cached;
  v[T_LIVE_BLOCKS] = t.allocated_blocks + t.pending_blocks;
  v[T_SEGMENTS] = t.segments;
}

static void put_delta(FILE *out, int w, int64_t d) {
  char num[32];
  (void)snprintf(num, sizeof num, "%s%" PRId64, d > 0 ? "+" : "", d);
  fprintf(out, "%*s", w, num);
}

static void write_diff_text(const char *na, const char *nb,
                            const uint64_t ta[T_N], const uint64_t tb[T_N],
                            const site_delta_t *d, size_t n, size_t nsa,
                            size_t nsb, size_t top, FILE *out) {
  size_t grew = 0, shrank = 0, changed, shown;
  for (size_t i = 0; i < n; i++) {
    grew += d[i].d_bytes > 0 || (d[i].d_bytes == 0 && d[i].d_blocks > 0);
    shrank += d[i].d_bytes < 0 || (d[i].d_bytes == 0 && d[i].d_blocks < 0);
  }
  changed = grew + shrank;
  fprintf(out, "diff A %s\n  -> B %s\n\n", na, nb);
  fprintf(out, "  %-14s %16s %16s %16s\n", "totals", "A", "B", "delta");
  for (int k = 0; k < T_N; k++) {
    int64_t dv = (int64_t)(tb[k] - ta[k]);
    char h[CLI_BYTES_LEN];
    fprintf(out, "  %-14s %16" PRIu64 " %16" PRIu64 " ", total_names[k], ta[k],
            tb[k]);
    put_delta(out, 16, dv);
    if (k != T_LIVE_BLOCKS && k != T_SEGMENTS && dv != 0)
      fprintf(out, "  (%s%s)", dv > 0 ? "+" : "",
              cli_format_bytes((double)dv, h));
    fputc('\n', out);
  }
  fprintf(out,
          "\nsites: %zu in A, %zu in B; %zu grew, %zu shrank, "
          "%zu unchanged\n",
          nsa, nsb, grew, shrank, n - changed);
  /* Unchanged sites sort between the growing and the shrinking ones; only
   * changes are listed. */
  shown = top == 0 || top > changed ? changed : top;
  if (changed == 0) {
    fprintf(out, "no growth: no site changed its live bytes or blocks\n");
    return;
  }
  fprintf(out,
          "top %zu sites by growth of live bytes (allocated + "
          "pending_free)\n",
          shown);
  fprintf(out, "  %14s %8s %14s %14s %8s %8s  %s\n", "delta bytes", "blocks",
          "A bytes", "B bytes", "A blocks", "B blocks", "site");
  size_t printed = 0;
  for (size_t i = 0; i < n && printed < shown; i++) {
    if (d[i].d_bytes == 0 && d[i].d_blocks == 0)
      continue;
    fprintf(out, "  ");
    put_delta(out, 14, d[i].d_bytes);
    fputc(' ', out);
    put_delta(out, 8, d[i].d_blocks);
    fprintf(out, " %14" PRIu64 " %14" PRIu64 " %8" PRIu64 " %8" PRIu64 "  %s\n",
            d[i].a_bytes, d[i].b_bytes, d[i].a_blocks, d[i].b_blocks,
            d[i].site);
    printed++;
  }
}

static json_t *diff_json(const char *na, const char *nb, const uint64_t ta[T_N],
                         const uint64_t tb[T_N], const site_delta_t *d,
                         size_t n, size_t top) {
  json_t *o = json_object(), *t = json_object(), *a = json_array();
  size_t printed = 0;
  jset(o, "a", jname(na));
  jset(o, "b", jname(nb));
  for (int k = 0; k < T_N; k++) {
    json_t *x = json_object();
    jset(x, "a", jint(ta[k]));
    jset(x, "b", jint(tb[k]));
    jset(x, "delta", json_integer((json_int_t)(int64_t)(tb[k] - ta[k])));
    jset(t, total_names[k], x);
  }
  jset(o, "totals", t);
  for (size_t i = 0; i < n && (top == 0 || printed < top); i++) {
    if (d[i].d_bytes == 0 && d[i].d_blocks == 0)
      continue;
    json_t *x = json_object();
    jset(x, "site", json_string(d[i].site));
    jset(x, "delta_bytes", json_integer(d[i].d_bytes));
    jset(x, "delta_blocks", json_integer(d[i].d_blocks));
    jset(x, "a_bytes", jint(d[i].a_bytes));
    jset(x, "b_bytes", jint(d[i].b_bytes));
    jset(x, "a_blocks", jint(d[i].a_blocks));
    jset(x, "b_blocks", jint(d[i].b_blocks));
    (void)json_array_append_new(a, x);
    printed++;
  }
  jset(o, "sites", a);
  return o;
}

int snap_diff_write(const snap_t *a, const char *name_a, const snap_t *b,
                    const char *name_b, FILE *out, size_t top, int json) {
  snap_site_stat_t *va = NULL, *vb = NULL;
  size_t na = 0, nb = 0, n = 0;
  site_delta_t *d = NULL;
  uint64_t ta[T_N], tb[T_N];
  int rc = CLI_EXIT_OK;
  if (sites_by_name(a, &va, &na) != 0 || sites_by_name(b, &vb, &nb) != 0 ||
      (d = join_sites(va, na, vb, nb, &n)) == NULL) {
    fprintf(stderr, "pinpool snapshot diff: out of memory\n");
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  diff_totals(a, ta);
  diff_totals(b, tb);
  if (json) {
    if (dump_json(diff_json(name_a, name_b, ta, tb, d, n, top), out) != 0) {
      fprintf(stderr, "pinpool snapshot diff: out of memory\n");
      rc = CLI_EXIT_FAIL;
    }
  } else {
    write_diff_text(name_a, name_b, ta, tb, d, n, na, nb, top, out);
  }
out:
  free(d);
  snap_sites_free(va, na);
  snap_sites_free(vb, nb);
  return rc;
}

/* ---- the subcommands ------------------------------------------------------
 */

static void summary_usage(FILE *out) {
  fprintf(out,
          "usage: pinpool snapshot summary FILE [--top N] [--json]\n\n"
          "Segments by flag, blocks by state, rounding waste, fragmentation,\n"
          "the accounting identity, the history ring and the N allocation\n"
          "sites holding the most live bytes (default 10; 0: all).\n"
          "FILE may be '-' for standard input. Exit status: 0 success, 1\n"
          "unreadable or malformed file or an identity that does not hold,\n"
          "2 usage error.\n");
}

static void diff_usage(FILE *out) {
  fprintf(out,
          "usage: pinpool snapshot diff A B [--top N] [--json]\n\n"
          "Live bytes and blocks per allocation site in snapshots A and B,\n"
          "the N sites that grew most first (default 10; 0: all), and the\n"
          "totals (reserved, allocated, pending, cached) with their delta.\n"
          "One of A and B may be '-' for standard input. Exit status: 0\n"
          "success, 1 unreadable or malformed file, 2 usage error.\n");
}

/* Positional files and options, in any order. Returns -1 to go on, or an
 * exit code (help printed, usage error). */
static int parse_args(const char *sub, void (*usage)(FILE *), int argc,
                      char **argv, const char **files, int nfiles, size_t *top,
                      int *json) {
  int got = 0, only_files = 0;
  *top = 10;
  *json = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = NULL;
    int r;
    if (!only_files && strcmp(arg, "--") == 0) {
      only_files = 1;
      continue;
    }
    if (!only_files && arg[0] == '-' && arg[1] != '\0') {
      if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
      }
      if (strcmp(arg, "--json") == 0) {
        *json = 1;
        continue;
      }
      r = cli_option("snapshot", argc, argv, &i, "--top", &val);
      if (r < 0)
        return CLI_EXIT_USAGE;
      if (r > 0) {
        uint64_t n;
        if (cli_parse_u64("snapshot", "--top", val, 0, 1000000, &n) != 0)
          return CLI_EXIT_USAGE;
        *top = (size_t)n;
        continue;
      }
      return cli_usage_error("snapshot", "%s: unknown option '%s'", sub, arg);
    }
    if (got == nfiles)
      return cli_usage_error("snapshot", "%s: unexpected argument '%s'", sub,
                             arg);
    files[got++] = arg;
  }
  if (got < nfiles)
    return cli_usage_error("snapshot", "%s: expected %s", sub,
                           nfiles == 1 ? "a snapshot FILE"
                                       : "two snapshot files A and B");
  if (nfiles == 2 && strcmp(files[0], "-") == 0 && strcmp(files[1], "-") == 0)
    return cli_usage_error("snapshot",
                           "%s: standard input can be read once "
                           "only",
                           sub);
  return -1;
}

static int load_or_report(const char *sub, const char *path, snap_t *s) {
  char err[512];
  if (snap_load(path, s, err, sizeof err) == 0)
    return 0;
  fprintf(stderr, "pinpool snapshot %s: %s\n", sub, err);
  return -1;
}

int snap_summary_run(int argc, char **argv) {
  const char *file;
  size_t top;
  int json, rc;
  snap_t s;
  rc = parse_args("summary", summary_usage, argc, argv, &file, 1, &top, &json);
  if (rc >= 0)
    return rc;
  if (load_or_report("summary", file, &s) != 0)
    return CLI_EXIT_FAIL;
  rc = snap_summary_write(&s, strcmp(file, "-") == 0 ? "(stdin)" : file, stdout,
                          top, json);
  snap_free(&s);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "pinpool snapshot summary: cannot write the output\n");
    return CLI_EXIT_FAIL;
  }
  return rc;
}

int snap_diff_run(int argc, char **argv) {
  const char *files[2];
  size_t top;
  int json, rc;
  snap_t a, b;
  rc = parse_args("diff", diff_usage, argc, argv, files, 2, &top, &json);
  if (rc >= 0)
    return rc;
  if (load_or_report("diff", files[0], &a) != 0)
    return CLI_EXIT_FAIL;
  if (load_or_report("diff", files[1], &b) != 0) {
    snap_free(&a);
    return CLI_EXIT_FAIL;
  }
  rc = snap_diff_write(&a, strcmp(files[0], "-") == 0 ? "(stdin)" : files[0],
                       &b, strcmp(files[1], "-") == 0 ? "(stdin)" : files[1],
                       stdout, top, json);
  snap_free(&a);
  snap_free(&b);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "pinpool snapshot diff: cannot write the output\n");
    return CLI_EXIT_FAIL;
  }
  return rc;
}
