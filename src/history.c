/*
 * Allocation history (docs/snapshot-format.md, "history").
 *
 * Cost model. History off: every hot path reads one atomic (the level) and
 * skips a predictable branch. On: an entry is one fetch-add on the ring's
 * head, one clock read (the TSC where it is invariant: about 10 ns, a third
 * of clock_gettime here) and nine relaxed stores; a stack is backtrace(3)
 * plus one lookup in the stack table (a mutex: distinct stacks are few, and
 * the capture itself costs far more than the lock).
 *
 * Races, and why there are none:
 *  - The level is written by pinpool_record_history and read by every
 *    allocation and free: an atomic (PyTorch's record_history_ was a plain
 *    field; mutant HISTORY_FLAG_PLAIN puts that back).
 *  - Ring slots are written by any thread and copied by snapshots: each is
 *    guarded by its sequence word (a seqlock whose fields are all atomics),
 *    so a reader skips a slot it saw half written instead of reading it.
 *    A writer claims its slot with a CAS that fails while a writer of an
 *    older lap still holds it: two writers never fill one slot at once (the
 *    seqlock alone let a reader accept fields of two entries). The loser
 *    drops its entry and counts it (hist.lost: stats history_lost_writes).
 *  - A block's info word is written by the allocating thread and read by
 *    snapshots: one atomic (PyTorch wrote such fields under one lock and
 *    read them under another; mutant BLOCKINFO_PLAIN puts that back).
 *  - A ring that is replaced (a larger max_entries) may still be written by
 *    a thread that loaded it just before: it is retired, not freed, until
 *    the pool is destroyed. Rings only grow (powers of two), so retired
 *    rings together are smaller than the live one.
 */
#include "internal.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#define DEFAULT_ENTRIES 100000u
#define MAX_ENTRIES ((size_t)1 << 26)
#define MAX_DEPTH 64u
/* Frames captured beyond the asked depth: the allocator's own frames at the
 * top of every stack, cut when the stack is written (snapshot_json.c). */
#define OWN_FRAMES 6u
#define MAX_STACKS ((size_t)1 << 20)

/* ---- Thread ids ---------------------------------------------------------- */

static _Thread_local uint32_t tid_cache PP_TLS_MODEL;

uint32_t pp_thread_id(void) {
  if (pp_unlikely(tid_cache == 0))
    tid_cache = (uint32_t)syscall(SYS_gettid);
  return tid_cache;
}

/* ---- Clock ----------------------------------------------------------------
 * Entries store raw clock values; snapshots convert them with the
 * (clock, ns) pair taken at create and one taken when writing. */

static bool tsc_invariant(void) {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
    return false;
  __get_cpuid(0x80000007u, &a, &b, &c, &d);
  return (d >> 8) & 1u; /* "invariant TSC": constant rate, all cores */
#else
  return false;
#endif
}

uint64_t pp_hist_clock(const pinpool_t *pool) {
#if defined(__x86_64__)
  if (pool->hist.tsc)
    return __builtin_ia32_rdtsc();
#endif
  (void)pool;
  return pp_now_ns();
}

uint64_t pp_hist_to_ns(const pinpool_t *pool, uint64_t clk, uint64_t clk_now,
                       uint64_t ns_now) {
  const pp_history_t *h = &pool->hist;
  if (!h->tsc)
    return clk;
  if (clk_now <= h->clk0 || ns_now <= h->ns0)
    return h->ns0;
  double rate = (double)(ns_now - h->ns0) / (double)(clk_now - h->clk0);
  double d = ((double)clk - (double)h->clk0) * rate;
  return d <= 0 ? h->ns0 : h->ns0 + (uint64_t)d;
}

/* ---- Stack table ----------------------------------------------------------
 * Distinct stacks, interned: id (1-based) -> frames. Under `lock`; grows by
 * doubling. Append-only: a stack's id, offsets and frames never change once
 * interned, so snapshots copy it in pieces (pp_stacks_copy). */
