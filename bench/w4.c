/* pp_bench: W4, stream-ordered frees. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* ==== W4: stream-ordered frees ===============================================
 * Each thread stages 1 MiB blocks through two simulated streams: a fast one
 * (each copy 50 us) and a slow one (2 ms). Per block: allocate, use, queue
 * a copy on a stream, free it at once (stream-ordered): pinpool records the
 * stream (pinpool_record_stream, events=simulated); refpool records its
 * event (an item on the same simulated stream, as pinpool's provider does)
 * on its global FIFO; malloc peers and naive go through a shim that keeps
 * the block on a per-stream queue and frees it when the stream's completion
 * counter passes the copy. At most 4 copies are in flight per stream (the
 * producer prefers the streams in turn and waits when both are full).
 * Timed per op: the shim's drain + allocation + use, and record + free (or
 * the shim's queueing); not the copy's submission nor the waits.
 *
 * Reuse lag: when an allocation returns an address whose last copy
 * completed at time T, lag = now - T, attributed to that copy's stream.
 * An address handed out before its copy completed is an early reuse (a
 * correctness failure; must be 0). "need" = bytes allocated and not yet
 * freed or whose copy has not completed; overhead = reserved (RSS for
 * malloc) peak / need peak. */

#define W4_DEPTH 4
#define W4_STREAMS_PER_THREAD 2
#define W4_SIZE (1 * MIB)

/* Every implementation sees the same device model: pinpool's simulated
 * streams (events=simulated), one worker thread per stream running queued
 * "copies" in order. pinpool uses its own pool's streams and its event
 * provider; the others use a second pinpool pool only as a stream clock
 * (pb_clock), and learn completion from a counter the copy's callback
 * increments. */
typedef struct wstream {
  pinpool_stream_t id;
  uint64_t copy_ns;
  uint64_t submitted; /* producer thread only */
  alignas(64) atomic_uint_fast64_t completed;
} wstream_t;

static wstream_t g_streams[MAX_THREADS * W4_STREAMS_PER_THREAD + 1];

static pinpool_t *stream_pool(void) {
  return pb_im.kind == K_PINPOOL ? pb_im.pool : pb_clock;
}

typedef struct w4_op {
  void *p;
  int stream;      /* index in g_streams */
  uint64_t t_free; /* when the producer's free returned */
  atomic_uint_fast64_t t_done;
} w4_op_t;

typedef struct w4_copy {
  w4_op_t *op;
  wstream_t *st;
} w4_copy_t;

typedef struct shim_item {
  void *p;
  uint64_t ticket;
  const atomic_uint_fast64_t *t_done; /* of the block's copy */
} shim_item_t;

typedef struct w4_arg {
  uint64_t ops; /* per thread */
} w4_arg_t;

static atomic_uint_fast64_t g_w4_allocs, g_w4_done;

static void w4_copy_done(void *arg) {
  w4_copy_t *c = arg;
  atomic_store_explicit(&c->op->t_done, pb_now_ns(), memory_order_relaxed);
  atomic_fetch_add_explicit(&g_w4_done, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->st->completed, 1, memory_order_release);
}

/* Address -> index of the op that last used it (open addressing). */
typedef struct addrmap {
  uintptr_t *key;
  uint64_t *val;
  size_t cap;
} addrmap_t;

static size_t addr_hash(uintptr_t a, size_t cap) {
  uint64_t x = (uint64_t)a * 0x9e3779b97f4a7c15ULL;
  return (size_t)(x >> 17) & (cap - 1);
}

static void addrmap_put(addrmap_t *m, uintptr_t a, uint64_t v) {
  size_t i = addr_hash(a, m->cap);
  while (m->key[i] != 0 && m->key[i] != a)
    i = (i + 1) & (m->cap - 1);
  m->key[i] = a;
  m->val[i] = v;
}

static bool addrmap_get(const addrmap_t *m, uintptr_t a, uint64_t *v) {
  size_t i = addr_hash(a, m->cap);
  while (m->key[i] != 0) {
    if (m->key[i] == a) {
      *v = m->val[i];
      return true;
    }
    i = (i + 1) & (m->cap - 1);
  }
  return false;
}

typedef struct shimq {
  shim_item_t *v;
  size_t head, n, cap;
  uint64_t reclaimed, reclaim_ns; /* copy done -> handed back to malloc */
} shimq_t;

static void shim_push(shimq_t *q, shim_item_t it) {
  if (q->n == q->cap) {
    size_t ncap = q->cap ? q->cap * 2 : 64;
    shim_item_t *nv = pb_xmalloc(ncap * sizeof *nv);
    for (size_t i = 0; i < q->n; i++)
      nv[i] = q->v[(q->head + i) % q->cap];
    free(q->v);
    q->v = nv;
    q->cap = ncap;
    q->head = 0;
  }
  q->v[(q->head + q->n) % q->cap] = it;
  q->n++;
}

