/*
 * Reading snapshot files (see snapshot_load.h and docs/snapshot-format.md).
 *
 * The file is parsed into a jansson tree once; snap_load then walks the
 * whole tree and checks every field the accessors return, so that the
 * accessors (and the subcommands) can trust types and index ranges. The
 * walk is linear in the size of the file. Error paths such as
 * "segments[3].blocks[7].state" are formatted only when a check fails: a
 * snapshot with a million history entries must not format a million paths.
 */
#define _POSIX_C_SOURCE 200809L
#include "snapshot_load.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

const char *const snap_action_names[SNAP_NACTIONS] = {"segment_alloc",
                                                      "alloc",
                                                      "free_requested",
                                                      "free_completed",
                                                      "segment_free",
                                                      "empty_cache",
                                                      "oom"};
const char *const snap_state_names[3] = {"allocated", "pending_free", "cached"};

static const char *const flag_names[] = {
    "page_locked", "mlock_failed", "huge_advised", "reserve", "pin_fallback"};
static const char *const record_names[] = {"none", "state", "alloc", "all"};
static const char *const entry_fields[9] = {
    "seq",    "time_ns", "action", "address", "size", "requested_size",
    "stream", "thread",  "stack"};

#define NOIDX ((size_t)-1)
#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

typedef struct ctx {
  const char *name;
  char *err;
  size_t errlen;
  size_t nframes, nstacks;
} ctx_t;

/* Where a value is: {"segments", 3, "blocks", 7} is segments[3].blocks[7];
 * an index of NOIDX is left out ({"stats.reclaim", NOIDX}). */
typedef struct where {
  const char *outer;
  size_t i;
  const char *inner;
  size_t j;
} where_t;

static const where_t top_level = {NULL, NOIDX, NULL, NOIDX};

static void append(char *buf, size_t n, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void append(char *buf, size_t n, size_t *len, const char *fmt, ...) {
  va_list ap;
  int k;
  if (*len >= n)
    return;
  va_start(ap, fmt);
  k = vsnprintf(buf + *len, n - *len, fmt, ap);
  va_end(ap);
  if (k > 0)
    *len = *len + (size_t)k < n ? *len + (size_t)k : n;
}

/* The path of `key` (or of element `kidx` of it, or of element kidx of
 * the place itself when key is NULL) at `w`. */
static void where_format(const where_t *w, const char *key, size_t kidx,
                         char *buf, size_t n) {
  size_t len = 0;
  buf[0] = '\0';
  if (w->outer != NULL) {
    append(buf, n, &len, "%s", w->outer);
    if (w->i != NOIDX)
      append(buf, n, &len, "[%zu]", w->i);
  }
  if (w->inner != NULL) {
    append(buf, n, &len, ".%s", w->inner);
    if (w->j != NOIDX)
      append(buf, n, &len, "[%zu]", w->j);
  }
  if (key != NULL)
    append(buf, n, &len, "%s%s", len > 0 ? "." : "", key);
  if (kidx != NOIDX)
    append(buf, n, &len, "[%zu]", kidx);
}

static int fail(ctx_t *c, const where_t *w, const char *key, size_t kidx,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static int fail(ctx_t *c, const where_t *w, const char *key, size_t kidx,
                const char *fmt, ...) {
  char path[256], msg[256];
  va_list ap;
  where_format(w, key, kidx, path, sizeof path);
  va_start(ap, fmt);
  (void)vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->errlen > 0) {
    if (path[0] != '\0')
      (void)snprintf(c->err, c->errlen, "%s: %s: %s", c->name, path, msg);
    else
      (void)snprintf(c->err, c->errlen, "%s: %s", c->name, msg);
  }
  return -1;
}

static const char *type_name(const json_t *v) {
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "an object";
  case JSON_ARRAY:
    return "an array";
  case JSON_STRING:
    return "a string";
  case JSON_INTEGER:
    return json_integer_value(v) < 0 ? "a negative integer" : "an integer";
  case JSON_REAL:
    return "a real number";
  case JSON_TRUE:
    return "true";
  case JSON_FALSE:
    return "false";
  case JSON_NULL:
    return "null";
  }
  return "a value of unknown type";
}

enum { NULLABLE = 1 };

/* An integer in [min, max] (or null, -1, with NULLABLE). `index_of`, when
 * not NULL, names the array the value indexes ("stacks"), for the message;
 * max is then that array's size - 1 (-1 for an empty array). */