struct pp_stacktab {
  pp_mutex_t lock;
  uint32_t *slots; /* open addressing: stack id, 0 empty */
  size_t nslots;   /* power of two, > 2 * n */
  /* A doubling in progress (issue 38, the meter's findings, item 5): the
   * old slots still hold every stack below mig_end; stacks [0, mig) are
   * in slots too, and so is every stack interned since. Each intern moves
   * MIG_STEP more, so no hold rehashes the whole table. NULL: none. */
  uint32_t *old_slots;
  size_t old_nslots, mig, mig_end;
  uint64_t *hash; /* per stack */
  uint64_t *off;  /* stack i: frames[off[i], off[i+1]) */
  uintptr_t *frames;
  size_t n, cap, nframes, cap_frames;
};

static uint64_t hash_frames(void *const *f, int n) {
  uint64_t h = 0x9e3779b97f4a7c15u ^ (uint64_t)n;
  for (int i = 0; i < n; i++) {
    h ^= (uint64_t)(uintptr_t)f[i];
    h *= 0xff51afd7ed558ccdu;
    h ^= h >> 32;
  }
  return h;
}

/* Stacks a doubling moves per intern. */
#define MIG_STEP 64

static void slot_put(uint32_t *slots, size_t ns, uint64_t h, size_t i) {
  size_t j = h & (ns - 1);
  while (slots[j] != 0)
    j = (j + 1) & (ns - 1);
  slots[j] = (uint32_t)(i + 1);
}

/* Move up to k stacks of a doubling in progress into the new slots; the
 * old ones go when every stack is moved. On the lock's meter. */
static void migrate_locked(pp_stacktab_t *t, size_t k) {
  if (t->old_slots == NULL)
    return;
  size_t end = t->mig_end - t->mig > k ? t->mig + k : t->mig_end;
  pp_lock_visit(&t->lock, end - t->mig);
  for (size_t i = t->mig; i < end; i++)
    slot_put(t->slots, t->nslots, t->hash[i], i);
  t->mig = end;
  if (t->mig == t->mig_end) {
    free(t->old_slots);
    t->old_slots = NULL;
    t->old_nslots = 0;
  }
}

static bool grow_locked(pp_stacktab_t *t, size_t more_frames) {
  if (t->n + 1 >= t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 256;
    uint64_t *hash = realloc(t->hash, cap * sizeof *hash);
    if (hash == NULL)
      return false;
    t->hash = hash;
    uint64_t *off = realloc(t->off, (cap + 1) * sizeof *off);
    if (off == NULL)
      return false;
    t->off = off;
    t->cap = cap;
  }
  if (t->nframes + more_frames > t->cap_frames) {
    size_t cap = t->cap_frames ? t->cap_frames * 2 : 4096;
    while (cap < t->nframes + more_frames)
      cap *= 2;
    uintptr_t *f = realloc(t->frames, cap * sizeof *f);
    if (f == NULL)
      return false;
    t->frames = f;
    t->cap_frames = cap;
  }
  if (2 * (t->n + 1) >= t->nslots) {
    size_t ns = t->nslots ? t->nslots * 2 : 1024;
    uint32_t *slots = calloc(ns, sizeof *slots);
    if (slots == NULL)
      return false;
    /* A doubling starts when the last has ended: it ends after mig_end /
     * MIG_STEP interns, long before n doubles again (a doubling comes
     * after nslots / 4 more stacks). Should one not have (it cannot),
     * the rest is moved here. */
    migrate_locked(t, SIZE_MAX);
    uint32_t *old = t->slots;
    size_t old_n = t->nslots;
    t->slots = slots;
    t->nslots = ns;
#ifdef PINPOOL_MUTANT_STACKS_REHASH_ONE_HOLD
    /* Mutant (docs/verification.md): the whole table in this hold. */
    t->old_slots = old, t->old_nslots = old_n, t->mig = 0, t->mig_end = t->n;
    migrate_locked(t, SIZE_MAX);
#else
    if (old != NULL && t->n > 0) {
      t->old_slots = old, t->old_nslots = old_n;
      t->mig = 0, t->mig_end = t->n;
    } else {
      free(old);
    }
#endif
  }
  return true;
}

