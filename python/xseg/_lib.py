"""The ctypes layer over libxseg.so: loading it, declaring every function of
cmd/libxseg/xseg.h, and thin Python functions over them. Nothing here
imports torch; the host backend (``XSEG_BACKEND=host``) runs all of it on a
machine without a GPU."""

from __future__ import annotations

import ctypes
import json
import operator
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

LIB_NAME = "libxseg.so"

_lock = threading.RLock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None


class XsegError(RuntimeError):
    """A libxseg call failed; the message is libxseg's reason."""


class PausedError(XsegError):
    """An allocation went to a paused tag (see xseg.pause): resume the tag
    first. (Allocations PyTorch makes through an installed xseg raise
    RuntimeError with the same text, "the tag is paused".)"""


class OutOfMemoryError(XsegError, MemoryError):
    """An allocation through the ctypes layer found no memory. (Allocations
    PyTorch makes through an installed xseg raise torch.OutOfMemoryError
    instead.)"""


def _candidates() -> List[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    parent = os.path.dirname(here)
    root = os.path.dirname(parent)
    return [os.path.join(d, LIB_NAME) for d in
            (here, parent, root, os.path.join(parent, ".gpu-lib"), os.path.join(root, ".gpu-lib"))]


def find_library(path: Optional[str] = None) -> str:
    """The absolute path of libxseg.so: ``path``, else ``$XSEG_LIB``, else
    the copy inside this package (a wheel ships one), else one in the source
    tree (``python/``, the repository root, ``.gpu-lib/``). Raises
    FileNotFoundError naming what was tried (or saying that a path given
    is a directory)."""
    if path is None:
        path = os.environ.get("XSEG_LIB") or None
    if path is not None:
        path = os.path.abspath(os.fspath(path))
        if os.path.isdir(path):
            inside = os.path.join(path, LIB_NAME)
            hint = f" (did you mean {inside}?)" if os.path.isfile(inside) else ""
            raise FileNotFoundError(f"xseg: library {path} is a directory, not the library's file{hint}")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"xseg: library {path} does not exist")
        return path
    tried = _candidates()
    for p in tried:
        if os.path.isfile(p):
            return p
    raise FileNotFoundError(
        "xseg: cannot find libxseg.so. Install the package from a wheel (pip install ./python builds "
        "one with Go), or build it with `go build -buildmode=c-shared -o libxseg.so ./cmd/libxseg` and "
        "set XSEG_LIB. Tried: " + ", ".join(tried))


