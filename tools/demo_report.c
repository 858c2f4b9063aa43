/*
 * `pinpool demo`'s output (demo_report.h): the progress line on stderr, and on
 * stdout the pool's stats table, the consistency checks, the cached
 * alloc+free pairs and the totals.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "demo_pipeline.h"
#include "demo_report.h"
#include "pinpool.h"

/* ---- Progress ----------------------------------------------------------- */
#define MIB (1024.0 * 1024.0)
#define GIB (1024.0 * 1024.0 * 1024.0)

static double hit_rate(const pinpool_stats_t *s) {
  uint64_t n = s->cache_hits + s->cache_misses;
  return n == 0 ? 0.0 : 100.0 * (double)s->cache_hits / (double)n;
}

void demo_progress_print(demo_t *d, demo_progress_t *pr, double now) {
  pinpool_stats_t s;
  uint64_t buffers = atomic_load(&d->done_buffers);
  uint64_t bytes = atomic_load(&d->done_bytes);
  double dt = now - pr->last_time;
  int rc = pinpool_get_stats(d->pool, &s);
  if (rc != PINPOOL_OK) {
    demo_pinpool_failure(d, "pinpool_get_stats", rc);
    return;
  }
  if (dt <= 0)
    dt = 1e-9;
  fprintf(stderr,
          "%s[%6.1fs] %7.0f buf/s %6.2f GiB/s  live %7.1f MiB  reserved "
          "%7.1f MiB  cached %7.1f MiB  hit %5.1f%%%s",
          pr->tty ? "\r" : "", now - pr->start,
          (double)(buffers - pr->last_buffers) / dt,
          (double)(bytes - pr->last_bytes) / GIB / dt,
          (double)s.block_bytes.current / MIB,
          (double)s.reserved_bytes.current / MIB,
          (double)s.cached_bytes.current / MIB, hit_rate(&s),
          pr->tty ? "\033[K" : "\n");
  fflush(stderr);
  pr->last_time = now;
  pr->last_buffers = buffers;
  pr->last_bytes = bytes;
  pr->printed = true;
}

/* ---- Report ------------------------------------------------------------- */
static void print_stat(const char *name, const pinpool_stat_t *s, bool bytes) {
  char b[4][CLI_BYTES_LEN];
  if (bytes)
    printf("  %-18s %12s %12s %12s %12s\n", name,
           cli_format_bytes((double)s->current, b[0]),
           cli_format_bytes((double)s->peak, b[1]),
           cli_format_bytes((double)s->allocated, b[2]),
           cli_format_bytes((double)s->freed, b[3]));
  else
    printf("  %-18s %12llu %12llu %12llu %12llu\n", name,
           (unsigned long long)s->current, (unsigned long long)s->peak,
           (unsigned long long)s->allocated, (unsigned long long)s->freed);
}

static void print_count(const char *name, uint64_t v, const char *note) {
  printf("  %-18s %12llu%s%s\n", name, (unsigned long long)v,
         note[0] ? "  " : "", note);
}

static void print_bytes(const char *name, uint64_t v, const char *note) {
  char b[CLI_BYTES_LEN];
  printf("  %-18s %12s%s%s\n", name, cli_format_bytes((double)v, b),
         note[0] ? "  " : "", note);
}

static void print_duration(const char *name, const pinpool_duration_t *t) {
  char total[CLI_BYTES_LEN], mean[CLI_BYTES_LEN], max[CLI_BYTES_LEN];
  double m = t->count ? (double)t->total_ns / (double)t->count : 0.0;
  printf("  %-18s %12llu calls, total %s, mean %s, max %s\n", name,
         (unsigned long long)t->count,
         cli_format_ns((double)t->total_ns, total), cli_format_ns(m, mean),
         cli_format_ns((double)t->max_ns, max));
}

