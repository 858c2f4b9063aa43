/*
 * `pinpool snapshot torch FILE -o OUT.pickle`: the snapshot in the layout of
 * PyTorch's torch.cuda.memory._snapshot() pickle, so that memory_viz
 * (pytorch.org/memory_viz, torch/utils/viz/MemoryViz.js) and the Python
 * tools that read such pickles show pinpool's host memory. The mapping is
 * documented in docs/snapshot-format.md ("PyTorch memory_viz"). Which
 * segments the pickle lists (the arena's chunks, or for older snapshots
 * pinpool's segments) and the blocks of each one are decided in
 * snapshot_torch_layout.c; this file encodes them and the trace.
 *
 * The pickle is written by a small serializer of our own (pickle.c, which
 * says which opcodes and why), not by Python: the tool must not need it.
 *
 * Two layouts (--layout): "new", the dict {segments, device_traces,
 * allocator_settings} of torch 2.x's _snapshot() that memory_viz and
 * torch 2's _memory_viz (trace_plot, segment_plot) read; and "old", the
 * bare list of segments of torch 1.x's memory_snapshot(), whose blocks
 * carry a "history" list, that torch 1.13's _memory_viz (stats, segments,
 * memory, compare: Debian 12's) reads. Without --layout the installed
 * torch decides (installed_layout); docs/snapshot-format.md.
 *
 * memory_viz's "Allocator State History" replays the trace backwards from
 * the segments, and stops with a script error at an event that does not fit
 * them (a free_requested of a block it does not know, a block outside every
 * segment). A snapshot of a busy pool can hold such events: block states
 * are read one by one while threads go on, and the history ring may lose
 * entries. replay() runs the viewer's rules once and leaves those events
 * out, with a note; a quiescent snapshot loses none.
 */
#define _XOPEN_SOURCE 700 /* realpath, and POSIX 2008 (mkstemp, fchmod) */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pickle.h"
#include "snapshot_load.h"
#include "snapshot_torch.h"

#define CMD "snapshot torch"

static void torch_usage(FILE *out) {
  fprintf(
      out,
      "usage: pinpool snapshot torch FILE -o OUT.pickle [--layout "
      "old|new]\n\n"
      "Write the snapshot FILE ('-' for standard input) as the pickle\n"
      "that torch.cuda.memory._snapshot() returns, for PyTorch's\n"
      "memory_viz (drag OUT.pickle onto https://pytorch.org/memory_viz)\n"
      "and torch.cuda._memory_viz. Host memory is shown as device 0.\n\n"
      "  -o, --output OUT.pickle   the file to write ('-' for standard "
      "output)\n"
      "  --layout old|new          new: the dict of torch >= 2.0\n"
      "                            (segments, device_traces); old: the\n"
      "                            list of segments of torch 1.x. Default:\n"
      "                            the installed torch's ($PINPOOL_TORCH_\n"
      "                            VERSION, else the first of\n"
      "                            $PINPOOL_PYTHON, python3, /usr/bin/\n"
      "                            python3, python that imports torch;\n"
      "                            new without torch)\n\n"
      "Exit status: 0 success, 1 unreadable or malformed input or write\n"
      "error (OUT is then left as it was), 2 usage error.\n");
}

/* ---- Address map (open addressing, linear probing) ----------------------- */

typedef struct amap {
  uint64_t *keys, *vals;
  unsigned char *used;
  size_t cap, n; /* cap: a power of two, or 0 */
} amap_t;

static size_t amap_hash(uint64_t k, size_t cap) {
  /* splitmix64's finalizer: block addresses differ only in a few bits. */
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  k ^= k >> 31;
  return (size_t)k & (cap - 1);
}

static void amap_free(amap_t *m) {
  free(m->keys);
  free(m->vals);
  free(m->used);
  memset(m, 0, sizeof *m);
}

static uint64_t *amap_get(const amap_t *m, uint64_t key) {
  if (m->cap == 0)
    return NULL;
  for (size_t i = amap_hash(key, m->cap); m->used[i];
       i = (i + 1) & (m->cap - 1))
    if (m->keys[i] == key)
      return &m->vals[i];
  return NULL;
}

static int amap_set(amap_t *m, uint64_t key, uint64_t val);

static int amap_grow(amap_t *m) {
  amap_t g = {0};
  g.cap = m->cap == 0 ? 64 : m->cap * 2;
  g.keys = malloc(g.cap * sizeof *g.keys);
  g.vals = malloc(g.cap * sizeof *g.vals);
  g.used = calloc(g.cap, 1);
  if (g.keys == NULL || g.vals == NULL || g.used == NULL) {
    amap_free(&g);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->used[i])
      (void)amap_set(&g, m->keys[i], m->vals[i]);
  amap_free(m);
  *m = g;
  return 0;
}

static int amap_set(amap_t *m, uint64_t key, uint64_t val) {
  size_t i;
  uint64_t *v = amap_get(m, key);
  if (v != NULL) {
    *v = val;
    return 0;
  }
  if ((m->n + 1) * 2 > m->cap && amap_grow(m) != 0)
    return -1;
  for (i = amap_hash(key, m->cap); m->used[i]; i = (i + 1) & (m->cap - 1))
    ;
  m->used[i] = 1;
  m->keys[i] = key;
  m->vals[i] = val;
  m->n++;
  return 0;
}

