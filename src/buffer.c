/*
 * Buffers: reference-counted handles to one block, with lazily initialized
 * memory attributes and exports (pinpool.h, "Buffers").
 *
 * One atomic word holds everything that decides a buffer's lifetime:
 *
 *   bits  0..30  references
 *   bits 31..61  exports (consumers' holds, and the short internal holds of
 *                record_stream and attribute queries)
 *   bit  62      CLOSED: no new export; the block goes back when exports == 0
 *   bit  63      BLOCK: the block has not been given back to the pool yet
 *
 * Every change is one compare-and-swap (acq_rel) on that word, so every
 * thread agrees on the order of retains, releases, exports and closes. Two
 * conditions are sticky once true and are acted on by the one thread whose
 * CAS made them true:
 *
 *   block due   CLOSED and exports == 0      -> pinpool_free, clear BLOCK
 *   struct due  refs == 0, exports == 0, and BLOCK clear -> free the handle
 *
 * So two threads dropping the last reference and the last export at once
 * cannot both free (or both skip) the block, an export cannot slip in after
 * a close (it would have to CAS a word with CLOSED set), and the handle is
 * freed only after its block is back in the pool (BLOCK is cleared after
 * pinpool_free returns). The last reference closes the buffer.
 *
 * Attributes known at allocation are written before the buffer is
 * published and never again. The others (NUMA node of the pages, huge
 * pages, the driver's view of a CUDA pool's memory) are computed by the
 * first query: a three-state flag (UNINIT -> BUSY by CAS, BUSY -> READY by
 * a release store after the result is written; losers wait until READY,
 * or retry the CAS when a failed query put it back to UNINIT).
 * tests/mutants builds this file with the flag (ATTR_FLAG_PLAIN) or the
 * export count (EXPORT_COUNT_PLAIN) as plain fields; ThreadSanitizer
 * reports both under the hammer's "buffers" part.
 */
#include "internal.h"

#include "cuda_driver.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define B_REF ((uint64_t)1)
#define B_REFS ((uint64_t)0x7fffffff)
#define B_EXP_SHIFT 31
#define B_EXP ((uint64_t)1 << B_EXP_SHIFT)
#define B_EXPS (B_REFS << B_EXP_SHIFT)
#define B_CLOSED ((uint64_t)1 << 62)
#define B_BLOCK ((uint64_t)1 << 63)

#define B_NREFS(w) ((w)&B_REFS)
#define B_NEXPS(w) (((w)&B_EXPS) >> B_EXP_SHIFT)

enum { ATTR_UNINIT = 0, ATTR_BUSY = 1, ATTR_READY = 2 };

/* Which attributes the first query computes. */
enum { LAZY_DEVICE = 1u << 0, LAZY_NUMA = 1u << 1, LAZY_HUGE = 1u << 2 };

typedef struct lazy_attrs {
  int device_accessible;
  int device_id;
  int numa_node;
  int huge_pages;
} lazy_attrs_t;

struct pinpool_buffer {
  /* Immutable after pinpool_buffer_alloc returns. */
  pinpool_t *pool; /* holds a pool reference (pp_pool_ref) */
  void *ptr;
  size_t size;      /* block size */
  size_t requested; /* size asked for */
  unsigned lazy;    /* LAZY_* still to compute on the first query */
  pinpool_mem_attrs_t known;

  _Atomic(uint64_t) state; /* the word described above */

  /* Written once by the thread that moved attr_state to BUSY, before its
   * release store of READY; read only after an acquire load of READY. */
  _Atomic(int) attr_state;
  lazy_attrs_t computed;
};

static bool block_due(uint64_t w) { return (w & B_CLOSED) && B_NEXPS(w) == 0; }

static bool struct_due(uint64_t w) {
  return B_NREFS(w) == 0 && B_NEXPS(w) == 0 && !(w & B_BLOCK);
}

static bool cas_state(pinpool_buffer_t *b, uint64_t *old, uint64_t desired) {
  return pp_cas_acq_rel(&b->state, old, desired);
}

static void free_handle(pinpool_buffer_t *b) {
  pinpool_t *pool = b->pool;
  free(b);
  pp_pool_unref(pool); /* may tear the pool down: after pinpool_destroy */
}

