/*
 * libpinpool.so and the Python module can be loaded late (issue 20, "TLS
 * model"): after other libraries have used up the static TLS surplus.
 *
 *   test_dlopen_tls HOG_DIR NHOGS LIBPINPOOL [MODULE]
 *
 * 1. Neither LIBPINPOOL nor MODULE is marked STATIC_TLS (DF_STATIC_TLS in
 *    the dynamic section's DT_FLAGS), which initial-exec TLS sets.
 * 2. Copies of a library with 512 bytes of initial-exec TLS
 *    (HOG_DIR/libpp_tlshog_N.so) are dlopen'ed until one fails with
 *    "cannot allocate memory in static TLS block": the surplus is used up
 *    (if none fails, the test cannot show anything and fails).
 * 3. LIBPINPOOL is dlopen'ed now, and a pool made, used and validated
 *    through dlsym, from this thread and from a new one.
 * (The module is imported late by tests/tls/import_late.py.)
 * Before the fix (initial-exec), step 1 and step 3 failed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define CHECK(c, ...)                                                          \
  do {                                                                         \
    if (!(c)) {                                                                \
      fprintf(stderr, "FAIL: " __VA_ARGS__);                                   \
      fputc('\n', stderr);                                                     \
      fails++;                                                                 \
    }                                                                          \
  } while (0)

/* 1 if the ELF file's DT_FLAGS has DF_STATIC_TLS, 0 if not, -1 on error. */
static int static_tls(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return -1;
  Elf64_Ehdr eh;
  int r = -1;
  if (fread(&eh, sizeof eh, 1, f) != 1 || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    goto out;
  for (unsigned i = 0; i < eh.e_shnum; i++) {
    Elf64_Shdr sh;
    if (fseek(f, (long)(eh.e_shoff + (Elf64_Off)i * eh.e_shentsize),
              SEEK_SET) ||
        fread(&sh, sizeof sh, 1, f) != 1)
      goto out;
    if (sh.sh_type != SHT_DYNAMIC)
      continue;
    r = 0;
    for (Elf64_Xword off = 0; off + sizeof(Elf64_Dyn) <= sh.sh_size;
         off += sizeof(Elf64_Dyn)) {
      Elf64_Dyn d;
      if (fseek(f, (long)(sh.sh_offset + off), SEEK_SET) ||
          fread(&d, sizeof d, 1, f) != 1) {
        r = -1;
        goto out;
      }
      if (d.d_tag == DT_FLAGS && (d.d_un.d_val & DF_STATIC_TLS))
        r = 1;
    }
  }
out:
  fclose(f);
  return r;
}

typedef struct pinpool pinpool_t;
static int (*p_create)(const char *, pinpool_t **);
static int (*p_alloc)(pinpool_t *, size_t, void **);
static int (*p_free)(pinpool_t *, void *);
static int (*p_validate)(pinpool_t *);
static void (*p_destroy)(pinpool_t *);
static pinpool_t *pool;

static void *use_pool(void *arg) {
  (void)arg;
  void *p[8];
  for (int i = 0; i < 8; i++)
    CHECK(p_alloc(pool, (size_t)512 << i, &p[i]) == 0, "pinpool_alloc");
  for (int i = 0; i < 8; i++)
    CHECK(p_free(pool, p[i]) == 0, "pinpool_free");
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s HOG_DIR NHOGS LIBPINPOOL [MODULE]\n", argv[0]);
    return 2;
  }
  for (int i = 3; i < argc; i++) {
    int s = static_tls(argv[i]);
    CHECK(s == 0, "%s: %s", argv[i],
          s < 0 ? "not a readable ELF file with a dynamic section"
                : "marked STATIC_TLS (initial-exec TLS): cannot be "
                  "dlopen'ed once the static TLS surplus is used up");
  }
  int nhogs = atoi(argv[2]), loaded = 0;
  const char *why = NULL;
  for (int i = 0; i < nhogs; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/libpp_tlshog_%d.so", argv[1], i);
    if (dlopen(path, RTLD_NOW) == NULL) {
      why = dlerror();
      break;
    }
    loaded++;
  }
  CHECK(why != NULL && strstr(why, "static TLS") != NULL,
        "the static TLS surplus was not used up by %d libraries (%s)", loaded,
        why != NULL ? why : "all loaded");
  printf("surplus used up after %d libraries: %s\n", loaded,
         why != NULL ? why : "-");
  void *h = dlopen(argv[3], RTLD_NOW);
  CHECK(h != NULL, "dlopen %s after the surplus was used up: %s", argv[3],
        h == NULL ? dlerror() : "");
  if (h == NULL)
    return 1;
  *(void **)&p_create = dlsym(h, "pinpool_create");
  *(void **)&p_alloc = dlsym(h, "pinpool_alloc");
  *(void **)&p_free = dlsym(h, "pinpool_free");
  *(void **)&p_validate = dlsym(h, "pinpool_validate");
  *(void **)&p_destroy = dlsym(h, "pinpool_destroy");
  if (!p_create || !p_alloc || !p_free || !p_validate || !p_destroy) {
    fprintf(stderr, "FAIL: dlsym: %s\n", dlerror());
    return 1;
  }
  if (fails)
    return 1;
  CHECK(p_create("mlock=0,populate=0", &pool) == 0, "pinpool_create");
  use_pool(NULL);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, use_pool, NULL) == 0, "pthread_create");
  pthread_join(t, NULL);
  use_pool(NULL);
  CHECK(p_validate(pool) == 0, "pinpool_validate");
  p_destroy(pool);
  printf("%s: loaded late and used: %s\n", argv[3], fails ? "FAIL" : "ok");
  return fails != 0;
}
