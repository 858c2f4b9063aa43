/*
 * History and snapshots (docs/snapshot-format.md): bad input, contents,
 * levels, the ring, flags, the three writers, stream-ordered blocks, and
 * the races PyTorch's pinned snapshot had, reproduced by construction:
 *   - race_history_toggle: the history level switched on and off while
 *     threads allocate (PyTorch read record_history_ as a plain field);
 *   - race_snapshot_state: blocks change state while snapshots read them
 *     (PyTorch wrote block fields under one lock and read them under
 *     another).
 *   - concurrent_all: allocation, frees on other threads, record_stream,
 *     event completion, history on/off, empty_cache and snapshots, all at
 *     once for a bounded time.
 * Under ThreadSanitizer these must report nothing (tests/mutants shows the
 * same runs report the races once they are put back); every snapshot is
 * checked (snapcheck.h) and, with PP_SNAPSHOT_DIR set, saved there for the
 * JSON Schema check that runs after this test.
 */
#include "testutil.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snapshot/snapcheck.h"

static double pp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double run_seconds(void) {
  const char *e = getenv("PP_SNAPSHOT_SECONDS");
  double s = e != NULL ? atof(e) : 1.0;
  return s > 0 ? s : 1.0;
}

/* Save a snapshot for the schema check (at most `limit` per test). */
static void keep(const char *tag, const char *text, size_t len, int limit) {
  static _Atomic(int) serial;
  const char *dir = getenv("PP_SNAPSHOT_DIR");
  if (dir == NULL)
    return;
  int n = atomic_fetch_add(&serial, 1);
  if (n >= limit)
    return;
  (void)mkdir(dir, 0755);
  char path[512];
  snprintf(path, sizeof path, "%s/%s-%03d.json", dir, tag, n);
  FILE *f = fopen(path, "w");
  PP_ASSERT(f != NULL, "cannot write %s", path);
  fwrite(text, 1, len, f);
  fclose(f);
}

static char *snap(pinpool_t *pool, unsigned flags, size_t *len,
                  snapcheck_t *chk) {
  char *text = NULL;
  PP_OK(pinpool_snapshot_write_mem(pool, &text, len, flags));
  char why[256];
  PP_ASSERT(snapcheck(text, *len, chk, why, sizeof why) == 0,
            "snapshot check: %s", why);
  return text;
}

/* ---- Bad input ------------------------------------------------------------
 */

static void bad_input(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 1000, 8, 0};
  PP_CHECK_RC(pinpool_record_history(NULL, &o), PINPOOL_EINVAL);
  o.record = 4;
  PP_CHECK_RC(pinpool_record_history(pool, &o), PINPOOL_EINVAL);
  o.record = -1;
  PP_CHECK_RC(pinpool_record_history(pool, &o), PINPOOL_EINVAL);
  o.record = PINPOOL_HISTORY_ALL;
  o.stack_depth = 65;
  PP_CHECK_RC(pinpool_record_history(pool, &o), PINPOOL_EINVAL);
  o.stack_depth = 8;
  o.max_entries = ((size_t)1 << 26) + 1;
  PP_CHECK_RC(pinpool_record_history(pool, &o), PINPOOL_EINVAL);
  PP_ASSERT(strstr(pinpool_last_error(), "max_entries") != NULL, "message: %s",
            pinpool_last_error());

  /* Nothing changed: history is still off and empty. */
  void *p;
  PP_OK(pinpool_alloc(pool, 1000, &p));
  size_t len;
  snapcheck_t c;
  char *t = snap(pool, 0, &len, &c);
  PP_ASSERT(strcmp(c.record, "none") == 0 && c.entries == 0 && c.stacks == 0,
            "history changed by bad calls: %s, %llu entries", c.record,
            (unsigned long long)c.entries);
  pinpool_snapshot_free(t);

  PP_CHECK_RC(pinpool_snapshot_write(NULL, "x.json", 0), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_snapshot_write(pool, NULL, 0), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_snapshot_write(pool, "x.json", 0x80), PINPOOL_EINVAL);
  PP_ASSERT(access("x.json", F_OK) != 0, "a refused write created a file");
  const char *nodir = "/nonexistent-pinpool-dir/snap.json";
  PP_CHECK_RC(pinpool_snapshot_write(pool, nodir, 0), PINPOOL_EBACKEND);
  PP_ASSERT(strstr(pinpool_last_error(), "nonexistent-pinpool-dir") != NULL,
            "message: %s", pinpool_last_error());
  PP_CHECK_RC(pinpool_snapshot_write_file(pool, NULL, 0), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_snapshot_write_file(NULL, stdout, 0), PINPOOL_EINVAL);
  char *out = (char *)0x1;
  PP_CHECK_RC(pinpool_snapshot_write_mem(pool, NULL, &len, 0), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_snapshot_write_mem(pool, &out, NULL, 0), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_snapshot_write_mem(pool, &out, &len, 4), PINPOOL_EINVAL);
  PP_ASSERT(out == (char *)0x1, "out written on error");
  /* A full device: the write fails cleanly and the file is removed. */
  if (access("/dev/full", W_OK) == 0) {
    FILE *full = fopen("/dev/full", "w");
    PP_ASSERT(full != NULL, "open /dev/full");
    PP_CHECK_RC(pinpool_snapshot_write_file(pool, full, 0), PINPOOL_EBACKEND);
    fclose(full);
  }
  pinpool_snapshot_free(NULL);
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- Contents --------------------------------------------------------------
 */

