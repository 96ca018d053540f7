"""Does cuMemMap take an offset into an allocation here, and what do 2 MiB
mappings of one large allocation cost? Run on the GPU machine (no torch):

    python3 offset_probe.py [--mib 1024]

One allocation of --mib MiB, exportable as a POSIX fd, is mapped (a) whole,
once, and (b) as 2 MiB pieces, each with its own cuMemMap at its offset;
access is granted to (b) in one call over the range and, again, one call a
piece. A pattern written through (a) is read back through (b); a piece is
unmapped alone and mapped again past the range, and read there; the
allocation is exported once and a child process maps it whole and reads the
pattern. Prints one JSON line with the times (ms) and the checks.
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ipc_probe as P  # noqa: E402  (its ctypes structures and helpers)

C = P.C
cu = P.cu
MiB = P.MiB
PIECE = 2 * MiB


def read_u32(ptr):
    v = C.c_uint32()
    P.ck(cu.cuMemcpyDtoH_v2(C.byref(v), C.c_uint64(ptr), C.c_size_t(4)), "read")
    return v.value


def child(fd, size, pieces):
    P.init()
    h = C.c_uint64()
    P.ck(cu.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fd), 1), "import")
    base = P.reserve(size)
    P.ck(cu.cuMemMap(C.c_uint64(base), C.c_size_t(size), C.c_size_t(0), h, C.c_uint64(0)), "map")
    P.ck(cu.cuMemSetAccess(C.c_uint64(base), C.c_size_t(size), C.byref(P.ACC), C.c_size_t(1)), "access")
    ok = all(read_u32(base + i * PIECE) == i for i in range(0, pieces, max(1, pieces // 16)))
    print(json.dumps({"child_read_right": ok}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    P.init()
    size = args.mib * MiB
    n = size // PIECE
    r = {"allocation_mib": args.mib, "pieces": n}
    h = C.c_uint64()
    t = P.now()
    P.ck(cu.cuMemCreate(C.byref(h), C.c_size_t(size), C.byref(P.PROP), C.c_uint64(0)), "create")
    r["create_ms"] = (P.now() - t) * 1e3
    whole = P.reserve(size)
    t = P.now()
    P.ck(cu.cuMemMap(C.c_uint64(whole), C.c_size_t(size), C.c_size_t(0), h, C.c_uint64(0)), "map whole")
    r["map_whole_ms"] = (P.now() - t) * 1e3
    t = P.now()
    P.ck(cu.cuMemSetAccess(C.c_uint64(whole), C.c_size_t(size), C.byref(P.ACC), C.c_size_t(1)), "access whole")
    r["access_whole_ms"] = (P.now() - t) * 1e3
    for i in range(n):  # piece i holds the word i at its start
        P.ck(cu.cuMemsetD32_v2(C.c_uint64(whole + i * PIECE), i, C.c_size_t(1)), "memset")
    P.ck(cu.cuCtxSynchronize(), "sync")
    base = P.reserve(size + PIECE)
    t = P.now()
    err = 0
    for i in range(n):
        err = cu.cuMemMap(C.c_uint64(base + i * PIECE), C.c_size_t(PIECE), C.c_size_t(i * PIECE), h, C.c_uint64(0))
        if err:
            r["offset_map_error"] = err
            r["offset_map_failed_at"] = i
            break
    r["map_pieces_ms"] = (P.now() - t) * 1e3
    if not err:
        t = P.now()
        P.ck(cu.cuMemSetAccess(C.c_uint64(base), C.c_size_t(size), C.byref(P.ACC), C.c_size_t(1)), "access pieces")
        r["access_pieces_one_call_ms"] = (P.now() - t) * 1e3
        t = P.now()
        for i in range(n):
            P.ck(cu.cuMemSetAccess(C.c_uint64(base + i * PIECE), C.c_size_t(PIECE), C.byref(P.ACC), C.c_size_t(1)), "access")
        r["access_pieces_each_ms"] = (P.now() - t) * 1e3
        r["pieces_read_right"] = all(read_u32(base + i * PIECE) == i for i in range(n))
        k = n // 2
        t = P.now()
        P.ck(cu.cuMemUnmap(C.c_uint64(base + k * PIECE), C.c_size_t(PIECE)), "unmap piece")
        r["unmap_piece_ms"] = (P.now() - t) * 1e3
        t = P.now()
        P.ck(cu.cuMemMap(C.c_uint64(base + n * PIECE), C.c_size_t(PIECE), C.c_size_t(k * PIECE), h, C.c_uint64(0)), "remap")
        P.ck(cu.cuMemSetAccess(C.c_uint64(base + n * PIECE), C.c_size_t(PIECE), C.byref(P.ACC), C.c_size_t(1)), "access")
        r["remap_piece_ms"] = (P.now() - t) * 1e3
        r["moved_piece_read_right"] = read_u32(base + n * PIECE) == k
        r["neighbours_read_right"] = read_u32(base + (k - 1) * PIECE) == k - 1 and read_u32(base + (k + 1) * PIECE) == k + 1
        fd = P.export(h.value)
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", str(fd), str(size), str(n)],
                             pass_fds=[fd], capture_output=True, text=True, timeout=120)
        os.close(fd)
        r["child"] = out.stdout.strip() or out.stderr.strip()[-300:]
        t = P.now()
        for i in range(n):
            if i != k:
                P.ck(cu.cuMemUnmap(C.c_uint64(base + i * PIECE), C.c_size_t(PIECE)), "unmap")
        P.ck(cu.cuMemUnmap(C.c_uint64(base + n * PIECE), C.c_size_t(PIECE)), "unmap")
        r["unmap_pieces_ms"] = (P.now() - t) * 1e3
    P.ck(cu.cuMemUnmap(C.c_uint64(whole), C.c_size_t(size)), "unmap whole")
    P.ck(cu.cuMemRelease(h), "release")
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))


if __name__ == "__main__":
    sys.exit(main())
