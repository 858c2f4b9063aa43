/*
 * `pinpool snapshot diff A B`: live memory per allocation site in two
 * snapshots, largest growth first, for leak hunting; and the totals side
 * by side. Text or JSON; the sites come from snapshot_summarize.c.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "snapshot_summarize.h"
#include "snapshot_summary.h"

/* ---- diff -------------------------------------------------------------------
 */

typedef struct site_delta {
  const char *site; /* borrowed from the site lists */
  uint64_t a_bytes, b_bytes, a_blocks, b_blocks;
  int64_t d_bytes, d_blocks;
} site_delta_t;

static int by_growth(const void *pa, const void *pb) {
  const site_delta_t *a = pa, *b = pb;
  if (a->d_bytes != b->d_bytes)
    return a->d_bytes > b->d_bytes ? -1 : 1;
  if (a->d_blocks != b->d_blocks)
    return a->d_blocks > b->d_blocks ? -1 : 1;
  return strcmp(a->site, b->site);
}

/* Merge two name-sorted site lists into deltas, largest growth first. */
static site_delta_t *join_sites(const snap_site_stat_t *a, size_t na,
                                const snap_site_stat_t *b, size_t nb,
                                size_t *nout) {
  site_delta_t *d = calloc(na + nb + 1, sizeof *d);
  size_t i = 0, j = 0, n = 0;
  if (d == NULL)
    return NULL;
  while (i < na || j < nb) {
    int c = i == na ? 1 : j == nb ? -1 : strcmp(a[i].site, b[j].site);
    site_delta_t *x = &d[n++];
    if (c <= 0) {
      x->site = a[i].site;
      x->a_bytes = a[i].bytes;
      x->a_blocks = a[i].blocks;
      i++;
    }
    if (c >= 0) {
      x->site = b[j].site;
      x->b_bytes = b[j].bytes;
      x->b_blocks = b[j].blocks;
      j++;
    }
    x->d_bytes = (int64_t)(x->b_bytes - x->a_bytes);
    x->d_blocks = (int64_t)(x->b_blocks - x->a_blocks);
  }
  if (n > 1)
    qsort(d, n, sizeof *d, by_growth);
  *nout = n;
  return d;
}

enum {
  T_RESERVED,
  T_ALLOCATED,
  T_PENDING,
  T_CACHED,
  T_LIVE_BLOCKS,
  T_SEGMENTS,
  T_N
};
static const char *const total_names[T_N] = {"reserved",     "allocated",
                                             "pending_free", "cached",
                                             "live_blocks",  "segments"};

static void diff_totals(const snap_t *s, uint64_t v[T_N]) {
  snap_totals_t t;
  snap_read_totals(s, &t);
  v[T_RESERVED] = t.reserved;
  v[T_ALLOCATED] = t.allocated;
  v[T_PENDING] = t.pending;
  v[T_CACHED] = t.cached;
  v[T_LIVE_BLOCKS] = t.allocated_blocks + t.pending_blocks;
  v[T_SEGMENTS] = t.segments;
}

static void put_delta(FILE *out, int w, int64_t d) {
  char num[32];
  (void)snprintf(num, sizeof num, "%s%" PRId64, d > 0 ? "+" : "", d);
  fprintf(out, "%*s", w, num);
}

static void write_diff_text(const char *na, const char *nb,
                            const uint64_t ta[T_N], const uint64_t tb[T_N],
                            const site_delta_t *d, size_t n, size_t nsa,
                            size_t nsb, size_t top, FILE *out) {
  size_t grew = 0, shrank = 0, changed, shown;
  for (size_t i = 0; i < n; i++) {
    grew += d[i].d_bytes > 0 || (d[i].d_bytes == 0 && d[i].d_blocks > 0);
    shrank += d[i].d_bytes < 0 || (d[i].d_bytes == 0 && d[i].d_blocks < 0);
  }
  changed = grew + shrank;
  fprintf(out, "diff A %s\n  -> B %s\n\n", na, nb);
  fprintf(out, "  %-14s %16s %16s %16s\n", "totals", "A", "B", "delta");
  for (int k = 0; k < T_N; k++) {
    int64_t dv = (int64_t)(tb[k] - ta[k]);
    char h[CLI_BYTES_LEN];
    fprintf(out, "  %-14s %16" PRIu64 " %16" PRIu64 " ", total_names[k], ta[k],
            tb[k]);
    put_delta(out, 16, dv);
    if (k != T_LIVE_BLOCKS && k != T_SEGMENTS && dv != 0)
      fprintf(out, "  (%s%s)", dv > 0 ? "+" : "",
              cli_format_bytes((double)dv, h));
    fputc('\n', out);
  }
  fprintf(out,
          "\nsites: %zu in A, %zu in B; %zu grew, %zu shrank, "
          "%zu unchanged\n",
          nsa, nsb, grew, shrank, n - changed);
  /* Unchanged sites sort between the growing and the shrinking ones; only
   * changes are listed. */
  shown = top == 0 || top > changed ? changed : top;
  if (changed == 0) {
    fprintf(out, "no growth: no site changed its live bytes or blocks\n");
    return;
  }
  fprintf(out,
          "top %zu sites by growth of live bytes (allocated + "
          "pending_free)\n",
          shown);
  fprintf(out, "  %14s %8s %14s %14s %8s %8s  %s\n", "delta bytes", "blocks",
          "A bytes", "B bytes", "A blocks", "B blocks", "site");
  size_t printed = 0;
  for (size_t i = 0; i < n && printed < shown; i++) {
    if (d[i].d_bytes == 0 && d[i].d_blocks == 0)
      continue;
    fprintf(out, "  ");
    put_delta(out, 14, d[i].d_bytes);
    fputc(' ', out);
    put_delta(out, 8, d[i].d_blocks);
    fprintf(out, " %14" PRIu64 " %14" PRIu64 " %8" PRIu64 " %8" PRIu64 "  %s\n",
            d[i].a_bytes, d[i].b_bytes, d[i].a_blocks, d[i].b_blocks,
            d[i].site);
    printed++;
  }
}

