/*
 * The arena's chunks in snapshots (docs/snapshot-format.md, `chunks`),
 * checked by snapcheck_chunks (snapcheck.h):
 *   - quiescent_pools: real pools of several configurations (host chunks
 *     that join into runs, malloc chunks that never do, a reserve, two
 *     fake NUMA nodes, huge pages), with slabs and large blocks, after
 *     frees, thread flushes and empty_cache, and after threads allocated
 *     and joined: in every snapshot the segments and free ranges tile the
 *     chunks and the stats' arena fields agree;
 *   - example: the hand-written tests/snapshot/example_chunks.json (a
 *     segment crossing two chunks of a run, a chunk all free) passes;
 *   - corrupted: hand-made damage to that file and to a real snapshot
 *     (a free range overlapping a segment, a missing gap, a segment in no
 *     chunk, a run broken under a crossing segment, free ranges not
 *     coalesced, stats that disagree...) each fails, for the reason
 *     expected; those that break only the layout pass plain snapcheck,
 *     so it is the new check that catches them;
 *   - one_hold: a large block carved and another given back just before
 *     the snapshot copies its segments (the test hook): the chunks and the
 *     segments it reports still tile, because both are copied after that
 *     point, in one hold of seg_lock for a pool this small (with the chunks
 *     copied before that point, as they were, the new block overlaps a
 *     free range and the old one leaves a gap);
 *   - pieces: a pool whose copy takes several holds (issue 38), changed
 *     between every two of them: nothing listed twice (snapcheck_disjoint).
 * usage: test_snapshot_chunks EXAMPLE_CHUNKS.json
 */
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* the test hook, the snapshot's cursor */
#include "snapshot/snapcheck.h"

static const char *example_path;

typedef unsigned long long ull;

static char *take(pinpool_t *pool, size_t *len) {
  char *text = NULL;
  PP_OK(pinpool_snapshot_write_mem(pool, &text, len, 0));
  return text;
}

/* What the quiescent snapshots covered, over all of them. */
typedef struct seen {
  uint64_t snapshots, chunks_max, free_ranges, crossing, joined;
  uint64_t busy_chunks; /* chunks holding two segments or more */
} seen_t;

static void count_busy_chunks(const char *text, size_t len, seen_t *s) {
  json_t *root = json_loadb(text, len, 0, NULL), *c, *g;
  size_t i, j;
  json_array_foreach(json_object_get(root, "chunks"), i, c) {
    uint64_t a = (uint64_t)json_integer_value(json_object_get(c, "address"));
    uint64_t e = a + (uint64_t)json_integer_value(json_object_get(c, "size"));
    int n = 0;
    json_array_foreach(json_object_get(root, "segments"), j, g) {
      uint64_t sa = (uint64_t)json_integer_value(json_object_get(g, "address"));
      n += sa >= a && sa < e;
    }
    s->busy_chunks += n >= 2;
  }
  json_decref(root);
}

static void check_quiescent(pinpool_t *pool, const char *what, seen_t *s) {
  size_t len;
  char *text = take(pool, &len), why[512];
  snapcheck_t c;
  PP_ASSERT(snapcheck_chunks(text, len, &c, why, sizeof why) == 0, "%s: %s",
            what, why);
  s->snapshots++;
  s->chunks_max = c.chunks > s->chunks_max ? c.chunks : s->chunks_max;
  s->free_ranges += c.free_ranges;
  s->crossing += c.crossing_segments;
  s->joined += c.joined_ranges;
  count_busy_chunks(text, len, s);
  pinpool_snapshot_free(text);
}

/* Small blocks (slabs of many classes) and large ones (segments of their
 * own, carved from the chunks at their exact size). */
static size_t pick_size(uint64_t *rng) {
  uint64_t r = pp_rand(rng);
  if (r % 5 == 0)
    return 256 * KiB + (size_t)(r >> 8) % (3 * MiB);
  return 64 + (size_t)(r >> 8) % (64 * KiB);
}

#define NBLK 160

