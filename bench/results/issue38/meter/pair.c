/*
 * W1's cached pair under callgrind (issue 38, the meter's findings):
 * PAIRS alloc/free pairs of one size after one warm-up pair, so that the
 * instructions per call are counted with a fixed operation count, whatever
 * the machine's load. Built against each revision's libpinpool.a:
 *   cc -O2 -I include pair.c build/release/libpinpool.a -lpthread -ldl
 *   valgrind --tool=callgrind ./a.out SIZE PAIRS
 */
#include "pinpool.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
  size_t size = argc > 1 ? strtoull(argv[1], NULL, 0) : 4096;
  long pairs = argc > 2 ? atol(argv[2]) : 10000;
  pinpool_t *pool;
  if (pinpool_create("backend=host,mlock=0,populate=0", &pool) != 0)
    return 1;
  void *p;
  for (long i = 0; i <= pairs; i++) {
    if (pinpool_alloc(pool, size, &p) != 0 || pinpool_free(pool, p) != 0)
      return 1;
  }
  pinpool_destroy(pool);
  return 0;
}
