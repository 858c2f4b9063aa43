/*
 * The allocator's core after issue 37's third review (docs/verification.md,
 * "Issue 37, the third review"). Counts, never times: a thread is held in
 * a lock-drop window by the test hook (src/base.h, PP_HOOK_*), and a wait
 * for the background grower is bounded (a loaded machine runs it late,
 * never wrongly) and then asserted.
 *  - chunk_pages: every size asked of the backend is a page multiple,
 *    whatever max_reserved and grow_ahead leave (item 1).
 *  - grow_ahead_bounds: grow_ahead above the machine's memory is
 *    PINPOOL_ECONFIG; a headroom above the largest chunk is made a chunk
 *    per look, never asked of the backend whole (item 1).
 *  - retry_grower_claim, retry_release_claim: the out-of-memory retry
 *    waits for a claim in flight (the grower's chunk held by the hook
 *    before it enters the arena; a released chunk held before its claim
 *    is dropped) and succeeds as it would alone (items 2, 3).
 *  - retry_changes_nothing, retry_releases_what_it_needs: a request no
 *    release could make fit fails with every chunk still cached; one that
 *    a release can make fit releases only what the cap lacks (item 6).
 *  - last_error_kept: an allocation that succeeds through the retry
 *    leaves pinpool_last_error() as it was (item 10).
 *  - exit_trims: a thread's exit flushes its cache and trims to max_cached
 *    (item 8).
 *  - process_waits_for_poller: pinpool_process_events while a miss's
 *    bounded poll holds a queue waits for it and drains the queue (item 7).
 *  - backend_count_formula: docs/stats.md's backend_alloc.count -
 *    grow_ahead_chunks = cache_misses + failed calls + grower chunks given
 *    back unused (item 9).
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_* */
#include "space_backend.h"

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- A recording backend: address space only (space_backend.h), every
 * size asked counted. ---------------------------------------------------- */
static atomic_ullong rb_calls, rb_odd, rb_max;

static int rb_alloc(void *ctx, size_t size, void **out) {
  atomic_fetch_add(&rb_calls, 1);
  if (size % 4096 != 0)
    atomic_fetch_add(&rb_odd, 1);
  unsigned long long m = atomic_load(&rb_max);
  while (size > m && !atomic_compare_exchange_weak(&rb_max, &m, size))
    ;
  /* Mapped whole pages; the size freed is the one asked for. */
  return pp_space_alloc(ctx, (size + 4095) & ~(size_t)4095, out);
}

static void rb_free(void *ctx, void *p, size_t size) {
  pp_space_free(ctx, p, (size + 4095) & ~(size_t)4095);
}

static const pinpool_backend_t rb_backend = {"recording", rb_alloc, rb_free,
                                             NULL, 0};

static void rb_reset(void) {
  atomic_store(&rb_calls, 0);
  atomic_store(&rb_odd, 0);
  atomic_store(&rb_max, 0);
}

/* Bounded wait for a condition on the pool's stats. */
typedef bool (*stats_pred_t)(const pinpool_stats_t *st, uint64_t arg);
static bool wait_stats(pinpool_t *pool, stats_pred_t pred, uint64_t arg) {
  for (int i = 0; i < 10000; i++) {
    pinpool_stats_t st = pp_stats_of(pool);
    if (pred(&st, arg))
      return true;
    pp_sleep_ms(1);
  }
  return false;
}

/* ---- Item 1: a chunk of a size the cap leaves ----------------------------
 * The grower asked chunk_size for what max_reserved leaves (any byte
 * count) or for a headroom that is not a page multiple, and chunk_size
 * returned it unrounded when the policy's chunk would pass the cap: the
 * debug build's granule assertion aborted the grower's thread, a release
 * build's validate failed. The recording backend sees every size, inline
 * growth's and the grower's. */
#define CAP_ODD 17400000ull /* not a page multiple */
#define AHEAD_ODD 3000000ull

static bool grown_to_cap(const pinpool_stats_t *st, uint64_t cap) {
  /* The grower stops when the cap leaves less than a chunk (2 MiB); a
   * headroom of AHEAD_ODD before that. */
  return st->chunk_free_bytes >= AHEAD_ODD ||
         st->reserved_bytes.current + 2 * MiB > cap;
}

