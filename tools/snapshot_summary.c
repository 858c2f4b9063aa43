/*
 * `pinpool snapshot summary FILE`: what the pool holds (segments by flag,
 * blocks by state), how much is lost to rounding and to fragmentation, whether
 * the accounting identities of docs/snapshot-format.md hold (exit 1 if not),
 * the history ring in numbers, and the allocation sites holding the most live
 * memory.
 *
 * The numbers come from snapshot_summarize.c; this file writes them (text
 * or JSON) and runs the subcommand. diff (snapshot_diff.c) uses its JSON
 * writers and argument parsing.
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

/* ---- text output ----------------------------------------------------------
 */

static double pct(uint64_t part, uint64_t whole) {
  return whole == 0 ? 0.0 : 100.0 * (double)part / (double)whole;
}

/* Fragmentation on free space (1 - largest free piece / free bytes, in
 * segments and in the arena's chunks), where free space that is whole
 * (idle segments, wholly free chunks) counts as one piece with the largest:
 * the share of the free bytes that lies in pieces a request of the largest
 * piece's size could not use. An idle pool whose free space is whole
 * segments and chunks reads 0 % (issue 41 found one reported as 91 %
 * fragmented, the pool's one largest run against all its free space). */
static double fragmentation(const snap_summary_t *m, uint64_t free_seg) {
  uint64_t free_all = free_seg + m->arena_free;
  return free_all == 0 ? 0.0
                       : 100.0 - pct(m->whole_free + m->part_largest, free_all);
}

/* "NUMBER  (HUMAN)" with the number right-aligned in `w` columns. */
static void put_bytes(FILE *out, int w, uint64_t v) {
  char h[CLI_BYTES_LEN];
  fprintf(out, "%*" PRIu64 "  (%s)", w, v, cli_format_bytes((double)v, h));
}

static void put_row(FILE *out, const char *label, uint64_t count,
                    uint64_t bytes) {
  fprintf(out, "  %-16s %10" PRIu64 " ", label, count);
  put_bytes(out, 14, bytes);
  fputc('\n', out);
}

static void put_time(FILE *out, const snap_t *s) {
  double ut = json_number_value(json_object_get(s->root, "unix_time"));
  char when[64] = "";
  char g[CLI_BYTES_LEN], h[CLI_BYTES_LEN];
  /* Far-off values would overflow time_t (or gmtime's year). */
  if (ut >= 0 && ut < 1e11) {
    time_t secs = (time_t)ut;
    struct tm tm;
    if (gmtime_r(&secs, &tm) != NULL)
      (void)strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  }
  fprintf(out, "  time      %s (unix %.3f, monotonic %.3f s)\n",
          when[0] ? when : "?", ut, (double)snap_u64(s->root, "time_ns") / 1e9);
  fprintf(out, "  gathered  in %s, pool lock held at most %s\n",
          cli_format_ns((double)snap_u64(s->root, "gather_ns"), g),
          cli_format_ns((double)snap_u64(s->root, "max_hold_ns"), h));
}

static const char *root_str(const snap_t *s, const char *key) {
  const char *v = json_string_value(json_object_get(s->root, key));
  return v != NULL ? v : "?";
}

/* The stats are read before the blocks; in a busy pool they differ. */
static void put_stats_check(FILE *out, const snap_t *s,
                            const snap_totals_t *t) {
  const json_t *st = json_object_get(s->root, "stats");
  const struct {
    const char *name;
    uint64_t stat, total;
  } pairs[] = {
      {"reserved_bytes",
       snap_u64(json_object_get(st, "reserved_bytes"), "current"), t->reserved},
      {"block_bytes", snap_u64(json_object_get(st, "block_bytes"), "current"),
       t->allocated},
      {"cached_bytes", snap_u64(json_object_get(st, "cached_bytes"), "current"),
       t->cached},
      {"pending_bytes", snap_u64(st, "pending_bytes"), t->pending},
      {"segments", snap_u64(json_object_get(st, "segments"), "current"),
       t->segments},
  };
  int differ = 0;
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    if (pairs[k].stat == pairs[k].total)
      continue;
    fprintf(out, "%s%s %" PRIu64 " (totals %" PRIu64 ")",
            differ ? ", "
                   : "  stats     differ from the totals (read "
                     "before the blocks while threads ran): ",
            pairs[k].name, pairs[k].stat, pairs[k].total);
    differ = 1;
  }
  fprintf(out, differ ? "\n" : "  stats     agree with the totals\n");
}

