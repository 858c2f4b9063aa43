/*
 * numa=local (docs/allocation-policy.md, "NUMA-local reuse"): central lists,
 * arenas and thread caches per NUMA node.
 *
 * On a machine of one node, fake topologies (numa_fake_nodes=K) and the
 * test hook for "the calling thread's node" (pp_test_numa_node) make 2-4
 * nodes: a thread is on the node this file's thread-local `my_node` says
 * (-1: the node of its CPU). What is proven:
 *  - every block handed to a thread is from its node (pinpool_block_node),
 *    whichever sizes (slab classes, large blocks, hot slots);
 *  - a block freed by a thread of another node goes home: the other node's
 *    next allocation does not get it, and its own node reuses it without
 *    growing (fails against PINPOOL_MUTANT_NUMA_NO_ROUTE, tests/mutants);
 *  - a thread that changes node flushes its cache (the validator checks that
 *    a cache holds only its node's blocks);
 *  - a node out of memory: PINPOOL_ENOMEM without numa_spill, a counted
 *    spill with it, which leaves the thread's last error as it was;
 *  - stats per node are exact (testutil's PP_CHECK_CONSISTENT adds the
 *    nodes up), snapshots show each segment's and chunk's node;
 *  - placement: get_mempolicy finds each node's memory bound to its real
 *    node (fake node k on real node k % real nodes), on every node the
 *    machine has; without the hook, a thread pinned to a CPU gets that
 *    CPU's node's memory;
 *  - every bad configuration is refused with PINPOOL_ECONFIG.
 */
#include "testutil.h"

#include "internal.h" /* pp_test_numa_node */

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_BIND 2
#define SENTINEL ((pinpool_t *)(uintptr_t)0x5e471e1)
#define MPOL_F_ADDR (1 << 1)

static _Thread_local int my_node = -1;
static int node_hook(void) { return my_node; }

static int setup(void **state) {
  (void)state;
  atomic_store(&pp_test_numa_node, node_hook);
  return 0;
}
static int teardown(void **state) {
  (void)state;
  atomic_store(&pp_test_numa_node, NULL);
  return 0;
}

static unsigned node_of_block(pinpool_t *pool, void *p) {
  unsigned n = 99;
  PP_OK(pinpool_block_node(pool, p, &n));
  return n;
}

/* Sizes that take every path: slab classes, a class above tcache_bytes / 16
 * (one-block stacks and hot slots), large blocks. */
static const size_t sizes[] = {700,     4 * KiB, 64 * KiB, 300 * KiB,
                               2 * MiB, 5 * MiB, 8 * MiB};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* ---- Configuration ------------------------------------------------------- */

static void test_config_errors(void **state) {
  (void)state;
  static const char *const bad[] = {
      "numa=bogus",
      "numa=",
      "numa=on",
      "numa=local,numa_node=0",
      "numa_node=0,numa=local",
      "numa=local,backend=malloc",
      "numa=local,backend=cuda",
      "numa_spill=1",
      "numa=off,numa_spill=0",
      "numa_fake_nodes=2",
      "numa=local,numa_fake_nodes=0",
      "numa=local,numa_fake_nodes=65",
      "numa=local,numa_fake_nodes=-1",
      "numa=local,numa_fake_nodes=x",
      "numa=local,numa_spill=2",
      "numa=local,numa_spill=yes please",
      "numa=local,numa=local",
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    pinpool_t *pool = NULL;
    PP_CHECK_RC(pinpool_create(bad[i], &pool), PINPOOL_ECONFIG);
    PP_ASSERT(pool == NULL, "'%s': *out written on failure", bad[i]);
    PP_ASSERT(strstr(pinpool_last_error(), "numa") != NULL,
              "'%s': the message does not name the key: %s", bad[i],
              pinpool_last_error());
  }
  /* A backend given by the caller cannot place memory on a node. */
  counting_backend_t cb;
  cb_init(&cb);
  pinpool_backend_t table = cb_table(&cb, 1);
  pinpool_t *pool = NULL;
  PP_CHECK_RC(pinpool_create_with_backend("numa=local", &table, &pool),
              PINPOOL_ECONFIG);
  PP_ASSERT(pool == NULL, "user backend: *out written on failure");
  PP_CHECK_CB_CLEAN(&cb);
  cb_fini(&cb);
}

