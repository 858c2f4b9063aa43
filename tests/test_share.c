/*
 * Shared pools and lending (docs/sharing.md; issue 22).
 *
 * Workers are child processes (fork) that report by exit status (no cmocka
 * in a child) and leave with _exit; each runs under a deadline. A child
 * forked from this process inherits the shared pools, which it may not use
 * (PINPOOL_EFORKED); it attaches lent blocks with the descriptors it
 * received or inherited.
 *
 *  - config: shared=1 needs backend=host or cuda-register.
 *  - in_process: lend and attach in one process (two views of one page),
 *    the chunk mapped once for two blocks and unmapped with the last,
 *    free refused while lent, stats and validation.
 *  - socket: a worker receives handles + descriptors over a socketpair,
 *    fills, detaches, sends the handles back; the owner sees the bytes.
 *  - inherit: a child forked after the chunk was made attaches with the
 *    descriptor number it inherited (handle.owner_fd).
 *  - stale: a handle whose lend was returned, reclaimed, or whose block
 *    was freed and reused, is refused (PINPOOL_ESTALE); the mutant
 *    SHARE_NO_GEN (tests/mutants) must fail here.
 *  - sigkill: a worker killed mid-fill with 4 blocks attached; the owner
 *    sees it exit (pidfd) and takes back every block; also on socket EOF.
 *  - forged: forged handles and wrong descriptors (another file, a memfd
 *    without seals, a look-alike sealed memfd, another chunk, read-only).
 *  - sealed: a worker cannot resize the chunk; the owner is unharmed.
 *  - limits: RLIMIT_NOFILE reached at chunk creation and at receive,
 *    RLIMIT_MEMLOCK with mlock=require and mlock=1; nothing leaks.
 *  - bad_input: every new entry point, with the pool unchanged.
 *  - snapshot: lent blocks listed with peer, generation and time.
 */
#include "testutil.h"

#include "internal.h" /* pp_share_worker_chunks */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CONF "shared=1,backend=host,mlock=0,populate=1"

static pinpool_t *shared_pool(const char *conf) {
  pinpool_t *pool = NULL;
  PP_OK(pinpool_create(conf, &pool));
  return pool;
}

/* A block of `size` bytes allocated and lent to this process. */
static void *lend_new(pinpool_t *pool, size_t size, pinpool_share_handle_t *h,
                      int *fd) {
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, size, &p));
  PP_OK(pinpool_lend(pool, p, getpid(), h, fd));
  return p;
}

/* ---- config ---------------------------------------------------------- */
static void test_config(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_CHECK_RC(pinpool_create("shared=1,backend=malloc", &pool),
              PINPOOL_ECONFIG);
  PP_ASSERT(strstr(pinpool_last_error(), "shared") != NULL, "%s",
            pinpool_last_error());
  PP_CHECK_RC(pinpool_create("shared=1,backend=cuda", &pool), PINPOOL_ECONFIG);
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_backend_t t = cb_table(&cb, 0);
  PP_CHECK_RC(pinpool_create_with_backend("shared=1", &t, &pool),
              PINPOOL_ECONFIG);
  cb_fini(&cb);
  PP_CHECK_RC(pinpool_create("shared=2", &pool), PINPOOL_ECONFIG);
  pool = shared_pool(CONF);
  char buf[1024];
  PP_OK(pinpool_get_config(pool, buf, sizeof buf, NULL));
  PP_ASSERT(strstr(buf, "shared=1") != NULL, "%s", buf);
  pinpool_destroy(pool);
  pool = shared_pool("mlock=0");
  PP_OK(pinpool_get_config(pool, buf, sizeof buf, NULL));
  PP_ASSERT(strstr(buf, "shared") == NULL, "%s", buf);
  pinpool_destroy(pool);
}

/* ---- in one process --------------------------------------------------- */
static void test_in_process(void **state) {
  (void)state;
  int fds0 = pp_count_fds();
  pinpool_t *pool = shared_pool(CONF);
  void *a = NULL, *b = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &a));
  PP_OK(pinpool_alloc(pool, 100 * KiB, &b));
  pinpool_share_handle_t ha, hb;
  int fa = -1, fb = -1;
  PP_OK(pinpool_lend(pool, a, getpid(), &ha, &fa));
  PP_OK(pinpool_lend(pool, b, getpid(), &hb, &fb));
  PP_ASSERT(fa >= 0 && fa == fb, "one chunk, one descriptor: %d %d", fa, fb);
  PP_ASSERT(ha.generation != hb.generation && ha.generation != 0, "gens");
  PP_ASSERT(ha.length == 1 * MiB && ha.chunk_id == hb.chunk_id, "fields");
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.lent_blocks == 2 && st.lent_bytes == 1 * MiB + hb.length,
            "lent %llu %llu", (unsigned long long)st.lent_blocks,
            (unsigned long long)st.lent_bytes);
  void *wa = NULL, *wb = NULL;
  PP_OK(pinpool_share_attach(&ha, fa, &wa));
  PP_OK(pinpool_share_attach(&hb, -1, &wb)); /* the chunk is mapped */
  PP_ASSERT(wa != a && wa != NULL, "a second view");
  PP_ASSERT(pp_share_worker_chunks() == 1, "mapped once");
  pp_fill(wa, 1 * MiB, 7);
  pp_fill(wb, hb.length, 9);
  PP_ASSERT(pp_filled(a, 1 * MiB, 7) && pp_filled(b, hb.length, 9),
            "the owner sees the worker's bytes");
  /* Lent: the owner may not free it. */
  PP_CHECK_RC(pinpool_free(pool, a), PINPOOL_EBUSY);
  PP_CHECK_RC(pinpool_lend(pool, a, getpid(), &ha, &fa), PINPOOL_EBUSY);
  PP_OK(pinpool_validate(pool));
  PP_OK(pinpool_share_detach(wa));
  PP_ASSERT(pp_share_worker_chunks() == 1, "b still holds it");
  PP_OK(pinpool_share_detach(wb));
  PP_ASSERT(pp_share_worker_chunks() == 0, "unmapped with the last");
  PP_CHECK_RC(pinpool_share_detach(wb), PINPOOL_EINVAL);
  PP_OK(pinpool_lend_return(pool, &ha, getpid()));
  PP_OK(pinpool_lend_return(pool, &hb, getpid()));
  st = pp_stats_of(pool);
  PP_ASSERT(st.lent_blocks == 0 && st.lent_bytes == 0, "returned");
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_free(pool, b));
  PP_CHECK_CONSISTENT(pool);
  PP_OK(pinpool_empty_cache(pool));
  pinpool_destroy(pool);
  PP_ASSERT(pp_count_fds() == fds0, "descriptors: %d before, %d after", fds0,
            pp_count_fds());
}

