/* The memory system calls of a malloc peer (syscount.h). */
#define _GNU_SOURCE
#include "syscount.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static const char *const k_calls[] = {"mmap", "munmap",   "mremap",
                                      "brk",  "mprotect", "madvise"};
#define NCALLS (sizeof k_calls / sizeof k_calls[0])
#define MAX_FDS (64 * NCALLS) /* 64 threads: more than any workload has */

static const char *const k_tracefs[] = {"/sys/kernel/tracing",
                                        "/sys/kernel/debug/tracing"};

static uint64_t g_ids[NCALLS];
static bool g_ready;

/* Every registered thread's events; g_broken once one failed to open (a
 * sum without it would be too small, so the count is then unknown). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_fds[MAX_FDS];
static size_t g_nfds;
static bool g_broken;

static int open_counter(uint64_t id) {
  struct perf_event_attr a;
  memset(&a, 0, sizeof a);
  a.type = PERF_TYPE_TRACEPOINT;
  a.size = sizeof a;
  a.config = id;
  /* pid 0, cpu -1: the calling thread, on any CPU. */
  return (int)syscall(SYS_perf_event_open, &a, 0, -1, -1, PERF_FLAG_FD_CLOEXEC);
}

/* On failure *err is the first fopen error other than ENOENT (EACCES:
 * tracefs is there but not readable by this user), else ENOENT. */
static bool read_id(const char *call, uint64_t *id, int *err) {
  *err = ENOENT;
  for (size_t t = 0; t < sizeof k_tracefs / sizeof k_tracefs[0]; t++) {
    char path[160];
    snprintf(path, sizeof path, "%s/events/syscalls/sys_enter_%s/id",
             k_tracefs[t], call);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
      if (errno != ENOENT && *err == ENOENT)
        *err = errno;
      continue;
    }
    unsigned long long v = 0;
    int n = fscanf(f, "%llu", &v);
    fclose(f);
    if (n == 1) {
      *id = v;
      return true;
    }
  }
  return false;
}

/* Open the calling thread's events into fds; returns how many opened. */
static size_t open_all(int *fds) {
  size_t n = 0;
  for (; n < NCALLS; n++) {
    fds[n] = open_counter(g_ids[n]);
    if (fds[n] < 0)
      break;
  }
  return n;
}

static int register_fds(const int *fds, size_t n) {
  pthread_mutex_lock(&g_lock);
  bool ok = n == NCALLS && g_nfds + NCALLS <= MAX_FDS;
  if (ok) {
    memcpy(&g_fds[g_nfds], fds, NCALLS * sizeof *fds);
    g_nfds += NCALLS;
  } else {
    g_broken = true;
  }
  pthread_mutex_unlock(&g_lock);
  if (!ok)
    for (size_t i = 0; i < n; i++)
      close(fds[i]);
  return ok ? 0 : -1;
}

bool syscount_init(char *why, size_t len) {
  for (size_t i = 0; i < NCALLS; i++) {
    int err;
    if (!read_id(k_calls[i], &g_ids[i], &err)) {
      if (err == ENOENT)
        snprintf(why, len,
                 "no tracepoint id for sys_enter_%s (tracefs not mounted at "
                 "%s or %s?)",
                 k_calls[i], k_tracefs[0], k_tracefs[1]);
      else
        snprintf(why, len,
                 "tracepoint id for sys_enter_%s: %s (tracefs needs root)",
                 k_calls[i], strerror(err));
      return false;
    }
  }
  /* The calling thread's events are its counters from now on (not a test
   * opened and closed: the last close of a syscall tracepoint's event
   * waits for the kernel to unregister it, tens of ms each). */
  int fds[NCALLS];
  size_t n = open_all(fds);
  if (n < NCALLS) {
    snprintf(why, len,
             "perf_event_open(syscalls:sys_enter_%s): %s (needs root or "
             "perf_event_paranoid <= -1)",
             k_calls[n], strerror(errno));
    for (size_t i = 0; i < n; i++)
      close(fds[i]);
    return false;
  }
  g_ready = true;
  return register_fds(fds, n) == 0;
}

int syscount_thread_start(void) {
  if (!g_ready)
    return -1;
  int fds[NCALLS];
  return register_fds(fds, open_all(fds));
}

bool syscount_read(uint64_t *out) {
  uint64_t sum = 0;
  pthread_mutex_lock(&g_lock);
  bool ok = g_ready && !g_broken;
  for (size_t i = 0; ok && i < g_nfds; i++) {
    uint64_t v = 0;
    if (read(g_fds[i], &v, sizeof v) != (ssize_t)sizeof v)
      ok = false;
    sum += v;
  }
  pthread_mutex_unlock(&g_lock);
  if (ok)
    *out = sum;
  return ok;
}

const char *syscount_names(void) {
  return "mmap, munmap, mremap, brk, mprotect, madvise";
}