static void test_config_roundtrip(void **state) {
  (void)state;
  pinpool_t *pool, *again;
  PP_OK(pinpool_create("numa=local,numa_spill=1,numa_fake_nodes=3", &pool));
  char a[1024], b[1024];
  PP_OK(pinpool_get_config(pool, a, sizeof a, NULL));
  PP_ASSERT(strstr(a, "numa=local,numa_spill=1,numa_fake_nodes=3") != NULL,
            "config string: %s", a);
  PP_OK(pinpool_create(a, &again));
  PP_OK(pinpool_get_config(again, b, sizeof b, NULL));
  PP_ASSERT(strcmp(a, b) == 0, "round trip: '%s' != '%s'", a, b);
  unsigned n = 0;
  PP_OK(pinpool_numa_nodes(again, &n));
  assert_int_equal(n, 3);
  pinpool_destroy(again);
  pinpool_destroy(pool);
  /* numa=off (the default) says nothing of NUMA but numa_node. */
  PP_OK(pinpool_create("numa=off", &pool));
  PP_OK(pinpool_get_config(pool, a, sizeof a, NULL));
  PP_ASSERT(strstr(a, "numa=") == NULL, "numa=off: %s", a);
  PP_OK(pinpool_numa_nodes(pool, &n));
  assert_int_equal(n, 1);
  pinpool_destroy(pool);
}