/* ---- over a socket ---------------------------------------------------- */
#define NBLK 6
static int socket_worker(int sock) {
  for (int i = 0; i < NBLK; i++) {
    pinpool_share_handle_t h;
    int fd = -1;
    if (pinpool_share_recv(sock, &h, &fd) != 0)
      return 10;
    void *p = NULL;
    if (pinpool_share_attach(&h, fd, &p) != 0)
      return 11;
    (void)close(fd);
    pp_fill(p, h.length, (unsigned)i);
    if (pinpool_share_detach(p) != 0)
      return 12;
    if (pinpool_share_send(sock, &h, -1) != 0)
      return 13;
  }
  if (pp_share_worker_chunks() != 0)
    return 14;
  return 0;
}

static void test_socket(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF ",hugepages=1");
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0) {
    (void)close(sv[0]);
    _exit(socket_worker(sv[1]));
  }
  (void)close(sv[1]);
  void *blk[NBLK];
  size_t sizes[NBLK] = {4 * KiB, 1 * MiB, 3 * MiB, 512, 300 * KiB, 8 * MiB};
  for (int i = 0; i < NBLK; i++) {
    PP_OK(pinpool_alloc(pool, sizes[i], &blk[i]));
    memset(blk[i], 0, sizes[i]);
    pinpool_share_handle_t h;
    int fd;
    PP_OK(pinpool_lend(pool, blk[i], pid, &h, &fd));
    PP_OK(pinpool_share_send(sv[0], &h, fd));
    pinpool_share_handle_t back;
    int bfd = 5;
    PP_OK(pinpool_share_recv(sv[0], &back, &bfd));
    PP_ASSERT(bfd == -1, "no descriptor comes back");
    PP_ASSERT(memcmp(&back, &h, sizeof h) == 0, "the same handle");
    PP_OK(pinpool_lend_return(pool, &back, pid));
    size_t bs = 0;
    PP_OK(pinpool_block_size(pool, blk[i], &bs));
    PP_ASSERT(pp_filled(blk[i], bs, (unsigned)i), "block %d filled", i);
  }
  PP_CHECK_RC(pp_wait_child(pid, 10000), 0);
  for (int i = 0; i < NBLK; i++)
    PP_OK(pinpool_free(pool, blk[i]));
  (void)close(sv[0]);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- inherited by fork ------------------------------------------------- */
static void test_inherit(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 2 * MiB, &p)); /* the chunk exists from here */
  int to_child[2], to_parent[2];
  PP_ASSERT(pipe(to_child) == 0 && pipe(to_parent) == 0, "pipe");
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0) {
    /* The inherited pool is the parent's memory: refused here. */
    void *q = NULL;
    if (pinpool_alloc(pool, 4096, &q) != PINPOOL_EFORKED)
      _exit(20);
    pinpool_share_handle_t h;
    if (read(to_child[0], &h, sizeof h) != (ssize_t)sizeof h)
      _exit(21);
    void *w = NULL;
    if (pinpool_share_attach(&h, h.owner_fd, &w) != 0)
      _exit(22);
    pp_fill(w, h.length, 42);
    if (pinpool_share_detach(w) != 0)
      _exit(23);
    if (write(to_parent[1], &h, sizeof h) != (ssize_t)sizeof h)
      _exit(24);
    _exit(0);
  }
  pinpool_share_handle_t h;
  int fd;
  PP_OK(pinpool_lend(pool, p, pid, &h, &fd));
  PP_ASSERT(h.owner_fd == fd, "owner_fd");
  PP_ASSERT(write(to_child[1], &h, sizeof h) == (ssize_t)sizeof h, "write");
  pinpool_share_handle_t back;
  PP_ASSERT(read(to_parent[0], &back, sizeof back) == (ssize_t)sizeof back,
            "the child answered (exit %d)", pp_wait_child(pid, 0));
  PP_OK(pinpool_lend_return(pool, &back, pid));
  PP_ASSERT(pp_filled(p, 2 * MiB, 42), "filled by the child");
  PP_CHECK_RC(pp_wait_child(pid, 10000), 0);
  PP_OK(pinpool_free(pool, p));
  for (int i = 0; i < 2; i++) {
    (void)close(to_child[i]);
    (void)close(to_parent[i]);
  }
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- generations --------------------------------------------------------- */
static void expect_stale(const pinpool_share_handle_t *h, int fd,
                         const char *what) {
  void *w = NULL;
  int rc = pinpool_share_attach(h, fd, &w);
  if (rc != PINPOOL_ESTALE)
    PP_FAIL("stale handle attached (%s): returned %d, not PINPOOL_ESTALE", what,
            rc);
  PP_ASSERT(strstr(pinpool_last_error(), "stale") != NULL, "%s",
            pinpool_last_error());
  PP_ASSERT(pp_share_worker_chunks() == 0, "nothing stays mapped");
}

