/*
 * `pinpool demo`'s pipeline (demo_pipeline.h): buffer sizes from a seeded
 * generator, the cookies and byte pattern each buffer carries, the bounded
 * queues, the producer and consumer threads, and the simulated device
 * copies of a pool with streams.
 */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "demo_pipeline.h"
#include "pinpool.h"

const char *const demo_kind_names[DEMO_KIND_COUNT] = {
    "image u8 256x3x224x224", "image fp32 64x3x224x224", "KV page 2 MiB",
    "tokens 4 KiB-2 MiB"};

/* ---- Random numbers (splitmix64) ---------------------------------------- */
uint64_t demo_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
  return z ^ (z >> 31);
}

static uint64_t rng_next(uint64_t *state) {
  *state += UINT64_C(0x9e3779b97f4a7c15);
  return demo_mix64(*state);
}

static double rng_unit(uint64_t *state) {
  return (double)(rng_next(state) >> 11) * 0x1.0p-53;
}

static size_t draw_buffer(uint64_t *rng, enum buffer_kind *kind) {
  uint64_t r = rng_next(rng) % 1000;
  double size;
  if (r < DEMO_PERMILLE_IMAGE_U8) {
    *kind = DEMO_KIND_IMAGE_U8;
    return DEMO_IMAGE_U8_BYTES;
  }
  r -= DEMO_PERMILLE_IMAGE_U8;
  if (r < DEMO_PERMILLE_IMAGE_F32) {
    *kind = DEMO_KIND_IMAGE_F32;
    return DEMO_IMAGE_F32_BYTES;
  }
  r -= DEMO_PERMILLE_IMAGE_F32;
  if (r < DEMO_PERMILLE_KV_PAGE) {
    *kind = DEMO_KIND_KV_PAGE;
    return DEMO_KV_PAGE_BYTES;
  }
  *kind = DEMO_KIND_TOKENS;
  size = exp2(DEMO_TOKENS_MIN_LOG2 +
              (DEMO_TOKENS_MAX_LOG2 - DEMO_TOKENS_MIN_LOG2) * rng_unit(rng));
  return ((size_t)size & ~(size_t)3) /* int32 tokens */;
}

/* ---- Cookies and patterns ------------------------------------------------ */
static unsigned char pattern_byte(uint64_t id) {
  return (unsigned char)(demo_mix64(id ^ UINT64_C(0x5bd1e995)) & 0xff);
}

static demo_cookie_t make_cookie(uint64_t magic, uint64_t id, uint64_t size) {
  demo_cookie_t c;
  c.magic = magic;
  c.id = id;
  c.size = size;
  c.check = demo_mix64(magic ^ demo_mix64(id ^ demo_mix64(size)));
  return c;
}

static void fill_buffer(unsigned char *p, size_t size, uint64_t id) {
  demo_cookie_t head = make_cookie(DEMO_HEAD_MAGIC, id, size);
  demo_cookie_t tail = make_cookie(DEMO_TAIL_MAGIC, id, size);
  memcpy(p, &head, DEMO_COOKIE_BYTES);
  memset(p + DEMO_COOKIE_BYTES, pattern_byte(id), size - 2 * DEMO_COOKIE_BYTES);
  memcpy(p + size - DEMO_COOKIE_BYTES, &tail, DEMO_COOKIE_BYTES);
}

/* NULL if the buffer holds what its producer wrote, else what is wrong;
 * *where gets the offset of the first bad byte. */
static const char *verify_buffer(demo_consumer_t *c, const demo_item_t *it,
                                 size_t *where) {
  demo_cookie_t want, got;
  size_t off = DEMO_COOKIE_BYTES, end = it->size - DEMO_COOKIE_BYTES;
  unsigned char b = pattern_byte(it->id);

  want = make_cookie(DEMO_HEAD_MAGIC, it->id, it->size);
  memcpy(&got, it->ptr, DEMO_COOKIE_BYTES);
  *where = 0;
  if (memcmp(&got, &want, DEMO_COOKIE_BYTES) != 0)
    return "header cookie overwritten";
  want = make_cookie(DEMO_TAIL_MAGIC, it->id, it->size);
  memcpy(&got, it->ptr + end, DEMO_COOKIE_BYTES);
  *where = end;
  if (memcmp(&got, &want, DEMO_COOKIE_BYTES) != 0)
    return "trailer cookie overwritten";
  if (c->ref_byte != b) {
    memset(c->ref, b, DEMO_VERIFY_CHUNK);
    c->ref_byte = b;
  }
  while (off < end) {
    size_t n = end - off < DEMO_VERIFY_CHUNK ? end - off : DEMO_VERIFY_CHUNK;
    if (memcmp(it->ptr + off, c->ref, n) != 0) {
      while (it->ptr[off] == b)
        off++;
      *where = off;
      return "pattern overwritten";
    }
    off += n;
  }
  return NULL;
}

/* ---- Failures ----------------------------------------------------------- */

/* Count a failure; true if its message should be printed (the first few). */
bool demo_count_failure(demo_t *d) {
  atomic_fetch_add(&d->failures, 1);
  return atomic_fetch_add(&d->reported, 1) < DEMO_MAX_REPORTED_FAILURES;
}

