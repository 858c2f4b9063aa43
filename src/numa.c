/*
 * NUMA-local reuse (numa=local; docs/allocation-policy.md, "NUMA-local
 * reuse"): the topology, read once at create, and "the calling thread's
 * node".
 *
 * The thread's node is the node of the CPU it runs on (sched_getcpu, which
 * glibc answers from the rseq area without a system call, and the CPU ->
 * node table parsed here). Not the node of its memory policy: reading that
 * is a get_mempolicy system call per allocation. A thread bound with
 * `numactl --cpunodebind` (or sched_setaffinity to one node's CPUs) runs
 * only there, so the two agree; one bound with --membind alone but free to
 * run anywhere gets the memory of the node it happens to run on.
 *
 * Fake topologies (numa_fake_nodes=K, for tests): CPU c is on node c % K,
 * and node k's memory is bound to real node k % (real nodes), since a
 * node that does not exist cannot be bound to.
 */
#include "internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

_Atomic(pp_test_numa_fn) pp_test_numa_node;

/* Parse a sysfs list ("0-3,8,10-11") and call fn(i, arg) for each number;
 * numbers above max are ignored. */
static void parse_list(const char *s, unsigned max,
                       void (*fn)(unsigned, void *), void *arg) {
  while (*s != '\0' && *s != '\n') {
    char *end;
    unsigned long a = strtoul(s, &end, 10), b = a;
    if (end == s)
      return;
    if (*end == '-') {
      s = end + 1;
      b = strtoul(s, &end, 10);
      if (end == s)
        return;
    }
    for (unsigned long i = a; i <= b && i <= max; i++)
      fn((unsigned)i, arg);
    s = *end == ',' ? end + 1 : end;
  }
}

static int read_line(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return -1;
  char *ok = fgets(buf, (int)len, f);
  (void)fclose(f);
  return ok == NULL ? -1 : 0;
}

typedef struct node_set {
  unsigned n;
  int ids[PP_NUMA_MAX];
} node_set_t;

static void add_node(unsigned i, void *arg) {
  node_set_t *ns = arg;
  if (ns->n < PP_NUMA_MAX)
    ns->ids[ns->n++] = (int)i;
}

typedef struct cpu_fill {
  uint16_t *map;
  unsigned ncpus;
  uint16_t node;
} cpu_fill_t;

static void set_cpu(unsigned cpu, void *arg) {
  cpu_fill_t *f = arg;
  if (cpu < f->ncpus)
    f->map[cpu] = f->node;
}

int pp_numa_init(pinpool_t *pool) {
  const pp_config_t *c = &pool->cfg;
  pool->nnodes = 1;
  pool->place[0] = c->numa_node; /* -1: no placement */
  if (c->numa != PP_NUMA_LOCAL) {
    pool->nvshards = c->shards;
    return 0;
  }
  /* The real nodes with memory: "online" (a kernel without NUMA: node 0). */
  node_set_t real = {0, {0}};
  char line[4096];
  if (read_line("/sys/devices/system/node/online", line, sizeof line) == 0)
    parse_list(line, 1023, add_node, &real);
  if (real.n == 0)
    add_node(0, &real);
  long ncpu = sysconf(_SC_NPROCESSORS_CONF);
  pool->ncpus = ncpu < 1 ? 1u : ncpu > 65536 ? 65536u : (unsigned)ncpu;
  pool->cpu_node = calloc(pool->ncpus, sizeof *pool->cpu_node);
  if (pool->cpu_node == NULL)
    return pp_fail(PINPOOL_ENOMEM, "pinpool_create: out of memory");
  if (c->numa_fake_nodes > 0) {
    pool->nnodes = c->numa_fake_nodes;
    for (unsigned cpu = 0; cpu < pool->ncpus; cpu++)
      pool->cpu_node[cpu] = (uint16_t)(cpu % pool->nnodes);
    for (unsigned k = 0; k < pool->nnodes; k++)
      pool->place[k] = real.ids[k % real.n];
  } else {
    /* Node k of the pool is real node real.ids[k]; the ids may have gaps
     * (a node without memory is not online). */
    pool->nnodes = real.n;
    for (unsigned k = 0; k < real.n; k++) {
      pool->place[k] = real.ids[k];
      char path[96];
      (void)snprintf(path, sizeof path,
                     "/sys/devices/system/node/node%d/cpulist", real.ids[k]);
      cpu_fill_t f = {pool->cpu_node, pool->ncpus, (uint16_t)k};
      if (read_line(path, line, sizeof line) == 0)
        parse_list(line, pool->ncpus - 1, set_cpu, &f);
    }
  }
  pool->nvshards = c->shards * pool->nnodes;
  pool->epoch_tag = pool->nnodes > 1 ? PP_EPOCH_NUMA : 0;
  return 0;
}

void pp_numa_fini(pinpool_t *pool) { free(pool->cpu_node); }

unsigned pp_numa_current(const pinpool_t *pool) {
  if (pool->nnodes == 1)
    return 0;
  pp_test_numa_fn f =
      atomic_load_explicit(&pp_test_numa_node, memory_order_acquire);
  int n = f != NULL ? f() : -1;
  if (n < 0) {
    int cpu = sched_getcpu();
    n = cpu >= 0 && (unsigned)cpu < pool->ncpus ? pool->cpu_node[cpu] : 0;
  }
  return (unsigned)n % pool->nnodes;
}

void pp_numa_follow(pinpool_t *pool, pp_tcache_t *tc) {
  unsigned node = pp_numa_current(pool);
  if (pp_likely(node == tc->node))
    return;
  /* Every block goes back to its own node's lists (pp_central_give routes
   * by segment), so the cache holds only the new node's from now on. */
  pp_tcache_flush_all(tc);
  tc->node = node;
}
