/*
 * Shared helpers for the pinpool unit tests (cmocka).
 *
 * - PP_* check macros that report the pinpool error text on failure,
 * - a deterministic xorshift PRNG,
 * - a reference size-class function,
 * - stats checks (the accounting identity, current == allocated - freed,
 *   peak >= current, validate() == 0) and a field-by-field stats comparison,
 * - a counting user backend (aligned_alloc based) that records every call.
 *
 * Everything here is race-free: the counting backend guards its state with a
 * mutex, because the pool may call it from several threads at once.
 */
#ifndef PP_TESTUTIL_H
#define PP_TESTUTIL_H

/* POSIX and GNU declarations (pthread barriers, setenv, nanosleep, ...) for
 * tests built with -std=c11: include this header first. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <sys/types.h>

#include "pinpool.h"

/* PP_SANITIZED: built with ASan or TSan, whose runtimes change what some
 * tests measure (time, page faults: the shadow memory's). */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define PP_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define PP_SANITIZED 1
#endif
#endif

#define KiB ((size_t)1024)
#define MiB ((size_t)1024 * KiB)
#define GiB ((size_t)1024 * MiB)

/* Fail the current test with a formatted message, reported at the caller. */
#define PP_FAIL(...)                                                           \
  do {                                                                         \
    print_error("ERROR: " __VA_ARGS__);                                        \
    print_error("\n");                                                         \
    _fail(__FILE__, __LINE__);                                                 \
  } while (0)

#define PP_ASSERT(cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      print_error("ERROR: assertion `%s` failed: ", #cond);                    \
      print_error(__VA_ARGS__);                                                \
      print_error("\n");                                                       \
      _fail(__FILE__, __LINE__);                                               \
    }                                                                          \
  } while (0)

/* Evaluate a pinpool call and require the given return code. */
#define PP_CHECK_RC(expr, expected)                                            \
  pp_check_rc_((expr), (expected), #expr, __FILE__, __LINE__)
#define PP_OK(expr) PP_CHECK_RC(expr, 0)

void pp_check_rc_(int got, int expected, const char *expr, const char *file,
                  int line);

/* Name of an error code ("PINPOOL_ENOMEM"), for messages. */
const char *pp_code_name(int code);

/* ---- PRNG (xorshift64*) ------------------------------------------------- */
static inline uint64_t pp_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * UINT64_C(2685821657736338717);
}

static inline uint64_t pp_seed(uint64_t v) {
  /* splitmix64 so that small seeds give well-mixed states (never 0). */
  uint64_t z = v + UINT64_C(0x9E3779B97F4A7C15);
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  z ^= z >> 31;
  return z ? z : 1;
}

/* A size in [lo, hi], roughly log-uniform. lo >= 1. */
size_t pp_rand_size(uint64_t *s, size_t lo, size_t hi);

/* ---- Size classes (the documented formula) ----------------------------- */
/* < 512 -> 512; for 2^e <= s < 2^(e+1), e >= 9: round up to a multiple of
 * 2^(e-3). Valid for 1 <= s <= 2^62. */
size_t pp_ref_class(size_t s);
/* Whether bs is the size of the block a request of `size` gets
 * (pp_ref_block). */
int pp_ref_block_ok(size_t size, size_t bs);
/* The block size a request gets: its class up to 256 KiB, above it the
 * request rounded up to a page (carved from the arena). */
size_t pp_ref_block(size_t s);

/* ---- Stats ----------------------------------------------------------------
 */
void pp_get_stats_(pinpool_t *pool, pinpool_stats_t *st, const char *file,
                   int line);
#define PP_STATS(pool, st) pp_get_stats_((pool), (st), __FILE__, __LINE__)
/* The stats as a value (a failed call fails the test). */
pinpool_stats_t pp_stats_of(pinpool_t *pool);
/* Allocate n bytes (the call must succeed) and write all of them: the whole
 * block is there and writable. */
void *pp_alloc_touch(pinpool_t *pool, size_t n);

/* Checks on a quiescent pool: the accounting identity
 * reserved == block_bytes + cached + pending, current == allocated - freed and
 * peak >= current for every pinpool_stat_t, requests == blocks, and
 * pinpool_validate() == 0. */
void pp_check_consistent_(pinpool_t *pool, const char *file, int line);
#define PP_CHECK_CONSISTENT(pool)                                              \
  pp_check_consistent_((pool), __FILE__, __LINE__)

/* Empty the cache of a pool whose blocks are all freed: nothing may stay
 * reserved or locked. */
void pp_check_emptied_(pinpool_t *pool, const char *file, int line);
#define PP_CHECK_EMPTIED(pool) pp_check_emptied_((pool), __FILE__, __LINE__)

/* Field-by-field equality of two stats snapshots (every field). */
void pp_check_stats_equal_(const pinpool_stats_t *a, const pinpool_stats_t *b,
                           const char *what, const char *file, int line);
#define PP_CHECK_STATS_EQUAL(a, b, what)                                       \
  pp_check_stats_equal_((a), (b), (what), __FILE__, __LINE__)

/* ---- Counting user backend ------------------------------------------------
 */
