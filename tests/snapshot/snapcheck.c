/* Snapshot checks shared by the tests (snapcheck.h). */
#include "snapcheck.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int bad(char *why, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int bad(char *why, size_t n, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(why, n, fmt, ap);
  va_end(ap);
  return -1;
}

static uint64_t u(const json_t *o, const char *k) {
  return (uint64_t)json_integer_value(json_object_get(o, k));
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

int snapcheck(const char *text, size_t len, snapcheck_t *out, char *why,
              size_t whylen) {
  memset(out, 0, sizeof *out);
  json_error_t err;
  json_t *root = json_loadb(text, len, 0, &err);
  if (root == NULL)
    return bad(why, whylen, "not JSON: line %d column %d: %s", err.line,
               err.column, err.text);
  int rc = -1;
  uint64_t *addrs = NULL;
  const char *fmt = json_string_value(json_object_get(root, "format"));
  if (fmt == NULL || strcmp(fmt, "pinpool-snapshot") != 0 ||
      u(root, "version") != 1) {
    bad(why, whylen, "format/version");
    goto done;
  }
  json_t *segs = json_object_get(root, "segments");
  json_t *stacks = json_object_get(root, "stacks");
  json_t *frames = json_object_get(root, "frames");
  json_t *tot = json_object_get(root, "totals");
  json_t *hist = json_object_get(root, "history");
  if (!json_is_array(segs) || !json_is_array(stacks) ||
      !json_is_array(frames) || !json_is_object(tot) || !json_is_object(hist)) {
    bad(why, whylen, "missing top-level keys");
    goto done;
  }
  size_t nstacks = json_array_size(stacks), nframes = json_array_size(frames);
  size_t nblk = 0, cap = 0;
  uint64_t alloc_b = 0, pend_b = 0, cached_b = 0, seg_b = 0, req_b = 0;
  uint64_t extra = 0; /* uncarved + tails */
  size_t i, j;
  json_t *sg, *b;
  json_array_foreach(segs, i, sg) {
    uint64_t size = u(sg, "size"), bs = u(sg, "block_size");
    uint64_t base = u(sg, "address"), total = u(sg, "blocks_total");
    uint64_t unc = u(sg, "uncarved_blocks"), tail = u(sg, "tail_bytes");
    json_t *blocks = json_object_get(sg, "blocks");
    if (bs == 0 || total != size / bs || tail != size - total * bs ||
        json_array_size(blocks) + unc != total) {
      bad(why, whylen, "segments[%zu]: blocks do not fill it", i);
      goto done;
    }
    seg_b += size;
    extra += unc * bs + tail;
    json_array_foreach(blocks, j, b) {
      uint64_t a = u(b, "address");
      if (a < base || a >= base + total * bs || (a - base) % bs != 0) {
        bad(why, whylen, "segments[%zu].blocks[%zu]: address", i, j);
        goto done;
      }
      if (nblk == cap) {
        cap = cap ? 2 * cap : 1024;
        uint64_t *n = realloc(addrs, cap * sizeof *n);
        if (n == NULL) {
          bad(why, whylen, "out of memory");
          goto done;
        }
        addrs = n;
      }
      addrs[nblk++] = a;
      const char *st = json_string_value(json_object_get(b, "state"));
      uint64_t req = u(b, "requested_size");
      json_t *sk = json_object_get(b, "stack");
      if (json_is_integer(sk) && (uint64_t)json_integer_value(sk) >= nstacks) {
        bad(why, whylen, "segments[%zu].blocks[%zu]: stack index", i, j);
        goto done;
      }
      if (st != NULL && strcmp(st, "allocated") == 0) {
        out->allocated++;
        alloc_b += bs;
        req_b += req;
      } else if (st != NULL && strcmp(st, "pending_free") == 0) {
        out->pending++;
        pend_b += bs;
      } else if (st != NULL && strcmp(st, "cached") == 0) {
        out->cached++;
        cached_b += bs;
      } else {
        bad(why, whylen, "segments[%zu].blocks[%zu]: state", i, j);
        goto done;
      }
      if (req > bs) {
        bad(why, whylen, "segments[%zu].blocks[%zu]: requested > size", i, j);
        goto done;
      }
    }
  }
  if (nblk > 0)
    qsort(addrs, nblk, sizeof *addrs, cmp_u64);
  for (i = 1; i < nblk; i++)
    if (addrs[i] == addrs[i - 1]) {
      bad(why, whylen, "block %#llx listed twice",
          (unsigned long long)addrs[i]);
      goto done;
    }
  uint64_t rfree = u(tot, "chunk_free_bytes");
  if (u(tot, "allocated_bytes") != alloc_b ||
      u(tot, "pending_bytes") != pend_b ||
      u(tot, "cached_bytes") != cached_b + extra + rfree ||
      u(tot, "segment_bytes") != seg_b || u(tot, "requested_bytes") != req_b ||
      u(tot, "reserved_bytes") != seg_b + rfree) {
    bad(why, whylen, "totals do not match the blocks listed");
    goto done;
  }
  if (u(tot, "reserved_bytes") != u(tot, "allocated_bytes") +
                                      u(tot, "pending_bytes") +
                                      u(tot, "cached_bytes")) {
    bad(why, whylen, "accounting identity fails in the totals");
    goto done;
  }
  json_t *st;
  json_array_foreach(stacks, i, st) {
    json_t *f;
    json_array_foreach(st, j, f) {
      if (!json_is_integer(f) || (uint64_t)json_integer_value(f) >= nframes) {
        bad(why, whylen, "stacks[%zu][%zu]: frame index", i, j);
        goto done;
      }
    }
  }
  json_t *entries = json_object_get(hist, "entries"), *e;
  uint64_t prev = 0;
  json_array_foreach(entries, i, e) {
    uint64_t seq = (uint64_t)json_integer_value(json_array_get(e, 0));
    json_t *sk = json_array_get(e, 8);
    if (json_array_size(e) != 9 || (i > 0 && seq <= prev) ||
        (json_is_integer(sk) && (uint64_t)json_integer_value(sk) >= nstacks)) {
      bad(why, whylen, "history.entries[%zu]", i);
      goto done;
    }
    prev = seq;
  }
  out->segments = json_array_size(segs);
  out->blocks = nblk;
  out->allocated_bytes = alloc_b;
  out->pending_bytes = pend_b;
  out->cached_bytes = u(tot, "cached_bytes");
  out->reserved_bytes = u(tot, "reserved_bytes");
  out->requested_bytes = req_b;
  out->entries = json_array_size(entries);
  out->stacks = nstacks;
  out->frames = nframes;
  out->dropped = u(hist, "dropped");
  out->max_hold_ns = u(root, "max_hold_ns");
  out->gather_ns = u(root, "gather_ns");
  const char *rec = json_string_value(json_object_get(hist, "record"));
  snprintf(out->record, sizeof out->record, "%s", rec ? rec : "?");
  rc = 0;
done:
  free(addrs);
  json_decref(root);
  return rc;
}

int snapcheck_has_function(const char *text, size_t len, const char *function) {
  json_t *root = json_loadb(text, len, 0, NULL);
  int found = 0;
  size_t i;
  json_t *f;
  json_array_foreach(json_object_get(root, "frames"), i, f) {
    const char *fn = json_string_value(json_object_get(f, "function"));
    if (fn != NULL && strcmp(fn, function) == 0)
      found = 1;
  }
  json_decref(root);
  return found;
}

const char *snapcheck_block_state(const char *text, size_t len, uint64_t a) {
  static char state[32];
  const char *res = NULL;
  json_t *root = json_loadb(text, len, 0, NULL);
  size_t i, j;
  json_t *sg, *b;
  json_array_foreach(json_object_get(root, "segments"), i, sg) {
    json_array_foreach(json_object_get(sg, "blocks"), j, b) {
      if (u(b, "address") == a) {
        snprintf(state, sizeof state, "%s",
                 json_string_value(json_object_get(b, "state")));
        res = state;
      }
    }
  }
  json_decref(root);
  return res;
}
