/*
 * Calling pinpool from inside its callbacks: every callback kind x every
 * public call that can wait x the modes that add a waiter (issue 37,
 * fourth review, rev37d; docs/verification.md, "Issue 37, the fourth
 * review"; docs/api.md, "Calling pinpool from a callback").
 *
 * Kinds (where the test's callback runs the call):
 *   BA  a backend alloc (an allocation's growth; the grower's, grow mode)
 *   BF  a backend free (empty_cache's release of a whole free chunk)
 *   BX  a backend free in a thread's exit trim (max_cached)
 *   ER  an event provider's record (a free of a block used on a stream)
 *   EQ  a provider's query (an allocation's miss polls a pending head)
 *   ES  a provider's synchronize (pinpool_synchronize)
 *   EL  a provider's release (process_events reclaims a completed event)
 *   OE  the error callback (a query that reports a device error)
 * Calls: an allocation that misses (and may join a growth in flight), one
 * past max_reserved (the out-of-memory retry and its wait for claims),
 * free, empty_cache, process_events, synchronize, validate, get_stats,
 * snapshot, thread_flush (the trim).
 * Modes:
 *   plain   the main thread alone;
 *   bg      background=1: the library's thread polls; the callback runs
 *           on the main thread once that thread waits for its query;
 *   grow    grow_ahead: BA runs on the grower's thread;
 *   thread  a second thread starts once the callback runs, makes the
 *           same kind of callback (a growth, a release, a poll) and runs
 *           the call there too, then process_events and an allocation
 *           past the cap: the two callbacks meet (each waits, bounded,
 *           for the other to be inside one);
 *   fork    a thread forks while the callback runs (it waits, bounded,
 *           for the fork to be under way); the child validates.
 * BA/small and EQ/small: BA and EQ with an outer allocation of a small
 * class (a refill of the thread cache's empty stack, 4-8 KiB) instead of
 * a large one; the callback first allocates and frees a block of that
 * same class, then runs the call (another class, or none). A refill took
 * its blocks into the stack over what the nested calls had left there
 * (issue 37, the fifth review, rv37e's d6 and d8: validate then found
 * blocks cached in no list); the nested calls of the large cases never
 * met the outer call's stack.
 * Each case runs in a child under a watchdog: a hang fails the case and
 * names it. Each checks the call's result (0, PINPOOL_ENOMEM, or
 * PINPOOL_EBUSY: what a callback gets where it would wait) and that the
 * pool validates afterwards. rev37d's D1-D5 are cases of it: D1 bg EQ
 * validate, D2 thread BF alloc_cap, D3 fork BX alloc_miss, D4 grow BA
 * validate, D5 thread EQ alloc_miss. settle_tickets is D6.
 */
#include "testutil.h"

#include "internal.h" /* pp_test_hook, PP_HOOK_*, pp_fork_gate */

#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define WATCHDOG_MS 15000u
#define RV_MS 300u /* the most a callback waits for its partner */

enum { K_BA, K_BF, K_BX, K_ER, K_EQ, K_ES, K_EL, K_OE, NKIND };
enum {
  C_ALLOC_MISS,
  C_ALLOC_CAP,
  C_FREE,
  C_EMPTY,
  C_PROCESS,
  C_SYNC,
  C_VALIDATE,
  C_STATS,
  C_SNAPSHOT,
  C_TRIM,
  NCALL
};
enum { M_PLAIN, M_BG, M_GROW, M_THREAD, M_FORK, NMODE };
static const char *const kind_name[NKIND] = {"BA", "BF", "BX", "ER",
                                             "EQ", "ES", "EL", "OE"};
static const char *const call_name[NCALL] = {
    "alloc_miss",  "alloc_cap", "free",      "empty_cache", "process_events",
    "synchronize", "validate",  "get_stats", "snapshot",    "thread_flush"};
static const char *const mode_name[NMODE] = {"plain", "bg", "grow", "thread",
                                             "fork"};

/* Child exit codes besides 0. */
#define X_NOT_FIRED 100 /* the callback never ran: the case tested nothing */
#define X_BAD_RC 20
#define X_INVALID 21
#define X_SETUP 22
#define X_FORK_CHILD 23

enum { ROLE_OTHER, ROLE_MAIN, ROLE_PEER, ROLE_X };

static struct {
  int kind, call, mode;
  bool small; /* BA/small, EQ/small: the outer call refills a small class */
} cs;
static _Atomic size_t outer_size; /* the trigger's allocation, now */
static pinpool_t *pool;
static pthread_t main_tid, x_self; /* x_self: X's own, before x_armed */
static pthread_t fire_tid;         /* the main callback's, before main_in_cb */
static _Atomic int armed, x_armed, fired, main_in_cb, peer_in_cb, poll_waiting,
    main_calling, main_blocked, fork_req, fork_started, fork_done, case_done,
    query_result, bad_rc, bad_call, child_bad;
static _Atomic(void *) spare[3];
static __thread int tl_role;
static __thread unsigned tl_peer_fired; /* kinds fired on the peer */

static unsigned now_ms(void) { return (unsigned)(pp_now_ns() / 1000000u); }

/* Wait for *flag (bounded): true if it came. */
static bool wait_for(_Atomic int *flag, unsigned ms) {
  unsigned t0 = now_ms();
  while (!atomic_load(flag)) {
    if (now_ms() - t0 > ms)
      return false;
    pp_sleep_ms(1);
  }
  return true;
}

static void note_rc(int call, int rc) {
  bool ok = rc == 0 || rc == PINPOOL_ENOMEM || rc == PINPOOL_EBUSY;
  if (call == C_VALIDATE)
    ok = rc == 0 || rc == PINPOOL_EBUSY; /* never a false ECORRUPT */
  if (!ok && atomic_exchange(&bad_rc, rc) == 0) {
    atomic_store(&bad_call, call);
    fprintf(stderr, "  %s from a callback: %d (%s)\n", call_name[call], rc,
            pinpool_last_error());
  }
}

