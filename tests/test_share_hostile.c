/*
 * Shared pools against workers that are buggy or hostile (issue 36,
 * docs/sharing.md "Threat model"). Workers are forked children reporting
 * by exit status (no cmocka in a child), each under a deadline.
 *
 *  - hostile_returns: three workers, each told every handle of every lend
 *    (tokens included, as a child forked from the owner would find them in
 *    its memory), send back every lend they were not given, and edits of
 *    their own (other chunk, generation +1, guessed and flipped tokens,
 *    another slot); from the owner's side, every one is refused, counted in
 *    lend_refusals and nothing else: the real borrowers' bytes, the lends,
 *    the stats. A worker cannot attach a lend of a chunk it was not given,
 *    nor reclaim or return anything through the inherited pool.
 *  - pid_reuse (root; skipped otherwise): in a new pid namespace a worker
 *    exits, is reaped, and another gets its pid (ns_last_pid): lend, lend
 *    by pidfd, return, reclaim by pid, reclaim_exited and reclaim_list each
 *    treat them as two processes; lending to the exited (and to a zombie)
 *    fails with PINPOOL_EEXITED.
 *  - return_pidfd (root; skipped otherwise, or without SO_PEERPIDFD of a
 *    reaped peer and pidfs): pinpool_lend_return_pidfd takes back a lend
 *    from a borrower that returned, exited and was reaped before the owner
 *    read; and refuses a process that took a dead borrower's pid, returned
 *    its handle and exited too before the owner read (D4 of issue 36's
 *    second review: a pid number cannot tell the two).
 *  - cgroup_room_files, cgroup_limit (root; skipped where no child memory
 *    cgroup can be made and limited): a shared chunk past the room the
 *    process's memory cgroups leave is PINPOOL_ENOMEM before any memfd
 *    exists; before, populating it was ended by the cgroup's OOM killer.
 *  - ctl_readonly: from a worker, the control area cannot be made writable
 *    by mprotect, pwrite, fallocate, ftruncate, a fresh mmap, or a
 *    read-write reopen through /proc; nor the library's own mapping of it.
 *  - reclaim_list: it reports exactly the lends it ended.
 *  - framing: a handle split at every byte boundary on a non-blocking
 *    socket (PINPOOL_EAGAIN, the piece kept, nothing misread after); short
 *    reads and writes of every size (pp_share_io_cap); a full non-blocking
 *    socket on the sending side; a signal during a stalled peer's message
 *    (PINPOOL_EINTR), SO_RCVTIMEO (PINPOOL_EAGAIN); extra descriptors (all
 *    closed, the stream still in step); a descriptor number reused by
 *    another socket.
 *  - small_stack: a chunk made, lent, sent, received, attached and
 *    returned on a thread with a 32 KiB stack.
 *  - fork_io_lock: a fork while another thread holds the table of kept
 *    part-messages (a test hook inside its lock): the child's
 *    pinpool_share_send/recv must not deadlock (the fork handlers take
 *    that lock too).
 */
#include "testutil.h"

#include "share.h" /* pp_share_io_cap, pp_share_io_kept, pp_test_hook */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/time.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* pinpool_share_recv, waiting for the closers where they push back
 * (PINPOOL_EBUSY, rv39s): an earlier case's descriptors may still be in
 * their hands (docs/sharing.md, "Back-pressure"). */
static int recv_settled(int sock, pinpool_share_handle_t *h, int *fd) {
  int rc;
  while ((rc = pinpool_share_recv(sock, h, fd)) == PINPOOL_EBUSY)
    pp_share_closer_flush();
  return rc;
}

#define CONF "shared=1,mlock=0,populate=1"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77 /* Linux 6.5 */
#endif
#ifndef PIDFS_MAGIC
#define PIDFS_MAGIC 0x50494446 /* Linux 6.9 */
#endif

/* Run fn as pid 1 of a new pid namespace, in a child: fn's exit code, 77
 * if no pid namespace can be made here. */
static int in_pidns(int (*fn)(void)) {
  pid_t outer = fork();
  if (outer < 0)
    return 98;
  if (outer == 0) {
    if (unshare(CLONE_NEWPID) != 0)
      _exit(77);
    pid_t init = fork(); /* pid 1 of the new namespace */
    if (init < 0)
      _exit(78);
    if (init == 0)
      _exit(getpid() != 1 ? 79 : fn());
    int st = 0;
    (void)waitpid(init, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 99);
  }
  return pp_wait_child(outer, 30000);
}

/* A test of fn in a new pid namespace (in_pidns): skipped where not root
 * (a pid namespace needs CAP_SYS_ADMIN) or where fn says 77 (what it needs
 * is not here); else fn's exit code must be 0 (the check that failed). */
static void pidns_test(const char *name, int (*fn)(void)) {
  if (geteuid() != 0) {
    print_message("%s: not root: skipped\n", name);
    skip();
  }
  int rc = in_pidns(fn);
  if (rc == 77) {
    print_message("%s: not available here (pid namespace, ns_last_pid, "
                  "...): skipped\n",
                  name);
    skip();
  }
  PP_ASSERT(rc == 0, "%s: pid namespace check %d failed", name, rc);
}

/* ---- hostile returns ------------------------------------------------------
 */
#define NW 3
/* Lends per worker: a 1 MiB block and a block of a chunk of its own. */
#define PER 2
#define NL (NW * PER)

/* Forgeries a worker makes of one of its own handles (k: which). */
#define NFORGE 6
static pinpool_share_handle_t forge(const pinpool_share_handle_t *h, int k) {
  pinpool_share_handle_t f = *h;
  switch (k) {
  case 0:
    f.chunk_id += 1;
    break;
  case 1:
    f.generation += 1;
    break;
  case 2: /* a guessed token */
    (void)syscall(SYS_getrandom, f.token, sizeof f.token, 0);
    break;
  case 3:
    f.token[15] ^= 1;
    break;
  case 4:
    f.slot += 1;
    break;
  default:
    f.generation -= 1;
    break;
  }
  return f;
}

/* Worker w: receives its PER handles (with descriptors), then the whole
 * table of NL handles; fills its own blocks, tries what the owner's API
 * offers through the inherited pool, attaches across chunks, then sends
 * back every lend it was not given and NFORGE edits of each of its own,
 * then its own honestly. */
static int hostile_worker(pinpool_t *inherited, int w, int sock) {
  pinpool_share_handle_t mine[PER], all[NL];
  int fds[PER];
  void *p[PER];
  for (int i = 0; i < PER; i++) {
    if (recv_settled(sock, &mine[i], &fds[i]) != 0 || fds[i] < 0)
      return 10;
    if (pinpool_share_attach(&mine[i], fds[i], &p[i]) != 0)
      return 11;
    pp_fill(p[i], mine[i].length, (unsigned)(w * 16 + i));
  }
  if (pp_read_full(sock, all, sizeof all) != 0)
    return 12;
  /* The owner's calls, through the pool this child inherited: refused. */
  size_t n = 0;
  if (pinpool_lend_reclaim(inherited, -1, PINPOOL_RECLAIM_LIVE, &n) !=
          PINPOOL_EFORKED ||
      pinpool_lend_reclaim_exited(inherited, 0, &n) != PINPOOL_EFORKED ||
      pinpool_lend_return(inherited, &all[(w + 1) % NW * PER], getpid()) !=
          PINPOOL_EFORKED)
    return 13;
  /* Another worker's lend of a chunk this one was not given: no
   * descriptor of it, and this worker's descriptor is another file. */
  for (int j = 0; j < NL; j++) {
    if (j / PER == w || all[j].chunk_id == mine[0].chunk_id)
      continue;
    void *q = NULL;
    if (pinpool_share_attach(&all[j], -1, &q) == 0 ||
        pinpool_share_attach(&all[j], fds[0], &q) == 0 ||
        pinpool_share_attach(&all[j], fds[1], &q) == 0)
      return 14;
  }
  /* Returns: every lend not ours (exact, token included), then forgeries
   * of ours. The owner answers each with its code. */
  for (int j = 0; j < NL; j++)
    if (j / PER != w && pinpool_share_send(sock, &all[j], -1) != 0)
      return 15;
  for (int i = 0; i < PER; i++)
    for (int k = 0; k < NFORGE; k++) {
      pinpool_share_handle_t f = forge(&mine[i], k);
      if (pinpool_share_send(sock, &f, -1) != 0)
        return 16;
    }
  /* Still ours: the owner must not have let anyone else have it. */
  for (int i = 0; i < PER; i++)
    if (!pp_filled(p[i], mine[i].length, (unsigned)(w * 16 + i)))
      return 17;
  char go;
  if (pp_read_full(sock, &go, 1) != 0)
    return 18;
  for (int i = 0; i < PER; i++) {
    if (pinpool_share_detach(p[i]) != 0 ||
        pinpool_share_send(sock, &mine[i], -1) != 0)
      return 19;
    (void)close(fds[i]);
  }
  return 0;
}

