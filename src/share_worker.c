/*
 * Sharing (docs/sharing.md), the worker side: attaching lent blocks and
 * passing handles with their descriptors (share.c is the owner's side).
 *
 * One mapping per chunk per process, found by the memfd's (st_dev,
 * st_ino), shared by every block attached from it, unmapped when the last
 * is detached. The table has its own lock, a leaf; the fork handlers take
 * it (fork.c).
 */
#include "share.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* ---- Worker side --------------------------------------------------------- */
typedef struct wchunk {
  struct wchunk *next;
  uint64_t dev, ino, nonce, id, size;
  char *base;
  void *ctl;
  size_t ctl_len;
  size_t refs;
} wchunk_t;
typedef struct attachment {
  char *ptr;
  wchunk_t *ck;
} attachment_t;
static struct {
  pp_mutex_t lock;
  wchunk_t *chunks;
  attachment_t *att;
  size_t natt, catt;
} wk = {.lock = {.m = PTHREAD_MUTEX_INITIALIZER}};

void pp_share_worker_fork(int phase) {
  if (phase == PP_FORK_PREPARE)
    pp_mutex_lock(&wk.lock);
  else
    pp_mutex_unlock(&wk.lock);
}

static int bad(const char *fmt, const char *what) {
  return pp_fail(PINPOOL_EBADHANDLE, fmt, what);
}

/* The handle's own fields: 0 or EBADHANDLE. */
static int check_handle(const pinpool_share_handle_t *h) {
  if (h->magic != PINPOOL_SHARE_MAGIC)
    return bad("pinpool_share_attach: %s", "not a pinpool handle (magic)");
  if (h->version != PINPOOL_SHARE_VERSION)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: handle version %u, expected %u",
                   h->version, PINPOOL_SHARE_VERSION);
  if (h->generation == 0 || h->chunk_size == 0 ||
      h->chunk_size % PP_PAGE != 0 || h->chunk_size > ((uint64_t)1 << 48) ||
      h->length == 0 || h->offset >= h->chunk_size ||
      h->length > h->chunk_size - h->offset ||
      h->slot >= pp_ctl_slots(h->chunk_size))
    return bad("pinpool_share_attach: %s",
               "the handle's fields are inconsistent (forged or corrupt)");
  return 0;
}

/* fd is a memfd of the handle's chunk: writable, the right size, sealed
 * against resizing (never against writing), the same file. */
static int check_fd(const pinpool_share_handle_t *h, int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d: %s", fd,
                   strerror(errno));
  if (!S_ISREG(st.st_mode))
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is not a memfd", fd);
  if ((uint64_t)st.st_dev != h->dev || (uint64_t)st.st_ino != h->ino)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is another file than "
                   "the handle's chunk (inode %llu, handle says %llu)",
                   fd, (unsigned long long)st.st_ino,
                   (unsigned long long)h->ino);
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is not a memfd "
                   "(F_GET_SEALS: %s)",
                   fd, strerror(errno));
  if ((seals & SEALS_NEEDED) != SEALS_NEEDED || (seals & SEALS_FORBIDDEN))
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d has seals %#x, "
                   "expected shrink, grow and seal (and no write seal)",
                   fd, (unsigned)seals);
  if ((uint64_t)st.st_size != h->chunk_size + pp_ctl_bytes(h->chunk_size))
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is %lld bytes, the "
                   "handle's chunk %llu",
                   fd, (long long)st.st_size,
                   (unsigned long long)h->chunk_size +
                       pp_ctl_bytes(h->chunk_size));
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is not open "
                   "read-write",
                   fd);
  return 0;
}

static int map_fail(int err, const char *what, uint64_t size) {
  return pp_fail(err == ENOMEM ? PINPOOL_ENOMEM : PINPOOL_EBACKEND,
                 "pinpool_share_attach: mmap of the %s (%llu bytes): %s%s",
                 what, (unsigned long long)size, strerror(err),
                 err == ENOMEM ? " (or vm.max_map_count reached)" : "");
}

