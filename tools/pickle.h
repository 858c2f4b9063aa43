/*
 * A pickle writer (pickle.c) for `pinpool snapshot torch`
 * (snapshot_torch.c): protocol 4, buffered, memoized objects, lists and
 * dicts in batches. Not thread-safe; one pk_t per file.
 */
#ifndef PP_TOOLS_PICKLE_H
#define PP_TOOLS_PICKLE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
  OP_MARK = '(',
  OP_STOP = '.',
  OP_BININT = 'J',
  OP_BININT1 = 'K',
  OP_BININT2 = 'M',
  OP_BINUNICODE = 'X',
  OP_EMPTY_LIST = ']',
  OP_APPENDS = 'e',
  OP_BINGET = 'h',
  OP_LONG_BINGET = 'j',
  OP_BINPUT = 'q',
  OP_LONG_BINPUT = 'r',
  OP_SETITEMS = 'u',
  OP_EMPTY_DICT = '}',
  OP_PROTO = 0x80,
  OP_TUPLE2 = 0x86,
  OP_NEWFALSE = 0x89,
  OP_LONG1 = 0x8a,
  OP_SHORT_BINUNICODE = 0x8c,
};

typedef struct pk {
  FILE *f;
  int failed; /* a write failed (errno kept in err) */
  int err;
  uint32_t memo_next; /* next memo index */
  size_t len;
  unsigned char buf[1 << 16];
} pk_t;

/* Items of a list or dict, written in batches: call pk_item before each
 * item (key and value for a dict) and pk_end after the last. */
typedef struct pk_seq {
  size_t n;
  unsigned close; /* OP_APPENDS or OP_SETITEMS */
} pk_seq_t;

void pk_flush(pk_t *p);
void pk_bytes(pk_t *p, const void *data, size_t n);
/* Opcode op, then the n low bytes of v, little-endian. */
void pk_op_le(pk_t *p, unsigned op, uint64_t v, unsigned n);
void pk_op(pk_t *p, unsigned op);
void pk_uint(pk_t *p, uint64_t v);
void pk_strn(pk_t *p, const char *s, size_t n);
void pk_str(pk_t *p, const char *s);
/* Memoize the object on top of the stack; returns its memo index. */
uint32_t pk_put(pk_t *p);
void pk_get(pk_t *p, uint32_t id);
pk_seq_t pk_list(pk_t *p);
pk_seq_t pk_dict(pk_t *p);
void pk_item(pk_t *p, pk_seq_t *q);
void pk_end(pk_t *p, pk_seq_t *q);

#endif /* PP_TOOLS_PICKLE_H */
