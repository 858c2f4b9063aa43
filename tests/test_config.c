/* Configuration strings: every key with good and bad values, size suffixes,
 * booleans, whitespace and empty items, duplicates, PINPOOL_CONF, and the
 * pinpool_get_config round trip. */
#define _GNU_SOURCE
#include "testutil.h"

#include <grp.h>
#include <inttypes.h>
#include <sched.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define SENTINEL ((pinpool_t *)(uintptr_t)0x5a5a5a5a)

/* Create with `conf`, require success, do a tiny alloc/free, check. */
static pinpool_t *create_ok_(const char *conf, const char *file, int line) {
  pinpool_t *pool = NULL;
  int rc = pinpool_create(conf, &pool);
  if (rc != 0) {
    print_error("ERROR: pinpool_create(\"%s\") returned %d (%s): \"%s\"\n",
                conf ? conf : "(NULL)", rc, pp_code_name(rc),
                pinpool_last_error());
    _fail(file, line);
  }
  if (pool == NULL) {
    print_error("ERROR: pinpool_create(\"%s\") returned 0 and a NULL pool\n",
                conf ? conf : "(NULL)");
    _fail(file, line);
  }
  return pool;
}
#define create_ok(conf) create_ok_((conf), __FILE__, __LINE__)

static void good_(const char *conf, const char *file, int line) {
  pinpool_t *pool = create_ok_(conf, file, line);
  void *p = NULL;
  int rc = pinpool_alloc(pool, 1000, &p);
  if (rc != 0) {
    print_error("ERROR: pool created with \"%s\": alloc returned %d (%s) %s\n",
                conf, rc, pp_code_name(rc), pinpool_last_error());
    _fail(file, line);
  }
  pp_check_rc_(pinpool_free(pool, p), 0, "pinpool_free", file, line);
  pp_check_consistent_(pool, file, line);
  pinpool_destroy(pool);
}
#define GOOD(conf) good_((conf), __FILE__, __LINE__)

/* Only create and destroy (for settings under which an allocation may
 * legitimately fail, such as mlock=require without CAP_IPC_LOCK). */
static void good_create_(const char *conf, const char *file, int line) {
  pinpool_t *pool = create_ok_(conf, file, line);
  pp_check_consistent_(pool, file, line);
  pinpool_destroy(pool);
}
#define GOOD_CREATE(conf) good_create_((conf), __FILE__, __LINE__)

/* Require PINPOOL_ECONFIG, *out untouched, and a message naming `key`. */
static void bad_(const char *conf, const char *key, const char *file,
                 int line) {
  pinpool_t *pool = SENTINEL;
  int rc = pinpool_create(conf, &pool);
  if (rc != PINPOOL_ECONFIG) {
    print_error("ERROR: pinpool_create(\"%s\") returned %d (%s), expected "
                "PINPOOL_ECONFIG\n",
                conf ? conf : "(NULL)", rc, pp_code_name(rc));
    if (rc == 0)
      pinpool_destroy(pool);
    _fail(file, line);
  }
  if (pool != SENTINEL) {
    print_error("ERROR: failed pinpool_create(\"%s\") changed *out to %p\n",
                conf ? conf : "(NULL)", (void *)pool);
    _fail(file, line);
  }
  const char *le = pinpool_last_error();
  if (le == NULL || (key != NULL && strstr(le, key) == NULL)) {
    print_error("ERROR: pinpool_create(\"%s\"): last_error \"%s\" does not "
                "name the key '%s'\n",
                conf ? conf : "(NULL)", le ? le : "(null)", key);
    _fail(file, line);
  }
}
#define BAD(conf, key) bad_((conf), (key), __FILE__, __LINE__)

static uint64_t stat_field(const char *conf, int which) {
  pinpool_t *pool = create_ok(conf);
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  pinpool_destroy(pool);
  switch (which) {
  case 0:
    return st.max_cached;
  case 1:
    return st.max_reserved;
  default:
    return st.reserve_bytes;
  }
}

