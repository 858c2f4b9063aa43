/*
 * libFuzzer target: input bytes -> a sequence of public API calls on one or
 * two pools, from one or two threads, with bad input mixed in: double,
 * foreign, interior and stale frees; zero, huge and overflowing sizes; NULL
 * arguments; random configuration strings; odd hooks; a user backend and a
 * user event provider that fail when the input says so.
 *
 * Checked after every single-threaded step (any violation abort()s, which
 * libFuzzer records as a crash):
 *  - pinpool_validate() == 0 on every pool (DESIGN.md invariant 5);
 *  - reserved == block_bytes + cached + pending, current == allocated -
 *    freed, peak >= current (invariant 6);
 *  - the pool agrees with a model of the live blocks kept here: count,
 *    block bytes and requested bytes; blocks never overlap; cookies written
 *    at both ends of every block survive until its free (invariant 4);
 *  - every error is one of the codes documented for the call, comes with a
 *    message, and -- where the model knows the answer -- is exactly the
 *    right one; a call that fails leaves the stats unchanged;
 *  - a user backend gets back exactly the ranges it handed out, and nothing
 *    is left with it (or with the user event provider) after destroy.
 * While a second thread runs (OP_THREADS), each thread checks only its own
 * return codes and cookies; the full checks run after the join.
 *
 * Input format and how to add seeds: tests/fuzz/README.md.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fuzz_pinpool.h"
#include "pinpool.h"
#include "snapshot/snapcheck.h"

#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KIB ((uint64_t)1024)
#define MIB (KIB * 1024)
#define LARGEST_CLASS ((size_t)1 << 60)
#define MAX_OPS 400   /* per input, main thread */
#define MAX_LIVE 96   /* blocks the main thread tracks per pool */
#define T2_LIVE 32    /* blocks the second thread tracks */
#define MAX_DEAD 32   /* freed pointers remembered for double frees */
#define MAX_STREAMS 4 /* simulated streams (one worker thread each) */
#define UB_MAX 512    /* ranges a user backend can hand out */
#define UB_CAP (256 * MIB)
#define SENTINEL ((void *)(uintptr_t)0x5e17e1)

/* ---- Failing ------------------------------------------------------------- */

__attribute__((noreturn, format(printf, 3, 4))) static void
fz_fail(const char *file, int line, const char *fmt, ...) {
  va_list ap;
  (void)fprintf(stderr, "pinpool fuzz: %s:%d: ", file, line);
  va_start(ap, fmt);
  (void)vfprintf(stderr, fmt, ap);
  va_end(ap);
  (void)fprintf(stderr, "\n  pinpool_last_error(): \"%s\"\n",
                pinpool_last_error());
  abort();
}

static void fz_note(const char *cond) {
  (void)fprintf(stderr, "pinpool fuzz: check `%s` failed\n", cond);
}

/* CHECK(cond, fmt, ...): abort with the condition and a message. */
#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fz_note(#cond);                                                          \
      fz_fail(__FILE__, __LINE__, __VA_ARGS__);                                \
    }                                                                          \
  } while (0)

static const char *code_name(int rc) {
  static const char *const names[] = {
      "PINPOOL_OK",        "PINPOOL_EINVAL",    "PINPOOL_ENOMEM",
      "PINPOOL_EZEROSIZE", "PINPOOL_EOVERFLOW", "PINPOOL_EDOUBLEFREE",
      "PINPOOL_ENOTOWNED", "PINPOOL_EINTERIOR", "PINPOOL_ECONFIG",
      "PINPOOL_EBACKEND",  "PINPOOL_ECORRUPT",  "PINPOOL_EBUSY",
      "PINPOOL_ENODRIVER", "PINPOOL_EDEVICE"};
  if (rc <= 0 && rc >= -13)
    return names[-rc];
  return "(not a pinpool code)";
}

/* Sets of codes, one bit per code: what each call documents. */
#define BIT(c) (1u << (unsigned)-(c))
#define S_OK BIT(PINPOOL_OK)
#define S_BADPTR                                                               \
  (BIT(PINPOOL_ENOTOWNED) | BIT(PINPOOL_EINTERIOR) | BIT(PINPOOL_EDOUBLEFREE))
#define S_ALLOC                                                                \
  (S_OK | BIT(PINPOOL_EINVAL) | BIT(PINPOOL_ENOMEM) | BIT(PINPOOL_EZEROSIZE) | \
   BIT(PINPOOL_EOVERFLOW) | BIT(PINPOOL_EBACKEND))
#define S_FREE (S_OK | BIT(PINPOOL_EINVAL) | S_BADPTR)
#define S_RECORD (S_FREE | BIT(PINPOOL_EBUSY) | BIT(PINPOOL_ENOMEM))
#define S_SIZECLASS                                                            \
  (S_OK | BIT(PINPOOL_EINVAL) | BIT(PINPOOL_EZEROSIZE) | BIT(PINPOOL_EOVERFLOW))
#define S_SIMPLE (S_OK | BIT(PINPOOL_EINVAL))
#define S_SIM                                                                  \
  (S_OK | BIT(PINPOOL_EINVAL) | BIT(PINPOOL_EBUSY) | BIT(PINPOOL_ENOMEM))
#define S_GETCONFIG (S_OK | BIT(PINPOOL_EINVAL) | BIT(PINPOOL_EOVERFLOW))
#define S_CREATE                                                               \
  (S_OK | BIT(PINPOOL_EINVAL) | BIT(PINPOOL_ECONFIG) | BIT(PINPOOL_ENOMEM) |   \
   BIT(PINPOOL_EBACKEND) | BIT(PINPOOL_ENODRIVER))

/* The last-error message is "primed" with a known text before each checked
 * call, so that a failing call can be shown to have set its own message. */
static _Thread_local char tl_primed[128];

static void prime_with(int alt) {
  size_t dummy;
  if (alt)
    (void)pinpool_size_class(0, &dummy);
  else
    (void)pinpool_get_stats(NULL, NULL);
  (void)snprintf(tl_primed, sizeof tl_primed, "%s", pinpool_last_error());
}
static void prime(void) { prime_with(0); }

/* PP_FUZZ_TRACE=1: print every operation and every checked result. */
static int trace_on(void) {
  static _Atomic int on = -1;
  int v = atomic_load(&on);
  if (v < 0) {
    v = getenv("PP_FUZZ_TRACE") != NULL;
    atomic_store(&on, v);
  }
  return v;
}

static void expect_(int rc, unsigned set, const char *what, const char *file,
                    int line) {
  if (trace_on())
    (void)fprintf(stderr, "    %s -> %s\n", what, code_name(rc));
  if (rc > 0 || rc < -31 || !(set & BIT(rc)))
    fz_fail(file, line, "%s returned %d %s: not a code documented for it", what,
            rc, code_name(rc));
  if (rc != 0) {
    const char *msg = pinpool_last_error();
    if (msg == NULL || msg[0] == '\0' || strcmp(msg, tl_primed) == 0)
      fz_fail(file, line, "%s failed with %s but set no message", what,
              code_name(rc));
  }
}
/* rc must be in `set`; exact (if nonzero or `want_exact`) must match. */
#define EXPECT(rc, set, what) expect_((rc), (set), (what), __FILE__, __LINE__)
#define EXPECT_IS(rc, want, what)                                              \
  do {                                                                         \
    int rc_ = (rc), want_ = (want);                                            \
    expect_(rc_, BIT(want_), (what), __FILE__, __LINE__);                      \
  } while (0)

/* ---- Input --------------------------------------------------------------- */

typedef struct reader {
  const uint8_t *p;
  size_t n;
} reader_t;

static uint8_t rd_u8(reader_t *r) {
  if (r->n == 0)
    return 0;
  r->n--;
  return *r->p++;
}
static uint16_t rd_u16(reader_t *r) {
  uint16_t lo = rd_u8(r);
  return (uint16_t)(lo | (uint16_t)(rd_u8(r) << 8));
}
static uint32_t rd_u32(reader_t *r) {
  uint32_t lo = rd_u16(r);
  return lo | (uint32_t)rd_u16(r) << 16;
}

/* A request size: mostly small, sometimes on a class boundary, sometimes
 * zero, huge, beyond the largest class or a power of two up to 2^63. */
static size_t pick_size(reader_t *r) {
  uint8_t k = rd_u8(r);
  switch (k % 16) {
  case 0:
    return 0;
  case 1:
    return SIZE_MAX;
  case 2:
    return LARGEST_CLASS;
  case 3:
    return LARGEST_CLASS + 1 + rd_u16(r);
  case 4:
    return ((size_t)1 << 40) + rd_u16(r);
  case 5:
    return 511 + rd_u8(r) % 3;
  case 6: {
    unsigned e = 9 + rd_u8(r) % 14, j = rd_u8(r) % 8;
    size_t c = ((size_t)1 << e) + (size_t)j * ((size_t)1 << (e - 3));
    return c - 1 + rd_u8(r) % 3;
  }
  case 7:
  case 8:
  case 9:
    return 1 + rd_u16(r) % 512;
  case 10:
  case 11:
    return 1 + rd_u32(r) % (64 * KIB);
  case 12:
    return 1 + rd_u32(r) % (256 * KIB);
  case 13:
    return 256 * KIB + rd_u32(r) % (2 * MIB);
  case 14:
    return 1 + rd_u32(r) % (8 * MIB);
  default:
    return (size_t)1 << (rd_u8(r) % 64);
  }
}

/* ---- A user backend: mmap'd ranges, checked on the way back -------------- */

typedef struct ub_range {
  uintptr_t ret; /* what alloc returned */
  size_t size;
  void *map; /* NULL for a fake (never mapped) address */
  size_t maplen;
} ub_range_t;

enum { UB_FAIL_MODES = 8 };
typedef struct ubackend {
  pthread_mutex_t lock;
  ub_range_t r[UB_MAX]; /* under lock */
  unsigned n;           /* under lock */
  uint64_t outstanding; /* under lock */
  uint64_t cap;
  _Atomic int fail_mode, fail_count; /* the next fail_count calls fail */
  _Atomic unsigned fakes;
} ubackend_t;

