/*
 * pp_report's latest.md: the run and its method, the W2 summary, the
 * goals, one table per workload W1-W7, W1h's and W8's sections, W9's
 * (report_w9.c), the time spent and the failed runs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_data.h"

typedef struct column {
  const char *key;
  const char *head;
  char kind; /* t: time (ns), n: number, r: ratio, x: plain %.2f */
} column_t;

typedef struct wl_desc {
  const char *name;
  const char *title;
  const char *what;
  column_t extra[5];
} wl_desc_t;

static const wl_desc_t g_wl[] = {
    {"W1",
     "W1 hot reuse",
     "Alloc+free pairs of one size in a loop (each thread its own loop). "
     "ns/op = per pair: median and p99 over timed groups of pairs.",
     {{NULL, NULL, 0}}},
    {"W2",
     "W2 log-uniform sizes, capped live set",
     "Sizes log-uniform in the case's range; random frees keep the live set "
     "under the cap (split between threads). The same operations for every "
     "implementation: the fill (until the live set first reaches the cap) "
     "is reported apart (fill ops/s, fill faults/op); ns/op, ops/s, "
     "faults/op and backend calls are the steady state: the next 10,000 "
     "operations per thread (quick: 1,000), of which the second half is "
     "shown apart too (late faults/op, late ops/s). One operation = the "
     "frees it needs + allocation + use.",
     {{"fill_ops_per_s", "fill ops/s", 'n'},
      {"fill_minflt_per_op", "fill faults/op", 'x'},
      {"late_minflt_per_op", "late faults/op", 'x'},
      {"late_ops_per_s", "late ops/s", 'n'},
      {NULL, NULL, 0}}},
    {"W3",
     "W3 data-loader batches",
     "Producer allocates a batch (uint8 / fp32 256×3×224²), consumer frees "
     "the oldest; at most `depth` queued. 2 threads: producer and consumer "
     "on their own CPUs. ns/op = allocation (+ touch); ops/s = batches/s.",
     {{"free_ns_med", "free med", 't'}, {NULL, NULL, 0}}},
    {"W4",
     "W4 stream-ordered frees",
     "1 MiB blocks staged through a fast (50 µs copies) and a slow (2 ms) "
     "simulated stream, ≤ 4 copies in flight per stream, each block freed "
     "right after its copy is queued. pinpool: record_stream + free "
     "(events=simulated); refpool: its global event FIFO; malloc peers and "
     "naive: a shim that frees a block when its stream passes it. ns/op = "
     "allocation + use + record/free (the copy's submission and the waits "
     "for stream room excluded). Reuse lag = time from a block's copy "
     "completing to the same address being handed out again, by the "
     "stream of that copy (median). Reclaim lag = mean time from a copy "
     "completing to its block being reusable (pools: from their reclaim "
     "statistics; shim: measured per block). Overhead = reserved (RSS for "
     "malloc) peak / peak of live + in-flight bytes.",
     {{"lag_fast_us_med", "fast reuse lag µs", 'n'},
      {"lag_slow_us_med", "slow reuse lag µs", 'n'},
      {"reclaim_lag_us", "reclaim lag µs", 'n'},
      {"early_reuse", "early reuse", 'n'},
      {NULL, NULL, 0}}},
    {"W5",
     "W5 producer/consumer, cross-thread frees",
     "xmalloc-test style: log-uniform 4 KiB – 4 MiB blocks allocated in "
     "batches of 64 and freed by the consumer (≤ 4 batches queued); 1 "
     "thread: allocate 64, free 64. ns/op = allocation (+ touch).",
     {{"free_ns_med", "free med", 't'},
      {"rss_growth_mib", "RSS growth MiB", 'x'},
      {NULL, NULL, 0}}},
    {"W6",
     "W6 backend churn",
     "Large blocks in a cycle (quick: 16–64 MiB; full: 256 MiB – 1 GiB), two "
     "live at a time; pinpool's cache is capped below the working set, so "
     "blocks come from the backend. ns/op = one acquisition (allocation + "
     "use).",
     {{"acquire_ms_per_gib", "acquire ms/GiB", 'x'},
      {"release_ms_per_gib", "release ms/GiB", 'x'},
      {NULL, NULL, 0}}},
    {"W7",
     "W7 KV-cache offload",
     "Bursts of 2 MiB pages; least recently used pages freed to stay under "
     "the live cap; a tenth of the live pages re-accessed after each burst. "
     "ns/op = one page (its LRU free + allocation + use).",
     {{"reserved_end_mib", "reserved at end MiB", 'x'}, {NULL, NULL, 0}}},
};