static void test_hostile_returns(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(CONF, &pool));
  int sv[NW][2];
  pid_t pid[NW];
  for (int w = 0; w < NW; w++) {
    PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv[w]) == 0,
              "socketpair");
    pid[w] = fork();
    PP_ASSERT(pid[w] >= 0, "fork");
    if (pid[w] == 0) {
      for (int v = 0; v <= w; v++)
        (void)close(sv[v][0]);
      _exit(hostile_worker(pool, w, sv[w][1]));
    }
    (void)close(sv[w][1]);
  }
  /* Each worker: one 1 MiB block (all in one chunk) and a 40 MiB block
   * (a chunk of its own). */
  void *blk[NL];
  pinpool_share_handle_t all[NL];
  for (int w = 0; w < NW; w++)
    for (int i = 0; i < PER; i++) {
      int j = w * PER + i, fd;
      PP_OK(pinpool_alloc(pool, i == 0 ? 1 * MiB : 40 * MiB, &blk[j]));
      PP_OK(pinpool_lend(pool, blk[j], pid[w], &all[j], &fd));
      PP_OK(pinpool_share_send(sv[w][0], &all[j], fd));
    }
  for (int w = 0; w < NW; w++)
    PP_ASSERT(pp_write_full(sv[w][0], all, sizeof all) == 0, "table");
  pinpool_stats_t before = pp_stats_of(pool);
  PP_ASSERT(before.lent_blocks == NL && before.lend_refusals == 0, "lent");
  /* Every hostile return, from the socket it came on: refused. */
  int refused = 0;
  for (int w = 0; w < NW; w++) {
    int expect = (NL - PER) + PER * NFORGE;
    for (int k = 0; k < expect; k++) {
      pinpool_share_handle_t h;
      int fd = 7;
      PP_OK(recv_settled(sv[w][0], &h, &fd));
      PP_ASSERT(fd == -1, "no descriptor");
      int rc = pinpool_lend_return(pool, &h, pid[w]);
      PP_ASSERT(rc == PINPOOL_EPERM || rc == PINPOOL_ESTALE ||
                    rc == PINPOOL_EBADHANDLE,
                "worker %d, return %d: accepted (%d: %s)", w, k, rc,
                pinpool_last_error());
      refused++;
    }
  }
  pinpool_stats_t after = pp_stats_of(pool);
  PP_ASSERT(after.lend_refusals == (uint64_t)refused, "refusals %llu of %d",
            (unsigned long long)after.lend_refusals, refused);
  PP_ASSERT(after.lent_blocks == before.lent_blocks &&
                after.lent_bytes == before.lent_bytes &&
                after.blocks.current == before.blocks.current &&
                after.block_bytes.current == before.block_bytes.current &&
                after.reserved_bytes.current == before.reserved_bytes.current,
            "nothing changed but the refusal count");
  /* Still lent: the owner would not free or hand out any of them. */
  for (int j = 0; j < NL; j++)
    PP_CHECK_RC(pinpool_free(pool, blk[j]), PINPOOL_EBUSY);
  void *fresh = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &fresh));
  for (int j = 0; j < NL; j++)
    PP_ASSERT(fresh != blk[j], "a lent block handed out again");
  PP_OK(pinpool_free(pool, fresh));
  /* The real borrowers' bytes, as they wrote them. */
  for (int j = 0; j < NL; j++)
    PP_ASSERT(
        pp_filled(blk[j], all[j].length, (unsigned)(j / PER * 16 + j % PER)),
        "block %d changed", j);
  /* The honest returns, from their borrowers: accepted. */
  for (int w = 0; w < NW; w++)
    PP_ASSERT(write(sv[w][0], "g", 1) == 1, "go");
  for (int w = 0; w < NW; w++)
    for (int i = 0; i < PER; i++) {
      pinpool_share_handle_t h;
      int fd;
      PP_OK(recv_settled(sv[w][0], &h, &fd));
      PP_OK(pinpool_lend_return(pool, &h, pid[w]));
    }
  for (int w = 0; w < NW; w++) {
    PP_CHECK_RC(pp_wait_child(pid[w], 20000), 0);
    (void)close(sv[w][0]);
  }
  PP_ASSERT(pp_stats_of(pool).lent_blocks == 0, "all returned");
  PP_ASSERT(pp_stats_of(pool).lend_refusals == (uint64_t)refused, "count");
  for (int j = 0; j < NL; j++)
    PP_OK(pinpool_free(pool, blk[j]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- pid reuse in a pid namespace -----------------------------------------
 */
/* Codes: the child's exit status names the check that failed. */
static int set_last_pid(pid_t want) {
  int f = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
  if (f < 0)
    return -1;
  char b[32];
  int n = snprintf(b, sizeof b, "%d", (int)want - 1);
  int ok = write(f, b, (size_t)n) == n ? 0 : -1;
  (void)close(f);
  return ok;
}

/* A child that waits on a pipe for its end. */
static pid_t sleeper(int *wake) {
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) != 0)
    return -1;
  pid_t p = fork();
  if (p == 0) {
    char c;
    (void)close(pp[1]);
    (void)read(pp[0], &c, 1);
    _exit(0);
  }
  (void)close(pp[0]);
  *wake = pp[1];
  return p;
}

static int pidns_main(void) {
  if (access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
    return 77;
  pinpool_t *pool = NULL;
  if (pinpool_create(CONF, &pool) != 0)
    return 40;
  void *a1 = NULL, *a2 = NULL, *b1 = NULL, *b2 = NULL, *c1 = NULL;
  if (pinpool_alloc(pool, 64 * KiB, &a1) ||
      pinpool_alloc(pool, 64 * KiB, &a2) ||
      pinpool_alloc(pool, 64 * KiB, &b1) ||
      pinpool_alloc(pool, 64 * KiB, &b2) || pinpool_alloc(pool, 64 * KiB, &c1))
    return 41;
  int wa;
  pid_t A = sleeper(&wa);
  if (A <= 0)
    return 42;
  pinpool_share_handle_t ha, ha2, hb, hb2, hz;
  int fd;
  if (pinpool_lend(pool, a1, A, &ha, &fd) != 0)
    return 43;
  /* A ends: while it is a zombie, a lend to it is refused. */
  (void)close(wa);
  int pfd = (int)syscall(SYS_pidfd_open, A, 0);
  if (pfd < 0)
    return 44;
  struct pollfd pl = {pfd, POLLIN, 0};
  if (poll(&pl, 1, 10000) != 1)
    return 45;
  if (pinpool_lend(pool, a2, A, &hz, &fd) != PINPOOL_EEXITED)
    return 46;
  if (pinpool_lend_pidfd(pool, a2, pfd, &hz, &fd) != PINPOOL_EEXITED)
    return 47;
  if (waitpid(A, NULL, 0) != A)
    return 48;
  /* Reaped, its lend still recorded: a lend to its pid is refused. */
  if (pinpool_lend(pool, a2, A, &hz, &fd) != PINPOOL_EEXITED)
    return 49;
  if (pinpool_lend_pidfd(pool, a2, pfd, &hz, &fd) != PINPOOL_EEXITED)
    return 50;
  /* B gets A's pid. */
  if (set_last_pid(A) != 0)
    return 51;
  int wb;
  pid_t B = sleeper(&wb);
  if (B != A) {
    fprintf(stderr, "pidns: wanted pid %d, got %d\n", (int)A, (int)B);
    return 52;
  }
  /* Lends to the pid now go to B, a new peer. */
  if (pinpool_lend(pool, b1, B, &hb, &fd) != 0)
    return 53;
  int bfd = (int)syscall(SYS_pidfd_open, B, 0);
  if (bfd < 0 || pinpool_lend_pidfd(pool, b2, bfd, &hb2, &fd) != 0)
    return 54;
  /* A's handle returned "from" the pid: B is not A. */
  if (pinpool_lend_return(pool, &ha, A) != PINPOOL_EPERM)
    return 55;
  /* reclaim_exited ends A's lend alone (one, not B's two). */
  size_t n = 0;
  if (pinpool_lend_reclaim_exited(pool, 0, &n) != 0 || n != 1)
    return 56;
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0 || st.lent_blocks != 2)
    return 57;
  /* A second exited peer with the same number, then reclaim(pid) without
   * LIVE: only the exited one's lend. */
  if (pinpool_lend(pool, a1, B, &ha2, &fd) != 0) /* B again: a third */
    return 58;
  if (pinpool_lend_reclaim(pool, B, 0, &n) != 0 || n != 0)
    return 59;
  pinpool_lend_info_t info[4];
  if (pinpool_lend_reclaim_list(pool, PINPOOL_PEER_EXITED, 0, info, 4, &n) !=
          0 ||
      n != 0)
    return 60;
  /* B's returns, from B's pid: accepted. */
  if (pinpool_lend_return(pool, &hb, B) != 0 ||
      pinpool_lend_return(pool, &hb2, B) != 0) {
    fprintf(stderr, "pidns: %s\n", pinpool_last_error());
    return 61;
  }
  /* B ends; C takes the pid; B's last lend ends by reclaim(pid), C's not. */
  (void)close(wb);
  if (waitpid(B, NULL, 0) != B)
    return 62;
  if (set_last_pid(B) != 0)
    return 63;
  int wc;
  pid_t C = sleeper(&wc);
  if (C != B)
    return 64;
  pinpool_share_handle_t hc;
  if (pinpool_lend(pool, c1, C, &hc, &fd) != 0)
    return 65;
  if (pinpool_lend_reclaim_list(pool, C, 0, info, 4, &n) != 0 || n != 1 ||
      info[0].ptr != a1 || info[0].generation != ha2.generation ||
      info[0].peer != C)
    return 66;
  if (pinpool_lend_return(pool, &hc, C) != 0)
    return 67;
  (void)close(wc);
  (void)waitpid(C, NULL, 0);
  (void)close(pfd);
  (void)close(bfd);
  if (pinpool_get_stats(pool, &st) != 0 || st.lent_blocks != 0)
    return 68;
  if (pinpool_free(pool, a1) || pinpool_free(pool, a2) ||
      pinpool_free(pool, b1) || pinpool_free(pool, b2) ||
      pinpool_free(pool, c1) || pinpool_validate(pool) != 0)
    return 69;
  pinpool_destroy(pool);
  return 0;
}

