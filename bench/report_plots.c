/*
 * pp_report's chart data: one *.dat file per chart and plots.gp, which
 * gnuplot runs from the plots directory (bench/run.sh).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_data.h"

static FILE *open_in(const char *dir, const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  if (f == NULL)
    pr_die("cannot write %s: %s", path, strerror(errno));
  return f;
}

/* Distinct series (impl, mode) in a workload, fair modes only or all. */
static int series(const char *wl, int threads, bool fair_only,
                  const pr_group_t **out, int max) {
  int n = 0;
  for (int i = 0; i < pr_ngroups && n < max; i++) {
    const pr_group_t *g = &pr_groups[i];
    if (strcmp(g->workload, wl) || g->threads != threads ||
        (fair_only && !pr_fair(g)))
      continue;
    bool dup = false;
    for (int k = 0; k < n; k++)
      dup = dup || (strcmp(out[k]->impl, g->impl) == 0 &&
                    strcmp(out[k]->mode, g->mode) == 0);
    if (!dup)
      out[n++] = g;
  }
  return n;
}

/* Colour and dash of a series: one colour per implementation, dashed for
 * malloc peers' alloc-only mode. */
static const char *style(const char *impl, const char *mode, char *buf,
                         size_t len) {
  static const struct {
    const char *impl, *rgb;
  } colours[] = {{"pinpool", "#000000"},
                 {"pinpool-tc", "#7f7f7f"},
                 {"pinpool-prearena", "#8c8c3c"},
                 {"refpool", "#9467bd"},
                 {"rmmpool", "#17becf"},
                 {"floor", "#bbbbbb"},
                 {"tcmalloc-rr0", "#ffbb78"},
                 {"naive", "#8c564b"},
                 {"glibc", "#1f77b4"},
                 {"pinpool-cuda", "#393b79"},
                 {"pinpool-cuda-register", "#bcbd22"},
                 {"refpool-cuda", "#c5b0d5"},
                 {"cuhostalloc", "#e377c2"},
                 {"jemalloc", "#d62728"},
                 {"mimalloc", "#2ca02c"},
                 {"tcmalloc", "#ff7f0e"}};
  const char *rgb = "#555555";
  for (size_t i = 0; i < sizeof colours / sizeof colours[0]; i++)
    if (strcmp(colours[i].impl, impl) == 0)
      rgb = colours[i].rgb;
  snprintf(buf, len, "lc rgb '%s' dt %d", rgb,
           strcmp(mode, "alloc") == 0 ? 2 : 1);
  return buf;
}

/* "impl" or "impl/mode" -> its parts. */
static void split_label(const char *s, char *impl, size_t ilen, char *mode,
                        size_t mlen) {
  const char *sl = strchr(s, '/');
  snprintf(impl, ilen, "%.*s", (int)(sl ? (size_t)(sl - s) : strlen(s)), s);
  snprintf(mode, mlen, "%s", sl ? sl + 1 : "touch");
}

/* A short name for a case, for the x axis of the bar charts. */
static const char *short_case(const pr_group_t *g, bool threads, char *buf,
                              size_t len) {
  char sz[32] = "";
  unsigned depth = 0;
  char live[32] = "";
  if (strcmp(g->workload, "W3") == 0 &&
      sscanf(g->kase, "%31s batch, depth %u", sz, &depth) == 2)
    snprintf(buf, len, "W3 %s d%u", sz, depth);
  else if (strcmp(g->workload, "W2") == 0 &&
           sscanf(g->kase, "%31s live<=%31s", sz, live) == 2)
    snprintf(buf, len, "W2 %s %s", sz, live);
  else
    snprintf(buf, len, "%s", g->workload);
  if (threads) {
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, " %dT", g->threads);
  }
  return buf;
}

static const char *g_bar_peers[] = {
    "rmmpool/touch",  "refpool/touch",  "naive/touch",    "glibc/touch",
    "jemalloc/touch", "mimalloc/touch", "tcmalloc/touch", "tcmalloc-rr0/touch"};
#define N_BAR_PEERS ((int)(sizeof g_bar_peers / sizeof g_bar_peers[0]))

/* One histogram plot command over `file` with columns 2..n+1 styled as
 * the labels say. */
static void gp_bars(FILE *gp, const char *file, const char *const *labels,
                    int n) {
  char st[96], impl[32], mode[16];
  fprintf(gp, "plot ");
  for (int k = 0; k < n; k++) {
    split_label(labels[k], impl, sizeof impl, mode, sizeof mode);
    fprintf(gp, "%s'%s' using %d%s title columnheader(%d) %s", k ? ", " : "",
            file, k + 2, k ? "" : ":xtic(1)", k + 2,
            style(impl, mode, st, sizeof st));
  }
  fprintf(gp, "\n");
}

/* The header row of a bar chart's data: "case", then one column a label. */
static void dat_header(FILE *d, const char *const *labels, int n) {
  fprintf(d, "case");
  for (int k = 0; k < n; k++)
    fprintf(d, "\t%s", labels[k]);
  fprintf(d, "\n");
}

