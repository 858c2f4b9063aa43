/*
 * Configuration: "key=value,key=value" (docs/configuration.md). Parsing is
 * all-or-nothing: the output is written only when every item is valid, and
 * every error names the key it is about.
 */
#include "internal.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

typedef enum {
  K_SIZE,
  K_BOOL,
  K_UINT,
  K_INT,
  K_MLOCK,
  K_PIN,
  K_BACKEND,
  K_EVENTS,
  K_CUDA_FLAGS,
  K_FAULT,
  K_NUMA,
  K_GROW,
  K_PMOVE
} kind_t;

typedef struct key_desc {
  const char *name;
  kind_t kind;
  size_t offset;
  long long lo, hi; /* K_UINT / K_INT bounds */
} key_desc_t;

#define CFG_OFF(f) offsetof(pp_config_t, f)
/* Keys of earlier versions: refused with a message that says why. */
static bool removed_key(const char *key) {
  static const char *const gone[] = {"remap", "remap_min", "borrow"};
  for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++)
    if (strcmp(key, gone[i]) == 0)
      return true;
  return false;
}
static const key_desc_t keys[] = {
    {"backend", K_BACKEND, CFG_OFF(backend), 0, 0},
    {"max_cached", K_SIZE, CFG_OFF(max_cached), 0, 0},
    {"max_cached_pct", K_UINT, CFG_OFF(max_cached_pct), 0, 10000},
    {"max_reserved", K_SIZE, CFG_OFF(max_reserved), 0, 0},
    {"reserve", K_SIZE, CFG_OFF(reserve), 0, 0},
    {"mlock", K_MLOCK, CFG_OFF(mlock), 0, 0},
    {"pin_failure", K_PIN, CFG_OFF(pin_failure), 0, 0},
    {"hugepages", K_BOOL, CFG_OFF(hugepages), 0, 0},
    {"populate", K_BOOL, CFG_OFF(populate), 0, 0},
    {"populate_threads", K_UINT, CFG_OFF(populate_threads), 1, 64},
    {"populate_parallel_min", K_SIZE, CFG_OFF(populate_parallel_min), 0, 0},
    {"tcache_bytes", K_SIZE, CFG_OFF(tcache_bytes), 0, 0},
    {"shards", K_UINT, CFG_OFF(shards), 1, 64},
    {"events", K_EVENTS, CFG_OFF(events), 0, 0},
    {"background", K_BOOL, CFG_OFF(background), 0, 0},
    {"poll_us", K_UINT, CFG_OFF(poll_us), 1, 1000000},
    {"sim_delay_us", K_UINT, CFG_OFF(sim_delay_us), 0, 10000000},
    {"cuda_flags", K_CUDA_FLAGS, CFG_OFF(cuda_flags), 0, 0},
    {"register_threads", K_UINT, CFG_OFF(register_threads), 1, 64},
    {"register_max", K_SIZE, CFG_OFF(register_max), 0, 0},
    {"device", K_INT, CFG_OFF(device), -1, 1024},
    {"numa_node", K_INT, CFG_OFF(numa_node), -1, 1023},
    {"numa", K_NUMA, CFG_OFF(numa), 0, 0},
    {"numa_spill", K_BOOL, CFG_OFF(numa_spill), 0, 0},
    {"numa_fake_nodes", K_UINT, CFG_OFF(numa_fake_nodes), 1, PP_NUMA_MAX},
    {"shared", K_BOOL, CFG_OFF(shared), 0, 0},
    {"fault", K_FAULT, CFG_OFF(fault_site), 0, 0},
    {"grow_ahead", K_GROW, CFG_OFF(grow_ahead), 0, 0},
    {"page_move", K_PMOVE, CFG_OFF(page_move), 0, 0},
};

static const char *fault_sites[PP_FAULT_SITES] = {
    "none",  "alloc",    "populate", "mlock", "record",
    "query", "register", "sset",     "queue", "move"};

bool pp_fault_hit(const pp_config_t *cfg, int site) {
  if (pp_likely(cfg->fault_site != site || cfg->fault == NULL))
    return false;
  uint64_t k = pp_fetch_add_relaxed(&cfg->fault->calls, 1) + 1;
  if (k < cfg->fault_n || k - cfg->fault_n >= cfg->fault_count)
    return false;
  pp_fetch_add_relaxed(&cfg->fault->fired, 1);
  return true;
}