static void md_cell(FILE *f, const pr_group_t *g, const column_t *c) {
  char buf[64];
  double v = pr_get(g, c->key);
  switch (c->kind) {
  case 't':
    fprintf(f, " %s |", pr_fmt_ns(v, buf, sizeof buf));
    break;
  case 'x':
    if (isfinite(v))
      fprintf(f, " %.2f |", v);
    else
      fprintf(f, " – |");
    break;
  default:
    fprintf(f, " %s |", pr_fmt_num(v, buf, sizeof buf));
  }
}

static void md_table(FILE *f, const wl_desc_t *w) {
  bool any = false;
  for (int i = 0; i < pr_ngroups && !any; i++)
    any = strcmp(pr_groups[i].workload, w->name) == 0;
  fprintf(f, "## %s\n\n%s\n\n", w->title, w->what);
  if (!any) {
    fprintf(f, "No results.\n\n");
    return;
  }
  fprintf(f, "| case | thr | impl | mode | ns/op med | p99 | ops/s | "
             "time ÷ pinpool | ops/s ÷ pinpool | over floor /op | ÷ floor | "
             "memory held | backend calls | faults/op |");
  for (const column_t *c = w->extra; c->key; c++)
    fprintf(f, " %s |", c->head);
  fprintf(f, " reps |\n|---|--:|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
             "--:|");
  for (const column_t *c = w->extra; c->key; c++)
    fprintf(f, "--:|");
  fprintf(f, "--:|\n");
  const char *prev_case = "";
  int prev_t = 0;
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    char b1[64], b2[64], b3[64], b4[64], b5[64], b6[64];
    if (strcmp(g->workload, w->name) || g->nruns == 0)
      continue;
    bool same = strcmp(prev_case, g->kase) == 0 && prev_t == g->threads;
    double ov = strcmp(w->name, "W4") == 0 ? pr_get(g, "reserved_over_need")
                                           : pr_get(g, "overhead");
    fprintf(f, "| %s | %d | %s%s%s | %s | %s | %s | %s | %s | %s | ",
            same ? "" : g->kase, g->threads, pr_is_pinpool(g) ? "**" : "",
            g->impl, pr_is_pinpool(g) ? "**" : "", g->mode,
            pr_fmt_ns(pr_get(g, "ns_med"), b1, sizeof b1),
            pr_fmt_ns(pr_get(g, "ns_p99"), b2, sizeof b2),
            pr_fmt_num(pr_get(g, "ops_per_s"), b3, sizeof b3),
            pr_fmt_ratio(g->ratio_ns, b4, sizeof b4),
            pr_fmt_ratio(g->ratio_ops, b5, sizeof b5));
    fprintf(f, "%s | %s | ", pr_fmt_ns(g->over_floor_ns, b1, sizeof b1),
            pr_fmt_ratio(g->ratio_floor, b2, sizeof b2));
    if (isfinite(ov))
      fprintf(f, "%.2f | ", ov);
    else
      fprintf(f, "– | ");
    fprintf(f, "%s | %s |",
            pr_fmt_num(pr_get(g, "backend_calls"), b6, sizeof b6),
            pr_fmt_num(pr_get(g, "minflt_per_op"), b1, sizeof b1));
    for (const column_t *c = w->extra; c->key; c++)
      md_cell(f, g, c);
    fprintf(f, " %d |\n", g->nruns);
    prev_case = g->kase;
    prev_t = g->threads;
  }
  /* Notes */
  bool header = false;
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    char b[64];
    if (strcmp(g->workload, w->name))
      continue;
    for (int k = 0; k < g->nnotes; k++) {
      if (!header)
        fprintf(f, "\nNotes:\n\n");
      header = true;
      fprintf(f, "- %s, %d thread%s, %s: %s\n", g->kase, g->threads,
              g->threads > 1 ? "s" : "", pr_label(g, b, sizeof b), g->notes[k]);
    }
  }
  /* Configurations */
  fprintf(f, "\npinpool configuration:");
  const char *seen[4] = {NULL, NULL, NULL, NULL};
  int nseen = 0;
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    if (strcmp(g->workload, w->name) || !pr_is_pinpool(g))
      continue;
    bool dup = false;
    for (int k = 0; k < nseen; k++)
      dup = dup || strcmp(seen[k], g->config) == 0;
    if (dup || nseen == 4)
      continue;
    seen[nseen++] = g->config;
    fprintf(f, "%s %s `%s`", nseen > 1 ? ";" : "", g->impl, g->config);
  }
  fprintf(f, ".\n\n");
}

