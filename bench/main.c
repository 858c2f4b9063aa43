/*
 * pp_bench — one run of one benchmark case (issue 7).
 *
 * The same source is built once per malloc peer: pp_bench (glibc malloc),
 * pp_bench_jemalloc, pp_bench_mimalloc, pp_bench_tcmalloc; each links its
 * allocator so that malloc() in the whole process is that allocator and no
 * two peers share a process. Every binary also holds pinpool, the reference
 * pool (refpool.c: PyTorch's policy) and the naive baseline; bench/run.sh
 * runs those from pp_bench.
 *
 * One invocation measures one (workload, case, implementation, mode,
 * thread count) once and prints one record; bench/run.sh interleaves the
 * implementations, repeats, and pp_report takes the medians. One case per
 * process keeps the peak RSS (VmHWM) of a case free of the others.
 *
 *   pp_bench --workload W --impl NAME [--mode alloc|touch]
 *            [--threads 1|2] [--case N] [--rep N] [--quick] [--name NAME]
 *   pp_bench --list W [--threads N] [--quick]   the number of cases
 *
 * Workloads: W1..W7 (every implementation), W1h (W1's pair with pinpool's
 * allocation history on) and W8 (snapshots), both pinpool only.
 *
 * Implementations (--impl):
 *   pinpool  pinpool (mlock=1; workload-specific settings in the record)
 *   pinpool-tc  W1 only: pinpool with tcache_bytes=8GiB (every size in the
 *            thread cache)
 *   pinpool-h-alloc, pinpool-h-all, pinpool-h-all16  W1h only: pinpool
 *            with history level alloc (no stacks), all (no stacks), all
 *            with 16-frame stacks
 *   refpool  the PyTorch-policy reference pool (refpool.c)
 *   rmmpool  the RMM pool_memory_resource-policy reference pool
 *            (rmmpool.c: coalescing best fit in populated chunks)
 *   naive    mmap(MAP_POPULATE) + mlock per allocation, munlock + munmap
 *            per free: the CPU analogue of cudaHostAlloc / cudaFreeHost
 *   floor    touch mode only: no allocator; blocks are consecutive pieces
 *            of a pre-faulted region (a ring per thread the size of the
 *            workload's live set), frees do nothing: the cost of the
 *            touches alone
 *   floor-huge  the floor on transparent huge pages (2 MiB aligned,
 *            MADV_HUGEPAGE, then written): pinpool hugepages=1's floor
 *            (issue 37); run by hand, not by run.sh
 *   malloc   this binary's malloc (glibc, jemalloc, mimalloc or tcmalloc;
 *            --name renames it, e.g. tcmalloc-rr0 for the tcmalloc binary
 *            run under TCMALLOC_RELEASE_RATE=0)
 * Modes, the same for every implementation: "touch" writes one byte in
 * every 4 KiB page of every block handed out (pinned memory is written by
 * its user; the pools' pages are resident, the mallocs' may fault);
 * "alloc" writes nothing (the allocator alone).
 *
 * The sources: harness.h (what the parts share), harness.c (utilities,
 * process measurements, options, requested bytes, records, threads),
 * impl.c (the implementations, the floor, their setup), w1.c .. w8.c (one
 * workload each; W1h is in w1.c) and this file (the workloads' table,
 * the options, main).
 *
 * Output lines (tab-separated):
 *   R <workload> <case> <impl> <mode> <threads> <rep> <config> k=v ...
 *   N <workload> <case> <impl> <mode> <threads> <note>
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cudapeer.h"
#include "harness.h"
#include "syscount.h"

/* ==== Dispatch ============================================================ */

typedef struct workload {
  const char *name;
  const char *pool_config;
  const char *variant; /* a pinpool variant measured too, or NULL */
  const char *variant_config;
  int (*ncases)(void);
  void (*run)(int ci);
  int max_threads;
  bool pinpool_only;  /* no peer has the feature measured */
  bool hist_variants; /* the pinpool-h-* implementations are measured */
} workload_t;