/* Act on the transition old -> new that this thread's CAS made. */
static void settle(pinpool_buffer_t *b, uint64_t old, uint64_t nw) {
  if (!block_due(old) && block_due(nw)) {
    /* Cannot fail for a block we own, except for want of memory for this
     * thread's first cache of the pool: the block then stays allocated and
     * counted (stats show it), which is safe. Not PINPOOL_EBUSY: a release
     * from a callback inside another pinpool call (a backend free during a
     * fork: rv37e's d4) is a nested call, which needs no thread cache
     * (alloc.c, "Nested calls"). Stream-ordered when streams were
     * recorded. */
    (void)pinpool_free(b->pool, b->ptr);
    old = atomic_fetch_and_explicit(&b->state, ~B_BLOCK, memory_order_acq_rel);
    nw = old & ~B_BLOCK;
  }
  if (!struct_due(old) && struct_due(nw))
    free_handle(b);
}

/* ---- Exports and internal holds ----------------------------------------- */

/* Take an export-like hold: fails with EBUSY once closed. */
static int hold_acquire(pinpool_buffer_t *b, const char *fn) {
#ifdef PINPOOL_MUTANT_EXPORT_COUNT_PLAIN
  /* Race mutant (docs/verification.md): the export count as a plain
   * integer, read and written without an atomic read-modify-write. */
  uint64_t *plain = (uint64_t *)&b->state;
  uint64_t w = *plain;
  if (w & B_CLOSED)
    return pp_fail(PINPOOL_EBUSY, "%s: the buffer is closed", fn);
  *plain = w + B_EXP;
  return 0;
#else
  uint64_t w = pp_load_relaxed(&b->state);
  do {
    if (w & B_CLOSED)
      return pp_fail(PINPOOL_EBUSY, "%s: the buffer is closed", fn);
    if (B_NEXPS(w) == B_REFS)
      return pp_fail(PINPOOL_EOVERFLOW, "%s: too many exports", fn);
  } while (!cas_state(b, &w, w + B_EXP));
  return 0;
#endif
}

static void hold_release(pinpool_buffer_t *b) {
#ifdef PINPOOL_MUTANT_EXPORT_COUNT_PLAIN
  uint64_t *plain = (uint64_t *)&b->state;
  uint64_t w = *plain;
  *plain = w - B_EXP;
  settle(b, w, w - B_EXP);
#else
  uint64_t w =
      atomic_fetch_sub_explicit(&b->state, B_EXP, memory_order_acq_rel);
  settle(b, w, w - B_EXP);
#endif
}

/* ---- Attributes --------------------------------------------------------- */

#define PP_MPOL_F_NODE (1 << 0)
#define PP_MPOL_F_ADDR (1 << 1)

/* Node of the page holding p: >= 0; -1 if unknowable here (no NUMA
 * syscalls); -2 if the page is not resident yet (ask again later). */
static int numa_node_of(const void *p) {
  uintptr_t page = (uintptr_t)p & ~(uintptr_t)(PP_PAGE - 1);
  unsigned char vec = 0;
  if (mincore((void *)page, PP_PAGE, &vec) != 0 || !(vec & 1))
    return -2;
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, NULL, 0UL, (void *)page,
              PP_MPOL_F_NODE | PP_MPOL_F_ADDR) != 0)
    return -1; /* ENOSYS, EPERM (seccomp): no NUMA information */
  return node;
}

/* Size in kB of a smaps field line "Name:   123 kB", or -1. */
static long smaps_kb(const char *line, const char *name) {
  size_t n = strlen(name);
  if (strncmp(line, name, n) != 0)
    return -1;
  return strtol(line + n, NULL, 10);
}

/* Fallback for kernels before 6.7: 1 if the mapping holding p has huge
 * pages, 0 if not, -1 unknown. Reads /proc/self/smaps up to that mapping
 * (the kernel walks the page tables of every mapping it prints: about
 * 0.3 ms in a small process). */
