/*
 * W9 (issue 22): loader workers fill batches, the main process consumes
 * them. Two paths, the same workers, the same fill, the same consumer:
 *
 *   lend   pinpool shared=1: the main process allocates pinned batches from
 *          a shared pool and lends them (pinpool_lend + SCM_RIGHTS); the
 *          worker attaches, fills in place, sends the handle back; the main
 *          process checksums the pinned block (where a device copy would
 *          start) and lends it again. No host copy.
 *   copy   today's path (PyTorch DataLoader with pin_memory=True): each
 *          worker fills a slot of its own shared-memory buffer (MAP_SHARED
 *          memfd, as torch's file_descriptor strategy), sends the slot's
 *          number; the main process copies the slot into a page-locked
 *          buffer (mlock, as the pin-memory thread's pinned tensor), hands
 *          the slot back, and checksums the pinned copy. One host copy per
 *          batch.
 *
 * Each worker has `depth` (2) batches in flight. fill: `mem` (a 64-bit
 * pattern written at memory speed) or `cpu` (each word the result of 24
 * rounds of a xorshift-multiply mix: per-batch CPU work). The worker of the
 * lend path keeps its last block attached until the next one is (a worker
 * of a long-running loader keeps its chunks mapped; detaching the only
 * block would unmap the chunk at every batch).
 *
 * Reported (one line of JSON per run): batches/s (wall), host bytes the
 * main process copied per batch, memory held (the main process's pinned
 * and shared bytes: pool reserved bytes, or slots + pinned buffer), and
 * the main process's CPU time per batch (getrusage, user + system).
 * With --raw, the same as one tab-separated W9 record instead (bench/run.sh
 * appends it to the raw file pp_report reads: W9, path, workers, batch MiB,
 * fill, then key=value fields).
 *
 *   pp_bench_w9 [--raw] PATH WORKERS BATCH_MIB FILL BATCHES
 *   (PATH lend|copy, FILL mem|cpu)
 *
 * mlock is best effort in both paths (a pool with mlock=1 populates what it
 * cannot lock; the copy path's buffer stays unlocked): without the memlock
 * limit the run still measures, and locked_mib (with mlock_failures) shows
 * what was not locked.
 */
#define _GNU_SOURCE
#include "pinpool.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DEPTH 2
#define MAXW 16

static void die(const char *what) {
  fprintf(stderr, "w9: %s: %s (%s)\n", what, strerror(errno),
          pinpool_last_error());
  exit(1);
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_ns(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) *
             1000000000ull +
         ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) *
             1000ull;
}

static int g_cpu_fill;

/* The worker's fill of batch `seq`. */
static void fill(void *p, size_t n, uint64_t seq) {
  uint64_t *w = p;
  size_t k = n / 8;
  if (!g_cpu_fill) {
    for (size_t i = 0; i < k; i++)
      w[i] = seq ^ i;
    return;
  }
  for (size_t i = 0; i < k; i++) {
    uint64_t x = seq * 0x9e3779b97f4a7c15ull + i;
    for (int r = 0; r < 24; r++) {
      x ^= x >> 29;
      x *= 0xbf58476d1ce4e5b9ull;
    }
    w[i] = x;
  }
}

/* The consumer: reads every word (stands in for the device copy). */
static uint64_t checksum(const void *p, size_t n) {
  const uint64_t *w = p;
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (size_t i = 0; i + 4 <= n / 8; i += 4) {
    s0 += w[i];
    s1 ^= w[i + 1];
    s2 += w[i + 2];
    s3 ^= w[i + 3];
  }
  return s0 ^ s1 ^ s2 ^ s3;
}

static volatile uint64_t g_sink;

/* The consumer's CPU time (this thread's), apart from the rest of the main
 * process's: with a device, the consumer is a DMA copy. */
static uint64_t g_consume_ns;
static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
static void consume(const void *p, size_t n) {
  uint64_t t = thread_cpu_ns();
  g_sink += checksum(p, n);
  g_consume_ns += thread_cpu_ns() - t;
}