static void test_pid_reuse(void **state) {
  (void)state;
  pidns_test("pid_reuse", pidns_main);
}

/* ---- a return known by the returner's pidfd (issue 36, D4) --------------
 * pid 1 of a new pid namespace. */
/* A child that waits for a byte on go (-1: no wait), connects to the
 * listener at a, sends a byte and exits. */
static pid_t connect_and_exit(const struct sockaddr_un *a, socklen_t alen,
                              int go) {
  pid_t p = fork();
  if (p == 0) {
    char c;
    if (go >= 0 && read(go, &c, 1) != 1)
      _exit(1);
    int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, (const struct sockaddr *)a, alen) != 0 ||
        send(s, "r", 1, 0) != 1)
      _exit(2);
    _exit(0);
  }
  return p;
}

/* The SO_PEERPIDFD of the next connection on ls (its sender reaped by
 * now); -1 and errno on failure. */
static int next_peer_pidfd(int ls) {
  int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
  if (c < 0)
    return -1;
  int pfd = -1;
  socklen_t l = sizeof pfd;
  int rc = getsockopt(c, SOL_SOCKET, SO_PEERPIDFD, &pfd, &l);
  int e = errno;
  (void)close(c);
  errno = e;
  return rc == 0 ? pfd : -1;
}

static int return_pidfd_main(void) {
  if (access("/proc/sys/kernel/ns_last_pid", W_OK) != 0)
    return 77;
  pinpool_t *pool = NULL;
  void *x = NULL, *y = NULL;
  if (pinpool_create(CONF, &pool) != 0 ||
      pinpool_alloc(pool, 64 * KiB, &x) != 0 ||
      pinpool_alloc(pool, 64 * KiB, &y) != 0)
    return 40;
  /* An autobound abstract address: unique, whatever else runs. */
  int ls = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  socklen_t alen = sizeof(sa_family_t);
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, alen) != 0 ||
      listen(ls, 8) != 0)
    return 41;
  alen = sizeof a;
  if (getsockname(ls, (struct sockaddr *)&a, &alen) != 0)
    return 42;
  /* The honest borrower: lent to, returns, exits and is reaped; then the
   * owner reads. */
  int go[2];
  if (pipe2(go, O_CLOEXEC) != 0)
    return 43;
  pid_t A = connect_and_exit(&a, alen, go[0]);
  pinpool_share_handle_t hx, hy;
  int fd;
  if (A < 0 || pinpool_lend(pool, x, A, &hx, &fd) != 0)
    return 44;
  int st = 0;
  if (write(go[1], "g", 1) != 1 || waitpid(A, &st, 0) != A || !WIFEXITED(st) ||
      WEXITSTATUS(st) != 0)
    return 45;
  int pfd = next_peer_pidfd(ls);
  if (pfd < 0) {
    /* Before Linux 6.5 no SO_PEERPIDFD; before 6.16 none of a reaped
     * peer. */
    fprintf(stderr, "return_pidfd: SO_PEERPIDFD of a reaped peer: %s\n",
            strerror(errno));
    return 77;
  }
  struct statfs fs;
  if (fstatfs(pfd, &fs) != 0 || fs.f_type != PIDFS_MAGIC)
    return 77; /* no pidfs: the pid's rule (docs/sharing.md) */
  pinpool_stats_t s0, s1;
  if (pinpool_get_stats(pool, &s0) != 0)
    return 46;
  /* Bad input: a clear error, nothing changed, nothing counted. */
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) != 0 ||
      pinpool_lend_return_pidfd(pool, &hx, -1) != PINPOOL_EINVAL ||
      pinpool_lend_return_pidfd(pool, &hx, pp[0]) != PINPOOL_EINVAL ||
      pinpool_lend_return_pidfd(pool, NULL, pfd) != PINPOOL_EINVAL ||
      pinpool_lend_return_pidfd(NULL, &hx, pfd) != PINPOOL_EINVAL)
    return 47;
  (void)close(pp[0]);
  (void)close(pp[1]);
  if (pinpool_get_stats(pool, &s1) != 0 || s1.lent_blocks != 1 ||
      s1.lend_refusals != s0.lend_refusals)
    return 48;
  if (pinpool_lend_return_pidfd(pool, &hx, pfd) != 0) {
    fprintf(stderr, "return_pidfd: %s\n", pinpool_last_error());
    return 49;
  }
  /* Once more: stale, counted. */
  if (pinpool_lend_return_pidfd(pool, &hx, pfd) != PINPOOL_ESTALE)
    return 50;
  (void)close(pfd);
  /* D4: B is lent to and exits without returning, reaped; G takes B's pid,
   * sends B's handle, exits and is reaped; then the owner reads. */
  int wb;
  pid_t B = sleeper(&wb);
  if (B < 0 || pinpool_lend(pool, y, B, &hy, &fd) != 0)
    return 51;
  (void)close(wb);
  if (waitpid(B, NULL, 0) != B || set_last_pid(B) != 0)
    return 52;
  pid_t G = connect_and_exit(&a, alen, -1);
  if (G != B) {
    fprintf(stderr, "return_pidfd: wanted pid %d, got %d\n", (int)B, (int)G);
    return 53;
  }
  if (waitpid(G, &st, 0) != G || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    return 54;
  pfd = next_peer_pidfd(ls);
  if (pfd < 0 || pinpool_get_stats(pool, &s0) != 0)
    return 55;
  if (pinpool_lend_return_pidfd(pool, &hy, pfd) != PINPOOL_EPERM)
    return 56;
  if (pinpool_get_stats(pool, &s1) != 0 || s1.lent_blocks != 1 ||
      s1.lend_refusals != s0.lend_refusals + 1)
    return 57;
  (void)close(pfd);
  size_t n = 0;
  if (pinpool_lend_reclaim_exited(pool, 0, &n) != 0 || n != 1)
    return 58;
  if (pinpool_free(pool, x) != 0 || pinpool_free(pool, y) != 0 ||
      pinpool_validate(pool) != 0)
    return 59;
  (void)close(ls);
  pinpool_destroy(pool);
  return 0;
}

static void test_return_pidfd(void **state) {
  (void)state;
  /* (77 also: no SO_PEERPIDFD of a reaped peer, or no pidfs.) */
  pidns_test("return_pidfd", return_pidfd_main);
}

/* ---- an owner and a worker that are both pid 1 (issue 36, third round) ----
 * Each init of its own pid namespace, the worker's a child of the owner's.
 * Before, the worker took the handle's owner_pid (1, in the owner's
 * namespace) for its own pid, thought the handle one of its own pools',
 * closed the control descriptor pinpool_share_recv received, and its
 * attach failed (EBADHANDLE: no control area). Runs in the owner, pid 1. */
static int pid1_worker(int sock) {
  if (getpid() != 1)
    return 40;
  pinpool_share_handle_t h;
  int fd = -1;
  void *p = NULL;
  if (recv_settled(sock, &h, &fd) != 0 || fd < 0)
    return 41;
  if (h.owner_pid != 1)
    return 42; /* the case under test: equal pid numbers */
  if (pinpool_share_attach(&h, fd, &p) != 0) {
    fprintf(stderr, "pid1 worker: %s\n", pinpool_last_error());
    return 43;
  }
  memset(p, 0x5a, (size_t)h.length);
  if (pinpool_share_detach(p) != 0)
    return 44;
  return 0;
}