/* W1h: one row per size and history level. */
static void md_w1h(FILE *f) {
  fprintf(f, "## W1h history cost on the hot path\n\n"
             "W1's cached alloc+free pair, 1 thread, pinpool with history off "
             "and on (`pinpool_record_history` right after create; a ring of "
             "100,000 entries, the default). With history on, each pair "
             "records 2 events (alloc, free_completed). ÷ off = ns/pair ÷ the "
             "history-off pair; ns per event = (pair − off pair) ÷ 2.\n\n");
  if (!pr_have_workload("W1h")) {
    fprintf(f, "No results.\n\n");
    return;
  }
  fprintf(f, "| size | history | impl | ns/pair med | p99 | ÷ off | ns per "
             "event | reps |\n|---|---|---|--:|--:|--:|--:|--:|\n");
  const char *prev = "";
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    char b1[64], b2[64], b3[64], b4[64];
    if (strcmp(g->workload, "W1h") || g->nruns == 0)
      continue;
    const char *lvl = g->impl;
    for (int k = 0; k < PR_N_HLEVELS; k++)
      if (strcmp(pr_hlevels[k].impl, g->impl) == 0)
        lvl = pr_hlevels[k].label;
    fprintf(f, "| %s | %s | %s | %s | %s | %s | %s | %d |\n",
            strcmp(prev, g->kase) ? g->kase : "", lvl, g->impl,
            pr_fmt_ns(pr_get(g, "ns_med"), b1, sizeof b1),
            pr_fmt_ns(pr_get(g, "ns_p99"), b2, sizeof b2),
            pr_fmt_ratio(g->ratio_ns, b3, sizeof b3),
            pr_fmt_ns(pr_ns_per_event(g), b4, sizeof b4), g->nruns);
    prev = g->kase;
  }
  fprintf(f, "\n");
}

/* W8: the snapshots' cost, then the latency of the allocating threads in
 * each phase. */
