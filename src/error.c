/*
 * Error codes, the per-thread last-error message, and small utilities every
 * file needs (clock, debug mutex, atomic max).
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The message of the last failing call, per thread: a failure in one thread
 * never overwrites what another thread is about to read. */
static _Thread_local char tls_last_error[256];

const char *pinpool_version(void) { return PINPOOL_VERSION_STRING; }

_Thread_local pp_callout_t pp_callout PP_TLS_MODEL;

const char *pp_callout_name(void) {
  switch (pp_callout.kind) {
  case PP_CO_BACKEND_ALLOC:
    return "a backend alloc callback";
  case PP_CO_BACKEND_FREE:
    return "a backend free callback";
  case PP_CO_EV_RECORD:
    return "an event provider's record";
  case PP_CO_EV_QUERY:
    return "an event provider's query";
  case PP_CO_EV_SYNC:
    return "an event provider's synchronize";
  case PP_CO_EV_RELEASE:
    return "an event provider's release";
  case PP_CO_EV_DESTROY:
    return "an event provider's destroy";
  case PP_CO_ON_ERROR:
    return "the error callback";
  default:
    return "a backend call's reservation";
  }
}

int pp_callout_refuse(const char *what) {
  return pp_fail(PINPOOL_EBUSY,
                 "%s: called from inside %s, where it would wait for "
                 "another thread (docs/api.md, \"Calling pinpool from a "
                 "callback\")",
                 what, pp_callout_name());
}

const char *pinpool_strerror(int err) {
  switch (err) {
  case PINPOOL_OK:
    return "PINPOOL_OK: success";
  case PINPOOL_EINVAL:
    return "PINPOOL_EINVAL: invalid argument (NULL pool or pointer)";
  case PINPOOL_ENOMEM:
    return "PINPOOL_ENOMEM: out of memory (max_reserved or backend)";
  case PINPOOL_EZEROSIZE:
    return "PINPOOL_EZEROSIZE: size 0 requested";
  case PINPOOL_EOVERFLOW:
    return "PINPOOL_EOVERFLOW: size or buffer length out of range";
  case PINPOOL_EDOUBLEFREE:
    return "PINPOOL_EDOUBLEFREE: block is not allocated (double free)";
  case PINPOOL_ENOTOWNED:
    return "PINPOOL_ENOTOWNED: pointer was not allocated by this pool";
  case PINPOOL_EINTERIOR:
    return "PINPOOL_EINTERIOR: pointer is inside a block, not its start";
  case PINPOOL_ECONFIG:
    return "PINPOOL_ECONFIG: bad configuration key or value";
  case PINPOOL_EBACKEND:
    return "PINPOOL_EBACKEND: the memory backend failed";
  case PINPOOL_ECORRUPT:
    return "PINPOOL_ECORRUPT: internal inconsistency detected";
  case PINPOOL_EBUSY:
    return "PINPOOL_EBUSY: operation not allowed in the current state";
  case PINPOOL_ENODRIVER:
    return "PINPOOL_ENODRIVER: CUDA driver, device or context unavailable";
  case PINPOOL_EDEVICE:
    return "PINPOOL_EDEVICE: the device reported an error for an event";
  case PINPOOL_EFORKED:
    return "PINPOOL_EFORKED: a CUDA or shared pool cannot be used in a child "
           "of fork";
  case PINPOOL_ESTALE:
    return "PINPOOL_ESTALE: the lend of this handle has ended (stale handle)";
  case PINPOOL_EBADHANDLE:
    return "PINPOOL_EBADHANDLE: handle or descriptor does not match (forged, "
           "another pool's or another file)";
  case PINPOOL_ELIMIT:
    return "PINPOOL_ELIMIT: a process limit was reached (RLIMIT_NOFILE)";
  case PINPOOL_ECLOSED:
    return "PINPOOL_ECLOSED: the peer closed the socket";
  case PINPOOL_EPERM:
    return "PINPOOL_EPERM: lend return refused (wrong token, or not from "
           "the process the block was lent to)";
  case PINPOOL_EEXITED:
    return "PINPOOL_EEXITED: the peer process has exited";
  case PINPOOL_EAGAIN:
    return "PINPOOL_EAGAIN: the socket would block (partial message kept)";
  case PINPOOL_EINTR:
    return "PINPOOL_EINTR: interrupted by a signal (partial message kept)";
  default:
    return "unknown pinpool error";
  }
}

const char *pinpool_last_error(void) { return tls_last_error; }

void pp_error_save(char *buf, size_t len) {
  (void)snprintf(buf, len, "%s", tls_last_error);
}

void pp_error_restore(const char *buf) {
  (void)snprintf(tls_last_error, sizeof tls_last_error, "%s", buf);
}

int pp_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  (void)vsnprintf(tls_last_error, sizeof tls_last_error, fmt, ap);
  va_end(ap);
  return code;
}

void pp_assert_fail(const char *expr, const char *file, int line) {
  (void)fprintf(stderr, "pinpool: assertion failed: %s (%s:%d)\n", expr, file,
                line);
  abort();
}

uint64_t pp_now_ns(void) {
  struct timespec ts;
  (void)clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void pp_atomic_max_relaxed(pp_counter_t *p, uint64_t v) {
  uint64_t cur = pp_load_relaxed(p);
  while (cur < v &&
         !atomic_compare_exchange_weak_explicit(
             p, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void pp_mutex_init(pp_mutex_t *m) {
  /* Adaptive: a contended lock spins a little before it sleeps. The pool's
   * locks are held for tens of nanoseconds; sleeping in the kernel for one
   * costs microseconds and turns two threads trading blocks through a bin
   * into a convoy. */
  pthread_mutexattr_t a;
  (void)pthread_mutexattr_init(&a);
  (void)pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
  (void)pthread_mutex_init(&m->m, &a);
  (void)pthread_mutexattr_destroy(&a);
#if PINPOOL_DEBUG >= 1
  atomic_init(&m->owner, 0);
#endif
}

void pp_mutex_destroy(pp_mutex_t *m) { (void)pthread_mutex_destroy(&m->m); }

#if PINPOOL_DEBUG >= 1
bool pp_mutex_held(pp_mutex_t *m) {
  return pp_load_relaxed(&m->owner) == (unsigned long)pthread_self();
}
#endif
