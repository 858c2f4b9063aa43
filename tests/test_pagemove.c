/*
 * The page move (src/pagemove.c; docs/allocation-policy.md, "Page-moving
 * growth"): what the kernel does to the pages, counted from /proc and
 * getrusage, never timed.
 *
 * - locked: every other piece of a locked chunk moved into a reserved
 *   range: the marks arrive, no page faults (moving or touching), the
 *   moved pages and the unmoved rest of the chunk stay locked, the holes
 *   are PROT_NONE with nothing resident and stay reserved (another
 *   mapping cannot land in them), VmLck unchanged;
 * - unlocked: the same for a pool without mlock, with two system calls a
 *   piece and nothing locked;
 * - memlock_limit: a child without CAP_IPC_LOCK under an 8 MiB
 *   RLIMIT_MEMLOCK locks, moves and unmaps 20 times: every lock granted
 *   (MREMAP_DONTUNMAP of a locked range counted the moved bytes twice);
 * - each_call_fails: fault=move:N for every call of a move: a failure
 *   leaves the pages where they were, locked, the target empty and
 *   PROT_NONE, VmLck unchanged; a failed mprotect of the hole is a move
 *   with PP_MOVE_HOLE_OPEN; the reservation fails with nothing made.
 */
#include "testutil.h"

#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

enum { PIECE = 1 << 20, NPIECES = 8 };

/* The sanitizers' runtimes make mlock and munlock do nothing (their
 * interceptors), so smaps shows nothing locked there: the lock checks
 * hold in the plain builds only. */
#ifdef PP_SANITIZED
#define LOCKS_SEEN false
#else
#define LOCKS_SEEN true
#endif
/* The locked kB smaps must show: `kb` when locked, 0 when not. */
static bool locked_as(long got, bool locked, long kb) {
  return !LOCKS_SEEN || got == (locked ? kb : 0);
}

static long minflt(void) {
  struct rusage ru;
  (void)getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* VmLck of this process, kB. */
static long vmlck_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  PP_ASSERT(f != NULL, "/proc/self/status");
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "VmLck:", 6) == 0)
      v = strtol(line + 6, NULL, 10);
  fclose(f);
  return v;
}

typedef struct range_facts {
  long rss_kb, locked_kb;
  bool all_none; /* every mapping in the range is ---p */
  bool covered;  /* the mappings cover the whole range */
} range_facts_t;

/* What smaps says of [lo, lo + len): the mappings wholly inside it. */
static range_facts_t facts(const void *lo_p, size_t len) {
  uintptr_t lo = (uintptr_t)lo_p, hi = lo + len;
  range_facts_t r = {0, 0, true, false};
  FILE *f = fopen("/proc/self/smaps", "r");
  PP_ASSERT(f != NULL, "/proc/self/smaps");
  char line[512];
  bool in = false;
  size_t seen = 0;
  while (fgets(line, sizeof line, f) != NULL) {
    unsigned long a, b;
    char perms[8];
    if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3) {
      in = a >= lo && b <= hi;
      if (in) {
        seen += b - a;
        if (strcmp(perms, "---p") != 0)
          r.all_none = false;
      }
      continue;
    }
    if (in && strncmp(line, "Rss:", 4) == 0)
      r.rss_kb += strtol(line + 4, NULL, 10);
    else if (in && strncmp(line, "Locked:", 7) == 0)
      r.locked_kb += strtol(line + 7, NULL, 10);
  }
  fclose(f);
  r.covered = seen == len;
  return r;
}

