"""Trains one of the corpus's models at a fixed shape (the same
allocations every step) and prints one RESULT line of JSON: the median
step in ms after the tenth, peak reserved and allocated bytes, and the
pages mapped in all and over the second half of the steps (xseg's
num_maps; "late" maps, which a layout that has settled does not make).
bench/RESULTS.md round 38 runs it under PyTorch's allocator, xseg's
default and policy:steady, to see which loops the default keeps moving
pages in. From the repository root:

    python3 python/gpu/fixed_loop.py MODEL [--steps N]
    python3 -m xseg [--conf policy:steady] python/gpu/fixed_loop.py MODEL

MODEL: resnet50 (batch 64 at 224 x 224, SGD), resnet_small (a
ResNet-26 of width 32, batch 128 at 112 x 112: short steps), unet
(the corpus's UNet, batch 32 at 64 x 64, AdamW), gpt (the corpus's GPT
uncheckpointed, 12 layers of 768, batch 8 of 512 tokens, bf16 autocast,
AdamW), gan (holdout5's DCGAN at batch 256).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from holdout import resnet  # noqa: E402
from holdout5 import gan_setup, gan_step  # noqa: E402
from workloads import GPT, UNet, seeded  # noqa: E402

MODELS = ("resnet50", "resnet_small", "unet", "gpt", "gan")


def make_step(name: str, dev: str):
    """The model's training step: a function of no arguments."""
    if name == "gan":
        g, d, opt_g, opt_d = gan_setup(100, 128, dev)
        return lambda: gan_step(g, d, opt_g, opt_d, 256, 100, dev)
    if name in ("resnet50", "resnet_small"):
        depths, width, batch, side = ((3, 4, 6, 3), 64, 64, 224) if name == "resnet50" else ((2, 2, 2, 2), 32, 128, 112)
        model = resnet(depths, width).to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

        def step():
            x = torch.randn(batch, 3, side, side, device=dev)
            y = torch.randint(0, 1000, (batch,), device=dev)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    if name == "unet":
        model = UNet().to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            x = torch.randn(32, 3, 64, 64, device=dev)
            t = torch.randint(0, 1000, (32,), device=dev)
            F.mse_loss(model(x, t), x).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step
    model = GPT(50257, 768, 12, 12, 512, checkpointed=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        ids = torch.randint(0, 50257, (8, 512), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids)
        F.cross_entropy(logits.float().view(-1, logits.shape[-1]), ids.view(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def maps() -> int:
    """Pages mapped so far under xseg (cudaMalloc calls under PyTorch's
    allocator)."""
    st = torch.cuda.memory_stats()
    return int(st.get("xseg.num_maps", st.get("num_device_alloc", 0)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    if args.steps < 12:
        raise SystemExit("--steps: at least 12")
    seeded(0)
    step = make_step(args.model, "cuda")
    times, mid = [], 0
    torch.cuda.synchronize()
    for i in range(args.steps):
        if i == args.steps // 2:
            mid = maps()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    after = sorted(times[10:])
    print("RESULT " + json.dumps({
        "model": args.model, "median_ms": after[len(after) // 2] * 1e3, "first_ms": times[0] * 1e3,
        "peak_reserved": torch.cuda.max_memory_reserved(), "peak_allocated": torch.cuda.max_memory_allocated(),
        "maps": maps(), "late_maps": maps() - mid}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
