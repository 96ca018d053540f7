"""xseg as PyTorch's CUDA allocator: install(), and the PyTorch functions
that a pluggable allocator leaves broken, made to work with xseg's numbers.

PyTorch's CUDAPluggableAllocator takes function pointers for malloc and
free and for a few hooks (empty cache, memory fraction, record stream, the
three private-pool hooks of CUDA graphs); install() gives it libxseg's.
Everything else about memory that PyTorch asks its allocator for (stats,
snapshots, allocation history, IPC, memory pools) throws "does not yet
support" in C++ for a pluggable allocator, so install() replaces the
torch._C functions that torch.cuda calls for these with versions that ask
xseg, and registers xseg's own sharing for torch.multiprocessing.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import operator
import sys
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import _graphs, _lib, _nativeipc
from ._lib import XsegError

_log = logging.getLogger("xseg")
_lock = threading.RLock()
_allocator: Any = None  # the CUDAPluggableAllocator, kept alive while installed
_originals: Dict[str, Any] = {}  # (owner, name) -> what install() replaced

GIB = float(1 << 30)


def _torch() -> Any:
    import torch
    return torch


def _device(device: Any = None) -> int:
    """A device ordinal from None (torch's current device once CUDA is
    initialized, else 0), an int or any integer with __index__ (numpy's,
    torch's), "cuda:N" (needs torch), or a torch.device or other object with
    an ``index`` attribute (None there means the current device too). A
    bool, or a value of any other type, raises TypeError; a negative
    ordinal ValueError."""
    if isinstance(device, bool):
        raise TypeError(f"xseg: the device argument must be an int, a torch.device, a str or None, "
                        f"not bool ({device!r})")
    if device is None:
        return _current_device()
    try:
        ordinal = operator.index(device)
    except TypeError:
        pass
    else:
        if ordinal < 0:
            raise ValueError(f"xseg: device {ordinal} is negative")
        return ordinal
    torch = sys.modules.get("torch")
    if isinstance(device, str):
        if torch is None:
            raise ValueError(f"xseg: device {device!r} needs torch to parse")
        device = torch.device(device)
    index = getattr(device, "index", None)
    if index is None:
        if not hasattr(device, "index"):
            raise TypeError(f"xseg: the device argument must be an int, a torch.device, a str or None, "
                            f"not {type(device).__name__} ({device!r:.60})")
        return _current_device()  # torch.device("cuda"): no index
    if isinstance(index, bool) or callable(index):  # a list's or tuple's index method
        raise TypeError(f"xseg: the device argument must be an int, a torch.device, a str or None, "
                        f"not {type(device).__name__} ({device!r:.60})")
    try:
        ordinal = operator.index(index)
    except TypeError:
        raise TypeError(f"xseg: the device argument's index must be an integer, not "
                        f"{type(index).__name__} ({type(device).__name__} {device!r:.60})") from None
    if ordinal < 0:
        raise ValueError(f"xseg: device {ordinal} is negative")
    return ordinal


def _current_device() -> int:
    """torch's current device once CUDA is initialized, else 0."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return 0


# Statistics, with PyTorch's key names.

def stats(device: Any = None) -> Dict[str, Any]:
    """Statistics of one device as a flat dict with PyTorch's key names
    ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak",
    "num_alloc_retries", ...) and xseg's own ("num_maps",
    "device_total_bytes", ...). All zero for a device that has not
    allocated yet."""
    return _lib.flatten(_lib.raw_stats(_device(device)))


def memory_allocated(device: Any = None) -> int:
    """Bytes of blocks handed out now (torch.cuda.memory_allocated)."""
    return int(stats(device)["allocated_bytes.all.current"])


def memory_reserved(device: Any = None) -> int:
    """Bytes of device memory xseg holds now (torch.cuda.memory_reserved)."""
    return int(stats(device)["reserved_bytes.all.current"])


def max_memory_allocated(device: Any = None) -> int:
    """Peak of memory_allocated since start or reset_peak_stats."""
    return int(stats(device)["allocated_bytes.all.peak"])


def max_memory_reserved(device: Any = None) -> int:
    """Peak of memory_reserved since start or reset_peak_stats."""
    return int(stats(device)["reserved_bytes.all.peak"])


memory_used = memory_allocated
peak_memory = max_memory_allocated


def memory_total(device: Any = None) -> int:
    """The device's total memory in bytes, as the driver reports it; 0 until
    xseg has started."""
    return int(stats(device)["device_total_bytes"])


def memory_free(device: Any = None) -> int:
    """The device's free memory in bytes (all processes); 0 until xseg has
    started."""
    return int(stats(device)["device_free_bytes"])


def num_ooms(device: Any = None) -> int:
    """How many allocations failed for want of memory."""
    return int(stats(device)["num_ooms"])


def num_alloc_retries(device: Any = None) -> int:
    """How many allocations succeeded only after emptying the cache."""
    return int(stats(device)["num_alloc_retries"])


get_retry_count = num_alloc_retries


def get_memory_stats(device: Any = None) -> Dict[str, float]:
    """A summary in GB (2**30 bytes): used_gb (allocated), reserved_gb,
    peak_gb (peak allocated), peak_reserved_gb, free_gb and total_gb (the
    device, all processes), and the counts retries and ooms."""
    s = stats(device)
    return {
        "used_gb": s["allocated_bytes.all.current"] / GIB,
        "reserved_gb": s["reserved_bytes.all.current"] / GIB,
        "peak_gb": s["allocated_bytes.all.peak"] / GIB,
        "peak_reserved_gb": s["reserved_bytes.all.peak"] / GIB,
        "free_gb": s["device_free_bytes"] / GIB,
        "total_gb": s["device_total_bytes"] / GIB,
        "retries": s["num_alloc_retries"],
        "ooms": s["num_ooms"],
    }


def empty_cache(device: int = -1) -> None:
    """Give every whole free page back to the driver (device -1: all)."""
    _lib.empty_cache(device)


clear_cache = empty_cache


def reset_peak_stats(device: int = -1) -> None:
    """Make every peak the current value (device -1: all)."""
    _lib.reset_peak_stats(device)


def snapshot(device: Any = None) -> Dict[str, Any]:
    """Segments, mapped ranges and blocks of one device, with its stats, as
    libxseg's JSON (nested). torch.cuda.memory_snapshot gives PyTorch's
    shape instead."""
    return _lib.raw_snapshot(_device(device))


def pool_allocations(pool: Tuple[int, int], device: Any = None) -> List[int]:
    """Addresses of the blocks allocated now in private pool ``pool`` (a
    ``torch.cuda.graph_pool_handle()``, ``CUDAGraph.pool()`` or
    ``MemPool.id``) on device (default the current one), sorted."""
    return _lib.pool_allocations(pool, _device(device))


# torch.cuda.memory_stats: PyTorch's nested shape. Keys of PyTorch's
# allocator that xseg has no counterpart for are 0 (README lists them).

_STAT_ARRAYS = ("allocation", "segment", "active", "allocated_bytes", "reserved_bytes",
                "active_bytes", "requested_bytes")
_ZERO_STAT_ARRAYS = ("inactive_split", "inactive_split_bytes")
_ZERO_STATS = ("oversize_allocations", "oversize_segments")
_XSEG_ONLY = ("num_maps", "num_unmaps", "num_set_access_calls", "num_syncs", "num_pages_created",
              "num_pages_reused", "num_pages_retired", "sync_ns", "page_ns", "device_total_bytes",
              "device_free_bytes", "memory_limit_bytes", "memory_limit_set")
ZERO_KEYS = _ZERO_STAT_ARRAYS + _ZERO_STATS + ("max_split_size",)


def _zero_stat() -> Dict[str, int]:
    return {"current": 0, "peak": 0, "allocated": 0, "freed": 0}


def torch_memory_stats(device: Any = None) -> Dict[str, Any]:
    """torch.cuda.memory_stats_as_nested_dict under xseg: every key of
    PyTorch's own allocator, with xseg's numbers, and xseg's own under
    "xseg"."""
    raw = _lib.raw_stats(_device(device))
    out: Dict[str, Any] = {}
    for k in _STAT_ARRAYS:
        out[k] = {p: dict(raw[k][p]) for p in ("all", "small_pool", "large_pool")}
    for k in _ZERO_STAT_ARRAYS:
        out[k] = {p: _zero_stat() for p in ("all", "small_pool", "large_pool")}
    for k in _ZERO_STATS:
        out[k] = _zero_stat()
    out["num_alloc_retries"] = raw["num_alloc_retries"]
    out["num_ooms"] = raw["num_ooms"]
    out["num_sync_all_streams"] = raw.get("num_syncs", 0)
    out["num_device_alloc"] = raw.get("num_maps", 0)
    out["num_device_free"] = raw.get("num_unmaps", 0)
    out["max_split_size"] = 0
    out["xseg"] = {k: int(raw[k]) for k in _XSEG_ONLY if k in raw}  # memory_limit_set: 0 or 1
    return out


# torch.cuda.memory_snapshot and memory_viz: PyTorch's snapshot shape, from
# xseg's snapshot and its allocation history.

_STATES = {"allocated": "active_allocated", "pending": "active_pending_free", "free": "inactive"}


def _torch_segments(dev: int, pool: Optional[Tuple[int, int]]) -> List[Dict[str, Any]]:
    snap = _lib.raw_snapshot(dev)
    out = []
    for seg in snap.get("segments") or []:
        seg_pool = tuple(seg.get("segment_pool_id") or (0, 0))
        if pool is not None and pool != (0, 0) and seg_pool != pool:
            continue
        blocks = sorted(seg.get("blocks") or [], key=lambda b: b["ptr"])
        mapped = seg.get("mapped") or []
        expandable = int(seg.get("reserved_size", 0)) > sum(int(r["size"]) for r in mapped) or len(mapped) != 1
        for r in mapped:
            lo, hi = int(r["ptr"]), int(r["ptr"]) + int(r["size"])
            bs = [b for b in blocks if lo <= int(b["ptr"]) < hi]
            out.append(_torch_segment(dev, seg, seg_pool, lo, hi - lo, bs, expandable))
    return out


def _torch_segment(dev: int, seg: Dict[str, Any], pool: Tuple[int, ...], addr: int, size: int,
                   blocks: List[Dict[str, Any]], expandable: bool) -> Dict[str, Any]:
    tb = []
    allocated = active = requested = 0
    for b in blocks:
        state = _STATES.get(b.get("state", ""), "inactive")
        bsize, breq = int(b["size"]), int(b.get("requested", 0))
        if state == "active_allocated":
            allocated += bsize
            requested += breq
        if state != "inactive":
            active += bsize
        tb.append({"address": int(b["ptr"]), "size": bsize, "requested_size": breq if state != "inactive" else 0,
                   "state": state, "frames": []})
    return {
        "device": dev, "address": addr, "total_size": size, "allocated_size": allocated,
        "active_size": active, "requested_size": requested, "stream": int(seg.get("stream", 0)),
        "segment_type": "small" if seg.get("pool") == "small" else "large",
        "segment_pool_id": pool, "is_expandable": expandable, "frames": [], "blocks": tb,
    }


def _torch_trace(dev: int) -> List[Dict[str, Any]]:
    out = []
    for e in _lib.history(dev):
        t = {"action": e["action"], "addr": int(e.get("addr", 0)), "size": int(e.get("size", 0)),
             "stream": int(e.get("stream", 0)), "time_us": int(e.get("time_us", 0)), "frames": [],
             "compile_context": "N/A", "user_metadata": ""}
        if e["action"] == "oom":
            t["device_free"] = int(e.get("device_free", 0))
        out.append(t)
    return out


def _device_count() -> int:
    torch = sys.modules.get("torch")
    return int(torch.cuda.device_count()) if torch is not None else 1


def _history_on(dev: int) -> bool:
    with _lock:
        return dev in _history_devices


_history_devices: Dict[int, int] = {}  # device -> max_entries while recording


def torch_snapshot(arg: Any = None) -> Dict[str, Any]:
    """torch._C._cuda_memorySnapshot under xseg. arg is None or
    (pool first, pool second, include_traces)."""
    pool: Optional[Tuple[int, int]] = None
    traces = True
    if arg is not None:
        pool = (int(arg[0]), int(arg[1]))
        if len(arg) > 2:
            traces = bool(arg[2])
    segments: List[Dict[str, Any]] = []
    device_traces: List[List[Dict[str, Any]]] = []
    for dev in range(_device_count()):
        segments.extend(_torch_segments(dev, pool))
        device_traces.append(_torch_trace(dev) if traces and _history_on(dev) else [])
    return {
        "segments": segments,
        "device_traces": device_traces,
        "allocator_settings": {"xseg": _lib.version(), "expandable_segments": True},
        "external_annotations": [],
    }


def record_memory_history(enabled: Any = "all", context: Any = "all", stacks: str = "all",
                          max_entries: int = sys.maxsize, clear_history: bool = False,
                          *rest: Any) -> None:
    """torch._C._cuda_record_memory_history under xseg: record (enabled
    not None) or stop recording every device's allocation events, keeping
    at most max_entries (capped at 2**22) per device. xseg records no Python
    or C++ stack frames: context and stacks are accepted and ignored, and
    every frames list is empty."""
    n = 0 if enabled is None else max(1, min(int(max_entries), MAX_HISTORY))
    with _lock:
        for dev in range(_device_count()):
            if clear_history and n:
                _lib.record_history(dev, 0)
            _lib.record_history(dev, n)
            if n:
                _history_devices[dev] = n
            else:
                _history_devices.pop(dev, None)


MAX_HISTORY = 1 << 22


def _record_memory_history_legacy(enabled: bool, record_context: bool = True, trace_alloc_max_entries: int = 1,
                                  *rest: Any) -> None:
    record_memory_history("all" if enabled else None, max_entries=max(1, int(trace_alloc_max_entries)))


# Out of memory, size reduction.

def allocate_tensor(num_elements: int, dtype: Any = None, device: Any = None,
                    min_elements: Optional[int] = None) -> Any:
    """A 1-D CUDA tensor of at most num_elements elements of dtype (default
    torch.float32) on device, as large as memory allows down to
    min_elements (default 1): xseg shrinks the request by its
    oom_size_factor (OOM_SIZE_FACTOR, 0.8 by default) after each
    out-of-memory, emptying the cache only at the last try. Its length says
    what it got. Raises torch.OutOfMemoryError if even min_elements does not
    fit. The memory goes back to xseg when the tensor dies."""
    torch = _torch()
    dtype = torch.float32 if dtype is None else dtype
    itemsize = torch.empty((), dtype=dtype).element_size()
    num = _lib._integer(num_elements, "allocate_tensor's num_elements")
    lo = 1 if min_elements is None else _lib._integer(min_elements, "allocate_tensor's min_elements")
    if not 0 < lo <= num:
        raise ValueError(f"xseg: allocate_tensor needs 0 < min_elements <= num_elements, got {lo}, {num}")
    dev = _device(device)
    stream = torch.cuda.current_stream(dev).cuda_stream
    try:
        ptr, size = _lib.malloc_at_most(num * itemsize, lo * itemsize, dev, stream)
    except _lib.OutOfMemoryError as e:
        raise torch.OutOfMemoryError("CUDA out of memory. " + str(e)) from None
    holder = _Block(ptr, size, dev)
    with torch.cuda.device(dev):
        raw = torch.as_tensor(holder, device=torch.device("cuda", dev))
    n = size // itemsize
    return raw[: n * itemsize].view(dtype)


class _Block:
    """A block of xseg's own (not PyTorch's), exposed through
    __cuda_array_interface__ and freed when the last tensor over it dies."""

    def __init__(self, ptr: int, size: int, device: int) -> None:
        self.ptr, self.size, self.device = ptr, size, device
        self.__cuda_array_interface__ = _lib.cuda_array_interface(ptr, (size,))

    def __del__(self) -> None:
        lib = _lib.loaded()
        if self.ptr and lib is not None:
            lib.xseg_free(self.ptr, 0, self.device, None)
            self.ptr = 0


# Cross-process sharing of tensors: xseg's own IPC (pidfd_getfd, or the
# exporter's socket where ptrace rights are missing). PyTorch's CUDA IPC
# refuses a pluggable allocator's memory.

def share(tensor: Any, importers: int = 0) -> bytes:
    """Share tensor's storage with other processes and return the
    descriptor; they call open_tensor() with it. The storage must start an
    xseg block (any tensor PyTorch allocated under install() does, views
    included: share the view's base storage). importers > 0 ends the share
    once that many have opened it; 0 keeps it while tensor lives (or until
    unshare). The pages stay out of reuse until the share ends and every
    importer has let go, even after tensor is freed. Waits for the work
    queued on the device's current stream, so importers see the bytes
    written so far. Needs a shareable allocator (install() makes one)."""
    torch = _torch()
    if not getattr(tensor, "is_cuda", False):
        raise ValueError("xseg: share needs a CUDA tensor")
    dev = tensor.device.index or 0
    torch.cuda.current_stream(tensor.device).synchronize()
    desc = _lib.share_block(tensor.untyped_storage().data_ptr(), dev, importers)
    if importers == 0:
        f = weakref.finalize(tensor, _unshare_quietly, desc)
        f.atexit = False
    return desc


def _unshare_quietly(desc: bytes) -> None:
    lib = _lib.loaded()
    if lib is not None:
        lib.xseg_unshare(desc, len(desc))


unshare = _lib.unshare


class _Opened:
    """An open mapping exposed through __cuda_array_interface__; the tensors
    over it keep it alive, the last one to go closes it. By default its
    bytes, all of them; or its first elements of CAI type typestr in
    shape (C order)."""

    def __init__(self, m: _lib.Mapping, typestr: str = "|u1", shape: Optional[Tuple[int, ...]] = None) -> None:
        self.mapping = m
        self.__cuda_array_interface__ = _lib.cuda_array_interface(m.ptr, (m.size,) if shape is None else shape,
                                                                  typestr)


_cuda_devices: Dict[int, Any] = {}  # ordinal -> torch.device("cuda", ordinal)


def _open_bytes(desc: bytes, dev: int, typestr: str = "|u1", shape: Optional[Tuple[int, ...]] = None,
                nbytes: int = 0) -> Any:
    """Map desc on device dev and return a tensor over the mapping: its
    bytes, or (typestr, shape) as _Opened takes them, of nbytes bytes,
    which the block must hold."""
    torch = _torch()
    if not torch.cuda.is_initialized():
        torch.cuda.init()
    # The tensor is built while the exporter answers the lease request;
    # nobody reads it before wait() has seen the lease granted.
    m = _lib.open_block(desc, dev, wait=False)
    if nbytes > m.size:
        m.close()
        raise XsegError(f"xseg: the shared block has {m.size} bytes, the tensor's storage {nbytes}")
    where = _cuda_devices.get(dev)
    if where is None:
        where = _cuda_devices[dev] = torch.device("cuda", dev)
    if torch.cuda.current_device() == dev:  # the usual case: no device switch
        t = torch.as_tensor(_Opened(m, typestr, shape), device=where)
    else:
        with torch.cuda.device(dev):
            t = torch.as_tensor(_Opened(m, typestr, shape), device=where)
    try:
        m.wait()
    except BaseException:
        t = None  # nobody gets the unprotected bytes
        m.close()
        raise
    return t


def open_tensor(desc: bytes, shape: Any, dtype: Any, device: Any = None) -> Any:
    """Map the block desc names (from share() in any process) and return a
    tensor of shape and dtype over its first bytes on device (default the
    current CUDA device). The tensor and its views keep the mapping alive;
    it stays valid after the exporter exits."""
    torch = _torch()
    dev = _device(device)
    raw = _open_bytes(desc, dev)
    n = 1
    for d in shape:
        n *= int(d)
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if nbytes > raw.numel():
        raise ValueError(f"xseg: {tuple(shape)} of {dtype} take {nbytes} bytes, the shared block has {raw.numel()}")
    return raw[:nbytes].view(dtype).view(tuple(shape))


def _rebuild_tensor(cls: Any, desc: bytes, device: int, nbytes: int, dtype: Any, size: Any, stride: Any,
                    offset: int, requires_grad: bool) -> Any:
    """The consumer's half of the torch.multiprocessing reducer: map the
    block and rebuild the tensor over it (this module is imported by the
    unpickler, so the consumer needs no install())."""
    torch = _torch()
    typestr = _typestr(dtype)
    if typestr is not None and offset == 0 and _c_order(size, stride) and _numel(size) * dtype.itemsize == nbytes:
        # The tensor is its whole storage, in C order, of a type the
        # array interface names: __cuda_array_interface__ makes it as it
        # is, one tensor and no set_.
        t = _open_bytes(desc, device, typestr, tuple(size), nbytes)
    else:
        # The storage's bytes, as many as the producer's storage had.
        raw = _open_bytes(desc, device, shape=(nbytes,), nbytes=nbytes)
        # raw's device and no allocation: new_empty skips parsing a device.
        t = raw.new_empty((0,), dtype=dtype)
        t.set_(raw.untyped_storage(), offset, size, stride)
    if cls is torch.nn.parameter.Parameter:
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    if cls is not torch.Tensor:
        t = t.as_subclass(cls)
    t.requires_grad_(requires_grad)
    return t


_typestrs: Dict[Any, str] = {}  # torch dtype -> __cuda_array_interface__ typestr


def _typestr(dtype: Any) -> Optional[str]:
    """The array interface's type string of dtype, or None (bfloat16 and
    the float8 types have none)."""
    if not _typestrs:
        torch = _torch()
        for d, ts in ((torch.float32, "<f4"), (torch.float16, "<f2"), (torch.float64, "<f8"),
                      (torch.int64, "<i8"), (torch.int32, "<i4"), (torch.int16, "<i2"), (torch.int8, "|i1"),
                      (torch.uint8, "|u1"), (torch.bool, "|b1"), (torch.complex64, "<c8"),
                      (torch.complex128, "<c16")):
            _typestrs[d] = ts
    return _typestrs.get(dtype)


def _numel(size: Any) -> int:
    n = 1
    for d in size:
        n *= d
    return n


def _c_order(size: Any, stride: Any) -> bool:
    """Whether stride is exactly size's C-order strides, in elements (what
    a tensor built without strides gets)."""
    want = 1
    for d, st in zip(reversed(size), reversed(stride)):
        if st != want:
            return False
        want *= d
    return True


def _reduce_tensor(tensor: Any) -> Any:
    """torch.multiprocessing's reducer for tensors, for CUDA tensors whose
    storage is an xseg block: one share per message that ends once its
    consumer has opened it (the consumer's mapping then keeps the pages,
    as PyTorch's IPC keeps the block until consumers drop it)."""
    storage = None
    if getattr(tensor, "is_cuda", False) and not tensor.is_sparse and not tensor.is_nested:
        storage = tensor.untyped_storage()
    if storage is None or storage.data_ptr() == 0:
        return _originals[("reductions", "reduce_tensor")](tensor)
    torch = _torch()
    dev = tensor.device.index or 0
    torch.cuda.current_stream(tensor.device).synchronize()
    try:
        desc = _lib.share_block(storage.data_ptr(), dev, importers=1)
    except XsegError as e:
        raise RuntimeError(
            f"xseg: cannot share this CUDA tensor with another process: {e}. Only memory xseg "
            "allocated can be shared (install(shareable=True), the default); a tensor over memory "
            "from elsewhere (an opened share, from_blob) must be copied first.") from None
    args = (type(tensor), desc, dev, storage.nbytes(), tensor.dtype, tuple(tensor.size()),
            tuple(tensor.stride()), tensor.storage_offset(), tensor.requires_grad)
    return (_rebuild_tensor, args)


def _reduce_storage(storage: Any) -> Any:
    if getattr(storage, "device", None) is None or storage.device.type != "cuda":
        return _originals[("reductions", "reduce_storage")](storage)
    torch = _torch()
    t = torch.empty((0,), dtype=torch.uint8, device=storage.device).set_(storage)
    return (_storage_of, (_reduce_tensor(t),))


def _storage_of(rebuilt: Tuple[Any, Tuple[Any, ...]]) -> Any:
    fn, args = rebuilt
    return fn(*args).untyped_storage()


def _patch_multiprocessing(torch: Any) -> None:
    import torch.multiprocessing  # noqa: F401  (registers PyTorch's reducers first)
    from multiprocessing.reduction import ForkingPickler
    from torch.multiprocessing import reductions
    for name, fn in (("reduce_tensor", _reduce_tensor), ("reduce_storage", _reduce_storage)):
        key = ("reductions", name)
        if key not in _originals:
            _originals[key] = getattr(reductions, name)
            setattr(reductions, name, fn)
    for t in list(torch._tensor_classes) + [torch.Tensor, torch.nn.parameter.Parameter]:
        ForkingPickler.register(t, _reduce_tensor)
    ForkingPickler.register(torch.UntypedStorage, _reduce_storage)


# torch.cuda.MemPool under xseg: a private pool of xseg's, the same kind a
# CUDA graph capture gets. PyTorch's MemPool constructor asks the
# allocator to create the pool (createOrIncrefPool), which a pluggable
# allocator refuses; use_mem_pool then only calls the begin/end/release
# hooks xseg implements.

class MemPool:
    """torch.cuda.MemPool for xseg: allocations inside
    ``with torch.cuda.use_mem_pool(pool):`` on this thread come from a
    private pool of xseg's that nothing outside it draws from; its memory
    goes back to the driver once the pool and every tensor from it are
    gone. A custom allocator, use_on_oom and no_split are PyTorch-allocator
    features: asking for them raises XsegError."""

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False) -> None:
        if allocator is not None:
            raise XsegError("xseg: torch.cuda.MemPool(allocator=...) would put a second allocator under "
                            "xseg; PyTorch cannot mix them. Use MemPool() (xseg's pool) instead.")
        if use_on_oom or no_split:
            raise XsegError("xseg: MemPool(use_on_oom=..., no_split=...) are options of PyTorch's own "
                            "allocator; xseg's pools neither lend memory on OOM nor split differently.")
        torch = _torch()
        self._device = torch.cuda.current_device()
        self._id = tuple(int(x) for x in torch.cuda.graph_pool_handle())
        _lib.pool_retain(self._device, self._id)
        self._release = weakref.finalize(self, _release_pool_quietly, self._device, self._id)
        self._release.atexit = False

    @property
    def id(self) -> Tuple[int, int]:
        """The pool's id, as torch.cuda.MemPool.id."""
        return self._id  # type: ignore[return-value]

    @property
    def allocator(self) -> None:
        """None: the pool is xseg's."""
        return None

    def use_count(self) -> int:
        """1 while this MemPool lives (uses by active use_mem_pool blocks
        are not counted)."""
        return 1 if self._release.alive else 0

    def snapshot(self, include_traces: bool = True) -> List[Dict[str, Any]]:
        """The segments of this pool, as torch.cuda.memory_snapshot."""
        return torch_snapshot((self._id[0], self._id[1], include_traces))["segments"]


