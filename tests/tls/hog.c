/* A library with initial-exec TLS: each copy loaded takes HOG_BYTES of the
 * static TLS surplus (tests/tls/test_dlopen_tls.c loads copies until one
 * no longer fits). */
__attribute__((tls_model("initial-exec"))) _Thread_local char pp_hog[512];
__attribute__((visibility("default"))) int pp_hog_touch(void);
int pp_hog_touch(void) { return ++pp_hog[0]; }
