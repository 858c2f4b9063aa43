/*
 * A process that owns shared chunks and also works for another process's
 * pool (issue 36, second round; docs/sharing.md "A process in both
 * roles"). The helper process is a forked child reporting by exit status
 * (no cmocka in a child), under a deadline.
 *
 *  - both_roles: this process owns a shared chunk (its own lend live); a
 *    second owner, forked, lends it a block and sends the handle with
 *    pinpool_share_send (chunk and control descriptors). The control
 *    descriptor must be kept and found by pinpool_share_attach (no
 *    descriptor given): before, a process that had created shared chunks
 *    closed every control descriptor it received, and the attach failed
 *    with PINPOOL_EBADHANDLE.
 *  - own_returns_keep_nothing: returns of this process's own lends with
 *    control descriptors (genuine and forged) keep none.
 *  - forged_owner_bounded: a peer naming another owner can park at most
 *    MAX_CTL sealed descriptors here, whatever it sends.
 *  - many_partial_messages: an honest peer's half-received message stays
 *    kept while 200 other sockets (peers that stall mid-message, as many
 *    as a process may have open) keep pieces too; before, the 65th evicted
 *    the oldest, and that socket read the rest of its message as the
 *    start of the next (PINPOOL_EBADHANDLE: desynchronised).
 */
#include "testutil.h"

#include "share.h" /* pp_share_worker_pending_ctl */

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CONF "shared=1,mlock=0"
#define KiB ((size_t)1024)

/* The second owner: lends a block of its own pool to its parent, sends
 * the handle, waits for the parent's byte, checks what the parent wrote,
 * takes the block back. Exit status: 0, or the step that failed. */
static int second_owner(int sock) {
  pinpool_t *pool = NULL;
  void *b = NULL;
  if (pinpool_create(CONF, &pool) != 0 ||
      pinpool_alloc(pool, 64 * KiB, &b) != 0)
    return 2;
  memset(b, 0, 64 * KiB);
  pinpool_share_handle_t h;
  int fd = -1;
  if (pinpool_lend(pool, b, getppid(), &h, &fd) != 0)
    return 3;
  if (pinpool_share_send(sock, &h, fd) != 0)
    return 4;
  char c = 0;
  if (read(sock, &c, 1) != 1 || c != 'w')
    return 5;
  if (((unsigned char *)b)[0] != 0xA5 ||
      ((unsigned char *)b)[64 * KiB - 1] != 0xA5)
    return 6;
  if (pinpool_lend_return(pool, &h, getppid()) != 0)
    return 7;
  (void)close(fd);
  if (pinpool_free(pool, b) != 0)
    return 8;
  pinpool_destroy(pool);
  return 0;
}

/* This process as the second owner's worker: its block p filled with 0xA5,
 * detached, the owner told (sock), and its checks waited for. */
static void give_back_filled(void *p, int sock, pid_t c) {
  memset(p, 0xA5, 64 * KiB);
  PP_OK(pinpool_share_detach(p));
  PP_ASSERT(write(sock, "w", 1) == 1, "write");
  PP_CHECK_RC(pp_wait_child(c, 10000), 0);
  (void)close(sock);
}