static void mix(pinpool_t *pool, const char *cfg, seen_t *s, uint64_t seed) {
  void *p[NBLK] = {NULL};
  uint64_t rng = pp_seed(seed);
  char what[256];
  for (int i = 0; i < NBLK; i++)
    PP_OK(pinpool_alloc(pool, pick_size(&rng), &p[i]));
  snprintf(what, sizeof what, "[%s] all allocated", cfg);
  check_quiescent(pool, what, s);
  /* Every third block back: large ones leave gaps once the arena has
   * them again (the thread flush gives the deferred ones back). */
  for (int i = 0; i < NBLK; i += 3) {
    PP_OK(pinpool_free(pool, p[i]));
    p[i] = NULL;
  }
  snprintf(what, sizeof what, "[%s] a third freed", cfg);
  check_quiescent(pool, what, s);
  PP_OK(pinpool_thread_flush(pool));
  snprintf(what, sizeof what, "[%s] thread cache flushed", cfg);
  check_quiescent(pool, what, s);
  /* Refill some of the holes with other sizes. */
  for (int i = 0; i < NBLK; i += 6)
    PP_OK(pinpool_alloc(pool, pick_size(&rng), &p[i]));
  snprintf(what, sizeof what, "[%s] holes refilled", cfg);
  check_quiescent(pool, what, s);
  PP_OK(pinpool_empty_cache(pool));
  snprintf(what, sizeof what, "[%s] after empty_cache", cfg);
  check_quiescent(pool, what, s);
  for (int i = 0; i < NBLK; i++)
    if (p[i] != NULL)
      PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_thread_flush(pool));
  snprintf(what, sizeof what, "[%s] all freed", cfg);
  check_quiescent(pool, what, s);
}

typedef struct worker {
  pinpool_t *pool;
  uint64_t seed;
  void *kept[16];
} worker_t;

static void *work(void *arg) {
  worker_t *w = arg;
  uint64_t rng = pp_seed(w->seed);
  void *p[32] = {NULL};
  for (int k = 0; k < 3000; k++) {
    int i = (int)(pp_rand(&rng) % 32);
    if (p[i] != NULL)
      PP_OK(pinpool_free(w->pool, p[i]));
    PP_OK(pinpool_alloc(w->pool, pick_size(&rng), &p[i]));
  }
  for (int i = 0; i < 32; i++) {
    if (i < 16)
      w->kept[i] = p[i]; /* still allocated after the thread ends */
    else
      PP_OK(pinpool_free(w->pool, p[i]));
  }
  return NULL;
}

static void quiescent_pools(void **state) {
  (void)state;
  static const char *const configs[] = {
      "",
      "backend=malloc",
      "reserve=16MiB",
      "numa=local,numa_fake_nodes=2",
      "hugepages=1",
  };
  seen_t s = {0};
  for (size_t k = 0; k < sizeof configs / sizeof configs[0]; k++) {
    pinpool_t *pool = NULL;
    PP_OK(pinpool_create(configs[k], &pool));
    mix(pool, configs[k], &s, 100 + k);
    pinpool_destroy(pool);
  }
  /* Threads that allocated and freed, joined: their leftovers and the
   * blocks they still hold. */
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  pthread_t t[2];
  worker_t w[2];
  for (int i = 0; i < 2; i++) {
    w[i] = (worker_t){pool, 7u + (uint64_t)i, {NULL}};
    PP_ASSERT(pthread_create(&t[i], NULL, work, &w[i]) == 0, "thread");
  }
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  check_quiescent(pool, "[threads] joined", &s);
  for (int i = 0; i < 2; i++)
    for (int j = 0; j < 16; j++)
      PP_OK(pinpool_free(pool, w[i].kept[j]));
  PP_OK(pinpool_thread_flush(pool));
  check_quiescent(pool, "[threads] freed", &s);
  PP_OK(pinpool_empty_cache(pool));
  check_quiescent(pool, "[threads] empty_cache", &s);
  pinpool_destroy(pool);

  printf("quiescent_pools: %llu snapshots, up to %llu chunks, %llu free "
         "ranges, %llu chunks with two segments or more, %llu segments "
         "crossing a chunk boundary, %llu free ranges joined across one\n",
         (ull)s.snapshots, (ull)s.chunks_max, (ull)s.free_ranges,
         (ull)s.busy_chunks, (ull)s.crossing, (ull)s.joined);
  /* The layouts checked had gaps to check, and more than one chunk. */
  PP_ASSERT(s.free_ranges > 0 && s.busy_chunks > 0 && s.chunks_max > 1,
            "the pools never had free gaps between segments, or never more "
            "than one chunk: the check was not exercised");
}