static int check_int(ctx_t *c, const where_t *w, const char *key, size_t kidx,
                     const json_t *v, int64_t min, int64_t max, unsigned flags,
                     const char *index_of, int64_t *out) {
  int64_t x;
  if (v == NULL)
    return fail(c, w, key, kidx, "missing");
  if ((flags & NULLABLE) && json_is_null(v)) {
    if (out != NULL)
      *out = -1;
    return 0;
  }
  if (!json_is_integer(v))
    return fail(c, w, key, kidx, "expected %s%s, got %s",
                min == 0  ? "a non-negative integer"
                : min > 0 ? "a positive integer"
                          : "an integer",
                (flags & NULLABLE) ? " or null" : "", type_name(v));
  x = (int64_t)json_integer_value(v);
  if (index_of != NULL && x >= 0 && x > max)
    return fail(c, w, key, kidx,
                "index %" PRId64 " out of range (%" PRId64 " %s)", x, max + 1,
                index_of);
  if (x < min || x > max) {
    if (max == INT64_MAX)
      return fail(c, w, key, kidx,
                  "expected an integer >= %" PRId64 ", got %" PRId64, min, x);
    return fail(c, w, key, kidx,
                "expected an integer in [%" PRId64 ", %" PRId64
                "], got %" PRId64,
                min, max, x);
  }
  if (out != NULL)
    *out = x;
  return 0;
}

static int get_int(ctx_t *c, const where_t *w, const json_t *obj,
                   const char *key, int64_t min, int64_t max, unsigned flags,
                   const char *index_of, int64_t *out) {
  return check_int(c, w, key, NOIDX, json_object_get(obj, key), min, max, flags,
                   index_of, out);
}

static int get_u64(ctx_t *c, const where_t *w, const json_t *obj,
                   const char *key) {
  return get_int(c, w, obj, key, 0, INT64_MAX, 0, NULL, NULL);
}

static int get_string(ctx_t *c, const where_t *w, const json_t *obj,
                      const char *key, unsigned flags) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return fail(c, w, key, NOIDX, "missing");
  if (json_is_string(v) || ((flags & NULLABLE) && json_is_null(v)))
    return 0;
  return fail(c, w, key, NOIDX, "expected a string%s, got %s",
              (flags & NULLABLE) ? " or null" : "", type_name(v));
}

static int find_name(const char *s, const char *const *names, size_t n) {
  for (size_t k = 0; k < n; k++)
    if (strcmp(s, names[k]) == 0)
      return (int)k;
  return -1;
}

/* A string out of `names`; *out gets its index. */
static int check_enum(ctx_t *c, const where_t *w, const char *key, size_t kidx,
                      const json_t *v, const char *const *names, size_t n,
                      int *out) {
  char list[256];
  size_t len = 0;
  int k = -1;
  if (v == NULL)
    return fail(c, w, key, kidx, "missing");
  if (json_is_string(v))
    k = find_name(json_string_value(v), names, n);
  if (k >= 0) {
    if (out != NULL)
      *out = k;
    return 0;
  }
  list[0] = '\0';
  for (size_t m = 0; m < n; m++)
    append(list, sizeof list, &len, "%s%s", m > 0 ? ", " : "", names[m]);
  return fail(c, w, key, kidx, "expected one of %s", list);
}

/* A stream handle: "0x" and 1 to 16 lowercase hex digits (the format
 * writes handles as strings so that any 64-bit value survives). */
static int is_handle(const json_t *v) {
  const char *t = json_string_value(v);
  size_t n;
  if (t == NULL || t[0] != '0' || t[1] != 'x')
    return 0;
  n = strspn(t + 2, "0123456789abcdef");
  return n >= 1 && n <= 16 && t[2 + n] == '\0';
}

static int check_handle(ctx_t *c, const where_t *w, const char *key,
                        size_t kidx, const json_t *v, unsigned flags) {
  if (v == NULL)
    return fail(c, w, key, kidx, "missing");
  if (is_handle(v) || ((flags & NULLABLE) && json_is_null(v)))
    return 0;
  if (json_is_string(v))
    return fail(c, w, key, kidx,
                "expected a stream handle (\"0x\" and 1 to 16 lowercase "
                "hex digits)");
  return fail(c, w, key, kidx, "expected a stream handle string%s, got %s",
              (flags & NULLABLE) ? " or null" : "", type_name(v));
}

