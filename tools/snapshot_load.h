/*
 * Reading snapshot files (docs/snapshot-format.md) for the `pinpool
 * snapshot` subcommands, with libjansson.
 *
 * snap_load checks, once, everything the subcommands rely on: the format
 * and version, and the type (and range) of every field they read, for
 * every segment, block, frame, stack and history entry. After a successful
 * load the subcommands read fields with the accessors below and never need
 * to check a type again. Errors name the position: a JSON syntax error as
 * "FILE: line L, column C (byte B): MESSAGE" (jansson's position), a
 * structural one as "FILE: segments[3].blocks[7].state: expected one of
 * allocated, pending_free, cached". Malformed or truncated input is an
 * error, never a crash (tests/fuzz/fuzz_snapshot.c).
 */
#ifndef PINPOOL_TOOLS_SNAPSHOT_LOAD_H
#define PINPOOL_TOOLS_SNAPSHOT_LOAD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { SNAP_ALLOCATED = 0, SNAP_PENDING = 1, SNAP_CACHED = 2 };

/* History actions, in the order of the format's enum. */
enum {
  SNAP_SEGMENT_ALLOC = 0,
  SNAP_ALLOC,
  SNAP_FREE_REQUESTED,
  SNAP_FREE_COMPLETED,
  SNAP_SEGMENT_FREE,
  SNAP_EMPTY_CACHE,
  SNAP_OOM,
  SNAP_NACTIONS
};
extern const char *const snap_action_names[SNAP_NACTIONS];
extern const char *const snap_state_names[3];

typedef struct snap_block {
  uint64_t address, size, requested;
  int state;             /* SNAP_ALLOCATED, SNAP_PENDING, SNAP_CACHED */
  int64_t thread;        /* -1: null */
  int64_t stack;         /* -1: null; else < snap->nstacks */
  const json_t *streams; /* array of handle strings ("0x7"): snap_handle */
} snap_block_t;

typedef struct snap_entry {
  uint64_t seq, time_ns, address, size, requested, stream, thread;
  int action;    /* SNAP_* action */
  int64_t stack; /* -1: null; else < snap->nstacks */
} snap_entry_t;

typedef struct snap_frame {
  uint64_t address, offset;
  const char *function, *module, *file; /* NULL: null */
  int64_t line;                         /* -1: null */
} snap_frame_t;

typedef struct snap_chunk {
  uint64_t address, size, node;
  size_t nfree; /* entries of its `free` list */
} snap_chunk_t;

typedef struct snap {
  json_t *root;                                       /* owned */
  const json_t *segments, *frames, *stacks, *entries; /* borrowed arrays */
  size_t nsegments, nframes, nstacks, nentries;
  /* The arena's chunks (written since issue 21): NULL and 0 when the
   * snapshot has none. The loader checks their types only; their order is
   * the reader's business (as for segments). */
  const json_t *chunks;
  size_t nchunks;
} snap_t;

/* Load `path` ("-": standard input). 0, or -1 with a message in err. */
int snap_load(const char *path, snap_t *out, char *err, size_t errlen);
/* The same over a buffer (`name` is used in messages). */
int snap_load_buffer(const char *name, const char *data, size_t len,
                     snap_t *out, char *err, size_t errlen);
void snap_free(snap_t *s);

/* Accessors, valid after a successful load (indices in range). */
size_t snap_segment_nblocks(const snap_t *s, size_t seg);
const json_t *snap_segment(const snap_t *s, size_t seg); /* the object */
void snap_block(const snap_t *s, size_t seg, size_t i, snap_block_t *out);
void snap_entry(const snap_t *s, size_t i, snap_entry_t *out);
void snap_frame(const snap_t *s, size_t i, snap_frame_t *out);
/* Frames of a stack: count, and frame index j (innermost first). */
size_t snap_stack_len(const snap_t *s, int64_t stack);
size_t snap_stack_frame(const snap_t *s, int64_t stack, size_t j);
void snap_chunk(const snap_t *s, size_t i, snap_chunk_t *out);
/* Free range j of chunk i: [*address, *address + *size). */
void snap_chunk_free(const snap_t *s, size_t i, size_t j, uint64_t *address,
                     uint64_t *size);
/* An integer field of an object the loader checked ("size"...). */
uint64_t snap_u64(const json_t *obj, const char *key);
/* The value of a stream handle string ("0x7"); 0 for null. */
uint64_t snap_handle(const json_t *v);

/* The allocation site of a stack: "function (file:line)" of its innermost
 * frame, "function+0xOFF" without debug info, "0xADDR" without a symbol,
 * "(no stack)" for -1. Writes into buf and returns it. */
const char *snap_site(const snap_t *s, int64_t stack, char *buf, size_t len);

/* ---- Computations of summary and diff (snapshot_summarize.c) ------------ */

/* Live blocks (allocated + pending_free) of one allocation site (snap_site
 * of the block's stack; stacks with the same site are merged). */
typedef struct snap_site_stat {
  char *site; /* owned */
  uint64_t bytes, blocks, requested;
} snap_site_stat_t;

/* The sites of s, largest live bytes first (ties by name). 0, or -1 when
 * memory runs out. Free with snap_sites_free. */
int snap_live_sites(const snap_t *s, snap_site_stat_t **out, size_t *n);
void snap_sites_free(snap_site_stat_t *v, size_t n);

/* The reports of `summary` and `diff` for loaded snapshots, written to out
 * (text, or JSON when json != 0), with the `top` largest sites (0: all).
 * They return an exit code: 0, or 1 when the accounting identity does not
 * hold (summary) or memory ran out. The fuzz target calls them too. */
int snap_summary_write(const snap_t *s, const char *name, FILE *out, size_t top,
                       int json);
int snap_diff_write(const snap_t *a, const char *name_a, const snap_t *b,
                    const char *name_b, FILE *out, size_t top, int json);

/* ---- Subcommands of `pinpool snapshot` (one file each) ------------------ */
int snap_summary_run(int argc, char **argv); /* snapshot_summary.c */
int snap_diff_run(int argc, char **argv);    /* snapshot_diff.c */
int snap_html_run(int argc, char **argv);    /* snapshot_html.c */
int snap_torch_run(int argc, char **argv);   /* snapshot_torch.c */
/* snapshot.c: FILE -o OUT for the converters; -1: go on, else exit code. */
int snap_convert_args(const char *cmd, int argc, char **argv,
                      void (*usage)(FILE *out), const char *out_example,
                      const char **in, const char **out);

#endif /* PINPOOL_TOOLS_SNAPSHOT_LOAD_H */
