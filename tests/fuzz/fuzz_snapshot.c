/*
 * libFuzzer target of the snapshot reader (tools/snapshot_load.c) and of
 * the computations of `pinpool snapshot summary` and `diff`
 * (tools/snapshot_summarize.c, snapshot_summary.c, snapshot_diff.c).
 *
 * The input is the file. A load that fails must leave a message naming the
 * input and nothing allocated (LeakSanitizer); a load that succeeds must
 * give values within the ranges snapshot_load.h promises, whatever the
 * accessors are asked for, and the summary and diff must run to the end on
 * it: text and JSON, all sites and a few. A diff of a snapshot with itself
 * must show no change; a diff with a variant of it (blocks in other states
 * and on other stacks) must list site deltas that add up to the change of
 * live bytes. Any violated check abort()s with a message.
 *
 * Shared by pp_fuzz_snapshot (libFuzzer) and pp_fuzz_snapshot_replay
 * (replay.c over tests/fuzz/corpus_snapshot, no libFuzzer).
 */
#define _GNU_SOURCE
#include "fuzz_pinpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot_load.h"

#define NAME "fuzz-input"

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      (void)fprintf(stderr, "fuzz_snapshot: check failed: %s: ", #cond);       \
      (void)fprintf(stderr, __VA_ARGS__);                                      \
      (void)fputc('\n', stderr);                                               \
      abort();                                                                 \
    }                                                                          \
  } while (0)

static FILE *sink(void) {
  /* One stream for the whole run: opening one per input would cost more
   * than most inputs. Its contents are never read. */
  static FILE *f;
  if (f == NULL) {
    f = fopen("/dev/null", "w");
    CHECK(f != NULL, "cannot open /dev/null");
  }
  return f;
}

static void check_error(const char *err) {
  size_t n = strnlen(err, 512);
  CHECK(n < 512, "message not terminated");
  CHECK(strncmp(err, NAME ": ", strlen(NAME) + 2) == 0,
        "message does not name the input: '%s'", err);
  CHECK(n > strlen(NAME) + 2, "empty message");
}

