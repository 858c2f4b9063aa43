/*
 * Sharing (docs/sharing.md): chunks of a `shared=1` pool backed by memfd,
 * blocks lent to other processes by handle + descriptor.
 *
 * Owner side. Each chunk is a sealed memfd (SHRINK | GROW | SEAL: its size
 * never changes, so no process mapping it can be made to fault with
 * SIGBUS) and a control area in a memfd of its own: a header naming the
 * pool (nonce) and chunk, then one slot per block that may be lent at
 * once. The control memfd is sealed against writes (FUTURE_WRITE) once the
 * owner has mapped it, and workers get it read-only: only the owner's
 * mapping can ever write it. A lend takes a slot and writes the block's
 * offset, length and a generation taken from a pool-wide counter (never 0,
 * never reused); the end of the lend (return or reclaim) stores 0 there. A
 * worker attaching a handle reads the slot: a generation that differs is a
 * stale handle. The control area is a courtesy to workers; the owner never
 * reads it: what the owner believes about lends is its own table here.
 *
 * Threat model (docs/sharing.md): a worker is any code. A lend is recorded
 * against a peer record that holds a pidfd (identity by process, never by
 * pid number) and carries a 128-bit token from getrandom; a return is
 * accepted only with the token and from the pid that names the recorded
 * process now. Refusals change nothing and are counted.
 *
 * The worker side is share_worker.c.
 *
 * Locking: share->lock is a leaf (no pool lock is taken under it, no
 * provider call is made under it; the system calls made under it are
 * pidfd_open, poll, getrandom, fstat, close); the worker table has its own
 * lock. The fork handlers take both (fork.c).
 */
#include "share.h"

#include "index.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysinfo.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#ifndef PIDFS_MAGIC
#define PIDFS_MAGIC                                                            \
  0x50494446 /* Linux 6.9: a pidfd's inode names its process */
#endif

/* ---- Owner state ------------------------------------------------------- */
struct pp_schunk {
  uintptr_t base;
  size_t size;
  int fd;     /* the chunk's bytes, read-write */
  int ctl_fd; /* the control area, read-only (write-sealed) */
  uint64_t id, dev, ino, ctl_ino;
  void *ctl; /* the owner's writable mapping of it */
  size_t ctl_len;
  uint32_t nslots;
  uint32_t nfree;
  uint32_t *free_slots; /* a stack of free slot indices */
};
typedef struct lend {
  void *ptr;
  size_t len;
  pp_schunk_t *ck;
  uint32_t slot;
  int peer_pid;      /* information: the number when lent */
  uint64_t peer_id;  /* the peer record (identity) */
  struct peer *peer; /* that record (it lives while it has lends) */
  uint64_t gen;
  uint8_t token[16];
  uint64_t since_ns;      /* CLOCK_MONOTONIC */
  uint64_t since_unix_ns; /* CLOCK_REALTIME */
} lend_t;
/* A peer: one process, named by the pool's own pidfd for as long as the
 * record lives: while it has lends, and after its last one until the pool
 * sees it has exited (peers_prune_*), so that a worker lent to again and
 * again costs no pidfd_open per lend. Two records may carry one pid
 * number (a process that exited, and a later one that got its pid); at
 * most one of them is alive. */
typedef struct peer {
  uint64_t id; /* never reused */
  int pid;
  int pidfd;
  size_t nlends;
  /* pidfd's pidfs inode (Linux 6.9), read once: a return by pidfd compares
   * it (0, 0: no pidfs). */
  uint64_t dev, ino;
} peer_t;
struct pp_share {
  pp_mutex_t lock;
  uint64_t nonce; /* immutable */
  int owner_pid;  /* immutable */
  uint64_t next_id, next_gen, next_peer;
  pp_schunk_t **chunks; /* sorted by base */
  size_t nchunks, cchunks;
  lend_t *lends;
  size_t nlends, clends;
  /* The lends' indexes: by block (lend_find), by generation
   * (lend_return); the value is a lend's place in lends[] + 1. */
  pp_index_t lix, gix;
  /* A snapshot copying lends[] over several holds (pp_share_lends_copy,
   * which copy_lock makes one at a time): lends[0, copy_next) are copied;
   * lend_end keeps every lend not yet copied at copy_next or above. */
  pp_mutex_t copy_lock;
  size_t copy_next;
  bool copying;
  /* The peer records (each its own allocation: lends point at theirs),
   * the newest record of each pid by pid (pix: peer_live), and the
   * prune's cursor (peers_prune_some). */
  peer_t **peers;
  size_t npeers, cpeers, prune_next;
  pp_index_t pix;
  uint8_t rnd[256]; /* getrandom's bytes, 16 per token */
  size_t rnd_left;
  /* nlends and the bytes lent, readable without the lock (free's check,
   * stats); refused returns. */
  _Atomic(uint64_t) nlent, lent_bytes, refusals;
};

