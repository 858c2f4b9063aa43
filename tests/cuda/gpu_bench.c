/*
 * pp_gpu_bench: what scripts/gpu-check.sh measures on a machine with an
 * NVIDIA GPU, in one run:
 *
 *   1. allocation latency: cuMemHostAlloc / cuMemFreeHost against pinpool's
 *      cached alloc / free (backend=cuda), at 4 KiB, 1 MiB and 64 MiB;
 *   2. the cost of a fresh segment: ms per GiB of backend=cuda
 *      (cuMemHostAlloc) and backend=cuda-register (parallel touch +
 *      cuMemHostRegister), for a 1 GiB block;
 *   3. copy bandwidth H2D and D2H (cuMemcpy*Async on a stream, 256 MiB)
 *      from a pool block against malloc'd pageable memory;
 *   4. stream-ordered reuse: a block whose H2D copies are still in flight
 *      is freed after pinpool_record_stream; allocations of the same size
 *      must not return it until the copies completed (checked against an
 *      event recorded after them), and the data copied back must be intact.
 *   5. graph capture: H2D copies of a pool block are captured into a graph
 *      (record_stream and the free happen during the capture, and pinpool
 *      polls another stream's event meanwhile); the capture must not be
 *      invalidated, pinpool must say the stream captures with the id the
 *      driver gives, the block must not come back while the graph is
 *      launched, nor after its launches completed, until
 *      pinpool_graph_release; then it must, and the device copy must hold
 *      the block's data (no scribble reached it).
 *
 * It loads the driver itself (dlopen of $PINPOOL_LIBCUDA or libcuda.so.1),
 * so it builds without CUDA, and runs against the fake driver too (ctest
 * pp_gpu_bench_fake), where the numbers mean nothing but every path runs.
 * --quick shrinks every size and count. Exit status 0 when every check
 * passed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_min.h"
#include "pinpool.h"

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define GiB (1024 * MiB)

/* Every entry point the benchmark calls: member, declaration, export. */
#define CU_ENTRIES(X)                                                          \
  X(init, cuInit, "cuInit")                                                    \
  X(version, cuDriverGetVersion, "cuDriverGetVersion")                         \
  X(err_name, cuGetErrorName, "cuGetErrorName")                                \
  X(device_get, cuDeviceGet, "cuDeviceGet")                                    \
  X(device_name, cuDeviceGetName, "cuDeviceGetName")                           \
  X(retain, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain")              \
  X(release, cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2")     \
  X(set_current, cuCtxSetCurrent, "cuCtxSetCurrent")                           \
  X(host_alloc, cuMemHostAlloc, "cuMemHostAlloc")                              \
  X(free_host, cuMemFreeHost, "cuMemFreeHost")                                 \
  X(mem_alloc, cuMemAlloc_v2, "cuMemAlloc_v2")                                 \
  X(mem_free, cuMemFree_v2, "cuMemFree_v2")                                    \
  X(htod, cuMemcpyHtoDAsync_v2, "cuMemcpyHtoDAsync_v2")                        \
  X(dtoh, cuMemcpyDtoHAsync_v2, "cuMemcpyDtoHAsync_v2")                        \
  X(stream_create, cuStreamCreate, "cuStreamCreate")                           \
  X(stream_destroy, cuStreamDestroy_v2, "cuStreamDestroy_v2")                  \
  X(stream_sync, cuStreamSynchronize, "cuStreamSynchronize")                   \
  X(event_create, cuEventCreate, "cuEventCreate")                              \
  X(event_record, cuEventRecord, "cuEventRecord")                              \
  X(event_query, cuEventQuery, "cuEventQuery")                                 \
  X(event_destroy, cuEventDestroy_v2, "cuEventDestroy_v2")                     \
  X(begin_capture, cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2")         \
  X(end_capture, cuStreamEndCapture, "cuStreamEndCapture")                     \
  X(capture_info, cuStreamGetCaptureInfo_v2, "cuStreamGetCaptureInfo_v2")      \
  X(graph_instantiate, cuGraphInstantiateWithFlags,                            \
    "cuGraphInstantiateWithFlags")                                             \
  X(graph_launch, cuGraphLaunch, "cuGraphLaunch")                              \
  X(graph_exec_destroy, cuGraphExecDestroy, "cuGraphExecDestroy")              \
  X(graph_destroy, cuGraphDestroy, "cuGraphDestroy")

#define CU_MEMBER(m, fn, sym) __typeof__(&fn) m;
static struct {
  CU_ENTRIES(CU_MEMBER)
  int (*fake_stream_delay)(CUstream, int); /* only in the fake driver */
} cu;

static bool quick;
static int failures;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *cu_err(CUresult rc) {
  const char *s = NULL;
  if (cu.err_name == NULL || cu.err_name(rc, &s) != CUDA_SUCCESS || s == NULL)
    return "unknown CUDA error";
  return s;
}

/* Evaluate a driver call; on failure report it and return from the caller
 * with -1. */
#define CU(call)                                                               \
  do {                                                                         \
    CUresult cu_rc_ = (call);                                                  \
    if (cu_rc_ != CUDA_SUCCESS) {                                              \
      fprintf(stderr, "FAIL: %s: %s (%d)\n", #call, cu_err(cu_rc_), cu_rc_);   \
      failures++;                                                              \
      return -1;                                                               \
    }                                                                          \
  } while (0)
#define PP(call)                                                               \
  do {                                                                         \
    int pp_rc_ = (call);                                                       \
    if (pp_rc_ != 0) {                                                         \
      fprintf(stderr, "FAIL: %s: %s (%s)\n", #call, pinpool_strerror(pp_rc_),  \
              pinpool_last_error());                                           \
      failures++;                                                              \
      return -1;                                                               \
    }                                                                          \
  } while (0)

static int load(void) {
  const char *path = getenv("PINPOOL_LIBCUDA");
  if (path == NULL || path[0] == '\0')
    path = "libcuda.so.1";
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "FAIL: cannot load the CUDA driver: %s\n", dlerror());
    return -1;
  }
#define CU_LOAD_ONE(m, fn, sym)                                                \
  CU_LOAD(lib, cu.m, sym);                                                     \
  if (cu.m == NULL) {                                                          \
    fprintf(stderr, "FAIL: the driver lacks %s\n", sym);                       \
    return -1;                                                                 \
  }
  CU_ENTRIES(CU_LOAD_ONE)
  CU_LOAD(lib, cu.fake_stream_delay, "fake_cuda_stream_delay");
  CU(cu.init(0));
  int version = 0;
  CU(cu.version(&version));
  CUdevice dev = 0;
  CU(cu.device_get(&dev, 0));
  char name[256] = "";
  CU(cu.device_name(name, (int)sizeof name, dev));
  CUcontext ctx = NULL;
  CU(cu.retain(&ctx, dev));
  CU(cu.set_current(ctx));
  printf("driver   %s (version %d.%d)%s\n", path, version / 1000,
         version % 1000 / 10,
         cu.fake_stream_delay != NULL ? "  [fake driver: numbers are "
                                        "meaningless]"
                                      : "");
  printf("device 0 %s\n", name);
  return 0;
}