static void chunk_pages_run(const char *conf, uint64_t cap, int blocks) {
  rb_reset();
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend(conf, &rb_backend, &pool));
  void *p[16] = {0};
  for (int i = 0; i < blocks; i++) {
    PP_OK(pinpool_alloc(pool, MiB, &p[i]));
    PP_ASSERT(wait_stats(pool, grown_to_cap, cap), "%s: block %d: no headroom",
              conf, i);
  }
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(atomic_load(&rb_odd) == 0,
            "%s: %llu of %llu backend allocations not a page multiple", conf,
            atomic_load(&rb_odd), atomic_load(&rb_calls));
  PP_ASSERT(st.reserved_bytes.current + 2 * MiB > cap &&
                st.reserved_bytes.current <= cap,
            "%s: reserved %llu under a cap of %llu", conf,
            (unsigned long long)st.reserved_bytes.current,
            (unsigned long long)cap);
  PP_OK(pinpool_validate(pool));
  for (int i = 0; i < blocks; i++)
    PP_OK(pinpool_free(pool, p[i]));
  PP_OK(pinpool_empty_cache(pool));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

static void chunk_pages(void **state) {
  (void)state;
  /* The room the cap leaves is the last chunk's size. */
  chunk_pages_run("max_reserved=17400000,grow_ahead=3000000", CAP_ODD, 14);
  /* A page-multiple cap: the headroom (not a page multiple) is. */
  chunk_pages_run("max_reserved=16MiB,grow_ahead=3000000", 16 * MiB, 13);
}

/* ---- Item 1: grow_ahead's bounds ---------------------------------------- */
static bool headroom_at_least(const pinpool_stats_t *st, uint64_t bytes) {
  return st->chunk_free_bytes >= bytes;
}

