"""What xseg holds around a raw CUDA graph capture (capture_begin /
capture_end on a side stream) with 64 MiB freed before it, and what
torch.cuda.empty_cache and xseg.empty_cache do during and after it: the
reserved and allocated bytes and each segment's blocks at each step.
RESULTS round 25 used it. Run on the GPU machine: python3 capture_probe.py"""
import xseg

xseg.install()
import torch  # noqa: E402  (after install: PyTorch swaps allocators only before CUDA starts)


def st(tag):
    segs = [(hex(g["address"]), g["total_size"], g.get("stream"), [(b["size"], b["state"]) for b in g["blocks"]][:6])
            for g in torch.cuda.memory_snapshot()]
    print(tag, "reserved", torch.cuda.memory_reserved(), "alloc", torch.cuda.memory_allocated(), "segs", segs,
          flush=True)



x = torch.zeros(1 << 20, device="cuda")
junk = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
del junk
torch.cuda.synchronize()
st("before capture")
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    g.capture_begin()
    y = x + 1
    st("in capture")
    torch.cuda.empty_cache()
    g.capture_end()
torch.cuda.current_stream().wait_stream(s)
st("after capture")
try:
    xseg.empty_cache(0)
    print("C empty_cache ok")
except Exception as e:
    print("C empty_cache raised", e)
st("after C empty")
torch.cuda.empty_cache()
st("after torch empty")
