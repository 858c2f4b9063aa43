/*
 * The host backend: anonymous mmap, pages populated up front (in parallel
 * for large segments), optional transparent huge pages, optional mlock with
 * a clean fallback when RLIMIT_MEMLOCK forbids it.
 *
 * Called with no pool lock held (invariant 1): a 1 GiB segment takes
 * hundreds of milliseconds to populate.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

#define HUGE_ALIGN ((size_t)2 << 20)

typedef struct host_ctx {
  pp_config_t cfg; /* immutable copy */
} host_ctx_t;

typedef struct populate_job {
  char *p;
  size_t len;
  pthread_t tid;
  int started;
  int lock; /* populate by mlock */
  int err;  /* populate_range's answer, or mlock's errno */
} populate_job_t;

/* 0, or the errno of a failed populate (ENOMEM: no memory to back it). */
static int populate_range(char *p, size_t len) {
  if (madvise(p, len, MADV_POPULATE_WRITE) == 0)
    return 0;
  if (errno != EINVAL)
    return errno; /* touching would only fault (or be OOM-killed) instead */
  /* Kernels before 5.14: fault each page in by writing to it. The memory is
   * fresh and zero, so writing a zero changes nothing a caller could see. */
  for (size_t off = 0; off < len; off += PP_PAGE)
    ((volatile char *)p)[off] = 0;
  return 0;
}

static void run_job(populate_job_t *j) {
  pp_hook(PP_HOOK_POPULATE_JOB);
  if (j->lock)
    j->err = mlock(j->p, j->len) == 0 ? 0 : errno;
  else
    j->err = populate_range(j->p, j->len);
}

static void *populate_main(void *arg) {
  run_job(arg);
  return NULL;
}

/* 0 or the errno of the first range that failed. lock: populate by
 * locking each range (mlock faults the pages in as it locks them: one pass
 * instead of populating and then walking the pages again to lock them, about
 * 20 % less time per GiB here); an error is then mlock's. */
static int populate(char *p, size_t size, unsigned nt, bool lock) {
  pp_hook(PP_HOOK_POPULATE);
  if (nt <= 1) {
    populate_job_t j = {p, size, 0, 0, lock, 0};
    run_job(&j);
    return j.err;
  }
  if (nt > 64)
    nt = 64;
  populate_job_t jobs[64] = {{0}};
  size_t pages = size / PP_PAGE, per = (pages + nt - 1) / nt;
  for (unsigned i = 0; i < nt; i++) {
    size_t first = (size_t)i * per;
    size_t n = first >= pages ? 0 : (pages - first < per ? pages - first : per);
    jobs[i] = (populate_job_t){p + first * PP_PAGE, n * PP_PAGE, 0, 0, lock, 0};
  }
  /* Job 0 runs on this thread; a thread that cannot start runs inline. */
  for (unsigned i = 1; i < nt; i++) {
    if (jobs[i].len == 0)
      continue;
    if (pthread_create(&jobs[i].tid, NULL, populate_main, &jobs[i]) == 0)
      jobs[i].started = 1;
    else
      run_job(&jobs[i]);
  }
  run_job(&jobs[0]);
  int err = jobs[0].err;
  for (unsigned i = 1; i < nt; i++) {
    if (jobs[i].started)
      (void)pthread_join(jobs[i].tid, NULL);
    if (err == 0)
      err = jobs[i].err;
  }
  return err;
}

/* Threads to populate len bytes with: nthreads from populate_parallel_min
 * up, else one. */
static unsigned populate_nt(const pp_config_t *cfg, size_t len,
                            unsigned nthreads) {
  return len >= cfg->populate_parallel_min ? nthreads : 1u;
}

/* Populating len bytes failed with err: unmap [p, p + map_len), say so. */
static int populate_failed(char *p, size_t map_len, size_t len, int err) {
  (void)munmap(p, map_len);
  return pp_fail(err == ENOMEM ? PINPOOL_ENOMEM : PINPOOL_EBACKEND,
                 "host backend: populating %zu bytes failed: %s", len,
                 strerror(err));
}

/* The pool's accounting must not depend on how a host segment was
 * populated: populate() and mlock() only change residency. */
int pp_numa_check(int node) {
  if (node < 0)
    return 0;
  char path[64];
  (void)snprintf(path, sizeof path, "/sys/devices/system/node/node%d", node);
  /* A kernel without NUMA has no such directory but one node: node 0. */
  if (access(path, F_OK) == 0 ||
      (node == 0 && access("/sys/devices/system/node", F_OK) != 0))
    return 0;
  return pp_fail(PINPOOL_ECONFIG,
                 "config: key 'numa_node': node %d does "
                 "not exist on this machine",
                 node);
}

/* Bind [p, p+size) to one node before the first touch, so populating
 * allocates the pages there. */
