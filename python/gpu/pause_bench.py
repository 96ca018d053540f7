"""Pause/resume cycles of 8 GiB on a GPU (issue 18, must-show 2):

    python3 pause_bench.py [--gib 8] [--cycles 1000] [--alloc-mib 64] [--modes xseg,vmm,empty_cache]

Each mode runs in a process of its own and allocates --gib GiB as
allocations of --alloc-mib MiB, then times --cycles pause/resume cycles
(no backup: the memory work alone):

  xseg         xseg installed; the allocations made in xseg.region("bench");
               pause = xseg.pause("bench"), resume = xseg.resume("bench").
  vmm          the way vLLM's CuMemAllocator and torch_memory_saver work, written
               here with ctypes on libcuda: one VMM reservation per allocation
               (cuMemAddressReserve + cuMemCreate + cuMemMap + cuMemSetAccess);
               pause = cuCtxSynchronize, then cuMemUnmap + cuMemRelease of each;
               resume = cuMemCreate + cuMemMap + cuMemSetAccess of each, at
               its reserved address.
  empty_cache  PyTorch's own caching allocator: pause = drop the tensors,
               synchronize, torch.cuda.empty_cache(); resume = allocate them
               again (new addresses: CUDA graphs would not survive).

It prints per mode the median and p99 of pause and of resume in ms, the
free memory seen while paused, and what leaked after the cycles (device
memory free before/after, open file descriptors, resident host memory,
over all cycles and over their second half, which tells a leak from a
one-time set-up), then one line "RESULT {json}" per mode. Exit 1 if a mode
leaked device memory, or descriptors or host memory in the second half, or
failed.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def fds():
    return len(os.listdir("/proc/self/fd"))


def fd_kinds():
    """What each open descriptor is (its /proc link), by number."""
    kinds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            kinds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return kinds


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- the one-reservation-per-allocation baseline, on libcuda with ctypes ---

CU_MEM_ALLOCATION_TYPE_PINNED, CU_MEM_LOCATION_TYPE_DEVICE, CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 1, 1, 3


class VMM:
    """One reservation, one physical allocation per allocation, as vLLM's
    CuMemAllocator (csrc/cumem_allocator.cpp) and torch_memory_saver do:
    no shareable handle, access for the owning device only."""

    def __init__(self, device):
        # cu_vmm (beside this file) loads libcuda: only this baseline needs it.
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from cu_vmm import Access, Loc, Prop, cu
        self.cu = cu
        self.dev = device
        self.prop = Prop()
        self.prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location = Loc(CU_MEM_LOCATION_TYPE_DEVICE, device)
        self.access = Access(Loc(CU_MEM_LOCATION_TYPE_DEVICE, device), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        g = ctypes.c_size_t()
        self.check(self.cu.cuMemGetAllocationGranularity(ctypes.byref(g), ctypes.byref(self.prop), 0),
                   "cuMemGetAllocationGranularity")
        self.gran = g.value
        self.allocs = []  # [ptr, size, handle or 0]

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: CUresult {rc}")

    def create_and_map(self, a):
        ptr, size = a[0], a[1]
        h = ctypes.c_ulonglong()
        self.check(self.cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(size), ctypes.byref(self.prop),
                                       ctypes.c_ulonglong(0)), "cuMemCreate")
        self.check(self.cu.cuMemMap(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), h,
                                    ctypes.c_ulonglong(0)), "cuMemMap")
        self.check(self.cu.cuMemSetAccess(ctypes.c_ulonglong(ptr), ctypes.c_size_t(size),
                                          ctypes.byref(self.access), ctypes.c_size_t(1)), "cuMemSetAccess")
        a[2] = h.value

    def malloc(self, size):
        size = (size + self.gran - 1) // self.gran * self.gran
        p = ctypes.c_ulonglong()
        self.check(self.cu.cuMemAddressReserve(ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                               ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        a = [p.value, size, 0]
        self.create_and_map(a)
        self.allocs.append(a)

    def pause(self):
        self.check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
        for a in self.allocs:
            self.check(self.cu.cuMemUnmap(ctypes.c_ulonglong(a[0]), ctypes.c_size_t(a[1])), "cuMemUnmap")
            self.check(self.cu.cuMemRelease(ctypes.c_ulonglong(a[2])), "cuMemRelease")
            a[2] = 0

    def resume(self):
        for a in self.allocs:
            self.create_and_map(a)

    def close(self):
        for a in self.allocs:
            if a[2]:
                self.cu.cuMemUnmap(ctypes.c_ulonglong(a[0]), ctypes.c_size_t(a[1]))
                self.cu.cuMemRelease(ctypes.c_ulonglong(a[2]))
            self.cu.cuMemAddressFree(ctypes.c_ulonglong(a[0]), ctypes.c_size_t(a[1]))
        self.allocs = []


def one_mode(mode, gib, cycles, alloc_mib):
    """Runs in the child: returns the figures of mode."""
    if mode == "xseg":
        try:
            import xseg
        except ImportError:
            sys.path.append(os.path.join(HERE, ".."))
            import xseg
        xseg.install()
    import torch
    torch.cuda.init()
    torch.cuda.synchronize()
    n, size = gib * 1024 // alloc_mib, alloc_mib * MiB
    free_start = torch.cuda.mem_get_info()[0]
    tensors = []
    vmm = None
    if mode == "xseg":
        with xseg.region("bench"):
            tensors = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(n)]

        def pause():
            xseg.pause("bench")

        def resume():
            xseg.resume("bench")
    elif mode == "vmm":
        vmm = VMM(torch.cuda.current_device())
        for _ in range(n):
            vmm.malloc(size)
        pause, resume = vmm.pause, vmm.resume
    else:
        tensors = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(n)]

        def pause():
            tensors.clear()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

        def resume():
            tensors.extend(torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(n))
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    free_live = torch.cuda.mem_get_info()[0]
    # One warm-up cycle (first-touch costs), then the measured ones.
    pause()
    free_paused = torch.cuda.mem_get_info()[0]
    resume()
    fd0, rss0, free0, kinds0 = fds(), rss(), torch.cuda.mem_get_info()[0], fd_kinds()
    tp, tr = [], []
    half = None
    for i in range(cycles):
        if i == cycles // 2:
            half = fds(), rss()
        t0 = time.perf_counter()
        pause()
        t1 = time.perf_counter()
        resume()
        t2 = time.perf_counter()
        tp.append((t1 - t0) * 1e3)
        tr.append((t2 - t1) * 1e3)
    torch.cuda.synchronize()
    fd1, rss1, free1 = fds(), rss(), torch.cuda.mem_get_info()[0]
    r = dict(mode=mode, gib=gib, allocations=n, alloc_mib=alloc_mib, cycles=cycles,
             pause_median_ms=statistics.median(tp), pause_p99_ms=pct(tp, 99),
             resume_median_ms=statistics.median(tr), resume_p99_ms=pct(tr, 99),
             freed_while_paused_gib=(free_paused - free_live) / (1 << 30),
             device_free_drift_mib=(free1 - free0) / MiB, fd_drift=fd1 - fd0, rss_drift_mib=(rss1 - rss0) / MiB,
             # A leak grows with the cycles; a runtime's one-time set-up
             # (Go's netpoller opens an epoll fd and an eventfd the first
             # time it is needed) and a heap reaching its steady size do
             # not: the second half's drift tells them apart.
             fd_drift_second_half=fd1 - half[0], rss_drift_second_half_mib=(rss1 - half[1]) / MiB,
             new_fds=sorted(set(v for k, v in fd_kinds().items() if kinds0.get(k) != v)))
    if mode == "xseg":
        st = xseg.tag_stats("bench")
        r.update(remaps=st["remaps"], tag_reserved_gib=st["reserved_bytes"] / (1 << 30))
    if vmm is not None:
        vmm.close()
    tensors.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    if mode == "xseg":
        # A tag keeps its free pages for its own allocations, like any
        # private pool (empty_cache leaves them); pausing it with nothing
        # live gives them back.
        xseg.pause("bench")
        r["tag_reserved_after_pause_gib"] = xseg.tag_stats("bench")["reserved_bytes"] / (1 << 30)
        xseg.empty_cache()
    r["device_free_end_vs_start_mib"] = (torch.cuda.mem_get_info()[0] - free_start) / MiB
    # Leaked device memory: free at the end of the cycles below free after
    # the warm-up by more than a page per allocation.
    # Leaked descriptors or host memory: growth over the second half of the
    # cycles (more than 1 MiB of RSS: the allocator's heap settles).
    r["leaked"] = (r["device_free_drift_mib"] < -(2 * n) or r["fd_drift_second_half"] > 0
                   or r["rss_drift_second_half_mib"] > 1)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=1000)
    ap.add_argument("--alloc-mib", type=int, default=64)
    ap.add_argument("--modes", default="xseg,vmm,empty_cache")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(one_mode(args.child, args.gib, args.cycles, args.alloc_mib)), flush=True)
        return
    status = 0
    rows = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--gib", str(args.gib), "--cycles",
               str(args.cycles), "--alloc-mib", str(args.alloc_mib)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            print(f"{mode}: failed ({p.returncode})\n{p.stdout[-2000:]}{p.stderr[-4000:]}")
            status = 1
            continue
        r = json.loads(lines[-1][7:])
        rows.append(r)
        print(lines[-1], flush=True)
        status |= 1 if r["leaked"] else 0
    print(f"\n{args.gib} GiB as allocations of {args.alloc_mib} MiB, {args.cycles} cycles (ms):")
    print(f"{'mode':12} {'pause med':>10} {'pause p99':>10} {'resume med':>11} {'resume p99':>11} "
          f"{'freed GiB':>10} {'dev drift MiB':>14} {'fds':>4} {'rss MiB':>8} {'2nd half: fds':>14} {'rss MiB':>8}")
    for r in rows:
        print(f"{r['mode']:12} {r['pause_median_ms']:10.2f} {r['pause_p99_ms']:10.2f} {r['resume_median_ms']:11.2f} "
              f"{r['resume_p99_ms']:11.2f} {r['freed_while_paused_gib']:10.2f} {r['device_free_drift_mib']:14.1f} "
              f"{r['fd_drift']:4d} {r['rss_drift_mib']:8.1f} {r['fd_drift_second_half']:14d} "
              f"{r['rss_drift_second_half_mib']:8.1f}")
    for r in rows:
        if r["new_fds"]:
            print(f"{r['mode']}: descriptors opened during the cycles: {', '.join(r['new_fds'])}")
    sys.exit(status)


if __name__ == "__main__":
    main()
