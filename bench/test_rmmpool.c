/*
 * test_rmmpool — checks of the benchmark's RMM-policy reference pool
 * (rmmpool.c), so that the peer the suite compares pinpool with does what
 * its description says (ctest bench_rmmpool):
 *  - live blocks never overlap and keep their contents (random sizes,
 *    random streams, frees on other streams than the allocation's);
 *  - best fit: the smallest fitting free block is taken, at its lowest
 *    address;
 *  - coalescing: once everything is freed and the lists merged, each chunk
 *    is one free block again; chunks never merge with each other;
 *  - growth: by max(request, pool size), never while a free block fits;
 *  - stream-ordered frees: a block freed with an event is not handed out
 *    before the event completed, and then it is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmmpool.h"

static int g_fails;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                     \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      g_fails++;                                                               \
    }                                                                          \
  } while (0)

#define MIB ((size_t)1 << 20)

/* Events: a ticket per record; complete once g_done passes it. */
static uint64_t g_next, g_done;

static int ev_record(void *ctx, uintptr_t stream, refpool_event_t *ev) {
  (void)ctx;
  ev->stream = stream;
  ev->ticket = ++g_next;
  return 0;
}

static int ev_query(void *ctx, const refpool_event_t *ev) {
  (void)ctx;
  return ev->ticket <= g_done;
}

static const refpool_events_t g_ev = {ev_record, ev_query, NULL};

typedef struct live {
  unsigned char *p;
  size_t size;
  unsigned char tag;
} live_t;

static size_t round256(size_t n) { return (n + 255) & ~(size_t)255; }

static void test_random(void) {
  rmmpool_t *rp;
  CHECK(rmmpool_create(0, &g_ev, NULL, &rp) == 0, "create");
  enum { N = 600 };
  live_t *v = calloc(N, sizeof *v);
  size_t n = 0;
  unsigned seed = 12345;
  for (int it = 0; it < 40000; it++) {
    seed = seed * 1103515245u + 12345u;
    unsigned r = seed >> 8;
    if (n < N && (n == 0 || (r & 1))) {
      size_t size = 1 + r % (512 * 1024);
      unsigned char *p = rmmpool_alloc(rp, size, (r >> 3) % 3);
      CHECK(p != NULL, "alloc %zu", size);
      if (p == NULL)
        break;
      v[n] = (live_t){p, size, (unsigned char)it};
      memset(p, v[n].tag, size);
      n++;
    } else {
      size_t k = (r >> 4) % n;
      CHECK(v[k].p[0] == v[k].tag && v[k].p[v[k].size - 1] == v[k].tag,
            "block %p overwritten", (void *)v[k].p);
      rmmpool_free(rp, v[k].p, v[k].size, (r >> 2) % 3, false);
      v[k] = v[--n];
    }
  }
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      CHECK(v[i].p + round256(v[i].size) <= v[j].p ||
                v[j].p + round256(v[j].size) <= v[i].p,
            "blocks overlap");
  while (n > 0) {
    n--;
    rmmpool_free(rp, v[n].p, v[n].size, 0, false);
  }
  rmmpool_stats_t s;
  rmmpool_get_stats(rp, &s);
  CHECK(s.steals > 0 && s.list_merges > 0, "no steal or merge (%llu, %llu)",
        (unsigned long long)s.steals, (unsigned long long)s.list_merges);
  /* A request larger than the pool merges every list and grows once. */
  size_t big = (size_t)s.reserved_bytes + 1;
  void *p = rmmpool_alloc(rp, big, 0);
  CHECK(p != NULL, "alloc of the whole pool + 1");
  rmmpool_free(rp, p, big, 0, false);
  uint64_t chunks = s.chunks + 1;
  rmmpool_get_stats(rp, &s);
  CHECK(s.chunks == chunks, "chunks %llu, want %llu",
        (unsigned long long)s.chunks, (unsigned long long)chunks);
  CHECK(s.free_blocks == s.chunks,
        "after freeing everything: %llu free blocks in %llu chunks",
        (unsigned long long)s.free_blocks, (unsigned long long)s.chunks);
  rmmpool_destroy(rp);
  free(v);
}

