# pinpool._core is the C core; its types are those of the package
# (__init__.pyi), which re-exports it whole.
from pinpool import (Buffer as Buffer, Pool as Pool, __version__ as __version__,
                     alloc as alloc, default_pool as default_pool,
                     kDLCPU as kDLCPU, kDLCUDAHost as kDLCUDAHost,
                     StaleHandleError as StaleHandleError,
                     BadHandleError as BadHandleError)

# Private: the sharing primitives pinpool/_share.py calls.
def _attach(handle: bytes, fd: int, ctl_fd: int, nbytes: int, /) -> Buffer: ...
def _lend_live(handle: bytes, fd: int, /) -> bool: ...
def _share_owns(handle: bytes, /) -> bool: ...
