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
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
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

/* The queue's bound: the closers held (a stall), 300 descriptors of a kind
 * that goes to them: PP_SHARE_CLOSERS threads, PP_SHARE_CLOSER_QUEUE
 * queued, the rest closed on the caller's thread; never more open. */
static void test_the_closers_queue_is_bounded(void **state) {
  (void)state;
  int before = pp_count_fds();
  int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
  CK(nul >= 0, "open");
  pp_closer_counts_t c0, c;
  pp_share_closer_counts(&c0);
  hold_start();
  bad_message(nul, 100);
  hold_wait(PP_SHARE_CLOSERS);
  bad_message(nul, 100);
  bad_message(nul, 100);
  pp_share_closer_counts(&c);
  CK(c.threads == PP_SHARE_CLOSERS && c.busy == PP_SHARE_CLOSERS,
     "%u closer threads, %u busy, %d expected", c.threads, c.busy,
     PP_SHARE_CLOSERS);
  CK(c.queued == PP_SHARE_CLOSER_QUEUE, "%zu queued, the bound %d", c.queued,
     PP_SHARE_CLOSER_QUEUE);
  unsigned long held = PP_SHARE_CLOSERS + PP_SHARE_CLOSER_QUEUE;
  CK(c.inline_closes - c0.inline_closes == 300 - held,
     "%lu closed on the caller's thread, %lu expected",
     c.inline_closes - c0.inline_closes, 300 - held);
  int open_now = 0;
  DIR *d = opendir("/proc/self/fd");
  CK(d != NULL, "opendir");
  while (readdir(d) != NULL)
    open_now++;
  (void)closedir(d);
  open_now -= 3;
  CK(open_now == before + 1 + (int)held,
     "%d descriptors open with the closers held, %d expected", open_now,
     before + 1 + (int)held);
  hold_end();
  (void)close(nul);
  CK(pp_count_fds() == before, "%d open, %d before", pp_count_fds(), before);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fuse_file_never_asked_on_the_callers_thread),
      cmocka_unit_test(test_fork_child_drops_the_closers_queue),
      cmocka_unit_test(test_one_peer_cannot_stall_the_disposal),
      cmocka_unit_test(test_unix_carriers_are_drained),
      cmocka_unit_test(test_the_closers_queue_is_bounded),
  };
  return pp_run_selected("test_share_closer", tests,
                         sizeof tests / sizeof tests[0], argc, argv);
}