/* Id of the stack f[0..n), interned; 0 if the table is full or out of
 * memory (the entry is recorded without a stack). */
static uint32_t intern(pp_stacktab_t *t, void *const *f, int n) {
  uint64_t h = hash_frames(f, n);
  uint32_t id = 0;
  pp_mutex_lock(&t->lock);
  migrate_locked(t, MIG_STEP);
  /* The new slots, then the old ones of a doubling in progress (they hold
   * every stack not yet moved; ids never change). */
  for (int pass = 0; pass < 2 && id == 0; pass++) {
    uint32_t *slots = pass == 0 ? t->slots : t->old_slots;
    size_t ns = pass == 0 ? t->nslots : t->old_nslots;
    if (ns == 0 || slots == NULL)
      continue;
    uint64_t probes = 0;
    for (size_t j = h & (ns - 1); slots[j] != 0; j = (j + 1) & (ns - 1)) {
      probes++;
      size_t i = slots[j] - 1;
      if (t->hash[i] == h && t->off[i + 1] - t->off[i] == (uint64_t)n &&
          memcmp(&t->frames[t->off[i]], f, (size_t)n * sizeof *f) == 0) {
        id = (uint32_t)(i + 1);
        break;
      }
    }
    pp_lock_visit(&t->lock, probes);
  }
  if (id == 0 && t->n < MAX_STACKS && grow_locked(t, (size_t)n)) {
    size_t i = t->n++;
    t->hash[i] = h;
    t->off[i] = t->nframes;
    memcpy(&t->frames[t->nframes], f, (size_t)n * sizeof *f);
    t->nframes += (size_t)n;
    t->off[i + 1] = t->nframes;
    slot_put(t->slots, t->nslots, h, i);
    id = (uint32_t)(i + 1);
  }
  pp_mutex_unlock(&t->lock);
  return id;
}

static void stacktab_free(pp_stacktab_t *t) {
  if (t == NULL)
    return;
  pp_mutex_destroy(&t->lock);
  free(t->slots);
  free(t->old_slots);
  free(t->hash);
  free(t->off);
  free(t->frames);
  free(t);
}

/* A piece of the stack table's copy: at most this many stacks or frames
 * in one hold of its lock (every allocation with history takes it: issue
 * 38, a copy in one hold of 2^16 stacks held it 0.3-0.5 s). */
#define STACK_PIECE 256u
#define FRAME_PIECE 4096u

int pp_stacks_copy(pinpool_t *pool, pp_stacks_copy_t *out, uint64_t *hold_ns) {
  memset(out, 0, sizeof *out);
  pp_stacktab_t *t = pp_load_acquire(&pool->hist.stacks);
  if (t == NULL)
    return 0;
  /* The stacks interned when the copy begins, [0, n): the table only
   * appends, so they are copied in pieces, a hold each, into memory sized
   * once (stacks interned meanwhile are not listed, as entries recorded
   * meanwhile are not; the arrays may move between holds, so their
   * addresses are read in each). */
  pp_mutex_lock(&t->lock);
  size_t n = t->n, nf = t->nframes;
  pp_mutex_unlock(&t->lock);
  uintptr_t *frames = malloc((nf ? nf : 1) * sizeof *frames);
  uint64_t *off = malloc((n + 1) * sizeof *off);
  if (frames == NULL || off == NULL) {
    free(frames);
    free(off);
    return pp_fail(PINPOOL_ENOMEM, "snapshot: out of memory for stacks");
  }
  off[0] = 0;
  for (size_t i = 0; i < n;) {
    if (i > 0)
      pp_hook(PP_HOOK_SNAP_TABLE);
    uint64_t t0 = pp_now_ns();
    pp_mutex_lock(&t->lock);
    size_t j = i;
#ifdef PINPOOL_MUTANT_STACKS_ONE_HOLD
    j = n; /* Mutant (docs/verification.md): the whole table in one hold. */
#else
    while (j < n && j - i < STACK_PIECE &&
           (j == i || t->off[j + 1] - t->off[i] <= FRAME_PIECE))
      j++;
#endif
    memcpy(&off[i + 1], &t->off[i + 1], (j - i) * sizeof *off);
    memcpy(&frames[t->off[i]], &t->frames[t->off[i]],
           (t->off[j] - t->off[i]) * sizeof *frames);
    pp_lock_visit(&t->lock, (j - i) + (t->off[j] - t->off[i]));
    pp_mutex_unlock(&t->lock);
    uint64_t dt = pp_now_ns() - t0;
    if (dt > *hold_ns)
      *hold_ns = dt;
    i = j;
  }
  out->n = n;
  out->frames = frames;
  out->off = off;
  return 0;
}

