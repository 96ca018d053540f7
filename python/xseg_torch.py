"""xseg as PyTorch's CUDA allocator.

Load libxseg.so (``go build -buildmode=c-shared -o libxseg.so ./cmd/libxseg``)
as the process's CUDA allocator, before the first CUDA allocation::

    import xseg_torch
    xseg_torch.install(conf="oom_max_retries:3")   # first thing
    import torch
    x = torch.empty(1 << 20, device="cuda")         # xseg's memory
    print(xseg_torch.stats()["reserved_bytes.all.peak"])

The library is found from the ``path`` argument, the ``XSEG_LIB`` environment
variable, or next to this file, its parent folder (the repository root) and
``.gpu-lib/`` there. Only ``ctypes`` and (for ``install``) ``torch`` are used.

PyTorch does not pass ``Tensor.record_stream`` on to a pluggable allocator, so
``install`` patches ``torch.Tensor.record_stream`` to tell xseg as well
(``xseg_record_stream``): a block used on a second stream is then reused only
after that stream's work has finished. ``install(route_record_stream=False)``
leaves PyTorch's behaviour alone (and memory used on a second stream can be
handed out again while that stream still reads it).

The functions are safe to call from any thread. Statistics use PyTorch's key
names (``allocated_bytes.all.current``, ``reserved_bytes.all.peak``,
``num_alloc_retries``, ``num_ooms``, ...), flattened as
``torch.cuda.memory_stats`` flattens them.
"""

import contextlib
import ctypes
import json
import os
import sys
import threading
import weakref

__all__ = [
    "find_library", "load", "install", "installed", "is_installed",
    "set_record_stream_routing", "stats", "memory_used", "memory_total",
    "memory_free", "memory_allocated", "memory_reserved", "peak_memory",
    "max_memory_allocated", "max_memory_reserved", "num_ooms",
    "num_alloc_retries", "empty_cache", "clear_cache", "reset_peak_stats",
    "snapshot", "last_error", "version", "share", "unshare", "open",
    "pool_allocations", "graph_tree_calls",
]

_LIB_NAME = "libxseg.so"
_lock = threading.RLock()
_lib = None
_lib_path = None
_allocator = None  # the CUDAPluggableAllocator, kept alive while installed
_routing = False
_orig_record_stream = None


def find_library(path=None):
    """Return the absolute path of libxseg.so: ``path``, else ``$XSEG_LIB``,
    else the first that exists of this file's folder, its parent and
    ``.gpu-lib/`` in either. Raises FileNotFoundError naming what was tried."""
    if path is None:
        path = os.environ.get("XSEG_LIB") or None
    if path is not None:
        path = os.path.abspath(os.fspath(path))
        if not os.path.isfile(path):
            raise FileNotFoundError(f"xseg: library {path} does not exist")
        return path
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    tried = [os.path.join(d, _LIB_NAME) for d in
             (here, root, os.path.join(here, ".gpu-lib"), os.path.join(root, ".gpu-lib"))]
    for p in tried:
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(
        "xseg: cannot find libxseg.so; build it with "
        "`go build -buildmode=c-shared -o libxseg.so ./cmd/libxseg` and pass its path "
        "or set XSEG_LIB. Tried: " + ", ".join(tried))


def _declare(lib):
    c = ctypes
    sigs = {
        "xseg_malloc": (c.c_void_p, [c.c_ssize_t, c.c_int, c.c_void_p]),
        "xseg_free": (None, [c.c_void_p, c.c_ssize_t, c.c_int, c.c_void_p]),
        "xseg_record_stream": (c.c_int, [c.c_void_p, c.c_void_p]),
        "xseg_stats_json": (c.c_void_p, [c.c_int]),
        "xseg_snapshot_json": (c.c_void_p, [c.c_int]),
        "xseg_string_free": (None, [c.c_void_p]),
        "xseg_empty_cache": (c.c_int, [c.c_int]),
        "xseg_reset_peak_stats": (c.c_int, [c.c_int]),
        "xseg_configure": (c.c_int, [c.c_char_p]),
        "xseg_set_log_level": (c.c_int, [c.c_char_p]),
        "xseg_share": (c.c_ssize_t, [c.c_void_p, c.c_int, c.c_void_p, c.c_size_t]),
        "xseg_unshare": (c.c_int, [c.c_char_p, c.c_size_t]),
        "xseg_open": (c.c_int64, [c.c_char_p, c.c_size_t, c.c_int,
                                  c.POINTER(c.c_void_p), c.POINTER(c.c_size_t)]),
        "xseg_close": (c.c_int, [c.c_int64]),
        "xseg_pool_json": (c.c_void_p, [c.c_int, c.c_ulonglong, c.c_ulonglong, c.c_int]),
        "xseg_pool_restore": (c.c_void_p, [c.c_int, c.c_char_p, c.c_size_t]),
        "xseg_malloc_in_pool": (c.c_void_p, [c.c_ssize_t, c.c_int, c.c_void_p, c.c_ulonglong, c.c_ulonglong]),
        "xseg_version": (c.c_char_p, []),
        "xseg_last_error": (c.c_char_p, []),
    }
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args