/* Every accessor over everything, with the promised ranges. */
static void walk(const snap_t *s, uint64_t *live_blocks, uint64_t *live_bytes) {
  char small[8], big[1024];
  *live_blocks = 0;
  *live_bytes = 0;
  for (size_t seg = 0; seg < s->nsegments; seg++) {
    const json_t *o = snap_segment(s, seg);
    CHECK(json_is_object(o), "segment %zu", seg);
    CHECK(snap_u64(o, "block_size") >= 512, "block_size");
    size_t nb = snap_segment_nblocks(s, seg);
    for (size_t i = 0; i < nb; i++) {
      snap_block_t b;
      snap_block(s, seg, i, &b);
      CHECK(b.state >= SNAP_ALLOCATED && b.state <= SNAP_CACHED, "state %d",
            b.state);
      CHECK(b.stack >= -1 && b.stack < (int64_t)s->nstacks, "block stack");
      CHECK(b.thread >= -1, "thread");
      CHECK(json_is_array(b.streams), "streams");
      for (size_t k = 0; k < json_array_size(b.streams); k++) {
        const json_t *h = json_array_get(b.streams, k);
        char back[32];
        CHECK(json_is_string(h), "stream handle not a string");
        /* A checked handle is lowercase hex without leading junk: printing
         * its value gives it back, up to leading zeros. */
        (void)snprintf(back, sizeof back, "%llx",
                       (unsigned long long)snap_handle(h));
        const char *t = json_string_value(h) + 2;
        t += strspn(t, "0");
        CHECK(strcmp(t[0] ? t : "0", back) == 0, "handle %s read as 0x%s",
              json_string_value(h), back);
      }
      CHECK(strlen(snap_state_names[b.state]) > 0, "state name");
      *live_blocks += b.state != SNAP_CACHED;
      *live_bytes += b.state != SNAP_CACHED ? b.size : 0;
    }
  }
  for (size_t i = 0; i < s->nentries; i++) {
    snap_entry_t e;
    snap_entry(s, i, &e);
    CHECK(e.action >= 0 && e.action < SNAP_NACTIONS, "action %d", e.action);
    CHECK(e.stack >= -1 && e.stack < (int64_t)s->nstacks, "entry stack");
    const json_t *h = json_array_get(json_array_get(s->entries, i), 6);
    CHECK(json_is_null(h) ? e.stream == 0
                          : json_is_string(h) && e.stream == snap_handle(h),
          "entry stream");
  }
  for (size_t i = 0; i < s->nframes; i++) {
    snap_frame_t f;
    snap_frame(s, i, &f);
    CHECK(f.line >= -1, "line");
  }
  for (int64_t st = -1; st <= (int64_t)s->nstacks; st++) {
    size_t n = snap_stack_len(s, st);
    if (st < 0 || st == (int64_t)s->nstacks)
      CHECK(n == 0, "length of a stack out of range");
    for (size_t j = 0; j < n; j++)
      CHECK(snap_stack_frame(s, st, j) < s->nframes, "frame index");
    CHECK(snap_site(s, st, big, sizeof big) == big, "site buffer");
    CHECK(strnlen(big, sizeof big) < sizeof big && big[0] != '\0', "site");
    json_t *js = json_string(big); /* NULL: not UTF-8 */
    CHECK(js != NULL, "site '%s' is not UTF-8", big);
    json_decref(js);
    snap_site(s, st, small, sizeof small);
    CHECK(strnlen(small, sizeof small) < sizeof small, "short site buffer");
    js = json_string(small);
    CHECK(js != NULL, "cut site '%s' is not UTF-8", small);
    json_decref(js);
    (void)snap_site(s, st, small, 0); /* must not write */
  }
}

/* Diff output as parsed JSON. */
static json_t *diff_json(const snap_t *a, const snap_t *b) {
  char *text = NULL;
  size_t len = 0;
  json_error_t je;
  FILE *f = open_memstream(&text, &len);
  CHECK(f != NULL, "open_memstream");
  int rc = snap_diff_write(a, "a", b, "b", f, 0, 1);
  CHECK(fclose(f) == 0, "fclose");
  CHECK(rc == 0, "diff exit %d", rc);
  json_t *j = json_loadb(text, len, 0, &je);
  CHECK(j != NULL, "diff JSON does not parse: %s", je.text);
  free(text);
  return j;
}

/* Sum of the sites' delta_bytes (mod 2^64, as the sums themselves). */
static uint64_t delta_sum(const json_t *j) {
  const json_t *sites = json_object_get(j, "sites");
  uint64_t sum = 0;
  for (size_t i = 0; i < json_array_size(sites); i++) {
    const json_t *site = json_array_get(sites, i);
    CHECK(json_is_string(json_object_get(site, "site")), "a site unnamed");
    sum += (uint64_t)json_integer_value(json_object_get(site, "delta_bytes"));
  }
  return sum;
}

/* The diff of s with itself lists no site and every delta is 0. */
static void check_self_diff(const snap_t *s) {
  json_t *j = diff_json(s, s);
  const char *key;
  json_t *v;
  CHECK(json_array_size(json_object_get(j, "sites")) == 0,
        "self-diff lists a site");
  json_object_foreach(json_object_get(j, "totals"), key, v)
      CHECK(json_integer_value(json_object_get(v, "delta")) == 0,
            "self-diff: %s changed", key);
  json_decref(j);
}

/* A variant of s with every other block in another state and on another
 * stack, written and loaded again: the diffs between the two list site
 * deltas that add up to the change of live bytes, both ways. This reaches
 * the diff's code for changed sites, which a self-diff never does. */