static void put_sites(FILE *out, const snap_site_stat_t *v, size_t n,
                      size_t top) {
  size_t shown = top == 0 || top > n ? n : top;
  fprintf(out,
          "\ntop %zu of %zu allocation sites by live bytes "
          "(allocated + pending_free)\n",
          shown, n);
  if (n == 0) {
    fprintf(out, "  (no live blocks)\n");
    return;
  }
  fprintf(out, "  %14s  %-12s %8s %14s  %s\n", "live bytes", "", "blocks",
          "requested", "site");
  for (size_t i = 0; i < shown; i++) {
    char h[CLI_BYTES_LEN], paren[CLI_BYTES_LEN + 2];
    (void)snprintf(paren, sizeof paren, "(%s)",
                   cli_format_bytes((double)v[i].bytes, h));
    fprintf(out, "  %14" PRIu64 "  %-12s %8" PRIu64 " %14" PRIu64 "  %s\n",
            v[i].bytes, paren, v[i].blocks, v[i].requested, v[i].site);
  }
}

static void write_summary_text(const snap_t *s, const char *name,
                               const snap_summary_t *m,
                               const snap_site_stat_t *v, size_t n, size_t top,
                               FILE *out) {
  const snap_totals_t *t = &m->t, *r = &m->r;
  const json_t *h = json_object_get(s->root, "history");
  uint64_t free_seg = r->cached - r->tail - r->chunk_free;
  uint64_t waste = r->allocated - r->requested;
  char hb[CLI_BYTES_LEN];

  fprintf(out, "snapshot %s\n", name);
  fprintf(out, "  pinpool   %s, pid %" PRIu64 ", backend %s\n",
          root_str(s, "pinpool_version"), snap_u64(s->root, "pid"),
          root_str(s, "backend"));
  fprintf(out, "  config    %s\n", root_str(s, "config"));
  put_time(out, s);

  fprintf(out, "\nsegments  %" PRIu64 ", %" PRIu64 " bytes (%s)\n", r->segments,
          r->segment_bytes, cli_format_bytes((double)r->segment_bytes, hb));
  fprintf(out, "  %-16s %10s %14s\n", "by flag", "segments", "bytes");
  for (size_t k = 0; k < SNAP_NFLAGS; k++)
    put_row(out, snap_flag_names[k], m->flag_segments[k], m->flag_bytes[k]);
  put_row(out, "(no flags)", m->noflag_segments, m->noflag_bytes);
  fprintf(out, "  %-16s %10s ", "free in chunks", "");
  put_bytes(out, 14, t->chunk_free);
  fprintf(out, "\n");

  fprintf(out, "\nblocks by state\n  %-16s %10s %14s\n", "", "blocks", "bytes");
  put_row(out, "allocated", r->allocated_blocks, r->allocated);
  put_row(out, "pending_free", r->pending_blocks, r->pending);
  put_row(out, "cached", r->cached_blocks,
          r->cached - r->uncarved - r->tail - r->chunk_free);
  put_row(out, "uncarved", m->uncarved_blocks, r->uncarved);
  fprintf(out, "  %-16s %10s ", "segment tails", "");
  put_bytes(out, 14, r->tail);
  fprintf(out, "\n");

  fprintf(out,
          "\nrounding waste (allocated blocks): %" PRIu64
          " bytes (%s), %.2f %% of %" PRIu64 " block bytes; requested %" PRIu64
          "\n",
          waste, cli_format_bytes((double)waste, hb), pct(waste, r->allocated),
          r->allocated, r->requested);

  fprintf(out,
          "\nfragmentation (free blocks in segments: cached + uncarved)\n");
  fprintf(out, "  free in segments  ");
  put_bytes(out, 14, free_seg);
  fprintf(out, "\n  largest free run  ");
  put_bytes(out, 14, m->largest_run);
  if (m->largest_run > 0)
    fprintf(out,
            ": %" PRIu64 " adjacent blocks of %" PRIu64
            " in segment 0x%" PRIx64,
            m->largest_run / m->largest_run_bs, m->largest_run_bs,
            m->largest_run_addr);
  fprintf(out,
          "\n  fragmentation     %13.2f %%  (1 - largest free piece / free in "
          "segments and chunks; idle segments and free chunks are whole)\n",
          fragmentation(m, free_seg));
  fprintf(out, "  in used segments  ");
  put_bytes(out, 14, m->free_in_used);
  fprintf(out,
          ": free blocks in %" PRIu64 " segments with live blocks "
          "(empty_cache cannot return them)\n",
          m->used_segments);
  fprintf(out, "  idle segments     ");
  put_bytes(out, 14, m->idle_bytes);
  fprintf(out, ": %" PRIu64 " segments without live blocks\n",
          m->idle_segments);

  fprintf(out, "\naccounting\n");
  fprintf(out,
          "  reserved  %" PRIu64 " = allocated %" PRIu64 " + pending %" PRIu64
          " + cached %" PRIu64 "\n",
          t->reserved, t->allocated, t->pending, t->cached);
  fprintf(out,
          "  cached    %" PRIu64 " = cached blocks %" PRIu64
          " + uncarved %" PRIu64 " + tails %" PRIu64
          " + free in chunks %" PRIu64 "\n",
          r->cached, r->cached - r->uncarved - r->tail - r->chunk_free,
          r->uncarved, r->tail, r->chunk_free);
  put_stats_check(out, s, t);
  for (size_t k = 0; k < m->problems.n && k < SNAP_MAX_PROBLEMS; k++)
    fprintf(out, "  MISMATCH  %s\n", m->problems.msg[k]);
  if (m->problems.n > SNAP_MAX_PROBLEMS)
    fprintf(out, "  MISMATCH  ... and %zu more\n",
            m->problems.n - SNAP_MAX_PROBLEMS);
  if (m->problems.n == 0)
    fprintf(out, "  identity OK\n");
  else
    fprintf(out, "  identity FAILED (%zu problems)\n", m->problems.n);

  fprintf(out,
          "\nhistory   record %s, stack depth %" PRIu64 ", ring of %" PRIu64
          " entries\n",
          json_string_value(json_object_get(h, "record")),
          snap_u64(h, "stack_depth"), snap_u64(h, "max_entries"));
  fprintf(out,
          "  entries   %zu kept, %" PRIu64 " recorded, %" PRIu64 " dropped\n",
          s->nentries, snap_u64(h, "recorded"), snap_u64(h, "dropped"));
  if (s->nentries > 0)
    fprintf(out,
            "  span      %s (time_ns %" PRIu64 "..%" PRIu64 ", seq %" PRIu64
            "..%" PRIu64 ", %" PRIu64 " missing)\n",
            cli_format_ns((double)(m->max_time - m->min_time), hb), m->min_time,
            m->max_time, m->first_seq, m->last_seq, m->seq_gaps);
  for (int k = 0; k < SNAP_NACTIONS; k++)
    fprintf(out, "  %-16s %10" PRIu64 "\n", snap_action_names[k],
            m->actions[k]);

  put_sites(out, v, n, top);
}

