/* pp_bench: W8, snapshots (pinpool only). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

/* ==== W8: snapshots ==========================================================
 * pinpool only: no peer has snapshots. The main thread builds a live set of
 * N blocks (log-uniform 512 B - 4 KiB: the 10^6-block case stays under
 * 2 GiB) with history on (level all, 16-frame stacks, a ring of 1,000,000
 * entries; quick: 100,000) and frees and reallocates random blocks until
 * the ring has wrapped, so that every snapshot carries a full ring. One
 * snapshot is written before the measurement ("cold": the first one in a
 * process loads the symbolizer). Then 1 or 2 workers (--threads) allocate
 * and free while the main thread, in three phases of equal length:
 *   snap  writes snapshots to a file in a temp dir in a loop (at least 3,
 *         quick 1, and for at least the usual minimal phase); each timed,
 *         its file size and the gather_ns and max_hold_ns it reports read
 *         back
 *   idle  sleeps: the baseline
 *   busy  memsets a 64 MiB buffer: a writer's CPU time and memory traffic
 *         without its locks. With 2 workers pinned to the 2 CPUs of a small
 *         machine the writer takes CPU time from them; comparing snap with
 *         busy separates that from what the pool's locks cost.
 * Each worker times every alloc+free pair:
 *   hot      4 KiB from its thread cache (most pairs)
 *   central  every 64th: after a pinpool_thread_flush, so the allocation
 *            refills from a central bin (its mutex)
 *   backend  every 10 ms: a 512 KiB pair and a flush; a block that size is
 *            a segment of its own and max_cached=256KiB keeps no idle one,
 *            so this is one segment created and one released: the paths
 *            that wait for the segment lock a snapshot takes
 *            (docs/snapshot-format.md), and for the process's mmap lock,
 *            which the snapshot's own large buffers take too. Rare enough
 *            to cost the worker about 5 % of its time (a segment is
 *            populated and locked).
 * A worker keeps one 4 KiB block allocated throughout so that a flush never
 * leaves its 4 KiB segment idle (max_cached would release it, turning
 * central pairs into backend pairs). */

/* Millions of pairs per phase are too many to keep and sort: a log-linear
 * histogram (exact below 64 ns, then 32 buckets per power of two, so within
 * about 3 %) gives the quantiles, and the maximum is kept exactly. */
#define LH_EXACT 64u
#define LH_SUB_BITS 5u
#define LH_BUCKETS (LH_EXACT + (64u - 6u) * (1u << LH_SUB_BITS))

typedef struct lhist {
  uint64_t n, max;
  uint64_t b[LH_BUCKETS];
} lhist_t;

static unsigned lh_index(uint64_t v) {
  if (v < LH_EXACT)
    return (unsigned)v;
  unsigned e = 63u - (unsigned)__builtin_clzll(v); /* >= 6 */
  unsigned m = (unsigned)(v >> (e - LH_SUB_BITS)) & ((1u << LH_SUB_BITS) - 1u);
  return LH_EXACT + (e - 6u) * (1u << LH_SUB_BITS) + m;
}

static void lh_add(lhist_t *h, uint64_t v) {
  h->b[lh_index(v)]++;
  h->n++;
  if (v > h->max)
    h->max = v;
}

static void lh_merge(lhist_t *into, const lhist_t *from) {
  for (unsigned i = 0; i < LH_BUCKETS; i++)
    into->b[i] += from->b[i];
  into->n += from->n;
  if (from->max > into->max)
    into->max = from->max;
}

/* Nearest rank, as pb_samples_quantile; a bucket reads as its middle. */
static double lh_quantile(const lhist_t *h, double q) {
  if (h->n == 0)
    return NAN;
  uint64_t rank = (uint64_t)ceil(q * (double)h->n), seen = 0;
  if (rank < 1)
    rank = 1;
  for (unsigned i = 0; i < LH_BUCKETS; i++) {
    seen += h->b[i];
    if (seen < rank)
      continue;
    if (i < LH_EXACT)
      return (double)i;
    unsigned j = i - LH_EXACT, e = j / (1u << LH_SUB_BITS) + 6u;
    uint64_t lo = (uint64_t)1 << e | (uint64_t)(j % (1u << LH_SUB_BITS))
                                         << (e - LH_SUB_BITS);
    double mid = (double)lo + (double)((uint64_t)1 << (e - LH_SUB_BITS)) / 2;
    return mid < (double)h->max ? mid : (double)h->max;
  }
  return (double)h->max;
}

