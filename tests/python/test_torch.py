"""PyTorch on pool memory (docs/python.md, "PyTorch"): Pool.empty with torch
dtypes, pinpool.torch.pin / collate / pin_memory_fn / record_stream, and the
lifetime of a block under tensors and their views. Debian's torch is a CPU
build: streams are the pool's simulated ones (events=simulated) and objects
with a cuda_stream attribute, as torch.cuda.Stream has."""

import collections
import gc
import subprocess
import sys
import threading
import time

import pytest

import pinpool
from conftest import live_blocks, needs_numpy, needs_torch, np, torch

pytestmark = needs_torch

if torch is not None:
    import pinpool.torch as ppt

    DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
              torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64,
              torch.bool, torch.complex64]
else:
    DTYPES = []


def test_import_pinpool_does_not_import_torch():
    code = ("import sys, pinpool; from pinpool import *; "
            "assert 'torch' not in sys.modules; "
            "p = pinpool.Pool(''); p.empty(3, 'float32'); "
            "assert 'torch' not in sys.modules; import pinpool.torch; "
            "assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [5, (2, 3), (2, 3, 4), (0,), (3, 0), ()])
def test_empty_dtypes_and_shapes(pool, dtype, shape):
    t = pool.empty(shape, dtype=dtype)
    assert isinstance(t, torch.Tensor)
    assert t.dtype == dtype and t.device.type == "cpu"
    assert tuple(t.shape) == (shape if isinstance(shape, tuple) else (shape,))
    assert t.is_contiguous()
    assert ppt.is_pooled(t, pool)
    t.fill_(1)
    assert bool((t == 1).all())
    z = pool.zeros(shape, dtype=dtype)
    assert int(torch.count_nonzero(z)) == 0


def test_module_level_empty_uses_the_default_pool():
    t = ppt.empty((4,), torch.int32)
    assert ppt.buffer_of(t).pool is pinpool.default_pool()
    t2 = ppt.zeros(3, pool=pinpool.default_pool())
    assert t2.dtype == torch.float32 and not bool(t2.any())


def test_tensor_is_pool_memory(pool):
    t = pool.empty((8, 8), dtype=torch.float32)
    buf = ppt.buffer_of(t)
    assert isinstance(buf, pinpool.Buffer) and buf.pool is pool
    assert t.data_ptr() == buf.ptr
    assert buf.nbytes == t.numel() * t.element_size()
    assert ppt.buffer_of(torch.zeros(3)) is None
    assert not ppt.is_pooled(torch.zeros(3))


def test_block_returns_when_last_view_dies(pool):
    t = pool.empty((6, 4), dtype=torch.float64)
    row = t[2]
    tr = t.t()
    flat = t.view(-1)
    del t
    gc.collect()
    assert live_blocks(pool) == 1
    del row, tr
    gc.collect()
    assert live_blocks(pool) == 1, "freed while a view was alive"
    flat[:] = 3.0  # still valid memory
    assert ppt.is_pooled(flat, pool)  # a view finds its buffer too
    del flat
    gc.collect()
    assert live_blocks(pool) == 0


def test_numpy_view_of_tensor_keeps_block(pool):
    if np is None:
        pytest.skip("needs NumPy")
    t = pool.empty(16, dtype=torch.int32)
    a = t.numpy()
    del t
    gc.collect()
    assert live_blocks(pool) == 1
    a[:] = 1
    del a
    gc.collect()
    assert live_blocks(pool) == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_pin_non_contiguous(pool, dtype):
    src = (torch.arange(60) % 7).to(dtype).reshape(3, 4, 5)
    cases = [src, src.transpose(0, 2), src[:, ::2, 1:], src.permute(1, 2, 0),
             src.expand(2, 3, 4, 5), src[1]]
    for x in cases:
        p = ppt.pin(x, pool)
        assert ppt.is_pooled(p, pool)
        assert p.is_contiguous() and p.dtype == x.dtype
        assert p.shape == x.shape and torch.equal(p, x)
        assert ppt.pin(p, pool) is p  # already pinned: itself
    del p, x, cases
    gc.collect()
    assert live_blocks(pool) == 0


def test_pin_default_pool_and_grad():
    x = torch.ones(3, requires_grad=True)
    p = ppt.pin(x)
    assert ppt.buffer_of(p).pool is pinpool.default_pool()
    assert p.requires_grad and torch.equal(p.detach(), x.detach())


def test_pin_bad_input(pool):
    with pytest.raises(TypeError):
        ppt.pin([1, 2, 3], pool)
    with pytest.raises(TypeError):
        ppt.pin(torch.ones(2), pool="max_cached=1")
    with pytest.raises(ValueError):
        ppt.pin(torch.ones(2, 2).to_sparse(), pool)
    with pytest.raises(ValueError):
        ppt.pin(torch.ones(2, device="meta"), pool)
    with pytest.raises(TypeError):
        ppt.pin_memory_fn([torch.ones(1)], pool=3)
    with pytest.raises(TypeError):
        ppt.collate([torch.ones(1)], pool="pool")
    assert live_blocks(pool) == 0


def test_empty_bad_input(pool):
    for shape, exc in [((-1, 2), ValueError), ("2", TypeError),
                       ((2.0,), TypeError)]:
        with pytest.raises(exc):
            pool.empty(shape, dtype=torch.float32)
    with pytest.raises(TypeError):
        ppt.empty((2,), dtype="float32")  # a torch dtype is required here
    with pytest.raises(TypeError):
        ppt.empty((2,), torch.float32, pool=42)
    assert live_blocks(pool) == 0
    assert pool.stats()["requests"]["allocated"] == 0


Sample = collections.namedtuple("Sample", "x label")


def samples(n):
    return [{"image": torch.full((3, 4), float(i)),
             "pair": (torch.tensor([i, -i]), i * 0.5),
             "nt": Sample(torch.arange(3) + i, i),
             "name": f"s{i}"} for i in range(n)]


def test_collate_into_pool(pool):
    batch = ppt.collate(samples(5), pool)
    img = batch["image"]
    assert img.shape == (5, 3, 4) and ppt.is_pooled(img, pool)
    assert torch.equal(img[2], torch.full((3, 4), 2.0))
    a, b = batch["pair"]
    assert torch.equal(a[:, 1], -torch.arange(5)) and ppt.is_pooled(a, pool)
    assert b.dtype == torch.float64 and ppt.is_pooled(b, pool)
    assert isinstance(batch["nt"], Sample)
    assert batch["nt"].label.dtype == torch.int64
    assert batch["name"] == [f"s{i}" for i in range(5)]
    # Same values as torch's own collate.
    from torch.utils.data import default_collate
    ref = default_collate(samples(5))
    assert torch.equal(ref["image"], img)
    assert torch.equal(ref["nt"].x, batch["nt"].x)
    del batch, img, a, b
    gc.collect()
    assert live_blocks(pool) == 0


def test_collate_bad_input(pool):
    with pytest.raises(TypeError):
        ppt.collate([object(), object()], pool)
    with pytest.raises(TypeError):
        ppt.collate([], pool)
    with pytest.raises(RuntimeError):
        ppt.collate([torch.ones(2), torch.ones(3)], pool)
    with pytest.raises(RuntimeError):
        ppt.collate([[1, 2], [1]], pool)
    gc.collect()
    assert live_blocks(pool) == 0


class Squares(torch.utils.data.Dataset if torch is not None else object):
    def __len__(self):
        return 40

    def __getitem__(self, i):
        return torch.full((2, 3), float(i * i)), i


def test_dataloader_main_process_collate(pool):
    loader = torch.utils.data.DataLoader(
        Squares(), batch_size=8, collate_fn=lambda b: ppt.collate(b, pool))
    seen = 0
    for x, idx in loader:
        assert ppt.is_pooled(x, pool) and ppt.is_pooled(idx, pool)
        assert torch.equal(x[:, 0, 0], (idx * idx).to(torch.float32))
        seen += len(idx)
    assert seen == 40
    del x, idx
    gc.collect()
    assert live_blocks(pool) == 0


def test_dataloader_workers(pool):
    # Workers collate (default_collate: the batch crosses to this process
    # through shared memory); pin_memory_fn puts each batch on the pool.
    loader = torch.utils.data.DataLoader(
        Squares(), batch_size=8, num_workers=2, collate_fn=ppt.collate,
        shuffle=True, generator=torch.Generator().manual_seed(1))
    seen = []
    for batch in map(lambda b: ppt.pin_memory_fn(b, pool), loader):
        x, idx = batch
        assert ppt.is_pooled(x, pool) and ppt.is_pooled(idx, pool)
        assert torch.equal(x[:, 1, 2], (idx * idx).to(torch.float32))
        seen += idx.tolist()
    assert sorted(seen) == list(range(40))
    del batch, x, idx
    gc.collect()
    assert live_blocks(pool) == 0


def test_pin_memory_fn_structures(pool):
    data = {"a": torch.ones(2).t(), "b": [torch.zeros(1), "keep", 3],
            "c": Sample(torch.arange(2), torch.ones(1)), "d": (torch.ones(1),)}
    out = ppt.pin_memory_fn(data, pool)
    assert ppt.is_pooled(out["a"], pool) and out["b"][1:] == ["keep", 3]
    assert isinstance(out["c"], Sample) and ppt.is_pooled(out["c"].x, pool)
    assert isinstance(out["d"], tuple) and ppt.is_pooled(out["d"][0], pool)
    del out
    gc.collect()
    assert live_blocks(pool) == 0


class FakeStream:
    """What pinpool reads of a torch.cuda.Stream: its cuda_stream handle."""

    def __init__(self, handle):
        self.cuda_stream = handle


def test_record_stream_waits():
    p = pinpool.Pool("events=simulated,sim_delay_us=200000")
    t = p.empty((256,), dtype=torch.float32)
    ppt.record_stream(t, FakeStream(7))
    ppt.record_stream(t, 9)  # an int handle too
    del t
    gc.collect()
    st = p.stats()
    assert st["pending_blocks"] == 1, "reused before the stream's work ended"
    assert p.memory_stats()["active.all.current"] == 1
    p.synchronize()
    assert p.stats()["pending_blocks"] == 0
    assert live_blocks(p) == 0


def test_record_stream_bad_input(pool):
    t = pool.empty(4, dtype=torch.float32)
    with pytest.raises(ValueError):
        ppt.record_stream(torch.zeros(2), 1)  # not pool memory
    with pytest.raises(TypeError):
        ppt.record_stream(t, "stream")
    with pytest.raises(TypeError):
        ppt.record_stream(t, FakeStream("x"))
    with pytest.raises(ValueError):
        ppt.record_stream(t, -1)
    with pytest.raises(RuntimeError):
        ppt.record_stream(t, 1)  # events=none: no event provider
    with pytest.raises(TypeError):
        ppt.buffer_of("tensor")
    del t
    gc.collect()
    assert live_blocks(pool) == 0


def test_record_stream_fake_cuda(cuda_pool):
    # A CUDA-pinned pool with CUDA events on the fake driver: a stream
    # object's cuda_stream handle is recorded through cuEventRecord.
    try:
        p = pinpool.Pool("backend=cuda,device=0,events=cuda")
    except (RuntimeError, ValueError) as e:
        pytest.skip(f"no events=cuda pool on this driver: {e}")
    t = p.empty((64,), dtype=torch.uint8)
    buf = ppt.buffer_of(t)
    assert buf.__dlpack_device__() == (pinpool.kDLCUDAHost, 0)
    ppt.record_stream(t, FakeStream(0))
    del t, buf
    gc.collect()
    p.synchronize()
    assert live_blocks(p) == 0


def test_public_functions_are_listed_and_documented():
    """Every public function of pinpool.torch is in __all__ with a
    docstring; helpers are underscored (issue 41: nbytes_of and
    parse_shape were public without docstrings)."""
    import inspect
    public = [n for n, v in vars(ppt).items()
              if not n.startswith("_") and inspect.isfunction(v)]
    for name in public:
        assert name in ppt.__all__, name
        assert (getattr(ppt, name).__doc__ or "").strip(), name
    assert not hasattr(ppt, "nbytes_of") and not hasattr(ppt, "parse_shape")


class _Samples(torch.utils.data.Dataset if torch is not None else object):
    """Tensors, a dict and a number: what default_collate stacks."""

    def __len__(self):
        return 22

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return {"x": torch.randn(3, 5, generator=g), "y": i,
                "z": (torch.arange(4) * i, "s")}


def _flat(batch):
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, dict):
        return [t for k in sorted(batch) for t in _flat(batch[k])]
    if isinstance(batch, (list, tuple)):
        return [t for b in batch for t in _flat(b)]
    return []


