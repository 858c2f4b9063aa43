/*
 * `pinpool snapshot torch FILE -o OUT.pickle`: the snapshot in the layout of
 * PyTorch's torch.cuda.memory._snapshot() pickle, so that memory_viz
 * (pytorch.org/memory_viz, torch/utils/viz/MemoryViz.js) and the Python
 * tools that read such pickles show pinpool's host memory. The mapping is
 * documented in docs/snapshot-format.md ("PyTorch memory_viz"). Which
 * segments the pickle lists (the arena's chunks, or for older snapshots
 * pinpool's segments) and the blocks of each one are decided in
 * snapshot_torch_layout.c; the trace is snapshot_torch_trace.c's, the
 * pickle snapshot_torch_pickle.c's; this file is the command.
 *
 * The pickle is written by a small serializer of our own (pickle.c, which
 * says which opcodes and why), not by Python: the tool must not need it.
 *
 * Two layouts (--layout): "new", the dict {segments, device_traces,
 * allocator_settings} of torch 2.x's _snapshot() that memory_viz and
 * torch 2's _memory_viz (trace_plot, segment_plot) read; and "old", the
 * bare list of segments of torch 1.x's memory_snapshot(), whose blocks
 * carry a "history" list, that torch 1.13's _memory_viz (stats, segments,
 * memory, compare: Debian 12's) reads. Without --layout the installed
 * torch decides (installed_layout); docs/snapshot-format.md.
 *
 * memory_viz's "Allocator State History" replays the trace backwards from
 * the segments, and stops with a script error at an event that does not fit
 * them (a free_requested of a block it does not know, a block outside every
 * segment). A snapshot of a busy pool can hold such events: block states
 * are read one by one while threads go on, and the history ring may lose
 * entries. tv_replay() runs the viewer's rules once and leaves those events
 * out, with a note; a quiescent snapshot loses none.
 */
#define _XOPEN_SOURCE 700 /* realpath, and POSIX 2008 (mkstemp, fchmod) */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pickle.h"
#include "snapshot_load.h"
#include "snapshot_torch_layout.h"
#include "snapshot_torch_pickle.h"
#include "snapshot_torch_trace.h"

#define CMD "snapshot torch"

static void torch_usage(FILE *out) {
  fprintf(
      out,
      "usage: pinpool snapshot torch FILE -o OUT.pickle [--layout "
      "old|new]\n\n"
      "Write the snapshot FILE ('-' for standard input) as the pickle\n"
      "that torch.cuda.memory._snapshot() returns, for PyTorch's\n"
      "memory_viz (drag OUT.pickle onto https://pytorch.org/memory_viz)\n"
      "and torch.cuda._memory_viz. Host memory is shown as device 0.\n\n"
      "  -o, --output OUT.pickle   the file to write ('-' for standard "
      "output)\n"
      "  --layout old|new          new: the dict of torch >= 2.0\n"
      "                            (segments, device_traces); old: the\n"
      "                            list of segments of torch 1.x. Default:\n"
      "                            the installed torch's ($PINPOOL_TORCH_\n"
      "                            VERSION, else the first of\n"
      "                            $PINPOOL_PYTHON, python3, /usr/bin/\n"
      "                            python3, python that imports torch;\n"
      "                            new without torch)\n\n"
      "Exit status: 0 success, 1 unreadable or malformed input or write\n"
      "error (OUT is then left as it was), 2 usage error.\n");
}

/* ---- The command --------------------------------------------------------- */

/* How long an interpreter may take to answer (importing torch takes a
 * second or two, more on a loaded machine); one that has not answered by
 * then is killed and taken for one without torch. $PINPOOL_PYTHON_TIMEOUT
 * (seconds, 0.1 to 600) sets another. */
#define PROBE_TIMEOUT_MS 15000

static long long probe_timeout_ms(void) {
  const char *e = getenv("PINPOOL_PYTHON_TIMEOUT");
  if (e == NULL || e[0] == '\0')
    return PROBE_TIMEOUT_MS;
  char *end;
  double v = strtod(e, &end);
  if (*end != '\0' || !(v >= 0.1 && v <= 600))
    return PROBE_TIMEOUT_MS;
  return (long long)(v * 1000);
}

