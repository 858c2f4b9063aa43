/*
 * The malloc backend (for debugging: valgrind and ASan see every segment as
 * a heap allocation) and the adapter for a user-supplied backend table.
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int malloc_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  (void)ctx;
  void *p = NULL;
  int e = posix_memalign(&p, PP_PAGE, size);
  if (e != 0)
    return pp_fail(e == ENOMEM ? PINPOOL_ENOMEM : PINPOOL_EBACKEND,
                   "malloc backend: posix_memalign(%zu) failed: %s", size,
                   strerror(e));
  *flags = 0;
  *out = p;
  return 0;
}

static void malloc_free(void *ctx, void *ptr, size_t size) {
  (void)ctx;
  (void)size;
  free(ptr);
}

int pp_backend_malloc_open(const pp_config_t *cfg, pp_provider_t *out) {
  (void)cfg;
  *out = (pp_provider_t){"malloc", NULL, malloc_alloc, malloc_free,
                         NULL,     NULL, NULL};
  return 0;
}

/* ---- User backend adapter ------------------------------------------------
 * The user's table is copied; its answers are checked, because a backend
 * that returns a misaligned or NULL pointer must not corrupt the pool. */
typedef struct user_ctx {
  pinpool_backend_t b;
} user_ctx_t;

static int user_alloc(void *ctx, size_t size, void **out, unsigned *flags) {
  user_ctx_t *u = ctx;
  void *p = NULL;
  int rc = u->b.alloc(u->b.ctx, size, &p);
  if (rc == PINPOOL_ENOMEM)
    return pp_fail(PINPOOL_ENOMEM, "backend '%s': out of memory (%zu bytes)",
                   u->b.name, size);
  if (rc != 0 || p == NULL)
    return pp_fail(PINPOOL_EBACKEND,
                   "backend '%s': alloc of %zu bytes failed (returned %d)",
                   u->b.name, size, rc);
  if (((uintptr_t)p & (PP_PAGE - 1)) != 0) {
    u->b.free(u->b.ctx, p, size);
    return pp_fail(PINPOOL_EBACKEND,
                   "backend '%s': returned %p, not 4096-byte aligned",
                   u->b.name, p);
  }
  *flags = u->b.page_locked ? PP_SEG_LOCKED : 0;
  *out = p;
  return 0;
}

static void user_free(void *ctx, void *ptr, size_t size) {
  user_ctx_t *u = ctx;
  u->b.free(u->b.ctx, ptr, size);
}

static void user_destroy(void *ctx) { free(ctx); }

int pp_backend_user_open(const pinpool_backend_t *user, pp_provider_t *out) {
  if (user->alloc == NULL || user->free == NULL)
    return pp_fail(PINPOOL_EINVAL, "backend: alloc and free must be set");
  user_ctx_t *u = malloc(sizeof *u);
  if (u == NULL)
    return pp_fail(PINPOOL_ENOMEM, "backend: out of memory");
  u->b = *user;
  if (u->b.name == NULL)
    u->b.name = "user";
  out->name = u->b.name;
  out->ctx = u; /* freed by user_destroy */
  out->alloc = user_alloc;
  out->free = user_free;
  out->destroy = user_destroy;
  return 0;
}