static void test_both_roles(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *mine; /* this process owns a chunk */
  pinpool_share_handle_t mh;
  int mfd;
  pp_lend_to_self(CONF, 64 * KiB, &pool, &mine, &mh, &mfd);
  int sock;
  pid_t c = pp_fork_peer(second_owner, &sock);
  pinpool_share_handle_t h;
  int fd = -1;
  PP_OK(pinpool_share_recv(sock, &h, &fd));
  PP_ASSERT(pp_share_worker_pending_ctl() == 1,
            "the second owner's control descriptor was not kept (%zu kept)",
            pp_share_worker_pending_ctl());
  void *p = NULL;
  /* No control descriptor given: the one received with the handle. */
  PP_CHECK_RC(pinpool_share_attach(&h, fd, &p), 0);
  (void)close(fd);
  PP_ASSERT(pp_share_worker_pending_ctl() == 0, "kept after the attach");
  give_back_filled(p, sock, c);
  PP_OK(pinpool_lend_return(pool, &mh, getpid()));
  (void)close(mfd);
  PP_OK(pinpool_free(pool, mine));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* A handle with two descriptors (the chunk's, then the "control area"),
 * as pinpool_share_send frames it. */
static void send_pair(int sock, const pinpool_share_handle_t *h, int a, int b) {
  int fds[2] = {a, b};
  PP_ASSERT(pp_send_fds(sock, h, sizeof *h, fds, 2) == (ssize_t)sizeof *h,
            "sendmsg");
}

/* A memfd sealed as a control area of chunk_size is (any process can make
 * one): *ino its inode. */
static int sealed_ctl(uint64_t chunk_size, uint64_t *ino) {
  int m = memfd_create("peer-ctl", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  PP_ASSERT(m >= 0, "memfd");
  PP_ASSERT(ftruncate(m, (off_t)pp_ctl_bytes(chunk_size)) == 0, "ftruncate");
  PP_ASSERT(fcntl(m, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) ==
                0,
            "seals");
  struct stat st;
  PP_ASSERT(fstat(m, &st) == 0, "fstat");
  *ino = (uint64_t)st.st_ino;
  return m;
}

/* A peer's forged handle f, sent on tx with a fresh sealed control area
 * (its inode in f) after descriptor a (-1: the control area twice), with
 * chunk inode ino, and received on rx: whatever came is closed. */
static void send_forged(int tx, int rx, pinpool_share_handle_t f, int a,
                        uint64_t ino) {
  uint64_t ctl;
  int m = sealed_ctl(f.chunk_size, &ctl);
  f.ino = ino;
  f.ctl_ino = ctl;
  send_pair(tx, &f, a >= 0 ? a : m, m);
  (void)close(m);
  pinpool_share_handle_t g;
  int got = -1;
  PP_OK(pinpool_share_recv(rx, &g, &got));
  (void)close(got);
}

/* pp_lend_to_self undone: the lend returned, the block freed, the pool
 * destroyed. */
static void end_self_lend(pinpool_t *pool, void *b,
                          const pinpool_share_handle_t *h) {
  PP_OK(pinpool_lend_return(pool, h, getpid()));
  PP_OK(pinpool_free(pool, b));
  pinpool_destroy(pool);
}

static void test_own_returns_keep_nothing(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *b;
  pinpool_share_handle_t h;
  int cfd;
  pp_lend_to_self(CONF, 64 * KiB, &pool, &b, &h, &cfd);
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  int fds0 = pp_count_fds();
  for (int i = 0; i < 100; i++) /* this process's own pool, any chunk the
                                 * peer names, a control area that checks
                                 * out */
    send_forged(sv[1], sv[0], h, cfd, 1000000 + (uint64_t)i);
  PP_ASSERT(pp_share_worker_pending_ctl() == 0 && pp_count_fds() == fds0,
            "kept %zu control descriptors of its own pool's handles (%d "
            "open more)",
            pp_share_worker_pending_ctl(), pp_count_fds() - fds0);
  (void)close(sv[0]);
  (void)close(sv[1]);
  (void)close(cfd);
  end_self_lend(pool, b, &h);
}

static void test_forged_owner_bounded(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *b;
  pinpool_share_handle_t h;
  int cfd;
  pp_lend_to_self(CONF, 64 * KiB, &pool, &b, &h, &cfd);
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  int fds0 = pp_count_fds();
  for (int i = 0; i < 200; i++) {
    pinpool_share_handle_t f = h;
    f.owner_pid = getpid() + 1 + i; /* "another owner's" */
    f.nonce = h.nonce ^ (uint64_t)(i + 1);
    send_forged(sv[1], sv[0], f, cfd, 2000000 + (uint64_t)i);
  }
  size_t kept = pp_share_worker_pending_ctl();
  PP_ASSERT(kept >= 1 && kept <= 16 && pp_count_fds() - fds0 == (int)kept,
            "%zu kept, %d open more (1 to 16: one socket's)", kept,
            pp_count_fds() - fds0);
  (void)close(sv[0]);
  (void)close(sv[1]);
  (void)close(cfd);
  end_self_lend(pool, b, &h);
}

/* Both roles: a genuine owner's handle received (its control descriptor
 * kept until the attach), then a hostile peer on another socket sends 200
 * forged handles with sealed control areas that check out, one of them
 * naming the genuine chunk with its own control area. Before, the table's
 * oldest went at 64 and the same chunk's entry was replaced: the genuine
 * descriptor was closed and the attach failed (issue 36, third round). */
static void test_forged_peer_cannot_evict(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *mine;
  pinpool_share_handle_t mh;
  int mfd;
  pp_lend_to_self(CONF, 64 * KiB, &pool, &mine, &mh, &mfd);
  int sock, hv[2];
  pid_t c = pp_fork_peer(second_owner, &sock);
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, hv) == 0, "sp");
  pinpool_share_handle_t h;
  int fd = -1;
  size_t before = pp_share_worker_pending_ctl(); /* earlier tests' */
  PP_OK(pinpool_share_recv(sock, &h, &fd));
  PP_ASSERT(pp_share_worker_pending_ctl() == before + 1, "genuine not kept");
  for (int i = 0; i < 200; i++) {
    pinpool_share_handle_t f = h;
    f.nonce = h.nonce ^ (uint64_t)(i + 1);
    /* #100 names the genuine chunk, with another control area */
    send_forged(hv[1], hv[0], f, -1, i != 100 ? 3000000 + (uint64_t)i : h.ino);
  }
  void *p = NULL;
  PP_CHECK_RC(pinpool_share_attach(&h, fd, &p), 0);
  PP_ASSERT(pp_share_worker_pending_ctl() <= before + 16,
            "%zu kept (%zu + 16: the peer's bound)",
            pp_share_worker_pending_ctl(), before);
  (void)close(fd);
  give_back_filled(p, sock, c);
  (void)close(hv[0]);
  (void)close(hv[1]);
  PP_OK(pinpool_lend_return(pool, &mh, getpid()));
  (void)close(mfd);
  PP_OK(pinpool_free(pool, mine));
  pinpool_destroy(pool);
}

/* A piece of a message kept for a socket (with the descriptor that came
 * with it), then the socket closed: the next call on any other socket
 * drops the piece and closes the descriptor. Before, both stayed until the
 * descriptor number named a socket again or the table filled (issue 36,
 * third round). */
static void test_closed_socket_piece_dropped(void **state) {
  (void)state;
  int a[2], b[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
                       a) == 0,
            "sp");
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
                       b) == 0,
            "sp"); /* made first: never the closed one's numbers */
  int m = memfd_create("piece", MFD_CLOEXEC);
  PP_ASSERT(m >= 0, "memfd");
  pinpool_share_handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = PINPOOL_SHARE_MAGIC;
  h.version = PINPOOL_SHARE_VERSION;
  PP_ASSERT(pp_send_fds(a[1], &h, 40, &m, 1) == 40, "sendmsg");
  (void)close(m);
  int fds0 = pp_count_fds();
  size_t kept0 = pp_share_io_kept();
  pinpool_share_handle_t g;
  int got = -1;
  PP_CHECK_RC(pinpool_share_recv(a[0], &g, &got), PINPOOL_EAGAIN);
  PP_ASSERT(pp_share_io_kept() == kept0 + 1 && pp_count_fds() == fds0 + 1,
            "the piece and its descriptor kept");
  (void)close(a[0]);
  (void)close(a[1]);
  PP_CHECK_RC(pinpool_share_recv(b[0], &g, &got), PINPOOL_EAGAIN);
  PP_ASSERT(pp_share_io_kept() == kept0 && pp_count_fds() == fds0 - 2,
            "a closed socket's piece kept (%zu pieces, %d descriptors more)",
            pp_share_io_kept() - kept0, pp_count_fds() - (fds0 - 2));
  (void)close(b[0]);
  (void)close(b[1]);
}

