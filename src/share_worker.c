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
#include <linux/magic.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef SCM_PIDFD
#define SCM_PIDFD 0x04 /* Linux 6.5 */
#endif

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
/* A control-area descriptor received with a handle, for a chunk not mapped
 * here yet (pinpool_share_recv): consumed by the chunk's first attach. At
 * most MAX_CTL are kept, at most MAX_CTL_PER_SRC from one socket (src: its
 * inode); when the table is full, the one to go is the oldest of the
 * socket with the most kept, so one peer evicts only its own. */
#define MAX_CTL 64
#define MAX_CTL_PER_SRC 16
typedef struct ctl_pending {
  uint64_t dev, ino; /* the chunk's */
  uint64_t ctl_ino;
  int fd;
  uint64_t src; /* the receiving socket's st_ino */
} ctl_pending_t;
static struct {
  pp_mutex_t lock;
  wchunk_t *chunks;
  attachment_t *att;
  size_t natt, catt;
  ctl_pending_t ctl[MAX_CTL];
  size_t nctl;
  /* The nonces of the shared pools this process created (pp_share_create;
   * emptied in a child of fork, which owns none): "a handle of this
   * process's own pool" without pid numbers. An owner and a worker in two
   * pid namespaces may both be pid 1, and the handle's owner_pid (the
   * owner's number, in its namespace) then equalled the worker's getpid():
   * the worker closed every control descriptor it received and no attach
   * could work (issue 36, third round). */
  uint64_t *own;
  size_t nown, cown;
} wk = {.lock = {.m = PTHREAD_MUTEX_INITIALIZER}};

int pp_share_own_add(uint64_t nonce) {
  int rc = 0;
  pp_mutex_lock(&wk.lock);
  if (wk.nown == wk.cown) {
    size_t n = wk.cown == 0 ? 4 : wk.cown * 2;
    uint64_t *t = realloc(wk.own, n * sizeof *t);
    if (t == NULL)
      rc = pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory");
    else {
      wk.own = t;
      wk.cown = n;
    }
  }
  if (rc == 0)
    wk.own[wk.nown++] = nonce;
  pp_mutex_unlock(&wk.lock);
  return rc;
}

void pp_share_own_del(uint64_t nonce) {
  pp_mutex_lock(&wk.lock);
  for (size_t i = 0; i < wk.nown; i++)
    if (wk.own[i] == nonce) {
      wk.own[i] = wk.own[--wk.nown];
      break;
    }
  pp_mutex_unlock(&wk.lock);
}

/* h names a pool this process created (wk.lock held). */
static bool own_locked(const pinpool_share_handle_t *h) {
  for (size_t i = 0; i < wk.nown; i++)
    if (wk.own[i] == h->nonce)
      return true;
  return false;
}

static bool own(const pinpool_share_handle_t *h) {
  pp_mutex_lock(&wk.lock);
  bool r = own_locked(h);
  pp_mutex_unlock(&wk.lock);
  return r;
}

int pinpool_share_owns(const pinpool_share_handle_t *h) {
  if (h == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_owns: handle is NULL");
  return own(h) ? 1 : 0;
}

/* Both of this file's locks (never held together elsewhere): a child must
 * not inherit either held. ios is defined below. */
static void ios_fork(int phase);
void pp_share_worker_fork(int phase) {
  if (phase == PP_FORK_PREPARE) {
    pp_mutex_lock(&wk.lock);
    ios_fork(phase);
  } else {
    ios_fork(phase);
    if (phase == PP_FORK_CHILD)
      wk.nown = 0; /* the parent's pools are not the child's */
    pp_mutex_unlock(&wk.lock);
  }
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
  /* F_GET_SEALS first: it answers for a shmem or hugetlbfs file only and
   * asks no file system. The fstat after it is then a memory file's; on
   * a FUSE file fstat is a request to the peer's daemon, answered when it
   * likes, on the caller's thread (issue 36, rv3637f, D3). */
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is not a memfd "
                   "(F_GET_SEALS: %s)",
                   fd, strerror(errno));
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
  if ((seals & SEALS_NEEDED) != SEALS_NEEDED || (seals & SEALS_FORBIDDEN))
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d has seals %#x, "
                   "expected shrink, grow and seal (and no write seal)",
                   fd, (unsigned)seals);
  if ((uint64_t)st.st_size != h->chunk_size)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is %lld bytes, the "
                   "handle's chunk %llu",
                   fd, (long long)st.st_size,
                   (unsigned long long)h->chunk_size);
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || (fl & O_ACCMODE) != O_RDWR)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is not open "
                   "read-write",
                   fd);
  return 0;
}

/* cfd is the handle's control area: the memfd of inode ctl_ino, its size,
 * sealed against resizing and against every write. 0 or EBADHANDLE. */
static int check_ctl(const pinpool_share_handle_t *h, int cfd) {
  /* F_GET_SEALS before the fstat, as in check_fd (a peer's FUSE file). */
  int seals = fcntl(cfd, F_GET_SEALS);
  struct stat st;
  if (seals < 0 || fstat(cfd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (uint64_t)st.st_dev != h->dev || (uint64_t)st.st_ino != h->ctl_ino)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: descriptor %d is not the handle's "
                   "control area (inode %llu)",
                   cfd, (unsigned long long)h->ctl_ino);
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) !=
          (F_SEAL_SHRINK | F_SEAL_GROW) ||
      (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) == 0)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: control descriptor %d has seals "
                   "%#x: not sealed against writes and resizing",
                   cfd, (unsigned)seals);
  if ((uint64_t)st.st_size != pp_ctl_bytes(h->chunk_size))
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_attach: control descriptor %d is %lld "
                   "bytes, expected %llu",
                   cfd, (long long)st.st_size,
                   (unsigned long long)pp_ctl_bytes(h->chunk_size));
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

/* The descriptor of h's control area to map (lock held): ctl_fd if given,
 * else one received with a handle of this chunk, else the inherited
 * owner_ctl_fd if it is that file; *pending: the index of a received one
 * (to close once mapped), else -1. -1 if none. */
static int find_ctl(const pinpool_share_handle_t *h, int ctl_fd,
                    long *pending) {
  *pending = -1;
  if (ctl_fd >= 0)
    return ctl_fd;
  for (size_t i = 0; i < wk.nctl; i++)
    if (wk.ctl[i].dev == h->dev && wk.ctl[i].ino == h->ino &&
        wk.ctl[i].ctl_ino == h->ctl_ino) {
      *pending = (long)i;
      return wk.ctl[i].fd;
    }
  /* owner_ctl_fd is a number a peer wrote: here it may name any file,
   * one a peer sent included (a FUSE file): F_GET_SEALS before fstat. */
  struct stat st;
  if (h->owner_ctl_fd >= 0 && fcntl(h->owner_ctl_fd, F_GET_SEALS) >= 0 &&
      fstat(h->owner_ctl_fd, &st) == 0 && (uint64_t)st.st_dev == h->dev &&
      (uint64_t)st.st_ino == h->ctl_ino)
    return h->owner_ctl_fd;
  return -1;
}