/* SITE:N or SITE:N:COUNT, N >= 1, COUNT >= 1 (default 1). */
static int parse_fault(const char *v, pp_config_t *c) {
  const char *colon = strchr(v, ':');
  if (colon == NULL)
    return -1;
  int site = 0;
  for (int i = 1; i < PP_FAULT_SITES; i++)
    if (strlen(fault_sites[i]) == (size_t)(colon - v) &&
        strncmp(v, fault_sites[i], (size_t)(colon - v)) == 0)
      site = i;
  if (site == 0 || !isdigit((unsigned char)colon[1]))
    return -1;
  char *end;
  errno = 0;
  unsigned long long n = strtoull(colon + 1, &end, 10), count = 1;
  if (errno == ERANGE || n == 0)
    return -1;
  if (*end == ':') {
    if (!isdigit((unsigned char)end[1]))
      return -1;
    count = strtoull(end + 1, &end, 10);
    if (errno == ERANGE || count == 0)
      return -1;
  }
  if (*end != '\0')
    return -1;
  c->fault_site = site;
  c->fault_n = n;
  c->fault_count = count;
  return 0;
}
#define NKEYS (sizeof keys / sizeof keys[0])

static void config_defaults(pp_config_t *c) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  memset(c, 0, sizeof *c);
  c->backend = PP_BACKEND_AUTO;
  c->mlock = PP_MLOCK_OFF;
  c->populate = true;
  c->populate_threads = ncpu < 1 ? 1u : ncpu > 8 ? 8u : (unsigned)ncpu;
  c->populate_parallel_min = (uint64_t)64 << 20;
  c->tcache_bytes = (uint64_t)64 << 20;
  c->shards = 4;
  c->events = PP_EVENTS_NONE;
  c->page_move = PP_PMOVE_DEFAULT;
  c->poll_us = 100;
  c->sim_delay_us = 100;
  c->cuda_flags = PP_CUDA_PORTABLE;
  c->register_threads = c->populate_threads;
  c->register_max = (uint64_t)64 << 30; /* docs/cuda.md, "Large segments" */
  c->device = -1;
  c->numa_node = -1;
}

/* The machine's physical memory in bytes (UINT64_MAX if unknown): the
 * bound of grow_ahead. */
static uint64_t phys_bytes(void) {
  long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || psz <= 0)
    return UINT64_MAX;
  return pp_sat_mul((uint64_t)pages, (uint64_t)psz);
}

/* Sizes: digits, then optional B, K/KiB, M/MiB, G/GiB, T/TiB (1024-based)
 * or KB/MB/GB/TB (1000-based). Overflow is an error. */
static int parse_size(const char *v, uint64_t *out) {
  if (!isdigit((unsigned char)v[0]))
    return -1;
  errno = 0;
  char *end;
  unsigned long long n = strtoull(v, &end, 10);
  if (errno == ERANGE)
    return -1;
  static const struct {
    const char *suffix;
    unsigned long long mult;
  } units[] = {
      {"", 1ull},
      {"B", 1ull},
      {"K", 1ull << 10},
      {"KiB", 1ull << 10},
      {"M", 1ull << 20},
      {"MiB", 1ull << 20},
      {"G", 1ull << 30},
      {"GiB", 1ull << 30},
      {"T", 1ull << 40},
      {"TiB", 1ull << 40},
      {"KB", 1000ull},
      {"MB", 1000000ull},
      {"GB", 1000000000ull},
      {"TB", 1000000000000ull},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcmp(end, units[i].suffix) == 0) {
      if (n > ULLONG_MAX / units[i].mult)
        return -1;
      *out = n * units[i].mult;
      return 0;
    }
  }
  return -1;
}

static int parse_bool(const char *v, bool *out) {
  static const char *yes[] = {"1", "true", "yes", "on"};
  static const char *no[] = {"0", "false", "no", "off"};
  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp(v, yes[i]) == 0) {
      *out = true;
      return 0;
    }
    if (strcasecmp(v, no[i]) == 0) {
      *out = false;
      return 0;
    }
  }
  return -1;
}

