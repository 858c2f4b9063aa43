/*
 * Sharing, internal: what the owner side (share.c) and the worker side
 * (share_worker.c) both know: the memfd's seals and the layout of a
 * chunk's control area (docs/sharing.md). Nothing here is exported.
 */
#ifndef PINPOOL_SHARE_H
#define PINPOOL_SHARE_H

#include "internal.h"

#include <fcntl.h>

#ifndef MFD_CLOEXEC
#define MFD_CLOEXEC 0x0001u
#endif
#ifndef MFD_ALLOW_SEALING
#define MFD_ALLOW_SEALING 0x0002u
#endif
#ifndef MFD_NOEXEC_SEAL
#define MFD_NOEXEC_SEAL 0x0008u /* Linux 6.3 */
#endif
#ifndef F_ADD_SEALS
#define F_ADD_SEALS 1033
#define F_GET_SEALS 1034
#define F_SEAL_SEAL 0x0001
#define F_SEAL_SHRINK 0x0002
#define F_SEAL_GROW 0x0004
#define F_SEAL_WRITE 0x0008
#endif
#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* The chunk's bytes: never resized, always writable (workers fill them). */
#define SEALS_NEEDED (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
#define SEALS_FORBIDDEN (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)
/* The control area, a memfd of its own: never resized and, once the owner
 * has mapped it (its mapping keeps writing), never writable again through
 * any descriptor or new mapping (F_SEAL_FUTURE_WRITE, Linux 5.1). */
#define CTL_SEALS                                                              \
  (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL | F_SEAL_FUTURE_WRITE)
#define CTL_MAGIC 0x70696e706f6f6c31ull /* "pinpool1" */
#define HUGE_ALIGN ((size_t)2 << 20)

/* ---- The control area (a sealed memfd of its own, docs/sharing.md) -----
 * Atomics: the owner writes while workers (other processes, or threads of
 * this one) read. Lock-free 64-bit atomics are address-free, so they work
 * across processes. */
typedef struct pp_ctl_head {
  _Atomic(uint64_t) magic, nonce, chunk_id, chunk_size, nslots, owner_pid;
  _Atomic(uint64_t) pad[2];
} pp_ctl_head_t;
typedef struct pp_ctl_slot {
  _Atomic(uint64_t) gen; /* 0: free; else the lend's generation */
  _Atomic(uint64_t) offset, length, peer;
} pp_ctl_slot_t;
_Static_assert(sizeof(pp_ctl_head_t) == 64, "control header is 64 bytes");
_Static_assert(sizeof(pinpool_share_handle_t) == 128, "handle is 128 bytes");

/* Slots per chunk: one per 16 KiB of chunk, 128 to 65536 (a 2 MiB chunk
 * lends 128 blocks at once; a 1 GiB chunk 65536, in 2 MiB of control). A
 * function of the chunk size alone, so that a worker computes the file
 * size it expects from the handle. */
static inline uint64_t pp_ctl_slots(uint64_t size) {
  uint64_t n = size / (16 << 10);
  return n < 128 ? 128 : n > 65536 ? 65536 : n;
}
static inline uint64_t pp_ctl_bytes(uint64_t size) {
  uint64_t b =
      sizeof(pp_ctl_head_t) + pp_ctl_slots(size) * sizeof(pp_ctl_slot_t);
  return (b + PP_PAGE - 1) & ~(uint64_t)(PP_PAGE - 1);
}
static inline pp_ctl_slot_t *pp_ctl_slot(void *ctl, uint64_t i) {
  return (pp_ctl_slot_t *)((char *)ctl + sizeof(pp_ctl_head_t)) + i;
}

/* Worker side (share_worker.c): a control-area descriptor received with a
 * handle (pinpool_share_recv) on socket sock, kept until the chunk is
 * attached. The descriptor is consumed. */
void pp_share_ctl_received(const pinpool_share_handle_t *h, int ctl_fd,
                           int sock);
/* Close a descriptor a peer sent (not kept), never waiting on the peer:
 * the caller's thread closes a memory file (F_GET_SEALS) and hands
 * anything else to the process's closers (at most PP_SHARE_CLOSERS
 * threads), which neutralise, drain and close it (share_worker.c,
 * "Disposing"). Never closed past a bound on the caller's thread:
 * pinpool_share_recv reads nothing while pp_share_closers_saturated()
 * (PP_SHARE_CLOSER_QUEUE or more handed over and not closed yet). */
void pp_share_close_received(int fd);
bool pp_share_closers_saturated(void);
#define PP_SHARE_CLOSERS 4
#define PP_SHARE_CLOSER_QUEUE 64
/* Tests: recvmsg calls the closers' drains made, and of them those that
 * came back truncated (MSG_CTRUNC: the kernel released the rest). */
extern _Atomic(unsigned long) pp_share_drain_calls;
extern _Atomic(unsigned long) pp_share_drain_ctrunc;
/* Tests: wait until the closers have closed everything queued (each close
 * returned); the same for at most ms milliseconds: whether they have. */
void pp_share_closer_flush(void);
bool pp_share_closer_wait(unsigned ms);
typedef struct {
  size_t queued;
  unsigned threads, busy;
  unsigned long inline_closes; /* out of memory, on the caller's thread */
} pp_closer_counts_t;
void pp_share_closer_counts(pp_closer_counts_t *c);
/* The nonces of the shared pools this process created (share_worker.c's
 * table, emptied in a child of fork): add at pp_share_create (0 or
 * PINPOOL_ENOMEM), delete at pp_share_destroy. */
int pp_share_own_add(uint64_t nonce);
void pp_share_own_del(uint64_t nonce);
/* The least room for a shared chunk that the memory cgroup of this process
 * and its ancestors leave (share_cgroup.c), read from the mountinfo and
 * cgroup files named (/proc/self's; tests give others): 0 and *room, 1
 * where no memory cgroup limit can be read, or PINPOOL_ENOMEM (its buffers
 * are on the heap, not the caller's stack). */
int pp_share_cgroup_room(const char *mountinfo, const char *cgroup,
                         uint64_t *room);
/* Tests: the innermost memory cgroup directory of this process into dir:
 * 2 (cgroup v2), 1 (v1), 0 (none, or its memory files cannot be read), or
 * PINPOOL_ENOMEM. */
int pp_share_cgroup_dir(const char *mountinfo, const char *cgroup, char *dir,
                        size_t len);
/* Tests: at most this many bytes per sendmsg/recvmsg of a handle (0: no
 * cap), to force short reads and writes at every byte boundary; the
 * received control descriptors and the part-messages kept now. */
extern _Atomic(size_t) pp_share_io_cap;
size_t pp_share_worker_pending_ctl(void);
size_t pp_share_io_kept(void);

#endif