static void amap_del(amap_t *m, uint64_t key) {
  size_t mask = m->cap - 1, i, j;
  if (m->cap == 0)
    return;
  for (i = amap_hash(key, m->cap); m->used[i]; i = (i + 1) & mask)
    if (m->keys[i] == key)
      break;
  if (!m->used[i])
    return;
  /* Backward-shift deletion: no tombstones, so lookups stay short. */
  for (j = (i + 1) & mask; m->used[j]; j = (j + 1) & mask) {
    size_t h = amap_hash(m->keys[j], m->cap);
    /* Move j into the hole at i unless its home lies cyclically in (i, j]. */
    if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
      m->keys[i] = m->keys[j];
      m->vals[i] = m->vals[j];
      i = j;
    }
  }
  m->used[i] = 0;
  m->n--;
}

/* ---- Trace events -------------------------------------------------------- */

/* What one history entry becomes. EV_FREE is a free that had no separate
 * free_requested: it is written as free_requested + free_completed, the
 * pair memory_viz folds into one "free" (an unpaired free_completed would
 * be replayed as a block still waiting for its streams). */
enum {
  EV_ALLOC,
  EV_FREE_REQUESTED,
  EV_FREE_COMPLETED,
  EV_FREE,
  EV_SEGMENT_ALLOC,
  EV_SEGMENT_FREE,
  EV_OOM,
  EV_FOLDED, /* a segment event of a chunk shown inside a larger segment */
};

/* The fields used of a history entry, copied once: reading them through
 * jansson again in each pass costs more than the copy. */
typedef struct ev {
  uint64_t address, size, requested, stream, time_ns;
  int64_t stack;
  unsigned char kind, keep;
} ev_t;

typedef struct events {
  ev_t *v;
  size_t n;
  amap_t seg_stack; /* segment address -> stack of its segment_alloc */
} events_t;

static int build_events(const snap_t *s, events_t *out) {
  amap_t waiting = {0}; /* blocks with a free_requested not yet completed */
  int rc = -1;
  out->v = malloc((s->nentries > 0 ? s->nentries : 1) * sizeof *out->v);
  if (out->v == NULL)
    return -1;
  out->n = 0;
  for (size_t i = 0; i < s->nentries; i++) {
    snap_entry_t e;
    int kind;
    snap_entry(s, i, &e);
    switch (e.action) {
    case SNAP_ALLOC:
      amap_del(&waiting, e.address);
      kind = EV_ALLOC;
      break;
    case SNAP_FREE_REQUESTED:
      if (amap_set(&waiting, e.address, 1) != 0)
        goto out;
      kind = EV_FREE_REQUESTED;
      break;
    case SNAP_FREE_COMPLETED:
      if (amap_get(&waiting, e.address) != NULL) {
        amap_del(&waiting, e.address);
        kind = EV_FREE_COMPLETED;
      } else {
        kind = EV_FREE;
      }
      break;
    case SNAP_SEGMENT_ALLOC:
      /* A segment's frames are those of the allocation that created it,
       * as PyTorch reports them. */
      if (e.stack >= 0) {
        if (amap_set(&out->seg_stack, e.address, (uint64_t)e.stack) != 0)
          goto out;
      } else {
        amap_del(&out->seg_stack, e.address);
      }
      kind = EV_SEGMENT_ALLOC;
      break;
    case SNAP_SEGMENT_FREE:
      amap_del(&out->seg_stack, e.address);
      kind = EV_SEGMENT_FREE;
      break;
    case SNAP_OOM:
      kind = EV_OOM;
      break;
    default:
      /* empty_cache has no PyTorch action; the segment_free entries it
       * causes are recorded (and converted) on their own. */
      continue;
    }
    out->v[out->n++] = (ev_t){e.address, e.size,  e.requested,         e.stream,
                              e.time_ns, e.stack, (unsigned char)kind, 1};
  }
  rc = 0;
out:
  amap_free(&waiting);
  return rc;
}

/* ---- Consistency with the segments (see the top of the file) ------------- */

typedef struct rseg {
  uint64_t addr, size, nblocks; /* nblocks: live blocks inside */
} rseg_t;

typedef struct replay {
  rseg_t *segs; /* sorted by address, disjoint */
  size_t n, cap;
  amap_t blocks; /* live block address -> address of its segment */
} replay_t;