static void test_many_partial_messages(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  void *b;
  pinpool_share_handle_t h;
  int cfd;
  pp_lend_to_self(CONF, 64 * KiB, &pool, &b, &h, &cfd);
  enum { HALF = 60, OTHERS = 200 };
  int hv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
                       hv) == 0,
            "sp");
  /* The honest peer: the first HALF bytes with the descriptor. */
  PP_ASSERT(pp_send_fds(hv[1], &h, HALF, &cfd, 1) == HALF, "sendmsg");
  pinpool_share_handle_t g;
  int got = -1;
  PP_CHECK_RC(pinpool_share_recv(hv[0], &g, &got), PINPOOL_EAGAIN);
  /* Stalled peers, each a byte into a message. */
  int sv[OTHERS][2];
  for (int i = 0; i < OTHERS; i++) {
    PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
                         sv[i]) == 0,
              "sp %d", i);
    PP_ASSERT(write(sv[i][1], &h, 1) == 1, "write");
    PP_CHECK_RC(pinpool_share_recv(sv[i][0], &g, &got), PINPOOL_EAGAIN);
  }
  /* The honest peer's rest: its message whole, as sent. */
  PP_ASSERT(write(hv[1], (const char *)&h + HALF, sizeof h - HALF) ==
                (ssize_t)(sizeof h - HALF),
            "write");
  PP_CHECK_RC(pinpool_share_recv(hv[0], &g, &got), 0);
  PP_ASSERT(memcmp(&g, &h, sizeof h) == 0 && got >= 0,
            "the honest peer's message came back changed");
  (void)close(got);
  for (int i = 0; i < OTHERS; i++) {
    (void)close(sv[i][0]);
    (void)close(sv[i][1]);
  }
  (void)close(hv[0]);
  (void)close(hv[1]);
  /* The closed sockets' pieces go when the table is next full (checked
   * by another round): what is kept stays bounded by the open sockets. */
  for (int i = 0; i < OTHERS; i++) {
    PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0,
                         sv[i]) == 0,
              "sp %d", i);
    PP_ASSERT(write(sv[i][1], &h, 1) == 1, "write");
    PP_CHECK_RC(pinpool_share_recv(sv[i][0], &g, &got), PINPOOL_EAGAIN);
  }
  PP_ASSERT(pp_share_io_kept() <= OTHERS + 64, "%zu pieces kept",
            pp_share_io_kept());
  for (int i = 0; i < OTHERS; i++) {
    (void)close(sv[i][0]);
    (void)close(sv[i][1]);
  }
  (void)close(cfd);
  end_self_lend(pool, b, &h);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_both_roles),
      cmocka_unit_test(test_own_returns_keep_nothing),
      cmocka_unit_test(test_forged_owner_bounded),
      cmocka_unit_test(test_many_partial_messages),
      cmocka_unit_test(test_forged_peer_cannot_evict),
      cmocka_unit_test(test_closed_socket_piece_dropped),
  };
  return pp_run_selected("test_share_roles", tests,
                         sizeof tests / sizeof tests[0], argc, argv);
}