enum { W8_SNAP, W8_IDLE, W8_BUSY, W8_NPHASES };
enum { W8_ALL, W8_HOT, W8_CENTRAL, W8_BACKEND, W8_NKINDS };
#define W8_WARM (-1)
#define W8_STOP W8_NPHASES
#define W8_CENTRAL_EVERY 64u
#define W8_BACKEND_NS 10000000u
#define W8_HOT_SIZE (4 * KIB)
#define W8_BACKEND_SIZE (512 * KIB)
#define W8_DEPTH 16u

typedef struct w8_arg {
  alignas(64) atomic_int phase;
  lhist_t *h[MAX_THREADS]; /* [phase][kind] per worker */
} w8_arg_t;

static void w8_flush(void) {
  int rc = pinpool_thread_flush(pb_im.pool);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_thread_flush", rc);
}

static void *w8_worker(worker_t *w) {
  w8_arg_t *a = w->arg;
  lhist_t *h = a->h[w->idx];
  void *anchor;
  int rc = pinpool_alloc(pb_im.pool, W8_HOT_SIZE, &anchor);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_alloc", rc);
  pthread_barrier_wait(&pb_barrier);
  uint64_t t1 = pb_now_ns(), next_backend = t1 + W8_BACKEND_NS;
  for (unsigned i = 1;; i++) {
    int ph = atomic_load_explicit(&a->phase, memory_order_relaxed);
    if (ph == W8_STOP)
      break;
    int kind = W8_HOT;
    uint64_t t0;
    if (t1 >= next_backend) {
      kind = W8_BACKEND;
      t0 = pb_now_ns();
      pb_pool_pair(W8_BACKEND_SIZE, i);
      w8_flush();
      t1 = pb_now_ns();
      next_backend = t1 + W8_BACKEND_NS;
    } else {
      if (i % W8_CENTRAL_EVERY == 0) {
        w8_flush();
        kind = W8_CENTRAL;
      }
      t0 = pb_now_ns();
      pb_pool_pair(W8_HOT_SIZE, i);
      t1 = pb_now_ns();
    }
    if (ph >= 0) {
      lh_add(&h[ph * W8_NKINDS + W8_ALL], t1 - t0);
      lh_add(&h[ph * W8_NKINDS + kind], t1 - t0);
    }
  }
  rc = pinpool_free(pb_im.pool, anchor);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_free", rc);
  return NULL;
}

static const size_t w8_counts[] = {1000, 10000, 100000, 1000000};

int pb_w8_ncases(void) { return pb_opt.quick ? 2 : 4; }

static const char *count_str(size_t n, char *buf, size_t len) {
  if (n >= 1000000 && n % 1000000 == 0)
    snprintf(buf, len, "%zuM", n / 1000000);
  else if (n >= 1000 && n % 1000 == 0)
    snprintf(buf, len, "%zuk", n / 1000);
  else
    snprintf(buf, len, "%zu", n);
  return buf;
}

/* The unsigned number after `key` in text, or NAN. */
static double json_u64_after(const char *text, const char *key) {
  const char *p = strstr(text, key);
  unsigned long long v;
  if (p == NULL || sscanf(p + strlen(key), "%llu", &v) != 1)
    return NAN;
  return (double)v;
}

typedef struct w8_snap {
  double ns, bytes, gather_ns, hold_ns;
  double hist_max_entries, hist_recorded, hist_dropped; /* if asked */
} w8_snap_t;

