/* Disposal of the descriptors a peer sends (issue 36, the review rv3637f;
 * docs/sharing.md, "What a peer's descriptors can do"; docs/verification.md,
 * "Issue 36, rv3637f").
 *
 * fuse: no call that a FUSE daemon answers (fstat, fstatfs: GETATTR,
 * STATFS; anything else) is made on the caller's thread for a descriptor a
 * peer sent: a daemon in this test counts the requests each thread makes
 * (the request's pid is the thread's id), and the receiving thread must
 * make none, in each path that meets such a descriptor. Needs root and
 * /dev/fuse (a private mount namespace, in a child): skipped without. */
#include "testutil.h"

#include "share.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fuse.h>
#include <linux/userfaultfd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_FDS 253 /* SCM_MAX_FD */
#define SKIPPED 77

/* The checks run in forked children too, where a cmocka failure would go
 * on with the runner in the child: there a failure is a message and
 * _exit(1), reported by the parent's wait. */
static bool in_child;
#define CK(cond, ...)                                                          \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (in_child) {                                                          \
        fprintf(stderr, "ERROR (%s:%d, child): ", __FILE__, __LINE__);         \
        fprintf(stderr, __VA_ARGS__);                                          \
        fprintf(stderr, "\n");                                                 \
        _exit(1);                                                              \
      }                                                                        \
      PP_FAIL(__VA_ARGS__);                                                    \
    }                                                                          \
  } while (0)
#define CK_RC(expr, expected)                                                  \
  do {                                                                         \
    int rc_ = (expr);                                                          \
    CK(rc_ == (expected), "%s: %d (%s), expected %d", #expr, rc_,              \
       pinpool_strerror(rc_), (expected));                                     \
  } while (0)

/* Send len bytes of h with fds[0..n) on the first byte. */
static void send_with(int sock, const void *h, size_t len, const int *fds,
                      int n) {
  union {
    char b[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct cmsghdr al;
  } u;
  CK(n <= MAX_FDS, "%d descriptors", n);
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)h, len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (n > 0) {
    m.msg_control = u.b;
    m.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
    memcpy(CMSG_DATA(cm), fds, (size_t)n * sizeof(int));
  }
  CK(sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)len, "sendmsg: %s",
     strerror(errno));
}

/* A handle of no pool of this process's, well formed. */
static pinpool_share_handle_t foreign_handle(void) {
  pinpool_share_handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = PINPOOL_SHARE_MAGIC;
  h.version = PINPOOL_SHARE_VERSION;
  h.nonce = 0x5eed5eed5eed5eedull;
  h.chunk_id = 1;
  h.generation = 1;
  h.chunk_size = 1 << 20;
  h.length = 4096;
  h.ino = 777;
  h.ctl_ino = 778;
  h.owner_ctl_fd = -1;
  return h;
}

/* ---- fuse ---------------------------------------------------------------- */

/* The daemon is a process of its own (a child of the test's child), with
 * the only reference to /dev/fuse: if the test's child ends with a request
 * in flight (a FUSE flush waits uninterruptibly), the daemon still answers,
 * and its death (PR_SET_PDEATHSIG) aborts the connection. A daemon thread
 * in the same process would deadlock such an exit. Its counts are in a
 * shared mapping. */
static int fuse_dev = -1;
typedef struct {
  _Atomic pid_t watched;   /* the thread whose requests count */
  _Atomic int reqs;        /* its requests since */
  _Atomic int last_opcode; /* the last of them */
} fuse_count_t;
static fuse_count_t *fc;

static void fuse_reply(uint64_t unique, const void *p, size_t n) {
  char buf[512];
  struct fuse_out_header *o = (struct fuse_out_header *)buf;
  o->len = (uint32_t)(sizeof *o + n);
  o->error = 0;
  o->unique = unique;
  if (n > 0)
    memcpy(buf + sizeof *o, p, n);
  (void)!write(fuse_dev, buf, o->len);
}

static void fuse_attr_of(struct fuse_attr *a, uint64_t ino) {
  memset(a, 0, sizeof *a);
  a->ino = ino;
  a->nlink = 1;
  a->mode = ino == 1 ? (S_IFDIR | 0755) : (S_IFREG | 0644);
  a->blksize = 4096;
}

/* The daemon: answers at once, every attribute valid for 0 s (each fstat
 * is a request), and counts the watched thread's requests. */
