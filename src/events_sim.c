/*
 * The simulated event provider: each stream is a worker thread that runs
 * the work queued on it in order, each item after its simulated duration.
 * An event is an item too: it completes when the worker reaches it (after
 * sim_delay_us), so it completes after everything queued before it on the
 * same stream — the ordering a device stream gives. Used by the tests, the
 * demo and the benchmarks; pinpool_sim_submit queues work ("a copy").
 *
 * One mutex per provider guards every queue; a condition variable per
 * stream wakes its worker, one per provider wakes waiters in synchronize.
 * The worker never runs user work under the lock.
 *
 * An event is its queue item, held twice: by the queue until the worker
 * has passed it, and by the pool until it releases it. The pool may release
 * an event the worker has not reached yet (a free that recorded the event
 * but found no memory to queue it: stream.c), so a released event is never
 * reused while queued: when events were pooled, such an event was handed
 * out again by the next record and the worker's late "done" completed that
 * record early (a block reused while its copy still ran). Holding the item
 * twice also makes a record one allocation and one lock, and a release no
 * lock at all, as the benchmark's peers pay for their events on the same
 * simulated streams (bench/impl.c).
 */
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct sim_item {
  uint64_t duration_ns;
  void (*fn)(void *);
  void *arg;
  struct sim_item *next; /* under sim->lock */
  bool is_event;
  /* An event's: set when the worker passes it; the holds (queue, pool)
   * whose last drop frees the item. */
  _Atomic(int) done;
  _Atomic(int) holds;
} sim_item_t;

typedef struct sim_stream {
  pinpool_stream_t id;
  pthread_t thread;
  bool running; /* thread is this process's (false in a child of fork) */
  pthread_cond_t wake;
  sim_item_t *head, *tail; /* under sim->lock */
  struct sim_stream *next;
  struct sim *sim;
} sim_stream_t;

typedef struct sim {
  pthread_mutex_t lock;
  pthread_cond_t done_cv; /* broadcast when any event completes */
  sim_stream_t *streams;
  uint64_t delay_ns;
  bool stop;
  /* A child of fork: the workers did not survive. The first call that
   * needs one starts those of the streams with queued work (restart_locked);
   * what a worker was running at the fork runs again, from its start. */
  _Atomic(bool) restart;
} sim_t;

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Drop one of an event item's two holds; the last one frees it.
 * Acquire-release: whichever side frees it sees everything the other did
 * with it first (the worker's store of done, the pool's last query). */
static void event_put(sim_item_t *it) {
  if (atomic_fetch_sub_explicit(&it->holds, 1, memory_order_acq_rel) == 1)
    free(it);
}

static void *worker(void *arg) {
  sim_stream_t *st = arg;
  sim_t *sim = st->sim;
  /* A pool's thread: the work it runs (pinpool_sim_submit's fn) may drop
   * the pool's last reference, and the teardown joins this thread
   * (lifecycle.c, the reaper). */
  pp_pool_thread = true;
  pthread_mutex_lock(&sim->lock);
  for (;;) {
    while (st->head == NULL && !sim->stop)
      pthread_cond_wait(&st->wake, &sim->lock);
    if (st->head == NULL) /* stop, and everything queued has run */
      break;
    sim_item_t *it = st->head;
    pthread_mutex_unlock(&sim->lock);
    if (it->duration_ns > 0)
      sleep_ns(it->duration_ns);
    if (it->fn != NULL)
      it->fn(it->arg);
    pthread_mutex_lock(&sim->lock);
    st->head = it->next;
    if (st->head == NULL)
      st->tail = NULL;
    if (it->is_event) {
#ifdef PINPOOL_MUTANT_SIM_DONE_PLAIN
      /* Race mutant: the completion flag without release/acquire (the
       * cuda-python lazy-attribute race): a reader may see "done" before
       * what the work wrote. */
      *(int *)&it->done = 1;
#else
      /* Release: a thread that sees done also sees what fn wrote. */
      pp_store_release(&it->done, 1);
#endif
      pthread_cond_broadcast(&sim->done_cv);
      event_put(it); /* the queue's hold; the last use of it here */
    } else {
      free(it);
    }
  }
  pthread_mutex_unlock(&sim->lock);
  return NULL;
}

/* Start st's worker. Caller holds sim->lock. */
static bool start_locked(sim_stream_t *st) {
  st->running = pthread_create(&st->thread, NULL, worker, st) == 0;
  return st->running;
}

/* A child of fork: a worker for every stream with queued work (an event
 * of the parent's may be waited for). Caller holds sim->lock. */
static void restart_locked(sim_t *sim) {
  if (!pp_load_relaxed(&sim->restart))
    return;
  pp_store_relaxed(&sim->restart, false);
  for (sim_stream_t *st = sim->streams; st != NULL; st = st->next)
    if (!st->running && st->head != NULL)
      (void)start_locked(st);
}

/* The stream's worker, started on first use. Caller holds sim->lock. */
static sim_stream_t *stream_locked(sim_t *sim, pinpool_stream_t id) {
  restart_locked(sim);
  sim_stream_t *st = sim->streams;
  while (st != NULL && st->id != id)
    st = st->next;
  if (st != NULL)
    return st->running || start_locked(st) ? st : NULL;
  st = calloc(1, sizeof *st);
  if (st == NULL)
    return NULL;
  st->id = id;
  st->sim = sim;
  (void)pthread_cond_init(&st->wake, NULL);
  if (!start_locked(st)) {
    (void)pthread_cond_destroy(&st->wake);
    free(st);
    return NULL;
  }
  st->next = sim->streams;
  sim->streams = st;
  return st;
}

