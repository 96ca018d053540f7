"""Where the time of sharing 1 GiB between processes goes, by layout.

Run on the GPU machine (no torch needed):

    python3 ipc_probe.py [--mib 1024] [--runs 6]

For each layout (the same bytes as 1, 2, 52 or 512 physical allocations)
the parent creates the allocations exportable as POSIX fds, maps them into
one range and fills it; then, --runs times, it exports every allocation
(freshly, or once and reused: "cached"), passes the fds to a child over a
Unix socket, and the child imports, reserves, maps, grants access and reads
the last word back. Each step's time is printed as a median over the runs
(the first run left out) in JSON lines. The point is to see which costs
are per allocation and which per byte, so that a layout can be chosen that
brings a 1 GiB share under legacy CUDA IPC's time.
"""
import argparse
import ctypes as C
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cu_vmm import MiB, Access, Flags, Loc, Prop, ck, cu  # noqa: E402


CTX = C.c_void_p()
# XSEG_PROBE_THREADS=N: the child imports, and grants access per mapping,
# from N threads at once (does the driver run them in parallel?).
THREADS = int(os.environ.get("XSEG_PROBE_THREADS", "1"))


def init():
    ck(cu.cuInit(0), "cuInit")
    ck(cu.cuDevicePrimaryCtxRetain(C.byref(CTX), 0), "retain")
    ck(cu.cuCtxSetCurrent(CTX), "set current")


def each(fn, items):
    """fn over items, from THREADS threads (each with the context current)."""
    if THREADS <= 1:
        return [fn(x) for x in items]
    from concurrent.futures import ThreadPoolExecutor

    def run(x):
        ck(cu.cuCtxSetCurrent(CTX), "set current")
        return fn(x)
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(run, items))


PROP = Prop(1, 1, Loc(1, 0), None, Flags())
ACC = Access(Loc(1, 0), 3)


def now():
    return time.perf_counter()


def reserve(size):
    p = C.c_uint64()
    ck(cu.cuMemAddressReserve(C.byref(p), C.c_size_t(size), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "reserve")
    return p.value


def map_all(base, hs, sz, per_map_access):
    t = {}
    t0 = now()
    for i, h in enumerate(hs):
        ck(cu.cuMemMap(C.c_uint64(base + i * sz), C.c_size_t(sz), C.c_size_t(0), C.c_uint64(h), C.c_uint64(0)), "map")
    t1 = now()
    if per_map_access:
        each(lambda i: ck(cu.cuMemSetAccess(C.c_uint64(base + i * sz), C.c_size_t(sz), C.byref(ACC), C.c_size_t(1)),
                          "access"), range(len(hs)))
    else:
        ck(cu.cuMemSetAccess(C.c_uint64(base), C.c_size_t(sz * len(hs)), C.byref(ACC), C.c_size_t(1)), "access")
    t2 = now()
    t["map"], t["access"] = t1 - t0, t2 - t1
    return t


def export(h):
    fd = C.c_int(-1)
    ck(cu.cuMemExportToShareableHandle(C.byref(fd), C.c_uint64(h), 1, C.c_uint64(0)), "export")
    return fd.value


def child(sock, per_map_access):
    init()
    while True:
        hdr = sock.recv(16)
        if not hdr:
            return
        n, sz = struct.unpack("QQ", hdr)
        fds = []
        while len(fds) < n:
            _, got, _, _ = socket.recv_fds(sock, 1, min(n - len(fds), 250))
            fds += got
        t = {}
        t0 = now()
        def imp(fd):
            h = C.c_uint64()
            ck(cu.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fd), 1), "import")
            return h.value
        hs = each(imp, fds)
        t["import"] = now() - t0
        t["threads"] = THREADS
        t1 = now()
        base = reserve(n * sz)
        t["reserve"] = now() - t1
        t.update(map_all(base, hs, sz, per_map_access))
        t3 = now()
        v = C.c_float()
        ck(cu.cuMemcpyDtoH_v2(C.byref(v), C.c_uint64(base + n * sz - 4), C.c_size_t(4)), "read")
        t["read"] = now() - t3
        t["open_total"] = now() - t0
        t["read_at"] = time.clock_gettime(time.CLOCK_MONOTONIC)
        t["value"] = v.value
        # Undo, timed apart: not part of the put-to-read path.
        t4 = now()
        ck(cu.cuMemUnmap(C.c_uint64(base), C.c_size_t(n * sz)), "unmap")
        for h in hs:
            ck(cu.cuMemRelease(C.c_uint64(h)), "release")
        ck(cu.cuMemAddressFree(C.c_uint64(base), C.c_size_t(n * sz)), "free")
        for fd in fds:
            os.close(fd)
        t["close"] = now() - t4
        b = json.dumps(t).encode()
        sock.sendall(struct.pack("Q", len(b)) + b)