/* The group of g's case measured by label ("impl/mode") at threads, or
 * NULL. */
static const pr_group_t *same_case(const pr_group_t *g, const char *label,
                                   int threads) {
  char impl[32], mode[16];
  split_label(label, impl, sizeof impl, mode, sizeof mode);
  return pr_find_group(g->workload, g->kase, impl, mode, threads, false);
}

void pr_write_plots(void) {
  const pr_group_t *ser[32];
  char b[64], st[96];
  FILE *gp = open_in(pr_opt.plots, "plots.gp");
  fprintf(gp, "# generated by pp_report; run: gnuplot -e \"outdir='DIR'\" "
              "plots.gp\n"
              "if (!exists(\"outdir\")) outdir = \".\"\n"
              "set datafile missing \"?\"\nset datafile separator \"\\t\"\n"
              "set grid ytics\nset key outside right top\n"
              "set style fill solid 0.85 border -1\n");

  /* W1: ns per pair vs size, 1 thread. */
  int ns = series("W1", 1, false, ser, 32);
  FILE *d = open_in(pr_opt.plots, "w1.dat");
  fprintf(d, "size\tbytes");
  for (int k = 0; k < ns; k++)
    fprintf(d, "\t%s", pr_label(ser[k], b, sizeof b));
  fprintf(d, "\n");
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    if (strcmp(g->workload, "W1") || g->threads != 1 ||
        strcmp(g->impl, "pinpool") || strcmp(g->mode, "touch"))
      continue;
    fprintf(d, "%s\t%.0f", g->kase, pr_get(g, "size"));
    for (int k = 0; k < ns; k++) {
      const pr_group_t *q =
          pr_find_group("W1", g->kase, ser[k]->impl, ser[k]->mode, 1, false);
      double v = pr_get(q, "ns_med");
      fprintf(d, isfinite(v) ? "\t%.6g" : "\t?", v);
    }
    fprintf(d, "\n");
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 960,560 font 'sans,10'\n"
              "set output outdir.'/w1.png'\n"
              "set title 'W1 hot reuse, 1 thread: ns per alloc+free pair "
              "(median, log-log; lower is better; solid: touch, dashed: "
              "alloc)'\n"
              "set logscale xy\nset xlabel 'block size'\n"
              "set ylabel 'ns per pair'\nset format y '10^{%%L}'\n"
              "set xtics ('4K' 4096, '64K' 65536, '1M' 1048576, "
              "'64M' 67108864, '1G' 1073741824)\nplot ");
  for (int k = 0; k < ns; k++)
    fprintf(gp,
            "%s'w1.dat' using 2:%d title columnheader(%d) with "
            "linespoints lw %d pt 7 ps 0.6 %s",
            k ? ", " : "", k + 3, k + 3,
            strcmp(ser[k]->impl, "pinpool") ? 2 : 4,
            style(ser[k]->impl, ser[k]->mode, st, sizeof st));
  fprintf(gp, "\nunset logscale\nunset xlabel\nunset ylabel\n"
              "set xtics autofreq\nset format y '%%g'\n");

  /* Throughput: pinpool speed / peer speed for W2-W7 (fair modes). */
  d = open_in(pr_opt.plots, "throughput.dat");
  dat_header(d, g_bar_peers, N_BAR_PEERS);
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    if (!strcmp(g->workload, "W1") || strcmp(g->impl, "pinpool") ||
        strcmp(g->mode, "touch") || pr_pinpool_only_wl(g->workload))
      continue;
    fprintf(d, "%s", short_case(g, true, b, sizeof b));
    for (int k = 0; k < N_BAR_PEERS; k++) {
      const pr_group_t *q = same_case(g, g_bar_peers[k], g->threads);
      double r = q ? pr_speed(g) / pr_speed(q) : NAN;
      fprintf(d, isfinite(r) && r > 0 ? "\t%.6g" : "\t?", r);
    }
    fprintf(d, "\n");
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 1600,600 font 'sans,10'\n"
              "set output outdir.'/throughput.png'\n"
              "set title 'Throughput: pinpool ÷ peer (ops/s; W4: allocator "
              "time per op), touch mode, like for like. Above 1: pinpool "
              "ahead'\n"
              "set style data histograms\nset style histogram clustered "
              "gap 1\nset logscale y\nset yrange [0.1:*]\n"
              "set ylabel 'ratio (log)'\n"
              "set xtics rotate by -30 scale 0\nset bmargin 8\n"
              "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead "
              "lw 2 lc rgb 'black'\n");
  gp_bars(gp, "throughput.dat", g_bar_peers, N_BAR_PEERS);
  fprintf(gp, "unset arrow 1\nunset logscale\nunset ylabel\n");

  /* Memory overhead, 1 thread, per workload (fair series). */
  static const char *oimpl[] = {
      "pinpool/touch",  "rmmpool/touch",  "refpool/touch",
      "naive/touch",    "glibc/touch",    "jemalloc/touch",
      "mimalloc/touch", "tcmalloc/touch", "tcmalloc-rr0/touch"};
  const int noimpl = (int)(sizeof oimpl / sizeof oimpl[0]);
  d = open_in(pr_opt.plots, "overhead.dat");
  dat_header(d, oimpl, noimpl);
  for (int i = 0; i < pr_ngroups; i++) {
    const pr_group_t *g = &pr_groups[i];
    if (!strcmp(g->workload, "W1") || g->threads != 1 ||
        strcmp(g->impl, "pinpool") || strcmp(g->mode, "touch") ||
        pr_pinpool_only_wl(g->workload))
      continue;
    fprintf(d, "%s", short_case(g, false, b, sizeof b));
    for (int k = 0; k < noimpl; k++) {
      const pr_group_t *q = same_case(g, oimpl[k], 1);
      double v = strcmp(g->workload, "W4") == 0
                     ? pr_get(q, "reserved_over_need")
                     : pr_get(q, "overhead");
      fprintf(d, isfinite(v) ? "\t%.6g" : "\t?", v);
    }
    fprintf(d, "\n");
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 1400,560 font 'sans,10'\n"
              "set output outdir.'/overhead.png'\n"
              "set title 'Memory overhead, 1 thread: peak reserved (malloc: "
              "peak RSS growth) ÷ peak requested; W4: ÷ (live + in flight). "
              "Lower is better'\n"
              "set logscale y\nset yrange [0.8:*]\n"
              "set ytics (0.8, 1, 1.1, 1.25, 1.5, 2, 3, 5, 10, 20)\n"
              "set ylabel 'overhead (log)'\nset xtics rotate by -30 scale 0\n"
              "set arrow 1 from graph 0, first 1 to graph 1, first 1 nohead "
              "lw 2 lc rgb 'black'\n");
  gp_bars(gp, "overhead.dat", oimpl, noimpl);
  fprintf(gp, "unset arrow 1\nunset logscale\nset yrange [*:*]\n"
              "set ytics autofreq\nunset ylabel\n");

  /* W4: reuse lag per implementation, 1 thread. */
  ns = series("W4", 1, true, ser, 32);
  d = open_in(pr_opt.plots, "w4.dat");
  fprintf(d, "impl\tfast stream\tslow stream\treserved / need\n");
  for (int k = 0; k < ns; k++) {
    double f1 = pr_get(ser[k], "lag_fast_us_med"),
           s1 = pr_get(ser[k], "lag_slow_us_med"),
           o1 = pr_get(ser[k], "reserved_over_need");
    fprintf(d, "%s", pr_label(ser[k], b, sizeof b));
    fprintf(d, isfinite(f1) && f1 > 0 ? "\t%.6g" : "\t?", f1);
    fprintf(d, isfinite(s1) && s1 > 0 ? "\t%.6g" : "\t?", s1);
    fprintf(d, isfinite(o1) ? "\t%.6g\n" : "\t?\n", o1);
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 1100,500 font 'sans,10'\n"
              "set output outdir.'/w4.png'\n"
              "set multiplot layout 1,2 title 'W4 stream-ordered frees, 1 "
              "thread (fast stream: 50 µs copies, slow: 2 ms)'\n"
              "set xtics rotate by -30 scale 0\nset key inside top right\n"
              "set title 'reuse lag after the copy completed (median µs, "
              "log)'\nset logscale y\n"
              "plot 'w4.dat' using 2:xtic(1) title columnheader(2) lc rgb "
              "'#1f77b4', '' using 3 title columnheader(3) lc rgb '#d62728'\n"
              "unset logscale\nset yrange [0:*]\n"
              "set title 'reserved ÷ (live + in flight), peak'\nunset key\n"
              "plot 'w4.dat' using 4:xtic(1) lc rgb '#9467bd'\n"
              "unset multiplot\nset yrange [*:*]\nset key outside right "
              "top\n");

  /* W6: acquire and release ms per GiB (fair modes). */
  ns = series("W6", 1, true, ser, 32);
  d = open_in(pr_opt.plots, "w6.dat");
  fprintf(d, "impl\tacquire ms/GiB\trelease ms/GiB\n");
  for (int k = 0; k < ns; k++) {
    double a1 = pr_get(ser[k], "acquire_ms_per_gib"),
           r1 = pr_get(ser[k], "release_ms_per_gib");
    fprintf(d, "%s", pr_label(ser[k], b, sizeof b));
    fprintf(d, isfinite(a1) ? "\t%.6g" : "\t?", a1);
    fprintf(d, isfinite(r1) ? "\t%.6g\n" : "\t?\n", r1);
  }
  fclose(d);
  fprintf(gp, "set terminal pngcairo size 960,500 font 'sans,10'\n"
              "set output outdir.'/w6.png'\n"
              "set title 'W6 backend churn: ms per GiB acquired / released "
              "(lower is better)'\n"
              "set yrange [0:*]\nset ylabel 'ms per GiB'\n"
              "plot 'w6.dat' using 2:xtic(1) title columnheader(2) lc rgb "
              "'#1f77b4', '' using 3 title columnheader(3) lc rgb "
              "'#ff7f0e'\n");
  if (fclose(gp) != 0)
    pr_die("cannot write plots.gp");
}