static int parse_int(const char *v, long long lo, long long hi,
                     long long *out) {
  if (!isdigit((unsigned char)v[0]) &&
      !(v[0] == '-' && isdigit((unsigned char)v[1])))
    return -1;
  errno = 0;
  char *end;
  long long n = strtoll(v, &end, 10);
  if (errno == ERANGE || *end != '\0' || n < lo || n > hi)
    return -1;
  *out = n;
  return 0;
}

/* "portable+devicemap+writecombined", any subset, or "0" / "none". */
static int parse_cuda_flags(const char *v, unsigned *out) {
  if (strcmp(v, "0") == 0 || strcmp(v, "none") == 0) {
    *out = 0;
    return 0;
  }
  unsigned f = 0;
  const char *p = v;
  while (*p != '\0') {
    size_t n = strcspn(p, "+");
    if (n == 8 && strncmp(p, "portable", n) == 0)
      f |= PP_CUDA_PORTABLE;
    else if (n == 9 && strncmp(p, "devicemap", n) == 0)
      f |= PP_CUDA_DEVICEMAP;
    else if (n == 13 && strncmp(p, "writecombined", n) == 0)
      f |= PP_CUDA_WRITECOMBINED;
    else
      return -1;
    p += n;
    if (*p == '+' && *++p == '\0')
      return -1;
  }
  *out = f;
  return 0;
}

/* Trim leading and trailing blanks in place; returns the new start. */
static char *trim(char *s) {
  while (isspace((unsigned char)*s))
    s++;
  size_t n = strlen(s);
  while (n > 0 && isspace((unsigned char)s[n - 1]))
    s[--n] = '\0';
  return s;
}

/* A value that names one of n choices: its value (values[i], or i when
 * values is NULL) into field, or the error that lists them (`expected`). */
static int parse_choice(const char *v, const char *key,
                        const char *const *names, const int *values, int n,
                        const char *expected, void *field) {
  for (int i = 0; i < n; i++)
    if (strcmp(v, names[i]) == 0) {
      int x = values != NULL ? values[i] : i;
      memcpy(field, &x, sizeof x);
      return 0;
    }
  return pp_fail(PINPOOL_ECONFIG,
                 "config: bad value '%s' for key '%s' (expected %s)", v, key,
                 expected);
}

