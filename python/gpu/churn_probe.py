"""Does page work on the CPU slow the kernels running on the GPU? Times
kernels (CUDA events) while another thread maps, grants access to and
unmaps 2 MiB pages of a range of its own, RATE times a second (0: none;
-1: as fast as it can), the work a page move of xseg's asks of the driver:

    python3 churn_probe.py [--rates 0,160,1000,-1] [--reps 40]

Kernels, each timed over batches of 20 launches, median of --reps batches:
  gemm    bf16 4096^3
  stream  y = x * 1.0001 over 1 GiB
A move of GPT-2's loop: xseg's default moves about 30 pages in a step of
186 ms, about 160 a second. PyTorch's own allocator, so the kernels' memory
is the same in every run. Prints one line "RESULT {json}": per rate, the
medians in ms and the page cycles done."""
import argparse
import ctypes as C
import json
import os
import statistics
import sys
import threading
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--rates", default="0,160,1000,-1")
ap.add_argument("--reps", type=int, default=40)
args = ap.parse_args()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cu_vmm import MiB, Access, Flags, Loc, Prop, ck, cu  # noqa: E402


torch.cuda.init()
dev = torch.cuda.current_device()
ctx = C.c_void_p()
torch.zeros(1, device="cuda")
ck(cu.cuCtxGetCurrent(C.byref(ctx)), "current context")
PROP = Prop(1, 0, Loc(1, dev), None, Flags())
ACC = Access(Loc(1, dev), 3)
PAGE = 2 * MiB
NP = 64
base = C.c_uint64()
ck(cu.cuMemAddressReserve(C.byref(base), C.c_size_t(NP * PAGE), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "reserve")
handles = []
for _ in range(NP):
    h = C.c_uint64()
    ck(cu.cuMemCreate(C.byref(h), C.c_size_t(PAGE), C.byref(PROP), C.c_uint64(0)), "create")
    handles.append(h.value)

stop = threading.Event()
done = [0]


def churn(rate):
    ck(cu.cuCtxSetCurrent(ctx), "set current")
    gap = 1.0 / rate if rate > 0 else 0.0
    i = 0
    nxt = time.perf_counter()
    while not stop.is_set():
        va = base.value + (i % NP) * PAGE
        ck(cu.cuMemMap(C.c_uint64(va), C.c_size_t(PAGE), C.c_size_t(0), C.c_uint64(handles[(i * 7) % NP]), C.c_uint64(0)), "map")
        ck(cu.cuMemSetAccess(C.c_uint64(va), C.c_size_t(PAGE), C.byref(ACC), C.c_size_t(1)), "access")
        ck(cu.cuMemUnmap(C.c_uint64(va), C.c_size_t(PAGE)), "unmap")
        done[0] += 1
        i += 1
        if gap:
            nxt += gap
            d = nxt - time.perf_counter()
            if d > 0:
                time.sleep(d)


a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
x = torch.randn(256 * MiB, device="cuda")
y = torch.empty_like(x)
kernels = {"gemm": lambda: torch.mm(a, b), "stream": lambda: torch.mul(x, 1.0001, out=y)}


def timed(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(20):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 20


res = {}
for rate in [int(r) for r in args.rates.split(",")]:
    for fn in kernels.values():
        for _ in range(3):
            timed(fn)
    stop.clear()
    done[0] = 0
    th = threading.Thread(target=churn, args=(rate,)) if rate else None
    if th:
        th.start()
    t0 = time.perf_counter()
    row = {name: statistics.median(timed(fn) for _ in range(args.reps)) for name, fn in kernels.items()}
    secs = time.perf_counter() - t0
    stop.set()
    if th:
        th.join()
    row["cycles_per_s"] = done[0] / secs
    res[str(rate)] = row
    print(rate, row, flush=True)
for h in handles:
    ck(cu.cuMemRelease(C.c_uint64(h)), "release")
ck(cu.cuMemAddressFree(base, C.c_size_t(NP * PAGE)), "free")
print("RESULT " + json.dumps(res), flush=True)