/* Write one snapshot to path, time it and read back what it reports. The
 * history header sits after the segments (~100 MB into a 10^6-block file),
 * so it is looked for only in the phase's last snapshot, after the phases.
 * The previous file is removed first, untimed: ext4 writes back a file
 * that was truncated and rewritten when it is closed (auto_da_alloc), which
 * would time the disk; a new file per snapshot is also the usual use. */
static void w8_snapshot(const char *path, w8_snap_t *out) {
  if (unlink(path) != 0 && errno != ENOENT)
    pb_die("W8: cannot remove %s: %s", path, strerror(errno));
  uint64_t t0 = pb_now_ns();
  int rc = pinpool_snapshot_write(pb_im.pool, path, 0);
  uint64_t t1 = pb_now_ns();
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_snapshot_write", rc);
  memset(out, 0, sizeof *out);
  out->ns = (double)(t1 - t0);
  out->hist_max_entries = out->hist_recorded = out->hist_dropped = NAN;
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    pb_die("W8: cannot read the snapshot %s: %s", path, strerror(errno));
  out->bytes = (double)st.st_size;
  char head[4096];
  ssize_t n = pread(fd, head, sizeof head - 1, 0);
  head[n > 0 ? n : 0] = '\0';
  out->gather_ns = json_u64_after(head, "\"gather_ns\":");
  out->hold_ns = json_u64_after(head, "\"max_hold_ns\":");
  close(fd);
}

/* The ring's header of the snapshot in path, into out. */
static void w8_ring_header(const char *path, w8_snap_t *out) {
  int fd = open(path, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0)
    pb_die("W8: cannot read the snapshot %s: %s", path, strerror(errno));
  if (st.st_size > 0) {
    size_t len = (size_t)st.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED)
      pb_die("W8: mmap of the snapshot failed: %s", strerror(errno));
    static const char key[] = "\"history\":{";
    const char *hp = memmem(map, len, key, sizeof key - 1);
    if (hp != NULL) {
      char buf[512];
      size_t k = len - (size_t)(hp - (const char *)map);
      k = k < sizeof buf - 1 ? k : sizeof buf - 1;
      memcpy(buf, hp, k);
      buf[k] = '\0';
      out->hist_max_entries = json_u64_after(buf, "\"max_entries\":");
      out->hist_recorded = json_u64_after(buf, "\"recorded\":");
      out->hist_dropped = json_u64_after(buf, "\"dropped\":");
    }
    munmap(map, len);
  }
  close(fd);
}

static void sleep_until(uint64_t t) {
  for (uint64_t now = pb_now_ns(); now < t; now = pb_now_ns()) {
    uint64_t d = t - now;
    struct timespec ts = {(time_t)(d / 1000000000u), (long)(d % 1000000000u)};
    nanosleep(&ts, NULL);
  }
}