static int apply(const key_desc_t *k, const char *v, bool user_backend,
                 bool user_events, pp_config_t *c) {
  char *field = (char *)c + k->offset;
  bool b;
  switch (k->kind) {
  case K_SIZE: {
    uint64_t n;
    if (parse_size(v, &n) != 0)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key '%s' (expected a size "
                     "such as 4096, 64MiB, 8GiB)",
                     v, k->name);
    memcpy(field, &n, sizeof n);
    return 0;
  }
  case K_BOOL:
    if (parse_bool(v, &b) != 0)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key '%s' (expected 0 or 1)", v,
                     k->name);
    memcpy(field, &b, sizeof b);
    return 0;
  case K_UINT:
  case K_INT: {
    long long n;
    if (parse_int(v, k->lo, k->hi, &n) != 0 ||
        (k->kind == K_UINT && v[0] == '-'))
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key '%s' (expected an "
                     "integer in %lld..%lld)",
                     v, k->name, k->lo, k->hi);
    if (k->kind == K_UINT) {
      unsigned u = (unsigned)n;
      memcpy(field, &u, sizeof u);
    } else {
      int i = (int)n;
      memcpy(field, &i, sizeof i);
    }
    return 0;
  }
  case K_EVENTS: {
    static const char *const names[] = {"none", "simulated", "cuda"};
    if (user_events)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: key 'events' cannot be used with an event "
                     "provider given to pinpool_create_ex");
    return parse_choice(v, "events", names, NULL, 3, "none, simulated or cuda",
                        field);
  }
  case K_FAULT:
    if (parse_fault(v, c) != 0)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key 'fault' (expected "
                     "SITE:N[:COUNT], SITE one of alloc, populate, mlock, "
                     "record, query)",
                     v);
    return 0;
  case K_CUDA_FLAGS: {
    unsigned f;
    if (parse_cuda_flags(v, &f) != 0)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key 'cuda_flags' (expected "
                     "portable, devicemap, writecombined joined by '+', or "
                     "none)",
                     v);
    memcpy(field, &f, sizeof f);
    return 0;
  }
  case K_MLOCK: {
    int m;
    if (strcasecmp(v, "require") == 0)
      m = PP_MLOCK_REQUIRE;
    else if (parse_bool(v, &b) == 0)
      m = b ? PP_MLOCK_TRY : PP_MLOCK_OFF;
    else
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key 'mlock' (expected 0, 1 "
                     "or require)",
                     v);
    memcpy(field, &m, sizeof m);
    c->mlock_set = true;
    return 0;
  }
  case K_GROW: {
    /* A size (0: off), off, or auto (growahead.c). */
    uint64_t n = 0;
    bool aut = strcasecmp(v, "auto") == 0;
    if (!aut && strcasecmp(v, "off") != 0 && parse_size(v, &n) != 0)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: bad value '%s' for key 'grow_ahead' (expected "
                     "a size such as 256MiB, auto, or 0 or off)",
                     v);
    memcpy(field, &n, sizeof n);
    c->grow_ahead_auto = aut;
    return 0;
  }
  case K_PMOVE: {
    static const char *const names[] = {"0", "1", "auto"};
    static const int values[] = {PP_PMOVE_OFF, PP_PMOVE_ON, PP_PMOVE_AUTO};
    return parse_choice(v, "page_move", names, values, 3, "0, 1 or auto",
                        field);
  }
  case K_NUMA: {
    static const char *const names[] = {"off", "local"};
    static const int values[] = {PP_NUMA_OFF, PP_NUMA_LOCAL};
    return parse_choice(v, "numa", names, values, 2, "off or local", field);
  }
  case K_PIN: {
    static const char *const names[] = {"error", "pageable"};
    static const int values[] = {PP_PIN_ERROR, PP_PIN_PAGEABLE};
    return parse_choice(v, "pin_failure", names, values, 2, "error or pageable",
                        field);
  }
  case K_BACKEND: {
    static const char *const names[] = {"auto", "host", "malloc", "cuda",
                                        "cuda-register"};
    static const int values[] = {PP_BACKEND_AUTO, PP_BACKEND_HOST,
                                 PP_BACKEND_MALLOC, PP_BACKEND_CUDA,
                                 PP_BACKEND_CUDA_REGISTER};
    if (user_backend)
      return pp_fail(PINPOOL_ECONFIG,
                     "config: key 'backend' cannot be used with "
                     "pinpool_create_with_backend");
    return parse_choice(v, "backend", names, values, 5,
                        "auto, host, malloc, cuda or cuda-register", field);
  }
  }
  return pp_fail(PINPOOL_ECONFIG, "config: internal error on key '%s'",
                 k->name);
}

