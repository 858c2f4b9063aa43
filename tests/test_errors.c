/* Every error path of every public entry point. Each failing call must return
 * the documented code, leave a message in pinpool_last_error(), and change
 * nothing: the stats are identical before and after (every field), the pool
 * validates, and it keeps working. */
#define _GNU_SOURCE
#include "testutil.h"

#include <inttypes.h>
#include <stdlib.h>

#define SENTINEL_PTR ((void *)(uintptr_t)0xdeadbee0)

/* Run `expr` (a failing call) and require: the code, a message, unchanged
 * stats of `pool`, validate() == 0. */
#define EXPECT_NOCHANGE(pool, expr, expected)                                  \
  do {                                                                         \
    pinpool_stats_t before_, after_;                                           \
    PP_STATS((pool), &before_);                                                \
    PP_CHECK_RC((expr), (expected));                                           \
    const char *le_ = pinpool_last_error();                                    \
    PP_ASSERT(le_ != NULL && le_[0] != '\0', "no last_error message after %s", \
              #expr);                                                          \
    PP_STATS((pool), &after_);                                                 \
    PP_CHECK_STATS_EQUAL(&before_, &after_, #expr);                            \
    PP_CHECK_CONSISTENT(pool);                                                 \
  } while (0)

/* As EXPECT_NOCHANGE, but any of two codes is accepted (documented
 * ambiguity). */
#define EXPECT_NOCHANGE2(pool, expr, c1, c2)                                   \
  do {                                                                         \
    pinpool_stats_t before_, after_;                                           \
    PP_STATS((pool), &before_);                                                \
    int rc_ = (expr);                                                          \
    PP_ASSERT(rc_ == (c1) || rc_ == (c2),                                      \
              "%s returned %d (%s), want %s or %s", #expr, rc_,                \
              pp_code_name(rc_), #c1, #c2);                                    \
    PP_STATS((pool), &after_);                                                 \
    PP_CHECK_STATS_EQUAL(&before_, &after_, #expr);                            \
    PP_CHECK_CONSISTENT(pool);                                                 \
  } while (0)

static void test_version(void **state) {
  (void)state;
  const char *v = pinpool_version();
  PP_ASSERT(v != NULL && strcmp(v, PINPOOL_VERSION_STRING) == 0,
            "pinpool_version() = \"%s\"", v ? v : "(null)");
}

static void test_strerror(void **state) {
  (void)state;
  static const int codes[] = {
      PINPOOL_OK,        PINPOOL_EINVAL,     PINPOOL_ENOMEM,
      PINPOOL_EZEROSIZE, PINPOOL_EOVERFLOW,  PINPOOL_EDOUBLEFREE,
      PINPOOL_ENOTOWNED, PINPOOL_EINTERIOR,  PINPOOL_ECONFIG,
      PINPOOL_EBACKEND,  PINPOOL_ECORRUPT,   PINPOOL_EBUSY,
      PINPOOL_ENODRIVER, PINPOOL_EDEVICE,    PINPOOL_EFORKED,
      PINPOOL_ESTALE,    PINPOOL_EBADHANDLE, PINPOOL_ELIMIT,
      PINPOOL_ECLOSED,   PINPOOL_EPERM,      PINPOOL_EEXITED,
      PINPOOL_EAGAIN,    PINPOOL_EINTR};
  enum { N = sizeof codes / sizeof codes[0] };
  const char *msg[N];
  for (int i = 0; i < N; i++) {
    msg[i] = pinpool_strerror(codes[i]);
    PP_ASSERT(msg[i] != NULL && msg[i][0] != '\0',
              "pinpool_strerror(%d) is empty", codes[i]);
    PP_ASSERT(strstr(msg[i], "unknown") == NULL,
              "pinpool_strerror(%d) = \"%s\" says unknown", codes[i], msg[i]);
    if (codes[i] != PINPOOL_OK)
      PP_ASSERT(strstr(msg[i], pp_code_name(codes[i])) != NULL,
                "pinpool_strerror(%d) = \"%s\" does not name %s", codes[i],
                msg[i], pp_code_name(codes[i]));
  }
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++)
      PP_ASSERT(strcmp(msg[i], msg[j]) != 0,
                "codes %d and %d share the text \"%s\"", codes[i], codes[j],
                msg[i]);
  static const int unknown[] = {12345,      -12345,         1, -23, -100,
                                2147483647, -2147483647 - 1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    const char *m = pinpool_strerror(unknown[i]);
    PP_ASSERT(m != NULL && strstr(m, "unknown") != NULL,
              "pinpool_strerror(%d) = \"%s\"", unknown[i], m ? m : "(null)");
  }
}

/* ---- last_error is thread-local and starts empty ---------------------- */
struct le_arg {
  char initial[256];
  char after[256];
  int rc;
};

static void *le_thread(void *p) {
  struct le_arg *a = p;
  const char *le = pinpool_last_error();
  snprintf(a->initial, sizeof a->initial, "%s", le ? le : "(null)");
  pinpool_t *pool = NULL;
  a->rc = pinpool_create("thread_local_key=1", &pool);
  le = pinpool_last_error();
  snprintf(a->after, sizeof a->after, "%s", le ? le : "(null)");
  return NULL;
}

static void test_last_error_thread_local(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_CHECK_RC(pinpool_create("main_thread_key=1", &pool), PINPOOL_ECONFIG);
  char mine[256];
  snprintf(mine, sizeof mine, "%s", pinpool_last_error());
  PP_ASSERT(strstr(mine, "main_thread_key") != NULL, "last_error \"%s\"", mine);

  struct le_arg a;
  memset(&a, 0, sizeof a);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, le_thread, &a) == 0, "pthread_create");
  pthread_join(t, NULL);
  PP_ASSERT(a.initial[0] == '\0',
            "a new thread's last_error is \"%s\", want \"\"", a.initial);
  PP_ASSERT(a.rc == PINPOOL_ECONFIG, "thread create rc %d", a.rc);
  PP_ASSERT(strstr(a.after, "thread_local_key") != NULL,
            "thread's last_error \"%s\"", a.after);
  PP_ASSERT(strcmp(pinpool_last_error(), mine) == 0,
            "another thread's failure changed this thread's last_error to "
            "\"%s\"",
            pinpool_last_error());

  /* Successful calls keep the message of the last failure. */
  PP_OK(pinpool_create("", &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 100, &p));
  PP_OK(pinpool_free(pool, p));
  PP_ASSERT(strcmp(pinpool_last_error(), mine) == 0,
            "a successful call changed last_error to \"%s\"",
            pinpool_last_error());
  pinpool_destroy(pool);
}

/* ---- Creation --------------------------------------------------------------
 */
static void test_create_errors(void **state) {
  (void)state;
  PP_CHECK_RC(pinpool_create("", NULL), PINPOOL_EINVAL);
  PP_ASSERT(pinpool_last_error()[0] != '\0', "no message");
  PP_CHECK_RC(pinpool_create(NULL, NULL), PINPOOL_EINVAL);
  pinpool_backend_t be = pp_heap_backend();
  PP_CHECK_RC(pinpool_create_with_backend("", &be, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_create_ex("", NULL, NULL), PINPOOL_EINVAL);
  pinpool_t *pool = (pinpool_t *)SENTINEL_PTR;
  PP_CHECK_RC(pinpool_create_with_backend("", NULL, &pool), PINPOOL_EINVAL);
  PP_ASSERT(pool == (pinpool_t *)SENTINEL_PTR, "*out changed on failure");
  /* A table without functions is refused (any error code), never used. */
  pinpool_backend_t nofn = {"broken", NULL, NULL, NULL, 0};
  int rc = pinpool_create_with_backend("", &nofn, &pool);
  PP_ASSERT(rc < 0, "a backend without alloc/free was accepted (rc %d)", rc);
  PP_ASSERT(pool == (pinpool_t *)SENTINEL_PTR, "*out changed on failure");
  pinpool_destroy(NULL); /* no-op */
}

/* ---- Entry points given a NULL pool / NULL out ------------------------- */
static void test_null_arguments(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  void *live = NULL;
  PP_OK(pinpool_alloc(pool, 3000, &live));
  pinpool_stats_t st;
  void *out = SENTINEL_PTR;
  size_t sz = 777;
  char buf[512];
  size_t needed = 0;

  EXPECT_NOCHANGE(pool, pinpool_alloc(NULL, 100, &out), PINPOOL_EINVAL);
  PP_ASSERT(out == SENTINEL_PTR, "*out changed");
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, 100, NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_free(NULL, live), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_free(pool, NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_block_size(NULL, live, &sz), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_block_size(pool, NULL, &sz), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_block_size(pool, live, NULL), PINPOOL_EINVAL);
  PP_ASSERT(sz == 777, "*out changed");
  EXPECT_NOCHANGE(pool, pinpool_size_class(100, NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_empty_cache(NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_thread_flush(NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_get_stats(NULL, &st), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_get_stats(pool, NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_reset_peak_stats(NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_validate(NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_get_config(NULL, buf, sizeof buf, &needed),
                  PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_get_config(pool, NULL, 64, &needed),
                  PINPOOL_EINVAL);
  /* Stream-ordered entry points. */
  EXPECT_NOCHANGE(pool, pinpool_record_stream(NULL, live, 0), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_record_stream(pool, NULL, 0), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_process_events(NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_synchronize(NULL), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_sim_submit(NULL, 0, 0, NULL, NULL),
                  PINPOOL_EINVAL);
  /* Graph capture (docs/cuda.md): a NULL pool or out-pointer, a capture or
   * a stream the pool never saw, a provider without capture (here none;
   * events=simulated below). tests/cuda/test_cuda_capture has the rest. */
  int capturing = 7;
  uint64_t cid = 7;
  EXPECT_NOCHANGE(pool, pinpool_graph_release(NULL, 1), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_graph_release(pool, 1), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_graph_release(pool, 0), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_stream_graphs_release(NULL, 1), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_stream_graphs_release(pool, 1), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_stream_capture(NULL, 1, &capturing, &cid),
                  PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_stream_capture(pool, 1, NULL, &cid),
                  PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_stream_capture(pool, 1, &capturing, NULL),
                  PINPOOL_EINVAL);
  EXPECT_NOCHANGE(pool, pinpool_stream_capture(pool, 1, &capturing, &cid),
                  PINPOOL_EBUSY);
  PP_ASSERT(capturing == 7 && cid == 7, "out-pointers changed on failure");
  pinpool_t *sim = NULL;
  PP_OK(pinpool_create("events=simulated", &sim));
  void *sb = NULL;
  PP_OK(pinpool_alloc(sim, 3000, &sb));
  PP_OK(pinpool_record_stream(sim, sb, 5));
  PP_OK(pinpool_free(sim, sb)); /* a stream-ordered free, no capture */
  EXPECT_NOCHANGE(sim, pinpool_stream_capture(sim, 5, &capturing, &cid),
                  PINPOOL_EBUSY);
  EXPECT_NOCHANGE(sim, pinpool_stream_graphs_release(sim, 5), PINPOOL_EINVAL);
  EXPECT_NOCHANGE(sim, pinpool_graph_release(sim, 5), PINPOOL_EINVAL);
  PP_OK(pinpool_synchronize(sim));
  pinpool_destroy(sim);

  PP_OK(pinpool_free(pool, live));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- Sizes -----------------------------------------------------------------
 */
static void test_bad_sizes(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("", &pool));
  void *out = SENTINEL_PTR;
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, 0, &out), PINPOOL_EZEROSIZE);
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, SIZE_MAX, &out), PINPOOL_EOVERFLOW);
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, SIZE_MAX - 100, &out),
                  PINPOOL_EOVERFLOW);
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, ((size_t)1 << 60) + 1, &out),
                  PINPOOL_EOVERFLOW);
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, ((size_t)1 << 62) + 1, &out),
                  PINPOOL_EOVERFLOW);
  EXPECT_NOCHANGE(pool, pinpool_alloc(pool, (size_t)1 << 63, &out),
                  PINPOOL_EOVERFLOW);
  PP_ASSERT(out == SENTINEL_PTR, "*out changed on error");
  size_t c = 99;
  EXPECT_NOCHANGE(pool, pinpool_size_class(0, &c), PINPOOL_EZEROSIZE);
  EXPECT_NOCHANGE(pool, pinpool_size_class(SIZE_MAX, &c), PINPOOL_EOVERFLOW);
  PP_ASSERT(c == 99, "size_class changed *out on error");
  /* The pool still works. */
  PP_OK(pinpool_alloc(pool, 1, &out));
  PP_OK(pinpool_free(pool, out));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- Bad pointers given to free and block_size ------------------------- */