/* ---- The example, and corrupted snapshots ------------------------------ */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  PP_ASSERT(f != NULL, "cannot open %s", path);
  char *buf = malloc(1 << 20);
  PP_ASSERT(buf != NULL, "out of memory");
  *len = fread(buf, 1, 1 << 20, f);
  fclose(f);
  return buf;
}

static void example(void **state) {
  (void)state;
  size_t len;
  char *text = read_file(example_path, &len), why[512];
  snapcheck_t c;
  PP_ASSERT(snapcheck_chunks(text, len, &c, why, sizeof why) == 0, "%s: %s",
            example_path, why);
  PP_ASSERT(c.chunks == 4 && c.free_ranges == 5 && c.crossing_segments == 1 &&
                c.chunk_free_bytes == 8 * MiB,
            "example_chunks.json: %llu chunks, %llu free ranges, %llu "
            "crossing",
            (ull)c.chunks, (ull)c.free_ranges, (ull)c.crossing_segments);
  free(text);
}

static json_t *at(json_t *root, const char *a, size_t i) {
  return json_array_get(json_object_get(root, a), i);
}

static json_t *free_range(json_t *root, size_t chunk, size_t j) {
  return json_array_get(json_object_get(at(root, "chunks", chunk), "free"), j);
}

static uint64_t ival(json_t *v) { return (uint64_t)json_integer_value(v); }

static void set_range(json_t *r, uint64_t a, uint64_t size) {
  json_array_set_new(r, 0, json_integer((json_int_t)a));
  json_array_set_new(r, 1, json_integer((json_int_t)size));
}

static void add_to(json_t *obj, const char *key, int64_t delta) {
  json_object_set_new(
      obj, key,
      json_integer(json_integer_value(json_object_get(obj, key)) +
                   (json_int_t)delta));
}

/* Free bytes changed by delta: the totals follow, so that plain snapcheck
 * still passes and only the layout is wrong. */
static void totals_follow(json_t *root, int64_t delta) {
  json_t *t = json_object_get(root, "totals");
  add_to(t, "chunk_free_bytes", delta);
  add_to(t, "reserved_bytes", delta);
  add_to(t, "cached_bytes", delta);
}

/* Apply `damage` to a copy of text: snapcheck_chunks must fail with
 * `want` in its message; plain snapcheck must fail too when `always`
 * (what holds in any snapshot), and pass otherwise. */
static void expect_fail(const char *text, size_t len, const char *name,
                        void (*damage)(json_t *), const char *want,
                        int always) {
  json_t *root = json_loadb(text, len, 0, NULL);
  PP_ASSERT(root != NULL, "%s: the base does not parse", name);
  damage(root);
  char *bad = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  char why[512] = "", plain_why[512] = "";
  snapcheck_t c;
  int rc = snapcheck_chunks(bad, strlen(bad), &c, why, sizeof why);
  int plain = snapcheck(bad, strlen(bad), &c, plain_why, sizeof plain_why);
  free(bad);
  PP_ASSERT(rc != 0, "%s: the damaged snapshot passes", name);
  PP_ASSERT(strstr(why, want) != NULL, "%s: fails, but not for \"%s\": %s",
            name, want, why);
  if (always)
    PP_ASSERT(plain != 0, "%s: plain snapcheck misses it", name);
  else
    PP_ASSERT(plain == 0,
              "%s: plain snapcheck fails (%s): the damage was meant to break "
              "only the chunk layout",
              name, plain_why);
  printf("  %-44s fails: %s\n", name, why);
}