_c = ctypes
_VP, _INT, _SZ, _SSZ, _ULL = _c.c_void_p, _c.c_int, _c.c_size_t, _c.c_ssize_t, _c.c_ulonglong
_SIGNATURES: Dict[str, Tuple[Any, List[Any]]] = {
    "xseg_malloc": (_VP, [_SSZ, _INT, _VP]),
    "xseg_malloc_at_most": (_VP, [_SZ, _SZ, _INT, _VP, _c.POINTER(_SZ)]),
    "xseg_free": (None, [_VP, _SSZ, _INT, _VP]),
    "xseg_free_block": (_INT, [_VP, _INT]),
    "xseg_record_stream": (_INT, [_VP, _VP]),
    "xseg_stats_json": (_VP, [_INT]),
    "xseg_snapshot_json": (_VP, [_INT]),
    "xseg_string_free": (None, [_VP]),
    "xseg_empty_cache": (_INT, [_INT]),
    "xseg_reset_peak_stats": (_INT, [_INT]),
    "xseg_reset_accumulated_stats": (_INT, [_INT]),
    "xseg_configure": (_INT, [_c.c_char_p]),
    "xseg_set_log_level": (_INT, [_c.c_char_p]),
    "xseg_share": (_SSZ, [_VP, _INT, _VP, _SZ]),
    "xseg_share_for": (_SSZ, [_VP, _INT, _INT, _VP, _SZ]),
    "xseg_unshare": (_INT, [_c.c_char_p, _SZ]),
    "xseg_open": (_c.c_int64, [_c.c_char_p, _SZ, _INT, _c.POINTER(_VP), _c.POINTER(_SZ)]),
    "xseg_open_nowait": (_c.c_int64, [_c.c_char_p, _SZ, _INT, _c.POINTER(_VP), _c.POINTER(_SZ)]),
    "xseg_open_wait": (_INT, [_c.c_int64]),
    "xseg_close": (_INT, [_c.c_int64]),
    "xseg_pool_json": (_VP, [_INT, _ULL, _ULL, _INT]),
    "xseg_pool_restore": (_VP, [_INT, _c.c_char_p, _SZ]),
    "xseg_pool_retain": (_INT, [_INT, _ULL, _ULL]),
    "xseg_pool_release": (_INT, [_INT, _ULL, _ULL]),
    "xseg_malloc_in_pool": (_VP, [_SSZ, _INT, _VP, _ULL, _ULL]),
    "xseg_set_memory_fraction": (None, [_c.c_double, _INT]),
    "xseg_memory_fraction": (_INT, [_INT, _c.POINTER(_c.c_double)]),
    "xseg_set_memory_limit": (_INT, [_INT, _ULL]),
    "xseg_cache_info": (_INT, [_INT, _c.POINTER(_SZ)]),
    "xseg_torch_route_cache_info": (_INT, []),
    "xseg_record_history": (_INT, [_INT, _SZ]),
    "xseg_history_json": (_VP, [_INT]),
    "xseg_tag": (_INT, [_INT, _c.c_char_p, _c.POINTER(_ULL), _c.POINTER(_ULL)]),
    "xseg_begin_region": (_INT, [_INT, _c.c_char_p]),
    "xseg_end_region": (_INT, [_INT]),
    "xseg_pause": (_INT, [_INT, _c.c_char_p, _INT]),
    "xseg_resume": (_INT, [_INT, _c.c_char_p]),
    "xseg_tag_stats_json": (_VP, [_INT, _c.c_char_p]),
    "xseg_tags_json": (_VP, [_INT]),
    "xseg_version": (_c.c_char_p, []),
    "xseg_last_error": (_c.c_char_p, []),
    "xseg_thread_error": (_c.c_char_p, []),
}


# The range of each integer argument type: ctypes itself wraps an integer
# that does not fit (device 2**32 would be device 0, size 2**64 size 0) and
# truncates a float through int(), so every call checks its integers first.
_RANGES: Dict[Any, Tuple[int, int]] = {
    _INT: (-(1 << 31), (1 << 31) - 1),
    _c.c_int64: (-(1 << 63), (1 << 63) - 1),
    _SSZ: (-(1 << 63), (1 << 63) - 1),
    _SZ: (0, (1 << 64) - 1),
    _ULL: (0, (1 << 64) - 1),
    _VP: (0, (1 << 64) - 1),  # an address or a stream handle; None is NULL
}


# What ctypes passes as it is: its own values, buffers, pointers and byref.
_CTYPES_VALUES = (_c._SimpleCData, _c.Array, _c._Pointer, type(_c.byref(_c.c_int())))


def _checked(name: str, f: Any, args: List[Any]) -> Callable[..., Any]:
    """f, a declared function of libxseg, behind a check of its integer
    arguments: TypeError for one that is not an integer (a float, a
    string: ctypes would pass a pointer to a string's bytes as an address
    or a stream handle; a bool, which the functions that take PyTorch's
    device argument refuse too), OverflowError for one out of its C type's range.
    ctypes values, buffers, pointers and None (NULL, for an address) go to
    ctypes as they are, and so do strings' arguments."""
    checks = [(i, _RANGES[t]) for i, t in enumerate(args) if t in _RANGES]

    def call(*a: Any) -> Any:
        out = list(a)
        for i, (lo, hi) in checks:
            if i >= len(a):
                continue  # ctypes reports the missing argument
            v = a[i]
            if isinstance(v, _CTYPES_VALUES) or (args[i] is _VP and v is None):
                continue  # a ctypes value, buffer or pointer; NULL
            n = _integer(v, f"{name} argument {i + 1}")
            if not lo <= n <= hi:
                raise OverflowError(f"xseg: {name} argument {i + 1}: {n} is out of range [{lo}, {hi}]")
            out[i] = n
        return f(*out)

    call.__name__ = name
    return call