struct df_arg {
  pinpool_t *pool;
  void *ptr;
  int rc_free;
  int rc_size;
};

static void *df_thread(void *p) {
  struct df_arg *a = p;
  size_t sz = 0;
  a->rc_free = pinpool_free(a->pool, a->ptr);
  a->rc_size = pinpool_block_size(a->pool, a->ptr, &sz);
  return NULL;
}

/* large_cached: whether the pool's thread caches hold a freed 3 MiB block
 * (tcache on; else the block waits in its class's hot slot). */
static void bad_pointers_with(const char *conf, int large_cached) {
  pinpool_t *pool = NULL, *other = NULL;
  PP_OK(pinpool_create(conf, &pool));
  PP_OK(pinpool_create(conf, &other));

  /* A mix of live blocks: carved small ones and large ones. */
  void *small512 = NULL, *small4k = NULL, *mid = NULL, *large = NULL;
  void *keep = NULL, *victim = NULL, *large_victim = NULL;
  PP_OK(pinpool_alloc(pool, 500, &small512));
  PP_OK(pinpool_alloc(pool, 4096, &small4k));
  PP_OK(pinpool_alloc(pool, 100000, &mid));
  PP_OK(pinpool_alloc(pool, 4 * MiB, &large));
  PP_OK(pinpool_alloc(pool, 4096, &keep));
  PP_OK(pinpool_alloc(pool, 4096, &victim));
  PP_OK(pinpool_alloc(pool, 3 * MiB, &large_victim));
  void *foreign = NULL;
  PP_OK(pinpool_alloc(other, 4096, &foreign));
  size_t sz = 0;

  /* Never from the pool. */
  int on_stack = 0;
  void *heap = malloc(4096);
  PP_ASSERT(heap != NULL, "malloc");
  void *wild[] = {&on_stack,
                  heap,
                  foreign,
                  (void *)(uintptr_t)0x1000,
                  (void *)(uintptr_t)64,
                  (void *)(~(uintptr_t)63),
                  (void *)(~(uintptr_t)4095)};
  for (size_t i = 0; i < sizeof wild / sizeof wild[0]; i++) {
    EXPECT_NOCHANGE(pool, pinpool_free(pool, wild[i]), PINPOOL_ENOTOWNED);
    EXPECT_NOCHANGE(pool, pinpool_block_size(pool, wild[i], &sz),
                    PINPOOL_ENOTOWNED);
  }
  /* The foreign block is intact in its own pool. */
  PP_OK(pinpool_block_size(other, foreign, &sz));
  PP_ASSERT(sz == 4096, "foreign block size %zu", sz);

  /* Interior pointers. */
  struct {
    void *base;
    size_t cls;
  } blocks[] = {{small512, 512},
                {small4k, 4096},
                {mid, pp_ref_block(100000)},
                {large, pp_ref_block(4 * MiB)}};
  for (size_t i = 0; i < 4; i++) {
    char *b = blocks[i].base;
    size_t offs[] = {1,
                     63,
                     64,
                     65,
                     blocks[i].cls / 2,
                     blocks[i].cls - 64,
                     blocks[i].cls - 1};
    for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++) {
      EXPECT_NOCHANGE(pool, pinpool_free(pool, b + offs[k]), PINPOOL_EINTERIOR);
      EXPECT_NOCHANGE(pool, pinpool_block_size(pool, b + offs[k], &sz),
                      PINPOOL_EINTERIOR);
    }
    PP_OK(pinpool_block_size(pool, b, &sz));
    PP_ASSERT(sz == blocks[i].cls, "block_size %zu, want %zu", sz,
              blocks[i].cls);
  }
  if (large != NULL) {
    EXPECT_NOCHANGE(pool, pinpool_free(pool, (char *)large + 4096),
                    PINPOOL_EINTERIOR);
    EXPECT_NOCHANGE(pool, pinpool_free(pool, (char *)large + 2 * MiB),
                    PINPOOL_EINTERIOR);
  }

  /* Double frees: the block sits in the thread cache or in the bins. */
  PP_OK(pinpool_free(pool, victim));
  EXPECT_NOCHANGE(pool, pinpool_free(pool, victim), PINPOOL_EDOUBLEFREE);
  EXPECT_NOCHANGE(pool, pinpool_block_size(pool, victim, &sz),
                  PINPOOL_EDOUBLEFREE);
  EXPECT_NOCHANGE2(pool, pinpool_free(pool, (char *)victim + 64),
                   PINPOOL_EINTERIOR, PINPOOL_EDOUBLEFREE);
  /* From another thread, while the block is in this thread's cache. */
  struct df_arg a = {pool, victim, 0, 0};
  pinpool_stats_t before, after;
  PP_STATS(pool, &before);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, df_thread, &a) == 0, "pthread_create");
  pthread_join(t, NULL);
  PP_ASSERT(a.rc_free == PINPOOL_EDOUBLEFREE,
            "double free from another thread returned %d (%s)", a.rc_free,
            pp_code_name(a.rc_free));
  PP_ASSERT(a.rc_size == PINPOOL_EDOUBLEFREE,
            "block_size of a freed block from another thread returned %d (%s)",
            a.rc_size, pp_code_name(a.rc_size));
  PP_STATS(pool, &after);
  /* The other thread exited: its (empty) cache went away; nothing else.
   * peak_slack_bytes is a precision bound that grows with the number of
   * thread caches ever registered, not pool state: ignored here. */
  after.peak_slack_bytes = before.peak_slack_bytes;
  PP_CHECK_STATS_EQUAL(&before, &after, "double free from another thread");
  PP_CHECK_CONSISTENT(pool);

  /* After the thread cache is flushed into the shared bins. */
  PP_OK(pinpool_thread_flush(pool));
  EXPECT_NOCHANGE(pool, pinpool_free(pool, victim), PINPOOL_EDOUBLEFREE);
  /* After empty_cache, the segment stays (keep is live): still a double free.
   */
  PP_OK(pinpool_empty_cache(pool));
  PP_ASSERT(pinpool_block_size(pool, keep, &sz) == 0, "keep lost");
  EXPECT_NOCHANGE(pool, pinpool_free(pool, victim), PINPOOL_EDOUBLEFREE);

  /* A large block freed and still held by the pool as a block (in the
   * thread cache or the hot slot): double free. Given back to the central
   * layer, its segment goes back to the arena at once: its address is in no
   * segment any more and a second free is "not owned". A thread flush does
   * that to a block in the thread cache; a block in the hot slot stays
   * there until empty_cache. */
  PP_STATS(pool, &before);
  PP_OK(pinpool_free(pool, large_victim));
  EXPECT_NOCHANGE(pool, pinpool_free(pool, large_victim), PINPOOL_EDOUBLEFREE);
  EXPECT_NOCHANGE(pool, pinpool_block_size(pool, large_victim, &sz),
                  PINPOOL_EDOUBLEFREE);
  PP_OK(pinpool_thread_flush(pool));
  PP_STATS(pool, &after);
  PP_ASSERT(after.segments.current ==
                before.segments.current - (large_cached ? 1 : 0),
            "[%s] segments %" PRIu64 " -> %" PRIu64
            " after freeing a large block and a thread flush (%s)",
            conf, before.segments.current, after.segments.current,
            large_cached ? "back to the arena" : "kept in the hot slot");
  EXPECT_NOCHANGE(pool, pinpool_free(pool, large_victim),
                  large_cached ? PINPOOL_ENOTOWNED : PINPOOL_EDOUBLEFREE);
  PP_OK(pinpool_empty_cache(pool));
  EXPECT_NOCHANGE(pool, pinpool_free(pool, large_victim), PINPOOL_ENOTOWNED);
  EXPECT_NOCHANGE(pool, pinpool_block_size(pool, large_victim, &sz),
                  PINPOOL_ENOTOWNED);

  /* A reallocated block is live again and frees once. */
  void *again = NULL;
  PP_OK(pinpool_alloc(pool, 4096, &again));
  PP_OK(pinpool_free(pool, again));
  EXPECT_NOCHANGE(pool, pinpool_free(pool, again), PINPOOL_EDOUBLEFREE);

  /* The pool keeps working after all of that. */
  void *ps[64];
  for (int i = 0; i < 64; i++)
    PP_OK(pinpool_alloc(pool, (size_t)(i + 1) * 1000, &ps[i]));
  PP_CHECK_CONSISTENT(pool);
  for (int i = 0; i < 64; i++)
    PP_OK(pinpool_free(pool, ps[i]));
  PP_OK(pinpool_free(pool, small512));
  PP_OK(pinpool_free(pool, small4k));
  PP_OK(pinpool_free(pool, mid));
  PP_OK(pinpool_free(pool, large));
  PP_OK(pinpool_free(pool, keep));
  PP_OK(pinpool_free(other, foreign));
  PP_CHECK_CONSISTENT(pool);
  PP_CHECK_CONSISTENT(other);
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.requests.current == 0 && st.requested_bytes.current == 0 &&
                st.block_bytes.current == 0,
            "blocks still counted after freeing all");
  free(heap);
  pinpool_destroy(pool);
  pinpool_destroy(other);
}