static int pid1_owner(void) {
  if (getpid() != 1)
    return 30;
  pinpool_t *pool = NULL;
  void *ptr = NULL;
  int sv[2];
  if (pinpool_create("shared=1", &pool) != 0 ||
      pinpool_alloc(pool, 1 << 16, &ptr) != 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return 31;
  int pp[2];
  if (pipe(pp) != 0)
    return 32;
  pid_t mid = fork();
  if (mid < 0)
    return 33;
  if (mid == 0) {
    if (unshare(CLONE_NEWPID) != 0)
      _exit(77);
    pid_t w = fork();
    if (w < 0)
      _exit(34);
    if (w == 0) { /* as a spawned worker: nothing of the owner's inherited */
      for (int f = 3; f < 1024; f++)
        if (f != sv[1])
          (void)close(f);
      _exit(pid1_worker(sv[1]));
    }
    (void)!write(pp[1], &w, sizeof w);
    int st = 0;
    (void)waitpid(w, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 99);
  }
  pid_t w = 0;
  if (read(pp[0], &w, sizeof w) != (ssize_t)sizeof w)
    return 35;
  pinpool_share_handle_t h;
  int fd = -1;
  if (pinpool_lend(pool, ptr, w, &h, &fd) != 0 ||
      pinpool_share_send(sv[0], &h, fd) != 0)
    return 36;
  int st = 0;
  if (waitpid(mid, &st, 0) != mid || !WIFEXITED(st))
    return 37;
  if (WEXITSTATUS(st) != 0)
    return WEXITSTATUS(st);
  for (size_t i = 0; i < (size_t)h.length; i++)
    if (((unsigned char *)ptr)[i] != 0x5a)
      return 38;
  size_t n = 0;
  if (pinpool_lend_reclaim_exited(pool, 0, &n) != 0 || n != 1 ||
      pinpool_free(pool, ptr) != 0)
    return 39;
  pinpool_destroy(pool);
  return 0;
}

static void test_pidns_owner_pid1(void **state) {
  (void)state;
  pidns_test("pidns_owner_pid1 (owner and worker both pid 1)", pid1_owner);
}

/* ---- the control area, from a worker --------------------------------------
 */
static int ctl_attacks(int cfd, size_t len) {
  char b = 1;
  /* The descriptor: read-only, and the file sealed against writes. */
  if (pwrite(cfd, &b, 1, 0) >= 0)
    return 1;
  if (fallocate(cfd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                (off_t)len) == 0)
    return 2;
  if (ftruncate(cfd, 0) == 0)
    return 3;
  if (mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0) != MAP_FAILED)
    return 4;
  void *v = mmap(NULL, len, PROT_READ, MAP_SHARED, cfd, 0);
  if (v == MAP_FAILED)
    return 5;
  if (mprotect(v, len, PROT_READ | PROT_WRITE) == 0)
    return 6;
  (void)munmap(v, len);
  /* A read-write reopen of the same file: the seal still says no. */
  char path[64];
  (void)snprintf(path, sizeof path, "/proc/self/fd/%d", cfd);
  int rw = open(path, O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    if (pwrite(rw, &b, 1, 0) >= 0)
      return 7;
    if (fallocate(rw, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
                  (off_t)len) == 0)
      return 8;
    if (mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0) !=
        MAP_FAILED)
      return 9;
    v = mmap(NULL, len, PROT_READ, MAP_SHARED, rw, 0);
    if (v == MAP_FAILED || mprotect(v, len, PROT_READ | PROT_WRITE) == 0)
      return 10;
    (void)munmap(v, len);
    if (fcntl(rw, F_ADD_SEALS, F_SEAL_WRITE) == 0 ||
        fcntl(rw, F_SEAL_SEAL) == 0)
      return 11;
    (void)close(rw);
  }
  return 0;
}

/* The library's own read-only view of the control area (a worker found it
 * in /proc/self/maps): mprotect cannot make it writable either. */
static int ctl_view_attack(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  if (f == NULL)
    return 20;
  char line[512];
  int found = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    if (strstr(line, "pinpool-ctl") == NULL)
      continue;
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx", &lo, &hi) != 2)
      continue;
    found++;
    if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) == 0)
      return 21;
  }
  (void)fclose(f);
  return found > 0 ? 0 : 22;
}

static void test_ctl_readonly(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(CONF, &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0) {
    (void)close(sv[0]);
    /* The message, raw: the handle and both descriptors. */
    pinpool_share_handle_t h;
    union {
      char buf[CMSG_SPACE(4 * sizeof(int))];
      struct cmsghdr a;
    } u;
    struct iovec iov = {&h, sizeof h};
    struct msghdr m = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = u.buf,
                       .msg_controllen = sizeof u.buf};
    if (recvmsg(sv[1], &m, MSG_WAITALL) != (ssize_t)sizeof h)
      _exit(30);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    if (cm == NULL || cm->cmsg_len != CMSG_LEN(2 * sizeof(int)))
      _exit(31);
    int fds[2];
    memcpy(fds, CMSG_DATA(cm), sizeof fds);
    struct stat st;
    if (fstat(fds[1], &st) != 0 || (uint64_t)st.st_ino != h.ctl_ino)
      _exit(32);
    int r = ctl_attacks(fds[1], (size_t)st.st_size);
    if (r == 0) /* and through the descriptor inherited from the owner */
      r = ctl_attacks(h.owner_ctl_fd, (size_t)st.st_size);
    void *w = NULL;
    if (r == 0 && pinpool_share_attach_ctl(&h, fds[0], fds[1], &w) != 0)
      _exit(33);
    if (r == 0)
      r = ctl_view_attack();
    if (r != 0) {
      fprintf(stderr,
              "ctl attack %d succeeded: the worker wrote the "
              "control area\n",
              r);
      _exit(40 + r);
    }
    pp_fill(w, h.length, 9);
    if (pinpool_share_detach(w) != 0)
      _exit(34);
    _exit(0);
  }
  (void)close(sv[1]);
  pinpool_share_handle_t h;
  int fd;
  PP_OK(pinpool_lend(pool, p, pid, &h, &fd));
  PP_OK(pinpool_share_send(sv[0], &h, fd));
  PP_CHECK_RC(pp_wait_child(pid, 10000), 0);
  /* The worker filled the block, and the lend is as the owner made it: an
   * attach here still finds the generation. */
  PP_ASSERT(pp_filled(p, 1 * MiB, 9), "filled");
  void *w = NULL;
  PP_OK(pinpool_share_attach(&h, fd, &w));
  PP_OK(pinpool_share_detach(w));
  size_t n = 0;
  PP_OK(pinpool_lend_reclaim_exited(pool, PINPOOL_RECLAIM_FREE, &n));
  PP_ASSERT(n == 1, "%zu", n);
  (void)close(sv[0]);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- reclaim_list -------------------------------------------------------- */
static void test_reclaim_list(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(CONF, &pool));
  void *b[5];
  pinpool_share_handle_t h[5];
  int fd;
  int wake;
  pid_t dead = sleeper(&wake);
  PP_ASSERT(dead > 0, "fork");
  for (int i = 0; i < 5; i++) {
    PP_OK(pinpool_alloc(pool, 64 * KiB, &b[i]));
    PP_OK(pinpool_lend(pool, b[i], i < 3 ? dead : getpid(), &h[i], &fd));
  }
  (void)close(wake);
  PP_CHECK_RC(pp_wait_child(dead, 10000), 0);
  pinpool_lend_info_t info[2];
  size_t n = 0, total = 0;
  bool seen[5] = {false};
  do { /* two at a time: it says which, exactly */
    PP_OK(pinpool_lend_reclaim_list(pool, PINPOOL_PEER_EXITED, 0, info, 2, &n));
    for (size_t k = 0; k < n; k++) {
      int i = 0;
      while (i < 5 && b[i] != info[k].ptr)
        i++;
      PP_ASSERT(i < 3 && !seen[i], "ended lend %zu is not one of the dead's",
                k);
      seen[i] = true;
      PP_ASSERT(info[k].generation == h[i].generation &&
                    info[k].length == h[i].length && info[k].peer == dead,
                "fields");
    }
    total += n;
  } while (n == 2);
  PP_ASSERT(total == 3 && seen[0] && seen[1] && seen[2], "the three: %zu",
            total);
  PP_ASSERT(pp_stats_of(pool).lent_blocks == 2, "the live two stay");
  PP_OK(pinpool_lend_reclaim_list(pool, getpid(), PINPOOL_RECLAIM_LIVE, info, 2,
                                  &n));
  PP_ASSERT(n == 2, "%zu", n);
  for (int i = 0; i < 5; i++)
    PP_OK(pinpool_free(pool, b[i]));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- thread pidfds ----------------------------------------------------------
 * A pidfd of a thread (PIDFD_THREAD, Linux 6.9) polls readable when that
 * thread exits: a lend tracked by it would end while its process lives. */
#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif
static int thr_pipe[2];
static void *parked_thread(void *a) {
  (void)a;
  pid_t t = (pid_t)syscall(SYS_gettid);
  char c;
  if (write(thr_pipe[1], &t, sizeof t) != sizeof t)
    _exit(3);
  if (read(thr_pipe[0], &c, 1) < 0) /* never written: parked until killed */
    _exit(3);
  return NULL;
}

