#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

const char *pp_code_name(int code) {
  switch (code) {
  case PINPOOL_OK:
    return "PINPOOL_OK";
  case PINPOOL_EINVAL:
    return "PINPOOL_EINVAL";
  case PINPOOL_ENOMEM:
    return "PINPOOL_ENOMEM";
  case PINPOOL_EZEROSIZE:
    return "PINPOOL_EZEROSIZE";
  case PINPOOL_EOVERFLOW:
    return "PINPOOL_EOVERFLOW";
  case PINPOOL_EDOUBLEFREE:
    return "PINPOOL_EDOUBLEFREE";
  case PINPOOL_ENOTOWNED:
    return "PINPOOL_ENOTOWNED";
  case PINPOOL_EINTERIOR:
    return "PINPOOL_EINTERIOR";
  case PINPOOL_ECONFIG:
    return "PINPOOL_ECONFIG";
  case PINPOOL_EBACKEND:
    return "PINPOOL_EBACKEND";
  case PINPOOL_ECORRUPT:
    return "PINPOOL_ECORRUPT";
  case PINPOOL_EBUSY:
    return "PINPOOL_EBUSY";
  case PINPOOL_ENODRIVER:
    return "PINPOOL_ENODRIVER";
  case PINPOOL_EDEVICE:
    return "PINPOOL_EDEVICE";
  case PINPOOL_EFORKED:
    return "PINPOOL_EFORKED";
  case PINPOOL_ESTALE:
    return "PINPOOL_ESTALE";
  case PINPOOL_EBADHANDLE:
    return "PINPOOL_EBADHANDLE";
  case PINPOOL_ELIMIT:
    return "PINPOOL_ELIMIT";
  case PINPOOL_ECLOSED:
    return "PINPOOL_ECLOSED";
  case PINPOOL_EPERM:
    return "PINPOOL_EPERM";
  case PINPOOL_EEXITED:
    return "PINPOOL_EEXITED";
  case PINPOOL_EAGAIN:
    return "PINPOOL_EAGAIN";
  case PINPOOL_EINTR:
    return "PINPOOL_EINTR";
  default:
    return "(unknown code)";
  }
}

void pp_check_rc_(int got, int expected, const char *expr, const char *file,
                  int line) {
  if (got == expected)
    return;
  const char *le = pinpool_last_error();
  print_error("ERROR: %s returned %d (%s), expected %d (%s); last_error: "
              "\"%s\"\n",
              expr, got, pp_code_name(got), expected, pp_code_name(expected),
              le ? le : "(null)");
  _fail(file, line);
}

size_t pp_rand_size(uint64_t *s, size_t lo, size_t hi) {
  /* pick a power-of-two bucket uniformly between log2(lo) and log2(hi), then
   * a uniform value inside it, clamped to [lo, hi]. */
  int elo = 63 - __builtin_clzll((unsigned long long)lo);
  int ehi = 63 - __builtin_clzll((unsigned long long)hi);
  int e = elo + (int)(pp_rand(s) % (uint64_t)(ehi - elo + 1));
  size_t base = (size_t)1 << e;
  size_t v = base + (size_t)(pp_rand(s) % base);
  if (v < lo)
    v = lo;
  if (v > hi)
    v = hi;
  return v;
}

size_t pp_ref_class(size_t s) {
  if (s <= 512)
    return 512;
  int e = 63 - __builtin_clzll((unsigned long long)s);
  size_t step = (size_t)1 << (e - 3);
  return (s + step - 1) & ~(step - 1);
}

size_t pp_ref_block(size_t s) {
  return s > 256 * KiB ? (s + 4095) / 4096 * 4096 : pp_ref_class(s);
}

int pp_ref_block_ok(size_t size, size_t bs) { return bs == pp_ref_block(size); }

void pp_get_stats_(pinpool_t *pool, pinpool_stats_t *st, const char *file,
                   int line) {
  memset(st, 0xEE, sizeof *st);
  pp_check_rc_(pinpool_get_stats(pool, st), 0, "pinpool_get_stats", file, line);
}

#define STAT_FIELDS(X)                                                         \
  X(requests)                                                                  \
  X(requested_bytes)                                                           \
  X(blocks) X(block_bytes) X(reserved_bytes) X(cached_bytes) X(segments)