static int get_array(ctx_t *c, const where_t *w, const json_t *obj,
                     const char *key, const json_t **out) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return fail(c, w, key, NOIDX, "missing");
  if (!json_is_array(v))
    return fail(c, w, key, NOIDX, "expected an array, got %s", type_name(v));
  *out = v;
  return 0;
}

static int get_object(ctx_t *c, const where_t *w, const json_t *obj,
                      const char *key, const json_t **out) {
  const json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return fail(c, w, key, NOIDX, "missing");
  if (!json_is_object(v))
    return fail(c, w, key, NOIDX, "expected an object, got %s", type_name(v));
  *out = v;
  return 0;
}

/* An element of an array that must be an object. */
static int check_object_elem(ctx_t *c, const where_t *w, const json_t *v) {
  if (json_is_object(v))
    return 0;
  return fail(c, w, NULL, NOIDX, "expected an object, got %s", type_name(v));
}

/* ---- stats and totals ---------------------------------------------------- */

enum { F_U64, F_STAT, F_DURATION };
static const struct {
  const char *name;
  int kind;
} stats_fields[] = {
    {"requests", F_STAT},         {"requested_bytes", F_STAT},
    {"blocks", F_STAT},           {"block_bytes", F_STAT},
    {"reserved_bytes", F_STAT},   {"cached_bytes", F_STAT},
    {"segments", F_STAT},         {"pending_bytes", F_U64},
    {"pending_blocks", F_U64},    {"events_recorded", F_U64},
    {"events_completed", F_U64},  {"event_errors", F_U64},
    {"reclaim", F_DURATION},      {"cache_hits", F_U64},
    {"cache_misses", F_U64},      {"tcache_hits", F_U64},
    {"oom_count", F_U64},         {"retries", F_U64},
    {"trimmed_segments", F_U64},  {"mlock_failures", F_U64},
    {"locked_bytes", F_U64},      {"backend_alloc", F_DURATION},
    {"backend_free", F_DURATION}, {"peak_slack_bytes", F_U64},
    {"reserve_bytes", F_U64},     {"max_cached", F_U64},
    {"max_reserved", F_U64},
};
static const char *const stat_keys[] = {"current", "peak", "allocated",
                                        "freed"};
static const char *const duration_keys[] = {"count", "total_ns", "max_ns"};
static const char *const totals_keys[] = {
    "segments",        "segment_bytes",    "chunk_free_bytes", "reserved_bytes",
    "allocated_bytes", "allocated_blocks", "requested_bytes",  "pending_bytes",
    "pending_blocks",  "cached_bytes",     "cached_blocks",    "uncarved_bytes",
    "tail_bytes"};

static int check_stats(ctx_t *c, const json_t *root) {
  const where_t at = {"stats", NOIDX, NULL, NOIDX};
  const json_t *stats, *sub;
  if (get_object(c, &top_level, root, "stats", &stats) != 0)
    return -1;
  for (size_t k = 0; k < NELEMS(stats_fields); k++) {
    const char *const *keys = stat_keys;
    size_t nkeys = NELEMS(stat_keys);
    if (stats_fields[k].kind == F_U64) {
      if (get_u64(c, &at, stats, stats_fields[k].name) != 0)
        return -1;
      continue;
    }
    if (stats_fields[k].kind == F_DURATION) {
      keys = duration_keys;
      nkeys = NELEMS(duration_keys);
    }
    if (get_object(c, &at, stats, stats_fields[k].name, &sub) != 0)
      return -1;
    const where_t in = {"stats", NOIDX, stats_fields[k].name, NOIDX};
    for (size_t m = 0; m < nkeys; m++)
      if (get_u64(c, &in, sub, keys[m]) != 0)
        return -1;
  }
  return 0;
}

static int check_totals(ctx_t *c, const json_t *root) {
  const where_t at = {"totals", NOIDX, NULL, NOIDX};
  const json_t *totals;
  if (get_object(c, &top_level, root, "totals", &totals) != 0)
    return -1;
  for (size_t k = 0; k < NELEMS(totals_keys); k++)
    if (get_u64(c, &at, totals, totals_keys[k]) != 0)
      return -1;
  return 0;
}

/* ---- segments, blocks ------------------------------------------------------
 */