def load(path=None):
    """Load libxseg.so once (see find_library) and return its ctypes.CDLL,
    with every function's signature declared. A second call with another
    path raises RuntimeError: a process has one xseg."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            if path is not None and os.path.abspath(os.fspath(path)) != _lib_path:
                raise RuntimeError(f"xseg: {_lib_path} is already loaded; cannot load {path} too")
            return _lib
        p = find_library(path)
        lib = ctypes.CDLL(p)
        _declare(lib)
        _lib, _lib_path = lib, p
        return lib


def last_error():
    """The text of xseg's most recent failure (any thread), or None."""
    s = load().xseg_last_error()
    return s.decode(errors="replace") if s else None


def version():
    """The library's version string."""
    return load().xseg_version().decode()


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"xseg: {what} failed: {last_error()}")


def _json(fn, device):
    lib = load()
    p = fn(_device(device))
    if not p:
        raise RuntimeError(f"xseg: {fn.__name__} failed: {last_error()}")
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.xseg_string_free(p)


def _device(device):
    """A device ordinal from an int or torch.device; None (or a device
    without an index) is torch's current device once CUDA is initialized,
    else 0."""
    if isinstance(device, int):
        return device
    index = getattr(device, "index", None)
    if index is not None:
        return index
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return 0


def _flatten(d, prefix="", out=None):
    out = {} if out is None else out
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            _flatten(v, key + ".", out)
        else:
            out[key] = v
    return out


def stats(device=None):
    """Statistics of one device as a flat dict with PyTorch's key names
    ("allocated_bytes.all.current", "reserved_bytes.large_pool.peak",
    "allocation.all.allocated", "num_alloc_retries", "num_ooms", ...) and
    xseg's own ("num_maps", "num_pages_reused", "device_total_bytes", ...).
    All zero for a device that has not allocated yet."""
    return _flatten(_json(load().xseg_stats_json, device))


def memory_allocated(device=None):
    """Bytes of blocks handed out now (torch.cuda.memory_allocated)."""
    return stats(device)["allocated_bytes.all.current"]


def memory_reserved(device=None):
    """Bytes of device memory xseg holds now (torch.cuda.memory_reserved)."""
    return stats(device)["reserved_bytes.all.current"]


def max_memory_allocated(device=None):
    """Peak of memory_allocated since start or reset_peak_stats."""
    return stats(device)["allocated_bytes.all.peak"]


def max_memory_reserved(device=None):
    """Peak of memory_reserved since start or reset_peak_stats."""
    return stats(device)["reserved_bytes.all.peak"]


memory_used = memory_allocated
peak_memory = max_memory_allocated


def memory_total(device=None):
    """The device's total memory in bytes, as the driver reports it; 0 until
    xseg has made its first allocation."""
    return stats(device)["device_total_bytes"]


def memory_free(device=None):
    """The device's free memory in bytes (all processes), as the driver
    reports it; 0 until xseg has made its first allocation."""
    return stats(device)["device_free_bytes"]


def num_ooms(device=None):
    """How many allocations failed for want of memory."""
    return stats(device)["num_ooms"]


def num_alloc_retries(device=None):
    """How many allocations succeeded only after emptying the cache."""
    return stats(device)["num_alloc_retries"]


def empty_cache(device=-1):
    """Give every whole free page back to the driver (device -1: all)."""
    _check(load().xseg_empty_cache(device), "empty_cache")


clear_cache = empty_cache


def reset_peak_stats(device=-1):
    """Make every peak the current value (device -1: all)."""
    _check(load().xseg_reset_peak_stats(device), "reset_peak_stats")