static int ub_alloc(void *ctx, size_t size, void **out) {
  ubackend_t *ub = ctx;
  CHECK(out != NULL && size > 0 && size % 4096 == 0,
        "backend asked for %zu bytes", size);
  int left = atomic_load(&ub->fail_count);
  while (left > 0 &&
         !atomic_compare_exchange_weak(&ub->fail_count, &left, left - 1)) {
  }
  int mode = left > 0 ? atomic_load(&ub->fail_mode) : -1;
  uintptr_t fake = 0;
  size_t shift = 0, maplen = size;
  switch (mode) {
  case 0:
    return PINPOOL_ENOMEM;
  case 1:
    return PINPOOL_EBACKEND;
  case 2:
    return -1234; /* not a pinpool code */
  case 3:
    return 7; /* positive */
  case 4:
    *out = NULL; /* "success" without memory */
    return 0;
  case 5: /* beyond the segment map (unique: ranges are told apart by
           * address on the way back) */
    fake = ((uintptr_t)1 << 48) +
           ((uintptr_t)atomic_fetch_add(&ub->fakes, 1) << 32);
    break;
  case 6:
    fake = ((uintptr_t)1 << 48) - 4096; /* straddles 2^48 */
    break;
  case 7:
    shift = 64; /* misaligned */
    maplen = size + 4096;
    break;
  default:
    break;
  }
  pthread_mutex_lock(&ub->lock);
  if (ub->n == UB_MAX || ub->outstanding + size > ub->cap) {
    pthread_mutex_unlock(&ub->lock);
    return PINPOOL_ENOMEM;
  }
  for (unsigned i = 0; fake != 0 && i < ub->n; i++) {
    if (ub->r[i].ret == fake) { /* that fake range is out already */
      pthread_mutex_unlock(&ub->lock);
      return PINPOOL_EBACKEND;
    }
  }
  void *map = NULL;
  if (fake == 0) {
    map = mmap(NULL, maplen, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (map == MAP_FAILED) {
      pthread_mutex_unlock(&ub->lock);
      return PINPOOL_ENOMEM;
    }
  }
  uintptr_t ret = fake != 0 ? fake : (uintptr_t)map + shift;
  ub->r[ub->n++] = (ub_range_t){ret, size, map, maplen};
  ub->outstanding += size;
  pthread_mutex_unlock(&ub->lock);
  *out = (void *)ret;
  return 0;
}

static void ub_free(void *ctx, void *ptr, size_t size) {
  ubackend_t *ub = ctx;
  pthread_mutex_lock(&ub->lock);
  unsigned i = 0;
  while (i < ub->n && ub->r[i].ret != (uintptr_t)ptr)
    i++;
  CHECK(i < ub->n, "backend free of %p (%zu bytes): not handed out", ptr, size);
  CHECK(ub->r[i].size == size,
        "backend free of %p with %zu bytes, handed out with %zu", ptr, size,
        ub->r[i].size);
  if (ub->r[i].map != NULL)
    (void)munmap(ub->r[i].map, ub->r[i].maplen);
  ub->outstanding -= size;
  ub->r[i] = ub->r[--ub->n];
  pthread_mutex_unlock(&ub->lock);
}

static uint64_t ub_outstanding(ubackend_t *ub) {
  pthread_mutex_lock(&ub->lock);
  uint64_t n = ub->outstanding;
  pthread_mutex_unlock(&ub->lock);
  return n;
}

/* ---- A user event provider driven by a script from the input ------------ */

/* Set in the thread that calls pinpool_free: the free being made recorded
 * an event that will fail (or failed to record one), so the block must stay
 * PENDING forever. Events are recorded inside pinpool_free, in its thread. */
static _Thread_local bool tl_doom;

#define UEV_LIVE 0x5eed1e55u
#define UEV_DEAD 0xdeadde5du
typedef struct uevent {
  uint32_t magic;
  int err;           /* 0: completes; < 0: query/synchronize report it */
  int positive;      /* query answers 7 instead of 1, synchronize 3, not 0 */
  _Atomic int polls; /* queries answered "not yet" before completing */
} uevent_t;

typedef struct uevents {
  uint8_t script[16]; /* written only while one thread runs */
  unsigned len;
  _Atomic unsigned pos;
  _Atomic long live; /* recorded, not yet released */
} uevents_t;

static int ue_record(void *ctx, pinpool_stream_t stream, void **event) {
  static const int record_err[4] = {PINPOOL_EDEVICE, 5, -77, PINPOOL_ENOMEM};
  static const int event_err[4] = {PINPOOL_EDEVICE, -1, -99, -13};
  uevents_t *ue = ctx;
  (void)stream;
  CHECK(event != NULL, "record without an out pointer");
  uint8_t s = 0;
  if (ue->len > 0)
    s = ue->script[atomic_fetch_add(&ue->pos, 1) % ue->len];
  if ((s & 3) == 2) {
    tl_doom = true;
    return record_err[(s >> 4) & 3];
  }
  uevent_t *ev = malloc(sizeof *ev);
  if (ev == NULL) {
    tl_doom = true;
    return PINPOOL_ENOMEM;
  }
  ev->magic = UEV_LIVE;
  ev->err = (s & 3) == 3 ? event_err[(s >> 6) & 3] : 0;
  ev->positive = (s >> 6) & 1;
  atomic_init(&ev->polls, (s >> 2) & 3);
  if (ev->err != 0)
    tl_doom = true;
  atomic_fetch_add(&ue->live, 1);
  *event = ev;
  return 0;
}

static int ue_query(void *ctx, void *event) {
  uevent_t *ev = event;
  (void)ctx;
  CHECK(ev != NULL && ev->magic == UEV_LIVE, "query of a dead event %p", event);
  int left = atomic_load(&ev->polls);
  if (left > 0) {
    atomic_store(&ev->polls, left - 1);
    return 0;
  }
  if (ev->err != 0)
    return ev->err;
  return ev->positive ? 7 : 1;
}

static int ue_synchronize(void *ctx, void *event) {
  uevent_t *ev = event;
  (void)ctx;
  CHECK(ev != NULL && ev->magic == UEV_LIVE, "synchronize of a dead event %p",
        event);
  if (ev->err != 0)
    return ev->err;
  return ev->positive ? 3 : 0;
}

static void ue_release(void *ctx, void *event) {
  uevents_t *ue = ctx;
  uevent_t *ev = event;
  CHECK(ev != NULL && ev->magic == UEV_LIVE, "release of a dead event %p",
        event);
  ev->magic = UEV_DEAD;
  free(ev);
  atomic_fetch_sub(&ue->live, 1);
}

/* ---- Hooks for pinpool_create_ex ---------------------------------------- */

enum { BK_HOST, BK_MALLOC, BK_USER, BK_USER_LOCKED };
enum { EV_NONE, EV_SIM, EV_USER, EV_USER_QUIET /* no on_error */ };

typedef struct hookset {
  ubackend_t *ub; /* NULL: the config's backend */
  uevents_t *ue;  /* NULL: the config's events */
  pinpool_backend_t bt;
  pinpool_events_t et;
  pinpool_hooks_t h;
  _Atomic uint64_t on_error_calls;
} hookset_t;

static void fz_on_error(void *arg, int err, const char *msg, void *block) {
  hookset_t *hs = arg;
  CHECK(err < 0, "on_error with code %d", err);
  CHECK(msg != NULL, "on_error without a message");
  CHECK(block != NULL && (uintptr_t)block % 64 == 0, "on_error with block %p",
        block);
  atomic_fetch_add(&hs->on_error_calls, 1);
}

static hookset_t *hookset_new(int backend, int events, uint64_t cap) {
  bool ub = backend == BK_USER || backend == BK_USER_LOCKED;
  bool ue = events == EV_USER || events == EV_USER_QUIET;
  if (!ub && !ue)
    return NULL;
  hookset_t *hs = calloc(1, sizeof *hs);
  CHECK(hs != NULL, "out of memory");
  if (ub) {
    hs->ub = calloc(1, sizeof *hs->ub);
    CHECK(hs->ub != NULL, "out of memory");
    (void)pthread_mutex_init(&hs->ub->lock, NULL);
    hs->ub->cap = cap;
    /* name NULL: the library must name it itself */
    hs->bt = (pinpool_backend_t){backend == BK_USER ? "fuzz-backend" : NULL,
                                 ub_alloc, ub_free, hs->ub,
                                 backend == BK_USER_LOCKED};
    hs->h.backend = &hs->bt;
  }
  if (ue) {
    hs->ue = calloc(1, sizeof *hs->ue);
    CHECK(hs->ue != NULL, "out of memory");
    hs->et = (pinpool_events_t){events == EV_USER ? "fuzz-events" : NULL,
                                ue_record,
                                ue_query,
                                ue_synchronize,
                                ue_release,
                                hs->ue};
    hs->h.events = &hs->et;
    if (events == EV_USER) {
      hs->h.on_error = fz_on_error;
      hs->h.error_arg = hs;
    }
  }
  return hs;
}

/* After pinpool_destroy: the backend has every range back and the provider
 * every event (nothing is lost, invariant 6). */
static void hookset_check_idle(hookset_t *hs, const char *what) {
  if (hs == NULL)
    return;
  if (hs->ub != NULL) {
    pthread_mutex_lock(&hs->ub->lock);
    unsigned n = hs->ub->n;
    uint64_t bytes = hs->ub->outstanding;
    pthread_mutex_unlock(&hs->ub->lock);
    CHECK(n == 0 && bytes == 0,
          "%s: after destroy the backend still has %u ranges (%llu bytes) "
          "out",
          what, n, (unsigned long long)bytes);
  }
  if (hs->ue != NULL)
    CHECK(atomic_load(&hs->ue->live) == 0,
          "%s: after destroy %ld events were never released", what,
          atomic_load(&hs->ue->live));
}

static void hookset_free(hookset_t *hs) {
  if (hs == NULL)
    return;
  if (hs->ub != NULL) {
    (void)pthread_mutex_destroy(&hs->ub->lock);
    free(hs->ub);
  }
  free(hs->ue);
  free(hs);
}

/* variant: use pinpool_create_ex even without hooks, or
 * pinpool_create_with_backend when only a backend is hooked. */
static int create_pool(const char *config, hookset_t *hs, bool variant,
                       pinpool_t **out) {
  if (hs == NULL)
    return variant ? pinpool_create_ex(config, NULL, out)
                   : pinpool_create(config, out);
  if (variant && hs->ue == NULL)
    return pinpool_create_with_backend(config, &hs->bt, out);
  return pinpool_create_ex(config, &hs->h, out);
}

/* ---- The model of the blocks a thread holds ------------------------------ */

typedef struct blk {
  uintptr_t p;
  size_t req, bs;
  uint32_t tag; /* cookie seed */
} blk_t;

typedef struct model {
  blk_t live[MAX_LIVE];
  unsigned nlive;
  struct {
    uintptr_t p;
    size_t bs;
  } dead[MAX_DEAD];
  unsigned ndead, dnext;
  uint64_t doomed_blocks, doomed_bytes; /* PENDING forever */
  uint32_t next_tag;
} model_t;

static size_t cookie_len(size_t req) { return req < 32 ? req : 16; }

static uint8_t cookie_byte(uint32_t tag, size_t i) {
  return (uint8_t)(tag * 151u + (unsigned)i * 7u + 1u);
}

/* The cookie covers the first and the last 16 bytes of the request (the
 * whole request when it is shorter than 32 bytes). */
static void cookie_write(const blk_t *b) {
  uint8_t *p = (uint8_t *)b->p;
  size_t n = cookie_len(b->req);
  for (size_t i = 0; i < n; i++)
    p[i] = cookie_byte(b->tag, i);
  for (size_t i = b->req - n; i < b->req; i++)
    p[i] = cookie_byte(b->tag, i);
}

static void cookie_check(const blk_t *b) {
  const uint8_t *p = (const uint8_t *)b->p;
  size_t n = cookie_len(b->req);
  for (int half = 0; half < 2; half++) {
    for (size_t i = half ? b->req - n : 0; i < (half ? b->req : n); i++)
      CHECK(p[i] == cookie_byte(b->tag, i),
            "block %#lx (%zu bytes requested): byte %zu changed while it "
            "was allocated (handed out twice, or metadata in user memory?)",
            (unsigned long)b->p, b->req, i);
  }
}

static int live_start(const model_t *m, uintptr_t p) {
  for (unsigned i = 0; i < m->nlive; i++)
    if (m->live[i].p == p)
      return (int)i;
  return -1;
}

static int live_inside(const model_t *m, uintptr_t p) {
  for (unsigned i = 0; i < m->nlive; i++)
    if (p > m->live[i].p && p - m->live[i].p < m->live[i].bs)
      return (int)i;
  return -1;
}

static void check_no_overlap(const model_t *m, uintptr_t p, size_t bs,
                             const char *what) {
  for (unsigned i = 0; i < m->nlive; i++) {
    const blk_t *l = &m->live[i];
    CHECK(p + bs <= l->p || l->p + l->bs <= p,
          "%s: block %#lx+%zu overlaps the live block %#lx+%zu", what,
          (unsigned long)p, bs, (unsigned long)l->p, l->bs);
  }
}

static void dead_push(model_t *m, uintptr_t p, size_t bs) {
  m->dead[m->dnext].p = p;
  m->dead[m->dnext].bs = bs;
  m->dnext = (m->dnext + 1) % MAX_DEAD;
  if (m->ndead < MAX_DEAD)
    m->ndead++;
}

static void live_drop(model_t *m, unsigned i) {
  dead_push(m, m->live[i].p, m->live[i].bs);
  m->live[i] = m->live[--m->nlive];
}

/* ---- Pools under test ---------------------------------------------------- */

typedef struct fpool {
  const char *name;
  pinpool_t *pool;
  char config[256];
  int backend, events;
  bool mlock;
  bool tainted; /* created while backend faults were armed */
  uint64_t max_reserved, max_cached, reserve;
  bool variant; /* create_pool variant */
  hookset_t *hs;
  _Atomic uint64_t sim_fn_submitted, sim_fn_ran;
  model_t m; /* the main thread's blocks */
} fpool_t;

typedef struct fuzz {
  fpool_t a, b;
  bool has_b;
} fuzz_t;

/* What one thread is doing. */
typedef struct ctx {
  fuzz_t *fz;
  model_t *m; /* this thread's blocks of pool A */
  bool main;
  bool concurrent; /* another thread may be inside a call on pool A */
  unsigned live_cap;
} ctx_t;

static void sim_fn(void *arg) { atomic_fetch_add((_Atomic uint64_t *)arg, 1); }

static bool fault_armed(const fpool_t *fp) {
  return fp->hs != NULL && fp->hs->ub != NULL &&
         atomic_load(&fp->hs->ub->fail_count) > 0;
}

static void stats_get(pinpool_t *pool, pinpool_stats_t *st) {
  memset(st, 0, sizeof *st);
  int rc = pinpool_get_stats(pool, st);
  CHECK(rc == 0, "pinpool_get_stats returned %d", rc);
}

/* A failed call changes nothing (pinpool.h). peak_slack_bytes is left out:
 * a first call from a thread creates its cache even when it then fails. */
static void stats_same(const pinpool_stats_t *before,
                       const pinpool_stats_t *after, const char *what) {
  pinpool_stats_t x = *before, y = *after;
  x.peak_slack_bytes = y.peak_slack_bytes = 0;
  CHECK(memcmp(&x, &y, sizeof x) == 0, "%s failed but changed the stats", what);
}

static void check_stat(const pinpool_stat_t *s, const char *name) {
  CHECK(s->peak >= s->current, "%s: peak %llu < current %llu", name,
        (unsigned long long)s->peak, (unsigned long long)s->current);
  CHECK(s->current == s->allocated - s->freed,
        "%s: current %llu != allocated %llu - freed %llu", name,
        (unsigned long long)s->current, (unsigned long long)s->allocated,
        (unsigned long long)s->freed);
}

/* Everything that must hold while no other thread uses the pool. */
static void check_pool(fpool_t *fp) {
  const model_t *m = &fp->m;
  prime();
  int rc = pinpool_validate(fp->pool);
  if (rc != 0)
    fz_fail(__FILE__, __LINE__, "pool %s: pinpool_validate returned %d (%s)",
            fp->name, rc, pinpool_last_error());
  pinpool_stats_t st;
  stats_get(fp->pool, &st);
  CHECK(st.reserved_bytes.current ==
            st.block_bytes.current + st.cached_bytes.current + st.pending_bytes,
        "pool %s: identity broken: reserved %llu != blocks %llu + cached "
        "%llu + pending %llu",
        fp->name, (unsigned long long)st.reserved_bytes.current,
        (unsigned long long)st.block_bytes.current,
        (unsigned long long)st.cached_bytes.current,
        (unsigned long long)st.pending_bytes);
  check_stat(&st.requests, "requests");
  check_stat(&st.requested_bytes, "requested_bytes");
  check_stat(&st.blocks, "blocks");
  check_stat(&st.block_bytes, "block_bytes");
  check_stat(&st.reserved_bytes, "reserved_bytes");
  check_stat(&st.cached_bytes, "cached_bytes");
  check_stat(&st.segments, "segments");
  CHECK(st.blocks.current == st.requests.current, "blocks != requests");
  uint64_t bytes = 0, req = 0;
  for (unsigned i = 0; i < m->nlive; i++) {
    bytes += m->live[i].bs;
    req += m->live[i].req;
  }
  CHECK(st.requests.current == m->nlive && st.block_bytes.current == bytes &&
            st.requested_bytes.current == req,
        "pool %s: stats say %llu blocks (%llu bytes, %llu requested), the "
        "model %u (%llu, %llu)",
        fp->name, (unsigned long long)st.requests.current,
        (unsigned long long)st.block_bytes.current,
        (unsigned long long)st.requested_bytes.current, m->nlive,
        (unsigned long long)bytes, (unsigned long long)req);
  CHECK(st.pending_blocks >= m->doomed_blocks &&
            st.pending_bytes >= m->doomed_bytes &&
            (st.pending_blocks == 0) == (st.pending_bytes == 0),
        "pool %s: pending %llu blocks / %llu bytes, %llu / %llu doomed",
        fp->name, (unsigned long long)st.pending_blocks,
        (unsigned long long)st.pending_bytes,
        (unsigned long long)m->doomed_blocks,
        (unsigned long long)m->doomed_bytes);
  CHECK(st.max_reserved == fp->max_reserved &&
            st.max_cached == fp->max_cached && st.reserve_bytes == fp->reserve,
        "pool %s: configured limits not reported", fp->name);
  CHECK(fp->max_reserved == 0 || st.reserved_bytes.current <= fp->max_reserved,
        "pool %s: reserved %llu beyond max_reserved %llu", fp->name,
        (unsigned long long)st.reserved_bytes.current,
        (unsigned long long)fp->max_reserved);
  CHECK(st.reserved_bytes.current >= st.reserve_bytes,
        "pool %s: reserved below the reserve", fp->name);
  /* The arena: free space in chunks is cached memory, in page-multiple
   * extents, the largest no more than all of it; chunks hold the segments
   * and every reserved byte. */
  CHECK(st.chunk_free_bytes <= st.cached_bytes.current &&
            st.chunk_free_bytes % 4096 == 0 &&
            st.largest_free_extent <= st.chunk_free_bytes &&
            st.largest_free_extent % 4096 == 0 &&
            (st.free_extents == 0) == (st.chunk_free_bytes == 0) &&
            st.free_extents * 4096 <= st.chunk_free_bytes &&
            (st.chunk_free_bytes == 0 ||
             st.largest_free_extent * st.free_extents >= st.chunk_free_bytes),
        "pool %s: %llu bytes free in chunks in %llu extents, the largest "
        "%llu, %llu cached",
        fp->name, (unsigned long long)st.chunk_free_bytes,
        (unsigned long long)st.free_extents,
        (unsigned long long)st.largest_free_extent,
        (unsigned long long)st.cached_bytes.current);
  CHECK((st.arena_chunks == 0) == (st.reserved_bytes.current == 0) &&
            (st.segments.current == 0 || st.arena_chunks > 0) &&
            st.reserved_bytes.current >= st.arena_chunks * 4096,
        "pool %s: %llu chunks, %llu segments, %llu bytes reserved", fp->name,
        (unsigned long long)st.arena_chunks,
        (unsigned long long)st.segments.current,
        (unsigned long long)st.reserved_bytes.current);
  if (fp->hs != NULL && fp->hs->ub != NULL) {
    uint64_t out = ub_outstanding(fp->hs->ub);
    CHECK(out == st.reserved_bytes.current,
          "pool %s: the backend has %llu bytes out, reserved_bytes says %llu",
          fp->name, (unsigned long long)out,
          (unsigned long long)st.reserved_bytes.current);
    /* One backend range per arena chunk (the reserve is one). */
    pthread_mutex_lock(&fp->hs->ub->lock);
    unsigned ranges = fp->hs->ub->n;
    pthread_mutex_unlock(&fp->hs->ub->lock);
    CHECK(ranges == st.arena_chunks,
          "pool %s: the backend has %u ranges out, %llu arena chunks", fp->name,
          ranges, (unsigned long long)st.arena_chunks);
    uint64_t locked = fp->backend == BK_USER_LOCKED ? out : 0;
    CHECK(st.locked_bytes == locked, "pool %s: locked_bytes %llu, want %llu",
          fp->name, (unsigned long long)st.locked_bytes,
          (unsigned long long)locked);
  } else {
    CHECK(st.locked_bytes <= st.reserved_bytes.current &&
              (fp->mlock || st.locked_bytes == 0),
          "pool %s: locked_bytes %llu", fp->name,
          (unsigned long long)st.locked_bytes);
  }
  if (fp->hs != NULL && fp->hs->h.on_error != NULL)
    CHECK(st.event_errors == atomic_load(&fp->hs->on_error_calls),
          "pool %s: %llu event errors counted, on_error called %llu times",
          fp->name, (unsigned long long)st.event_errors,
          (unsigned long long)atomic_load(&fp->hs->on_error_calls));
}

static void pool_open(fpool_t *fp) {
  bool armed = fault_armed(fp);
  prime();
  int rc = create_pool(fp->config, fp->hs, fp->variant, &fp->pool);
  EXPECT(rc, S_CREATE, "pinpool_create");
  /* A reserve taken from a failing backend may be unusable for good. */
  fp->tainted = rc == 0 && armed && fp->reserve != 0;
  if (rc != 0 && armed) {
    /* The armed backend fault hit the reserve: disarm and retry. */
    CHECK(rc == PINPOOL_ENOMEM || rc == PINPOOL_EBACKEND,
          "create with a failing backend: %s", code_name(rc));
    atomic_store(&fp->hs->ub->fail_count, 0);
    rc = create_pool(fp->config, fp->hs, fp->variant, &fp->pool);
  }
  CHECK(rc == 0, "pool %s: create(\"%s\") returned %s", fp->name, fp->config,
        code_name(rc));
}

/* Destroy with blocks, pending frees and simulated work still around. */
static void pool_close(fpool_t *fp) {
  pinpool_destroy(fp->pool);
  fp->pool = NULL;
  CHECK(atomic_load(&fp->sim_fn_ran) == atomic_load(&fp->sim_fn_submitted),
        "pool %s: %llu simulated work items ran, %llu were queued", fp->name,
        (unsigned long long)atomic_load(&fp->sim_fn_ran),
        (unsigned long long)atomic_load(&fp->sim_fn_submitted));
  hookset_check_idle(fp->hs, fp->name);
  if (fp->hs != NULL) /* the next pool counts its own errors */
    atomic_store(&fp->hs->on_error_calls, 0);
  /* The blocks are gone with the pool: their pointers are stale now. */
  while (fp->m.nlive > 0)
    live_drop(&fp->m, fp->m.nlive - 1);
  fp->m.doomed_blocks = fp->m.doomed_bytes = 0;
}

/* ---- Operations ------------------------------------------------------------
 */

enum {
  OP_ALLOC,
  OP_ALLOC2,
  OP_FREE,
  OP_FREE2,
  OP_FREE_DEAD,
  OP_FREE_INTERIOR,
  OP_FREE_NEAR,
  OP_FREE_FOREIGN,
  OP_BLOCK_SIZE,
  OP_SIZE_CLASS,
  OP_RECORD,
  OP_RECORD_BAD,
  OP_PROCESS,
  OP_SYNC,
  OP_SIM_SUBMIT,
  OP_EMPTY_CACHE,
  OP_THREAD_FLUSH,
  OP_STATS,
  OP_RESET_PEAK,
  OP_GET_CONFIG,
  OP_NULL_ARGS,
  OP_CONFIG,
  OP_BACKEND_FAULT,
  OP_EVENTS_SCRIPT,
  OP_POOL_B,
  OP_THREADS,
  OP_RECREATE,
  OP_COOKIES,
  OP_BURST,
  OP_BUFFER,
  OP_HISTORY,
  OP_SNAPSHOT,
  OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "alloc",        "alloc",         "free",          "free",
    "free_dead",    "free_interior", "free_near",     "free_foreign",
    "block_size",   "size_class",    "record",        "record_bad",
    "process",      "synchronize",   "sim_submit",    "empty_cache",
    "thread_flush", "stats",         "reset_peak",    "get_config",
    "null_args",    "config",        "backend_fault", "events_script",
    "pool_b",       "threads",       "recreate",      "cookies",
    "burst",        "buffer",        "history",       "snapshot"};

static bool quiet(const ctx_t *cx) { return cx->main && !cx->concurrent; }

/* Free m->live[i] of fp: must succeed. */
static void free_live(const ctx_t *cx, fpool_t *fp, model_t *m, unsigned i) {
  (void)cx;
  blk_t b = m->live[i];
  cookie_check(&b);
  tl_doom = false;
  prime();
  int rc = pinpool_free(fp->pool, (void *)b.p);
  EXPECT_IS(rc, PINPOOL_OK, "pinpool_free(live block)");
  if (tl_doom) {
    m->doomed_blocks++;
    m->doomed_bytes += b.bs;
  }
  tl_doom = false;
  live_drop(m, i);
}

/* Free any pointer p in fp, where m holds every live block of fp (so that
 * an answer can be predicted). exact: the code expected when p is neither
 * a live block nor inside one (0: one of the bad-pointer codes). */
static void free_any(const ctx_t *cx, fpool_t *fp, model_t *m, uintptr_t p,
                     int exact, const char *what) {
  int i = live_start(m, p);
  if (p != 0 && i >= 0) {
    free_live(cx, fp, m, (unsigned)i);
    return;
  }
  int in = live_inside(m, p);
  pinpool_stats_t before, after;
  bool q = quiet(cx);
  if (q)
    stats_get(fp->pool, &before);
  prime();
  int rc = pinpool_free(fp->pool, (void *)p);
  EXPECT(rc, S_FREE, what);
  if (p == 0)
    EXPECT_IS(rc, PINPOOL_EINVAL, what);
  else if (in >= 0)
    EXPECT_IS(rc, PINPOOL_EINTERIOR, what);
  else if (exact != 0)
    EXPECT_IS(rc, exact, what);
  else
    EXPECT(rc, S_BADPTR, what);
  if (q) {
    stats_get(fp->pool, &after);
    stats_same(&before, &after, what);
  }
}

static void block_size_any(const ctx_t *cx, fpool_t *fp, const model_t *m,
                           uintptr_t p, int exact, const char *what) {
  int i = live_start(m, p), in = live_inside(m, p);
  size_t out = 12345;
  prime();
  int rc = pinpool_block_size(fp->pool, (const void *)p, &out);
  EXPECT(rc, S_FREE, what);
  if (p == 0) {
    EXPECT_IS(rc, PINPOOL_EINVAL, what);
  } else if (i >= 0) {
    EXPECT_IS(rc, PINPOOL_OK, what);
    CHECK(out == m->live[i].bs, "%s: %zu, allocated as %zu", what, out,
          m->live[i].bs);
  } else if (in >= 0) {
    EXPECT_IS(rc, PINPOOL_EINTERIOR, what);
  } else if (exact != 0) {
    EXPECT_IS(rc, exact, what);
  } else {
    EXPECT(rc, S_BADPTR, what);
  }
  if (rc != 0)
    CHECK(out == 12345, "%s failed but wrote *out", what);
  (void)cx;
}

static void record_any(const ctx_t *cx, fpool_t *fp, const model_t *m,
                       uintptr_t p, pinpool_stream_t stream, int exact,
                       const char *what) {
  int i = live_start(m, p), in = live_inside(m, p);
  pinpool_stats_t before, after;
  bool q = quiet(cx);
  if (q)
    stats_get(fp->pool, &before);
  prime();
  int rc = pinpool_record_stream(fp->pool, (void *)p, stream);
  EXPECT(rc, S_RECORD, what);
  if (p == 0)
    EXPECT_IS(rc, PINPOOL_EINVAL, what);
  else if (fp->events == EV_NONE)
    EXPECT_IS(rc, PINPOOL_EBUSY, what);
  else if (i >= 0)
    EXPECT(rc, S_OK | BIT(PINPOOL_ENOMEM), what);
  else if (in >= 0)
    EXPECT_IS(rc, PINPOOL_EINTERIOR, what);
  else if (exact != 0)
    EXPECT_IS(rc, exact, what);
  else
    EXPECT(rc, S_BADPTR, what);
  if (q && rc != 0) {
    stats_get(fp->pool, &after);
    stats_same(&before, &after, what);
  }
}

/* A stream for fp: few for simulated streams (each is a thread). */
static pinpool_stream_t pick_stream(const fpool_t *fp, uint8_t k) {
  static const pinpool_stream_t odd[4] = {UINTPTR_MAX, 0xdeadbeef, 42,
                                          (pinpool_stream_t)1 << 63};
  if (fp->events == EV_SIM || k < 192)
    return k % MAX_STREAMS;
  return odd[k % 4];
}

/* A pointer that no pool handed out. *exact: the code it must get. */
static uint8_t foreign_static[256] __attribute__((aligned(4096)));
static uintptr_t guard_region; /* 2 MiB-aligned, mapped, never a segment */

static uintptr_t pick_foreign(const ctx_t *cx, uint8_t k, uintptr_t stack,
                              uintptr_t heap, int *exact) {
  static const uintptr_t small[4] = {1, 64, 4096, 65536};
  fuzz_t *fz = cx->fz;
  *exact = PINPOOL_ENOTOWNED;
  switch (k % 15) {
  case 0:
    return stack;
  case 1:
    return stack + 8;
  case 2:
    return heap;
  case 3:
    return heap + 1;
  case 4:
    return (uintptr_t)foreign_static;
  case 5:
    return (uintptr_t)&fz_fail;
  case 6:
    return small[(k >> 4) % 4];
  case 7:
    return (uintptr_t)1 << 48;
  case 8:
    return UINTPTR_MAX - 63;
  case 9:
    return (uintptr_t)0xffff800000000000u;
  case 10:
    return ((uintptr_t)1 << 47) - 4096;
  case 11:
    return guard_region + ((k >> 4) % 4) * 64 * KIB;
  case 12:
  case 13:
    /* Another pool's live block (the main thread owns pool B). */
    if (cx->main && fz->has_b && fz->b.m.nlive > 0) {
      const blk_t *b = &fz->b.m.live[(k >> 4) % fz->b.m.nlive];
      return b->p + (k % 15 == 13 ? b->bs / 2 : 0);
    }
    return stack;
  default:
    *exact = PINPOOL_EINVAL;
    return 0;
  }
}

/* A pointer near a live block: a neighbour, the next segment, ... */
static uintptr_t near_ptr(const blk_t *b, uint8_t k) {
  intptr_t mult = (intptr_t)(k % 9) - 4;
  if (mult == 0)
    mult = 1;
  intptr_t unit = (k & 0x40) ? (intptr_t)(2 * MIB) : (intptr_t)b->bs;
  uintptr_t p = b->p + (uintptr_t)(mult * unit);
  if (k & 0x80)
    p += b->bs / 2;
  return p;
}

/* The size of the block a request of `size` bytes (class cls, size at
 * most LARGEST_CLASS) gets (docs/allocation-policy.md): its class up to
 * 256 KiB (slabs); above, a large block carved from the arena at exactly
 * the request rounded up to a page. */
static size_t block_size_of(size_t size, size_t cls) {
  return size <= 256 * KIB ? cls : (size + 4095) & ~(size_t)4095;
}

static void op_alloc(const ctx_t *cx, fpool_t *fp, model_t *m, size_t size,
                     unsigned cap) {
  if (m->nlive >= cap)
    free_live(cx, fp, m, 0);
  bool q = quiet(cx);
  pinpool_stats_t before;
  if (q)
    stats_get(fp->pool, &before);
  bool armed = fault_armed(fp);
  size_t bs = 0;
  bool valid = size != 0 && size <= LARGEST_CLASS;
  if (valid) {
    CHECK(pinpool_size_class(size, &bs) == 0, "size_class(%zu)", size);
    bs = block_size_of(size, bs);
  }
  void *out = SENTINEL;
  prime();
  int rc = pinpool_alloc(fp->pool, size, &out);
  EXPECT(rc, S_ALLOC, "pinpool_alloc");
  if (size == 0)
    EXPECT_IS(rc, PINPOOL_EZEROSIZE, "pinpool_alloc(0)");
  else if (size > LARGEST_CLASS)
    EXPECT_IS(rc, PINPOOL_EOVERFLOW, "pinpool_alloc(> 2^60)");
  else if (fp->max_reserved != 0 && bs > fp->max_reserved)
    EXPECT_IS(rc, PINPOOL_ENOMEM, "pinpool_alloc(> max_reserved)");
  if (rc == PINPOOL_EBACKEND && q) /* (another thread may arm faults) */
    CHECK(armed || fp->tainted,
          "pinpool_alloc(%zu): EBACKEND from a sound "
          "backend",
          size);
  if (q && rc != 0 && valid && !armed && !fp->tainted &&
      fp->max_reserved != 0) {
    /* ENOMEM only at the cap: where the cap is in the way a new arena
     * chunk is just what the segment needs, at most max(2 MiB, bs) (a slab
     * is at most 2 MiB). */
    uint64_t need = bs > 2 * MIB ? bs : 2 * MIB;
    CHECK(before.reserved_bytes.current + need > fp->max_reserved,
          "pinpool_alloc(%zu) failed with %s with %llu of %llu bytes "
          "reserved",
          size, code_name(rc),
          (unsigned long long)before.reserved_bytes.current,
          (unsigned long long)fp->max_reserved);
  }
  if (rc != 0) {
    CHECK(out == SENTINEL, "pinpool_alloc failed but wrote *out");
    if (q && rc != PINPOOL_ENOMEM && rc != PINPOOL_EBACKEND) {
      pinpool_stats_t after;
      stats_get(fp->pool, &after);
      stats_same(&before, &after, "pinpool_alloc");
    }
    return;
  }
  uintptr_t p = (uintptr_t)out;
  CHECK(p != 0 && p % 64 == 0, "pinpool_alloc(%zu) = %p: misaligned", size,
        out);
  CHECK(bs % 4096 != 0 || p % 4096 == 0,
        "pinpool_alloc(%zu) = %p: class %zu is not page aligned", size, out,
        bs);
  size_t got = 0;
  CHECK(pinpool_block_size(fp->pool, out, &got) == 0 && got == bs,
        "block_size(%p) = %zu, a request of %zu gets %zu", out, got, size, bs);
  check_no_overlap(m, p, bs, "pinpool_alloc");
  if (cx->main) {
    fuzz_t *fz = cx->fz;
    if (fp == &fz->a && fz->has_b)
      check_no_overlap(&fz->b.m, p, bs, "pinpool_alloc (vs pool B)");
    if (fp == &fz->b)
      check_no_overlap(&fz->a.m, p, bs, "pinpool_alloc (vs pool A)");
  }
  blk_t b = {p, size, bs, m->next_tag++};
  cookie_write(&b);
  m->live[m->nlive++] = b;
}

/* pinpool_size_class: its error codes and the policy (docs/allocation-
 * policy.md): >= size, a multiple of 64, at most 12.5% above, idempotent. */
static void op_size_class(size_t size) {
  size_t c = 777;
  prime();
  int rc = pinpool_size_class(size, &c);
  EXPECT(rc, S_SIZECLASS, "pinpool_size_class");
  if (size == 0) {
    EXPECT_IS(rc, PINPOOL_EZEROSIZE, "pinpool_size_class(0)");
  } else if (size > LARGEST_CLASS) {
    EXPECT_IS(rc, PINPOOL_EOVERFLOW, "pinpool_size_class(> 2^60)");
  } else {
    EXPECT_IS(rc, PINPOOL_OK, "pinpool_size_class");
    CHECK(c >= size && c >= 512 && c % 64 == 0 && c <= LARGEST_CLASS,
          "size_class(%zu) = %zu", size, c);
    CHECK(size <= 512 || c - size < size / 8 + 1,
          "size_class(%zu) = %zu: more than 12.5%% above", size, c);
    size_t c2 = 0;
    CHECK(pinpool_size_class(c, &c2) == 0 && c2 == c,
          "size_class(size_class(%zu)) = %zu != %zu", size, c2, c);
    if (c < LARGEST_CLASS)
      CHECK(pinpool_size_class(c + 1, &c2) == 0 && c2 > c,
            "size_class(%zu + 1) = %zu", c, c2);
  }
  if (rc != 0)
    CHECK(c == 777, "pinpool_size_class failed but wrote *out");
}

static void op_get_config(const ctx_t *cx, fpool_t *fp, uint8_t kind,
                          uint8_t flags, uint8_t extra) {
  size_t needed = 0;
  prime();
  int rc = pinpool_get_config(fp->pool, NULL, 0, &needed);
  EXPECT_IS(rc, PINPOOL_EOVERFLOW, "pinpool_get_config(NULL, 0)");
  CHECK(needed > 1 && needed < 4096, "needed %zu", needed);
  size_t lens[6] = {0, 1, needed - 1, needed, needed + 7, extra};
  size_t len = lens[kind % 6];
  char *buf = len != 0 ? malloc(len) : NULL;
  CHECK(len == 0 || buf != NULL, "out of memory");
  if (len != 0)
    memset(buf, 0xA5, len);
  size_t nd = 777;
  prime();
  rc = pinpool_get_config(fp->pool, buf, len, (flags & 1) ? NULL : &nd);
  EXPECT(rc, S_GETCONFIG, "pinpool_get_config");
  if (len >= needed) {
    EXPECT_IS(rc, PINPOOL_OK, "pinpool_get_config");
    CHECK(strlen(buf) == needed - 1, "config of %zu chars, needed said %zu",
          strlen(buf), needed);
  } else {
    EXPECT_IS(rc, PINPOOL_EOVERFLOW, "pinpool_get_config(short buffer)");
    for (size_t i = 0; i < len; i++)
      CHECK((uint8_t)buf[i] == 0xA5, "get_config failed but wrote the buffer");
  }
  if (!(flags & 1))
    CHECK(nd == needed, "*needed = %zu, want %zu", nd, needed);
  /* Feed the resolved configuration back: the same settings (only while one
   * thread runs: the round trip creates a pool like this one). */
  if (rc == 0 && (flags & 2) && quiet(cx)) {
    hookset_t *hs = hookset_new(fp->backend, fp->events, UB_CAP);
    pinpool_t *p2 = NULL;
    prime();
    int rc2 = create_pool(buf, hs, (flags & 4) != 0, &p2);
    EXPECT_IS(rc2, PINPOOL_OK, "pinpool_create(resolved config)");
    char *buf2 = malloc(needed);
    CHECK(buf2 != NULL, "out of memory");
    CHECK(pinpool_get_config(p2, buf2, needed, NULL) == 0 &&
              strcmp(buf, buf2) == 0,
          "resolved config does not round-trip:\n  %s\n  %s", buf, buf2);
    free(buf2);
    CHECK(pinpool_validate(p2) == 0, "round-trip pool does not validate");
    pinpool_destroy(p2);
    hookset_check_idle(hs, "round-trip pool");
    hookset_free(hs);
  }
  free(buf);
}

/* ---- Configuration strings --------------------------------------------- */

/* Keys by index (a key byte picks one modulo their count: replace, never
 * remove, or every input's configs change). "remap" and "remap_min" were
 * removed with the arenas: they stay to probe the refusal ("was removed");
 * "borrow", removed too, gave its place to "register_max"; the misspelt
 * "max_cahced" (unknown keys are still probed by "SHARDS" and "a b") to
 * "pin_failure". */
static const char *const cfg_keys[] = {
    "backend",      "max_cached",   "max_cached_pct",   "register_max",
    "remap",        "max_reserved", "reserve",          "mlock",
    "hugepages",    "populate",     "populate_threads", "populate_parallel_min",
    "tcache_bytes", "shards",       "events",           "background",
    "poll_us",      "sim_delay_us", "cuda_flags",       "register_threads",
    "device",       "numa_node",    "pin_failure",      "",
    " shards ",     "SHARDS",       "tcache_bytes\t",   "=",
    "a b",          "fault",        "remap_min"};
#define N_CFG_KEYS (sizeof cfg_keys / sizeof cfg_keys[0])

static const char *const cfg_values[] = {
    "0",
    "1",
    "-1",
    "2",
    "64",
    "65",
    "4096",
    "64MiB",
    "1GiB",
    "1T",
    "1TB",
    "7KB",
    "1K",
    "1KiBB",
    "1.5M",
    "0x10",
    " 8 ",
    "18446744073709551615",
    "18446744073709551616",
    "17179869184GiB",
    "16777216TiB",
    "1152921504606846976",
    "1152921504606846977",
    "true",
    "FALSE",
    "yes",
    "off",
    "On",
    "require",
    "REQUIRE",
    "host",
    "malloc",
    "cuda",
    "cuda-register",
    "user",
    "none",
    "simulated",
    "portable",
    "portable+devicemap",
    "devicemap+writecombined+portable",
    "portable+",
    "+portable",
    "pageable",
    "1000000",
    "1000001",
    "10000000",
    "10000001",
    "1024",
    "1025",
    "1023",
    "-2",
    "2147483648",
    "-9223372036854775809",
    "=",
    "==1",
    "",
    "alloc:1",
    "alloc:2:3",
    "record:1",
    "query:1:5",
    "populate:1",
    "mlock:1",
    "bogus:1",
    "alloc:0",
    "alloc:1:0",
    "alloc:",
    "alloc:18446744073709551616",
    "query:1:18446744073709551615",
};
#define N_CFG_VALUES (sizeof cfg_values / sizeof cfg_values[0])

static void cfg_append(char *cfg, size_t cap, size_t *n, const char *s,
                       size_t len) {
  for (size_t i = 0; i < len && s[i] != '\0' && *n + 1 < cap; i++)
    cfg[(*n)++] = s[i];
  cfg[*n] = '\0';
}

/* Items of valid and invalid keys with random values, or raw bytes. */
static void build_config(reader_t *r, bool raw, char *cfg, size_t cap) {
  size_t n = 0;
  cfg[0] = '\0';
  if (raw) {
    size_t len = rd_u8(r) % 48;
    for (size_t i = 0; i < len && n + 1 < cap; i++) {
      char c = (char)rd_u8(r);
      if (c == '\0')
        c = ',';
      cfg[n++] = c;
    }
    cfg[n] = '\0';
    return;
  }
  unsigned items = 1 + rd_u8(r) % 4;
  for (unsigned it = 0; it < items; it++) {
    uint8_t kb = rd_u8(r), vb = rd_u8(r);
    if (it > 0)
      cfg_append(cfg, cap, &n, (kb & 0x80) ? " , " : ",", 3);
    const char *key = cfg_keys[kb % N_CFG_KEYS];
    cfg_append(cfg, cap, &n, key, strlen(key));
    if ((kb & 0x60) != 0x60) /* sometimes no '=' at all */
      cfg_append(cfg, cap, &n, (kb & 0x20) ? " = " : "=", 3);
    if (vb < 224) {
      const char *v = cfg_values[vb % N_CFG_VALUES];
      cfg_append(cfg, cap, &n, v, strlen(v));
    } else {
      char raw_v[16];
      size_t len = vb % 12;
      for (size_t i = 0; i < len; i++)
        raw_v[i] = (char)(rd_u8(r) | 1);
      cfg_append(cfg, cap, &n, raw_v, len);
    }
  }
}

/* Create a pool from a fuzzed configuration, use it a little, round-trip
 * its resolved configuration, destroy it. Host-backed pools get populate,
 * mlock and the reserve pinned to 0 first (a key given twice is an error),
 * so that no configuration can make them touch much memory; user-backed
 * ones take any value, their backend refuses more than 64 MiB. */
static void op_config(const ctx_t *cx, reader_t *r) {
  uint8_t sub = rd_u8(r), sel = rd_u8(r);
  char fuzzed[256], cfg[320];
  build_config(r, sub % 4 == 0, fuzzed, sizeof fuzzed);
  bool user = sub % 4 == 3;
  bool env = sub % 4 == 2 && quiet(cx);
  if (user)
    (void)snprintf(cfg, sizeof cfg, "%s", fuzzed);
  else
    (void)snprintf(cfg, sizeof cfg, "populate=0,mlock=0,reserve=0,%s", fuzzed);
  hookset_t *hs =
      user ? hookset_new(BK_USER, (sel & 1) ? EV_USER : EV_NONE, 64 * MIB)
           : NULL;
  pinpool_t *p = NULL;
  prime();
  int rc;
  if (env) {
    CHECK(setenv("PINPOOL_CONF", cfg, 1) == 0, "setenv");
    rc = pinpool_create(NULL, &p);
    (void)unsetenv("PINPOOL_CONF");
  } else {
    rc = create_pool(cfg, hs, (sel & 2) != 0, &p);
  }
  EXPECT(rc, S_CREATE, "pinpool_create(fuzzed config)");
  CHECK(rc != PINPOOL_EINVAL, "create(\"%s\"): EINVAL", cfg);
  if (rc == PINPOOL_ECONFIG)
    CHECK(strstr(pinpool_last_error(), "config") != NULL,
          "create(\"%s\"): ECONFIG with the message \"%s\"", cfg,
          pinpool_last_error());
  /* Only a removed key is refused as one (remap, remap_min, borrow). */
  if (rc == PINPOOL_ECONFIG &&
      strstr(pinpool_last_error(), "' was removed: large blocks") != NULL)
    CHECK(strstr(cfg, "remap") != NULL || strstr(cfg, "borrow") != NULL,
          "create(\"%s\"): refused as a removed key: \"%s\"", cfg,
          pinpool_last_error());
  if (rc != 0) {
    CHECK(p == NULL, "create failed but wrote *out");
    hookset_check_idle(hs, "pool of a refused config");
    hookset_free(hs);
    return;
  }
  size_t size = 1 + (size_t)(sel >> 2) * 1021;
  void *blk = NULL;
  prime();
  rc = pinpool_alloc(p, size, &blk);
  EXPECT(rc, S_ALLOC, "pinpool_alloc(fuzzed pool)");
  CHECK(rc == 0 || rc == PINPOOL_ENOMEM || rc == PINPOOL_EBACKEND,
        "pinpool_alloc(%zu) in a pool of \"%s\": %s", size, cfg, code_name(rc));
  CHECK(pinpool_validate(p) == 0, "pool of \"%s\" does not validate", cfg);
  if (rc == 0) {
    rc = pinpool_free(p, blk);
    CHECK(rc == 0, "free in a pool of \"%s\": %s", cfg, code_name(rc));
  }
  CHECK(pinpool_empty_cache(p) == 0, "empty_cache");
  CHECK(pinpool_validate(p) == 0, "pool of \"%s\" does not validate", cfg);
  char resolved[1024];
  rc = pinpool_get_config(p, resolved, sizeof resolved, NULL);
  CHECK(rc == 0, "get_config: %s", code_name(rc));
  pinpool_destroy(p);
  hookset_check_idle(hs, "pool of a fuzzed config");
  /* The resolved configuration gives the same pool. */
  p = NULL;
  prime();
  rc = create_pool(resolved, hs, (sel & 2) != 0, &p);
  CHECK(rc == 0, "create(resolved \"%s\") of \"%s\": %s", resolved, cfg,
        code_name(rc));
  char again[1024];
  CHECK(pinpool_get_config(p, again, sizeof again, NULL) == 0 &&
            strcmp(again, resolved) == 0,
        "config does not round-trip:\n  %s\n  %s", resolved, again);
  pinpool_destroy(p);
  hookset_check_idle(hs, "pool of a resolved config");
  hookset_free(hs);
}

/* ---- NULL arguments and odd hooks --------------------------------------- */

static int noop_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  (void)size;
  (void)out;
  return PINPOOL_ENOMEM;
}
static void noop_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)ptr;
  (void)size;
}