__attribute__((noinline)) static void *alloc_site_one(pinpool_t *pool,
                                                      size_t n) {
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, n, &p));
  return p;
}

static json_t *parse(const char *text, size_t len) {
  json_t *r = json_loadb(text, len, 0, NULL);
  PP_ASSERT(r != NULL, "snapshot does not parse");
  return r;
}

static json_t *find_block(json_t *root, void *p) {
  size_t i, j;
  json_t *sg, *b;
  json_array_foreach(json_object_get(root, "segments"), i, sg) {
    json_array_foreach(json_object_get(sg, "blocks"), j, b) {
      if ((uintptr_t)json_integer_value(json_object_get(b, "address")) ==
          (uintptr_t)p)
        return b;
    }
  }
  return NULL;
}

static size_t count_action(json_t *root, const char *action) {
  size_t n = 0, i;
  json_t *e;
  json_array_foreach(
      json_object_get(json_object_get(root, "history"), "entries"), i, e) {
    if (strcmp(json_string_value(json_array_get(e, 2)), action) == 0)
      n++;
  }
  return n;
}

static void contents(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 1000, 16, 0};
  PP_OK(pinpool_record_history(pool, &o));
  void *a = alloc_site_one(pool, 4000);
  void *b = alloc_site_one(pool, 100000);
  PP_OK(pinpool_free(pool, b));
  size_t len;
  snapcheck_t c;
  char *t = snap(pool, 0, &len, &c);
  keep("contents", t, len, 40);
  PP_ASSERT(strcmp(c.record, "all") == 0, "record %s", c.record);
  PP_ASSERT(snapcheck_has_function(t, len, "alloc_site_one"),
            "the allocation site is not in the stacks");
  json_t *root = parse(t, len);
  json_t *ba = find_block(root, a), *bb = find_block(root, b);
  PP_ASSERT(ba != NULL && bb != NULL, "blocks missing");
  PP_ASSERT(
      strcmp(json_string_value(json_object_get(ba, "state")), "allocated") ==
              0 &&
          json_integer_value(json_object_get(ba, "requested_size")) == 4000,
      "block a");
  PP_ASSERT(json_is_integer(json_object_get(ba, "thread")) &&
                json_is_integer(json_object_get(ba, "stack")),
            "block a has no thread/stack");
  PP_ASSERT(strcmp(json_string_value(json_object_get(bb, "state")), "cached") ==
                    0 &&
                json_is_null(json_object_get(bb, "stack")),
            "block b");
  /* The stack of a starts in the caller: its first frame is
   * alloc_site_one, not an allocator function. */
  json_t *stack =
      json_array_get(json_object_get(root, "stacks"),
                     (size_t)json_integer_value(json_object_get(ba, "stack")));
  json_t *f0 =
      json_array_get(json_object_get(root, "frames"),
                     (size_t)json_integer_value(json_array_get(stack, 0)));
  const char *fn = json_string_value(json_object_get(f0, "function"));
  PP_ASSERT(fn != NULL && strcmp(fn, "alloc_site_one") == 0,
            "innermost frame is %s", fn ? fn : "(null)");
  PP_ASSERT(count_action(root, "alloc") == 2 &&
                count_action(root, "free_completed") == 1 &&
                count_action(root, "segment_alloc") >= 1,
            "history entries");
  /* Quiescent: the counters and the blocks agree. */
  pinpool_stats_t st;
  PP_OK(pinpool_get_stats(pool, &st));
  PP_ASSERT(st.reserved_bytes.current == c.reserved_bytes &&
                st.block_bytes.current == c.allocated_bytes &&
                st.cached_bytes.current == c.cached_bytes &&
                st.requested_bytes.current == c.requested_bytes,
            "stats and totals disagree in a quiescent pool");
  json_decref(root);
  pinpool_snapshot_free(t);

  /* Flags: no symbols, no history. */
  t = snap(pool, PINPOOL_SNAPSHOT_NO_SYMBOLS | PINPOOL_SNAPSHOT_NO_HISTORY,
           &len, &c);
  root = parse(t, len);
  PP_ASSERT(c.entries == 0 && c.frames > 0, "flags");
  PP_ASSERT(!snapcheck_has_function(t, len, "alloc_site_one"),
            "NO_SYMBOLS still symbolized");
  json_decref(root);
  pinpool_snapshot_free(t);

  /* The file and FILE* writers give the same kind of document. */
  char path[] = "/tmp/pp_snapshot_XXXXXX";
  int fd = mkstemp(path);
  PP_ASSERT(fd >= 0, "mkstemp");
  close(fd);
  PP_OK(pinpool_snapshot_write(pool, path, 0));
  FILE *f = fopen(path, "r");
  char *buf = malloc(1 << 22);
  size_t n = fread(buf, 1, 1 << 22, f);
  fclose(f);
  char why[256];
  PP_ASSERT(snapcheck(buf, n, &c, why, sizeof why) == 0, "file: %s", why);
  f = fopen(path, "w");
  PP_OK(pinpool_snapshot_write_file(pool, f, 0));
  fclose(f);
  f = fopen(path, "r");
  n = fread(buf, 1, 1 << 22, f);
  fclose(f);
  PP_ASSERT(snapcheck(buf, n, &c, why, sizeof why) == 0, "FILE*: %s", why);
  free(buf);
  unlink(path);
  PP_OK(pinpool_free(pool, a));
  pinpool_destroy(pool);
}