def snapshot(device=None):
    """Segments, mapped ranges and blocks of one device, with its stats, as a
    dict (nested, as the library's JSON)."""
    return _json(load().xseg_snapshot_json, device)


# Cross-process sharing. PyTorch's own CUDA IPC refuses memory of a
# pluggable allocator; these share xseg blocks instead (package ipc: pidfd_getfd
# where the kernel allows it, else the exporter's Unix socket).

_DESC_CAP = 1 << 16


def share(tensor):
    """Share tensor's storage with other processes and return the descriptor
    (bytes) to send them any way you like; they call open() with it. The
    allocator must be shareable: install(conf="shareable:true") or
    XSEG_CONF=shareable:true. The storage's pages stay out of reuse until
    this share ends (when tensor is garbage collected, or unshare(desc)) and
    every importer has closed its tensor or died, even after tensor is
    freed. Waits for the work queued on tensor's device's current stream, so
    importers see the bytes written so far."""
    import torch
    if not tensor.is_cuda or tensor.storage_offset() != 0:
        raise ValueError("xseg: share needs a CUDA tensor that starts its storage (storage_offset 0)")
    torch.cuda.current_stream(tensor.device).synchronize()
    buf = ctypes.create_string_buffer(_DESC_CAP)
    n = load().xseg_share(tensor.untyped_storage().data_ptr(), tensor.device.index or 0, buf, _DESC_CAP)
    if n < 0:
        raise RuntimeError(f"xseg: share failed: {last_error()}")
    desc = buf.raw[:n]
    weakref.finalize(tensor, _unshare_quietly, desc)
    return desc


def _unshare_quietly(desc):
    if _lib is not None:
        _lib.xseg_unshare(desc, len(desc))


def unshare(desc):
    """Stop serving new importers of desc (from share); importers that
    opened it keep their mapping."""
    _check(load().xseg_unshare(desc, len(desc)), "unshare")


class _Mapping:
    """An open xseg mapping; __cuda_array_interface__ exposes its bytes. The
    tensors made over it keep it alive; the last one to go closes it."""

    def __init__(self, handle, ptr, size):
        self.handle, self.ptr, self.size = handle, ptr, size
        self.__cuda_array_interface__ = {
            "shape": (size,), "typestr": "|u1", "data": (ptr, False),
            "version": 3, "strides": None, "stream": None,
        }

    def __del__(self):
        if self.handle > 0 and _lib is not None:
            _lib.xseg_close(self.handle)
            self.handle = -1


def open(desc, shape, dtype, device=None):
    """Map the block that desc (from share() in any process) names and return
    a tensor of shape and dtype over its first bytes on device (default the
    current CUDA device). The tensor, and every view of it, keeps the
    mapping alive; it stays valid after the exporter exits. Opening one
    descriptor twice in a process shares one mapping."""
    import torch
    dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
    h = load().xseg_open(bytes(desc), len(desc), idx, ctypes.byref(ptr), ctypes.byref(size))
    if h < 0:
        raise RuntimeError(f"xseg: open failed: {last_error()}")
    m = _Mapping(h, ptr.value, size.value)
    n = 1
    for d in shape:
        n *= int(d)
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    if nbytes > m.size:
        raise ValueError(f"xseg: {tuple(shape)} of {dtype} take {nbytes} bytes, the shared block has {m.size}")
    with torch.cuda.device(idx):
        raw = torch.as_tensor(m, device=dev)
    return raw[:nbytes].view(dtype).view(tuple(shape))


def is_installed():
    """Whether install() made xseg this process's CUDA allocator."""
    return _allocator is not None


def _record_stream(tensor, stream):
    """torch.Tensor.record_stream, routed to xseg as well."""
    _orig_record_stream(tensor, stream)
    if not _routing or not tensor.is_cuda:
        return
    ptr = tensor.untyped_storage().data_ptr()
    if not ptr:
        return
    handle = getattr(stream, "cuda_stream", None)
    if handle is None:  # a generic torch.Stream of a CUDA device
        import torch
        handle = torch.cuda.Stream(stream_id=stream.stream_id, device_index=stream.device_index,
                                   device_type=stream.device_type).cuda_stream
    if load().xseg_record_stream(ptr, handle) < 0:
        raise RuntimeError(f"xseg: record_stream failed: {last_error()}")


