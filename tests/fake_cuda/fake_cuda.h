/*
 * Control API of the fake CUDA driver (libfakecuda.so), for tests.
 *
 * Tests load the driver the way pinpool does (dlopen of $PINPOOL_LIBCUDA)
 * and look these functions up with dlsym; when they are missing the driver
 * is a real one and the fake-only tests skip.
 *
 * The fake runs every entry point pinpool uses on host memory. Each stream
 * (and each context's stream 0) is a worker thread that runs its queue in
 * order, sleeping the stream's delay before each operation, so that
 * events complete asynchronously, and out of order across streams.
 *
 * Environment read when the library loads: FAKE_CUDA_DELAY_US (default
 * delay), FAKE_CUDA_PIN_US_PER_GIB (as pin_us_per_gib), FAKE_CUDA_HIDE (as
 * fake_cuda_hide).
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include "cuda_min.h"

/* Settings (0, or -1 for an unknown key or a bad value):
 *   init_result      what cuInit returns (e.g. 34 stub, 100 no device)
 *   device_count     devices cuDeviceGetCount reports (0..8, default 1)
 *   delay_us         sleep before each stream operation, for streams
 *                    without their own delay (default 0)
 *   driver_version   what cuDriverGetVersion reports (default 12080)
 *   misalign         1: cuMemHostAlloc returns memory 64 bytes off a page
 *   pin_us_per_gib   microseconds cuMemHostAlloc and cuMemHostRegister
 *                    sleep per GiB pinned, no lock held (default 0; also
 *                    FAKE_CUDA_PIN_US_PER_GIB) */
int fake_cuda_set(const char *key, long long value);

/* Counters and state (-1 for an unknown key):
 *   calls:<entry>          calls of an entry point ("calls:cuEventQuery";
 *                          a base name counts its _v2 export)
 *   live_host_allocs       cuMemHostAlloc not yet freed
 *   live_registrations     cuMemHostRegister not yet unregistered
 *   live_events            cuEventCreate not yet destroyed
 *   live_streams           cuStreamCreate not yet destroyed
 *   live_device_allocs     cuMemAlloc not yet freed
 *   host_alloc_bytes       bytes held by cuMemHostAlloc
 *   registered_bytes       bytes held registered
 *   ctx_errors             calls made with no (or the wrong, or a released)
 *                          context current: each returned
 *                          CUDA_ERROR_INVALID_CONTEXT
 *   bad_calls              contract violations: unknown pointer freed or
 *                          unregistered, overlapping registration, pop of an
 *                          empty context stack, release of an unretained
 *                          primary context, use of a destroyed event
 *   pushes, pops           cuCtxPushCurrent / cuCtxPopCurrent calls
 *   unpopped               pushes - pops, read at one instant
 *   primary_refs           primary context retains not yet released
 *   last_host_alloc_flags  flags of the latest cuMemHostAlloc
 *   last_register_flags    flags of the latest cuMemHostRegister
 *   last_event_flags       flags of the latest cuEventCreate
 *   last_proc_flags        flags of the latest cuGetProcAddress
 *   has_proc_address       1 if this build exports cuGetProcAddress
 *   ops_pending            stream operations queued, not yet done
 *   captured_records       cuEventRecord calls on a capturing stream
 *   capture_violations     potentially unsafe calls (cuEventQuery,
 *                          cuEventSynchronize) made while the calling
 *                          thread's capture mode forbade them: each
 *                          invalidated the captures it conflicted with
 *   captured_event_uses    cuEventQuery / cuEventSynchronize of an event
 *                          last recorded inside a capture
 *   live_captures          cuStreamBeginCapture not yet ended
 *   live_graphs            graphs from cuStreamEndCapture and executable
 *                          graphs not destroyed
 *   forked_inits           cuInit calls in a fork() child of the process
 *                          that initialized the driver: each failed with
 *                          CUDA_ERROR_NOT_INITIALIZED (CUDA does not
 *                          support fork; a real driver's behaviour there is
 *                          undefined)
 *
 * Graph capture: cuStreamBeginCapture (modes global, thread-local,
 * relaxed), cuStreamEndCapture, cuStreamGetCaptureInfo (id and status),
 * cuThreadExchangeStreamCaptureMode (per thread), cuGraphDestroy, and
 * cuGraphInstantiateWithFlags / cuGraphLaunch / cuGraphExecDestroy (a
 * launch is an empty operation on the stream). In a
 * capture, copies and event records become nodes (nothing runs); an
 * unsafe call forbidden by the calling thread's mode fails with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the capture (so
 * cuStreamEndCapture returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED), as
 * the driver does; the capture status of the legacy stream 0 while any
 * capture runs is CUDA_ERROR_STREAM_CAPTURE_IMPLICIT. */
long long fake_cuda_get(const char *key);

/* The registration (cuMemHostRegister, not yet unregistered) whose range
 * holds the byte at `p`: 0, with its start in *base and its length in *size
 * (either may be NULL), or -1 if no registration holds it. The driver
 * answers cuPointerGetAttribute for every byte of a registration (a range's
 * start and its interior alike) and refuses, with CUDA_ERROR_INVALID_VALUE,
 * an address that no registration, cuMemHostAlloc or cuMemAlloc range
 * holds; this tells a test which registration answered. */
int fake_cuda_registration(const void *p, void **base, size_t *size);

/* The `nth` call from now (1: the next) of `entry` ("cuMemHostAlloc",
 * "cuEventQuery", ...) does nothing and returns `code`. Several may be
 * armed at once. 0, or -1 for an unknown entry or no free slot. */
int fake_cuda_fail(const char *entry, unsigned nth, int code);

/* The `nth` cuEventRecord from now succeeds, but the event completes with
 * `code`: cuEventQuery and cuEventSynchronize return it from then on (an
 * asynchronous device fault). */
int fake_cuda_fail_event(unsigned nth, int code);

/* Names (comma separated, base names as cuGetProcAddress takes them) that
 * cuGetProcAddress pretends not to know. NULL or "" clears. */
int fake_cuda_hide(const char *names);

/* Queue fn(arg) on `stream` (NULL: stream 0 of the current context, or of
 * device 0 if none is current), run after everything queued there before,
 * after the stream's delay plus `delay_us`: a host-side stand-in for a DMA
 * still in flight. fn may be NULL. */
int fake_cuda_enqueue(CUstream stream, void (*fn)(void *), void *arg,
                      unsigned delay_us);

/* Per-stream delay before each operation (NULL: as for enqueue); a
 * negative value returns the stream to the default. */
int fake_cuda_stream_delay(CUstream stream, int delay_us);

/* Clear injections, hidden names and settings (init_result 0, one device,
 * no delay) and the call counters. Live objects and their counts stay. */
void fake_cuda_reset(void);

#endif /* FAKE_CUDA_H */
