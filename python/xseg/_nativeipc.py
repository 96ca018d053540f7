"""CUDA tensors from processes that run PyTorch's own allocator, received in
a process with xseg installed.

A producer without xseg (a DataLoader worker, a spawned helper, any process
that did not call install()) shares a CUDA tensor the way PyTorch does: a
cudaIpcMemHandle_t of the cudaMalloc block the tensor lies in, a shared
reference counter, and an IPC event for the producer's pending work. The
consumer's PyTorch opens the handle through its allocator's getIpcDevPtr,
which PyTorch's pluggable allocator refuses, so with xseg installed every
such tensor failed to arrive. install() puts new_shared_cuda in the place
of torch.UntypedStorage._new_shared_cuda, which torch.multiprocessing's
rebuild calls with the producer's 8 values, and it does what PyTorch's
own does with them (torch/csrc/StorageSharing.cpp), through the CUDA
driver: wait for the producer's event, open the handle once per handle and
device however many storages come from it (the driver allows one open per
context), and when a storage dies wait for the consumer's stream, close the
handle after its last storage, and give the producer's reference counter
back, after which the producer may free the block.

Shares of PyTorch's expandable segments (exported POSIX file descriptors)
are not opened: the error says to install xseg in the producer too, whose
own sharing then carries the tensor.
"""
from __future__ import annotations

import ctypes
import logging
import sys
import threading
from typing import Any, Dict, List, Tuple

from ._lib import XsegError, cuda_array_interface

_log = logging.getLogger("xseg")

IPC_HANDLE_SIZE = 64  # sizeof(cudaIpcMemHandle_t)
_NEWEST_VERSION = 2  # the newest header PyTorch 2.x writes before the handle
_CUDA_MALLOC = ord("c")
_EXPANDABLE_SEGMENT = ord("e")
_LAZY_ENABLE_PEER_ACCESS = 1  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS


def parse_handle(handle: Any) -> bytes:
    """The cudaIpcMemHandle_t in handle, as PyTorch's shareIpcHandle writes
    it: the 64 bytes alone (older PyTorch), or a version byte, a type byte
    ('c': cudaMalloc memory) and the 64 bytes. Raises XsegError for a share
    of expandable segments ('e') or anything else, TypeError for a handle
    that is not bytes."""
    if not isinstance(handle, (bytes, bytearray)):
        raise TypeError(f"xseg: a CUDA IPC handle is bytes, not {type(handle).__name__}")
    if len(handle) == IPC_HANDLE_SIZE:
        return bytes(handle)
    if len(handle) < 2:
        raise XsegError(f"xseg: a CUDA IPC handle of {len(handle)} bytes is not one PyTorch writes")
    version, kind = handle[0], handle[1]
    if version > _NEWEST_VERSION:
        raise XsegError(f"xseg: the CUDA IPC handle has version {version}, from a PyTorch newer than "
                        f"this xseg knows (up to {_NEWEST_VERSION})")
    if kind == _EXPANDABLE_SEGMENT:
        raise XsegError("xseg: the tensor comes from a process running PyTorch's expandable segments, "
                        "whose shares xseg cannot open; install xseg in that process too (xseg.install() "
                        "or python3 -m xseg), or run it without expandable_segments")
    if kind != _CUDA_MALLOC or len(handle) != 2 + IPC_HANDLE_SIZE:
        raise XsegError(f"xseg: not a CUDA IPC handle PyTorch writes (type {kind!r}, {len(handle)} bytes)")
    return bytes(handle[2:])


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_SIZE)]


def handle_struct(raw: bytes) -> _IpcHandle:
    """The CUipcMemHandle of the 64 bytes raw, all of them: _IpcHandle(raw)
    would copy only up to the first NUL (ctypes fills a char array from
    bytes as from a C string)."""
    if len(raw) != IPC_HANDLE_SIZE:
        raise ValueError(f"xseg: a CUDA IPC handle has {IPC_HANDLE_SIZE} bytes, not {len(raw)}")
    h = _IpcHandle()
    ctypes.memmove(ctypes.addressof(h), raw, IPC_HANDLE_SIZE)
    return h


class _Driver:
    """The CUDA driver calls, loaded on first use."""

    def __init__(self) -> None:
        cuda = ctypes.CDLL("libcuda.so.1")
        self.current = cuda.cuCtxGetCurrent
        self.current.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.current.restype = ctypes.c_int
        self.device = cuda.cuDeviceGet
        self.device.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        self.device.restype = ctypes.c_int
        self.retain = cuda.cuDevicePrimaryCtxRetain
        self.retain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        self.retain.restype = ctypes.c_int
        self.set_current = cuda.cuCtxSetCurrent
        self.set_current.argtypes = [ctypes.c_void_p]
        self.set_current.restype = ctypes.c_int
        self.open = cuda.cuIpcOpenMemHandle_v2
        self.open.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        self.open.restype = ctypes.c_int
        self.close = cuda.cuIpcCloseMemHandle
        self.close.argtypes = [ctypes.c_uint64]
        self.close.restype = ctypes.c_int
        self._name = cuda.cuGetErrorName
        self._name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self._name.restype = ctypes.c_int

    def ensure_context(self, device: int) -> None:
        """Make device's primary context current on this thread if no
        context is (PyTorch makes it current lazily; the IPC calls need one).
        The caller has made device PyTorch's current device."""
        ctx = ctypes.c_void_p()
        if self.current(ctypes.byref(ctx)) == 0 and ctx.value:
            return
        dev = ctypes.c_int()
        rc = self.device(ctypes.byref(dev), device)
        if rc == 0:
            rc = self.retain(ctypes.byref(ctx), dev.value)  # PyTorch's runtime holds it for the process too
        if rc == 0:
            rc = self.set_current(ctx)
        if rc != 0:
            raise XsegError(f"xseg: making device {device}'s CUDA context current: {self.error(rc)}")

    def error(self, rc: int) -> str:
        s = ctypes.c_char_p()
        if self._name(rc, ctypes.byref(s)) == 0 and s.value:
            return s.value.decode()
        return f"CUresult {rc}"