/* The stack table's lock's meter (tests; base.h, pp_lock_meter): 0 while
 * history never ran with stacks. */
uint64_t pp_stacks_meter(pinpool_t *pool, bool reset) {
  pp_stacktab_t *t = pp_load_acquire(&pool->hist.stacks);
  return t == NULL ? 0 : pp_lock_meter(&t->lock, reset);
}

void pp_stacks_copy_free(pp_stacks_copy_t *c) {
  free(c->frames);
  free(c->off);
  memset(c, 0, sizeof *c);
}

/* ---- Recording ------------------------------------------------------------
 */

/* The unwinder. glibc's backtrace() goes through libgcc's unwinder, which
 * here costs about 6 us for an 8-frame stack (it searches the unwind
 * tables of every object on each frame); libunwind's unw_backtrace caches
 * them and takes about 0.3 us. libunwind is loaded with dlopen when it is
 * there (PINPOOL_LIBUNWIND names another path; set empty: glibc's), so
 * the library still needs nothing beyond libc. */
typedef int (*backtrace_fn)(void **, int);
static _Atomic(backtrace_fn) unwinder;
static pthread_once_t unwinder_once = PTHREAD_ONCE_INIT;

static void unwinder_init(void) {
  backtrace_fn fn = backtrace;
  const char *env = getenv("PINPOOL_LIBUNWIND");
  if (env == NULL || env[0] != '\0') {
    void *lib =
        dlopen(env != NULL ? env : "libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
    void *sym = lib != NULL ? dlsym(lib, "unw_backtrace") : NULL;
    if (sym != NULL) {
      fn = (backtrace_fn)sym; /* kept loaded for the process's life */
      /* libunwind initializes itself lazily on first use, behind a plain
       * flag (ThreadSanitizer reports two threads' first captures racing
       * on it). Its first use is here, inside pthread_once, so every
       * later capture happens after that initialization. */
      void *warm[4];
      (void)fn(warm, 4);
    } else if (lib != NULL) {
      dlclose(lib);
    }
  }
  pp_store_release(&unwinder, fn);
}

static uint32_t capture(pinpool_t *pool, unsigned depth, const void *ra) {
  pp_stacktab_t *t = pp_load_acquire(&pool->hist.stacks);
  if (t == NULL || depth == 0)
    return 0;
  backtrace_fn bt = pp_load_acquire(&unwinder);
  if (pp_unlikely(bt == NULL)) {
    (void)pthread_once(&unwinder_once, unwinder_init);
    bt = pp_load_acquire(&unwinder);
  }
  void *f[MAX_DEPTH + OWN_FRAMES];
  int n = bt(f, (int)(depth + OWN_FRAMES));
  int first = 0;
  for (int k = 0; ra != NULL && k < n && k < (int)OWN_FRAMES; k++)
    if (f[k] == ra) {
      first = k; /* the caller's frame: ours above it are cut */
      break;
    }
  n -= first;
  if (n > (int)depth)
    n = (int)depth;
  if (n <= 0)
    return 0;
  return intern(t, f + first, n);
}

static void emit(pinpool_t *pool, int action, uint64_t addr, uint64_t size,
                 uint64_t req, uint64_t stream, uint32_t tid, uint32_t stack) {
  pp_hring_t *r = pp_load_acquire(&pool->hist.ring);
  if (r == NULL)
    return;
  uint64_t seq = pp_fetch_add_relaxed(&r->head, 1);
  pp_hslot_t *s = &r->slots[seq & r->mask];
  /* Claim the slot: from an even (complete) value below ours to odd, in
   * one CAS. A slot's sequence word only grows, so the claim also proves
   * that no writer of an older lap is still filling it: one preempted for a
   * whole lap left it odd (or wrote its final value after a newer claim
   * failed), and then this entry is dropped and counted instead of being
   * written beside the other writer's fields. Without the claim a reader
   * accepted a mix of two entries (docs/verification.md, "Review
   * defects", 1). */
  uint64_t cur = pp_load_relaxed(&s->seq);
  do {
    if ((cur & 1) != 0 || cur >= 2 * seq + 2) {
      pp_fetch_add_relaxed(&pool->hist.lost, 1);
      return;
    }
  } while (!atomic_compare_exchange_weak_explicit(
      &s->seq, &cur, 2 * seq + 1, memory_order_relaxed, memory_order_relaxed));
  /* The odd value is visible before any field (a reader that sees a field
   * of ours also sees the claim, and its re-check fails). */
  atomic_thread_fence(memory_order_release);
  pp_hook(PP_HOOK_HIST_CLAIMED);
  pp_store_relaxed(&s->time, pp_hist_clock(pool));
  pp_store_relaxed(&s->addr, addr);
  pp_hook(PP_HOOK_HIST_FIELDS);
  pp_store_relaxed(&s->size, size);
  pp_store_relaxed(&s->req, req);
  pp_store_relaxed(&s->stream, stream);
  pp_store_relaxed(&s->tid_action, (uint64_t)tid << 8 | (uint64_t)action);
  pp_store_relaxed(&s->stack, stack);
  pp_hook(PP_HOOK_HIST_PUBLISH);
  pp_store_release(&s->seq, 2 * seq + 2);
}

static _Atomic(uint64_t) *info_array(pp_segment_t *seg) {
  _Atomic(uint64_t) *arr = pp_load_acquire(&seg->info);
  if (arr != NULL)
    return arr;
  _Atomic(uint64_t) *fresh = calloc(seg->capacity, sizeof *fresh);
  if (fresh == NULL)
    return NULL;
  _Atomic(uint64_t) *expected = NULL;
  if (pp_cas_acq_rel(&seg->info, &expected, fresh))
    return fresh;
  free(fresh); /* another thread installed one first */
  return expected;
}

void pp_hist_alloc(pinpool_t *pool, pp_segment_t *seg, uint32_t idx, size_t bs,
                   size_t req, const void *ra) {
  unsigned lvl = pp_hist_level(pool);
  if (lvl == PINPOOL_HISTORY_NONE)
    return;
  uint32_t tid = pp_thread_id();
  uint32_t stack = capture(pool, pp_load_relaxed(&pool->hist.depth), ra);
  _Atomic(uint64_t) *info = info_array(seg);
  if (info != NULL) {
#ifdef PINPOOL_MUTANT_BLOCKINFO_PLAIN
    *(uint64_t *)&info[idx] = (uint64_t)stack << 32 | tid;
#else
    pp_store_relaxed(&info[idx], (uint64_t)stack << 32 | tid);
#endif
  }
  if (lvl >= PINPOOL_HISTORY_ALLOC)
    emit(pool, PP_H_ALLOC, pp_load_relaxed(&seg->base) + (uint64_t)idx * bs, bs,
         req, 0, tid, stack);
}

void pp_hist_event(pinpool_t *pool, int action, uintptr_t addr, size_t size,
                   size_t req, uint64_t stream, const void *ra) {
  unsigned lvl = pp_hist_level(pool);
  if (lvl < PINPOOL_HISTORY_ALLOC)
    return;
  bool want_stack = lvl == PINPOOL_HISTORY_ALL ||
                    action == PP_H_SEGMENT_ALLOC || action == PP_H_OOM;
  uint32_t stack =
      want_stack ? capture(pool, pp_load_relaxed(&pool->hist.depth), ra) : 0;
  emit(pool, action, addr, size, req, stream, pp_thread_id(), stack);
}

/* ---- pinpool_record_history ---------------------------------------------- */

static size_t ring_bytes(uint64_t cap) {
  return sizeof(pp_hring_t) + cap * sizeof(pp_hslot_t);
}

static pp_hring_t *ring_new(uint64_t cap) {
  /* mmap: zeroed (seq 0 matches no entry) and committed only as written. */
  void *p = mmap(NULL, ring_bytes(cap), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  pp_hring_t *r = p;
  r->mask = cap - 1;
  return r;
}

static void ring_free(pp_hring_t *r) {
  if (r != NULL)
    munmap(r, ring_bytes(r->mask + 1));
}

int pp_hist_init(pinpool_t *pool) {
  pp_history_t *h = &pool->hist;
  atomic_init(&h->level, PINPOOL_HISTORY_NONE);
  atomic_init(&h->depth, 0);
  atomic_init(&h->ring, NULL);
  atomic_init(&h->max_entries, 0);
  atomic_init(&h->base_seq, 0);
  atomic_init(&h->lost, 0);
  atomic_init(&h->stacks, NULL);
  pp_mutex_init(&h->lock);
  h->retired = NULL;
  h->tsc = tsc_invariant();
  h->ns0 = pp_now_ns();
  h->clk0 = pp_hist_clock(pool);
  return 0;
}

void pp_hist_fini(pinpool_t *pool) {
  pp_history_t *h = &pool->hist;
  ring_free(pp_load_relaxed(&h->ring));
  for (pp_hring_t *r = h->retired; r != NULL;) {
    pp_hring_t *next = r->retired_next;
    ring_free(r);
    r = next;
  }
  h->retired = NULL;
  stacktab_free(pp_load_relaxed(&h->stacks));
  pp_mutex_destroy(&h->lock);
}

static int check_options(const pinpool_history_options_t *o) {
  if (o->record < PINPOOL_HISTORY_NONE || o->record > PINPOOL_HISTORY_ALL)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_record_history: record %d is not one of "
                   "PINPOOL_HISTORY_NONE/STATE/ALLOC/ALL (0..3)",
                   o->record);
  if (o->max_entries > MAX_ENTRIES)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_record_history: max_entries %zu is above 2^26",
                   o->max_entries);
  if (o->stack_depth > MAX_DEPTH)
    return pp_fail(PINPOOL_EINVAL,
                   "pinpool_record_history: stack_depth %u is above 64",
                   o->stack_depth);
  return 0;
}

