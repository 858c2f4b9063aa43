/*
 * numa_node=N places host segments on node N: the policy of a block's pages
 * is MPOL_BIND to {N} and the pages are resident on N. Checked with
 * get_mempolicy on whatever machine runs the tests (node 0 always exists;
 * a second node is checked when there is one).
 */
#include "testutil.h"

#include <errno.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MPOL_BIND 2
#define MPOL_F_NODE (1 << 0)
#define MPOL_F_ADDR (1 << 1)

static int policy_of(void *addr, int *mode, unsigned long *mask) {
  return (int)syscall(SYS_get_mempolicy, mode, mask, 64 + 1, addr, MPOL_F_ADDR);
}

static int node_of(void *addr) {
  int node = -1;
  if (syscall(SYS_get_mempolicy, &node, NULL, 0, addr,
              MPOL_F_NODE | MPOL_F_ADDR) != 0)
    return -1;
  return node;
}

static void check_node(const char *config, int node) {
  pinpool_t *pool;
  PP_OK(pinpool_create(config, &pool));
  void *small, *large;
  PP_OK(pinpool_alloc(pool, 64 * KiB, &small)); /* in a shared segment */
  PP_OK(pinpool_alloc(pool, 8 * MiB, &large));  /* a segment of its own */
  void *blocks[2] = {small, large};
  for (int i = 0; i < 2; i++) {
    int mode = -1;
    unsigned long mask = 0;
    if (policy_of(blocks[i], &mode, &mask) != 0 && errno == ENOSYS) {
      print_message("get_mempolicy: no NUMA support in this kernel; "
                    "skipping the placement check\n");
      break;
    }
    PP_ASSERT(mode == MPOL_BIND && mask == (1ul << node),
              "%s: block %p has policy %d mask %#lx, want bind to node %d",
              config, blocks[i], mode, mask, node);
    PP_ASSERT(node_of(blocks[i]) == node, "%s: page of %p is on node %d",
              config, blocks[i], node_of(blocks[i]));
  }
  PP_OK(pinpool_free(pool, small));
  PP_OK(pinpool_free(pool, large));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_node0(void **state) {
  (void)state;
  check_node("numa_node=0", 0);
  check_node("numa_node=0,hugepages=1", 0);
}

static void test_other_nodes(void **state) {
  (void)state;
  int checked = 0;
  for (int n = 1; n < 64; n++) {
    char path[64], config[32];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d", n);
    if (access(path, F_OK) != 0)
      continue;
    snprintf(config, sizeof config, "numa_node=%d", n);
    check_node(config, n);
    checked++;
  }
  print_message("checked %d NUMA node(s) besides node 0\n", checked);
}

static void test_bad_node(void **state) {
  (void)state;
  pinpool_t *pool = NULL;
  PP_CHECK_RC(pinpool_create("numa_node=1023", &pool), PINPOOL_ECONFIG);
  PP_ASSERT(strstr(pinpool_last_error(), "numa_node") != NULL,
            "message does not name the key: %s", pinpool_last_error());
  PP_CHECK_RC(pinpool_create("numa_node=-2", &pool), PINPOOL_ECONFIG);
  PP_CHECK_RC(pinpool_create("numa_node=x", &pool), PINPOOL_ECONFIG);
  PP_ASSERT(pool == NULL, "no pool on error");
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_node0),
      cmocka_unit_test(test_other_nodes),
      cmocka_unit_test(test_bad_node),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