def recv_json(sock):
    n = struct.unpack("Q", sock.recv(8, socket.MSG_WAITALL))[0]
    return json.loads(sock.recv(n, socket.MSG_WAITALL))


def layout(total, n, runs, cached, per_map_access):
    sz = total // n
    hs = []
    t0 = now()
    for _ in range(n):
        h = C.c_uint64()
        ck(cu.cuMemCreate(C.byref(h), C.c_size_t(sz), C.byref(PROP), C.c_uint64(0)), "create")
        hs.append(h.value)
    create = now() - t0
    base = reserve(total)
    map_all(base, hs, sz, False)
    ck(cu.cuMemsetD32_v2(C.c_uint64(base), 0x3F800000, C.c_size_t(total // 4)), "memset")
    ck(cu.cuCtxSynchronize(), "sync")
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # A fresh process, not a fork: CUDA does not survive fork.
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", str(b.fileno())]
                            + (["--access-per-map"] if per_map_access else []), pass_fds=[b.fileno()])
    b.close()
    rows = []
    keep = None
    for r in range(runs):
        start = time.clock_gettime(time.CLOCK_MONOTONIC)
        t0 = now()
        if cached and keep is not None:
            fds = [os.dup(fd) for fd in keep]
        else:
            fds = [export(h) for h in hs]
            if cached:
                keep = [os.dup(fd) for fd in fds]
        exp = now() - t0
        a.sendall(struct.pack("QQ", n, sz))
        for i in range(0, n, 250):
            socket.send_fds(a, [b"x"], fds[i:i + 250])
        for fd in fds:
            os.close(fd)
        t = recv_json(a)
        t["export"] = exp
        t["put_to_read"] = t.pop("read_at") - start
        rows.append(t)
    a.close()
    proc.wait()
    for fd in keep or []:
        os.close(fd)
    ck(cu.cuMemUnmap(C.c_uint64(base), C.c_size_t(total)), "unmap")
    for h in hs:
        ck(cu.cuMemRelease(C.c_uint64(h)), "release")
    ck(cu.cuMemAddressFree(C.c_uint64(base), C.c_size_t(total)), "free")
    keys = [k for k in rows[0] if k != "value"]
    med = {k: round(statistics.median(r[k] for r in rows[1:]) * 1e3, 3) for k in keys}
    first = {k: round(rows[0][k] * 1e3, 3) for k in keys}
    ok = all(r["value"] == 1.0 for r in rows)
    return {"allocations": n, "alloc_mib": sz // MiB, "cached_export": cached, "access_per_map": per_map_access,
            "create_ms": round(create * 1e3, 3), "median_ms": med, "first_run_ms": first, "read_right": ok}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--counts", default="1,2,8,52,512")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--access-per-map", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return child(socket.socket(fileno=args.child), args.access_per_map)
    init()
    total = args.mib * MiB
    for n in map(int, args.counts.split(",")):
        if total % n or (total // n) % (2 * MiB):
            total_n = (total // n + 2 * MiB - 1) // (2 * MiB) * (2 * MiB) * n
        else:
            total_n = total
        for cached in (False, True):
            for pma in ((False, True) if n in (52, 512) and not cached else (False,)):
                print(json.dumps(layout(total_n, n, args.runs, cached, pma)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
