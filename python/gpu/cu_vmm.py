"""The CUDA driver's VMM calls through ctypes, for the GPU scripts that
call them directly (ipc_probe.py, churn_probe.py, pause_bench.py): libcuda,
the layouts of CUmemAllocationProp and CUmemAccessDesc, and a check of each
call's result. No CUDA headers needed."""
import ctypes as C

cu = C.CDLL("libcuda.so.1")
MiB = 1 << 20


class Loc(C.Structure):
    _fields_ = [("type", C.c_int), ("id", C.c_int)]


class Flags(C.Structure):
    _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte),
                ("usage", C.c_ushort), ("reserved", C.c_ubyte * 4)]


class Prop(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc),
                ("win32HandleMetaData", C.c_void_p), ("allocFlags", Flags)]


class Access(C.Structure):
    _fields_ = [("location", Loc), ("flags", C.c_int)]


def ck(r, what):
    """Raises unless r, a CUresult, is CUDA_SUCCESS."""
    if r != 0:
        raise RuntimeError(f"{what}: CUDA error {r}")
