"""CUDA graphs under xseg and under PyTorch's own allocator (issue 13).

Run once per allocator, each in its own process:
    python3 graphs.py xseg      # xseg installed as the CUDA allocator
    python3 graphs.py native    # PyTorch's caching allocator
Each case prints one line "GRAPHS <allocator> <case> ok|FAIL ..." and the
process exits 1 if any case failed. Cases:
  two_graphs     graph A (t = x*2; y = t+1; t freed inside the capture) and
                 graph B (w = x*3) captured one after the other on the
                 default capture stream; every replay order, 100 replays each.
  temp_then_alloc a temporary freed in a capture, then allocations of the
                 same size on the capture stream after it; 100 replays.
  shared_pool    two graphs captured with one pool id, replayed in capture
                 order, 100 times.
  growth         a capture that allocates 1 GiB (new pages mapped during
                 capture), replayed.
  record_stream  a block used on a side stream and freed inside a capture.
  release        reserved memory before a capture, with the graph, after
                 deleting it, after empty_cache.
"""
import gc
import itertools
import sys

which = sys.argv[1] if len(sys.argv) > 1 else "xseg"
if which == "xseg":
    import os
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import xseg_torch
    xseg_torch.install()
import torch

failed = 0
N = 1 << 22  # 16 MiB of float32: large pool


def report(case, ok, detail=""):
    global failed
    failed += not ok
    print(f"GRAPHS {which} {case} {'ok' if ok else 'FAIL'} {detail}".rstrip(), flush=True)


def reserved():
    torch.cuda.synchronize()
    if which == "xseg":
        return xseg_torch.memory_reserved()
    return torch.cuda.memory_reserved()


def warm(s):
    # A side-stream warm-up, as the CUDA graph docs ask for.
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ones(8, device="cuda").mul_(2)
    torch.cuda.current_stream().wait_stream(s)


def two_graphs():
    x = torch.arange(N, device="cuda", dtype=torch.float32)
    warm(torch.cuda.Stream())
    ga, gb = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(ga):
        t = x * 2
        y = t + 1
        del t
    with torch.cuda.graph(gb):
        w = x * 3
    ey, ew = x * 2 + 1, x * 3
    bad = []
    for order in itertools.permutations("ab"):
        for _ in range(100):
            for g in order:
                (ga if g == "a" else gb).replay()
        torch.cuda.synchronize()
        if not (torch.equal(y, ey) and torch.equal(w, ew)):
            bad.append("".join(order))
    report("two_graphs", not bad, f"orders {bad} wrong" if bad else "orders ab ba x100")


def temp_then_alloc():
    x = torch.arange(N, device="cuda", dtype=torch.float32)
    s = torch.cuda.Stream()
    warm(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        t = x * 2
        y = t + 1
        del t
    with torch.cuda.stream(s):
        zs = [torch.full((N,), 7.0, device="cuda") for _ in range(3)]
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(100):
        g.replay()
    torch.cuda.synchronize()
    ok = torch.equal(y, x * 2 + 1) and all(bool((z == 7).all()) for z in zs)
    report("temp_then_alloc", ok)


def shared_pool():
    x = torch.arange(N, device="cuda", dtype=torch.float32)
    warm(torch.cuda.Stream())
    pool = torch.cuda.graph_pool_handle()
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1, pool=pool):
        t = x * 2
        y1 = t + 1
        del t
    with torch.cuda.graph(g2, pool=pool):
        u = y1 * 3
        y2 = u - 1
        del u
    for _ in range(100):
        g1.replay()
        g2.replay()
    torch.cuda.synchronize()
    ok = torch.equal(y1, x * 2 + 1) and torch.equal(y2, (x * 2 + 1) * 3 - 1)
    detail = ""
    if which == "xseg":
        detail = f"pool blocks {len(xseg_torch.pool_allocations(pool))}"
    report("shared_pool", ok, detail)


def growth():
    x = torch.ones(N, device="cuda")
    warm(torch.cuda.Stream())
    before = reserved()
    maps = xseg_torch.stats()["num_maps"] if which == "xseg" else 0
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        big = torch.empty(1 << 28, device="cuda")  # 1 GiB mapped inside the capture
        big.fill_(2)
        out = big[:N] + x
    during = reserved()
    maps = xseg_torch.stats()["num_maps"] - maps if which == "xseg" else 0
    g.replay()
    torch.cuda.synchronize()
    # Under xseg the capture's pool is new, so its 1 GiB is mapped during the
    # capture (in pages or one chunk; pages from xseg's page cache, at most
    # 128 MiB and already counted as reserved, included); PyTorch's
    # allocator may take cached segments instead.
    grew = which != "xseg" or (maps > 0 and during - before >= (1 << 30) - (128 << 20))
    report("growth", bool((out == 3).all()) and grew,
           f"reserved +{(during - before) >> 20} MiB, {maps} pages mapped in capture")


def record_stream():
    x = torch.arange(N, device="cuda", dtype=torch.float32)
    side = torch.cuda.Stream()
    warm(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        t = x * 2
        y = t + 1
        t.record_stream(side)
        del t
    g.replay()
    torch.cuda.synchronize()
    z = torch.full((N,), 5.0, device="cuda")
    g.replay()
    torch.cuda.synchronize()
    report("record_stream", torch.equal(y, x * 2 + 1) and bool((z == 5).all()))


def release():
    gc.collect()
    torch.cuda.empty_cache()
    base = reserved()
    x = torch.ones(N, device="cuda")
    warm(torch.cuda.Stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ts = [x * i for i in range(16)]  # 256 MiB in the graph's pool
        y = sum(ts)
        del ts
    g.replay()
    with_graph = reserved()
    del g, y
    gc.collect()
    after_del = reserved()
    torch.cuda.empty_cache()
    after_empty = reserved()
    del x
    gc.collect()
    torch.cuda.empty_cache()
    ok = with_graph - base >= 256 << 20 and after_empty <= base + (16 << 20) + (20 << 20)
    if which == "xseg":
        ok = ok and after_del < with_graph  # xseg gives a destroyed graph's memory back at once
    report("release", ok, f"reserved MiB: before {base >> 20}, with graph {with_graph >> 20}, "
           f"graph deleted {after_del >> 20}, after empty_cache {after_empty >> 20}")


for case in (two_graphs, temp_then_alloc, shared_pool, growth, record_stream, release):
    try:
        case()
    except Exception as e:  # a case that raises is a failure, the others still run
        report(case.__name__, False, f"{type(e).__name__}: {e}")
sys.exit(1 if failed else 0)