static void run_call(int call, int role) {
  void *p = NULL;
  int rc = 0;
  if (cs.small && role == ROLE_MAIN) {
    /* The outer call's own class first: its stack is being refilled. */
    for (int i = 0; i < 3; i++) {
      void *q = NULL;
      rc = pinpool_alloc(pool, atomic_load(&outer_size), &q);
      note_rc(C_ALLOC_MISS, rc);
      if (rc == 0)
        note_rc(C_FREE, pinpool_free(pool, q));
    }
    rc = 0;
  }
  switch (call) {
  case C_ALLOC_MISS: /* a size nobody allocated: a miss */
    rc = pinpool_alloc(pool, role == ROLE_PEER ? 128u << 10 : 256u << 10, &p);
    break;
  case C_ALLOC_CAP: /* past max_reserved=64MiB with ~38 MiB reserved */
    rc = pinpool_alloc(pool, 48 * MiB, &p);
    break;
  case C_FREE:
    p = atomic_exchange(&spare[role == ROLE_PEER], NULL);
    rc = p != NULL ? pinpool_free(pool, p) : 0;
    p = NULL;
    break;
  case C_EMPTY:
    rc = pinpool_empty_cache(pool);
    break;
  case C_PROCESS:
    rc = pinpool_process_events(pool);
    break;
  case C_SYNC:
    rc = pinpool_synchronize(pool);
    break;
  case C_VALIDATE:
    rc = pinpool_validate(pool);
    break;
  case C_STATS: {
    pinpool_stats_t st;
    rc = pinpool_get_stats(pool, &st);
    break;
  }
  case C_SNAPSHOT: {
    char *text = NULL;
    size_t len = 0;
    rc = pinpool_snapshot_write_mem(pool, &text, &len, 0);
    if (rc == 0)
      pinpool_snapshot_free(text);
    break;
  }
  default:
    rc = pinpool_thread_flush(pool);
    break;
  }
  note_rc(call, rc);
  if (p != NULL)
    note_rc(call, pinpool_free(pool, p));
}

/* Whether the case's callback may run on this thread. */
static bool fires_here(int kind) {
  bool is_main = pthread_equal(pthread_self(), main_tid);
  if (kind == K_BX)
    return atomic_load(&x_armed) && pthread_equal(pthread_self(), x_self);
  if (cs.mode == M_BG)
    return is_main; /* the library's thread is the one that waits */
  if (cs.mode == M_GROW && kind == K_BA)
    return !is_main; /* the grower's backend alloc */
  return true;
}

/* Every test callback comes here with its kind. */
static void callout(int kind) {
  if (!atomic_load(&armed))
    return;
  if (tl_role == ROLE_PEER) {
    /* The peer: once per kind, in the case's kind, a growth or a
     * release (the callbacks its trigger makes that hold what another
     * thread may wait for); it meets the main callback and runs the
     * case's call, a full poll and an allocation past the cap. */
    if ((tl_peer_fired & (1u << kind)) ||
        (kind != cs.kind && kind != K_BA && kind != K_BF))
      return;
    tl_peer_fired |= 1u << kind;
    atomic_store(&peer_in_cb, 1);
    (void)wait_for(&main_in_cb, RV_MS);
    /* The main callback's call first: until it waits for something (a
     * wait hook) or returns, this callback holds what it holds. */
    (void)wait_for(&main_blocked, RV_MS);
    run_call(cs.call, ROLE_PEER);
    run_call(C_PROCESS, ROLE_PEER);
    run_call(C_ALLOC_CAP, ROLE_PEER);
    return;
  }
  if (kind != cs.kind || !fires_here(kind) || atomic_exchange(&fired, 1))
    return;
  fire_tid = pthread_self();
  atomic_store(&main_in_cb, 1);
  if (cs.mode == M_THREAD) {
    (void)wait_for(&peer_in_cb, RV_MS);
  } else if (cs.mode == M_FORK) {
    atomic_store(&fork_req, 1);
    unsigned t0 = now_ms();
    while (!atomic_load(&fork_done) && now_ms() - t0 < RV_MS &&
           !(atomic_load(&fork_started) && atomic_load(&pp_fork_gate) != 0))
      pp_sleep_ms(1);
  } else if (cs.mode == M_BG && kind == K_EQ) {
    (void)wait_for(&poll_waiting, RV_MS); /* the background poll waits */
  }
  atomic_store(&main_calling, 1);
  run_call(cs.call, ROLE_MAIN);
  atomic_store(&main_blocked, 1); /* returned */
}

/* ---- The callbacks ------------------------------------------------------ */
static int be_alloc(void *ctx, size_t size, void **out) {
  (void)ctx;
  callout(K_BA);
  void *m = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return PINPOOL_ENOMEM;
  *out = m;
  return 0;
}
static void be_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  callout(atomic_load(&x_armed) && pthread_equal(pthread_self(), x_self)
              ? K_BX
              : K_BF);
  (void)munmap(p, size);
}
static int ev_record(void *ctx, pinpool_stream_t s, void **ev) {
  (void)ctx;
  (void)s;
  callout(K_ER);
  *ev = malloc(1);
  return *ev != NULL ? 0 : PINPOOL_ENOMEM;
}
static int ev_query(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  callout(K_EQ);
  return atomic_load(&query_result);
}
static int ev_sync(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  callout(K_ES);
  return 0;
}
static void ev_release(void *ctx, void *ev) {
  (void)ctx;
  callout(K_EL);
  free(ev);
}
static void on_error(void *arg, int err, const char *msg, void *block) {
  (void)arg;
  (void)err;
  (void)msg;
  (void)block;
  callout(K_OE);
}
static void hook(int point) {
  if (point == PP_HOOK_POLL_WAIT && !pthread_equal(pthread_self(), main_tid))
    atomic_store(&poll_waiting, 1);
  /* The main callback's call is about to wait for another thread. */
  if ((point == PP_HOOK_POLL_WAIT || point == PP_HOOK_GROW_JOIN ||
       point == PP_HOOK_RETRY_SETTLE || point == PP_HOOK_VALIDATE_HOLD) &&
      atomic_load(&main_calling) && pthread_equal(pthread_self(), fire_tid))
    atomic_store(&main_blocked, 1);
}