def _release_pool_quietly(device: int, pool: Tuple[int, int]) -> None:
    lib = _lib.loaded()
    if lib is not None:
        lib.xseg_pool_release(device, pool[0], pool[1])


# install / uninstall.

def is_installed() -> bool:
    """Whether install() made xseg this process's CUDA allocator."""
    return _allocator is not None


def install(path: Optional[str] = None, conf: Optional[str] = None, enable_logging: Any = False,
            route_record_stream: bool = True, raise_on_oom: bool = True, shareable: bool = True) -> None:
    """Make xseg the CUDA allocator of this process.

    Call it before anything touches CUDA: PyTorch swaps allocators only
    before its first CUDA allocation, and never back. conf is an XSEG_CONF
    string ("oom_max_retries:3,release_threshold_mb:1024") applied over the
    XSEG_CONF environment variable; enable_logging logs to standard error
    (every step of the OOM policy included), or at the level named
    ("debug"). shareable makes pages exportable, so that tensors can go
    through torch.multiprocessing. route_record_stream gives PyTorch xseg's
    record-stream hook (Tensor.record_stream then orders the block's reuse
    after the other stream's work). raise_on_oom installs
    xseg_malloc_or_throw, so that running out of memory raises
    torch.OutOfMemoryError ("CUDA out of memory. ...").

    It then makes these PyTorch functions work with xseg's numbers:
    torch.cuda.memory_allocated, memory_reserved, max_memory_*,
    memory_stats(_as_nested_dict), memory_summary, reset_peak_memory_stats,
    reset_accumulated_memory_stats, empty_cache, set_per_process_memory_fraction,
    get_per_process_memory_fraction, memory_snapshot,
    memory._record_memory_history / _snapshot / _dump_snapshot,
    torch.cuda.MemPool / use_mem_pool, CUDA graphs and torch.compile's graph
    trees, CUDA tensors through torch.multiprocessing (also those sent by
    processes on PyTorch's own allocator), and cuDNN's autotuner
    (torch.backends.cudnn.benchmark, through PyTorch's cacheInfo).

    Installing again only checks the library. Raises RuntimeError when CUDA
    is already initialized or PyTorch refuses the swap, ValueError for a
    configuration that does not parse."""
    global _allocator
    torch = _torch()
    with _lock:
        if _allocator is not None:
            _lib.load(path)
            return
        if torch.cuda.is_initialized():
            raise RuntimeError(
                "xseg.install(): CUDA is already initialized in this process, so PyTorch's own "
                "allocator may already hold memory and cannot be replaced. Call install() first, "
                "before any tensor is created on the GPU (and before torch.cuda.init()).")
        lib = _lib.load(path)
        _configure(conf, enable_logging, shareable)
        malloc = "xseg_malloc_or_throw" if raise_on_oom else "xseg_malloc"
        alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib.library_path(), malloc, "xseg_free")
        _set_hooks(alloc, lib, route_record_stream)
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError(
                "xseg.install(): PyTorch refused to swap its CUDA allocator (it does so only "
                f"before the first CUDA allocation, and only once): {e}") from e
        _allocator = alloc
        _patch_torch(torch)
        _route_cache_info(lib)
        _log.info("xseg %s installed as the CUDA allocator (%s)", _lib.version(), _lib.library_path())