@pytest.mark.parametrize("workers", [0, 2])
def test_patch_dataloader_pins_into_the_pool(pool, workers):
    """DataLoader(..., pin_memory=True) under patch_dataloader gives the
    batches torch's own loader gives, on pool memory; undone, torch's
    loader is back (issue 41, 5)."""
    from torch.utils.data import DataLoader
    original = DataLoader.__iter__
    ds = _Samples()
    want = list(DataLoader(ds, batch_size=4, num_workers=workers))
    with ppt.patch_dataloader(pool) as patch:
        loader = DataLoader(ds, batch_size=4, num_workers=workers,
                            pin_memory=True)
        got = list(loader)
        assert loader.pin_memory  # the loader is left as it was made
        assert len(iter(loader)) == len(want)
        # pin_memory=False: untouched.
        plain = list(DataLoader(ds, batch_size=4, num_workers=workers))
        assert not any(ppt.is_pooled(t) for b in plain for t in _flat(b))
    assert DataLoader.__iter__ is original and not patch.active
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g["z"][1] == w["z"][1]
        fg, fw = _flat(g), _flat(w)
        assert len(fg) == len(fw) == 3
        for a, b in zip(fg, fw):
            assert torch.equal(a, b) and a.dtype == b.dtype
            assert ppt.is_pooled(a, pool)
    after = list(DataLoader(ds, batch_size=4, pin_memory=True))
    assert not any(ppt.is_pooled(t) for b in after for t in _flat(b))
    del got, g, fg, a
    gc.collect()


