/*
 * pp_report — merge benchmark runs into bench/results/latest.{json,md} and
 * the data and script for the charts (issue 7).
 *
 *   pp_report --raw FILE --json OUT --markdown OUT --plots DIR
 *             [--rev REV] [--mode quick|full] [--elapsed SECONDS]
 *             [--peer NAME=VERSION]... [--missing NAME=REASON]...
 *             [--load-start "L1 L5 L15"] [--load-end "..."] [--charts 0|1]
 *
 * FILE holds the lines the pp_bench programs print (R: a record, N: a
 * note; W9: a record of pp_bench_w9 --raw, report_w9.c's) and the lines
 * bench/run.sh adds (F: a run that failed; T: how long a run took, in
 * microseconds). Records of
 * the same (workload, case, implementation, mode, threads) are repetitions:
 * every metric is reported as the median over them, and each record gets
 * its ratio to pinpool's record of the same case and thread count.
 * DIR receives *.dat files and plots.gp (run it with gnuplot from DIR; it
 * writes the PNGs into the directory given as `outdir`).
 *
 * The parts, each calling only those below it:
 *   report.c          the options and the order of the steps;
 *   report_goals.c, report_json.c, report_md.c, report_plots.c
 *                     one output each (none calls another);
 *   report_data.c     the records merged into groups, and the questions
 *                     the outputs ask of them (report_data.h);
 *   report_w9.c       W9's records, goals, JSON and markdown;
 *   report_support.c  dying, formats, the goal list (report_support.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "report_data.h"

/* ---- Main ---------------------------------------------------------------- */

static void usage(void) {
  fprintf(stderr,
          "usage: pp_report --raw FILE --json OUT --markdown OUT --plots DIR\n"
          "                 [--rev REV] [--mode quick|full] [--elapsed S]\n"
          "                 [--peer NAME=VERSION]... [--missing NAME=WHY]...\n"
          "                 [--load-start L] [--load-end L] [--charts 0|1]\n");
}

int main(int argc, char **argv) {
  pr_machine_t m;
  pr_opt.rev = "unknown";
  pr_opt.mode = "full";
  pr_opt.charts = true;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (i + 1 >= argc) {
      usage();
      pr_die("option %s needs a value", a);
    }
    const char *v = argv[++i];
    if (strcmp(a, "--raw") == 0)
      pr_opt.raw = v;
    else if (strcmp(a, "--json") == 0)
      pr_opt.json = v;
    else if (strcmp(a, "--markdown") == 0)
      pr_opt.md = v;
    else if (strcmp(a, "--plots") == 0)
      pr_opt.plots = v;
    else if (strcmp(a, "--rev") == 0)
      pr_opt.rev = v;
    else if (strcmp(a, "--mode") == 0)
      pr_opt.mode = v;
    else if (strcmp(a, "--elapsed") == 0)
      pr_opt.elapsed = strtod(v, NULL);
    else if (strcmp(a, "--load-start") == 0)
      pr_opt.load_start = v;
    else if (strcmp(a, "--load-end") == 0)
      pr_opt.load_end = v;
    else if (strcmp(a, "--peer") == 0 && pr_opt.npeers < 16)
      pr_opt.peers[pr_opt.npeers++] = v;
    else if (strcmp(a, "--charts") == 0)
      pr_opt.charts = strcmp(v, "0") != 0;
    else if (strcmp(a, "--missing") == 0 && pr_opt.nmissing < 16)
      pr_opt.missing[pr_opt.nmissing++] = v;
    else {
      usage();
      pr_die("unknown option '%s'", a);
    }
  }
  if (pr_opt.raw == NULL || pr_opt.json == NULL || pr_opt.md == NULL ||
      pr_opt.plots == NULL) {
    usage();
    return 2;
  }
  pr_parse_raw(pr_opt.raw);
  /* Failures alone (every W9 run failed) still make a report, which lists
   * them. */
  if (pr_ngroups == 0 && !pr_w9_have() && pr_nfail == 0)
    pr_die("no records in %s", pr_opt.raw);
  pr_merge();
  pr_describe_machine(&m);
  pr_evaluate_goals();
  pr_write_json(&m);
  pr_write_md(&m);
  pr_write_plots();
  return 0;
}