/* ---- JSON output ----------------------------------------------------------
 */

/* json_int_t is signed: values above INT64_MAX (only from nonsense input,
 * as sums wrap) come out negative rather than failing. */
json_t *snap_jint(uint64_t v) { return json_integer((json_int_t)v); }

/* A JSON string of a file name, which need not be UTF-8 (json_string
 * refuses those): other bytes than ASCII become '?'. */
json_t *snap_jname(const char *name) {
  json_t *v = json_string(name);
  char *copy;
  if (v != NULL || (copy = strdup(name)) == NULL)
    return v;
  for (char *c = copy; *c != '\0'; c++)
    if ((unsigned char)*c >= 0x80)
      *c = '?';
  v = json_string(copy);
  free(copy);
  return v;
}

void snap_jset(json_t *o, const char *key, json_t *v) {
  (void)json_object_set_new(o, key, v);
}

static json_t *jcount(uint64_t blocks, uint64_t bytes) {
  json_t *o = json_object();
  snap_jset(o, "blocks", snap_jint(blocks));
  snap_jset(o, "bytes", snap_jint(bytes));
  return o;
}

static json_t *jsites(const snap_site_stat_t *v, size_t n, size_t top) {
  json_t *a = json_array();
  size_t shown = top == 0 || top > n ? n : top;
  for (size_t i = 0; i < shown; i++) {
    json_t *o = json_object();
    snap_jset(o, "site", json_string(v[i].site));
    snap_jset(o, "bytes", snap_jint(v[i].bytes));
    snap_jset(o, "blocks", snap_jint(v[i].blocks));
    snap_jset(o, "requested", snap_jint(v[i].requested));
    (void)json_array_append_new(a, o);
  }
  return a;
}