def set_record_stream_routing(on):
    """Route torch.Tensor.record_stream to xseg too (on=True), or not. The
    original method is always called; the patch is made once and stays."""
    global _routing, _orig_record_stream
    import torch
    with _lock:
        if on and _orig_record_stream is None:
            _orig_record_stream = torch.Tensor.record_stream
            torch.Tensor.record_stream = _record_stream
        _routing = bool(on)


def install(path=None, conf=None, enable_logging=False, route_record_stream=True, raise_on_oom=True):
    """Make xseg the CUDA allocator of this process.

    Call it before anything touches CUDA: PyTorch swaps allocators only
    before its first CUDA allocation, and never back. conf is an XSEG_CONF
    string ("oom_max_retries:3,release_threshold_mb:1024") applied over the
    XSEG_CONF environment variable; enable_logging logs to standard error
    (every step of the OOM policy included), or at the level named ("debug").
    route_record_stream: see set_record_stream_routing. raise_on_oom
    installs xseg_malloc_or_throw, so that a failed allocation raises a
    RuntimeError ("xseg_malloc: ... out of memory ...") in Python; PyTorch
    does not check the NULL that xseg_malloc returns (raise_on_oom=False)
    and would hand out a tensor at address 0. Installing again with the same
    library only changes the routing.
    Raises RuntimeError when CUDA is already initialized or PyTorch refuses
    the swap, ValueError for a configuration that does not parse."""
    global _allocator
    import torch
    with _lock:
        if _allocator is not None:
            load(path)
            set_record_stream_routing(route_record_stream)
            return
        if torch.cuda.is_initialized():
            raise RuntimeError(
                "xseg_torch.install(): CUDA is already initialized in this process, so PyTorch's own "
                "allocator may already hold memory and cannot be replaced. Call install() first, "
                "before any tensor is created on the GPU (and before torch.cuda.init()).")
        lib = load(path)
        _configure(lib, conf, enable_logging)
        malloc = "xseg_malloc_or_throw" if raise_on_oom else "xseg_malloc"
        alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, malloc, "xseg_free")
        try:
            torch.cuda.memory.change_current_allocator(alloc)
        except RuntimeError as e:
            raise RuntimeError(
                "xseg_torch.install(): PyTorch refused to swap its CUDA allocator (it does so only "
                f"before the first CUDA allocation, and only once): {e}") from e
        _set_pool_hooks(alloc, lib)
        _allocator = alloc
        set_record_stream_routing(route_record_stream)
        _patch_graph_trees(torch)


def _configure(lib, conf, enable_logging):
    if enable_logging:
        level = enable_logging if isinstance(enable_logging, str) else "info"
        _check(lib.xseg_set_log_level(level.encode()), "enabling logging")
        conf = ",".join(c for c in (conf, "oom_verbose:true") if c)
    if conf:
        if lib.xseg_configure(conf.encode()) != 0:
            raise ValueError(f"xseg: configuration {conf!r}: {last_error()}")


@contextlib.contextmanager
def installed(path=None, conf=None, enable_logging=False, route_record_stream=True, raise_on_oom=True,
              keep=False):
    """install() for a block: ``with xseg_torch.installed(): train()``.

    On leaving the block xseg's cache is emptied and PyTorch's previous
    allocator put back where PyTorch allows it. PyTorch (up to at least 2.11)
    never allows it: a pluggable allocator counts as initialized from the
    moment it is made, and change_current_allocator refuses to replace an
    initialized allocator. So, unless keep=True says that xseg staying for
    the rest of the process is intended, leaving the block raises
    RuntimeError saying so (an exception from the block itself is left to
    propagate instead)."""
    import torch
    try:
        previous = torch.cuda.memory._get_current_allocator()
    except (AttributeError, RuntimeError):
        previous = None
    install(path, conf, enable_logging, route_record_stream, raise_on_oom)
    try:
        yield sys.modules[__name__]
    except BaseException:
        _leave(torch, previous, keep=True)
        raise
    _leave(torch, previous, keep)