/*
 * Disposing of a descriptor a peer sent that is not kept (issue 36: the
 * third and fifth reviews, rv3637f and rv39s). A peer chooses what it
 * sends, and the last close of some files waits on the peer: a TCP socket
 * with SO_LINGER and unsent data to a peer that does not read waits out the
 * linger; an AF_UNIX socket whose receive queue holds such a socket
 * releases it, and waits the same, in whichever thread closes the unix
 * socket; a file of a FUSE mount the peer serves waits for its daemon's
 * answer to FLUSH, without end. And not only close: a peer that keeps its
 * own copy of what it sent can sit in a system call that holds the
 * object's kernel lock while it faults on a page nobody serves (its
 * userfaultfd, a file of its FUSE mount): a unix socket's recv holds the
 * socket's iolock, a pipe's write the pipe's mutex, a TCP send lock_sock,
 * as long as the peer likes; our recvmsg(MSG_DONTWAIT), F_GETPIPE_SZ and
 * setsockopt(SO_LINGER) on that object then wait for it (rv39s D1: the
 * earlier design called them on the caller's thread, 5 s each in
 * uffd_stall, for ever in fuse_pipe_stall).
 *
 * The rule: THE CALLER'S THREAD DOES NOTHING TO A PEER'S DESCRIPTOR EXCEPT
 * fcntl(F_GET_SEALS) AND THE close() OF A MEMORY FILE. F_GET_SEALS
 * (memfd_fcntl) looks at the file's operations and answers -EINVAL for
 * anything but shmem or hugetlbfs without a lock or a call into a file
 * system or socket; on a memory file it reads the seals under no lock the
 * peer can hold for long (the inode's seals word). The last close of a
 * shmem file frees its pages and calls no peer (no flush, no linger).
 *
 * Everything else goes to the closers: at most CLOSERS detached threads,
 * one started when a descriptor is queued and none waits. A closer, with
 * one budget per received message (DRAIN_MAX descriptors and DRAIN_CALLS
 * calls, however many of the message's descriptors and however deep),
 * neutralises what it takes: a memory file is closed; any socket gets
 * SO_LINGER {1, 0} (an abortive close) whatever the budget (rv39s D2:
 * past the old budget, sockets were queued un-neutralised); an AF_UNIX
 * one has its ancillary-data options turned off (SO_PASSCRED,
 * SO_PASSPIDFD, SO_PASSSEC, timestamps: a peer that set them on the socket
 * it sent made the drain's control buffer too small, MSG_CTRUNC, and the
 * kernel released the rest: rv39s D4), is shut down and drained
 * breadth-first: each message read from it has its memory files, sockets
 * other than unix ones and other files closed at once, and only its unix
 * sockets are kept, on a worklist, to be drained after (rv39s D3: the
 * recursion held every level's descriptors open, ~1270 from one message,
 * and at RLIMIT_NOFILE the kernel truncated). Before each drain recvmsg
 * the closer checks that the process has room for a whole message under
 * RLIMIT_NOFILE; without it, it stops draining and closes (which may
 * release what is left on that closer, never on a caller's thread).
 *
 * The bound (rv39s D1, D5): the closers' queue grows as needed, but
 * pinpool_share_recv reads no new message while CLOSER_QUEUE descriptors
 * or more are handed to the closers and not closed yet (queued or in a
 * closer's hands): PINPOOL_EBUSY, nothing read. One message carries at
 * most RECV_MAX_FDS, so this process holds at most CLOSER_QUEUE - 1 +
 * RECV_MAX_FDS (+ 2 per part-received message kept) peer's descriptors
 * waiting for the closers. Past the bound nothing is closed on the
 * caller's thread (the earlier design did: rv39s D2's 69th lingering
 * socket, 8.1 s). A peer that stalls every closer for good (CLOSERS
 * descriptors whose close or drain never ends) stalls disposal: receiving
 * then refuses, with PINPOOL_EBUSY, until they free (docs/sharing.md).
 *
 * Which kinds can still wait on a closer (docs/sharing.md): a FUSE file
 * (FLUSH), an NFS/CIFS/9p file open for writing, a tty (closing_wait), a
 * block device, a device whose driver drains in release, a kTLS socket,
 * and any object whose lock a peer holds while it faults on a page nobody
 * serves.
 *
 * The threads run with every signal blocked and never call back into the
 * library. Fork: the child has none of them; its handlers (pthread_atfork,
 * registered with the first thread) keep the queue consistent (the lock is
 * held across fork), mark the threads gone and drop the queue
 * (closer_child): the child's first queued descriptor starts its own.
 */
#define CLOSERS PP_SHARE_CLOSERS
#define CLOSER_QUEUE PP_SHARE_CLOSER_QUEUE
#define DRAIN_DEPTH 4
#define DRAIN_MAX 512
#define DRAIN_CALLS 4096
/* SCM_MAX_FD (include/net/scm.h): the most descriptors one message can
 * carry, however many SCM_RIGHTS headers a peer splits them into. */
#define RECV_MAX_FDS 253

/* One received message's drain budget, shared by the closers that take
 * its descriptors (rv39s D5: the bounds were per descriptor and per
 * drained socket: 455,375 recvmsg calls from one message). */
typedef struct {
  _Atomic long fds, calls;
  _Atomic unsigned refs;
} drain_budget_t;

typedef struct {
  int fd;
  drain_budget_t *b; /* NULL: out of memory, a budget of its own */
} closer_item_t;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t wake;         /* a closer: a descriptor queued */
  pthread_cond_t idle;         /* pp_share_closer_flush: all done */
  closer_item_t *q;            /* a ring from head, n of them, cap; lock */
  size_t head, n, cap;         /* lock */
  unsigned threads;            /* closer threads in this process; lock */
  unsigned waiting;            /* of them, waiting for a descriptor; lock */
  unsigned busy;               /* of them, disposing of one; lock */
  unsigned long inline_closes; /* out of memory, on the caller's; lock */
} closer = {.lock = PTHREAD_MUTEX_INITIALIZER,
            .wake = PTHREAD_COND_INITIALIZER,
            .idle = PTHREAD_COND_INITIALIZER};