/* ---- Levels and the ring ---------------------------------------------------
 */

static void levels_and_ring(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  pinpool_history_options_t o = {PINPOOL_HISTORY_STATE, 0, 8, 0};
  PP_OK(pinpool_record_history(pool, &o));
  void *a = alloc_site_one(pool, 5000);
  size_t len;
  snapcheck_t c;
  char *t = snap(pool, 0, &len, &c);
  json_t *root = parse(t, len);
  PP_ASSERT(c.entries == 0, "STATE recorded entries");
  PP_ASSERT(json_is_integer(json_object_get(find_block(root, a), "stack")),
            "STATE did not keep the block's stack");
  json_decref(root);
  pinpool_snapshot_free(t);

  /* Off: new blocks have no info; a freed and reused block forgets it. */
  PP_OK(pinpool_record_history(pool, NULL));
  PP_OK(pinpool_free(pool, a));
  void *a2 = NULL;
  PP_OK(pinpool_alloc(pool, 5000, &a2));
  t = snap(pool, 0, &len, &c);
  root = parse(t, len);
  json_t *b = find_block(root, a2);
  PP_ASSERT(json_is_null(json_object_get(b, "thread")) &&
                json_is_null(json_object_get(b, "stack")),
            "a block allocated with history off has a stack");
  json_decref(root);
  pinpool_snapshot_free(t);
  PP_OK(pinpool_free(pool, a2));

  /* The ring keeps the newest max_entries; the rest count as dropped. */
  o = (pinpool_history_options_t){PINPOOL_HISTORY_ALLOC, 1000, 0, 1};
  PP_OK(pinpool_record_history(pool, &o));
  for (int i = 0; i < 3000; i++) {
    void *p;
    PP_OK(pinpool_alloc(pool, 700, &p));
    PP_OK(pinpool_free(pool, p));
  }
  t = snap(pool, 0, &len, &c);
  PP_ASSERT(c.entries == 1000 && c.dropped >= 5000,
            "ring: %llu kept, %llu "
            "dropped",
            (unsigned long long)c.entries, (unsigned long long)c.dropped);
  PP_ASSERT(c.stacks == 0, "stack_depth 0 captured stacks");
  pinpool_snapshot_free(t);
  /* clear drops everything recorded so far */
  o.clear = 1;
  PP_OK(pinpool_record_history(pool, &o));
  t = snap(pool, 0, &len, &c);
  PP_ASSERT(c.entries == 0 && c.dropped == 0, "clear");
  pinpool_snapshot_free(t);
  /* A larger ring starts afresh; sequence numbers go on. */
  o = (pinpool_history_options_t){PINPOOL_HISTORY_ALL, 5000, 4, 0};
  PP_OK(pinpool_record_history(pool, &o));
  for (int i = 0; i < 100; i++) {
    void *p;
    PP_OK(pinpool_alloc(pool, 700, &p));
    PP_OK(pinpool_free(pool, p));
  }
  PP_OK(pinpool_empty_cache(pool));
  t = snap(pool, 0, &len, &c);
  root = parse(t, len);
  PP_ASSERT(c.entries >= 201 && count_action(root, "empty_cache") == 1,
            "after resize: %llu entries", (unsigned long long)c.entries);
  json_t *e0 = json_array_get(
      json_object_get(json_object_get(root, "history"), "entries"), 0);
  PP_ASSERT(json_integer_value(json_array_get(e0, 0)) >= 6000,
            "sequence numbers restarted");
  json_decref(root);
  pinpool_snapshot_free(t);
  pinpool_destroy(pool);
}