/* ---- The antagonists ------------------------------------------------------
 */
static void *peer_main(void *arg) {
  (void)arg;
  tl_role = ROLE_PEER;
  while (!atomic_load(&main_in_cb) && !atomic_load(&case_done))
    pp_sleep_ms(1);
  if (atomic_load(&case_done))
    return NULL;
  /* The same kind of callback as the main thread's: a release first where
   * that is one (the second whole free chunk), else a growth (which polls
   * a pending head first). */
  if (cs.kind == K_BF)
    note_rc(C_EMPTY, pinpool_empty_cache(pool));
  void *p = NULL;
  int rc = pinpool_alloc(pool, MiB, &p);
  note_rc(C_ALLOC_MISS, rc);
  if (rc == 0)
    note_rc(C_FREE, pinpool_free(pool, p));
  note_rc(C_EMPTY, pinpool_empty_cache(pool));
  return NULL;
}

static void *forker_main(void *arg) {
  (void)arg;
  while (!atomic_load(&fork_req) && !atomic_load(&case_done))
    pp_sleep_ms(1);
  if (!atomic_load(&fork_req))
    return NULL;
  atomic_store(&fork_started, 1);
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    /* The child: only this thread. The pool is whole. */
    int v = pinpool_validate(pool);
    if (v != 0)
      fprintf(stderr, "  fork child: %s\n", pinpool_last_error());
    _exit(v == 0 ? 0 : 1);
  }
  atomic_store(&fork_done, 1);
  if (pid < 0 || pp_wait_child(pid, WATCHDOG_MS / 2) != 0)
    atomic_store(&child_bad, 1);
  return NULL;
}

/* Thread X (BX): fills its cache past max_cached and exits; its exit trim
 * releases a chunk through the backend's free. */
static void *x_main(void *arg) {
  (void)arg;
  tl_role = ROLE_X;
  x_self = pthread_self();
  void *b[12];
  for (int i = 0; i < 12; i++)
    if (pinpool_alloc(pool, MiB, &b[i]) != 0)
      b[i] = NULL;
  for (int i = 0; i < 12; i++)
    if (b[i] != NULL)
      (void)pinpool_free(pool, b[i]);
  atomic_store(&x_armed, 1);
  return NULL;
}