/* One run's numbers, printed as JSON or as a W9 record (--raw). */
typedef struct result {
  const char *path;
  int workers;
  size_t batch;
  int batches;
  double per_s, copied, held_mib, locked_mib, cpu_ms, consume_ms;
  unsigned long long mlock_failures;
} result_t;

static int g_raw;

static void print_result(const result_t *r) {
  const char *fill_name = g_cpu_fill ? "cpu" : "mem";
  if (g_raw) {
    printf("W9\t%s\t%d\t%zu\t%s\tbatches=%d\tbatches_per_s=%.2f\t"
           "copied_bytes_per_batch=%.0f\tmemory_held_mib=%.1f\t"
           "locked_mib=%.1f\tmain_cpu_ms_per_batch=%.3f\t"
           "consume_cpu_ms_per_batch=%.3f\tmlock_failures=%llu\n",
           r->path, r->workers, r->batch >> 20, fill_name, r->batches, r->per_s,
           r->copied, r->held_mib, r->locked_mib, r->cpu_ms, r->consume_ms,
           r->mlock_failures);
    return;
  }
  printf("{\"workload\":\"W9\",\"path\":\"%s\",\"workers\":%d,"
         "\"batch_mib\":%zu,\"fill\":\"%s\",\"batches\":%d,"
         "\"batches_per_s\":%.2f,\"copied_bytes_per_batch\":%.0f,"
         "\"memory_held_mib\":%.1f,\"locked_mib\":%.1f,"
         "\"main_cpu_ms_per_batch\":%.3f,\"consume_cpu_ms_per_batch\":%.3f}\n",
         r->path, r->workers, r->batch >> 20, fill_name, r->batches, r->per_s,
         r->copied, r->held_mib, r->locked_mib, r->cpu_ms, r->consume_ms);
}

/* ---- lend ------------------------------------------------------------- */
/* The owner's pointers by (chunk id, offset): the blocks lent. */
typedef struct optr {
  uint64_t chunk, off;
  void *p;
} optr_t;
static optr_t g_optr[MAXW * DEPTH];
static int g_noptr;
static void *owner_ptr(const pinpool_share_handle_t *h) {
  for (int i = 0; i < g_noptr; i++)
    if (g_optr[i].chunk == h->chunk_id && g_optr[i].off == h->offset)
      return g_optr[i].p;
  return NULL;
}

static int lend_worker(int sock) {
  /* The most recent attachments stay: each chunk this worker fills stays
   * mapped (a chunk is unmapped with its last attached block, and the
   * blocks of one worker are often in different chunks). */
  void *recent[2 * DEPTH] = {NULL};
  unsigned next = 0;
  uint64_t seq = 0;
  for (;;) {
    pinpool_share_handle_t h;
    int fd = -1;
    int rc = pinpool_share_recv(sock, &h, &fd);
    if (rc == PINPOOL_ECLOSED)
      return 0;
    if (rc != 0)
      return 10;
    void *p = NULL;
    if (pinpool_share_attach(&h, fd, &p) != 0)
      return 11;
    if (fd >= 0)
      close(fd);
    if (recent[next] != NULL && pinpool_share_detach(recent[next]) != 0)
      return 12;
    recent[next] = p;
    next = (next + 1) % (2 * DEPTH);
    fill(p, h.length, seq++);
    if (pinpool_share_send(sock, &h, -1) != 0)
      return 0; /* the main process is done */
  }
}

