/* Descriptors a peer sends that the library does not keep are closed
 * without waiting on the peer (issue 36, third review, item 2;
 * docs/verification.md, "Issue 36, the third review").
 *
 * The descriptor is a TCP socket with SO_LINGER {1, 600 s} and unsent data
 * to a peer that never reads: its last close waits out the linger unless
 * the socket is closed abortively. pinpool_share_recv closes what it does
 * not keep in four places: descriptors beyond the two a message carries
 * (take_fds; a 5th and a 253rd too: the control buffer had room for 4, and
 * the kernel closed the rest in the receiving thread, issue 36's fourth
 * review, item 1), a message that is not a handle (io_free), a second
 * descriptor that is no control area (pp_share_ctl_received), and a
 * part-message of a socket closed since (pruned from the kept pieces,
 * before under the table's lock). Each case runs on an O_NONBLOCK socket
 * with a watchdog that, after WATCHDOG_S seconds, interrupts the close with
 * a signal (a linger wait ends at a signal); the test asserts the
 * watchdog never had to. No time is asserted: before the fix each case
 * waited for the watchdog. */
#include "testutil.h"

#include "share.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define WATCHDOG_S 20
#define LINGER_S 600
#define MAX_FDS 253 /* SCM_MAX_FD: the most one message carries */

static pthread_t main_thread;
static sem_t stop_dog;
static _Atomic int fired;

static void on_usr1(int sig) { (void)sig; }

static void *dog(void *arg) {
  (void)arg;
  struct timespec t;
  (void)clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += WATCHDOG_S;
  while (sem_timedwait(&stop_dog, &t) != 0) {
    if (errno == EINTR)
      continue;
    /* Still in the case: interrupt the close, once a second until it
     * returns. */
    atomic_store(&fired, 1);
    (void)pthread_kill(main_thread, SIGUSR1);
    (void)clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += 1;
  }
  return NULL;
}

/* A connected TCP socket whose close lingers: unsent data to *keep (the
 * accepted end, never read), SO_LINGER {1, LINGER_S}. -1 if TCP on
 * loopback cannot be had here. */
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
  PP_ASSERT(fcntl(c, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
  static char junk[65536];
  while (send(c, junk, sizeof junk, MSG_NOSIGNAL) > 0)
    ;
  struct linger l = {1, LINGER_S};
  PP_ASSERT(setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l) == 0,
            "SO_LINGER");
  return c;
}

/* Send len bytes of h with the descriptors fds (n of them) on the first. */
static void send_with(int sock, const void *h, size_t len, const int *fds,
                      int n) {
  union {
    char b[CMSG_SPACE(MAX_FDS * sizeof(int))];
    struct cmsghdr al;
  } u;
  PP_ASSERT(n <= MAX_FDS, "%d descriptors", n);
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)h, len};
  struct msghdr m = {.msg_iov = &iov,
                     .msg_iovlen = 1,
                     .msg_control = u.b,
                     .msg_controllen = CMSG_SPACE((size_t)n * sizeof(int))};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
  memcpy(CMSG_DATA(cm), fds, (size_t)n * sizeof(int));
  PP_ASSERT(sendmsg(sock, &m, MSG_NOSIGNAL) == (ssize_t)len, "sendmsg: %s",
            strerror(errno));
}

enum { EXTRA_FDS, FIFTH_FD, MOST_FDS, NOT_A_HANDLE, NOT_A_CTL, PRUNED, NCASES };
static const char *const names[NCASES] = {
    "descriptors beyond two",
    "a fifth descriptor (past the 4 the control buffer had room for)",
    "the 253rd descriptor (SCM_MAX_FD)",
    "a message that is not a handle",
    "a second descriptor that is no control area",
    "a part-message of a socket closed since"};

/* The received unix socket (nested) was closed: its peer x sees the
 * hang-up. The bound is a watchdog: before the fix the close never came
 * while the lingering socket it carries held the receiving thread. */
static void wait_closed(int x, int *keep, const char *what) {
  struct pollfd p = {.fd = x, .events = POLLRDHUP};
  int n;
  do
    n = poll(&p, 1, WATCHDOG_S * 1000);
  while (n < 0 && errno == EINTR);
  PP_ASSERT(n == 1 && (p.revents & (POLLHUP | POLLRDHUP)) != 0,
            "%s: the received unix socket was not closed", what);
  /* The TCP socket's peer closed with its data unread: a reset, which
   * ends the linger the closer thread waits out (pp_count_fds waits for
   * that thread). */
  if (*keep >= 0)
    (void)close(*keep);
  *keep = -1;
}

/* nested: the peer's descriptor is an AF_UNIX socket whose own receive
 * queue holds the lingering TCP socket (issue 36, the fifth review, item
 * 4): SO_LINGER on the unix socket reaches none of what it carries, and
 * its close released the TCP socket in the receiving thread. */
