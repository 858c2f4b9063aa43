/*
 * The CUDA memory backends.
 *
 * backend=cuda: cuMemHostAlloc / cuMemFreeHost, flags from cuda_flags. The
 * driver maps, populates and pins in one call (about 0.45 s per GiB).
 *
 * backend=cuda-register: the host backend's mmap, THP and mbind, pages
 * populated by register_threads threads, then cuMemHostRegister. Touching
 * pages in parallel first leaves the driver only the pinning, which is
 * several times faster for large segments; it is also the only way to
 * place pinned memory on a NUMA node.
 *
 * Large segments: one cuMemHostRegister of 512 GiB or more fails on recent
 * drivers, so a segment is registered in pieces of at most register_max
 * bytes (default 64 GiB; a multiple of the segment's page size, so no huge
 * page is split between two registrations), in address order; a piece that
 * fails unregisters the ones before it. The pieces follow from the
 * segment's size alone, so the free unregisters the same pieces. The
 * driver's view of an interior pointer (cuPointerGetAttribute) is the
 * piece's, which is the same memory: attributes do not depend on where a
 * block sits. backend=cuda has no pieces (one cuMemHostAlloc is one
 * range): a segment above register_max is refused there.
 *
 * Called with no pool lock held, from any thread, concurrently (invariant
 * 1): each call pushes the pool's context, so a thread that never used CUDA
 * can allocate.
 */
#include "cuda_driver.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct cuda_ctx {
  const pp_cuda_t *cuda; /* owned by the pool, outlives this backend */
  pp_config_t cfg;       /* immutable copy */
  unsigned alloc_flags;  /* CU_MEMHOSTALLOC_* */
  unsigned reg_flags;    /* CU_MEMHOSTREGISTER_* */
} cuda_ctx_t;

static int cuda_error(const cuda_ctx_t *b, pp_cu_result_t cr, const char *call,
                      size_t size) {
  char err[128];
  return pp_fail(cr == PP_CU_ERROR_OUT_OF_MEMORY ? PINPOOL_ENOMEM
                                                 : PINPOOL_EBACKEND,
                 "%s backend: %s of %zu bytes failed: %s",
                 b->cfg.backend == PP_BACKEND_CUDA ? "cuda" : "cuda-register",
                 call, size, pp_cuda_strerror(b->cuda, cr, err, sizeof err));
}

static int cuda_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  const cuda_ctx_t *b = ctx;
  void *p = NULL;
  if (size > b->cfg.register_max)
    return pp_fail(PINPOOL_ENOMEM,
                   "cuda backend: a segment of %zu bytes is above "
                   "register_max (%llu): one cuMemHostAlloc call that large "
                   "fails on recent drivers; use backend=cuda-register, "
                   "which registers it in pieces",
                   size, (unsigned long long)b->cfg.register_max);
  pp_cu_result_t cr = pp_cuda_push(b->cuda);
  if (cr != PP_CU_SUCCESS)
    return cuda_error(b, cr, "cuCtxPushCurrent before cuMemHostAlloc", size);
  cr = b->cuda->cuMemHostAlloc(&p, size, b->alloc_flags);
  /* The pool promises 4096-byte alignment; the driver pins whole pages and
   * has always returned page-aligned memory, but a segment that broke the
   * promise would corrupt the block arithmetic, so check. */
  if (cr == PP_CU_SUCCESS && ((uintptr_t)p & (PP_PAGE - 1)) != 0) {
    (void)b->cuda->cuMemFreeHost(p);
    pp_cuda_pop(b->cuda);
    return pp_fail(PINPOOL_EBACKEND,
                   "cuda backend: cuMemHostAlloc returned %p, not aligned to "
                   "%u bytes",
                   p, PP_PAGE);
  }
  pp_cuda_pop(b->cuda);
  if (cr != PP_CU_SUCCESS)
    return cuda_error(b, cr, "cuMemHostAlloc", size);
  *flags = PP_SEG_LOCKED;
  *out = p;
  return 0;
}

static void cuda_free(void *ctx, void *ptr, size_t size) {
  const cuda_ctx_t *b = ctx;
  (void)size;
  /* Nothing to report a failure to: the range is forgotten either way. */
  if (pp_cuda_push(b->cuda) != PP_CU_SUCCESS)
    return;
  (void)b->cuda->cuMemFreeHost(ptr);
  pp_cuda_pop(b->cuda);
}

/* Unregister the pieces of [p, p + len): those of a segment of `size`
 * bytes that start below p + len. Context pushed by the caller. */
static void unregister_pieces(const cuda_ctx_t *b, char *p, size_t len) {
  for (size_t off = 0; off < len; off += b->cfg.register_max)
    (void)b->cuda->cuMemHostUnregister(p + off);
}

/* node >= 0 (numa=local): the pages are bound to it before the first touch,
 * then registered; -1: the configured numa_node. */
