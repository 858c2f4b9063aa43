/*
 * The room a memory cgroup leaves for a shared chunk (docs/sharing.md,
 * "Limits").
 *
 * A shared chunk is a memfd: shmem, charged to the memory cgroup of the
 * process that populates it. A cgroup at its limit does not fail that
 * population: its OOM killer ends a process. Measured on Linux 6.18 (cgroup
 * v1 memory controller, a child cgroup limited to 64 MiB): fallocate,
 * MADV_POPULATE_WRITE, mlock and memset of a 128 MiB memfd were each ended
 * by SIGKILL, none returned an error. So pp_share_chunk_new refuses a chunk
 * bigger than the room read here before its memfd exists.
 *
 * The room is the least, over the process's memory cgroup and each of its
 * ancestors up to the hierarchy's mount, of the limit less what reclaim
 * cannot free of the memory charged: file pages other than shmem can be
 * written back or dropped, anything else stays (swap is not counted: a
 * chunk that would fit only by swapping is refused). cgroup v2: memory.max,
 * memory.current, memory.stat "file" and "shmem"; v1: memory.limit_in_bytes,
 * memory.usage_in_bytes, memory.stat "total_cache" and "total_shmem".
 * Where no memory cgroup can be read (no /proc, none mounted) there is no
 * room to compare with: nothing is refused here.
 *
 * The room is a moment's: other processes of the cgroup may charge memory
 * between this read and the population, and then the OOM killer can still
 * come. It only keeps a pool from asking, alone, for more than the cgroup
 * holds.
 */
#include "share.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The buffers of one reading, on the heap: a shared chunk can be created
 * on any thread of the application, and these (about 45 KiB) would crash
 * one with a small stack (a 32-48 KiB pthread stack, issue 36's fourth
 * review). */
struct scratch {
  char dirs[2][PATH_MAX];  /* the memory cgroup directories (v2, v1) */
  char paths[2][PATH_MAX]; /* their paths in /proc/self/cgroup */
  char mnts[2][PATH_MAX];  /* their hierarchies' mount points */
  char roots[2][PATH_MAX]; /* and those mounts' roots */
  char root[PATH_MAX], mnt[PATH_MAX];
  char line[PATH_MAX + 256];
  char path[PATH_MAX + 64];
};

/* A value of a cgroup file: a number, or "max" (UINT64_MAX); false if the
 * file cannot be read. */
static bool read_value(struct scratch *sc, const char *dir, const char *name,
                       uint64_t *out) {
  char *path = sc->path, buf[64];
  if (snprintf(path, sizeof sc->path, "%s/%s", dir, name) >=
      (int)sizeof sc->path)
    return false;
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return false;
  bool ok = fgets(buf, sizeof buf, f) != NULL;
  (void)fclose(f);
  if (!ok)
    return false;
  if (strncmp(buf, "max", 3) == 0) {
    *out = UINT64_MAX;
    return true;
  }
  char *end;
  unsigned long long v = strtoull(buf, &end, 10);
  if (end == buf)
    return false;
  *out = (uint64_t)v;
  return true;
}

/* Two keys of a memory.stat file (0 where absent). */
static void read_stat(struct scratch *sc, const char *dir, const char *k1,
                      uint64_t *v1, const char *k2, uint64_t *v2) {
  char *path = sc->path, line[256];
  *v1 = *v2 = 0;
  if (snprintf(path, sizeof sc->path, "%s/memory.stat", dir) >=
      (int)sizeof sc->path)
    return;
  FILE *f = fopen(path, "re");
  if (f == NULL)
    return;
  size_t n1 = strlen(k1), n2 = strlen(k2);
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, k1, n1) == 0 && line[n1] == ' ')
      *v1 = strtoull(line + n1 + 1, NULL, 10);
    else if (strncmp(line, k2, n2) == 0 && line[n2] == ' ')
      *v2 = strtoull(line + n2 + 1, NULL, 10);
  }
  (void)fclose(f);
}

/* The room of one cgroup directory; false if it has no limit to read. */
static bool dir_room(struct scratch *sc, const char *dir, bool v2,
                     uint64_t *room) {
  uint64_t limit, used, file, shmem;
  if (!read_value(sc, dir, v2 ? "memory.max" : "memory.limit_in_bytes",
                  &limit) ||
      !read_value(sc, dir, v2 ? "memory.current" : "memory.usage_in_bytes",
                  &used))
    return false;
  /* v1 reads "no limit" as the largest page multiple below 2^63. */
  if (limit == UINT64_MAX || (!v2 && limit >= (UINT64_C(1) << 62)))
    return false;
  read_stat(sc, dir, v2 ? "file" : "total_cache", &file,
            v2 ? "shmem" : "total_shmem", &shmem);
  uint64_t freeable = file > shmem ? file - shmem : 0;
  used = used > freeable ? used - freeable : 0;
  *room = used < limit ? limit - used : 0;
  return true;
}

/* Whether the cgroup list names the memory controller (v1: "memory" among
 * the comma-separated controllers). */
static bool has_memory(const char *ctrls, size_t len) {
  const char *p = ctrls, *end = ctrls + len;
  while (p < end) {
    const char *c = memchr(p, ',', (size_t)(end - p));
    size_t n = (size_t)((c != NULL ? c : end) - p);
    if (n == 6 && memcmp(p, "memory", 6) == 0)
      return true;
    p += n + 1;
  }
  return false;
}

/* The process's memory cgroup directories into sc->dirs, v2's (dirs[0])
 * and v1's (dirs[1]), "" where there is none; floors: the lengths of their
 * mounts' paths (the walk up stops there). */
