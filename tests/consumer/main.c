/* Install consumer: built against an installed pinpool (CMake package or
 * pkg-config). Exits 0 only if every call succeeds. */
#include <pinpool.h>

#include <stdio.h>
#include <string.h>

int main(void) {
  const char *v = pinpool_version();
  if (v == NULL || strcmp(v, PINPOOL_VERSION_STRING) != 0) {
    fprintf(stderr, "consumer: version '%s', header says '%s'\n",
            v ? v : "(null)", PINPOOL_VERSION_STRING);
    return 1;
  }
  pinpool_t *pool = NULL;
  int rc = pinpool_create("", &pool);
  if (rc != 0 || pool == NULL) {
    fprintf(stderr, "consumer: pinpool_create: %s (%s)\n", pinpool_strerror(rc),
            pinpool_last_error());
    return 1;
  }
  void *p = NULL;
  rc = pinpool_alloc(pool, 4096, &p);
  if (rc != 0 || p == NULL) {
    fprintf(stderr, "consumer: pinpool_alloc: %s (%s)\n", pinpool_strerror(rc),
            pinpool_last_error());
    pinpool_destroy(pool);
    return 1;
  }
  memset(p, 0xA5, 4096);
  rc = pinpool_free(pool, p);
  if (rc != 0) {
    fprintf(stderr, "consumer: pinpool_free: %s (%s)\n", pinpool_strerror(rc),
            pinpool_last_error());
    pinpool_destroy(pool);
    return 1;
  }
  pinpool_destroy(pool);
  printf("consumer: pinpool %s OK\n", v);
  return 0;
}