static void fuse_daemon(void) {
  static char buf[1 << 17]; /* FUSE_MIN_READ_BUFFER and more */
  for (;;) {
    ssize_t n = read(fuse_dev, buf, sizeof buf);
    if (n <= 0) {
      if (n < 0 && (errno == EINTR || errno == ENOENT))
        continue;
      return; /* ENODEV: unmounted */
    }
    struct fuse_in_header *in = (struct fuse_in_header *)buf;
    void *a = buf + sizeof *in;
    if (in->pid != 0 && (pid_t)in->pid == atomic_load(&fc->watched)) {
      atomic_fetch_add(&fc->reqs, 1);
      atomic_store(&fc->last_opcode, (int)in->opcode);
    }
    switch (in->opcode) {
    case FUSE_INIT: {
      struct fuse_init_in *ii = a;
      struct fuse_init_out o;
      memset(&o, 0, sizeof o);
      o.major = FUSE_KERNEL_VERSION;
      o.minor = ii->minor < 31 ? ii->minor : 31;
      o.max_readahead = ii->max_readahead;
      o.max_write = 4096;
      o.max_background = 4;
      o.congestion_threshold = 3;
      o.time_gran = 1;
      fuse_reply(in->unique, &o, sizeof o);
      break;
    }
    case FUSE_LOOKUP: {
      struct fuse_entry_out e;
      memset(&e, 0, sizeof e);
      e.nodeid = 2;
      e.generation = 1;
      fuse_attr_of(&e.attr, 2);
      fuse_reply(in->unique, &e, sizeof e);
      break;
    }
    case FUSE_GETATTR: {
      struct fuse_attr_out o;
      memset(&o, 0, sizeof o);
      fuse_attr_of(&o.attr, in->nodeid);
      fuse_reply(in->unique, &o, sizeof o);
      break;
    }
    case FUSE_STATFS: {
      struct fuse_statfs_out o;
      memset(&o, 0, sizeof o);
      o.st.bsize = 4096;
      o.st.frsize = 4096;
      o.st.namelen = 255;
      fuse_reply(in->unique, &o, sizeof o);
      break;
    }
    case FUSE_OPEN: {
      struct fuse_open_out o;
      memset(&o, 0, sizeof o);
      o.fh = 1;
      fuse_reply(in->unique, &o, sizeof o);
      break;
    }
    case FUSE_FORGET:
    case FUSE_BATCH_FORGET:
    case FUSE_INTERRUPT:
      break; /* no answer */
    default: /* FLUSH, RELEASE, ...: done */
      fuse_reply(in->unique, NULL, 0);
      break;
    }
  }
}

static pid_t tid(void) { return (pid_t)syscall(SYS_gettid); }

static void watch(void) {
  atomic_store(&fc->reqs, 0);
  atomic_store(&fc->watched, tid());
}

/* The watched thread's requests since watch() must be none: each path
 * that fails is said, and counted (the child's status). */
static int fuse_failures;
static void none_since(const char *what) {
  int n = atomic_load(&fc->reqs);
  if (n != 0) {
    fprintf(stderr,
            "ERROR: %s: %d request(s) to the peer's FUSE daemon from the "
            "caller's thread (the last: opcode %d; 3 GETATTR, 17 STATFS)\n",
            what, n, atomic_load(&fc->last_opcode));
    fuse_failures++;
  }
}

/* The child: mount, then each path with a FUSE file where a peer's
 * descriptor goes. SKIPPED where a FUSE mount cannot be had. */