static pthread_once_t closer_once = PTHREAD_ONCE_INIT;
_Atomic(unsigned long) pp_share_drain_calls;  /* tests: drain recvmsg calls */
_Atomic(unsigned long) pp_share_drain_ctrunc; /* tests: of them, truncated */

static void closer_prepare(void) { (void)pthread_mutex_lock(&closer.lock); }
static void closer_parent(void) { (void)pthread_mutex_unlock(&closer.lock); }
static void closer_child(void) {
  /* The threads did not survive; their waiters neither (no destroy:
   * glibc's would wait for them). The queue is the parent's: its numbers
   * name the child's copies now, and any the child closes and opens again
   * (a daemon's closefrom) later name the child's own files, which a
   * closer of the child's would close behind its back (rv3637f's
   * closer_fork: 12 of 30). So the child drops the queue without closing:
   * the parent's closers still close the parent's copies, and the child's
   * copies, close-on-exec now (F_SETFD asks no file system), go at its
   * exec or exit, or at the child's own close. The budgets the parent's
   * closers share are not freed (a few bytes). */
  for (size_t i = 0; i < closer.n; i++)
    (void)fcntl(closer.q[(closer.head + i) % closer.cap].fd, F_SETFD,
                FD_CLOEXEC);
  closer.head = 0;
  closer.n = 0;
  closer.threads = 0;
  closer.waiting = 0;
  closer.busy = 0;
  (void)pthread_cond_init(&closer.wake, NULL);
  (void)pthread_cond_init(&closer.idle, NULL);
  (void)pthread_mutex_unlock(&closer.lock);
}
static void closer_atfork(void) {
  (void)pthread_atfork(closer_prepare, closer_parent, closer_child);
}

static void budget_put(drain_budget_t *b) {
  if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1)
    free(b);
}

/* Take one from *c: false when none is left. */
static bool budget_take(_Atomic long *c) { return atomic_fetch_sub(c, 1) > 0; }

/* The number of descriptors open in this process (-1: unknown). */
static int open_fds(void) {
  int d = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (d < 0)
    return -1;
  int n = -1; /* d itself */
  char buf[4096];
  for (;;) {
    long r = syscall(SYS_getdents64, d, buf, sizeof buf);
    if (r <= 0) {
      if (r < 0)
        n = -1;
      break;
    }
    for (long off = 0; off < r;) {
      unsigned short reclen;
      memcpy(&reclen, buf + off + 16, sizeof reclen);
      const char *name = buf + off + 19;
      if (name[0] != '.')
        n++;
      off += reclen;
    }
  }
  (void)close(d);
  return n;
}

/* Room for one more whole message under RLIMIT_NOFILE (rv39s D3), with
 * slack for the rest of the process. */
static bool fd_headroom(int held) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return false;
  if (rl.rlim_cur == RLIM_INFINITY)
    return true;
  int now = open_fds();
  if (now < 0)
    now = held;
  return (rlim_t)now + RECV_MAX_FDS + 32 <= rl.rlim_cur;
}

/* A unix socket to drain, and how deep it was found. */
typedef struct {
  int fd, depth;
} drain_item_t;
typedef struct {
  drain_item_t *v;
  size_t head, n, cap;
} worklist_t;

static bool work_push(worklist_t *w, int fd, int depth) {
  if (w->head + w->n == w->cap) {
    if (w->head > 0) {
      memmove(w->v, w->v + w->head, w->n * sizeof *w->v);
      w->head = 0;
    }
    if (w->n == w->cap) {
      size_t cap = w->cap == 0 ? 16 : w->cap * 2;
      drain_item_t *t = realloc(w->v, cap * sizeof *t);
      if (t == NULL)
        return false;
      w->v = t;
      w->cap = cap;
    }
  }
  w->v[w->head + w->n++] = (drain_item_t){fd, depth};
  return true;
}

/* On a closer: close fd now, or (an AF_UNIX socket within the budget)
 * shut it, neutralise it and put it on w to drain. Every socket gets
 * SO_LINGER {1, 0} first, whatever the budget (rv39s D2). */
static void closer_take(worklist_t *w, int fd, int depth, drain_budget_t *b) {
  if (fcntl(fd, F_GET_SEALS) >= 0) { /* a memory file */
    (void)close(fd);
    return;
  }
  int type = 0, dom = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
    (void)close(fd); /* not a socket: may wait, on this closer only */
    return;
  }
  struct linger l = {1, 0};
  (void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  len = sizeof dom;
  if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &dom, &len) != 0 ||
      dom != AF_UNIX || depth >= DRAIN_DEPTH || !budget_take(&b->fds) ||
      !work_push(w, fd, depth))
    (void)close(fd);
}

/* Options that add ancillary data a drain did not ask for (rv39s D4);
 * Linux's generic numbers where the headers lack them. */
static const int quiet_opts[] = {SO_PASSCRED,
                                 34 /* SO_PASSSEC */,
                                 76 /* SO_PASSPIDFD */,
                                 29 /* SO_TIMESTAMP_OLD */,
                                 35 /* SO_TIMESTAMPNS_OLD */,
                                 37 /* SO_TIMESTAMPING_OLD */,
                                 63 /* SO_TIMESTAMP_NEW */,
                                 64 /* SO_TIMESTAMPNS_NEW */,
                                 65 /* SO_TIMESTAMPING_NEW */,
                                 40 /* SO_RXQ_OVFL */};

/* Drain the unix socket it.fd (on a closer): every descriptor that comes
 * out taken (closer_take). Its close (by the caller) then releases
 * nothing, or what the bounds left. */