static void one_case(int which, bool nested) {
  int keep = -1, srv = -1;
  int l = lingering(&keep, &srv);
  if (l < 0) {
    print_message("no TCP on loopback here: case skipped\n");
    return;
  }
  int x = -1;
  if (nested) {
    int xy[2];
    PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, xy) == 0,
              "sp");
    send_with(xy[0], "n", 1, &l, 1); /* queued on xy[1] */
    (void)close(l);
    l = xy[1];
    x = xy[0];
  }
  int m = memfd_create("peer", MFD_CLOEXEC);
  PP_ASSERT(m >= 0 && ftruncate(m, 1 << 20) == 0, "memfd");
  pinpool_share_handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = PINPOOL_SHARE_MAGIC;
  h.version = PINPOOL_SHARE_VERSION;
  h.nonce = 12345; /* no pool of this process's */
  h.ino = 777;
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  PP_ASSERT(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
  int fds[MAX_FDS] = {m, l, l};
  if (which == EXTRA_FDS) {
    fds[1] = m;
    send_with(sv[1], &h, sizeof h, fds, 3);
  } else if (which == FIFTH_FD || which == MOST_FDS) {
    /* Before, the kernel dropped every one past the 4th and closed it in
     * the receiving thread: the lingering socket goes last. */
    int n = which == FIFTH_FD ? 5 : MAX_FDS;
    for (int i = 0; i < n - 1; i++)
      fds[i] = m;
    fds[n - 1] = l;
    send_with(sv[1], &h, sizeof h, fds, n);
  } else if (which == NOT_A_HANDLE) {
    h.magic = 0;
    send_with(sv[1], &h, sizeof h, fds, 2);
  } else if (which == NOT_A_CTL) {
    send_with(sv[1], &h, sizeof h, fds, 2);
  } else {
    send_with(sv[1], &h, 1, fds, 2); /* one byte: the rest never comes */
  }
  (void)close(l); /* the message's references are the last */
  (void)close(m);
  pinpool_share_handle_t g;
  int got = -1;
  int open_before = pp_count_fds();
  atomic_store(&fired, 0);
  PP_ASSERT(sem_init(&stop_dog, 0, 0) == 0, "sem_init");
  pthread_t t;
  PP_ASSERT(pthread_create(&t, NULL, dog, NULL) == 0, "pthread_create");
  int rc = pinpool_share_recv(sv[0], &g, &got);
  if (nested && which != PRUNED)
    wait_closed(x, &keep, names[which]);
  if (which == PRUNED) {
    PP_CHECK_RC(rc, PINPOOL_EAGAIN); /* the piece and its descriptors kept */
    PP_ASSERT(pp_share_io_kept() == 1, "kept %zu", pp_share_io_kept());
    (void)close(sv[0]);
    (void)close(sv[1]);
    PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
              "sp");
    PP_ASSERT(fcntl(sv[0], F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
    /* Another socket's call drops the closed socket's piece. */
    rc = pinpool_share_recv(sv[0], &g, &got);
    PP_CHECK_RC(rc, PINPOOL_EAGAIN);
    PP_ASSERT(pp_share_io_kept() == 0, "kept %zu", pp_share_io_kept());
    if (nested)
      wait_closed(x, &keep, names[which]);
  } else if (which == NOT_A_CTL) {
    PP_OK(rc); /* the first descriptor is the caller's */
    PP_ASSERT(got >= 0, "got %d", got);
    (void)close(got);
  } else {
    PP_CHECK_RC(rc, PINPOOL_EBADHANDLE);
    /* Every descriptor the message brought is closed: none kept, none
     * left to the kernel (pp_count_fds waits for the closer thread;
     * nested: keep was closed, wait_closed). */
    int expect = open_before - (nested ? 1 : 0);
    PP_ASSERT(pp_count_fds() == expect, "%s: %d descriptors open, %d expected",
              names[which], pp_count_fds(), expect);
  }
  (void)sem_post(&stop_dog);
  (void)pthread_join(t, NULL);
  (void)sem_destroy(&stop_dog);
  PP_ASSERT(!atomic_load(&fired),
            "%s%s: closing the peer's lingering socket waited for the "
            "watchdog (%d s)",
            names[which], nested ? " (in a unix socket's queue)" : "",
            WATCHDOG_S);
  (void)close(sv[0]);
  (void)close(sv[1]);
  if (keep >= 0)
    (void)close(keep); /* a reset: the closer's linger wait ends */
  (void)close(srv);
  if (x >= 0)
    (void)close(x);
  pp_share_closer_flush();
}

static void test_received_descriptors_close_at_once(void **state) {
  (void)state;
  main_thread = pthread_self();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_usr1; /* no SA_RESTART: the close returns */
  PP_ASSERT(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction");
  for (int i = 0; i < NCASES; i++)
    one_case(i, false);
  for (int i = 0; i < NCASES; i++)
    one_case(i, true);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_received_descriptors_close_at_once),
  };
  return pp_run_selected("test_share_linger", tests,
                         sizeof tests / sizeof tests[0], argc, argv);
}
