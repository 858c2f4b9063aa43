# Types of the pinpool package for mypy and editors (PEP 561: py.typed).
# Pool and Buffer are C (python/pinpoolmodule.c); their docstrings are the
# reference. tests/python/test_stub.py checks that this file and the module
# agree: the same public names, the same parameters and defaults.
import os
from types import TracebackType
from typing import (Any, Callable, Dict, Generic, Iterable, Iterator, List,
                    Literal, Optional, Sequence, SupportsIndex, Tuple, Type,
                    TypedDict, TypeVar, Union, overload)

import numpy as np
import numpy.typing as npt
import torch as _torch

from pinpool import torch as torch

__version__: str
kDLCPU: int
kDLCUDAHost: int

_Shape = Union[SupportsIndex, Sequence[SupportsIndex]]
_Stream = Union[int, Any]  # an int handle, or an object with .cuda_stream

# Pool.stats() (docs/stats.md): test_stub.py checks these keys against the
# module's.
class _Stat(TypedDict):
    current: int
    peak: int
    allocated: int
    freed: int

class _Duration(TypedDict):
    count: int
    total_ns: int
    max_ns: int

class _Stats(TypedDict):
    requests: _Stat
    requested_bytes: _Stat
    blocks: _Stat
    block_bytes: _Stat
    reserved_bytes: _Stat
    cached_bytes: _Stat
    segments: _Stat
    pending_bytes: int
    pending_blocks: int
    events_recorded: int
    events_completed: int
    event_errors: int
    cache_hits: int
    cache_misses: int
    tcache_hits: int
    oom_count: int
    retries: int
    trimmed_segments: int
    arena_chunks: int
    chunk_free_bytes: int
    free_extents: int
    largest_free_extent: int
    history_lost_writes: int
    mlock_failures: int
    locked_bytes: int
    fallback_bytes: int
    fallback_blocks: int
    peak_slack_bytes: int
    reserve_bytes: int
    max_cached: int
    max_reserved: int
    graph_held_blocks: int
    graph_held_bytes: int
    numa_spill_blocks: int
    numa_spill_bytes: int
    lent_blocks: int
    lent_bytes: int
    lend_refusals: int
    grow_ahead_chunks: int
    grow_ahead_bytes: int
    grow_ahead_hits: int
    grow_ahead_waits_avoided: int
    page_moves: int
    bytes_moved: int
    move_fallbacks: int
    backend_auto: str  # NotPinnedWarning: "", "cuda-register", "host-locked", "host-unlocked"
    pin_warnings: int
    reclaim: _Duration
    backend_alloc: _Duration
    backend_free: _Duration

class _Attributes(TypedDict):
    host_accessible: Optional[bool]
    device_accessible: Optional[bool]
    device_id: int
    page_locked: Optional[bool]
    numa_node: int
    huge_pages: Optional[bool]
    huge_advised: Optional[bool]
    backend: str