static void grow_ahead_bounds(void **state) {
  (void)state;
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  PP_ASSERT(pages > 0 && psz > 0, "no physical memory size");
  uint64_t phys = (uint64_t)pages * (uint64_t)psz;
  char conf[128];
  pinpool_t *pool = NULL;
  (void)snprintf(conf, sizeof conf, "backend=host,grow_ahead=%llu",
                 (unsigned long long)phys + 1);
  PP_CHECK_RC(pinpool_create(conf, &pool), PINPOOL_ECONFIG);
  PP_ASSERT(pool == NULL, "a pool was made");
  PP_ASSERT(strstr(pinpool_last_error(), "grow_ahead") != NULL, "error: %s",
            pinpool_last_error());
  PP_CHECK_RC(
      pinpool_create("backend=host,grow_ahead=18446744073709551615", &pool),
      PINPOOL_ECONFIG);
  PP_ASSERT(pool == NULL, "a pool was made");
  /* At the bound: accepted (address space only, nothing grown). */
  (void)snprintf(conf, sizeof conf, "grow_ahead=%llu",
                 (unsigned long long)phys);
  PP_OK(pinpool_create_with_backend(conf, &rb_backend, &pool));
  pinpool_destroy(pool);
  pool = NULL;
  /* 3 GiB ahead on address space: made a chunk of at most 1 GiB (the
   * growth policy's largest) per look; the whole headroom was asked of
   * the backend at every look before. */
  if (phys < 4 * GiB)
    return;
  rb_reset();
  PP_OK(pinpool_create_with_backend("grow_ahead=3GiB", &rb_backend, &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, MiB, &p)); /* the first growth: inline */
  PP_ASSERT(wait_stats(pool, headroom_at_least, 3 * GiB), "no headroom");
  PP_ASSERT(atomic_load(&rb_max) <= GiB,
            "the backend was asked for %llu bytes at once",
            atomic_load(&rb_max));
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- Items 2, 3: the retry and the claims in flight ----------------------
 * The hook holds a thread in a window where a chunk's max_reserved claim is
 * not matched by the arena (the grower's chunk made and not yet entered;
 * a released chunk out of the arena and not yet given back); the
 * allocating thread's retry lets it go on when it starts to wait for it
 * (PP_HOOK_RETRY_SETTLE). Before the fix the retry did not wait: it found
 * nothing to release and failed, and the hook let the held thread go
 * after the allocation returned. */
static atomic_int hold_point; /* the hook point to hold at, once */
static atomic_int held, settled_seen;
static sem_t hold_go;

static void hold_hook(int point) {
  if (point == PP_HOOK_RETRY_SETTLE) {
    atomic_store(&settled_seen, 1);
    if (atomic_load(&held) == 1)
      (void)sem_post(&hold_go);
    return;
  }
  int want = atomic_load(&hold_point);
  if (want == 0 || point != want ||
      !atomic_compare_exchange_strong(&hold_point, &want, 0))
    return;
  atomic_store(&held, 1);
  while (sem_wait(&hold_go) != 0)
    ;
  atomic_store(&held, 2);
}

static void hold_arm(int point) {
  (void)sem_init(&hold_go, 0, 0);
  atomic_store(&held, 0);
  atomic_store(&settled_seen, 0);
  atomic_store(&hold_point, point);
  atomic_store(&pp_test_hook, hold_hook);
}

static void hold_wait(void) {
  for (int i = 0; i < 10000 && atomic_load(&held) == 0; i++)
    pp_sleep_ms(1);
  PP_ASSERT(atomic_load(&held) == 1, "nothing held in the window");
}

/* Lets the held thread go if the allocation did not (before the fix). */
static void hold_end(void) {
  if (atomic_load(&held) == 1 && atomic_load(&settled_seen) == 0)
    (void)sem_post(&hold_go);
  for (int i = 0; i < 10000 && atomic_load(&held) == 1; i++)
    pp_sleep_ms(1);
  atomic_store(&pp_test_hook, NULL);
  atomic_store(&hold_point, 0);
  (void)sem_destroy(&hold_go);
}

static void retry_grower_claim(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend("max_reserved=32MiB,grow_ahead=16MiB",
                                    &rb_backend, &pool));
  hold_arm(PP_HOOK_GROW_AHEAD);
  void *a = NULL, *b = NULL;
  PP_OK(pinpool_alloc(pool, 8 * MiB, &a)); /* inline: the grower starts */
  hold_wait(); /* its 16 MiB chunk claimed, not in the arena */
  /* 8 + 20 MiB fit under 32 MiB without grow-ahead; 20 MiB does not fit
   * in the grower's chunk, so it waits in the retry, not as a join. */
  int rc = pinpool_alloc(pool, 20 * MiB, &b);
  hold_end();
  PP_ASSERT(rc == 0 && atomic_load(&settled_seen) == 1,
            "20 MiB with 8 MiB live under a 32 MiB cap, the grower's chunk "
            "in flight: rc %d (%s), retry waited: %d",
            rc, pinpool_last_error(), atomic_load(&settled_seen));
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.reserved_bytes.current <= 32 * MiB, "reserved %llu",
            (unsigned long long)st.reserved_bytes.current);
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

static pinpool_t *rel_pool;
static void *releaser(void *arg) {
  (void)arg;
  PP_OK(pinpool_empty_cache(rel_pool));
  return NULL;
}

static void retry_release_claim(void **state) {
  (void)state;
  PP_OK(pinpool_create_with_backend("max_reserved=32MiB,tcache_bytes=0",
                                    &rb_backend, &rel_pool));
  void *x = NULL, *y = NULL;
  PP_OK(pinpool_alloc(rel_pool, 16 * MiB, &x));
  PP_OK(pinpool_free(rel_pool, x)); /* a 16 MiB chunk, free */
  hold_arm(PP_HOOK_ARENA_RELEASE);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, releaser, NULL) == 0, "thread");
  hold_wait(); /* the chunk out of the arena, its claim not yet dropped */
  int rc = pinpool_alloc(rel_pool, 24 * MiB, &y);
  hold_end();
  pthread_join(t, NULL);
  PP_ASSERT(rc == 0 && atomic_load(&settled_seen) == 1,
            "24 MiB under a 32 MiB cap during another thread's release: rc "
            "%d (%s), retry waited: %d",
            rc, pinpool_last_error(), atomic_load(&settled_seen));
  PP_OK(pinpool_free(rel_pool, y));
  PP_OK(pinpool_validate(rel_pool));
  pinpool_destroy(rel_pool);
  rel_pool = NULL;
}

