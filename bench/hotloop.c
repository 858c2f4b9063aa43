/*
 * pp_hotloop — workload W1 ("hot reuse") of the benchmark suite.
 *
 * One thread allocates and frees a block of a fixed size in a loop; we report
 * nanoseconds per alloc+free pair for:
 *
 *   pinpool          a pool with tcache_bytes=2GiB, so that every size (even
 *                    1 GiB) stays in the thread cache; warmed up, so each
 *                    alloc is a cache hit
 *   pinpool-default  a pool with the default configuration, warmed up
 *   malloc           glibc malloc + free
 *   malloc+touch     glibc malloc, a write to every 4 KiB page, free: the fair
 *                    comparison, since pinned blocks are resident
 *   mmap+populate    mmap(MAP_POPULATE) + munmap per pair: the naive
 *                    "cudaHostAlloc per buffer" design, minus the pinning
 *
 * Every implementation writes one byte of the block and stores its address
 * into a volatile, so that no compiler can elide the pair.
 *
 * Method: per (size, implementation), a calibration run estimates the cost of
 * a pair and picks the pairs per repeat that fill the time budget. Then 7
 * repeats run, the implementations interleaved (their order rotates every
 * repeat). Inside a repeat, pairs are timed in groups of k (k is chosen so a
 * group lasts >= 4 us, which keeps clock_gettime out of the result; k = 1
 * for slow pairs). Reported: the median over repeats of the mean ns per pair,
 * and the 99th percentile (nearest rank) of the per-group ns per pair over
 * all repeats (the max when there are fewer than 100 groups).
 *
 *   pp_hotloop [--quick] [--full] [--repeats N] [--json FILE]
 *              [--markdown FILE] [--rev REVISION]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "pinpool.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define GIB ((size_t)1 << 30)
#define PAGE ((size_t)4096)

#define MAX_REPEATS 51
#define GROUP_NS 4000.0        /* minimum duration of a timed group */
#define CALIBRATE_NS 2000000.0 /* calibration stops after 2 ms ... */
#define MAX_PAIRS_PER_REPEAT ((uint64_t)1 << 26)

static const size_t g_sizes[] = {4 * KIB, 64 * KIB, 1 * MIB, 64 * MIB, 1 * GIB};
#define N_SIZES (sizeof g_sizes / sizeof g_sizes[0])

/* ---- Sinks: keep the compiler from removing the pairs ------------------- */
static void *volatile g_sink_ptr;

/* ---- Implementations ---------------------------------------------------- */
typedef struct impl impl_t;
struct impl {
  const char *name;
  const char *config; /* pinpool config, NULL for the others */
  int (*loop)(impl_t *im, size_t size, uint64_t pairs);
  pinpool_t *pool;
  bool available;
  char note[128]; /* why unavailable, or extra info */
};

static int pinpool_fail(const char *call, int rc) {
  const char *why = pinpool_last_error();
  fprintf(stderr, "pp_hotloop: %s failed: %s%s%s\n", call, pinpool_strerror(rc),
          why[0] ? ": " : "", why);
  return -1;
}

static int loop_pinpool(impl_t *im, size_t size, uint64_t pairs) {
  for (uint64_t i = 0; i < pairs; i++) {
    void *p = NULL;
    int rc = pinpool_alloc(im->pool, size, &p);
    if (rc != PINPOOL_OK)
      return pinpool_fail("pinpool_alloc", rc);
    *(unsigned char *)p = (unsigned char)i;
    g_sink_ptr = p;
    rc = pinpool_free(im->pool, p);
    if (rc != PINPOOL_OK)
      return pinpool_fail("pinpool_free", rc);
  }
  return 0;
}

static int loop_malloc(impl_t *im, size_t size, uint64_t pairs) {
  (void)im;
  for (uint64_t i = 0; i < pairs; i++) {
    unsigned char *p = malloc(size);
    if (p == NULL) {
      fprintf(stderr, "pp_hotloop: malloc(%zu) failed\n", size);
      return -1;
    }
    p[0] = (unsigned char)i;
    g_sink_ptr = p;
    free(p);
  }
  return 0;
}

static int loop_malloc_touch(impl_t *im, size_t size, uint64_t pairs) {
  (void)im;
  for (uint64_t i = 0; i < pairs; i++) {
    unsigned char *p = malloc(size);
    if (p == NULL) {
      fprintf(stderr, "pp_hotloop: malloc(%zu) failed\n", size);
      return -1;
    }
    for (size_t off = 0; off < size; off += PAGE)
      p[off] = (unsigned char)i;
    g_sink_ptr = p;
    free(p);
  }
  return 0;
}