class Pool:
    def __init__(self, config: Optional[str] = None) -> None: ...
    @property
    def config(self) -> str: ...
    def alloc(self, nbytes: SupportsIndex, /) -> Buffer: ...
    @overload
    def empty(self, shape: _Shape, dtype: _torch.dtype) -> _torch.Tensor: ...
    @overload
    def empty(self, shape: _Shape, dtype: npt.DTypeLike = None) -> npt.NDArray[Any]: ...
    @overload
    def zeros(self, shape: _Shape, dtype: _torch.dtype) -> _torch.Tensor: ...
    @overload
    def zeros(self, shape: _Shape, dtype: npt.DTypeLike = None) -> npt.NDArray[Any]: ...
    def empty_cache(self, /) -> None: ...
    def stats(self, /) -> _Stats: ...
    def memory_stats(self) -> Dict[str, int]: ...
    def memory_summary(self) -> str: ...
    def reset_peak_stats(self, /) -> None: ...
    def process_events(self, /) -> None: ...
    def synchronize(self, /) -> None: ...
    def stream_capture(self, stream: _Stream, /) -> Optional[int]: ...
    def graph_release(self, capture_id: int, /) -> None: ...
    def stream_graphs_release(self, stream: _Stream, /) -> None: ...
    def record_history(
        self,
        enabled: Union[None, bool, Literal["state", "alloc", "all"]] = True,
        max_entries: int = 0,
        stack_depth: int = 16,
        clear: bool = False,
    ) -> None: ...
    @overload
    def snapshot(self, path: None = None, *, history: bool = True, symbols: bool = True) -> str: ...
    @overload
    def snapshot(self, path: Union[str, bytes, "os.PathLike[str]"], *, history: bool = True, symbols: bool = True) -> None: ...
    def lend_reclaim(self, pid: Optional[int] = None, *, free: bool = False,
                     live: bool = False) -> int: ...
    def lend_reclaim_exited(self, *, free: bool = False) -> int: ...
    def lend_collect(self, grace: Optional[float] = None) -> List[Buffer]: ...
    def __enter__(self, /) -> Pool: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
        /,
    ) -> bool: ...

class Buffer:
    @property
    def nbytes(self) -> int: ...
    @property
    def block_size(self) -> int: ...
    @property
    def ptr(self) -> int: ...
    @property
    def pool(self) -> Optional[Pool]: ...  # None: attached (a worker's)
    @property
    def attached(self) -> bool: ...
    @property
    def lent_to(self) -> Optional[int]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def exports(self) -> int: ...
    @property
    def attributes(self) -> _Attributes: ...
    @property
    def host_accessible(self) -> Optional[bool]: ...
    @property
    def device_accessible(self) -> Optional[bool]: ...
    @property
    def device_id(self) -> int: ...
    @property
    def page_locked(self) -> Optional[bool]: ...
    @property
    def numa_node(self) -> int: ...
    @property
    def huge_pages(self) -> Optional[bool]: ...
    @property
    def backend(self) -> str: ...
    def close(self, /) -> None: ...
    def lend(self, pid: int) -> None: ...
    def record_stream(self, stream: _Stream, /) -> None: ...
    def __dlpack__(
        self,
        *,
        stream: Optional[int] = None,
        max_version: Optional[Tuple[int, int]] = None,
        dl_device: Optional[Tuple[int, int]] = None,
        copy: Optional[bool] = None,
    ) -> Any: ...
    def __dlpack_device__(self, /) -> Tuple[int, int]: ...
    def __len__(self) -> int: ...
    def __enter__(self, /) -> Buffer: ...
    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
        /,
    ) -> bool: ...

def default_pool() -> Pool: ...
def alloc(nbytes: SupportsIndex, /) -> Buffer: ...
def asarray(buf: Buffer, dtype: npt.DTypeLike = None, shape: Optional[_Shape] = None) -> npt.NDArray[Any]: ...

class StaleHandleError(ValueError): ...
class BadHandleError(ValueError): ...
class WorkerError(RuntimeError): ...
class NotPinnedWarning(RuntimeWarning): ...

_T = TypeVar("_T")

class SharedLoader(Generic[_T]):
    def __init__(
        self,
        pool: Pool,
        fill_fn: Callable[[Any, Buffer], Any],
        tasks: Union[int, Iterable[Any]],
        batch_bytes: int,
        *,
        num_workers: int = 2,
        max_lent_per_worker: int = 2,
        ordered: bool = True,
        transform: Optional[Callable[[Buffer], _T]] = None,
        start_method: Optional[str] = None,
        timeout: Optional[float] = None,
        dumpable: bool = True,
    ) -> None: ...
    @property
    def worker_pids(self) -> List[int]: ...
    def close(self) -> None: ...
    def __iter__(self) -> Iterator[Union[Buffer, _T]]: ...
    def __enter__(self) -> SharedLoader[_T]: ...
    def __exit__(self, *exc: Any) -> None: ...