static const char *human(size_t n, char *buf, size_t len) {
  if (n >= GiB && n % GiB == 0)
    snprintf(buf, len, "%zu GiB", n / GiB);
  else if (n >= MiB && n % MiB == 0)
    snprintf(buf, len, "%zu MiB", n / MiB);
  else
    snprintf(buf, len, "%zu KiB", n / KiB);
  return buf;
}

/* ---- 1. latency ---------------------------------------------------------- */
static int bench_latency(void) {
  static const size_t sizes[] = {4 * KiB, MiB, 64 * MiB};
  const int iters_full[] = {200, 50, 5}, iters_quick[] = {20, 5, 2};
  printf("\n1. allocation latency (mean per call)\n");
  printf("   %-8s %16s %16s %16s %16s\n", "size", "cuMemHostAlloc",
         "cuMemFreeHost", "pinpool_alloc", "pinpool_free");
  pinpool_t *pool = NULL;
  PP(pinpool_create("backend=cuda,device=0", &pool));
  for (int s = 0; s < 3; s++) {
    int n = quick ? iters_quick[s] : iters_full[s];
    double ta = 0, tf = 0, pa = 0, pf = 0;
    for (int i = 0; i < n; i++) {
      void *p = NULL;
      double t0 = now_s();
      CU(cu.host_alloc(&p, sizes[s], CU_MEMHOSTALLOC_PORTABLE));
      double t1 = now_s();
      CU(cu.free_host(p));
      ta += t1 - t0;
      tf += now_s() - t1;
    }
    void *p = NULL;
    PP(pinpool_alloc(pool, sizes[s], &p)); /* the one miss */
    PP(pinpool_free(pool, p));
    int pn = n * 100;
    for (int i = 0; i < pn; i++) {
      double t0 = now_s();
      PP(pinpool_alloc(pool, sizes[s], &p));
      double t1 = now_s();
      PP(pinpool_free(pool, p));
      pa += t1 - t0;
      pf += now_s() - t1;
    }
    char h[32];
    printf("   %-8s %13.1f us %13.1f us %13.3f us %13.3f us\n",
           human(sizes[s], h, sizeof h), ta / n * 1e6, tf / n * 1e6,
           pa / pn * 1e6, pf / pn * 1e6);
  }
  pinpool_destroy(pool);
  return 0;
}