static json_t *diff_json(const char *na, const char *nb, const uint64_t ta[T_N],
                         const uint64_t tb[T_N], const site_delta_t *d,
                         size_t n, size_t top) {
  json_t *o = json_object(), *t = json_object(), *a = json_array();
  size_t printed = 0;
  snap_jset(o, "a", snap_jname(na));
  snap_jset(o, "b", snap_jname(nb));
  for (int k = 0; k < T_N; k++) {
    json_t *x = json_object();
    snap_jset(x, "a", snap_jint(ta[k]));
    snap_jset(x, "b", snap_jint(tb[k]));
    snap_jset(x, "delta", json_integer((json_int_t)(int64_t)(tb[k] - ta[k])));
    snap_jset(t, total_names[k], x);
  }
  snap_jset(o, "totals", t);
  for (size_t i = 0; i < n && (top == 0 || printed < top); i++) {
    if (d[i].d_bytes == 0 && d[i].d_blocks == 0)
      continue;
    json_t *x = json_object();
    snap_jset(x, "site", json_string(d[i].site));
    snap_jset(x, "delta_bytes", json_integer(d[i].d_bytes));
    snap_jset(x, "delta_blocks", json_integer(d[i].d_blocks));
    snap_jset(x, "a_bytes", snap_jint(d[i].a_bytes));
    snap_jset(x, "b_bytes", snap_jint(d[i].b_bytes));
    snap_jset(x, "a_blocks", snap_jint(d[i].a_blocks));
    snap_jset(x, "b_blocks", snap_jint(d[i].b_blocks));
    (void)json_array_append_new(a, x);
    printed++;
  }
  snap_jset(o, "sites", a);
  return o;
}

int snap_diff_write(const snap_t *a, const char *name_a, const snap_t *b,
                    const char *name_b, FILE *out, size_t top, int json) {
  snap_site_stat_t *va = NULL, *vb = NULL;
  size_t na = 0, nb = 0, n = 0;
  site_delta_t *d = NULL;
  uint64_t ta[T_N], tb[T_N];
  int rc = CLI_EXIT_OK;
  if (snap_sites_by_name(a, &va, &na) != 0 ||
      snap_sites_by_name(b, &vb, &nb) != 0 ||
      (d = join_sites(va, na, vb, nb, &n)) == NULL) {
    fprintf(stderr, "pinpool snapshot diff: out of memory\n");
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  diff_totals(a, ta);
  diff_totals(b, tb);
  if (json) {
    if (snap_dump_json(diff_json(name_a, name_b, ta, tb, d, n, top), out) !=
        0) {
      fprintf(stderr, "pinpool snapshot diff: out of memory\n");
      rc = CLI_EXIT_FAIL;
    }
  } else {
    write_diff_text(name_a, name_b, ta, tb, d, n, na, nb, top, out);
  }
out:
  free(d);
  snap_sites_free(va, na);
  snap_sites_free(vb, nb);
  return rc;
}

static void diff_usage(FILE *out) {
  fprintf(out,
          "usage: pinpool snapshot diff A B [--top N] [--json]\n\n"
          "Live bytes and blocks per allocation site in snapshots A and B,\n"
          "the N sites that grew most first (default 10; 0: all), and the\n"
          "totals (reserved, allocated, pending, cached) with their delta.\n"
          "One of A and B may be '-' for standard input. Exit status: 0\n"
          "success, 1 unreadable or malformed file, 2 usage error.\n");
}

int snap_diff_run(int argc, char **argv) {
  const char *files[2];
  size_t top;
  int json, rc;
  snap_t a, b;
  rc = snap_report_args("diff", diff_usage, argc, argv, files, 2, &top, &json);
  if (rc >= 0)
    return rc;
  if (snap_load_or_report("diff", files[0], &a) != 0)
    return CLI_EXIT_FAIL;
  if (snap_load_or_report("diff", files[1], &b) != 0) {
    snap_free(&a);
    return CLI_EXIT_FAIL;
  }
  rc = snap_diff_write(&a, strcmp(files[0], "-") == 0 ? "(stdin)" : files[0],
                       &b, strcmp(files[1], "-") == 0 ? "(stdin)" : files[1],
                       stdout, top, json);
  snap_free(&a);
  snap_free(&b);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "pinpool snapshot diff: cannot write the output\n");
    return CLI_EXIT_FAIL;
  }
  return rc;
}