static void test_every_key_good(void **state) {
  (void)state;
  GOOD("");
  GOOD(NULL);
  GOOD("backend=host");
  GOOD("backend=malloc");
  GOOD("max_cached=0");
  GOOD("max_cached=1GiB");
  GOOD("max_reserved=0");
  GOOD("max_reserved=1GiB");
  GOOD("reserve=0");
  GOOD("reserve=4MiB");
  GOOD("mlock=0");
  GOOD("mlock=1");
  GOOD_CREATE("mlock=require");
  GOOD("pin_failure=error");
  GOOD("pin_failure=pageable");
  GOOD("numa=off");
  GOOD("numa=local");
  GOOD("numa=local,numa_spill=1");
  GOOD("numa=local,numa_spill=0,numa_fake_nodes=4");
  GOOD("hugepages=0");
  GOOD("hugepages=1");
  GOOD("populate=0");
  GOOD("populate=1");
  GOOD("populate_threads=1");
  GOOD("populate_threads=8");
  GOOD("populate_threads=64");
  GOOD("tcache_bytes=0");
  GOOD("tcache_bytes=1MiB");
  GOOD("shards=1");
  GOOD("shards=7");
  GOOD("shards=64");
  GOOD("max_cached_pct=0");
  GOOD("max_cached_pct=10000");
  GOOD("backend=malloc,max_cached=64MiB,max_reserved=1GiB,reserve=2MiB,"
       "mlock=0,hugepages=0,populate=0,populate_threads=2,tcache_bytes=256KiB,"
       "shards=4");
}

static void test_booleans(void **state) {
  (void)state;
  static const char *vals[] = {"0",   "1",  "true", "false",
                               "yes", "no", "on",   "off"};
  static const char *keys[] = {"hugepages", "populate", "mlock"};
  char buf[64];
  for (size_t k = 0; k < 3; k++)
    for (size_t v = 0; v < 8; v++) {
      snprintf(buf, sizeof buf, "%s=%s", keys[k], vals[v]);
      GOOD_CREATE(buf);
      if (k != 2)
        GOOD(buf);
    }
  for (size_t k = 0; k < 3; k++) {
    static const char *badv[] = {"2", "maybe", "", "-1", "tru", "10", "1x"};
    for (size_t v = 0; v < sizeof badv / sizeof badv[0]; v++) {
      snprintf(buf, sizeof buf, "%s=%s", keys[k], badv[v]);
      BAD(buf, keys[k]);
    }
  }
  BAD("mlock=required", "mlock");
  BAD("pin_failure=1", "pin_failure");
  BAD("pin_failure=Pageable", "pin_failure");
  BAD("pin_failure=", "pin_failure");
  BAD("numa=1", "numa");
  BAD("numa=Local", "numa");
  BAD("numa=local,numa_node=0", "numa");
  BAD("numa=local,backend=malloc", "numa");
  BAD("numa=local,backend=cuda", "numa");
  BAD("numa_spill=1", "numa_spill");
  BAD("numa=local,numa_spill=2", "numa_spill");
  BAD("numa_fake_nodes=2", "numa_fake_nodes");
  BAD("numa=local,numa_fake_nodes=0", "numa_fake_nodes");
  BAD("numa=local,shared=1", "shared");
  BAD("shared=1,numa=local", "shared");
  BAD("numa=local,numa_fake_nodes=65", "numa_fake_nodes");
}