/* ---- 2. fresh segments --------------------------------------------------- */
static int bench_segment(const char *backend, size_t size) {
  char conf[128];
  snprintf(conf, sizeof conf, "backend=%s,device=0", backend);
  pinpool_t *pool = NULL;
  PP(pinpool_create(conf, &pool));
  void *p = NULL;
  double t0 = now_s();
  PP(pinpool_alloc(pool, size, &p));
  double t1 = now_s();
  PP(pinpool_free(pool, p));
  PP(pinpool_empty_cache(pool));
  double t2 = now_s();
  pinpool_destroy(pool);
  char h[32];
  double gib = (double)size / (double)GiB;
  printf("   %-14s %-8s alloc %9.1f ms (%8.1f ms/GiB)   release %8.1f ms\n",
         backend, human(size, h, sizeof h), (t1 - t0) * 1e3,
         (t1 - t0) * 1e3 / gib, (t2 - t1) * 1e3);
  return 0;
}

/* ---- 3. bandwidth -------------------------------------------------------- */
static int copy_rate(CUstream s, CUdeviceptr d, void *h, size_t size, bool htod,
                     int reps, double *gbs) {
  /* One untimed copy: first-touch and mapping costs are not bandwidth. */
  if (htod)
    CU(cu.htod(d, h, size, s));
  else
    CU(cu.dtoh(h, d, size, s));
  CU(cu.stream_sync(s));
  double t0 = now_s();
  for (int i = 0; i < reps; i++) {
    if (htod)
      CU(cu.htod(d, h, size, s));
    else
      CU(cu.dtoh(h, d, size, s));
  }
  CU(cu.stream_sync(s));
  *gbs = (double)size * reps / (now_s() - t0) / 1e9;
  return 0;
}

static int bench_bandwidth(void) {
  size_t size = quick ? 16 * MiB : 256 * MiB;
  int reps = quick ? 2 : 10;
  char h[32];
  printf("\n3. copy bandwidth, %s per copy, %d copies\n",
         human(size, h, sizeof h), reps);
  CUstream s = NULL;
  CUdeviceptr d = 0;
  CU(cu.stream_create(&s, CU_STREAM_NON_BLOCKING));
  CU(cu.mem_alloc(&d, size));
  pinpool_t *pool = NULL;
  PP(pinpool_create("backend=cuda,device=0", &pool));
  void *pinned = NULL;
  PP(pinpool_alloc(pool, size, &pinned));
  void *pageable = malloc(size);
  if (pageable == NULL) {
    fprintf(stderr, "FAIL: malloc\n");
    failures++;
    return -1;
  }
  memset(pinned, 1, size);
  memset(pageable, 1, size);
  double r[4];
  if (copy_rate(s, d, pinned, size, true, reps, &r[0]) != 0 ||
      copy_rate(s, d, pinned, size, false, reps, &r[1]) != 0 ||
      copy_rate(s, d, pageable, size, true, reps, &r[2]) != 0 ||
      copy_rate(s, d, pageable, size, false, reps, &r[3]) != 0)
    return -1;
  printf("   %-22s %10s %10s\n", "source", "H2D GB/s", "D2H GB/s");
  printf("   %-22s %10.2f %10.2f\n", "pinpool (pinned)", r[0], r[1]);
  printf("   %-22s %10.2f %10.2f\n", "malloc (pageable)", r[2], r[3]);
  free(pageable);
  PP(pinpool_free(pool, pinned));
  pinpool_destroy(pool);
  CU(cu.mem_free(d));
  CU(cu.stream_destroy(s));
  return 0;
}

/* ---- 4. stream-ordered reuse -------------------------------------------- */
static void pattern(unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    p[i] = (unsigned char)((i >> 12) * 7u + i);
}