/* example_chunks.json: chunks[0] [A, A+8M) free [A+2M,1M] [A+5M,1M];
 * chunks[1] [A+8M, A+12M) free [A+10M,2M]; chunks[2] [A+64M, A+66M) all
 * free; chunks[3] [A+96M, A+100M) free [A+98M,2M]. segments[0] [A, A+2M),
 * [1] [A+3M, A+5M), [2] [A+6M, A+10M) crossing into chunks[1], [3]
 * [A+96M, A+98M). */
static void d_overlap(json_t *r) {
  json_t *f = free_range(r, 0, 0);
  set_range(f, ival(json_array_get(f, 0)) - 4096,
            ival(json_array_get(f, 1)) + 4096);
  totals_follow(r, 4096);
}
static void d_missing_gap(json_t *r) {
  json_t *fr = json_object_get(at(r, "chunks", 0), "free");
  totals_follow(r, -(int64_t)ival(json_array_get(json_array_get(fr, 1), 1)));
  json_array_remove(fr, 1);
}
static void d_no_chunk(json_t *r) {
  json_t *fr = json_object_get(at(r, "chunks", 3), "free");
  totals_follow(r, -(int64_t)ival(json_array_get(json_array_get(fr, 0), 1)));
  json_array_remove(json_object_get(r, "chunks"), 3);
}
static void d_run_flags(json_t *r) {
  json_t *fl = json_object_get(at(r, "chunks", 1), "flags");
  json_array_append_new(fl, json_string("huge_advised"));
}
static void d_run_apart(json_t *r) {
  add_to(at(r, "chunks", 1), "address", 4096);
}
static void d_uncoalesced(json_t *r) {
  json_t *fr = json_object_get(at(r, "chunks", 2), "free");
  json_t *f = json_array_get(fr, 0);
  uint64_t a = ival(json_array_get(f, 0)), s = ival(json_array_get(f, 1));
  set_range(f, a, s / 2);
  json_t *g = json_array();
  json_array_append_new(g, json_integer((json_int_t)(a + s / 2)));
  json_array_append_new(g, json_integer((json_int_t)(s - s / 2)));
  json_array_append_new(fr, g);
}
static void d_past_end(json_t *r) {
  json_t *f = free_range(r, 1, 0);
  set_range(f, ival(json_array_get(f, 0)), ival(json_array_get(f, 1)) + 4096);
  totals_follow(r, 4096);
}
static void d_free_sum(json_t *r) {
  json_t *f = free_range(r, 3, 0);
  set_range(f, ival(json_array_get(f, 0)), ival(json_array_get(f, 1)) - 4096);
}
static void d_order(json_t *r) {
  json_t *ch = json_object_get(r, "chunks");
  json_t *two = json_incref(json_array_get(ch, 2));
  json_array_remove(ch, 2);
  json_array_append_new(ch, two);
}
static void d_stat_chunks(json_t *r) {
  add_to(json_object_get(r, "stats"), "arena_chunks", 1);
}
static void d_stat_extents(json_t *r) {
  add_to(json_object_get(r, "stats"), "free_extents", -1);
}
static void d_stat_largest(json_t *r) {
  add_to(json_object_get(r, "stats"), "largest_free_extent", -4096);
}
static void d_stat_free(json_t *r) {
  add_to(json_object_get(r, "stats"), "chunk_free_bytes", 4096);
}
static void d_stat_reserved(json_t *r) {
  add_to(json_object_get(json_object_get(r, "stats"), "reserved_bytes"),
         "current", 4096);
}
static void d_stat_segments(json_t *r) {
  add_to(json_object_get(json_object_get(r, "stats"), "segments"), "current",
         1);
}

/* On a real snapshot: the first free range that follows a segment in its
 * chunk grows back over it; the first free range disappears. */
