/*
 * `pinpool demo`'s pipeline (demo_pipeline.c; demo.c says what the demo
 * does): the buffers, cookies, queues and threads, and the state they
 * share. `pinpool demo` is in layers, each calling only those below it:
 * demo.c (the command), demo_report.c (the progress line and the report,
 * demo_report.h), demo_pipeline.c. Every name that crosses these files
 * starts with demo_ (DEMO_).
 */
#ifndef PINPOOL_TOOLS_DEMO_PIPELINE_H
#define PINPOOL_TOOLS_DEMO_PIPELINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinpool.h"

/* ---- Buffer kinds ------------------------------------------------------- */
enum buffer_kind {
  DEMO_KIND_IMAGE_U8,  /* 256x3x224x224 uint8 image batch */
  DEMO_KIND_IMAGE_F32, /* 64x3x224x224 fp32 image batch */
  DEMO_KIND_KV_PAGE,   /* 2 MiB KV-cache page */
  DEMO_KIND_TOKENS,    /* token batch, 4 KiB - 2 MiB log-uniform */
  DEMO_KIND_COUNT
};

extern const char *const demo_kind_names[DEMO_KIND_COUNT];

#define DEMO_IMAGE_U8_BYTES ((size_t)256 * 3 * 224 * 224)
#define DEMO_IMAGE_F32_BYTES ((size_t)64 * 3 * 224 * 224 * sizeof(float))
#define DEMO_KV_PAGE_BYTES ((size_t)2 << 20)
#define DEMO_TOKENS_MIN_LOG2 12 /* 4 KiB */
#define DEMO_TOKENS_MAX_LOG2 21 /* 2 MiB */

/* Mix, in per mille of buffers (the rest are token batches). */
#define DEMO_PERMILLE_IMAGE_U8 60
#define DEMO_PERMILLE_IMAGE_F32 20
#define DEMO_PERMILLE_KV_PAGE 300

/* ---- Cookies ------------------------------------------------------------ */
#define DEMO_HEAD_MAGIC UINT64_C(0x50494e504f4f4c48) /* "PINPOOLH" */
#define DEMO_TAIL_MAGIC UINT64_C(0x50494e504f4f4c54) /* "PINPOOLT" */

typedef struct cookie {
  uint64_t magic;
  uint64_t id; /* producer << 40 | sequence number */
  uint64_t size;
  uint64_t check; /* hash of the three fields above */
} demo_cookie_t;

#define DEMO_COOKIE_BYTES sizeof(demo_cookie_t)
#define DEMO_VERIFY_CHUNK ((size_t)64 << 10)
#define DEMO_MAX_REPORTED_FAILURES 8

/* ---- Options ------------------------------------------------------------ */
typedef struct demo_options {
  double seconds;
  uint64_t producers;
  uint64_t consumers;
  uint64_t depth;
  uint64_t seed;
  const char *config;   /* NULL: PINPOOL_CONF or defaults */
  const char *snapshot; /* NULL: none; else written at the end of the run */
} demo_options_t;

/* ---- Bounded queue ------------------------------------------------------ */
typedef struct item {
  unsigned char *ptr;
  size_t size;
  uint64_t id;
} demo_item_t;

typedef struct queue {
  pthread_mutex_t mu;
  pthread_cond_t not_empty;
  pthread_cond_t not_full;
  demo_item_t *items;
  size_t cap;
  size_t head;
  size_t count;
  bool closed;
} demo_queue_t;

/* ---- Shared state ------------------------------------------------------- */
typedef struct demo {
  demo_options_t opt;
  pinpool_t *pool;
  demo_queue_t *queues;
  atomic_int stop;      /* producers stop at their next buffer */
  atomic_uint failures; /* unexpected errors and failed checks */
  atomic_uint reported; /* failure messages printed so far */
  atomic_uint_fast64_t done_buffers;
  atomic_uint_fast64_t done_bytes;
  atomic_uint_fast64_t cookie_failures;
  atomic_uint_fast64_t bad_blocks;    /* size or alignment off contract */
  bool streams;                       /* the pool has simulated streams */
  atomic_uint_fast64_t copies;        /* simulated H2D copies completed */
  atomic_uint_fast64_t copy_failures; /* a copy saw its buffer reused */
} demo_t;

typedef struct producer {
  demo_t *d;
  unsigned id;
  pthread_t thread;
  uint64_t rng;
  uint64_t buffers;
  uint64_t by_kind[DEMO_KIND_COUNT];
  uint64_t requested_bytes; /* sum of requested sizes */
  uint64_t block_bytes;     /* sum of pinpool_block_size */
  double waste_ratio_sum;   /* sum of (block - requested) / requested */
  uint64_t enomem;          /* ENOMEM answers (retried) */
  double alloc_ns_sum;
  double alloc_ns_max;
  /* Durations by power of two of ns (bucket k: [2^k, 2^(k+1))), count and
   * sum: the slowest calls are told apart from the rest afterwards. */
  uint64_t alloc_hist_n[64];
  double alloc_hist_sum[64];
} demo_producer_t;

typedef struct consumer {
  demo_t *d;
  unsigned id;
  pthread_t thread;
  uint64_t buffers;
  unsigned char ref[DEMO_VERIFY_CHUNK]; /* the expected body bytes */
  int ref_byte;                         /* byte `ref` holds, -1 if none */
} demo_consumer_t;

/* ---- The pipeline (demo_pipeline.c) ---------------------------------------
 */

/* The splitmix64 finalizer (the seed of each producer's generator). */
uint64_t demo_mix64(uint64_t z);
/* Count a failure; true if its message should be printed (the first few). */
bool demo_count_failure(demo_t *d);
/* A pinpool call that failed unexpectedly: counted, and told if among the
 * first few. */
void demo_pinpool_failure(demo_t *d, const char *call, int err);
int demo_queue_init(demo_queue_t *q, size_t cap);
void demo_queue_fini(demo_queue_t *q);
/* No more pushes: consumers drain the queue, then stop. */
void demo_queue_close(demo_queue_t *q);
/* The threads' bodies: arg is a demo_producer_t / demo_consumer_t. */
void *demo_producer_main(void *arg);
void *demo_consumer_main(void *arg);

#endif /* PINPOOL_TOOLS_DEMO_PIPELINE_H */