/* ---- Item 6: what the retry releases ------------------------------------
 * D6's general case: a request that the cap refuses even with every whole
 * free chunk given back fails with nothing released; one that a release
 * can make fit releases only what the cap lacks. The address-space
 * backend has no alloc_at: chunks never join a run, so each free chunk is
 * room for its own size only. */
static void retry_changes_nothing(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend("max_reserved=64MiB", &rb_backend, &pool));
  void *a = NULL, *b = NULL, *c = NULL;
  PP_OK(pinpool_alloc(pool, 40 * MiB, &a)); /* a 40 MiB chunk, in use */
  PP_OK(pinpool_alloc(pool, 8 * MiB, &b));  /* an 8 MiB chunk */
  PP_OK(pinpool_free(pool, b));
  pinpool_stats_t st0 = pp_stats_of(pool);
  /* 40 MiB held by a live block: at most 24 MiB can ever be added. */
  PP_CHECK_RC(pinpool_alloc(pool, 30 * MiB, &c), PINPOOL_ENOMEM);
  PP_ASSERT(strstr(pinpool_last_error(), "max_reserved") != NULL, "error: %s",
            pinpool_last_error());
  pinpool_stats_t st1 = pp_stats_of(pool);
  PP_ASSERT(st1.cached_bytes.current == st0.cached_bytes.current &&
                st1.arena_chunks == st0.arena_chunks &&
                st1.trimmed_segments == st0.trimmed_segments &&
                st1.backend_free.count == st0.backend_free.count,
            "a failed allocation released memory: cached %llu -> %llu, "
            "chunks %llu -> %llu",
            (unsigned long long)st0.cached_bytes.current,
            (unsigned long long)st1.cached_bytes.current,
            (unsigned long long)st0.arena_chunks,
            (unsigned long long)st1.arena_chunks);
  PP_ASSERT(st1.oom_count == st0.oom_count + 1 && st1.retries == st0.retries,
            "oom %llu -> %llu, retries %llu -> %llu",
            (unsigned long long)st0.oom_count,
            (unsigned long long)st1.oom_count, (unsigned long long)st0.retries,
            (unsigned long long)st1.retries);
  /* The cached chunk is still there: the next 8 MiB is a hit. */
  PP_OK(pinpool_alloc(pool, 8 * MiB, &b));
  pinpool_stats_t st2 = pp_stats_of(pool);
  PP_ASSERT(st2.backend_alloc.count == st1.backend_alloc.count,
            "the 8 MiB block needed a new chunk");
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

static void retry_releases_what_it_needs(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create_with_backend("max_reserved=64MiB", &rb_backend, &pool));
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  PP_OK(pinpool_alloc(pool, 24 * MiB, &a)); /* in use */
  PP_OK(pinpool_alloc(pool, 16 * MiB, &b));
  PP_OK(pinpool_alloc(pool, 16 * MiB, &c));
  PP_OK(pinpool_free(pool, b));
  PP_OK(pinpool_free(pool, c)); /* two free 16 MiB chunks: 56 of 64 MiB */
  pinpool_stats_t st0 = pp_stats_of(pool);
  PP_ASSERT(st0.arena_chunks == 3, "%llu chunks",
            (unsigned long long)st0.arena_chunks);
  /* 24 MiB: 8 left under the cap, one 16 MiB chunk released is enough. */
  PP_OK(pinpool_alloc(pool, 24 * MiB, &d));
  pinpool_stats_t st1 = pp_stats_of(pool);
  PP_ASSERT(st1.trimmed_segments == st0.trimmed_segments + 1 &&
                st1.arena_chunks == 3 && st1.retries == st0.retries + 1,
            "released %llu chunks for 8 MiB lacking (%llu chunks left)",
            (unsigned long long)(st1.trimmed_segments - st0.trimmed_segments),
            (unsigned long long)st1.arena_chunks);
  PP_OK(pinpool_free(pool, d));
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_validate(pool));
  pinpool_destroy(pool);
}

