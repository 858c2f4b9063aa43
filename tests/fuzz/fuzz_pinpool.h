/*
 * The fuzz target's entry point, shared by the libFuzzer build
 * (pp_fuzz_pinpool) and the plain corpus replayer (pp_fuzz_replay).
 */
#ifndef PP_FUZZ_PINPOOL_H
#define PP_FUZZ_PINPOOL_H

#include <stddef.h>
#include <stdint.h>

/* Run one input: 0 always; a violated check abort()s. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif /* PP_FUZZ_PINPOOL_H */