static int fuse_child(void) {
  if (unshare(CLONE_NEWNS) != 0 ||
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0)
    return SKIPPED;
  char dir[] = "/tmp/pp_fuse_XXXXXX";
  if (mkdtemp(dir) == NULL)
    return SKIPPED;
  fuse_dev = open("/dev/fuse", O_RDWR | O_CLOEXEC);
  if (fuse_dev < 0) {
    (void)rmdir(dir);
    return SKIPPED;
  }
  char opts[128];
  (void)snprintf(opts, sizeof opts, "fd=%d,rootmode=40000,user_id=0,group_id=0",
                 fuse_dev);
  if (mount("pp_hostile", dir, "fuse", MS_NOSUID | MS_NODEV, opts) != 0) {
    (void)rmdir(dir);
    return SKIPPED;
  }
  fc = mmap(NULL, sizeof *fc, PROT_READ | PROT_WRITE,
            MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  CK(fc != MAP_FAILED, "mmap");
  pid_t me = getpid();
  pid_t d = fork();
  CK(d >= 0, "fork");
  if (d == 0) {
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == me)
      fuse_daemon();
    _exit(0);
  }
  (void)close(fuse_dev); /* the daemon's alone */
  char path[64];
  (void)snprintf(path, sizeof path, "%s/f", dir);
  int f = open(path, O_RDONLY | O_CLOEXEC);
  CK(f >= 0, "open %s: %s", path, strerror(errno));

  /* The counting works: this thread's own fstat is a request. */
  struct stat st;
  watch();
  CK(fstat(f, &st) == 0, "fstat");
  CK(atomic_load(&fc->reqs) >= 1, "the daemon counted no request");

  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pinpool_share_handle_t h = foreign_handle(), g;
  int got = -1;

  /* 1. Three descriptors: all closed (pp_share_close_received). */
  int three[3] = {f, f, f};
  send_with(sv[1], &h, sizeof h, three, 3);
  watch();
  CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
  none_since("a message of three descriptors");

  /* 2. A handle and two: the second is checked as a control area
   * (check_ctl), refused, closed. */
  send_with(sv[1], &h, sizeof h, three, 2);
  watch();
  CK_RC(pinpool_share_recv(sv[0], &g, &got), 0);
  none_since("a handle whose control descriptor is a FUSE file");
  CK(got >= 0, "got %d", got);
  (void)close(got);

  /* 3. Attach with the FUSE file as the chunk's descriptor (check_fd) and
   * as the control area's (check_ctl). */
  void *p = NULL;
  watch();
  CK_RC(pinpool_share_attach(&h, f, &p), PINPOOL_EBADHANDLE);
  none_since("pinpool_share_attach with a FUSE file");
  int m = memfd_create("pp_chunk", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  CK(m >= 0 && ftruncate(m, (off_t)h.chunk_size) == 0, "memfd");
  CK(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0,
     "seals");
  CK(fstat(m, &st) == 0, "fstat memfd");
  h.dev = (uint64_t)st.st_dev;
  h.ino = (uint64_t)st.st_ino;
  watch();
  CK_RC(pinpool_share_attach_ctl(&h, m, f, &p), PINPOOL_EBADHANDLE);
  none_since("pinpool_share_attach_ctl with a FUSE control descriptor");

  /* 4. The handle's owner_ctl_fd (a number the peer wrote) names the FUSE
   * file here (find_ctl). */
  h.owner_ctl_fd = f;
  watch();
  CK_RC(pinpool_share_attach(&h, m, &p), PINPOOL_EBADHANDLE);
  none_since("a handle whose owner_ctl_fd names a FUSE file");
  h.owner_ctl_fd = -1;

  /* 5. A part-message kept for a socket whose number, once it is closed,
   * names the FUSE file: the next call prunes it (sock_id). */
  int xy[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, xy) == 0, "sp");
  CK(fcntl(xy[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
  send_with(xy[1], &h, 1, NULL, 0);
  CK_RC(pinpool_share_recv(xy[0], &g, &got), PINPOOL_EAGAIN);
  CK(pp_share_io_kept() == 1, "kept %zu", pp_share_io_kept());
  CK(dup3(f, xy[0], O_CLOEXEC) == xy[0], "dup3");
  CK(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
  watch();
  CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EAGAIN);
  none_since("pruning a kept piece whose socket number names a FUSE file");
  CK(pp_share_io_kept() == 0, "kept %zu", pp_share_io_kept());

  atomic_store(&fc->watched, 0);
  pp_share_closer_flush();
  (void)close(xy[0]);
  (void)close(xy[1]);
  (void)close(sv[0]);
  (void)close(sv[1]);
  (void)close(m);
  (void)close(f);
  (void)umount2(dir, MNT_DETACH);
  (void)kill(d, SIGKILL);
  (void)waitpid(d, NULL, 0);
  (void)rmdir(dir);
  return fuse_failures;
}

static void test_fuse_file_never_asked_on_the_callers_thread(void **state) {
  (void)state;
  if (geteuid() != 0 || access("/dev/fuse", R_OK | W_OK) != 0) {
    print_message("no root or no /dev/fuse: skipped\n");
    skip();
  }
  fflush(NULL);
  pid_t pid = fork();
  CK(pid >= 0, "fork");
  if (pid == 0) {
    in_child = true;
    _exit(fuse_child());
  }
  int st = pp_wait_child(pid, 60000);
  if (st == SKIPPED) {
    print_message("no FUSE mount can be had here: skipped\n");
    skip();
  }
  CK(st == 0,
     "the FUSE child failed (status %d: the paths that asked the "
     "daemon on the caller's thread, or 1)",
     st);
}

/* ---- fork ---------------------------------------------------------------- */

/* The hook holds the closer threads (PP_HOOK_SHARE_CLOSER) until released:
 * what is queued behind them stays queued, deterministically. */
static sem_t release_closers;
static _Atomic int closers_held;

static void hold_closers(int point) {
  if (point != PP_HOOK_SHARE_CLOSER)
    return;
  atomic_fetch_add(&closers_held, 1);
  while (sem_wait(&release_closers) != 0)
    ;
}

static void hold_start(void) {
  CK(sem_init(&release_closers, 0, 0) == 0, "sem_init");
  atomic_store(&closers_held, 0);
  atomic_store(&pp_test_hook, hold_closers);
}

/* Wait (a bounded number of polls) until n closers are held. */
static void hold_wait(int n) {
  for (int i = 0; i < 20000 && atomic_load(&closers_held) < n; i++)
    pp_sleep_ms(1);
  CK(atomic_load(&closers_held) >= n, "%d closer(s) held, %d expected",
     atomic_load(&closers_held), n);
}

static void hold_end(void) {
  atomic_store(&pp_test_hook, NULL);
  for (int i = 0; i < 1024; i++)
    (void)sem_post(&release_closers);
  pp_share_closer_flush();
  (void)sem_destroy(&release_closers);
}

/* A message of n copies of fd, not a handle: every one goes to disposal. */
static void bad_message(int fd, int n) {
  int fds[MAX_FDS];
  for (int i = 0; i < n; i++)
    fds[i] = fd;
  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pinpool_share_handle_t h, g;
  memset(&h, 0xab, sizeof h);
  send_with(sv[1], &h, sizeof h, fds, n);
  int got = -1;
  CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
  (void)close(sv[0]);
  (void)close(sv[1]);
}

static bool is_devnull(int fd) {
  struct stat st, nul;
  return fstat(fd, &st) == 0 && stat("/dev/null", &nul) == 0 &&
         S_ISCHR(st.st_mode) && st.st_rdev == nul.st_rdev;
}

/* The child of a fork taken while descriptors wait in the closer's queue
 * closes every /dev/null it has (the queued ones: a daemon's closefrom),
 * opens files of its own (the numbers come back), and disposes of a
 * peer's descriptors: its closer must close those, never its own. */
static int fork_child(void) {
  atomic_store(&pp_test_hook, NULL);
  for (int fd = 3; fd < 1024; fd++)
    if (is_devnull(fd))
      (void)close(fd);
  int own[30];
  for (int i = 0; i < 30; i++)
    CK((own[i] = open("/dev/zero", O_RDONLY | O_CLOEXEC)) >= 0, "open");
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  bad_message(nul, 3);
  pp_share_closer_flush();
  int lost = 0;
  for (int i = 0; i < 30; i++)
    if (fcntl(own[i], F_GETFD) < 0) {
      fprintf(stderr, "ERROR: the child's own descriptor %d was closed\n",
              own[i]);
      lost++;
    }
  return lost;
}

static void test_fork_child_drops_the_closers_queue(void **state) {
  (void)state;
  int before = pp_count_fds();
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  hold_start();
  bad_message(nul, 12); /* one held in the closer, eleven queued */
  hold_wait(1);
  fflush(NULL);
  pid_t pid = fork();
  CK(pid >= 0, "fork");
  if (pid == 0) {
    in_child = true;
    _exit(fork_child());
  }
  int st = pp_wait_child(pid, 60000);
  hold_end();
  (void)close(nul);
  CK(st == 0,
     "the child's closer closed %d of its own descriptors (the parent's "
     "queued numbers)",
     st);
  CK(pp_count_fds() == before, "%d descriptors open, %d before", pp_count_fds(),
     before);
}

/* ---- stall ----------------------------------------------------------------
 * rv3637f's closer_stall: one peer's unix socket whose queue holds a TCP
 * socket with a long SO_LINGER and unsent data. Its disposal must close
 * the TCP socket abortively at once (its peer sees the reset: watchdog
 * WATCHDOG_S, never reached), and every later peer's descriptors must be
 * closed (the count flat after each message). Before, the one closer
 * thread waited out the linger in close() and everything after stayed
 * open until RLIMIT_NOFILE. No time is asserted: the bounds are
 * watchdogs. */
#define WATCHDOG_S 20
#define LINGER_S 600

/* A connected TCP socket whose close lingers LINGER_S: unsent data to
 * *keep (the accepted end, never read). -1 where TCP on loopback cannot be
 * had. */
static int lingering(int *keep, int *srv) {
  int small = 4096;
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof a;
  *srv = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (*srv < 0)
    return -1;
  (void)setsockopt(*srv, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  if (bind(*srv, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(*srv, 1) != 0 ||
      getsockname(*srv, (struct sockaddr *)&a, &al) != 0)
    return -1;
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c < 0)
    return -1;
  (void)setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  if (connect(c, (struct sockaddr *)&a, sizeof a) != 0)
    return -1;
  *keep = accept(*srv, NULL, NULL);
  if (*keep < 0)
    return -1;
  CK(fcntl(c, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
  static char junk[65536];
  while (send(c, junk, sizeof junk, MSG_NOSIGNAL) > 0)
    ;
  struct linger l = {1, LINGER_S};
  CK(setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0, "SO_LINGER");
  return c;
}

/* Open descriptors, once the closers are done (a watchdog: -1 if they are
 * not within WATCHDOG_S). */
static int settled_fds(void) {
  if (!pp_share_closer_wait(WATCHDOG_S * 1000))
    return -1;
  return pp_count_fds();
}

static void test_one_peer_cannot_stall_the_disposal(void **state) {
  (void)state;
  int keep = -1, srv = -1;
  int tcp = lingering(&keep, &srv);
  if (tcp < 0) {
    print_message("no TCP on loopback here: skipped\n");
    skip();
  }
  int before = pp_count_fds();
  /* The carrier: a unix socket whose queue holds the TCP socket. */
  int carrier[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, carrier) == 0, "sp");
  send_with(carrier[0], "x", 1, &tcp, 1);
  (void)close(tcp);
  (void)close(carrier[0]);
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  int three[3] = {carrier[1], nul, nul};
  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pinpool_share_handle_t h, g;
  memset(&h, 0xab, sizeof h);
  send_with(sv[1], &h, sizeof h, three, 3);
  (void)close(carrier[1]); /* the message's reference is the last */
  int got = -1;
  CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
  /* The TCP socket was closed abortively: its peer (whose receive queue
   * holds the data, so POLLIN says nothing) sees the reset: RDHUP and
   * ECONNRESET. */
  struct pollfd p = {.fd = keep, .events = POLLRDHUP};
  int n;
  do
    n = poll(&p, 1, WATCHDOG_S * 1000);
  while (n < 0 && errno == EINTR);
  CK(n == 1,
     "the lingering socket in the peer's unix socket was not closed "
     "abortively (its peer saw nothing in %d s)",
     WATCHDOG_S);
  int err = 0;
  socklen_t elen = sizeof err;
  CK(getsockopt(keep, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 &&
         err == ECONNRESET,
     "the TCP peer saw no reset (SO_ERROR %d)", err);
  int base = settled_fds();
  /* before: the TCP socket, its peer, the listener; now /dev/null and sv
   * instead of the TCP socket. */
  CK(base == before + 2,
     "%d descriptors open after the stalling message, "
     "%d expected",
     base, before + 2);
  /* Other peers' messages of 100 descriptors each: all closed. */
  int many[100];
  for (int i = 0; i < 100; i++)
    many[i] = nul;
  for (int i = 1; i <= 6; i++) {
    send_with(sv[1], &h, sizeof h, many, 100);
    CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
    int now = settled_fds();
    CK(now == base, "message %d of 100 descriptors: %d open, %d before", i, now,
       base);
  }
  (void)close(sv[0]);
  (void)close(sv[1]);
  (void)close(nul);
  (void)close(keep);
  (void)close(srv);
  CK(pp_count_fds() == before - 3, "%d open, %d before", pp_count_fds(),
     before - 3);
}

/* Wait (watchdog) for the reset that tells the TCP socket was closed
 * abortively: false if its peer saw none. */
static bool reset_seen(int keep) {
  struct pollfd p = {.fd = keep, .events = POLLRDHUP};
  int n;
  do
    n = poll(&p, 1, WATCHDOG_S * 1000);
  while (n < 0 && errno == EINTR);
  int err = 0;
  socklen_t elen = sizeof err;
  return n == 1 && getsockopt(keep, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 &&
         err == ECONNRESET;
}

enum { IN_DGRAM, IN_EMBRYO, IN_NESTED, NCARRIERS };
static const char *const carriers[NCARRIERS] = {
    "a datagram socket's queue", "a listener's connection not accepted yet",
    "a unix socket in a unix socket's queue"};

/* The lingering TCP socket reaches the receiver inside each kind of unix
 * socket; the disposal must drain it there and close the TCP socket
 * abortively on the caller's thread (never queue the carrier, whose close
 * on a closer would wait out the linger). */
static void test_unix_carriers_are_drained(void **state) {
  (void)state;
  for (int k = 0; k < NCARRIERS; k++) {
    int keep = -1, srv = -1;
    int tcp = lingering(&keep, &srv);
    if (tcp < 0) {
      print_message("no TCP on loopback here: skipped\n");
      skip();
    }
    int carrier = -1, other = -1;
    if (k == IN_DGRAM || k == IN_NESTED) {
      int xy[2];
      CK(socketpair(AF_UNIX,
                    (k == IN_DGRAM ? SOCK_DGRAM : SOCK_STREAM) | SOCK_CLOEXEC,
                    0, xy) == 0,
         "sp");
      send_with(xy[0], "x", 1, &tcp, 1);
      carrier = xy[1];
      other = xy[0];
      if (k == IN_NESTED) { /* xy[1] inside another pair's queue */
        int ab[2];
        CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ab) == 0, "sp");
        send_with(ab[0], "y", 1, &carrier, 1);
        (void)close(carrier);
        (void)close(other);
        carrier = ab[1];
        other = ab[0];
      }
    } else {
      struct sockaddr_un a = {.sun_family = AF_UNIX};
      int len = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "pp_closer_%d",
                         (int)getpid());
      socklen_t alen =
          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
      carrier = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      CK(carrier >= 0 && bind(carrier, (struct sockaddr *)&a, alen) == 0 &&
             listen(carrier, 4) == 0,
         "listener: %s", strerror(errno));
      other = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      CK(other >= 0 && connect(other, (struct sockaddr *)&a, alen) == 0,
         "connect: %s", strerror(errno));
      send_with(other, "x", 1, &tcp, 1); /* into the unaccepted end */
    }
    (void)close(tcp);
    (void)close(other);
    pp_closer_counts_t c0, c;
    pp_share_closer_counts(&c0);
    int three[3] = {carrier, carrier, carrier};
    int sv[2];
    CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
    pinpool_share_handle_t h, g;
    memset(&h, 0xab, sizeof h);
    send_with(sv[1], &h, sizeof h, three, 3);
    (void)close(carrier);
    int got = -1;
    CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
    pp_share_closer_counts(&c);
    bool reset = reset_seen(keep);
    (void)close(keep); /* a reset: a closer's linger wait, if any, ends */
    (void)close(srv);
    (void)close(sv[0]);
    (void)close(sv[1]);
    pp_share_closer_flush();
    CK(reset, "%s: the lingering TCP socket was not closed abortively",
       carriers[k]);
    CK(c.inline_closes == c0.inline_closes,
       "%s: %lu closed past the closers' bound", carriers[k],
       c.inline_closes - c0.inline_closes);
  }
}

/* The back-pressure (rv39s): the closers held, messages are read (their
 * descriptors handed to the closers) until PP_SHARE_CLOSER_QUEUE or more
 * wait; then pinpool_share_recv reads nothing (PINPOOL_EBUSY, the message
 * still in the socket) and closes nothing on the caller's thread; once
 * the closers free, the same message is read. Never more open than the
 * bound: PP_SHARE_CLOSER_QUEUE - 1 + one message. */
static void test_the_closers_push_back(void **state) {
  (void)state;
  int before = pp_count_fds();
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  int fds[60];
  for (int i = 0; i < 60; i++)
    fds[i] = nul;
  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) ==
         0,
     "sp");
  pinpool_share_handle_t h, g;
  memset(&h, 0xab, sizeof h);
  pp_closer_counts_t c0, c;
  pp_share_closer_counts(&c0);
  hold_start();
  int got = -1, admitted = 0, rc = 0;
  for (int i = 0; i < 10; i++) {
    send_with(sv[1], &h, sizeof h, fds, 60);
    rc = pinpool_share_recv(sv[0], &g, &got);
    if (rc != PINPOOL_EBADHANDLE)
      break;
    admitted++;
  }
  int queued = 0;
  int fion = ioctl(sv[0], FIONREAD, &queued);
  int rc2 = pinpool_share_recv(sv[0], &g, &got);
  pp_share_closer_counts(&c);
  int open_now = -3; /* not pp_count_fds: it waits for the closers */
  DIR *d = opendir("/proc/self/fd");
  CK(d != NULL, "opendir");
  while (readdir(d) != NULL)
    open_now++;
  (void)closedir(d);
  hold_end(); /* before any check: a failed one leaves no closer held */
  CK_RC(rc, PINPOOL_EBUSY);
  /* 60 admitted (0 waiting), 60 more (60 < 64), then refused. */
  CK(admitted == 2, "%d messages of 60 read before the refusal, 2 expected",
     admitted);
  CK(fion == 0 && queued == (int)sizeof h,
     "the refused message was read (%d bytes left in the socket)", queued);
  CK_RC(rc2, PINPOOL_EBUSY);
  CK(c.inline_closes == c0.inline_closes, "%lu closed on the caller's thread",
     c.inline_closes - c0.inline_closes);
  CK(c.queued + c.busy == 120, "%zu queued and %u busy, 120 expected", c.queued,
     c.busy);
  CK(open_now == before + 3 + 120,
     "%d descriptors open with the closers held, %d expected", open_now,
     before + 3 + 120);
  CK(open_now <= before + 3 + PP_SHARE_CLOSER_QUEUE - 1 + MAX_FDS,
     "past the bound");
  CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
  (void)close(sv[0]);
  (void)close(sv[1]);
  (void)close(nul);
  CK(settled_fds() == before, "%d open, %d before", pp_count_fds(), before);
}

/* ---- a peer that holds the object's kernel lock (rv39s D1) ---------------
 * The peer keeps a copy of what it sends and sits in a system call that
 * holds the object's lock while it copies from (or to) a page registered
 * with a userfaultfd that nobody serves: a pipe's write holds the pipe's
 * mutex, a unix socket's recv its iolock, a TCP send lock_sock. The
 * receiver must return with the descriptor handed to a closer: any call
 * on its thread that takes that lock (F_GETPIPE_SZ, recvmsg, setsockopt)
 * waits as long as the peer likes. Deterministic: the peer is known to be
 * in the fault (the userfaultfd reports it) before the message is sent;
 * the watchdog only ends a failing run. Needs userfaultfd for kernel-mode
 * faults (root, or vm.unprivileged_userfaultfd 1): skipped without. */
enum { HELD_PIPE, HELD_UNIX, HELD_TCP, NHELD };
static const char *const held_kinds[NHELD] = {"a pipe (its mutex)",
                                              "a unix socket (its iolock)",
                                              "a TCP socket (lock_sock)"};
typedef struct {
  int kind, fd;
  char *page;
  ssize_t rc;
} peer_call_t;

static void *peer_call(void *arg) {
  peer_call_t *pc = arg;
  if (pc->kind == HELD_UNIX)
    pc->rc = recv(pc->fd, pc->page, 4096, 0);
  else if (pc->kind == HELD_PIPE)
    pc->rc = write(pc->fd, pc->page, 4096);
  else
    pc->rc = send(pc->fd, pc->page, 4096, MSG_NOSIGNAL);
  return NULL;
}

typedef struct {
  int sock;
  int rc;
  sem_t done;
} victim_t;

static void *victim_recv(void *arg) {
  victim_t *v = arg;
  pinpool_share_handle_t g;
  int got = -1;
  v->rc = pinpool_share_recv(v->sock, &g, &got);
  (void)sem_post(&v->done);
  return NULL;
}

static bool uffd_allowed(void) {
  if (geteuid() == 0)
    return true;
  FILE *f = fopen("/proc/sys/vm/unprivileged_userfaultfd", "r");
  int on = 0;
  if (f != NULL) {
    if (fscanf(f, "%d", &on) != 1)
      on = 0;
    (void)fclose(f);
  }
  return on == 1;
}

/* A page registered with a new userfaultfd (missing pages), *uffd: NULL
 * where userfaultfd is not to be had. */
static char *uffd_page(int *uffd) {
  *uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (*uffd < 0)
    return NULL;
  struct uffdio_api api = {.api = UFFD_API};
  char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  struct uffdio_register r = {.range = {(unsigned long)p, 4096},
                              .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (p == MAP_FAILED || ioctl(*uffd, UFFDIO_API, &api) != 0 ||
      ioctl(*uffd, UFFDIO_REGISTER, &r) != 0) {
    if (p != MAP_FAILED)
      (void)munmap(p, 4096);
    (void)close(*uffd);
    return NULL;
  }
  return p;
}

/* A connected TCP pair on loopback: false without TCP. */
static bool tcp_pair(int *a, int *b) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof sa;
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(l, 1) != 0 || getsockname(l, (struct sockaddr *)&sa, &al) != 0) {
    if (l >= 0)
      (void)close(l);
    return false;
  }
  *a = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = *a >= 0 && connect(*a, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            (*b = accept4(l, NULL, NULL, SOCK_CLOEXEC)) >= 0;
  (void)close(l);
  return ok;
}

static void held_case(int kind) {
  if (!uffd_allowed()) {
    print_message("userfaultfd for kernel faults not allowed: skipped\n");
    skip();
  }
  int uffd = -1;
  char *page = uffd_page(&uffd);
  if (page == NULL) {
    print_message("no userfaultfd here (%s): skipped\n", strerror(errno));
    skip();
  }
  int obj = -1, other = -1; /* obj: sent; the peer's call is on obj */
  if (kind == HELD_PIPE) {
    int pp[2];
    CK(pipe2(pp, O_CLOEXEC) == 0, "pipe");
    obj = pp[1];
    other = pp[0];
  } else if (kind == HELD_UNIX) {
    int xy[2];
    CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, xy) == 0, "sp");
    obj = xy[0];
    other = xy[1];
    CK(send(other, "data", 4, 0) == 4, "send");
  } else if (!tcp_pair(&obj, &other)) {
    (void)munmap(page, 4096);
    (void)close(uffd);
    print_message("no TCP on loopback here: skipped\n");
    skip();
  }
  peer_call_t pc = {.kind = kind, .fd = obj, .page = page, .rc = -2};
  pthread_t peer;
  CK(pthread_create(&peer, NULL, peer_call, &pc) == 0, "pthread_create");
  /* The peer is in the fault, the object's lock held, once the
   * userfaultfd reports it. */
  struct pollfd pf = {.fd = uffd, .events = POLLIN};
  int n;
  do
    n = poll(&pf, 1, WATCHDOG_S * 1000);
  while (n < 0 && errno == EINTR);
  if (n != 1) { /* the kernel did not route its fault here */
    (void)close(uffd);
    (void)pthread_join(peer, NULL);
    print_message("the peer's call did not fault into the userfaultfd "
                  "(%zd): skipped\n",
                  pc.rc);
    (void)close(obj);
    (void)close(other);
    (void)munmap(page, 4096);
    skip();
  }
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  int three[3] = {obj, nul, nul};
  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pinpool_share_handle_t h;
  memset(&h, 0xab, sizeof h);
  send_with(sv[1], &h, sizeof h, three, 3);
  (void)close(nul);
  victim_t v = {.sock = sv[0], .rc = 1};
  CK(sem_init(&v.done, 0, 0) == 0, "sem_init");
  pthread_t vt;
  CK(pthread_create(&vt, NULL, victim_recv, &v) == 0, "pthread_create");
  struct timespec t;
  (void)clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += WATCHDOG_S;
  int w;
  do
    w = sem_timedwait(&v.done, &t);
  while (w != 0 && errno == EINTR);
  /* The peer lets go: the fault is served (its page a zero page once the
   * userfaultfd is closed), and the closer's call on obj goes through. */
  (void)close(uffd);
  (void)pthread_join(peer, NULL);
  (void)pthread_join(vt, NULL);
  (void)sem_destroy(&v.done);
  pp_share_closer_flush();
  (void)close(obj);
  (void)close(other);
  (void)close(sv[0]);
  (void)close(sv[1]);
  (void)munmap(page, 4096);
  CK(w == 0,
     "%s: the receiver waited on the peer that held the object's lock "
     "(not back in %d s)",
     held_kinds[kind], WATCHDOG_S);
  CK_RC(v.rc, PINPOOL_EBADHANDLE);
}