static void drain_unix(worklist_t *w, drain_item_t it, drain_budget_t *b) {
  int fd = it.fd;
  int zero = 0, on = 1;
  for (size_t i = 0; i < sizeof quiet_opts / sizeof quiet_opts[0]; i++)
    (void)setsockopt(fd, SOL_SOCKET, quiet_opts[i], &zero, sizeof zero);
  /* Our end shut: the peer's sends fail from here on, connects to a
   * listener are refused, reads end at the queue's end. SO_OOBINLINE: an
   * out-of-band byte (with descriptors) is read in line. */
  if (shutdown(fd, SHUT_RDWR) != 0 && errno != ENOTCONN)
    return;
  (void)setsockopt(fd, SOL_SOCKET, SO_OOBINLINE, &on, sizeof on);
  int listening = 0, type = 0;
  socklen_t len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0)
    return;
  len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
    return;
  while (budget_take(&b->calls)) {
    if (listening) {
      int c = accept4(fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c < 0)
        return;
      closer_take(w, c, it.depth + 1, b);
      continue;
    }
    if (!fd_headroom((int)w->n))
      return; /* the close releases the rest, on this closer */
    char data[256];
    union {
      char b[CMSG_SPACE(RECV_MAX_FDS * sizeof(int)) + 1024];
      struct cmsghdr align;
    } u;
    struct iovec iov = {data, sizeof data};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = u.b,
                       .msg_controllen = sizeof u.b};
    atomic_fetch_add(&pp_share_drain_calls, 1);
    ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return; /* empty, never connected, or an error */
    }
    bool fds = false;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&m); cm != NULL;
         cm = CMSG_NXTHDR(&m, cm)) {
      if (cm->cmsg_level != SOL_SOCKET ||
          (cm->cmsg_type != SCM_RIGHTS && cm->cmsg_type != SCM_PIDFD))
        continue;
      size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; i++) {
        int f;
        memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
        fds = true;
        if (cm->cmsg_type == SCM_PIDFD)
          (void)close(f); /* the kernel's pidfd */
        else
          closer_take(w, f, it.depth + 1, b);
      }
    }
    if (m.msg_flags & MSG_CTRUNC) {
      atomic_fetch_add(&pp_share_drain_ctrunc, 1);
      return;
    }
    if (n == 0 && !fds && type == SOCK_STREAM)
      return; /* the end: shut, and nothing queued */
  }
}

/* On a closer: dispose of fd, a message's descriptor, and of everything
 * it carries, breadth-first within b. */
static void closer_dispose(int fd, drain_budget_t *b) {
  worklist_t w = {0};
  closer_take(&w, fd, 0, b);
  while (w.n > 0) {
    drain_item_t it = w.v[w.head++];
    w.n--;
    drain_unix(&w, it, b);
    (void)close(it.fd);
  }
  free(w.v);
}

static void *closer_main(void *arg) {
  (void)arg;
  (void)pthread_mutex_lock(&closer.lock);
  for (;;) {
    while (closer.n == 0) {
      if (closer.busy == 0)
        (void)pthread_cond_broadcast(&closer.idle);
      closer.waiting++;
      (void)pthread_cond_wait(&closer.wake, &closer.lock);
      closer.waiting--;
    }
    closer_item_t it = closer.q[closer.head];
    closer.head = (closer.head + 1) % closer.cap;
    closer.n--;
    closer.busy++;
    (void)pthread_mutex_unlock(&closer.lock);
    pp_hook(PP_HOOK_SHARE_CLOSER);
    drain_budget_t own_b = {DRAIN_MAX, DRAIN_CALLS, 1};
    closer_dispose(it.fd, it.b != NULL ? it.b : &own_b); /* may wait */
    budget_put(it.b);
    (void)pthread_mutex_lock(&closer.lock);
    closer.busy--;
  }
  return NULL;
}

/* Start one more closer thread (closer.lock held): false where none can be
 * had (the process's thread limit). */