static int huge_pages_smaps(const void *p) {
  FILE *f = fopen("/proc/self/smaps", "re");
  if (f == NULL)
    return -1;
  char line[512];
  bool inside = false;
  int huge = -1;
  uintptr_t a = (uintptr_t)p;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long lo = 0, hi = 0;
    int end = 0;
    /* Header lines start with "lo-hi "; field lines with "Name:". */
    if (sscanf(line, "%lx-%lx%n", &lo, &hi, &end) == 2 && line[end] == ' ') {
      if (inside)
        break; /* the next mapping: done */
      inside = a >= lo && a < hi;
      if (inside)
        huge = 0;
      continue;
    }
    if (!inside)
      continue;
    long kb = smaps_kb(line, "AnonHugePages:");
    if (kb < 0)
      kb = smaps_kb(line, "ShmemPmdMapped:");
    if (kb > 0)
      huge = 1;
    kb = smaps_kb(line, "KernelPageSize:");
    if (kb > 4)
      huge = 1; /* hugetlbfs */
  }
  (void)fclose(f);
  return huge;
}

/* PAGEMAP_SCAN (Linux 6.7, <linux/fs.h>): the categories of a range of
 * pages, without privileges. Declared here for older headers. */
typedef struct pp_page_region {
  uint64_t start, end, categories;
} pp_page_region_t;
typedef struct pp_pm_scan_arg {
  uint64_t size, flags, start, end, walk_end, vec, vec_len, max_pages;
  uint64_t category_inverted, category_mask, category_anyof_mask;
  uint64_t return_mask;
} pp_pm_scan_arg_t;
#define PP_PAGEMAP_SCAN _IOWR('f', 16, pp_pm_scan_arg_t)
#define PP_PAGE_IS_PRESENT (1u << 3)
#define PP_PAGE_IS_HUGE (1u << 6)

/* Huge pages under the block's first page: 1 (a transparent huge page or
 * hugetlb page maps it), 0 (a base page does), -2 (no page there yet: ask
 * again later), -1 (unknown). */
static int huge_pages_of(const void *p) {
  uintptr_t page = (uintptr_t)p & ~(uintptr_t)(PP_PAGE - 1);
  int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -1;
  pp_page_region_t r = {0, 0, 0};
  pp_pm_scan_arg_t arg;
  memset(&arg, 0, sizeof arg);
  arg.size = sizeof arg;
  arg.start = page;
  arg.end = page + PP_PAGE;
  arg.vec = (uint64_t)(uintptr_t)&r;
  arg.vec_len = 1;
  arg.return_mask = PP_PAGE_IS_PRESENT | PP_PAGE_IS_HUGE;
  long n = ioctl(fd, PP_PAGEMAP_SCAN, &arg);
  int err = errno;
  (void)close(fd);
  if (n < 0)
    return err == ENOTTY || err == EINVAL ? huge_pages_smaps(p) : -1;
  if (n == 0 || !(r.categories & PP_PAGE_IS_PRESENT))
    return -2;
  return (r.categories & PP_PAGE_IS_HUGE) ? 1 : 0;
}

/* cuPointerGetAttribute and its attribute codes (cuda.h). */
typedef pp_cu_result_t (*pp_cu_ptr_attr_fn)(void *data, int attribute,
                                            unsigned long long ptr);
enum {
  PP_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2,
  PP_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9,
  PP_CU_MEMORYTYPE_HOST = 1,
};