static void md_w8(FILE *f) {
  fprintf(f, "## W8 snapshots\n\n"
             "pinpool only. A live set of N blocks (log-uniform 512 B – "
             "4 KiB) with history on (level all, 16-frame stacks, the ring "
             "full: 1,000,000 entries, quick 100,000), then 1 or 2 threads "
             "(`thr`) allocate and free while the main thread writes "
             "snapshots to a file in a loop. Snapshot: wall time of "
             "`pinpool_snapshot_write` (median; cold = the first one in the "
             "process, before the measurement), its file, and the `gather_ns` "
             "and `max_hold_ns` it reports (the longest time it held a pool "
             "lock). Duty = share of the phase spent writing snapshots.\n\n");
  if (!pr_have_workload("W8")) {
    fprintf(f, "%s.\n\n", PR_W8_REASON);
    return;
  }
  fprintf(f, "| case | thr | snapshot med | max | cold | file MiB | gather "
             "| lock hold med | max | ring kept | duty | setup | reps |\n"
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    char b[7][64];
    if (strcmp(g->workload, "W8") || g->nruns == 0)
      continue;
    fprintf(f,
            "| %s | %d | %s | %s | %s | %.1f | %s | %s | %s | %s | %.0f %% "
            "| %.1f s | %d |\n",
            g->kase, g->threads,
            pr_fmt_ns(pr_get(g, "snap_ms_med") * 1e6, b[0], sizeof b[0]),
            pr_fmt_ns(pr_get(g, "snap_ms_max") * 1e6, b[1], sizeof b[1]),
            pr_fmt_ns(pr_get(g, "snap_ms_cold") * 1e6, b[2], sizeof b[2]),
            pr_get(g, "file_mib"),
            pr_fmt_ns(pr_get(g, "gather_ms_med") * 1e6, b[3], sizeof b[3]),
            pr_fmt_ns(pr_get(g, "hold_us_med") * 1e3, b[4], sizeof b[4]),
            pr_fmt_ns(pr_get(g, "hold_us_max") * 1e3, b[5], sizeof b[5]),
            pr_fmt_num(pr_get(g, "hist_kept"), b[6], sizeof b[6]),
            pr_get(g, "snap_duty_pct"), pr_get(g, "setup_s"), g->nruns);
  }
  fprintf(f, "\nLatency of the allocating threads: every alloc+free pair "
             "timed, all threads together, in three phases of equal length: "
             "the main thread idle (no snapshot), busy (memsets a 64 MiB "
             "buffer: CPU and memory traffic without the pool; with 2 threads "
             "on 2 CPUs it takes CPU time from them), and writing snapshots. "
             "Pairs: hot = 4 KiB from the thread cache; central = every 64th, "
             "after a thread-cache flush (refill from a central bin); backend "
             "= every 10 ms, 512 KiB, a segment created and released (waits "
             "for the segment lock a snapshot takes, and for the kernel's mmap "
             "lock, which the snapshot's own buffers take too). History level "
             "all with 16-frame stacks makes a hot pair hundreds of ns long "
             "(see W1h).\n\n"
             "| case | thr | main thread | pairs/s | med | p99 | p99.9 | max | "
             "hot max | central med | central max | backend med | backend "
             "max |\n|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
  static const struct {
    const char *key, *label;
  } ph[] = {{"idle", "idle"}, {"busy", "busy"}, {"snap", "**snapshots**"}};
  static const char *const cols[] = {
      "med",         "p99",         "p999",        "max",        "hot_max",
      "central_med", "central_max", "backend_med", "backend_max"};
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    char b[64], key[48];
    if (strcmp(g->workload, "W8") || g->nruns == 0)
      continue;
    for (size_t p = 0; p < sizeof ph / sizeof ph[0]; p++) {
      snprintf(key, sizeof key, "%s_pairs_per_s", ph[p].key);
      fprintf(f, "| %s | %s | %s | %s |", p ? "" : g->kase,
              p ? "" : (g->threads > 1 ? "2" : "1"), ph[p].label,
              pr_fmt_num(pr_get(g, key), b, sizeof b));
      for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        snprintf(key, sizeof key, "%s_%s", ph[p].key, cols[c]);
        fprintf(f, " %s |", pr_fmt_ns(pr_get(g, key), b, sizeof b));
      }
      fprintf(f, "\n");
    }
  }
  fprintf(f, "\npinpool configuration:");
  for (int i = 0; i < pr_ngroups; i++)
    if (strcmp(pr_groups[i].workload, "W8") == 0) {
      fprintf(f, " `%s`", pr_groups[i].config);
      break;
    }
  fprintf(f, ".\n\n");
}

/* The headline: W2 like for like, per variant, threads and mode: pinpool
 * against the fastest peer, with faults per operation and memory held. */