static void test_held_pipe_never_waits(void **state) {
  (void)state;
  held_case(HELD_PIPE);
}
static void test_held_unix_never_waits(void **state) {
  (void)state;
  held_case(HELD_UNIX);
}
static void test_held_tcp_never_waits(void **state) {
  (void)state;
  held_case(HELD_TCP);
}

/* ---- the closers' drain (rv39s D2-D5) -------------------------------------
 * Each puts lingering TCP sockets where the drain meets them and checks the
 * abortive close (its peer sees the reset). */

/* D2: past the drain's descriptor budget (512 memory files ahead of them in
 * a unix socket's queue) sockets are still neutralised. */
static void test_sockets_past_the_budget_are_neutralised(void **state) {
  (void)state;
  enum { NT = 3 };
  int keep[NT], srv[NT], tcp[NT];
  for (int i = 0; i < NT; i++)
    if ((tcp[i] = lingering(&keep[i], &srv[i])) < 0) {
      print_message("no TCP on loopback here: skipped\n");
      skip();
    }
  int mfd = (int)syscall(SYS_memfd_create, "pp_budget", 1U /* CLOEXEC */);
  CK(mfd >= 0, "memfd_create");
  int xy[2];
  CK(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, xy) == 0, "sp");
  int m[MAX_FDS];
  for (int i = 0; i < MAX_FDS; i++)
    m[i] = mfd;
  for (int sent = 0; sent < 520; sent += 130)
    send_with(xy[0], "m", 1, m, 130);
  send_with(xy[0], "t", 1, tcp, NT);
  for (int i = 0; i < NT; i++)
    (void)close(tcp[i]);
  (void)close(mfd);
  (void)close(xy[0]);
  pp_closer_counts_t c0, c;
  pp_share_closer_counts(&c0);
  bad_message(xy[1], 1); /* one copy: one disposal, one budget */
  (void)close(xy[1]);
  bool reset[NT];
  for (int i = 0; i < NT; i++) {
    reset[i] = reset_seen(keep[i]);
    (void)close(keep[i]);
    (void)close(srv[i]);
  }
  pp_share_closer_flush();
  pp_share_closer_counts(&c);
  for (int i = 0; i < NT; i++)
    CK(reset[i], "TCP socket %d past the budget was not closed abortively", i);
  CK(c.inline_closes == c0.inline_closes, "%lu closed on the caller's thread",
     c.inline_closes - c0.inline_closes);
}