/* ---- One case ------------------------------------------------------------ */
static int case_run(void) {
  static pinpool_backend_t be;
  static pinpool_events_t evs;
  be = (pinpool_backend_t){"matrix", be_alloc, be_free, NULL, 0};
  evs = (pinpool_events_t){"matrix", ev_record,  ev_query,
                           ev_sync,  ev_release, NULL};
  pinpool_hooks_t h = {&be, &evs, on_error, NULL};
  char conf[160];
  (void)snprintf(conf, sizeof conf, "max_reserved=64MiB%s%s",
                 cs.mode == M_BG ? ",background=1,poll_us=500"
                 : cs.mode == M_GROW && cs.kind == K_BX ? ",grow_ahead=4MiB"
                 : cs.mode == M_GROW                    ? ",grow_ahead=8MiB"
                                                        : "",
                 cs.kind == K_BX ? ",max_cached=4MiB" : "");
  main_tid = pthread_self();
  tl_role = ROLE_MAIN;
  if (pinpool_create_ex(conf, &h, &pool) != 0) {
    fprintf(stderr, "  create: %s\n", pinpool_last_error());
    return X_SETUP;
  }
  atomic_store(&pp_test_hook, hook);
  /* Whole 2 MiB chunks (no free bytes beside them): the spares the call
   * frees and a block pending on stream 7 (query 0 until the end). */
  void *s0, *s1, *pend, *rec = NULL, *big[2] = {NULL, NULL};
  if (pinpool_alloc(pool, 2 * MiB, &s0) != 0 ||
      pinpool_alloc(pool, 2 * MiB, &s1) != 0 ||
      pinpool_alloc(pool, 2 * MiB, &pend) != 0 ||
      pinpool_record_stream(pool, pend, 7) != 0 ||
      pinpool_free(pool, pend) != 0)
    return X_SETUP;
  atomic_store(&spare[0], s0);
  atomic_store(&spare[1], s1);
  if (cs.kind == K_BF) { /* two whole free 16 MiB chunks */
    for (int i = 0; i < 2; i++)
      if (pinpool_alloc(pool, 16 * MiB, &big[i]) != 0)
        return X_SETUP;
    for (int i = 0; i < 2; i++)
      if (pinpool_free(pool, big[i]) != 0)
        return X_SETUP;
    (void)pinpool_thread_flush(pool);
  }
  if (cs.kind == K_ER && (pinpool_alloc(pool, 2 * MiB, &rec) != 0 ||
                          pinpool_record_stream(pool, rec, 8) != 0))
    return X_SETUP;
  pthread_t peer, forker, x;
  bool have_peer = cs.mode == M_THREAD, have_forker = cs.mode == M_FORK;
  if (have_peer)
    pthread_create(&peer, NULL, peer_main, NULL);
  if (have_forker)
    pthread_create(&forker, NULL, forker_main, NULL);
  atomic_store(&query_result, cs.kind == K_EL   ? 1
                              : cs.kind == K_OE ? PINPOOL_EDEVICE
                                                : 0);
  atomic_store(&armed, 1);
  /* The trigger: until the callback has run (a background poll may hold
   * the head a miss would query, the grower may look later). */
  for (int attempt = 0; attempt < 10 && !atomic_load(&fired); attempt++) {
    void *p = NULL;
    switch (cs.kind) {
    case K_BA:
    case K_EQ:
      /* Each attempt a class not allocated yet: a miss. */
      atomic_store(&outer_size, cs.small ? 4096u + (size_t)attempt * 512u
                                         : MiB + (size_t)attempt * 65536u);
      if (pinpool_alloc(pool, atomic_load(&outer_size), &p) == 0)
        (void)pinpool_free(pool, p);
      break;
    case K_BF:
      (void)pinpool_empty_cache(pool);
      break;
    case K_BX:
      if (attempt == 0) {
        pthread_create(&x, NULL, x_main, NULL);
        pthread_join(x, NULL);
      }
      break;
    case K_ER:
      if (rec != NULL)
        (void)pinpool_free(pool, rec);
      rec = NULL;
      break;
    case K_ES:
      (void)pinpool_synchronize(pool);
      break;
    default:
      (void)pinpool_process_events(pool);
      break;
    }
    for (int i = 0; i < 50 && !atomic_load(&fired); i++)
      pp_sleep_ms(1);
  }
  atomic_store(&case_done, 1);
  if (have_peer)
    pthread_join(peer, NULL);
  if (have_forker)
    pthread_join(forker, NULL);
  atomic_store(&armed, 0);
  atomic_store(&pp_test_hook, NULL);
  /* Drain: every head completes; then the pool is whole. */
  atomic_store(&query_result, 1);
  if (pinpool_synchronize(pool) != 0)
    return X_INVALID;
  if (pinpool_validate(pool) != 0) {
    fprintf(stderr, "  validate after the case: %s\n", pinpool_last_error());
    return X_INVALID;
  }
  for (int i = 0; i < 2; i++) {
    void *p = atomic_exchange(&spare[i], NULL);
    if (p != NULL && pinpool_free(pool, p) != 0)
      return X_INVALID;
  }
  if (atomic_load(&bad_rc) != 0)
    return X_BAD_RC;
  if (atomic_load(&child_bad))
    return X_FORK_CHILD;
  pinpool_destroy(pool);
  return atomic_load(&fired) ? 0 : X_NOT_FIRED;
}

/* The matrix: every case in a child, PAR at a time (most of a case is
 * waiting); a hang or a failure names the case. */
#define PAR 4
typedef struct {
  pid_t pid;
  unsigned t0;
  int kind;
  char name[64];
} slot_t;

/* The slot's child ended (or ran past the watchdog: killed): its status as
 * pp_wait_child's, or -4 while it runs. */
static int slot_poll(slot_t *sl) {
  int status = 0;
  pid_t r = waitpid(sl->pid, &status, WNOHANG);
  if (r == 0 && now_ms() - sl->t0 <= WATCHDOG_MS)
    return -4;
  if (r == 0) {
    (void)kill(sl->pid, SIGKILL);
    (void)waitpid(sl->pid, &status, 0);
    return -1;
  }
  if (r < 0)
    return -3;
  return WIFSIGNALED(status) ? -2 : WEXITSTATUS(status);
}

/* Kinds NKIND and NKIND + 1: BA/small and EQ/small. */
#define NKIND_ALL (NKIND + 2)
static void matrix(void **state) {
  (void)state;
  unsigned fired_in[NKIND_ALL] = {0}, failures = 0, cases = 0;
  const char *only = getenv("PP_MATRIX_ONLY"); /* "BF alloc_cap thread" */
  slot_t slot[PAR];
  int busy = 0, next = 0, total = NMODE * NKIND_ALL * NCALL;
  memset(slot, 0, sizeof slot);
  while (next < total || busy > 0) {
    /* Start cases while a slot is free. */
    for (int i = 0; i < PAR && next < total; i++) {
      if (slot[i].pid != 0)
        continue;
      int m = next / (NKIND_ALL * NCALL), k = next / NCALL % NKIND_ALL,
          c = next % NCALL;
      next++;
      bool small = k >= NKIND;
      int base = k == NKIND ? K_BA : k == NKIND + 1 ? K_EQ : k;
      (void)snprintf(slot[i].name, sizeof slot[i].name, "%s%s %s %s",
                     kind_name[base], small ? "/small" : "", call_name[c],
                     mode_name[m]);
      if (only != NULL && strcmp(only, slot[i].name) != 0)
        continue;
      cs.kind = base;
      cs.small = small;
      cs.call = c;
      cs.mode = m;
      cases++;
      fflush(NULL);
      pid_t pid = fork();
      assert_true(pid >= 0);
      if (pid == 0)
        _exit(case_run());
      slot[i].pid = pid;
      slot[i].t0 = now_ms();
      slot[i].kind = k;
      busy++;
    }
    pp_sleep_ms(1);
    for (int i = 0; i < PAR; i++) {
      if (slot[i].pid == 0)
        continue;
      int st = slot_poll(&slot[i]);
      if (st == -4)
        continue;
      slot[i].pid = 0;
      busy--;
      if (st == 0)
        fired_in[slot[i].kind]++;
      if (st == 0 || st == X_NOT_FIRED)
        continue;
      failures++;
      if (st == -1)
        fprintf(stderr, "case %s: DEADLOCK (still running after %u ms)\n",
                slot[i].name, WATCHDOG_MS);
      else
        fprintf(stderr, "case %s: the child failed (%d)\n", slot[i].name, st);
    }
  }
  fprintf(stderr, "reenter_matrix: %u cases, %u failed; fired per kind:", cases,
          failures);
  for (int k = 0; k < NKIND_ALL; k++)
    fprintf(stderr, " %s%s %u",
            kind_name[k < NKIND    ? k
                      : k == NKIND ? K_BA
                                   : K_EQ],
            k < NKIND ? "" : "/small", fired_in[k]);
  fprintf(stderr, "\n");
  PP_ASSERT(failures == 0, "%u of %u cases failed", failures, cases);
  /* Every kind's callback ran in most of its cases: a case whose callback
   * never ran tested nothing. */
  for (int k = 0; k < NKIND_ALL && only == NULL; k++)
    PP_ASSERT(fired_in[k] * 5 >= (unsigned)(NCALL * NMODE) * 4,
              "kind %d: the callback ran in %u of %d cases", k, fired_in[k],
              NCALL * NMODE);
}