static void d_real_overlap(json_t *r) {
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(r, "chunks"), i, c) {
    json_t *f = json_array_get(json_object_get(c, "free"), 0);
    if (f != NULL &&
        ival(json_array_get(f, 0)) > ival(json_object_get(c, "address"))) {
      set_range(f, ival(json_array_get(f, 0)) - 4096,
                ival(json_array_get(f, 1)) + 4096);
      totals_follow(r, 4096);
      return;
    }
  }
  PP_FAIL("no free range after a segment in the real snapshot");
}
static void d_real_gap(json_t *r) {
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(r, "chunks"), i, c) {
    json_t *fr = json_object_get(c, "free");
    if (json_array_size(fr) > 0) {
      totals_follow(r,
                    -(int64_t)ival(json_array_get(json_array_get(fr, 0), 1)));
      json_array_remove(fr, 0);
      return;
    }
  }
  PP_FAIL("no free range in the real snapshot");
}

static void corrupted(void **state) {
  (void)state;
  size_t len;
  char *text = read_file(example_path, &len);
  static const struct {
    const char *name;
    void (*damage)(json_t *);
    const char *want;
    int always;
  } cases[] = {
      {"free range overlapping a segment", d_overlap, "overlaps segments[0]",
       0},
      {"missing gap (a free range left out)", d_missing_gap,
       "is in no segment and no free range", 0},
      {"segment in no chunk (its chunk left out)", d_no_chunk,
       "segments[3] [0x7f0006000000, 0x7f0006200000) lies outside every chunk",
       0},
      {"crossing segment, next chunk's flags differ", d_run_flags,
       "segments[2] [0x7f0000600000, 0x7f0000a00000) crosses the end of "
       "chunks[0], and no chunk of its run follows",
       0},
      {"crossing segment, next chunk not adjacent", d_run_apart,
       "crosses the end of chunks[0], and no chunk of its run follows", 0},
      {"two free ranges touching in one chunk", d_uncoalesced,
       "the arena coalesces free ranges", 0},
      {"free range past its chunk's end", d_past_end,
       "chunks[1].free[0] [0x7f0000a00000, +2101248) is beyond the chunk's end",
       1},
      {"free ranges disagree with totals", d_free_sum,
       "totals.chunk_free_bytes", 1},
      {"chunks out of address order", d_order, "not in address order", 1},
      {"stats.arena_chunks off by one", d_stat_chunks, "stats.arena_chunks", 0},
      {"stats.free_extents off by one", d_stat_extents, "stats.free_extents",
       0},
      {"stats.largest_free_extent too small", d_stat_largest,
       "largest_free_extent", 0},
      {"stats.chunk_free_bytes off", d_stat_free, "stats.chunk_free_bytes", 0},
      {"stats.reserved_bytes off", d_stat_reserved,
       "stats.reserved_bytes.current", 0},
      {"stats.segments off", d_stat_segments, "stats.segments.current", 0},
  };
  printf("example_chunks.json, damaged:\n");
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    expect_fail(text, len, cases[k].name, cases[k].damage, cases[k].want,
                cases[k].always);
  free(text);

  /* A real snapshot, with gaps after segments. */
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  void *p[8];
  for (int i = 0; i < 8; i++)
    PP_OK(pinpool_alloc(pool, 300 * KiB + (size_t)i * 64 * KiB, &p[i]));
  for (int i = 0; i < 8; i += 2)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_thread_flush(pool));
  text = take(pool, &len);
  snapcheck_t c;
  char why[512];
  PP_ASSERT(snapcheck_chunks(text, len, &c, why, sizeof why) == 0,
            "real snapshot: %s", why);
  printf("a real snapshot (%llu chunks, %llu free ranges), damaged:\n",
         (ull)c.chunks, (ull)c.free_ranges);
  expect_fail(text, len, "free range grown over a segment", d_real_overlap,
              "overlaps segments[", 0);
  expect_fail(text, len, "free range left out", d_real_gap,
              "is in no segment and no free range", 0);
  pinpool_snapshot_free(text);
  for (int i = 1; i < 8; i += 2)
    PP_OK(pinpool_free(pool, p[i]));
  pinpool_destroy(pool);
}