static int bind_node(char *p, size_t size, int node) {
  unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
  if (node < 0)
    return 0;
  mask[node / (8 * sizeof(unsigned long))] |=
      1ul << (node % (8 * sizeof(unsigned long)));
  /* MPOL_BIND = 2; maxnode counts bits, plus one (kernel convention). */
  if (syscall(SYS_mbind, p, size, 2, mask, 1024 + 1, 0) != 0 &&
      !(errno == ENOSYS && node == 0))
    return pp_fail(PINPOOL_EBACKEND, "host backend: mbind to node %d: %s", node,
                   strerror(errno));
  return 0;
}

/* [hint, hint + size) mapped, if nothing else is mapped there, else
 * MAP_FAILED. MAP_FIXED_NOREPLACE (Linux 4.17) refuses an occupied range;
 * an older kernel takes it as a plain hint and may map elsewhere, which
 * is undone. */
static char *map_at_hint(void *hint, size_t size) {
#ifdef MAP_FIXED_NOREPLACE
  char *p = mmap(hint, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (p != MAP_FAILED && p != hint) {
    (void)munmap(p, size);
    p = MAP_FAILED;
  }
  return p;
#else
  (void)hint;
  (void)size;
  return MAP_FAILED;
#endif
}

/* Populate [p, p + size) (and lock it, lock_err non-NULL), as pp_host_map
 * says; 0 or the errno of a failed populate (the range is left mapped). */
static int populate_lock(const pp_config_t *cfg, char *p, size_t size,
                         unsigned nthreads, int *lock_err) {
  unsigned nt = populate_nt(cfg, size, nthreads);
  bool locked = false;
  int err = cfg->populate && pp_fault_hit(cfg, PP_FAULT_POPULATE) ? ENOMEM : 0;
  if (err == 0 && lock_err != NULL) {
    /* Lock and populate in one pass. Refused (RLIMIT_MEMLOCK, or injected as
     * EPERM): undo any part that was locked, populate as without mlock. */
    *lock_err =
        pp_fault_hit(cfg, PP_FAULT_MLOCK) ? EPERM : populate(p, size, nt, true);
    locked = *lock_err == 0;
    if (!locked)
      (void)munlock(p, size);
  }
  if (err == 0 && !locked && cfg->populate)
    err = populate(p, size, nt, false);
  return err;
}

/* shared=1: the chunk is a sealed memfd mapped MAP_SHARED (share.c),
 * placed, populated and locked here, in the owner only. No hint: a block
 * must lie in one chunk (one descriptor), so chunks never form runs. */
static int map_shared(const pp_config_t *cfg, size_t size, unsigned nthreads,
                      int *lock_err, void **out, unsigned *flags) {
  void *base = NULL;
  pp_schunk_t *ck = NULL;
  int rc = pp_share_chunk_new(cfg->share, size, cfg->hugepages, &base, &ck);
  if (rc != 0)
    return rc;
  char *p = base;
  if (cfg->hugepages && madvise(p, size, MADV_HUGEPAGE) == 0) {
    *flags |= PP_SEG_HUGE;
    pp_hook(PP_HOOK_HUGE_ADVISED);
  }
  rc = bind_node(p, size, cfg->numa_node);
  if (rc == 0) {
    int err = populate_lock(cfg, p, size, nthreads, lock_err);
    if (err != 0)
      rc = pp_fail(err == ENOMEM ? PINPOOL_ENOMEM : PINPOOL_EBACKEND,
                   "host backend: populating %zu bytes failed: %s", size,
                   strerror(err));
  }
  if (rc == 0)
    rc = pp_share_chunk_publish(cfg->share, ck);
  if (rc != 0) {
    pp_share_chunk_abort(ck);
    return rc;
  }
  *out = p;
  return 0;
}

int pp_host_map(const pp_config_t *cfg, void *hint, size_t size,
                unsigned nthreads, int *lock_err, void **out, unsigned *flags) {
  *flags = 0;
  if (cfg->share != NULL)
    return map_shared(cfg, size, nthreads, lock_err, out, flags);
  bool huge = cfg->hugepages;
  size_t map = huge ? size + HUGE_ALIGN : size;
  char *p = MAP_FAILED;
  if (hint != NULL && (!huge || ((uintptr_t)hint & (HUGE_ALIGN - 1)) == 0)) {
    p = map_at_hint(hint, size);
    if (p != MAP_FAILED) {
      map = size;
      huge = false; /* aligned already: no slack to trim */
    }
  }
  if (p == MAP_FAILED)
    p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
             0);
  else if (cfg->hugepages && madvise(p, size, MADV_HUGEPAGE) == 0) {
    *flags |= PP_SEG_HUGE;
    pp_hook(PP_HOOK_HUGE_ADVISED);
  }
  if (p == MAP_FAILED) {
    int e = errno;
    return pp_fail(e == ENOMEM ? PINPOOL_ENOMEM : PINPOOL_EBACKEND,
                   "host backend: mmap of %zu bytes failed: %s", map,
                   strerror(e));
  }
  if (huge) {
    /* THP needs 2 MiB-aligned ranges: trim the slack on both sides. */
    char *a = (char *)(((uintptr_t)p + HUGE_ALIGN - 1) & ~(HUGE_ALIGN - 1));
    if (a > p)
      (void)munmap(p, (size_t)(a - p));
    size_t tail = (size_t)((p + map) - (a + size));
    if (tail > 0)
      (void)munmap(a + size, tail);
    p = a;
    /* Must come before the first touch, or the pages are already small. */
    if (madvise(p, size, MADV_HUGEPAGE) == 0) {
      *flags |= PP_SEG_HUGE;
      pp_hook(PP_HOOK_HUGE_ADVISED);
    }
  }
  int rc = bind_node(p, size, cfg->numa_node);
  if (rc != 0) {
    (void)munmap(p, size);
    return rc;
  }
  int err = populate_lock(cfg, p, size, nthreads, lock_err);
  if (err != 0)
    return populate_failed(p, size, size, err);
  *out = p;
  return 0;
}