static void check_variant_diff(const snap_t *s, uint64_t live_bytes) {
  static const char *const flip[3] = {"cached", "allocated", "pending_free"};
  json_t *root = json_deep_copy(s->root);
  json_t *segs = json_object_get(root, "segments");
  char err[512];
  uint64_t vlive, vblocks;
  snap_t t;
  CHECK(root != NULL, "json_deep_copy");
  for (size_t seg = 0; seg < json_array_size(segs); seg++) {
    json_t *blocks = json_object_get(json_array_get(segs, seg), "blocks");
    for (size_t i = 0; i < json_array_size(blocks); i += 2) {
      json_t *b = json_array_get(blocks, i);
      snap_block_t sb;
      snap_block(s, seg, i, &sb);
      (void)json_object_set_new(b, "state", json_string(flip[sb.state]));
      (void)json_object_set_new(
          b, "stack",
          s->nstacks > 0 ? json_integer((json_int_t)((seg + i) % s->nstacks))
                         : json_null());
    }
  }
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  CHECK(text != NULL, "json_dumps");
  CHECK(snap_load_buffer("variant", text, strlen(text), &t, err, sizeof err) ==
            0,
        "the variant does not load: %s", err);
  free(text);
  walk(&t, &vblocks, &vlive);
  json_t *j = diff_json(s, &t);
  CHECK(delta_sum(j) == vlive - live_bytes, "site deltas do not add up");
  json_decref(j);
  j = diff_json(&t, s);
  CHECK(delta_sum(j) == live_bytes - vlive, "reverse deltas do not add up");
  json_decref(j);
  CHECK(snap_diff_write(s, "a", &t, "b", sink(), 1, 0) == 0, "text diff");
  snap_free(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[512];
  snap_t s;
  uint64_t live = 0, live_bytes = 0, site_blocks = 0;
  snap_site_stat_t *sites = NULL;
  size_t nsites = 0;

  memset(err, 'x', sizeof err);
  if (snap_load_buffer(NAME, (const char *)data, size, &s, err, sizeof err) !=
      0) {
    check_error(err);
    CHECK(s.root == NULL, "failed load left a tree");
    snap_free(&s); /* must be harmless */
    return 0;
  }
  CHECK(s.root != NULL && json_is_array(s.segments) &&
            json_is_array(s.frames) && json_is_array(s.stacks) &&
            json_is_array(s.entries),
        "loaded snapshot without its arrays");
  CHECK(s.nsegments == json_array_size(s.segments) &&
            s.nframes == json_array_size(s.frames) &&
            s.nstacks == json_array_size(s.stacks) &&
            s.nentries == json_array_size(s.entries),
        "counts");
  walk(&s, &live, &live_bytes);

  CHECK(snap_live_sites(&s, &sites, &nsites) == 0, "out of memory");
  for (size_t i = 0; i < nsites; i++) {
    site_blocks += sites[i].blocks;
    CHECK(sites[i].blocks > 0, "a site without blocks");
    if (i > 0)
      CHECK(sites[i - 1].bytes >= sites[i].bytes, "sites not sorted");
    for (size_t k = 0; k < i && k < 4; k++)
      CHECK(strcmp(sites[k].site, sites[i].site) != 0, "site twice");
  }
  CHECK(site_blocks == live, "sites hold %llu blocks, not %llu",
        (unsigned long long)site_blocks, (unsigned long long)live);
  snap_sites_free(sites, nsites);

  int rc = snap_summary_write(&s, NAME, sink(), 0, 0);
  CHECK(rc == 0 || rc == 1, "summary exit %d", rc);
  CHECK(snap_summary_write(&s, NAME, sink(), 1, 1) == rc,
        "text and JSON summaries disagree on the identity");
  CHECK(snap_diff_write(&s, "a", &s, "b", sink(), 2, 0) == 0, "diff");
  check_self_diff(&s);
  check_variant_diff(&s, live_bytes);
  snap_free(&s);
  CHECK(s.root == NULL, "snap_free");
  return 0;
}
