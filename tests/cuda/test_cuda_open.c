/* Loading the CUDA driver at pinpool_create: every way it can be unusable
 * gives PINPOOL_ENODRIVER with a message that says which (no library, the
 * toolkit's stub, cuInit failing, no device, device out of range, no
 * current context, a missing entry point), leaves *out untouched and
 * leaves nothing retained in the driver; and the configuration no CUDA
 * backend can honour is refused before the driver is even looked for. */
#define _GNU_SOURCE
#include "cudatest.h"

#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#define SENTINEL ((pinpool_t *)(uintptr_t)0x5e47)

#define STUB_PATH "/usr/local/cuda/lib64/stubs/libcuda.so"

/* pinpool_create(conf) fails with `code`, mentions `needle`, touches
 * nothing. */
static void expect_create_fails_(const char *lib, bool set_lib,
                                 const char *conf, int code, const char *needle,
                                 const char *file, int line) {
  pinpool_t *pool = SENTINEL;
  int rc = set_lib ? ct_create_with_lib(lib, conf, &pool)
                   : pinpool_create(conf, &pool);
  if (rc != code) {
    print_error("ERROR: pinpool_create(\"%s\") returned %d, expected %d; "
                "last_error: \"%s\"\n",
                conf, rc, code, pinpool_last_error());
    if (rc == 0)
      pinpool_destroy(pool);
    _fail(file, line);
  }
  ct_error_has_(needle, file, line);
  if (pool != SENTINEL) {
    print_error("ERROR: a failed pinpool_create changed *out\n");
    _fail(file, line);
  }
  ct_fake_eq_("primary_refs", 0, file, line);
  ct_fake_clean_(file, line);
}
#define EXPECT_FAILS(conf, code, needle)                                       \
  expect_create_fails_(NULL, false, (conf), (code), (needle), __FILE__,        \
                       __LINE__)
#define EXPECT_FAILS_WITH(lib, conf, code, needle)                             \
  expect_create_fails_((lib), true, (conf), (code), (needle), __FILE__,        \
                       __LINE__)

static void test_no_driver(void **state) {
  (void)state;
  const char *confs[] = {"backend=cuda,device=0",
                         "backend=cuda-register,device=0",
                         "events=cuda,device=0", "backend=cuda"};
  for (size_t i = 0; i < sizeof confs / sizeof confs[0]; i++) {
    EXPECT_FAILS_WITH("/nonexistent/libcuda.so.1", confs[i], PINPOOL_ENODRIVER,
                      "CUDA driver not found");
    /* dlerror's reason is passed on. */
    CT_ERROR_HAS("/nonexistent/libcuda.so.1");
  }
  /* A library that is no driver at all. */
  EXPECT_FAILS_WITH("libc.so.6", "backend=cuda,device=0", PINPOOL_ENODRIVER,
                    "CUDA driver lacks cuInit");
}

static void test_stub_library(void **state) {
  (void)state;
  bool tried = false;
  if (access(STUB_PATH, R_OK) == 0) {
    EXPECT_FAILS_WITH(STUB_PATH, "backend=cuda,device=0", PINPOOL_ENODRIVER,
                      "CUDA stub library: no GPU driver installed");
    tried = true;
  }
  if (ct_is_fake) {
    CT_ASSERT(ct_fake.set("init_result", CUDA_ERROR_STUB_LIBRARY) == 0, "set");
    EXPECT_FAILS("backend=cuda,device=0", PINPOOL_ENODRIVER,
                 "CUDA stub library: no GPU driver installed");
    tried = true;
  }
  if (!tried)
    skip();
}

static void test_init_fails(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  CT_ASSERT(ct_fake.set("init_result", CUDA_ERROR_UNKNOWN) == 0, "set");
  EXPECT_FAILS("backend=cuda,device=0", PINPOOL_ENODRIVER,
               "CUDA driver failed to initialize");
  /* The driver's own name for the error, through cuGetErrorName. */
  CT_ERROR_HAS("CUDA_ERROR_UNKNOWN");
}

static void test_no_device(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  /* As a driver on a machine whose GPU is gone: cuInit says so... */
  CT_ASSERT(ct_fake.set("init_result", CUDA_ERROR_NO_DEVICE) == 0, "set");
  EXPECT_FAILS("backend=cuda,device=0", PINPOOL_ENODRIVER, "no CUDA device");
  /* ... or cuInit succeeds and there are none. */
  CT_ASSERT(ct_fake.set("init_result", 0) == 0, "set");
  CT_ASSERT(ct_fake.set("device_count", 0) == 0, "set");
  EXPECT_FAILS("backend=cuda,device=0", PINPOOL_ENODRIVER, "no CUDA device");
  EXPECT_FAILS("events=cuda", PINPOOL_ENODRIVER, "no CUDA device");
}

