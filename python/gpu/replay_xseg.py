"""Replay a trace (DESIGN.md, "Trace format") with xseg as PyTorch's
allocator, as corpus/torch_replay.py does with PyTorch's own, and print the
same line, taking peak reserved, retries and OOMs from xseg's stats.
Usage: python3 replay_xseg.py TRACE.gz [--lib PATH]"""
import gzip
import os
import sys
import time

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
import xseg_torch  # noqa: E402

path = sys.argv[1]
xseg_torch.install(sys.argv[3] if len(sys.argv) > 3 and sys.argv[2] == "--lib" else None)
ev = [l.split() for l in gzip.open(path, "rt")]
torch.cuda.init()
keep = torch.empty(1, device="cuda")
xseg_torch.reset_peak_stats()
base = xseg_torch.memory_allocated()
streams = {"0": torch.cuda.current_stream()}
live, sizes, cur, peak = {}, {}, 0, 0
t0 = time.perf_counter()
for e in ev:
    if e[0] == "a":
        s = e[3]
        if s not in streams:
            streams[s] = torch.cuda.Stream()
        n = int(e[2])
        sizes[e[1]] = n
        live[e[1]] = torch.cuda.caching_allocator_alloc(n, 0, streams[s])
        cur += n
        peak = max(peak, cur)
    else:
        torch.cuda.caching_allocator_delete(live.pop(e[1]))
        cur -= sizes.pop(e[1])
t1 = time.perf_counter()
st = xseg_torch.stats()
res = st["reserved_bytes.all.peak"]
print(f"{os.path.basename(path)} [xseg] events={len(ev)} trace_peak_live={peak} "
      f"max_allocated={st['allocated_bytes.all.peak'] - base} max_reserved={res} "
      f"reserved/live={res / peak:.3f} us_per_event={(t1 - t0) / len(ev) * 1e6:.2f} "
      f"retries={st['num_alloc_retries']} ooms={st['num_ooms']} maps={st['num_maps']} "
      f"unmaps={st['num_unmaps']} set_access_calls={st['num_set_access_calls']}")