/* Index of the last segment starting at or below addr, or SIZE_MAX. */
static size_t rs_floor(const replay_t *r, uint64_t addr) {
  size_t lo = 0, hi = r->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->segs[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? SIZE_MAX : lo - 1;
}

static size_t rs_containing(const replay_t *r, uint64_t addr) {
  size_t i = rs_floor(r, addr);
  if (i != SIZE_MAX && addr - r->segs[i].addr < r->segs[i].size)
    return i;
  return SIZE_MAX;
}

/* Insert [addr, addr + size); 1 if it overlaps a segment, -1 on ENOMEM. */
static int rs_insert(replay_t *r, uint64_t addr, uint64_t size) {
  size_t i = rs_floor(r, addr), at = i == SIZE_MAX ? 0 : i + 1;
  if (size == 0 || addr + size < addr)
    return 1;
  if (i != SIZE_MAX && addr - r->segs[i].addr < r->segs[i].size)
    return 1;
  if (at < r->n && r->segs[at].addr - addr < size)
    return 1;
  if (r->n == r->cap) {
    size_t cap = r->cap == 0 ? 16 : r->cap * 2;
    rseg_t *g = realloc(r->segs, cap * sizeof *g);
    if (g == NULL)
      return -1;
    r->segs = g;
    r->cap = cap;
  }
  memmove(r->segs + at + 1, r->segs + at, (r->n - at) * sizeof *r->segs);
  r->segs[at] = (rseg_t){addr, size, 0};
  r->n++;
  return 0;
}

static int rs_add_block(replay_t *r, uint64_t addr, size_t seg) {
  if (amap_set(&r->blocks, addr, r->segs[seg].addr) != 0)
    return -1;
  r->segs[seg].nblocks++;
  return 0;
}

static void rs_remove_block(replay_t *r, uint64_t addr) {
  uint64_t *seg = amap_get(&r->blocks, addr);
  size_t i;
  if (seg == NULL)
    return;
  i = rs_floor(r, *seg);
  if (i != SIZE_MAX && r->segs[i].addr == *seg)
    r->segs[i].nblocks--;
  amap_del(&r->blocks, addr);
}

/* memory_viz cannot grow or shrink a segment: when chunks that a segment
 * crosses are shown as one (snapshot_torch_layout.c), their
 * segment_alloc and segment_free entries, and those of earlier chunks in
 * that range, are not written, and the segment is there from the start
 * of the trace. */
static void fold_segment_events(const tv_layout_t *l, events_t *ev) {
  for (size_t k = 0; k < ev->n; k++) {
    ev_t *v = &ev->v[k];
    if ((v->kind == EV_SEGMENT_ALLOC || v->kind == EV_SEGMENT_FREE) &&
        tv_in_joined(l, v->address, v->size)) {
      v->kind = EV_FOLDED;
      v->keep = 0;
    }
  }
}

/* Walk the events backwards from the segments and blocks of the snapshot,
 * as memory_viz does, and clear `keep` of each event it could not replay.
 * Returns the number left out, or -1 on ENOMEM. */
static long replay(const snap_t *s, const tv_layout_t *l, events_t *ev) {
  replay_t r = {0};
  long dropped = 0;
  for (size_t k = 0; k < l->n; k++) {
    const tv_seg_t *g = &l->v[k];
    /* tv_layout made them sorted and disjoint, so each one goes in. */
    int rc = rs_insert(&r, g->address, g->size);
    if (rc < 0)
      goto nomem;
    if (rc > 0)
      continue;
    for (size_t i = g->seg_first; i < g->seg_end; i++) {
      size_t nb = snap_segment_nblocks(s, i);
      for (size_t j = 0; j < nb; j++) {
        snap_block_t b;
        snap_block(s, i, j, &b);
        if (b.state != SNAP_CACHED && rs_add_block(&r, b.address, r.n - 1) != 0)
          goto nomem;
      }
    }
  }
  for (size_t k = ev->n; k-- > 0;) {
    ev_t *v = &ev->v[k];
    size_t i;
    if (v->kind == EV_FOLDED)
      continue;
    switch (v->kind) {
    case EV_ALLOC: /* before it, the block did not exist */
      rs_remove_block(&r, v->address);
      break;
    case EV_FREE_REQUESTED: /* the viewer marks a block it must know */
      v->keep = amap_get(&r.blocks, v->address) != NULL;
      break;
    case EV_FREE_COMPLETED:
    case EV_FREE: /* before it, the block existed, inside a segment */
      if (amap_get(&r.blocks, v->address) != NULL)
        break;
      i = rs_containing(&r, v->address);
      if (i == SIZE_MAX)
        v->keep = 0;
      else if (rs_add_block(&r, v->address, i) != 0)
        goto nomem;
      break;
    case EV_SEGMENT_ALLOC:
      /* Before it, the segment did not exist: the viewer removes the one at
       * this address (or, finding none, the last one), and must not leave
       * blocks outside every segment. */
      i = rs_floor(&r, v->address);
      if (i == SIZE_MAX || r.segs[i].addr != v->address ||
          r.segs[i].nblocks > 0) {
        v->keep = 0;
      } else {
        memmove(r.segs + i, r.segs + i + 1, (r.n - i - 1) * sizeof *r.segs);
        r.n--;
      }
      break;
    case EV_SEGMENT_FREE: {
      int rc = rs_insert(&r, v->address, v->size);
      if (rc < 0)
        goto nomem;
      v->keep = rc == 0;
      break;
    }
    default:
      break;
    }
    dropped += !v->keep;
  }
  free(r.segs);
  amap_free(&r.blocks);
  return dropped;
nomem:
  free(r.segs);
  amap_free(&r.blocks);
  return -1;
}

/* ---- The snapshot as a pickle -------------------------------------------- */

/* Strings written many times are memoized: a key costs 2 bytes after its
 * first use instead of its length plus 2. */
enum {
  N_SEGMENTS,
  N_DEVICE_TRACES,
  N_ALLOCATOR_SETTINGS,
  N_DEVICE,
  N_ADDRESS,
  N_TOTAL_SIZE,
  N_ALLOCATED_SIZE,
  N_ACTIVE_SIZE,
  N_REQUESTED_SIZE,
  N_STREAM,
  N_SEGMENT_TYPE,
  N_SEGMENT_POOL_ID,
  N_IS_EXPANDABLE,
  N_FRAMES,
  N_BLOCKS,
  N_SIZE,
  N_STATE,
  N_FILENAME,
  N_LINE,
  N_NAME,
  N_ACTION,
  N_ADDR,
  N_TIME_US,
  N_DEVICE_FREE,
  N_COMPILE_CONTEXT,
  N_USER_METADATA,
  N_SMALL,
  N_LARGE,
  N_ACTIVE_ALLOCATED,
  N_ACTIVE_PENDING_FREE,
  N_INACTIVE,
  N_ALLOC,
  N_FREE_REQUESTED,
  N_FREE_COMPLETED,
  N_SEGMENT_ALLOC,
  N_SEGMENT_FREE,
  N_OOM,
  N_SNAPSHOT,
  N_NA,
  N_EMPTY,
  N_UNKNOWN,
  N_HISTORY,
  N_REAL_SIZE,
  N_COUNT
};

static const char *const names[N_COUNT] = {
    [N_SEGMENTS] = "segments",
    [N_DEVICE_TRACES] = "device_traces",
    [N_ALLOCATOR_SETTINGS] = "allocator_settings",
    [N_DEVICE] = "device",
    [N_ADDRESS] = "address",
    [N_TOTAL_SIZE] = "total_size",
    [N_ALLOCATED_SIZE] = "allocated_size",
    [N_ACTIVE_SIZE] = "active_size",
    [N_REQUESTED_SIZE] = "requested_size",
    [N_STREAM] = "stream",
    [N_SEGMENT_TYPE] = "segment_type",
    [N_SEGMENT_POOL_ID] = "segment_pool_id",
    [N_IS_EXPANDABLE] = "is_expandable",
    [N_FRAMES] = "frames",
    [N_BLOCKS] = "blocks",
    [N_SIZE] = "size",
    [N_STATE] = "state",
    [N_FILENAME] = "filename",
    [N_LINE] = "line",
    [N_NAME] = "name",
    [N_ACTION] = "action",
    [N_ADDR] = "addr",
    [N_TIME_US] = "time_us",
    [N_DEVICE_FREE] = "device_free",
    [N_COMPILE_CONTEXT] = "compile_context",
    [N_USER_METADATA] = "user_metadata",
    [N_SMALL] = "small",
    [N_LARGE] = "large",
    [N_ACTIVE_ALLOCATED] = "active_allocated",
    [N_ACTIVE_PENDING_FREE] = "active_pending_free",
    [N_INACTIVE] = "inactive",
    [N_ALLOC] = "alloc",
    [N_FREE_REQUESTED] = "free_requested",
    [N_FREE_COMPLETED] = "free_completed",
    [N_SEGMENT_ALLOC] = "segment_alloc",
    [N_SEGMENT_FREE] = "segment_free",
    [N_OOM] = "oom",
    [N_SNAPSHOT] = "snapshot",
    [N_NA] = "N/A",
    [N_EMPTY] = "",
    [N_UNKNOWN] = "??",
    [N_HISTORY] = "history",
    [N_REAL_SIZE] = "real_size",
};

/* PyTorch's small pool holds blocks of at most 1 MiB (in 2 MiB segments);
 * pinpool's size classes up to 1 MiB play the same part. */
#define SMALL_BLOCK_MAX (UINT64_C(1) << 20)

typedef struct torch {
  const snap_t *s;
  pk_t *p;
  int old;                     /* --layout old: torch 1.x's list */
  uint32_t name_memo[N_COUNT]; /* memo index + 1; 0: not written yet */
  uint32_t *frame_memo;        /* per frame, the same */
  uint32_t *stack_memo;        /* per stack: its frames list */
  uint32_t empty_memo;         /* the empty frames list */
} torch_t;

static void w_name(torch_t *t, int k) {
  if (t->name_memo[k] != 0) {
    pk_get(t->p, t->name_memo[k] - 1);
    return;
  }
  pk_str(t->p, names[k]);
  t->name_memo[k] = pk_put(t->p) + 1;
}

/* Key k and an integer value, inside a dict. */
static void w_kv_uint(torch_t *t, pk_seq_t *d, int k, uint64_t v) {
  pk_item(t->p, d);
  w_name(t, k);
  pk_uint(t->p, v);
}

static void w_kv_name(torch_t *t, pk_seq_t *d, int k, int v) {
  pk_item(t->p, d);
  w_name(t, k);
  w_name(t, v);
}

/* {filename, line, name}; memory_viz prints "filename:line:name". */
static void w_frame(torch_t *t, size_t fi) {
  snap_frame_t f;
  pk_seq_t d;
  char hex[24];
  if (t->frame_memo[fi] != 0) {
    pk_get(t->p, t->frame_memo[fi] - 1);
    return;
  }
  snap_frame(t->s, fi, &f);
  d = pk_dict(t->p);
  t->frame_memo[fi] = pk_put(t->p) + 1;
  pk_item(t->p, &d);
  w_name(t, N_FILENAME);
  if (f.file != NULL)
    pk_str(t->p, f.file);
  else if (f.module != NULL)
    pk_str(t->p, f.module);
  else
    w_name(t, N_UNKNOWN);
  w_kv_uint(t, &d, N_LINE, f.line >= 0 ? (uint64_t)f.line : 0);
  pk_item(t->p, &d);
  w_name(t, N_NAME);
  if (f.function != NULL) {
    pk_str(t->p, f.function);
  } else {
    /* The return address can still be looked up (addr2line). */
    snprintf(hex, sizeof hex, "0x%" PRIx64, f.address);
    pk_str(t->p, hex);
  }
  pk_end(t->p, &d);
}

/* The frames list of a stack (innermost first in both formats), written
 * once per stack and then referred to. */
static void w_frames(torch_t *t, int64_t stack) {
  size_t n = snap_stack_len(t->s, stack);
  pk_seq_t l;
  if (n == 0) {
    if (t->empty_memo != 0) {
      pk_get(t->p, t->empty_memo - 1);
    } else {
      (void)pk_list(t->p);
      t->empty_memo = pk_put(t->p) + 1;
    }
    return;
  }
  if (t->stack_memo[stack] != 0) {
    pk_get(t->p, t->stack_memo[stack] - 1);
    return;
  }
  l = pk_list(t->p);
  t->stack_memo[stack] = pk_put(t->p) + 1;
  for (size_t j = 0; j < n; j++) {
    pk_item(t->p, &l);
    w_frame(t, snap_stack_frame(t->s, stack, j));
  }
  pk_end(t->p, &l);
}

static void w_block(torch_t *t, pk_seq_t *blocks, const tv_block_t *b) {
  pk_seq_t d;
  pk_item(t->p, blocks);
  d = pk_dict(t->p);
  w_kv_uint(t, &d, N_ADDRESS, b->address);
  w_kv_uint(t, &d, N_SIZE, b->size);
  w_kv_uint(t, &d, N_REQUESTED_SIZE, b->requested);
  w_kv_name(t, &d, N_STATE,
            b->state == SNAP_ALLOCATED ? N_ACTIVE_ALLOCATED
            : b->state == SNAP_PENDING ? N_ACTIVE_PENDING_FREE
                                       : N_INACTIVE);
  pk_item(t->p, &d);
  w_name(t, N_FRAMES);
  w_frames(t, b->stack);
  if (t->old && b->state != SNAP_CACHED) {
    /* torch 1.x: who allocated the block, as a one-entry history. */
    pk_seq_t h, e;
    pk_item(t->p, &d);
    w_name(t, N_HISTORY);
    h = pk_list(t->p);
    pk_item(t->p, &h);
    e = pk_dict(t->p);
    w_kv_uint(t, &e, N_ADDR, b->address);
    w_kv_uint(t, &e, N_REAL_SIZE, b->requested);
    pk_item(t->p, &e);
    w_name(t, N_FRAMES);
    w_frames(t, b->stack);
    pk_end(t->p, &e);
    pk_end(t->p, &h);
  }
  pk_end(t->p, &d);
}

/* The sums of a segment's active blocks (as PyTorch's segment fields). */
typedef struct seg_sums {
  uint64_t allocated, active, requested;
} seg_sums_t;

static void sum_block(void *ctx, const tv_block_t *b) {
  seg_sums_t *m = ctx;
  if (b->state == SNAP_CACHED)
    return;
  if (b->state == SNAP_ALLOCATED)
    m->allocated += b->size;
  m->active += b->size;
  m->requested += b->requested;
}

typedef struct block_out {
  torch_t *t;
  pk_seq_t *blocks;
} block_out_t;

static void put_block(void *ctx, const tv_block_t *b) {
  block_out_t *o = ctx;
  w_block(o->t, o->blocks, b);
}

static void w_segment(torch_t *t, const events_t *ev, const tv_seg_t *g) {
  seg_sums_t m = {0, 0, 0};
  uint64_t *stack;
  pk_seq_t d, blocks;

  /* The sums come before the blocks in the dict (PyTorch's key order). */
  tv_blocks(t->s, g, sum_block, &m);
  d = pk_dict(t->p);
  w_kv_uint(t, &d, N_DEVICE, 0);
  w_kv_uint(t, &d, N_ADDRESS, g->address);
  w_kv_uint(t, &d, N_TOTAL_SIZE, g->size);
  w_kv_uint(t, &d, N_ALLOCATED_SIZE, m.allocated);
  w_kv_uint(t, &d, N_ACTIVE_SIZE, m.active);
  w_kv_uint(t, &d, N_REQUESTED_SIZE, m.requested);
  w_kv_uint(t, &d, N_STREAM, 0);
  /* A chunk holding no segment is "large", like PyTorch's segments that
   * large blocks are split from. */
  w_kv_name(t, &d, N_SEGMENT_TYPE,
            g->max_block_size > 0 && g->max_block_size <= SMALL_BLOCK_MAX
                ? N_SMALL
                : N_LARGE);
  pk_item(t->p, &d);
  w_name(t, N_SEGMENT_POOL_ID);
  pk_uint(t->p, 0);
  pk_uint(t->p, 0);
  pk_op(t->p, OP_TUPLE2);
  pk_item(t->p, &d);
  w_name(t, N_IS_EXPANDABLE);
  pk_op(t->p, OP_NEWFALSE);
  pk_item(t->p, &d);
  w_name(t, N_FRAMES);
  stack = amap_get(&ev->seg_stack, g->address);
  w_frames(t, stack != NULL ? (int64_t)*stack : -1);

  /* Blocks end to end from the segment's address, their sizes adding up
   * to total_size (snapshot_torch_layout.c). */
  pk_item(t->p, &d);
  w_name(t, N_BLOCKS);
  blocks = pk_list(t->p);
  tv_blocks(t->s, g, put_block, &(block_out_t){t, &blocks});
  pk_end(t->p, &blocks);
  pk_end(t->p, &d);
}

static void w_trace_entry(torch_t *t, pk_seq_t *trace, int action,
                          uint64_t addr, uint64_t size, uint64_t stream,
                          uint64_t time_ns, int64_t stack) {
  pk_seq_t d;
  pk_item(t->p, trace);
  d = pk_dict(t->p);
  w_kv_name(t, &d, N_ACTION, action);
  /* PyTorch stores the free device memory in an oom entry instead of an
   * address; pinpool does not know it (0). */
  w_kv_uint(t, &d, action == N_OOM ? N_DEVICE_FREE : N_ADDR,
            action == N_OOM ? 0 : addr);
  w_kv_uint(t, &d, N_SIZE, size);
  w_kv_uint(t, &d, N_STREAM, stream);
  w_kv_uint(t, &d, N_TIME_US, time_ns / 1000);
  pk_item(t->p, &d);
  w_name(t, N_FRAMES);
  w_frames(t, stack);
  w_kv_name(t, &d, N_COMPILE_CONTEXT, N_NA);
  w_kv_name(t, &d, N_USER_METADATA, N_EMPTY);
  pk_end(t->p, &d);
}

static void w_trace(torch_t *t, const events_t *ev) {
  const json_t *root = t->s->root;
  uint64_t active = 0;
  pk_seq_t trace;
  trace = pk_list(t->p);
  for (size_t k = 0; k < ev->n; k++) {
    const ev_t *e = &ev->v[k];
    if (!e->keep)
      continue;
    /* Sizes as PyTorch records them: what was asked for, for blocks (its
     * alloc and free entries carry the requested size). */
    switch (e->kind) {
    case EV_ALLOC:
      w_trace_entry(t, &trace, N_ALLOC, e->address, e->requested, e->stream,
                    e->time_ns, e->stack);
      break;
    case EV_FREE:
      w_trace_entry(t, &trace, N_FREE_REQUESTED, e->address, e->requested,
                    e->stream, e->time_ns, e->stack);
      /* fall through */
    case EV_FREE_COMPLETED:
      w_trace_entry(t, &trace, N_FREE_COMPLETED, e->address, e->requested,
                    e->stream, e->time_ns, e->stack);
      break;
    case EV_FREE_REQUESTED:
      w_trace_entry(t, &trace, N_FREE_REQUESTED, e->address, e->requested,
                    e->stream, e->time_ns, e->stack);
      break;
    case EV_SEGMENT_ALLOC:
    case EV_SEGMENT_FREE:
      w_trace_entry(t, &trace,
                    e->kind == EV_SEGMENT_ALLOC ? N_SEGMENT_ALLOC
                                                : N_SEGMENT_FREE,
                    e->address, e->size, e->stream, e->time_ns, e->stack);
      break;
    case EV_OOM: /* the class size, as PyTorch's rounded size */
      w_trace_entry(t, &trace, N_OOM, 0, e->size, e->stream, e->time_ns,
                    e->stack);
      break;
    default:
      break;
    }
  }
  /* PyTorch's snapshot() ends the trace with a "snapshot" entry whose size
   * is the active bytes. */
  for (size_t i = 0; i < t->s->nsegments; i++) {
    const json_t *seg = snap_segment(t->s, i);
    uint64_t bsize = snap_u64(seg, "block_size");
    size_t nb = snap_segment_nblocks(t->s, i);
    for (size_t j = 0; j < nb; j++) {
      snap_block_t b;
      snap_block(t->s, i, j, &b);
      if (b.state != SNAP_CACHED)
        active += bsize;
    }
  }
  w_trace_entry(t, &trace, N_SNAPSHOT, 0, active, 0, snap_u64(root, "time_ns"),
                -1);
  pk_end(t->p, &trace);
}

static int write_pickle(const snap_t *s, const tv_layout_t *lay,
                        const events_t *ev, int old, FILE *f) {
  torch_t t = {0};
  pk_seq_t top, l;
  const json_t *root = s->root;
  int rc = -1;

  t.s = s;
  t.old = old;
  t.p = malloc(sizeof *t.p);
  t.frame_memo = calloc(s->nframes + 1, sizeof *t.frame_memo);
  t.stack_memo = calloc(s->nstacks + 1, sizeof *t.stack_memo);
  if (t.p == NULL || t.frame_memo == NULL || t.stack_memo == NULL) {
    errno = ENOMEM;
    goto out;
  }
  t.p->f = f;
  t.p->failed = 0;
  t.p->err = 0;
  t.p->memo_next = 0;
  t.p->len = 0;

  pk_op_le(t.p, OP_PROTO, 4, 1);
  if (old) {
    /* torch 1.x's memory_snapshot(): the segments, nothing else. */
    l = pk_list(t.p);
    for (size_t k = 0; k < lay->n; k++) {
      pk_item(t.p, &l);
      w_segment(&t, ev, &lay->v[k]);
    }
    pk_end(t.p, &l);
    goto stop;
  }
  top = pk_dict(t.p);

  pk_item(t.p, &top);
  w_name(&t, N_SEGMENTS);
  l = pk_list(t.p);
  for (size_t k = 0; k < lay->n; k++) {
    pk_item(t.p, &l);
    w_segment(&t, ev, &lay->v[k]);
  }
  pk_end(t.p, &l);

  /* One trace per device; the host is device 0. */
  pk_item(t.p, &top);
  w_name(&t, N_DEVICE_TRACES);
  l = pk_list(t.p);
  pk_item(t.p, &l);
  w_trace(&t, ev);
  pk_end(t.p, &l);

  /* PyTorch's keys here describe its CUDA allocator; pinpool's own
   * settings tell the reader more than made-up values would. */
  pk_item(t.p, &top);
  w_name(&t, N_ALLOCATOR_SETTINGS);
  l = pk_dict(t.p);
  {
    static const char *const keys[] = {"pinpool_version", "backend", "config"};
    pk_item(t.p, &l);
    pk_str(t.p, "allocator");
    pk_str(t.p, "pinpool");
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      pk_item(t.p, &l);
      pk_str(t.p, keys[k]);
      pk_str(t.p, json_string_value(json_object_get(root, keys[k])));
    }
  }
  pk_end(t.p, &l);
  pk_end(t.p, &top);
stop:
  pk_op(t.p, OP_STOP);
  pk_flush(t.p);
  if (t.p->failed) {
    errno = t.p->err;
    goto out;
  }
  rc = 0;
out:
  free(t.p);
  free(t.frame_memo);
  free(t.stack_memo);
  return rc;
}