/* ---- settle_tickets (D6) -------------------------------------------------
 * The out-of-memory retry waits only for the claims in flight when it
 * comes. R1's release is held in its backend free; W's allocation past
 * max_reserved waits for it (PP_HOOK_RETRY_SETTLE); then R2's release
 * begins and is held too, and R1's is let go. W must return while R2's
 * claim is still in flight (before the fix it waited for the pool's count
 * of claims, which R2 kept up: for as long as releases went on, 3 s in
 * rev37d's v6). */
static _Atomic int st_hold1, st_hold2, st_in1, st_in2, st_waiting, st_w_done;
static _Atomic int st_which;
static void st_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  int w = atomic_exchange(&st_which, 0);
  if (w == 1) {
    atomic_store(&st_in1, 1);
    while (atomic_load(&st_hold1))
      pp_sleep_ms(1);
  } else if (w == 2) {
    atomic_store(&st_in2, 1);
    while (atomic_load(&st_hold2))
      pp_sleep_ms(1);
  }
  (void)munmap(p, size);
}
static void st_hook(int point) {
  if (point == PP_HOOK_RETRY_SETTLE)
    atomic_store(&st_waiting, 1);
}
static void *st_release(void *arg) {
  (void)arg;
  (void)pinpool_empty_cache(pool);
  return NULL;
}
static void *st_w(void *arg) {
  (void)arg;
  void *p = NULL;
  if (pinpool_alloc(pool, 72 * MiB, &p) == 0)
    (void)pinpool_free(pool, p);
  atomic_store(&st_w_done, 1);
  return NULL;
}
static int settle_tickets_run(void) {
  static pinpool_backend_t be;
  be = (pinpool_backend_t){"tickets", be_alloc, st_free, NULL, 0};
  if (pinpool_create_with_backend("max_reserved=128MiB", &be, &pool) != 0)
    return X_SETUP;
  void *live[4], *fr[2];
  for (int i = 0; i < 4; i++)
    if (pinpool_alloc(pool, 16 * MiB, &live[i]) != 0)
      return X_SETUP;
  for (int i = 0; i < 2; i++)
    if (pinpool_alloc(pool, 16 * MiB, &fr[i]) != 0)
      return X_SETUP;
  for (int i = 0; i < 2; i++)
    (void)pinpool_free(pool, fr[i]);
  (void)pinpool_thread_flush(pool); /* two whole free chunks */
  atomic_store(&pp_test_hook, st_hook);
  atomic_store(&st_hold1, 1);
  atomic_store(&st_hold2, 1);
  atomic_store(&st_which, 1);
  pthread_t r1, r2, w;
  pthread_create(&r1, NULL, st_release, NULL);
  if (!wait_for(&st_in1, 5000))
    return 30;
  pthread_create(&w, NULL, st_w, NULL);
  if (!wait_for(&st_waiting, 5000))
    return 31; /* W never waited for R1's claim */
  atomic_store(&st_which, 2);
  pthread_create(&r2, NULL, st_release, NULL);
  if (!wait_for(&st_in2, 5000))
    return 32;
  atomic_store(&st_hold1, 0); /* R1's claim ends; R2's goes on */
  bool returned = wait_for(&st_w_done, 5000);
  atomic_store(&st_hold2, 0);
  pthread_join(r1, NULL);
  pthread_join(r2, NULL);
  pthread_join(w, NULL);
  atomic_store(&pp_test_hook, NULL);
  if (!returned) {
    fprintf(stderr, "the retry waited for a claim begun after it\n");
    return 33;
  }
  for (int i = 0; i < 4; i++)
    (void)pinpool_free(pool, live[i]);
  if (pinpool_validate(pool) != 0)
    return X_INVALID;
  pinpool_destroy(pool);
  return 0;
}
/* Runs one scenario in a child under the watchdog: a hang or a failed
 * check fails the test, naming it. */
static void in_child(const char *name, int (*run)(void)) {
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0)
    _exit(run());
  int st = pp_wait_child(pid, WATCHDOG_MS);
  PP_ASSERT(st == 0, "%s: the child failed (%d)", name, st);
}
static void settle_tickets(void **state) {
  (void)state;
  in_child("settle_tickets", settle_tickets_run);
}

/* ---- exit_trim_nests (rv37e's d7) ----------------------------------------
 * A thread's exit flushes its cache past max_cached and trims; the trim's
 * backend free allocates and frees 5 MiB of the same pool (more than the
 * cap). Such a call used to make a new thread record inside the key
 * destructor; that record's exit trimmed again, ran the backend free
 * again, and so on past the destructor rounds glibc runs: the last
 * record's 4-5 MiB stayed cached for good, per thread. Now a call from the
 * exit's callouts uses no thread cache and makes no record: every nested
 * allocation succeeds, the pool is back under the cap once the threads
 * are gone, and a call that needs the thread's cache (thread_flush) is
 * refused with PINPOOL_EBUSY. */