static json_t *summary_json(const snap_t *s, const char *name,
                            const snap_summary_t *m, const snap_site_stat_t *v,
                            size_t n, size_t top) {
  const snap_totals_t *r = &m->r;
  const json_t *h = json_object_get(s->root, "history");
  uint64_t free_seg = r->cached - r->tail - r->chunk_free;
  json_t *o = json_object(), *x;

  snap_jset(o, "file", snap_jname(name));
  snap_jset(o, "pid", snap_jint(snap_u64(s->root, "pid")));
  snap_jset(o, "pinpool_version", json_string(root_str(s, "pinpool_version")));
  snap_jset(o, "backend", json_string(root_str(s, "backend")));
  snap_jset(o, "config", json_string(root_str(s, "config")));
  snap_jset(o, "time_ns", snap_jint(snap_u64(s->root, "time_ns")));
  snap_jset(
      o, "unix_time",
      json_real(json_number_value(json_object_get(s->root, "unix_time"))));

  x = json_object();
  snap_jset(x, "count", snap_jint(r->segments));
  snap_jset(x, "bytes", snap_jint(r->segment_bytes));
  for (size_t k = 0; k < SNAP_NFLAGS; k++)
    snap_jset(x, snap_flag_names[k],
              jcount(m->flag_segments[k], m->flag_bytes[k]));
  snap_jset(x, "no_flags", jcount(m->noflag_segments, m->noflag_bytes));
  snap_jset(x, "chunk_free_bytes", snap_jint(r->chunk_free));
  snap_jset(o, "segments", x);

  x = json_object();
  snap_jset(x, "allocated", jcount(r->allocated_blocks, r->allocated));
  snap_jset(x, "pending_free", jcount(r->pending_blocks, r->pending));
  snap_jset(x, "cached",
            jcount(r->cached_blocks,
                   r->cached - r->uncarved - r->tail - r->chunk_free));
  snap_jset(x, "uncarved", jcount(m->uncarved_blocks, r->uncarved));
  snap_jset(x, "tail_bytes", snap_jint(r->tail));
  snap_jset(o, "blocks", x);

  x = json_object();
  snap_jset(x, "requested_bytes", snap_jint(r->requested));
  snap_jset(x, "block_bytes", snap_jint(r->allocated));
  snap_jset(x, "waste_bytes", snap_jint(r->allocated - r->requested));
  snap_jset(x, "waste_percent",
            json_real(pct(r->allocated - r->requested, r->allocated)));
  snap_jset(o, "rounding", x);

  x = json_object();
  snap_jset(x, "free_bytes", snap_jint(free_seg));
  snap_jset(x, "largest_run_bytes", snap_jint(m->largest_run));
  snap_jset(x, "whole_free_bytes", snap_jint(m->whole_free));
  snap_jset(x, "arena_free_bytes", snap_jint(m->arena_free));
  snap_jset(x, "largest_part_bytes", snap_jint(m->part_largest));
  snap_jset(x, "fragmentation_percent", json_real(fragmentation(m, free_seg)));
  snap_jset(x, "free_in_used_segments_bytes", snap_jint(m->free_in_used));
  snap_jset(x, "used_segments", snap_jint(m->used_segments));
  snap_jset(x, "idle_segments", snap_jint(m->idle_segments));
  snap_jset(x, "idle_bytes", snap_jint(m->idle_bytes));
  snap_jset(o, "fragmentation", x);

  x = json_object();
  snap_jset(x, "ok", json_boolean(m->problems.n == 0));
  snap_jset(x, "problem_count", snap_jint(m->problems.n));
  json_t *p = json_array();
  for (size_t k = 0; k < m->problems.n && k < SNAP_MAX_PROBLEMS; k++)
    (void)json_array_append_new(p, json_string(m->problems.msg[k]));
  snap_jset(x, "problems", p);
  snap_jset(o, "identity", x);

  x = json_object();
  snap_jset(x, "record",
            json_string(json_string_value(json_object_get(h, "record"))));
  snap_jset(x, "entries", snap_jint(s->nentries));
  snap_jset(x, "recorded", snap_jint(snap_u64(h, "recorded")));
  snap_jset(x, "dropped", snap_jint(snap_u64(h, "dropped")));
  snap_jset(x, "span_ns",
            snap_jint(s->nentries > 0 ? m->max_time - m->min_time : 0));
  json_t *acts = json_object();
  for (int k = 0; k < SNAP_NACTIONS; k++)
    snap_jset(acts, snap_action_names[k], snap_jint(m->actions[k]));
  snap_jset(x, "actions", acts);
  snap_jset(o, "history", x);

  snap_jset(o, "site_count", snap_jint(n));
  snap_jset(o, "sites", jsites(v, n, top));
  return o;
}

/* Write j (and a newline) to out and drop it; -1 if it could not be made. */
int snap_dump_json(json_t *j, FILE *out) {
  int rc = j != NULL && json_dumpf(j, out, JSON_INDENT(2)) == 0 ? 0 : -1;
  if (rc == 0)
    fputc('\n', out);
  json_decref(j);
  return rc;
}