static int register_alloc_node(void *ctx, void *hint, size_t size, int node,
                               void **out, unsigned *flags) {
  const cuda_ctx_t *b = ctx;
  void *p = NULL;
  unsigned f = 0;
  pp_config_t c = b->cfg;
  if (node >= 0)
    c.numa_node = node;
  (void)hint; /* registrations are per allocation: no runs (pp_provider_t) */
  int rc = pp_host_map(&c, NULL, size, b->cfg.register_threads, NULL, &p, &f);
  if (rc != 0)
    return rc;
  pp_cu_result_t cr = pp_cuda_push(b->cuda);
  if (cr != PP_CU_SUCCESS) {
    pp_host_unmap(&b->cfg, p, size);
    return cuda_error(b, cr, "cuCtxPushCurrent before cuMemHostRegister", size);
  }
  size_t off = 0, piece = 0;
  while (off < size) {
    piece = size - off < b->cfg.register_max ? size - off
                                             : (size_t)b->cfg.register_max;
    /* fault=register:N (tests): the driver refuses, as when it is out of
     * pinnable memory. */
    cr = pp_fault_hit(&b->cfg, PP_FAULT_REGISTER)
             ? PP_CU_ERROR_OUT_OF_MEMORY
             : b->cuda->cuMemHostRegister((char *)p + off, piece, b->reg_flags);
    if (cr != PP_CU_SUCCESS)
      break;
    off += piece;
  }
  if (cr != PP_CU_SUCCESS)
    unregister_pieces(b, p, off); /* the pieces before the failed one */
  pp_cuda_pop(b->cuda);
  if (cr != PP_CU_SUCCESS) {
    pp_host_unmap(&b->cfg, p, size);
    if (size <= b->cfg.register_max)
      return cuda_error(b, cr, "cuMemHostRegister", size);
    char what[96];
    (void)snprintf(what, sizeof what,
                   "cuMemHostRegister of piece %zu (at offset %zu, %zu bytes)",
                   off / (size_t)b->cfg.register_max, off, piece);
    return cuda_error(b, cr, what, size);
  }
  *flags = f | PP_SEG_LOCKED;
  *out = p;
  return 0;
}

static int register_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  return register_alloc_node(ctx, NULL, size, -1, out, flags);
}

static void register_free(void *ctx, void *ptr, size_t size) {
  const cuda_ctx_t *b = ctx;
  /* Unregister first: the driver must stop treating the range as pinned
   * before the pages go back to the kernel. If the context is gone, the
   * mapping is still ours to remove. */
  if (pp_cuda_push(b->cuda) == PP_CU_SUCCESS) {
    unregister_pieces(b, ptr, size);
    pp_cuda_pop(b->cuda);
  }
  pp_host_unmap(&b->cfg, ptr, size);
}

static void cuda_destroy(void *ctx) { free(ctx); }

int pp_backend_cuda_open(const pp_config_t *cfg, pp_cuda_t *cuda,
                         pp_provider_t *out) {
  int rc = pp_cuda_check_config(cfg);
  if (rc != 0)
    return rc;
  bool reg = cfg->backend == PP_BACKEND_CUDA_REGISTER;
  if (!reg && cfg->backend != PP_BACKEND_CUDA)
    return pp_fail(PINPOOL_EINVAL, "cuda backend: backend is not cuda");
  if (reg) {
    if ((rc = PP_CUDA_REQUIRE(cuda, cuMemHostRegister)) != 0 ||
        (rc = PP_CUDA_REQUIRE(cuda, cuMemHostUnregister)) != 0 ||
        (rc = pp_numa_check(cfg->numa_node)) != 0)
      return rc;
  } else if ((rc = PP_CUDA_REQUIRE(cuda, cuMemHostAlloc)) != 0 ||
             (rc = PP_CUDA_REQUIRE(cuda, cuMemFreeHost)) != 0) {
    return rc;
  }
  cuda_ctx_t *b = calloc(1, sizeof *b);
  if (b == NULL)
    return pp_fail(PINPOOL_ENOMEM, "cuda backend: out of memory");
  b->cuda = cuda;
  b->cfg = *cfg;
  b->alloc_flags = cfg->cuda_flags & (PP_CUDA_PORTABLE | PP_CUDA_DEVICEMAP |
                                      PP_CUDA_WRITECOMBINED);
  /* Registered memory is always portable: the pool hands blocks to threads
   * whatever context they use. Write-combining has no register form. */
  b->reg_flags = PP_CU_MEMHOSTREGISTER_PORTABLE |
                 ((cfg->cuda_flags & PP_CUDA_DEVICEMAP)
                      ? (unsigned)PP_CU_MEMHOSTREGISTER_DEVICEMAP
                      : 0u);
  if (reg)
    *out = (pp_provider_t){
        "cuda-register", b,    register_alloc,     register_free,
        cuda_destroy,    NULL, register_alloc_node};
  else
    *out = (pp_provider_t){"cuda",       b,    cuda_alloc, cuda_free,
                           cuda_destroy, NULL, NULL};
  // cppcheck-suppress memleak ; ownership passed to *out (ctx)
  return 0;
}
