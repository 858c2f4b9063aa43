/*
 * The computations of `pinpool snapshot summary` and `diff`
 * (snapshot_summary.h): the live allocation sites, and every number of
 * the summary.
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
#include "snapshot_summarize.h"

const char *const snap_flag_names[SNAP_NFLAGS] = {"page_locked", "huge_advised",
                                                  "mlock_failed", "reserve"};

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
int snap_sites_by_name(const snap_t *s, snap_site_stat_t **out, size_t *nout) {
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
  if (snap_sites_by_name(s, out, n) != 0)
    return -1;
  if (*n > 1)
    qsort(*out, *n, sizeof **out, by_bytes);
  return 0;
}

/* ---- one pass over segments, blocks and history ------------------------- */
static void problem(snap_problems_t *p, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void problem(snap_problems_t *p, const char *fmt, ...) {
  va_list ap;
  if (p->n < SNAP_MAX_PROBLEMS) {
    va_start(ap, fmt);
    (void)vsnprintf(p->msg[p->n], sizeof p->msg[0], fmt, ap);
    va_end(ap);
  }
  p->n++;
}

void snap_read_totals(const snap_t *s, snap_totals_t *t) {
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

static void summarize_segment(const snap_t *s, size_t seg, snap_summary_t *m,
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
    for (size_t j = 0; f != NULL && j < SNAP_NFLAGS; j++)
      if (strcmp(f, snap_flag_names[j]) == 0) {
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

static void check_totals(snap_summary_t *m) {
  const snap_totals_t *t = &m->t, *r = &m->r;
  static const struct {
    const char *name;
    size_t off;
  } fields[] = {
      {"segments", offsetof(snap_totals_t, segments)},
      {"segment_bytes", offsetof(snap_totals_t, segment_bytes)},
      {"allocated_bytes", offsetof(snap_totals_t, allocated)},
      {"allocated_blocks", offsetof(snap_totals_t, allocated_blocks)},
      {"requested_bytes", offsetof(snap_totals_t, requested)},
      {"pending_bytes", offsetof(snap_totals_t, pending)},
      {"pending_blocks", offsetof(snap_totals_t, pending_blocks)},
      {"cached_blocks", offsetof(snap_totals_t, cached_blocks)},
      {"cached_bytes", offsetof(snap_totals_t, cached)},
      {"uncarved_bytes", offsetof(snap_totals_t, uncarved)},
      {"tail_bytes", offsetof(snap_totals_t, tail)},
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
static int chunk_busy(const snap_summary_t *m, uint64_t address,
                      uint64_t size) {
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
int snap_summarize(const snap_t *s, snap_summary_t *m) {
  uint64_t prev_end = 0;
  memset(m, 0, sizeof *m);
  snap_read_totals(s, &m->t);
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