void demo_print_stats_table(const pinpool_stats_t *s) {
  char note[96];
  uint64_t hits = s->cache_hits;
  printf("\npinpool stats (after all threads joined)\n");
  printf("  %-18s %12s %12s %12s %12s\n", "field", "current", "peak",
         "allocated", "freed");
  print_stat("requests", &s->requests, false);
  print_stat("requested_bytes", &s->requested_bytes, true);
  print_stat("blocks", &s->blocks, false);
  print_stat("block_bytes", &s->block_bytes, true);
  print_stat("reserved_bytes", &s->reserved_bytes, true);
  print_stat("cached_bytes", &s->cached_bytes, true);
  print_stat("segments", &s->segments, false);
  print_bytes("pending_bytes", s->pending_bytes, "");
  print_count("pending_blocks", s->pending_blocks, "");
  print_count("events_recorded", s->events_recorded, "");
  print_count("events_completed", s->events_completed, "");
  print_count("event_errors", s->event_errors, "");
  {
    /* Waits, one per stream-used block, from its free to its reuse: they
     * overlap, so their sum is no time anything took (issue 41: "total
     * 40.95 s" in a 10 s run). */
    char mean[CLI_BYTES_LEN], max[CLI_BYTES_LEN];
    double m = s->reclaim.count
                   ? (double)s->reclaim.total_ns / (double)s->reclaim.count
                   : 0.0;
    printf("  %-18s %12llu block waits, mean %s, max %s (free -> reusable; "
           "they overlap)\n",
           "reclaim", (unsigned long long)s->reclaim.count,
           cli_format_ns(m, mean),
           cli_format_ns((double)s->reclaim.max_ns, max));
  }
  snprintf(note, sizeof note, "(hit rate %.2f%%)", hit_rate(s));
  print_count("cache_hits", s->cache_hits, note);
  print_count("cache_misses", s->cache_misses, "");
  snprintf(note, sizeof note, "(%.1f%% of hits)",
           hits ? 100.0 * (double)s->tcache_hits / (double)hits : 0.0);
  print_count("tcache_hits", s->tcache_hits, note);
  print_count("oom_count", s->oom_count, "");
  print_count("retries", s->retries, "");
  print_count("trimmed_segments", s->trimmed_segments, "");
  print_count("arena_chunks", s->arena_chunks, "");
  print_bytes("chunk_free_bytes", s->chunk_free_bytes, "");
  print_count("free_extents", s->free_extents, "");
  print_bytes("largest_free_extent", s->largest_free_extent, "");
  print_count("mlock_failures", s->mlock_failures, "");
  print_bytes("locked_bytes", s->locked_bytes, "");
  print_bytes("fallback_bytes", s->fallback_bytes, "");
  print_count("fallback_blocks", s->fallback_blocks, "");
  print_count("numa_spill_blocks", s->numa_spill_blocks, "");
  print_bytes("numa_spill_bytes", s->numa_spill_bytes, "");
  print_count("lent_blocks", s->lent_blocks, "");
  print_bytes("lent_bytes", s->lent_bytes, "");
  print_duration("backend_alloc", &s->backend_alloc);
  print_duration("backend_free", &s->backend_free);
  print_bytes("peak_slack_bytes", s->peak_slack_bytes, "");
  print_bytes("reserve_bytes", s->reserve_bytes, "");
  print_bytes("max_cached", s->max_cached, s->max_cached ? "" : "(no cap)");
  print_bytes("max_reserved", s->max_reserved,
              s->max_reserved ? "" : "(no cap)");
  /* backend=auto's choice (docs/configuration.md, "backend=auto"). */
  static const char *const auto_notes[] = {
      "(a backend was named)", "(cuda-register: pinned by the driver)",
      "(host, page-locked with mlock)",
      "(host, NOT page-locked: RLIMIT_MEMLOCK too low)"};
  print_count("backend_auto", s->backend_auto,
              s->backend_auto < 4 ? auto_notes[s->backend_auto] : "");
  print_count("pin_warnings", s->pin_warnings,
              s->pin_warnings ? "(memory meant to be pinned is pageable)" : "");
}