static void op_null_args(const ctx_t *cx, fpool_t *fp, uint8_t sub,
                         uint8_t arg) {
  pinpool_t *a = fp->pool;
  const model_t *m = cx->m;
  int local = 0;
  void *some = m->nlive > 0 ? (void *)m->live[arg % m->nlive].p : &local;
  void *out = SENTINEL;
  size_t sz = 99;
  pinpool_t *np = SENTINEL;
  switch (sub % 20) {
  case 0:
    prime();
    EXPECT_IS(pinpool_alloc(NULL, 64, &out), PINPOOL_EINVAL,
              "pinpool_alloc(NULL pool)");
    CHECK(out == SENTINEL, "alloc failed but wrote *out");
    break;
  case 1:
    prime();
    EXPECT_IS(pinpool_alloc(a, 64, NULL), PINPOOL_EINVAL,
              "pinpool_alloc(NULL out)");
    break;
  case 2:
    prime();
    EXPECT_IS(pinpool_free(NULL, some), PINPOOL_EINVAL,
              "pinpool_free(NULL pool)");
    break;
  case 3:
    prime();
    EXPECT_IS(pinpool_free(a, NULL), PINPOOL_EINVAL, "pinpool_free(NULL)");
    break;
  case 4:
    prime();
    EXPECT_IS(pinpool_block_size(NULL, some, &sz), PINPOOL_EINVAL,
              "pinpool_block_size(NULL pool)");
    prime();
    EXPECT_IS(pinpool_block_size(a, NULL, &sz), PINPOOL_EINVAL,
              "pinpool_block_size(NULL ptr)");
    prime();
    EXPECT_IS(pinpool_block_size(a, some, NULL), PINPOOL_EINVAL,
              "pinpool_block_size(NULL out)");
    CHECK(sz == 99, "block_size failed but wrote *out");
    break;
  case 5:
    prime();
    EXPECT_IS(pinpool_size_class(64, NULL), PINPOOL_EINVAL,
              "pinpool_size_class(NULL out)");
    break;
  case 6:
    prime();
    EXPECT_IS(pinpool_empty_cache(NULL), PINPOOL_EINVAL,
              "pinpool_empty_cache(NULL)");
    prime();
    EXPECT_IS(pinpool_thread_flush(NULL), PINPOOL_EINVAL,
              "pinpool_thread_flush(NULL)");
    prime();
    EXPECT_IS(pinpool_process_events(NULL), PINPOOL_EINVAL,
              "pinpool_process_events(NULL)");
    prime();
    EXPECT_IS(pinpool_synchronize(NULL), PINPOOL_EINVAL,
              "pinpool_synchronize(NULL)");
    prime();
    EXPECT_IS(pinpool_reset_peak_stats(NULL), PINPOOL_EINVAL,
              "pinpool_reset_peak_stats(NULL)");
    break;
  case 7:
    prime();
    EXPECT_IS(pinpool_record_stream(NULL, some, 0), PINPOOL_EINVAL,
              "pinpool_record_stream(NULL pool)");
    prime();
    EXPECT_IS(pinpool_record_stream(a, NULL, 0), PINPOOL_EINVAL,
              "pinpool_record_stream(NULL ptr)");
    break;
  case 8:
    prime();
    EXPECT_IS(pinpool_sim_submit(NULL, 0, 0, NULL, NULL), PINPOOL_EINVAL,
              "pinpool_sim_submit(NULL)");
    break;
  case 9: {
    pinpool_stats_t st;
    prime_with(1);
    EXPECT_IS(pinpool_get_stats(NULL, &st), PINPOOL_EINVAL,
              "pinpool_get_stats(NULL pool)");
    prime_with(1);
    EXPECT_IS(pinpool_get_stats(a, NULL), PINPOOL_EINVAL,
              "pinpool_get_stats(NULL out)");
    break;
  }
  case 10:
    prime();
    EXPECT_IS(pinpool_validate(NULL), PINPOOL_EINVAL, "pinpool_validate(NULL)");
    break;
  case 11: {
    char buf[16];
    prime();
    EXPECT_IS(pinpool_get_config(NULL, buf, sizeof buf, &sz), PINPOOL_EINVAL,
              "pinpool_get_config(NULL pool)");
    prime();
    EXPECT_IS(pinpool_get_config(a, NULL, 5, &sz), PINPOOL_EINVAL,
              "pinpool_get_config(NULL buf, 5)");
    break;
  }
  case 12: {
    pinpool_backend_t bt = {"b", noop_alloc, noop_free, NULL, 0};
    pinpool_hooks_t h = {&bt, NULL, NULL, NULL};
    prime();
    EXPECT_IS(pinpool_create("populate=0", NULL), PINPOOL_EINVAL,
              "pinpool_create(NULL out)");
    prime();
    EXPECT_IS(pinpool_create_with_backend("populate=0", NULL, &np),
              PINPOOL_EINVAL, "pinpool_create_with_backend(NULL backend)");
    prime();
    EXPECT_IS(pinpool_create_ex("populate=0", &h, NULL), PINPOOL_EINVAL,
              "pinpool_create_ex(NULL out)");
    CHECK(np == SENTINEL, "create failed but wrote *out");
    break;
  }
  case 13: {
    pinpool_backend_t bt = {"half", (arg & 1) ? noop_alloc : NULL,
                            (arg & 1) ? NULL : noop_free, NULL, 0};
    pinpool_hooks_t h = {&bt, NULL, NULL, NULL};
    prime();
    EXPECT_IS(pinpool_create_ex("", &h, &np), PINPOOL_EINVAL,
              "pinpool_create_ex(backend without alloc or free)");
    prime();
    EXPECT_IS(pinpool_create_with_backend("", &bt, &np), PINPOOL_EINVAL,
              "pinpool_create_with_backend(backend without alloc or free)");
    CHECK(np == SENTINEL, "create failed but wrote *out");
    break;
  }
  case 14: {
    uevents_t ue;
    memset(&ue, 0, sizeof ue);
    pinpool_events_t et = {"half",         ue_record,  ue_query,
                           ue_synchronize, ue_release, &ue};
    switch (arg % 4) {
    case 0:
      et.record = NULL;
      break;
    case 1:
      et.query = NULL;
      break;
    case 2:
      et.synchronize = NULL;
      break;
    default:
      et.release = NULL;
      break;
    }
    pinpool_hooks_t h = {NULL, &et, NULL, NULL};
    prime();
    EXPECT_IS(pinpool_create_ex("", &h, &np), PINPOOL_EINVAL,
              "pinpool_create_ex(event provider missing a function)");
    CHECK(np == SENTINEL, "create failed but wrote *out");
    break;
  }
  case 15: {
    /* Hooks whose members are all NULL: as if none were given. */
    pinpool_hooks_t h = {NULL, NULL, (arg & 1) ? fz_on_error : NULL, NULL};
    prime();
    int rc = pinpool_create_ex("populate=0,tcache_bytes=4096", &h, &np);
    EXPECT_IS(rc, PINPOOL_OK, "pinpool_create_ex(empty hooks)");
    char buf[1024];
    CHECK(pinpool_get_config(np, buf, sizeof buf, NULL) == 0 &&
              strstr(buf, "backend=host") != NULL,
          "empty hooks: config %s", buf);
    void *blk = NULL;
    CHECK(pinpool_alloc(np, 1 + arg, &blk) == 0 && pinpool_free(np, blk) == 0,
          "alloc/free in a pool with empty hooks");
    CHECK(pinpool_validate(np) == 0, "validate");
    pinpool_destroy(np);
    break;
  }
  case 16: {
    /* Keys that a hook replaces are refused. */
    hookset_t *hs = hookset_new(BK_USER, EV_USER, 64 * MIB);
    static const char *const refused[3] = {"backend=host", "events=none",
                                           "populate=0,backend=malloc"};
    prime();
    EXPECT_IS(pinpool_create_ex(refused[arg % 3], &hs->h, &np), PINPOOL_ECONFIG,
              "pinpool_create_ex(key of a hook)");
    prime();
    EXPECT_IS(pinpool_create_with_backend("backend=malloc", &hs->bt, &np),
              PINPOOL_ECONFIG, "pinpool_create_with_backend(backend key)");
    CHECK(np == SENTINEL, "create failed but wrote *out");
    hookset_check_idle(hs, "refused hooks");
    hookset_free(hs);
    break;
  }
  case 17: {
    pinpool_destroy(NULL);
    static const int codes[] = {0,   -1, -2,      -3,      -4,  -5,  -6,
                                -7,  -8, -9,      -10,     -11, -12, -13,
                                -14, 1,  INT_MIN, INT_MAX, -99, 42,  -1234};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
      const char *s = pinpool_strerror(codes[i]);
      CHECK(s != NULL && s[0] != '\0', "strerror(%d)", codes[i]);
    }
    CHECK(strcmp(pinpool_version(), PINPOOL_VERSION_STRING) == 0, "version %s",
          pinpool_version());
    break;
  }
  case 18:
  case 19: {
    /* A user backend that fails at create (the reserve) with every kind of
     * bad answer: the create fails cleanly, nothing is leaked. */
    hookset_t *hs =
        hookset_new(BK_USER, (arg & 8) ? EV_USER : EV_NONE, 64 * MIB);
    atomic_store(&hs->ub->fail_mode, arg % UB_FAIL_MODES);
    atomic_store(&hs->ub->fail_count, 1 + (arg >> 4) % 3);
    prime();
    int rc = pinpool_create_ex("reserve=1MiB,max_reserved=8MiB", &hs->h, &np);
    EXPECT(rc, S_CREATE, "pinpool_create_ex(failing backend)");
    if (rc == 0) {
      /* The reserve came from a misbehaving backend and was accepted:
       * the pool must still be consistent and refuse or serve cleanly. */
      void *blk = SENTINEL;
      prime();
      int rc2 = pinpool_alloc(np, 4096, &blk);
      EXPECT(rc2, S_ALLOC, "pinpool_alloc(pool with a bad reserve)");
      CHECK(pinpool_validate(np) == 0, "validate");
      if (rc2 == 0)
        CHECK(pinpool_free(np, blk) == 0, "free");
      pinpool_destroy(np);
    } else {
      CHECK(rc == PINPOOL_ENOMEM || rc == PINPOOL_EBACKEND,
            "create with a failing backend: %s", code_name(rc));
      CHECK(np == SENTINEL, "create failed but wrote *out");
    }
    hookset_check_idle(hs, "failing backend at create");
    hookset_free(hs);
    break;
  }
  default:
    break;
  }
}