static int one_case(void) { return 1; }

static const workload_t g_workloads[] = {
    {"W1", "mlock=1", "pinpool-tc", ",tcache_bytes=8GiB", pb_w1_ncases,
     pb_w1_run, 2, false, false},
    {"W2", "mlock=1", NULL, NULL, pb_w2_ncases, pb_w2_run, 2, false, false},
    {"W3", "mlock=1", NULL, NULL, pb_w3_ncases, pb_w3_run, 2, false, false},
    {"W4", "mlock=1,events=simulated,sim_delay_us=0", NULL, NULL, one_case,
     pb_w4_run, 2, false, false},
    {"W5", "mlock=1", NULL, NULL, one_case, pb_w5_run, 2, false, false},
    {"W6", "mlock=1,max_cached=512MiB", NULL, NULL, one_case, pb_w6_run, 2,
     false, false},
    {"W7", "mlock=1", NULL, NULL, one_case, pb_w7_run, 2, false, false},
    {"W1h", "mlock=1", NULL, NULL, pb_w1h_ncases, pb_w1h_run, 1, true, true},
    {"W8", "mlock=1,max_cached=256KiB", NULL, NULL, pb_w8_ncases, pb_w8_run, 2,
     true, false},
};

static const workload_t *find_workload(const char *name) {
  for (size_t i = 0; i < sizeof g_workloads / sizeof g_workloads[0]; i++)
    if (strcmp(g_workloads[i].name, name) == 0)
      return &g_workloads[i];
  return NULL;
}

static void usage(FILE *f) {
  fprintf(
      f,
      "usage: pp_bench --workload W --impl NAME [--mode alloc|touch]\n"
      "                [--threads 1|2] [--case N] [--rep N] [--quick]\n"
      "                [--name NAME]\n"
      "                [--config PINPOOL_CONFIG]\n"
      "       pp_bench --list W [--threads N] [--quick]\n"
      "       pp_bench --cuda-probe\n"
      "       pp_bench --hold-syscount\n"
      "workloads: W1..W7, W1h (history cost), W8 (snapshots)\n"
      "impls: pinpool, pinpool-tc (W1), pinpool-h-alloc,\n"
      "       pinpool-h-all, pinpool-h-all16 (W1h), refpool, rmmpool, naive,\n"
      "       floor, floor-huge (touch mode only), malloc (%s; --name NAME "
      "reports it\n"
      "       under another name); W1h and W8 measure pinpool only\n"
      "       with a CUDA driver and device (W1..W7): pinpool-cuda,\n"
      "       pinpool-cuda-register, refpool-cuda, cuhostalloc\n"
      "       pp_bench --cuda-probe: exit 0 if those can run (prints the\n"
      "       device), 1 if not (prints why)\n"
      "       pp_bench --hold-syscount: keep the syscall tracepoints that\n"
      "       count malloc peers' backend calls registered until killed\n"
      "       (bench/run.sh; prints 'ready' or why not and exits 1)\n",
      PEER_NAME);
}

static long parse_int(const char *s, const char *what) {
  char *end;
  long v = strtol(s, &end, 10);
  if (*s == '\0' || *end != '\0')
    pb_die("%s: bad number '%s'", what, s);
  return v;
}

