/*
 * pinpool — the command-line tool.
 *
 *   pinpool help [COMMAND]
 *   pinpool version
 *   pinpool demo [options]
 *   pinpool snapshot summary|diff|html|torch ...
 *
 * cli_main() looks the subcommand up in `commands` (main() is main.c's; the
 * Python package calls cli_main too: `python3 -m pinpool`); to add one,
 * write its run and usage functions in a file of their own, declare them
 * in cli.h and add a row to the table.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "pinpool.h"

static int cmd_help(int argc, char **argv);
static void help_usage(FILE *out);
static int cmd_version(int argc, char **argv);
static void version_usage(FILE *out);

static const cli_command_t commands[] = {
    {"help", "[COMMAND]", "show this help, or the help of COMMAND", cmd_help,
     help_usage},
    {"version", "", "print the versions of the tool and library", cmd_version,
     version_usage},
    {"demo", "[--seconds N] [--producers P] [--consumers C] ...",
     "run a data-loader staging pipeline on one pool and print its stats",
     cli_demo_run, cli_demo_usage},
    {"snapshot", "summary|diff|html|torch ...",
     "read snapshot files: summary, diff, html viewer, PyTorch pickle",
     cli_snapshot_run, cli_snapshot_usage},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static const cli_command_t *find_command(const char *name) {
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(commands[i].name, name) == 0)
      return &commands[i];
  return NULL;
}

static void print_overview(FILE *out) {
  fprintf(out,
          "pinpool %s: a caching allocator for pinned host staging memory\n"
          "\n"
          "usage: pinpool COMMAND [options]\n"
          "\n"
          "commands:\n",
          PINPOOL_VERSION_STRING);
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
  fprintf(out, "\nRun 'pinpool help COMMAND' for the options of a command.\n"
               "Exit status: 0 success, 1 failure, 2 usage error.\n");
}

static void help_usage(FILE *out) {
  fprintf(out, "usage: pinpool help [COMMAND]\n"
               "\n"
               "Without COMMAND, list the commands; with it, show its help.\n");
}

static int cmd_help(int argc, char **argv) {
  const cli_command_t *cmd;
  if (argc == 1) {
    print_overview(stdout);
    return CLI_EXIT_OK;
  }
  if (argc > 2)
    return cli_usage_error("help", "unexpected argument '%s'", argv[2]);
  cmd = find_command(argv[1]);
  if (cmd == NULL)
    return cli_usage_error("help", "unknown command '%s'", argv[1]);
  cmd->usage(stdout);
  return CLI_EXIT_OK;
}

static void version_usage(FILE *out) {
  fprintf(out, "usage: pinpool version\n"
               "\n"
               "Print the version of the tool and of the pinpool library it "
               "runs on.\n");
}

static int cmd_version(int argc, char **argv) {
  if (argc > 1) {
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
      version_usage(stdout);
      return CLI_EXIT_OK;
    }
    return cli_usage_error("version", "unexpected argument '%s'", argv[1]);
  }
  printf("pinpool %s (library %s)\n", PINPOOL_VERSION_STRING,
         pinpool_version());
  return CLI_EXIT_OK;
}

int cli_main(int argc, char **argv) {
  const cli_command_t *cmd;
  if (argc < 2) {
    print_overview(stderr);
    return CLI_EXIT_USAGE;
  }
  if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)
    return cmd_help(1, argv + 1);
  if (strcmp(argv[1], "-V") == 0 || strcmp(argv[1], "--version") == 0)
    return cmd_version(1, argv + 1);
  cmd = find_command(argv[1]);
  if (cmd == NULL) {
    fprintf(stderr,
            "pinpool: unknown command '%s'\n"
            "Run 'pinpool help' for the list of commands.\n",
            argv[1]);
    return CLI_EXIT_USAGE;
  }
  return cmd->run(argc - 1, argv + 1);
}