/* ---- Pool B and the second thread ---------------------------------------- */

static void op_pool_b(const ctx_t *cx, reader_t *r) {
  uint8_t sub = rd_u8(r), arg = rd_u8(r);
  uint16_t v = rd_u16(r);
  fuzz_t *fz = cx->fz;
  if (!cx->main || !fz->has_b)
    return;
  fpool_t *a = &fz->a, *b = &fz->b;
  model_t *am = cx->m, *bm = &b->m;
  ctx_t bcx = *cx;
  bcx.m = bm;
  switch (sub % 8) {
  case 0:
    op_alloc(&bcx, b, bm, 1 + v % (64 * KIB), MAX_LIVE);
    break;
  case 1:
    if (bm->nlive > 0)
      free_live(&bcx, b, bm, arg % bm->nlive);
    break;
  case 2: /* B's block freed in A */
    if (bm->nlive > 0)
      free_any(cx, a, am, bm->live[arg % bm->nlive].p, PINPOOL_ENOTOWNED,
               "pinpool_free(A, block of B)");
    break;
  case 3: /* A's block freed in B */
    if (am->nlive > 0)
      free_any(&bcx, b, bm, am->live[arg % am->nlive].p, PINPOOL_ENOTOWNED,
               "pinpool_free(B, block of A)");
    break;
  case 4:
    if (am->nlive > 0)
      block_size_any(&bcx, b, bm, am->live[arg % am->nlive].p,
                     PINPOOL_ENOTOWNED, "pinpool_block_size(B, block of A)");
    break;
  case 5:
    if (am->nlive > 0)
      record_any(&bcx, b, bm, am->live[arg % am->nlive].p, arg,
                 PINPOOL_ENOTOWNED, "pinpool_record_stream(B, block of A)");
    break;
  case 6:
    prime();
    EXPECT_IS(pinpool_empty_cache(b->pool), PINPOOL_OK, "empty_cache(B)");
    break;
  default: /* B's stale pointers: only the main thread uses B */
    if (bm->ndead > 0)
      free_any(&bcx, b, bm, bm->dead[arg % bm->ndead].p, 0,
               "pinpool_free(B, stale)");
    break;
  }
}

