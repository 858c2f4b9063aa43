/*
 * Moving a chunk's free pages to another address (issue 37, page-moving
 * growth: docs/allocation-policy.md, "Page-moving growth"). The host
 * backend's private anonymous memory only: no other backend's pages may
 * move (a CUDA registration is of an address range, a shared chunk is a
 * memfd lent by offset).
 *
 * The system calls and their order are the design's, each chosen from a
 * measurement (bench/results/issue37/pagemove_probe.c and the design's
 * notes): the donor is unlocked first, because MREMAP_DONTUNMAP of a
 * locked range unlocks the rest of its mapping and leaves the moved bytes
 * counted twice against RLIMIT_MEMLOCK (kernel 6.18: a pool under
 * `ulimit -l` would see its mlock refused after a few moves); the move
 * keeps the donor's range mapped (DONTUNMAP), so no other mapping of the
 * process can land in the hole it leaves, as it could between a plain
 * mremap and a new reservation of the hole; the hole is then made
 * PROT_NONE (a stray touch faults instead of populating a page nobody
 * counts), and the moved pages are locked again, which faults nothing:
 * they are present.
 *
 * Called with no pool lock held (invariant 1: a move of a GiB takes
 * 25 - 150 ms). The caller owns both ranges for the whole call (the
 * donor is out of the arena's free extents, the target is its hole).
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4 /* Linux 5.7 */
#endif

/* Before each system call of a move: an injected failure (fault=move:N
 * counts each call of every move, so the tests fail each in turn) sets
 * errno as the call would. */
static bool injected(const pp_config_t *cfg) {
  if (!pp_fault_hit(cfg, PP_FAULT_MOVE))
    return false;
  errno = ENOMEM;
  return true;
}

int pp_space_reserve(const pp_config_t *cfg, size_t size, void **out) {
  pp_assert(size % PP_PAGE == 0 && size > 0);
  void *p = injected(cfg)
                ? MAP_FAILED
                : mmap(NULL, size, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return pp_fail(PINPOOL_ENOMEM,
                   "page move: no address range of %zu bytes to reserve", size);
  *out = p;
  return 0;
}

void pp_space_release(void *p, size_t size) { (void)munmap(p, size); }

/* Undo a move whose pages are at `to`, unlocked, and whose donor range
 * `from` is reserved (its own PROT_NONE or empty mapping): the pages go
 * back over that reservation (MREMAP_FIXED replaces it, so no window
 * opens), `to` is left mapped and empty and made PROT_NONE again, and the
 * pages are locked again if they were. False if the pages could not be
 * put back where they were, locked as they were. */
static bool move_back(void *to, void *from, size_t len, bool locked) {
  void *r = mremap(to, len, len,
                   MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, from);
  if (r == MAP_FAILED)
    return false;
  (void)mprotect(to, len, PROT_NONE);
  return !locked || mlock(from, len) == 0;
}

int pp_pages_move(const pp_config_t *cfg, void *to, void *from, size_t len,
                  bool locked, unsigned *notes) {
  pp_assert(len % PP_PAGE == 0 && len > 0);
  pp_assert((uintptr_t)to % PP_PAGE == 0 && (uintptr_t)from % PP_PAGE == 0);
  *notes = 0;
  /* 1. Unlocked first (the file comment: DONTUNMAP of a locked range). */
#ifndef PINPOOL_MUTANT_MOVE_LOCKED
  if (locked && (injected(cfg) || munlock(from, len) != 0))
#else
  /* Mutant (docs/verification.md): the locked range moved as it is;
   * test_pagemove's locked and memlock_limit must fail. */
  if (locked && injected(cfg))
#endif
    return pp_fail(PINPOOL_EBACKEND, "page move: munlock of %zu bytes: %s", len,
                   strerror(errno));
  /* 2. The page tables move; the donor's range stays mapped, empty. */
  void *r = MAP_FAILED;
  if (!injected(cfg))
    r = mremap(from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP,
               to);
  if (r == MAP_FAILED) {
    int err = errno;
    /* Nothing moved: lock the pages again where they are. They are
     * present, so this faults nothing; it fails only if another thread
     * took RLIMIT_MEMLOCK's room since step 1. */
    if (locked && mlock(from, len) != 0)
      *notes |= PP_MOVE_LOCK_LOST;
    return pp_fail(PINPOOL_EBACKEND, "page move: mremap of %zu bytes: %s", len,
                   strerror(err));
  }
  /* 3. The hole: reserved either way (DONTUNMAP left it mapped); a
   * failure here leaves it readable, empty, and is only noted. */
  if (injected(cfg) || mprotect(from, len, PROT_NONE) != 0)
    *notes |= PP_MOVE_HOLE_OPEN;
  /* 4. Locked again at the target. Refused (RLIMIT_MEMLOCK's room taken
   * between steps 1 and 4): the pages go back, as if nothing moved. */
  if (locked && (injected(cfg) || mlock(to, len) != 0)) {
    int err = errno;
    if (!move_back(to, from, len, locked))
      *notes |= PP_MOVE_LOCK_LOST;
    *notes &= ~(unsigned)PP_MOVE_HOLE_OPEN;
    return pp_fail(PINPOOL_EBACKEND, "page move: mlock of %zu bytes moved: %s",
                   len, strerror(err));
  }
  return 0;
}