/* D4: the peer set SO_TIMESTAMPNS and SO_PASSCRED on the datagram socket
 * it sends; a queued datagram of 253 descriptors (the last a lingering TCP
 * socket) must still come out whole: no drain truncated, the TCP socket
 * closed abortively. */
static void test_the_drain_takes_any_ancillary_data(void **state) {
  (void)state;
  int keep = -1, srv = -1;
  int tcp = lingering(&keep, &srv);
  if (tcp < 0) {
    print_message("no TCP on loopback here: skipped\n");
    skip();
  }
  int xy[2];
  CK(socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, xy) == 0, "sp");
  int on = 1;
  CK(setsockopt(xy[1], SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) == 0 &&
         setsockopt(xy[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on) == 0,
     "setsockopt");
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  int m[MAX_FDS];
  for (int i = 0; i < MAX_FDS - 1; i++)
    m[i] = nul;
  m[MAX_FDS - 1] = tcp;
  send_with(xy[0], "d", 1, m, MAX_FDS);
  (void)close(tcp);
  (void)close(nul);
  (void)close(xy[0]);
  unsigned long t0 = atomic_load(&pp_share_drain_ctrunc);
  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pinpool_share_handle_t h;
  memset(&h, 0xab, sizeof h);
  send_with(sv[1], &h, sizeof h, &xy[1], 1);
  (void)close(xy[1]);
  /* Received on a thread of its own, watched: a kernel release of the
   * lingering socket on the receiving thread would hold it LINGER_S. */
  victim_t v = {.sock = sv[0], .rc = 1};
  CK(sem_init(&v.done, 0, 0) == 0, "sem_init");
  pthread_t vt;
  CK(pthread_create(&vt, NULL, victim_recv, &v) == 0, "pthread_create");
  struct timespec t;
  (void)clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += WATCHDOG_S;
  int w;
  do
    w = sem_timedwait(&v.done, &t);
  while (w != 0 && errno == EINTR);
  bool reset = w == 0 && reset_seen(keep);
  (void)close(keep); /* a reset: a linger wait, if any, ends */
  (void)close(srv);
  (void)pthread_join(vt, NULL);
  (void)sem_destroy(&v.done);
  (void)close(sv[0]);
  (void)close(sv[1]);
  pp_share_closer_flush();
  CK(w == 0, "the receiver waited out the linger (not back in %d s)",
     WATCHDOG_S);
  CK(atomic_load(&pp_share_drain_ctrunc) == t0,
     "%lu drain recvmsg truncated (MSG_CTRUNC)",
     atomic_load(&pp_share_drain_ctrunc) - t0);
  CK(reset, "the lingering TCP socket in the datagram was not closed "
            "abortively");
}