def _integer(v: Any, what: str) -> int:
    """v as an int (anything with __index__ but a bool: device=True is
    more likely a mistake than device 1), or TypeError naming what."""
    if isinstance(v, bool):
        raise TypeError(f"xseg: {what} must be an integer, not bool ({v!r})")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"xseg: {what} must be an integer, not {type(v).__name__}") from None


def cuda_array_interface(ptr: int, shape: Tuple[int, ...], typestr: str = "|u1") -> Dict[str, Any]:
    """The __cuda_array_interface__ (version 3) of C-order memory at ptr of
    shape, elements of CAI type typestr, with no stream to wait for: what
    the package's holders of device memory give torch.as_tensor."""
    return {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 3, "strides": None,
            "stream": None}


def _declare(lib: ctypes.CDLL) -> None:
    missing = [n for n in _SIGNATURES if not hasattr(lib, n)]
    if len(missing) == len(_SIGNATURES):
        raise XsegError(f"xseg: {lib._name} is not an xseg library: it has none of the {len(missing)} "
                        "functions of xseg.h (xseg_malloc, xseg_free, ...)")
    if missing:
        raise XsegError(f"xseg: {lib._name} lacks {', '.join(missing)}: it is older than this package")
    for name, (res, args) in _SIGNATURES.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
        setattr(lib, name, _checked(name, f, args))


def load(path: Optional[str] = None) -> ctypes.CDLL:
    """Load libxseg.so once (see find_library) and return its ctypes.CDLL
    with every function's signature declared. A second call naming another
    path raises XsegError: a process has one xseg."""
    global _lib, _lib_path
    with _lock:
        if _lib is not None:
            if path is not None and os.path.abspath(os.fspath(path)) != _lib_path:
                raise XsegError(f"xseg: {_lib_path} is already loaded; cannot load {path} too")
            return _lib
        p = find_library(path)
        lib = ctypes.CDLL(p)
        _declare(lib)
        _lib, _lib_path = lib, p
        return lib


def loaded() -> Optional[ctypes.CDLL]:
    """The library if load() has run, else None (never loads it)."""
    return _lib


def library_path() -> Optional[str]:
    """The path load() loaded, or None."""
    return _lib_path


def last_error() -> Optional[str]:
    """The text of xseg's most recent failure (any thread), or None."""
    s = load().xseg_last_error()
    return s.decode(errors="replace") if s else None


def thread_error() -> Optional[str]:
    """The text of the most recent failure of a call this thread made, or
    None: the reason a call that just failed gives, whatever other threads
    have failed since (every error this package raises quotes it)."""
    s = load().xseg_thread_error()
    return s.decode(errors="replace") if s else None


def version() -> str:
    """The library's version string."""
    return load().xseg_version().decode()


def check(rc: int, what: str) -> None:
    """Raise XsegError with libxseg's reason unless rc is 0."""
    if rc != 0:
        raise XsegError(f"xseg: {what} failed: {thread_error()}")


def call_json(call: Callable[[ctypes.CDLL], Any], what: str) -> Any:
    """Call a libxseg function that returns a JSON string to free, and
    return the decoded value."""
    lib = load()
    p = call(lib)
    if not p:
        raise XsegError(f"xseg: {what} failed: {thread_error()}")
    try:
        return json.loads(ctypes.string_at(p).decode())
    finally:
        lib.xseg_string_free(p)


def configure(conf: str) -> None:
    """Set the configuration (XSEG_CONF syntax, for example
    ``"oom_max_retries:3,shareable:true"``) applied over $XSEG_CONF. Only
    before the first allocation; raises ValueError for a string that does
    not parse, XsegError when it is too late."""
    c = _c_string(conf, "configuration")
    lib = load()
    if lib.xseg_configure(c) != 0:
        err = thread_error() or ""
        if "after first use" in err:
            raise XsegError(f"xseg: configure({conf!r}): {err}")
        raise ValueError(f"xseg: configuration {conf!r}: {err}")