static void test_stale(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
  pinpool_share_handle_t h1, h2, h3;
  int fd;
  PP_OK(pinpool_lend(pool, p, getpid(), &h1, &fd));
  PP_OK(pinpool_lend_return(pool, &h1, getpid()));
  expect_stale(&h1, fd, "returned");
  PP_CHECK_RC(pinpool_lend_return(pool, &h1, getpid()), PINPOOL_ESTALE);
  /* Lent again: a new generation, maybe the same slot. */
  PP_OK(pinpool_lend(pool, p, getpid(), &h2, &fd));
  PP_ASSERT(h2.generation != h1.generation, "a new generation");
  expect_stale(&h1, fd, "lent again");
  void *w = NULL;
  PP_OK(pinpool_share_attach(&h2, fd, &w));
  PP_OK(pinpool_share_detach(w));
  /* Reclaimed. */
  size_t n = 0;
  PP_OK(pinpool_lend_reclaim(pool, getpid(), 0, &n));
  PP_ASSERT(n == 0, "a live peer's lend needs RECLAIM_LIVE: %zu", n);
  PP_OK(pinpool_lend_reclaim(pool, getpid(), PINPOOL_RECLAIM_LIVE, &n));
  PP_ASSERT(n == 1, "one lend reclaimed: %zu", n);
  expect_stale(&h2, fd, "reclaimed");
  /* Freed and reused: the same address, lent anew. */
  PP_OK(pinpool_free(pool, p));
  void *q = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &q));
  PP_ASSERT(q == p, "reused (%p, %p)", q, p);
  PP_OK(pinpool_lend(pool, q, getpid(), &h3, &fd));
  PP_ASSERT(h3.offset == h2.offset && h3.slot == h2.slot, "same place");
  expect_stale(&h2, fd, "freed and reused");
  PP_OK(pinpool_lend_reclaim(pool, -1,
                             PINPOOL_RECLAIM_FREE | PINPOOL_RECLAIM_LIVE, &n));
  PP_ASSERT(n == 1, "reclaimed %zu", n);
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.blocks.current == 0 && st.lent_blocks == 0, "all back");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- a worker killed mid-fill ---------------------------------------- */
static int killed_worker(int sock) {
  void *p[4];
  for (int i = 0; i < 4; i++) {
    pinpool_share_handle_t h;
    int fd = -1;
    if (pinpool_share_recv(sock, &h, &fd) != 0 ||
        pinpool_share_attach(&h, fd, &p[i]) != 0)
      _exit(10);
    (void)close(fd);
  }
  char c = 'r';
  if (write(sock, &c, 1) != 1)
    _exit(11);
  for (unsigned k = 0;; k++) /* filling until killed */
    for (int i = 0; i < 4; i++)
      ((volatile char *)p[i])[(k * 4096u) % (1u << 20)] = (char)k;
}

static void lend_to(pinpool_t *pool, pid_t pid, int sock, void **blk, int n) {
  for (int i = 0; i < n; i++) {
    PP_OK(pinpool_alloc(pool, 1 * MiB, &blk[i]));
    pinpool_share_handle_t h;
    int fd;
    PP_OK(pinpool_lend(pool, blk[i], pid, &h, &fd));
    PP_OK(pinpool_share_send(sock, &h, fd));
  }
}

static void test_sigkill(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  for (int round = 0; round < 2; round++) {
    int sv[2];
    PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0,
              "socketpair");
    pid_t pid = fork();
    PP_ASSERT(pid >= 0, "fork");
    if (pid == 0) {
      (void)close(sv[0]);
      _exit(killed_worker(sv[1]));
    }
    (void)close(sv[1]);
    void *blk[4];
    lend_to(pool, pid, sv[0], blk, 4);
    char c = 0;
    PP_ASSERT(read(sv[0], &c, 1) == 1 && c == 'r', "the worker is filling");
    pinpool_stats_t st = pp_stats_of(pool);
    PP_ASSERT(st.lent_blocks == 4, "4 lent");
    size_t n = 9;
    PP_OK(pinpool_lend_reclaim_exited(pool, 0, &n));
    PP_ASSERT(n == 0, "alive: nothing reclaimed (%zu)", n);
    PP_ASSERT(kill(pid, SIGKILL) == 0, "kill");
    if (round == 0) {
      /* Noticed through the pidfd (a zombie counts as exited). */
      for (int t = 0; t < 5000 && n == 0; t++) {
        PP_OK(pinpool_lend_reclaim_exited(pool, PINPOOL_RECLAIM_FREE, &n));
        if (n == 0)
          pp_sleep_ms(1);
      }
      PP_ASSERT(n == 4, "every block back: %zu", n);
    } else {
      /* Noticed through the socket: EOF, then reclaim by pid once it has
       * exited (EOF comes while the process is still exiting: before it
       * has, its lends end only with RECLAIM_LIVE). */
      pinpool_share_handle_t h;
      int fd;
      PP_CHECK_RC(pinpool_share_recv(sv[0], &h, &fd), PINPOOL_ECLOSED);
      PP_CHECK_RC(pp_wait_child(pid, 10000), -2);
      PP_OK(pinpool_lend_reclaim(pool, pid, PINPOOL_RECLAIM_FREE, &n));
      PP_ASSERT(n == 4, "every block back: %zu", n);
    }
    if (round == 0)
      PP_CHECK_RC(pp_wait_child(pid, 10000), -2);
    st = pp_stats_of(pool);
    PP_ASSERT(st.lent_blocks == 0 && st.lent_bytes == 0 &&
                  st.blocks.current == 0,
              "nothing lent or allocated: %llu %llu",
              (unsigned long long)st.lent_blocks,
              (unsigned long long)st.blocks.current);
    (void)close(sv[0]);
    PP_CHECK_CONSISTENT(pool);
  }
  /* The blocks are usable again. */
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
  memset(p, 1, 1 * MiB);
  PP_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
}