/* ---- Item 10: the last error of a call that succeeded ------------------- */
static void last_error_kept(void **state) {
  (void)state;
  /* The cap refuses the growth (a free chunk to give back), and the
   * backend refuses once (fault=alloc:2: every chunk given back). */
  const char *confs[] = {"max_reserved=16MiB", "fault=alloc:2"};
  for (int k = 0; k < 2; k++) {
    pinpool_t *pool = NULL;
    PP_OK(pinpool_create_with_backend(confs[k], &rb_backend, &pool));
    void *a = NULL, *b = NULL;
    PP_OK(pinpool_alloc(pool, 8 * MiB, &a));
    PP_OK(pinpool_free(pool, a));
    PP_CHECK_RC(pinpool_free(pool, NULL), PINPOOL_EINVAL);
    char before[256];
    (void)snprintf(before, sizeof before, "%s", pinpool_last_error());
    pinpool_stats_t st0 = pp_stats_of(pool);
    PP_OK(pinpool_alloc(pool, 12 * MiB, &b));
    pinpool_stats_t st1 = pp_stats_of(pool);
    PP_ASSERT(st1.retries == st0.retries + 1, "%s: no retry", confs[k]);
    PP_ASSERT(strcmp(pinpool_last_error(), before) == 0,
              "%s: an allocation that succeeded left \"%s\" (was \"%s\")",
              confs[k], pinpool_last_error(), before);
    PP_OK(pinpool_free(pool, b));
    pinpool_destroy(pool);
  }
  /* The class: every path an allocation can succeed through (the retry,
   * a chunk that could not be locked, a refusal of populate or of the
   * backend at each call in turn, under a cap) leaves the last error as
   * it was. */
  static const char *const sites[] = {"alloc", "populate", "mlock"};
  for (int k = 0; k < 3; k++)
    for (int n = 1; n <= 4; n++) {
      char conf[128];
      (void)snprintf(conf, sizeof conf,
                     "backend=host,mlock=1,populate=0,max_reserved=20MiB,"
                     "tcache_bytes=0,fault=%s:%d:2",
                     sites[k], n);
      pinpool_t *pool = NULL;
      PP_OK(pinpool_create(conf, &pool));
      void *p[8] = {0};
      for (int i = 0; i < 8; i++) {
        PP_CHECK_RC(pinpool_free(pool, NULL), PINPOOL_EINVAL);
        char before[256];
        (void)snprintf(before, sizeof before, "%s", pinpool_last_error());
        size_t sz = (size_t)(2 + i % 3) * MiB;
        if (pinpool_alloc(pool, sz, &p[i]) != 0) {
          p[i] = NULL;
        } else {
          PP_ASSERT(strcmp(pinpool_last_error(), before) == 0,
                    "%s, allocation %d succeeded and left \"%s\"", conf, i,
                    pinpool_last_error());
        }
        if (i % 2 == 1 && p[i - 1] != NULL) { /* room for the retry */
          PP_OK(pinpool_free(pool, p[i - 1]));
          p[i - 1] = NULL;
        }
      }
      for (int i = 0; i < 8; i++)
        if (p[i] != NULL)
          PP_OK(pinpool_free(pool, p[i]));
      PP_OK(pinpool_validate(pool));
      pinpool_destroy(pool);
    }
}

/* ---- Item 8: a thread's exit trims --------------------------------------
 * The exiting thread's cache goes back to the pool, idle: the caps apply
 * to it at once, as after pinpool_thread_flush (whole chunks: at most one
 * chunk over). Before, 12 MiB stayed cached under max_cached=4MiB until
 * another thread's next free. */
static pinpool_t *exit_pool;
static void *exit_worker(void *arg) {
  (void)arg;
  void *b[16];
  for (int i = 0; i < 16; i++)
    PP_OK(pinpool_alloc(exit_pool, MiB, &b[i]));
  for (int i = 0; i < 16; i++)
    PP_OK(pinpool_free(exit_pool, b[i]));
  return NULL;
}

static void exit_trims(void **state) {
  (void)state;
  PP_OK(
      pinpool_create_with_backend("max_cached=4MiB", &rb_backend, &exit_pool));
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, exit_worker, NULL) == 0, "thread");
  pthread_join(t, NULL);
  pinpool_stats_t st = pp_stats_of(exit_pool);
  PP_ASSERT(st.cached_bytes.current <= 6 * MiB,
            "%llu bytes cached under max_cached=4MiB after the thread's exit",
            (unsigned long long)st.cached_bytes.current);
  PP_OK(pinpool_validate(exit_pool));
  pinpool_destroy(exit_pool);
  exit_pool = NULL;
}

