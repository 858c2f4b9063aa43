/*
 * `pinpool snapshot html FILE -o OUT.html`: the viewer page
 * (tools/viewer/viewer.html, compiled in by tools/embed.cmake) with the
 * snapshot inserted, so that one file opens offline in any browser.
 *
 * The snapshot goes into a <script type="application/json"> element, whose
 * content the HTML parser does not decode: only "</script" (any case) ends
 * it early, and "<!--" followed by "<script" switches the tokenizer into a
 * state where even the real end tag no longer ends it. Both need a '<',
 * and in JSON a '<' can only occur inside a string, so every '<' is
 * written as the JSON escape \u003c and the page's JSON.parse gets the
 * exact strings back. JSON_ENSURE_ASCII keeps the page pure ASCII, so the
 * result does not depend on the charset a browser guesses for a local file
 * (and U+2028/U+2029 never appear raw).
 */
#define _POSIX_C_SOURCE 200809L /* lstat */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "snapshot_load.h"

#define CMD "snapshot html"

/* Where the page wants the JSON (inside <script id="snapshot">). */
#define MARKER "/*PINPOOL_SNAPSHOT_DATA*/"

extern const char snap_viewer_page[];
extern const unsigned long snap_viewer_page_len;

static void html_usage(FILE *out) {
  fprintf(
      out,
      "usage: pinpool snapshot html FILE -o OUT.html\n\n"
      "Write a self-contained page (no network access needed) showing the\n"
      "snapshot FILE ('-' for standard input): totals, an active-memory\n"
      "timeline by allocation site from the history, a map of every\n"
      "segment's blocks (hover a block for its stack) and the top sites.\n\n"
      "  -o, --output OUT.html   the page to write ('-' for standard "
      "output)\n\n"
      "Exit status: 0 success, 1 unreadable or malformed input or write\n"
      "error (OUT is then removed), 2 usage error.\n");
}

typedef struct page_out {
  FILE *f;
  int failed;
} page_out_t;

/* jansson's dump callback: copy the JSON text, escaping '<' (see top). */
static int dump_escaped(const char *buf, size_t size, void *data) {
  page_out_t *o = data;
  size_t start = 0;
  for (size_t i = 0; i < size; i++) {
    if (buf[i] != '<')
      continue;
    if (fwrite(buf + start, 1, i - start, o->f) != i - start ||
        fputs("\\u003c", o->f) == EOF)
      goto fail;
    start = i + 1;
  }
  if (fwrite(buf + start, 1, size - start, o->f) != size - start)
    goto fail;
  return 0;
fail:
  o->failed = 1;
  return -1;
}

static int write_page(FILE *f, const json_t *root) {
  const char *page = snap_viewer_page;
  const char *mark = strstr(page, MARKER);
  size_t before, after_off;
  page_out_t o = {f, 0};
  if (mark == NULL) {
    /* A build problem, not an input problem: the template lost its marker. */
    fprintf(stderr,
            "pinpool " CMD ": the embedded viewer page has no %s "
            "marker\n",
            MARKER);
    return -1;
  }
  before = (size_t)(mark - page);
  after_off = before + strlen(MARKER);
  if (fwrite(page, 1, before, f) != before)
    return -1;
  if (json_dump_callback(root, dump_escaped, &o,
                         JSON_COMPACT | JSON_ENSURE_ASCII) != 0 ||
      o.failed)
    return -1;
  if (fwrite(page + after_off, 1, snap_viewer_page_len - after_off, f) !=
      snap_viewer_page_len - after_off)
    return -1;
  return 0;
}

int snap_html_run(int argc, char **argv) {
  const char *in = NULL, *out = NULL;
  char err[512];
  snap_t snap;
  FILE *f;
  struct stat st;
  int to_stdout, rc, werr;

  int args =
      snap_convert_args(CMD, argc, argv, html_usage, "OUT.html", &in, &out);
  if (args >= 0)
    return args;

  /* Load (and check) before touching OUT, so bad input leaves no page and
   * an existing OUT is not clobbered. */
  if (snap_load(in, &snap, err, sizeof err) != 0) {
    fprintf(stderr, "pinpool " CMD ": %s\n", err);
    return CLI_EXIT_FAIL;
  }

  to_stdout = strcmp(out, "-") == 0;
  f = to_stdout ? stdout : fopen(out, "wb");
  if (f == NULL) {
    fprintf(stderr, "pinpool " CMD ": cannot create %s: %s\n", out,
            strerror(errno));
    snap_free(&snap);
    return CLI_EXIT_FAIL;
  }
  errno = 0;
  rc = write_page(f, snap.root);
  /* A full disk often shows only at the flush or the close. */
  if (fflush(f) != 0)
    rc = -1;
  if (ferror(f))
    rc = -1;
  if (!to_stdout && fclose(f) != 0)
    rc = -1;
  werr = errno;
  snap_free(&snap);
  if (rc != 0) {
    fprintf(stderr, "pinpool " CMD ": writing %s failed%s%s\n",
            to_stdout ? "standard output" : out, werr ? ": " : "",
            werr ? strerror(werr) : "");
    /* A truncated page would look like a snapshot with data missing; but
     * only a plain file is ours to remove: OUT may be /dev/full, a FIFO or
     * a symbolic link, and we run as root in containers. */
    if (!to_stdout && lstat(out, &st) == 0 && S_ISREG(st.st_mode))
      remove(out);
    return CLI_EXIT_FAIL;
  }
  return CLI_EXIT_OK;
}
