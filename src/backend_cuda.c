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

static int register_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  const cuda_ctx_t *b = ctx;
  void *p = NULL;
  unsigned f = 0;
  int rc = pp_host_map(&b->cfg, size, b->cfg.register_threads, NULL, &p, &f);
  if (rc != 0)
    return rc;
  pp_cu_result_t cr = pp_cuda_push(b->cuda);
  if (cr == PP_CU_SUCCESS) {
    /* fault=register:N (tests): the driver refuses, as when it is out of
     * pinnable memory. */
    cr = pp_fault_hit(&b->cfg, PP_FAULT_REGISTER)
             ? PP_CU_ERROR_OUT_OF_MEMORY
             : b->cuda->cuMemHostRegister(p, size, b->reg_flags);
    pp_cuda_pop(b->cuda);
  }
  if (cr != PP_CU_SUCCESS) {
    pp_host_unmap(p, size);
    return cuda_error(b, cr, "cuMemHostRegister", size);
  }
  *flags = f | PP_SEG_LOCKED;
  *out = p;
  return 0;
}

static void register_free(void *ctx, void *ptr, size_t size) {
  const cuda_ctx_t *b = ctx;
  /* Unregister first: the driver must stop treating the range as pinned
   * before the pages go back to the kernel. If the context is gone, the
   * mapping is still ours to remove. */
  if (pp_cuda_push(b->cuda) == PP_CU_SUCCESS) {
    (void)b->cuda->cuMemHostUnregister(ptr);
    pp_cuda_pop(b->cuda);
  }
  pp_host_unmap(ptr, size);
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
  /* No remap: the driver knows pinned memory by its address range (a
   * registration, or its own allocation), which mremap would move. */
  if (reg)
    *out = (pp_provider_t){"cuda-register", b,   register_alloc, register_free,
                           cuda_destroy,    NULL};
  else
    *out =
        (pp_provider_t){"cuda", b, cuda_alloc, cuda_free, cuda_destroy, NULL};
  // cppcheck-suppress memleak ; ownership passed to *out (ctx)
  return 0;
}