/* Free (to malloc / naive) every queued block whose copy completed. */
static void shim_drain(shimq_t *q, wstream_t *st, bool count) {
  uint64_t done = atomic_load_explicit(&st->completed, memory_order_acquire);
  uint64_t now = count && q->n > 0 ? pb_now_ns() : 0;
  while (q->n > 0 && q->v[q->head].ticket <= done) {
    if (count) {
      uint64_t td =
          atomic_load_explicit(q->v[q->head].t_done, memory_order_relaxed);
      q->reclaimed++;
      q->reclaim_ns += now > td ? now - td : 0;
    }
    pb_im_free(q->v[q->head].p, W4_SIZE, NULL);
    q->head = (q->head + 1) % q->cap;
    q->n--;
  }
}

static void *w4_thread(worker_t *w) {
  const w4_arg_t *a = w->arg;
  int s0 = 1 + w->idx * W4_STREAMS_PER_THREAD; /* fast; s0 + 1 is slow */
  w4_op_t *ops = pb_xmalloc(a->ops * sizeof *ops);
  w4_copy_t *copies = pb_xmalloc(a->ops * sizeof *copies);
  addrmap_t map;
  shimq_t shq[W4_STREAMS_PER_THREAD];
  samples_t lag[W4_STREAMS_PER_THREAD];
  uint64_t early = 0, need_peak = 0, waits = 0;
  bool shim =
      pb_im.kind == K_MALLOC || pb_im.kind == K_NAIVE || pb_im.kind == K_CUHOST;
  memset(shq, 0, sizeof shq);
  map.cap = 1;
  while (map.cap < a->ops * 4)
    map.cap <<= 1;
  map.key = pb_xmalloc(map.cap * sizeof *map.key);
  map.val = pb_xmalloc(map.cap * sizeof *map.val);
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++)
    pb_samples_init(&lag[k], a->ops);
  pb_samples_init(&w->ns, a->ops);
  pthread_barrier_wait(&pb_barrier); /* set up */
  pthread_barrier_wait(&pb_barrier); /* counters taken: go */
  w->t_start = pb_now_ns();
  for (uint64_t i = 0; i < a->ops; i++) {
    /* Pick a stream with room: alternate, fall back to the other. */
    int pick = -1;
    for (;;) {
      for (int k = 0; k < W4_STREAMS_PER_THREAD && pick < 0; k++) {
        int s = s0 + (int)((i + (uint64_t)k) % W4_STREAMS_PER_THREAD);
        wstream_t *st = &g_streams[s];
        if (st->submitted -
                atomic_load_explicit(&st->completed, memory_order_acquire) <
            W4_DEPTH)
          pick = s;
      }
      if (pick >= 0)
        break;
      waits++;
      sched_yield();
    }
    wstream_t *st = &g_streams[pick];
    uint64_t t0 = pb_now_ns();
    if (shim)
      for (int k = 0; k < W4_STREAMS_PER_THREAD; k++)
        shim_drain(&shq[k], &g_streams[s0 + k], true);
    void *ctx = NULL;
    pb_cur_stream = (uintptr_t)pick; /* rmmpool: allocated for that stream */
    void *p = pb_im_alloc(W4_SIZE, &ctx);
    uint64_t ta = pb_now_ns();
    atomic_fetch_add_explicit(&g_w4_allocs, 1, memory_order_relaxed);
    uint64_t need = (atomic_load_explicit(&g_w4_allocs, memory_order_relaxed) -
                     atomic_load_explicit(&g_w4_done, memory_order_relaxed)) *
                    W4_SIZE;
    if (need > need_peak)
      need_peak = need;
    uint64_t prev;
    if (addrmap_get(&map, (uintptr_t)p, &prev)) {
      uint64_t td =
          atomic_load_explicit(&ops[prev].t_done, memory_order_relaxed);
      if (td == 0)
        early++;
      else
        pb_samples_add(&lag[ops[prev].stream - s0], ta > td ? ta - td : 0);
    }
    ops[i].p = p;
    ops[i].stream = pick;
    atomic_init(&ops[i].t_done, 0);
    addrmap_put(&map, (uintptr_t)p, i);
    copies[i] = (w4_copy_t){&ops[i], st};
    int rc = pinpool_sim_submit(stream_pool(), st->id, st->copy_ns,
                                w4_copy_done, &copies[i]);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_sim_submit", rc);
    st->submitted++;
    uint64_t t1 = pb_now_ns();
    switch (pb_im.kind) {
    case K_PINPOOL:
      rc = pinpool_record_stream(pb_im.pool, p, st->id);
      if (rc != PINPOOL_OK)
        pb_die_pp("pinpool_record_stream", rc);
      rc = pinpool_free(pb_im.pool, p);
      if (rc != PINPOOL_OK)
        pb_die_pp("pinpool_free", rc);
      break;
    case K_REFPOOL:
      if (refpool_record_stream(pb_im.ref, p, ctx, (uintptr_t)pick) != 0)
        pb_die("refpool_record_stream failed");
      refpool_free(pb_im.ref, ctx);
      break;
    case K_RMMPOOL: /* freed on the stream, reused once its event completed */
      rmmpool_free(pb_im.rmm, p, W4_SIZE, (uintptr_t)pick, true);
      break;
    case K_FLOOR: /* the ring comes back to it after 256 blocks */
      break;
    case K_NAIVE:
    case K_CUHOST:
    case K_MALLOC:
      shim_push(&shq[pick - s0],
                (shim_item_t){p, st->submitted, &ops[i].t_done});
      break;
    }
    uint64_t t2 = pb_now_ns();
    ops[i].t_free = t2;
    pb_samples_add(&w->ns, (ta - t0) + (t2 - t1));
  }
  w->t_end = pb_now_ns();
  w->ops = a->ops;
  /* Wait for every copy, then hand the shims' blocks back. */
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++) {
    wstream_t *st = &g_streams[s0 + k];
    while (atomic_load_explicit(&st->completed, memory_order_acquire) <
           st->submitted)
      sched_yield();
    if (shim)
      shim_drain(&shq[k], st, false);
  }
  pthread_barrier_wait(&pb_barrier); /* every block back */
  pthread_barrier_wait(&pb_barrier); /* counters taken: clean up */
  /* Copy latency: from the free to the copy's completion, on average over
   * the copies that completed while the producer ran (the blocks a pool
   * could have reclaimed). */
  double lat = 0, nlat = 0;
  for (uint64_t i = 0; i < a->ops; i++) {
    uint64_t td = atomic_load_explicit(&ops[i].t_done, memory_order_relaxed);
    if (td > w->t_end)
      continue;
    lat += td > ops[i].t_free ? (double)(td - ops[i].t_free) : 0.0;
    nlat++;
  }
  w->extra[8] = lat;
  w->extra[9] = nlat;
  w->extra[10] = 0;
  w->extra[11] = 0;
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++) {
    w->extra[10] += (double)shq[k].reclaimed;
    w->extra[11] += (double)shq[k].reclaim_ns;
    free(shq[k].v);
  }
  w->extra[0] = (double)early;
  w->extra[1] = (double)need_peak;
  w->extra[2] = (double)waits;
  w->extra[3] = pb_samples_quantile(&lag[0], 0.5);
  w->extra[4] = pb_samples_quantile(&lag[0], 0.99);
  w->extra[5] = pb_samples_quantile(&lag[1], 0.5);
  w->extra[6] = (double)lag[0].n;
  w->extra[7] = (double)lag[1].n;
  for (int k = 0; k < W4_STREAMS_PER_THREAD; k++)
    pb_samples_free(&lag[k]);
  free(map.key);
  free(map.val);
  free(copies);
  free(ops);
  return NULL;
}

