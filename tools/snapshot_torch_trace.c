/*
 * The trace of `pinpool snapshot torch` (snapshot_torch_trace.h): the
 * history entries as memory_viz's events, and the replay of them against
 * the segments (the top of snapshot_torch.c says why some are left out).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_torch_trace.h"

/* ---- Address map (open addressing, linear probing) ----------------------- */

static size_t amap_hash(uint64_t k, size_t cap) {
  /* splitmix64's finalizer: block addresses differ only in a few bits. */
  k ^= k >> 30;
  k *= 0xbf58476d1ce4e5b9ull;
  k ^= k >> 27;
  k *= 0x94d049bb133111ebull;
  k ^= k >> 31;
  return (size_t)k & (cap - 1);
}

void tv_amap_free(tv_amap_t *m) {
  free(m->keys);
  free(m->vals);
  free(m->used);
  memset(m, 0, sizeof *m);
}

uint64_t *tv_amap_get(const tv_amap_t *m, uint64_t key) {
  if (m->cap == 0)
    return NULL;
  for (size_t i = amap_hash(key, m->cap); m->used[i];
       i = (i + 1) & (m->cap - 1))
    if (m->keys[i] == key)
      return &m->vals[i];
  return NULL;
}

static int amap_set(tv_amap_t *m, uint64_t key, uint64_t val);

static int amap_grow(tv_amap_t *m) {
  tv_amap_t g = {0};
  g.cap = m->cap == 0 ? 64 : m->cap * 2;
  g.keys = malloc(g.cap * sizeof *g.keys);
  g.vals = malloc(g.cap * sizeof *g.vals);
  g.used = calloc(g.cap, 1);
  if (g.keys == NULL || g.vals == NULL || g.used == NULL) {
    tv_amap_free(&g);
    return -1;
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->used[i])
      (void)amap_set(&g, m->keys[i], m->vals[i]);
  tv_amap_free(m);
  *m = g;
  return 0;
}

static int amap_set(tv_amap_t *m, uint64_t key, uint64_t val) {
  size_t i;
  uint64_t *v = tv_amap_get(m, key);
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

static void amap_del(tv_amap_t *m, uint64_t key) {
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

int tv_build_events(const snap_t *s, tv_events_t *out) {
  tv_amap_t waiting = {0}; /* blocks with a free_requested not yet completed */
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
      kind = TV_EV_ALLOC;
      break;
    case SNAP_FREE_REQUESTED:
      if (amap_set(&waiting, e.address, 1) != 0)
        goto out;
      kind = TV_EV_FREE_REQUESTED;
      break;
    case SNAP_FREE_COMPLETED:
      if (tv_amap_get(&waiting, e.address) != NULL) {
        amap_del(&waiting, e.address);
        kind = TV_EV_FREE_COMPLETED;
      } else {
        kind = TV_EV_FREE;
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
      kind = TV_EV_SEGMENT_ALLOC;
      break;
    case SNAP_SEGMENT_FREE:
      amap_del(&out->seg_stack, e.address);
      kind = TV_EV_SEGMENT_FREE;
      break;
    case SNAP_OOM:
      kind = TV_EV_OOM;
      break;
    default:
      /* empty_cache has no PyTorch action; the segment_free entries it
       * causes are recorded (and converted) on their own. */
      continue;
    }
    out->v[out->n++] =
        (tv_ev_t){e.address, e.size,  e.requested,         e.stream,
                  e.time_ns, e.stack, (unsigned char)kind, 1};
  }
  rc = 0;
out:
  tv_amap_free(&waiting);
  return rc;
}

/* ---- Consistency with the segments (see the top of the file) ------------- */

typedef struct rseg {
  uint64_t addr, size, nblocks; /* nblocks: live blocks inside */
} rseg_t;

typedef struct replay {
  rseg_t *segs; /* sorted by address, disjoint */
  size_t n, cap;
  tv_amap_t blocks; /* live block address -> address of its segment */
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
  uint64_t *seg = tv_amap_get(&r->blocks, addr);
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
void tv_fold_segment_events(const tv_layout_t *l, tv_events_t *ev) {
  for (size_t k = 0; k < ev->n; k++) {
    tv_ev_t *v = &ev->v[k];
    if ((v->kind == TV_EV_SEGMENT_ALLOC || v->kind == TV_EV_SEGMENT_FREE) &&
        tv_in_joined(l, v->address, v->size)) {
      v->kind = TV_EV_FOLDED;
      v->keep = 0;
    }
  }
}

/* Walk the events backwards from the segments and blocks of the snapshot,
 * as memory_viz does, and clear `keep` of each event it could not replay.
 * Returns the number left out, or -1 on ENOMEM. */
long tv_replay(const snap_t *s, const tv_layout_t *l, tv_events_t *ev) {
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
    tv_ev_t *v = &ev->v[k];
    size_t i;
    if (v->kind == TV_EV_FOLDED)
      continue;
    switch (v->kind) {
    case TV_EV_ALLOC: /* before it, the block did not exist */
      rs_remove_block(&r, v->address);
      break;
    case TV_EV_FREE_REQUESTED: /* the viewer marks a block it must know */
      v->keep = tv_amap_get(&r.blocks, v->address) != NULL;
      break;
    case TV_EV_FREE_COMPLETED:
    case TV_EV_FREE: /* before it, the block existed, inside a segment */
      if (tv_amap_get(&r.blocks, v->address) != NULL)
        break;
      i = rs_containing(&r, v->address);
      if (i == SIZE_MAX)
        v->keep = 0;
      else if (rs_add_block(&r, v->address, i) != 0)
        goto nomem;
      break;
    case TV_EV_SEGMENT_ALLOC:
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
    case TV_EV_SEGMENT_FREE: {
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
  tv_amap_free(&r.blocks);
  return dropped;
nomem:
  free(r.segs);
  tv_amap_free(&r.blocks);
  return -1;
}
