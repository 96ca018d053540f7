"""Time xseg's share of a 1 GiB tensor from Python (ctypes) in a tight loop,
and an idle stream's sync, on the GPU machine (bench/RESULTS.md round 22):

    PYTHONPATH=<installed wheel> python3 python/gpu/share_probe.py
"""
import time, statistics, torch, xseg
from xseg import _lib
xseg.install()
t = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
torch.cuda.synchronize()
ptr = t.untyped_storage().data_ptr()
for name, fn in (("share_block+unshare", lambda: _lib.unshare(_lib.share_block(ptr, 0, importers=1))),
                 ("stream sync", lambda: torch.cuda.current_stream(t.device).synchronize())):
    ts = []
    for i in range(3000):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
    ts = ts[500:]
    print(name, "median us %.1f p90 %.1f" % (statistics.median(ts) * 1e6, sorted(ts)[int(len(ts) * .9)] * 1e6))
d = _lib.share_block(ptr, 0, importers=1)
ts = []
for i in range(2000):
    t0 = time.perf_counter(); _lib.unshare(d); ts.append(time.perf_counter() - t0)
    d = _lib.share_block(ptr, 0, importers=1)
print("unshare alone median us %.1f" % (statistics.median(ts[300:]) * 1e6))