/* D5: one budget of calls per received message, however many of its
 * descriptors and nested sockets hold data: 3 carriers of 8 unix sockets
 * each with a full queue (~1000 reads each) make at most DRAIN_CALLS
 * (4096) drain recvmsg calls in all. */
static void test_one_call_budget_per_message(void **state) {
  (void)state;
  enum { NC = 3, NS = 8 };
  int carrier[NC];
  for (int k = 0; k < NC; k++) {
    int ab[2];
    CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ab) == 0, "sp");
    for (int s = 0; s < NS; s++) {
      int xy[2];
      CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, xy) == 0, "sp");
      CK(fcntl(xy[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
      static char junk[65536];
      while (send(xy[0], junk, sizeof junk, MSG_NOSIGNAL) > 0)
        ;
      send_with(ab[0], "s", 1, &xy[1], 1);
      (void)close(xy[0]);
      (void)close(xy[1]);
    }
    (void)close(ab[0]);
    carrier[k] = ab[1];
  }
  unsigned long c0 = atomic_load(&pp_share_drain_calls);
  bad_message(carrier[0], 1); /* a warm-up: nothing in it is counted */
  pp_share_closer_flush();
  c0 = atomic_load(&pp_share_drain_calls);
  int sv[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pinpool_share_handle_t h, g;
  memset(&h, 0xab, sizeof h);
  send_with(sv[1], &h, sizeof h, &carrier[1], NC - 1);
  for (int k = 0; k < NC; k++)
    (void)close(carrier[k]);
  int got = -1;
  CK_RC(pinpool_share_recv(sv[0], &g, &got), PINPOOL_EBADHANDLE);
  (void)close(sv[0]);
  (void)close(sv[1]);
  pp_share_closer_flush();
  unsigned long calls = atomic_load(&pp_share_drain_calls) - c0;
  CK(calls <= 4096, "%lu drain recvmsg calls for one message, at most 4096",
     calls);
  CK(calls >= 1000, "%lu drain recvmsg calls: the queues were not read", calls);
}

/* D3: nested unix sockets, two levels of 200, in a process whose
 * RLIMIT_NOFILE leaves room for 350 more: no drain is ever truncated (the
 * kernel would release the rest). In a child (the limit). */
static int emfile_child(void) {
  int lvl1[2];
  CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lvl1) == 0, "sp");
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  /* lvl1 carries one message of 200 sockets, each carrying one message of
   * 200 /dev/null: depth-first, 400 are held at the second level. */
  int inner[200];
  for (int i = 0; i < 200; i++) {
    int xy[2];
    CK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, xy) == 0, "sp");
    int m[200];
    for (int j = 0; j < 200; j++)
      m[j] = nul;
    send_with(xy[0], "n", 1, m, 200);
    (void)close(xy[0]);
    inner[i] = xy[1];
  }
  send_with(lvl1[0], "c", 1, inner, 200);
  for (int i = 0; i < 200; i++)
    (void)close(inner[i]);
  (void)close(lvl1[0]);
  (void)close(nul);
  int now = pp_count_fds();
  struct rlimit rl;
  CK(getrlimit(RLIMIT_NOFILE, &rl) == 0, "getrlimit");
  rl.rlim_cur = (rlim_t)now + 350;
  CK(setrlimit(RLIMIT_NOFILE, &rl) == 0, "setrlimit");
  unsigned long t0 = atomic_load(&pp_share_drain_ctrunc);
  bad_message(lvl1[1], 3);
  (void)close(lvl1[1]);
  pp_share_closer_flush();
  unsigned long t = atomic_load(&pp_share_drain_ctrunc) - t0;
  CK(t == 0, "%lu drain recvmsg truncated at RLIMIT_NOFILE", t);
  CK(pp_count_fds() == now - 1, "%d open, %d expected", pp_count_fds(),
     now - 1);
  return 0;
}

