/*
 * The test hook (internal.h, "Test hooks"): tests set it to stop a thread at
 * a named point and force one interleaving. Never set by the library.
 */
#include "internal.h"

_Atomic(pp_test_hook_fn) pp_test_hook;