void pp_check_consistent_(pinpool_t *pool, const char *file, int line) {
  pinpool_stats_t st;
  pp_get_stats_(pool, &st, file, line);
  int bad = 0;
#define CHECK_STAT(f)                                                          \
  if (st.f.current != st.f.allocated - st.f.freed) {                           \
    print_error("ERROR: stats." #f ": current %" PRIu64                        \
                " != allocated %" PRIu64 " - freed %" PRIu64 "\n",             \
                st.f.current, st.f.allocated, st.f.freed);                     \
    bad = 1;                                                                   \
  }                                                                            \
  if (st.f.peak < st.f.current) {                                              \
    print_error("ERROR: stats." #f ": peak %" PRIu64 " < current %" PRIu64     \
                "\n",                                                          \
                st.f.peak, st.f.current);                                      \
    bad = 1;                                                                   \
  }
  STAT_FIELDS(CHECK_STAT)
#undef CHECK_STAT
  if (st.reserved_bytes.current !=
      st.block_bytes.current + st.cached_bytes.current + st.pending_bytes) {
    print_error("ERROR: accounting identity broken: reserved %" PRIu64
                " != block_bytes %" PRIu64 " + cached %" PRIu64
                " + pending %" PRIu64 "\n",
                st.reserved_bytes.current, st.block_bytes.current,
                st.cached_bytes.current, st.pending_bytes);
    bad = 1;
  }
  if (st.requests.current != st.blocks.current) {
    print_error("ERROR: requests.current %" PRIu64 " != blocks.current %" PRIu64
                "\n",
                st.requests.current, st.blocks.current);
    bad = 1;
  }
  if (st.block_bytes.current < st.requested_bytes.current) {
    print_error("ERROR: block_bytes.current %" PRIu64
                " < requested_bytes.current %" PRIu64 "\n",
                st.block_bytes.current, st.requested_bytes.current);
    bad = 1;
  }
  /* Per node (pinpool_get_node_stats): the nodes' reserved bytes and
   * segments add up to the pool's. */
  unsigned nodes = 0;
  uint64_t node_res = 0, node_segs = 0;
  if (pinpool_numa_nodes(pool, &nodes) != 0 || nodes == 0) {
    print_error("ERROR: pinpool_numa_nodes failed\n");
    bad = 1;
  }
  for (unsigned n = 0; n < nodes; n++) {
    pinpool_node_stats_t ns;
    if (pinpool_get_node_stats(pool, n, &ns) != 0) {
      print_error("ERROR: pinpool_get_node_stats(%u) failed\n", n);
      bad = 1;
      break;
    }
    node_res += ns.reserved_bytes;
    node_segs += ns.segments;
  }
  if (!bad && (node_res != st.reserved_bytes.current ||
               node_segs != st.segments.current)) {
    print_error("ERROR: nodes hold %" PRIu64 " reserved bytes and %" PRIu64
                " segments, the pool %" PRIu64 " and %" PRIu64 "\n",
                node_res, node_segs, st.reserved_bytes.current,
                st.segments.current);
    bad = 1;
  }
  int v = pinpool_validate(pool);
  if (v != 0) {
    print_error("ERROR: pinpool_validate returned %d (%s): \"%s\"\n", v,
                pp_code_name(v), pinpool_last_error());
    bad = 1;
  }
  if (bad)
    _fail(file, line);
}

