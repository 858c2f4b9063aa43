/*
 * The owner's CPU cost of the return check (issue 36, second round): the
 * token and peer comparison and the borrower's pidfd poll in
 * pinpool_lend_return. Built twice from the same sources, once as is and
 * once with -DPINPOOL_MUTANT_SHARE_NO_TOKEN (the mutant that skips exactly
 * that check, tests/CMakeLists.txt), and run in turn:
 *
 *   cc -O2 -DPINPOOL_BUILDING -Iinclude -Isrc src/*.c \
 *      bench/results/issue36/check_cost.c -o /tmp/cc_check -lpthread -ldl -lm
 *   cc ... -DPINPOOL_MUTANT_SHARE_NO_TOKEN ... -o /tmp/cc_nocheck
 *
 * Each lends one block to a live child (sleeping) and takes it back, N
 * times, and prints the thread CPU time per return (CLOCK_THREAD_CPUTIME_ID
 * around pinpool_lend_return alone) and per lend + return cycle.
 */
#include "pinpool.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  pinpool_t *pool = NULL;
  void *b = NULL;
  if (pinpool_create("shared=1,mlock=0,backend=host", &pool) != 0 ||
      pinpool_alloc(pool, 1 << 20, &b) != 0) {
    fprintf(stderr, "setup: %s\n", pinpool_last_error());
    return 1;
  }
  double ret_ns = 0;
  double t0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  for (long i = 0; i < n; i++) {
    pinpool_share_handle_t h;
    int fd;
    if (pinpool_lend(pool, b, child, &h, &fd) != 0) {
      fprintf(stderr, "lend: %s\n", pinpool_last_error());
      return 1;
    }
    double a = now_ns(CLOCK_THREAD_CPUTIME_ID);
    int rc = pinpool_lend_return(pool, &h, child);
    ret_ns += now_ns(CLOCK_THREAD_CPUTIME_ID) - a;
    if (rc != 0) {
      fprintf(stderr, "return: %s\n", pinpool_last_error());
      return 1;
    }
  }
  double all = now_ns(CLOCK_THREAD_CPUTIME_ID) - t0;
  printf("returns %ld return_cpu_ns %.1f cycle_cpu_ns %.1f\n", n, ret_ns / n,
         all / n);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  pinpool_free(pool, b);
  pinpool_destroy(pool);
  return 0;
}