static int check_block(ctx_t *c, const where_t *w, const json_t *b) {
  const json_t *streams;
  size_t n;
  if (check_object_elem(c, w, b) != 0 || get_u64(c, w, b, "address") != 0 ||
      check_enum(c, w, "state", NOIDX, json_object_get(b, "state"),
                 snap_state_names, 3, NULL) != 0 ||
      get_u64(c, w, b, "requested_size") != 0 ||
      get_array(c, w, b, "streams", &streams) != 0 ||
      get_int(c, w, b, "thread", 0, INT64_MAX, NULLABLE, NULL, NULL) != 0 ||
      get_int(c, w, b, "stack", 0, (int64_t)c->nstacks - 1, NULLABLE, "stacks",
              NULL) != 0)
    return -1;
  n = json_array_size(streams);
  for (size_t k = 0; k < n; k++)
    if (check_handle(c, w, "streams", k, json_array_get(streams, k), 0) != 0)
      return -1;
  /* Optional (since issue 24): the captures that hold the block. */
  const json_t *graphs = json_object_get(b, "graphs");
  if (graphs == NULL)
    return 0;
  if (get_array(c, w, b, "graphs", &graphs) != 0)
    return -1;
  n = json_array_size(graphs);
  if (n == 0)
    return fail(c, w, "graphs", NOIDX, "empty (the key is left out then)");
  for (size_t k = 0; k < n; k++)
    if (check_handle(c, w, "graphs", k, json_array_get(graphs, k), 0) != 0)
      return -1;
  return 0;
}

static int check_segment(ctx_t *c, size_t i, const json_t *seg) {
  const where_t w = {"segments", i, NULL, NOIDX};
  const json_t *flags, *blocks;
  unsigned seen = 0;
  size_t n;
  if (check_object_elem(c, &w, seg) != 0 ||
      get_u64(c, &w, seg, "address") != 0 ||
      get_int(c, &w, seg, "size", 1, INT64_MAX, 0, NULL, NULL) != 0 ||
      get_int(c, &w, seg, "block_size", 512, INT64_MAX, 0, NULL, NULL) != 0 ||
      get_int(c, &w, seg, "class", 0, 408, 0, NULL, NULL) != 0 ||
      get_int(c, &w, seg, "blocks_total", 1, INT64_MAX, 0, NULL, NULL) != 0 ||
      get_u64(c, &w, seg, "uncarved_blocks") != 0 ||
      get_u64(c, &w, seg, "tail_bytes") != 0 ||
      get_array(c, &w, seg, "flags", &flags) != 0 ||
      get_array(c, &w, seg, "blocks", &blocks) != 0)
    return -1;
  n = json_array_size(flags);
  for (size_t k = 0; k < n; k++) {
    int f;
    if (check_enum(c, &w, "flags", k, json_array_get(flags, k), flag_names,
                   NELEMS(flag_names), &f) != 0)
      return -1;
    if (seen & (1u << f))
      return fail(c, &w, "flags", k, "duplicate flag %s", flag_names[f]);
    seen |= 1u << f;
  }
  n = json_array_size(blocks);
  for (size_t k = 0; k < n; k++) {
    const where_t wb = {"segments", i, "blocks", k};
    if (check_block(c, &wb, json_array_get(blocks, k)) != 0)
      return -1;
  }
  return 0;
}

/* ---- chunks (optional: written since issue 21) ----------------------------
 */

/* A free range: [address, size], size >= 1. */
static int check_range(ctx_t *c, const where_t *w, size_t k, const json_t *r) {
  if (!json_is_array(r))
    return fail(c, w, "free", k, "expected [address, size], got %s",
                type_name(r));
  if (json_array_size(r) != 2)
    return fail(c, w, "free", k, "expected [address, size], got %zu items",
                json_array_size(r));
  const where_t in = {w->outer, w->i, "free", k};
  if (check_int(c, &in, NULL, 0, json_array_get(r, 0), 0, INT64_MAX, 0, NULL,
                NULL) != 0 ||
      check_int(c, &in, NULL, 1, json_array_get(r, 1), 1, INT64_MAX, 0, NULL,
                NULL) != 0)
    return -1;
  return 0;
}