static void run_op(const ctx_t *cx, reader_t *r);

typedef struct t2 {
  fuzz_t *fz;
  reader_t r;
  model_t m;
  pthread_barrier_t start; /* both threads begin their ops together */
  bool threaded;
} t2_t;

static void *t2_main(void *arg) {
  t2_t *t = arg;
  ctx_t cx = {t->fz, &t->m, false, t->threaded, T2_LIVE};
  if (t->threaded)
    (void)pthread_barrier_wait(&t->start);
  for (unsigned i = 0; i < MAX_OPS && t->r.n > 0; i++)
    run_op(&cx, &t->r);
  return NULL;
}

/* A second thread runs the next `len` bytes as its own op stream on pool A,
 * with blocks handed over from the main thread, while the main thread runs
 * its next `mops` ops; then the join, the merge and the full checks. */
static void op_threads(const ctx_t *cx, reader_t *r) {
  uint8_t len = rd_u8(r), mops = rd_u8(r), hand = rd_u8(r);
  if (!quiet(cx))
    return;
  fuzz_t *fz = cx->fz;
  model_t *am = cx->m;
  t2_t *t = calloc(1, sizeof *t);
  CHECK(t != NULL, "out of memory");
  t->fz = fz;
  size_t n = 1 + len % 96u;
  if (n > r->n)
    n = r->n;
  t->r = (reader_t){r->p, n};
  r->p += n;
  r->n -= n;
  t->m.next_tag = 0x80000000u;
  for (unsigned h = hand % 8; h > 0 && am->nlive > 0; h--) {
    t->m.live[t->m.nlive++] = am->live[am->nlive - 1];
    am->nlive--;
  }
  pthread_t tid;
  CHECK(pthread_barrier_init(&t->start, NULL, 2) == 0, "barrier");
  t->threaded = true;
  if (pthread_create(&tid, NULL, t2_main, t) != 0) {
    t->threaded = false;
    (void)t2_main(t); /* no thread: run it first, then ours */
  }
  ctx_t mine = *cx;
  mine.concurrent = t->threaded;
  if (t->threaded)
    (void)pthread_barrier_wait(&t->start);
  for (unsigned i = 0; i < 1u + mops % 24u && r->n > 0; i++)
    run_op(&mine, r);
  if (t->threaded)
    CHECK(pthread_join(tid, NULL) == 0, "join");
  (void)pthread_barrier_destroy(&t->start);
  /* The second thread has exited (its cache flushed): take its blocks. */
  while (am->nlive + t->m.nlive > MAX_LIVE)
    free_live(cx, &fz->a, am, 0);
  for (unsigned i = 0; i < t->m.nlive; i++) {
    cookie_check(&t->m.live[i]);
    check_no_overlap(am, t->m.live[i].p, t->m.live[i].bs,
                     "blocks of two threads");
    am->live[am->nlive++] = t->m.live[i];
  }
  for (unsigned i = 0; i < t->m.ndead; i++)
    dead_push(am, t->m.dead[i].p, t->m.dead[i].bs);
  am->doomed_blocks += t->m.doomed_blocks;
  am->doomed_bytes += t->m.doomed_bytes;
  free(t);
}