int pp_config_parse(const char *text, bool user_backend, bool user_events,
                    pp_config_t *out) {
  pp_config_t c;
  config_defaults(&c);
  if (user_backend)
    c.backend = PP_BACKEND_USER;
  if (user_events)
    c.events = PP_EVENTS_USER;
  if (text == NULL)
    text = "";
  char *copy = strdup(text);
  if (copy == NULL)
    return pp_fail(PINPOOL_ENOMEM, "config: out of memory");
  bool seen[NKEYS] = {false};
  int rc = 0;
  char *save = NULL;
  for (char *item = strtok_r(copy, ",", &save); item != NULL && rc == 0;
       item = strtok_r(NULL, ",", &save)) {
    char *it = trim(item);
    if (*it == '\0')
      continue; /* empty items (",,", trailing comma) are ignored */
    char *eq = strchr(it, '=');
    if (eq == NULL) {
      rc = pp_fail(PINPOOL_ECONFIG, "config: item '%s' is not key=value", it);
      break;
    }
    *eq = '\0';
    char *key = trim(it), *val = trim(eq + 1);
    size_t i = 0;
    while (i < NKEYS && strcmp(keys[i].name, key) != 0)
      i++;
    if (i == NKEYS) {
      rc = removed_key(key)
               ? pp_fail(PINPOOL_ECONFIG,
                         "config: key '%s' was removed: large blocks "
                         "are carved from arenas, which neither remap nor "
                         "borrow (docs/configuration.md, \"Removed keys\")",
                         key)
               : pp_fail(PINPOOL_ECONFIG, "config: unknown key '%s'", key);
    } else if (seen[i]) {
      rc = pp_fail(PINPOOL_ECONFIG, "config: key '%s' given twice", key);
    } else if (*val == '\0') {
      rc = pp_fail(PINPOOL_ECONFIG, "config: key '%s' has no value", key);
    } else {
      seen[i] = true;
      rc = apply(&keys[i], val, user_backend, user_events, &c);
    }
  }
  free(copy);
  if (rc != 0)
    return rc;
  bool seen_numa_spill = false;
  for (size_t i = 0; i < NKEYS; i++)
    if (seen[i] && strcmp(keys[i].name, "numa_spill") == 0)
      seen_numa_spill = true;
  if (c.max_reserved != 0 && c.reserve > c.max_reserved)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: key 'reserve' (%llu) exceeds 'max_reserved' "
                   "(%llu)",
                   (unsigned long long)c.reserve,
                   (unsigned long long)c.max_reserved);
  if (c.reserve > PP_MAX_REQUEST)
    return pp_fail(PINPOOL_ECONFIG, "config: key 'reserve' is too large");
  /* A headroom the caps would never allow is a mistake, not a wish: the
   * grower stops at the caps (growahead.c). */
  bool over_reserved = c.max_reserved != 0 && c.grow_ahead > c.max_reserved;
  if (over_reserved || (c.max_cached != 0 && c.grow_ahead > c.max_cached))
    return pp_fail(
        PINPOOL_ECONFIG, "config: key 'grow_ahead' (%llu) exceeds '%s' (%llu)",
        (unsigned long long)c.grow_ahead,
        over_reserved ? "max_reserved" : "max_cached",
        (unsigned long long)(over_reserved ? c.max_reserved : c.max_cached));
  /* Nor one larger than the machine's memory: no backend can pin more,
   * and the grower would ask for it again at every growth of demand
   * (issue 37, third review, item 1: grow_ahead=2^64-1 was accepted). */
  uint64_t phys = phys_bytes();
  if (c.grow_ahead > phys)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: key 'grow_ahead' (%llu) exceeds this machine's "
                   "physical memory (%llu bytes)",
                   (unsigned long long)c.grow_ahead, (unsigned long long)phys);
  if (c.numa == PP_NUMA_LOCAL && c.numa_node >= 0)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: keys 'numa=local' and 'numa_node' exclude each "
                   "other (numa=local places each node's memory on that "
                   "node; numa_node places all of it on one)");
  /* backend=auto becomes host or cuda-register: both can do what the
   * checks below ask of the backend. */
  if (c.numa == PP_NUMA_LOCAL && c.backend != PP_BACKEND_HOST &&
      c.backend != PP_BACKEND_CUDA_REGISTER && c.backend != PP_BACKEND_AUTO)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: key 'numa': numa=local requires backend=host or "
                   "cuda-register (memory bound to a node before its first "
                   "touch; %s)",
                   c.backend == PP_BACKEND_CUDA
                       ? "cuMemHostAlloc cannot place memory"
                       : "this backend cannot place memory");
  if (c.numa != PP_NUMA_LOCAL && (seen_numa_spill || c.numa_fake_nodes != 0))
    return pp_fail(PINPOOL_ECONFIG, "config: key '%s' requires numa=local",
                   c.numa_fake_nodes != 0 ? "numa_fake_nodes" : "numa_spill");
  /* Shared pools (docs/sharing.md): chunks are memfds the pool maps and
   * pins itself, so a backend that allocates its own memory cannot be one. */
  if (c.shared && c.backend != PP_BACKEND_HOST &&
      c.backend != PP_BACKEND_CUDA_REGISTER && c.backend != PP_BACKEND_AUTO)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: key 'shared': needs backend=host or "
                   "backend=cuda-register (the backend is %s)",
                   c.backend == PP_BACKEND_CUDA     ? "cuda"
                   : c.backend == PP_BACKEND_MALLOC ? "malloc"
                                                    : "a user backend");
  if (c.shared && c.numa == PP_NUMA_LOCAL)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: keys 'shared' and 'numa=local' are not supported "
                   "together (a shared pool's chunks are memfds; the "
                   "per-node placement binds anonymous memory)");
  /* Pieces are cut at the segment's page size (2 MiB with hugepages). */
  uint64_t piece_unit = c.hugepages ? (uint64_t)2 << 20 : PP_PAGE;
  if (c.register_max < piece_unit || c.register_max % piece_unit != 0)
    return pp_fail(PINPOOL_ECONFIG,
                   "config: bad value %llu for key 'register_max' (expected "
                   "a multiple of %llu bytes%s, at least one)",
                   (unsigned long long)c.register_max,
                   (unsigned long long)piece_unit,
                   c.hugepages ? ", the huge page size" : "");
  *out = c;
  return 0;
}

