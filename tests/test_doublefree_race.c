/*
 * Two threads free the same block at the same moment: exactly one call
 * succeeds and the other gets PINPOOL_EDOUBLEFREE, round after round, and
 * the pool stays consistent. This is what the compare-and-swap on the
 * block's state word in pinpool_free buys (src/alloc.c); with a plain load
 * and store both calls can succeed and the block is cached twice, which
 * the count below and pinpool_validate catch.
 */
#include "testutil.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

/* Rounds: PINPOOL_RACE_ROUNDS, default 3000 (the load/store mutant fails
 * within a few hundred on two cores). */
static int g_rounds = 3000;

static pinpool_t *g_pool;
static void *_Atomic g_ptr;
static _Atomic(int) g_round, g_arrived, g_ok, g_double;

static void *racer(void *arg) {
  (void)arg;
  for (int r = 1; r <= g_rounds; r++) {
    while (atomic_load(&g_round) < r) /* wait for the block of round r */
      sched_yield();
    atomic_fetch_add(&g_arrived, 1);
    while (atomic_load(&g_arrived) < 2 * r) /* both racers line up */
      ;
    int rc = pinpool_free(g_pool, atomic_load(&g_ptr));
    if (rc == 0)
      atomic_fetch_add(&g_ok, 1);
    else if (rc == PINPOOL_EDOUBLEFREE)
      atomic_fetch_add(&g_double, 1);
  }
  return NULL;
}

static void test_concurrent_double_free(void **state) {
  (void)state;
  /* No thread cache: the freed block goes straight back to the bin, so a
   * block cached twice would be handed out twice below. */
  PP_OK(pinpool_create("tcache_bytes=0", &g_pool));
  pthread_t t[2];
  for (int i = 0; i < 2; i++)
    pthread_create(&t[i], NULL, racer, NULL);
  for (int r = 1; r <= g_rounds; r++) {
    void *p;
    PP_OK(pinpool_alloc(g_pool, 4096, &p));
    atomic_store(&g_ptr, p);
    atomic_store(&g_round, r);
    while (atomic_load(&g_ok) + atomic_load(&g_double) < 2 * r)
      sched_yield();
    PP_ASSERT(atomic_load(&g_ok) == r,
              "round %d: %d successful frees of one block", r,
              atomic_load(&g_ok));
  }
  for (int i = 0; i < 2; i++)
    pthread_join(t[i], NULL);
  PP_ASSERT(atomic_load(&g_double) == g_rounds, "%d double frees reported",
            atomic_load(&g_double));
  /* A block cached twice would come out twice among live allocations. */
  void *live[64];
  for (int i = 0; i < 64; i++) {
    PP_OK(pinpool_alloc(g_pool, 4096, &live[i]));
    for (int j = 0; j < i; j++)
      PP_ASSERT(live[j] != live[i], "block %p handed out twice", live[i]);
  }
  for (int i = 0; i < 64; i++)
    PP_OK(pinpool_free(g_pool, live[i]));
  PP_CHECK_CONSISTENT(g_pool);
  pinpool_destroy(g_pool);
}

int main(void) {
  pp_clean_env();
  const char *r = getenv("PINPOOL_RACE_ROUNDS");
  if (r != NULL && atoi(r) > 0)
    g_rounds = atoi(r);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_concurrent_double_free),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
