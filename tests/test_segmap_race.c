/* The segment map's lock-free lookup against the recycling of a segment
 * descriptor in the same map chunk (segmap.c, pp_segmap_find).
 *
 * A chunk of the map (256 KiB) holds two segments: A, which covers its first
 * byte (slot 0, looked at first), and S, which starts inside it (slot 1):
 * two slabs carved side by side from one arena chunk (the reserve). A block
 * at the start of S stays allocated while another thread releases A
 * (empty_cache gives its slab back to the arena) and allocates again, over
 * and over, so that A's descriptor alternates between A's addresses
 * (512 KiB) and a 1 MiB slab carved after S, outside the map chunk. A lookup
 * that reads A's old base with the new size (or the new base with the old
 * size) sees a range that covers S's block: pinpool_block_size then failed
 * with PINPOOL_ENOTOWNED ("in a segment's unused tail") for a live block, as
 * test_stress did once in CI (tcache_bytes=0,shards=1,max_cached=16MiB).
 * Before the fix this failed within a fraction of a second on two cores. */
#include "testutil.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static char *region; /* 2 MiB aligned: map chunks line up with its offsets */
#define REGION (40 * MiB)
#define FIRST (64 * KiB) /* the first arena chunk's offset: the reserve */
#define FAR (16 * MiB)   /* any other chunk's (the test expects none) */

/* Arena chunks at fixed addresses, whatever their size: the first (the
 * 4 MiB reserve, [64 KiB, 4160 KiB)) at region + 64 KiB, any other (one at
 * a time) at region + 16 MiB. The pool carves from the reserve, in this
 * order, the first slab of the 512-byte class (512 KiB, A: [64 KiB,
 * 576 KiB), slot 0 of map chunk 2), the first of the 208 KiB class
 * (4 x 208 KiB, S: [576 KiB, 1408 KiB), starting inside map chunk 2, slot
 * 1), and, A released, the first of the 256 KiB class (1 MiB): too big for
 * A's hole, so carved after S, never in map chunk 2. The cycles make no
 * backend call: they are fast, and the race is hit early (without the
 * seqlock of pp_segmap_find, 10 runs out of 10 failed, most within 0.1 s;
 * with a second chunk made and released every cycle, 6 out of 8). */
static bool first_live, far_live;

static int fixed_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  if (!first_live && size <= FAR - FIRST) {
    first_live = true;
    *out = region + FIRST;
  } else if (!far_live && size <= REGION - FAR) {
    far_live = true;
    *out = region + FAR;
  } else {
    return PINPOOL_ENOMEM;
  }
  return 0;
}

static void fixed_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)size;
  if ((char *)ptr == region + FIRST)
    first_live = false;
  else if ((char *)ptr == region + FAR)
    far_live = false;
}

struct race {
  pinpool_t *pool;
  void *live;
  atomic_int stop;
  long lookups, failures;
  int rc;
  size_t bs;
  char msg[256];
};

static void *lookup_main(void *arg) {
  struct race *r = arg;
  while (!atomic_load_explicit(&r->stop, memory_order_relaxed)) {
    size_t bs = 0;
    int rc = pinpool_block_size(r->pool, r->live, &bs);
    r->lookups++;
    if (rc != 0 || bs != 208 * KiB) {
      if (r->failures++ == 0) {
        r->rc = rc;
        r->bs = bs;
        (void)snprintf(r->msg, sizeof r->msg, "%s",
                       rc != 0 ? pinpool_last_error() : "wrong size");
      }
      atomic_store(&r->stop, 1);
    }
  }
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void test_lookup_vs_neighbour_recycled(void **state) {
  (void)state;
  char *m = mmap(NULL, REGION + 2 * MiB, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  assert_true(m != MAP_FAILED);
  region = (char *)(((uintptr_t)m + 2 * MiB - 1) & ~(uintptr_t)(2 * MiB - 1));
  pinpool_backend_t be;
  memset(&be, 0, sizeof be);
  be.name = "fixed";
  be.alloc = fixed_alloc;
  be.free = fixed_free;
  struct race *r = calloc(1, sizeof *r);
  assert_non_null(r);
  PP_OK(pinpool_create_with_backend("tcache_bytes=0,shards=1,reserve=4MiB", &be,
                                    &r->pool));
  void *a0 = NULL;
  PP_OK(pinpool_alloc(r->pool, 512, &a0)); /* A first, then S after it */
  assert_ptr_equal(a0, region + 64 * KiB);
  PP_OK(pinpool_alloc(r->pool, 200 * KiB, &r->live));
  assert_ptr_equal(r->live, region + 576 * KiB);
  PP_OK(pinpool_free(r->pool, a0));
  PP_OK(pinpool_empty_cache(r->pool)); /* A released, S live */
  PP_ASSERT(pp_stats_of(r->pool).segments.current == 1, "A was not released");

  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, lookup_main, r), 0);
  double end = now_s() + 1.5;
  long cycles = 0;
  while (!atomic_load(&r->stop)) {
    void *a = NULL, *b = NULL;
    PP_OK(pinpool_alloc(r->pool, 512, &a));
    assert_ptr_equal(a, region + 64 * KiB); /* A again, its descriptor */
    PP_OK(pinpool_free(r->pool, a));
    PP_OK(pinpool_empty_cache(r->pool)); /* A released */
    PP_OK(pinpool_alloc(r->pool, 256 * KiB, &b));
    /* A's descriptor, 1 MiB after S: outside map chunk 2 (a coherent read
     * of either incarnation's bounds misses S's block). */
    PP_ASSERT((char *)b >= region + 1408 * KiB &&
                  (char *)b + MiB <= region + FIRST + 4 * MiB,
              "the 1 MiB slab at region + %td", (char *)b - region);
    PP_OK(pinpool_free(r->pool, b));
    PP_OK(pinpool_empty_cache(r->pool));
    if ((++cycles & 255) == 0 && now_s() > end)
      break;
  }
  atomic_store(&r->stop, 1);
  pthread_join(t, NULL);
  pinpool_stats_t st = pp_stats_of(r->pool);
  PP_ASSERT(st.arena_chunks == 1 && st.backend_alloc.count == 1,
            "the arena grew: %llu chunks, %llu backend allocations",
            (unsigned long long)st.arena_chunks,
            (unsigned long long)st.backend_alloc.count);
  PP_ASSERT(r->failures == 0,
            "block_size(%p) of a live block = %d, %zu (want 0, %zu) after %ld "
            "lookups, %ld recycles: %s",
            r->live, r->rc, r->bs, 208 * KiB, r->lookups, cycles, r->msg);
  print_message("%ld lookups, %ld recycles of the neighbour\n", r->lookups,
                cycles);
  PP_OK(pinpool_free(r->pool, r->live));
  PP_OK(pinpool_validate(r->pool));
  pinpool_destroy(r->pool);
  free(r);
  PP_ASSERT(!first_live && !far_live, "a chunk was not given back");
  munmap(m, REGION + 2 * MiB);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lookup_vs_neighbour_recycled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