static _Atomic int xt_nested, xt_failed, xt_flush_rc;
static __thread int xt_depth;
static _Atomic int xt_on, xt_flush; /* xt_flush: the second phase */
static void xt_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  if (atomic_load(&xt_on) && xt_depth == 0) {
    xt_depth++;
    void *q = NULL;
    if (pinpool_alloc(pool, 5 * MiB, &q) == 0 && pinpool_free(pool, q) == 0)
      atomic_fetch_add(&xt_nested, 1);
    else
      atomic_fetch_add(&xt_failed, 1);
    if (atomic_load(&xt_flush))
      atomic_store(&xt_flush_rc, pinpool_thread_flush(pool));
    xt_depth--;
  }
  (void)munmap(p, size);
}
static void *xt_worker(void *arg) {
  (void)arg;
  void *p[8];
  for (int i = 0; i < 8; i++)
    if (pinpool_alloc(pool, 3 * MiB, &p[i]) != 0)
      p[i] = NULL;
  for (int i = 0; i < 8; i++)
    if (p[i] != NULL)
      (void)pinpool_free(pool, p[i]);
  return NULL;
}
static int exit_trim_run(void) {
  static pinpool_backend_t be;
  be = (pinpool_backend_t){"exit", be_alloc, xt_free, NULL, 0};
  if (pinpool_create_with_backend("max_cached=4MiB", &be, &pool) != 0)
    return X_SETUP;
  atomic_store(&xt_on, 1);
  for (int r = 0; r < 6; r++) {
    pthread_t t;
    pthread_create(&t, NULL, xt_worker, NULL);
    pthread_join(t, NULL);
  }
  pinpool_stats_t st;
  if (pinpool_get_stats(pool, &st) != 0 || pinpool_validate(pool) != 0)
    return X_INVALID;
  atomic_store(&xt_flush, 1); /* one more thread: thread_flush refused */
  pthread_t t;
  pthread_create(&t, NULL, xt_worker, NULL);
  pthread_join(t, NULL);
  atomic_store(&xt_on, 0);
  fprintf(stderr,
          "exit_trim_nests: %d nested, %d failed, thread_flush %d; "
          "cached %llu KiB\n",
          atomic_load(&xt_nested), atomic_load(&xt_failed),
          atomic_load(&xt_flush_rc),
          (unsigned long long)st.cached_bytes.current >> 10);
  if (atomic_load(&xt_nested) == 0 || atomic_load(&xt_failed) != 0)
    return 40;
  if (st.cached_bytes.current > 4 * MiB)
    return 41; /* a record made in the exit kept its cache */
  if (atomic_load(&xt_flush_rc) != PINPOOL_EBUSY)
    return 42;
  pinpool_destroy(pool);
  return 0;
}
static void exit_trim_nests(void **state) {
  (void)state;
  in_child("exit_trim_nests", exit_trim_run);
}

/* ---- destroy_in_callout_fork (rv37e's d1) ----------------------------------
 * A backend free of pool A (inside empty_cache's busy section) destroys
 * pool B while another thread forks (the fork waits for that section).
 * B's teardown took pp_global_lock plainly, which the forker holds:
 * deadlock. Now a teardown whose last reference goes inside a busy
 * section waits for the section's end: B's chunks go back after A's
 * callback returned. */
static pinpool_t *dx_b;
static _Atomic int dx_in_cb, dx_armed, dx_b_freed_in_cb, dx_b_freed;
static void dx_free_a(void *ctx, void *p, size_t size) {
  (void)ctx;
  if (atomic_exchange(&dx_armed, 0)) {
    atomic_store(&dx_in_cb, 1);
    unsigned t0 = now_ms(); /* until the fork waits for this section */
    while (atomic_load(&pp_fork_gate) == 0 && now_ms() - t0 < RV_MS)
      pp_sleep_ms(1);
    pinpool_destroy(dx_b);
    atomic_store(&dx_in_cb, 2);
  }
  (void)munmap(p, size);
}
static void dx_free_b(void *ctx, void *p, size_t size) {
  (void)ctx;
  atomic_fetch_add(&dx_b_freed, 1);
  if (atomic_load(&dx_in_cb) == 1)
    atomic_fetch_add(&dx_b_freed_in_cb, 1);
  (void)munmap(p, size);
}
static void *dx_emptier(void *arg) {
  (void)arg;
  (void)pinpool_empty_cache(pool);
  return NULL;
}
static int destroy_fork_run(void) {
  static pinpool_backend_t ba, bb;
  ba = (pinpool_backend_t){"a", be_alloc, dx_free_a, NULL, 0};
  bb = (pinpool_backend_t){"b", be_alloc, dx_free_b, NULL, 0};
  if (pinpool_create_with_backend("", &ba, &pool) != 0 ||
      pinpool_create_with_backend("", &bb, &dx_b) != 0)
    return X_SETUP;
  void *a = NULL, *b = NULL;
  if (pinpool_alloc(pool, 16 * MiB, &a) != 0 ||
      pinpool_alloc(dx_b, 16 * MiB, &b) != 0)
    return X_SETUP;
  (void)pinpool_free(pool, a);
  (void)pinpool_free(dx_b, b);
  (void)pinpool_thread_flush(pool); /* a whole free chunk in A */
  atomic_store(&dx_armed, 1);
  pthread_t t;
  pthread_create(&t, NULL, dx_emptier, NULL); /* B's caches: none there */
  if (!wait_for(&dx_in_cb, 5000))
    return 50;
  fflush(NULL);
  pid_t pid = fork(); /* waits for the emptier's section */
  if (pid == 0)
    _exit(0);
  if (pid < 0 || pp_wait_child(pid, WATCHDOG_MS / 2) != 0)
    return X_FORK_CHILD;
  pthread_join(t, NULL);
  fprintf(stderr,
          "destroy_in_callout_fork: B's backend frees %d, %d of "
          "them inside A's callback\n",
          atomic_load(&dx_b_freed), atomic_load(&dx_b_freed_in_cb));
  if (atomic_load(&dx_b_freed) == 0 || atomic_load(&dx_b_freed_in_cb) != 0)
    return 51;
  if (pinpool_validate(pool) != 0)
    return X_INVALID;
  pinpool_destroy(pool);
  return 0;
}
static void destroy_in_callout_fork(void **state) {
  (void)state;
  in_child("destroy_in_callout_fork", destroy_fork_run);
}