static void test_every_key_bad(void **state) {
  (void)state;
  BAD("backend=bogus", "backend");
  BAD("backend=", "backend");
  BAD("backend=HOSTX", "backend");
  static const char *size_keys[] = {"max_cached", "max_reserved", "reserve",
                                    "tcache_bytes"};
  static const char *bad_sizes[] = {
      "abc",
      "-1",
      "1X",
      "",
      "1.5MiB",
      "MiB",
      "1MiBB",
      "1 2",
      "99999999999999999999999", /* does not fit in 64 bits */
      "20000000TiB",             /* overflows when scaled */
      "18446744073709551616",    /* 2^64 */
      "0x10"};
  char buf[96];
  for (size_t k = 0; k < 4; k++)
    for (size_t v = 0; v < sizeof bad_sizes / sizeof bad_sizes[0]; v++) {
      snprintf(buf, sizeof buf, "%s=%s", size_keys[k], bad_sizes[v]);
      BAD(buf, size_keys[k]);
    }
  BAD("populate_threads=0", "populate_threads");
  BAD("populate_threads=65", "populate_threads");
  BAD("populate_threads=-1", "populate_threads");
  BAD("populate_threads=x", "populate_threads");
  BAD("populate_threads=", "populate_threads");
  /* Keys of earlier versions: a clear error that says why. */
  BAD("borrow=0", "was removed");
  BAD("remap=1", "was removed");
  BAD("remap_min=4MiB", "was removed");
  BAD("max_cached_pct=10001", "max_cached_pct");
  BAD("max_cached_pct=ten", "max_cached_pct");
  BAD("shards=0", "shards");
  BAD("shards=65", "shards");
  BAD("shards=-3", "shards");
  BAD("shards=two", "shards");
  BAD("shards=4294967297", "shards"); /* 2^32 + 1: no truncation to 1 */
  /* Unknown keys, and items that are not key=value. */
  BAD("max_cahced=1", "max_cahced");
  BAD("bogus=1", "bogus");
  BAD("shards=2,nosuchkey=3", "nosuchkey");
  BAD("MAX_CACHED=1", "MAX_CACHED");
  BAD("max_cached", "max_cached");
  BAD("shards=2,populate", "populate");
  /* A bad item after good ones fails the whole string. */
  BAD("shards=2,max_cached=1GiB,hugepages=7", "hugepages");
}

static void test_duplicates(void **state) {
  (void)state;
  BAD("shards=2,shards=2", "shards");
  BAD("max_cached=1MiB,shards=3,max_cached=2MiB", "max_cached");
  BAD(" mlock = 0 , mlock=0", "mlock");
  BAD("backend=malloc,backend=host", "backend");
}

static void test_whitespace_and_empty_items(void **state) {
  (void)state;
  GOOD(",");
  GOOD(",,,");
  GOOD(" ");
  GOOD("shards=2,");
  GOOD(",shards=2");
  GOOD("shards=2,,populate=0");
  GOOD("  shards = 2 ,  populate=0  ,, ");
  GOOD("\tshards=2\t,\tmlock=0 ");
  PP_ASSERT(stat_field("  max_cached = 3MiB , shards = 4 ,, ", 0) == 3 * MiB,
            "whitespace around the value changed it");
  PP_ASSERT(stat_field(" ,max_reserved=\t5MiB\t, ", 1) == 5 * MiB,
            "whitespace around the value changed it");
}

struct sfx {
  const char *text;
  uint64_t value;
};

static void test_size_suffixes(void **state) {
  (void)state;
  static const struct sfx cases[] = {
      {"123", 123},
      {"0", 0},
      {"100B", 100},
      {"1K", 1024},
      {"1KiB", 1024},
      {"1KB", 1000},
      {"3K", 3072},
      {"1M", 1048576},
      {"1MiB", 1048576},
      {"1MB", 1000000},
      {"64MiB", 64ull << 20},
      {"1G", 1ull << 30},
      {"1GiB", 1ull << 30},
      {"1GB", 1000000000ull},
      {"8GiB", 8ull << 30},
      {"1T", 1ull << 40},
      {"1TiB", 1ull << 40},
      {"1TB", 1000000000000ull},
      {"2TB", 2000000000000ull},
      {"1048577", 1048577},
      {"010", 10}, /* decimal, not octal */
  };
  char buf[96];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(buf, sizeof buf, "max_cached=%s", cases[i].text);
    uint64_t got = stat_field(buf, 0);
    PP_ASSERT(got == cases[i].value,
              "\"%s\" gave max_cached %" PRIu64 ", want %" PRIu64, buf, got,
              cases[i].value);
    snprintf(buf, sizeof buf, "max_reserved=%s", cases[i].text);
    got = stat_field(buf, 1);
    PP_ASSERT(got == cases[i].value,
              "\"%s\" gave max_reserved %" PRIu64 ", want %" PRIu64, buf, got,
              cases[i].value);
  }
  /* reserve is allocated at create: keep it small. */
  PP_ASSERT(stat_field("reserve=2MiB", 2) == 2 * MiB, "reserve=2MiB");
  PP_ASSERT(stat_field("reserve=2M", 2) == 2 * MiB, "reserve=2M");
  PP_ASSERT(stat_field("reserve=4096", 2) == 4096, "reserve=4096");
  PP_ASSERT(stat_field("reserve=0", 2) == 0, "reserve=0");
}