static void test_the_drain_keeps_within_the_fd_limit(void **state) {
  (void)state;
  pid_t pid = fork();
  CK(pid >= 0, "fork");
  if (pid == 0) {
    in_child = true;
    _exit(emfile_child());
  }
  int st = 0;
  CK(waitpid(pid, &st, 0) == pid, "waitpid");
  CK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child failed (status %#x)",
     st);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fuse_file_never_asked_on_the_callers_thread),
      cmocka_unit_test(test_fork_child_drops_the_closers_queue),
      cmocka_unit_test(test_one_peer_cannot_stall_the_disposal),
      cmocka_unit_test(test_unix_carriers_are_drained),
      cmocka_unit_test(test_the_closers_push_back),
      cmocka_unit_test(test_held_pipe_never_waits),
      cmocka_unit_test(test_held_unix_never_waits),
      cmocka_unit_test(test_held_tcp_never_waits),
      cmocka_unit_test(test_sockets_past_the_budget_are_neutralised),
      cmocka_unit_test(test_the_drain_takes_any_ancillary_data),
      cmocka_unit_test(test_one_call_budget_per_message),
      cmocka_unit_test(test_the_drain_keeps_within_the_fd_limit),
  };
  return pp_run_selected("test_share_closer", tests,
                         sizeof tests / sizeof tests[0], argc, argv);
}