def _leave(torch, previous, keep):
    global _allocator
    if torch.cuda.is_initialized():
        empty_cache()
    if keep:
        return
    reason = "PyTorch offers no way to get its previous allocator back"
    if previous is not None:
        try:
            torch.cuda.memory.change_current_allocator(previous)
        except RuntimeError as e:
            reason = f"PyTorch refuses to swap an allocator that is initialized ({e})"
        else:
            with _lock:
                _allocator = None
                set_record_stream_routing(False)
            return
    raise RuntimeError(
        "xseg_torch.installed(): cannot put PyTorch's allocator back: " + reason + ". xseg "
        "stays this process's CUDA allocator (its cache was emptied). Use installed(keep=True), "
        "or install() once at start-up, where that is intended.")


# CUDA graphs. A captured graph replays its kernels at the addresses they
# had during capture, temporaries freed inside the capture included, so a
# capture's memory must go to nothing else while the graph lives. PyTorch
# tells its allocator through three hooks of CUDAPluggableAllocator:
# begin-allocate-to-pool (with a filter: the capturing stream, or the
# calling thread), end-allocate-to-pool and release-pool. libxseg
# implements them (cmd/libxseg/pools.cc): allocations the filter accepts
# come from a private pool that nothing outside it draws from, and the last
# release gives the pool's memory back.