/* ---- Item 7: a full poll and a queue another thread polls ----------------
 * 300 blocks freed on one stream, every event completed. A miss (its poll
 * bounded: PP_MISS_BUDGET events) is held in its first query of the
 * queue's head; process_events runs meanwhile on another thread, and the
 * miss is let go once process_events waits for it (PP_HOOK_POLL_WAIT), or
 * returned (before the fix it skipped the queue). After both, nothing
 * completed is pending; before: 236 (the miss took its 64, process_events
 * none). */
#define PW_BLOCKS 300
typedef struct pw_event {
  int done;
} pw_event_t;
static pthread_t pw_miss_thread;
static atomic_int pw_gate, pw_in_query, pw_waiting, pw_returned;
static sem_t pw_go;
static pinpool_t *pw_pool;

static int pw_record(void *ctx, pinpool_stream_t s, void **ev) {
  (void)ctx;
  (void)s;
  pw_event_t *e = calloc(1, sizeof *e);
  if (e == NULL)
    return PINPOOL_ENOMEM;
  e->done = 1;
  *ev = e;
  return 0;
}

static int pw_query(void *ctx, void *ev) {
  (void)ctx;
  if (pthread_equal(pthread_self(), pw_miss_thread) &&
      atomic_exchange(&pw_gate, 0) != 0) {
    atomic_store(&pw_in_query, 1);
    while (sem_wait(&pw_go) != 0)
      ;
  }
  return ((pw_event_t *)ev)->done;
}

static int pw_sync(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  return 0;
}

static void pw_release(void *ctx, void *ev) {
  (void)ctx;
  free(ev);
}

static void pw_hook(int point) {
  if (point == PP_HOOK_POLL_WAIT)
    atomic_store(&pw_waiting, 1);
}

static void *pw_miss(void *arg) {
  (void)arg;
  void *b = NULL;
  PP_OK(pinpool_alloc(pw_pool, 3 * MiB, &b)); /* a miss: a bounded poll */
  PP_OK(pinpool_free(pw_pool, b));
  return NULL;
}

static void *pw_process(void *arg) {
  (void)arg;
  PP_OK(pinpool_process_events(pw_pool));
  atomic_store(&pw_returned, 1);
  return NULL;
}

static void process_waits_for_poller(void **state) {
  (void)state;
  pinpool_events_t ev = {"user",  pw_record,  pw_query,
                         pw_sync, pw_release, NULL};
  pinpool_hooks_t hooks = {NULL, &ev, NULL, NULL};
  PP_OK(pinpool_create_ex("backend=host,mlock=0", &hooks, &pw_pool));
  static void *b[PW_BLOCKS];
  for (int i = 0; i < PW_BLOCKS; i++) {
    PP_OK(pinpool_alloc(pw_pool, 4096, &b[i]));
    PP_OK(pinpool_record_stream(pw_pool, b[i], 7));
  }
  for (int i = 0; i < PW_BLOCKS; i++)
    PP_OK(pinpool_free(pw_pool, b[i]));
  pinpool_stats_t st0 = pp_stats_of(pw_pool);
  PP_ASSERT(st0.pending_blocks == PW_BLOCKS, "%llu pending",
            (unsigned long long)st0.pending_blocks);
  (void)sem_init(&pw_go, 0, 0);
  atomic_store(&pw_in_query, 0);
  atomic_store(&pw_waiting, 0);
  atomic_store(&pw_returned, 0);
  atomic_store(&pp_test_hook, pw_hook);
  atomic_store(&pw_gate, 1);
  pthread_t tp;
  PP_ASSERT(pthread_create(&pw_miss_thread, NULL, pw_miss, NULL) == 0, "t");
  for (int i = 0; i < 10000 && atomic_load(&pw_in_query) == 0; i++)
    pp_sleep_ms(1);
  PP_ASSERT(atomic_load(&pw_in_query) == 1, "the miss never polled");
  PP_ASSERT(pthread_create(&tp, NULL, pw_process, NULL) == 0, "t");
  for (int i = 0; i < 10000 && atomic_load(&pw_waiting) == 0 &&
                  atomic_load(&pw_returned) == 0;
       i++)
    pp_sleep_ms(1);
  bool waited = atomic_load(&pw_waiting) == 1;
  (void)sem_post(&pw_go);
  pthread_join(tp, NULL);
  pthread_join(pw_miss_thread, NULL);
  atomic_store(&pp_test_hook, NULL);
  (void)sem_destroy(&pw_go);
  pinpool_stats_t st1 = pp_stats_of(pw_pool);
  PP_ASSERT(waited && st1.pending_blocks == 0,
            "process_events with a miss polling the queue: %s, %llu of %d "
            "completed blocks still pending after both",
            waited ? "waited" : "did not wait",
            (unsigned long long)st1.pending_blocks, PW_BLOCKS);
  PP_OK(pinpool_validate(pw_pool));
  pinpool_destroy(pw_pool);
  pw_pool = NULL;
}

