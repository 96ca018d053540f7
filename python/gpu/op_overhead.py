"""What one allocation costs a PyTorch program on the host, under one
allocator, in its own process:

    python3 op_overhead.py native|expandable|xseg [--n 200000]

Times, on the CPU, loops that PyTorch's eager mode runs between kernels:
  empty    torch.empty of 4 MiB on the GPU and its release (one malloc and
           one free through the allocator, no kernel)
  add      y = x + 1 on a 256-element tensor (a kernel launch and one
           allocation, the mix of an optimizer's or a norm's small ops)
  add_out  the same into a preallocated y (the launch alone)
Each: the median of 5 windows of --n iterations, ns per iteration. The
difference add - add_out is what an allocation adds to a small op.
Prints one line "RESULT {json}"."""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["native", "expandable", "xseg"])
ap.add_argument("--n", type=int, default=200000)
args = ap.parse_args()

if args.mode == "expandable":
    os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
else:
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
if args.mode == "xseg":
    import xseg_torch  # noqa: E402
    xseg_torch.install(None)


def window(fn, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    fn(n)
    torch.cuda.synchronize()
    return (time.perf_counter_ns() - t0) / n


def empty(n):
    for _ in range(n):
        t = torch.empty(1 << 20, device="cuda")
        del t


x = torch.ones(256, device="cuda")
y = torch.empty_like(x)


def add(n):
    for _ in range(n):
        z = x + 1
        del z


def add_out(n):
    for _ in range(n):
        torch.add(x, 1, out=y)


res = {"mode": args.mode}
for name, fn in (("empty", empty), ("add", add), ("add_out", add_out)):
    fn(1000)
    res[name] = statistics.median(window(fn, args.n) for _ in range(5))
print("RESULT " + json.dumps(res), flush=True)