static void md_w2_summary(FILE *f) {
  if (!pr_have_workload("W2"))
    return;
  fprintf(f, "## W2 at a glance (steady state, like for like)\n\n"
             "Each row: pinpool and the fastest peer in the same mode "
             "(ops/s in the steady state, after the fill), pinpool ÷ that "
             "peer (> 1: pinpool ahead), page faults per operation and "
             "memory held (peak reserved or RSS ÷ peak requested) of both; "
             "in touch mode also the floor's ops/s. In alloc mode a malloc "
             "peer's memory held (RSS growth) is meaningless: its pages are "
             "never touched.\n\n"
             "| case | thr | mode | pinpool ops/s | faults/op | memory held "
             "| fastest peer | its ops/s | faults/op | memory held | "
             "pinpool ÷ peer | floor ops/s |\n"
             "|---|--:|---|--:|--:|--:|---|--:|--:|--:|--:|--:|\n");
  static const char *modes[] = {"touch", "alloc"};
  for (int m = 0; m < 2; m++)
    for (int i = 0; i < pr_ngroups; i++) {
      const pr_group_t *p = &pr_groups[i];
      char b[6][64];
      if (strcmp(p->workload, "W2") || strcmp(p->impl, "pinpool") ||
          strcmp(p->mode, modes[m]) || p->nruns == 0)
        continue;
      const pr_group_t *q = pr_best_peer(p);
      const pr_group_t *fl =
          pr_find_group("W2", p->kase, "floor", "touch", p->threads, false);
      fprintf(
          f,
          "| %s | %d | %s | %s | %s | %.2f | %s | %s | %s | %.2f | "
          "**%s** | %s |\n",
          p->kase, p->threads, p->mode,
          pr_fmt_num(pr_speed(p), b[0], sizeof b[0]),
          pr_fmt_num(pr_get(p, "minflt_per_op"), b[1], sizeof b[1]),
          pr_get(p, "overhead"), q ? q->impl : "–",
          pr_fmt_num(pr_speed(q), b[2], sizeof b[2]),
          pr_fmt_num(pr_get(q, "minflt_per_op"), b[3], sizeof b[3]),
          pr_get(q, "overhead"),
          pr_fmt_ratio(q ? pr_speed(p) / pr_speed(q) : NAN, b[4], sizeof b[4]),
          pr_fmt_num(strcmp(p->mode, "touch") == 0 ? pr_speed(fl) : NAN, b[5],
                     sizeof b[5]));
    }
  fprintf(f, "\n");
}