int pinpool_record_history(pinpool_t *pool,
                           const pinpool_history_options_t *opts) {
  if (pool == NULL)
    return pp_fail(PINPOOL_EINVAL, "pinpool_record_history: pool is NULL");
  pinpool_history_options_t o = {PINPOOL_HISTORY_NONE, 0, 0, 0};
  if (opts != NULL) {
    int rc = check_options(opts);
    if (rc != 0)
      return rc;
    o = *opts;
  }
  pp_history_t *h = &pool->hist;
  /* A new ring is mapped before the lock is taken: no mmap under a pool
   * lock. Rings only grow, so a ring found big enough here is still big
   * enough under the lock; one mapped here but no longer needed there (a
   * concurrent call installed a bigger one) is unmapped after it. */
  uint64_t want = o.max_entries;
  if (want == 0)
    want = pp_load_relaxed(&h->max_entries);
  if (want == 0)
    want = DEFAULT_ENTRIES;
  pp_hring_t *fresh = NULL;
  if (o.record != PINPOOL_HISTORY_NONE) {
    pp_hring_t *cur = pp_load_acquire(&h->ring);
    if (cur == NULL || cur->mask + 1 < want) {
      uint64_t cap = 1024;
      while (cap < want)
        cap *= 2;
      fresh = ring_new(cap);
      if (fresh == NULL)
        return pp_fail(PINPOOL_ENOMEM,
                       "pinpool_record_history: no memory for a ring of "
                       "%llu entries",
                       (unsigned long long)want);
    }
  }
  pp_mutex_lock(&h->lock);
  if (o.record == PINPOOL_HISTORY_NONE) {
    pp_store_release(&h->level, PINPOOL_HISTORY_NONE);
    pp_hring_t *r = pp_load_relaxed(&h->ring);
    if (o.clear && r != NULL)
      pp_store_relaxed(&h->base_seq, pp_load_relaxed(&r->head));
    pp_mutex_unlock(&h->lock);
    return 0;
  }

  /* Everything that can fail first: on error nothing has changed. */
  if (pp_load_relaxed(&h->stacks) == NULL) {
    pp_stacktab_t *t = calloc(1, sizeof *t);
    if (t == NULL) {
      pp_mutex_unlock(&h->lock);
      ring_free(fresh);
      return pp_fail(PINPOOL_ENOMEM, "pinpool_record_history: out of memory");
    }
    pp_mutex_init(&t->lock);
    pp_store_release(&h->stacks, t);
  }
  pp_hring_t *old = pp_load_relaxed(&h->ring);
  if (fresh != NULL && (old == NULL || old->mask < fresh->mask)) {
    if (old != NULL) {
      /* Sequence numbers continue; the old ring's entries are dropped. */
      uint64_t head = pp_load_relaxed(&old->head);
      pp_store_relaxed(&fresh->head, head);
      pp_store_relaxed(&h->base_seq, head);
      old->retired_next = h->retired;
      h->retired = old;
    }
    pp_store_release(&h->ring, fresh);
    fresh = NULL;
  }
  if (o.clear)
    pp_store_relaxed(&h->base_seq,
                     pp_load_relaxed(&pp_load_relaxed(&h->ring)->head));
  pp_store_relaxed(&h->max_entries, want);
  pp_store_relaxed(&h->depth, o.stack_depth);
#ifdef PINPOOL_MUTANT_HISTORY_FLAG_PLAIN
  *(volatile unsigned *)&h->level = (unsigned)o.record;
#else
  pp_store_release(&h->level, (unsigned)o.record);
#endif
  pp_mutex_unlock(&h->lock);
  ring_free(fresh); /* not needed after all */
  return 0;
}

/* ---- Fork (fork.c) -------------------------------------------------------
 * hist.lock, then the stack table's lock (the order record_history nests
 * them in). The stack table is set under hist.lock, so it is stable here. */
void pp_hist_fork_lock(pinpool_t *pool) {
  pp_mutex_lock(&pool->hist.lock);
  pp_stacktab_t *t = pp_load_acquire(&pool->hist.stacks);
  if (t != NULL)
    pp_mutex_lock(&t->lock);
}

void pp_hist_fork_unlock(pinpool_t *pool) {
  pp_stacktab_t *t = pp_load_acquire(&pool->hist.stacks);
  if (t != NULL)
    pp_mutex_unlock(&t->lock);
  pp_mutex_unlock(&pool->hist.lock);
}

/* The child of fork: its only thread has a new id. */
void pp_thread_id_reset(void) { tid_cache = 0; }