/* ---- forged handles and descriptors ------------------------------------ */
static void expect_bad(const pinpool_share_handle_t *h, int fd, int code,
                       const char *what) {
  void *w = (void *)1;
  int rc = pinpool_share_attach(h, fd, &w);
  if (rc != code)
    PP_FAIL("%s: attach returned %d, expected %d (%s)", what, rc, code,
            pinpool_last_error());
  PP_ASSERT(w == (void *)1, "%s: *out untouched", what);
  PP_ASSERT(pp_share_worker_chunks() == 0, "%s: nothing mapped", what);
}

static int sealed_memfd(size_t size, unsigned seals) {
  int fd = (int)syscall(SYS_memfd_create, "forged", 0x3u /* CLOEXEC|SEAL */);
  PP_ASSERT(fd >= 0, "memfd_create");
  PP_ASSERT(ftruncate(fd, (off_t)size) == 0, "ftruncate");
  if (seals != 0)
    PP_ASSERT(fcntl(fd, F_ADD_SEALS, (int)seals) == 0, "seals");
  return fd;
}

static void as_file(pinpool_share_handle_t *h, int fd) {
  struct stat st;
  PP_ASSERT(fstat(fd, &st) == 0, "fstat");
  h->dev = (uint64_t)st.st_dev;
  h->ino = (uint64_t)st.st_ino;
}

