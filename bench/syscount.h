/*
 * syscount — the memory system calls a malloc peer makes, counted by the
 * kernel: its "backend calls" (impl.c, pb_im_get_counters).
 *
 * The pools count their own backend calls; a malloc peer has no such
 * counter, and its calls cannot be intercepted by symbol (glibc's malloc
 * calls mmap, brk and mprotect internally; tcmalloc defines mmap itself).
 * So every worker thread opens one counting perf event per system call on
 * the kernel's syscall-entry tracepoints (mmap, munmap, mremap, brk,
 * mprotect, madvise), and a read sums them over every thread registered so
 * far: a thread that has exited keeps its final count. Needs tracefs (for
 * the tracepoint ids; bench/run.sh mounts it as root) and permission to
 * open tracepoint events (root, or perf_event_paranoid <= -1); without
 * them the count is unknown and the reason says why.
 */
#ifndef PINPOOL_BENCH_SYSCOUNT_H
#define PINPOOL_BENCH_SYSCOUNT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Find the tracepoints and count the calling thread's calls from now on.
 * Returns true, or false with the reason in why. Call once, before any
 * worker starts.
 *
 * Cost: the first event on a syscall tracepoint registers it and the last
 * one's close unregisters it, tens of ms each here, so a process that
 * counts takes about half a second longer to start and exit; bench/run.sh
 * keeps the tracepoints registered for the whole run with a holder
 * process (pp_bench --hold-syscount), which makes that negligible. */
bool syscount_init(char *why, size_t len);

/* Count the calling thread's memory system calls from now on (after a
 * successful syscount_init; otherwise nothing). Returns 0, or -1 if the
 * events could not be opened (the reads then report the count unknown). */
int syscount_thread_start(void);

/* The sum over every registered thread; false if the count is unknown. */
bool syscount_read(uint64_t *out);

/* The system calls counted, for the report ("mmap, munmap, ..."). */
const char *syscount_names(void);

#endif /* PINPOOL_BENCH_SYSCOUNT_H */