void pb_w8_run(int ci) {
  const size_t nlive = w8_counts[ci];
  const size_t ring = pb_opt.quick ? 100000 : 1000000;
  const unsigned min_snaps = pb_opt.quick ? 1 : 3;
  char name[96], b1[32], b2[32];
  snprintf(name, sizeof name, "%s live, ring %s",
           count_str(nlive, b1, sizeof b1), count_str(ring, b2, sizeof b2));
  pb_rec_begin("W8", name);
  size_t clen = strlen(pb_im.config);
  snprintf(pb_im.config + clen, sizeof pb_im.config - clen,
           " (history all, stack_depth %u, ring %zu)", W8_DEPTH, ring);
  pinpool_history_options_t ho = {PINPOOL_HISTORY_ALL, ring, W8_DEPTH, 0};
  int rc = pinpool_record_history(pb_im.pool, &ho);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_record_history", rc);

  /* The live set, then churn until the ring has wrapped (with level all
   * every allocation and every free is one entry). */
  uint64_t ts0 = pb_now_ns();
  lblock_t *live = pb_xmalloc(nlive * sizeof *live);
  rng_t r = {0x5eed0008u};
  double live_bytes = 0;
  for (size_t k = 0; k < nlive; k++) {
    size_t s = pb_log_uniform(&r, 512, 4 * KIB);
    live[k] = (lblock_t){pb_im_alloc(s, NULL), NULL, s};
    live_bytes += (double)s;
  }
  uint64_t events = nlive, target = ring + ring / 20;
  for (; events < target; events += 2) {
    size_t k = pb_rng_below(&r, nlive);
    pb_im_free(live[k].p, live[k].size, NULL);
    live_bytes -= (double)live[k].size;
    size_t s = pb_log_uniform(&r, 512, 4 * KIB);
    live[k] = (lblock_t){pb_im_alloc(s, NULL), NULL, s};
    live_bytes += (double)s;
  }
  double setup_s = (double)(pb_now_ns() - ts0) / 1e9;

  char dir[4096], path[4200];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/pp-w8.XXXXXX",
           tmp != NULL && *tmp != '\0' ? tmp : "/tmp");
  if (mkdtemp(dir) == NULL)
    pb_die("W8: mkdtemp(%s) failed: %s", dir, strerror(errno));
  snprintf(path, sizeof path, "%s/snapshot.json", dir);
  w8_snap_t cold;
  w8_snapshot(path, &cold);

  size_t busy_len = 64 * MIB;
  unsigned char *busy = pb_xmalloc(busy_len);
  memset(busy, 1, busy_len); /* fault it in before it is timed */
  pb_sink = busy;            /* escapes: the memsets below are not dead */

  w8_arg_t a;
  worker_t ws[MAX_THREADS];
  memset(ws, 0, sizeof ws);
  atomic_init(&a.phase, W8_WARM);
  for (int i = 0; i < pb_opt.threads; i++)
    a.h[i] = pb_xmalloc(W8_NPHASES * W8_NKINDS * sizeof(lhist_t));
  pb_run_workers(ws, pb_opt.threads, w8_worker, &a);
  pthread_barrier_wait(&pb_barrier);
  sleep_until(pb_now_ns() + 20000000u); /* warm-up: first stacks, first flush */

  /* snap: at least min_snaps snapshots and the usual minimal phase. */
  samples_t snap_ns, gather_ns, hold_ns;
  pb_samples_init(&snap_ns, 16);
  pb_samples_init(&gather_ns, 16);
  pb_samples_init(&hold_ns, 16);
  w8_snap_t last;
  memset(&last, 0, sizeof last);
  double bytes = 0, in_snap_ns = 0;
  uint64_t p0 = pb_now_ns(), p1;
  atomic_store(&a.phase, W8_SNAP);
  for (unsigned k = 0;; k++) {
    p1 = pb_now_ns();
    if (k >= min_snaps && p1 - p0 >= pb_min_phase_ns())
      break;
    w8_snapshot(path, &last);
    pb_samples_add(&snap_ns, (uint64_t)last.ns);
    pb_samples_add(&gather_ns, (uint64_t)last.gather_ns);
    pb_samples_add(&hold_ns, (uint64_t)last.hold_ns);
    bytes = last.bytes;
    in_snap_ns += last.ns;
  }
  uint64_t dur = p1 - p0;
  atomic_store(&a.phase, W8_IDLE);
  sleep_until(p1 + dur);
  uint64_t p2 = pb_now_ns();
  atomic_store(&a.phase, W8_BUSY);
  for (unsigned k = 0; pb_now_ns() < p2 + dur; k++)
    for (size_t off = 0; off < busy_len && pb_now_ns() < p2 + dur; off += MIB)
      memset(busy + off, (int)k, MIB);
  uint64_t p3 = pb_now_ns();
  atomic_store(&a.phase, W8_STOP);
  pb_join_workers(ws, pb_opt.threads);

  w8_ring_header(path, &last);
  if (unlink(path) != 0 || rmdir(dir) != 0)
    pb_die("W8: cannot remove %s: %s", dir, strerror(errno));

  lhist_t *h = pb_xmalloc(W8_NPHASES * W8_NKINDS * sizeof(lhist_t));
  for (int i = 0; i < pb_opt.threads; i++) {
    for (int k = 0; k < W8_NPHASES * W8_NKINDS; k++)
      lh_merge(&h[k], &a.h[i][k]);
    free(a.h[i]);
  }
  const double phase_s[W8_NPHASES] = {
      (double)dur / 1e9, (double)(p2 - p1) / 1e9, (double)(p3 - p2) / 1e9};
  static const char *const pname[W8_NPHASES] = {"snap", "idle", "busy"};
  const lhist_t *all = &h[W8_SNAP * W8_NKINDS + W8_ALL];
  pb_rec_num("ns_med", lh_quantile(all, 0.5));
  pb_rec_num("ns_p99", lh_quantile(all, 0.99));
  pb_rec_num("ops", (double)all->n);
  pb_rec_num("ops_per_s", (double)all->n / phase_s[W8_SNAP]);
  pb_rec_num("live_blocks", (double)nlive);
  pb_rec_num("live_mib", live_bytes / (double)MIB);
  pb_rec_num("ring", (double)ring);
  pb_rec_num("hist_max_entries", last.hist_max_entries);
  pb_rec_num("hist_recorded", last.hist_recorded);
  pb_rec_num("hist_kept", last.hist_recorded - last.hist_dropped);
  pb_rec_num("setup_s", setup_s);
  pb_rec_num("snaps", (double)snap_ns.n);
  pb_rec_num("snap_ms_cold", cold.ns / 1e6);
  pb_rec_num("snap_ms_med", pb_samples_quantile(&snap_ns, 0.5) / 1e6);
  pb_rec_num("snap_ms_max", pb_samples_quantile(&snap_ns, 1.0) / 1e6);
  pb_rec_num("snap_duty_pct", 100.0 * in_snap_ns / (double)dur);
  pb_rec_num("file_mib", bytes / (double)MIB);
  pb_rec_num("gather_ms_med", pb_samples_quantile(&gather_ns, 0.5) / 1e6);
  pb_rec_num("hold_us_med", pb_samples_quantile(&hold_ns, 0.5) / 1e3);
  pb_rec_num("hold_us_max", pb_samples_quantile(&hold_ns, 1.0) / 1e3);
  for (int ph = 0; ph < W8_NPHASES; ph++) {
    static const struct {
      int kind;
      const char *name;
      double q;
    } cols[] = {{W8_ALL, "med", 0.5},
                {W8_ALL, "p99", 0.99},
                {W8_ALL, "p999", 0.999},
                {W8_ALL, "max", 1.0},
                {W8_HOT, "hot_max", 1.0},
                {W8_CENTRAL, "central_med", 0.5},
                {W8_CENTRAL, "central_max", 1.0},
                {W8_BACKEND, "backend_med", 0.5},
                {W8_BACKEND, "backend_max", 1.0}};
    char key[40];
    const lhist_t *hp = &h[ph * W8_NKINDS];
    snprintf(key, sizeof key, "%s_pairs_per_s", pname[ph]);
    pb_rec_num(key, (double)hp[W8_ALL].n / phase_s[ph]);
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
      snprintf(key, sizeof key, "%s_%s", pname[ph], cols[c].name);
      const lhist_t *x = &hp[cols[c].kind];
      pb_rec_num(key, cols[c].q >= 1.0 ? (x->n ? (double)x->max : NAN)
                                       : lh_quantile(x, cols[c].q));
    }
  }
  pinpool_stats_t st;
  if (pinpool_get_stats(pb_im.pool, &st) == PINPOOL_OK)
    pb_rec_num("reserved_mib", (double)st.reserved_bytes.current / (double)MIB);
  pb_rec_end();

  free(h);
  free(busy);
  pb_samples_free(&snap_ns);
  pb_samples_free(&gather_ns);
  pb_samples_free(&hold_ns);
  /* History off first: a million frees with stacks would take seconds. */
  ho = (pinpool_history_options_t){PINPOOL_HISTORY_NONE, 0, 0, 0};
  rc = pinpool_record_history(pb_im.pool, &ho);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_record_history", rc);
  for (size_t k = 0; k < nlive; k++)
    pb_im_free(live[k].p, live[k].size, NULL);
  free(live);
}