static int check_chunk(ctx_t *c, size_t i, const json_t *ch) {
  const where_t w = {"chunks", i, NULL, NOIDX};
  const json_t *flags, *free_list;
  size_t n;
  if (check_object_elem(c, &w, ch) != 0 || get_u64(c, &w, ch, "address") != 0 ||
      get_int(c, &w, ch, "size", 1, INT64_MAX, 0, NULL, NULL) != 0 ||
      get_array(c, &w, ch, "flags", &flags) != 0 ||
      get_array(c, &w, ch, "free", &free_list) != 0)
    return -1;
  /* Optional (since issue 24): the NUMA node. */
  if (json_object_get(ch, "node") != NULL &&
      get_int(c, &w, ch, "node", 0, 63, 0, NULL, NULL) != 0)
    return -1;
  n = json_array_size(flags);
  for (size_t k = 0; k < n; k++)
    if (check_enum(c, &w, "flags", k, json_array_get(flags, k), flag_names,
                   NELEMS(flag_names), NULL) != 0)
      return -1;
  n = json_array_size(free_list);
  for (size_t k = 0; k < n; k++)
    if (check_range(c, &w, k, json_array_get(free_list, k)) != 0)
      return -1;
  return 0;
}

static int check_chunks(ctx_t *c, const json_t *root, snap_t *s) {
  const json_t *chunks = json_object_get(root, "chunks");
  size_t n;
  if (chunks == NULL)
    return 0;
  if (get_array(c, &top_level, root, "chunks", &chunks) != 0)
    return -1;
  n = json_array_size(chunks);
  for (size_t k = 0; k < n; k++)
    if (check_chunk(c, k, json_array_get(chunks, k)) != 0)
      return -1;
  s->chunks = chunks;
  s->nchunks = n;
  return 0;
}

/* ---- frames, stacks, history ------------------------------------------------
 */

static int check_frame(ctx_t *c, size_t i, const json_t *f) {
  const where_t w = {"frames", i, NULL, NOIDX};
  if (check_object_elem(c, &w, f) != 0 || get_u64(c, &w, f, "address") != 0 ||
      get_string(c, &w, f, "function", NULLABLE) != 0 ||
      get_u64(c, &w, f, "offset") != 0 ||
      get_string(c, &w, f, "module", NULLABLE) != 0 ||
      get_string(c, &w, f, "file", NULLABLE) != 0 ||
      get_int(c, &w, f, "line", 0, INT64_MAX, NULLABLE, NULL, NULL) != 0)
    return -1;
  return 0;
}

static int check_stack(ctx_t *c, size_t i, const json_t *st) {
  const where_t w = {"stacks", i, NULL, NOIDX};
  size_t n;
  if (!json_is_array(st))
    return fail(c, &w, NULL, NOIDX, "expected an array, got %s", type_name(st));
  n = json_array_size(st);
  for (size_t k = 0; k < n; k++)
    if (check_int(c, &w, NULL, k, json_array_get(st, k), 0,
                  (int64_t)c->nframes - 1, 0, "frames", NULL) != 0)
      return -1;
  return 0;
}

static int check_entry(ctx_t *c, size_t i, const json_t *e) {
  const where_t w = {"history.entries", i, NULL, NOIDX};
  if (!json_is_array(e))
    return fail(c, &w, NULL, NOIDX, "expected an array, got %s", type_name(e));
  if (json_array_size(e) != 9)
    return fail(c, &w, NULL, NOIDX, "expected 9 fields, got %zu",
                json_array_size(e));
  for (size_t k = 0; k < 8; k++) {
    if (k == 2) {
      if (check_enum(c, &w, NULL, k, json_array_get(e, k), snap_action_names,
                     SNAP_NACTIONS, NULL) != 0)
        return -1;
    } else if (k == 6) {
      if (check_handle(c, &w, NULL, k, json_array_get(e, k), NULLABLE) != 0)
        return -1;
    } else if (check_int(c, &w, NULL, k, json_array_get(e, k), 0, INT64_MAX, 0,
                         NULL, NULL) != 0) {
      return -1;
    }
  }
  return check_int(c, &w, NULL, 8, json_array_get(e, 8), 0,
                   (int64_t)c->nstacks - 1, NULLABLE, "stacks", NULL);
}

