/*
 * pp_bench's implementations under test (impl.c): one interface,
 * pb_im_alloc / pb_im_free / pb_im_get_counters, that every workload calls
 * the same way, the floor, and their setup from --impl. Above util.h,
 * below the harness (harness.h), which measures them.
 *
 * pb_use_block and pb_pool_pair sit inside timed regions: static inline,
 * as they were when everything was one file.
 */
#ifndef PP_BENCH_IMPL_H
#define PP_BENCH_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pinpool.h"
#include "refpool.h"
#include "rmmpool.h"
#include "util.h"

/* ---- Implementations (impl.c) -------------------------------------------- */

/* K_CUHOST: cuMemHostAlloc / cuMemFreeHost per block, the naive baseline on
 * a GPU machine (counted like K_NAIVE). */
typedef enum kind {
  K_PINPOOL,
  K_REFPOOL,
  K_RMMPOOL,
  K_NAIVE,
  K_CUHOST,
  K_MALLOC,
  K_FLOOR
} kind_t;

typedef struct impl {
  kind_t kind;
  const char *name; /* as reported */
  const char *mode; /* alloc, touch */
  bool touch;
  bool cuda; /* calls the CUDA driver itself: every thread enters its context */
  char config[256];
  pinpool_t *pool;
  refpool_t *ref;
  rmmpool_t *rmm;
  atomic_uint_fast64_t nv_reserved, nv_peak, nv_calls, nv_mlock_fail;
} impl_t;

extern impl_t pb_im;
/* Why a malloc peer's backend calls are not counted (syscount_init). */
extern char pb_syscount_why[256];
/* Per thread: a shared sink would be a data race and bounce a cache line
 * between the threads of a 2-thread run. */
extern _Thread_local void *volatile pb_sink;
/* The worker's index (0 on the main thread): the floor's ring of each
 * thread. */
extern _Thread_local int pb_tidx;
/* The stream an allocation is for (W4; 0 elsewhere): rmmpool's
 * stream-ordered free lists. */
extern _Thread_local uintptr_t pb_cur_stream;

/* Use the block the same way for every implementation: touch mode writes
 * one byte in every 4 KiB page of it, alloc mode writes nothing. */
static inline void pb_use_block(void *p, size_t size) {
  if (pb_im.touch) {
    volatile unsigned char *b = p;
    for (size_t off = 0; off < size; off += PAGE)
      b[off] = (unsigned char)off;
  }
  pb_sink = p;
}

/* One pinpool alloc+free pair that writes a byte of the block: W1's (and
 * W1h's) timed loop and W8's allocating threads. Inlined, so that W1 times
 * the pair itself. */
static inline __attribute__((always_inline)) void pb_pool_pair(size_t size,
                                                               uint64_t i) {
  void *p;
  int rc = pinpool_alloc(pb_im.pool, size, &p);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_alloc", rc);
  *(volatile unsigned char *)p = (unsigned char)i;
  pb_sink = p;
  rc = pinpool_free(pb_im.pool, p);
  if (rc != PINPOOL_OK)
    pb_die_pp("pinpool_free", rc);
}

void pb_floor_prepare(size_t per_thread, int threads);
void *pb_floor_alloc(size_t size);
void *pb_baseline_alloc(size_t size);
void pb_baseline_free(void *p, size_t size);
void *pb_im_alloc(size_t size, void **ctx);
void pb_im_free(void *p, size_t size, void *ctx);

/* Counters of the implementation itself (pools and naive); for a malloc
 * peer only its backend calls: the memory system calls its threads made,
 * counted by the kernel (syscount.h), where the machine lets us. */
typedef struct im_counters {
  bool known;       /* the memory counters below */
  bool calls_known; /* backend_calls */
  uint64_t backend_calls;
  uint64_t reserved_peak;
  uint64_t reserved_now;
  uint64_t requested_peak; /* pinpool only (its own exact tracking) */
  uint64_t mlock_failures;
} im_counters_t;

void pb_im_get_counters(im_counters_t *c);

/* The stream clock of the implementations other than pinpool (W4), and
 * room for `cap` refpool / rmmpool events on it. */
extern pinpool_t *pb_clock;
void pb_ref_events_reset(uint64_t cap);

/* ---- Setup (impl.c) ------------------------------------------------------ */

struct hist_variant;
struct cuda_pool;
const struct hist_variant *pb_find_hist_variant(const char *impl);
const struct cuda_pool *pb_find_cuda_pool(const char *impl);
void pb_im_setup(const char *pool_config, const char *variant,
                 const char *variant_config, bool hist);
void pb_im_teardown(void);
void pb_check_peer(void);

#endif
