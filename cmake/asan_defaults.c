/*
 * Linked into every executable of an AddressSanitizer build (the asan
 * preset: tests, fuzzers, tools, bench), so that the option holds however
 * the binary is started (ctest, tests/fuzz/run.sh, by hand); ASAN_OPTIONS
 * from the environment still overrides it flag by flag.
 *
 * intercept_tls_get_addr=0: clang 14's __tls_get_addr interceptor takes a
 * dynamic TLS block that happens to start sizeof(glibc 2.19's header) into
 * a page for such a header and hands LeakSanitizer a bogus range (e.g.
 * 0x3e-0x1000001140); its tracer then dies at the leak check ("Tracer
 * caught signal 11", no leak reported). Our binaries load libunwind and
 * libdw with dlopen (history's stacks, the symbolizer), whose TLS is
 * dynamic: about 1 run in 30 of pp_snapgen --streams failed, and a 40 s
 * run of the API fuzzer once (an empty crash input). Without the
 * interception no such range is scanned: 0 in 150.
 */
const char *__asan_default_options(void);

__attribute__((visibility("default"), used, no_sanitize("address")))
const char *
__asan_default_options(void) {
  return "intercept_tls_get_addr=0";
}