static int loop_mmap(impl_t *im, size_t size, uint64_t pairs) {
  (void)im;
  for (uint64_t i = 0; i < pairs; i++) {
    unsigned char *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
      fprintf(stderr, "pp_hotloop: mmap(%zu) failed: %s\n", size,
              strerror(errno));
      return -1;
    }
    p[0] = (unsigned char)i;
    g_sink_ptr = p;
    if (munmap(p, size) != 0) {
      fprintf(stderr, "pp_hotloop: munmap failed: %s\n", strerror(errno));
      return -1;
    }
  }
  return 0;
}

static impl_t g_impls[] = {
    {"pinpool", "tcache_bytes=2GiB", loop_pinpool, NULL, false, ""},
    {"pinpool-default", "", loop_pinpool, NULL, false, ""},
    {"malloc", NULL, loop_malloc, NULL, false, ""},
    {"malloc+touch", NULL, loop_malloc_touch, NULL, false, ""},
    {"mmap+populate", NULL, loop_mmap, NULL, false, ""},
};
#define N_IMPLS (sizeof g_impls / sizeof g_impls[0])

/* ---- Results ------------------------------------------------------------ */
typedef struct result {
  size_t size;
  const impl_t *impl;
  bool ok;
  uint64_t pairs_per_repeat;
  uint64_t group; /* pairs per timed sample */
  unsigned repeats;
  double rep_mean[MAX_REPEATS];
  double *samples; /* ns per pair of each timed group */
  size_t nsamples;
  size_t cap;
  double median;
  double p99;
  double max;
  /* pinpool only: backend calls and thread-cache hits while measured */
  uint64_t allocs;
  uint64_t backend_calls;
  uint64_t tcache_hits;
  bool have_pool_stats;
} result_t;

typedef struct options {
  bool quick;
  bool full;
  unsigned repeats;
  const char *json;
  const char *markdown;
  const char *rev;
  double budget_ns; /* timed pairs per repeat and implementation */
} options_t;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static const char *size_name(size_t size, char *buf, size_t len) {
  if (size >= GIB && size % GIB == 0)
    snprintf(buf, len, "%zu GiB", size / GIB);
  else if (size >= MIB && size % MIB == 0)
    snprintf(buf, len, "%zu MiB", size / MIB);
  else if (size >= KIB && size % KIB == 0)
    snprintf(buf, len, "%zu KiB", size / KIB);
  else
    snprintf(buf, len, "%zu B", size);
  return buf;
}

/* ---- Measurement -------------------------------------------------------- */

/* Estimate ns per pair (this also warms the implementation up). */
static int calibrate(impl_t *im, size_t size, double *ns_per_pair) {
  uint64_t n = 1;
  double t;
  if (im->loop(im, size, 1) != 0) /* warm-up: the pool's first miss */
    return -1;
  for (;;) {
    double t0 = now_ns();
    if (im->loop(im, size, n) != 0)
      return -1;
    t = now_ns() - t0;
    if (t >= CALIBRATE_NS || n >= MAX_PAIRS_PER_REPEAT)
      break;
    n *= 4;
  }
  *ns_per_pair = t / (double)n;
  if (*ns_per_pair < 0.1)
    *ns_per_pair = 0.1;
  return 0;
}

static int plan(result_t *r, impl_t *im, const options_t *o) {
  double est;
  uint64_t per_rep, group, groups;
  if (calibrate(im, r->size, &est) != 0)
    return -1;
  per_rep = (uint64_t)(o->budget_ns / est);
  if (per_rep < 1)
    per_rep = 1;
  if (per_rep > MAX_PAIRS_PER_REPEAT)
    per_rep = MAX_PAIRS_PER_REPEAT;
  group = (uint64_t)(GROUP_NS / est) + 1;
  if (est >= GROUP_NS)
    group = 1;
  if (group > per_rep)
    group = per_rep;
  groups = per_rep / group;
  r->group = group;
  r->pairs_per_repeat = groups * group;
  r->cap = (size_t)groups * o->repeats;
  r->samples = malloc(r->cap * sizeof *r->samples);
  if (r->samples == NULL) {
    fprintf(stderr, "pp_hotloop: out of memory\n");
    return -1;
  }
  return 0;
}