static void test_thread_pidfd(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(CONF, &pool));
  void *b;
  PP_OK(pinpool_alloc(pool, 64 * KiB, &b));
  int up[2];
  PP_ASSERT(pipe(up) == 0, "pipe");
  pid_t c = fork();
  PP_ASSERT(c >= 0, "fork");
  if (c == 0) {
    (void)prctl(PR_SET_PDEATHSIG, SIGKILL); /* a failed check ends it too */
    thr_pipe[1] = up[1];
    int down[2];
    if (pipe(down) != 0)
      _exit(3);
    thr_pipe[0] = down[0];
    pthread_t t;
    if (pthread_create(&t, NULL, parked_thread, NULL) != 0)
      _exit(3);
    (void)pthread_join(t, NULL);
    _exit(0);
  }
  (void)close(up[1]);
  pid_t tid = 0;
  PP_ASSERT(pp_read_full(up[0], &tid, sizeof tid) == 0, "tid");
  (void)close(up[0]);
  int fds0 = pp_count_fds();
  pid_t named[2] = {tid, c}; /* a non-leader thread, and the leader thread */
  for (int k = 0; k < 2; k++) {
    int tfd = (int)syscall(SYS_pidfd_open, named[k], PIDFD_THREAD);
    if (tfd < 0 && errno == EINVAL) /* no PIDFD_THREAD: nothing to refuse */
      break;
    PP_ASSERT(tfd >= 0, "pidfd_open(%d, PIDFD_THREAD): %s", (int)named[k],
              strerror(errno));
    pinpool_share_handle_t h;
    int fd = -5;
    PP_CHECK_RC(pinpool_lend_pidfd(pool, b, tfd, &h, &fd), PINPOOL_EINVAL);
    PP_ASSERT(strstr(pinpool_last_error(), "thread") != NULL, "says why: %s",
              pinpool_last_error());
    PP_ASSERT(fd == -5 && pp_stats_of(pool).lent_blocks == 0,
              "nothing changed");
    (void)close(tfd);
  }
  PP_ASSERT(pp_count_fds() == fds0, "no descriptor kept");
  /* The process's own pidfd is taken. */
  int pfd = (int)syscall(SYS_pidfd_open, c, 0);
  PP_ASSERT(pfd >= 0, "pidfd_open");
  pinpool_share_handle_t h;
  int fd;
  PP_OK(pinpool_lend_pidfd(pool, b, pfd, &h, &fd));
  (void)close(fd);
  (void)close(pfd);
  size_t n = 9;
  PP_OK(pinpool_lend_reclaim_exited(pool, 0, &n));
  PP_ASSERT(n == 0, "the live process's lend stays: %zu", n);
  (void)kill(c, SIGKILL);
  (void)waitpid(c, NULL, 0);
  PP_OK(pinpool_lend_reclaim_exited(pool, 0, &n));
  PP_ASSERT(n == 1, "%zu", n);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- framing --------------------------------------------------------------
 */
static pinpool_share_handle_t fake_handle(uint64_t gen) {
  pinpool_share_handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = PINPOOL_SHARE_MAGIC;
  h.version = PINPOOL_SHARE_VERSION;
  h.generation = gen;
  for (int i = 0; i < 16; i++)
    h.token[i] = (uint8_t)(gen * 31 + (uint64_t)i);
  h.owner_pid = -1; /* not ours: the send carries fd alone */
  return h;
}

/* Send bytes [from, to) of h raw, with descriptors fds[0..nfds) on them. */
static void raw_send(int sock, const pinpool_share_handle_t *h, size_t from,
                     size_t to, const int *fds, int nfds) {
  PP_ASSERT(pp_send_fds(sock, (const char *)h + from, to - from, fds, nfds) ==
                (ssize_t)(to - from),
            "raw send");
}

static void expect_handle(int sock, uint64_t gen, bool with_fd, ino_t ino) {
  pinpool_share_handle_t h;
  int fd = -5;
  PP_OK(recv_settled(sock, &h, &fd));
  pinpool_share_handle_t want = fake_handle(gen);
  PP_ASSERT(memcmp(&h, &want, sizeof h) == 0, "handle %llu misread",
            (unsigned long long)gen);
  if (with_fd) {
    struct stat st;
    PP_ASSERT(fd >= 0 && fstat(fd, &st) == 0 && st.st_ino == ino,
              "its descriptor");
    (void)close(fd);
  } else {
    PP_ASSERT(fd == -1, "no descriptor");
  }
}

static void on_alarm(int sig) { (void)sig; }

static void test_framing(void **state) {
  (void)state;
  int fds0 = pp_count_fds();
  FILE *tf = tmpfile();
  PP_ASSERT(tf != NULL, "tmpfile");
  int file = fileno(tf);
  struct stat fst;
  PP_ASSERT(fstat(file, &fst) == 0, "fstat");
  const size_t H = sizeof(pinpool_share_handle_t);
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  /* 1. Split at every byte boundary, non-blocking receiver. */
  PP_ASSERT(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0, "nonblock");
  for (size_t k = 1; k < H; k++) {
    pinpool_share_handle_t h = fake_handle(k), got;
    int fd = -5;
    raw_send(sv[0], &h, 0, k, &file, 1);
    PP_CHECK_RC(recv_settled(sv[1], &got, &fd), PINPOOL_EAGAIN);
    PP_ASSERT(fd == -5, "nothing out yet");
    PP_ASSERT(pp_share_io_kept() == 1, "the piece is kept");
    raw_send(sv[0], &h, k, H, NULL, 0);
    expect_handle(sv[1], k, true, fst.st_ino);
    PP_ASSERT(pp_share_io_kept() == 0, "nothing kept");
  }
  PP_CHECK_RC(recv_settled(sv[1], &(pinpool_share_handle_t){0}, &(int){0}),
              PINPOOL_EAGAIN);
  PP_ASSERT(pp_share_io_kept() == 0, "an empty socket keeps nothing");
  PP_ASSERT(fcntl(sv[1], F_SETFL, 0) == 0, "blocking");
  /* 2. Short reads and writes of every size up to a handle. */
  for (size_t cap = 1; cap <= H; cap++) {
    pp_store_relaxed(&pp_share_io_cap, cap);
    pinpool_share_handle_t h = fake_handle(1000 + cap);
    PP_OK(pinpool_share_send(sv[0], &h, cap % 2 ? file : -1));
    h = fake_handle(2000 + cap);
    PP_OK(pinpool_share_send(sv[0], &h, -1));
    expect_handle(sv[1], 1000 + cap, cap % 2, fst.st_ino);
    expect_handle(sv[1], 2000 + cap, false, 0);
  }
  pp_store_relaxed(&pp_share_io_cap, 0);
  /* 3. A full non-blocking socket on the sender's side: EAGAIN, the piece
   * kept, the same call again finishes it; every message intact, in
   * order. Short writes make the part-sent case certain. */
  int small = 4096;
  (void)setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  PP_ASSERT(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0, "nonblock");
  pp_store_relaxed(&pp_share_io_cap, 40);
  uint64_t partial = 0;
  for (uint64_t round = 0; round < 3; round++) {
    uint64_t base = 5000 + round * 100000, n = 0, next = 0;
    pinpool_share_handle_t h;
    int rc;
    for (;;) { /* until the socket is full */
      h = fake_handle(base + n);
      rc = pinpool_share_send(sv[0], &h, -1);
      if (rc != 0)
        break;
      n++;
      PP_ASSERT(n < 100000, "the socket never filled");
    }
    PP_CHECK_RC(rc, PINPOOL_EAGAIN);
    partial += pp_share_io_kept();
    /* Drain one at a time, the same call again until it is sent. */
    while ((rc = pinpool_share_send(sv[0], &h, -1)) == PINPOOL_EAGAIN) {
      PP_ASSERT(next < n, "drained everything before the part-sent one");
      expect_handle(sv[1], base + next++, false, 0);
    }
    PP_OK(rc);
    n++;
    while (next < n)
      expect_handle(sv[1], base + next++, false, 0);
  }
  pp_store_relaxed(&pp_share_io_cap, 0);
  PP_ASSERT(fcntl(sv[0], F_SETFL, 0) == 0, "blocking");
  PP_ASSERT(pp_share_io_kept() == 0, "nothing kept");
  print_message("framing: %llu of 3 full-socket sends were part-sent\n",
                (unsigned long long)partial);
  /* 4. A peer stalling mid-message: a signal gets the receiver out
   * (EINTR), SO_RCVTIMEO too (EAGAIN); the rest completes the message. */
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_alarm; /* no SA_RESTART */
  PP_ASSERT(sigaction(SIGALRM, &sa, &old) == 0, "sigaction");
  pinpool_share_handle_t h = fake_handle(7);
  raw_send(sv[0], &h, 0, 50, &file, 1);
  struct itimerval it = {{0, 0}, {0, 20000}};
  PP_ASSERT(setitimer(ITIMER_REAL, &it, NULL) == 0, "setitimer");
  pinpool_share_handle_t got;
  int gfd = -5;
  PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EINTR);
  PP_ASSERT(gfd == -5 && pp_share_io_kept() == 1, "kept");
  struct timeval tv = {0, 20000};
  PP_ASSERT(setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0,
            "rcvtimeo");
  PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EAGAIN);
  raw_send(sv[0], &h, 50, 90, NULL, 0);
  PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EAGAIN);
  raw_send(sv[0], &h, 90, H, NULL, 0);
  expect_handle(sv[1], 7, true, fst.st_ino);
  tv.tv_usec = 0;
  PP_ASSERT(setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0,
            "rcvtimeo off");
  PP_ASSERT(sigaction(SIGALRM, &old, NULL) == 0, "sigaction");
  /* 5. Extra descriptors: three at once, or two then one more on a later
   * piece: the message is consumed whole and refused, every descriptor
   * closed, and the next message is read right. */
  int three[3] = {file, file, file};
  h = fake_handle(8);
  raw_send(sv[0], &h, 0, H, three, 3);
  PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EBADHANDLE);
  h = fake_handle(9);
  raw_send(sv[0], &h, 0, 10, three, 2);
  raw_send(sv[0], &h, 10, H, three, 1);
  PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EBADHANDLE);
  h = fake_handle(10);
  PP_OK(pinpool_share_send(sv[0], &h, file));
  expect_handle(sv[1], 10, true, fst.st_ino);
  PP_ASSERT(pp_count_fds() == fds0 + 3, "every extra descriptor closed (%d)",
            pp_count_fds() - fds0);
  /* 6. A piece kept for a descriptor number that then names another
   * socket: not applied to it. */
  PP_ASSERT(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0, "nonblock");
  h = fake_handle(11);
  raw_send(sv[0], &h, 0, 30, NULL, 0);
  PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EAGAIN);
  int num = sv[1];
  (void)close(sv[0]);
  (void)close(sv[1]);
  int sv2[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2) == 0, "sp");
  int recv_end = sv2[0] == num ? sv2[0] : sv2[1];
  int send_end = recv_end == sv2[0] ? sv2[1] : sv2[0];
  PP_ASSERT(recv_end == num, "the number is reused (%d %d %d)", num, sv2[0],
            sv2[1]);
  h = fake_handle(12);
  PP_OK(pinpool_share_send(send_end, &h, -1));
  expect_handle(recv_end, 12, false, 0);
  PP_ASSERT(pp_share_io_kept() == 0, "the old piece dropped");
  (void)close(sv2[0]);
  (void)close(sv2[1]);
  (void)fclose(tf);
  PP_ASSERT(pp_count_fds() == fds0, "descriptors: %d before, %d after", fds0,
            pp_count_fds());
}