void pb_w4_run(int ci) {
  (void)ci;
  worker_t ws[MAX_THREADS];
  w4_arg_t a = {pb_opt.quick ? 400 : 2000};
  memset(ws, 0, sizeof ws);
  pb_rec_begin("W4", "1MiB blocks, fast 50us + slow 2ms streams, 4 in flight");
  /* 8 blocks in flight at most, but a slow copy can stay pending while
   * the fast stream goes through a hundred blocks or more: 256 blocks a
   * thread. The floor reuses by address order, not by completion: its
   * early reuses, when the ring laps a pending slow copy anyway, mean
   * nothing (the floor's writes are never checked). */
  pb_floor_prepare(256 * W4_SIZE, pb_opt.threads);
  atomic_init(&g_w4_allocs, 0);
  atomic_init(&g_w4_done, 0);
  if (pb_im.kind != K_PINPOOL) {
    int rc = pinpool_create("events=simulated,sim_delay_us=0", &pb_clock);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_create(clock)", rc);
  }
  if (pb_im.kind == K_REFPOOL || pb_im.kind == K_RMMPOOL)
    pb_ref_events_reset(a.ops * (uint64_t)pb_opt.threads + 16);
  /* Start every stream's worker from this (unpinned) thread. */
  for (int i = 1; i <= pb_opt.threads * W4_STREAMS_PER_THREAD; i++) {
    g_streams[i].id = (pinpool_stream_t)i;
    g_streams[i].copy_ns = (i % 2) ? 50000 : 2000000;
    g_streams[i].submitted = 0;
    atomic_init(&g_streams[i].completed, 0);
    int rc = pinpool_sim_submit(stream_pool(), g_streams[i].id, 0, NULL, NULL);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_sim_submit", rc);
  }
  /* The counters' window: from the workers' set-up done to every block
   * back (their set-up and clean-up allocate too, through a malloc peer). */
  pb_start(ws, w4_thread, &a);
  window_t win;
  pb_measure(ws, 1, &win);

  samples_t all;
  pb_samples_init(&all, 1024);
  uint64_t ops = pb_merge(ws, &all, NULL);
  double early = 0, need = 0, waits = 0, lf = 0, lf99 = 0, ls = 0, nf = 0,
         ns = 0, lat = 0, nlat = 0, shim_n = 0, shim_ns = 0;
  for (int i = 0; i < pb_opt.threads; i++) {
    early += ws[i].extra[0];
    if (ws[i].extra[1] > need) /* global counts: the threads' max */
      need = ws[i].extra[1];
    waits += ws[i].extra[2];
    lf += ws[i].extra[3] / pb_opt.threads;
    lf99 += ws[i].extra[4] / pb_opt.threads;
    ls += ws[i].extra[5] / pb_opt.threads;
    nf += ws[i].extra[6];
    ns += ws[i].extra[7];
    lat += ws[i].extra[8];
    nlat += ws[i].extra[9];
    shim_n += ws[i].extra[10];
    shim_ns += ws[i].extra[11];
  }
  /* Reclaim lag: from a block's copy completing to the block being
   * reusable, on average. Pools: (mean free -> cached, from their
   * statistics) - (mean free -> copy done); the shim: measured per block. */
  double rec_n = 0, rec_ns = 0;
  if (pb_im.kind == K_PINPOOL) {
    pinpool_stats_t st;
    int rc = pinpool_get_stats(pb_im.pool, &st);
    if (rc != PINPOOL_OK)
      pb_die_pp("pinpool_get_stats", rc);
    rec_n = (double)st.reclaim.count;
    rec_ns = (double)st.reclaim.total_ns;
  } else if (pb_im.kind == K_REFPOOL) {
    refpool_stats_t st;
    refpool_get_stats(pb_im.ref, &st);
    rec_n = (double)st.reclaim_count;
    rec_ns = (double)st.reclaim_total_ns;
  } else if (pb_im.kind == K_RMMPOOL) {
    rmmpool_stats_t st;
    rmmpool_get_stats(pb_im.rmm, &st);
    rec_n = (double)st.reclaim_count;
    rec_ns = (double)st.reclaim_total_ns;
  } else {
    rec_n = shim_n;
    rec_ns = shim_ns;
  }
  if (rec_n > 0 && nlat > 0) {
    double l = rec_ns / rec_n -
               (win.c0.known && pb_im.kind != K_NAIVE && pb_im.kind != K_CUHOST
                    ? lat / nlat
                    : 0.0);
    pb_rec_num("reclaim_lag_us", (l > 0 ? l : 0) / 1e3);
    pb_rec_num("copy_latency_us", lat / nlat / 1e3);
  }
  if (need > 0) /* the harness's requested peak: live + in flight */
    pb_req[0].peak_seen = (uint64_t)need;
  common_t c =
      pb_window_common(&win, &all, ops, pb_workers_wall(ws, pb_opt.threads));
  /* For pinpool, "overhead" is reserved over need too (not over its own
   * requested peak, which excludes the pending blocks). */
  pb_rec_num("need_peak_mib", need / MIB);
  if (pb_im.kind == K_PINPOOL) {
    im_counters_t ic;
    pb_im_get_counters(&ic);
    pb_rec_num("reserved_over_need", (double)ic.reserved_peak / need);
  } else if (win.c0.known) {
    pb_rec_num("reserved_over_need", (double)win.c1.reserved_peak / need);
  } else if (pb_hwm_reset) {
    pb_rec_num("reserved_over_need", (double)pb_rss_peak_delta() / need);
  }
  pb_rec_common(&c);
  pb_rec_num("lag_fast_us_med", lf / 1e3);
  pb_rec_num("lag_fast_us_p99", lf99 / 1e3);
  pb_rec_num("lag_slow_us_med", ls / 1e3);
  pb_rec_num("reuses_fast", nf);
  pb_rec_num("reuses_slow", ns);
  pb_rec_num("early_reuse", early);
  pb_rec_num("producer_waits", waits);
  if (early > 0)
    pb_note("%.0f blocks handed out before their copy completed", early);
  if (pb_im.kind == K_NAIVE || pb_im.kind == K_CUHOST)
    pb_note("%s: reuse lag measures address reuse by the kernel or driver, not "
            "caching",
            pb_im.name);
  pb_rec_end();
  pb_samples_free(&all);
  if (pb_clock != NULL) { /* joins the stream workers: every event ran */
    pinpool_destroy(pb_clock);
    pb_clock = NULL;
  }
}
