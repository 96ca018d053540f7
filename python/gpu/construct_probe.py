"""How fast can a consumer build a CUDA tensor over memory it mapped itself?
Times (medians of 200, us) of the ways open a shared block could hand
PyTorch a pointer: __cuda_array_interface__ (today's), a DLPack capsule
made with ctypes, and torch._C._construct_storage_from_data_pointer where
this PyTorch has it; each alone and followed by the set_ that gives the
tensor its dtype, size and stride. Prints RESULT <json>."""
import ctypes
import json
import statistics
import time

import torch


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManaged(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManaged))
DLManaged._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

PyCapsule_New = ctypes.pythonapi.PyCapsule_New
PyCapsule_New.restype = ctypes.py_object
PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
keep = []


def capsule(ptr, n, dev):
    m = DLManaged()
    shape = (ctypes.c_int64 * 1)(n)
    m.dl_tensor = DLTensor(ptr, DLDevice(2, dev), 1, DLDataType(1, 8, 1), shape, None, 0)
    keep.append((m, shape))
    return PyCapsule_New(ctypes.addressof(m), b"dltensor", None)


class CAI:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}


def main():
    dev = 0
    where = torch.device("cuda", dev)
    n = 1 << 30
    buf = torch.empty(n, dtype=torch.uint8, device=where)
    ptr = buf.data_ptr()
    N = (1 << 30) // 4
    res = {}

    def timeit(name, fn, reps=200):
        fn()
        ts = []
        for _ in range(reps):
            s = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - s) * 1e6)
        res[name] = round(statistics.median(ts), 2)

    def setter(raw):
        t = raw.new_empty((0,), dtype=torch.float32)
        t.set_(raw.untyped_storage(), 0, (N,), (1,))
        return t

    timeit("cai", lambda: torch.as_tensor(CAI(ptr, n), device=where))
    timeit("cai+set_", lambda: setter(torch.as_tensor(CAI(ptr, n), device=where)))
    from torch.utils.dlpack import from_dlpack
    timeit("capsule_ctypes", lambda: capsule(ptr, n, dev))
    timeit("dlpack", lambda: from_dlpack(capsule(ptr, n, dev)))
    timeit("torch._C._from_dlpack", lambda: torch._C._from_dlpack(capsule(ptr, n, dev)))
    timeit("dlpack+set_", lambda: setter(torch._C._from_dlpack(capsule(ptr, n, dev))))
    raw = torch._C._from_dlpack(capsule(ptr, n, dev))
    timeit("set_ alone", lambda: setter(raw))
    timeit("view+as_strided", lambda: raw.view(torch.float32).as_strided((N,), (1,), 0))
    f = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    res["has_construct_storage"] = f is not None
    if f is not None:
        def via_storage():
            st = f(ptr, where, n)
            t = torch.empty((0,), dtype=torch.float32, device=where)
            return t.set_(st, 0, (N,), (1,))
        timeit("storage_ptr+set_", via_storage)
    timeit("sync_idle_stream", lambda: torch.cuda.current_stream().synchronize())
    timeit("current_device", lambda: torch.cuda.current_device())
    x = torch._C._from_dlpack(capsule(ptr, n, dev))
    res["dlpack_ok"] = x.data_ptr() == ptr and x.numel() == n and x.device == where
    print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    main()