static void run_lend(int nw, size_t batch, int nbatches) {
  pinpool_t *pool = NULL;
  if (pinpool_create("shared=1,mlock=1,tcache_bytes=0", &pool) != 0)
    die("pinpool_create");
  int sock[MAXW];
  pid_t pid[MAXW];
  for (int w = 0; w < nw; w++) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      die("socketpair");
    pid[w] = fork();
    if (pid[w] == 0) {
      close(sv[0]);
      _exit(lend_worker(sv[1]));
    }
    close(sv[1]);
    sock[w] = sv[0];
  }
  uint64_t t0 = 0, c0 = 0;
  int done = 0, sent = 0, warm = nw * DEPTH;
  for (int w = 0; w < nw; w++)
    for (int d = 0; d < DEPTH; d++) {
      void *p;
      pinpool_share_handle_t h;
      int fd;
      if (pinpool_alloc(pool, batch, &p) != 0 ||
          pinpool_lend(pool, p, pid[w], &h, &fd) != 0 ||
          pinpool_share_send(sock[w], &h, fd) != 0)
        die("lend");
      g_optr[g_noptr++] = (optr_t){h.chunk_id, h.offset, p};
      sent++;
    }
  struct pollfd pfd[MAXW];
  for (int w = 0; w < nw; w++)
    pfd[w] = (struct pollfd){sock[w], POLLIN, 0};
  /* The first nw * DEPTH batches warm up (first touches of each chunk in
   * the worker, the fill's first pass); then nbatches are timed. */
  while (done < warm + nbatches) {
    if (poll(pfd, (nfds_t)nw, -1) < 0)
      die("poll");
    for (int w = 0; w < nw; w++) {
      if (!(pfd[w].revents & POLLIN))
        continue;
      pinpool_share_handle_t h;
      int fd;
      if (pinpool_share_recv(sock[w], &h, &fd) != 0)
        die("recv");
      if (pinpool_lend_return(pool, &h, pid[w]) != 0)
        die("lend_return");
      done++;
      void *p = owner_ptr(&h); /* the owner's own address of the block */
      consume(p, batch);
      if (sent < warm + nbatches) {
        pinpool_share_handle_t h2;
        if (pinpool_lend(pool, p, pid[w], &h2, &fd) != 0 ||
            pinpool_share_send(sock[w], &h2, fd) != 0)
          die("relend");
        sent++;
      }
      if (done == warm) { /* timed from the end of the warm-up */
        t0 = now_ns();
        c0 = cpu_ns();
        g_consume_ns = 0;
      }
    }
  }
  uint64_t t1 = now_ns(), c1 = cpu_ns();
  pinpool_stats_t st;
  pinpool_get_stats(pool, &st);
  for (int w = 0; w < nw; w++)
    close(sock[w]);
  for (int w = 0; w < nw; w++)
    waitpid(pid[w], NULL, 0);
  print_result(&(result_t){
      "lend", nw, batch, nbatches, nbatches / ((t1 - t0) / 1e9), 0.0,
      st.reserved_bytes.current / 1048576.0, st.locked_bytes / 1048576.0,
      (c1 - c0) / 1e6 / nbatches, g_consume_ns / 1e6 / nbatches,
      (unsigned long long)st.mlock_failures});
  pinpool_lend_reclaim(pool, -1, PINPOOL_RECLAIM_FREE | PINPOOL_RECLAIM_LIVE,
                       NULL);
  pinpool_destroy(pool);
}

/* ---- copy (today's path) --------------------------------------------- */
static int copy_worker(int sock, char *slots, size_t batch) {
  uint64_t seq = 0;
  for (;;) {
    unsigned char slot;
    ssize_t n = read(sock, &slot, 1);
    if (n <= 0)
      return 0;
    fill(slots + (size_t)slot * batch, batch, seq++);
    if (write(sock, &slot, 1) != 1)
      return 0;
  }
}