/* 0 for max_* means unlimited: allocations well beyond "0" succeed. */
static void test_zero_means_unlimited(void **state) {
  (void)state;
  pinpool_t *pool = create_ok("max_cached=0,max_reserved=0,tcache_bytes=0");
  pinpool_stats_t st;
  PP_STATS(pool, &st);
  PP_ASSERT(st.max_cached == 0 && st.max_reserved == 0,
            "caps %" PRIu64 "/%" PRIu64, st.max_cached, st.max_reserved);
  void *a = NULL, *b = NULL;
  PP_OK(pinpool_alloc(pool, 4 * MiB, &a));
  PP_OK(pinpool_alloc(pool, 4 * MiB, &b));
  PP_OK(pinpool_free(pool, a));
  PP_OK(pinpool_free(pool, b));
  PP_STATS(pool, &st);
  PP_ASSERT(st.cached_bytes.current >= 8 * MiB,
            "max_cached=0 must not trim: cached %" PRIu64,
            st.cached_bytes.current);
  PP_ASSERT(st.oom_count == 0, "oom_count %" PRIu64, st.oom_count);
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

static void test_env_var(void **state) {
  (void)state;
  /* Bad key in the environment: NULL config fails and names it. */
  PP_ASSERT(setenv("PINPOOL_CONF", "max_cahced=1", 1) == 0, "setenv");
  BAD(NULL, "max_cahced");
  PP_ASSERT(setenv("PINPOOL_CONF", "shards=99", 1) == 0, "setenv");
  BAD(NULL, "shards");
  /* Good environment: values are used. */
  PP_ASSERT(setenv("PINPOOL_CONF", "max_cached=3145735,max_reserved=7MiB", 1) ==
                0,
            "setenv");
  PP_ASSERT(stat_field(NULL, 0) == 3145735, "PINPOOL_CONF not applied");
  PP_ASSERT(stat_field(NULL, 1) == 7 * MiB, "PINPOOL_CONF not applied");
  /* An explicit string (even "") ignores the environment. */
  PP_ASSERT(stat_field("", 0) != 3145735, "\"\" must mean defaults, not env");
  PP_ASSERT(stat_field("shards=2", 0) != 3145735,
            "an explicit config must not take PINPOOL_CONF");
  PP_ASSERT(setenv("PINPOOL_CONF", "bogus=1", 1) == 0, "setenv");
  GOOD("");
  GOOD("shards=2");
  /* Whitespace/empty environment: defaults. */
  PP_ASSERT(setenv("PINPOOL_CONF", "", 1) == 0, "setenv");
  GOOD(NULL);
  PP_ASSERT(unsetenv("PINPOOL_CONF") == 0, "unsetenv");
  GOOD(NULL);
  PP_ASSERT(stat_field(NULL, 0) != 3145735, "unset env still applied");
}

static const char *all_keys[] = {
    "backend",   "max_cached", "max_reserved",     "reserve",      "mlock",
    "hugepages", "populate",   "populate_threads", "tcache_bytes", "shards"};

static char *get_config_str(pinpool_t *pool) {
  size_t needed = 0;
  char tiny[1] = {'x'};
  int rc = pinpool_get_config(pool, tiny, 0, &needed);
  PP_ASSERT(rc == PINPOOL_EOVERFLOW, "get_config with len 0 returned %d", rc);
  PP_ASSERT(tiny[0] == 'x', "get_config wrote into a buffer of length 0");
  PP_ASSERT(needed > 1, "needed %zu", needed);
  char *buf = malloc(needed + 16);
  PP_ASSERT(buf != NULL, "malloc");
  /* One byte short fails with the same `needed`. */
  size_t needed2 = 0;
  memset(buf, 'Z', needed + 16);
  PP_CHECK_RC(pinpool_get_config(pool, buf, needed - 1, &needed2),
              PINPOOL_EOVERFLOW);
  PP_ASSERT(needed2 == needed, "needed changed: %zu vs %zu", needed2, needed);
  PP_ASSERT(buf[needed - 1] == 'Z' && buf[needed] == 'Z',
            "get_config wrote beyond len on EOVERFLOW");
  /* Exactly `needed` bytes suffice; NULL `needed` allowed. */
  memset(buf, 'Z', needed + 16);
  size_t needed3 = 0;
  PP_OK(pinpool_get_config(pool, buf, needed, &needed3));
  PP_ASSERT(strlen(buf) + 1 == needed,
            "needed %zu but the string is %zu bytes + NUL", needed,
            strlen(buf));
  PP_ASSERT(buf[needed] == 'Z', "get_config wrote past needed");
  char *buf2 = malloc(needed + 100);
  PP_ASSERT(buf2 != NULL, "malloc");
  PP_OK(pinpool_get_config(pool, buf2, needed + 100, NULL));
  PP_ASSERT(strcmp(buf, buf2) == 0, "two get_config calls differ");
  free(buf2);
  return buf;
}

static void check_has_all_keys(const char *cfg) {
  for (size_t i = 0; i < sizeof all_keys / sizeof all_keys[0]; i++) {
    /* key appears as a whole item key: at the start or after ',' */
    size_t kl = strlen(all_keys[i]);
    const char *p = cfg;
    int found = 0;
    while ((p = strstr(p, all_keys[i])) != NULL) {
      if ((p == cfg || p[-1] == ',') && p[kl] == '=') {
        found = 1;
        break;
      }
      p++;
    }
    PP_ASSERT(found, "resolved config \"%s\" lacks key %s", cfg, all_keys[i]);
  }
}

static void round_trip(const char *conf) {
  pinpool_t *a = create_ok(conf);
  char *sa = get_config_str(a);
  check_has_all_keys(sa);
  pinpool_stats_t sta, stb;
  PP_STATS(a, &sta);
  pinpool_t *b = NULL;
  int rc = pinpool_create(sa, &b);
  if (rc != 0)
    PP_FAIL("feeding get_config output \"%s\" (from \"%s\") back to "
            "pinpool_create failed: %d %s",
            sa, conf, rc, pinpool_last_error());
  char *sb = get_config_str(b);
  PP_ASSERT(strcmp(sa, sb) == 0, "round trip of \"%s\": \"%s\" != \"%s\"", conf,
            sa, sb);
  PP_STATS(b, &stb);
  PP_ASSERT(sta.max_cached == stb.max_cached &&
                sta.max_reserved == stb.max_reserved &&
                sta.reserve_bytes == stb.reserve_bytes,
            "round trip of \"%s\" changed the caps", conf);
  free(sa);
  free(sb);
  pinpool_destroy(a);
  pinpool_destroy(b);
}

static void test_get_config_round_trip(void **state) {
  (void)state;
  round_trip("");
  round_trip("backend=malloc");
  round_trip("max_cached=3MiB,shards=3");
  round_trip("max_cached=1000001,max_reserved=1GB,tcache_bytes=0");
  round_trip("mlock=require,hugepages=1,populate=0,populate_threads=5");
  round_trip("mlock=1,populate=1,populate_threads=64,shards=64");
  round_trip("reserve=2MiB,tcache_bytes=123456");
  round_trip("pin_failure=pageable,mlock=1");
  round_trip("numa=local,numa_spill=1,numa_fake_nodes=2");
  round_trip("numa=local");
  round_trip("  shards = 9 ,,hugepages=on,populate=off ");
}

static void test_get_config_values(void **state) {
  (void)state;
  pinpool_t *pool = create_ok("shards=9,populate_threads=5,backend=malloc");
  char *s = get_config_str(pool);
  PP_ASSERT(strstr(s, "shards=9") != NULL, "\"%s\" lacks shards=9", s);
  PP_ASSERT(strstr(s, "populate_threads=5") != NULL,
            "\"%s\" lacks populate_threads=5", s);
  PP_ASSERT(strstr(s, "backend=malloc") != NULL, "\"%s\" lacks backend=malloc",
            s);
  free(s);
  pinpool_destroy(pool);
}

static void test_get_config_errors(void **state) {
  (void)state;
  char buf[256];
  size_t needed = 0;
  PP_CHECK_RC(pinpool_get_config(NULL, buf, sizeof buf, &needed),
              PINPOOL_EINVAL);
  pinpool_t *pool = create_ok("");
  PP_CHECK_RC(pinpool_get_config(pool, NULL, 16, &needed), PINPOOL_EINVAL);
  pinpool_destroy(pool);
}

/* backend= is not allowed together with a user backend. */
static void test_backend_key_with_user_backend(void **state) {
  (void)state;
  pinpool_backend_t be = pp_heap_backend();
  pinpool_t *pool = SENTINEL;
  PP_CHECK_RC(pinpool_create_with_backend("backend=host", &be, &pool),
              PINPOOL_ECONFIG);
  PP_ASSERT(pool == SENTINEL, "*out changed on failure");
  PP_ASSERT(strstr(pinpool_last_error(), "backend") != NULL,
            "last_error \"%s\" does not name backend", pinpool_last_error());
  PP_CHECK_RC(
      pinpool_create_with_backend("shards=2,backend=malloc", &be, &pool),
      PINPOOL_ECONFIG);
  PP_CHECK_RC(pinpool_create_with_backend("max_cahced=1", &be, &pool),
              PINPOOL_ECONFIG);
  PP_ASSERT(pool == SENTINEL, "*out changed on failure");
  /* Other keys are fine. */
  PP_OK(pinpool_create_with_backend("shards=2,tcache_bytes=0", &be, &pool));
  void *p = NULL;
  PP_OK(pinpool_alloc(pool, 5000, &p));
  PP_OK(pinpool_free(pool, p));
  PP_CHECK_CONSISTENT(pool);
  pinpool_destroy(pool);
}

/* ---- backend=auto on a machine without CUDA -------------------------------
 * (docs/configuration.md, "backend=auto"; the CUDA side is in
 * tests/cuda/test_cuda_open.c.) Each case runs in a child: RLIMIT_MEMLOCK,
 * the process's one warning and the capabilities are per process. */

typedef struct warn_log {
  int calls, last_err;
  char msg[1024];
} warn_log_t;

static void log_error(void *arg, int err, const char *msg, void *block) {
  warn_log_t *w = arg;
  w->calls++;
  w->last_err = err;
  (void)snprintf(w->msg, sizeof w->msg, "%s", block == NULL ? msg : "block?");
}

static int child_create(const char *conf, warn_log_t *w, pinpool_t **pool) {
  pinpool_hooks_t hooks = {NULL, NULL, log_error, w};
  return pinpool_create_ex(conf, &hooks, pool);
}

/* RLIMIT_MEMLOCK 64 KiB and no CAP_IPC_LOCK (root gives up its user):
 * host unlocked, the warning once per process (with the ways to fix it),
 * counted by each pool; a named backend=host or mlock=0 is no failure. */
static int auto_low_limit_child(void) {
  struct rlimit rl = {64 * 1024, 64 * 1024};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    return 10;
  if (geteuid() == 0 &&
      (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0))
    return 11;
  /* A pool that cannot receive the warning (no on_error) counts it and
   * leaves the process's one call to the next pool that can. */
  pinpool_t *mute = NULL;
  pinpool_stats_t st;
  if (pinpool_create("", &mute) != 0 || pinpool_get_stats(mute, &st) != 0 ||
      st.backend_auto != PINPOOL_AUTO_HOST_UNLOCKED || st.pin_warnings != 1)
    return 24;
  pinpool_destroy(mute);
  warn_log_t w = {0, 0, ""};
  pinpool_t *pool = NULL;
  if (child_create("", &w, &pool) != 0)
    return 12;
  if (pinpool_get_stats(pool, &st) != 0 ||
      st.backend_auto != PINPOOL_AUTO_HOST_UNLOCKED || st.pin_warnings != 1)
    return 13;
  if (w.calls != 1 || w.last_err != PINPOOL_ELIMIT ||
      strstr(w.msg, "ulimit -l") == NULL ||
      strstr(w.msg, "LimitMEMLOCK=") == NULL ||
      strstr(w.msg, "--ulimit memlock=-1") == NULL ||
      strstr(w.msg, "RLIMIT_MEMLOCK is 65536 bytes") == NULL)
    return 14;
  char cfg[1024];
  if (pinpool_get_config(pool, cfg, sizeof cfg, NULL) != 0 ||
      strncmp(cfg, "backend=host,", 13) != 0 ||
      strstr(cfg, ",mlock=0,") == NULL)
    return 15;
  void *p = NULL;
  if (pinpool_alloc(pool, 1 << 20, &p) != 0 ||
      pinpool_get_stats(pool, &st) != 0 || st.locked_bytes != 0 ||
      st.mlock_failures != 0 || pinpool_free(pool, p) != 0)
    return 16;
  /* The second pool counts its own; the callback is not called again. */
  pinpool_t *pool2 = NULL;
  if (child_create("", &w, &pool2) != 0 || pinpool_get_stats(pool2, &st) != 0 ||
      st.pin_warnings != 1 || w.calls != 1)
    return 17;
  pinpool_destroy(pool2);
  pinpool_destroy(pool);
  /* A fork child is a process of its own: its first warning calls its
   * pool's on_error (issue 41, second round: the child inherited the used
   * slot and was never told). */
  (void)fflush(NULL);
  pid_t pid = fork();
  if (pid < 0)
    return 25;
  if (pid == 0) {
    warn_log_t cw = {0, 0, ""};
    pinpool_t *cp = NULL;
    int bad = child_create("", &cw, &cp) != 0 || cw.calls != 1 ||
              cw.last_err != PINPOOL_ELIMIT;
    if (cp != NULL)
      pinpool_destroy(cp);
    _exit(bad);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0)
    return 26;
  /* Named: obeyed, no warning. */
  const char *named[] = {"backend=host", "mlock=0"};
  for (int i = 0; i < 2; i++) {
    if (child_create(named[i], &w, &pool) != 0 ||
        pinpool_get_stats(pool, &st) != 0 || st.pin_warnings != 0)
      return 18 + i;
    if (st.backend_auto !=
        (i == 0 ? PINPOOL_AUTO_NONE : PINPOOL_AUTO_HOST_UNLOCKED))
      return 20 + i;
    pinpool_destroy(pool);
  }
  /* A pool capped within the limit may be locked whole. */
  if (child_create("max_reserved=48KiB", &w, &pool) != 0 ||
      pinpool_get_stats(pool, &st) != 0 ||
      st.backend_auto != PINPOOL_AUTO_HOST_LOCKED || st.pin_warnings != 0)
    return 22;
  pinpool_destroy(pool);
  /* The soft limit is raised to the hard one first. */
  rl.rlim_cur = 0;
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0 ||
      child_create("max_reserved=48KiB", &w, &pool) != 0 ||
      pinpool_get_stats(pool, &st) != 0 ||
      st.backend_auto != PINPOOL_AUTO_HOST_LOCKED ||
      getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur != 64 * 1024)
    return 23;
  pinpool_destroy(pool);
  return 0;
}