def _fn_addr(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _set_pool_hooks(alloc, lib):
    hooks = alloc._allocator
    names = ("set_begin_allocate_to_pool", "set_end_allocate_to_pool_fn", "set_release_pool")
    if not all(hasattr(hooks, n) for n in names):
        raise RuntimeError(
            "xseg_torch.install(): this PyTorch has no private-pool hooks for pluggable allocators "
            "(they came in PyTorch 2.3); without them CUDA graphs would share memory between captures "
            "and compute wrong results. Use PyTorch 2.3 or newer.")
    hooks.set_begin_allocate_to_pool(_fn_addr(lib, "xseg_begin_allocate_to_pool"))
    hooks.set_end_allocate_to_pool_fn(_fn_addr(lib, "xseg_end_allocate_to_pool"))
    hooks.set_release_pool(_fn_addr(lib, "xseg_release_pool"))


def pool_allocations(pool, device=None):
    """Addresses of the blocks allocated now in private pool ``pool`` (a
    ``torch.cuda.graph_pool_handle()`` or ``CUDAGraph.pool()``), sorted."""
    first, second = pool
    return _json_call(lambda lib: lib.xseg_pool_json(_device(device), first, second, 0), "pool_allocations")


def _json_call(call, what):
    lib = load()
    p = call(lib)
    if not p:
        raise RuntimeError(f"xseg: {what} failed: {last_error()}")
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.xseg_string_free(p)


# torch.compile(mode="reduce-overhead") runs CUDA graph trees
# (torch/_inductor/cudagraph_trees.py), which reach the allocator through a
# few torch._C functions besides the hooks above. PyTorch implements them
# for its own allocator only (the pluggable allocator raises "does not yet
# support"), so install() replaces them with versions that ask xseg, and
# leaves every call about memory that is not xseg's to the original:
#
# - _cuda_checkPoolLiveAllocations: are the pool's allocated blocks exactly
#   the live storages?
# - _cuda_getCheckpointState / _cuda_setCheckpointPoolState: remember which
#   blocks of the pool were allocated after a recording, and put the pool
#   back to that before the next recording (a replay changes bytes, not
#   books). Storages that replays made hold no deleter; PyTorch gives the
#   live ones the allocator's deleter at that point. A pluggable allocator
#   cannot hand out such a deleter from Python, so xseg frees their blocks
#   when the storage dies instead (a finalizer on the storage, which PyTorch
#   keeps alive exactly as long as the storage).
# - _cuda_cudaCachingAllocator_raw_delete, _free_And_Remove_DeleterFn,
#   _has_Standard_Deleter: free, and answer for, those blocks.

class _PoolCheckpoint:
    """What _cuda_getCheckpointState returns under xseg: the pool's
    allocated blocks, as libxseg's JSON."""

    __slots__ = ("device", "pool", "data")

    def __init__(self, device, pool, data):
        self.device, self.pool, self.data = device, pool, data


_graph_lock = threading.Lock()
_tracked = {}      # StorageImpl address -> (finalizer, data ptr, device)
_restored = {}     # data ptr -> device: allocated again by a restore, no owner yet
_graph_originals = {}


def _free_block(ptr, device):
    if _lib is not None:
        _lib.xseg_free(ptr, 0, device, None)


def _storage_died(cdata, ptr, device):
    with _graph_lock:
        _tracked.pop(cdata, None)
    _free_block(ptr, device)


def _check_pool_live_allocations(device, pool, expected):
    try:
        live = pool_allocations(tuple(pool), device)
    except RuntimeError:
        return len(expected) == 0
    return set(live) == set(expected)


def _get_checkpoint_state(device, pool):
    first, second = pool
    data = _json_call(lambda lib: lib.xseg_pool_json(int(device), first, second, 1), "getCheckpointState")
    return _PoolCheckpoint(int(device), (first, second), json.dumps(data).encode())


def _set_checkpoint_pool_state(device, state, stale_storages, storages_to_add_deleters_to=()):
    import torch
    if not isinstance(state, _PoolCheckpoint):
        return _graph_originals["_cuda_setCheckpointPoolState"](device, state, stale_storages,
                                                                 storages_to_add_deleters_to)
    device = int(device)
    stale = list(dict.fromkeys(stale_storages))
    with _graph_lock:
        untracked = [c for c in stale if c not in _tracked]
    if untracked:
        raise NotImplementedError(
            "xseg: setCheckpointPoolState with stale storages that still hold the allocator's deleter "
            "is not supported under a pluggable allocator (PyTorch's CUDA graph trees pass none)")
    res = _json_call(lambda lib: lib.xseg_pool_restore(device, state.data, len(state.data)),
                     "setCheckpointPoolState")
    allocated, freed = set(res["allocated"]), res["freed"]
    with _graph_lock:
        for c in stale:
            fin, _, _ = _tracked.pop(c)
            fin.detach()
        definite = [p for p in freed if p not in allocated]
        for p in definite:
            _restored.pop(p, None)
        for p in allocated:
            _restored[p] = device
    if len(stale) < len(definite):
        raise RuntimeError("Any stale tensors which are being manually freed must be passed to set checkpoint")
    for cdata in storages_to_add_deleters_to:
        st = torch.UntypedStorage._new_with_weak_ptr(cdata)
        ptr = st.data_ptr()
        with _graph_lock:
            if _restored.pop(ptr, None) is None:
                raise RuntimeError(f"xseg: setCheckpointPoolState: storage at {ptr:#x} is not a block "
                                   "the checkpoint allocated")
            fin = weakref.finalize(st, _storage_died, cdata, ptr, device)
            fin.atexit = False
            _tracked[cdata] = (fin, ptr, device)
        del st


def _raw_delete(ptr):
    with _graph_lock:
        device = _restored.pop(ptr, None)
    if device is None:
        return _graph_originals["_cuda_cudaCachingAllocator_raw_delete"](ptr)
    _free_block(ptr, device)


def _free_and_remove_deleter(cdata):
    with _graph_lock:
        entry = _tracked.pop(cdata, None)
    if entry is None:
        return _graph_originals["_free_And_Remove_DeleterFn"](cdata)
    fin, ptr, device = entry
    fin.detach()
    _free_block(ptr, device)


def _has_standard_deleter(cdata):
    with _graph_lock:
        if cdata in _tracked:
            return True
    return _graph_originals["_has_Standard_Deleter"](cdata)


def graph_tree_calls():
    """How many times each torch._C function of CUDA graph trees that
    install() routes to xseg has been called (for tests and diagnosis)."""
    with _graph_lock:
        return dict(_graph_calls)


_graph_calls = {}


def _counted(name, fn):
    def call(*args):
        with _graph_lock:
            _graph_calls[name] = _graph_calls.get(name, 0) + 1
        return fn(*args)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = fn.__doc__
    return call


_GRAPH_TREE_PATCHES = {
    "_cuda_checkPoolLiveAllocations": _check_pool_live_allocations,
    "_cuda_getCheckpointState": _get_checkpoint_state,
    "_cuda_setCheckpointPoolState": _set_checkpoint_pool_state,
    "_cuda_cudaCachingAllocator_raw_delete": _raw_delete,
    "_free_And_Remove_DeleterFn": _free_and_remove_deleter,
    "_has_Standard_Deleter": _has_standard_deleter,
}


def _patch_graph_trees(torch):
    """Route the torch._C functions of CUDA graph trees to xseg (once)."""
    with _graph_lock:
        for name, fn in _GRAPH_TREE_PATCHES.items():
            if name in _graph_originals or not hasattr(torch._C, name):
                continue
            _graph_originals[name] = getattr(torch._C, name)
            setattr(torch._C, name, _counted(name, fn))