/* Queue a copy of `init` on stream `id`: work (the worker frees it), or an
 * event (init->is_event; *out gets it, held twice: worker()). */
static int enqueue(sim_t *sim, pinpool_stream_t id, const sim_item_t *init,
                   sim_item_t **out) {
  sim_item_t *it = malloc(sizeof *it);
  if (it == NULL)
    return pp_fail(PINPOOL_ENOMEM, "simulated stream: out of memory");
  *it = (sim_item_t){.duration_ns = init->duration_ns,
                     .fn = init->fn,
                     .arg = init->arg,
                     .is_event = init->is_event};
  atomic_init(&it->done, 0);
  atomic_init(&it->holds, 2); /* an event's: the queue's and the pool's */
  pthread_mutex_lock(&sim->lock);
  sim_stream_t *st = stream_locked(sim, id);
  if (st == NULL) {
    pthread_mutex_unlock(&sim->lock);
    free(it);
    return pp_fail(PINPOOL_ENOMEM, "simulated stream: cannot start a worker");
  }
  if (out != NULL)
    *out = it; /* the pool's hold; the queue's is the append below */
  if (st->tail != NULL)
    st->tail->next = it;
  else
    st->head = it;
  st->tail = it;
  pthread_cond_signal(&st->wake);
  pthread_mutex_unlock(&sim->lock);
  return 0;
}

int pp_events_sim_submit(void *ctx, pinpool_stream_t stream,
                         uint64_t duration_ns, void (*fn)(void *), void *arg) {
  sim_item_t init = {.duration_ns = duration_ns, .fn = fn, .arg = arg};
  return enqueue(ctx, stream, &init, NULL);
}

static int sim_record(void *ctx, pinpool_stream_t stream, void **event) {
  sim_t *sim = ctx;
  sim_item_t init = {.duration_ns = sim->delay_ns, .is_event = true};
  sim_item_t *it = NULL;
  int rc = enqueue(sim, stream, &init, &it);
  if (rc == 0)
    *event = it; /* the pool's hold */
  return rc;
}

static int sim_query(void *ctx, void *event) {
  sim_t *sim = ctx;
  if (pp_unlikely(pp_load_relaxed(&sim->restart))) {
    pthread_mutex_lock(&sim->lock);
    restart_locked(sim);
    pthread_mutex_unlock(&sim->lock);
  }
  return pp_load_acquire(&((sim_item_t *)event)->done) ? 1 : 0;
}

static int sim_synchronize(void *ctx, void *event) {
  sim_t *sim = ctx;
  sim_item_t *ev = event;
  pthread_mutex_lock(&sim->lock);
  restart_locked(sim);
  while (!pp_load_acquire(&ev->done))
    pthread_cond_wait(&sim->done_cv, &sim->lock);
  pthread_mutex_unlock(&sim->lock);
  return 0;
}

static void sim_release(void *ctx, void *event) {
  (void)ctx;
  event_put(event); /* the pool's hold: freed here if the worker passed it */
}

static void sim_destroy(void *ctx) {
  sim_t *sim = ctx;
  pthread_mutex_lock(&sim->lock);
  sim->stop = true;
  for (sim_stream_t *st = sim->streams; st != NULL; st = st->next)
    pthread_cond_signal(&st->wake);
  pthread_mutex_unlock(&sim->lock);
  for (sim_stream_t *st = sim->streams, *next; st != NULL; st = next) {
    next = st->next;
    if (st->running)
      (void)pthread_join(st->thread, NULL);
    (void)pthread_cond_destroy(&st->wake);
    free(st);
  }
  (void)pthread_cond_destroy(&sim->done_cv);
  (void)pthread_mutex_destroy(&sim->lock);
  free(sim);
}

static void sim_atfork(void *ctx, int phase) {
  sim_t *sim = ctx;
  if (phase == PP_FORK_PREPARE) {
    pthread_mutex_lock(&sim->lock);
    return;
  }
  if (phase == PP_FORK_CHILD) {
    /* The waiters are gone: new condition variables. */
    (void)pthread_cond_init(&sim->done_cv, NULL);
    for (sim_stream_t *st = sim->streams; st != NULL; st = st->next) {
      (void)pthread_cond_init(&st->wake, NULL);
      st->running = false;
    }
    pp_store_relaxed(&sim->restart, true);
  }
  pthread_mutex_unlock(&sim->lock);
}

int pp_events_sim_open(const pp_config_t *cfg, pp_events_t *out) {
  sim_t *sim = calloc(1, sizeof *sim);
  if (sim == NULL)
    return pp_fail(PINPOOL_ENOMEM, "simulated events: out of memory");
  (void)pthread_mutex_init(&sim->lock, NULL);
  (void)pthread_cond_init(&sim->done_cv, NULL);
  sim->delay_ns = (uint64_t)cfg->sim_delay_us * 1000u;
  *out = (pp_events_t){
      "simulated", sim,         sim_record, sim_query, sim_synchronize,
      sim_release, sim_destroy, sim_atfork, NULL};
  return 0;
}