/* ---- fork while the part-message table is locked ------------------------ */
/* SOCK_SEQPACKET and SOCK_DGRAM: a message shorter than a handle (with or
 * without descriptors, any length from 0) is refused whole and the next
 * message read right, for every length and with the test hook's cap on
 * piece size (which a datagram socket must ignore). */
static void test_datagram_short(void **state) {
  (void)state;
  int fds0 = pp_count_fds();
  FILE *tf = tmpfile();
  PP_ASSERT(tf != NULL, "tmpfile");
  int file = fileno(tf);
  struct stat fst;
  PP_ASSERT(fstat(file, &fst) == 0, "fstat");
  const size_t H = sizeof(pinpool_share_handle_t);
  const int types[2] = {SOCK_SEQPACKET, SOCK_DGRAM};
  for (int t = 0; t < 2; t++) {
    int sv[2];
    PP_ASSERT(socketpair(AF_UNIX, types[t] | SOCK_CLOEXEC, 0, sv) == 0, "sp");
    for (size_t len = 0; len < H; len++) {
      if (len == 0 && types[t] == SOCK_SEQPACKET)
        continue; /* 0 bytes there reads as the end of the connection */
      pinpool_share_handle_t h = fake_handle(100 + len), got;
      int gfd = -5;
      if (len == 0)
        PP_ASSERT(send(sv[0], "", 0, 0) == 0, "empty datagram");
      else
        raw_send(sv[0], &h, 0, len, &file, len % 2 ? 1 : 0);
      PP_OK(pinpool_share_send(sv[0], &h, file));
      PP_CHECK_RC(recv_settled(sv[1], &got, &gfd), PINPOOL_EBADHANDLE);
      PP_ASSERT(gfd == -5, "*fd untouched on refusal");
      PP_ASSERT(pp_share_io_kept() == 0, "type %d len %zu: nothing kept",
                types[t], len);
      pp_store_relaxed(&pp_share_io_cap, len % 7 + 1);
      expect_handle(sv[1], 100 + len, true, fst.st_ino);
      pp_store_relaxed(&pp_share_io_cap, 0);
    }
    (void)close(sv[0]);
    (void)close(sv[1]);
  }
  (void)fclose(tf);
  PP_ASSERT(pp_count_fds() == fds0, "descriptors: %d before, %d after", fds0,
            pp_count_fds());
}

/* Control descriptors a peer sends: the owner keeps none (100 returns each
 * with a second descriptor, any (dev, ino)); a worker keeps only the
 * handle's real control area, not another file or an unsealed memfd. */
static void send_two(int sock, const pinpool_share_handle_t *h, int a, int b) {
  int two[2] = {a, b};
  raw_send(sock, h, 0, sizeof *h, two, 2);
}

static int worker_keeps(int sock) {
  /* Forked from the owner: owns no chunks itself. */
  pinpool_share_handle_t g;
  int fd = -1;
  if (recv_settled(sock, &g, &fd) != 0 || fd < 0) /* the bogus one */
    return 10;
  (void)close(fd);
  if (pp_share_worker_pending_ctl() != 0)
    return 11;
  if (recv_settled(sock, &g, &fd) != 0 || fd < 0) /* the real one */
    return 12;
  (void)close(fd);
  return pp_share_worker_pending_ctl() == 1 ? 0 : 13;
}