void pp_check_stats_equal_(const pinpool_stats_t *a, const pinpool_stats_t *b,
                           const char *what, const char *file, int line) {
  int bad = 0;
#define CMP_STAT(f)                                                            \
  if (memcmp(&a->f, &b->f, sizeof a->f) != 0) {                                \
    print_error("ERROR: %s changed stats." #f ": {%" PRIu64 ",%" PRIu64        \
                ",%" PRIu64 ",%" PRIu64 "} -> {%" PRIu64 ",%" PRIu64           \
                ",%" PRIu64 ",%" PRIu64 "}\n",                                 \
                what, a->f.current, a->f.peak, a->f.allocated, a->f.freed,     \
                b->f.current, b->f.peak, b->f.allocated, b->f.freed);          \
    bad = 1;                                                                   \
  }
  STAT_FIELDS(CMP_STAT)
#undef CMP_STAT
#define CMP_U64(f)                                                             \
  if (a->f != b->f) {                                                          \
    print_error("ERROR: %s changed stats." #f ": %" PRIu64 " -> %" PRIu64      \
                "\n",                                                          \
                what, (uint64_t)a->f, (uint64_t)b->f);                         \
    bad = 1;                                                                   \
  }
  CMP_U64(pending_bytes)
  CMP_U64(pending_blocks)
  CMP_U64(events_recorded)
  CMP_U64(events_completed)
  CMP_U64(event_errors)
  CMP_U64(reclaim.count)
  CMP_U64(reclaim.total_ns)
  CMP_U64(reclaim.max_ns)
  CMP_U64(cache_hits)
  CMP_U64(cache_misses)
  CMP_U64(tcache_hits)
  CMP_U64(oom_count)
  CMP_U64(retries)
  CMP_U64(trimmed_segments)
  CMP_U64(arena_chunks)
  CMP_U64(chunk_free_bytes)
  CMP_U64(free_extents)
  CMP_U64(largest_free_extent)
  CMP_U64(history_lost_writes)
  CMP_U64(mlock_failures)
  CMP_U64(locked_bytes)
  CMP_U64(fallback_bytes)
  CMP_U64(fallback_blocks)
  CMP_U64(numa_spill_blocks)
  CMP_U64(numa_spill_bytes)
  CMP_U64(lent_blocks)
  CMP_U64(lent_bytes)
  CMP_U64(backend_alloc.count)
  CMP_U64(backend_alloc.total_ns)
  CMP_U64(backend_alloc.max_ns)
  CMP_U64(backend_free.count)
  CMP_U64(backend_free.total_ns)
  CMP_U64(backend_free.max_ns)
  CMP_U64(peak_slack_bytes)
  CMP_U64(reserve_bytes)
  CMP_U64(max_cached)
  CMP_U64(max_reserved)
#undef CMP_U64
  if (bad)
    _fail(file, line);
}

/* ---- Counting backend --------------------------------------------------- */

static void cb_error_locked(counting_backend_t *cb, const char *msg) {
  if (cb->c.errors++ == 0)
    snprintf(cb->first_error, sizeof cb->first_error, "%s", msg);
}

static int cb_alloc(void *ctx, size_t size, void **out) {
  counting_backend_t *cb = ctx;
  if (cb->hook)
    cb->hook(cb, 1, size, cb->hook_arg);
  pthread_mutex_lock(&cb->mu);
  cb->c.calls++;
  if (out == NULL) {
    cb_error_locked(cb, "alloc called with out == NULL");
    pthread_mutex_unlock(&cb->mu);
    return PINPOOL_EBACKEND;
  }
  if (size == 0 || size % 4096 != 0) {
    char m[128];
    snprintf(m, sizeof m, "alloc called with size %zu (not a multiple of 4096)",
             size);
    cb_error_locked(cb, m);
  }
  if (cb->fail_code) {
    int rc = cb->fail_code;
    pthread_mutex_unlock(&cb->mu);
    return rc;
  }
  int fill = cb->fill;
  pthread_mutex_unlock(&cb->mu);

  size_t rounded = (size + 4095) & ~(size_t)4095;
  void *p = aligned_alloc(4096, rounded ? rounded : 4096);
  if (p == NULL)
    return PINPOOL_ENOMEM;
  if (fill >= 0)
    memset(p, fill, size);

  pthread_mutex_lock(&cb->mu);
  if (cb->nrecs == cb->cap) {
    size_t ncap = cb->cap ? cb->cap * 2 : 256;
    cb_rec_t *n = realloc(cb->recs, ncap * sizeof *n);
    if (n == NULL) {
      pthread_mutex_unlock(&cb->mu);
      free(p);
      return PINPOOL_ENOMEM;
    }
    cb->recs = n;
    cb->cap = ncap;
  }
  cb_rec_t *r = &cb->recs[cb->nrecs++];
  r->ptr = p;
  r->size = size;
  r->alloc_seq = ++cb->alloc_seq;
  r->free_seq = 0;
  cb->c.nalloc++;
  cb->c.bytes_alloc += size;
  cb->c.live_count++;
  cb->c.live_bytes += size;
  if (cb->c.live_bytes > cb->c.peak_live_bytes)
    cb->c.peak_live_bytes = cb->c.live_bytes;
  pthread_mutex_unlock(&cb->mu);
  *out = p;
  return 0;
}

