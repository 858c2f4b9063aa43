/*
 * Replays fuzz inputs through the fuzz target without libFuzzer: each
 * argument is a file, or a directory whose regular files are replayed in
 * name order (names starting with '.' and *.md files are skipped). Used by
 * the ctest test pp_fuzz_replay (the seed corpus and the regression inputs)
 * in every preset, and to reproduce a crash from any build:
 *
 *   build/asan/tests/fuzz/pp_fuzz_replay crash-1234abcd
 *
 * A violated check abort()s with a message; success prints a count.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fuzz_pinpool.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int replay_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return -1;
  }
  size_t cap = 4096, n = 0;
  uint8_t *buf = malloc(cap);
  for (;;) {
    if (buf == NULL) {
      (void)fclose(f);
      (void)fprintf(stderr, "%s: out of memory\n", path);
      return -1;
    }
    n += fread(buf + n, 1, cap - n, f);
    if (n < cap)
      break;
    cap *= 2;
    uint8_t *grown = realloc(buf, cap);
    if (grown == NULL)
      free(buf);
    buf = grown;
  }
  int bad = ferror(f);
  (void)fclose(f);
  if (bad) {
    (void)fprintf(stderr, "%s: read error\n", path);
    free(buf);
    return -1;
  }
  if (getenv("PP_FUZZ_VERBOSE") != NULL)
    (void)fprintf(stderr, "replay %s (%zu bytes)\n", path, n);
  (void)LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 0;
}

static int skip_name(const char *name) {
  size_t len = strlen(name);
  return name[0] == '.' || (len >= 3 && strcmp(name + len - 3, ".md") == 0);
}

/* Returns the number of inputs replayed, or -1 on an error. */
static long replay_path(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode))
    return replay_file(path) == 0 ? 1 : -1;
  struct dirent **names = NULL;
  int n = scandir(path, &names, NULL, alphasort);
  if (n < 0) {
    perror(path);
    return -1;
  }
  long count = 0;
  for (int i = 0; i < n; i++) {
    char full[4096];
    if (count >= 0 && !skip_name(names[i]->d_name)) {
      (void)snprintf(full, sizeof full, "%s/%s", path, names[i]->d_name);
      if (stat(full, &st) == 0 && S_ISREG(st.st_mode))
        count = replay_file(full) == 0 ? count + 1 : -1;
    }
    free(names[i]);
  }
  free(names);
  return count;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    (void)fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
    return 2;
  }
  long total = 0;
  for (int i = 1; i < argc; i++) {
    long n = replay_path(argv[i]);
    if (n < 0)
      return 1;
    (void)printf("%s: %ld inputs\n", argv[i], n);
    total += n;
  }
  if (total == 0) {
    (void)fprintf(stderr, "no inputs found\n");
    return 1;
  }
  (void)printf("replayed %ld inputs: OK\n", total);
  return 0;
}