_driver_obj: List[_Driver] = []
_lock = threading.Lock()
_opened: Dict[Tuple[int, bytes], List[int]] = {}  # (device, handle) -> [address, storages]


def _driver() -> _Driver:
    if not _driver_obj:
        _driver_obj.append(_Driver())
    return _driver_obj[0]


def opened() -> int:
    """How many handles are open now (for tests)."""
    with _lock:
        return len(_opened)


def _open(raw: bytes, device: int) -> int:
    """The address of the block raw names, opened in the current context
    (device's) if this process has not opened it yet; counts one storage."""
    with _lock:
        e = _opened.get((device, raw))
        if e is not None:
            e[1] += 1
            return e[0]
        d = _driver()
        d.ensure_context(device)
        ptr = ctypes.c_uint64()
        rc = d.open(ctypes.byref(ptr), handle_struct(raw), _LAZY_ENABLE_PEER_ACCESS)
        if rc != 0:
            raise XsegError(f"xseg: opening a CUDA IPC handle of another process on device {device}: "
                            f"{d.error(rc)} (the producer may have exited, or run on a device this process "
                            "cannot reach)")
        _opened[(device, raw)] = [ptr.value, 1]
        return ptr.value


def _close(raw: bytes, device: int) -> None:
    """Count one storage of raw less; the last closes it (device current)."""
    with _lock:
        e = _opened.get((device, raw))
        if e is None:
            return
        e[1] -= 1
        if e[1] > 0:
            return
        del _opened[(device, raw)]
        d = _driver()
        d.ensure_context(device)
        rc = d.close(e[0])
    if rc != 0:
        _log.warning("xseg: closing a CUDA IPC handle on device %d: %s", device, d.error(rc))


class _Received:
    """One received storage's bytes, exposed through __cuda_array_interface__;
    the storage keeps it alive, and its end gives everything back."""

    def __init__(self, raw: bytes, device: int, base: int, offset: int, nbytes: int, ref_handle: bytes,
                 ref_offset: int) -> None:
        self.raw, self.device, self.ref_handle, self.ref_offset = raw, device, ref_handle, ref_offset
        self.__cuda_array_interface__ = cuda_array_interface(base + offset, (nbytes,))

    def release(self) -> None:
        """Give everything back, once: wait for the consumer's stream, count
        the handle's storage off (closing it after the last), and give the
        producer's reference counter back."""
        if self.raw is None:
            return
        raw, self.raw = self.raw, None
        torch = sys.modules.get("torch")
        if torch is None:
            return
        try:
            with torch.cuda.device(self.device):
                # As PyTorch's own consumer: the consumer's work on the
                # bytes ends before the producer may reuse them.
                torch.cuda.current_stream(self.device).synchronize()
                _close(raw, self.device)
        except Exception as e:  # noqa: BLE001 (called from a finalizer: must not raise)
            _log.warning("xseg: letting go of a tensor received from another process: %s", e)
        try:
            torch.UntypedStorage._release_ipc_counter_cuda(self.ref_handle, self.ref_offset)
        except Exception:  # noqa: BLE001 (the producer has exited: nothing to give back)
            pass

    def __del__(self) -> None:
        self.release()


def new_shared_cuda(*args: Any, **kwargs: Any) -> Any:
    """torch.UntypedStorage._new_shared_cuda under xseg: (device, handle,
    storage bytes, storage offset bytes, reference counter handle, its
    offset, event handle, whether to wait for the event) -> a storage over
    the producer's bytes."""
    if kwargs or len(args) != 8:
        raise TypeError("xseg: _new_shared_cuda takes the 8 values of PyTorch's CUDA IPC rebuild")
    device, handle, nbytes, offset, ref_handle, ref_offset, event_handle, event_sync = args
    torch = sys.modules["torch"]
    raw = parse_handle(handle)
    if not isinstance(ref_handle, bytes) or not isinstance(event_handle, bytes):
        raise TypeError("xseg: _new_shared_cuda's counter and event handles are bytes")
    device, nbytes, offset, ref_offset = int(device), int(nbytes), int(offset), int(ref_offset)
    if nbytes < 0 or offset < 0 or ref_offset < 0:
        raise ValueError(f"xseg: _new_shared_cuda: negative size or offset ({nbytes}, {offset}, {ref_offset})")
    with torch.cuda.device(device):
        if event_sync:
            event = torch.cuda.Event.from_ipc_handle(device, event_handle)
            torch.cuda.current_stream(device).wait_event(event)
        base = _open(raw, device)
        held = _Received(raw, device, base, offset, nbytes, ref_handle, ref_offset)
        try:
            t = torch.as_tensor(held, device=torch.device("cuda", device))
        except BaseException:
            # Now, not when the traceback that holds held goes.
            held.release()
            raise
    return t.untyped_storage()