/* backend=auto, the default (docs/configuration.md, "backend=auto"): a
 * driver that loads and reports a device gives cuda-register (device=-1
 * takes the current context, else device 0's primary one); a driver with
 * no device, or none at all, gives host; a named backend is obeyed and
 * the driver is not even loaded. */
static void expect_auto(const char *conf, uint64_t want, const char *prefix,
                        long long registrations) {
  pinpool_t *pool = CT_CREATE(conf);
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.backend_auto == want, "%s: backend_auto %llu, want %llu", conf,
            (unsigned long long)st.backend_auto, (unsigned long long)want);
  char cfg[1024];
  CT_OK(pinpool_get_config(pool, cfg, sizeof cfg, NULL));
  CT_ASSERT(strncmp(cfg, prefix, strlen(prefix)) == 0, "%s: config %s", conf,
            cfg);
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, 1 << 20, &p));
  CT_FAKE_EQ("live_registrations", registrations);
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_CLEAN();
}

static void test_auto_backend(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  /* No context current: device 0's primary context, released at destroy
   * (CT_FAKE_CLEAN checks primary_refs). */
  expect_auto("", PINPOOL_AUTO_CUDA_REGISTER, "backend=cuda-register,", 1);
  pinpool_t *pool = CT_CREATE("backend=auto");
  char cfg[1024];
  CT_OK(pinpool_get_config(pool, cfg, sizeof cfg, NULL));
  CT_ASSERT(strstr(cfg, ",device=0,") != NULL, "config %s", cfg);
  pinpool_destroy(pool);
  /* A current context: taken, as device=-1 does. */
  ct_ctx_enter();
  pool = CT_CREATE("");
  CT_OK(pinpool_get_config(pool, cfg, sizeof cfg, NULL));
  CT_ASSERT(strstr(cfg, ",device=-1,") != NULL, "config %s", cfg);
  pinpool_destroy(pool);
  ct_ctx_leave();
  /* A named backend: the driver is not loaded. */
  long long inits = ct_fake.get("calls:cuInit");
  expect_auto("backend=host", PINPOOL_AUTO_NONE, "backend=host,", 0);
  CT_FAKE_EQ("calls:cuInit", inits);
  /* No device: host, locked or not as RLIMIT_MEMLOCK allows (test_config
   * and tests/python test which). */
  CT_ASSERT(ct_fake.set("device_count", 0) == 0, "set");
  pool = CT_CREATE("");
  pinpool_stats_t st = ct_stats(pool);
  CT_ASSERT(st.backend_auto == PINPOOL_AUTO_HOST_LOCKED ||
                st.backend_auto == PINPOOL_AUTO_HOST_UNLOCKED,
            "no device: backend_auto %llu",
            (unsigned long long)st.backend_auto);
  pinpool_destroy(pool);
  CT_ASSERT(ct_fake.set("device_count", 1) == 0, "set");
  CT_ASSERT(ct_fake.set("init_result", CUDA_ERROR_NO_DEVICE) == 0, "set");
  pool = CT_CREATE("");
  CT_ASSERT(ct_stats(pool).backend_auto != PINPOOL_AUTO_CUDA_REGISTER,
            "cuInit: no device, yet cuda-register");
  pinpool_destroy(pool);
  CT_ASSERT(ct_fake.set("init_result", 0) == 0, "set");
  /* No driver at all. */
  pool = NULL;
  CT_OK(ct_create_with_lib("/nonexistent/libcuda.so.1", "", &pool));
  CT_ASSERT(ct_stats(pool).backend_auto != PINPOOL_AUTO_CUDA_REGISTER,
            "no driver, yet cuda-register");
  pinpool_destroy(pool);
  CT_FAKE_CLEAN();
}

/* backend=auto in a fork() child of a process that initialized CUDA
 * (issue 41, second round): CUDA does not support fork, so the child makes
 * no driver call. The fake counts a child's cuInit (forked_inits) and
 * fails it, as a real driver's may; without the check the child's auto
 * pool called cuInit. The child's auto pool is host, and a pool that
 * names a CUDA backend fails and says why. Checked in the child; its exit
 * status says which check failed. */