static void find_dirs(struct scratch *sc, const char *mountinfo,
                      const char *cgroup, size_t floors[2]) {
  /* The process's cgroup paths: v2's "0::path", v1's "n:...memory...:path".
   */
  char(*dirs)[PATH_MAX] = sc->dirs, (*paths)[PATH_MAX] = sc->paths;
  char *line = sc->line;
  size_t linesz = sizeof sc->line;
  paths[0][0] = paths[1][0] = '\0';
  dirs[0][0] = dirs[1][0] = '\0';
  floors[0] = floors[1] = 0;
  FILE *f = fopen(cgroup, "re");
  if (f == NULL)
    return;
  while (fgets(line, (int)linesz, f) != NULL) {
    line[strcspn(line, "\n")] = '\0';
    char *c1 = strchr(line, ':');
    char *c2 = c1 != NULL ? strchr(c1 + 1, ':') : NULL;
    if (c2 == NULL)
      continue;
    if (strncmp(line, "0::", 3) == 0)
      (void)snprintf(paths[0], PATH_MAX, "%s", c2 + 1);
    else if (has_memory(c1 + 1, (size_t)(c2 - c1 - 1)))
      (void)snprintf(paths[1], PATH_MAX, "%s", c2 + 1);
  }
  (void)fclose(f);
  /* Their mounts: "id parent dev root mountpoint opts ... - type source
   * superopts". */
  char(*mnts)[PATH_MAX] = sc->mnts, (*roots)[PATH_MAX] = sc->roots;
  char *mroot = sc->root, *mnt = sc->mnt;
  mnts[0][0] = mnts[1][0] = roots[0][0] = roots[1][0] = '\0';
  f = fopen(mountinfo, "re");
  if (f == NULL)
    return;
  while (fgets(line, (int)linesz, f) != NULL) {
    char type[64], super[512];
    const char *dash = strstr(line, " - ");
    if (dash == NULL ||
        sscanf(line, "%*s %*s %*s %4095s %4095s", mroot, mnt) != 2 ||
        sscanf(dash + 3, "%63s %*s %511s", type, super) != 2)
      continue;
    int v = strcmp(type, "cgroup2") == 0 ? 0
            : strcmp(type, "cgroup") == 0 && has_memory(super, strlen(super))
                ? 1
                : -1;
    if (v >= 0 && mnts[v][0] == '\0') {
      (void)snprintf(mnts[v], PATH_MAX, "%s", mnt);
      (void)snprintf(roots[v], PATH_MAX, "%s", mroot);
    }
  }
  (void)fclose(f);
  for (int v = 0; v < 2; v++) {
    const char *path = paths[v], *root = roots[v];
    if (path[0] != '/' || mnts[v][0] == '\0')
      continue;
    /* A mount of a subtree (a container's): the path is below its root. */
    size_t rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
    if (rl != 0 &&
        (strncmp(path, root, rl) != 0 || (path[rl] != '/' && path[rl] != '\0')))
      continue;
    if (snprintf(dirs[v], PATH_MAX, "%s%s", mnts[v], path + rl) >= PATH_MAX) {
      dirs[v][0] = '\0';
      continue;
    }
    floors[v] = strlen(mnts[v]);
    size_t n = strlen(dirs[v]);
    while (n > floors[v] + 1 && dirs[v][n - 1] == '/')
      dirs[v][--n] = '\0';
  }
}

/* NULL (the error recorded) when there is no memory: the callers test the
 * pointer itself, which the static analyzer can follow. */
static struct scratch *scratch_new(void) {
  struct scratch *sc = malloc(sizeof *sc);
  if (sc == NULL)
    (void)pp_fail(PINPOOL_ENOMEM, "shared pool: out of memory reading the "
                                  "memory cgroup's limit");
  return sc;
}

int pp_share_cgroup_dir(const char *mountinfo, const char *cgroup, char *dir,
                        size_t len) {
  struct scratch *sc = scratch_new();
  if (sc == NULL)
    return PINPOOL_ENOMEM;
  size_t floors[2];
  find_dirs(sc, mountinfo, cgroup, floors);
  int rc = 0;
  for (int v = 0; v < 2 && rc == 0; v++) {
    uint64_t x;
    if (sc->dirs[v][0] != '\0' &&
        read_value(sc, sc->dirs[v],
                   v == 0 ? "memory.current" : "memory.usage_in_bytes", &x) &&
        snprintf(dir, len, "%s", sc->dirs[v]) < (int)len)
      rc = v == 0 ? 2 : 1;
  }
  free(sc);
  return rc;
}

int pp_share_cgroup_room(const char *mountinfo, const char *cgroup,
                         uint64_t *room) {
  struct scratch *sc = scratch_new();
  if (sc == NULL)
    return PINPOOL_ENOMEM;
  size_t floors[2];
  find_dirs(sc, mountinfo, cgroup, floors);
  bool found = false;
  uint64_t least = UINT64_MAX;
  for (int v = 0; v < 2; v++) {
    char *dir = sc->dirs[v];
    size_t floor = floors[v];
    if (dir[0] == '\0')
      continue;
    for (;;) {
      uint64_t r;
      if (dir_room(sc, dir, v == 0, &r)) {
        found = true;
        if (r < least)
          least = r;
      }
      char *slash = strrchr(dir, '/');
      if (strlen(dir) <= floor || slash == NULL ||
          (size_t)(slash - dir) < floor)
        break;
      *slash = '\0';
    }
  }
  free(sc);
  if (!found)
    return 1;
  *room = least;
  return 0;
}