static void test_fit_and_growth(void) {
  rmmpool_t *rp;
  CHECK(rmmpool_create(16 * MIB, NULL, NULL, &rp) == 0, "create");
  rmmpool_stats_t s;
  rmmpool_get_stats(rp, &s);
  CHECK(s.chunks == 1 && s.reserved_bytes == 16 * MIB, "initial chunk");
  /* a(1) b(2) c(1) d(3) e(1) f(rest): free b and d; a 2 MiB request takes
   * b (best fit), not d or the tail. */
  char *a = rmmpool_alloc(rp, 1 * MIB, 0), *b = rmmpool_alloc(rp, 2 * MIB, 0);
  char *c = rmmpool_alloc(rp, 1 * MIB, 0), *d = rmmpool_alloc(rp, 3 * MIB, 0);
  char *e = rmmpool_alloc(rp, 1 * MIB, 0);
  CHECK(b == a + MIB && c == b + 2 * MIB && d == c + MIB && e == d + 3 * MIB,
        "blocks not carved in address order");
  rmmpool_free(rp, d, 3 * MIB, 0, false);
  rmmpool_free(rp, b, 2 * MIB, 0, false);
  char *x = rmmpool_alloc(rp, 2 * MIB, 0);
  CHECK(x == b, "best fit took %p, want %p", (void *)x, (void *)b);
  /* 2.5 MiB: only d fits among the holes (the tail is 8 MiB): d. */
  char *y = rmmpool_alloc(rp, 2 * MIB + MIB / 2, 0);
  CHECK(y == d, "best fit took %p, want %p", (void *)y, (void *)d);
  /* Free c and the rest of d's hole coalesce with their neighbours:
   * c (1) + y's tail (0.5) are not adjacent (y sits between), so free y:
   * c + d = 4 MiB in one block. */
  rmmpool_free(rp, y, 2 * MIB + MIB / 2, 0, false);
  rmmpool_free(rp, c, 1 * MIB, 0, false);
  char *z = rmmpool_alloc(rp, 4 * MIB, 0);
  CHECK(z == c, "coalesced hole not reused: %p, want %p", (void *)z, (void *)c);
  /* No growth while a block fits; growth by max(request, pool size). */
  rmmpool_get_stats(rp, &s);
  CHECK(s.chunks == 1, "grew while a block fit");
  char *w = rmmpool_alloc(rp, 20 * MIB, 0);
  CHECK(w != NULL, "alloc 20 MiB");
  rmmpool_get_stats(rp, &s);
  CHECK(s.chunks == 2 && s.reserved_bytes == 16 * MIB + 20 * MIB,
        "growth: %llu chunks, %llu bytes", (unsigned long long)s.chunks,
        (unsigned long long)s.reserved_bytes);
  char *u = rmmpool_alloc(rp, 9 * MIB, 0); /* tail of 8 MiB: no fit */
  CHECK(u != NULL, "alloc 9 MiB");
  rmmpool_get_stats(rp, &s);
  CHECK(s.chunks == 3 && s.reserved_bytes == 2 * (16 + 20) * MIB,
        "growth by the pool size: %llu bytes",
        (unsigned long long)s.reserved_bytes);
  rmmpool_destroy(rp);
}

static void test_events(void) {
  rmmpool_t *rp;
  g_next = g_done = 0;
  CHECK(rmmpool_create(4 * MIB, &g_ev, NULL, &rp) == 0, "create");
  char *a = rmmpool_alloc(rp, 4 * MIB, 7); /* steals stream 0's chunk */
  rmmpool_free(rp, a, 4 * MIB, 7, true);   /* event 1, not complete */
  char *b = rmmpool_alloc(rp, 4 * MIB, 7);
  CHECK(b != a, "a block was reused before its event completed");
  rmmpool_stats_t s;
  rmmpool_get_stats(rp, &s);
  CHECK(s.pending_blocks == 1, "pending %llu",
        (unsigned long long)s.pending_blocks);
  g_done = 1;
  char *c = rmmpool_alloc(rp, 4 * MIB, 8); /* another stream: steals */
  CHECK(c == a, "the completed block was not reused");
  rmmpool_get_stats(rp, &s);
  CHECK(s.pending_blocks == 0 && s.reclaim_count == 1 && s.steals == 2,
        "pending %llu, reclaimed %llu, steals %llu",
        (unsigned long long)s.pending_blocks,
        (unsigned long long)s.reclaim_count, (unsigned long long)s.steals);
  rmmpool_destroy(rp);
}

int main(void) {
  test_random();
  test_fit_and_growth();
  test_events();
  if (g_fails) {
    fprintf(stderr, "%d failure(s)\n", g_fails);
    return 1;
  }
  printf("test_rmmpool: OK\n");
  return 0;
}