static void test_forged(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  void *p = NULL, *big = NULL;
  PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
  PP_OK(pinpool_alloc(pool, 40 * MiB, &big)); /* a chunk of its own */
  pp_fill(p, 1 * MiB, 3);
  pinpool_share_handle_t h, hbig, f;
  int fd, fdbig;
  PP_OK(pinpool_lend(pool, p, getpid(), &h, &fd));
  PP_OK(pinpool_lend(pool, big, getpid(), &hbig, &fdbig));
  PP_ASSERT(fd != fdbig, "two chunks");
  pinpool_stats_t before = pp_stats_of(pool);
  struct stat cst;
  PP_ASSERT(fstat(fd, &cst) == 0, "fstat");
  size_t fsize = (size_t)cst.st_size;

  f = h, f.magic ^= 1;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "magic");
  f = h, f.version = 99;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "version");
  f = h, f.generation = 0;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "generation 0");
  f = h, f.offset = h.chunk_size;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "offset past the chunk");
  f = h, f.length = h.chunk_size;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "length past the chunk");
  f = h, f.slot = 1u << 30;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "slot out of range");
  f = h, f.chunk_size += 4096;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "chunk size");
  /* The right descriptor, a lend's generation, another block's place. */
  f = h, f.offset += 4096, f.length -= 4096;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "offset moved");
  f = h, f.nonce ^= 1;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "another pool's nonce");
  f = h, f.chunk_id += 1;
  expect_bad(&f, fd, PINPOOL_EBADHANDLE, "another chunk id");
  /* Wrong descriptors. */
  expect_bad(&h, fdbig, PINPOOL_EBADHANDLE, "another chunk's descriptor");
  expect_bad(&h, 987, PINPOOL_EBADHANDLE, "a closed descriptor");
  expect_bad(&h, -1, PINPOOL_EINVAL, "no descriptor, nothing mapped");
  FILE *tf = tmpfile();
  PP_ASSERT(tf != NULL, "tmpfile");
  int tfd = fileno(tf);
  PP_ASSERT(ftruncate(tfd, (off_t)fsize) == 0, "ftruncate");
  expect_bad(&h, tfd, PINPOOL_EBADHANDLE, "a regular file");
  f = h;
  as_file(&f, tfd);
  expect_bad(&f, tfd, PINPOOL_EBADHANDLE, "a regular file, handle to match");
  (void)fclose(tf);
  int m = sealed_memfd(fsize, 0);
  f = h;
  as_file(&f, m);
  expect_bad(&f, m, PINPOOL_EBADHANDLE, "a memfd without seals");
  (void)close(m);
  m = sealed_memfd(fsize,
                   F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_WRITE);
  f = h;
  as_file(&f, m);
  expect_bad(&f, m, PINPOOL_EBADHANDLE, "a write-sealed memfd");
  (void)close(m);
  /* A look-alike: sealed as ours, right size, but another file; and one
   * that claims our inode. */
  m = sealed_memfd(fsize, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  expect_bad(&h, m, PINPOOL_EBADHANDLE, "a look-alike memfd");
  f = h;
  as_file(&f, m);
  void *w = NULL;
  /* The real control area says "lent": the handle's own file, so it maps,
   * but it is the forger's memory, not the pool's (harmless). */
  PP_OK(pinpool_share_attach(&f, m, &w));
  PP_OK(pinpool_share_detach(w));
  (void)close(m);
  /* Control areas that are not the chunk's: another file; a copy sealed as
   * ours claiming its inode (its size is right, its inode is not); an
   * unsealed memfd claiming to be it. */
  {
    struct stat cs;
    PP_ASSERT(fstat(h.owner_ctl_fd, &cs) == 0, "ctl");
    size_t clen = (size_t)cs.st_size;
    const void *src =
        mmap(NULL, clen, PROT_READ, MAP_SHARED, h.owner_ctl_fd, 0);
    PP_ASSERT(src != MAP_FAILED, "map ctl");
    int cm = sealed_memfd(clen, 0);
    PP_ASSERT(pwrite(cm, src, clen, 0) == (ssize_t)clen, "copy");
    (void)munmap((void *)src, clen);
    w = (void *)1;
    PP_CHECK_RC(pinpool_share_attach_ctl(&h, fd, cm, &w), PINPOOL_EBADHANDLE);
    f = h;
    struct stat ms;
    PP_ASSERT(fstat(cm, &ms) == 0, "fstat");
    f.ctl_ino = (uint64_t)ms.st_ino;
    f.owner_ctl_fd = cm;
    expect_bad(&f, fd, PINPOOL_EBADHANDLE, "an unsealed control area");
    PP_ASSERT(fcntl(cm, F_ADD_SEALS,
                    F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE |
                        F_SEAL_SEAL) == 0,
              "seal");
    PP_CHECK_RC(pinpool_share_attach_ctl(&h, fd, cm, &w), PINPOOL_EBADHANDLE);
    PP_ASSERT(w == (void *)1 && pp_share_worker_chunks() == 0, "nothing");
    (void)close(cm);
    f = h;
    f.owner_ctl_fd = -1;
    expect_bad(&f, fd, PINPOOL_EBADHANDLE, "no control area descriptor");
  }
  /* Read-only descriptor of the real chunk. */
  char path[64];
  (void)snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  PP_ASSERT(ro >= 0, "open ro");
  expect_bad(&h, ro, PINPOOL_EBADHANDLE, "read-only");
  (void)close(ro);

  /* Nothing changed: the lends, the bytes, the pool. */
  pinpool_stats_t after = pp_stats_of(pool);
  PP_ASSERT(after.lent_blocks == before.lent_blocks &&
                after.reserved_bytes.current == before.reserved_bytes.current,
            "unchanged");
  PP_ASSERT(pp_filled(p, 1 * MiB, 3), "the block is intact");
  PP_OK(pinpool_share_attach(&h, fd, &w)); /* the real one works */
  PP_ASSERT(pp_filled(w, 1 * MiB, 3), "seen by the worker view");
  PP_OK(pinpool_share_detach(w));
  /* Returns that do not match a lend. */
  f = h, f.nonce ^= 1;
  PP_CHECK_RC(pinpool_lend_return(pool, &f, getpid()), PINPOOL_EBADHANDLE);
  f = h, f.offset += 4096;
  PP_CHECK_RC(pinpool_lend_return(pool, &f, getpid()), PINPOOL_EBADHANDLE);
  f = h, f.generation += 1000;
  PP_CHECK_RC(pinpool_lend_return(pool, &f, getpid()), PINPOOL_ESTALE);
  PP_ASSERT(pp_stats_of(pool).lent_blocks == 2, "still lent");
  PP_OK(pinpool_lend_return(pool, &h, getpid()));
  PP_OK(pinpool_lend_return(pool, &hbig, getpid()));
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_free(pool, big));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- seals --------------------------------------------------------------- */
static void test_sealed(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  pinpool_share_handle_t h;
  int fd;
  void *p = lend_new(pool, 1 * MiB, &h, &fd);
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0) {
    /* A hostile worker with the descriptor. */
    struct stat st;
    if (fstat(fd, &st) != 0)
      _exit(30);
    if (ftruncate(fd, 0) == 0 || errno != EPERM)
      _exit(31);
    if (ftruncate(fd, st.st_size / 2) == 0 || errno != EPERM)
      _exit(32);
    if (ftruncate(fd, st.st_size * 2) == 0 || errno != EPERM)
      _exit(33);
    if (fallocate(fd, 0, 0, st.st_size * 2) == 0)
      _exit(34);
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) == 0)
      _exit(35);
    char c = 1;
    if (pwrite(fd, &c, 1, st.st_size) == 1)
      _exit(36); /* a write past the end would grow it */
    void *w = NULL;
    if (pinpool_share_attach(&h, fd, &w) != 0)
      _exit(37);
    pp_fill(w, h.length, 5);
    _exit(0); /* without detaching: the kernel unmaps */
  }
  PP_CHECK_RC(pp_wait_child(pid, 10000), 0);
  struct stat st;
  PP_ASSERT(fstat(fd, &st) == 0 && (uint64_t)st.st_size == h.chunk_size,
            "size unchanged");
  /* The owner touches its whole chunk's block: no SIGBUS. */
  PP_ASSERT(pp_filled(p, 1 * MiB, 5), "the worker's fill");
  memset(p, 0, 1 * MiB);
  PP_OK(pinpool_lend_return(pool, &h, getpid()));
  PP_OK(pinpool_free(pool, p));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- limits -------------------------------------------------------------- */