static int pool_counters(impl_t *im, uint64_t *allocs, uint64_t *backend,
                         uint64_t *tcache) {
  pinpool_stats_t s;
  int rc = pinpool_get_stats(im->pool, &s);
  if (rc != PINPOOL_OK)
    return pinpool_fail("pinpool_get_stats", rc);
  *allocs = s.cache_hits + s.cache_misses;
  *backend = s.backend_alloc.count + s.backend_free.count;
  *tcache = s.tcache_hits;
  return 0;
}

/* One repeat of one implementation at one size. */
static int run_repeat(result_t *r, impl_t *im, unsigned rep) {
  uint64_t groups = r->pairs_per_repeat / r->group;
  uint64_t warm = r->group < 8 ? r->group : 8;
  double total = 0;
  if (r->pairs_per_repeat > 1 || r->group > 1)
    if (im->loop(im, r->size, warm) != 0) /* untimed: refill caches */
      return -1;
  for (uint64_t g = 0; g < groups; g++) {
    double t0 = now_ns(), dt;
    if (im->loop(im, r->size, r->group) != 0)
      return -1;
    dt = now_ns() - t0;
    total += dt;
    r->samples[r->nsamples++] = dt / (double)r->group;
  }
  r->rep_mean[rep] = total / (double)r->pairs_per_repeat;
  return 0;
}

static void summarize(result_t *r) {
  double means[MAX_REPEATS];
  size_t rank;
  memcpy(means, r->rep_mean, r->repeats * sizeof means[0]);
  qsort(means, r->repeats, sizeof means[0], cmp_double);
  r->median = r->repeats % 2
                  ? means[r->repeats / 2]
                  : (means[r->repeats / 2 - 1] + means[r->repeats / 2]) / 2;
  qsort(r->samples, r->nsamples, sizeof r->samples[0], cmp_double);
  rank = (size_t)((double)r->nsamples * 0.99 + 0.999999);
  if (rank < 1)
    rank = 1;
  if (rank > r->nsamples)
    rank = r->nsamples;
  r->p99 = r->samples[rank - 1];
  r->max = r->samples[r->nsamples - 1];
}

/* Measure every available implementation at `size`, interleaved. */
static int measure_size(size_t size, const options_t *o, result_t *res) {
  uint64_t a0[N_IMPLS], b0[N_IMPLS], t0[N_IMPLS];
  char name[32];

  for (size_t j = 0; j < N_IMPLS; j++) {
    res[j].size = size;
    res[j].impl = &g_impls[j];
    res[j].repeats = o->repeats;
    if (!g_impls[j].available)
      continue;
    fprintf(stderr, "  %-8s %-16s calibrating\n",
            size_name(size, name, sizeof name), g_impls[j].name);
    if (plan(&res[j], &g_impls[j], o) != 0)
      return -1;
    if (g_impls[j].pool != NULL &&
        pool_counters(&g_impls[j], &a0[j], &b0[j], &t0[j]) != 0)
      return -1;
  }
  for (unsigned rep = 0; rep < o->repeats; rep++) {
    for (size_t k = 0; k < N_IMPLS; k++) {
      size_t j = (k + rep) % N_IMPLS;
      if (g_impls[j].available && run_repeat(&res[j], &g_impls[j], rep) != 0)
        return -1;
    }
  }
  for (size_t j = 0; j < N_IMPLS; j++) {
    impl_t *im = &g_impls[j];
    if (!im->available)
      continue;
    summarize(&res[j]);
    res[j].ok = true;
    if (im->pool != NULL) {
      uint64_t a1, b1, t1;
      int rc;
      if (pool_counters(im, &a1, &b1, &t1) != 0)
        return -1;
      res[j].allocs = a1 - a0[j];
      res[j].backend_calls = b1 - b0[j];
      res[j].tcache_hits = t1 - t0[j];
      res[j].have_pool_stats = true;
      /* Give the memory back before the next size. */
      rc = pinpool_empty_cache(im->pool);
      if (rc != PINPOOL_OK)
        return pinpool_fail("pinpool_empty_cache", rc);
    }
  }
  return 0;
}

/* ---- Machine description ------------------------------------------------ */
typedef struct machine {
  char uname[256];
  long nproc;
  char cpu[256];
} machine_t;