setup_allocator = install


def _configure(conf: Optional[str], enable_logging: Any, shareable: bool) -> None:
    parts = ["shareable:true"] if shareable else []
    if enable_logging:
        level = enable_logging if isinstance(enable_logging, str) else "info"
        _lib.set_log_level(level)
        parts.append("oom_verbose:true")
    if conf:
        parts.append(conf)
    if parts:
        _lib.configure(",".join(parts))


def _fn_addr(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def _set_hooks(alloc: Any, lib: ctypes.CDLL, record_stream: bool) -> None:
    hooks = alloc._allocator
    pool_hooks = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
    if not all(hasattr(hooks, n) for n in pool_hooks):
        raise RuntimeError(
            "xseg.install(): this PyTorch has no private-pool hooks for pluggable allocators "
            "(they came in PyTorch 2.3); without them CUDA graphs would share memory between captures "
            "and compute wrong results. Use PyTorch 2.3 or newer.")
    hooks.set_begin_allocate_to_pool(_fn_addr(lib, "xseg_begin_allocate_to_pool"))
    hooks.set_end_allocate_to_pool_fn(_fn_addr(lib, "xseg_end_allocate_to_pool"))
    hooks.set_release_pool(_fn_addr(lib, "xseg_release_pool"))
    hooks.set_reset_fn(_fn_addr(lib, "xseg_empty_cache_hook"))
    hooks.set_memory_fraction_fn(_fn_addr(lib, "xseg_memory_fraction_hook"))
    if record_stream:
        hooks.set_record_stream_fn(_fn_addr(lib, "xseg_record_stream_hook"))


def _route_cache_info(lib: ctypes.CDLL) -> None:
    """Give PyTorch's pluggable allocator xseg's cacheInfo, which cuDNN's
    autotuner (torch.backends.cudnn.benchmark) calls and PyTorch offers no
    hook for (libxseg's xseg.h says how). If it cannot, everything else
    works and benchmark-mode convolutions raise as they would without it."""
    if lib.xseg_torch_route_cache_info() != 0:
        _log.warning("xseg.install(): torch.backends.cudnn.benchmark will raise with xseg installed "
                     "(PyTorch's cacheInfo could not be routed to xseg: %s)", _lib.thread_error())


def _replace(owner: Any, key: str, name: str, fn: Any) -> None:
    if (key, name) in _originals or not hasattr(owner, name):
        return
    _originals[(key, name)] = getattr(owner, name)
    setattr(owner, name, fn)


def _patch_torch(torch: Any) -> None:
    """Route the torch._C functions that torch.cuda calls for memory
    questions to xseg, and the rest (see install)."""
    c = torch._C
    _replace(c, "C", "_cuda_memoryStats", torch_memory_stats)
    _replace(c, "C", "_cuda_resetPeakMemoryStats", lambda device: _lib.reset_peak_stats(_device(device)))
    _replace(c, "C", "_cuda_resetAccumulatedMemoryStats",
             lambda device: _lib.reset_accumulated_stats(_device(device)))
    _replace(c, "C", "_cuda_memorySnapshot", torch_snapshot)
    _replace(c, "C", "_cuda_record_memory_history", record_memory_history)
    _replace(c, "C", "_cuda_record_memory_history_legacy", _record_memory_history_legacy)
    _replace(c, "C", "_cuda_getMemoryFraction", lambda device: _fraction_or_one(_device(device)))
    _graphs.patch_graph_trees(torch)
    _patch_multiprocessing(torch)
    # Tensors from processes on PyTorch's own allocator (_nativeipc says how).
    _replace(torch.UntypedStorage, "UntypedStorage", "_new_shared_cuda", staticmethod(_nativeipc.new_shared_cuda))
    for owner, key in ((torch.cuda, "cuda"), (torch.cuda.memory, "cuda.memory")):
        _replace(owner, key, "MemPool", MemPool)


def _fraction_or_one(device: int) -> float:
    """torch.cuda.get_per_process_memory_fraction under xseg: the fraction
    set (0.0 too, which allows no growth), 1.0 when there is no limit."""
    f = _lib.memory_fraction(device)
    if f > 0:
        return f
    return 0.0 if _lib.raw_stats(device).get("memory_limit_set") else 1.0


def uninstall() -> None:
    """Stop what xseg can stop: empty xseg's cache (its free pages go back to
    the driver) and stop recording allocation history. PyTorch itself keeps
    xseg as its CUDA allocator for the rest of the process: it swaps
    allocators only before the first CUDA allocation and offers no way back,
    so tensors allocated after uninstall() still come from xseg, and
    torch.cuda's memory functions go on reporting xseg's numbers. To run
    without xseg, start a process that does not call install()."""
    torch = sys.modules.get("torch")
    with _lock:
        if _allocator is None:
            return
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            _lib.empty_cache(-1)
            for dev in list(_history_devices):
                _lib.record_history(dev, 0)
            _history_devices.clear()
    _log.warning("xseg.uninstall(): xseg's cache is empty; PyTorch keeps xseg as its CUDA allocator "
                 "for the rest of this process (PyTorch cannot swap an allocator back)")


@contextlib.contextmanager
def installed(path: Optional[str] = None, conf: Optional[str] = None, enable_logging: Any = False,
              route_record_stream: bool = True, raise_on_oom: bool = True,
              shareable: bool = True) -> Iterator[Any]:
    """install() for a block: ``with xseg.installed(): train()``. On
    leaving the block xseg's cache is emptied (see uninstall(): PyTorch
    keeps xseg as its allocator for the rest of the process). It exits
    quietly; an exception from the block propagates unchanged."""
    install(path, conf, enable_logging, route_record_stream, raise_on_oom, shareable)
    try:
        yield sys.modules[__package__ or "xseg"]
    finally:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            try:
                torch.cuda.synchronize()
                _lib.empty_cache(-1)
            except (RuntimeError, XsegError) as e:  # the block's own exception matters more
                _log.warning("xseg.installed(): emptying the cache on exit: %s", e)