/* ---- backend=auto ---------------------------------------------------------
 * The default. A CUDA driver that loads and has a device: cuda-register
 * (the driver pins; device=-1 takes the context current at create, else
 * device 0's primary context). Otherwise host, locked with mlock when
 * RLIMIT_MEMLOCK allows the pool; otherwise host unlocked, with the
 * warning (pp_pin_warn).
 *
 * "Allows" is decided once, at create, for the whole life of a pool that
 * grows: mlock is unbounded for this process (CAP_IPC_LOCK, or an
 * unlimited RLIMIT_MEMLOCK), or max_reserved caps the pool at or below
 * what may still be locked (the limit less the process's locked bytes,
 * VmLck). A pool with no such cap under a finite limit would lock its
 * first chunks and then, silently chunk by chunk, stop: half-pinned
 * memory whose blocks behave differently. It is unlocked from the start
 * instead, and says so. A chunk whose mlock fails anyway (other pools or
 * code of the process locked memory since) is kept pageable, as mlock=1
 * does (counted in mlock_failures), and warned about too. */

static _Atomic(int) pin_warned_process; /* the process's one on_error call */
static pthread_once_t pin_atfork_once = PTHREAD_ONCE_INIT;

/* A child of fork is a process of its own: its one call is still to come
 * (the slot it inherited was its parent's). */
static void pin_warn_fork_child(void) {
  atomic_store_explicit(&pin_warned_process, 0, memory_order_relaxed);
}

static void pin_warn_atfork(void) {
  (void)pthread_atfork(NULL, NULL, pin_warn_fork_child);
}

void pp_pin_warn(const pp_config_t *cfg, const char *fmt, ...) {
  if (cfg->pinwarn == NULL || cfg->backend_auto == PINPOOL_AUTO_NONE)
    return;
  pp_pinwarn_t *w = cfg->pinwarn;
  pp_fetch_add_relaxed(&w->warnings, 1);
  /* Registered before the slot can be used: a fork after it resets it. */
  (void)pthread_once(&pin_atfork_once, pin_warn_atfork);
  /* The process's one call goes to the first pool that can receive it: a
   * pool without on_error counts the warning (pin_warnings) but leaves the
   * slot to a later pool that has a callback. */
  if (w->on_error == NULL || atomic_exchange(&pin_warned_process, 1) != 0)
    return;
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  (void)vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  unsigned co = pp_callout_enter(PP_CO_ON_ERROR);
  w->on_error(w->error_arg, PINPOOL_ELIMIT, msg, NULL);
  pp_callout_leave(co);
}

/* A number from /proc/self/status's line `key` ("VmLck:\t  12 kB" in kB,
 * "CapEff:\t0000..." in hex); false if absent. */
static bool proc_status(const char *key, int base, unsigned long long *out) {
  FILE *f = fopen("/proc/self/status", "re");
  if (f == NULL)
    return false;
  char line[256];
  size_t klen = strlen(key);
  bool found = false;
  while (!found && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, key, klen) == 0 && line[klen] == ':') {
      errno = 0;
      *out = strtoull(line + klen + 1, NULL, base);
      found = errno == 0;
    }
  (void)fclose(f);
  return found;
}

/* mlock without limit: CAP_IPC_LOCK in the effective set, asked of the
 * kernel (capget): /proc may not be mounted (a container, a chroot), and
 * reading it there took root for a process without the capability. */
static bool can_lock_unbounded(void) {
  struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
  memset(d, 0, sizeof d);
  if (syscall(SYS_capget, &h, d) == 0)
    return (d[CAP_TO_INDEX(CAP_IPC_LOCK)].effective &
            CAP_TO_MASK(CAP_IPC_LOCK)) != 0;
  unsigned long long caps = 0;
  return proc_status("CapEff", 16, &caps) &&
         (caps & (1ull << CAP_IPC_LOCK)) != 0;
}