static int check_history(ctx_t *c, const json_t *root, const json_t **entries) {
  const where_t w = {"history", NOIDX, NULL, NOIDX};
  const json_t *h, *fields;
  size_t n;
  if (get_object(c, &top_level, root, "history", &h) != 0 ||
      check_enum(c, &w, "record", NOIDX, json_object_get(h, "record"),
                 record_names, NELEMS(record_names), NULL) != 0 ||
      get_int(c, &w, h, "stack_depth", 0, 64, 0, NULL, NULL) != 0 ||
      get_u64(c, &w, h, "max_entries") != 0 ||
      get_u64(c, &w, h, "recorded") != 0 || get_u64(c, &w, h, "dropped") != 0 ||
      get_array(c, &w, h, "fields", &fields) != 0 ||
      get_array(c, &w, h, "entries", entries) != 0)
    return -1;
  /* The columns are fixed by the format: a writer that reorders them wrote
   * a different version, and every entry would be misread. */
  if (json_array_size(fields) != 9)
    return fail(c, &w, "fields", NOIDX,
                "expected the 9 columns seq, "
                "time_ns, action, address, size, requested_size, stream, "
                "thread, stack");
  for (size_t k = 0; k < 9; k++) {
    const json_t *f = json_array_get(fields, k);
    if (!json_is_string(f) || strcmp(json_string_value(f), entry_fields[k]))
      return fail(c, &w, "fields", k, "expected \"%s\"", entry_fields[k]);
  }
  n = json_array_size(*entries);
  for (size_t k = 0; k < n; k++)
    if (check_entry(c, k, json_array_get(*entries, k)) != 0)
      return -1;
  return 0;
}

/* ---- the whole file -------------------------------------------------------
 */

static int check_root(ctx_t *c, const json_t *root, snap_t *s) {
  const where_t *w = &top_level;
  const json_t *v;
  size_t n;
  if (!json_is_object(root))
    return fail(c, w, NULL, NOIDX, "expected a JSON object, got %s",
                type_name(root));
  /* format and version first: any other error in a file that is not a
   * version 1 snapshot would be misleading. */
  v = json_object_get(root, "format");
  if (!json_is_string(v) ||
      strcmp(json_string_value(v), "pinpool-snapshot") != 0)
    return fail(c, w, "format", NOIDX,
                "expected \"pinpool-snapshot\" (not a pinpool snapshot)");
  v = json_object_get(root, "version");
  if (v == NULL)
    return fail(c, w, "version", NOIDX, "missing");
  if (!json_is_integer(v))
    return fail(c, w, "version", NOIDX, "expected an integer, got %s",
                type_name(v));
  if (json_integer_value(v) != 1)
    return fail(c, w, "version", NOIDX,
                "unsupported version %" JSON_INTEGER_FORMAT
                " (this reader reads version 1)",
                json_integer_value(v));
  if (get_string(c, w, root, "pinpool_version", 0) != 0 ||
      get_int(c, w, root, "pid", 1, INT64_MAX, 0, NULL, NULL) != 0 ||
      get_u64(c, w, root, "time_ns") != 0 ||
      get_u64(c, w, root, "gather_ns") != 0 ||
      get_u64(c, w, root, "max_hold_ns") != 0 ||
      get_string(c, w, root, "backend", 0) != 0 ||
      get_string(c, w, root, "config", 0) != 0)
    return -1;
  v = json_object_get(root, "unix_time");
  if (v == NULL)
    return fail(c, w, "unix_time", NOIDX, "missing");
  if (!json_is_number(v) || json_number_value(v) < 0)
    return fail(c, w, "unix_time", NOIDX,
                "expected a non-negative number, got %s", type_name(v));
  if (check_stats(c, root) != 0 || check_totals(c, root) != 0 ||
      get_array(c, w, root, "segments", &s->segments) != 0 ||
      get_array(c, w, root, "frames", &s->frames) != 0 ||
      get_array(c, w, root, "stacks", &s->stacks) != 0)
    return -1;
  c->nframes = json_array_size(s->frames);
  c->nstacks = json_array_size(s->stacks);
  n = c->nframes;
  for (size_t k = 0; k < n; k++)
    if (check_frame(c, k, json_array_get(s->frames, k)) != 0)
      return -1;
  n = c->nstacks;
  for (size_t k = 0; k < n; k++)
    if (check_stack(c, k, json_array_get(s->stacks, k)) != 0)
      return -1;
  n = json_array_size(s->segments);
  for (size_t k = 0; k < n; k++)
    if (check_segment(c, k, json_array_get(s->segments, k)) != 0)
      return -1;
  if (check_chunks(c, root, s) != 0 || check_history(c, root, &s->entries) != 0)
    return -1;
  s->nsegments = json_array_size(s->segments);
  s->nframes = c->nframes;
  s->nstacks = c->nstacks;
  s->nentries = json_array_size(s->entries);
  return 0;
}