typedef struct cb_rec {
  void *ptr;
  size_t size;
  uint64_t alloc_seq; /* 1-based order of successful allocs */
  uint64_t free_seq;  /* 0 while live, else 1-based order of frees */
} cb_rec_t;

typedef struct cb_counts {
  uint64_t calls;           /* alloc calls, failed ones included */
  uint64_t nalloc;          /* successful alloc calls */
  uint64_t nfree;           /* free calls */
  uint64_t bytes_alloc;     /* sum of sizes of successful allocs */
  uint64_t bytes_freed;     /* sum of sizes passed to free */
  uint64_t live_count;      /* nalloc - nfree */
  uint64_t live_bytes;      /* bytes_alloc - bytes_freed */
  uint64_t peak_live_bytes; /* highest live_bytes ever */
  uint64_t errors;          /* contract violations seen by the backend */
} cb_counts_t;

typedef struct counting_backend counting_backend_t;
/* Called (with no backend lock held) at the start of every alloc / free. */
typedef void (*cb_hook_fn)(counting_backend_t *cb, int is_alloc, size_t size,
                           void *arg);

struct counting_backend {
  pthread_mutex_t mu;
  cb_rec_t *recs;
  size_t nrecs, cap;
  uint64_t alloc_seq, free_seq;
  cb_counts_t c;
  char first_error[256];
  int fail_code;   /* nonzero: alloc returns it (and allocates nothing) */
  int fill;        /* >= 0: fill new memory with this byte value */
  cb_hook_fn hook; /* set before the pool is created, not changed later */
  void *hook_arg;
};

void cb_init(counting_backend_t *cb);
/* Frees any memory the pool never returned and the records. */
void cb_fini(counting_backend_t *cb);
pinpool_backend_t cb_table(counting_backend_t *cb, int page_locked);
cb_counts_t cb_counts(counting_backend_t *cb);
void cb_set_fail(counting_backend_t *cb, int code);
/* Copy of the records (caller frees); *n receives the count. */
cb_rec_t *cb_records(counting_backend_t *cb, size_t *n);
/* The record of the live range containing p, or a zeroed record. */
cb_rec_t cb_find_live(counting_backend_t *cb, const void *p);

/* After destroy: every alloc freed exactly once with the same size, and the
 * backend saw no contract violation (misaligned/odd sizes, unknown or double
 * frees, size mismatches). */
void pp_check_cb_balanced_(counting_backend_t *cb, const char *file, int line);
#define PP_CHECK_CB_BALANCED(cb) pp_check_cb_balanced_((cb), __FILE__, __LINE__)
/* The backend saw no contract violation so far. */
void pp_check_cb_clean_(counting_backend_t *cb, const char *file, int line);
#define PP_CHECK_CB_CLEAN(cb) pp_check_cb_clean_((cb), __FILE__, __LINE__)

/* A user backend ("user") of page-aligned heap memory that counts nothing:
 * for tests that need one that works, and no more. */
pinpool_backend_t pp_heap_backend(void);

/* Unset PINPOOL_CONF so that an outer environment cannot change defaults. */
void pp_clean_env(void);
/* Run the tests of all[n] whose name holds argv[1] (all of them without
 * one): the mutant variants run one test of a file. */
int pp_run_selected(const char *group, const struct CMUnitTest *all, size_t n,
                    int argc, char **argv);

/* ---- Child processes and descriptors (the sharing and fork tests) ------- */
/* Sleep ms milliseconds, resuming after signals. */
void pp_sleep_ms(unsigned ms);
/* Wait for pid, killing it after timeout_ms: its exit status, -1 on timeout,
 * -2 if a signal killed it, -3 if waitpid failed. */
int pp_wait_child(pid_t pid, unsigned timeout_ms);
/* Open descriptors of this process, the three standard ones not counted. */
int pp_count_fds(void);
/* Write / check a pattern of one byte per 64 derived from seed. */
void pp_fill(void *p, size_t n, unsigned seed);
int pp_filled(const void *p, size_t n, unsigned seed);
/* Read / write exactly n bytes, resuming after EINTR: 0, or -1. */
int pp_read_full(int fd, void *buf, size_t n);
int pp_write_full(int fd, const void *buf, size_t n);
/* A peer: a child on a socket pair (AF_UNIX stream, close-on-exec) that
 * runs fn on its end and exits with fn's result; this process gets the
 * other end in *sock. The child's pid; the test fails if none is made. */
pid_t pp_fork_peer(int (*fn)(int sock), int *sock);
/* One sendmsg of n bytes at buf with fds[0..nfds) (0 to 4) as SCM_RIGHTS:
 * the bytes sent, or -1. */
ssize_t pp_send_fds(int sock, const void *buf, size_t n, const int *fds,
                    int nfds);
/* A pool of conf with a block of n bytes lent to this process itself:
 * *pool, *b, the handle and the chunk's descriptor (the pool's). */
void pp_lend_to_self(const char *conf, size_t n, pinpool_t **pool, void **b,
                     pinpool_share_handle_t *h, int *fd);

#endif /* PP_TESTUTIL_H */