void pp_config_auto(pp_config_t *cfg, pp_cuda_t **cuda) {
  *cuda = NULL;
  if (cfg->backend != PP_BACKEND_AUTO)
    return;
  char saved[256];
  pp_error_save(saved, sizeof saved); /* the probes' failures are not news */
  pp_config_t probe = *cfg;
  probe.backend = PP_BACKEND_CUDA_REGISTER;
  int rc = pp_cuda_open(&probe, cuda);
  if (rc != 0 && cfg->device < 0) {
    /* No current context (a process that has not touched CUDA yet): the
     * primary context of device 0, the one the runtime API would make. */
    probe.device = 0;
    rc = pp_cuda_open(&probe, cuda);
  }
  if (rc == 0) {
    cfg->backend = PP_BACKEND_CUDA_REGISTER;
    cfg->device = probe.device;
    cfg->backend_auto = PINPOOL_AUTO_CUDA_REGISTER;
    pp_error_restore(saved);
    return;
  }
  *cuda = NULL;
  char why[256];
  pp_error_save(why, sizeof why);
  pp_error_restore(saved);
  cfg->backend = PP_BACKEND_HOST;
  if (cfg->mlock_set) {
    /* mlock was named: obeyed as with backend=host (mlock=0 is a choice,
     * not a failure: no warning). */
    cfg->backend_auto = cfg->mlock == PP_MLOCK_OFF ? PINPOOL_AUTO_HOST_UNLOCKED
                                                   : PINPOOL_AUTO_HOST_LOCKED;
    return;
  }
  struct rlimit rl = {0, 0};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    /* Any process may raise its soft limit to the hard one. */
    struct rlimit up = {rl.rlim_max, rl.rlim_max};
    if (setrlimit(RLIMIT_MEMLOCK, &up) == 0)
      rl = up;
  }
  unsigned long long locked_kb = 0;
  (void)proc_status("VmLck", 10, &locked_kb);
  uint64_t locked = (uint64_t)locked_kb << 10;
  bool unbounded = rl.rlim_cur == RLIM_INFINITY || can_lock_unbounded();
  uint64_t room =
      unbounded || rl.rlim_cur <= locked ? 0 : (uint64_t)rl.rlim_cur - locked;
  if (unbounded || (cfg->max_reserved != 0 && cfg->max_reserved <= room)) {
    cfg->mlock = PP_MLOCK_TRY;
    cfg->backend_auto = PINPOOL_AUTO_HOST_LOCKED;
    return;
  }
  cfg->mlock = PP_MLOCK_OFF;
  cfg->backend_auto = PINPOOL_AUTO_HOST_UNLOCKED;
  pp_pin_warn(
      cfg,
      "pinpool: backend=auto: this pool's memory is NOT page-locked "
      "(pageable: device copies from it are synchronous and slower). No "
      "CUDA (%s); and RLIMIT_MEMLOCK is %llu bytes (%llu locked already) "
      "while the pool may grow beyond it. Fix: raise the limit (`ulimit -l "
      "unlimited` in the shell; LimitMEMLOCK=infinity in a systemd unit; "
      "`docker run --ulimit memlock=-1`), or cap the pool with "
      "max_reserved at most the limit, or name backend=host to choose "
      "pageable memory without this warning (docs/configuration.md, "
      "\"backend=auto\").",
      why, (unsigned long long)rl.rlim_cur, (unsigned long long)locked);
}

static void format_cuda_flags(unsigned f, char *buf, size_t len) {
  if (f == 0) {
    (void)snprintf(buf, len, "none");
    return;
  }
  (void)snprintf(
      buf, len, "%s%s%s%s%s", (f & PP_CUDA_PORTABLE) ? "portable" : "",
      (f & PP_CUDA_PORTABLE) && (f & ~PP_CUDA_PORTABLE) ? "+" : "",
      (f & PP_CUDA_DEVICEMAP) ? "devicemap" : "",
      (f & PP_CUDA_DEVICEMAP) && (f & PP_CUDA_WRITECOMBINED) ? "+" : "",
      (f & PP_CUDA_WRITECOMBINED) ? "writecombined" : "");
}