/* ---- buffer_release_fork (rv37e's d4) --------------------------------------
 * The last pinpool_buffer_release of a pool-B buffer, from a backend free
 * of pool A (inside empty_cache's busy section) while another thread
 * forks. The buffer's free of its block needed a cache of B on this
 * thread, which the fork refused (EBUSY); settle ignored it and the block
 * stayed allocated in B for good. Now the free is a nested call (no
 * cache): B's requests.current is 0 after the release. */
static pinpool_buffer_t *br_buf;
static _Atomic int br_armed, br_in_cb, br_rc = 1;
static void br_free_a(void *ctx, void *p, size_t size) {
  (void)ctx;
  if (atomic_exchange(&br_armed, 0)) {
    atomic_store(&br_in_cb, 1);
    unsigned t0 = now_ms(); /* until the fork waits for this section */
    while (atomic_load(&pp_fork_gate) == 0 && now_ms() - t0 < RV_MS)
      pp_sleep_ms(1);
    atomic_store(&br_rc, pinpool_buffer_release(br_buf));
  }
  (void)munmap(p, size);
}
static int buffer_fork_run(void) {
  static pinpool_backend_t ba;
  ba = (pinpool_backend_t){"a", be_alloc, br_free_a, NULL, 0};
  pinpool_t *b_pool = NULL;
  if (pinpool_create_with_backend("", &ba, &pool) != 0 ||
      pinpool_create("backend=malloc", &b_pool) != 0)
    return X_SETUP;
  void *a = NULL;
  if (pinpool_alloc(pool, 16 * MiB, &a) != 0 ||
      pinpool_buffer_alloc(b_pool, 4096, &br_buf) != 0)
    return X_SETUP;
  (void)pinpool_free(pool, a);
  (void)pinpool_thread_flush(pool); /* a whole free chunk in A */
  atomic_store(&br_armed, 1);
  pthread_t t;
  pthread_create(&t, NULL, dx_emptier, NULL); /* never used B */
  if (!wait_for(&br_in_cb, 5000))
    return 80;
  fflush(NULL);
  pid_t pid = fork(); /* waits for the emptier's section */
  if (pid == 0)
    _exit(0);
  if (pid < 0 || pp_wait_child(pid, WATCHDOG_MS / 2) != 0)
    return X_FORK_CHILD;
  pthread_join(t, NULL);
  pinpool_stats_t st;
  if (pinpool_get_stats(b_pool, &st) != 0)
    return X_INVALID;
  fprintf(stderr,
          "buffer_release_fork: release %d; pool B's requests.current %llu\n",
          atomic_load(&br_rc), (unsigned long long)st.requests.current);
  if (atomic_load(&br_rc) != 0 || st.requests.current != 0)
    return 81;
  if (pinpool_validate(b_pool) != 0 || pinpool_validate(pool) != 0)
    return X_INVALID;
  pinpool_destroy(b_pool);
  pinpool_destroy(pool);
  return 0;
}
static void buffer_release_fork(void **state) {
  (void)state;
  in_child("buffer_release_fork", buffer_fork_run);
}

/* ---- call_during_teardown (rv37e's d5) -------------------------------------
 * A backend free run by pinpool_destroy calls the pool being destroyed:
 * every such call fails with PINPOOL_EBUSY, nothing changed (before:
 * synchronize and alloc crashed on freed state); the teardown goes on. */
static _Atomic int td_calls, td_busy, td_armed;
static void td_free(void *ctx, void *p, size_t size) {
  (void)ctx;
  if (atomic_exchange(&td_armed, 0)) {
    void *q = NULL;
    pinpool_stats_t st;
    int rc[7] = {pinpool_alloc(pool, 4096, &q), pinpool_free(pool, p),
                 pinpool_synchronize(pool),     pinpool_process_events(pool),
                 pinpool_empty_cache(pool),     pinpool_thread_flush(pool),
                 pinpool_get_stats(pool, &st)};
    for (int i = 0; i < 7; i++) {
      atomic_fetch_add(&td_calls, 1);
      if (rc[i] == PINPOOL_EBUSY)
        atomic_fetch_add(&td_busy, 1);
      else
        fprintf(stderr, "  call %d during the teardown: %d\n", i, rc[i]);
    }
  }
  (void)munmap(p, size);
}
static int teardown_run(void) {
  static pinpool_backend_t be;
  static pinpool_events_t evs;
  be = (pinpool_backend_t){"teardown", be_alloc, td_free, NULL, 0};
  evs = (pinpool_events_t){"teardown", ev_record,  ev_query,
                           ev_sync,    ev_release, NULL};
  pinpool_hooks_t h = {&be, &evs, NULL, NULL};
  if (pinpool_create_ex("", &h, &pool) != 0)
    return X_SETUP;
  void *a = NULL;
  if (pinpool_alloc(pool, 4096, &a) != 0 || pinpool_free(pool, a) != 0)
    return X_SETUP;
  atomic_store(&query_result, 1);
  atomic_store(&td_armed, 1);
  pinpool_destroy(pool);
  fprintf(stderr, "call_during_teardown: %d of %d calls EBUSY\n",
          atomic_load(&td_busy), atomic_load(&td_calls));
  if (atomic_load(&td_calls) != 7 || atomic_load(&td_busy) != 7)
    return 60;
  return 0;
}
static void call_during_teardown(void **state) {
  (void)state;
  in_child("call_during_teardown", teardown_run);
}