static bool closer_start(void) {
  (void)pthread_once(&closer_once, closer_atfork);
  pthread_attr_t a;
  if (pthread_attr_init(&a) != 0)
    return false;
  (void)pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  /* A drain's control buffer (~2 KiB) and a worklist on the heap; refused
   * below the minimum: the default then. */
  (void)pthread_attr_setstacksize(&a, (size_t)256 << 10);
  sigset_t all, old;
  (void)sigfillset(&all);
  (void)pthread_sigmask(SIG_SETMASK, &all, &old); /* inherited: none */
  pthread_t t;
  int rc = pthread_create(&t, &a, closer_main, NULL);
  (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
  (void)pthread_attr_destroy(&a);
  if (rc == 0)
    closer.threads++;
  return rc == 0;
}

/* Room for one more in the ring (closer.lock held). */
static bool closer_room(void) {
  if (closer.n < closer.cap)
    return true;
  size_t cap =
      closer.cap == 0 ? CLOSER_QUEUE + RECV_MAX_FDS + 2 : closer.cap * 2;
  closer_item_t *t = malloc(cap * sizeof *t);
  if (t == NULL)
    return false;
  for (size_t i = 0; closer.cap > 0 && i < closer.n; i++) /* n <= cap */
    t[i] = closer.q[(closer.head + i) % closer.cap];
  free(closer.q);
  closer.q = t;
  closer.head = 0;
  closer.cap = cap;
  return true;
}

/* Hand fd to the closers, with b (a reference taken here). The queue has
 * no bound of its own: pinpool_share_recv's admission bounds what comes
 * in (pp_share_closers_saturated). Only where no memory can be had for
 * the queue is fd closed here (counted: inline_closes). With no thread to
 * be had it waits in the queue for the next one started. */
static void closer_queue(int fd, drain_budget_t *b) {
  bool queued = false;
  (void)pthread_mutex_lock(&closer.lock);
  if (closer_room()) {
    /* Each waiting thread takes one of those queued: one more is needed
     * when they are all spoken for. */
    if (closer.n >= closer.waiting && closer.threads < CLOSERS)
      (void)closer_start();
    if (b != NULL)
      atomic_fetch_add(&b->refs, 1);
    closer.q[(closer.head + closer.n) % closer.cap] = (closer_item_t){fd, b};
    closer.n++;
    queued = true;
    (void)pthread_cond_signal(&closer.wake);
  }
  if (!queued)
    closer.inline_closes++;
  (void)pthread_mutex_unlock(&closer.lock);
  if (!queued)
    (void)close(fd); /* out of memory: best effort, here */
}

bool pp_share_closers_saturated(void) {
  (void)pthread_mutex_lock(&closer.lock);
  if (closer.n > 0 && closer.threads == 0)
    (void)closer_start(); /* an earlier start failed */
  bool full = closer.n + closer.busy >= CLOSER_QUEUE;
  (void)pthread_mutex_unlock(&closer.lock);
  return full;
}

/* A message's budget: NULL where no memory (each descriptor then gets its
 * own). The caller holds one reference, dropped by budget_put. */
static drain_budget_t *budget_new(void) {
  drain_budget_t *b = malloc(sizeof *b);
  if (b != NULL) {
    atomic_init(&b->fds, DRAIN_MAX);
    atomic_init(&b->calls, DRAIN_CALLS);
    atomic_init(&b->refs, 1);
  }
  return b;
}

/* The caller's thread: F_GET_SEALS, and the close of a memory file; the
 * rest to the closers, with b. */
static void dispose(int fd, drain_budget_t *b) {
  if (fcntl(fd, F_GET_SEALS) >= 0)
    (void)close(fd); /* a memory file: its close never waits */
  else
    closer_queue(fd, b);
}

void pp_share_close_received(int fd) {
  if (fd < 0)
    return;
  drain_budget_t *b = budget_new();
  dispose(fd, b);
  budget_put(b);
}

void pp_share_closer_flush(void) {
  (void)pthread_mutex_lock(&closer.lock);
  while (closer.threads > 0 && (closer.n > 0 || closer.busy > 0))
    (void)pthread_cond_wait(&closer.idle, &closer.lock);
  (void)pthread_mutex_unlock(&closer.lock);
}

bool pp_share_closer_wait(unsigned ms) {
  struct timespec t;
  (void)clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  int rc = 0;
  (void)pthread_mutex_lock(&closer.lock);
  while (rc == 0 && closer.threads > 0 && (closer.n > 0 || closer.busy > 0))
    rc = pthread_cond_timedwait(&closer.idle, &closer.lock, &t);
  bool done = closer.threads == 0 || (closer.n == 0 && closer.busy == 0);
  (void)pthread_mutex_unlock(&closer.lock);
  return done;
}

void pp_share_closer_counts(pp_closer_counts_t *c) {
  (void)pthread_mutex_lock(&closer.lock);
  c->queued = closer.n;
  c->threads = closer.threads;
  c->busy = closer.busy;
  c->inline_closes = closer.inline_closes;
  (void)pthread_mutex_unlock(&closer.lock);
}

void pp_share_ctl_received(const pinpool_share_handle_t *h, int ctl_fd,
                           int sock) {
  /* Kept only for a handle of another process's pool (a handle of this
   * process's own, e.g. a worker's return with its control area, never
   * needs it: the owner maps its chunks itself), and only a descriptor
   * that is the handle's control area (inode, seals, size): a peer cannot
   * park other files, or unsealed memory, here. At most MAX_CTL are kept,
   * in any process: a process that owns chunks and also works for another
   * pool keeps that pool's control areas as a worker does (the handle's
   * nonce, one of this process's pools or not, tells the two apart; a peer that
   * forges it can park at most MAX_CTL sealed memfds, as it can in any worker).
   */
  if (own(h) || check_ctl(h, ctl_fd) != 0) {
    pp_share_close_received(ctl_fd);
    return;
  }
  struct stat sst;
  uint64_t src = fstat(sock, &sst) == 0 ? (uint64_t)sst.st_ino : 0;
  int drop = -1;
  pp_mutex_lock(&wk.lock);
  wchunk_t *c = wk.chunks;
  while (c != NULL && !(c->dev == h->dev && c->ino == h->ino))
    c = c->next;
  /* The same file again (same chunk and control inode) replaces its
   * entry; a different control area named for the same chunk is another
   * entry: before, any peer's forged handle naming a genuine chunk
   * replaced (closed) the genuine descriptor. */
  size_t i = 0;
  while (i < wk.nctl && !(wk.ctl[i].dev == h->dev && wk.ctl[i].ino == h->ino &&
                          wk.ctl[i].ctl_ino == h->ctl_ino))
    i++;
  if (c != NULL) {
    drop = ctl_fd; /* mapped already: its control area is mapped too */
  } else if (i < wk.nctl) {
    drop = wk.ctl[i].fd; /* the newer one replaces it */
    wk.ctl[i].fd = ctl_fd;
  } else {
    /* Before, the oldest of the table went: a peer sending MAX_CTL
     * forged handles (a process in both roles, issue 36 third round)
     * evicted the genuine owner's descriptor and its attach failed. Now
     * the sender's own oldest goes when it has MAX_CTL_PER_SRC kept, or,
     * the table full, the oldest of the socket with the most. */
    size_t mine = 0, victim = MAX_CTL, most = 0;
    for (size_t k = 0; k < wk.nctl; k++)
      if (wk.ctl[k].src == src && mine++ == 0)
        victim = k;
    if (mine < MAX_CTL_PER_SRC)
      victim = MAX_CTL;
    if (victim == MAX_CTL && wk.nctl == MAX_CTL) {
      for (size_t k = 0; k < wk.nctl; k++) {
        size_t n = 0;
        for (size_t j = 0; j < wk.nctl; j++)
          n += wk.ctl[j].src == wk.ctl[k].src;
        if (n > most) {
          most = n;
          victim = k;
        }
      }
    }
    if (victim < MAX_CTL) {
      drop = wk.ctl[victim].fd;
      memmove(&wk.ctl[victim], &wk.ctl[victim + 1],
              (wk.nctl - victim - 1) * sizeof wk.ctl[0]);
      wk.nctl--;
    }
    wk.ctl[wk.nctl++] =
        (ctl_pending_t){h->dev, h->ino, h->ctl_ino, ctl_fd, src};
  }
  pp_mutex_unlock(&wk.lock);
  if (drop >= 0)
    (void)close(drop);
}

int pinpool_share_attach_ctl(const pinpool_share_handle_t *h, int fd,
                             int ctl_fd, void **out) {
  if (h == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_attach: NULL argument");
  int rc = check_handle(h);
  if (rc == 0 && fd >= 0)
    rc = check_fd(h, fd);
  if (rc == 0 && ctl_fd >= 0)
    rc = check_ctl(h, ctl_fd);
  if (rc != 0)
    return rc;
  pp_mutex_lock(&wk.lock);
  wchunk_t *c = wk.chunks;
  while (c != NULL && !(c->dev == h->dev && c->ino == h->ino))
    c = c->next;
  bool fresh = false;
  long pending = -1;
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
    int cfd = find_ctl(h, ctl_fd, &pending);
    if (cfd < 0)
      rc = bad("pinpool_share_attach: %s",
               "no descriptor of the chunk's control area (it comes with "
               "the handle from pinpool_share_send, or is inherited)");
    else if (cfd != ctl_fd)
      rc = check_ctl(h, cfd);
    if (rc == 0)
      c = calloc(1, sizeof *c);
    if (rc == 0 && c == NULL) {
      rc = pp_fail(PINPOOL_ENOMEM, "pinpool_share_attach: out of memory");
    } else if (rc == 0) {
      *c = (wchunk_t){NULL,     h->dev,      h->ino,
                      h->nonce, h->chunk_id, h->chunk_size,
                      NULL,     NULL,        pp_ctl_bytes(h->chunk_size),
                      0};
      /* Read-only, from a descriptor sealed against writes (and opened
       * read-only by the owner): no process but the owner can write it. */
      c->ctl = mmap(NULL, c->ctl_len, PROT_READ, MAP_SHARED, cfd, 0);
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
  int drop = -1;
  if (pending >= 0) { /* mapped: the received descriptor is done */
    drop = wk.ctl[pending].fd;
    memmove(&wk.ctl[pending], &wk.ctl[pending + 1],
            (wk.nctl - (size_t)pending - 1) * sizeof wk.ctl[0]);
    wk.nctl--; /* in age order: the eviction takes the oldest */
  }
  if (fresh) {
    c->next = wk.chunks;
    wk.chunks = c;
  }
  c->refs++;
  char *p = c->base + h->offset;
  wk.att[wk.natt++] = (attachment_t){p, c};
  pp_mutex_unlock(&wk.lock);
  if (drop >= 0)
    (void)close(drop);
  *out = p;
  return 0;
}

int pinpool_share_attach(const pinpool_share_handle_t *h, int fd, void **out) {
  return pinpool_share_attach_ctl(h, fd, -1, out);
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

size_t pp_share_worker_pending_ctl(void) {
  pp_mutex_lock(&wk.lock);
  size_t n = wk.nctl;
  pp_mutex_unlock(&wk.lock);
  return n;
}

/* ---- Passing a handle and its descriptors --------------------------------
 * One message: the handle's 128 bytes, with the descriptors as SCM_RIGHTS
 * ancillary data on the first byte: the chunk's and, from the owner, its
 * control area's. A stream socket may deliver or accept the bytes in
 * pieces: what a call could not finish is kept per socket (struct io
 * below) and finished by the next call on that socket, so that a message
 * is never split between two readers' idea of the stream. A kept piece is
 * taken out of the table while its call runs (no lock over a system
 * call); two threads on one socket at once are the caller's race, as they
 * would be for any stream. */

_Atomic(size_t) pp_share_io_cap; /* tests: bytes per send/recv call, 0 all */

static size_t io_len(size_t left) {
  size_t cap = pp_load_relaxed(&pp_share_io_cap);
  return cap != 0 && cap < left ? cap : left;
}

typedef struct io {
  int sock;
  uint64_t sdev, sino; /* the socket: a reused descriptor number is another */
  bool tx;
  size_t done; /* bytes received or sent */
  unsigned char buf[sizeof(pinpool_share_handle_t)];
  int fds[2]; /* received: the chunk's, the control area's */
  int nfds;
  int err;         /* received: reported once the message is complete */
  struct io *dead; /* pruned, to be freed once ios.lock is dropped */
} io_t;
/* The table grows as needed: one piece per open socket and direction at
 * most, so it is bounded by RLIMIT_NOFILE; pieces of sockets closed since
 * are dropped when it is full (the check below), before it grows. It never
 * drops a live socket's piece to make room: that socket would read the
 * rest of its message as the start of the next (issue 36, second round:
 * the 65th stalled peer used to evict the oldest, an honest one). */
static struct {
  pp_mutex_t lock;
  io_t **io;
  size_t n, cap;
} ios = {.lock = {.m = PTHREAD_MUTEX_INITIALIZER}};

static void ios_fork(int phase) {
  if (phase == PP_FORK_PREPARE)
    pp_mutex_lock(&ios.lock);
  else
    pp_mutex_unlock(&ios.lock);
}

/* Never under ios.lock: the descriptors are a peer's (their close may
 * block, pp_share_close_received), and every socket's call waits for the
 * lock. */
static void io_free(io_t *p) {
  if (p == NULL)
    return;
  drain_budget_t *b = p->nfds > 0 ? budget_new() : NULL;
  for (int i = 0; i < p->nfds; i++) /* one message: one budget */
    dispose(p->fds[i], b);
  budget_put(b);
  free(p);
}

static void io_free_list(io_t *p) {
  while (p != NULL) {
    io_t *next = p->dead;
    io_free(p);
    p = next;
  }
}

/* A kept piece's descriptor number may name another file since, one a
 * peer sent included (a FUSE file, whose fstat is a request to its
 * daemon): SO_TYPE first, which fails with ENOTSOCK on anything but a
 * socket and asks no file system; a socket's fstat never leaves the
 * kernel. */
static bool sock_id(int sock, uint64_t *dev, uint64_t *ino) {
  int type;
  socklen_t tlen = sizeof type;
  if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0)
    return false;
  struct stat st;
  if (fstat(sock, &st) != 0)
    return false;
  *dev = (uint64_t)st.st_dev;
  *ino = (uint64_t)st.st_ino;
  return true;
}

/* Take the kept piece of sock's direction tx out of the table (NULL if
 * none, or if the descriptor number now names another socket: then the
 * old piece is dropped). */
/* Drop the pieces of sockets closed since they were kept (ios.lock held):
 * before, one stayed, with the descriptors it had received, until its
 * descriptor number named a socket again or the table filled. No piece
 * kept: nothing done (the common case costs nothing). The pieces dropped
 * are chained on *dead, for io_free_list once the lock is dropped. */
static void ios_prune_locked(io_t **dead) {
  for (size_t i = 0; i < ios.n;) {
    uint64_t dev, ino;
    io_t *q = ios.io[i];
    if (!sock_id(q->sock, &dev, &ino) || dev != q->sdev || ino != q->sino) {
      ios.io[i] = ios.io[--ios.n];
      q->dead = *dead;
      *dead = q;
    } else {
      i++;
    }
  }
}

static io_t *io_take(int sock, bool tx) {
  io_t *p = NULL, *dead = NULL;
  pp_mutex_lock(&ios.lock);
  pp_hook(PP_HOOK_SHARE_IO);
  ios_prune_locked(&dead);
  for (size_t i = 0; i < ios.n; i++)
    if (ios.io[i]->sock == sock && ios.io[i]->tx == tx) {
      p = ios.io[i];
      ios.io[i] = ios.io[--ios.n];
      break;
    }
  pp_mutex_unlock(&ios.lock);
  io_free_list(dead);
  uint64_t dev, ino;
  if (p != NULL &&
      (!sock_id(sock, &dev, &ino) || dev != p->sdev || ino != p->sino)) {
    io_free(p);
    p = NULL;
  }
  return p;
}

/* Keep p (a partial message) for the next call on its socket. */
static int io_keep(io_t *p) {
  if (p->sdev == 0 && p->sino == 0 && !sock_id(p->sock, &p->sdev, &p->sino)) {
    io_free(p);
    return -1;
  }
  io_t *dead = NULL;
  pp_mutex_lock(&ios.lock);
  if (ios.n == ios.cap) {
    /* Full: drop the pieces of sockets closed since (freed, and their
     * descriptors closed, after the lock), then grow. */
    ios_prune_locked(&dead);
  }
  if (ios.n == ios.cap) {
    size_t cap = ios.cap == 0 ? 64 : ios.cap * 2;
    io_t **t = realloc(ios.io, cap * sizeof(io_t *));
    if (t == NULL) { /* this socket's piece is lost, and said so */
      pp_mutex_unlock(&ios.lock);
      io_free_list(dead);
      io_free(p);
      return -1;
    }
    ios.io = t;
    ios.cap = cap;
  }
  ios.io[ios.n++] = p;
  pp_mutex_unlock(&ios.lock);
  io_free_list(dead);
  return 0;
}

/* Pieces of messages kept (tests). */
size_t pp_share_io_kept(void) {
  pp_mutex_lock(&ios.lock);
  size_t n = ios.n;
  pp_mutex_unlock(&ios.lock);
  return n;
}

static int sock_fail(const char *fn, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK)
    return pp_fail(PINPOOL_EAGAIN,
                   "%s: the socket would block (what arrived of the message "
                   "is kept: call again)",
                   fn);
  if (err == EINTR)
    return pp_fail(PINPOOL_EINTR,
                   "%s: interrupted by a signal (what arrived of the message "
                   "is kept: call again)",
                   fn);
  if (err == EMFILE || err == ENFILE || err == ETOOMANYREFS)
    return pp_fail(PINPOOL_ELIMIT, "%s: %s (descriptor limit: RLIMIT_NOFILE)",
                   fn, strerror(err));
  if (err == EPIPE || err == ECONNRESET)
    return pp_fail(PINPOOL_ECLOSED, "%s: the peer closed the socket (%s)", fn,
                   strerror(err));
  return pp_fail(PINPOOL_EBACKEND, "%s: %s", fn, strerror(err));
}

/* The descriptors to send with h: fd, and the owner's control area. */
static int send_fds(const pinpool_share_handle_t *h, int fd, int fds[2]) {
  int n = 0;
  if (fd < 0)
    return 0;
  if (fcntl(fd, F_GETFD) < 0)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_share_send: %d is not an open descriptor", fd);
  fds[n++] = fd;
  struct stat st;
  if (own(h) && h->owner_ctl_fd >= 0 &&
      fcntl(h->owner_ctl_fd, F_GET_SEALS) >= 0 &&
      fstat(h->owner_ctl_fd, &st) == 0 && (uint64_t)st.st_dev == h->dev &&
      (uint64_t)st.st_ino == h->ctl_ino)
    fds[n++] = h->owner_ctl_fd;
  return n;
}

/* Send what is left of p (its first byte carried the descriptors). */
static int send_rest(io_t *p) {
  while (p->done < sizeof p->buf) {
    ssize_t n = send(p->sock, p->buf + p->done, io_len(sizeof p->buf - p->done),
                     MSG_NOSIGNAL);
    if (n < 0)
      return -errno;
    p->done += (size_t)n;
  }
  return 0;
}

int pinpool_share_send(int sock, const pinpool_share_handle_t *h, int fd) {
  if (h == NULL || sock < 0)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_send: bad argument");
  io_t *p = io_take(sock, true);
  if (p != NULL) { /* finish the message an earlier call began */
    int e = send_rest(p);
    if (e == -EAGAIN || e == -EWOULDBLOCK || e == -EINTR) {
      int rc = sock_fail("pinpool_share_send", -e);
      if (io_keep(p) != 0)
        return pp_fail(PINPOOL_EBACKEND,
                       "pinpool_share_send: a part-sent message was lost "
                       "(the socket cannot be identified, or out of memory)");
      return rc;
    }
    bool same = memcmp(p->buf, h, sizeof p->buf) == 0;
    io_free(p);
    if (e != 0)
      return sock_fail("pinpool_share_send", -e);
    if (same) /* this call was the retry of that message: done */
      return 0;
  }
  int fds[2];
  int nfds = send_fds(h, fd, fds);
  if (nfds < 0)
    return nfds;
  union {
    char buf[CMSG_SPACE(2 * sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)h, io_len(sizeof *h)};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds > 0) {
    msg.msg_control = u.buf;
    msg.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
  }
  ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
  if (n < 0) /* nothing sent: nothing kept, the same call again */
    return sock_fail("pinpool_share_send", errno);
  if ((size_t)n == sizeof *h)
    return 0;
  p = calloc(1, sizeof *p);
  if (p == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_share_send: out of memory (a "
                                   "message is part-sent)");
  *p = (io_t){.sock = sock, .tx = true, .done = (size_t)n};
  memcpy(p->buf, h, sizeof p->buf);
  int e = send_rest(p);
  if (e == 0) {
    io_free(p);
    return 0;
  }
  if (e == -EAGAIN || e == -EWOULDBLOCK || e == -EINTR) {
    int rc = sock_fail("pinpool_share_send", -e);
    if (io_keep(p) != 0)
      return pp_fail(PINPOOL_EBACKEND,
                     "pinpool_share_send: a part-sent message was lost (the "
                     "socket cannot be identified, or out of memory)");
    return rc;
  }
  io_free(p);
  return sock_fail("pinpool_share_send", -e);
}

/* The control buffer of one recvmsg. Room for every descriptor a message
 * can carry, and for the credentials and pidfd that SO_PASSCRED and
 * SO_PASSPIDFD (the caller's socket options) add: without room the kernel
 * drops the rest and closes each one itself, in this thread, and the close
 * of a peer's TCP socket with SO_LINGER and unsent data waits out the
 * linger, O_NONBLOCK or not (issue 36, fourth review, item 1: the room was
 * for 4; a peer's 5th held the receiver 8 s). About 1 KiB of stack. */
typedef union {
  char buf[CMSG_SPACE(RECV_MAX_FDS * sizeof(int)) +
           CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int))];
  struct cmsghdr align;
} recv_control_t;

/* Take the descriptors of msg's control messages into p (at most 2 kept;
 * more: all closed, without waiting on the peer, and the message marked
 * bad). A pidfd from SO_PASSPIDFD is none of the message's: closed. */
static void take_fds(io_t *p, struct msghdr *msg) {
  drain_budget_t *b = budget_new(); /* one for the message (rv39s D5) */
  for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm != NULL;
       cm = CMSG_NXTHDR(msg, cm)) {
    if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_PIDFD &&
        cm->cmsg_len >= CMSG_LEN(sizeof(int))) {
      int f;
      memcpy(&f, CMSG_DATA(cm), sizeof f);
      (void)close(f); /* a pidfd: its close never waits */
      continue;
    }
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
      continue;
    size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int f;
      memcpy(&f, CMSG_DATA(cm) + i * sizeof(int), sizeof f);
      if (p->nfds < 2 && p->err == 0) {
        p->fds[p->nfds++] = f;
      } else {
        dispose(f, b);
        p->err = PINPOOL_EBADHANDLE;
      }
    }
  }
  if (p->err == PINPOOL_EBADHANDLE) /* several: none is trusted */
    for (; p->nfds > 0; p->nfds--)
      dispose(p->fds[p->nfds - 1], b);
  budget_put(b);
}