/* one_hold: in one 32 MiB reserve chunk, P1 | P2 | P3 | P4 | free tail,
 * with P3 (S bytes) given back before the snapshot. The hook carves a new
 * S-byte block, which fills P3's space exactly, and gives P1 (S bytes)
 * back: no aggregate changes (chunks, free bytes, free extents, largest,
 * segments), only where the free extent of S bytes is. Pools with a cap
 * give large blocks to the arena at once (no hot slot, no deferral). */
#define HOLD_S (1 * MiB + 4 * KiB)
static pinpool_t *hold_pool;
static void *hold_p1, *hold_new;

/* Runs on the snapshot's thread, which holds no pool lock at this point. */
static void carve_at_copy(int point) {
  if (point != PP_HOOK_SNAP_SEGMENTS || hold_new != NULL)
    return;
  PP_OK(pinpool_alloc(hold_pool, HOLD_S, &hold_new));
  PP_OK(pinpool_free(hold_pool, hold_p1));
}

static void one_hold(void **state) {
  (void)state;
  PP_OK(pinpool_create("populate=0,mlock=0,tcache_bytes=0,reserve=32MiB,"
                       "max_cached=1GiB",
                       &hold_pool));
  void *p2, *p3, *p4;
  PP_OK(pinpool_alloc(hold_pool, HOLD_S, &hold_p1));
  PP_OK(pinpool_alloc(hold_pool, 300 * KiB, &p2));
  PP_OK(pinpool_alloc(hold_pool, HOLD_S, &p3));
  PP_OK(pinpool_alloc(hold_pool, 300 * KiB, &p4));
  PP_OK(pinpool_free(hold_pool, p3));
  hold_new = NULL;
  atomic_store(&pp_test_hook, carve_at_copy);
  size_t len;
  char *text = take(hold_pool, &len), why[512];
  atomic_store(&pp_test_hook, NULL);
  PP_ASSERT(hold_new == p3, "the hook's block at %p, not in P3's space %p",
            hold_new, p3);
  snapcheck_t c;
  PP_ASSERT(snapcheck_chunks(text, len, &c, why, sizeof why) == 0,
            "a block carved and one given back while the snapshot copied: %s",
            why);
  pinpool_snapshot_free(text);
  PP_OK(pinpool_free(hold_pool, hold_new));
  PP_OK(pinpool_free(hold_pool, p2));
  PP_OK(pinpool_free(hold_pool, p4));
  pinpool_destroy(hold_pool);
}

/* pieces: a snapshot copies the segments and the arena in pieces of
 * PP_SNAP_PIECE elements, one hold of seg_lock each (issue 38). Between
 * every two pieces the hook frees the block whose segment the copy goes
 * on from (its release must move the copy's cursor on: pool.c), frees a
 * block whose segment was copied already, and carves a new block; once
 * the free extents are being copied, it frees the block after the one
 * copied first, which grows into another bin and is copied again (the
 * same bytes come twice), and carves a block that needs a new chunk
 * (made after the chunks were copied: its free rest is in none listed). The
 * snapshot must still list no byte twice (snapcheck_disjoint), and the
 * quiescent pool's next one tile its chunks. */
#define PIECES_N 2400
static pinpool_t *pc_pool;
static void *pc_blk[PIECES_N];
static int pc_calls, pc_moved, pc_grown;
static uintptr_t pc_low_island;
static void *pc_big;
static void *pc_new[64];

static void free_at(uintptr_t base) {
  for (int i = 0; i < PIECES_N; i++)
    if (pc_blk[i] != NULL && (uintptr_t)pc_blk[i] == base) {
      PP_OK(pinpool_free(pc_pool, pc_blk[i]));
      pc_blk[i] = NULL;
      return;
    }
}

/* On the snapshot's thread, no lock held, no other thread: the cursor
 * read without seg_lock is this thread's own. */