static void test_bad_arguments(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=2", &pool));
  unsigned n;
  pinpool_node_stats_t ns;
  PP_CHECK_RC(pinpool_numa_nodes(NULL, &n), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_numa_nodes(pool, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_get_node_stats(NULL, 0, &ns), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_get_node_stats(pool, 0, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_get_node_stats(pool, 2, &ns), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_get_node_stats(pool, UINT32_MAX, &ns), PINPOOL_EINVAL);
  void *p;
  PP_OK(pinpool_alloc(pool, 4096, &p));
  PP_CHECK_RC(pinpool_block_node(NULL, p, &n), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_block_node(pool, NULL, &n), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_block_node(pool, p, NULL), PINPOOL_EINVAL);
  PP_CHECK_RC(pinpool_block_node(pool, (char *)p + 512, &n), PINPOOL_EINTERIOR);
  PP_CHECK_RC(pinpool_block_node(pool, &n, &n), PINPOOL_ENOTOWNED);
  PP_OK(pinpool_free(pool, p));
  PP_CHECK_RC(pinpool_block_node(pool, p, &n), PINPOOL_EDOUBLEFREE);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- Locality -------------------------------------------------------------
 */

/* Each node's thread gets its node's memory, for every size; freed and
 * allocated again (thread caches, hot slots), still. */
static void test_blocks_from_own_node(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=4", &pool));
  void *p[4][NSIZES];
  for (int round = 0; round < 3; round++) {
    for (int k = 0; k < 4; k++) {
      my_node = k;
      for (size_t i = 0; i < NSIZES; i++) {
        PP_OK(pinpool_alloc(pool, sizes[i], &p[k][i]));
        unsigned got = node_of_block(pool, p[k][i]);
        PP_ASSERT(got == (unsigned)k,
                  "round %d: a thread of node %d got %zu bytes of node %u",
                  round, k, sizes[i], got);
      }
    }
    for (int k = 0; k < 4; k++) {
      my_node = k;
      for (size_t i = 0; i < NSIZES; i++)
        PP_OK(pinpool_free(pool, p[k][i]));
    }
    PP_CHECK_CONSISTENT(pool);
  }
  for (unsigned k = 0; k < 4; k++) {
    pinpool_node_stats_t ns;
    PP_OK(pinpool_get_node_stats(pool, k, &ns));
    PP_ASSERT(ns.reserved_bytes > 0 && ns.arena_chunks > 0,
              "node %u holds no memory", k);
  }
  my_node = -1;
  pinpool_destroy(pool);
}

typedef struct remote_arg {
  pinpool_t *pool;
  int node;
  void **blocks;
  size_t n, size;
} remote_arg_t;

static void *free_on_node(void *arg) {
  remote_arg_t *a = arg;
  my_node = a->node;
  for (size_t i = 0; i < a->n; i++)
    PP_OK(pinpool_free(a->pool, a->blocks[i]));
  /* This thread's own allocations, after those frees: its node's memory,
   * never a block it has just freed. */
  for (size_t i = 0; i < a->n; i++) {
    void *q;
    PP_OK(pinpool_alloc(a->pool, a->size, &q));
    unsigned got = node_of_block(a->pool, q);
    PP_ASSERT(got == (unsigned)a->node,
              "a thread of node %d got a block of node %u after freeing "
              "that node's blocks (a free did not go home)",
              a->node, got);
    PP_OK(pinpool_free(a->pool, q));
  }
  return NULL;
}

/* Frees by a thread of another node go to the blocks' own node: the other
 * node's thread never gets them, and their node reuses them (no growth). */
static void test_remote_free_goes_home(void **state) {
  (void)state;
  static const size_t rsizes[] = {4 * KiB, 64 * KiB, 300 * KiB, 8 * MiB};
  for (size_t s = 0; s < sizeof rsizes / sizeof rsizes[0]; s++) {
    pinpool_t *pool;
    PP_OK(pinpool_create("numa=local,numa_fake_nodes=2", &pool));
    enum { N = 16 };
    void *blocks[N];
    my_node = 0;
    for (size_t i = 0; i < N; i++)
      PP_OK(pinpool_alloc(pool, rsizes[s], &blocks[i]));
    pinpool_node_stats_t before;
    PP_OK(pinpool_get_node_stats(pool, 0, &before));
    remote_arg_t a = {pool, 1, blocks, N, rsizes[s]};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, free_on_node, &a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    PP_CHECK_CONSISTENT(pool); /* no cache holds another node's block */
    for (size_t i = 0; i < N; i++) {
      PP_OK(pinpool_alloc(pool, rsizes[s], &blocks[i]));
      assert_int_equal(node_of_block(pool, blocks[i]), 0);
    }
    pinpool_node_stats_t after;
    PP_OK(pinpool_get_node_stats(pool, 0, &after));
    PP_ASSERT(after.reserved_bytes == before.reserved_bytes,
              "%zu bytes: node 0 grew from %llu to %llu bytes to serve "
              "blocks it had been given back",
              rsizes[s], (unsigned long long)before.reserved_bytes,
              (unsigned long long)after.reserved_bytes);
    for (size_t i = 0; i < N; i++)
      PP_OK(pinpool_free(pool, blocks[i]));
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
  }
  my_node = -1;
}

/* A thread that moves to another node flushes its cache: its next blocks
 * are the new node's, and its cache holds none of the old one's. */
static void test_migration(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=3", &pool));
  for (int k = 0; k < 6; k++) {
    my_node = k % 3;
    void *p[32];
    for (int i = 0; i < 32; i++) {
      PP_OK(pinpool_alloc(pool, 1024 << (i % 6), &p[i]));
      assert_int_equal(node_of_block(pool, p[i]), (unsigned)(k % 3));
    }
    for (int i = 0; i < 32; i++)
      PP_OK(pinpool_free(pool, p[i]));
    PP_CHECK_CONSISTENT(pool);
  }
  /* Frees only, after a move: each goes home, none stays in the cache. */
  my_node = 0;
  void *q[8];
  for (int i = 0; i < 8; i++)
    PP_OK(pinpool_alloc(pool, 8 * KiB, &q[i]));
  my_node = 2;
  for (int i = 0; i < 8; i++)
    PP_OK(pinpool_free(pool, q[i]));
  PP_CHECK_CONSISTENT(pool);
  my_node = -1;
  pinpool_destroy(pool);
}

/* ---- A node out of memory -------------------------------------------------
 * fault=alloc:2:2: the first chunk (node 0's) is made, the next two backend
 * allocations (node 1's chunk and the retry after releasing idle memory)
 * fail: node 1 is out of memory. */
static void test_node_oom(void **state) {
  (void)state;
  for (int spill = 0; spill < 2; spill++) {
    char cfg[128];
    snprintf(cfg, sizeof cfg,
             "numa=local,numa_fake_nodes=2,numa_spill=%d,fault=alloc:2:2",
             spill);
    pinpool_t *pool;
    PP_OK(pinpool_create(cfg, &pool));
    my_node = 0;
    void *a, *b;
    PP_OK(pinpool_alloc(pool, 64 * KiB, &a));
    my_node = 1;
    /* A known last error, which a spill must leave as it is. */
    PP_CHECK_RC(pinpool_free(pool, NULL), PINPOOL_EINVAL);
    char before[512];
    snprintf(before, sizeof before, "%s", pinpool_last_error());
    pinpool_stats_t st;
    if (!spill) {
      PP_CHECK_RC(pinpool_alloc(pool, 64 * KiB, &b), PINPOOL_ENOMEM);
      PP_STATS(pool, &st);
      assert_int_equal(st.oom_count, 1);
      assert_int_equal(st.numa_spill_blocks, 0);
      assert_int_equal(st.numa_spill_bytes, 0);
    } else {
      PP_OK(pinpool_alloc(pool, 64 * KiB, &b));
      assert_int_equal(node_of_block(pool, b), 0);
      PP_ASSERT(strcmp(before, pinpool_last_error()) == 0,
                "a spill changed the last error: '%s' -> '%s'", before,
                pinpool_last_error());
      PP_STATS(pool, &st);
      assert_int_equal(st.oom_count, 0);
      assert_int_equal(st.numa_spill_blocks, 1);
      assert_int_equal(st.numa_spill_bytes, 64 * KiB);
      PP_CHECK_CONSISTENT(pool);    /* the spilled block is in no cache */
      PP_OK(pinpool_free(pool, b)); /* from node 1: goes home */
    }
    PP_CHECK_CONSISTENT(pool);
    /* The fault is spent: node 1 has memory again. */
    PP_OK(pinpool_alloc(pool, 64 * KiB, &b));
    assert_int_equal(node_of_block(pool, b), 1);
    PP_OK(pinpool_free(pool, b));
    my_node = 0;
    PP_OK(pinpool_free(pool, a));
    PP_CHECK_CONSISTENT(pool);
    pinpool_destroy(pool);
  }
  my_node = -1;
}

/* ---- Threads ------------------------------------------------------------
 * Threads on 4 fake nodes allocate, free their own blocks and each other's
 * (a shared mailbox): every allocation is from the thread's node; stats are
 * exact afterwards. Run under ThreadSanitizer by the tsan preset. */
enum { NT = 4, MAILBOX = 64, OPS = 4000 };
typedef struct shared {
  pinpool_t *pool;
  pthread_mutex_t mu;
  void *mail[MAILBOX];
  _Atomic(unsigned) wrong;
} shared_t;
typedef struct targ {
  shared_t *sh;
  int node;
  uint64_t seed;
} targ_t;

static void *worker(void *arg) {
  targ_t *t = arg;
  shared_t *sh = t->sh;
  my_node = t->node;
  void *mine[16] = {0};
  uint64_t s = pp_seed(t->seed);
  for (int op = 0; op < OPS; op++) {
    unsigned slot = (unsigned)(pp_rand(&s) % 16);
    if (mine[slot] != NULL) {
      /* Half the blocks go to the mailbox, for another thread to free. */
      void *give = mine[slot];
      mine[slot] = NULL;
      if (pp_rand(&s) % 2) {
        unsigned m = (unsigned)(pp_rand(&s) % MAILBOX);
        pthread_mutex_lock(&sh->mu);
        void *old = sh->mail[m];
        sh->mail[m] = give;
        pthread_mutex_unlock(&sh->mu);
        give = old;
      }
      if (give != NULL)
        PP_OK(pinpool_free(sh->pool, give));
    } else {
      size_t size = pp_rand(&s) % 8 == 0 ? pp_rand_size(&s, 256 * KiB, 4 * MiB)
                                         : pp_rand_size(&s, 1, 64 * KiB);
      PP_OK(pinpool_alloc(sh->pool, size, &mine[slot]));
      unsigned n;
      PP_OK(pinpool_block_node(sh->pool, mine[slot], &n));
      if (n != (unsigned)t->node)
        atomic_fetch_add(&sh->wrong, 1);
    }
    if (op == OPS / 2 && t->node == 1)
      my_node = 0; /* the threads of node 1 move */
    if (my_node != t->node)
      t->node = my_node;
  }
  for (int i = 0; i < 16; i++)
    if (mine[i] != NULL)
      PP_OK(pinpool_free(sh->pool, mine[i]));
  return NULL;
}

static void test_threads(void **state) {
  (void)state;
  static const char *const cfgs[] = {
      "numa=local,numa_fake_nodes=4",
      "numa=local,numa_fake_nodes=4,numa_spill=1,tcache_bytes=0",
      "numa=local,numa_fake_nodes=2,max_cached=4MiB,shards=2",
  };
  for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
    shared_t sh = {.wrong = 0};
    PP_OK(pinpool_create(cfgs[c], &sh.pool));
    pthread_mutex_init(&sh.mu, NULL);
    pthread_t th[NT];
    targ_t ta[NT];
    unsigned nodes;
    PP_OK(pinpool_numa_nodes(sh.pool, &nodes));
    for (int i = 0; i < NT; i++) {
      ta[i] = (targ_t){&sh, i % (int)nodes, (uint64_t)i * 7919 + c};
      assert_int_equal(pthread_create(&th[i], NULL, worker, &ta[i]), 0);
    }
    for (int i = 0; i < NT; i++)
      assert_int_equal(pthread_join(th[i], NULL), 0);
    PP_ASSERT(atomic_load(&sh.wrong) == 0,
              "%s: %u allocations got another node's memory", cfgs[c],
              atomic_load(&sh.wrong));
    for (int m = 0; m < MAILBOX; m++)
      if (sh.mail[m] != NULL)
        PP_OK(pinpool_free(sh.pool, sh.mail[m]));
    PP_CHECK_CONSISTENT(sh.pool);
    pinpool_stats_t st;
    PP_STATS(sh.pool, &st);
    assert_int_equal(st.requests.current, 0);
    PP_OK(pinpool_empty_cache(sh.pool));
    PP_CHECK_CONSISTENT(sh.pool);
    pthread_mutex_destroy(&sh.mu);
    pinpool_destroy(sh.pool);
  }
}

/* ---- Snapshots ------------------------------------------------------------
 */
static void test_snapshot_nodes(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=3", &pool));
  void *p[3];
  for (int k = 0; k < 3; k++) {
    my_node = k;
    PP_OK(pinpool_alloc(pool, 64 * KiB, &p[k]));
  }
  char *text = NULL;
  size_t len = 0;
  PP_OK(pinpool_snapshot_write_mem(pool, &text, &len, 0));
  for (int k = 0; k < 3; k++) {
    char want[32];
    snprintf(want, sizeof want, "\"node\":%d", k);
    PP_ASSERT(strstr(text, want) != NULL, "snapshot has no %s", want);
  }
  pinpool_snapshot_free(text);
  for (int k = 0; k < 3; k++) {
    my_node = k;
    PP_OK(pinpool_free(pool, p[k]));
  }
  my_node = -1;
  pinpool_destroy(pool);
}

/* ---- Placement on the machine's topology ----------------------------------
 */
static int policy_of(void *addr, int *mode, unsigned long *mask) {
  return (int)syscall(SYS_get_mempolicy, mode, mask, 1024 + 1, addr,
                      MPOL_F_ADDR);
}

/* Every node's blocks are bound to the node pinpool_get_node_stats names;
 * returns false if the kernel has no NUMA support. */
static bool check_placement(pinpool_t *pool, unsigned nodes) {
  for (unsigned k = 0; k < nodes; k++) {
    my_node = (int)k;
    pinpool_node_stats_t ns;
    PP_OK(pinpool_get_node_stats(pool, k, &ns));
    void *p[2];
    PP_OK(pinpool_alloc(pool, 64 * KiB, &p[0]));
    PP_OK(pinpool_alloc(pool, 8 * MiB, &p[1]));
    PP_OK(pinpool_get_node_stats(pool, k, &ns));
    for (int i = 0; i < 2; i++) {
      assert_int_equal(node_of_block(pool, p[i]), k);
      int mode = -1;
      unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
      if (policy_of(p[i], &mode, mask) != 0 && errno == ENOSYS) {
        print_message("get_mempolicy: no NUMA support; placement not "
                      "checked\n");
        PP_OK(pinpool_free(pool, p[0]));
        PP_OK(pinpool_free(pool, p[1]));
        return false;
      }
      size_t bits = 8 * sizeof(unsigned long);
      PP_ASSERT(ns.os_node >= 0 && mode == MPOL_BIND &&
                    mask[ns.os_node / bits] == 1ul << (ns.os_node % bits),
                "node %u (machine node %d): block %p has policy %d, mask "
                "word %#lx",
                k, ns.os_node, p[i], mode,
                ns.os_node >= 0 ? mask[ns.os_node / bits] : 0ul);
    }
    PP_OK(pinpool_free(pool, p[0]));
    PP_OK(pinpool_free(pool, p[1]));
  }
  my_node = -1;
  return true;
}

static int real_nodes(void) {
  int n = 0;
  for (int i = 0; i < 1024; i++) {
    char path[64];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d", i);
    if (access(path, F_OK) == 0)
      n++;
  }
  return n < 1 ? 1 : n;
}

static void test_placement(void **state) {
  (void)state;
  /* The machine's own nodes, each bound to itself. */
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local", &pool));
  unsigned nodes = 0;
  PP_OK(pinpool_numa_nodes(pool, &nodes));
  PP_ASSERT((int)nodes == real_nodes(), "numa=local: %u nodes, machine has %d",
            nodes, real_nodes());
  bool numa = check_placement(pool, nodes);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  print_message("checked placement on %u machine node(s)\n", nodes);
  if (!numa)
    return;
  /* A fake topology: node k on machine node k % (machine nodes). */
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=4,hugepages=1", &pool));
  for (unsigned k = 0; k < 4; k++) {
    pinpool_node_stats_t ns;
    PP_OK(pinpool_get_node_stats(pool, k, &ns));
    PP_ASSERT(ns.os_node >= 0, "fake node %u placed nowhere", k);
  }
  (void)check_placement(pool, 4);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

typedef struct cpu_arg {
  pinpool_t *pool;
  int cpu;
  unsigned want;
  unsigned got;
} cpu_arg_t;

static void *alloc_on_cpu(void *arg) {
  cpu_arg_t *a = arg;
  my_node = -1; /* the CPU's node */
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(a->cpu, &set);
  if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) {
    a->got = a->want; /* not allowed here: nothing to check */
    return NULL;
  }
  void *p;
  PP_OK(pinpool_alloc(a->pool, 64 * KiB, &p));
  a->got = node_of_block(a->pool, p);
  PP_OK(pinpool_free(a->pool, p));
  return NULL;
}

/* Without the hook: the node of the CPU the thread runs on (fake topology:
 * CPU c is on node c % K). */
static void test_cpu_node(void **state) {
  (void)state;
  atomic_store(&pp_test_numa_node, NULL);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=2", &pool));
  for (int cpu = 0; cpu < ncpu && cpu < 8; cpu++) {
    cpu_arg_t a = {pool, cpu, (unsigned)(cpu % 2), 99};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, alloc_on_cpu, &a), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    PP_ASSERT(a.got == a.want, "a thread on CPU %d got node %u, want %u", cpu,
              a.got, a.want);
  }
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
  atomic_store(&pp_test_numa_node, node_hook);
}

/* numa=local with a reserve: each node gets one, on it. */
static void test_reserve_per_node(void **state) {
  (void)state;
  pinpool_t *pool;
  PP_OK(pinpool_create("numa=local,numa_fake_nodes=2,reserve=4MiB", &pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  assert_int_equal(st.reserve_bytes, 8 * MiB);
  for (unsigned k = 0; k < 2; k++) {
    pinpool_node_stats_t ns;
    PP_OK(pinpool_get_node_stats(pool, k, &ns));
    assert_int_equal(ns.reserved_bytes, 4 * MiB);
    my_node = (int)k;
    void *p;
    PP_OK(pinpool_alloc(pool, 1 * MiB, &p));
    assert_int_equal(node_of_block(pool, p), k);
    PP_OK(pinpool_free(pool, p));
  }
  PP_STATS(pool, &st);
  assert_int_equal(st.reserved_bytes.current, 8 * MiB); /* no growth */
  PP_OK(pinpool_empty_cache(pool));
  PP_CHECK_CONSISTENT(pool);
  my_node = -1;
  pinpool_destroy(pool);
}

/* numa=local with a reserve: every node gets one, so max_reserved is
 * checked against the reserve times the nodes at create, a configuration
 * error before anything is mapped (issue 37, D3: the pool mapped and
 * populated node 0's reserve, unmapped it and failed with ENOMEM). */
static _Atomic unsigned g_populates;
static void count_populate(int point) {
  if (point == PP_HOOK_POPULATE)
    atomic_fetch_add(&g_populates, 1);
}

static void test_reserve_over_cap(void **state) {
  (void)state;
  pinpool_t *pool = SENTINEL;
  atomic_store(&g_populates, 0);
  atomic_store(&pp_test_hook, count_populate);
  int rc = pinpool_create(
      "numa=local,numa_fake_nodes=2,reserve=4MiB,max_reserved=6MiB", &pool);
  atomic_store(&pp_test_hook, NULL);
  PP_CHECK_RC(rc, PINPOOL_ECONFIG);
  PP_ASSERT(pool == SENTINEL, "*out set by a failed create");
  PP_ASSERT(strstr(pinpool_last_error(), "max_reserved") != NULL &&
                strstr(pinpool_last_error(), "2 nodes") != NULL,
            "message: %s", pinpool_last_error());
  PP_ASSERT(atomic_load(&g_populates) == 0,
            "%u chunks populated before the refusal",
            atomic_load(&g_populates));
  /* Exactly the cap: accepted. */
  PP_OK(pinpool_create(
      "numa=local,numa_fake_nodes=2,reserve=4MiB,max_reserved=8MiB", &pool));
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  assert_int_equal(st.reserve_bytes, 8 * MiB);
  pinpool_destroy(pool);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_config_errors),
      cmocka_unit_test(test_config_roundtrip),
      cmocka_unit_test(test_bad_arguments),
      cmocka_unit_test(test_blocks_from_own_node),
      cmocka_unit_test(test_remote_free_goes_home),
      cmocka_unit_test(test_migration),
      cmocka_unit_test(test_node_oom),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_snapshot_nodes),
      cmocka_unit_test(test_placement),
      cmocka_unit_test(test_cpu_node),
      cmocka_unit_test(test_reserve_per_node),
      cmocka_unit_test(test_reserve_over_cap),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