static long long now_ms(void) {
  struct timespec ts;
  (void)clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* What `py -c 'import torch; print(torch.__version__)'` prints, into ver
 * (ver[0] == '\0' when py is missing, fails, has no torch, or does not
 * answer within PROBE_TIMEOUT_MS). Reading stops at the answer's line; the
 * child is reaped, killed if it is still running at the deadline (the
 * review of issue 41: an interpreter that hung made the command hang). */
static void ask_torch_version(const char *py, char *ver, size_t len) {
  ver[0] = '\0';
  int fds[2];
  if (pipe(fds) != 0)
    return;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  char *argv[] = {(char *)py, "-c", "import torch; print(torch.__version__)",
                  NULL};
  extern char **environ;
  pid_t pid;
  /* Its own process group: a hung one is killed with what it started. */
  posix_spawnattr_t at;
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  int spawned = posix_spawnp(&pid, py, &fa, &at, argv, environ) == 0;
  posix_spawnattr_destroy(&at);
  posix_spawn_file_actions_destroy(&fa);
  (void)close(fds[1]);
  long long deadline = now_ms() + probe_timeout_ms();
  size_t n = 0;
  int answered = 0;
  while (spawned && !answered && n + 1 < len) {
    long long left = deadline - now_ms();
    struct pollfd pfd = {fds[0], POLLIN, 0};
    int pr = left > 0 ? poll(&pfd, 1, (int)left) : 0;
    if (pr < 0 && errno == EINTR)
      continue;
    if (pr <= 0)
      break; /* timed out (or poll failed) */
    ssize_t r = read(fds[0], ver + n, len - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break; /* EOF: the child closed its output */
    answered = memchr(ver + n, '\n', (size_t)r) != NULL;
    n += (size_t)r;
  }
  ver[n] = '\0';
  (void)close(fds[0]);
  int status = 0, reaped = 0;
  while (spawned && !reaped) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid || (w < 0 && errno != EINTR)) {
      reaped = w == pid;
      break;
    }
    if (now_ms() >= deadline) {
      (void)kill(-pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
      break;
    }
    struct timespec tick = {0, 10 * 1000 * 1000};
    (void)nanosleep(&tick, NULL);
  }
  if (!reaped || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || !answered ||
      ver[0] < '0' || ver[0] > '9')
    ver[0] = '\0'; /* no torch there */
}

/* The layout the installed torch reads: 1 (old) for torch 1.x, 0 (new)
 * for 2.x and later, and for no torch (memory_viz, the web page, reads
 * the new). The version is $PINPOOL_TORCH_VERSION if set, else the first
 * that one of these interpreters reports: $PINPOOL_PYTHON (`python3 -m
 * pinpool` sets it to its own), python3 on PATH, /usr/bin/python3, python.
 * More than one is asked because python3 on PATH is often not the one
 * with torch (a pyenv or virtual environment shim in front of the
 * system's python3-torch, issue 41): the first interpreter that imports
 * torch is the one a user can run `-m torch.cuda._memory_viz` with.
 * *source says which. */
static int installed_layout(const char **source) {
  static const char *const fallback[] = {"python3", "/usr/bin/python3",
                                         "python"};
  static char said[300];
  char ver[64] = "";
  const char *env = getenv("PINPOOL_TORCH_VERSION");
  if (env != NULL && env[0] != '\0') {
    snprintf(ver, sizeof ver, "%s", env);
    *source = "PINPOOL_TORCH_VERSION";
  } else {
    const char *py = getenv("PINPOOL_PYTHON");
    if (py != NULL && py[0] != '\0')
      ask_torch_version(py, ver, sizeof ver);
    for (size_t i = 0; ver[0] == '\0' && i < sizeof fallback / sizeof *fallback;
         i++)
      ask_torch_version(py = fallback[i], ver, sizeof ver);
    if (ver[0] == '\0')
      return 0; /* no torch anywhere: the web page's layout */
    snprintf(said, sizeof said, "%s -c 'import torch'", py);
    *source = said;
  }
  long major = strtol(ver, NULL, 10);
  return major == 1 || (major == 0 && ver[0] == '0');
}

/* Where the pickle goes: a temporary file next to OUT, renamed over it once
 * complete, so that OUT is never a truncated pickle and a failed run leaves
 * an existing OUT as it was. Standard output ("-") and files that are not
 * regular (a pipe, /dev/stdout) are written directly. */
typedef struct output {
  FILE *f;
  char *path; /* what the temporary file replaces (OUT, or its link target) */
  char *tmp;  /* NULL when writing directly */
  int is_stdout;
} output_t;

static int output_open(const char *out, output_t *o) {
  struct stat st;
  size_t len;
  int fd;
  memset(o, 0, sizeof *o);
  if (strcmp(out, "-") == 0) {
    o->f = stdout;
    o->is_stdout = 1;
    return 0;
  }
  if (stat(out, &st) == 0 && !S_ISREG(st.st_mode)) {
    o->f = fopen(out, "wb");
    return o->f != NULL ? 0 : -1;
  }
  /* Through a symbolic link the file it names is replaced, not the link. */
  o->path = realpath(out, NULL);
  if (o->path == NULL)
    o->path = strdup(out);
  len = o->path != NULL ? strlen(o->path) + sizeof ".XXXXXX" : 0;
  if (o->path == NULL || (o->tmp = malloc(len)) == NULL) {
    free(o->path);
    errno = ENOMEM;
    return -1;
  }
  snprintf(o->tmp, len, "%s.XXXXXX", o->path);
  fd = mkstemp(o->tmp);
  if (fd >= 0) {
    /* mkstemp creates the file 0600; OUT gets the usual permissions. */
    mode_t mask = umask(0);
    (void)umask(mask);
    (void)fchmod(fd, (mode_t)0666 & ~mask);
    o->f = fdopen(fd, "wb");
    if (o->f != NULL)
      return 0;
    int e = errno;
    (void)close(fd);
    (void)unlink(o->tmp);
    errno = e;
  }
  free(o->tmp);
  free(o->path);
  return -1;
}

/* Close the output; commit it when ok. Returns 0, or -1 with errno. */
static int output_close(output_t *o, int ok) {
  int rc = ok ? 0 : -1, e = errno;
  /* A full disk often shows only at the flush or the close. */
  if (fflush(o->f) != 0 || ferror(o->f)) {
    if (rc == 0)
      e = errno != 0 ? errno : EIO;
    rc = -1;
  }
  if (!o->is_stdout && fclose(o->f) != 0 && rc == 0) {
    e = errno;
    rc = -1;
  }
  if (o->tmp != NULL) {
    if (rc == 0 && rename(o->tmp, o->path) != 0) {
      e = errno;
      rc = -1;
    }
    if (rc != 0)
      (void)unlink(o->tmp);
    free(o->tmp);
    free(o->path);
  }
  errno = e;
  return rc;
}

int snap_torch_run(int argc, char **argv) {
  const char *in = NULL, *out = NULL, *name;
  char err[512];
  snap_t snap;
  tv_events_t ev = {0};
  tv_layout_t lay = {0};
  output_t o;
  long dropped;
  int rc;

  /* --layout is this command's own: taken out before the common ones. */
  int layout = -1; /* 0 new, 1 old, -1 the installed torch's */
  char **rest = malloc(sizeof *rest * (size_t)(argc + 1));
  int nrest = 0;
  if (rest == NULL) {
    fprintf(stderr, "pinpool " CMD ": %s\n", strerror(ENOMEM));
    return CLI_EXIT_FAIL;
  }
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    int r = i > 0 ? cli_option(CMD, argc, argv, &i, "--layout", &v) : 0;
    if (r < 0) {
      free(rest);
      return CLI_EXIT_USAGE;
    }
    if (r == 0) {
      rest[nrest++] = argv[i];
      continue;
    }
    if (layout != -1 || (strcmp(v, "old") != 0 && strcmp(v, "new") != 0)) {
      free(rest);
      return cli_usage_error(CMD, layout != -1 ? "--layout given twice"
                                               : "--layout must be old or new");
    }
    layout = strcmp(v, "old") == 0;
  }
  rest[nrest] = NULL;
  int args =
      snap_convert_args(CMD, nrest, rest, torch_usage, "OUT.pickle", &in, &out);
  free(rest);
  if (args >= 0)
    return args;
  const char *source = "--layout";
  if (layout < 0)
    layout = installed_layout(&source);

  /* Everything is checked and prepared before OUT is touched. */
  if (snap_load(in, &snap, err, sizeof err) != 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", err);
    return CLI_EXIT_FAIL;
  }
  name = strcmp(in, "-") == 0 ? "(stdin)" : in;
  if (tv_layout(&snap, name, &lay, err, sizeof err) != 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", err);
    snap_free(&snap);
    return CLI_EXIT_FAIL;
  }
  dropped = -1;
  if (tv_build_events(&snap, &ev) == 0) {
    tv_fold_segment_events(&lay, &ev);
    dropped = tv_replay(&snap, &lay, &ev);
  }
  if (dropped < 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", strerror(ENOMEM));
    rc = CLI_EXIT_FAIL;
    goto done;
  }

  if (output_open(out, &o) != 0) {
    fprintf(stderr, "pinpool " CMD ": cannot create %s: %s\n", out,
            strerror(errno));
    rc = CLI_EXIT_FAIL;
    goto done;
  }
  errno = 0;
  rc = tv_write_pickle(&snap, &lay, &ev, layout, o.f);
  if (output_close(&o, rc == 0) != 0) {
    fprintf(stderr, "pinpool " CMD ": writing %s failed%s%s\n",
            o.is_stdout ? "standard output" : out, errno ? ": " : "",
            errno ? strerror(errno) : "");
    rc = CLI_EXIT_FAIL;
    goto done;
  }
  if (lay.note[0] != '\0')
    fprintf(stderr, "pinpool " CMD ": note: %s: %s\n", name, lay.note);
  /* The old layout is the exception: say why it was chosen. */
  if (layout && strcmp(source, "--layout") != 0)
    fprintf(stderr,
            "pinpool " CMD ": note: the old layout, a list of segments "
            "(torch 1.x, as %s says; --layout old|new to choose)\n",
            source);
  if (dropped > 0)
    fprintf(stderr,
            "pinpool " CMD ": note: %ld of %zu history entries left out: "
            "they do not fit the block states of %s (a snapshot taken while "
            "the pool was busy, or entries lost from the ring), and "
            "memory_viz would stop at them\n",
            dropped, ev.n, name);
  rc = CLI_EXIT_OK;
done:
  free(ev.v);
  tv_amap_free(&ev.seg_stack);
  tv_layout_free(&lay);
  snap_free(&snap);
  return rc;
}