/* The range is still this process's: a mapping there is refused. */
static bool taken(void *p, size_t len) {
  void *q = mmap(p, len, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (q == MAP_FAILED)
    return errno == EEXIST;
  (void)munmap(q, len); /* a kernel without NOREPLACE put it elsewhere */
  return q != p;
}

static void mark(char *chunk) {
  for (size_t i = 0; i < NPIECES; i++)
    for (size_t off = 0; off < PIECE; off += 4096)
      chunk[i * PIECE + off] = (char)(i + 1);
}

static bool marked(const char *p, size_t piece_no) {
  for (size_t off = 0; off < PIECE; off += 4096)
    if (p[off] != (char)(piece_no + 1))
      return false;
  return true;
}

/* A populated chunk of NPIECES pieces, locked if asked (skip the test if
 * this process may not lock 8 MiB). */
static char *chunk_new(bool locked) {
  char *c = mmap(NULL, NPIECES * PIECE, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  PP_ASSERT(c != MAP_FAILED, "mmap");
  mark(c);
  if (locked && mlock(c, NPIECES * PIECE) != 0) {
    (void)munmap(c, NPIECES * PIECE);
    return NULL;
  }
  return c;
}

/* Every other piece of a chunk into one reserved range of half its size:
 * the design's assembly, by hand. */
static void move_every_other(bool locked) {
  pp_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  pp_fault_t counter = {0, 0};
  /* Counts the move's system calls: a fault that never fires. */
  cfg.fault_site = PP_FAULT_MOVE;
  cfg.fault_n = UINT64_MAX;
  cfg.fault_count = 1;
  cfg.fault = &counter;
  char *c = chunk_new(locked);
  if (c == NULL) {
    skip(); /* no mlock here: RLIMIT_MEMLOCK */
    return;
  }
  long lck0 = vmlck_kb();
  void *t = NULL;
  PP_OK(pp_space_reserve(&cfg, NPIECES / 2 * PIECE, &t));
  char *target = t;
  PP_ASSERT(facts(target, NPIECES / 2 * PIECE).rss_kb == 0,
            "a reservation holds no pages");
  uint64_t calls0 = counter.calls;
  long f0 = minflt();
  for (size_t k = 0; k < NPIECES / 2; k++) {
    unsigned notes = 99;
    PP_OK(pp_pages_move(&cfg, target + k * PIECE, c + 2 * k * PIECE, PIECE,
                        locked, &notes));
    PP_ASSERT(notes == 0, "piece %zu: notes %u", k, notes);
  }
  long f1 = minflt();
  for (size_t k = 0; k < NPIECES / 2; k++)
    PP_ASSERT(marked(target + k * PIECE, 2 * k), "piece %zu's pages", 2 * k);
  for (size_t off = 0; off < NPIECES / 2 * PIECE; off += 4096)
    target[off + 1] = 1; /* a write to every moved page */
  long f2 = minflt();
#ifndef PP_SANITIZED
  PP_ASSERT(f1 - f0 == 0 && f2 - f1 == 0,
            "page faults: %ld moving, %ld touching the moved pages", f1 - f0,
            f2 - f1);
#else
  (void)f0, (void)f1, (void)f2; /* the sanitizers' shadow faults too */
#endif
  uint64_t per = locked ? 4 : 2;
  PP_ASSERT(counter.calls - calls0 == per * NPIECES / 2,
            "%llu system calls for %d pieces (%llu a piece expected)",
            (unsigned long long)(counter.calls - calls0), NPIECES / 2,
            (unsigned long long)per);
  range_facts_t tf = facts(target, NPIECES / 2 * PIECE);
  long half_kb = (long)(NPIECES / 2 * PIECE / 1024);
  PP_ASSERT(tf.covered && tf.rss_kb == half_kb &&
                locked_as(tf.locked_kb, locked, half_kb),
            "target: rss %ld kB, locked %ld kB (%ld expected)", tf.rss_kb,
            tf.locked_kb, locked ? half_kb : 0);
  for (size_t k = 0; k < NPIECES; k++) {
    range_facts_t pf = facts(c + k * PIECE, PIECE);
    long piece_kb = PIECE / 1024;
    if (k % 2 == 0) {
      PP_ASSERT(pf.covered && pf.all_none && pf.rss_kb == 0,
                "hole %zu: PROT_NONE %d, rss %ld kB", k, pf.all_none,
                pf.rss_kb);
      PP_ASSERT(taken(c + k * PIECE, PIECE), "hole %zu is not reserved", k);
    } else {
      PP_ASSERT(pf.rss_kb == piece_kb && marked(c + k * PIECE, k),
                "piece %zu (not moved) changed", k);
      PP_ASSERT(locked_as(pf.locked_kb, locked, piece_kb),
                "piece %zu (not moved): locked %ld kB, %ld expected", k,
                pf.locked_kb, locked ? piece_kb : 0);
    }
  }
  PP_ASSERT(vmlck_kb() == lck0, "VmLck %ld kB, was %ld", vmlck_kb(), lck0);
  pp_space_release(target, NPIECES / 2 * PIECE);
  PP_ASSERT(munmap(c, NPIECES * PIECE) == 0, "the chunk, holes included");
  PP_ASSERT(vmlck_kb() == lck0 - (locked && LOCKS_SEEN ? half_kb * 2 : 0),
            "VmLck %ld kB after the unmaps", vmlck_kb());
}

static void test_pagemove_locked(void **state) {
  (void)state;
  move_every_other(true);
}

static void test_pagemove_unlocked(void **state) {
  (void)state;
  move_every_other(false);
}

/* The child: no CAP_IPC_LOCK (a root test drops to nobody), 8 MiB of
 * RLIMIT_MEMLOCK; 20 rounds of a 2 MiB locked chunk whose first half
 * moves, then both unmapped. Exit 0, or the round whose mlock failed. */
static int memlock_child(void) {
  struct rlimit rl = {8 << 20, 8 << 20};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    return 100;
  if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
    return 101;
  pp_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  for (int round = 0; round < 20; round++) {
    char *c = mmap(NULL, 2 << 20, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *t = NULL;
    unsigned notes = 0;
    if (c == MAP_FAILED || mlock(c, 2 << 20) != 0)
      return 1 + round;
    if (pp_space_reserve(&cfg, 1 << 20, &t) != 0 ||
        pp_pages_move(&cfg, t, c, 1 << 20, true, &notes) != 0 || notes != 0)
      return 50 + round;
    (void)munmap(c, 2 << 20);
    pp_space_release(t, 1 << 20);
  }
  return 0;
}

static void test_pagemove_memlock_limit(void **state) {
  (void)state;
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0)
    _exit(memlock_child());
  int st = 0;
  PP_ASSERT(waitpid(pid, &st, 0) == pid && WIFEXITED(st), "the child");
  int rc = WEXITSTATUS(st);
  if (rc == 100 || rc == 101) {
    skip(); /* cannot drop the privilege or set the limit here */
    return;
  }
  PP_ASSERT(rc == 0,
            "%s in round %d: the moves left RLIMIT_MEMLOCK counting bytes "
            "nothing locks",
            rc < 50 ? "mlock refused" : "the move failed",
            rc < 50 ? rc - 1 : rc - 50);
}

/* One piece moved with the N-th call failing. */
static void fail_call(uint64_t n, bool locked) {
  pp_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  pp_fault_t counter = {0, 0};
  cfg.fault_site = PP_FAULT_MOVE;
  cfg.fault_n = n;
  cfg.fault_count = 1;
  cfg.fault = &counter;
  char *c = chunk_new(locked);
  if (c == NULL) {
    skip();
    return;
  }
  long lck0 = vmlck_kb(), piece_kb = PIECE / 1024;
  void *t = NULL;
  /* The reservation is call 1 of this sequence: its failure makes
   * nothing (and is tested on its own below), so count it out. */
  cfg.fault_n = n + 1;
  PP_OK(pp_space_reserve(&cfg, PIECE, &t));
  char *target = t;
  unsigned notes = 99;
  int rc = pp_pages_move(&cfg, target, c, PIECE, locked, &notes);
  PP_ASSERT(counter.fired == 1, "call %llu never came (%llu calls)",
            (unsigned long long)n, (unsigned long long)counter.calls);
  /* The chunk as a whole: a piece of one mapping has no smaps of its own
   * until something splits it. */
  range_facts_t to = facts(target, PIECE);
  range_facts_t all = facts(c, NPIECES * PIECE);
  long chunk_kb = NPIECES * piece_kb;
  unsigned third = 3; /* the hole's mprotect, in either sequence */
  uint64_t mprotect_call = locked ? third : third - 1;
  if (n == mprotect_call) {
    PP_OK(rc);
    PP_ASSERT(notes == PP_MOVE_HOLE_OPEN, "notes %u", notes);
    PP_ASSERT(marked(target, 0) && to.rss_kb == piece_kb &&
                  locked_as(to.locked_kb, locked, piece_kb),
              "moved with an open hole: target rss %ld, locked %ld", to.rss_kb,
              to.locked_kb);
    /* The open hole may still be one mapping with the chunk's rest (same
     * flags, unlocked): the chunk's resident bytes say it is empty. */
    PP_ASSERT(all.rss_kb == chunk_kb - piece_kb && taken(c, PIECE),
              "the open hole: the chunk holds %ld kB", all.rss_kb);
    PP_ASSERT(locked_as(all.locked_kb, locked, chunk_kb - piece_kb),
              "the chunk's rest: locked %ld kB", all.locked_kb);
  } else {
    PP_CHECK_RC(rc, PINPOOL_EBACKEND);
    PP_ASSERT(notes == 0, "call %llu: notes %u", (unsigned long long)n, notes);
    /* Nothing changed: the pages where they were, locked as they were;
     * the target empty and PROT_NONE. */
    PP_ASSERT(marked(c, 0) && all.covered && all.rss_kb == chunk_kb &&
                  locked_as(all.locked_kb, locked, chunk_kb),
              "call %llu failed: the pages at home: rss %ld, locked %ld kB "
              "of %ld",
              (unsigned long long)n, all.rss_kb, all.locked_kb, chunk_kb);
    PP_ASSERT(to.covered && to.all_none && to.rss_kb == 0,
              "call %llu failed: the target: PROT_NONE %d, rss %ld kB",
              (unsigned long long)n, to.all_none, to.rss_kb);
  }
  PP_ASSERT(vmlck_kb() == lck0, "call %llu: VmLck %ld kB, was %ld",
            (unsigned long long)n, vmlck_kb(), lck0);
  pp_space_release(target, PIECE);
  PP_ASSERT(munmap(c, NPIECES * PIECE) == 0, "munmap");
}

static void test_pagemove_each_call_fails(void **state) {
  (void)state;
  for (uint64_t n = 1; n <= 4; n++)
    fail_call(n, true);
  for (uint64_t n = 1; n <= 2; n++)
    fail_call(n, false);
  /* The reservation itself. */
  pp_config_t cfg;
  memset(&cfg, 0, sizeof cfg);
  pp_fault_t counter = {0, 0};
  cfg.fault_site = PP_FAULT_MOVE;
  cfg.fault_n = 1;
  cfg.fault_count = 1;
  cfg.fault = &counter;
  void *t = (void *)&cfg;
  PP_CHECK_RC(pp_space_reserve(&cfg, PIECE, &t), PINPOOL_ENOMEM);
  PP_ASSERT(t == (void *)&cfg, "a failed reservation set its answer");
}

int main(int argc, char **argv) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test(test_pagemove_locked),
      cmocka_unit_test(test_pagemove_unlocked),
      cmocka_unit_test(test_pagemove_memlock_limit),
      cmocka_unit_test(test_pagemove_each_call_fails),
  };
  return pp_run_selected("test_pagemove", all, sizeof all / sizeof all[0], argc,
                         argv);
}