static void describe_machine(machine_t *m) {
  struct utsname u;
  FILE *f;
  char line[512];
  if (uname(&u) == 0)
    snprintf(m->uname, sizeof m->uname, "%s %s %s", u.sysname, u.release,
             u.machine);
  else
    snprintf(m->uname, sizeof m->uname, "unknown");
  m->nproc = sysconf(_SC_NPROCESSORS_ONLN);
  snprintf(m->cpu, sizeof m->cpu, "unknown");
  f = fopen("/proc/cpuinfo", "r");
  if (f == NULL)
    return;
  while (fgets(line, sizeof line, f) != NULL) {
    char *colon = strchr(line, ':');
    if (colon == NULL || (strncmp(line, "model name", 10) != 0 &&
                          strncmp(line, "Model", 5) != 0))
      continue;
    colon++;
    while (*colon == ' ' || *colon == '\t')
      colon++;
    colon[strcspn(colon, "\n")] = '\0';
    snprintf(m->cpu, sizeof m->cpu, "%s", colon);
    break;
  }
  fclose(f);
}

/* ---- Output ------------------------------------------------------------- */
static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\')
      fprintf(f, "\\%c", c);
    else if (c < 0x20)
      fprintf(f, "\\u%04x", c);
    else
      fputc(c, f);
  }
  fputc('"', f);
}

static void format_ratio(char *buf, size_t len, double ratio) {
  if (ratio >= 100)
    snprintf(buf, len, "%.0fx", ratio);
  else if (ratio >= 10)
    snprintf(buf, len, "%.1fx", ratio);
  else
    snprintf(buf, len, "%.2fx", ratio);
}

/* ns with one decimal below 100 ns, whole ns above. */
static const char *format_ns(char *buf, size_t len, double ns) {
  snprintf(buf, len, ns < 100 ? "%.1f" : "%.0f", ns);
  return buf;
}

/* One row of the table, as text cells. */
typedef struct row_cells {
  char size[32], median[32], p99[32], max[32], ratio[32], pairs[32], k[32];
  char note[192];
} row_cells_t;

static void make_cells(const result_t *r, double base, bool first,
                       row_cells_t *c) {
  size_t n;
  if (first)
    size_name(r->size, c->size, sizeof c->size);
  else
    c->size[0] = '\0';
  snprintf(c->median, sizeof c->median, "-");
  snprintf(c->p99, sizeof c->p99, "-");
  snprintf(c->max, sizeof c->max, "-");
  snprintf(c->ratio, sizeof c->ratio, "-");
  snprintf(c->pairs, sizeof c->pairs, "-");
  snprintf(c->k, sizeof c->k, "-");
  c->note[0] = '\0';
  if (!r->ok) {
    snprintf(c->note, sizeof c->note, "skipped%s%s",
             r->impl->note[0] ? ": " : "", r->impl->note);
    return;
  }
  format_ns(c->median, sizeof c->median, r->median);
  format_ns(c->p99, sizeof c->p99, r->p99);
  format_ns(c->max, sizeof c->max, r->max);
  if (base > 0)
    format_ratio(c->ratio, sizeof c->ratio, r->median / base);
  snprintf(c->pairs, sizeof c->pairs, "%llu",
           (unsigned long long)r->pairs_per_repeat * r->repeats);
  snprintf(c->k, sizeof c->k, "%llu", (unsigned long long)r->group);
  if (r->impl->config != NULL && r->impl->config[0] != '\0')
    snprintf(c->note, sizeof c->note, "config %s", r->impl->config);
  if (r->have_pool_stats) {
    n = strlen(c->note);
    snprintf(c->note + n, sizeof c->note - n,
             "%s%llu backend calls, %.0f%% tcache hits", n ? "; " : "",
             (unsigned long long)r->backend_calls,
             r->allocs ? 100.0 * (double)r->tcache_hits / (double)r->allocs
                       : 0.0);
  }
}