def test_patch_dataloader_nests_and_undoes(pool):
    from torch.utils.data import DataLoader
    original = DataLoader.__iter__
    other = pinpool.Pool("backend=host")
    outer = ppt.patch_dataloader(pool)
    inner = ppt.patch_dataloader(other)
    batch = next(iter(DataLoader(_Samples(), batch_size=2, pin_memory=True)))
    assert ppt.is_pooled(batch["x"], other)  # the innermost pool
    inner.undo()
    inner.undo()  # idempotent
    batch = next(iter(DataLoader(_Samples(), batch_size=2, pin_memory=True)))
    assert ppt.is_pooled(batch["x"], pool)
    outer.undo()
    assert DataLoader.__iter__ is original
    with pytest.raises(TypeError):
        ppt.patch_dataloader("pool")
    assert DataLoader.__iter__ is original
    del batch
    gc.collect()


class _OrderedSamples(torch.utils.data.Dataset if torch is not None else
                      object):
    """Batches whose collate keeps an OrderedDict and a custom batch class
    with its own pin_memory() hook."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.full((4,), float(i))


class _CustomBatch:
    def __init__(self, t):
        self.t = t
        self.hooked = False

    def pin_memory(self):
        self.hooked = True
        return self


def _ordered_collate(items):
    return collections.OrderedDict(
        [("b", torch.stack(items)), ("a", torch.stack(items) * 2)])


def test_patch_dataloader_keeps_batch_types(pool):
    """The review of issue 41: an OrderedDict batch came back as a dict,
    and a batch's own pin_memory() hook was skipped; torch keeps the type
    and calls the hook when CUDA is there (returns the batch as is without
    CUDA)."""
    from torch.utils.data import DataLoader
    ds = _OrderedSamples()
    want = list(DataLoader(ds, batch_size=4, collate_fn=_ordered_collate,
                           pin_memory=True))
    with ppt.patch_dataloader(pool):
        got = list(DataLoader(ds, batch_size=4, collate_fn=_ordered_collate,
                              pin_memory=True))
        custom = list(DataLoader(ds, batch_size=4, pin_memory=True,
                                 collate_fn=lambda xs: _CustomBatch(
                                     torch.stack(xs))))
    assert [type(b) for b in got] == [type(b) for b in want]
    assert [list(b) for b in got] == [["b", "a"]] * 2
    for g, w in zip(got, want):
        assert torch.equal(g["b"], w["b"]) and ppt.is_pooled(g["b"], pool)
    for b in custom:
        assert isinstance(b, _CustomBatch)
        assert b.hooked == torch.cuda.is_available()
    del got, g
    gc.collect()


def test_patch_dataloader_iterators_on_threads(pool, monkeypatch):
    """The review of issue 41: while one thread built its iterator (the
    loader's pin_memory briefly False), another thread starting to iterate
    the same loader got torch's unpinned iterator. Torch's iterator
    construction is slowed to hold that window open."""
    from torch.utils.data import DataLoader
    loader = DataLoader(_OrderedSamples(), batch_size=4, pin_memory=True)
    real = DataLoader._get_iterator

    def slow(self):
        time.sleep(0.05)
        return real(self)

    monkeypatch.setattr(DataLoader, "_get_iterator", slow)
    pooled = []
    with ppt.patch_dataloader(pool):
        def run():
            for b in loader:
                pooled.append(ppt.is_pooled(b, pool))

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert pooled and all(pooled), pooled
    gc.collect()


def test_patch_dataloader_undo_while_a_thread_is_inside():
    """Issue 41, second round: undo() of the last patch cleared the saved
    torch __iter__ while another thread had already entered the patched
    one, which then called None (TypeError). The thread that entered just
    before the undo is replayed here: the patched __iter__, called after
    the undo, must still give torch's iterator."""
    from torch.utils.data import DataLoader
    loader = DataLoader(_OrderedSamples(), batch_size=4, pin_memory=True)
    pool_of_test = pinpool.Pool("backend=host")
    patch = ppt.patch_dataloader(pool_of_test)
    entered = DataLoader.__iter__  # the patched one, as a thread saw it
    patch.undo()
    assert DataLoader.__iter__ is not entered
    batches = list(entered(loader))
    assert len(batches) == 2
    assert not any(ppt.is_pooled(b, pool_of_test) for b in batches)
    # Patched again after the undo: pooled again.
    with ppt.patch_dataloader(pool_of_test):
        assert all(ppt.is_pooled(b, pool_of_test) for b in loader)
    del batches
    gc.collect()


QUANTIZED = ["qint8", "quint8", "qint32"]


@pytest.mark.parametrize("name", QUANTIZED)
def test_pin_refuses_quantized_tensors(pool, name):
    """Issue 41, second round: pin() of a quantized CPU tensor crashed the
    interpreter (torch.frombuffer cannot build one; the copy into the
    uint8 view wrote through a bad storage). Refused with TypeError,
    nothing allocated; pin_memory_fn and the patched DataLoader return it
    as torch's loader does (as is without CUDA)."""
    from torch.utils.data import DataLoader
    dtype = getattr(torch, name)
    q = torch.quantize_per_tensor(torch.ones(4), 0.5, 1, dtype)
    with pytest.raises(TypeError, match="quantized"):
        ppt.pin(q, pool)
    assert live_blocks(pool) == 0
    got = ppt.pin_memory_fn({"q": q, "t": torch.ones(2)}, pool)
    assert got["q"].dtype == dtype and ppt.is_pooled(got["t"], pool)
    if not torch.cuda.is_available():
        assert got["q"] is q
    want = next(iter(DataLoader([q, q], batch_size=None, pin_memory=True)))
    with ppt.patch_dataloader(pool):
        b = next(iter(DataLoader([q, q], batch_size=None, pin_memory=True)))
    assert b.dtype == want.dtype and torch.equal(b.dequantize(),
                                                 want.dequantize())
    del got
    gc.collect()


class _MyList(list):
    pass


class _Seq(collections.abc.Sequence):
    def __init__(self, items):
        self.items = list(items)

    def __getitem__(self, i):
        return self.items[i]

    def __len__(self):
        return len(self.items)


class _NoInitSeq(_Seq):
    """A sequence that cannot be built from a list: torch gives a list."""

    def __init__(self, a, b):
        super().__init__([a, b])


class _Leaf:
    """Stands for a tensor in torch's pin_memory without CUDA (a CPU build
    cannot pin a tensor): an object with its own pin_memory hook."""

    def pin_memory(self):
        return self


@pytest.mark.parametrize("make", [
    lambda x: _MyList([x, x]),
    lambda x: collections.UserList([x, x]),
    lambda x: _Seq([x, x]),
    lambda x: _NoInitSeq(x, x),
    lambda x: [x, _MyList([x])],
])
def test_pin_memory_fn_keeps_sequence_types_as_torch(pool, make):
    """Issue 41, second round: a list subclass came back as a list, and a
    UserList or another Sequence's tensors were not pinned at all; torch's
    pin_memory keeps type(data) (a list where the type cannot be built
    from one) and pins what is inside."""
    from torch.utils.data._utils.pin_memory import pin_memory as torch_pin

    def shape(x):
        if isinstance(x, (torch.Tensor, _Leaf)):
            return "T"
        if isinstance(x, collections.abc.Sequence):
            return (type(x).__name__, [shape(v) for v in x])
        return type(x).__name__

    def tensors(x):
        if isinstance(x, torch.Tensor):
            return [x]
        return [t for v in x for t in tensors(v)]

    got = ppt.pin_memory_fn(make(torch.ones(3)), pool)
    assert tensors(got) and all(ppt.is_pooled(t, pool)
                                for t in tensors(got))
    assert shape(got) == shape(torch_pin(make(_Leaf())))
    del got
    gc.collect()