static void test_ctl_fds_not_kept(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *b;
  pinpool_share_handle_t h;
  int cfd;
  pp_lend_to_self(CONF, 64 * KiB, &pool, &b, &h, &cfd);
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  int fds0 = pp_count_fds();
  for (int i = 0; i < 100; i++) {
    pinpool_share_handle_t f = h;
    f.ino = 1000000 + (uint64_t)i; /* any chunk the peer names */
    int m = memfd_create("from-peer", MFD_CLOEXEC);
    PP_ASSERT(m >= 0 && ftruncate(m, 1 << 20) == 0, "memfd");
    send_two(sv[1], &f, m, m);
    (void)close(m);
    pinpool_share_handle_t g;
    int got = -1;
    PP_OK(recv_settled(sv[0], &g, &got));
    PP_ASSERT(got >= 0, "the first descriptor is the caller's");
    (void)close(got);
  }
  PP_ASSERT(pp_share_worker_pending_ctl() == 0 && pp_count_fds() == fds0,
            "the owner kept %zu control descriptors (%d open more)",
            pp_share_worker_pending_ctl(), pp_count_fds() - fds0);
  /* A worker: an unsealed memfd named as the control area is not kept;
   * the owner's real one is. */
  pid_t c = fork();
  PP_ASSERT(c >= 0, "fork");
  if (c == 0)
    _exit(worker_keeps(sv[0]));
  pinpool_share_handle_t f = h;
  int m = memfd_create("fake-ctl", MFD_CLOEXEC);
  PP_ASSERT(m >= 0, "memfd");
  struct stat st;
  PP_ASSERT(fstat(m, &st) == 0, "fstat");
  f.ino = h.ino + 1000;  /* another chunk: not the attached one */
  f.ctl_ino = st.st_ino; /* and the "control area" is m */
  send_two(sv[1], &f, cfd, m);
  (void)close(m);
  PP_OK(pinpool_share_send(sv[1], &h, cfd)); /* the owner's own send */
  PP_CHECK_RC(pp_wait_child(c, 10000), 0);
  (void)close(cfd);
  (void)close(sv[0]);
  (void)close(sv[1]);
  size_t n = 0;
  PP_OK(pinpool_lend_reclaim(pool, getpid(), PINPOOL_RECLAIM_LIVE, &n));
  PP_ASSERT(n == 1, "%zu", n);
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* shared=1, a block bigger than the machine: PINPOOL_ENOMEM before any
 * memfd exists (a memfd is not counted against overcommit: populated, it
 * ran into the OOM killer). The child caps its address space so that,
 * should the check regress, the chunk's mmap fails instead of taking the
 * machine's memory; the message then names mmap, not the check. */
#ifndef PP_SANITIZED
static int huge_child(size_t want) {
  unsigned long vm = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  if (f == NULL || fscanf(f, "%lu", &vm) != 1)
    return 20;
  (void)fclose(f);
  struct rlimit rl = {(rlim_t)vm * PP_PAGE + 2 * GiB,
                      (rlim_t)vm * PP_PAGE + 2 * GiB};
  if (setrlimit(RLIMIT_AS, &rl) != 0)
    return 21;
  pinpool_t *pool = NULL;
  if (pinpool_create(CONF, &pool) != 0)
    return 22;
  void *b = NULL;
  int rc = pinpool_alloc(pool, want, &b);
  int ok = rc == PINPOOL_ENOMEM && b == NULL &&
           strstr(pinpool_last_error(), "RAM and swap") != NULL &&
           pp_stats_of(pool).reserved_bytes.current == 0;
  if (!ok)
    fprintf(stderr, "huge alloc: rc %d, %s\n", rc, pinpool_last_error());
  pinpool_destroy(pool);
  return ok ? 0 : 23;
}
#endif

static void test_shared_alloc_beyond_memory(void **state) {
  (void)state;
#ifdef PP_SANITIZED
  skip(); /* the sanitizers' shadow needs more address space than the cap */
#else
  struct sysinfo si;
  PP_ASSERT(sysinfo(&si) == 0, "sysinfo");
  size_t total = (size_t)(si.totalram + si.totalswap) * si.mem_unit;
  pid_t c = fork();
  PP_ASSERT(c >= 0, "fork");
  if (c == 0)
    _exit(huge_child(total + GiB));
  PP_CHECK_RC(pp_wait_child(c, 20000), 0);
#endif
}

/* ---- a memory cgroup's limit (issue 36, third round) ---------------------
 * A chunk the cgroup cannot hold was populated into its OOM killer. */
static void put_file(const char *dir, const char *name, const char *text) {
  char path[PATH_MAX];
  (void)snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  PP_ASSERT(f != NULL, "open %s", path);
  (void)fputs(text, f);
  (void)fclose(f);
}

static void mkdir_at(char *out, size_t n, const char *base, const char *sub) {
  (void)snprintf(out, n, "%s/%s", base, sub);
  PP_ASSERT(mkdir(out, 0700) == 0, "mkdir %s: %s", out, strerror(errno));
}

/* The room from made-up /proc files and cgroup trees: the least of every
 * level's limit less its unreclaimable charge, v2 and v1 together; a
 * level without a limit counts for nothing; nothing readable: 1. */
static void test_cgroup_room_files(void **state) {
  (void)state;
  char tmp[] = "/tmp/pp-cgroup-XXXXXX", m2[PATH_MAX], m1[PATH_MAX], a[PATH_MAX],
       b[PATH_MAX], x[PATH_MAX], mi[PATH_MAX + 16], cg[PATH_MAX + 16],
       text[4 * PATH_MAX];
  PP_ASSERT(mkdtemp(tmp) != NULL, "mkdtemp");
  mkdir_at(m2, sizeof m2, tmp, "v2");
  mkdir_at(a, sizeof a, m2, "a");
  mkdir_at(b, sizeof b, a, "b");
  mkdir_at(m1, sizeof m1, tmp, "v1");
  mkdir_at(x, sizeof x, m1, "x");
  /* v2: a holds 100 MiB, 90 charged, of which 40 is file cache that is
   * not shmem: 50 MiB of room; b, below it, has no limit. */
  put_file(a, "memory.max", "104857600\n");
  put_file(a, "memory.current", "94371840\n");
  put_file(a, "memory.stat",
           "anon 41943040\nfile 52428800\nshmem "
           "10485760\nfile_mapped 0\n");
  put_file(b, "memory.max", "max\n");
  put_file(b, "memory.current", "1048576\n");
  (void)snprintf(mi, sizeof mi, "%s/mountinfo", tmp);
  (void)snprintf(cg, sizeof cg, "%s/cgroup", tmp);
  (void)snprintf(text, sizeof text,
                 "22 1 0:21 / /proc rw - proc proc rw\n"
                 "30 22 0:27 / %s rw,relatime shared:9 - cgroup2 cgroup2 "
                 "rw,nsdelegate\n",
                 m2);
  put_file(tmp, "mountinfo", text);
  put_file(tmp, "cgroup", "0::/a/b\n");
  uint64_t room = 0;
  PP_CHECK_RC(pp_share_cgroup_room(mi, cg, &room), 0);
  PP_ASSERT(room == 50 * MiB, "v2 room %llu", (unsigned long long)room);
  char dir[PATH_MAX];
  int v = pp_share_cgroup_dir(mi, cg, dir, sizeof dir);
  PP_ASSERT(v == 2 && strcmp(dir, b) == 0, "cgroup dir: %d %s", v, dir);
  /* v1 too (hybrid): x holds 30 MiB, 25 charged, its cache all shmem:
   * 5 MiB, the least. */
  put_file(x, "memory.limit_in_bytes", "31457280\n");
  put_file(x, "memory.usage_in_bytes", "26214400\n");
  put_file(x, "memory.stat",
           "cache 5242880\nrss 0\ntotal_cache "
           "5242880\ntotal_shmem 5242880\n");
  put_file(m1, "memory.limit_in_bytes", "9223372036854771712\n");
  put_file(m1, "memory.usage_in_bytes", "999999999999\n");
  (void)snprintf(text, sizeof text,
                 "30 22 0:27 / %s rw - cgroup2 cgroup2 rw\n"
                 "31 22 0:28 / %s rw - cgroup cgroup rw,memory\n",
                 m2, m1);
  put_file(tmp, "mountinfo", text);
  put_file(tmp, "cgroup", "5:memory:/x\n1:cpu:/y\n0::/a/b\n");
  PP_CHECK_RC(pp_share_cgroup_room(mi, cg, &room), 0);
  PP_ASSERT(room == 5 * MiB, "v1+v2 room %llu", (unsigned long long)room);
  /* Over the limit: no room (never a wrap). */
  put_file(x, "memory.usage_in_bytes", "41943040\n");
  PP_CHECK_RC(pp_share_cgroup_room(mi, cg, &room), 0);
  PP_ASSERT(room == 0, "over the limit: room %llu", (unsigned long long)room);
  /* A container's mount of its own subtree (root /a): b is at m2/b. */
  (void)snprintf(text, sizeof text,
                 "30 22 0:27 /a %s rw - cgroup2 cgroup2 rw\n", m2);
  put_file(tmp, "mountinfo", text);
  put_file(tmp, "cgroup", "0::/a\n");
  put_file(m2, "memory.max", "20971520\n");
  put_file(m2, "memory.current", "10485760\n");
  PP_CHECK_RC(pp_share_cgroup_room(mi, cg, &room), 0);
  PP_ASSERT(room == 10 * MiB, "subtree mount: room %llu",
            (unsigned long long)room);
  /* No limit anywhere, or no files: nothing to compare with. */
  put_file(tmp, "cgroup", "0::/a/b\n");
  (void)snprintf(text, sizeof text, "30 22 0:27 / %s rw - cgroup2 cgroup2 rw\n",
                 b);
  put_file(tmp, "mountinfo", text);
  put_file(tmp, "cgroup", "0::/\n");
  PP_CHECK_RC(pp_share_cgroup_room(mi, cg, &room), 1);
  char none[PATH_MAX + 16];
  (void)snprintf(none, sizeof none, "%s/none", tmp);
  PP_CHECK_RC(pp_share_cgroup_room(none, cg, &room), 1);
  PP_CHECK_RC(pp_share_cgroup_room(mi, none, &room), 1);
  char cmd[PATH_MAX + 16];
  (void)snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
  PP_CHECK_RC(system(cmd), 0);
}

#ifndef PP_SANITIZED
/* Memfds this process has open. */
static int memfds_open(void) {
  DIR *d = opendir("/proc/self/fd");
  if (d == NULL)
    return -1;
  int n = 0;
  struct dirent *e;
  char path[PATH_MAX], link[PATH_MAX];
  while ((e = readdir(d)) != NULL) {
    (void)snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(path, link, sizeof link - 1);
    if (k > 0) {
      link[k] = '\0';
      n += strncmp(link, "/memfd:", 7) == 0;
    }
  }
  (void)closedir(d);
  return n;
}

/* In the limited cgroup: a chunk past its room is PINPOOL_ENOMEM before
 * any memfd exists (before: the population was ended by SIGKILL); one
 * that fits is made. */
static int cgroup_child(int go) {
  char c;
  if (read(go, &c, 1) != 1)
    return 30;
  pinpool_t *pool = NULL;
  if (pinpool_create("shared=1,mlock=0,populate=1", &pool) != 0)
    return 31;
  int before = memfds_open();
  void *p = NULL;
  int rc = pinpool_alloc(pool, 128 * MiB, &p);
  if (rc != PINPOOL_ENOMEM || p != NULL ||
      strstr(pinpool_last_error(), "cgroup") == NULL) {
    fprintf(stderr, "cgroup: rc %d, %s\n", rc, pinpool_last_error());
    return 32;
  }
  if (memfds_open() != before || pp_stats_of(pool).reserved_bytes.current != 0)
    return 33;
  if (pinpool_alloc(pool, 4 * MiB, &p) != 0) {
    fprintf(stderr, "cgroup: 4 MiB: %s\n", pinpool_last_error());
    return 34;
  }
  if (pinpool_free(pool, p) != 0)
    return 35;
  pinpool_destroy(pool);
  return 0;
}

#endif

static void test_cgroup_limit(void **state) {
  (void)state;
#ifdef PP_SANITIZED
  skip(); /* the sanitizers' shadow is charged to the cgroup too */
#else
  char dir[PATH_MAX], sub[PATH_MAX + 64];
  int v = pp_share_cgroup_dir("/proc/self/mountinfo", "/proc/self/cgroup", dir,
                              sizeof dir);
  if (geteuid() != 0 || v == 0) {
    print_message("cgroup_limit: not root, or no memory cgroup: skipped\n");
    skip();
  }
  (void)snprintf(sub, sizeof sub, "%s/pp-test-%d", dir, (int)getpid());
  if (mkdir(sub, 0700) != 0) {
    print_message("cgroup_limit: mkdir %s: %s: skipped\n", sub,
                  strerror(errno));
    skip();
  }
  char lim[32];
  (void)snprintf(lim, sizeof lim, "%d", 64 << 20);
  char path[PATH_MAX + 96];
  (void)snprintf(path, sizeof path, "%s/%s", sub,
                 v == 2 ? "memory.max" : "memory.limit_in_bytes");
  FILE *f = fopen(path, "w");
  bool limited = f != NULL && fputs(lim, f) >= 0;
  if (f != NULL)
    limited = fclose(f) == 0 && limited;
  int go[2];
  PP_ASSERT(pipe2(go, O_CLOEXEC) == 0, "pipe");
  pid_t c = limited ? fork() : -1;
  if (c == 0)
    _exit(cgroup_child(go[0]));
  bool moved = false;
  if (c > 0) {
    (void)snprintf(path, sizeof path, "%s/cgroup.procs", sub);
    f = fopen(path, "w");
    moved = f != NULL && fprintf(f, "%d\n", (int)c) > 0;
    if (f != NULL)
      moved = fclose(f) == 0 && moved;
    if (!moved)
      (void)kill(c, SIGKILL);
    (void)!write(go[1], "g", 1);
  }
  int rc = c > 0 ? pp_wait_child(c, 30000) : -1;
  (void)close(go[0]);
  (void)close(go[1]);
  (void)rmdir(sub);
  if (!limited || !moved) {
    print_message("cgroup_limit: cannot limit a child cgroup here (%s): "
                  "skipped\n",
                  !limited ? "limit" : "move");
    skip();
  }
  PP_ASSERT(rc == 0,
            "in a 64 MiB cgroup: check %d failed (a kill: the OOM "
            "killer)",
            rc);
#endif
}

static sem_t io_in;
static _Atomic(int) io_armed;

static void hold_io_lock(int point) {
  if (point != PP_HOOK_SHARE_IO || !atomic_exchange(&io_armed, 0))
    return;
  (void)sem_post(&io_in);
  pp_sleep_ms(200); /* the fork comes meanwhile */
}

static void *recv_nonblocking(void *arg) {
  int sock = *(int *)arg;
  pinpool_share_handle_t h;
  int fd;
  (void)recv_settled(sock, &h, &fd); /* EAGAIN, through the hook */
  return NULL;
}

static void test_fork_io_lock(void **state) {
  (void)state;
  /* An owner: the fork handlers exist from the first pool on (fork.c). */
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(CONF, &pool));
  int sv[2], sv2[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0 &&
                socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2) == 0,
            "socketpair");
  PP_ASSERT(fcntl(sv[1], F_SETFL, O_NONBLOCK) == 0, "nonblock");
  PP_ASSERT(sem_init(&io_in, 0, 0) == 0, "sem_init");
  atomic_store(&pp_test_hook, hold_io_lock);
  atomic_store(&io_armed, 1);
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, recv_nonblocking, &sv[1]) == 0, "thread");
  while (sem_wait(&io_in) != 0) {
  }
  pid_t pid = fork(); /* the other thread is inside the table's lock */
  if (pid == 0) {
    atomic_store(&pp_test_hook, NULL);
    pinpool_share_handle_t h = fake_handle(77), got;
    int fd = -5;
    if (pinpool_share_send(sv2[0], &h, -1) != 0 ||
        recv_settled(sv2[1], &got, &fd) != 0 || memcmp(&h, &got, sizeof h) != 0)
      _exit(1);
    _exit(0);
  }
  PP_ASSERT(pid > 0, "fork");
  (void)pthread_join(t, NULL);
  atomic_store(&pp_test_hook, NULL);
  int rc = pp_wait_child(pid, 5000);
  PP_ASSERT(rc == 0, "the child's share_send/recv %s (%d)",
            rc == -1 ? "deadlocked on a lock held at the fork" : "failed", rc);
  (void)sem_destroy(&io_in);
  for (int i = 0; i < 2; i++) {
    (void)close(sv[i]);
    (void)close(sv2[i]);
  }
  pinpool_destroy(pool);
}

