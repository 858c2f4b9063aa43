/*
 * The pickle of `pinpool snapshot torch` (snapshot_torch_pickle.h): the
 * segments, their blocks and the trace in torch's layout (new: the dict
 * of torch 2.x; old: the list of torch 1.x), through pickle.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "snapshot_torch_pickle.h"

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

static void w_segment(torch_t *t, const tv_events_t *ev, const tv_seg_t *g) {
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
  stack = tv_amap_get(&ev->seg_stack, g->address);
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

static void w_trace(torch_t *t, const tv_events_t *ev) {
  const json_t *root = t->s->root;
  uint64_t active = 0;
  pk_seq_t trace;
  trace = pk_list(t->p);
  for (size_t k = 0; k < ev->n; k++) {
    const tv_ev_t *e = &ev->v[k];
    if (!e->keep)
      continue;
    /* Sizes as PyTorch records them: what was asked for, for blocks (its
     * alloc and free entries carry the requested size). */
    switch (e->kind) {
    case TV_EV_ALLOC:
      w_trace_entry(t, &trace, N_ALLOC, e->address, e->requested, e->stream,
                    e->time_ns, e->stack);
      break;
    case TV_EV_FREE:
      w_trace_entry(t, &trace, N_FREE_REQUESTED, e->address, e->requested,
                    e->stream, e->time_ns, e->stack);
      /* fall through */
    case TV_EV_FREE_COMPLETED:
      w_trace_entry(t, &trace, N_FREE_COMPLETED, e->address, e->requested,
                    e->stream, e->time_ns, e->stack);
      break;
    case TV_EV_FREE_REQUESTED:
      w_trace_entry(t, &trace, N_FREE_REQUESTED, e->address, e->requested,
                    e->stream, e->time_ns, e->stack);
      break;
    case TV_EV_SEGMENT_ALLOC:
    case TV_EV_SEGMENT_FREE:
      w_trace_entry(t, &trace,
                    e->kind == TV_EV_SEGMENT_ALLOC ? N_SEGMENT_ALLOC
                                                   : N_SEGMENT_FREE,
                    e->address, e->size, e->stream, e->time_ns, e->stack);
      break;
    case TV_EV_OOM: /* the class size, as PyTorch's rounded size */
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

int tv_write_pickle(const snap_t *s, const tv_layout_t *lay,
                    const tv_events_t *ev, int old, FILE *f) {
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