static void print_check(const char *what, bool ok) {
  printf("  %-74s %s\n", what, ok ? "OK" : "MISMATCH");
}

unsigned demo_print_checks(demo_t *d, const pinpool_stats_t *s,
                           uint64_t produced) {
  char line[200], r[CLI_BYTES_LEN], a[CLI_BYTES_LEN], c[CLI_BYTES_LEN],
      p[CLI_BYTES_LEN];
  unsigned failed = 0;
  uint64_t consumed = atomic_load(&d->done_buffers);
  uint64_t cookies = atomic_load(&d->cookie_failures);
  uint64_t bad_blocks = atomic_load(&d->bad_blocks);
  uint64_t reserved = s->reserved_bytes.current;
  /* Each term is checked on its own too: the sum is taken modulo 2^64. */
  bool identity = s->block_bytes.current <= reserved &&
                  s->cached_bytes.current <= reserved &&
                  s->pending_bytes <= reserved &&
                  reserved == s->block_bytes.current + s->cached_bytes.current +
                                  s->pending_bytes;
  int rc;

  printf("\nchecks\n");
  snprintf(line, sizeof line, "cookies and patterns: %llu buffers, %llu bad",
           (unsigned long long)consumed, (unsigned long long)cookies);
  print_check(line, cookies == 0);
  failed += cookies != 0;
  snprintf(line, sizeof line, "block sizes and alignment: %llu bad",
           (unsigned long long)bad_blocks);
  print_check(line, bad_blocks == 0);
  failed += bad_blocks != 0;
  if (d->streams) {
    uint64_t copies = atomic_load(&d->copies);
    uint64_t cf = atomic_load(&d->copy_failures);
    snprintf(line, sizeof line,
             "stream-ordered reuse: %llu device copies, %llu saw their "
             "buffer reused early; %llu events",
             (unsigned long long)copies, (unsigned long long)cf,
             (unsigned long long)s->events_completed);
    bool ok = cf == 0 && copies == consumed && s->pending_blocks == 0;
    print_check(line, ok);
    failed += !ok;
  }
  snprintf(line, sizeof line, "buffers produced == consumed: %llu == %llu",
           (unsigned long long)produced, (unsigned long long)consumed);
  print_check(line, produced == consumed);
  failed += produced != consumed;
  snprintf(line, sizeof line,
           "reserved %s == allocated %s + cached %s + "
           "pending %s",
           cli_format_bytes((double)s->reserved_bytes.current, r),
           cli_format_bytes((double)s->block_bytes.current, a),
           cli_format_bytes((double)s->cached_bytes.current, c),
           cli_format_bytes((double)s->pending_bytes, p));
  print_check(line, identity);
  failed += !identity;
  snprintf(line, sizeof line, "live blocks after drain: %llu (requests %llu)",
           (unsigned long long)s->blocks.current,
           (unsigned long long)s->requests.current);
  print_check(line, s->blocks.current == 0 && s->requests.current == 0);
  failed += s->blocks.current != 0 || s->requests.current != 0;

  rc = pinpool_validate(d->pool);
  if (rc == PINPOOL_OK) {
    print_check("pinpool_validate", true);
  } else {
    const char *why = pinpool_last_error();
    snprintf(line, sizeof line, "pinpool_validate: %s", pinpool_strerror(rc));
    print_check(line, false);
    printf("    %s\n", why);
    failed++;
  }
  return failed;
}

/* The README's figure, the cached pair (bench W1, docs/benchmarks.md): one
 * thread allocates and frees one size over and over, the block coming back
 * from its own thread cache (or a large class's hot slot). As W1 does, the
 * pairs are timed in groups (PAIR_GROUP pairs between two clock reads, so
 * the clock's cost is spread over them) and the median group is the
 * figure. Run on the demo's pool once its run is over and its stats and
 * checks are printed (these pairs are not in them), history off. 0, or -1
 * when an allocation failed. */
