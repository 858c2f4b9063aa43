/*
 * pp_bench's utilities (util.h): small utilities, the process's own
 * measurements and the options. Calls no other file of pp_bench.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "pinpool.h"
#include "util.h"

/* ---- Small utilities ----------------------------------------------------- */

void pb_die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "pp_bench: ");
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

void pb_die_pp(const char *call, int rc) {
  pb_die("%s failed: %s: %s", call, pinpool_strerror(rc), pinpool_last_error());
}

void *pb_xmalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (p == NULL)
    pb_die("out of memory (%zu bytes of bookkeeping)", n);
  return p;
}

/* A log-uniform size in [lo, hi]. */
size_t pb_log_uniform(rng_t *r, size_t lo, size_t hi) {
  double l = log((double)lo), h = log((double)hi);
  size_t s = (size_t)exp(l + (h - l) * pb_rng_unit(r));
  return s < lo ? lo : s > hi ? hi : s;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

void pb_samples_init(samples_t *s, size_t cap) {
  s->v = pb_xmalloc((cap ? cap : 1) * sizeof *s->v);
  s->n = 0;
  s->cap = cap ? cap : 1;
}

void pb_samples_add(samples_t *s, uint64_t x) {
  if (s->n == s->cap) {
    size_t ncap = s->cap * 2;
    uint64_t *nv = realloc(s->v, ncap * sizeof *nv);
    if (nv == NULL)
      pb_die("out of memory (samples)");
    s->v = nv;
    s->cap = ncap;
  }
  s->v[s->n++] = x;
}

void pb_samples_merge(samples_t *into, const samples_t *from) {
  for (size_t i = 0; i < from->n; i++)
    pb_samples_add(into, from->v[i]);
}

/* Sorts the samples; q in [0, 1]; nearest rank. */
double pb_samples_quantile(samples_t *s, double q) {
  if (s->n == 0)
    return 0.0;
  qsort(s->v, s->n, sizeof s->v[0], cmp_u64);
  size_t rank = (size_t)ceil(q * (double)s->n);
  if (rank < 1)
    rank = 1;
  if (rank > s->n)
    rank = s->n;
  return (double)s->v[rank - 1];
}

double pb_samples_mean(const samples_t *s) {
  double t = 0;
  for (size_t i = 0; i < s->n; i++)
    t += (double)s->v[i];
  return s->n ? t / (double)s->n : 0.0;
}

void pb_samples_free(samples_t *s) {
  free(s->v);
  s->v = NULL;
  s->n = s->cap = 0;
}

const char *pb_size_str(size_t size, char *buf, size_t len) {
  if (size >= GIB && size % GIB == 0)
    snprintf(buf, len, "%zuGiB", size / GIB);
  else if (size >= MIB && size % MIB == 0)
    snprintf(buf, len, "%zuMiB", size / MIB);
  else if (size >= MIB)
    snprintf(buf, len, "%.1fMiB", (double)size / (double)MIB);
  else if (size >= KIB && size % KIB == 0)
    snprintf(buf, len, "%zuKiB", size / KIB);
  else
    snprintf(buf, len, "%zuB", size);
  return buf;
}

/* ---- Process measurements: faults, RSS ----------------------------------- */

uint64_t pb_minflt_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (uint64_t)ru.ru_minflt;
}

/* A "VmXXX:" field of /proc/self/status, in bytes (0 if unreadable). */
uint64_t pb_proc_status_kib(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  uint64_t v = 0;
  size_t len = strlen(field);
  if (f == NULL)
    return 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, field, len) == 0 && line[len] == ':') {
      v = strtoull(line + len + 1, NULL, 10) * 1024u;
      break;
    }
  }
  fclose(f);
  return v;
}

static uint64_t g_rss_base;
bool pb_hwm_reset;

/* Reset the peak RSS to the current RSS (Linux clear_refs "5"). */
void pb_rss_begin(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  pb_hwm_reset = false;
  if (f != NULL) {
    pb_hwm_reset = fputs("5", f) >= 0;
    if (fclose(f) != 0)
      pb_hwm_reset = false;
  }
  g_rss_base = pb_proc_status_kib("VmRSS");
}

/* Peak RSS since pb_rss_begin, above the RSS at pb_rss_begin. */
uint64_t pb_rss_peak_delta(void) {
  uint64_t hwm = pb_proc_status_kib("VmHWM");
  return hwm > g_rss_base ? hwm - g_rss_base : 0;
}

/* ---- Options ------------------------------------------------------------- */

options_t pb_opt = {NULL, NULL, false, 1, 0, 1, false, NULL, NULL};
