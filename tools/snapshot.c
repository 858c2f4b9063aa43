/*
 * `pinpool snapshot SUBCOMMAND`: read snapshot files written by
 * pinpool_snapshot_write (docs/snapshot-format.md).
 *
 *   summary FILE            segments, blocks by state, waste, top sites
 *   diff A B                growth between two snapshots, by site
 *   html FILE -o OUT.html   a self-contained viewer page
 *   torch FILE -o OUT.pickle  PyTorch memory_viz's pickle layout
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "snapshot_load.h"

static const struct {
  const char *name, *synopsis, *summary;
  int (*run)(int argc, char **argv);
} subcommands[] = {
    {"summary", "FILE [--top N] [--json]",
     "segments, blocks by state, waste, fragmentation, top allocation sites",
     snap_summary_run},
    {"diff", "A B [--top N] [--json]",
     "what grew from snapshot A to snapshot B, by allocation site",
     snap_diff_run},
    {"html", "FILE -o OUT.html",
     "a self-contained page: timeline, segment map, top sites", snap_html_run},
    {"torch", "FILE -o OUT.pickle",
     "the pickle layout PyTorch's memory_viz reads", snap_torch_run},
};
#define N_SUB (sizeof subcommands / sizeof subcommands[0])

void cli_snapshot_usage(FILE *out) {
  fprintf(out, "usage: pinpool snapshot SUBCOMMAND [options]\n\n"
               "Read snapshots written by pinpool_snapshot_write "
               "(docs/snapshot-format.md).\n\nsubcommands:\n");
  for (size_t i = 0; i < N_SUB; i++)
    fprintf(out, "  %-8s %-22s %s\n", subcommands[i].name,
            subcommands[i].synopsis, subcommands[i].summary);
  fprintf(out, "\nFILE may be '-' for standard input. Exit status: 0 "
               "success, 1 unreadable or malformed input, 2 usage error.\n");
}

int cli_snapshot_run(int argc, char **argv) {
  if (argc < 2)
    return cli_usage_error("snapshot", "a subcommand is required "
                                       "(summary, diff, html, torch)");
  for (size_t i = 0; i < N_SUB; i++)
    if (strcmp(argv[1], subcommands[i].name) == 0)
      return subcommands[i].run(argc - 1, argv + 1);
  return cli_usage_error("snapshot", "unknown subcommand '%s'", argv[1]);
}

/* The arguments of a converter (html, torch): FILE -o OUT, -h/--help.
 * Returns -1 with *in and *out set when the caller should go on, or the
 * exit code to return (usage printed for --help, errors reported). */
int snap_convert_args(const char *cmd, int argc, char **argv,
                      void (*usage)(FILE *out), const char *out_example,
                      const char **in, const char **out) {
  *in = *out = NULL;
  for (int i = 1; i < argc; i++) {
    const char *v = NULL;
    int r;
    if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
      usage(stdout);
      return CLI_EXIT_OK;
    }
    if ((r = cli_option(cmd, argc, argv, &i, "-o", &v)) == 0)
      r = cli_option(cmd, argc, argv, &i, "--output", &v);
    if (r < 0)
      return CLI_EXIT_USAGE;
    if (r > 0) {
      if (*out != NULL)
        return cli_usage_error(cmd, "-o/--output given twice");
      if (v[0] == '\0')
        return cli_usage_error(cmd, "-o/--output needs a file name");
      *out = v;
      continue;
    }
    if (argv[i][0] == '-' && argv[i][1] != '\0')
      return cli_usage_error(cmd, "unknown option '%s'", argv[i]);
    if (*in != NULL)
      return cli_usage_error(cmd, "unexpected argument '%s' (one FILE only)",
                             argv[i]);
    *in = argv[i];
  }
  if (*in == NULL)
    return cli_usage_error(cmd, "a snapshot FILE is required");
  if (*out == NULL)
    return cli_usage_error(cmd, "an output file is required (-o %s)",
                           out_example);
  return -1;
}