static void change_between_pieces(int point) {
  if (point != PP_HOOK_SNAP_PIECE || pc_calls >= 64)
    return;
  pp_snap_cursor_t *c = pc_pool->snap_cursors;
  PP_ASSERT(c != NULL && c->link == NULL, "one snapshot's cursor");
  if (c->next != NULL) {
    pp_snap_cursor_t before = *c;
    free_at(pp_load_relaxed(&before.next->base));
    pc_moved += c->next != before.next;
  }
  /* Once the segments are copied: the block after the lowest island,
   * whose free extent (the first of its bin, by address) is copied
   * already; it grows into a larger bin and is copied again. */
  if (c->next == NULL && !pc_grown) {
    for (int i = 0; i < PIECES_N; i++)
      if (pc_blk[i] != NULL &&
          (uintptr_t)pc_blk[i] == pc_low_island + 300 * KiB) {
        free_at((uintptr_t)pc_blk[i]);
        pc_grown = 1;
        break;
      }
    /* And a chunk made after the chunks were copied: its free rest is
     * copied, in no chunk listed. */
    PP_OK(pinpool_alloc(pc_pool, 300 * MiB + 4 * KiB, &pc_big));
  }
  /* The newest blocks' segments are copied first (the list's head). */
  for (int i = PIECES_N - 1; i >= 0; i -= 2)
    if (pc_blk[i] != NULL) {
      PP_OK(pinpool_free(pc_pool, pc_blk[i]));
      pc_blk[i] = NULL;
      break;
    }
  PP_OK(pinpool_alloc(pc_pool, 1 * MiB + 64 * KiB, &pc_new[pc_calls]));
  pc_calls++;
}

static void pieces(void **state) {
  (void)state;
  PP_OK(pinpool_create("populate=0,mlock=0,tcache_bytes=0,max_cached=4GiB",
                       &pc_pool));
  for (int i = 0; i < PIECES_N; i++)
    PP_OK(pinpool_alloc(pc_pool, 300 * KiB, &pc_blk[i]));
  pc_low_island = UINTPTR_MAX;
  for (int i = 1; i < PIECES_N; i += 4) { /* islands: free extents */
    if ((uintptr_t)pc_blk[i] < pc_low_island)
      pc_low_island = (uintptr_t)pc_blk[i];
    PP_OK(pinpool_free(pc_pool, pc_blk[i]));
    pc_blk[i] = NULL;
  }
  pc_calls = pc_moved = pc_grown = 0;
  pc_big = NULL;
  atomic_store(&pp_test_hook, change_between_pieces);
  size_t len;
  char *text = take(pc_pool, &len), why[512];
  atomic_store(&pp_test_hook, NULL);
  snapcheck_t c;
  PP_ASSERT(snapcheck_disjoint(text, len, &c, why, sizeof why) == 0,
            "blocks freed and carved between the pieces: %s", why);
  printf("pieces: %d changes between pieces, the cursor moved on by %d "
         "releases; %llu segments, %llu free ranges listed\n",
         pc_calls, pc_moved, (ull)c.segments, (ull)c.free_ranges);
  PP_ASSERT(pc_calls >= 3, "%d pieces: the copy was not in pieces",
            pc_calls + 1);
  PP_ASSERT(pc_moved >= 1, "no release moved the cursor: not tested");
  PP_ASSERT(pc_grown, "no copied free extent grew: not tested");
  pinpool_snapshot_free(text);
  text = take(pc_pool, &len);
  PP_ASSERT(snapcheck_chunks(text, len, &c, why, sizeof why) == 0,
            "the quiescent pool after: %s", why);
  pinpool_snapshot_free(text);
  for (int i = 0; i < PIECES_N; i++)
    if (pc_blk[i] != NULL)
      PP_OK(pinpool_free(pc_pool, pc_blk[i]));
  for (int i = 0; i < pc_calls; i++)
    PP_OK(pinpool_free(pc_pool, pc_new[i]));
  PP_OK(pinpool_free(pc_pool, pc_big));
  pinpool_destroy(pc_pool);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_snapshot_chunks EXAMPLE_CHUNKS.json\n");
    return 2;
  }
  example_path = argv[1];
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(example),         cmocka_unit_test(corrupted),
      cmocka_unit_test(quiescent_pools), cmocka_unit_test(one_hold),
      cmocka_unit_test(pieces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