int snap_summary_write(const snap_t *s, const char *name, FILE *out, size_t top,
                       int json) {
  snap_summary_t *m = malloc(sizeof *m);
  snap_site_stat_t *v = NULL;
  size_t n = 0;
  int rc;
  if (m == NULL || snap_live_sites(s, &v, &n) != 0) {
    free(m);
    fprintf(stderr, "pinpool snapshot summary: %s: out of memory\n", name);
    return CLI_EXIT_FAIL;
  }
  if (snap_summarize(s, m) != 0) {
    free(m->busy);
    free(m);
    snap_sites_free(v, n);
    fprintf(stderr, "pinpool snapshot summary: %s: out of memory\n", name);
    return CLI_EXIT_FAIL;
  }
  rc = m->problems.n == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
  if (json) {
    if (snap_dump_json(summary_json(s, name, m, v, n, top), out) != 0) {
      fprintf(stderr, "pinpool snapshot summary: %s: out of memory\n", name);
      rc = CLI_EXIT_FAIL;
    }
  } else {
    write_summary_text(s, name, m, v, n, top, out);
  }
  snap_sites_free(v, n);
  free(m->busy);
  free(m);
  return rc;
}

/* ---- the subcommands ------------------------------------------------------
 */

static void summary_usage(FILE *out) {
  fprintf(out,
          "usage: pinpool snapshot summary FILE [--top N] [--json]\n\n"
          "Segments by flag, blocks by state, rounding waste, fragmentation,\n"
          "the accounting identity, the history ring and the N allocation\n"
          "sites holding the most live bytes (default 10; 0: all).\n"
          "FILE may be '-' for standard input. Exit status: 0 success, 1\n"
          "unreadable or malformed file or an identity that does not hold,\n"
          "2 usage error.\n");
}

/* Positional files and options, in any order. Returns -1 to go on, or an
 * exit code (help printed, usage error). */
int snap_report_args(const char *sub, void (*usage)(FILE *), int argc,
                     char **argv, const char **files, int nfiles, size_t *top,
                     int *json) {
  int got = 0, only_files = 0;
  *top = 10;
  *json = 0;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = NULL;
    int r;
    if (!only_files && strcmp(arg, "--") == 0) {
      only_files = 1;
      continue;
    }
    if (!only_files && arg[0] == '-' && arg[1] != '\0') {
      if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
        usage(stdout);
        return CLI_EXIT_OK;
      }
      if (strcmp(arg, "--json") == 0) {
        *json = 1;
        continue;
      }
      r = cli_option("snapshot", argc, argv, &i, "--top", &val);
      if (r < 0)
        return CLI_EXIT_USAGE;
      if (r > 0) {
        uint64_t n;
        if (cli_parse_u64("snapshot", "--top", val, 0, 1000000, &n) != 0)
          return CLI_EXIT_USAGE;
        *top = (size_t)n;
        continue;
      }
      return cli_usage_error("snapshot", "%s: unknown option '%s'", sub, arg);
    }
    if (got == nfiles)
      return cli_usage_error("snapshot", "%s: unexpected argument '%s'", sub,
                             arg);
    files[got++] = arg;
  }
  if (got < nfiles)
    return cli_usage_error("snapshot", "%s: expected %s", sub,
                           nfiles == 1 ? "a snapshot FILE"
                                       : "two snapshot files A and B");
  if (nfiles == 2 && strcmp(files[0], "-") == 0 && strcmp(files[1], "-") == 0)
    return cli_usage_error("snapshot",
                           "%s: standard input can be read once "
                           "only",
                           sub);
  return -1;
}

int snap_load_or_report(const char *sub, const char *path, snap_t *s) {
  char err[512];
  if (snap_load(path, s, err, sizeof err) == 0)
    return 0;
  fprintf(stderr, "pinpool snapshot %s: %s\n", sub, err);
  return -1;
}

int snap_summary_run(int argc, char **argv) {
  const char *file;
  size_t top;
  int json, rc;
  snap_t s;
  rc = snap_report_args("summary", summary_usage, argc, argv, &file, 1, &top,
                        &json);
  if (rc >= 0)
    return rc;
  if (snap_load_or_report("summary", file, &s) != 0)
    return CLI_EXIT_FAIL;
  rc = snap_summary_write(&s, strcmp(file, "-") == 0 ? "(stdin)" : file, stdout,
                          top, json);
  snap_free(&s);
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "pinpool snapshot summary: cannot write the output\n");
    return CLI_EXIT_FAIL;
  }
  return rc;
}