static int reuse_check(void) {
  size_t size = quick ? 4 * MiB : 64 * MiB;
  int copies = quick ? 4 : 32; /* keep the copy engine busy for a while */
  char h[32];
  printf("\n4. stream-ordered reuse: %d H2D copies of a %s block in "
         "flight\n",
         copies, human(size, h, sizeof h));
  CUstream s = NULL;
  CUdeviceptr d = 0;
  CUevent marker = NULL;
  CU(cu.stream_create(&s, CU_STREAM_NON_BLOCKING));
  if (cu.fake_stream_delay != NULL)
    (void)cu.fake_stream_delay(s, quick ? 20000 : 50000); /* a slow "DMA" */
  CU(cu.mem_alloc(&d, size));
  CU(cu.event_create(&marker, CU_EVENT_DISABLE_TIMING));
  pinpool_t *pool = NULL;
  PP(pinpool_create("backend=cuda,device=0,events=cuda", &pool));

  unsigned char *blk = NULL;
  PP(pinpool_alloc(pool, size, (void **)&blk));
  pattern(blk, size);
  for (int i = 0; i < copies; i++)
    CU(cu.htod(d, blk, size, s));
  /* Done when the copies are: the pool's event comes after this one. */
  CU(cu.event_record(marker, s));
  PP(pinpool_record_stream(pool, blk, (pinpool_stream_t)s));
  PP(pinpool_free(pool, blk));

  long in_flight = 0, early = 0, iters = 0;
  double t0 = now_s();
  for (;;) {
    CUresult q = cu.event_query(marker);
    if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)
      CU(q);
    if (q == CUDA_SUCCESS || now_s() - t0 > 30.0)
      break;
    unsigned char *other = NULL;
    PP(pinpool_alloc(pool, size, (void **)&other));
    iters++;
    if (other == blk) {
      if (cu.event_query(marker) == CUDA_ERROR_NOT_READY)
        early++; /* handed out while the copies still read it */
    } else {
      in_flight++;
      /* Scribble a page per MiB: an early reuse would corrupt the copy. */
      for (size_t off = 0; off < size; off += MiB)
        memset(other + off, 0xff, 4096);
    }
    PP(pinpool_free(pool, other));
  }
  PP(pinpool_synchronize(pool));
  unsigned char *back = malloc(size);
  if (back == NULL)
    return -1;
  memset(back, 0, size);
  CU(cu.dtoh(back, d, size, s));
  CU(cu.stream_sync(s));
  unsigned char *want = malloc(size);
  if (want == NULL)
    return -1;
  pattern(want, size);
  bool intact = memcmp(back, want, size) == 0;
  /* After completion the block is an ordinary cached block again: held
   * allocations reach it past whatever the thread cache holds. */
  bool reused = false;
  void *held[4];
  int nheld = 0;
  for (; nheld < 4 && !reused; nheld++) {
    PP(pinpool_alloc(pool, size, &held[nheld]));
    reused = held[nheld] == blk;
  }
  for (int i = 0; i < nheld; i++)
    PP(pinpool_free(pool, held[i]));
  printf("   allocations while in flight: %ld (other blocks: %ld, the freed "
         "block: %ld)\n",
         iters, in_flight, early);
  printf("   data copied back intact: %s\n", intact ? "yes" : "NO");
  printf("   block reused after completion: %s\n", reused ? "yes" : "no");
  if (early > 0 || !intact) {
    fprintf(stderr, "FAIL: stream-ordered reuse violated\n");
    failures++;
  }
  if (in_flight == 0)
    printf("   note: the copies finished before the first allocation; "
           "nothing was tested in flight\n");
  free(want);
  free(back);
  pinpool_destroy(pool);
  CU(cu.event_destroy(marker));
  CU(cu.mem_free(d));
  CU(cu.stream_destroy(s));
  return 0;
}

/* ---- 5. graph capture -------------------------------------------------- */
/* Allocate `size` up to 4 times while holding each, scribbling on blocks
 * that are not `blk`; *got_blk: blk came back. */
static int probe(pinpool_t *pool, size_t size, const void *blk, bool *got_blk) {
  void *held[4];
  int n = 0;
  *got_blk = false;
  for (; n < 4 && !*got_blk; n++) {
    PP(pinpool_alloc(pool, size, &held[n]));
    *got_blk = held[n] == blk;
    if (!*got_blk)
      memset(held[n], 0xff, 4096);
  }
  for (int i = 0; i < n; i++)
    PP(pinpool_free(pool, held[i]));
  return 0;
}