/* The driver's view of the block: 0, or PINPOOL_EBACKEND (retry later). */
static int device_attrs_of(const pinpool_buffer_t *b, int *accessible,
                           int *id) {
  const pp_cuda_t *cuda = b->pool->cuda;
  int backend = b->pool->cfg.backend;
  bool pinned =
      backend == PP_BACKEND_CUDA || backend == PP_BACKEND_CUDA_REGISTER;
  /* Without the entry point: what the configuration says. */
  *accessible = pinned ? 1 : backend == PP_BACKEND_USER ? -1 : 0;
  *id = pinned ? b->pool->cfg.device : -1;
  pp_cu_ptr_attr_fn query =
      (pp_cu_ptr_attr_fn)(uintptr_t)dlsym(cuda->lib, "cuPointerGetAttribute");
  if (query == NULL)
    return 0;
  pp_cu_result_t cr = pp_cuda_push(cuda);
  if (cr != PP_CU_SUCCESS)
    return pp_fail(PINPOOL_EBACKEND,
                   "pinpool_buffer_attrs: cannot make the pool's CUDA "
                   "context current (CUDA error %d)",
                   cr);
  unsigned type = 0;
  int ordinal = -1;
  unsigned long long p = (unsigned long long)(uintptr_t)b->ptr;
  cr = query(&type, PP_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
  int rc = 0;
  if (cr == PP_CU_ERROR_INVALID_VALUE) {
    *accessible = 0; /* not registered with the driver */
    *id = -1;
  } else if (cr != PP_CU_SUCCESS) {
    rc = pp_fail(PINPOOL_EBACKEND,
                 "pinpool_buffer_attrs: cuPointerGetAttribute: CUDA error %d",
                 cr);
  } else {
    *accessible = 1; /* host memory known to the driver, or device memory */
    if (query(&ordinal, PP_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) ==
        PP_CU_SUCCESS)
      *id = ordinal;
  }
  pp_cuda_pop(cuda);
  return rc;
}

/* Compute the lazy attributes into *out. 0 when complete (cache them),
 * 1 when complete for now but worth asking again (no resident page yet),
 * or a negative error. */
static int lazy_compute(const pinpool_buffer_t *b, lazy_attrs_t *out) {
  lazy_attrs_t a = {b->known.device_accessible, b->known.device_id,
                    b->known.numa_node, b->known.huge_pages};
  *out = a;
  int again = 0;
  if (b->lazy & LAZY_DEVICE) {
    int rc = device_attrs_of(b, &a.device_accessible, &a.device_id);
    if (rc != 0)
      return rc < 0 ? rc : PINPOOL_EBACKEND;
  }
  if (b->lazy & LAZY_NUMA) {
    a.numa_node = numa_node_of(b->ptr);
    if (a.numa_node == -2) {
      a.numa_node = -1;
      again = 1;
    }
  }
  if (b->lazy & LAZY_HUGE) {
    a.huge_pages = huge_pages_of(b->ptr);
    if (a.huge_pages == -2) {
      a.huge_pages = -1;
      again = 1;
    }
  }
  *out = a;
  return again;
}

#ifdef PINPOOL_MUTANT_ATTR_FLAG_PLAIN
/* Race mutant (docs/verification.md): the lazy-attribute flag as a plain
 * field (cuda-python's Buffer before NVIDIA/cuda-python#2216). */
#define attr_load(b) (*(int *)&(b)->attr_state)
#define attr_store(b, v) ((void)(*(int *)&(b)->attr_state = (v)))
static bool attr_begin(pinpool_buffer_t *b, int *expected) {
  if (attr_load(b) != *expected) {
    *expected = attr_load(b);
    return false;
  }
  attr_store(b, ATTR_BUSY);
  return true;
}
#else
#define attr_load(b) pp_load_acquire(&(b)->attr_state)
#define attr_store(b, v) pp_store_release(&(b)->attr_state, (v))
static bool attr_begin(pinpool_buffer_t *b, int *expected) {
  return pp_cas_acq_rel(&b->attr_state, expected, ATTR_BUSY);
}
#endif

/* A thread that finds another computing the attributes sleeps on the state
 * word (a futex) instead of spinning: the computation makes system calls
 * (move_pages, the driver) and may take a while. A spurious or missed wake
 * costs nothing but a loop: the wait returns at once unless the word is
 * still BUSY, and the computer wakes every waiter after each change away
 * from BUSY. */
static void attr_wait(pinpool_buffer_t *b) {
  (void)syscall(SYS_futex, (int *)&b->attr_state, FUTEX_WAIT_PRIVATE, ATTR_BUSY,
                NULL, NULL, 0);
}

static void attr_done(pinpool_buffer_t *b, int state) {
  attr_store(b, state);
  (void)syscall(SYS_futex, (int *)&b->attr_state, FUTEX_WAKE_PRIVATE, INT_MAX,
                NULL, NULL, 0);
}

static void fill_attrs(const pinpool_buffer_t *b, const lazy_attrs_t *l,
                       pinpool_mem_attrs_t *out) {
  *out = b->known;
  out->device_accessible = l->device_accessible;
  out->device_id = l->device_id;
  out->numa_node = l->numa_node;
  out->huge_pages = l->huge_pages;
}

int pinpool_buffer_attrs(pinpool_buffer_t *buf, pinpool_mem_attrs_t *out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_attrs: NULL argument");
  if (buf->lazy == 0) {
    *out = buf->known;
    return 0;
  }
  for (;;) {
    int st = attr_load(buf);
    if (st == ATTR_READY) {
      fill_attrs(buf, &buf->computed, out);
      return 0;
    }
    if (st == ATTR_BUSY) { /* another thread computes: wait for it */
      attr_wait(buf);
      continue;
    }
    int expected = ATTR_UNINIT;
    if (!attr_begin(buf, &expected))
      continue;
    pp_hook(PP_HOOK_ATTR_BUSY);
    /* Ours to compute. Hold the block so that a concurrent close cannot
     * give it back (and the pool release its pages) while we look. */
    int rc = hold_acquire(buf, "pinpool_buffer_attrs");
    if (rc != 0) {
      attr_done(buf, ATTR_UNINIT);
      return rc;
    }
    lazy_attrs_t l;
    rc = lazy_compute(buf, &l);
    if (rc >= 0)
      fill_attrs(buf, &l, out);
    if (rc == 0) {
      buf->computed = l;
      attr_done(buf, ATTR_READY); /* publishes `computed` */
    } else {
      attr_done(buf, ATTR_UNINIT); /* failed or incomplete: retry later */
    }
    hold_release(buf); /* last: the caller's reference keeps buf */
    return rc < 0 ? rc : 0;
  }
}

/* ---- Allocation and references ------------------------------------------ */

static void init_known(pinpool_buffer_t *b, unsigned seg_flags) {
  pinpool_t *pool = b->pool;
  const pp_config_t *cfg = &pool->cfg;
  pinpool_mem_attrs_t *k = &b->known;
  k->host_accessible = 1;
  k->page_locked = (seg_flags & PP_SEG_LOCKED) ? 1 : 0;
  k->huge_advised = (seg_flags & PP_SEG_HUGE) ? 1 : 0;
  k->backend = pool->backend_name;
  k->huge_pages = -1;
  b->lazy = LAZY_HUGE;
  if (cfg->numa_node >= 0 && (cfg->backend == PP_BACKEND_HOST ||
                              cfg->backend == PP_BACKEND_CUDA_REGISTER)) {
    k->numa_node = cfg->numa_node; /* bound with mbind before first touch */
  } else {
    k->numa_node = -1;
    b->lazy |= LAZY_NUMA;
  }
  k->device_accessible = cfg->backend == PP_BACKEND_USER ? -1 : 0;
  k->device_id = -1;
  if (pool->cuda != NULL)
    b->lazy |= LAZY_DEVICE;
}

int pinpool_buffer_alloc(pinpool_t *pool, size_t size, pinpool_buffer_t **out) {
  if (pool == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_alloc: pool or out is NULL");
  pinpool_buffer_t *b = calloc(1, sizeof *b);
  if (b == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_buffer_alloc: out of memory");
  void *p = NULL;
  int rc = pinpool_alloc(pool, size, &p);
  if (rc != 0) {
    free(b);
    return rc;
  }
  /* The block is ours (we just took it), so its segment is live and its
   * descriptor's fields, written before the segment was published, are
   * stable. */
  pp_segment_t *seg = pp_segmap_find(pool->map, (uintptr_t)p);
  pp_assert(seg != NULL);
  b->pool = pool;
  b->ptr = p;
  b->size = seg != NULL ? pp_load_relaxed(&seg->block_size) : size;
  b->requested = size;
  init_known(b, seg != NULL ? seg->flags : 0);
  atomic_init(&b->state, B_REF | B_BLOCK);
  atomic_init(&b->attr_state, ATTR_UNINIT);
  pp_pool_ref(pool);
  *out = b;
  return 0;
}

int pinpool_buffer_retain(pinpool_buffer_t *buf) {
  if (buf == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_retain: buf is NULL");
  uint64_t w = pp_load_relaxed(&buf->state);
  do {
    if (B_NREFS(w) == 0)
      return pp_fail(PINPOOL_EINVAL,
                     "pinpool_buffer_retain: no reference left to retain");
    if (B_NREFS(w) == B_REFS)
      return pp_fail(PINPOOL_EOVERFLOW,
                     "pinpool_buffer_retain: too many references");
  } while (!cas_state(buf, &w, w + B_REF));
  return 0;
}

int pinpool_buffer_release(pinpool_buffer_t *buf) {
  if (buf == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_release: buf is NULL");
  uint64_t w = pp_load_relaxed(&buf->state), nw;
  do {
    if (B_NREFS(w) == 0)
      return pp_fail(PINPOOL_EINVAL,
                     "pinpool_buffer_release: no reference left to release");
    nw = w - B_REF;
    if (B_NREFS(nw) == 0)
      nw |= B_CLOSED; /* the last reference closes */
  } while (!cas_state(buf, &w, nw));
  settle(buf, w, nw);
  return 0;
}

int pinpool_buffer_close(pinpool_buffer_t *buf) {
  if (buf == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_close: buf is NULL");
  uint64_t w = pp_load_relaxed(&buf->state);
  do {
    if (w & B_CLOSED)
      return 0; /* once only */
  } while (!cas_state(buf, &w, w | B_CLOSED));
  settle(buf, w, w | B_CLOSED);
  return 0;
}

int pinpool_buffer_record_stream(pinpool_buffer_t *buf,
                                 pinpool_stream_t stream) {
  if (buf == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_record_stream: buf is NULL");
  int rc = hold_acquire(buf, "pinpool_buffer_record_stream");
  if (rc != 0)
    return rc;
  rc = pinpool_record_stream(buf->pool, buf->ptr, stream);
  hold_release(buf); /* may free the block: after the stream is recorded */
  return rc;
}

/* ---- Accessors ------------------------------------------------------------
 */

int pinpool_buffer_ptr(const pinpool_buffer_t *buf, void **out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_ptr: NULL argument");
  *out = buf->ptr;
  return 0;
}

int pinpool_buffer_size(const pinpool_buffer_t *buf, size_t *out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_size: NULL argument");
  *out = buf->size;
  return 0;
}

int pinpool_buffer_requested_size(const pinpool_buffer_t *buf, size_t *out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_buffer_requested_size: NULL argument");
  *out = buf->requested;
  return 0;
}

int pinpool_buffer_pool(const pinpool_buffer_t *buf, pinpool_t **out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_pool: NULL argument");
  *out = buf->pool;
  return 0;
}

int pinpool_buffer_exports(const pinpool_buffer_t *buf, size_t *out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_exports: NULL argument");
  /* const object, atomic member: the load does not modify it. */
  uint64_t w = pp_load_acquire((_Atomic(uint64_t) *)&buf->state);
  *out = (size_t)B_NEXPS(w);
  return 0;
}

int pinpool_buffer_closed(const pinpool_buffer_t *buf, int *out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_closed: NULL argument");
  uint64_t w = pp_load_acquire((_Atomic(uint64_t) *)&buf->state);
  *out = (w & B_CLOSED) ? 1 : 0;
  return 0;
}

/* ---- Exports --------------------------------------------------------------
 */

int pinpool_buffer_export(pinpool_buffer_t *buf, unsigned flags,
                          const pinpool_export_t **out) {
  if (buf == NULL || out == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_export: NULL argument");
  if (flags & ~PINPOOL_EXPORT_READONLY)
    return pp_fail(PINPOOL_EINVAL, "pinpool_buffer_export: unknown flags %#x",
                   flags);
  /* The descriptor first: once the hold is taken we must not fail. */
  pinpool_export_t *e = malloc(sizeof *e);
  if (e == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_buffer_export: out of memory");
  int rc = hold_acquire(buf, "pinpool_buffer_export");
  if (rc != 0) {
    free(e);
    return rc;
  }
  e->ptr = buf->ptr;
  e->size = buf->requested;
  e->readonly = (flags & PINPOOL_EXPORT_READONLY) ? 1 : 0;
  e->ndim = 1;
  e->shape[0] = (int64_t)buf->requested;
  e->strides[0] = 1;
  e->buffer = buf;
  *out = e;
  return 0;
}

int pinpool_export_release(const pinpool_export_t *exp) {
  if (exp == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_export_release: exp is NULL");
  pinpool_buffer_t *b = exp->buffer;
  free((void *)(uintptr_t)exp);
  hold_release(b);
  return 0;
}