void pr_write_md(const pr_machine_t *m) {
  char date[64];
  FILE *f = pr_open_dated(pr_opt.md, "%Y-%m-%d %H:%M UTC", date, sizeof date);
  fprintf(f, "# pinpool benchmarks (%s run)\n\n", pr_opt.mode);
  fprintf(f,
          "Written by `bench/run.sh%s` on %s, revision `%s`, in %.0f s. "
          "Method and caveats: [docs/benchmarks.md](../../docs/"
          "benchmarks.md). Raw numbers: [latest.json](latest.json).\n\n",
          strcmp(pr_opt.mode, "quick") == 0 ? " --quick" : "", date, pr_opt.rev,
          pr_opt.elapsed);
  fprintf(f,
          "- Machine: %s; %ld CPUs (%s); %.1f GiB; THP `%s`; RLIMIT_MEMLOCK "
          "%s; uid %d.\n",
          m->uname, m->nproc, m->cpu, m->mem_gib, m->thp, m->memlock, m->uid);
  fprintf(f,
          "- Load average at start / end: %s / %s (other work on the machine "
          "shares its CPUs; repetitions are interleaved to spread that "
          "noise).\n",
          pr_opt.load_start ? pr_opt.load_start : "?",
          pr_opt.load_end ? pr_opt.load_end : "?");
  fprintf(f, "- Implementations: **pinpool**; refpool (PyTorch "
             "CachingHostAllocator policy: power-of-two, no split, global "
             "event FIFO; bench/refpool.c); rmmpool (RMM "
             "pool_memory_resource policy: coalescing best fit over "
             "populated chunks that double, per-stream free lists; "
             "bench/rmmpool.c); naive (mmap+MAP_POPULATE+mlock per block, "
             "munlock+munmap per free; not in W2); floor (no allocator: the "
             "touches alone, on a pre-faulted ring the size of the live "
             "set)");
  for (int i = 0; i < pr_opt.npeers; i++)
    fprintf(f, "; %s", pr_opt.peers[i]);
  for (int i = 0; i < pr_opt.nmissing; i++)
    fprintf(f, "; %s (missing)", pr_opt.missing[i]);
  fprintf(f, ".\n");
  for (int i = 0; i < pr_opt.npeers; i++)
    if (strncmp(pr_opt.peers[i], "cuda=", 5) == 0)
      fprintf(f, "- GPU implementations (the CUDA driver above; touch mode "
                 "only): "
                 "pinpool-cuda (`backend=cuda`: cuMemHostAlloc segments), "
                 "pinpool-cuda-register (`backend=cuda-register`: mmap, "
                 "parallel populate, cuMemHostRegister), refpool-cuda "
                 "(refpool on cuMemHostAlloc, as PyTorch), cuhostalloc "
                 "(cuMemHostAlloc / cuMemFreeHost per block: the naive "
                 "baseline on a GPU machine); all with "
                 "CU_MEMHOSTALLOC_PORTABLE.\n");
  fprintf(f, "- Modes, the same for every implementation: `touch` writes one "
             "byte in every 4 KiB page of every block handed out (the "
             "headline: a pinned block is written by its user; a pool's pages "
             "are resident, a malloc's may fault); `alloc` writes nothing (the "
             "allocator alone). Every ratio compares an implementation with "
             "pinpool in the same mode. `floor` (touch mode only) is the "
             "touches alone; `over floor /op` = an implementation's time per "
             "operation (1 / ops/s) minus the floor's, `÷ floor` their ratio.\n"
             "- Every number is the median over `reps` runs; each run is one "
             "process, implementations interleaved with a rotating order. "
             "`time ÷ pinpool` = ns/op median ÷ pinpool's (> 1: pinpool is "
             "faster); `ops/s ÷ pinpool` (< 1: pinpool is faster). "
             "Memory held (`overhead`) = peak reserved ÷ peak requested bytes "
             "for the pools, naive and the floor (its ring), peak RSS (VmHWM) "
             "growth ÷ peak requested for malloc peers (meaningless in `alloc` "
             "mode, where their pages are never touched). Page faults per "
             "operation (minor faults of the process in the measured phase) "
             "and backend calls in the measured phase: segment or chunk "
             "allocations + releases for pools, mappings + unmappings for "
             "naive, and for malloc peers their memory system calls (mmap, "
             "munmap, mremap, brk, mprotect, madvise, counted by the kernel "
             "on its syscall tracepoints; left out, with a note, where it "
             "cannot count them).\n\n");
  md_w2_summary(f);

  fprintf(f, "## Goals (issues 21, 7, 4 and 22; reported, not asserted)\n\n"
             "| goal | status | where we stand "
             "|\n"
             "|---|---|---|\n");
  for (int i = 0; i < pr_ngoals; i++)
    fprintf(f, "| %s | **%s** | %s |\n", pr_goals[i].name, pr_goals[i].status,
            pr_goals[i].detail);
  fprintf(f, "\n");
  if (pr_opt.charts) {
    fprintf(f, "Charts: [W1 hot reuse](w1.png), [throughput vs pinpool]"
               "(throughput.png), [memory overhead](overhead.png), "
               "[W4 reuse lag](w4.png), [W6 backend churn](w6.png).\n\n");
    fprintf(f, "![W1](w1.png)\n\n![throughput](throughput.png)\n\n");
  } else {
    fprintf(f, "Charts: not drawn (gnuplot is not installed, or there "
               "was nothing to draw in this run).\n\n");
  }
  for (size_t i = 0; i < sizeof g_wl / sizeof g_wl[0]; i++)
    md_table(f, &g_wl[i]);
  md_w1h(f);
  md_w8(f);
  pr_w9_write_md(f);
  if (pr_ncost > 0) {
    /* W9's T lines carry its workers where the others' carry threads. */
    fprintf(f,
            "## Time spent\n\n| workload | threads%s | runs | seconds |\n"
            "|---|--:|--:|--:|\n",
            pr_w9_have() ? " (W9: workers)" : "");
    for (int i = 0; i < pr_ncost; i++)
      fprintf(f, "| %s | %d | %d | %.0f |\n", pr_cost[i].workload,
              pr_cost[i].threads, pr_cost[i].runs, pr_cost[i].seconds);
    fprintf(f, "\n");
  }
  if (pr_nfail > 0) {
    fprintf(f, "## Failed runs\n\n");
    for (int i = 0; i < pr_nfail; i++)
      fprintf(f, "- %s\n", pr_fail[i].text);
    fprintf(f, "\n");
  }
  if (fclose(f) != 0)
    pr_die("cannot write %s", pr_opt.md);
}
