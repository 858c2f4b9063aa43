/* pp_bench: W7, KV-cache offload. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ==== W7: KV-cache offload ===================================================
 * Fixed-size 2 MiB pages allocated in bursts (uniform between 1/16 and 1/4
 * of the capacity), least recently used pages freed to stay under the live
 * cap (1 GiB; quick 64 MiB; split between threads); after each burst a
 * random tenth of the live pages is accessed (moved to most recently used).
 * Timed per page: the LRU free it needs + allocation + use. */

typedef struct w7_arg {
  size_t page;
  size_t cap;
  uint64_t warm;
  span_t span;
} w7_arg_t;

typedef struct lru_node {
  void *p;
  void *ctx;
  uint32_t prev, next;
} lru_node_t;

#define LRU_NIL UINT32_MAX

typedef struct lru {
  lru_node_t *n;
  uint32_t head, tail; /* head = most recent */
  uint32_t *free_slots;
  uint32_t nfree;
  uint32_t *live; /* slot ids of live pages (for random access) */
  uint32_t *pos;  /* slot -> index in live */
  uint32_t nlive;
} lru_t;

static void lru_unlink(lru_t *l, uint32_t s) {
  lru_node_t *x = &l->n[s];
  if (x->prev != LRU_NIL)
    l->n[x->prev].next = x->next;
  else
    l->head = x->next;
  if (x->next != LRU_NIL)
    l->n[x->next].prev = x->prev;
  else
    l->tail = x->prev;
}

static void lru_push_front(lru_t *l, uint32_t s) {
  l->n[s].prev = LRU_NIL;
  l->n[s].next = l->head;
  if (l->head != LRU_NIL)
    l->n[l->head].prev = s;
  l->head = s;
  if (l->tail == LRU_NIL)
    l->tail = s;
}

static void *w7_thread(worker_t *w) {
  const w7_arg_t *a = w->arg;
  uint32_t cap = (uint32_t)(a->cap / a->page);
  lru_t l;
  rng_t r = {0x5eed0007u + (uint64_t)w->idx * 104729u};
  uint64_t i, t1 = 0, burst_left = 0;
  bool first = true;
  l.n = pb_xmalloc(cap * sizeof *l.n);
  l.free_slots = pb_xmalloc(cap * sizeof *l.free_slots);
  l.live = pb_xmalloc(cap * sizeof *l.live);
  l.pos = pb_xmalloc(cap * sizeof *l.pos);
  l.head = l.tail = LRU_NIL;
  l.nfree = cap;
  l.nlive = 0;
  for (uint32_t k = 0; k < cap; k++)
    l.free_slots[k] = cap - 1 - k;
  pb_samples_init(&w->ns, a->span.min_ops * 2);
  pthread_barrier_wait(&pb_barrier);
  for (i = 0;; i++) {
    if (pb_phase_over(w, i, a->warm, 1, &a->span, &t1))
      break;
    if (burst_left == 0) {
      if (!first) { /* attention reads between bursts */
        for (uint32_t k = 0; k < l.nlive / 10; k++) {
          uint32_t s = l.live[pb_rng_below(&r, l.nlive)];
          lru_unlink(&l, s);
          lru_push_front(&l, s);
        }
      }
      first = false;
      burst_left = cap / 16 + pb_rng_below(&r, cap / 4 - cap / 16 + 1);
      if (burst_left < 1)
        burst_left = 1;
    }
    burst_left--;
    uint64_t t0 = pb_now_ns();
    if (l.nfree == 0) { /* evict the least recently used page */
      uint32_t s = l.tail;
      lru_unlink(&l, s);
      pb_im_free(l.n[s].p, a->page, l.n[s].ctx);
      pb_req_free(w->idx, a->page);
      uint32_t at = l.pos[s];
      l.live[at] = l.live[--l.nlive];
      l.pos[l.live[at]] = at;
      l.free_slots[l.nfree++] = s;
    }
    void *ctx = NULL;
    void *p = pb_im_alloc(a->page, &ctx);
    t1 = pb_now_ns();
    pb_req_alloc(w->idx, a->page);
    uint32_t s = l.free_slots[--l.nfree];
    l.n[s].p = p;
    l.n[s].ctx = ctx;
    lru_push_front(&l, s);
    l.pos[s] = l.nlive;
    l.live[l.nlive++] = s;
    if (i >= a->warm)
      pb_samples_add(&w->ns, t1 - t0);
  }
  w->t_end = t1;
  w->ops = i - a->warm;
  pthread_barrier_wait(&pb_barrier); /* measured phase done */
  pthread_barrier_wait(&pb_barrier); /* counters taken: clean up */
  for (uint32_t s = l.head; s != LRU_NIL; s = l.n[s].next)
    pb_im_free(l.n[s].p, a->page, l.n[s].ctx);
  free(l.n);
  free(l.free_slots);
  free(l.live);
  free(l.pos);
  return NULL;
}

void pb_w7_run(int ci) {
  worker_t ws[MAX_THREADS];
  w7_arg_t a;
  char name[96], sz[32];
  (void)ci;
  memset(ws, 0, sizeof ws);
  a.page = 2 * MIB;
  a.cap = (pb_opt.quick ? 64 * MIB : 1 * GIB) / (size_t)pb_opt.threads;
  a.warm = a.cap / a.page;
  a.span = (span_t){a.cap / a.page, 10000000, pb_min_phase_ns()};
  snprintf(name, sizeof name, "%s pages, live<=%s",
           pb_size_str(a.page, sz, sizeof sz), pb_opt.quick ? "64MiB" : "1GiB");
  pb_rec_begin("W7", name);
  pb_floor_prepare(a.cap + a.page, pb_opt.threads);
  pb_start(ws, w7_thread, &a);
  window_t win;
  pb_measure(ws, 2, &win); /* the workers' clean-up: not counted */
  samples_t all;
  pb_samples_init(&all, 1024);
  uint64_t ops = pb_merge(ws, &all, NULL);
  common_t c =
      pb_window_common(&win, &all, ops, pb_workers_wall(ws, pb_opt.threads));
  pb_rec_common(&c);
  if (win.c1.known)
    pb_rec_num("reserved_end_mib", (double)win.c1.reserved_now / MIB);
  pb_rec_num("page_kib", (double)a.page / KIB);
  pb_rec_end();
  pb_samples_free(&all);
}