int snap_load_buffer(const char *name, const char *data, size_t len,
                     snap_t *out, char *err, size_t errlen) {
  ctx_t c = {name, err, errlen, 0, 0};
  json_error_t je;
  json_t *root;
  memset(out, 0, sizeof *out);
  if (errlen > 0)
    err[0] = '\0';
  if (len == 0) {
    if (errlen > 0)
      (void)snprintf(err, errlen, "%s: empty file", name);
    return -1;
  }
  /* A writer never repeats a key; a repeated one means a damaged or
   * hand-edited file, where silently taking one of the two would hide it. */
  root = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
  if (root == NULL) {
    if (errlen > 0)
      (void)snprintf(err, errlen, "%s: line %d, column %d (byte %d): %s", name,
                     je.line, je.column, je.position, je.text);
    return -1;
  }
  if (check_root(&c, root, out) != 0) {
    json_decref(root);
    memset(out, 0, sizeof *out);
    return -1;
  }
  out->root = root;
  return 0;
}

/* Read all of f into a malloc'ed buffer. */
static int read_all(FILE *f, char **data, size_t *len) {
  struct stat st;
  size_t cap = 1 << 16, n = 0;
  char *buf;
  if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
    cap = (size_t)st.st_size + 1;
  buf = malloc(cap);
  if (buf == NULL)
    return ENOMEM;
  for (;;) {
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap)
      break;
    char *grown = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
    if (grown == NULL) {
      free(buf);
      return ENOMEM;
    }
    buf = grown;
    cap *= 2;
  }
  if (ferror(f)) {
    int e = errno != 0 ? errno : EIO;
    free(buf);
    return e;
  }
  *data = buf;
  *len = n;
  return 0;
}

int snap_load(const char *path, snap_t *out, char *err, size_t errlen) {
  int is_stdin = strcmp(path, "-") == 0;
  const char *name = is_stdin ? "(stdin)" : path;
  char *data = NULL;
  size_t len = 0;
  FILE *f;
  int e, rc;
  memset(out, 0, sizeof *out);
  f = is_stdin ? stdin : fopen(path, "rb");
  if (f == NULL) {
    e = errno;
    if (errlen > 0)
      (void)snprintf(err, errlen, "%s: cannot open: %s", name, strerror(e));
    return -1;
  }
  errno = 0;
  e = read_all(f, &data, &len);
  if (!is_stdin)
    (void)fclose(f);
  if (e != 0) {
    if (errlen > 0)
      (void)snprintf(err, errlen, "%s: cannot read: %s", name, strerror(e));
    return -1;
  }
  rc = snap_load_buffer(name, data, len, out, err, errlen);
  free(data);
  return rc;
}

void snap_free(snap_t *s) {
  if (s == NULL)
    return;
  json_decref(s->root);
  memset(s, 0, sizeof *s);
}

/* ---- accessors -------------------------------------------------------------
 */

uint64_t snap_u64(const json_t *obj, const char *key) {
  json_int_t v = json_integer_value(json_object_get(obj, key));
  return v < 0 ? 0 : (uint64_t)v;
}

/* An id the loader checked: an integer >= 0 or null (-1). */
static int64_t id_value(const json_t *v) {
  return json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
}

static uint64_t u64_value(const json_t *v) {
  json_int_t x = json_integer_value(v);
  return x < 0 ? 0 : (uint64_t)x;
}

uint64_t snap_handle(const json_t *v) {
  return is_handle(v) ? strtoull(json_string_value(v) + 2, NULL, 16) : 0;
}

const json_t *snap_segment(const snap_t *s, size_t seg) {
  return json_array_get(s->segments, seg);
}

size_t snap_segment_nblocks(const snap_t *s, size_t seg) {
  return json_array_size(json_object_get(snap_segment(s, seg), "blocks"));
}

void snap_block(const snap_t *s, size_t seg, size_t i, snap_block_t *out) {
  const json_t *sg = snap_segment(s, seg);
  const json_t *b = json_array_get(json_object_get(sg, "blocks"), i);
  const char *state = json_string_value(json_object_get(b, "state"));
  int k = state != NULL ? find_name(state, snap_state_names, 3) : -1;
  out->address = snap_u64(b, "address");
  out->size = snap_u64(sg, "block_size");
  out->requested = snap_u64(b, "requested_size");
  out->state = k < 0 ? SNAP_CACHED : k;
  out->thread = id_value(json_object_get(b, "thread"));
  out->stack = id_value(json_object_get(b, "stack"));
  out->streams = json_object_get(b, "streams");
}