size_t pp_config_format(const pp_config_t *c, const char *backend_name,
                        char *buf, size_t len) {
  static const char *mlock_names[] = {"0", "1", "require"};
  static const char *event_names[] = {"none", "simulated", "cuda", NULL};
  char flags[48];
  format_cuda_flags(c->cuda_flags, flags, sizeof flags);
  /* A user backend (or event provider) has no name pinpool_create would
   * accept: leave it out so the string can be fed back. */
  const char *ev = c->events < 3 ? event_names[c->events] : NULL;
  /* numa=local's keys only when it is on: the string of a pool without it
   * is unchanged. */
  char numa[80] = "";
  if (c->numa == PP_NUMA_LOCAL && c->numa_fake_nodes != 0)
    (void)snprintf(numa, sizeof numa,
                   ",numa=local,numa_spill=%d,numa_fake_nodes=%u",
                   c->numa_spill ? 1 : 0, c->numa_fake_nodes);
  else if (c->numa == PP_NUMA_LOCAL)
    (void)snprintf(numa, sizeof numa, ",numa=local,numa_spill=%d",
                   c->numa_spill ? 1 : 0);
  /* snprintf(NULL, 0, ...) is defined (C11 7.21.6.5): the length only. */
  int n = snprintf(
      // cppcheck-suppress ctunullpointer
      buf, len,
      "%s%s%smax_cached=%llu,max_cached_pct=%u,max_reserved=%llu,"
      "reserve=%llu,mlock=%s,pin_failure=%s,"
      "hugepages=%d,populate=%d,populate_threads=%u,populate_parallel_min=%"
      "llu,tcache_bytes=%llu,shards=%u%s%s,background=%d,poll_us=%u,"
      "sim_delay_us=%u,cuda_flags=%s,register_threads=%u,register_max=%llu,"
      "device=%d,numa_node=%d%s%s",
      backend_name ? "backend=" : "", backend_name ? backend_name : "",
      backend_name ? "," : "", (unsigned long long)c->max_cached,
      c->max_cached_pct, (unsigned long long)c->max_reserved,
      (unsigned long long)c->reserve, mlock_names[c->mlock],
      c->pin_failure == PP_PIN_PAGEABLE ? "pageable" : "error",
      c->hugepages ? 1 : 0, c->populate ? 1 : 0, c->populate_threads,
      (unsigned long long)c->populate_parallel_min,
      (unsigned long long)c->tcache_bytes, c->shards, ev ? ",events=" : "",
      ev ? ev : "", c->background ? 1 : 0, c->poll_us, c->sim_delay_us, flags,
      c->register_threads, (unsigned long long)c->register_max, c->device,
      c->numa_node, numa, c->shared ? ",shared=1" : "");
  if (n >= 0 && c->fault_site != PP_FAULT_NONE) {
    size_t used = (size_t)n;
    int m = snprintf(used < len ? buf + used : NULL,
                     used < len ? len - used : 0, ",fault=%s:%llu:%llu",
                     fault_sites[c->fault_site], (unsigned long long)c->fault_n,
                     (unsigned long long)c->fault_count);
    n = m < 0 ? m : n + m;
  }
  /* page_move only when not the default: the string of a pool without it
   * is unchanged. */
  if (n >= 0 && c->page_move != PP_PMOVE_DEFAULT) {
    static const char *const pm[] = {"0", "1", "auto"};
    size_t used = (size_t)n;
    int m =
        snprintf(used < len ? buf + used : NULL, used < len ? len - used : 0,
                 ",page_move=%s", pm[c->page_move]);
    n = m < 0 ? m : n + m;
  }
  /* grow_ahead only when set: the string of a pool without it is
   * unchanged. */
  if (n >= 0 && (c->grow_ahead != 0 || c->grow_ahead_auto)) {
    size_t used = (size_t)n;
    int m = c->grow_ahead_auto
                ? snprintf(used < len ? buf + used : NULL,
                           used < len ? len - used : 0, ",grow_ahead=auto")
                : snprintf(used < len ? buf + used : NULL,
                           used < len ? len - used : 0, ",grow_ahead=%llu",
                           (unsigned long long)c->grow_ahead);
    n = m < 0 ? m : n + m;
  }
  return n < 0 ? 0 : (size_t)n;
}