static void cb_free(void *ctx, void *ptr, size_t size) {
  counting_backend_t *cb = ctx;
  if (cb->hook)
    cb->hook(cb, 0, size, cb->hook_arg);
  pthread_mutex_lock(&cb->mu);
  cb->c.nfree++;
  cb_rec_t *r = NULL;
  for (size_t i = cb->nrecs; i-- > 0;) {
    if (cb->recs[i].ptr == ptr && cb->recs[i].free_seq == 0) {
      r = &cb->recs[i];
      break;
    }
  }
  char m[160];
  if (r == NULL) {
    snprintf(m, sizeof m, "free(%p, %zu): not a live range of this backend",
             ptr, size);
    cb_error_locked(cb, m);
    cb->c.bytes_freed += size;
    pthread_mutex_unlock(&cb->mu);
    return; /* do not free memory we do not know */
  }
  if (r->size != size) {
    snprintf(m, sizeof m, "free(%p, %zu): allocated with size %zu", ptr, size,
             r->size);
    cb_error_locked(cb, m);
  }
  r->free_seq = ++cb->free_seq;
  cb->c.live_count--;
  cb->c.live_bytes -= r->size;
  cb->c.bytes_freed += r->size; /* the recorded size, not the given one */
  pthread_mutex_unlock(&cb->mu);
  free(ptr);
}

void cb_init(counting_backend_t *cb) {
  memset(cb, 0, sizeof *cb);
  pthread_mutex_init(&cb->mu, NULL);
  cb->fill = -1;
}

void cb_fini(counting_backend_t *cb) {
  for (size_t i = 0; i < cb->nrecs; i++)
    if (cb->recs[i].free_seq == 0)
      free(cb->recs[i].ptr);
  free(cb->recs);
  pthread_mutex_destroy(&cb->mu);
  memset(cb, 0, sizeof *cb);
}

pinpool_backend_t cb_table(counting_backend_t *cb, int page_locked) {
  pinpool_backend_t t;
  memset(&t, 0, sizeof t);
  t.name = "counting";
  t.alloc = cb_alloc;
  t.free = cb_free;
  t.ctx = cb;
  t.page_locked = page_locked;
  return t;
}

cb_counts_t cb_counts(counting_backend_t *cb) {
  pthread_mutex_lock(&cb->mu);
  cb_counts_t c = cb->c;
  pthread_mutex_unlock(&cb->mu);
  return c;
}

void cb_set_fail(counting_backend_t *cb, int code) {
  pthread_mutex_lock(&cb->mu);
  cb->fail_code = code;
  pthread_mutex_unlock(&cb->mu);
}

cb_rec_t *cb_records(counting_backend_t *cb, size_t *n) {
  pthread_mutex_lock(&cb->mu);
  cb_rec_t *copy = malloc((cb->nrecs ? cb->nrecs : 1) * sizeof *copy);
  if (copy != NULL && cb->nrecs)
    memcpy(copy, cb->recs, cb->nrecs * sizeof *copy);
  *n = copy ? cb->nrecs : 0;
  pthread_mutex_unlock(&cb->mu);
  return copy;
}

cb_rec_t cb_find_live(counting_backend_t *cb, const void *p) {
  cb_rec_t out;
  memset(&out, 0, sizeof out);
  uintptr_t a = (uintptr_t)p;
  pthread_mutex_lock(&cb->mu);
  for (size_t i = 0; i < cb->nrecs; i++) {
    const cb_rec_t *r = &cb->recs[i];
    if (r->free_seq == 0 && a >= (uintptr_t)r->ptr &&
        a < (uintptr_t)r->ptr + r->size) {
      out = *r;
      break;
    }
  }
  pthread_mutex_unlock(&cb->mu);
  return out;
}

void pp_check_cb_clean_(counting_backend_t *cb, const char *file, int line) {
  pthread_mutex_lock(&cb->mu);
  uint64_t errors = cb->c.errors;
  char msg[256];
  memcpy(msg, cb->first_error, sizeof msg);
  pthread_mutex_unlock(&cb->mu);
  if (errors) {
    print_error("ERROR: the backend saw %" PRIu64
                " contract violation(s); first: %s\n",
                errors, msg);
    _fail(file, line);
  }
}

void pp_check_cb_balanced_(counting_backend_t *cb, const char *file, int line) {
  pp_check_cb_clean_(cb, file, line);
  cb_counts_t c = cb_counts(cb);
  if (c.nalloc != c.nfree || c.live_count != 0 || c.live_bytes != 0 ||
      c.bytes_alloc != c.bytes_freed) {
    print_error("ERROR: backend calls unbalanced: %" PRIu64 " allocs (%" PRIu64
                " bytes), %" PRIu64 " frees (%" PRIu64 " bytes), %" PRIu64
                " ranges (%" PRIu64 " bytes) never freed\n",
                c.nalloc, c.bytes_alloc, c.nfree, c.bytes_freed, c.live_count,
                c.live_bytes);
    _fail(file, line);
  }
}