#define PAIR_GROUP 256
#define PAIR_GROUPS 101

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static int cached_pair_ns(pinpool_t *pool, size_t size, double *out) {
  static double ns[PAIR_GROUPS];
  void *p = NULL;
  /* The first pair brings the block into this thread's cache. */
  if (pinpool_alloc(pool, size, &p) != PINPOOL_OK)
    return -1;
  (void)pinpool_free(pool, p);
  for (int g = 0; g < PAIR_GROUPS; g++) {
    double t0 = cli_now();
    for (int i = 0; i < PAIR_GROUP; i++) {
      if (pinpool_alloc(pool, size, &p) != PINPOOL_OK)
        return -1;
      (void)pinpool_free(pool, p);
    }
    ns[g] = (cli_now() - t0) * 1e9 / PAIR_GROUP;
  }
  qsort(ns, PAIR_GROUPS, sizeof ns[0], cmp_double);
  *out = ns[PAIR_GROUPS / 2];
  return 0;
}

void demo_print_cached_pairs(demo_t *d) {
  static const size_t sizes[] = {(size_t)1 << DEMO_TOKENS_MIN_LOG2,
                                 DEMO_KV_PAGE_BYTES, DEMO_IMAGE_U8_BYTES};
  char b[CLI_BYTES_LEN], sz[CLI_BYTES_LEN];
  if (d->opt.snapshot != NULL)
    (void)pinpool_record_history(d->pool, NULL); /* off: as W1 measures */
  printf("  %-16s", "cached pair");
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    double ns;
    if (cached_pair_ns(d->pool, sizes[i], &ns) != 0) {
      printf(" %s: allocation failed", cli_format_bytes((double)sizes[i], sz));
      break;
    }
    printf("%s %s %s", i ? "," : "", cli_format_bytes((double)sizes[i], sz),
           cli_format_ns(ns, b));
  }
  printf("\n  %-16s (pinpool_alloc + pinpool_free by one thread, the block "
         "from its\n"
         "  %-16s own cache, on this pool after the run: the README's "
         "figure, measured\n"
         "  %-16s as bench W1 does, the median of %d groups of %d pairs)\n",
         "", "", "", PAIR_GROUPS, PAIR_GROUP);
}