static void run_copy(int nw, size_t batch, int nbatches) {
  /* Each worker's shared-memory slots, created before the fork (memfd,
   * MAP_SHARED: torch's file_descriptor strategy shares shm the same way). */
  char *slots[MAXW];
  int sock[MAXW];
  pid_t pid[MAXW];
  for (int w = 0; w < nw; w++) {
    int fd = (int)syscall(SYS_memfd_create, "w9-slots", 1u);
    if (fd < 0 || ftruncate(fd, (off_t)(DEPTH * batch)) != 0)
      die("memfd");
    slots[w] =
        mmap(NULL, DEPTH * batch, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (slots[w] == MAP_FAILED)
      die("mmap");
    close(fd);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
      die("socketpair");
    pid[w] = fork();
    if (pid[w] == 0) {
      close(sv[0]);
      _exit(copy_worker(sv[1], slots[w], batch));
    }
    close(sv[1]);
    sock[w] = sv[0];
  }
  /* The pinned destination: one page-locked batch (the pin-memory
   * thread's pinned tensor, reused). */
  char *pinned = mmap(NULL, batch, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (pinned == MAP_FAILED)
    die("mmap pinned");
  int locked = mlock(pinned, batch) == 0;
  for (int w = 0; w < nw; w++)
    for (unsigned char d = 0; d < DEPTH; d++)
      if (write(sock[w], &d, 1) != 1)
        die("write");
  int sent = nw * DEPTH, done = 0, warm = nw * DEPTH;
  uint64_t t0 = 0, c0 = 0, copied = 0;
  struct pollfd pfd[MAXW];
  for (int w = 0; w < nw; w++)
    pfd[w] = (struct pollfd){sock[w], POLLIN, 0};
  while (done < warm + nbatches) {
    if (poll(pfd, (nfds_t)nw, -1) < 0)
      die("poll");
    for (int w = 0; w < nw; w++) {
      if (!(pfd[w].revents & POLLIN))
        continue;
      unsigned char slot;
      if (read(sock[w], &slot, 1) != 1)
        die("read");
      done++;
      memcpy(pinned, slots[w] + (size_t)slot * batch, batch);
      copied += batch;
      if (sent < warm + nbatches) { /* the slot is free again */
        if (write(sock[w], &slot, 1) != 1)
          die("write");
        sent++;
      }
      consume(pinned, batch);
      if (done == warm) { /* timed from the end of the warm-up */
        t0 = now_ns();
        c0 = cpu_ns();
        copied = 0;
        g_consume_ns = 0;
      }
    }
  }
  uint64_t t1 = now_ns(), c1 = cpu_ns();
  for (int w = 0; w < nw; w++)
    close(sock[w]);
  for (int w = 0; w < nw; w++)
    waitpid(pid[w], NULL, 0);
  double held = (double)(nw * DEPTH + 1) * (double)batch / 1048576.0;
  print_result(
      &(result_t){"copy", nw, batch, nbatches, nbatches / ((t1 - t0) / 1e9),
                  (double)(copied / (uint64_t)nbatches), held,
                  locked ? batch / 1048576.0 : 0.0, (c1 - c0) / 1e6 / nbatches,
                  g_consume_ns / 1e6 / nbatches, locked ? 0ull : 1ull});
  for (int w = 0; w < nw; w++)
    munmap(slots[w], DEPTH * batch);
  munmap(pinned, batch);
}

int main(int argc, char **argv) {
  const char *prog = argv[0];
  if (argc > 1 && strcmp(argv[1], "--raw") == 0) {
    g_raw = 1;
    argv++;
    argc--;
  }
  if (argc != 6 ||
      (strcmp(argv[1], "lend") != 0 && strcmp(argv[1], "copy") != 0) ||
      (strcmp(argv[4], "mem") != 0 && strcmp(argv[4], "cpu") != 0)) {
    fprintf(stderr,
            "usage: %s [--raw] lend|copy WORKERS BATCH_MIB mem|cpu BATCHES\n",
            prog);
    return 2;
  }
  int nw = atoi(argv[2]);
  size_t batch = (size_t)atoi(argv[3]) << 20;
  g_cpu_fill = strcmp(argv[4], "cpu") == 0;
  int nb = atoi(argv[5]);
  if (nw < 1 || nw > MAXW || batch == 0 || nb < 1) {
    /* run.sh records stderr's last line as a failed run's reason */
    fprintf(stderr, "w9: WORKERS 1..%d, BATCH_MIB and BATCHES >= 1\n", MAXW);
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (strcmp(argv[1], "lend") == 0)
    run_lend(nw, batch, nb);
  else
    run_copy(nw, batch, nb);
  return 0;
}