/* The control area says the lend of h is live: 0, ESTALE or EBADHANDLE. */
static int check_slot(const wchunk_t *c, const pinpool_share_handle_t *h) {
  const pp_ctl_head_t *hd = c->ctl;
  if (pp_load_acquire(&((pp_ctl_head_t *)hd)->magic) != CTL_MAGIC ||
      pp_load_relaxed(&((pp_ctl_head_t *)hd)->nonce) != h->nonce ||
      pp_load_relaxed(&((pp_ctl_head_t *)hd)->chunk_id) != h->chunk_id ||
      pp_load_relaxed(&((pp_ctl_head_t *)hd)->chunk_size) != h->chunk_size)
    return bad("pinpool_share_attach: %s",
               "the chunk is not the one the handle names (nonce or chunk "
               "id differ)");
  pp_ctl_slot_t *sl = pp_ctl_slot(c->ctl, h->slot);
  uint64_t g = pp_load_acquire(&sl->gen);
  uint64_t off = pp_load_relaxed(&sl->offset);
  uint64_t len = pp_load_relaxed(&sl->length);
  atomic_thread_fence(memory_order_acquire);
  uint64_t g2 = pp_load_relaxed(&sl->gen);
#ifdef PINPOOL_MUTANT_SHARE_NO_GEN
  /* Mutant (docs/verification.md): the generation is not compared. */
  (void)g;
  (void)g2;
#else
  if (g != h->generation || g2 != g)
    return pp_fail(PINPOOL_ESTALE,
                   "pinpool_share_attach: stale handle: lend generation "
                   "%llu ended (the block was returned, reclaimed, freed or "
                   "reused; slot %u holds generation %llu)",
                   (unsigned long long)h->generation, h->slot,
                   (unsigned long long)g);
#endif
  if (off != h->offset || len != h->length)
    return bad("pinpool_share_attach: %s",
               "the handle's offset or length differ from the lend's "
               "(forged)");
  return 0;
}

int pinpool_share_attach(const pinpool_share_handle_t *h, int fd, void **out) {
  if (h == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_attach: NULL argument");
  int rc = check_handle(h);
  if (rc == 0 && fd >= 0)
    rc = check_fd(h, fd);
  if (rc != 0)
    return rc;
  pp_mutex_lock(&wk.lock);
  wchunk_t *c = wk.chunks;
  while (c != NULL && !(c->dev == h->dev && c->ino == h->ino))
    c = c->next;
  bool fresh = false;
  if (c != NULL && (c->nonce != h->nonce || c->id != h->chunk_id ||
                    c->size != h->chunk_size))
    rc = bad("pinpool_share_attach: %s",
             "the handle names a chunk mapped here under another identity");
  else if (c == NULL && fd < 0)
    rc = pp_fail(PINPOOL_EINVAL,
                 "pinpool_share_attach: no descriptor, and chunk %llu is not "
                 "mapped in this process",
                 (unsigned long long)h->chunk_id);
  if (rc == 0 && wk.natt == wk.catt) {
    size_t n = wk.catt == 0 ? 16 : wk.catt * 2;
    attachment_t *t = realloc(wk.att, n * sizeof *t);
    if (t == NULL)
      rc = pp_fail(PINPOOL_ENOMEM, "pinpool_share_attach: out of memory");
    else
      wk.att = t, wk.catt = n;
  }
  if (rc == 0 && c == NULL) {
    c = calloc(1, sizeof *c);
    if (c == NULL) {
      rc = pp_fail(PINPOOL_ENOMEM, "pinpool_share_attach: out of memory");
    } else {
      *c = (wchunk_t){NULL,     h->dev,      h->ino,
                      h->nonce, h->chunk_id, h->chunk_size,
                      NULL,     NULL,        pp_ctl_bytes(h->chunk_size),
                      0};
      /* The control area read-only: a worker's bug cannot corrupt the
       * generations other workers check. */
      c->ctl = mmap(NULL, c->ctl_len, PROT_READ, MAP_SHARED, fd,
                    (off_t)h->chunk_size);
      if (c->ctl == MAP_FAILED) {
        rc = map_fail(errno, "control area", c->ctl_len);
        free(c);
        c = NULL;
      } else {
        fresh = true;
      }
    }
  }
  if (rc == 0 && c == NULL) /* (cannot be: each branch above set rc) */
    rc = pp_fail(PINPOOL_ECORRUPT, "pinpool_share_attach: no chunk");
  if (rc == 0 && c != NULL)
    rc = check_slot(c, h);
  if (rc == 0 && c != NULL && fresh) {
    c->base = mmap(NULL, c->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->base == MAP_FAILED)
      rc = map_fail(errno, "chunk", c->size);
  }
  if (rc != 0 || c == NULL) {
    if (fresh && c != NULL) {
      if (c->base != NULL && c->base != MAP_FAILED)
        (void)munmap(c->base, c->size);
      (void)munmap(c->ctl, c->ctl_len);
      free(c);
    }
    pp_mutex_unlock(&wk.lock);
    return rc != 0 ? rc : PINPOOL_ECORRUPT;
  }
  if (fresh) {
    c->next = wk.chunks;
    wk.chunks = c;
  }
  c->refs++;
  char *p = c->base + h->offset;
  wk.att[wk.natt++] = (attachment_t){p, c};
  pp_mutex_unlock(&wk.lock);
  *out = p;
  return 0;
}

int pinpool_share_detach(void *ptr) {
  if (ptr == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_detach: ptr is NULL");
  pp_mutex_lock(&wk.lock);
  size_t i = 0;
  while (i < wk.natt && wk.att[i].ptr != ptr)
    i++;
  if (i == wk.natt) {
    pp_mutex_unlock(&wk.lock);
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_share_detach: %p is not an attached block", ptr);
  }
  wchunk_t *c = wk.att[i].ck;
  wk.att[i] = wk.att[--wk.natt];
  bool last = --c->refs == 0;
  if (last) {
    wchunk_t **pp = &wk.chunks;
    while (*pp != c)
      pp = &(*pp)->next;
    *pp = c->next;
  }
  pp_mutex_unlock(&wk.lock);
  if (last) { /* no system call under the lock */
    (void)munmap(c->base, c->size);
    (void)munmap(c->ctl, c->ctl_len);
    free(c);
  }
  return 0;
}

size_t pp_share_worker_chunks(void) {
  pp_mutex_lock(&wk.lock);
  size_t n = 0;
  for (wchunk_t *c = wk.chunks; c != NULL; c = c->next)
    n++;
  pp_mutex_unlock(&wk.lock);
  return n;
}

/* ---- Passing a handle and its descriptor ---------------------------------
 * One message: the handle's 96 bytes, with the descriptor as SCM_RIGHTS
 * ancillary data on the first byte (stream sockets deliver it with the
 * first read of those bytes). */

static int sock_fail(const char *fn, int err) {
  if (err == EMFILE || err == ENFILE || err == ETOOMANYREFS)
    return pp_fail(PINPOOL_ELIMIT, "%s: %s (descriptor limit: RLIMIT_NOFILE)",
                   fn, strerror(err));
  if (err == EPIPE || err == ECONNRESET)
    return pp_fail(PINPOOL_ECLOSED, "%s: the peer closed the socket (%s)", fn,
                   strerror(err));
  return pp_fail(PINPOOL_EBACKEND, "%s: %s", fn, strerror(err));
}

int pinpool_share_send(int sock, const pinpool_share_handle_t *h, int fd) {
  if (h == NULL || sock < 0)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_send: bad argument");
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  const char *p = (const char *)h;
  size_t left = sizeof *h;
  bool with_fd = fd >= 0;
  while (left > 0) {
    struct iovec iov = {(void *)p, left};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (with_fd) {
      msg.msg_control = u.buf;
      msg.msg_controllen = sizeof u.buf;
      struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int));
      memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EBADF && with_fd && fcntl(fd, F_GETFD) < 0)
        return pp_fail(PINPOOL_EINVAL,
                       "pinpool_share_send: %d is not an open descriptor", fd);
      return sock_fail("pinpool_share_send", errno);
    }
    with_fd = false; /* sent with the first byte */
    p += n;
    left -= (size_t)n;
  }
  return 0;
}