void demo_print_totals(demo_t *d, const demo_producer_t *prods,
                       const pinpool_stats_t *s, double elapsed) {
  char b[3][CLI_BYTES_LEN];
  uint64_t buffers = 0, requested = 0, block = 0, enomem = 0;
  uint64_t by_kind[DEMO_KIND_COUNT] = {0};
  double waste_sum = 0, alloc_sum = 0, alloc_max = 0;
  uint64_t naive, backend;

  for (uint64_t i = 0; i < d->opt.producers; i++) {
    const demo_producer_t *p = &prods[i];
    buffers += p->buffers;
    requested += p->requested_bytes;
    block += p->block_bytes;
    enomem += p->enomem;
    waste_sum += p->waste_ratio_sum;
    alloc_sum += p->alloc_ns_sum;
    if (p->alloc_ns_max > alloc_max)
      alloc_max = p->alloc_ns_max;
    for (int k = 0; k < DEMO_KIND_COUNT; k++)
      by_kind[k] += p->by_kind[k];
  }

  printf("\ntotals\n");
  printf("  %-16s %llu in %.2f s\n", "buffers", (unsigned long long)buffers,
         elapsed);
  for (int k = 0; k < DEMO_KIND_COUNT; k++)
    printf("  %-16s   %-26s %8llu\n", "", demo_kind_names[k],
           (unsigned long long)by_kind[k]);
  printf("  %-16s %s\n", "bytes staged",
         cli_format_bytes((double)requested, b[0]));
  printf("  %-16s %.0f buffers/s, %.2f GiB/s (fill + verify)\n", "throughput",
         (double)buffers / elapsed, (double)requested / GIB / elapsed);
  printf("  %-16s per call in the pipeline: mean %s, max %s\n", "pinpool_alloc",
         cli_format_ns(buffers ? alloc_sum / (double)buffers : 0, b[0]),
         cli_format_ns(alloc_max, b[1]));
  {
    /* The mean is dominated by the few calls that grew the arena (a new
     * chunk populated, locked or registered: milliseconds). The pool
     * counts the misses (cache_misses); the demo cannot tell which call was
     * one, so the slowest cache_misses calls are taken for them. */
    uint64_t hn[64] = {0};
    double hs[64] = {0};
    for (unsigned i = 0; i < d->opt.producers; i++)
      for (unsigned k = 0; k < 64; k++) {
        hn[k] += prods[i].alloc_hist_n[k];
        hs[k] += prods[i].alloc_hist_sum[k];
      }
    uint64_t misses = s->cache_misses < buffers ? s->cache_misses : buffers;
    uint64_t left = misses;
    double miss_sum = 0;
    for (int k = 63; k >= 0 && left > 0; k--) {
      uint64_t take = hn[k] < left ? hn[k] : left;
      if (take > 0)
        miss_sum += hs[k] * (double)take / (double)hn[k];
      left -= take;
    }
    uint64_t hits = buffers - misses;
    /* The hits' median, as the power-of-two bucket it falls in: the mean
     * of a hit is pulled far above it by the few calls the scheduler
     * preempted (every thread of the demo is busy: filling, verifying). */
    char mb[CLI_BYTES_LEN];
    int med = -1;
    for (uint64_t k = 0, seen = 0; k < 64 && hits > 0; k++) {
      seen += hn[k];
      if (seen * 2 >= hits) {
        med = (int)k;
        break;
      }
    }
    printf(
        "  %-16s hits %llu, mean %s, median in [%s, %s); misses (grew "
        "the arena) %llu, mean %s\n",
        "", (unsigned long long)hits,
        cli_format_ns(hits ? (alloc_sum - miss_sum) / (double)hits : 0, b[0]),
        cli_format_ns(med > 0 ? (double)(UINT64_C(1) << med) : 0, b[1]),
        cli_format_ns(med >= 0 ? (double)(UINT64_C(2) << med) : 0, b[2]),
        (unsigned long long)misses,
        cli_format_ns(misses ? miss_sum / (double)misses : 0, mb));
    printf("  %-16s (each call timed on its own, two clock reads around it; "
           "a hit here\n"
           "  %-16s is a block a consumer thread freed, taken from the "
           "pool's shared\n"
           "  %-16s bins (tcache_hits says how many came from a thread "
           "cache), while %llu\n"
           "  %-16s threads fill and verify on %ld CPUs: the slowest %llu "
           "calls taken for the misses)\n",
           "", "", "",
           (unsigned long long)(d->opt.producers + d->opt.consumers), "",
           sysconf(_SC_NPROCESSORS_ONLN), (unsigned long long)misses);
  }
  if (enomem)
    printf("  %-16s %llu ENOMEM answers, retried\n", "",
           (unsigned long long)enomem);
  printf("  %-16s mean %.2f%% per buffer, %.2f%% of bytes; block_bytes peak "
         "%s vs requested_bytes peak %s (+%.2f%%)\n",
         "rounding waste", buffers ? 100.0 * waste_sum / (double)buffers : 0.0,
         requested ? 100.0 * (double)(block - requested) / (double)requested
                   : 0.0,
         cli_format_bytes((double)s->block_bytes.peak, b[1]),
         cli_format_bytes((double)s->requested_bytes.peak, b[2]),
         s->requested_bytes.peak ? 100.0 *
                                       ((double)s->block_bytes.peak -
                                        (double)s->requested_bytes.peak) /
                                       (double)s->requested_bytes.peak
                                 : 0.0);
  backend = s->backend_alloc.count + s->backend_free.count;
  naive = 2 * buffers; /* one alloc and one free per buffer */
  printf("  backend calls: %llu (a naive cudaHostAlloc-per-buffer design "
         "would make %llu)\n",
         (unsigned long long)backend, (unsigned long long)naive);
}