/* ---- Buffers, history, snapshots ---------------------------------------- */

/* One export's descriptor is the buffer's bytes, immutable, and usable:
 * its first and last byte are read (and written unless read-only). */
static void export_check(const pinpool_export_t *e, void *ptr, size_t req,
                         int readonly) {
  CHECK(e->ptr == ptr && e->size == req && e->ndim == 1 &&
            e->shape[0] == (int64_t)req && e->strides[0] == 1 &&
            e->readonly == readonly,
        "export descriptor");
  volatile uint8_t *b = e->ptr;
  uint8_t x = b[0], y = b[req - 1];
  if (!readonly) {
    b[0] = (uint8_t)(x + 1);
    b[req - 1] = y;
  }
}

/* A buffer's whole life in one op: allocated, then up to 16 input-chosen
 * steps (retain, release, export, export release, close, attributes,
 * record_stream, accessors, bad arguments), then whatever is still held is
 * released, in an input-chosen order (exports may outlive the last
 * reference). The block is back in the pool (or pending on a simulated
 * stream) when the op ends, so the model of live blocks is unchanged. */
static void op_buffer(const ctx_t *cx, fpool_t *fp, reader_t *r) {
  size_t size = pick_size(r);
  pinpool_buffer_t *buf = SENTINEL;
  prime();
  int rc = pinpool_buffer_alloc(fp->pool, size, &buf);
  EXPECT(rc, S_ALLOC, "pinpool_buffer_alloc");
  if (rc != 0) {
    CHECK(buf == SENTINEL, "buffer_alloc failed but wrote *out");
    return;
  }
  void *ptr = NULL;
  size_t bs = 0, req = 0;
  EXPECT_IS(pinpool_buffer_ptr(buf, &ptr), PINPOOL_OK, "buffer_ptr");
  EXPECT_IS(pinpool_buffer_size(buf, &bs), PINPOOL_OK, "buffer_size");
  EXPECT_IS(pinpool_buffer_requested_size(buf, &req), PINPOOL_OK,
            "buffer_requested_size");
  CHECK(req == size && bs >= req && ptr != NULL, "buffer accessors");
  int refs = 1;
  bool closed = false;
  const pinpool_export_t *ex[4];
  int nex = 0;
  unsigned steps = rd_u8(r) % 17;
  for (unsigned k = 0; k < steps; k++) {
    uint8_t st = rd_u8(r);
    switch (st % 9) {
    case 0:
      if (refs < 8) {
        EXPECT_IS(pinpool_buffer_retain(buf), PINPOOL_OK, "buffer_retain");
        refs++;
      }
      break;
    case 1:
      if (refs > 1) {
        EXPECT_IS(pinpool_buffer_release(buf), PINPOOL_OK, "buffer_release");
        refs--;
      }
      break;
    case 2: {
      if (nex == 4)
        break;
      unsigned flags = (st & 0x10) ? PINPOOL_EXPORT_READONLY : 0;
      if (st & 0x20)
        flags |= 0x80; /* unknown */
      const pinpool_export_t *e = SENTINEL;
      prime();
      rc = pinpool_buffer_export(buf, flags, &e);
      if (flags & 0x80) {
        EXPECT_IS(rc, PINPOOL_EINVAL, "buffer_export(bad flags)");
      } else if (closed) {
        EXPECT_IS(rc, PINPOOL_EBUSY, "buffer_export(closed)");
      } else {
        EXPECT(rc, S_OK | BIT(PINPOOL_ENOMEM), "buffer_export");
      }
      if (rc != 0) {
        CHECK(e == SENTINEL, "buffer_export failed but wrote *out");
        break;
      }
      export_check(e, ptr, req, (flags & PINPOOL_EXPORT_READONLY) != 0);
      ex[nex++] = e;
      break;
    }
    case 3:
      if (nex > 0) {
        int i = (st >> 4) % nex;
        EXPECT_IS(pinpool_export_release(ex[i]), PINPOOL_OK, "export_release");
        ex[i] = ex[--nex];
      }
      break;
    case 4:
      EXPECT_IS(pinpool_buffer_close(buf), PINPOOL_OK, "buffer_close");
      closed = true;
      break;
    case 5: {
      pinpool_mem_attrs_t at;
      prime();
      rc = pinpool_buffer_attrs(buf, &at);
      EXPECT(rc, S_OK | BIT(PINPOOL_EBUSY) | BIT(PINPOOL_EBACKEND),
             "buffer_attrs");
      if (rc == PINPOOL_EBUSY)
        CHECK(closed, "buffer_attrs: EBUSY on an open buffer");
      if (rc == 0)
        CHECK(at.host_accessible == 1 && at.backend != NULL,
              "buffer_attrs values");
      break;
    }
    case 6: {
      pinpool_stream_t stream = (pinpool_stream_t)((st >> 4) % MAX_STREAMS);
      if (fp->events != EV_SIM && fp->events != EV_NONE)
        break; /* user events may fail by script: covered elsewhere */
      prime();
      rc = pinpool_buffer_record_stream(buf, stream);
      if (closed || fp->events == EV_NONE)
        EXPECT_IS(rc, PINPOOL_EBUSY, "buffer_record_stream");
      else
        EXPECT(rc, S_OK | BIT(PINPOOL_ENOMEM), "buffer_record_stream");
      break;
    }
    case 7: {
      pinpool_t *pl = NULL;
      size_t n = 99;
      int c = -1;
      EXPECT_IS(pinpool_buffer_pool(buf, &pl), PINPOOL_OK, "buffer_pool");
      EXPECT_IS(pinpool_buffer_exports(buf, &n), PINPOOL_OK, "buffer_exports");
      EXPECT_IS(pinpool_buffer_closed(buf, &c), PINPOOL_OK, "buffer_closed");
      CHECK(pl == fp->pool, "buffer_pool");
      CHECK(c == (int)closed, "buffer_closed says %d", c);
      if (!cx->concurrent)
        CHECK(n == (size_t)nex, "buffer_exports: %zu, %d held", n, nex);
      break;
    }
    default: {
      const pinpool_export_t *e = SENTINEL;
      pinpool_mem_attrs_t at;
      size_t n = 7;
      void *pp = SENTINEL;
      int c = 5;
      prime();
      switch ((st >> 4) % 8) {
      case 0:
        EXPECT_IS(pinpool_buffer_retain(NULL), PINPOOL_EINVAL, "retain(NULL)");
        break;
      case 1:
        EXPECT_IS(pinpool_buffer_release(NULL), PINPOOL_EINVAL,
                  "release(NULL)");
        break;
      case 2:
        EXPECT_IS(pinpool_buffer_close(NULL), PINPOOL_EINVAL, "close(NULL)");
        break;
      case 3:
        EXPECT_IS(pinpool_buffer_export(NULL, 0, &e), PINPOOL_EINVAL,
                  "export(NULL)");
        EXPECT_IS(pinpool_buffer_export(buf, 0, NULL), PINPOOL_EINVAL,
                  "export(NULL out)");
        break;
      case 4:
        EXPECT_IS(pinpool_export_release(NULL), PINPOOL_EINVAL,
                  "export_release(NULL)");
        break;
      case 5:
        EXPECT_IS(pinpool_buffer_attrs(NULL, &at), PINPOOL_EINVAL,
                  "attrs(NULL)");
        EXPECT_IS(pinpool_buffer_attrs(buf, NULL), PINPOOL_EINVAL,
                  "attrs(NULL out)");
        break;
      case 6:
        EXPECT_IS(pinpool_buffer_ptr(NULL, &pp), PINPOOL_EINVAL, "ptr(NULL)");
        EXPECT_IS(pinpool_buffer_size(buf, NULL), PINPOOL_EINVAL,
                  "size(NULL out)");
        EXPECT_IS(pinpool_buffer_exports(NULL, &n), PINPOOL_EINVAL,
                  "exports(NULL)");
        EXPECT_IS(pinpool_buffer_closed(buf, NULL), PINPOOL_EINVAL,
                  "closed(NULL out)");
        break;
      default:
        EXPECT_IS(pinpool_buffer_record_stream(NULL, 1), PINPOOL_EINVAL,
                  "record_stream(NULL)");
        EXPECT_IS(pinpool_buffer_alloc(NULL, 64, (pinpool_buffer_t **)&pp),
                  PINPOOL_EINVAL, "buffer_alloc(NULL pool)");
        break;
      }
      CHECK(e == SENTINEL && n == 7 && pp == SENTINEL && c == 5,
            "a refused buffer call wrote an output");
      break;
    }
    }
  }
  /* The end: references first (the exports then keep the memory alive,
   * and are checked once more), or exports first. */
  if (rd_u8(r) & 1) {
    while (refs > 0) {
      EXPECT_IS(pinpool_buffer_release(buf), PINPOOL_OK, "buffer_release");
      refs--;
    }
    for (int i = 0; i < nex; i++)
      export_check(ex[i], ptr, req, ex[i]->readonly);
  }
  while (nex > 0)
    EXPECT_IS(pinpool_export_release(ex[--nex]), PINPOOL_OK, "export_release");
  while (refs > 0) {
    EXPECT_IS(pinpool_buffer_release(buf), PINPOOL_OK, "buffer_release");
    refs--;
  }
}