/* Close every descriptor of the control messages of msg. */
static void close_fds(struct msghdr *msg) {
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm != NULL;
       cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int f;
      memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
      (void)close(f);
    }
  }
}

int pinpool_share_recv(int sock, pinpool_share_handle_t *h, int *fd) {
  if (h == NULL || fd == NULL || sock < 0)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_recv: bad argument");
  pinpool_share_handle_t tmp;
  /* Room for more than one descriptor, so that a peer sending several is
   * detected (and its descriptors closed) rather than truncated. */
  union {
    char buf[CMSG_SPACE(4 * sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {&tmp, sizeof tmp};
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
  ssize_t n;
  do
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return sock_fail("pinpool_share_recv", errno);
  if (n == 0)
    return pp_fail(PINPOOL_ECLOSED,
                   "pinpool_share_recv: the peer closed the socket");
  int got = -1, nfds = 0;
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm != NULL;
       cm = CMSG_NXTHDR(&msg, cm))
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
      size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      if (k > 0 && got < 0)
        memcpy(&got, CMSG_DATA(cm), sizeof got);
      nfds += (int)k;
    }
  if (msg.msg_flags & MSG_CTRUNC) {
    close_fds(&msg);
    return pp_fail(PINPOOL_ELIMIT,
                   "pinpool_share_recv: a descriptor was dropped (MSG_CTRUNC: "
                   "this process is at RLIMIT_NOFILE, or the peer sent too "
                   "many)");
  }
  if (nfds > 1) {
    close_fds(&msg);
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_recv: %d descriptors in one message", nfds);
  }
  size_t have = (size_t)n;
  while (have < sizeof tmp) { /* a stream socket may split the bytes */
    ssize_t m = recv(sock, (char *)&tmp + have, sizeof tmp - have, 0);
    if (m < 0 && errno == EINTR)
      continue;
    if (m <= 0) {
      int e = m < 0 ? errno : 0;
      if (got >= 0)
        (void)close(got);
      return m == 0 ? pp_fail(PINPOOL_ECLOSED,
                              "pinpool_share_recv: the peer closed the socket "
                              "within a message")
                    : sock_fail("pinpool_share_recv", e);
    }
    have += (size_t)m;
  }
  if (tmp.magic != PINPOOL_SHARE_MAGIC ||
      tmp.version != PINPOOL_SHARE_VERSION) {
    if (got >= 0)
      (void)close(got);
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_recv: the message is not a pinpool handle");
  }
  *h = tmp;
  *fd = got;
  return 0;
}
