"""pinpool: a fast, thread-safe caching allocator of pinned host memory.

    import pinpool
    pool = pinpool.Pool("max_cached=1GiB")
    a = pool.empty((64, 1024), dtype="float32")     # a NumPy array on pool memory
    t = pool.empty((64, 1024), dtype=torch.float32) # a torch tensor on it
    t = pinpool.torch.pin(cpu_tensor)               # tensor.pin_memory(), pooled
    print(pool.memory_summary())

Pool and Buffer are the C core (pinpool._core, over include/pinpool.h);
NumPy and torch are imported only when a call needs them. docs/python.md
has the whole reference and the thread-safety contract: every call may be
made from any number of threads at once, free-threaded builds included.
"""

from pinpool._core import (
    BadHandleError,
    Buffer,
    NotPinnedWarning,
    Pool,
    StaleHandleError,
    __version__,
    alloc,
    default_pool,
    kDLCPU,
    kDLCUDAHost,
)
from pinpool._array import asarray
from pinpool._loader import SharedLoader, WorkerError

# Raised in the main process for a worker's exception: named where users
# import it from (tracebacks print the qualified name).
WorkerError.__module__ = "pinpool"

__all__ = [
    "BadHandleError",
    "Buffer",
    "NotPinnedWarning",
    "Pool",
    "SharedLoader",
    "StaleHandleError",
    "WorkerError",
    "__version__",
    "alloc",
    "asarray",
    "default_pool",
    "kDLCPU",
    "kDLCUDAHost",
]
# Not in __all__: pinpool.torch, so that `from pinpool import *` does not
# import torch.


def __getattr__(name: str) -> object:
    # pinpool.torch without importing torch at `import pinpool` (PEP 562):
    # the submodule, and torch with it, is imported at first use.
    if name == "torch":
        import importlib

        return importlib.import_module("pinpool.torch")
    raise AttributeError(f"module 'pinpool' has no attribute '{name}'")