/* pinpool_record_history with input-chosen options, bad ones included:
 * out of range is EINVAL. */
static void op_history(fpool_t *fp, reader_t *r) {
  static const size_t entries[8] = {
      0, 1, 7, 100, 1000, 4096, (size_t)1 << 20, ((size_t)1 << 26) + 1};
  uint8_t a = rd_u8(r), b = rd_u8(r);
  pinpool_history_options_t o = {(int)(a % 6) - 1, entries[(a >> 3) % 8],
                                 b % 70u, (b & 0x80) != 0};
  bool bad = o.record < 0 || o.record > 3 || o.stack_depth > 64 ||
             o.max_entries > ((size_t)1 << 26);
  prime();
  int rc = pinpool_record_history(fp->pool, (a & 0x40) && !bad ? NULL : &o);
  if (bad)
    EXPECT_IS(rc, PINPOOL_EINVAL, "pinpool_record_history(bad options)");
  else
    EXPECT(rc, S_OK | BIT(PINPOOL_ENOMEM), "pinpool_record_history");
  if (a & 0x80) {
    prime();
    EXPECT_IS(pinpool_record_history(NULL, &o), PINPOOL_EINVAL,
              "pinpool_record_history(NULL)");
  }
}

/* A snapshot in memory: it must pass every structural check, and in a
 * quiet pool its totals must equal the stats. */
static void op_snapshot(const ctx_t *cx, fpool_t *fp, reader_t *r) {
  uint8_t f = rd_u8(r);
  /* Mostly without symbols: libdw costs milliseconds per snapshot. */
  unsigned flags = (f & 3) == 0 ? 0 : PINPOOL_SNAPSHOT_NO_SYMBOLS;
  if (f & 4)
    flags |= PINPOOL_SNAPSHOT_NO_HISTORY;
  if ((f & 0xf8) == 0x80)
    flags |= 0x40; /* unknown */
  bool q = quiet(cx);
  pinpool_stats_t st;
  if (q)
    stats_get(fp->pool, &st);
  char *text = SENTINEL;
  size_t len = 0;
  prime();
  int rc = pinpool_snapshot_write_mem(fp->pool, &text, &len, flags);
  if (flags & 0x40) {
    EXPECT_IS(rc, PINPOOL_EINVAL, "pinpool_snapshot_write_mem(bad flags)");
    CHECK(text == SENTINEL, "a refused snapshot wrote *out");
    return;
  }
  EXPECT(rc, S_OK | BIT(PINPOOL_ENOMEM), "pinpool_snapshot_write_mem");
  if (rc != 0)
    return;
  snapcheck_t c;
  char why[256];
  CHECK(snapcheck(text, len, &c, why, sizeof why) == 0, "snapshot: %s", why);
  if (q)
    CHECK(c.allocated == st.blocks.current &&
              c.allocated_bytes == st.block_bytes.current &&
              c.requested_bytes == st.requested_bytes.current &&
              c.pending_bytes == st.pending_bytes &&
              c.reserved_bytes == st.reserved_bytes.current &&
              c.cached_bytes == st.cached_bytes.current,
          "snapshot totals disagree with the stats of a quiet pool");
  pinpool_snapshot_free(text);
}

/* ---- The interpreter -------------------------------------------------------
 */