static void print_table(FILE *f, const result_t *res, size_t nsizes,
                        const options_t *o, const machine_t *m, bool markdown) {
  const char *mode = o->quick ? "quick" : "normal";
  if (markdown)
    fprintf(f,
            "# W1 hot reuse: 1 thread, alloc+free pairs\n\n"
            "- revision: `%s`\n"
            "- machine: %s, %ld CPUs, %s\n"
            "- mode: %s, %u repeats\n"
            "- median: of the per-repeat mean ns per pair (it can exceed "
            "p99 when a few pairs are very slow: page faults, heap trims)\n"
            "- p99, max: over timed groups of k pairs, all repeats\n"
            "- vs pinpool: median / median of `pinpool` at the same size "
            "(higher is slower)\n\n"
            "| size | impl | median ns/pair | p99 | max | vs pinpool | "
            "pairs | k | notes |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---|\n",
            o->rev, m->uname, m->nproc, m->cpu, mode, o->repeats);
  else
    fprintf(f,
            "W1 hot reuse: 1 thread, alloc+free pairs (%s mode)\n"
            "median of %u per-repeat means; p99 and max over timed groups "
            "of k pairs\n"
            "revision %s | %s | %ld CPUs | %s\n\n"
            "%-8s %-16s %14s %12s %12s %10s %10s %5s  %s\n",
            mode, o->repeats, o->rev, m->uname, m->nproc, m->cpu, "size",
            "impl", "median ns/pair", "p99", "max", "vs pinpool", "pairs", "k",
            "notes");
  for (size_t i = 0; i < nsizes; i++) {
    const result_t *row = &res[i * N_IMPLS];
    double base = row[0].ok ? row[0].median : 0.0; /* row[0]: pinpool */
    for (size_t j = 0; j < N_IMPLS; j++) {
      row_cells_t c;
      make_cells(&row[j], base, markdown || j == 0, &c);
      if (markdown)
        fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.size,
                row[j].impl->name, c.median, c.p99, c.max, c.ratio, c.pairs,
                c.k, c.note);
      else
        fprintf(f, "%-8s %-16s %14s %12s %12s %10s %10s %5s  %s\n", c.size,
                row[j].impl->name, c.median, c.p99, c.max, c.ratio, c.pairs,
                c.k, c.note);
    }
  }
}

