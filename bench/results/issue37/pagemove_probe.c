/*
 * What moving a chunk's free pages with mremap does to them (issue 37,
 * page-moving growth: the facts docs/allocation-policy.md, "Page-moving
 * growth", rests on). Not part of the build:
 *
 *   cc -O2 -o pagemove_probe pagemove_probe.c
 *   ./pagemove_probe [MiB] [KiB] [SEQ]
 *
 * Maps MiB (default 256) of private anonymous memory, populated and locked
 * (as the host backend with mlock=1), and moves every other piece of KiB
 * (default 1024: scattered free extents) into one new PROT_NONE range by
 * sequence SEQ:
 *   0  munlock, mremap(MREMAP_DONTUNMAP), mprotect(PROT_NONE) the hole,
 *      mlock the moved piece (src/pagemove.c's; the default)
 *   1  mremap(MREMAP_DONTUNMAP) alone
 *   2  a plain mremap, then the hole mapped again (MAP_FIXED_NOREPLACE,
 *      PROT_NONE): a window in which another mmap can take the hole
 * Prints, counted: the minor faults of the moves and of touching every
 * moved page, the locked kB of the target and of the chunk's unmoved
 * pieces (smaps), the process's VmLck, the mappings (VMAs) before and
 * after, whether the holes are still taken (MAP_FIXED_NOREPLACE answers
 * EEXIST); and the time per GiB (load-dependent).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

static long minflt(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static long vmas(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  long n = 0;
  int ch;
  while ((ch = fgetc(f)) != EOF)
    n += ch == '\n';
  fclose(f);
  return n;
}

static long status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, strlen(key)) == 0)
      v = strtol(line + strlen(key), NULL, 10);
  fclose(f);
  return v;
}

/* Sum of a smaps field (kB) over the mappings wholly inside [lo, hi). */
static long smaps_kb(uintptr_t lo, uintptr_t hi, const char *key) {
  FILE *f = fopen("/proc/self/smaps", "r");
  char line[512], perms[8];
  long v = 0;
  int in = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long a, b;
    if (sscanf(line, "%lx-%lx %7s", &a, &b, perms) == 3) {
      in = a >= lo && b <= hi;
      continue;
    }
    if (in && strncmp(line, key, strlen(key)) == 0)
      v += strtol(line + strlen(key), NULL, 10);
  }
  fclose(f);
  return v;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
  size_t piece = (argc > 2 ? strtoul(argv[2], NULL, 10) : 1024) << 10;
  int seq = argc > 3 ? atoi(argv[3]) : 0;
  size_t size = mib << 20, n = size / piece, moved = (n + 1) / 2;
  char *src = mmap(NULL, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (src == MAP_FAILED || mlock(src, size) != 0) {
    perror("mmap/mlock");
    return 1;
  }
  for (size_t i = 0; i < n; i++)
    memset(src + i * piece, (int)(i & 0x7f) + 1, 8); /* a mark per piece */
  long v0 = vmas(), lck0 = status_kb("VmLck:");
  char *dst = mmap(NULL, moved * piece, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (dst == MAP_FAILED) {
    perror("mmap target");
    return 1;
  }
  long f0 = minflt();
  double t0 = now();
  for (size_t k = 0; k < moved; k++) {
    char *from = src + 2 * k * piece, *to = dst + k * piece;
    int flags = MREMAP_MAYMOVE | MREMAP_FIXED | (seq < 2 ? MREMAP_DONTUNMAP : 0);
    if (seq == 0 && munlock(from, piece) != 0)
      perror("munlock");
    if (mremap(from, piece, piece, flags, to) == MAP_FAILED) {
      printf("mremap piece %zu: %s\n", k, strerror(errno));
      return 1;
    }
    if (seq == 0 && (mprotect(from, piece, PROT_NONE) != 0 ||
                     mlock(to, piece) != 0))
      perror("mprotect/mlock");
    if (seq == 2 && mmap(from, piece, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE |
                             MAP_FIXED_NOREPLACE,
                         -1, 0) != from)
      printf("the hole of piece %zu was taken meanwhile\n", k);
  }
  double t1 = now();
  long f1 = minflt();
  long ok = 0;
  for (size_t k = 0; k < moved; k++)
    ok += dst[k * piece] == (char)((2 * k) & 0x7f) + 1;
  for (size_t off = 0; off < moved * piece; off += 4096)
    dst[off + 100] = 1;
  long f2 = minflt();
  printf("moved %zu pieces of %zu KiB (%zu MiB) out of %zu MiB\n", moved,
         piece >> 10, moved * piece >> 20, mib);
  printf("faults: %ld during the moves, %ld touching every moved page\n",
         f1 - f0, f2 - f1);
  printf("marks intact: %ld of %zu\n", ok, moved);
  printf("locked kB: target %ld of %zu; the chunk's unmoved pieces %ld of "
         "%zu\n",
         smaps_kb((uintptr_t)dst, (uintptr_t)dst + moved * piece, "Locked:"),
         moved * piece >> 10,
         smaps_kb((uintptr_t)src, (uintptr_t)src + size, "Locked:"),
         (n - moved) * piece >> 10);
  printf("rss kB of the donors' ranges: %ld\n",
         smaps_kb((uintptr_t)src, (uintptr_t)src + size, "Rss:") -
             (long)((n - moved) * piece >> 10));
  printf("VmLck kB: %ld before, %ld after\n", lck0, status_kb("VmLck:"));
  printf("VMAs: %ld before, %ld after\n", v0, vmas());
  void *q = mmap(src, piece, PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  printf("donor range still taken: %s\n",
         q == MAP_FAILED && errno == EEXIST ? "yes (EEXIST)" : "NO");
  if (q != MAP_FAILED && q != src)
    munmap(q, piece);
  printf("time: %.1f ms per GiB moved (this machine, alone or not)\n",
         (t1 - t0) * 1e3 / ((double)(moved * piece) / (1 << 30)));
  return 0;
}