static void run_op(const ctx_t *cx, reader_t *r) {
  fuzz_t *fz = cx->fz;
  fpool_t *a = &fz->a;
  model_t *m = cx->m;
  bool q = quiet(cx);
  int local[4] = {0, 0, 0, 0};
  uint8_t op = rd_u8(r) % OP_COUNT;
  if (trace_on())
    (void)fprintf(stderr, "[%s%s] op %s (live %u)\n",
                  cx->main ? "main" : "thread 2",
                  cx->concurrent ? ", concurrent" : "", op_names[op], m->nlive);
  switch (op) {
  case OP_ALLOC:
  case OP_ALLOC2:
    op_alloc(cx, a, m, pick_size(r), cx->live_cap);
    break;
  case OP_FREE:
  case OP_FREE2: {
    uint8_t i = rd_u8(r);
    if (m->nlive > 0)
      free_live(cx, a, m, i % m->nlive);
    break;
  }
  case OP_FREE_DEAD: { /* double free, or a stale pointer's interior */
    uint8_t i = rd_u8(r), off = rd_u8(r);
    if (!q || m->ndead == 0) /* could hit another thread's new block */
      break;
    uintptr_t p = m->dead[i % m->ndead].p;
    if (off != 0)
      p += (uintptr_t)off * 64 % m->dead[i % m->ndead].bs;
    free_any(cx, a, m, p, 0, "pinpool_free(stale pointer)");
    break;
  }
  case OP_FREE_INTERIOR: {
    uint8_t i = rd_u8(r);
    uint32_t off = rd_u32(r);
    if (m->nlive == 0)
      break;
    const blk_t *b = &m->live[i % m->nlive];
    free_any(cx, a, m, b->p + 1 + off % (b->bs - 1), PINPOOL_EINTERIOR,
             "pinpool_free(interior pointer)");
    break;
  }
  case OP_FREE_NEAR: {
    uint8_t i = rd_u8(r), k = rd_u8(r);
    if (!q || m->nlive == 0)
      break;
    free_any(cx, a, m, near_ptr(&m->live[i % m->nlive], k), 0,
             "pinpool_free(pointer near a block)");
    break;
  }
  case OP_FREE_FOREIGN: {
    uint8_t k = rd_u8(r);
    uintptr_t heap_blk = (uintptr_t)malloc(64);
    CHECK(heap_blk != 0, "out of memory");
    int exact = 0;
    uintptr_t p = pick_foreign(cx, k, (uintptr_t)&local[1], heap_blk, &exact);
    free_any(cx, a, m, p, exact, "pinpool_free(foreign pointer)");
    free((void *)heap_blk);
    break;
  }
  case OP_BLOCK_SIZE: {
    uint8_t k = rd_u8(r), i = rd_u8(r);
    uint16_t off = rd_u16(r);
    const blk_t *b = m->nlive > 0 ? &m->live[i % m->nlive] : NULL;
    int exact = 0;
    size_t out = 5;
    switch (k % 8) {
    case 0:
      if (b != NULL)
        block_size_any(cx, a, m, b->p, 0, "pinpool_block_size(live)");
      break;
    case 1:
      if (b != NULL)
        block_size_any(cx, a, m, b->p + 1 + off % (b->bs - 1),
                       PINPOOL_EINTERIOR, "pinpool_block_size(interior)");
      break;
    case 2:
      if (q && m->ndead > 0)
        block_size_any(cx, a, m, m->dead[i % m->ndead].p, 0,
                       "pinpool_block_size(stale)");
      break;
    case 3:
      if (q && b != NULL)
        block_size_any(cx, a, m, near_ptr(b, (uint8_t)off), 0,
                       "pinpool_block_size(near)");
      break;
    case 4: {
      uintptr_t p = pick_foreign(cx, (uint8_t)off, (uintptr_t)&local[2],
                                 (uintptr_t)&local[0], &exact);
      block_size_any(cx, a, m, p, exact, "pinpool_block_size(foreign)");
      break;
    }
    case 5:
      block_size_any(cx, a, m, 0, PINPOOL_EINVAL, "pinpool_block_size(NULL)");
      break;
    case 6:
      prime();
      EXPECT_IS(pinpool_block_size(a->pool, b ? (void *)b->p : local, NULL),
                PINPOOL_EINVAL, "pinpool_block_size(NULL out)");
      break;
    default:
      prime();
      EXPECT_IS(pinpool_block_size(NULL, b ? (void *)b->p : local, &out),
                PINPOOL_EINVAL, "pinpool_block_size(NULL pool)");
      CHECK(out == 5, "block_size failed but wrote *out");
      break;
    }
    break;
  }
  case OP_SIZE_CLASS:
    op_size_class(pick_size(r));
    break;
  case OP_RECORD: {
    uint8_t i = rd_u8(r), s = rd_u8(r), n = rd_u8(r);
    if (m->nlive == 0)
      break;
    const blk_t *b = &m->live[i % m->nlive];
    for (unsigned j = 0; j <= n % 3u; j++)
      record_any(cx, a, m, b->p, pick_stream(a, (uint8_t)(s + j * 37)), 0,
                 "pinpool_record_stream(live)");
    break;
  }
  case OP_RECORD_BAD: {
    uint8_t k = rd_u8(r), i = rd_u8(r), s = rd_u8(r);
    uint16_t off = rd_u16(r);
    const blk_t *b = m->nlive > 0 ? &m->live[i % m->nlive] : NULL;
    pinpool_stream_t st = pick_stream(a, s);
    int exact = 0;
    switch (k % 6) {
    case 0:
      if (b != NULL)
        record_any(cx, a, m, b->p + 1 + off % (b->bs - 1), st,
                   PINPOOL_EINTERIOR, "pinpool_record_stream(interior)");
      break;
    case 1:
      if (q && m->ndead > 0)
        record_any(cx, a, m, m->dead[i % m->ndead].p, st, 0,
                   "pinpool_record_stream(stale)");
      break;
    case 2:
      if (q && b != NULL)
        record_any(cx, a, m, near_ptr(b, (uint8_t)off), st, 0,
                   "pinpool_record_stream(near)");
      break;
    case 3: {
      uintptr_t p = pick_foreign(cx, (uint8_t)off, (uintptr_t)&local[3],
                                 (uintptr_t)&local[0], &exact);
      record_any(cx, a, m, p, st, exact, "pinpool_record_stream(foreign)");
      break;
    }
    case 4:
      record_any(cx, a, m, 0, st, PINPOOL_EINVAL,
                 "pinpool_record_stream(NULL)");
      break;
    default:
      prime();
      EXPECT_IS(pinpool_record_stream(NULL, b ? (void *)b->p : local, st),
                PINPOOL_EINVAL, "pinpool_record_stream(NULL pool)");
      break;
    }
    break;
  }
  case OP_PROCESS:
    prime();
    EXPECT_IS(pinpool_process_events(a->pool), PINPOOL_OK,
              "pinpool_process_events");
    break;
  case OP_SYNC: {
    prime();
    EXPECT_IS(pinpool_synchronize(a->pool), PINPOOL_OK, "pinpool_synchronize");
    if (!q)
      break;
    /* Nothing pending but the blocks whose events failed. */
    pinpool_stats_t st;
    stats_get(a->pool, &st);
    CHECK(st.pending_blocks == m->doomed_blocks &&
              st.pending_bytes == m->doomed_bytes,
          "after synchronize: %llu blocks (%llu bytes) pending, %llu (%llu) "
          "have failed events",
          (unsigned long long)st.pending_blocks,
          (unsigned long long)st.pending_bytes,
          (unsigned long long)m->doomed_blocks,
          (unsigned long long)m->doomed_bytes);
    break;
  }
  case OP_SIM_SUBMIT: {
    uint8_t s = rd_u8(r), flags = rd_u8(r);
    uint64_t ns = (flags & 3) == 3 ? 1u + flags * 4u : 0u;
    bool fn = (flags & 4) != 0;
    /* Count first: the worker may run it before the call returns. */
    if (fn && a->events == EV_SIM)
      atomic_fetch_add(&a->sim_fn_submitted, 1);
    prime();
    int rc = pinpool_sim_submit(a->pool, s % MAX_STREAMS, ns,
                                fn ? sim_fn : NULL, &a->sim_fn_ran);
    EXPECT(rc, S_SIM, "pinpool_sim_submit");
    if (rc != 0 && fn && a->events == EV_SIM)
      atomic_fetch_sub(&a->sim_fn_submitted, 1);
    EXPECT_IS(rc, a->events == EV_SIM ? PINPOOL_OK : PINPOOL_EBUSY,
              "pinpool_sim_submit");
    break;
  }
  case OP_EMPTY_CACHE: {
    prime();
    EXPECT_IS(pinpool_empty_cache(a->pool), PINPOOL_OK, "pinpool_empty_cache");
    if (!q || m->nlive != 0)
      break;
    /* No block allocated, none pending: only the reserve is left. */
    pinpool_stats_t st;
    stats_get(a->pool, &st);
    if (st.pending_blocks != 0)
      break;
    CHECK(st.reserved_bytes.current == a->reserve && st.segments.current == 0,
          "empty_cache with nothing allocated left %llu bytes reserved in "
          "%llu segments (reserve %llu)",
          (unsigned long long)st.reserved_bytes.current,
          (unsigned long long)st.segments.current,
          (unsigned long long)a->reserve);
    break;
  }
  case OP_THREAD_FLUSH:
    prime();
    EXPECT_IS(pinpool_thread_flush(a->pool), PINPOOL_OK,
              "pinpool_thread_flush");
    break;
  case OP_STATS: {
    uint8_t f = rd_u8(r);
    pinpool_stats_t st;
    prime_with(1);
    EXPECT_IS(pinpool_get_stats(a->pool, (f & 1) ? NULL : &st),
              (f & 1) ? PINPOOL_EINVAL : PINPOOL_OK, "pinpool_get_stats");
    break;
  }
  case OP_RESET_PEAK: {
    prime();
    EXPECT_IS(pinpool_reset_peak_stats(a->pool), PINPOOL_OK,
              "pinpool_reset_peak_stats");
    if (!q)
      break;
    pinpool_stats_t st;
    stats_get(a->pool, &st);
    const pinpool_stat_t *s[6] = {&st.requests,     &st.requested_bytes,
                                  &st.block_bytes,  &st.reserved_bytes,
                                  &st.cached_bytes, &st.segments};
    for (int i = 0; i < 6; i++)
      CHECK(s[i]->peak == s[i]->current,
            "after reset_peak_stats: stat %d peak %llu != current %llu", i,
            (unsigned long long)s[i]->peak, (unsigned long long)s[i]->current);
    break;
  }
  case OP_GET_CONFIG: {
    uint8_t k = rd_u8(r), f = rd_u8(r), x = rd_u8(r);
    op_get_config(cx, a, k, f, x);
    break;
  }
  case OP_NULL_ARGS: {
    uint8_t sub = rd_u8(r), arg = rd_u8(r);
    op_null_args(cx, a, sub, arg);
    break;
  }
  case OP_CONFIG:
    op_config(cx, r);
    break;
  case OP_BACKEND_FAULT: {
    uint8_t mode = rd_u8(r), count = rd_u8(r);
    if (a->hs == NULL || a->hs->ub == NULL)
      break;
    atomic_store(&a->hs->ub->fail_mode, mode % UB_FAIL_MODES);
    atomic_store(&a->hs->ub->fail_count, count % 4);
    break;
  }
  case OP_EVENTS_SCRIPT: {
    uint8_t len = rd_u8(r) % 17;
    uint8_t s[16];
    for (unsigned i = 0; i < len && i < 16; i++)
      s[i] = rd_u8(r);
    if (!q || a->hs == NULL || a->hs->ue == NULL)
      break;
    uevents_t *ue = a->hs->ue;
    ue->len = len < 16 ? len : 16;
    memcpy(ue->script, s, ue->len);
    atomic_store(&ue->pos, 0);
    break;
  }
  case OP_POOL_B:
    op_pool_b(cx, r);
    break;
  case OP_THREADS:
    op_threads(cx, r);
    break;
  case OP_RECREATE:
    if (!q)
      break;
    pool_close(a);
    pool_open(a);
    break;
  case OP_COOKIES:
    for (unsigned i = 0; i < m->nlive; i++)
      cookie_check(&m->live[i]);
    if (cx->main && fz->has_b)
      for (unsigned i = 0; i < fz->b.m.nlive; i++)
        cookie_check(&fz->b.m.live[i]);
    break;
  case OP_BUFFER:
    op_buffer(cx, a, r);
    break;
  case OP_HISTORY:
    op_history(a, r);
    break;
  case OP_SNAPSHOT:
    op_snapshot(cx, a, r);
    break;
  case OP_BURST: { /* fill segments: many blocks of one size, some freed */
    size_t size = pick_size(r);
    uint8_t n = rd_u8(r), f = rd_u8(r);
    for (unsigned i = 0; i < 1u + n % 32u; i++)
      op_alloc(cx, a, m, size, cx->live_cap);
    for (unsigned i = 0; (f & 1) && i < m->nlive; i++)
      free_live(cx, a, m, i); /* every other one (the last moves in) */
    break;
  }
  default:
    break;
  }
}

/* ---- Setup and teardown ---------------------------------------------------
 */

static void fz_init_once(void) {
  static bool done;
  if (done)
    return;
  done = true;
  /* No real CUDA driver, whatever the machine has: backend=cuda and
   * events=cuda configs then fail with ENODRIVER, never pin memory. */
  (void)setenv("PINPOOL_LIBCUDA", "/nonexistent/pinpool-fuzz/libcuda.so.1", 1);
  (void)unsetenv("PINPOOL_CONF");
  size_t len = 4 * MIB;
  void *g = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(g != MAP_FAILED, "mmap of the guard region");
  guard_region = ((uintptr_t)g + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1);
}

/* Two setup bytes:
 *   b0: bits 0-1 backend (host, malloc, user, user page-locked),
 *       bits 2-3 events (none, simulated, user, user without on_error),
 *       bit 4 reserve=4MiB, bit 5 second pool B, bit 6 hugepages=1 (host),
 *       bit 7 mlock=1 (host);
 *   b1: bits 0-2 tcache_bytes, bits 3-4 shards - 1, bits 5-6 max_cached,
 *       bit 7 max_reserved 24MiB instead of 64MiB. (Bit 1 also gave
 *       host pools remap_min=0, a key removed with the arenas: inputs
 *       that set it now run the same pool without it.) */
static void setup(fuzz_t *fz, reader_t *r) {
  static const uint64_t tcache[8] = {0,         512, 4096,    64 * KIB,
                                     256 * KIB, MIB, 4 * MIB, 64 * MIB};
  static const uint64_t cached[4] = {0, MIB, 4 * MIB, 16 * MIB};
  static const char *const backends[4] = {",backend=host", ",backend=malloc",
                                          "", ""};
  uint8_t b0 = rd_u8(r), b1 = rd_u8(r);
  fpool_t *a = &fz->a;
  a->name = "A";
  a->backend = b0 & 3;
  a->events = (b0 >> 2) & 3;
  a->reserve = (b0 & 16) ? 4 * MIB : 0;
  a->max_reserved = (b1 & 128) ? 24 * MIB : 64 * MIB;
  a->max_cached = cached[(b1 >> 5) & 3];
  bool host = a->backend == BK_HOST;
  bool huge = host && (b0 & 64);
  a->mlock = host && (b0 & 128);
  a->variant = (b1 & 1) != 0;
  (void)snprintf(a->config, sizeof a->config,
                 "populate=0,tcache_bytes=%llu,shards=%u,max_cached=%llu,"
                 "max_reserved=%llu%s%s%s%s%s",
                 (unsigned long long)tcache[b1 & 7], 1u + ((b1 >> 3) & 3),
                 (unsigned long long)a->max_cached,
                 (unsigned long long)a->max_reserved, backends[a->backend],
                 a->events == EV_SIM ? ",events=simulated,sim_delay_us=0" : "",
                 a->reserve ? ",reserve=4MiB" : "", huge ? ",hugepages=1" : "",
                 a->mlock ? ",mlock=1" : "");
  a->hs = hookset_new(a->backend, a->events, UB_CAP);
  pool_open(a);
  fz->has_b = (b0 & 32) != 0;
  if (fz->has_b) {
    fpool_t *b = &fz->b;
    b->name = "B";
    b->backend = BK_HOST;
    b->events = EV_NONE;
    b->max_reserved = 16 * MIB;
    (void)snprintf(b->config, sizeof b->config,
                   "populate=0,tcache_bytes=64KiB,shards=1,max_reserved=16MiB,"
                   "backend=host"); /* unlocked: not backend=auto's choice */
    pool_open(b);
  }
}

static void check_step(const ctx_t *cx) {
  fuzz_t *fz = cx->fz;
  check_pool(&fz->a);
  if (fz->has_b)
    check_pool(&fz->b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_init_once();
  reader_t r = {data, size};
  fuzz_t *fz = calloc(1, sizeof *fz);
  CHECK(fz != NULL, "out of memory");
  setup(fz, &r);
  ctx_t cx = {fz, &fz->a.m, true, false, MAX_LIVE};
  check_step(&cx);
  for (unsigned i = 0; i < MAX_OPS && r.n > 0; i++) {
    run_op(&cx, &r);
    check_step(&cx);
  }
  for (unsigned i = 0; i < fz->a.m.nlive; i++)
    cookie_check(&fz->a.m.live[i]);
  pool_close(&fz->a);
  hookset_free(fz->a.hs);
  if (fz->has_b)
    pool_close(&fz->b);
  free(fz);
  return 0;
}