static int auto_in_fork_child(void) {
  pinpool_t *pool = NULL;
  pinpool_stats_t st;
  void *p = NULL;
  if (pinpool_create("", &pool) != 0)
    return 10;
  if (pinpool_get_stats(pool, &st) != 0 ||
      (st.backend_auto != PINPOOL_AUTO_HOST_LOCKED &&
       st.backend_auto != PINPOOL_AUTO_HOST_UNLOCKED))
    return 11;
  if (pinpool_alloc(pool, 1 << 20, &p) != 0 || pinpool_free(pool, p) != 0)
    return 12;
  pinpool_destroy(pool);
  if (ct_fake.get("forked_inits") != 0)
    return 13;
  pool = NULL;
  if (pinpool_create("backend=cuda-register", &pool) != PINPOOL_ENODRIVER ||
      pool != NULL)
    return 14;
  const char *e = pinpool_last_error();
  if (e == NULL || strstr(e, "forked") == NULL)
    return 15;
  if (pinpool_create("backend=host,events=cuda", &pool) != PINPOOL_ENODRIVER)
    return 16;
  return ct_fake.get("forked_inits") == 0 ? 0 : 17;
}

static void test_auto_backend_fork_child(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  /* This process initializes the driver (if no earlier test did). */
  pinpool_t *pool = CT_CREATE("");
  CT_ASSERT(ct_stats(pool).backend_auto == PINPOOL_AUTO_CUDA_REGISTER,
            "parent: not cuda-register");
  pid_t pid = fork();
  CT_ASSERT(pid >= 0, "fork");
  if (pid == 0)
    _exit(auto_in_fork_child());
  int status = 0;
  CT_ASSERT(waitpid(pid, &status, 0) == pid, "waitpid");
  CT_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "fork child: check %d failed (status 0x%x)",
            WIFEXITED(status) ? WEXITSTATUS(status) : -1, status);
  /* The parent still uses the driver. */
  pinpool_destroy(pool);
  expect_auto("", PINPOOL_AUTO_CUDA_REGISTER, "backend=cuda-register,", 1);
  CT_FAKE_EQ("forked_inits", 0);
}

static void test_device_out_of_range(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  EXPECT_FAILS("backend=cuda,device=1024", PINPOOL_ENODRIVER,
               "device=1024 out of range");
  if (!ct_is_fake)
    return;
  CT_ASSERT(ct_fake.set("device_count", 2) == 0, "set");
  EXPECT_FAILS("backend=cuda,device=2", PINPOOL_ENODRIVER,
               "device=2 out of range (2 CUDA devices)");
  /* The last device is in range; its primary context is held while the
   * pool lives. */
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda,device=1", &pool));
  CT_FAKE_EQ("primary_refs", 1);
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_no_current_context(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  /* The test thread has no context: device=-1 (the default) has none to
   * take. */
  EXPECT_FAILS("backend=cuda", PINPOOL_ENODRIVER,
               "no current CUDA context (set device=N)");
  EXPECT_FAILS("backend=cuda,device=-1", PINPOOL_ENODRIVER,
               "no current CUDA context");
  /* backend=host: backend=auto (the default) would open device 0's
   * primary context for its cuda-register backend, and the events would
   * use it (test_auto_backend). */
  EXPECT_FAILS("backend=host,events=cuda", PINPOOL_ENODRIVER,
               "no current CUDA context");
  /* With one current, the pool takes it and does not retain it. */
  ct_ctx_enter();
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda", &pool));
  CT_FAKE_EQ("primary_refs", 1); /* ours only */
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, 100000, &p));
  memset(p, 0x5a, 100000);
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
  ct_ctx_leave();
  CT_FAKE_BALANCED();
}

