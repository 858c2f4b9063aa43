/*
 * Sharing (docs/sharing.md): chunks of a `shared=1` pool backed by memfd,
 * blocks lent to other processes by handle + descriptor.
 *
 * Owner side. Each chunk is a sealed memfd (SHRINK | GROW | SEAL: its size
 * never changes, so no process mapping it can be made to fault with
 * SIGBUS) of the chunk's bytes followed by a control area: a header naming
 * the pool (nonce) and chunk, then one slot per block that may be lent at
 * once. A lend takes a slot and writes the block's offset, length and a
 * generation taken from a pool-wide counter (never 0, never reused); the
 * end of the lend (return or reclaim) stores 0 there. A worker attaching a
 * handle reads the slot: a generation that differs is a stale handle (the
 * lend ended, the block may have been freed and reused since). The owner
 * writes slots; workers map the area read-only.
 *
 * The worker side is share_worker.c.
 *
 * Locking: share->lock is a leaf (no pool lock is taken under it, no
 * provider call is made under it); the worker table has its own lock. The
 * fork handlers take both (fork.c).
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

/* ---- Owner state ------------------------------------------------------- */
struct pp_schunk {
  uintptr_t base;
  size_t size;
  int fd;
  uint64_t id, dev, ino;
  void *ctl;
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
  int peer;
  uint64_t gen;
  uint64_t since_ns;      /* CLOCK_MONOTONIC */
  uint64_t since_unix_ns; /* CLOCK_REALTIME */
} lend_t;
typedef struct peer {
  int pid;
  int pidfd; /* -1: pidfd_open unavailable (kill(pid, 0) instead) */
  size_t nlends;
} peer_t;
struct pp_share {
  pp_mutex_t lock;
  uint64_t nonce; /* immutable */
  int owner_pid;  /* immutable */
  uint64_t next_id, next_gen;
  pp_schunk_t **chunks; /* sorted by base */
  size_t nchunks, cchunks;
  lend_t *lends;
  size_t nlends, clends;
  peer_t *peers;
  size_t npeers, cpeers;
  /* nlends and the bytes lent, readable without the lock (free's check,
   * stats). */
  _Atomic(uint64_t) nlent, lent_bytes;
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
    /* No getrandom: unique enough for identification (not a secret:
     * the fd grant is the boundary, docs/sharing.md). */
    static _Atomic(uint64_t) ctr;
    v = pp_now_ns() ^ ((uint64_t)getpid() << 32) ^ (uintptr_t)&v ^
        (pp_fetch_add_relaxed(&ctr, 1) * 0x9e3779b97f4a7c15ull);
    v |= 1;
  }
  return v;
}

int pp_share_create(pp_share_t **out) {
  pp_share_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory");
  pp_mutex_init(&s->lock);
  s->nonce = random_nonce();
  s->owner_pid = (int)getpid();
  s->next_id = 1;
  s->next_gen = 1;
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
  free(c->free_slots);
  free(c);
}

void pp_share_destroy(pp_share_t *s) {
  if (s == NULL)
    return;
  /* Normally every chunk went back through the provider (pp_arena_fini);
   * in a child of fork the provider was cut off, and the chunks' views and
   * descriptors inherited from the parent are dropped here. */
  for (size_t i = 0; i < s->nchunks; i++)
    chunk_unmap(s->chunks[i]);
  for (size_t i = 0; i < s->npeers; i++)
    if (s->peers[i].pidfd >= 0)
      (void)close(s->peers[i].pidfd);
  free(s->chunks);
  free(s->lends);
  free(s->peers);
  pp_mutex_destroy(&s->lock);
  free(s);
}