/* ---- The command --------------------------------------------------------- */

/* How long an interpreter may take to answer (importing torch takes a
 * second or two, more on a loaded machine); one that has not answered by
 * then is killed and taken for one without torch. $PINPOOL_PYTHON_TIMEOUT
 * (seconds, 0.1 to 600) sets another. */
#define PROBE_TIMEOUT_MS 15000

static long long probe_timeout_ms(void) {
  const char *e = getenv("PINPOOL_PYTHON_TIMEOUT");
  if (e == NULL || e[0] == '\0')
    return PROBE_TIMEOUT_MS;
  char *end;
  double v = strtod(e, &end);
  if (*end != '\0' || !(v >= 0.1 && v <= 600))
    return PROBE_TIMEOUT_MS;
  return (long long)(v * 1000);
}

static long long now_ms(void) {
  struct timespec ts;
  (void)clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What `py -c 'import torch; print(torch.__version__)'` prints, into ver
 * (ver[0] == '\0' when py is missing, fails, has no torch, or does not
 * answer within PROBE_TIMEOUT_MS). Reading stops at the answer's line; the
 * child is reaped, killed if it is still running at the deadline (the
 * review of issue 41: an interpreter that hung made the command hang). */
static void ask_torch_version(const char *py, char *ver, size_t len) {
  ver[0] = '\0';
  int fds[2];
  if (pipe(fds) != 0)
    return;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char *argv[] = {(char *)py, "-c", "import torch; print(torch.__version__)",
                  NULL};
  extern char **environ;
  pid_t pid;
  /* Its own process group: a hung one is killed with what it started. */
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  int spawned = posix_spawnp(&pid, py, &fa, &at, argv, environ) == 0;
  posix_spawnattr_destroy(&at);
  posix_spawn_file_actions_destroy(&fa);
  (void)close(fds[1]);
  long long deadline = now_ms() + probe_timeout_ms();
  size_t n = 0;
  int answered = 0;
  while (spawned && !answered && n + 1 < len) {
    long long left = deadline - now_ms();
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int pr = left > 0 ? poll(&pfd, 1, (int)left) : 0;
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      break; /* timed out (or poll failed) */
    ssize_t r = read(fds[0], ver + n, len - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break; /* EOF: the child closed its output */
    answered = memchr(ver + n, '\n', (size_t)r) != NULL;
    n += (size_t)r;
  }
  ver[n] = '\0';
  (void)close(fds[0]);
  int status = 0, reaped = 0;
  while (spawned && !reaped) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) {
      reaped = w == pid;
      break;
    }
    if (now_ms() >= deadline) {
      (void)kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
      break;
    }
    struct timespec tick = {0, 10 * 1000 * 1000};
    (void)nanosleep(&tick, NULL);
  }
  if (!reaped || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !answered ||
      ver[0] < '0' || ver[0] > '9')
    ver[0] = '\0'; /* no torch there */
}

