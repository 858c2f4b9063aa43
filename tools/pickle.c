/*
 * The pickle writer of `pinpool snapshot torch` (pickle.h).
 *
 * Written here, not by Python: the tool must not need Python. The viewer
 * (memory_viz) decodes the file with its own JavaScript unpickler, which
 * knows only part of the protocol. So only
 * opcodes that unpickler handles are written (protocol 4 header, no FRAME):
 * EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, TUPLE2, BININT1, BININT2,
 * BININT, LONG1 (at most 8 bytes below 2^63, which it reads exactly as a
 * Number up to 2^53: addresses fit), SHORT_BINUNICODE, BINUNICODE, NEWFALSE,
 * BINPUT, LONG_BINPUT, BINGET, LONG_BINGET and STOP. APPENDS and SETITEMS
 * come in batches of at most 1000 items, as CPython writes them: the viewer
 * appends a batch with one spread call, which fails on a million arguments.
 */
#include "pickle.h"

#include <errno.h>
#include <string.h>

/* CPython's batch size; see the top of the file for why batches matter. */
#define PK_BATCH 1000

void pk_flush(pk_t *p) {
  if (p->len > 0 && !p->failed && fwrite(p->buf, 1, p->len, p->f) != p->len) {
    p->failed = 1;
    p->err = errno != 0 ? errno : EIO;
  }
  p->len = 0;
}

void pk_bytes(pk_t *p, const void *data, size_t n) {
  if (n > sizeof p->buf - p->len) {
    pk_flush(p);
    if (n > sizeof p->buf) {
      if (!p->failed && fwrite(data, 1, n, p->f) != n) {
        p->failed = 1;
        p->err = errno != 0 ? errno : EIO;
      }
      return;
    }
  }
  memcpy(p->buf + p->len, data, n);
  p->len += n;
}

/* An opcode followed by an n-byte little-endian argument (n <= 8). Most of
 * the file is such 1 to 5 byte pieces: they go into the buffer directly. */
void pk_op_le(pk_t *p, unsigned op, uint64_t v, unsigned n) {
  unsigned char *b;
  if (sizeof p->buf - p->len < 9)
    pk_flush(p);
  b = p->buf + p->len;
  b[0] = (unsigned char)op;
  for (unsigned i = 0; i < n; i++)
    b[1 + i] = (unsigned char)(v >> (8 * i));
  p->len += 1 + n;
}

void pk_op(pk_t *p, unsigned op) { pk_op_le(p, op, 0, 0); }

void pk_uint(pk_t *p, uint64_t v) {
  if (v <= 0xff) {
    pk_op_le(p, OP_BININT1, v, 1);
  } else if (v <= 0xffff) {
    pk_op_le(p, OP_BININT2, v, 2);
  } else if (v <= 0x7fffffff) {
    pk_op_le(p, OP_BININT, v, 4);
  } else {
    /* LONG1: little-endian two's complement, the shortest form with the top
     * bit clear, so 2^63 and above take 9 bytes (which the viewer would read
     * as a BigInt; addresses never get there). */
    unsigned char b[11] = {OP_LONG1};
    unsigned n = 4;
    while (n < 9 && (v >> (8 * n - 1)) != 0)
      n++;
    b[1] = (unsigned char)n;
    for (unsigned i = 0; i < n; i++)
      b[2 + i] = i < 8 ? (unsigned char)(v >> (8 * i)) : 0;
    pk_bytes(p, b, 2 + n);
  }
}

/* s must be UTF-8: jansson checks every string it parses. */
void pk_strn(pk_t *p, const char *s, size_t n) {
  if (n <= 0xff)
    pk_op_le(p, OP_SHORT_BINUNICODE, n, 1);
  else
    pk_op_le(p, OP_BINUNICODE, n, 4);
  pk_bytes(p, s, n);
}

void pk_str(pk_t *p, const char *s) { pk_strn(p, s, strlen(s)); }

uint32_t pk_put(pk_t *p) {
  uint32_t id = p->memo_next++;
  if (id <= 0xff)
    pk_op_le(p, OP_BINPUT, id, 1);
  else
    pk_op_le(p, OP_LONG_BINPUT, id, 4);
  return id;
}

void pk_get(pk_t *p, uint32_t id) {
  if (id <= 0xff)
    pk_op_le(p, OP_BINGET, id, 1);
  else
    pk_op_le(p, OP_LONG_BINGET, id, 4);
}

pk_seq_t pk_list(pk_t *p) {
  pk_op(p, OP_EMPTY_LIST);
  return (pk_seq_t){0, OP_APPENDS};
}

pk_seq_t pk_dict(pk_t *p) {
  pk_op(p, OP_EMPTY_DICT);
  return (pk_seq_t){0, OP_SETITEMS};
}

void pk_item(pk_t *p, pk_seq_t *q) {
  if (q->n % PK_BATCH == 0) {
    if (q->n > 0)
      pk_op(p, q->close);
    pk_op(p, OP_MARK);
  }
  q->n++;
}

void pk_end(pk_t *p, pk_seq_t *q) {
  if (q->n > 0)
    pk_op(p, q->close);
}