void pp_share_fork(pp_share_t *s, int phase) {
  if (phase == PP_FORK_PREPARE)
    pp_mutex_lock(&s->lock);
  else
    pp_mutex_unlock(&s->lock);
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

int pp_share_chunk_new(pp_share_t *s, size_t size, bool huge, void **base,
                       pp_schunk_t **out) {
  pp_schunk_t *c = calloc(1, sizeof *c);
  uint64_t nslots = pp_ctl_slots(size);
  uint32_t *slots = malloc(nslots * sizeof *slots);
  if (c == NULL || slots == NULL) {
    free(c);
    free(slots);
    return pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory");
  }
  c->fd = -1;
  c->free_slots = slots;
  c->nslots = (uint32_t)nslots;
  for (uint32_t i = 0; i < c->nslots; i++)
    slots[i] = c->nslots - 1 - i; /* slot 0 on top */
  c->nfree = c->nslots;
  c->size = size;
  c->ctl_len = pp_ctl_bytes(size);
  c->base = 0; /* mapped below */
  int fd = (int)syscall(SYS_memfd_create, "pinpool-chunk",
                        MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_NOEXEC_SEAL);
  if (fd < 0 && errno == EINVAL) /* before Linux 6.3 */
    fd = (int)syscall(SYS_memfd_create, "pinpool-chunk",
                      MFD_CLOEXEC | MFD_ALLOW_SEALING);
  int rc = 0;
  if (fd < 0) {
    rc = sys_fail(errno, "memfd_create", size);
  } else {
    c->fd = fd;
    struct stat st;
    if (ftruncate(fd, (off_t)(size + c->ctl_len)) != 0)
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
  if (rc == 0) {
    c->base = (uintptr_t)p;
    c->ctl = mmap(NULL, c->ctl_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                  (off_t)size);
    if (c->ctl == MAP_FAILED) {
      c->ctl = NULL;
      rc = sys_fail(errno, "mmap of the control area", size);
    }
  }
  if (rc != 0) {
    chunk_unmap(c); /* base is set only once p is mapped */
    return rc;
  }
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

/* ---- Lends --------------------------------------------------------------- */

static lend_t *lend_find(pp_share_t *s, const void *ptr) {
  pp_assert_held(&s->lock);
  for (size_t i = 0; i < s->nlends; i++)
    if (s->lends[i].ptr == ptr)
      return &s->lends[i];
  return NULL;
}
static peer_t *peer_find(pp_share_t *s, int pid) {
  pp_assert_held(&s->lock);
  for (size_t i = 0; i < s->npeers; i++)
    if (s->peers[i].pid == pid)
      return &s->peers[i];
  return NULL;
}

/* End lend l (lock held): the slot's generation goes to 0 first, so a
 * worker attaching from now on sees a stale handle. */
static void lend_end(pp_share_t *s, lend_t *l) {
  pp_assert_held(&s->lock);
  pp_ctl_slot_t *slot = pp_ctl_slot(l->ck->ctl, l->slot);
  pp_store_release(&slot->gen, 0);
  l->ck->free_slots[l->ck->nfree++] = l->slot;
  peer_t *p = peer_find(s, l->peer);
  if (p != NULL && --p->nlends == 0) {
    if (p->pidfd >= 0)
      (void)close(p->pidfd);
    *p = s->peers[--s->npeers];
  }
  pp_fetch_sub_relaxed(&s->lent_bytes, l->len);
  *l = s->lends[--s->nlends];
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

int pp_share_lends_copy(pp_share_t *s, pp_lend_view_t **out, size_t *n) {
  pp_mutex_lock(&s->lock);
  size_t k = s->nlends;
  pp_lend_view_t *v = k == 0 ? NULL : malloc(k * sizeof *v);
  if (k != 0 && v == NULL) {
    pp_mutex_unlock(&s->lock);
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory");
  }
  for (size_t i = 0; i < k; i++) {
    const lend_t *l = &s->lends[i];
    v[i] = (pp_lend_view_t){(uintptr_t)l->ptr,
                            l->len,
                            l->ck->id,
                            (uintptr_t)l->ptr - l->ck->base,
                            l->gen,
                            l->peer,
                            l->since_ns,
                            l->since_unix_ns};
  }
  pp_mutex_unlock(&s->lock);
  *out = v;
  *n = k;
  return 0;
}

/* Open the peer's record (lock held): a pidfd, so that its death is seen
 * even when its pid is reused. */
static int peer_get(pp_share_t *s, int pid, peer_t **out) {
  pp_assert_held(&s->lock);
  peer_t *p = peer_find(s, pid);
  if (p != NULL) {
    *out = p;
    return 0;
  }
  if (s->npeers == s->cpeers) {
    size_t n = s->cpeers == 0 ? 8 : s->cpeers * 2;
    peer_t *t = realloc(s->peers, n * sizeof *t);
    if (t == NULL)
      return pp_fail(PINPOOL_ENOMEM, "pinpool_lend: out of memory");
    s->peers = t;
    s->cpeers = n;
  }
  int fd = (int)syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    int e = errno;
    if (e == ESRCH)
      return pp_fail(PINPOOL_EINVAL, "pinpool_lend: no process %d", pid);
    if (e == EMFILE || e == ENFILE) {
      struct rlimit rl = {0, 0};
      (void)getrlimit(RLIMIT_NOFILE, &rl);
      return pp_fail(PINPOOL_ELIMIT,
                     "pinpool_lend: pidfd_open for peer %d: %s "
                     "(RLIMIT_NOFILE is %llu descriptors)",
                     pid, strerror(e), (unsigned long long)rl.rlim_cur);
    }
    if (e != ENOSYS && e != EPERM)
      return pp_fail(PINPOOL_EBACKEND, "pinpool_lend: pidfd_open(%d): %s", pid,
                     strerror(e));
    if (kill(pid, 0) != 0 && errno == ESRCH)
      return pp_fail(PINPOOL_EINVAL, "pinpool_lend: no process %d", pid);
    fd = -1; /* older kernel: kill(pid, 0) at reclaim time */
  } else {
    (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  p = &s->peers[s->npeers++];
  *p = (peer_t){pid, fd, 0};
  *out = p;
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

int pinpool_lend(pinpool_t *pool, void *ptr, int peer,
                 pinpool_share_handle_t *out, int *fd) {
  int rc = need_shared(pool, "pinpool_lend");
  if (rc != 0)
    return rc;
  if (ptr == NULL || out == NULL || fd == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_lend: NULL argument");
  if (peer <= 0)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_lend: peer %d is not a process id (> 0)", peer);
  size_t bs = 0;
  rc = pinpool_block_size(pool, ptr, &bs);
  if (rc != 0) {
    char why[256];
    pp_error_save(why, sizeof why);
    return pp_fail(rc, "pinpool_lend: %s", why);
  }
  pp_share_t *s = pool->share;
  pp_mutex_lock(&s->lock);
  pp_schunk_t *c = chunk_of(s, ptr);
  peer_t *p = NULL;
  if (c == NULL || (uintptr_t)ptr + bs - c->base > c->size)
    rc = pp_fail(PINPOOL_ECORRUPT, "pinpool_lend: block %p is in no chunk",
                 ptr); /* cannot happen: every chunk is a memfd */
  else if (lend_find(s, ptr) != NULL)
    rc = pp_fail(PINPOOL_EBUSY, "pinpool_lend: block %p is lent already", ptr);
  else if (c->nfree == 0)
    rc = pp_fail(PINPOOL_EBUSY,
                 "pinpool_lend: chunk %llu has %u blocks lent, its most",
                 (unsigned long long)c->id, c->nslots);
  else if (s->nlends == s->clends) {
    size_t n = s->clends == 0 ? 16 : s->clends * 2;
    lend_t *t = realloc(s->lends, n * sizeof *t);
    if (t == NULL)
      rc = pp_fail(PINPOOL_ENOMEM, "pinpool_lend: out of memory");
    else
      s->lends = t, s->clends = n;
  }
  if (rc == 0)
    rc = peer_get(s, peer, &p);
  if (rc != 0 || p == NULL) {
    pp_mutex_unlock(&s->lock);
    return rc;
  }
  uint32_t si = c->free_slots[--c->nfree];
  uint64_t gen = s->next_gen++;
  uint64_t off = (uintptr_t)ptr - c->base;
  pp_ctl_slot_t *slot = pp_ctl_slot(c->ctl, si);
  pp_store_relaxed(&slot->offset, off);
  pp_store_relaxed(&slot->length, (uint64_t)bs);
  pp_store_relaxed(&slot->peer, (uint64_t)peer);
  pp_store_release(&slot->gen, gen); /* publishes offset and length */
  p->nlends++;
  s->lends[s->nlends++] =
      (lend_t){ptr, bs, c, si, peer, gen, pp_now_ns(), realtime_ns()};
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
                                  .slot = si};
  *fd = c->fd;
  pp_mutex_unlock(&s->lock);
  return 0;
}

int pinpool_lend_return(pinpool_t *pool, const pinpool_share_handle_t *h) {
  int rc = need_shared(pool, "pinpool_lend_return");
  if (rc != 0)
    return rc;
  if (h == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_lend_return: handle is NULL");
  pp_share_t *s = pool->share;
  if (h->magic != PINPOOL_SHARE_MAGIC || h->version != PINPOOL_SHARE_VERSION ||
      h->nonce != s->nonce)
    return pp_fail(PINPOOL_EBADHANDLE,
                   "pinpool_lend_return: not a handle of this pool");
  pp_mutex_lock(&s->lock);
  lend_t *l = NULL;
  for (size_t i = 0; i < s->nlends && l == NULL; i++)
    if (s->lends[i].gen == h->generation)
      l = &s->lends[i];
  if (l == NULL)
    rc = pp_fail(PINPOOL_ESTALE,
                 "pinpool_lend_return: no lend of generation %llu (returned "
                 "or reclaimed already)",
                 (unsigned long long)h->generation);
  else if (l->ck->id != h->chunk_id ||
           (uintptr_t)l->ptr - l->ck->base != h->offset ||
           l->len != h->length || l->slot != h->slot)
    rc = pp_fail(PINPOOL_EBADHANDLE,
                 "pinpool_lend_return: the handle of generation %llu does "
                 "not describe that lend (forged?)",
                 (unsigned long long)h->generation);
  else
    lend_end(s, l);
  pp_mutex_unlock(&s->lock);
  return rc;
}

/* Whether process `p` has exited (lock held). */
static bool peer_exited(const peer_t *p) {
  if (p->pidfd >= 0) {
    struct pollfd pfd = {p->pidfd, POLLIN, 0};
    return poll(&pfd, 1, 0) > 0 && (pfd.revents & (POLLIN | POLLHUP)) != 0;
  }
  return kill(p->pid, 0) != 0 && errno == ESRCH;
}

/* End every lend to `peer` (-1: all); free the blocks if asked. */
static int reclaim(pinpool_t *pool, int peer, unsigned flags, size_t *count) {
  pp_share_t *s = pool->share;
  size_t n = 0;
  int rc = 0;
  for (;;) {
    void *ptr = NULL;
    pp_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->nlends; i++)
      if (peer == -1 || s->lends[i].peer == peer) {
        ptr = s->lends[i].ptr;
        lend_end(s, &s->lends[i]);
        break;
      }
    pp_mutex_unlock(&s->lock);
    if (ptr == NULL)
      break;
    n++;
    if (flags & PINPOOL_RECLAIM_FREE) {
      int r = pinpool_free(pool, ptr);
      if (r != 0 && rc == 0)
        rc = r; /* the owner freed it meanwhile: its own race */
    }
  }
  if (count != NULL)
    *count = n;
  return rc;
}

int pinpool_lend_reclaim(pinpool_t *pool, int peer, unsigned flags,
                         size_t *count) {
  int rc = need_shared(pool, "pinpool_lend_reclaim");
  if (rc != 0)
    return rc;
  if (peer == 0 || peer < -1)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_lend_reclaim: peer %d (a process id, or -1 for "
                   "every peer)",
                   peer);
  if ((flags & ~PINPOOL_RECLAIM_FREE) != 0)
    return pp_fail(PINPOOL_EINVAL, "pinpool_lend_reclaim: unknown flags %#x",
                   flags);
  return reclaim(pool, peer, flags, count);
}

int pinpool_lend_reclaim_exited(pinpool_t *pool, unsigned flags,
                                size_t *count) {
  int rc = need_shared(pool, "pinpool_lend_reclaim_exited");
  if (rc != 0)
    return rc;
  if ((flags & ~PINPOOL_RECLAIM_FREE) != 0)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_lend_reclaim_exited: unknown flags %#x", flags);
  pp_share_t *s = pool->share;
  size_t total = 0;
  for (;;) {
    int dead = 0;
    pp_mutex_lock(&s->lock);
    for (size_t i = 0; i < s->npeers && dead == 0; i++)
      if (peer_exited(&s->peers[i]))
        dead = s->peers[i].pid;
    pp_mutex_unlock(&s->lock);
    if (dead == 0)
      break;
    size_t n = 0;
    int r = reclaim(pool, dead, flags, &n);
    if (r != 0 && rc == 0)
      rc = r;
    total += n;
  }
  if (count != NULL)
    *count = total;
  return rc;
}