void pp_host_unmap(const pp_config_t *cfg, void *p, size_t size) {
  if (cfg->share != NULL)
    pp_share_chunk_drop(cfg->share, p, size);
  else
    (void)munmap(p, size);
}

static int host_alloc_at(void *ctx, void *hint, size_t size, void **out,
                         unsigned *flags) {
  const host_ctx_t *h = ctx;
  char *p = NULL;
  int lock_err = 0;
  bool lock = h->cfg.mlock != PP_MLOCK_OFF;
  int rc = pp_host_map(&h->cfg, hint, size, h->cfg.populate_threads,
                       lock ? &lock_err : NULL, (void **)&p, flags);
  if (rc != 0)
    return rc;
  if (lock) {
    if (lock_err == 0) {
      *flags |= PP_SEG_LOCKED;
    } else {
      int e = lock_err;
      if (h->cfg.mlock == PP_MLOCK_REQUIRE) {
        struct rlimit rl = {0, 0};
        (void)getrlimit(RLIMIT_MEMLOCK, &rl);
        pp_host_unmap(&h->cfg, p, size);
        return pp_fail(PINPOOL_ENOMEM,
                       "host backend: mlock of %zu bytes failed (%s); "
                       "RLIMIT_MEMLOCK is %llu bytes and mlock=require",
                       size, strerror(e), (unsigned long long)rl.rlim_cur);
      }
      *flags |= PP_SEG_LOCK_FAILED;
      /* backend=auto promised pinned memory: say that this chunk is not. */
      struct rlimit rl = {0, 0};
      (void)getrlimit(RLIMIT_MEMLOCK, &rl);
      pp_pin_warn(&h->cfg,
                  "pinpool: backend=auto: mlock of a %zu-byte chunk failed "
                  "(%s; RLIMIT_MEMLOCK is %llu bytes): the chunk is NOT "
                  "page-locked (pageable). Fix: raise the limit (`ulimit -l "
                  "unlimited`; LimitMEMLOCK=infinity in a systemd unit; "
                  "`docker run --ulimit memlock=-1`) or lower max_reserved "
                  "(docs/configuration.md, \"backend=auto\").",
                  size, strerror(e), (unsigned long long)rl.rlim_cur);
    }
  }
  *out = p;
  return 0;
}

/* numa=local: as alloc_at, bound to `node` instead of cfg.numa_node. */
static int host_alloc_node(void *ctx, void *hint, size_t size, int node,
                           void **out, unsigned *flags) {
  host_ctx_t h = *(const host_ctx_t *)ctx;
  h.cfg.numa_node = node;
  return host_alloc_at(&h, hint, size, out, flags);
}

static void host_free(void *ctx, void *ptr, size_t size) {
  const host_ctx_t *h = ctx;
  /* munmap drops any mlock with the mapping. */
  pp_host_unmap(&h->cfg, ptr, size);
}

static int host_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  return host_alloc_at(ctx, NULL, size, out, flags);
}

static void host_destroy(void *ctx) { free(ctx); }

int pp_backend_host_open(const pp_config_t *cfg, pp_provider_t *out) {
  host_ctx_t *h = malloc(sizeof *h);
  if (h == NULL)
    return pp_fail(PINPOOL_ENOMEM, "host backend: out of memory");
  h->cfg = *cfg;
  out->name = "host";
  out->ctx = h; /* freed by host_destroy */
  out->alloc = host_alloc;
  out->free = host_free;
  out->destroy = host_destroy;
  /* A shared pool's blocks never cross chunks (one descriptor each), and
   * its chunks are memfds (numa=local is refused with shared=1). */
  out->alloc_at = cfg->share != NULL ? NULL : host_alloc_at;
  out->alloc_node = cfg->share != NULL ? NULL : host_alloc_node;
  return 0;
}