def set_log_level(level: str) -> None:
    """Log to standard error at this level: "off", "error", "warn", "info",
    "debug"."""
    if load().xseg_set_log_level(_c_string(str(level), "log level")) != 0:
        raise ValueError(f"xseg: log level {level!r}: {thread_error()}")


def flatten(d: Dict[str, Any], prefix: str = "", out: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Flatten nested dicts into "a.b.c" keys, as torch.cuda.memory_stats
    does."""
    out = {} if out is None else out
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            flatten(v, key + ".", out)
        else:
            out[key] = v
    return out


def raw_stats(device: int) -> Dict[str, Any]:
    """The device's statistics, nested, as libxseg's JSON."""
    return call_json(lambda lib: lib.xseg_stats_json(device), "stats")


def raw_snapshot(device: int) -> Dict[str, Any]:
    """The device's segments, ranges and blocks, as libxseg's JSON."""
    return call_json(lambda lib: lib.xseg_snapshot_json(device), "snapshot")


def history(device: int) -> List[Dict[str, Any]]:
    """The recorded allocation events of device, oldest first (see
    record_history)."""
    return call_json(lambda lib: lib.xseg_history_json(device), "history")


def record_history(device: int, max_entries: int) -> None:
    """Record the last max_entries allocation events of device (0: stop and
    drop them)."""
    check(load().xseg_record_history(device, max_entries), "record_history")


def empty_cache(device: int = -1) -> None:
    """Give every whole free page back to the driver (device -1: all)."""
    check(load().xseg_empty_cache(device), "empty_cache")


def reset_peak_stats(device: int = -1) -> None:
    """Make every peak the current value (device -1: all)."""
    check(load().xseg_reset_peak_stats(device), "reset_peak_stats")


def reset_accumulated_stats(device: int = -1) -> None:
    """Zero the accumulated counters (allocated/freed totals, retries,
    OOMs) (device -1: all)."""
    check(load().xseg_reset_accumulated_stats(device), "reset_accumulated_stats")


def set_memory_fraction(fraction: float, device: int) -> None:
    """Limit the memory xseg reserves on device to fraction of its total
    memory, as torch.cuda.set_per_process_memory_fraction: growth past it
    fails as out of memory (after emptying the cache); memory already
    cached stays usable. 0 allows no growth, 1.0 the whole device."""
    f = float(fraction)
    if not 0.0 <= f <= 1.0:
        raise ValueError(f"xseg: memory fraction {fraction!r} is not in [0, 1]")
    lib = load()
    before = thread_error()
    lib.xseg_set_memory_fraction(f, device)
    # The setter is void: its failure shows only as the thread's error,
    # which a later failure of this thread (the read-back's) replaces.
    err = thread_error()
    failed = err != before or (err or "").startswith("xseg_set_memory_fraction:")
    try:
        got = memory_fraction(device)
    except XsegError:
        if not failed:
            raise
        got = None
    if got != f:
        reason = err if failed else f"the fraction reads back as {got}"
        raise XsegError(f"xseg: set_memory_fraction({f}, {device}) failed: {reason}")


def memory_fraction(device: int) -> float:
    """The memory fraction set for device: 0.0 if none, and for a fraction of
    0 (stats(device)["memory_limit_set"] tells them apart)."""
    out = ctypes.c_double()
    check(load().xseg_memory_fraction(device, ctypes.byref(out)), "memory_fraction")
    return out.value


def cache_info(device: int = 0) -> int:
    """PyTorch's cacheInfo for device: an estimate, optimistic as PyTorch's
    own, of the largest block one allocation could get now (the driver's
    free memory plus the bytes xseg holds unused, under the memory limit
    the limit less the bytes in use). cuDNN's autotuner asks it."""
    out = _SZ()
    check(load().xseg_cache_info(device, ctypes.byref(out)), "cache_info")
    return out.value


def malloc(size: int, device: int = 0, stream: int = 0) -> int:
    """Allocate size bytes on device for use on stream (a CUstream handle, 0
    for the default stream); returns the address. Raises
    OutOfMemoryError or XsegError."""
    size = _integer(size, "malloc's size")
    if size < 0:
        raise ValueError(f"xseg: malloc of a negative size {size}")
    p = load().xseg_malloc(size, device, stream or None)
    if not p and size:
        _raise_alloc("malloc", size)
    return p or 0


# xseg_malloc_at_most takes a max above this as this, and refuses a min
# above it (xseg.h); malloc_at_most clamps here too, so that a max past
# 2**64 (which size_t cannot hold) asks for as much as possible as well.
_MAX_AT_MOST = 1 << 62


def malloc_at_most(max_bytes: int, min_bytes: int, device: int = 0, stream: int = 0) -> Tuple[int, int]:
    """Allocate as much as it can of at most max_bytes and at least
    min_bytes, shrinking the request by the configured oom_size_factor
    (OOM_SIZE_FACTOR) after each out-of-memory; returns (address, size).
    A max_bytes above 2**62 is taken as 2**62 (as the library does; it
    starts from the memory there is): a huge max_bytes asks for as much as
    possible. Raises ValueError unless 0 < min_bytes <= max_bytes and
    min_bytes <= 2**62."""
    max_bytes, min_bytes = _integer(max_bytes, "max_bytes"), _integer(min_bytes, "min_bytes")
    if not 0 < min_bytes <= max_bytes or min_bytes > _MAX_AT_MOST:
        raise ValueError(f"xseg: malloc_at_most needs 0 < min_bytes <= max_bytes and min_bytes <= 2**62, "
                         f"got {min_bytes}, {max_bytes}")
    max_bytes = min(max_bytes, _MAX_AT_MOST)
    got = ctypes.c_size_t()
    p = load().xseg_malloc_at_most(max_bytes, min_bytes, device, stream or None, ctypes.byref(got))
    if not p:
        _raise_alloc("malloc_at_most", min_bytes)
    return p, got.value


def _raise_alloc(what: str, size: int) -> None:
    err = thread_error() or "unknown error"
    if "the tag is paused" in err:
        raise PausedError(f"xseg: {what} of {size} bytes: {err}")
    if "out of memory" in err:
        raise OutOfMemoryError(f"xseg: {what} of {size} bytes: {err}")
    raise XsegError(f"xseg: {what} of {size} bytes failed: {err}")


def free(ptr: int, device: int = 0) -> None:
    """Give back a block malloc returned. Raises XsegError for an address
    xseg did not hand out."""
    if not ptr:
        return
    check(load().xseg_free_block(ptr, device), "free")


def record_stream(ptr: int, stream: int) -> bool:
    """Mark the block at ptr as used on stream too; False when ptr is not a
    block of xseg."""
    rc = load().xseg_record_stream(ptr, stream or None)
    if rc < 0:
        raise XsegError(f"xseg: record_stream failed: {thread_error()}")
    return rc == 0


# Cross-process sharing (package ipc): pidfd_getfd where the kernel allows
# it, else the exporter's Unix socket.

DESC_CAP = 1 << 16

# Each thread's descriptor buffer: share_block runs once per tensor a
# torch.multiprocessing message carries, and a fresh buffer (zeroed) plus
# its copy (buf.raw) cost more than the share's own work in Go.
_share_bufs = threading.local()


def share_block(ptr: int, device: int = 0, importers: int = 0) -> bytes:
    """Share the live block that starts at ptr with other processes and
    return its descriptor. importers > 0 (at most 2**20) ends the share by
    itself once that many importers have opened it (each holds the pages
    until it closes); 0 keeps it until unshare(). The block's pages stay
    out of reuse while the share is open or any importer holds them, even
    after free()."""
    buf = getattr(_share_bufs, "buf", None)
    if buf is None:
        buf = _share_bufs.buf = ctypes.create_string_buffer(DESC_CAP)
    n = load().xseg_share_for(ptr, device, importers, buf, DESC_CAP)
    if n < 0:
        raise XsegError(f"xseg: share failed: {thread_error()}")
    return ctypes.string_at(buf, n)


def _descriptor(desc: Any, what: str) -> bytes:
    """desc, a descriptor from share_block, as bytes: it may be any
    bytes-like object (bytes, bytearray, memoryview); anything else (a str,
    an int) raises TypeError."""
    if type(desc) is bytes:
        return desc
    try:
        return memoryview(desc).tobytes()
    except TypeError:
        pass
    raise TypeError(f"xseg: {what} needs a descriptor (bytes-like, from share_block), "
                    f"not {type(desc).__name__} ({desc!r:.60})")


def unshare(desc: bytes) -> None:
    """Stop serving new importers of desc (bytes-like, from share_block);
    importers that opened it keep their mapping."""
    d = _descriptor(desc, "unshare")
    check(load().xseg_unshare(d, len(d)), "unshare")


class Mapping:
    """A shared block mapped into this process (open_block). ``ptr`` and
    ``size`` give its bytes; ``close()`` (or leaving a ``with`` block, or
    garbage collection) unmaps it once no other Mapping of the same
    descriptor is open."""

    def __init__(self, handle: int, ptr: int, size: int) -> None:
        self.handle, self.ptr, self.size = handle, ptr, size

    def close(self) -> None:
        h, self.handle = self.handle, -1
        if h > 0 and _lib is not None:
            check(_lib.xseg_close(h), "close")

    def wait(self) -> None:
        """Wait for the exporter to grant the lease of an open_block(...,
        wait=False); at once for any other. Raises XsegError if it refused
        (the share ended first): read nothing then, and close()."""
        if self.handle <= 0:
            raise XsegError("xseg: wait on a closed mapping")
        check(load().xseg_open_wait(self.handle), "open_wait")

    def __enter__(self) -> "Mapping":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if self.handle > 0 and _lib is not None:
            _lib.xseg_close(self.handle)
            self.handle = -1


def open_block(desc: bytes, device: int = 0, wait: bool = True) -> Mapping:
    """Map the block that desc (from share_block in any process) names, for
    device. It stays valid after the exporter exits. wait=False returns
    before the exporter has granted the lease: call the Mapping's wait()
    before reading or writing its bytes. desc may be any bytes-like object;
    anything else raises TypeError."""
    d = _descriptor(desc, "open_block")
    ptr, size = ctypes.c_void_p(), ctypes.c_size_t()
    lib = load()
    fn = lib.xseg_open if wait else lib.xseg_open_nowait
    h = fn(d, len(d), device, ctypes.byref(ptr), ctypes.byref(size))
    if h < 0:
        raise XsegError(f"xseg: open failed: {thread_error()}")
    return Mapping(h, ptr.value or 0, size.value)


# Private pools (CUDA graphs, torch.cuda.MemPool).

def _pool_id(pool: Any, what: str) -> Tuple[Any, Any]:
    """pool, a private pool's id, as its two parts (first, second): it is a
    pair, such as a tag's id from tag() or a MemPool's. TypeError for a
    value that is not iterable (or is a str or bytes), ValueError for one
    of another length; the parts' own checks come with the call (TypeError
    unless integers, OverflowError outside [0, 2**64))."""
    if isinstance(pool, (str, bytes, bytearray)):
        parts = None
    else:
        try:
            parts = tuple(pool)
        except TypeError:
            parts = None
    if parts is None:
        raise TypeError(f"xseg: {what}: a pool id is a pair of integers (first, second), "
                        f"not {type(pool).__name__} ({pool!r:.60})")
    if len(parts) != 2:
        raise ValueError(f"xseg: {what}: a pool id is a pair of integers (first, second), "
                         f"not {len(parts)} values ({pool!r:.60})")
    return parts[0], parts[1]


def pool_retain(device: int, pool: Tuple[int, int]) -> None:
    """Make private pool ``pool`` (a pair of ints) on device if need be and
    hold one more use of it."""
    first, second = _pool_id(pool, "pool_retain")
    check(load().xseg_pool_retain(device, first, second), "pool_retain")


def pool_release(device: int, pool: Tuple[int, int]) -> None:
    """Drop one use of private pool ``pool``; the last gives its memory
    back."""
    first, second = _pool_id(pool, "pool_release")
    check(load().xseg_pool_release(device, first, second), "pool_release")


def pool_allocations(pool: Tuple[int, int], device: int) -> List[int]:
    """Addresses of the blocks allocated now in private pool ``pool``."""
    first, second = _pool_id(pool, "pool_allocations")
    return call_json(lambda lib: lib.xseg_pool_json(device, first, second, 0), "pool_allocations")


def malloc_in_pool(size: int, pool: Tuple[int, int], device: int = 0, stream: int = 0) -> int:
    """Allocate size bytes on device from private pool ``pool`` (which must
    be retained: a tag's id from tag(), a MemPool's); returns the address.
    Raises PausedError in a paused tag, OutOfMemoryError, XsegError."""
    size = _integer(size, "malloc_in_pool's size")
    if size < 0:
        raise ValueError(f"xseg: malloc_in_pool of a negative size {size}")
    first, second = _pool_id(pool, "malloc_in_pool")
    p = load().xseg_malloc_in_pool(size, device, stream or None, first, second)
    if not p and size:
        _raise_alloc("malloc_in_pool", size)
    return p or 0


# Tags: pause and resume (the user-facing functions are in _pause.py).

def _c_string(s: str, what: str) -> bytes:
    """s as a C string. ctypes would cut it at a NUL without a word:
    refuse one here."""
    if not isinstance(s, str):
        raise TypeError(f"xseg: a {what} is a str, not {type(s).__name__}")
    if "\0" in s:
        raise ValueError(f"xseg: {what} {s!r} contains NUL")
    return s.encode("utf-8")  # a lone surrogate: UnicodeEncodeError, a ValueError


def _tag_arg(name: Optional[str]) -> Optional[bytes]:
    """A tag name as the C API takes it; None stays None (every tag)."""
    return None if name is None else _c_string(name, "tag name")


def tag(name: str, device: int = 0) -> Tuple[int, int]:
    """Make tag ``name`` on device if need be and return its private pool
    id (first, second): malloc_in_pool with it allocates in the tag."""
    first, second = ctypes.c_ulonglong(), ctypes.c_ulonglong()
    check(load().xseg_tag(device, _tag_arg(name), ctypes.byref(first), ctypes.byref(second)), f"tag({name!r})")
    return first.value, second.value


def begin_region(name: str, device: int = 0) -> None:
    """Send the calling thread's allocations on device to tag ``name``
    until end_region (regions nest, innermost wins)."""
    check(load().xseg_begin_region(device, _tag_arg(name)), f"begin_region({name!r})")


def end_region(device: int = 0) -> None:
    """End the calling thread's innermost region on device."""
    check(load().xseg_end_region(device), "end_region")


def pause_tag(name: Optional[str], backup: bool, device: int = -1) -> None:
    """Pause tag ``name`` (None: every tag) of device (-1: every device)."""
    check(load().xseg_pause(device, _tag_arg(name), 1 if backup else 0), f"pause({name!r})")


def resume_tag(name: Optional[str], device: int = -1) -> None:
    """Resume tag ``name`` (None: every paused tag) of device (-1: every
    device)."""
    check(load().xseg_resume(device, _tag_arg(name)), f"resume({name!r})")


def raw_tag_stats(name: str, device: int) -> Dict[str, Any]:
    """The statistics of tag ``name`` on device, as libxseg's JSON."""
    arg = _tag_arg(name)
    return call_json(lambda lib: lib.xseg_tag_stats_json(device, arg), f"tag_stats({name!r})")


def raw_tags(device: int) -> List[Dict[str, Any]]:
    """The statistics of every tag of device, by name."""
    return call_json(lambda lib: lib.xseg_tags_json(device), "tags")