int pinpool_share_recv(int sock, pinpool_share_handle_t *h, int *fd) {
  if (h == NULL || fd == NULL || sock < 0)
    return pp_fail(PINPOOL_EINVAL, "pinpool_share_recv: bad argument");
  /* SOCK_SEQPACKET and SOCK_DGRAM deliver a message whole or not at all:
   * one shorter than a handle is a bad message, never the start of one (a
   * piece kept would swallow the next, good, message). Only a stream
   * delivers in pieces. */
  int type = SOCK_STREAM;
  socklen_t tlen = sizeof type;
  if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0)
    return errno == ENOTSOCK || errno == EBADF
               ? pp_fail(PINPOOL_EINVAL,
                         "pinpool_share_recv: %d is not a socket", sock)
               : sock_fail("pinpool_share_recv", errno);
  bool stream = type == SOCK_STREAM;
  io_t *p = io_take(sock, false);
  if (p == NULL) {
    p = calloc(1, sizeof *p);
    if (p == NULL)
      return pp_fail(PINPOOL_ENOMEM, "pinpool_share_recv: out of memory");
    p->sock = sock;
  }
  bool short_dgram = false;
  while (p->done < sizeof p->buf) {
    if (pp_share_closers_saturated()) {
      /* Back-pressure (rv39s): the closers hold CLOSER_QUEUE or more of
       * the peers' descriptors; a message read now could add RECV_MAX_FDS
       * more. Nothing is read; what arrived before is kept. */
      if (p->done == 0 && p->nfds == 0 && p->err == 0)
        io_free(p);
      else if (io_keep(p) != 0)
        return pp_fail(PINPOOL_EBACKEND,
                       "pinpool_share_recv: a part-received message was "
                       "lost (the socket cannot be identified, or out of "
                       "memory)");
      return pp_fail(PINPOOL_EBUSY,
                     "pinpool_share_recv: the closers are saturated (%d or "
                     "more descriptors peers sent wait to be closed): "
                     "nothing read, call again once they free",
                     PP_SHARE_CLOSER_QUEUE);
    }
    /* Room for every descriptor a message can carry (recv_control_t), so
     * that a peer sending more than two is detected and its descriptors
     * closed here without waiting, never dropped by the kernel. */
    recv_control_t u;
    memset(&u, 0, sizeof u);
    size_t left = sizeof p->buf - p->done;
    struct iovec iov = {p->buf + p->done, stream ? io_len(left) : left};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = u.buf,
                         .msg_controllen = sizeof u.buf};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      int e = errno;
      if (e == EAGAIN || e == EWOULDBLOCK || e == EINTR) {
        int rc = sock_fail("pinpool_share_recv", e);
#ifdef PINPOOL_MUTANT_SHARE_NO_KEEP
        /* Mutant (docs/verification.md): what arrived is dropped. */
        if (true)
#else
        if (p->done == 0 && p->nfds == 0 && p->err == 0)
#endif
          io_free(p); /* nothing arrived: nothing to keep */
        else if (io_keep(p) != 0)
          return pp_fail(
              PINPOOL_EBACKEND,
              "pinpool_share_recv: a part-received message was "
              "lost (the socket cannot be identified, or out of memory)");
        return rc;
      }
      bool within = p->done > 0;
      io_free(p);
      return within && e == ECONNRESET
                 ? pp_fail(PINPOOL_ECLOSED, "pinpool_share_recv: the peer "
                                            "closed the socket within a "
                                            "message")
                 : sock_fail("pinpool_share_recv", e);
    }
    take_fds(p, &msg);
    if ((msg.msg_flags & MSG_CTRUNC) && p->err == 0) {
      /* With room for SCM_MAX_FD, only this process's RLIMIT_NOFILE (the
       * kernel closed the rest) or control data this code does not expect:
       * the message is refused whole, its descriptors closed, reported
       * when it is complete (the stream stays in step). */
      p->err = PINPOOL_ELIMIT;
      for (; p->nfds > 0; p->nfds--)
        pp_share_close_received(p->fds[p->nfds - 1]);
    }
    if (msg.msg_flags & MSG_TRUNC) /* a datagram longer than a handle */
      p->err = p->err != 0 ? p->err : PINPOOL_EBADHANDLE;
    if (!stream && (size_t)n != left && (n > 0 || type == SOCK_DGRAM)) {
      /* A short message (a datagram's 0 bytes too: it has no end of
       * stream): refused whole, with its descriptors. */
      short_dgram = true;
      p->err = p->err != 0 ? p->err : PINPOOL_EBADHANDLE;
      p->done = sizeof p->buf;
      break;
    }
    if (n == 0) {
      bool within = p->done > 0;
      io_free(p);
      return pp_fail(PINPOOL_ECLOSED, within ? "pinpool_share_recv: the peer "
                                               "closed the socket within a "
                                               "message"
                                             : "pinpool_share_recv: the peer "
                                               "closed the socket");
    }
    p->done += (size_t)n;
  }
  pinpool_share_handle_t tmp;
  memcpy(&tmp, p->buf, sizeof tmp);
  int err = p->err;
  if (err == 0 && (tmp.magic != PINPOOL_SHARE_MAGIC ||
                   tmp.version != PINPOOL_SHARE_VERSION))
    err = PINPOOL_EBADHANDLE;
  if (err != 0) {
    io_free(p);
    if (err == PINPOOL_ELIMIT)
      return pp_fail(PINPOOL_ELIMIT,
                     "pinpool_share_recv: a descriptor was dropped "
                     "(MSG_CTRUNC: this process is at RLIMIT_NOFILE, or the "
                     "peer sent control data that does not fit): the "
                     "message is refused");
    if (short_dgram)
      return pp_fail(PINPOOL_EBADHANDLE,
                     "pinpool_share_recv: a message shorter than a handle "
                     "(on a SOCK_SEQPACKET/SOCK_DGRAM socket: discarded "
                     "whole)");
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_share_recv: the message is not a pinpool handle "
                   "(bad magic or version, too many descriptors, or too "
                   "long)");
  }
  int got = p->nfds > 0 ? p->fds[0] : -1;
  if (p->nfds > 1)
    pp_share_ctl_received(&tmp, p->fds[1], sock);
  p->nfds = 0;
  io_free(p);
  *h = tmp;
  *fd = got;
  return 0;
}