static void test_missing_entry_point(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  if (ct_fake.get("has_proc_address") != 1)
    skip(); /* hiding works through cuGetProcAddress */
  static const struct {
    const char *hide, *conf, *lacks;
  } cases[] = {
      {"cuMemHostAlloc", "backend=cuda,device=0", "lacks cuMemHostAlloc"},
      {"cuMemFreeHost", "backend=cuda,device=0", "lacks cuMemFreeHost"},
      {"cuMemHostRegister", "backend=cuda-register,device=0",
       "lacks cuMemHostRegister"},
      {"cuMemHostUnregister", "backend=cuda-register,device=0",
       "lacks cuMemHostUnregister"},
      {"cuEventCreate", "events=cuda,device=0", "lacks cuEventCreate"},
      {"cuEventRecord", "events=cuda,device=0", "lacks cuEventRecord"},
      {"cuEventQuery", "events=cuda,device=0", "lacks cuEventQuery"},
      {"cuEventSynchronize", "events=cuda,device=0",
       "lacks cuEventSynchronize"},
      {"cuEventDestroy", "events=cuda,device=0", "lacks cuEventDestroy"},
      {"cuStreamGetCaptureInfo", "events=cuda,device=0",
       "lacks cuStreamGetCaptureInfo"},
      {"cuThreadExchangeStreamCaptureMode", "events=cuda,device=0",
       "lacks cuThreadExchangeStreamCaptureMode"},
      {"cuCtxPushCurrent", "backend=cuda,device=0", "lacks cuCtxPushCurrent"},
      {"cuCtxPopCurrent", "backend=cuda,device=0", "lacks cuCtxPopCurrent"},
      {"cuDevicePrimaryCtxRetain", "backend=cuda,device=0",
       "lacks cuDevicePrimaryCtxRetain"},
      {"cuDeviceGetCount", "backend=cuda,device=0", "lacks cuDeviceGetCount"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ct_fake.hide(cases[i].hide);
    EXPECT_FAILS(cases[i].conf, PINPOOL_ENODRIVER, cases[i].lacks);
  }
  /* Only what a configuration uses is required. */
  ct_fake.hide("cuMemHostRegister,cuMemHostUnregister,cuEventQuery");
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda,device=0", &pool));
  pinpool_destroy(pool);
  ct_fake.hide(NULL);
  CT_FAKE_BALANCED();
}

static void test_proc_address_asked_for_legacy_stream(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda,device=0,events=cuda", &pool));
  if (ct_fake.get("has_proc_address") == 1) {
    /* Stream 0 means the legacy default stream (pinpool.h). */
    CT_FAKE_EQ("last_proc_flags", CU_GET_PROC_ADDRESS_LEGACY_STREAM);
    CT_ASSERT(ct_fake.get("calls:cuGetProcAddress") > 0, "not used");
  } else {
    CT_FAKE_EQ("calls:cuGetProcAddress", 0);
  }
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_older_driver(void **state) {
  (void)state;
  CT_REQUIRE_FAKE();
  /* cuGetProcAddress refuses versions newer than the driver: pinpool must
   * ask for no more than the driver's own version. */
  CT_ASSERT(ct_fake.set("driver_version", 11040) == 0, "set");
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda,device=0,events=cuda", &pool));
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_numa_node_with_cuda_backend(void **state) {
  (void)state;
  /* Refused whatever the machine: no driver needed to say so. */
  EXPECT_FAILS_WITH("/nonexistent/libcuda.so.1", "backend=cuda,numa_node=0",
                    PINPOOL_ECONFIG,
                    "numa_node requires backend=host or "
                    "cuda-register");
  CT_REQUIRE_DRIVER();
  EXPECT_FAILS("backend=cuda,device=0,numa_node=0", PINPOOL_ECONFIG,
               "numa_node");
  /* cuda-register places its mmap'd pages before pinning them. */
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda-register,device=0,numa_node=0", &pool));
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, MiB, &p));
  memset(p, 1, MiB);
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

static void test_errors_leave_driver_usable(void **state) {
  (void)state;
  CT_REQUIRE_DRIVER();
  /* After every kind of failure above, a good pool still comes up. */
  EXPECT_FAILS_WITH("/nonexistent/libcuda.so.1", "backend=cuda,device=0",
                    PINPOOL_ENODRIVER, "not found");
  pinpool_t *pool = NULL;
  CT_OK(pinpool_create("backend=cuda,device=0", &pool));
  void *p = NULL;
  CT_OK(pinpool_alloc(pool, 4096, &p));
  CT_OK(pinpool_free(pool, p));
  pinpool_destroy(pool);
  CT_FAKE_BALANCED();
}

int main(void) {
  ct_init();
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_no_driver, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_stub_library, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_init_fails, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_no_device, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_auto_backend, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_auto_backend_fork_child, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_device_out_of_range, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_no_current_context, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_missing_entry_point, ct_setup,
                                      ct_teardown),
      cmocka_unit_test_setup_teardown(test_proc_address_asked_for_legacy_stream,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_older_driver, ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_numa_node_with_cuda_backend,
                                      ct_setup, ct_teardown),
      cmocka_unit_test_setup_teardown(test_errors_leave_driver_usable, ct_setup,
                                      ct_teardown),
  };
  return cmocka_run_group_tests_name("cuda_open", tests, NULL, NULL);
}
