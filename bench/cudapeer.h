/*
 * cudapeer — the CUDA driver as the benchmarks' GPU peers use it
 * (cuhostalloc and refpool-cuda in impl.c).
 *
 * The driver is loaded with dlopen ($PINPOOL_LIBCUDA, else libcuda.so.1),
 * as the library itself does, so the benchmarks build without CUDA and run
 * against the tests' fake driver too (where the numbers mean nothing but
 * every path runs). Device 0's primary context is retained once and made
 * current on every thread that calls the driver: cuMemHostAlloc and
 * cuMemFreeHost need a current context in the calling thread.
 *
 * Memory comes from cuMemHostAlloc with CU_MEMHOSTALLOC_PORTABLE, the flags
 * pinpool's backend=cuda uses by default, so that a pool and its peers pin
 * the same kind of memory.
 */
#ifndef PINPOOL_BENCH_CUDAPEER_H
#define PINPOOL_BENCH_CUDAPEER_H

#include <stdbool.h>
#include <stddef.h>

/* Load the driver, initialize it and retain device 0's primary context,
 * made current on the calling thread. Idempotent and thread-safe. Returns
 * 0, or -1 with the reason in why (the driver is missing, is the toolkit's
 * stub, has no device, the context could not be made current ...). */
int cudapeer_open(char *why, size_t len);

/* "NAME, driver X.Y" (after a successful open), for the report. */
const char *cudapeer_describe(void);

/* Make the context current on the calling thread (after cudapeer_open).
 * Returns 0 or -1. */
int cudapeer_enter(void);

/* cuMemHostAlloc / cuMemFreeHost. alloc returns NULL on failure; free
 * returns 0 or -1. */
void *cudapeer_host_alloc(size_t size);
int cudapeer_free_host(void *p);

/* The last driver error, by name ("CUDA_ERROR_OUT_OF_MEMORY"). */
const char *cudapeer_last_error(void);

#endif /* PINPOOL_BENCH_CUDAPEER_H */