static int limits_child(void) {
  int fds0 = pp_count_fds();
  pinpool_t *pool = NULL;
  if (pinpool_create(CONF, &pool) != 0)
    return 40;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return 41;
  /* RLIMIT_NOFILE: every descriptor number below the limit in use. */
  struct rlimit old, rl;
  if (getrlimit(RLIMIT_NOFILE, &old) != 0)
    return 42;
  rl.rlim_cur = (rlim_t)fds0 + 16;
  rl.rlim_max = old.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
    return 43;
  int hold[64], nh = 0;
  while (nh < 64 && (hold[nh] = dup(0)) >= 0)
    nh++;
  if (nh == 64 || errno != EMFILE)
    return 44;
  void *p = NULL;
  int rc = pinpool_alloc(pool, 1 * MiB, &p);
  if (rc != PINPOOL_ELIMIT)
    return 45;
  if (strstr(pinpool_last_error(), "RLIMIT_NOFILE") == NULL)
    return 46;
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0 || st.reserved_bytes.current != 0 ||
      st.arena_chunks != 0)
    return 47;
  if (pinpool_validate(pool) != 0)
    return 48;
  /* A received descriptor with no room for it: dropped, and said so. */
  pinpool_share_handle_t h;
  memset(&h, 0, sizeof h);
  h.magic = PINPOOL_SHARE_MAGIC;
  h.version = PINPOOL_SHARE_VERSION;
  if (pinpool_share_send(sv[0], &h, 0) != 0)
    return 49;
  int fd = 0;
  rc = pinpool_share_recv(sv[1], &h, &fd);
  if (rc != PINPOOL_ELIMIT)
    return 50;
  while (nh > 0)
    (void)close(hold[--nh]);
  (void)close(sv[0]);
  (void)close(sv[1]);
  if (setrlimit(RLIMIT_NOFILE, &old) != 0)
    return 51;
  /* With room again, the pool works. */
  if (pinpool_alloc(pool, 1 * MiB, &p) != 0 || pinpool_free(pool, p) != 0)
    return 52;
  pinpool_destroy(pool);
  if (pp_count_fds() != fds0)
    return 53;

  /* RLIMIT_MEMLOCK (the owner's: it locks the shared chunks), without
   * CAP_IPC_LOCK: mlock=require fails cleanly, mlock=1 falls back. */
  rl.rlim_cur = rl.rlim_max = 64 * 1024;
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    return 54;
  if (geteuid() == 0 &&
      (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
    return 55;
  /* The sanitizers' mlock does nothing and succeeds (as test_limits
   * finds): nothing to test there. */
  void *probe = mmap(NULL, 4 * MiB, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED)
    return 65;
  bool locks = mlock(probe, 4 * MiB) == 0;
  (void)munmap(probe, 4 * MiB);
  if (locks) {
    fprintf(stderr, "child: mlock ignores RLIMIT_MEMLOCK here (a "
                    "sanitizer): memlock part skipped\n");
    return 0;
  }
  if (pinpool_create("shared=1,backend=host,mlock=require", &pool) != 0)
    return 56;
  rc = pinpool_alloc(pool, 4 * MiB, &p);
  if (rc != PINPOOL_ENOMEM ||
      strstr(pinpool_last_error(), "RLIMIT_MEMLOCK") == NULL) {
    fprintf(stderr, "child: mlock=require: %d %s\n", rc, pinpool_last_error());
    return 57;
  }
  if (pinpool_get_stats(pool, &st) != 0 || st.reserved_bytes.current != 0)
    return 58;
  pinpool_destroy(pool);
  if (pp_count_fds() != fds0)
    return 59;
  if (pinpool_create("shared=1,backend=host,mlock=1", &pool) != 0)
    return 60;
  if (pinpool_alloc(pool, 4 * MiB, &p) != 0)
    return 61;
  if (pinpool_get_stats(pool, &st) != 0 || st.mlock_failures != 1 ||
      st.locked_bytes != 0)
    return 62;
  if (pinpool_free(pool, p) != 0 || pinpool_validate(pool) != 0)
    return 63;
  pinpool_destroy(pool);
  if (pp_count_fds() != fds0)
    return 64;
  return 0;
}

static void test_limits(void **state) {
  (void)state;
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0)
    _exit(limits_child());
  PP_CHECK_RC(pp_wait_child(pid, 20000), 0);
}

