"""Does the size of the mappings behind a tensor change how fast kernels run
on it? Times a few kernels over large tensors under one allocator, in its own
process:

    python3 mapping_probe.py native|expandable|xseg [--reps 30]

Under xseg the tensors sit on 2 MiB mappings (the default policy's pages; a
first growth past the chunk mark gets one physical allocation for the inside
of a block, so the probe first allocates and frees a block as large as all
of its tensors, and the tensors are carved from recycled pages, as a
training loop's are after its first steps), or on chunks of up to 64 MiB
under XSEG_CONF=policy:steady. PyTorch's native allocator backs each large
block with one cudaMalloc; expandable segments map 20 MiB pages.

Kernels (CUDA events, median of --reps after 3 warm-up runs, ms):
  stream   y = x * 1.0001 over 2 GiB (bandwidth, sequential)
  gather   torch.take over a 2 GiB table with 64 Mi random indices
           (scattered reads: the reach of the GPU's address translation)
  gemm     bf16 8192 x 8192 x 8192
  logits   bf16 (8192 x 768) @ (768 x 50257), GPT-2 small's LM head

Prints one line "RESULT {json}"."""
import argparse
import json
import os

from torch_setup import choose_allocator, median_ms

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["native", "expandable", "xseg"])
ap.add_argument("--reps", type=int, default=30)
args = ap.parse_args()

choose_allocator(args.mode)
import torch  # noqa: E402

if args.mode == "xseg":
    import xseg  # noqa: E402
    xseg.install()

dev = torch.device("cuda")
GiB = 1 << 30
if args.mode == "xseg":
    # Grow past the chunk mark once and give it back, so that the tensors
    # below are made of 2 MiB pages, as a loop's blocks are after its first
    # steps (a chunk freed whole is split when a smaller block is carved).
    warm = torch.empty(7 * GiB, dtype=torch.uint8, device=dev)
    del warm
    small = [torch.empty((1 << 20) + 4096 * i, dtype=torch.uint8, device=dev) for i in range(64)]
    del small

g = torch.Generator(device=dev).manual_seed(0)
x = torch.rand(GiB // 2, device=dev, generator=g)  # 2 GiB of float32
y = torch.empty_like(x)
idx = torch.randint(0, x.numel(), (1 << 26,), device=dev, generator=g)
a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16, generator=g)
c = torch.empty(8192, 8192, device=dev, dtype=torch.bfloat16)
h = torch.randn(8192, 768, device=dev, dtype=torch.bfloat16, generator=g)
w = torch.randn(768, 50257, device=dev, dtype=torch.bfloat16, generator=g)
logits = torch.empty(8192, 50257, device=dev, dtype=torch.bfloat16)
gathered = torch.empty(1 << 26, device=dev)

kernels = {
    "stream": lambda: torch.mul(x, 1.0001, out=y),
    "gather": lambda: torch.take(x, idx, out=gathered),
    "gemm": lambda: torch.matmul(a, b, out=c),
    "logits": lambda: torch.matmul(h, w, out=logits),
}
res = {}
for name, k in kernels.items():
    for _ in range(3):
        k()
    res[name] = median_ms(torch, k, args.reps)
out = {"mode": args.mode, "conf": os.environ.get("XSEG_CONF", ""), "ms": res}
if args.mode == "xseg":
    st = xseg.stats()
    out.update({k: st.get(k) for k in ("num_maps", "num_pages_created", "num_unmaps")})
print("RESULT " + json.dumps(out), flush=True)