/* A 1 MiB block of a pool auto chose host locked for: locked, no warning
 * given (neither counted nor delivered to w). */
static bool alloc_locked_quietly(pinpool_t *pool, const warn_log_t *w) {
  pinpool_stats_t st;
  void *p = NULL;
  return pinpool_alloc(pool, 1 << 20, &p) == 0 &&
         pinpool_get_stats(pool, &st) == 0 &&
         st.backend_auto == PINPOOL_AUTO_HOST_LOCKED && st.locked_bytes != 0 &&
         st.pin_warnings == 0 && w->calls == 0 && pinpool_free(pool, p) == 0;
}

/* With CAP_IPC_LOCK (root): host locked; a chunk whose mlock fails anyway
 * (injected) stays pageable, counted, and warned about once. */
static int auto_locked_child(void) {
  warn_log_t w = {0, 0, ""};
  pinpool_t *pool = NULL;
  if (child_create("", &w, &pool) != 0)
    return 30;
  if (!alloc_locked_quietly(pool, &w))
    return 31;
  pinpool_destroy(pool);
  pinpool_stats_t st;
  void *p = NULL;
  if (child_create("fault=mlock:1", &w, &pool) != 0 ||
      pinpool_alloc(pool, 1 << 20, &p) != 0 ||
      pinpool_get_stats(pool, &st) != 0 || st.mlock_failures != 1 ||
      st.locked_bytes != 0 || st.pin_warnings != 1 || w.calls != 1 ||
      w.last_err != PINPOOL_ELIMIT || strstr(w.msg, "NOT page-locked") == NULL)
    return 32;
  /* The next chunk locks. */
  void *q = NULL;
  if (pinpool_alloc(pool, 8 << 20, &q) != 0 ||
      pinpool_get_stats(pool, &st) != 0 || st.locked_bytes == 0 ||
      st.pin_warnings != 1 || pinpool_free(pool, q) != 0 ||
      pinpool_free(pool, p) != 0)
    return 33;
  pinpool_destroy(pool);
  return 0;
}

