/*
 * The callbacks event provider: a user's pinpool_events_t (CPU pipelines,
 * other runtimes). The table is copied; answers are checked so that a
 * provider returning nonsense cannot corrupt the pool.
 */
#include "internal.h"

#include <stdlib.h>

typedef struct user_events {
  pinpool_events_t u;
} user_events_t;

static int user_record(void *ctx, pinpool_stream_t stream, void **event) {
  user_events_t *e = ctx;
  int rc = e->u.record(e->u.ctx, stream, event);
  if (rc != 0)
    return pp_fail(rc < 0 ? rc : PINPOOL_EDEVICE,
                   "event provider '%s': record on stream %#lx failed (%d)",
                   e->u.name, (unsigned long)stream, rc);
  return 0;
}

static int user_query(void *ctx, void *event) {
  user_events_t *e = ctx;
  int rc = e->u.query(e->u.ctx, event);
  if (rc < 0)
    return pp_fail(rc, "event provider '%s': query reported error %d",
                   e->u.name, rc);
  return rc > 0 ? 1 : 0;
}

static int user_synchronize(void *ctx, void *event) {
  user_events_t *e = ctx;
  int rc = e->u.synchronize(e->u.ctx, event);
  if (rc < 0)
    return pp_fail(rc, "event provider '%s': synchronize reported error %d",
                   e->u.name, rc);
  return 0;
}

static void user_release(void *ctx, void *event) {
  user_events_t *e = ctx;
  e->u.release(e->u.ctx, event);
}

static void user_destroy(void *ctx) { free(ctx); }

int pp_events_user_open(const pinpool_events_t *user, pp_events_t *out) {
  user_events_t *e = malloc(sizeof *e);
  if (e == NULL)
    return pp_fail(PINPOOL_ENOMEM, "event provider: out of memory");
  e->u = *user;
  if (e->u.name == NULL)
    e->u.name = "callbacks";
  out->name = e->u.name;
  out->ctx = e; /* freed by user_destroy */
  out->record = user_record;
  out->query = user_query;
  out->synchronize = user_synchronize;
  out->release = user_release;
  out->destroy = user_destroy;
  return 0;
}