void demo_pinpool_failure(demo_t *d, const char *call, int err) {
  if (demo_count_failure(d))
    cli_pinpool_error(call, err);
}

/* ---- Queue ----------------------------------------------------------------
 */
int demo_queue_init(demo_queue_t *q, size_t cap) {
  q->items = calloc(cap, sizeof *q->items);
  if (q->items == NULL)
    return -1;
  q->cap = cap;
  q->head = q->count = 0;
  q->closed = false;
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->not_empty, NULL);
  pthread_cond_init(&q->not_full, NULL);
  return 0;
}

void demo_queue_fini(demo_queue_t *q) {
  pthread_cond_destroy(&q->not_full);
  pthread_cond_destroy(&q->not_empty);
  pthread_mutex_destroy(&q->mu);
  free(q->items);
}

static void queue_push(demo_queue_t *q, demo_item_t it) {
  pthread_mutex_lock(&q->mu);
  while (q->count == q->cap)
    pthread_cond_wait(&q->not_full, &q->mu);
  q->items[(q->head + q->count) % q->cap] = it;
  q->count++;
  pthread_cond_signal(&q->not_empty);
  pthread_mutex_unlock(&q->mu);
}

void demo_queue_close(demo_queue_t *q) {
  pthread_mutex_lock(&q->mu);
  q->closed = true;
  pthread_cond_broadcast(&q->not_empty);
  pthread_mutex_unlock(&q->mu);
}

/* Wait for an item; false once the queue is closed and empty. Before waiting
 * on an empty queue, the consumer hands its thread cache back to the pool:
 * it only frees, so the blocks it caches are only useful to the producers. */
static bool queue_pop(demo_queue_t *q, demo_t *d, demo_item_t *out) {
  pthread_mutex_lock(&q->mu);
  if (q->count == 0 && !q->closed) {
    int rc;
    pthread_mutex_unlock(&q->mu);
    rc = pinpool_thread_flush(d->pool);
    if (rc != PINPOOL_OK)
      demo_pinpool_failure(d, "pinpool_thread_flush", rc);
    pthread_mutex_lock(&q->mu);
  }
  while (q->count == 0 && !q->closed)
    pthread_cond_wait(&q->not_empty, &q->mu);
  if (q->count == 0) {
    pthread_mutex_unlock(&q->mu);
    return false;
  }
  *out = q->items[q->head];
  q->head = (q->head + 1) % q->cap;
  q->count--;
  pthread_cond_signal(&q->not_full);
  pthread_mutex_unlock(&q->mu);
  return true;
}

/* ---- Threads ------------------------------------------------------------ */

/* NULL if the block meets the contract of pinpool_alloc, else what it
 * breaks: at least the request, 64-byte aligned, and 4096-byte aligned when
 * its class is a multiple of 4096 (docs/api.md). */
static const char *check_block(const void *ptr, size_t size, size_t block) {
  if (block < size)
    return "pinpool_block_size is smaller than the request";
  if (((uintptr_t)ptr & 63) != 0)
    return "not 64-byte aligned";
  if (block % 4096 == 0 && ((uintptr_t)ptr & 4095) != 0)
    return "class is a multiple of 4096 but the block is not 4096-aligned";
  return NULL;
}

void *demo_producer_main(void *arg) {
  demo_producer_t *p = arg;
  demo_t *d = p->d;
  uint64_t seq = 0;
  bool enomem_reported = false;

  while (!atomic_load_explicit(&d->stop, memory_order_relaxed)) {
    enum buffer_kind kind;
    size_t size = draw_buffer(&p->rng, &kind), block = 0;
    void *ptr = NULL;
    double t0, dt;
    int rc;
    demo_item_t it;

    for (;;) {
      t0 = cli_now();
      rc = pinpool_alloc(d->pool, size, &ptr);
      dt = (cli_now() - t0) * 1e9;
      if (rc != PINPOOL_ENOMEM)
        break;
      /* A cap in --config was reached: wait for the consumers. */
      p->enomem++;
      if (!enomem_reported) {
        cli_pinpool_error("pinpool_alloc (will retry)", rc);
        enomem_reported = true;
      }
      if (atomic_load_explicit(&d->stop, memory_order_relaxed))
        return NULL;
      cli_sleep(0.001);
    }
    if (rc != PINPOOL_OK) {
      demo_pinpool_failure(d, "pinpool_alloc", rc);
      atomic_store(&d->stop, 1);
      break;
    }
    p->alloc_ns_sum += dt;
    if (dt > p->alloc_ns_max)
      p->alloc_ns_max = dt;
    {
      unsigned k = 0;
      while (k < 63 && dt >= (double)(UINT64_C(2) << k))
        k++;
      p->alloc_hist_n[k]++;
      p->alloc_hist_sum[k] += dt;
    }

    rc = pinpool_block_size(d->pool, ptr, &block);
    if (rc != PINPOOL_OK) {
      demo_pinpool_failure(d, "pinpool_block_size", rc);
      block = size;
    } else {
      const char *bad = check_block(ptr, size, block);
      if (bad != NULL) {
        atomic_fetch_add(&d->bad_blocks, 1);
        if (demo_count_failure(d))
          fprintf(stderr,
                  "pinpool demo: block %p of %zu bytes for a request of %zu "
                  "bytes: %s\n",
                  ptr, block, size, bad);
      }
      if (block < size)
        block = size;
    }
    p->requested_bytes += size;
    p->block_bytes += block;
    p->waste_ratio_sum += (double)(block - size) / (double)size;

    it.ptr = ptr;
    it.size = size;
    it.id = ((uint64_t)p->id << 40) | seq;
    fill_buffer(it.ptr, it.size, it.id);
    queue_push(&d->queues[(p->id + seq) % d->opt.consumers], it);
    p->buffers++;
    p->by_kind[kind]++;
    seq++;
  }
  return NULL;
}