/* ---- Stream-ordered blocks -------------------------------------------------
 */

static void pending_blocks(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=0", &pool));
  pinpool_history_options_t o = {PINPOOL_HISTORY_ALL, 1000, 8, 0};
  PP_OK(pinpool_record_history(pool, &o));
  PP_OK(pinpool_sim_submit(pool, 5, 300000000u, NULL, NULL)); /* 300 ms */
  void *p = alloc_site_one(pool, 3000);
  PP_OK(pinpool_record_stream(pool, p, 5));
  PP_OK(pinpool_record_stream(pool, p, 6));
  PP_OK(pinpool_free(pool, p));
  size_t len;
  snapcheck_t c;
  char *t = snap(pool, 0, &len, &c);
  keep("pending", t, len, 40);
  json_t *root = parse(t, len);
  json_t *b = find_block(root, p);
  PP_ASSERT(strcmp(json_string_value(json_object_get(b, "state")),
                   "pending_free") == 0,
            "state %s", json_string_value(json_object_get(b, "state")));
  json_t *streams = json_object_get(b, "streams");
  PP_ASSERT(
      json_array_size(streams) == 2 &&
          strcmp(json_string_value(json_array_get(streams, 0)), "0x5") == 0 &&
          strcmp(json_string_value(json_array_get(streams, 1)), "0x6") == 0,
      "streams of the pending block");
  PP_ASSERT(count_action(root, "free_requested") == 1 &&
                count_action(root, "free_completed") == 0,
            "free_requested");
  PP_ASSERT(c.pending_bytes > 0, "no pending bytes");
  json_decref(root);
  pinpool_snapshot_free(t);
  PP_OK(pinpool_synchronize(pool));
  t = snap(pool, 0, &len, &c);
  root = parse(t, len);
  PP_ASSERT(
      strcmp(json_string_value(json_object_get(find_block(root, p), "state")),
             "cached") == 0 &&
          count_action(root, "free_completed") == 1,
      "after synchronize");
  json_decref(root);
  pinpool_snapshot_free(t);
  pinpool_destroy(pool);
}

/* ---- Races ------------------------------------------------------------------
 */

typedef struct racer {
  pinpool_t *pool;
  unsigned seed;
  int streams;
  _Atomic(int) *stop;
  void **shared; /* blocks handed between threads */
  pthread_mutex_t *lock;
} racer_t;

static unsigned rnd(unsigned *s) {
  *s = *s * 1664525u + 1013904223u;
  return *s >> 8;
}

static void *alloc_loop(void *arg) {
  racer_t *r = arg;
  void *mine[16] = {NULL};
  while (!atomic_load(r->stop)) {
    unsigned x = rnd(&r->seed);
    void **slot = &mine[x % 16];
    if (*slot == NULL) {
      if (pinpool_alloc(r->pool, 256 + x % 300000, slot) != 0)
        PP_FAIL("alloc: %s", pinpool_last_error());
      continue;
    }
    if (r->streams && x % 5 == 0)
      PP_OK(pinpool_record_stream(r->pool, *slot, 1 + x % 2));
    if (r->shared != NULL && x % 3 == 0) { /* free on another thread */
      pthread_mutex_lock(r->lock);
      void *other = r->shared[x % 8];
      r->shared[x % 8] = *slot;
      pthread_mutex_unlock(r->lock);
      *slot = other;
      if (other == NULL)
        continue;
    }
    PP_OK(pinpool_free(r->pool, *slot));
    *slot = NULL;
    if (r->streams && x % 64 == 0)
      PP_OK(pinpool_process_events(r->pool));
  }
  for (int i = 0; i < 16; i++)
    if (mine[i] != NULL)
      PP_OK(pinpool_free(r->pool, mine[i]));
  return NULL;
}

