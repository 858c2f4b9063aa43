/* The segment map's lock-free lookup against the recycling of a segment
 * descriptor in the same map chunk (segmap.c, pp_segmap_find).
 *
 * A chunk of the map (256 KiB) holds two segments: A, which covers its first
 * byte (slot 0, looked at first), and S, which starts inside it (slot 1). A
 * block at the start of S stays allocated while another thread releases A
 * and allocates again, over and over, so that A's descriptor alternates
 * between A's addresses (512 KiB) and a 1 MiB segment far away. A lookup
 * that reads A's old base with the new size (or the new base with the old
 * size) sees a range that covers S's block: pinpool_block_size then failed
 * with PINPOOL_ENOTOWNED ("in a segment's unused tail") for a live block, as
 * test_stress did once in CI (tcache_bytes=0,shards=1,max_cached=16MiB).
 * Before the fix this failed within a fraction of a second on two cores. */
#include "testutil.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

static char *region; /* 2 MiB aligned: chunks line up with its offsets */

/* Addresses by size: the pool asks for 512 KiB (the first segment of the
 * 512-byte class), 4 x 208 KiB (the first of the 208 KiB class) and 1 MiB
 * (the first of the 256 KiB class). */
static int fixed_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  if (size == 512 * KiB)
    *out = region + 64 * KiB; /* A: [64 KiB, 576 KiB), slot 0 of chunk 2 */
  else if (size == 4 * 208 * KiB)
    *out = region + 576 * KiB; /* S: starts inside chunk 2, slot 1 */
  else if (size == 1 * MiB)
    *out = region + 16 * MiB; /* far from both */
  else
    return PINPOOL_ENOMEM;
  return 0;
}

static void fixed_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)ptr;
  (void)size;
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
  char *m = mmap(NULL, 20 * MiB, PROT_READ | PROT_WRITE,
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
  PP_OK(pinpool_create_with_backend("tcache_bytes=0,shards=1", &be, &r->pool));
  PP_OK(pinpool_alloc(r->pool, 200 * KiB, &r->live));
  assert_ptr_equal(r->live, region + 576 * KiB);

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
    assert_ptr_equal(b, region + 16 * MiB); /* A's descriptor, 1 MiB */
    PP_OK(pinpool_free(r->pool, b));
    PP_OK(pinpool_empty_cache(r->pool));
    if ((++cycles & 255) == 0 && now_s() > end)
      break;
  }
  atomic_store(&r->stop, 1);
  pthread_join(t, NULL);
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
  munmap(m, 20 * MiB);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_lookup_vs_neighbour_recycled),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
