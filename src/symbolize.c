/*
 * Names for return addresses, used only when a snapshot is written
 * (capturing a stack stores addresses alone: that is what keeps history
 * cheap).
 *
 * libdw (elfutils) reads the symbol table, static functions included, and
 * the DWARF line table where debug information exists. It is loaded with
 * dlopen, as the CUDA driver is: the library keeps no link dependency
 * beyond libc, and a process without libdw still gets names from dladdr
 * (exported symbols only). Building needs libdw's header only for its
 * types; without the header the dladdr path alone is compiled.
 */
#include "internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<elfutils/libdwfl.h>)
#include <elfutils/libdwfl.h>
#define HAVE_DWFL 1
#endif
#endif

struct pp_symbolizer {
#ifdef HAVE_DWFL
  void *lib;
  Dwfl *dwfl;
  Dwfl_Callbacks cb;
  __typeof__(dwfl_end) *end;
  __typeof__(dwfl_addrmodule) *addrmodule;
  __typeof__(dwfl_module_addrinfo) *addrinfo;
  __typeof__(dwfl_module_getsrc) *getsrc;
  __typeof__(dwfl_lineinfo) *lineinfo;
  __typeof__(dwfl_module_info) *modinfo;
#endif
  int unused; /* keeps the struct non-empty without libdw */
};

#ifdef HAVE_DWFL
static bool dwfl_open(pp_symbolizer_t *s) {
  const char *env = getenv("PINPOOL_LIBDW");
  if (env != NULL && env[0] == '\0')
    return false; /* PINPOOL_LIBDW= : dladdr only (tests) */
  s->lib = dlopen(env != NULL ? env : "libdw.so.1", RTLD_NOW | RTLD_LOCAL);
  if (s->lib == NULL)
    return false;
  __typeof__(dwfl_begin) *begin =
      (__typeof__(dwfl_begin) *)dlsym(s->lib, "dwfl_begin");
  __typeof__(dwfl_linux_proc_report) *report =
      (__typeof__(dwfl_linux_proc_report) *)dlsym(s->lib,
                                                  "dwfl_linux_proc_report");
  __typeof__(dwfl_report_end) *report_end =
      (__typeof__(dwfl_report_end) *)dlsym(s->lib, "dwfl_report_end");
  s->end = (__typeof__(dwfl_end) *)dlsym(s->lib, "dwfl_end");
  s->addrmodule =
      (__typeof__(dwfl_addrmodule) *)dlsym(s->lib, "dwfl_addrmodule");
  s->addrinfo =
      (__typeof__(dwfl_module_addrinfo) *)dlsym(s->lib, "dwfl_module_addrinfo");
  s->getsrc =
      (__typeof__(dwfl_module_getsrc) *)dlsym(s->lib, "dwfl_module_getsrc");
  s->lineinfo = (__typeof__(dwfl_lineinfo) *)dlsym(s->lib, "dwfl_lineinfo");
  s->modinfo =
      (__typeof__(dwfl_module_info) *)dlsym(s->lib, "dwfl_module_info");
  s->cb.find_elf = (__typeof__(dwfl_linux_proc_find_elf) *)dlsym(
      s->lib, "dwfl_linux_proc_find_elf");
  s->cb.find_debuginfo = (__typeof__(dwfl_standard_find_debuginfo) *)dlsym(
      s->lib, "dwfl_standard_find_debuginfo");
  if (begin == NULL || report == NULL || report_end == NULL || s->end == NULL ||
      s->addrmodule == NULL || s->addrinfo == NULL || s->getsrc == NULL ||
      s->lineinfo == NULL || s->modinfo == NULL || s->cb.find_elf == NULL ||
      s->cb.find_debuginfo == NULL)
    goto fail;
  s->dwfl = begin(&s->cb);
  if (s->dwfl == NULL)
    goto fail;
  if (report(s->dwfl, getpid()) != 0 || report_end(s->dwfl, NULL, NULL) != 0) {
    s->end(s->dwfl);
    s->dwfl = NULL;
    goto fail;
  }
  return true;
fail:
  dlclose(s->lib);
  s->lib = NULL;
  return false;
}
#endif

pp_symbolizer_t *pp_symbolizer_open(void) {
  pp_symbolizer_t *s = calloc(1, sizeof *s);
  if (s == NULL)
    return NULL;
#ifdef HAVE_DWFL
  (void)dwfl_open(s);
#endif
  return s;
}

void pp_symbolizer_close(pp_symbolizer_t *s) {
  if (s == NULL)
    return;
#ifdef HAVE_DWFL
  if (s->dwfl != NULL)
    s->end(s->dwfl);
  if (s->lib != NULL)
    dlclose(s->lib);
#endif
  free(s);
}

void pp_symbolize(pp_symbolizer_t *s, uintptr_t addr, pp_symbol_t *out) {
  *out = (pp_symbol_t){NULL, NULL, NULL, 0, -1};
  /* A return address points after the call, possibly into the next
   * function or line: look up the call instruction's last byte. */
  uintptr_t pc = addr > 0 ? addr - 1 : addr;
#ifdef HAVE_DWFL
  if (s->dwfl != NULL) {
    Dwfl_Module *m = s->addrmodule(s->dwfl, pc);
    if (m != NULL) {
      GElf_Off off = 0;
      GElf_Sym sym;
      const char *name = s->addrinfo(m, pc, &off, &sym, NULL, NULL, NULL);
      if (name != NULL) {
        out->function = name;
        out->offset = (uint64_t)off + (addr - pc);
      }
      out->module = s->modinfo(m, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
      Dwfl_Line *line = s->getsrc(m, pc);
      int lineno = 0;
      const char *file =
          line != NULL ? s->lineinfo(line, NULL, &lineno, NULL, NULL, NULL)
                       : NULL;
      if (file != NULL) {
        out->file = file;
        out->line = lineno;
      }
      if (out->function != NULL)
        return;
    }
  }
#endif
  Dl_info info;
  if (dladdr((void *)pc, &info) != 0) {
    if (out->module == NULL)
      out->module = info.dli_fname;
    if (info.dli_sname != NULL) {
      out->function = info.dli_sname;
      out->offset = (uint64_t)(addr - (uintptr_t)info.dli_saddr);
    } else if (out->module != NULL) {
      out->offset = (uint64_t)(addr - (uintptr_t)info.dli_fbase);
    }
  }
}