/* The layout the installed torch reads: 1 (old) for torch 1.x, 0 (new)
 * for 2.x and later, and for no torch (memory_viz, the web page, reads
 * the new). The version is $PINPOOL_TORCH_VERSION if set, else the first
 * that one of these interpreters reports: $PINPOOL_PYTHON (`python3 -m
 * pinpool` sets it to its own), python3 on PATH, /usr/bin/python3, python.
 * More than one is asked because python3 on PATH is often not the one
 * with torch (a pyenv or virtual environment shim in front of the
 * system's python3-torch, issue 41): the first interpreter that imports
 * torch is the one a user can run `-m torch.cuda._memory_viz` with.
 * *source says which. */
static int installed_layout(const char **source) {
  static const char *const fallback[] = {"python3", "/usr/bin/python3",
                                         "python"};
  static char said[300];
  char ver[64] = "";
  const char *env = getenv("PINPOOL_TORCH_VERSION");
  if (env != NULL && env[0] != '\0') {
    snprintf(ver, sizeof ver, "%s", env);
    *source = "PINPOOL_TORCH_VERSION";
  } else {
    const char *py = getenv("PINPOOL_PYTHON");
    if (py != NULL && py[0] != '\0')
      ask_torch_version(py, ver, sizeof ver);
    for (size_t i = 0; ver[0] == '\0' && i < sizeof fallback / sizeof *fallback;
         i++)
      ask_torch_version(py = fallback[i], ver, sizeof ver);
    if (ver[0] == '\0')
      return 0; /* no torch anywhere: the web page's layout */
    snprintf(said, sizeof said, "%s -c 'import torch'", py);
    *source = said;
  }
  long major = strtol(ver, NULL, 10);
  return major == 1 || (major == 0 && ver[0] == '0');
}

