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