/* Root (CAP_IPC_LOCK) without /proc (a container or chroot that does not
 * mount it) and RLIMIT_MEMLOCK 0: mlock has no limit, so host locked, no
 * warning. The capability was read from /proc/self/status: without it
 * the pool was unlocked and warned about a limit that does not apply.
 * Returns 0, or 99 where a private mount namespace cannot be made (the
 * case is left out). */
static int auto_locked_no_proc_child(void) {
  if (unshare(CLONE_NEWNS) != 0 ||
      mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
      umount2("/proc", MNT_DETACH) != 0)
    return 99;
  if (access("/proc/self/status", R_OK) == 0)
    return 99; /* another /proc below */
  struct rlimit rl = {0, 0};
  if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0)
    return 40;
  warn_log_t w = {0, 0, ""};
  pinpool_t *pool = NULL;
  if (child_create("", &w, &pool) != 0)
    return 41;
  if (!alloc_locked_quietly(pool, &w))
    return 42;
  pinpool_destroy(pool);
  return 0;
}

static void run_child(int (*fn)(void), const char *what) {
  (void)fflush(NULL);
  pid_t pid = fork();
  PP_ASSERT(pid >= 0, "fork");
  if (pid == 0) {
    (void)unsetenv("PINPOOL_LIBCUDA");
    (void)setenv("PINPOOL_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    _exit(fn());
  }
  int status = 0;
  PP_ASSERT(waitpid(pid, &status, 0) == pid, "waitpid");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 99) {
    print_message("%s: no private mount namespace here: left out\n", what);
    return;
  }
  PP_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "%s: the child failed with %d (see the code in test_config.c)",
            what, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static void test_auto_backend_host(void **state) {
  (void)state;
  run_child(auto_low_limit_child, "RLIMIT_MEMLOCK 64 KiB");
  if (geteuid() == 0) {
    run_child(auto_locked_child, "root");
    run_child(auto_locked_no_proc_child, "root without /proc");
  } else
    print_message("not root: the locked case is left out\n");
}

int main(void) {
  pp_clean_env();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_every_key_good),
      cmocka_unit_test(test_booleans),
      cmocka_unit_test(test_every_key_bad),
      cmocka_unit_test(test_duplicates),
      cmocka_unit_test(test_whitespace_and_empty_items),
      cmocka_unit_test(test_size_suffixes),
      cmocka_unit_test(test_zero_means_unlimited),
      cmocka_unit_test(test_env_var),
      cmocka_unit_test(test_get_config_round_trip),
      cmocka_unit_test(test_get_config_values),
      cmocka_unit_test(test_get_config_errors),
      cmocka_unit_test(test_backend_key_with_user_backend),
      cmocka_unit_test(test_auto_backend_host),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