static int capture_check(void) {
  size_t size = quick ? 4 * MiB : 64 * MiB;
  int copies = quick ? 4 : 16, launches = quick ? 2 : 8;
  char h[32];
  printf("\n5. graph capture: %d H2D copies of a %s block captured, the "
         "graph launched %d times\n",
         copies, human(size, h, sizeof h), launches);
  CUstream cs = NULL, ls = NULL;
  CUdeviceptr d = 0;
  CU(cu.stream_create(&cs, CU_STREAM_NON_BLOCKING));
  CU(cu.stream_create(&ls, CU_STREAM_NON_BLOCKING));
  if (cu.fake_stream_delay != NULL)
    (void)cu.fake_stream_delay(ls, 20000);
  CU(cu.mem_alloc(&d, size));
  pinpool_t *pool = NULL;
  PP(pinpool_create("backend=cuda,device=0,events=cuda", &pool));
  unsigned char *blk = NULL, *other = NULL;
  PP(pinpool_alloc(pool, size, (void **)&blk));
  pattern(blk, size);
  CU(cu.htod(d, blk, size, cs)); /* outside the capture: d starts right */
  CU(cu.stream_sync(cs));
  /* A block with an event pending on ls, for pinpool to poll during the
   * capture (a query in the global mode would invalidate it). */
  PP(pinpool_alloc(pool, size, (void **)&other));
  CU(cu.htod(d, blk, size, ls));
  PP(pinpool_record_stream(pool, other, (pinpool_stream_t)ls));
  PP(pinpool_free(pool, other));

  CU(cu.begin_capture(cs, CU_STREAM_CAPTURE_MODE_GLOBAL));
  for (int i = 0; i < copies; i++)
    CU(cu.htod(d, blk, size, cs));
  int capturing = 0, status = 0;
  uint64_t id = 0;
  cuuint64_t drv_id = 0;
  PP(pinpool_stream_capture(pool, (pinpool_stream_t)cs, &capturing, &id));
  CU(cu.capture_info(cs, &status, &drv_id, NULL, NULL, NULL));
  PP(pinpool_record_stream(pool, blk, (pinpool_stream_t)cs));
  PP(pinpool_free(pool, blk));
  PP(pinpool_process_events(pool));
  CUgraph graph = NULL;
  CUresult end = cu.end_capture(cs, &graph);
  printf("   pinpool: capturing %d, id %llu (driver: status %d, id %llu)\n",
         capturing, (unsigned long long)id, status, (unsigned long long)drv_id);
  printf("   capture ended: %s\n", end == CUDA_SUCCESS ? "ok" : cu_err(end));
  if (end != CUDA_SUCCESS || capturing != 1 || id != drv_id) {
    fprintf(stderr, "FAIL: the capture was broken or misreported\n");
    failures++;
    return -1;
  }
  CUgraphExec exec = NULL;
  CU(cu.graph_instantiate(&exec, graph, 0));
  for (int i = 0; i < launches; i++)
    CU(cu.graph_launch(exec, ls));
  pinpool_stats_t st;
  PP(pinpool_get_stats(pool, &st));
  bool early = false, early_done = false, back = false;
  PP(probe(pool, size, blk, &early)); /* launches in flight */
  CU(cu.stream_sync(ls));
  PP(pinpool_synchronize(pool));
  PP(probe(pool, size, blk, &early_done)); /* launched, not released */
  CU(cu.graph_exec_destroy(exec));
  CU(cu.graph_destroy(graph));
  PP(pinpool_graph_release(pool, id));
  PP(pinpool_synchronize(pool));
  PP(probe(pool, size, blk, &back));
  unsigned char *copy = malloc(size), *want = malloc(size);
  if (copy == NULL || want == NULL)
    return -1;
  CU(cu.dtoh(copy, d, size, ls));
  CU(cu.stream_sync(ls));
  pattern(want, size);
  bool intact = memcmp(copy, want, size) == 0;
  printf("   held by the graph: %llu block(s); handed out while launched: "
         "%s, after its launches: %s, after the release: %s\n",
         (unsigned long long)st.graph_held_blocks, early ? "YES" : "no",
         early_done ? "YES" : "no", back ? "yes" : "NO");
  printf("   device copy intact: %s\n", intact ? "yes" : "NO");
  if (st.graph_held_blocks != 1 || early || early_done || !back || !intact) {
    fprintf(stderr, "FAIL: graph capture\n");
    failures++;
  }
  free(copy);
  free(want);
  pinpool_destroy(pool);
  CU(cu.mem_free(d));
  CU(cu.stream_destroy(cs));
  CU(cu.stream_destroy(ls));
  return 0;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else {
      fprintf(stderr, "usage: %s [--quick]\n", argv[0]);
      return 2;
    }
  }
  if (load() != 0)
    return 1;
  (void)bench_latency();
  size_t seg = quick ? 64 * MiB : GiB;
  printf("\n2. a fresh segment (first allocation of a block this size)\n");
  (void)bench_segment("cuda", seg);
  (void)bench_segment("cuda-register", seg);
  (void)bench_bandwidth();
  (void)reuse_check();
  (void)capture_check();
  printf("\nRESULT: %s\n", failures == 0 ? "OK" : "FAILED");
  return failures == 0 ? 0 : 1;
}