/* Where the pickle goes: a temporary file next to OUT, renamed over it once
 * complete, so that OUT is never a truncated pickle and a failed run leaves
 * an existing OUT as it was. Standard output ("-") and files that are not
 * regular (a pipe, /dev/stdout) are written directly. */
typedef struct output {
  FILE *f;
  char *path; /* what the temporary file replaces (OUT, or its link target) */
  char *tmp;  /* NULL when writing directly */
  int is_stdout;
} output_t;

static int output_open(const char *out, output_t *o) {
  struct stat st;
  size_t len;
  int fd;
  memset(o, 0, sizeof *o);
  if (strcmp(out, "-") == 0) {
    o->f = stdout;
    o->is_stdout = 1;
    return 0;
  }
  if (stat(out, &st) == 0 && !S_ISREG(st.st_mode)) {
    o->f = fopen(out, "wb");
    return o->f != NULL ? 0 : -1;
  }
  /* Through a symbolic link the file it names is replaced, not the link. */
  o->path = realpath(out, NULL);
  if (o->path == NULL)
    o->path = strdup(out);
  len = o->path != NULL ? strlen(o->path) + sizeof ".XXXXXX" : 0;
  if (o->path == NULL || (o->tmp = malloc(len)) == NULL) {
    free(o->path);
    errno = ENOMEM;
    return -1;
  }
  snprintf(o->tmp, len, "%s.XXXXXX", o->path);
  fd = mkstemp(o->tmp);
  if (fd >= 0) {
    /* mkstemp creates the file 0600; OUT gets the usual permissions. */
    mode_t mask = umask(0);
    (void)umask(mask);
    (void)fchmod(fd, (mode_t)0666 & ~mask);
    o->f = fdopen(fd, "wb");
    if (o->f != NULL)
      return 0;
    int e = errno;
    (void)close(fd);
    (void)unlink(o->tmp);
    errno = e;
  }
  free(o->tmp);
  free(o->path);
  return -1;
}