static void test_bad_pointers_default(void **state) {
  (void)state;
  bad_pointers_with("", 1);
}
static void test_bad_pointers_no_tcache(void **state) {
  (void)state;
  bad_pointers_with("tcache_bytes=0", 0);
}
static void test_bad_pointers_malloc_backend(void **state) {
  (void)state;
  bad_pointers_with("backend=malloc,shards=1", 1);
}

/* A pointer inside a segment but in space that was never handed out. */
static void test_pointer_into_unused_segment_space(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create("tcache_bytes=0", &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 4096, &p));
  /* The block is at the low end of a 512 KiB slab carved from the low end
   * of a 2 MiB chunk; probe the rest of both. In the slab, each probe is
   * either inside an unallocated region or an interior pointer; beyond it
   * the chunk's free space is in no segment: not owned. */
  for (size_t off = 4096; off < 2 * MiB; off += 64 * 1024 + 64) {
    char *q = (char *)p + off;
    pinpool_stats_t b, a;
    PP_STATS(pool, &b);
    int rc = pinpool_free(pool, q);
    if (off < 512 * KiB)
      PP_ASSERT(rc == PINPOOL_EINTERIOR || rc == PINPOOL_EDOUBLEFREE ||
                    rc == PINPOOL_ENOTOWNED,
                "free of never-allocated space %p returned %d (%s)", (void *)q,
                rc, pp_code_name(rc));
    else
      PP_ASSERT(rc == PINPOOL_ENOTOWNED,
                "free of %p, in the chunk beyond the slab, returned %d (%s)",
                (void *)q, rc, pp_code_name(rc));
    PP_STATS(pool, &a);
    PP_CHECK_STATS_EQUAL(&b, &a, "free of never-allocated space");
  }
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_free(pool, p));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_strerror),
      cmocka_unit_test(test_last_error_thread_local),
      cmocka_unit_test(test_create_errors),
      cmocka_unit_test(test_null_arguments),
      cmocka_unit_test(test_bad_sizes),
      cmocka_unit_test(test_bad_pointers_default),
      cmocka_unit_test(test_bad_pointers_no_tcache),
      cmocka_unit_test(test_bad_pointers_malloc_backend),
      cmocka_unit_test(test_pointer_into_unused_segment_space),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
