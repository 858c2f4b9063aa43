/*
 * Shared declarations of the `pinpool` command-line tool.
 *
 * main() (pinpool.c) dispatches on a table of subcommands; each subcommand
 * lives in its own file and exposes a run function and a usage function.
 * cli.c holds the helpers they share: error reporting, option parsing and
 * human-readable formatting.
 */
#ifndef PINPOOL_TOOLS_CLI_H
#define PINPOOL_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes of every subcommand. */
enum {
  CLI_EXIT_OK = 0,    /* success */
  CLI_EXIT_FAIL = 1,  /* the command ran and found a problem */
  CLI_EXIT_USAGE = 2, /* unknown subcommand, bad option or bad value */
};

/* One subcommand. `run` gets argv[0] == the subcommand's name and returns an
 * exit code; `usage` prints the full help of the subcommand. */
typedef struct cli_command {
  const char *name;
  const char *synopsis; /* options, for the command list */
  const char *summary;  /* one line */
  int (*run)(int argc, char **argv);
  void (*usage)(FILE *out);
} cli_command_t;

/* The whole tool: argv[0] is the program's name, argv[1] the subcommand.
 * Returns the exit status. pinpool.c; called by main() (main.c) and by the
 * Python package's pinpool._cli (python/climodule.c). */
int cli_main(int argc, char **argv);

/* ---- Subcommands (one file each) ---------------------------------------- */
int cli_demo_run(int argc, char **argv);     /* demo.c */
void cli_demo_usage(FILE *out);              /* demo.c */
int cli_snapshot_run(int argc, char **argv); /* snapshot.c */
void cli_snapshot_usage(FILE *out);          /* snapshot.c */

/* ---- Errors (cli.c) ----------------------------------------------------- */

/* Print "pinpool CMD: MESSAGE" and a hint to stderr; return CLI_EXIT_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Print "pinpool: CALL failed: <pinpool_strerror(err)>: <last error>" to
 * stderr. Call it in the thread whose pinpool call failed, right away, so
 * that pinpool_last_error() still describes that failure. */
void cli_pinpool_error(const char *call, int err);

/* ---- Option parsing (cli.c) ----------------------------------------------
 * Long options take their value as "--name VALUE" or "--name=VALUE".
 * cli_option returns 1 and sets *value (advancing *i past a separate value)
 * if argv[*i] is option `name`; 0 if it is not; -1 if the value is missing
 * (after printing a usage error for `cmd`). */
int cli_option(const char *cmd, int argc, char **argv, int *i, const char *name,
               const char **value);

/* Parse a decimal integer in [min, max]. Returns 0, or prints a usage error
 * naming `opt` and returns -1. */
int cli_parse_u64(const char *cmd, const char *opt, const char *text,
                  uint64_t min, uint64_t max, uint64_t *out);

/* Parse a finite decimal number in [min, max], as cli_parse_u64. */
int cli_parse_double(const char *cmd, const char *opt, const char *text,
                     double min, double max, double *out);

/* ---- Formatting and time (cli.c) ---------------------------------------- */
#define CLI_BYTES_LEN 32

/* "0 B", "512 B", "4.0 KiB", "36.75 MiB", "1.50 GiB"... into buf; returns
 * buf. */
const char *cli_format_bytes(double bytes, char buf[CLI_BYTES_LEN]);

/* "812 ns", "3.41 us", "12.3 ms", "1.20 s" into buf; returns buf. */
const char *cli_format_ns(double ns, char buf[CLI_BYTES_LEN]);

/* Seconds on CLOCK_MONOTONIC. */
double cli_now(void);

/* Sleep for `seconds` (returns early on a signal). */
void cli_sleep(double seconds);

#endif /* PINPOOL_TOOLS_CLI_H */