/* ---- small stacks -------------------------------------------------------
 * A shared pool's calls on a thread with a small stack (issue 36, fourth
 * review, item 5): the chunk's creation read the memory cgroup with ~44
 * KiB of arrays on the stack and crashed a thread with 32-48 KiB. The
 * whole share path runs on SMALL_STACK bytes: a chunk made, lent, sent and
 * received with a descriptor, attached, returned. In a child, so that the
 * overflow is a failed check and not the end of the suite. */
#ifdef PP_SANITIZED
#define SMALL_STACK (256 * 1024) /* redzones grow every frame */
#else
#define SMALL_STACK (32 * 1024)
#endif

static void *small_stack_run(void *arg) {
  int *rc = arg;
  pinpool_t *pool = NULL;
  int sv[2];
  void *p = NULL, *q = NULL;
  pinpool_share_handle_t h, got;
  int fd = -1, rfd = -1;
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    *rc = 40;
  else if (pinpool_create(CONF, &pool) != 0)
    *rc = 41;
  else if (pinpool_alloc(pool, 1 * MiB, &p) != 0) /* the chunk is made */
    *rc = 42;
  else if (pinpool_lend(pool, p, (int)getpid(), &h, &fd) != 0)
    *rc = 43;
  else if (pinpool_share_send(sv[0], &h, fd) != 0)
    *rc = 44;
  else if (recv_settled(sv[1], &got, &rfd) != 0 || rfd < 0)
    *rc = 45;
  else if (pinpool_share_attach(&got, rfd, &q) != 0)
    *rc = 46;
  else if (pinpool_share_detach(q) != 0 ||
           pinpool_lend_return(pool, &got, (int)getpid()) != 0)
    *rc = 47;
  else if (pinpool_free(pool, p) != 0)
    *rc = 48;
  else
    *rc = 0;
  if (*rc != 0)
    fprintf(stderr, "small stack: step %d: %s\n", *rc, pinpool_last_error());
  if (fd >= 0)
    (void)close(fd);
  if (rfd >= 0)
    (void)close(rfd);
  pinpool_destroy(pool);
  return NULL;
}

static void test_small_stack(void **state) {
  (void)state;
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0) {
    pthread_attr_t at;
    pthread_t t;
    int rc = 50;
    if (pthread_attr_init(&at) != 0 ||
        pthread_attr_setstacksize(&at, SMALL_STACK) != 0 ||
        pthread_create(&t, &at, small_stack_run, &rc) != 0)
      _exit(49);
    (void)pthread_join(t, NULL);
    _exit(rc);
  }
  int rc = pp_wait_child(pid, 30000);
  PP_ASSERT(rc == 0,
            "the share path on a %d KiB stack: child status %d (a signal: "
            "the stack overflowed)",
            SMALL_STACK / 1024, rc);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hostile_returns),
      cmocka_unit_test(test_pid_reuse),
      cmocka_unit_test(test_pidns_owner_pid1),
      cmocka_unit_test(test_return_pidfd),
      cmocka_unit_test(test_cgroup_room_files),
      cmocka_unit_test(test_cgroup_limit),
      cmocka_unit_test(test_ctl_readonly),
      cmocka_unit_test(test_reclaim_list),
      cmocka_unit_test(test_thread_pidfd),
      cmocka_unit_test(test_framing),
      cmocka_unit_test(test_datagram_short),
      cmocka_unit_test(test_ctl_fds_not_kept),
      cmocka_unit_test(test_shared_alloc_beyond_memory),
      cmocka_unit_test(test_fork_io_lock),
      cmocka_unit_test(test_small_stack),
  };
  return pp_run_selected("test_share_hostile", tests,
                         sizeof tests / sizeof tests[0], argc, argv);
}