/* ---- sync_bounded (rv37e's d3) ---------------------------------------------
 * pinpool_synchronize waits for the blocks freed before it was called, not
 * for those another thread frees meanwhile. S synchronizes block A
 * (stream 1); from inside A's synchronize callback, P frees block B
 * (stream 2) and is held at PP_HOOK_FREE_COUNTED (B counted pending, no
 * event yet) until S has returned, or 5 s. Before the fix S waited for
 * pending_live == 0, B included: it returned only after P's hold timed
 * out. Counted, not timed: did S return while P was still held? */
static _Atomic int sb_go_p, sb_p_held, sb_s_done, sb_timed_out, sb_s_rc = 1;
static pthread_t sb_s_tid, sb_p_tid;
static _Atomic int sb_armed;
static int sb_record(void *ctx, pinpool_stream_t st, void **ev) {
  (void)ctx;
  int *e = malloc(sizeof *e);
  if (e == NULL)
    return PINPOOL_ENOMEM;
  *e = (int)st;
  *ev = e;
  return 0;
}
static int sb_query(void *ctx, void *ev) {
  (void)ctx;
  (void)ev;
  return 1;
}
static int sb_sync(void *ctx, void *ev) {
  (void)ctx;
  if (*(int *)ev == 1 && atomic_load(&sb_armed) &&
      pthread_equal(pthread_self(), sb_s_tid) && !atomic_exchange(&sb_go_p, 1))
    (void)wait_for(&sb_p_held, 5000); /* B is counted, after S came */
  return 0;
}
static void sb_release(void *ctx, void *ev) {
  (void)ctx;
  free(ev);
}
static void sb_hook(int point) {
  if (point != PP_HOOK_FREE_COUNTED || !atomic_load(&sb_armed) ||
      !pthread_equal(pthread_self(), sb_p_tid))
    return;
  atomic_store(&sb_p_held, 1);
  if (!wait_for(&sb_s_done, 5000))
    atomic_store(&sb_timed_out, 1);
}
static void *sb_s(void *arg) {
  (void)arg;
  atomic_store(&sb_s_rc, pinpool_synchronize(pool));
  atomic_store(&sb_s_done, 1);
  return NULL;
}
static void *sb_p(void *arg) {
  (void)arg;
  if (!wait_for(&sb_go_p, 5000))
    return NULL;
  void *b = NULL;
  if (pinpool_alloc(pool, 4096, &b) == 0 &&
      pinpool_record_stream(pool, b, 2) == 0)
    (void)pinpool_free(pool, b);
  return NULL;
}
static int sync_bounded_run(void) {
  static pinpool_events_t evs;
  evs = (pinpool_events_t){"bounded", sb_record,  sb_query,
                           sb_sync,   sb_release, NULL};
  pinpool_hooks_t h = {NULL, &evs, NULL, NULL};
  if (pinpool_create_ex("backend=malloc", &h, &pool) != 0)
    return X_SETUP;
  void *a = NULL;
  if (pinpool_alloc(pool, 4096, &a) != 0 ||
      pinpool_record_stream(pool, a, 1) != 0 || pinpool_free(pool, a) != 0)
    return X_SETUP;
  atomic_store(&pp_test_hook, sb_hook);
  atomic_store(&sb_armed, 1);
  pthread_create(&sb_p_tid, NULL, sb_p, NULL);
  pthread_create(&sb_s_tid, NULL, sb_s, NULL);
  pthread_join(sb_s_tid, NULL);
  pthread_join(sb_p_tid, NULL);
  atomic_store(&sb_armed, 0);
  atomic_store(&pp_test_hook, NULL);
  fprintf(stderr,
          "sync_bounded: synchronize %d; P held %d; returned while B "
          "(freed after the call) was held: %s\n",
          atomic_load(&sb_s_rc), atomic_load(&sb_p_held),
          atomic_load(&sb_timed_out) ? "no" : "yes");
  if (atomic_load(&sb_s_rc) != 0 || !atomic_load(&sb_p_held))
    return 70;
  if (atomic_load(&sb_timed_out))
    return 71; /* it waited for B */
  if (pinpool_synchronize(pool) != 0 || pinpool_validate(pool) != 0)
    return X_INVALID;
  pinpool_destroy(pool);
  return 0;
}
static void sync_bounded(void **state) {
  (void)state;
  in_child("sync_bounded", sync_bounded_run);
}

int main(int argc, char **argv) {
  pp_clean_env();
  const struct CMUnitTest all[] = {
      cmocka_unit_test(matrix),
      cmocka_unit_test(settle_tickets),
      cmocka_unit_test(exit_trim_nests),
      cmocka_unit_test(destroy_in_callout_fork),
      cmocka_unit_test(buffer_release_fork),
      cmocka_unit_test(call_during_teardown),
      cmocka_unit_test(sync_bounded),
  };
  return pp_run_selected("reenter_matrix", all, sizeof all / sizeof all[0],
                         argc, argv);
}