static void start(pthread_t *t, racer_t *r, int n, pinpool_t *pool, int streams,
                  _Atomic(int) *stop, void **shared, pthread_mutex_t *lock) {
  for (int i = 0; i < n; i++) {
    r[i] = (racer_t){pool, 17u * (unsigned)i + 3u, streams, stop, shared, lock};
    pthread_create(&t[i], NULL, alloc_loop, &r[i]);
  }
}

static void finish(pthread_t *t, int n, _Atomic(int) *stop, pinpool_t *pool,
                   void **shared) {
  atomic_store(stop, 1);
  for (int i = 0; i < n; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; shared != NULL && i < 8; i++)
    if (shared[i] != NULL)
      PP_OK(pinpool_free(pool, shared[i]));
  PP_OK(pinpool_synchronize(pool));
  PP_OK(pinpool_validate(pool));
}

static void race_history_toggle(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  _Atomic(int) stop = 0;
  pthread_t t[2];
  racer_t r[2];
  start(t, r, 2, pool, 0, &stop, NULL, NULL);
  double end = pp_now() + run_seconds();
  unsigned s = 1;
  long toggles = 0;
  while (pp_now() < end) {
    unsigned x = rnd(&s);
    pinpool_history_options_t o = {(int)(x % 4), 1000 + x % 3000, x % 9,
                                   (int)(x % 7 == 0)};
    PP_OK(pinpool_record_history(pool, x % 5 ? &o : NULL));
    toggles++;
  }
  finish(t, 2, &stop, pool, NULL);
  PP_ASSERT(toggles > 10, "only %ld toggles", toggles);
  pinpool_destroy(pool);
}

static void race_snapshot_state(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  pinpool_history_options_t o = {PINPOOL_HISTORY_STATE, 0, 4, 0};
  PP_OK(pinpool_record_history(pool, &o));
  _Atomic(int) stop = 0;
  pthread_t t[2];
  racer_t r[2];
  start(t, r, 2, pool, 0, &stop, NULL, NULL);
  double end = pp_now() + run_seconds();
  long snaps = 0;
  while (pp_now() < end) {
    size_t len;
    snapcheck_t c;
    char *text = snap(pool, PINPOOL_SNAPSHOT_NO_SYMBOLS, &len, &c);
    keep("state", text, len, 40);
    pinpool_snapshot_free(text);
    snaps++;
  }
  finish(t, 2, &stop, pool, NULL);
  PP_ASSERT(snaps > 2, "only %ld snapshots", snaps);
  pinpool_destroy(pool);
}

static void concurrent_all(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("events=simulated,sim_delay_us=50,background=1,"
                       "poll_us=500,tcache_bytes=1MiB",
                       &pool));
  _Atomic(int) stop = 0;
  pthread_t t[3];
  racer_t r[3];
  void *shared[8] = {NULL};
  pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  start(t, r, 3, pool, 1, &stop, shared, &lock);
  double end = pp_now() + run_seconds();
  unsigned s = 99;
  long snaps = 0;
  uint64_t max_hold = 0, max_gather = 0;
  while (pp_now() < end) {
    unsigned x = rnd(&s);
    if (x % 3 == 0) {
      pinpool_history_options_t o = {(int)(x % 4), 2000, x % 2 ? 8 : 0, 0};
      PP_OK(pinpool_record_history(pool, &o));
    } else if (x % 3 == 1) {
      PP_OK(pinpool_empty_cache(pool));
    }
    size_t len;
    snapcheck_t c;
    char *text =
        snap(pool, x % 4 == 0 ? 0 : PINPOOL_SNAPSHOT_NO_SYMBOLS, &len, &c);
    keep("all", text, len, 40);
    if (c.max_hold_ns > max_hold)
      max_hold = c.max_hold_ns;
    if (c.gather_ns > max_gather)
      max_gather = c.gather_ns;
    pinpool_snapshot_free(text);
    snaps++;
  }
  finish(t, 3, &stop, pool, shared);
  printf("concurrent_all: %ld snapshots, longest lock hold %.1f us, longest "
         "gather %.1f us\n",
         snaps, (double)max_hold / 1e3, (double)max_gather / 1e3);
  PP_ASSERT(snaps > 2, "only %ld snapshots", snaps);
  pinpool_destroy(pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(bad_input),
      cmocka_unit_test(contents),
      cmocka_unit_test(levels_and_ring),
      cmocka_unit_test(pending_blocks),
      cmocka_unit_test(race_history_toggle),
      cmocka_unit_test(race_snapshot_state),
      cmocka_unit_test(concurrent_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