static uint64_t realtime_ns(void) {
  struct timespec ts;
  (void)clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t random_nonce(void) {
  uint64_t v = 0;
  long n = syscall(SYS_getrandom, &v, sizeof v, 0);
  if (n != (long)sizeof v || v == 0) {
    /* No getrandom: unique enough for identification (the nonce is not a
     * secret: it is in every handle and control area; tokens are). */
    static _Atomic(uint64_t) ctr;
    v = pp_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&v ^
        (pp_fetch_add_relaxed(&ctr, 1) * 0x9e3779b97f4a7c15ull);
    v |= 1;
  }
  return v;
}

/* A fresh 128-bit token (lock held): from the kernel's CSPRNG, 16 tokens
 * per getrandom call. No fallback: a guessable token is no token. */
static int token_new(pp_share_t *s, uint8_t out[16]) {
  pp_assert_held(&s->lock);
  if (s->rnd_left < 16) {
    size_t got = 0;
    while (got < sizeof s->rnd) {
      long n = syscall(SYS_getrandom, s->rnd + got, sizeof s->rnd - got, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        return pp_fail(PINPOOL_EBACKEND, "pinpool_lend: getrandom: %s",
                       n < 0 ? strerror(errno) : "no bytes");
      got += (size_t)n;
    }
    s->rnd_left = sizeof s->rnd;
  }
  s->rnd_left -= 16;
  memcpy(out, s->rnd + s->rnd_left, 16);
  memset(s->rnd + s->rnd_left, 0, 16); /* each token leaves one copy */
  return 0;
}

/* Constant time: the time taken says nothing of how much matched. */
static bool token_eq(const uint8_t *a, const uint8_t *b) {
  unsigned d = 0;
  for (int i = 0; i < 16; i++)
    d |= (unsigned)(a[i] ^ b[i]);
  return d == 0;
}

int pp_share_create(pp_share_t **out) {
  pp_share_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory");
  pp_mutex_init(&s->lock);
  pp_mutex_init(&s->copy_lock);
  s->nonce = random_nonce();
  s->owner_pid = (int)getpid();
  int rc = pp_share_own_add(s->nonce);
  if (rc != 0) {
    pp_mutex_destroy(&s->copy_lock);
    pp_mutex_destroy(&s->lock);
    free(s);
    return rc;
  }
  pp_index_init(&s->lix, &s->lock);
  pp_index_init(&s->gix, &s->lock);
  pp_index_init(&s->pix, &s->lock);
  s->next_id = 1;
  s->next_gen = 1;
  s->next_peer = 1;
  *out = s;
  return 0;
}

/* Also for a chunk half made (share_chunk_new's failures): base 0 is not
 * mapped yet. */
static void chunk_unmap(pp_schunk_t *c) {
  if (c->base != 0)
    (void)munmap((void *)c->base, c->size);
  if (c->ctl != NULL)
    (void)munmap(c->ctl, c->ctl_len);
  if (c->fd >= 0)
    (void)close(c->fd);
  if (c->ctl_fd >= 0)
    (void)close(c->ctl_fd);
  free(c->free_slots);
  free(c);
}

void pp_share_destroy(pp_share_t *s) {
  if (s == NULL)
    return;
  /* Normally every chunk went back through the provider (pp_arena_fini);
   * in a child of fork the provider was cut off, and the chunks' views and
   * descriptors inherited from the parent are dropped here. */
  pp_share_own_del(s->nonce);
  for (size_t i = 0; i < s->nchunks; i++)
    chunk_unmap(s->chunks[i]);
  for (size_t i = 0; i < s->npeers; i++) {
    (void)close(s->peers[i]->pidfd);
    free(s->peers[i]);
  }
  pp_index_fini(&s->pix);
  free(s->chunks);
  free(s->lends);
  pp_index_fini(&s->lix);
  pp_index_fini(&s->gix);
  free(s->peers);
  memset(s->rnd, 0, sizeof s->rnd);
  pp_mutex_destroy(&s->copy_lock);
  pp_mutex_destroy(&s->lock);
  free(s);
}

void pp_share_fork(pp_share_t *s, int phase) {
  if (phase == PP_FORK_PREPARE)
    pp_mutex_lock(&s->lock);
  else
    pp_mutex_unlock(&s->lock);
  /* A snapshot copying lends in the parent has no thread in the child:
   * its copy_lock is made anew, its cursor forgotten. */
  if (phase == PP_FORK_CHILD) {
    pp_mutex_init(&s->copy_lock);
    s->copying = false;
  }
}

/* ---- Chunks (called by the host backend, no pool lock held) ------------ */

static int sys_fail(int err, const char *what, size_t size) {
  if (err == EMFILE || err == ENFILE) {
    struct rlimit rl = {0, 0};
    (void)getrlimit(RLIMIT_NOFILE, &rl);
    return pp_fail(PINPOOL_ELIMIT,
                   "shared pool: %s for a chunk of %zu bytes: %s "
                   "(RLIMIT_NOFILE is %llu descriptors)",
                   what, size, strerror(err), (unsigned long long)rl.rlim_cur);
  }
  return pp_fail(err == ENOMEM ? PINPOOL_ENOMEM : PINPOOL_EBACKEND,
                 "shared pool: %s for a chunk of %zu bytes: %s", what, size,
                 strerror(err));
}

static int memfd_new(const char *name) {
  int fd = (int)syscall(SYS_memfd_create, name,
                        MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd < 0 && errno == EINVAL) /* before Linux 6.3 */
    fd = (int)syscall(SYS_memfd_create, name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  return fd;
}

/* The control area of c (c->ctl_len bytes): a memfd mapped writable here,
 * then sealed so that no descriptor or new mapping can ever write it, then
 * reopened read-only for workers (a view mapped from a read-write open
 * file description could be mprotect'ed writable again: the reference
 * notes). The read-write descriptor is closed: only this mapping writes. */
static int ctl_new(pp_schunk_t *c) {
  int fd = memfd_new("pinpool-ctl");
  if (fd < 0)
    return sys_fail(errno, "memfd_create of the control area", c->size);
  int rc = 0;
  struct stat st;
  if (ftruncate(fd, (off_t)c->ctl_len) != 0)
    rc = sys_fail(errno, "ftruncate of the control area", c->size);
  if (rc == 0) {
    c->ctl = mmap(NULL, c->ctl_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (c->ctl == MAP_FAILED) {
      c->ctl = NULL;
      rc = sys_fail(errno, "mmap of the control area", c->size);
    }
  }
#ifdef PINPOOL_MUTANT_SHARE_CTL_WRITABLE
  /* Mutant (docs/verification.md): the control area as writable as the
   * chunk (no seal against writes, no read-only reopen, inherited). */
  if (rc == 0 && fstat(fd, &st) == 0) {
    c->ctl_ino = (uint64_t)st.st_ino;
    c->ctl_fd = fd;
    return 0;
  }
#endif
  /* A child forked from the owner would inherit this writable mapping:
   * none does. */
  if (rc == 0 && madvise(c->ctl, c->ctl_len, MADV_DONTFORK) != 0)
    rc = sys_fail(errno, "madvise(MADV_DONTFORK) of the control area", c->size);
  if (rc == 0 && fcntl(fd, F_ADD_SEALS, CTL_SEALS) != 0)
    rc = sys_fail(errno,
                  "sealing the control area (F_SEAL_FUTURE_WRITE "
                  "needs Linux 5.1)",
                  c->size);
  if (rc == 0 && fstat(fd, &st) != 0)
    rc = sys_fail(errno, "fstat of the control area", c->size);
  if (rc != 0) {
    (void)close(fd);
    return rc;
  }
  c->ctl_ino = (uint64_t)st.st_ino;
  char path[64];
  (void)snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  int ro = open(path, O_RDONLY | O_CLOEXEC);
  if (ro >= 0) {
    (void)close(fd);
    c->ctl_fd = ro;
  } else {
    /* No /proc: the seal alone keeps writes out (a read-write descriptor
     * can neither write nor map writable a FUTURE_WRITE-sealed memfd). */
    c->ctl_fd = fd;
  }
  return 0;
}

int pp_share_chunk_new(pp_share_t *s, size_t size, bool huge, void **base,
                       pp_schunk_t **out) {
  /* A memfd is shmem without overcommit accounting (VM_NORESERVE):
   * ftruncate and a MAP_SHARED mmap of any size succeed, and populating
   * it then runs until the OOM killer ends the process. Refused here, as
   * the plain host backend's anonymous mmap is by the kernel's heuristic
   * overcommit: a chunk bigger than RAM and swap together. */
  struct sysinfo si;
  if (sysinfo(&si) == 0) {
    unsigned long long total =
        ((unsigned long long)si.totalram + si.totalswap) * si.mem_unit;
    if ((unsigned long long)size > total)
      return pp_fail(PINPOOL_ENOMEM,
                     "shared pool: a chunk of %zu bytes is more than this "
                     "machine's memory (%llu bytes of RAM and swap)",
                     size, total);
  }
  /* Nor does a memory cgroup's limit fail the population: its OOM killer
   * ends a process (share_cgroup.c has the measurement). Refused before
   * any memfd exists. */
  uint64_t room;
  int crc =
      pp_share_cgroup_room("/proc/self/mountinfo", "/proc/self/cgroup", &room);
  if (crc < 0)
    return crc;
  if (crc == 0 && (uint64_t)size > room)
    return pp_fail(PINPOOL_ENOMEM,
                   "shared pool: a chunk of %zu bytes is more than this "
                   "process's memory cgroup has room for (%llu bytes below "
                   "its limit, or an ancestor's): populating it would call "
                   "the cgroup's OOM killer",
                   size, (unsigned long long)room);
  pp_schunk_t *c = calloc(1, sizeof *c);
  uint64_t nslots = pp_ctl_slots(size);
  uint32_t *slots = malloc(nslots * sizeof *slots);
  if (c == NULL || slots == NULL) {
    free(c);
    free(slots);
    return pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory");
  }
  c->fd = -1;
  c->ctl_fd = -1;
  c->free_slots = slots;
  c->nslots = (uint32_t)nslots;
  for (uint32_t i = 0; i < c->nslots; i++)
    slots[i] = c->nslots - 1 - i; /* slot 0 on top */
  c->nfree = c->nslots;
  c->size = size;
  c->ctl_len = pp_ctl_bytes(size);
  c->base = 0; /* mapped below */
  int fd = memfd_new("pinpool-chunk");
  int rc = 0;
  if (fd < 0) {
    rc = sys_fail(errno, "memfd_create", size);
  } else {
    c->fd = fd;
    struct stat st;
    if (ftruncate(fd, (off_t)size) != 0)
      rc = sys_fail(errno, "ftruncate", size);
    else if (fcntl(fd, F_ADD_SEALS, SEALS_NEEDED) != 0)
      rc = sys_fail(errno, "sealing", size);
    else if (fstat(fd, &st) != 0)
      rc = sys_fail(errno, "fstat", size);
    else {
      c->dev = (uint64_t)st.st_dev;
      c->ino = (uint64_t)st.st_ino;
    }
  }
  if (rc == 0)
    rc = ctl_new(c);
  char *p = MAP_FAILED;
  if (rc == 0 && huge) {
    /* THP needs a 2 MiB-aligned range: reserve one, map the file over it. */
    char *r = mmap(NULL, size + HUGE_ALIGN, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r != MAP_FAILED) {
      char *a = (char *)(((uintptr_t)r + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1));
      p = mmap(a, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
      int e = errno;
      if (a > r)
        (void)munmap(r, (size_t)(a - r));
      size_t tail = (size_t)((r + size + HUGE_ALIGN) - (a + size));
      if (tail > 0)
        (void)munmap(a + size, tail);
      if (p == MAP_FAILED)
        (void)munmap(a, size);
      errno = e;
    }
  } else if (rc == 0) {
    p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (rc == 0 && p == MAP_FAILED)
    rc = sys_fail(errno, "mmap", size);
  if (rc != 0) {
    chunk_unmap(c); /* base is set only once p is mapped */
    return rc;
  }
  c->base = (uintptr_t)p;
  pp_ctl_head_t *h = c->ctl;
  pp_store_relaxed(&h->nonce, s->nonce);
  pp_store_relaxed(&h->chunk_size, (uint64_t)size);
  pp_store_relaxed(&h->nslots, nslots);
  pp_store_relaxed(&h->owner_pid, (uint64_t)s->owner_pid);
  pp_mutex_lock(&s->lock);
  c->id = s->next_id++;
  pp_mutex_unlock(&s->lock);
  pp_store_relaxed(&h->chunk_id, c->id);
  pp_store_release(&h->magic, CTL_MAGIC);
  *base = p;
  *out = c;
  return 0;
}

void pp_share_chunk_abort(pp_schunk_t *c) { chunk_unmap(c); }

/* Index of the first chunk whose base is > p. Lock held. */
static size_t chunk_upper(const pp_share_t *s, uintptr_t p) {
  size_t lo = 0, hi = s->nchunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (s->chunks[mid]->base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}
static pp_schunk_t *chunk_of(const pp_share_t *s, const void *ptr) {
  uintptr_t p = (uintptr_t)ptr;
  size_t i = chunk_upper(s, p);
  if (i == 0)
    return NULL;
  pp_schunk_t *c = s->chunks[i - 1];
  return p - c->base < c->size ? c : NULL;
}

int pp_share_chunk_publish(pp_share_t *s, pp_schunk_t *c) {
  pp_mutex_lock(&s->lock);
  if (s->nchunks == s->cchunks) {
    size_t n = s->cchunks == 0 ? 16 : s->cchunks * 2;
    pp_schunk_t **t = realloc(s->chunks, n * sizeof(pp_schunk_t *));
    if (t == NULL) {
      pp_mutex_unlock(&s->lock);
      return pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory");
    }
    s->chunks = t;
    s->cchunks = n;
  }
  size_t i = chunk_upper(s, c->base);
  memmove(&s->chunks[i + 1], &s->chunks[i],
          (s->nchunks - i) * sizeof(pp_schunk_t *));
  s->chunks[i] = c;
  s->nchunks++;
  pp_mutex_unlock(&s->lock);
  return 0;
}

void pp_share_chunk_drop(pp_share_t *s, void *base, size_t size) {
  pp_mutex_lock(&s->lock);
  pp_schunk_t *c = chunk_of(s, base);
  if (c != NULL && c->base == (uintptr_t)base) {
    size_t i = chunk_upper(s, c->base) - 1;
    memmove(&s->chunks[i], &s->chunks[i + 1],
            (s->nchunks - i - 1) * sizeof(pp_schunk_t *));
    s->nchunks--;
  } else {
    c = NULL;
  }
  pp_mutex_unlock(&s->lock);
  pp_assert(c != NULL && c->size == size);
  if (c != NULL)
    chunk_unmap(c); /* no lend can remain: its block was allocated */
  else
    (void)munmap(base, size);
}

/* ---- Peers ----------------------------------------------------------------
 * A peer record holds a pidfd: the process it names can die, but the
 * descriptor never names another. Whether it has exited: poll (a zombie
 * has). */

static bool pidfd_exited(int pidfd) {
  struct pollfd pfd = {pidfd, POLLIN, 0};
  int n;
  do
    n = poll(&pfd, 1, 0);
  while (n < 0 && errno == EINTR);
  return n > 0 && (pfd.revents & (POLLIN | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* The record of lend l (lock held): the lend points at it (issue 38, the
 * meter's findings, item 2: every return, reclaim and end of a lend walked
 * the records for its id). */
static peer_t *lend_peer(pp_share_t *s, const struct lend *l) {
  pp_assert_held(&s->lock);
  (void)s;
#ifdef PINPOOL_MUTANT_PEER_WALK
  /* Mutant (docs/verification.md): the records walked by id, as before. */
  size_t i = 0;
  while (i < s->npeers && s->peers[i]->id != l->peer_id)
    i++;
  pp_lock_visit(&s->lock, i + 1);
  return i < s->npeers ? s->peers[i] : NULL;
#else
  return l->peer;
#endif
}

/* Take record i out (lock held; no lends): the last fills its place. */
static void peer_drop(pp_share_t *s, size_t i) {
  peer_t *p = s->peers[i];
  pp_assert(p->nlends == 0);
  if (pp_index_get(&s->pix, (uint64_t)p->pid) == (uintptr_t)p)
    pp_index_del(&s->pix, (uint64_t)p->pid); /* no newer one of its pid */
  (void)close(p->pidfd);
  free(p);
  s->peers[i] = s->peers[--s->npeers]; /* p itself if it was the last */
}

/* Records a new record's prune examines (a poll each). */
#define PRUNE_STEP 4

/* Drop records without lends whose process has exited (lock held), so
 * that their pidfds do not pile up: PRUNE_STEP of them from a cursor that
 * goes round, at each new record (issue 38, item 2: every record, each
 * with a poll, in the hold of every lend to a new process). A record
 * dropped here has been without lends and exited since the cursor last
 * passed it: at most npeers / PRUNE_STEP new records ago, so such records
 * stay a fraction of the live ones. */
static void peers_prune_some(pp_share_t *s) {
  pp_assert_held(&s->lock);
#ifdef PINPOOL_MUTANT_PEER_WALK
  size_t k = s->npeers; /* the mutant: every record, as before */
#else
  size_t k = s->npeers < PRUNE_STEP ? s->npeers : PRUNE_STEP;
#endif
  pp_lock_visit(&s->lock, k);
  for (; k > 0 && s->npeers > 0; k--) {
    if (s->prune_next >= s->npeers)
      s->prune_next = 0;
    peer_t *p = s->peers[s->prune_next];
    if (p->nlends == 0 && pidfd_exited(p->pidfd))
      peer_drop(s, s->prune_next); /* the last comes here: examined next */
    else
      s->prune_next++;
  }
}

/* Records a reclaim's prune examines in one hold. */
#define PRUNE_PIECE 64

/* Every record examined, PRUNE_PIECE a hold, from the top down: a drop
 * moves the last record (examined already) down to the hole, new records
 * go on top, so none present throughout is missed. At the end of a
 * reclaim: the exited peers' records go with their lends. */
static void peers_prune_all(pp_share_t *s) {
  size_t c = SIZE_MAX;
  for (;;) {
    pp_mutex_lock(&s->lock);
    if (c > s->npeers)
      c = s->npeers;
    size_t seen = 0;
    while (c > 0 && seen < PRUNE_PIECE) {
      peer_t *p = s->peers[--c];
      seen++;
      if (p->nlends == 0 && pidfd_exited(p->pidfd))
        peer_drop(s, c);
    }
    pp_lock_visit(&s->lock, seen);
    pp_mutex_unlock(&s->lock);
    if (c == 0)
      break;
  }
}

/* The live record of pid, if any: a live process's pid names only it, and
 * it is the newest record of that pid (a record is made for a pid only
 * when none of its records is alive). */
static peer_t *peer_live(pp_share_t *s, int pid) {
  pp_assert_held(&s->lock);
#if defined(PINPOOL_MUTANT_SHARE_PID_KEY) || defined(PINPOOL_MUTANT_PEER_WALK)
  size_t i = 0;
  for (; i < s->npeers; i++)
#ifdef PINPOOL_MUTANT_SHARE_PID_KEY
    /* Mutant (docs/verification.md): peers by pid number alone. */
    if (s->peers[i]->pid == pid)
#else
    /* Mutant (docs/verification.md): every record walked, as before. */
    if (s->peers[i]->pid == pid && !pidfd_exited(s->peers[i]->pidfd))
#endif
      break;
  pp_lock_visit(&s->lock, i + 1);
  return i < s->npeers ? s->peers[i] : NULL;
#else
  peer_t *p = (peer_t *)(uintptr_t)pp_index_get(&s->pix, (uint64_t)pid);
  return p != NULL && !pidfd_exited(p->pidfd) ? p : NULL;
#endif
}

static int nofile_fail(const char *fn, int pid, int e) {
  struct rlimit rl = {0, 0};
  (void)getrlimit(RLIMIT_NOFILE, &rl);
  return pp_fail(PINPOOL_ELIMIT,
                 "%s: a pidfd for peer %d: %s (RLIMIT_NOFILE is %llu "
                 "descriptors)",
                 fn, pid, strerror(e), (unsigned long long)rl.rlim_cur);
}

/* PIDFD_GET_INFO (Linux 6.13): the pid in the caller's pid namespace. */
struct pp_pidfd_info {
  uint64_t mask, cgroupid;
  uint32_t pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int32_t exit_code;
};
_Static_assert(sizeof(struct pp_pidfd_info) == 64, "PIDFD_INFO_SIZE_VER0");
#define PP_PIDFD_GET_INFO _IOWR(0xFF, 11, struct pp_pidfd_info)

/* The pid a pidfd names, in this process's pid namespace: > 0, or -1 if
 * it has been reaped, 0 if it is in no pid namespace of ours; -2 if not a
 * pidfd. PIDFD_GET_INFO where the kernel has it, else "Pid:" of its
 * fdinfo (which counts in /proc's namespace). */
static int pidfd_pid(int pidfd) {
  /* A thread pidfd (PIDFD_THREAD, which is O_EXCL, Linux 6.9) polls
   * readable when its thread exits, not its process: a peer tracked by it
   * would "exit" while the process lives. -3: not a process's pidfd. */
  int fl = fcntl(pidfd, F_GETFL);
  if (fl < 0)
    return -2;
  if (fl & O_EXCL)
    return -3;
  struct pp_pidfd_info info;
  memset(&info, 0, sizeof info);
  info.mask = 1; /* PIDFD_INFO_PID */
  if (ioctl(pidfd, PP_PIDFD_GET_INFO, &info) == 0)
    return info.pid != info.tgid ? -3 : (int)info.tgid;
  if (errno == ESRCH)
    return -1;
  if (errno == EBADF)
    return -2;
  char path[64], buf[1024];
  (void)snprintf(path, sizeof path, "/proc/self/fdinfo/%d", pidfd);
  int f = open(path, O_RDONLY | O_CLOEXEC);
  if (f < 0)
    return -2;
  ssize_t n = read(f, buf, sizeof buf - 1);
  (void)close(f);
  if (n <= 0)
    return -2;
  buf[n] = '\0';
  const char *p = strstr(buf, "\nPid:");
  if (p == NULL)
    return -2;
  return (int)strtol(p + 5, NULL, 10);
}

/* Add a record for the process of `pidfd` (consumed), pid `pid`. */
static int peer_add(pp_share_t *s, int pid, int pidfd, peer_t **out) {
  pp_assert_held(&s->lock);
  peers_prune_some(s);
  peer_t *p = NULL;
  if (s->npeers == s->cpeers) {
    size_t n = s->cpeers == 0 ? 8 : s->cpeers * 2;
    peer_t **t = realloc(s->peers, n * sizeof(peer_t *));
    if (t != NULL) {
      s->peers = t;
      s->cpeers = n;
    }
  }
  if (s->npeers < s->cpeers && pp_index_reserve(&s->pix, 1))
    p = malloc(sizeof *p);
  if (p == NULL) {
    (void)close(pidfd);
    return pp_fail(PINPOOL_ENOMEM, "pinpool_lend: out of memory");
  }
  *p = (peer_t){s->next_peer++, pid, pidfd, 0, 0, 0};
  s->peers[s->npeers++] = p;
  /* The newest record of pid: any other has exited (peer_live). */
  if (pp_index_get(&s->pix, (uint64_t)pid) != 0)
    pp_index_set(&s->pix, (uint64_t)pid, (uintptr_t)p);
  else
    pp_index_put(&s->pix, (uint64_t)pid, (uintptr_t)p);
  struct statfs fs;
  struct stat st;
  if (fstatfs(pidfd, &fs) == 0 && fs.f_type == PIDFS_MAGIC &&
      fstat(pidfd, &st) == 0) {
    p->dev = (uint64_t)st.st_dev;
    p->ino = (uint64_t)st.st_ino;
  }
  *out = p;
  return 0;
}

/* Whether the process `pid` names now is the one p's pidfd names, p having
 * exited (lock held): no process has the pid (it was p's and was reaped),
 * or a pidfd opened for it is the same pidfs inode as p's (p's zombie).
 * Without pidfs (before Linux 6.9) two pidfds cannot be compared: false. */
static bool exited_peer_is(const peer_t *p, int pid) {
  if (p->pid != pid)
    return false;
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0)
    return errno == ESRCH;
  struct stat a, b;
  struct statfs fs;
  bool same = fstatfs(fd, &fs) == 0 && fs.f_type == PIDFS_MAGIC &&
              fstat(fd, &a) == 0 && fstat(p->pidfd, &b) == 0 &&
              a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  (void)close(fd);
  return same;
}

/* The record of the process pid names now, made if needed (lock held). A
 * record whose process has exited is another process's, even with this
 * pid: the lend goes to a new record. */
static int peer_of_pid(pp_share_t *s, const char *fn, int pid, peer_t **out) {
  peer_t *p = peer_live(s, pid);
  if (p != NULL) {
    *out = p;
    return 0;
  }
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    int e = errno;
    if (e == ESRCH)
      return pp_fail(PINPOOL_EEXITED, "%s: no process %d (it has exited)", fn,
                     pid);
    if (e == EMFILE || e == ENFILE)
      return nofile_fail(fn, pid, e);
    /* pid > 0 and flags 0: EINVAL (before Linux 6.9) and ENOENT (since)
     * mean the pid is a thread's id, not a thread group's (rvpy39 D5:
     * before, "needs pidfds: Linux 5.3", which misled). */
    if (e == EINVAL || e == ENOENT)
      return pp_fail(PINPOOL_EINVAL,
                     "%s: pid %d is a thread, not a process: lend to the "
                     "process (getpid() of the borrower)",
                     fn, pid);
    return pp_fail(PINPOOL_EBACKEND,
                   "%s: pidfd_open(%d): %s (a shared pool needs pidfds: "
                   "Linux 5.3)",
                   fn, pid, strerror(e));
  }
  /* (pidfd_open sets close-on-exec itself.) */
  if (pidfd_exited(fd)) { /* a zombie: it will never return the block */
    (void)close(fd);
    return pp_fail(PINPOOL_EEXITED, "%s: process %d has exited (a zombie)", fn,
                   pid);
  }
  return peer_add(s, pid, fd, out);
}

/* The record of the process `pidfd` names (lock held). */
static int peer_of_pidfd(pp_share_t *s, const char *fn, int pidfd,
                         peer_t **out) {
  int pid = pidfd_pid(pidfd);
  if (pid == -2)
    return pp_fail(PINPOOL_EINVAL, "%s: descriptor %d is not a pidfd", fn,
                   pidfd);
  if (pid == -3)
    return pp_fail(PINPOOL_EINVAL,
                   "%s: pidfd %d names a thread (PIDFD_THREAD), not a "
                   "process: its thread's exit would end the process's "
                   "lends; open it with pidfd_open(pid, 0)",
                   fn, pidfd);
  if (pid <= 0 || pidfd_exited(pidfd))
    return pp_fail(PINPOOL_EEXITED,
                   pid == 0 ? "%s: the process of pidfd %d is outside this "
                              "pid namespace"
                            : "%s: the process of pidfd %d has exited",
                   fn, pidfd);
  /* Alive now, so its pid names it alone: a live record with that pid is
   * this process. */
  peer_t *p = peer_live(s, pid);
  if (p != NULL) {
    *out = p;
    return 0;
  }
  int fd = fcntl(pidfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0)
    return errno == EMFILE || errno == ENFILE
               ? nofile_fail(fn, pid, errno)
               : pp_fail(PINPOOL_EBACKEND, "%s: dup of pidfd %d: %s", fn, pidfd,
                         strerror(errno));
  return peer_add(s, pid, fd, out);
}

/* ---- Lends --------------------------------------------------------------- */

/* The lends' indexes (index.h): block address -> its place in lends[] + 1
 * (issue 38: every free of a shared pool asks whether its block is lent,
 * and lend_find walked every lend: 3.9 us a free at 3,000 lends), and
 * generation -> its place + 1 (a return names its lend by generation,
 * and lend_return walked every lend too). Both double in pieces: rebuilt
 * whole, they held the lock for every lend at each doubling (the meter's
 * findings, item 1). Lock held; the probes count on the lock's meter. */
static uint64_t pkey(const void *ptr) { return (uint64_t)(uintptr_t)ptr; }

/* Room in lends[] and both indexes for one lend more. Nothing visible
 * changes if memory runs out. */
static bool lends_room(pp_share_t *s) {
  if (!pp_index_reserve(&s->lix, 1) || !pp_index_reserve(&s->gix, 1))
    return false;
  if (s->nlends < s->clends)
    return true;
  size_t n = s->clends == 0 ? 16 : s->clends * 2;
  lend_t *t = realloc(s->lends, n * sizeof *t);
  if (t == NULL)
    return false;
  s->lends = t, s->clends = n;
  return true;
}

static lend_t *lend_find(pp_share_t *s, const void *ptr) {
  pp_assert_held(&s->lock);
#ifdef PINPOOL_MUTANT_LEND_WALK
  /* Mutant (docs/verification.md): every lend walked, as before. */
  pp_lock_visit(&s->lock, s->nlends);
  for (size_t i = 0; i < s->nlends; i++)
    if (s->lends[i].ptr == ptr)
      return &s->lends[i];
  return NULL;
#else
  uint64_t v = pp_index_get(&s->lix, pkey(ptr));
  return v == 0 ? NULL : &s->lends[v - 1];
#endif
}

/* The lend of generation gen, or NULL (lock held). */
static lend_t *lend_of_gen(pp_share_t *s, uint64_t gen) {
  pp_assert_held(&s->lock);
  if (gen == 0)
    return NULL;
#ifdef PINPOOL_MUTANT_LEND_GEN_WALK
  /* Mutant (docs/verification.md): the lends walked by generation, as
   * before (now on the meter). */
  size_t i = 0;
  while (i < s->nlends && s->lends[i].gen != gen)
    i++;
  pp_lock_visit(&s->lock, i + 1);
  return i < s->nlends ? &s->lends[i] : NULL;
#else
  uint64_t v = pp_index_get(&s->gix, gen);
  return v == 0 ? NULL : &s->lends[v - 1];
#endif
}

/* Move lends[from] to lends[to] (an empty place), its index entries along:
 * a lookup by its keys finds from's entries, which still hold from + 1. */
static void lend_move(pp_share_t *s, size_t from, size_t to) {
  s->lends[to] = s->lends[from];
  pp_index_set(&s->lix, pkey(s->lends[to].ptr), to + 1);
  pp_index_set(&s->gix, s->lends[to].gen, to + 1);
}

/* End lend l (lock held): the slot's generation goes to 0 first, so a
 * worker attaching from now on sees a stale handle. */
static void lend_end(pp_share_t *s, lend_t *l) {
  pp_assert_held(&s->lock);
  pp_ctl_slot_t *slot = pp_ctl_slot(l->ck->ctl, l->slot);
  pp_store_release(&slot->gen, 0);
  l->ck->free_slots[l->ck->nfree++] = l->slot;
  peer_t *p = lend_peer(s, l);
  pp_assert(p != NULL);
  if (p != NULL)
    p->nlends--; /* kept without lends until it exits (peers_prune_*) */
  pp_fetch_sub_relaxed(&s->lent_bytes, l->len);
  memset(l->token, 0, sizeof l->token);
  size_t i = (size_t)(l - s->lends), last = --s->nlends;
  pp_index_del(&s->lix, pkey(l->ptr));
  pp_index_del(&s->gix, l->gen);
  /* The last lend fills the hole. A snapshot copying in pieces has copied
   * lends[0, c): the last one, not copied yet, must not land below c, so
   * lends[c - 1] (copied) fills the hole and the last one takes its place,
   * c - 1, where the copy goes on (pp_share_lends_copy). */
  size_t c = s->copying ? s->copy_next : 0;
  if (i < c && last >= c) {
    if (i != c - 1)
      lend_move(s, c - 1, i);
    if (last != c - 1)
      lend_move(s, last, c - 1);
    s->copy_next = c - 1;
  } else if (i != last) {
    lend_move(s, last, i);
  }
  if (s->copy_next > s->nlends)
    s->copy_next = s->nlends;
  pp_store_release(&s->nlent, s->nlends);
}

bool pp_share_is_lent(pp_share_t *s, const void *ptr) {
  if (pp_load_acquire(&s->nlent) == 0)
    return false;
  pp_mutex_lock(&s->lock);
  bool lent = lend_find(s, ptr) != NULL;
  pp_mutex_unlock(&s->lock);
  return lent;
}

void pp_share_counts(pp_share_t *s, uint64_t *blocks, uint64_t *bytes) {
  *blocks = pp_load_relaxed(&s->nlent);
  *bytes = pp_load_relaxed(&s->lent_bytes);
}

uint64_t pp_share_meter(pp_share_t *s, bool reset) {
  return pp_lock_meter(&s->lock, reset);
}

uint64_t pp_share_refusals(pp_share_t *s) {
  return pp_load_relaxed(&s->refusals);
}

/* Lends copied in one hold of the lock, at most (the snapshot's pieces,
 * issue 38: the copy of every lend in one hold stalled every free). */
#define LEND_PIECE 256

int pp_share_lends_copy(pp_share_t *s, pp_lend_view_t **out, size_t *n,
                        uint64_t *hold_ns) {
  /* One copy at a time: lend_end keeps one cursor in order. Lends are
   * copied from lends[0] up, LEND_PIECE a hold; between holds lend_end
   * keeps every lend not copied yet at copy_next or above, so a lend that
   * lives through the copy is listed once, and one lent or ended meanwhile
   * may or may not be (docs/snapshot-format.md). Only lends made before
   * the copy began are listed (their generation), so that a stream of new
   * lends cannot keep it going. */
  pp_mutex_lock(&s->copy_lock);
  pp_lend_view_t *v = NULL;
  size_t k = 0, cap = 0;
  pp_mutex_lock(&s->lock);
  uint64_t gen_end = s->next_gen;
  s->copy_next = 0;
  s->copying = true;
  for (;;) {
    size_t room = s->nlends - s->copy_next;
    if (room > LEND_PIECE)
      room = LEND_PIECE;
    if (room == 0)
      break;
    if (k + room > cap) {
      /* Memory outside the lock; the cursor is kept meanwhile. */
      pp_mutex_unlock(&s->lock);
      size_t want = cap == 0 ? LEND_PIECE : 2 * cap;
      pp_lend_view_t *g = realloc(v, want * sizeof *v);
      pp_mutex_lock(&s->lock);
      if (g == NULL) {
        s->copying = false;
        pp_mutex_unlock(&s->lock);
        pp_mutex_unlock(&s->copy_lock);
        free(v);
        return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory");
      }
      v = g, cap = want;
      continue; /* the lends may have changed: measure again */
    }
    uint64_t t0 = pp_now_ns();
    for (size_t i = s->copy_next; i < s->copy_next + room; i++) {
      const lend_t *l = &s->lends[i];
      if (l->gen >= gen_end)
        continue;
      v[k++] = (pp_lend_view_t){(uintptr_t)l->ptr,
                                l->len,
                                l->ck->id,
                                (uintptr_t)l->ptr - l->ck->base,
                                l->gen,
                                l->peer_pid,
                                l->since_ns,
                                l->since_unix_ns};
    }
    s->copy_next += room;
    pp_lock_visit(&s->lock, room);
#ifndef PINPOOL_MUTANT_LEND_WALK
    /* The next piece in another hold: a free waits for one piece at most. */
    uint64_t dt = pp_now_ns() - t0;
    if (hold_ns != NULL && dt > *hold_ns)
      *hold_ns = dt;
    pp_mutex_unlock(&s->lock);
    pp_hook(PP_HOOK_SNAP_TABLE);
    pp_mutex_lock(&s->lock);
#else
    (void)t0;
    (void)hold_ns;
#endif
  }
  s->copying = false;
  pp_mutex_unlock(&s->lock);
  pp_mutex_unlock(&s->copy_lock);
  *out = v;
  *n = k;
  return 0;
}

static int need_shared(pinpool_t *pool, const char *fn) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "%s: pool is NULL", fn);
  if (pool->share == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "%s: the pool is not shared (create it with shared=1)", fn);
  if (pp_unlikely(pool->forked_cuda))
    return pp_fail(PINPOOL_EFORKED, "%s: a shared pool in a child of fork", fn);
  return 0;
}

/* pinpool_lend and pinpool_lend_pidfd: peer is a pid (by_pidfd false) or a
 * pidfd. */
static int lend(pinpool_t *pool, const char *fn, void *ptr, int peer,
                bool by_pidfd, pinpool_share_handle_t *out, int *fd) {
  int rc = need_shared(pool, fn);
  if (rc != 0)
    return rc;
  if (ptr == NULL || out == NULL || fd == NULL)
    return pp_fail(PINPOOL_EINVAL, "%s: NULL argument", fn);
  if (!by_pidfd && peer <= 0)
    return pp_fail(PINPOOL_EINVAL, "%s: peer %d is not a process id (> 0)", fn,
                   peer);
  if (by_pidfd && peer < 0)
    return pp_fail(PINPOOL_EINVAL, "%s: pidfd %d is not a descriptor", fn,
                   peer);
  size_t bs = 0;
  rc = pinpool_block_size(pool, ptr, &bs);
  if (rc != 0) {
    char why[256];
    pp_error_save(why, sizeof why);
    return pp_fail(rc, "%s: %s", fn, why);
  }
  pp_share_t *s = pool->share;
  pp_mutex_lock(&s->lock);
  pp_schunk_t *c = chunk_of(s, ptr);
  peer_t *p = NULL;
  uint8_t token[16] = {0};
  if (c == NULL || (uintptr_t)ptr + bs - c->base > c->size)
    rc = pp_fail(PINPOOL_ECORRUPT, "%s: block %p is in no chunk", fn,
                 ptr); /* cannot happen: every chunk is a memfd */
  else if (lend_find(s, ptr) != NULL)
    rc = pp_fail(PINPOOL_EBUSY, "%s: block %p is lent already", fn, ptr);
  else if (c->nfree == 0)
    rc = pp_fail(PINPOOL_EBUSY, "%s: chunk %llu has %u blocks lent, its most",
                 fn, (unsigned long long)c->id, c->nslots);
  else if (!lends_room(s))
    rc = pp_fail(PINPOOL_ENOMEM, "%s: out of memory", fn);
  if (rc == 0)
    rc = token_new(s, token);
  /* Last: a record made here is the only thing to undo, and only if it has
   * no lend (below, it gets this one). */
  if (rc == 0)
    rc = by_pidfd ? peer_of_pidfd(s, fn, peer, &p)
                  : peer_of_pid(s, fn, peer, &p);
  if (rc != 0 || p == NULL) {
    pp_mutex_unlock(&s->lock);
    return rc != 0 ? rc : PINPOOL_ECORRUPT;
  }
  uint32_t si = c->free_slots[--c->nfree];
  uint64_t gen = s->next_gen++;
  uint64_t off = (uintptr_t)ptr - c->base;
  pp_ctl_slot_t *slot = pp_ctl_slot(c->ctl, si);
  pp_store_relaxed(&slot->offset, off);
  pp_store_relaxed(&slot->length, (uint64_t)bs);
  pp_store_relaxed(&slot->peer, (uint64_t)p->pid);
  pp_store_release(&slot->gen, gen); /* publishes offset and length */
  p->nlends++;
  lend_t *l = &s->lends[s->nlends++];
  *l = (lend_t){ptr, bs,  c,   si,          p->pid,       p->id,
                p,   gen, {0}, pp_now_ns(), realtime_ns()};
  pp_index_put(&s->lix, pkey(ptr), s->nlends); /* its place + 1 */
  pp_index_put(&s->gix, gen, s->nlends);
  memcpy(l->token, token, sizeof token);
  pp_fetch_add_relaxed(&s->lent_bytes, bs);
  pp_store_release(&s->nlent, s->nlends);
  *out = (pinpool_share_handle_t){.magic = PINPOOL_SHARE_MAGIC,
                                  .version = PINPOOL_SHARE_VERSION,
                                  .nonce = s->nonce,
                                  .owner_pid = s->owner_pid,
                                  .owner_fd = c->fd,
                                  .chunk_id = c->id,
                                  .chunk_size = c->size,
                                  .dev = c->dev,
                                  .ino = c->ino,
                                  .offset = off,
                                  .length = bs,
                                  .generation = gen,
                                  .slot = si,
                                  .owner_ctl_fd = c->ctl_fd,
                                  .ctl_ino = c->ctl_ino};
  memcpy(out->token, token, sizeof token);
  memset(token, 0, sizeof token);
  *fd = c->fd;
  pp_mutex_unlock(&s->lock);
  return 0;
}

int pinpool_lend(pinpool_t *pool, void *ptr, int peer,
                 pinpool_share_handle_t *out, int *fd) {
  return lend(pool, "pinpool_lend", ptr, peer, false, out, fd);
}

int pinpool_lend_pidfd(pinpool_t *pool, void *ptr, int pidfd,
                       pinpool_share_handle_t *out, int *fd) {
  return lend(pool, "pinpool_lend_pidfd", ptr, pidfd, true, out, fd);
}

/* A refused return: counted, nothing else changes. */
static int refuse(pp_share_t *s, int code, const char *fmt, const char *fn,
                  unsigned long long gen) {
  pp_fetch_add_relaxed(&s->refusals, 1);
  return pp_fail(code, fmt, fn, gen);
}

int pinpool_lend_refused(pinpool_t *pool) {
  int rc = need_shared(pool, "pinpool_lend_refused");
  if (rc == 0)
    pp_fetch_add_relaxed(&pool->share->refusals, 1);
  return rc;
}

/* Whether the process a pidfd names (st: its fstat) is p's (lock held).
 * pidfs (Linux 6.9) gives a process one inode for as long as a pidfd of it
 * is open, and p's pidfd keeps it open: any pidfd of p's process, alive, a
 * zombie or reaped (SO_PEERPIDFD of a peer reaped since it connected:
 * Linux 6.16), has that inode; no other process's, and no file elsewhere
 * (the device is pidfs's). */
static bool pidfd_names_peer(const peer_t *p, const struct stat *st) {
  return p->ino != 0 && p->dev == (uint64_t)st->st_dev &&
         p->ino == (uint64_t)st->st_ino;
}

/* pinpool_lend_return (pid > 0, pidst NULL) and pinpool_lend_return_pidfd
 * (pidst: the fstat of the returner's pidfd, a pidfs one; pid unused). */
static int lend_return(pinpool_t *pool, const char *fn,
                       const pinpool_share_handle_t *h, int peer,
                       const struct stat *pidst) {
  pp_share_t *s = pool->share;
  unsigned long long g = (unsigned long long)h->generation;
  int rc = 0;
  if (h->magic != PINPOOL_SHARE_MAGIC || h->version != PINPOOL_SHARE_VERSION ||
      h->nonce != s->nonce)
    return refuse(s, PINPOOL_EBADHANDLE,
                  "%s: not a handle of this pool "
                  "(generation %llu)",
                  fn, g);
  pp_mutex_lock(&s->lock);
  lend_t *l = lend_of_gen(s, h->generation);
  if (l == NULL) {
    rc = refuse(s, PINPOOL_ESTALE,
                "%s: no lend of generation %llu (returned "
                "or reclaimed already)",
                fn, g);
  } else if (l->ck->id != h->chunk_id ||
             (uintptr_t)l->ptr - l->ck->base != h->offset ||
             l->len != h->length || l->slot != h->slot) {
    rc = refuse(s, PINPOOL_EBADHANDLE,
                "%s: the handle of generation %llu does "
                "not describe that lend (forged?)",
                fn, g);
  }
#ifndef PINPOOL_MUTANT_SHARE_NO_TOKEN
  else if (!token_eq(l->token, h->token)) {
    rc = refuse(s, PINPOOL_EPERM,
                "%s: the handle of generation %llu does "
                "not carry its lend's token (forged)",
                fn, g);
  } else {
    peer_t *p = lend_peer(s, l);
    if (pidst != NULL) {
      /* The returner's process itself, alive or not: no pid involved. */
      if (p == NULL || !pidfd_names_peer(p, pidst))
        rc = refuse(s, PINPOOL_EPERM,
                    "%s: the lend of generation %llu was made to another "
                    "process",
                    fn, g);
      else
        lend_end(s, l);
    }
    /* By pid. The borrower alive: its pid names it alone. Exited (a worker
     * that sent its last return and left): accepted while the pid names no
     * other process, or the returner is not known by a pidfd; a process
     * that took the pid and exited too is not told apart (D4 of issue 36:
     * pinpool_lend_return_pidfd is). */
    else if (p == NULL || p->pid != peer)
      rc = refuse(s, PINPOOL_EPERM,
                  "%s: the lend of generation %llu was "
                  "made to another process",
                  fn, g);
    else if (pidfd_exited(p->pidfd) && !exited_peer_is(p, peer))
      rc = refuse(s, PINPOOL_EPERM,
                  "%s: the borrower of generation %llu has "
                  "exited and its pid names another process now (end its "
                  "lends with pinpool_lend_reclaim_exited)",
                  fn, g);
    else
      lend_end(s, l);
  }
#else
  /* Mutant (docs/verification.md): neither token nor peer compared. */
  else {
    (void)token_eq;
    (void)exited_peer_is;
    (void)pidfd_names_peer;
    (void)peer;
    (void)pidst;
    lend_end(s, l);
  }
#endif
  pp_mutex_unlock(&s->lock);
  return rc;
}

int pinpool_lend_return(pinpool_t *pool, const pinpool_share_handle_t *h,
                        int peer) {
  int rc = need_shared(pool, "pinpool_lend_return");
  if (rc != 0)
    return rc;
  if (h == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_lend_return: handle is NULL");
  if (peer <= 0)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_lend_return: peer %d is not a process id (> 0)",
                   peer);
  return lend_return(pool, "pinpool_lend_return", h, peer, NULL);
}

/* pidfs's device (one superblock per kernel), once a pidfd has shown it
 * (fstatfs); 0 before. */
static _Atomic(uint64_t) pidfs_dev;

int pinpool_lend_return_pidfd(pinpool_t *pool, const pinpool_share_handle_t *h,
                              int pidfd) {
  static const char fn[] = "pinpool_lend_return_pidfd";
  int rc = need_shared(pool, fn);
  if (rc != 0)
    return rc;
  if (h == NULL)
    return pp_fail(PINPOOL_EINVAL, "%s: handle is NULL", fn);
  /* pidfs (Linux 6.9): the inode decides, no pid is read. A file of
   * pidfs is told by its device once one pidfd has shown it: a fstat and a
   * fcntl a return, where the ioctl for the pid and a fstatfs made it
   * 8.9 us against 3.1 for a return by pid (docs/benchmarks.md). A
   * thread's pidfd (PIDFD_THREAD, O_EXCL) is not a process's. */
  struct stat st;
  if (pidfd >= 0 && fstat(pidfd, &st) == 0) {
    uint64_t dev = pp_load_relaxed(&pidfs_dev);
    struct statfs fs;
    if (dev == 0 && fstatfs(pidfd, &fs) == 0 && fs.f_type == PIDFS_MAGIC) {
      dev = (uint64_t)st.st_dev;
      pp_store_relaxed(&pidfs_dev, dev);
    }
    if (dev != 0 && dev == (uint64_t)st.st_dev) {
      int fl = fcntl(pidfd, F_GETFL);
      if (fl < 0 || (fl & O_EXCL) != 0)
        return pp_fail(PINPOOL_EINVAL,
                       "%s: descriptor %d is not a process's pidfd", fn, pidfd);
      return lend_return(pool, fn, h, -1, &st);
    }
  }
  int pid = pidfd < 0 ? -2 : pidfd_pid(pidfd);
  if (pid == -2 || pid == -3)
    return pp_fail(PINPOOL_EINVAL, "%s: descriptor %d is not a process's pidfd",
                   fn, pidfd);
  /* No pidfs (Linux < 6.9): two pidfds cannot be compared; the pid rule
   * of pinpool_lend_return, for a returner not reaped yet. */
  if (pid <= 0)
    return pp_fail(PINPOOL_EINVAL,
                   "%s: the process of pidfd %d has been reaped or is outside "
                   "this pid namespace, and this kernel cannot compare "
                   "pidfds (no pidfs, Linux < 6.9)",
                   fn, pidfd);
  return lend_return(pool, fn, h, pid, NULL);
}

/* Whether lend l is selected by (peer, live) (lock held): its peer record
 * has exited, or `live` (the caller ends live lends too); and its pid is
 * peer (> 0) or peer is -1. */
static bool selected(pp_share_t *s, const lend_t *l, int peer, bool live) {
  if (peer > 0 && l->peer_pid != peer)
    return false;
  if (live)
    return true;
  peer_t *p = lend_peer(s, l);
  return p == NULL || pidfd_exited(p->pidfd);
}

/* Lends a reclaim examines in one hold of the lock, at most (issue 38:
 * a reclaim examined every lend in one hold, while every free of the
 * pool waited to ask whether its block is lent). */
#define RECLAIM_PIECE 256

/* End the selected lends, up to cap of them when listing them in ended
 * (may be NULL: then there is no cap, and batches of 64 are freed if
 * asked, outside the lock); then free them if asked.
 *
 * The walk goes down lends[] from the top, RECLAIM_PIECE lends a hold:
 * lends[c, nlends) are examined. Every move in lends[] goes down (lend_end
 * fills a hole with the last lend, or with the snapshot cursor's lend
 * below it), so between two holds a lend not yet examined stays below c,
 * and one examined may come down to be examined again, never missed: every
 * selected lend that lives through the reclaim is ended; one lent or
 * ended meanwhile may or may not be. No shared cursor: reclaims may run
 * at once. */
static int reclaim(pinpool_t *pool, int peer, unsigned flags,
                   pinpool_lend_info_t *ended, size_t cap, size_t *count) {
  pp_share_t *s = pool->share;
  bool live = (flags & PINPOOL_RECLAIM_LIVE) != 0;
  size_t n = 0, c = SIZE_MAX;
  int rc = 0;
  for (;;) {
    pinpool_lend_info_t local[64];
    pinpool_lend_info_t *out = ended != NULL ? ended + n : local;
    size_t room = ended != NULL ? cap - n : 64;
    size_t k = 0, seen = 0;
    pp_mutex_lock(&s->lock);
    if (c > s->nlends)
      c = s->nlends; /* returns meanwhile: the top came down */
#ifdef PINPOOL_MUTANT_RECLAIM_ONE_HOLD
    /* Mutant (docs/verification.md): every lend examined in one hold. */
    while (c > 0 && k < room) {
#else
    while (c > 0 && k < room && seen < RECLAIM_PIECE) {
#endif
      lend_t *l = &s->lends[--c];
      seen++;
      if (!selected(s, l, peer, live))
        continue;
      out[k++] = (pinpool_lend_info_t){l->ptr, l->len, l->gen, l->peer_pid, 0};
      lend_end(s, l); /* the last lend, examined already, comes to c */
    }
    pp_lock_visit(&s->lock, seen);
    bool done = c == 0 || (ended != NULL && k == room);
    pp_mutex_unlock(&s->lock);
    if (done)
      peers_prune_all(s);
    n += k;
    if (flags & PINPOOL_RECLAIM_FREE)
      for (size_t i = 0; i < k; i++) {
        int r = pinpool_free(pool, out[i].ptr);
        if (r != 0 && rc == 0)
          rc = r; /* the owner freed it meanwhile: its own race */
      }
    if (done)
      break;
    pp_hook(PP_HOOK_RECLAIM_PIECE);
  }
  if (count != NULL)
    *count = n;
  return rc;
}

static int reclaim_args(pinpool_t *pool, const char *fn, int peer,
                        unsigned flags) {
  int rc = need_shared(pool, fn);
  if (rc != 0)
    return rc;
  if (peer == 0 || peer < -2)
    return pp_fail(PINPOOL_EINVAL,
                   "%s: peer %d (a process id, or -1 for every peer)", fn,
                   peer);
  if ((flags & ~(PINPOOL_RECLAIM_FREE | PINPOOL_RECLAIM_LIVE)) != 0)
    return pp_fail(PINPOOL_EINVAL, "%s: unknown flags %#x", fn, flags);
  return 0;
}

int pinpool_lend_reclaim(pinpool_t *pool, int peer, unsigned flags,
                         size_t *count) {
  int rc = reclaim_args(pool, "pinpool_lend_reclaim", peer, flags);
  if (rc == 0 && peer == PINPOOL_PEER_EXITED)
    rc = pp_fail(PINPOOL_EINVAL,
                 "pinpool_lend_reclaim: peer %d (a process id, or -1 for "
                 "every peer)",
                 peer);
  if (rc != 0)
    return rc;
  return reclaim(pool, peer, flags, NULL, 0, count);
}

int pinpool_lend_reclaim_exited(pinpool_t *pool, unsigned flags,
                                size_t *count) {
  int rc = need_shared(pool, "pinpool_lend_reclaim_exited");
  if (rc != 0)
    return rc;
  if ((flags & ~PINPOOL_RECLAIM_FREE) != 0)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_lend_reclaim_exited: unknown flags %#x", flags);
  return reclaim(pool, -1, flags, NULL, 0, count);
}

int pinpool_lend_reclaim_list(pinpool_t *pool, int peer, unsigned flags,
                              pinpool_lend_info_t *ended, size_t cap,
                              size_t *count) {
  int rc = reclaim_args(pool, "pinpool_lend_reclaim_list", peer, flags);
  if (rc != 0)
    return rc;
  if (ended == NULL || cap == 0 || count == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_lend_reclaim_list: ended, cap and count are "
                   "needed");
  if (peer == PINPOOL_PEER_EXITED) {
    peer = -1;
    flags &= ~PINPOOL_RECLAIM_LIVE;
  }
  return reclaim(pool, peer, flags, ended, cap, count);
}
