/* Helpers shared by the subcommands of the `pinpool` tool (see cli.h). */
#define _GNU_SOURCE
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pinpool.h"

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "pinpool %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  /* "snapshot html": a subcommand of a command has its own --help. */
  if (strchr(cmd, ' ') != NULL)
    fprintf(stderr, "\nRun 'pinpool %s --help' for usage.\n", cmd);
  else
    fprintf(stderr, "\nRun 'pinpool help %s' for usage.\n", cmd);
  return CLI_EXIT_USAGE;
}

void cli_pinpool_error(const char *call, int err) {
  const char *detail = pinpool_last_error();
  if (detail != NULL && detail[0] != '\0')
    fprintf(stderr, "pinpool: %s failed: %s: %s\n", call, pinpool_strerror(err),
            detail);
  else
    fprintf(stderr, "pinpool: %s failed: %s\n", call, pinpool_strerror(err));
}

int cli_option(const char *cmd, int argc, char **argv, int *i, const char *name,
               const char **value) {
  const char *arg = argv[*i];
  size_t n = strlen(name);
  if (strncmp(arg, name, n) != 0)
    return 0;
  if (arg[n] == '=') {
    *value = arg + n + 1;
    return 1;
  }
  if (arg[n] != '\0')
    return 0;
  if (*i + 1 >= argc) {
    cli_usage_error(cmd, "option %s needs a value", name);
    return -1;
  }
  *i += 1;
  *value = argv[*i];
  return 1;
}

int cli_parse_u64(const char *cmd, const char *opt, const char *text,
                  uint64_t min, uint64_t max, uint64_t *out) {
  char *end = NULL;
  unsigned long long v;
  if (text[0] < '0' || text[0] > '9')
    goto bad;
  errno = 0;
  v = strtoull(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0')
    goto bad;
  if (v < min || v > max) {
    cli_usage_error(cmd, "%s must be between %llu and %llu, not '%s'", opt,
                    (unsigned long long)min, (unsigned long long)max, text);
    return -1;
  }
  *out = (uint64_t)v;
  return 0;
bad:
  cli_usage_error(cmd, "%s needs a whole number, not '%s'", opt, text);
  return -1;
}

int cli_parse_double(const char *cmd, const char *opt, const char *text,
                     double min, double max, double *out) {
  char *end = NULL;
  double v;
  errno = 0;
  v = strtod(text, &end);
  if (errno != 0 || end == text || *end != '\0' || !isfinite(v)) {
    cli_usage_error(cmd, "%s needs a number, not '%s'", opt, text);
    return -1;
  }
  if (v < min || v > max) {
    cli_usage_error(cmd, "%s must be between %g and %g, not '%s'", opt, min,
                    max, text);
    return -1;
  }
  *out = v;
  return 0;
}

const char *cli_format_bytes(double bytes, char buf[CLI_BYTES_LEN]) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  size_t u = 0;
  double v = bytes;
  while (fabs(v) >= 1024.0 && u + 1 < sizeof units / sizeof units[0]) {
    v /= 1024.0;
    u++;
  }
  if (u == 0)
    snprintf(buf, CLI_BYTES_LEN, "%.0f B", v);
  else if (fabs(v) >= 100.0)
    snprintf(buf, CLI_BYTES_LEN, "%.1f %s", v, units[u]);
  else
    snprintf(buf, CLI_BYTES_LEN, "%.2f %s", v, units[u]);
  return buf;
}

const char *cli_format_ns(double ns, char buf[CLI_BYTES_LEN]) {
  if (ns < 1e3)
    snprintf(buf, CLI_BYTES_LEN, "%.0f ns", ns);
  else if (ns < 1e6)
    snprintf(buf, CLI_BYTES_LEN, "%.2f us", ns / 1e3);
  else if (ns < 1e9)
    snprintf(buf, CLI_BYTES_LEN, "%.2f ms", ns / 1e6);
  else
    snprintf(buf, CLI_BYTES_LEN, "%.2f s", ns / 1e9);
  return buf;
}

double cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_sleep(double seconds) {
  struct timespec ts;
  if (seconds <= 0)
    return;
  ts.tv_sec = (time_t)seconds;
  ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
  if (ts.tv_nsec >= 1000000000L)
    ts.tv_nsec = 999999999L;
  nanosleep(&ts, NULL);
}