static int write_json(const char *path, const result_t *res, size_t nsizes,
                      const options_t *o, const machine_t *m) {
  FILE *f = fopen(path, "w");
  bool first = true;
  time_t t = time(NULL);
  char date[64];
  if (f == NULL) {
    fprintf(stderr, "pp_hotloop: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&t));
  fprintf(f, "{\n  \"schema\": \"pinpool-bench/1\",\n  \"git_revision\": ");
  json_string(f, o->rev);
  fprintf(f, ",\n  \"date\": \"%s\",\n  \"mode\": \"%s\",\n", date,
          o->quick ? "quick" : "normal");
  fprintf(f, "  \"pinpool_version\": ");
  json_string(f, pinpool_version());
  fprintf(f, ",\n  \"machine\": {\"uname\": ");
  json_string(f, m->uname);
  fprintf(f, ", \"nproc\": %ld, \"cpu_model\": ", m->nproc);
  json_string(f, m->cpu);
  fprintf(f, "},\n  \"results\": [");
  for (size_t i = 0; i < nsizes * N_IMPLS; i++) {
    const result_t *r = &res[i];
    if (!r->ok)
      continue;
    fprintf(f, "%s\n    {\"workload\": \"W1\", \"size\": %zu, \"impl\": ",
            first ? "" : ",", r->size);
    json_string(f, r->impl->name);
    fprintf(f,
            ", \"threads\": 1, \"ns_per_pair_median\": %.3f, "
            "\"ns_per_pair_p99\": %.3f, \"ns_per_pair_max\": %.3f, "
            "\"iterations\": %llu, "
            "\"repeats\": %u, \"pairs_per_sample\": %llu",
            r->median, r->p99, r->max,
            (unsigned long long)r->pairs_per_repeat * r->repeats, r->repeats,
            (unsigned long long)r->group);
    if (r->impl->config != NULL) {
      fprintf(f, ", \"config\": ");
      json_string(f, r->impl->config);
    }
    if (r->have_pool_stats)
      fprintf(f, ", \"backend_calls\": %llu, \"tcache_hits\": %llu",
              (unsigned long long)r->backend_calls,
              (unsigned long long)r->tcache_hits);
    fprintf(f, "}");
    first = false;
  }
  fprintf(f, "\n  ]\n}\n");
  if (fclose(f) != 0) {
    fprintf(stderr, "pp_hotloop: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

static int write_markdown(const char *path, const result_t *res, size_t nsizes,
                          const options_t *o, const machine_t *m) {
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    fprintf(stderr, "pp_hotloop: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  print_table(f, res, nsizes, o, m, true);
  if (fclose(f) != 0) {
    fprintf(stderr, "pp_hotloop: cannot write %s: %s\n", path, strerror(errno));
    return -1;
  }
  return 0;
}

/* ---- Main -----------------------------------------------------------------
 */
static void usage(FILE *f) {
  fprintf(f,
          "usage: pp_hotloop [--quick] [--full] [--repeats N] [--json FILE]\n"
          "                  [--markdown FILE] [--rev REVISION]\n"
          "\n"
          "W1 hot reuse: ns per alloc+free pair of pinpool, glibc malloc,\n"
          "malloc + page touch and mmap(MAP_POPULATE) at 4 KiB .. 64 MiB\n"
          "(1 GiB too with --full).\n"
          "\n"
          "  --quick         short time budget (whole run well under 20 s)\n"
          "  --full          add the 1 GiB size\n"
          "  --repeats N     repeats per measurement (default 7, odd, <= %d)\n"
          "  --json FILE     write the results as JSON\n"
          "  --markdown FILE write the table as markdown\n"
          "  --rev REVISION  git revision recorded in the outputs\n",
          MAX_REPEATS);
}

static int parse_args(int argc, char **argv, options_t *o) {
  memset(o, 0, sizeof *o);
  o->repeats = 7;
  o->rev = "unknown";
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char **value = NULL;
    if (strcmp(a, "--quick") == 0) {
      o->quick = true;
    } else if (strcmp(a, "--full") == 0) {
      o->full = true;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      exit(0);
    } else if (strcmp(a, "--json") == 0) {
      value = &o->json;
    } else if (strcmp(a, "--markdown") == 0) {
      value = &o->markdown;
    } else if (strcmp(a, "--rev") == 0) {
      value = &o->rev;
    } else if (strcmp(a, "--repeats") == 0) {
      char *end;
      long n;
      if (i + 1 >= argc)
        goto missing;
      n = strtol(argv[++i], &end, 10);
      if (*end != '\0' || n < 1 || n > MAX_REPEATS) {
        fprintf(stderr, "pp_hotloop: --repeats must be 1..%d\n", MAX_REPEATS);
        return -1;
      }
      o->repeats = (unsigned)n;
    } else {
      fprintf(stderr, "pp_hotloop: unknown option '%s' (try --help)\n", a);
      return -1;
    }
    if (value != NULL) {
      if (i + 1 >= argc)
        goto missing;
      *value = argv[++i];
    }
    continue;
  missing:
    fprintf(stderr, "pp_hotloop: option %s needs a value\n", a);
    return -1;
  }
  o->budget_ns = o->quick ? 40e6 : 100e6;
  return 0;
}

static void setup_impls(void) {
  for (size_t j = 0; j < N_IMPLS; j++) {
    impl_t *im = &g_impls[j];
    im->available = true;
    if (im->loop == loop_pinpool) {
      int rc = pinpool_create(im->config, &im->pool);
      if (rc != PINPOOL_OK) {
        pinpool_fail("pinpool_create", rc);
        snprintf(im->note, sizeof im->note, "pinpool_create(\"%s\"): %s",
                 im->config, pinpool_strerror(rc));
        im->available = false;
      }
    }
  }
}

int main(int argc, char **argv) {
  options_t o;
  machine_t m;
  result_t *res;
  size_t nsizes, measured;
  int status = 0;
  double t0 = now_ns();

  if (parse_args(argc, argv, &o) != 0)
    return 2;
  nsizes = o.full ? N_SIZES : N_SIZES - 1;
  describe_machine(&m);
  setup_impls();
  res = calloc(nsizes * N_IMPLS, sizeof *res);
  if (res == NULL) {
    fprintf(stderr, "pp_hotloop: out of memory\n");
    return 1;
  }
  fprintf(stderr, "pp_hotloop: %s mode, %u repeats, %zu sizes\n",
          o.quick ? "quick" : "normal", o.repeats, nsizes);
  for (measured = 0; measured < nsizes; measured++) {
    if (measure_size(g_sizes[measured], &o, &res[measured * N_IMPLS]) != 0) {
      status = 1; /* report the sizes measured so far */
      break;
    }
  }
  print_table(stdout, res, measured, &o, &m, false);
  printf("\n(%.1f s)\n", (now_ns() - t0) / 1e9);
  if (o.json != NULL && write_json(o.json, res, measured, &o, &m) != 0)
    status = 1;
  if (o.markdown != NULL &&
      write_markdown(o.markdown, res, measured, &o, &m) != 0)
    status = 1;
  for (size_t i = 0; i < N_IMPLS; i++)
    pinpool_destroy(g_impls[i].pool);
  for (size_t i = 0; i < nsizes * N_IMPLS; i++)
    free(res[i].samples);
  free(res);
  return status;
}
