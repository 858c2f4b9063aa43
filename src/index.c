/*
 * The hash index with a doubling in pieces (index.h has the design).
 */
#include "index.h"

#include <stdlib.h>

enum { MOVED = 1 }; /* an old slot's key once its entry moved (val 0) */

static size_t home(uint64_t key, size_t cap) {
  /* Fibonacci hashing: the product's top bits mix every bit of the key
   * (blocks are aligned: the low bits alone would cluster; generations
   * and ids are consecutive). */
  return (size_t)((key * 0x9e3779b97f4a7c15u) >>
                  (64 - __builtin_ctzll((unsigned long long)cap)));
}

static void visit(pp_index_t *ix, uint64_t n) {
  if (ix->meter != NULL)
    pp_lock_visit(ix->meter, n);
}

/* The slot of key in t (cap slots), or the empty one where it would go;
 * *probes counts. Old slots: a moved one is passed, as if full. */
static size_t slot_in(const pp_islot_t *t, size_t cap, uint64_t key,
                      uint64_t *probes) {
  size_t mask = cap - 1, j = home(key, cap);
  (*probes)++;
  while (!(t[j].val != 0 && t[j].key == key) &&
         !(t[j].val == 0 && t[j].key != MOVED)) {
    j = (j + 1) & mask;
    (*probes)++;
  }
  return j;
}

void pp_index_init(pp_index_t *ix, pp_mutex_t *meter) {
  *ix = (pp_index_t){NULL, 0, 0, NULL, 0, 0, meter};
}

void pp_index_fini(pp_index_t *ix) {
  free(ix->t);
  free(ix->old);
  pp_index_init(ix, ix->meter);
}

/* Move up to k old slots into the new ones; the old go when all have. */
static void migrate(pp_index_t *ix, size_t k) {
  if (ix->old == NULL)
    return;
  size_t end = ix->ocap - ix->mig > k ? ix->mig + k : ix->ocap;
  uint64_t probes = end - ix->mig;
  for (size_t i = ix->mig; i < end; i++) {
    pp_islot_t *o = &ix->old[i];
    if (o->val == 0)
      continue;
    size_t j = slot_in(ix->t, ix->cap, o->key, &probes);
    ix->t[j] = *o;
    *o = (pp_islot_t){MOVED, 0};
  }
  ix->mig = end;
  visit(ix, probes);
  if (ix->mig == ix->ocap) {
    free(ix->old);
    ix->old = NULL;
    ix->ocap = ix->mig = 0;
  }
}

bool pp_index_reserve(pp_index_t *ix, size_t more) {
  migrate(ix, PP_INDEX_STEP);
  size_t need = ix->n + more;
  if (2 * need <= ix->cap)
    return true;
  size_t cap = ix->cap == 0 ? 16 : 2 * ix->cap;
  while (cap < 2 * need)
    cap *= 2;
  pp_islot_t *t = calloc(cap, sizeof *t);
  if (t == NULL)
    return false;
  /* A doubling starts when the last has ended (see index.h: it ends
   * within cap / PP_INDEX_STEP changes, before n can double); should one
   * not have, the rest moves here. */
  migrate(ix, SIZE_MAX);
  ix->old = ix->t;
  ix->ocap = ix->cap;
  ix->mig = 0;
  ix->t = t;
  ix->cap = cap;
  if (ix->old == NULL)
    ix->ocap = 0;
#ifdef PINPOOL_MUTANT_INDEX_ONE_HOLD
  /* Mutant (docs/verification.md): the whole index in this hold. */
  migrate(ix, SIZE_MAX);
#endif
  return true;
}

uint64_t pp_index_get(pp_index_t *ix, uint64_t key) {
  if (ix->cap == 0)
    return 0;
  uint64_t probes = 0;
  size_t j = slot_in(ix->t, ix->cap, key, &probes);
  uint64_t v = ix->t[j].val;
  if (v == 0 && ix->old != NULL) {
    j = slot_in(ix->old, ix->ocap, key, &probes);
    v = ix->old[j].val;
  }
  visit(ix, probes);
  return v;
}

void pp_index_put(pp_index_t *ix, uint64_t key, uint64_t val) {
  pp_assert(val != 0 && 2 * (ix->n + 1) <= ix->cap);
  migrate(ix, PP_INDEX_STEP);
  uint64_t probes = 0;
  size_t j = slot_in(ix->t, ix->cap, key, &probes);
  pp_assert(ix->t[j].val == 0);
  ix->t[j] = (pp_islot_t){key, val};
  ix->n++;
  visit(ix, probes);
}

/* The slot holding key (present): in the new slots, or (*in_old) the
 * old. */
static pp_islot_t *find(pp_index_t *ix, uint64_t key, bool *in_old) {
  uint64_t probes = 0;
  size_t j = slot_in(ix->t, ix->cap, key, &probes);
  pp_islot_t *s = &ix->t[j];
  *in_old = s->val == 0 && ix->old != NULL;
  if (*in_old)
    s = &ix->old[slot_in(ix->old, ix->ocap, key, &probes)];
  visit(ix, probes);
  pp_assert(s->val != 0);
  return s;
}

void pp_index_set(pp_index_t *ix, uint64_t key, uint64_t val) {
  pp_assert(val != 0);
  bool in_old;
  find(ix, key, &in_old)->val = val;
}

void pp_index_del(pp_index_t *ix, uint64_t key) {
  bool in_old;
  pp_islot_t *s = find(ix, key, &in_old);
  ix->n--;
  if (in_old) {
    *s = (pp_islot_t){MOVED, 0}; /* old slots: their runs stay whole */
    return;
  }
  /* Shift back every later entry of the run that may move into the hole:
   * one whose home is not cyclically in (hole, its slot]. */
  size_t mask = ix->cap - 1, i = (size_t)(s - ix->t);
  uint64_t probes = 0;
  for (size_t j = (i + 1) & mask; ix->t[j].val != 0; j = (j + 1) & mask) {
    probes++;
    size_t h = home(ix->t[j].key, ix->cap);
    if (((j - h) & mask) >= ((j - i) & mask)) {
      ix->t[i] = ix->t[j];
      i = j;
    }
  }
  ix->t[i] = (pp_islot_t){0, 0};
  visit(ix, probes);
}