/* Close the output; commit it when ok. Returns 0, or -1 with errno. */
static int output_close(output_t *o, int ok) {
  int rc = ok ? 0 : -1, e = errno;
  /* A full disk often shows only at the flush or the close. */
  if (fflush(o->f) != 0 || ferror(o->f)) {
    if (rc == 0)
      e = errno != 0 ? errno : EIO;
    rc = -1;
  }
  if (!o->is_stdout && fclose(o->f) != 0 && rc == 0) {
    e = errno;
    rc = -1;
  }
  if (o->tmp != NULL) {
    if (rc == 0 && rename(o->tmp, o->path) != 0) {
      e = errno;
      rc = -1;
    }
    if (rc != 0)
      (void)unlink(o->tmp);
    free(o->tmp);
    free(o->path);
  }
  errno = e;
  return rc;
}

int snap_torch_run(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *name;
  char err[512];
  snap_t snap;
  events_t ev = {0};
  tv_layout_t lay = {0};
  output_t o;
  long dropped;
  int rc;

  /* --layout is this command's own: taken out before the common ones. */
  int layout = -1; /* 0 new, 1 old, -1 the installed torch's */
  char **rest = malloc(sizeof *rest * (size_t)(argc + 1));
  int nrest = 0;
  if (rest == NULL) {
    fprintf(stderr, "pinpool " CMD ": %s\n", strerror(ENOMEM));
    return CLI_EXIT_FAIL;
  }
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    int r = i > 0 ? cli_option(CMD, argc, argv, &i, "--layout", &v) : 0;
    if (r < 0) {
      free(rest);
      return CLI_EXIT_USAGE;
    }
    if (r == 0) {
      rest[nrest++] = argv[i];
      continue;
    }
    if (layout != -1 || (strcmp(v, "old") != 0 && strcmp(v, "new") != 0)) {
      free(rest);
      return cli_usage_error(CMD, layout != -1 ? "--layout given twice"
                                               : "--layout must be old or new");
    }
    layout = strcmp(v, "old") == 0;
  }
  rest[nrest] = NULL;
  int args =
      snap_convert_args(CMD, nrest, rest, torch_usage, "OUT.pickle", &in, &out);
  free(rest);
  if (args >= 0)
    return args;
  const char *source = "--layout";
  if (layout < 0)
    layout = installed_layout(&source);

  /* Everything is checked and prepared before OUT is touched. */
  if (snap_load(in, &snap, err, sizeof err) != 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", err);
    return CLI_EXIT_FAIL;
  }
  name = strcmp(in, "-") == 0 ? "(stdin)" : in;
  if (tv_layout(&snap, name, &lay, err, sizeof err) != 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", err);
    snap_free(&snap);
    return CLI_EXIT_FAIL;
  }
  dropped = -1;
  if (build_events(&snap, &ev) == 0) {
    fold_segment_events(&lay, &ev);
    dropped = replay(&snap, &lay, &ev);
  }
  if (dropped < 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", strerror(ENOMEM));
    rc = CLI_EXIT_FAIL;
    goto done;
  }

  if (output_open(out, &o) != 0) {
    fprintf(stderr, "pinpool " CMD ": cannot create %s: %s\n", out,
            strerror(errno));
    rc = CLI_EXIT_FAIL;
    goto done;
  }
  errno = 0;
  rc = write_pickle(&snap, &lay, &ev, layout, o.f);
  if (output_close(&o, rc == 0) != 0) {
    fprintf(stderr, "pinpool " CMD ": writing %s failed%s%s\n",
            o.is_stdout ? "standard output" : out, errno ? ": " : "",
            errno ? strerror(errno) : "");
    rc = CLI_EXIT_FAIL;
    goto done;
  }
  if (lay.note[0] != '\0')
    fprintf(stderr, "pinpool " CMD ": note: %s: %s\n", name, lay.note);
  /* The old layout is the exception: say why it was chosen. */
  if (layout && strcmp(source, "--layout") != 0)
    fprintf(stderr,
            "pinpool " CMD ": note: the old layout, a list of segments "
            "(torch 1.x, as %s says; --layout old|new to choose)\n",
            source);
  if (dropped > 0)
    fprintf(stderr,
            "pinpool " CMD ": note: %ld of %zu history entries left out: "
            "they do not fit the block states of %s (a snapshot taken while "
            "the pool was busy, or entries lost from the ring), and "
            "memory_viz would stop at them\n",
            dropped, ev.n, name);
  rc = CLI_EXIT_OK;
done:
  free(ev.v);
  amap_free(&ev.seg_stack);
  tv_layout_free(&lay);
  snap_free(&snap);
  return rc;
}