void snap_entry(const snap_t *s, size_t i, snap_entry_t *out) {
  const json_t *e = json_array_get(s->entries, i);
  const char *action = json_string_value(json_array_get(e, 2));
  int k =
      action != NULL ? find_name(action, snap_action_names, SNAP_NACTIONS) : -1;
  out->seq = u64_value(json_array_get(e, 0));
  out->time_ns = u64_value(json_array_get(e, 1));
  out->action = k < 0 ? SNAP_ALLOC : k;
  out->address = u64_value(json_array_get(e, 3));
  out->size = u64_value(json_array_get(e, 4));
  out->requested = u64_value(json_array_get(e, 5));
  out->stream = snap_handle(json_array_get(e, 6));
  out->thread = u64_value(json_array_get(e, 7));
  out->stack = id_value(json_array_get(e, 8));
}

void snap_frame(const snap_t *s, size_t i, snap_frame_t *out) {
  const json_t *f = json_array_get(s->frames, i);
  out->address = snap_u64(f, "address");
  out->offset = snap_u64(f, "offset");
  out->function = json_string_value(json_object_get(f, "function"));
  out->module = json_string_value(json_object_get(f, "module"));
  out->file = json_string_value(json_object_get(f, "file"));
  out->line = id_value(json_object_get(f, "line"));
}

void snap_chunk(const snap_t *s, size_t i, snap_chunk_t *out) {
  const json_t *c = json_array_get(s->chunks, i);
  out->address = snap_u64(c, "address");
  out->size = snap_u64(c, "size");
  out->node = snap_u64(c, "node"); /* absent before issue 24: 0 */
  out->nfree = json_array_size(json_object_get(c, "free"));
}

void snap_chunk_free(const snap_t *s, size_t i, size_t j, uint64_t *address,
                     uint64_t *size) {
  const json_t *r =
      json_array_get(json_object_get(json_array_get(s->chunks, i), "free"), j);
  *address = u64_value(json_array_get(r, 0));
  *size = u64_value(json_array_get(r, 1));
}

size_t snap_stack_len(const snap_t *s, int64_t stack) {
  if (stack < 0 || (uint64_t)stack >= s->nstacks)
    return 0;
  return json_array_size(json_array_get(s->stacks, (size_t)stack));
}

size_t snap_stack_frame(const snap_t *s, int64_t stack, size_t j) {
  if (stack < 0 || (uint64_t)stack >= s->nstacks)
    return 0;
  return (size_t)u64_value(
      json_array_get(json_array_get(s->stacks, (size_t)stack), j));
}

/* If snprintf cut buf (of size len) inside a UTF-8 sequence, drop the
 * partial character: the names are UTF-8 (jansson checked), and a site
 * must stay valid UTF-8 to be written to JSON again. */
static void utf8_trim(char *buf, size_t len) {
  size_t n = strlen(buf), i = n, need;
  unsigned char lead;
  if (n + 1 < len)
    return;
  while (i > 0 && ((unsigned char)buf[i - 1] & 0xC0) == 0x80)
    i--;
  if (i == 0)
    return;
  lead = (unsigned char)buf[i - 1];
  need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  if (n - (i - 1) < need)
    buf[i - 1] = '\0';
}

const char *snap_site(const snap_t *s, int64_t stack, char *buf, size_t len) {
  snap_frame_t f;
  size_t fi;
  if (len == 0)
    return buf;
  if (stack < 0) {
    (void)snprintf(buf, len, "(no stack)");
    return buf;
  }
  if (snap_stack_len(s, stack) == 0) {
    (void)snprintf(buf, len, "(empty stack)");
    return buf;
  }
  fi = snap_stack_frame(s, stack, 0);
  if (fi >= s->nframes) { /* the loader rejects this; be safe anyway */
    (void)snprintf(buf, len, "(bad frame)");
    return buf;
  }
  snap_frame(s, fi, &f);
  if (f.function != NULL && f.file != NULL && f.line >= 0)
    (void)snprintf(buf, len, "%s (%s:%" PRId64 ")", f.function, f.file, f.line);
  else if (f.function != NULL && f.file != NULL)
    (void)snprintf(buf, len, "%s (%s)", f.function, f.file);
  else if (f.function != NULL)
    (void)snprintf(buf, len, "%s+0x%" PRIx64, f.function, f.offset);
  else if (f.file != NULL && f.line >= 0)
    (void)snprintf(buf, len, "0x%" PRIx64 " (%s:%" PRId64 ")", f.address,
                   f.file, f.line);
  else
    (void)snprintf(buf, len, "0x%" PRIx64, f.address);
  utf8_trim(buf, len);
  return buf;
}