/* ---- Item 9: what backend_alloc.count counts ----------------------------
 * docs/stats.md said backend_alloc.count - grow_ahead_chunks equals
 * cache_misses; a grower's chunk that a release made it give back unused,
 * and a failed backend call, are counted in backend_alloc and in neither
 * (reviewer's r3). The formula as documented now, in the three cases. */
static bool backend_calls_at_least(const pinpool_stats_t *st, uint64_t n) {
  return st->backend_alloc.count >= n;
}

static bool backend_frees_at_least(const pinpool_stats_t *st, uint64_t n) {
  return st->backend_free.count >= n;
}

static void check_formula(pinpool_t *pool, uint64_t failed, uint64_t lost,
                          const char *what) {
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.backend_alloc.count - st.grow_ahead_chunks ==
                st.cache_misses + failed + lost,
            "%s: backend_alloc.count %llu - grow_ahead_chunks %llu != "
            "cache_misses %llu + failed %llu + given back unused %llu",
            what, (unsigned long long)st.backend_alloc.count,
            (unsigned long long)st.grow_ahead_chunks,
            (unsigned long long)st.cache_misses, (unsigned long long)failed,
            (unsigned long long)lost);
}

static void backend_count_formula(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *a = NULL;
  /* Neither: the grower's chunk enters. */
  PP_OK(pinpool_create_with_backend("grow_ahead=16MiB", &rb_backend, &pool));
  PP_OK(pinpool_alloc(pool, 8 * MiB, &a));
  PP_ASSERT(wait_stats(pool, headroom_at_least, 16 * MiB), "no headroom");
  check_formula(pool, 0, 0, "grown ahead");
  PP_OK(pinpool_free(pool, a));
  pinpool_destroy(pool);
  /* The grower's call fails (the second backend call). */
  PP_OK(pinpool_create_with_backend("grow_ahead=16MiB,fault=alloc:2",
                                    &rb_backend, &pool));
  PP_OK(pinpool_alloc(pool, 8 * MiB, &a));
  PP_ASSERT(wait_stats(pool, backend_calls_at_least, 2), "no second call");
  check_formula(pool, 1, 0, "the grower's call failed");
  PP_OK(pinpool_free(pool, a));
  pinpool_destroy(pool);
  /* A release while the grower's chunk is in flight: it goes back. */
  PP_OK(pinpool_create_with_backend("grow_ahead=16MiB,tcache_bytes=0",
                                    &rb_backend, &pool));
  hold_arm(PP_HOOK_GROW_AHEAD);
  PP_OK(pinpool_alloc(pool, 8 * MiB, &a));
  hold_wait();
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_empty_cache(pool)); /* the 8 MiB chunk: a release */
  hold_end(); /* lets the grower go: its chunk goes back unused */
  PP_ASSERT(wait_stats(pool, backend_frees_at_least, 2),
            "the grower's chunk was kept");
  check_formula(pool, 0, 1, "a release while the grower's chunk was made");
  pinpool_destroy(pool);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(chunk_pages),
      cmocka_unit_test(grow_ahead_bounds),
      cmocka_unit_test(retry_grower_claim),
      cmocka_unit_test(retry_release_claim),
      cmocka_unit_test(retry_changes_nothing),
      cmocka_unit_test(retry_releases_what_it_needs),
      cmocka_unit_test(last_error_kept),
      cmocka_unit_test(exit_trims),
      cmocka_unit_test(process_waits_for_poller),
      cmocka_unit_test(backend_count_formula),
  };
  return pp_run_selected("test_core37", all, sizeof all / sizeof all[0], argc,
                         argv);
}