/* ---- Simulated device copies --------------------------------------------
 * With events=simulated, a consumer does what a training loop does with a
 * staged batch: it queues an asynchronous host-to-device copy on its stream,
 * records the stream on the buffer and frees the buffer at once. The copy
 * runs later on the stream's worker thread and checks the buffer still
 * holds its batch: if the pool handed the block out again before the copy
 * completed, a producer would have overwritten it. */
typedef struct copy_job {
  demo_t *d;
  demo_item_t it;
} copy_job_t;

static void device_copy(void *arg) {
  copy_job_t *j = arg;
  const demo_item_t *it = &j->it;
  demo_cookie_t want = make_cookie(DEMO_HEAD_MAGIC, it->id, it->size), got;
  bool ok = true;
  memcpy(&got, it->ptr, DEMO_COOKIE_BYTES);
  ok &= memcmp(&got, &want, DEMO_COOKIE_BYTES) == 0;
  want = make_cookie(DEMO_TAIL_MAGIC, it->id, it->size);
  memcpy(&got, it->ptr + it->size - DEMO_COOKIE_BYTES, DEMO_COOKIE_BYTES);
  ok &= memcmp(&got, &want, DEMO_COOKIE_BYTES) == 0;
  unsigned char b = pattern_byte(it->id);
  for (size_t off = DEMO_COOKIE_BYTES; off + DEMO_COOKIE_BYTES < it->size;
       off += 4096)
    ok &= it->ptr[off] == b;
  if (!ok) {
    atomic_fetch_add(&j->d->copy_failures, 1);
    if (demo_count_failure(j->d))
      fprintf(stderr,
              "pinpool demo: buffer %#llx was reused before its device copy "
              "completed\n",
              (unsigned long long)it->id);
  }
  atomic_fetch_add_explicit(&j->d->copies, 1, memory_order_relaxed);
  free(j);
}

/* Queue the copy and free the buffer, stream-ordered. Returns the rc of the
 * first failing call. */
static int copy_and_free(demo_t *d, demo_consumer_t *c, const demo_item_t *it) {
  pinpool_stream_t stream = (pinpool_stream_t)(c->id + 1);
  copy_job_t *j = malloc(sizeof *j);
  if (j == NULL)
    return PINPOOL_ENOMEM;
  *j = (copy_job_t){d, *it};
  /* ~25 GB/s of simulated PCIe bandwidth */
  uint64_t ns = (uint64_t)it->size / 25;
  int rc = pinpool_sim_submit(d->pool, stream, ns, device_copy, j);
  if (rc != PINPOOL_OK) {
    free(j);
    return rc;
  }
  rc = pinpool_record_stream(d->pool, it->ptr, stream);
  if (rc != PINPOOL_OK)
    return rc;
  return pinpool_free(d->pool, it->ptr);
}

void *demo_consumer_main(void *arg) {
  demo_consumer_t *c = arg;
  demo_t *d = c->d;
  demo_queue_t *q = &d->queues[c->id];
  demo_item_t it;

  while (queue_pop(q, d, &it)) {
    size_t where;
    const char *bad = verify_buffer(c, &it, &where);
    int rc;
    if (bad != NULL) {
      atomic_fetch_add(&d->cookie_failures, 1);
      if (demo_count_failure(d))
        fprintf(stderr,
                "pinpool demo: buffer %#llx (%zu bytes at %p): %s at offset "
                "%zu\n",
                (unsigned long long)it.id, it.size, (void *)it.ptr, bad, where);
    }
    rc = d->streams ? copy_and_free(d, c, &it) : pinpool_free(d->pool, it.ptr);
    if (rc != PINPOOL_OK)
      demo_pinpool_failure(d, "pinpool_free", rc);
    c->buffers++;
    atomic_fetch_add_explicit(&d->done_buffers, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&d->done_bytes, it.size, memory_order_relaxed);
  }
  /* Hand back what this thread cached (also done at thread exit). */
  {
    int rc = pinpool_thread_flush(d->pool);
    if (rc != PINPOOL_OK)
      demo_pinpool_failure(d, "pinpool_thread_flush", rc);
  }
  return NULL;
}