void pp_clean_env(void) { unsetenv("PINPOOL_CONF"); }

int pp_run_selected(const char *group, const struct CMUnitTest *all, size_t n,
                    int argc, char **argv) {
  struct CMUnitTest *some = calloc(n, sizeof *some);
  if (some == NULL)
    return 1;
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (argc < 2 || strstr(all[i].name, argv[1]) != NULL)
      some[k++] = all[i];
  int rc = _cmocka_run_group_tests(group, some, k, NULL, NULL);
  free(some);
  return rc;
}

void pp_check_emptied_(pinpool_t *pool, const char *file, int line) {
  pp_check_rc_(pinpool_empty_cache(pool), 0, "pinpool_empty_cache(pool)", file,
               line);
  pinpool_stats_t st;
  pp_get_stats_(pool, &st, file, line);
  if (st.locked_bytes != 0 || st.reserved_bytes.current != 0) {
    print_error("ERROR: after empty_cache: locked %" PRIu64
                ", reserved %" PRIu64 "\n",
                st.locked_bytes, st.reserved_bytes.current);
    _fail(file, line);
  }
}

static int heap_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  void *p = aligned_alloc(4096, size);
  if (!p)
    return PINPOOL_ENOMEM;
  *out = p;
  return 0;
}

static void heap_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)size;
  free(ptr);
}

pinpool_backend_t pp_heap_backend(void) {
  return (pinpool_backend_t){"user", heap_alloc, heap_free, NULL, 0};
}

pinpool_stats_t pp_stats_of(pinpool_t *pool) {
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  return st;
}

void *pp_alloc_touch(pinpool_t *pool, size_t n) {
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, n, &p));
  memset(p, 0x5a, n);
  return p;
}

void pp_sleep_ms(unsigned ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int pp_wait_child(pid_t pid, unsigned timeout_ms) {
  int status = 0;
  for (unsigned waited = 0;; waited++) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid)
      break;
    if (r < 0)
      return -3;
    if (waited >= timeout_ms) {
      (void)kill(pid, SIGKILL);
      (void)waitpid(pid, &status, 0);
      return -1;
    }
    pp_sleep_ms(1);
  }
  return WIFSIGNALED(status) ? -2 : WEXITSTATUS(status);
}

/* share_worker.c's (src/share.h): wait until the closer thread has
 * closed every descriptor handed to it. */
void pp_share_closer_flush(void);

int pp_count_fds(void) {
  /* A descriptor a peer sent and the library did not keep is closed on
   * the process's closer thread, a moment after the call that received it
   * returned (docs/sharing.md): counted once that thread is done. */
  pp_share_closer_flush();
  DIR *d = opendir("/proc/self/fd");
  int n = 0;
  if (d == NULL)
    return -1;
  while (readdir(d) != NULL)
    n++;
  (void)closedir(d);
  return n - 3; /* ., .., and the directory's own descriptor */
}

void pp_fill(void *p, size_t n, unsigned seed) {
  unsigned char *c = p;
  for (size_t i = 0; i < n; i += 64)
    c[i] = (unsigned char)(seed + i / 64);
}

int pp_filled(const void *p, size_t n, unsigned seed) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i += 64)
    if (c[i] != (unsigned char)(seed + i / 64))
      return 0;
  return 1;
}

int pp_read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

int pp_write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

pid_t pp_fork_peer(int (*fn)(int sock), int *sock) {
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
            "socketpair: %s", strerror(errno));
  pid_t c = fork();
  PP_ASSERT(c >= 0, "fork: %s", strerror(errno));
  if (c == 0) {
    (void)close(sv[0]);
    _exit(fn(sv[1]));
  }
  (void)close(sv[1]);
  *sock = sv[0];
  return c;
}

ssize_t pp_send_fds(int sock, const void *buf, size_t n, const int *fds,
                    int nfds) {
  union {
    char buf[CMSG_SPACE(4 * sizeof(int))];
    struct cmsghdr align;
  } u;
  if (nfds < 0 || nfds > 4)
    return -1;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)buf, n};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
  }
  return sendmsg(sock, &m, 0);
}

void pp_lend_to_self(const char *conf, size_t n, pinpool_t **pool, void **b,
                     pinpool_share_handle_t *h, int *fd) {
  PP_OK(pinpool_create(conf, pool));
  PP_OK(pinpool_alloc(*pool, n, b));
  PP_OK(pinpool_lend(*pool, *b, getpid(), h, fd));
}