int main(int argc, char **argv) {
  const char *list = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(a, "--quick") == 0) {
      pb_opt.quick = true;
      continue;
    }
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(a, "--cuda-probe") == 0) {
      /* bench/run.sh: are the GPU implementations measurable here? */
      char why[256] = "";
      if (cudapeer_open(why, sizeof why) != 0) {
        printf("%s\n", why);
        return 1;
      }
      printf("%s\n", cudapeer_describe());
      return 0;
    }
    if (strcmp(a, "--hold-syscount") == 0) {
      /* bench/run.sh runs this for the whole suite: with the tracepoints
       * registered by this process, a measurement's own events open and
       * close without the kernel's (un)registration (syscount.h). */
      char why[256] = "";
      if (!syscount_init(why, sizeof why)) {
        printf("%s\n", why);
        return 1;
      }
      /* Gone with bench/run.sh even if it is killed without its trap. */
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      printf("ready\n");
      fflush(stdout);
      for (;;)
        pause();
    }
    if (v == NULL) {
      usage(stderr);
      pb_die("option %s needs a value", a);
    }
    i++;
    if (strcmp(a, "--workload") == 0)
      pb_opt.workload = v;
    else if (strcmp(a, "--list") == 0)
      list = v;
    else if (strcmp(a, "--impl") == 0)
      pb_opt.impl = v;
    else if (strcmp(a, "--mode") == 0) {
      if (strcmp(v, "touch") != 0 && strcmp(v, "alloc") != 0)
        pb_die("--mode is alloc or touch, not '%s'", v);
      pb_opt.touch = strcmp(v, "touch") == 0;
    } else if (strcmp(a, "--name") == 0)
      pb_opt.name = v;
    else if (strcmp(a, "--threads") == 0)
      pb_opt.threads = (int)parse_int(v, "--threads");
    else if (strcmp(a, "--case") == 0)
      pb_opt.case_idx = (int)parse_int(v, "--case");
    else if (strcmp(a, "--rep") == 0)
      pb_opt.rep = (int)parse_int(v, "--rep");
    else if (strcmp(a, "--config") == 0)
      pb_opt.config = v;
    else
      pb_die("unknown option '%s' (try --help)", a);
  }
  if (pb_opt.threads < 1 || pb_opt.threads > MAX_THREADS)
    pb_die("--threads must be 1..%d", MAX_THREADS);
  if (list != NULL) {
    const workload_t *wl = find_workload(list);
    if (wl == NULL)
      pb_die("unknown workload '%s'", list);
    if (pb_opt.threads > wl->max_threads)
      return 0; /* no cases */
    printf("%d\n", wl->ncases());
    return 0;
  }
  if (pb_opt.workload == NULL || pb_opt.impl == NULL) {
    usage(stderr);
    return 2;
  }
  const workload_t *wl = find_workload(pb_opt.workload);
  if (wl == NULL)
    pb_die("unknown workload '%s'", pb_opt.workload);
  if (pb_opt.threads > wl->max_threads)
    pb_die("%s runs with at most %d thread(s)", wl->name, wl->max_threads);
  if (pb_opt.case_idx < 0 || pb_opt.case_idx >= wl->ncases())
    pb_die("%s has cases 0..%d", wl->name, wl->ncases() - 1);
  if (strncmp(pb_opt.impl, "pinpool-", 8) == 0 &&
      (wl->variant == NULL || strcmp(pb_opt.impl, wl->variant) != 0) &&
      (!wl->hist_variants || pb_find_hist_variant(pb_opt.impl) == NULL) &&
      (wl->pinpool_only || pb_find_cuda_pool(pb_opt.impl) == NULL))
    pb_die("%s is not a variant measured in %s", pb_opt.impl, wl->name);
  if (wl->pinpool_only && strncmp(pb_opt.impl, "pinpool", 7) != 0)
    pb_die("%s measures pinpool only", wl->name);
  pb_cpus_init();
  if (strcmp(pb_opt.impl, "malloc") == 0)
    pb_check_peer();
  const char *cfg = wl->pool_config, *vcfg = wl->variant_config;
  if (pb_opt.quick && strcmp(wl->name, "W6") == 0)
    cfg = "mlock=1,max_cached=32MiB";
  if (pb_opt.config != NULL)
    cfg = pb_opt.config;
  pb_im_setup(cfg, wl->variant, vcfg, wl->hist_variants);
  wl->run(pb_opt.case_idx);
  pb_im_teardown();
  return 0;
}