/* ---- bad input --------------------------------------------------------- */
static void test_bad_input(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF), *plain = shared_pool("mlock=0");
  void *p = NULL, *q = NULL;
  PP_OK(pinpool_alloc(pool, 64 * KiB, &p));
  PP_OK(pinpool_alloc(plain, 64 * KiB, &q));
  pinpool_share_handle_t h;
  int fd = -7;
  pinpool_stats_t before = pp_stats_of(pool);
  PP_CHECK_RC(pinpool_lend(NULL, p, getpid(), &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(pool, NULL, getpid(), &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(pool, p, getpid(), NULL, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(pool, p, getpid(), &h, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(pool, p, 0, &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(pool, p, -5, &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(pool, p, 0x3fffffff, &h, &fd), PINPOOL_EEXITED);
  PP_CHECK_RC(pinpool_lend_pidfd(pool, p, -1, &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_pidfd(pool, p, 0, &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_pidfd(pool, p, 987, &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend(plain, q, getpid(), &h, &fd), PINPOOL_EINVAL);
  PP_ASSERT(strstr(pinpool_last_error(), "shared=1") != NULL, "%s",
            pinpool_last_error());
  PP_CHECK_RC(pinpool_lend(pool, q, getpid(), &h, &fd), PINPOOL_ENOTOWNED);
  PP_CHECK_RC(pinpool_lend(pool, (char *)p + 64, getpid(), &h, &fd),
              PINPOOL_EINTERIOR);
  void *r = NULL;
  PP_OK(pinpool_alloc(pool, 64 * KiB, &r));
  PP_OK(pinpool_free(pool, r));
  PP_CHECK_RC(pinpool_lend(pool, r, getpid(), &h, &fd), PINPOOL_EDOUBLEFREE);
  PP_ASSERT(fd == -7, "*fd untouched");
  pinpool_stats_t after = pp_stats_of(pool);
  PP_ASSERT(after.lent_blocks == 0 && before.lent_blocks == 0, "nothing lent");

  PP_OK(pinpool_lend(pool, p, getpid(), &h, &fd));
  PP_CHECK_RC(pinpool_lend_return(NULL, &h, getpid()), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_return(pool, NULL, getpid()), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_return(plain, &h, getpid()), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_return(pool, &h, 0), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_return(pool, &h, -3), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim(NULL, -1, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim(pool, 0, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim(pool, -2, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim(pool, -1, 4, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim(pool, -3, 0, NULL), PINPOOL_EINVAL);
  pinpool_lend_info_t info[2];
  size_t n = 5;
  PP_CHECK_RC(pinpool_lend_reclaim_list(pool, -1, 0, NULL, 2, &n),
              PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_list(pool, -1, 0, info, 0, &n),
              PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_list(pool, -1, 0, info, 2, NULL),
              PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_list(pool, 0, 0, info, 2, &n),
              PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_list(pool, -1, 8, info, 2, &n),
              PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_list(plain, -1, 0, info, 2, &n),
              PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim(plain, -1, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_exited(NULL, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_exited(pool, 8, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_lend_reclaim_exited(pool, PINPOOL_RECLAIM_LIVE, NULL),
              PINPOOL_EINVAL);
  PP_OK(pinpool_lend_reclaim(pool, 1, 0, &n)); /* init has nothing */
  PP_ASSERT(n == 0, "%zu", n);
  PP_ASSERT(pp_stats_of(pool).lent_blocks == 1, "still lent");

  void *w = NULL;
  PP_CHECK_RC(pinpool_share_attach(NULL, fd, &w), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_attach(&h, fd, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_detach(NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_detach(p), PINPOOL_EINVAL); /* not attached */

  PP_CHECK_RC(pinpool_share_send(-1, &h, fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_send(0, NULL, fd), PINPOOL_EINVAL);
  int sv[2];
  PP_ASSERT(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "sp");
  PP_CHECK_RC(pinpool_share_send(sv[0], &h, 999), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_recv(-1, &h, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_recv(sv[1], NULL, &fd), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_share_recv(sv[1], &h, NULL), PINPOOL_EINVAL);
  /* Garbage on the socket: not a handle, and its descriptor is closed. */
  int fds0 = pp_count_fds();
  pinpool_share_handle_t junk;
  memset(&junk, 0x5a, sizeof junk);
  PP_OK(pinpool_share_send(sv[0], &junk, fd));
  pinpool_share_handle_t got;
  int gfd = -9;
  PP_CHECK_RC(pinpool_share_recv(sv[1], &got, &gfd), PINPOOL_EBADHANDLE);
  PP_ASSERT(gfd == -9 && pp_count_fds() == fds0, "the descriptor was closed");
  /* A socket that is not connected, one whose peer went. */
  int lone = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  PP_CHECK_RC(pinpool_share_send(lone, &h, -1), PINPOOL_EBACKEND);
  (void)close(lone);
  (void)close(sv[0]);
  PP_CHECK_RC(pinpool_share_recv(sv[1], &got, &gfd), PINPOOL_ECLOSED);
  PP_CHECK_RC(pinpool_share_send(sv[1], &h, -1), PINPOOL_ECLOSED);
  (void)close(sv[1]);
  PP_ASSERT(strcmp(pinpool_strerror(PINPOOL_ESTALE), "unknown pinpool error"),
            "named");
  PP_ASSERT(strcmp(pinpool_strerror(PINPOOL_ECLOSED), "unknown pinpool error"),
            "named");

  PP_OK(pinpool_lend_return(pool, &h, getpid()));
  PP_OK(pinpool_free(pool, p));
  PP_OK(pinpool_free(plain, q));
  PP_CHECK_CONSISTENT(pool);
  PP_CHECK_CONSISTENT(plain);
  pinpool_destroy(pool);
  pinpool_destroy(plain);
}

/* ---- snapshots --------------------------------------------------------- */
static void test_snapshot(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  pinpool_share_handle_t h;
  int fd;
  void *p = lend_new(pool, 1 * MiB, &h, &fd);
  char *text = NULL;
  size_t len = 0;
  PP_OK(pinpool_snapshot_write_mem(pool, &text, &len, 0));
  char want[128];
  (void)snprintf(want, sizeof want, "\"peer_pid\":%d", (int)getpid());
  PP_ASSERT(strstr(text, "\"lends\":[{") != NULL, "lends listed");
  PP_ASSERT(strstr(text, want) != NULL, "peer listed");
  (void)snprintf(want, sizeof want, "\"generation\":%llu",
                 (unsigned long long)h.generation);
  PP_ASSERT(strstr(text, want) != NULL, "generation listed");
  PP_ASSERT(strstr(text, "\"lent_blocks\":1") != NULL, "stat");
  pinpool_snapshot_free(text);
  PP_OK(pinpool_lend_return(pool, &h, getpid()));
  PP_OK(pinpool_snapshot_write_mem(pool, &text, &len, 0));
  PP_ASSERT(strstr(text, "\"lends\":[]") != NULL, "none lent");
  pinpool_snapshot_free(text);
  PP_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
}

/* ---- backend=cuda-register (the fake driver, PINPOOL_LIBCUDA) ---------- */
static void test_cuda_register(void **state) {
  (void)state;
  if (getenv("PINPOOL_LIBCUDA") == NULL) {
    print_message("no PINPOOL_LIBCUDA: skipped\n");
    return;
  }
  int fds0 = pp_count_fds();
  /* A refused registration gives the chunk back (its memfd closed, as
   * the descriptor count at the end shows); a pageable fallback chunk is a
   * memfd too. */
  const char *confs[] = {
      "shared=1,mlock=0,backend=cuda-register,device=0,fault=register:1",
      "shared=1,mlock=0,backend=cuda-register,device=0,fault=register:1,"
      "pin_failure=pageable"};
  for (int k = 0; k < 2; k++) {
    pinpool_t *pool = shared_pool(confs[k]);
    void *p = NULL;
    int rc = pinpool_alloc(pool, 1 * MiB, &p);
    /* k 0: the refused chunk was given back and the allocation retried
     * (the retry after ENOMEM); k 1: the pageable fallback. */
    PP_OK(rc);
    pinpool_stats_t st = pp_stats_of(pool);
    PP_ASSERT(
        k == 0 ? st.retries == 1 && st.locked_bytes > 0 : st.fallback_bytes > 0,
        "k %d: retries %llu, fallback %llu", k, (unsigned long long)st.retries,
        (unsigned long long)st.fallback_bytes);
    pinpool_share_handle_t h;
    int fd;
    PP_OK(pinpool_lend(pool, p, getpid(), &h, &fd));
    void *w = NULL;
    PP_OK(pinpool_share_attach(&h, fd, &w));
    pp_fill(w, 1 * MiB, 11);
    PP_OK(pinpool_share_detach(w));
    PP_OK(pinpool_lend_return(pool, &h, getpid()));
    PP_ASSERT(pp_filled(p, 1 * MiB, 11), "seen by the owner");
    PP_OK(pinpool_free(pool, p));
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
  }
  PP_ASSERT(pp_count_fds() == fds0, "descriptors: %d before, %d after", fds0,
            pp_count_fds());
}

/* ---- threads: lends, attaches, returns, frees and snapshots at once ---- */
typedef struct tctx {
  pinpool_t *pool;
  int id, err;
} tctx_t;

static void *lend_thread(void *arg) {
  tctx_t *t = arg;
  for (int i = 0; i < 150 && t->err == 0; i++) {
    size_t n = (size_t)(4 + (i % 5) * 60) * KiB;
    void *p = NULL, *w = NULL;
    pinpool_share_handle_t h;
    int fd;
    if (pinpool_alloc(t->pool, n, &p) != 0 ||
        pinpool_lend(t->pool, p, getpid(), &h, &fd) != 0 ||
        pinpool_share_attach(&h, fd, &w) != 0) {
      t->err = 1;
      break;
    }
    memset(w, t->id, n);
    if (pinpool_share_detach(w) != 0 ||
        pinpool_lend_return(t->pool, &h, getpid()) != 0)
      t->err = 2;
    const unsigned char *c = p;
    if (c[0] != (unsigned char)t->id || c[n - 1] != (unsigned char)t->id)
      t->err = 3;
    if (pinpool_free(t->pool, p) != 0)
      t->err = 4;
  }
  return NULL;
}

static void *watch_thread(void *arg) {
  tctx_t *t = arg;
  for (int i = 0; i < 20 && t->err == 0; i++) {
    char *text = NULL;
    size_t len = 0;
    pinpool_stats_t st;
    size_t n = 0;
    if (pinpool_snapshot_write_mem(t->pool, &text, &len, 0) != 0 ||
        pinpool_get_stats(t->pool, &st) != 0 ||
        pinpool_lend_reclaim_exited(t->pool, 0, &n) != 0 || n != 0)
      t->err = 5;
    pinpool_snapshot_free(text);
  }
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  pinpool_t *pool = shared_pool(CONF);
  pthread_t th[4];
  tctx_t ctx[4];
  for (int i = 0; i < 4; i++) {
    ctx[i] = (tctx_t){pool, i + 1, 0};
    PP_ASSERT(pthread_create(&th[i], NULL, i < 3 ? lend_thread : watch_thread,
                             &ctx[i]) == 0,
              "pthread_create");
  }
  for (int i = 0; i < 4; i++) {
    (void)pthread_join(th[i], NULL);
    PP_ASSERT(ctx[i].err == 0, "thread %d: error %d (%s)", i, ctx[i].err,
              pinpool_last_error());
  }
  pinpool_stats_t st = pp_stats_of(pool);
  PP_ASSERT(st.lent_blocks == 0 && st.blocks.current == 0, "all back");
  PP_ASSERT(pp_share_worker_chunks() == 0, "nothing mapped");
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config),   cmocka_unit_test(test_in_process),
      cmocka_unit_test(test_socket),   cmocka_unit_test(test_inherit),
      cmocka_unit_test(test_stale),    cmocka_unit_test(test_sigkill),
      cmocka_unit_test(test_forged),   cmocka_unit_test(test_sealed),
      cmocka_unit_test(test_limits),   cmocka_unit_test(test_bad_input),
      cmocka_unit_test(test_snapshot), cmocka_unit_test(test_cuda_register),
      cmocka_unit_test(test_threads),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
