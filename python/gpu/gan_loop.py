"""Times holdout5.py's GAN training loop step by step (bench/RESULTS.md
rounds 37 and 38): gan_train's models, batches and steps, with the GPU
synchronized after each step, printing one RESULT line of JSON: the
steps' seconds, the first five steps in ms, the median step and the
median of the last ten, peak reserved and allocated bytes, and the
allocator's statistics (xseg's own under "xseg." when it is installed).
From the repository root:

    python3 python/gpu/gan_loop.py                 # PyTorch's allocator
    python3 -m xseg python/gpu/gan_loop.py         # xseg
    python3 -m xseg --conf large_page_mb:8 python/gpu/gan_loop.py

--batches picks the batch sizes: random (gan_train's, 32 to 512, a new
one nearly every step), fixed:N (N every step) or cycle:A,B,... (those in
turn). --steps sets how many (40). --profile also runs the steps after
the tenth under torch.profiler and adds, under "profile", the GPU's
kernel time a step, the kernels' count, and the CPU operators with the
most self time (where an allocator's calls show: aten::empty* call it,
cuDNN's convolutions call it for their workspaces).
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))

import torch  # noqa: E402

from holdout5 import gan_setup, gan_step  # noqa: E402
from workloads import seeded  # noqa: E402


def batch_sizes(spec: str, steps: int) -> list:
    """The batch size of each step, from --batches."""
    rng = seeded(0)
    if spec == "random":
        return [rng.randint(32, 512) for _ in range(steps)]
    kind, _, arg = spec.partition(":")
    try:
        values = [int(v) for v in arg.split(",")]
    except ValueError:
        values = []
    if kind not in ("fixed", "cycle") or not values or min(values) < 1 or (kind == "fixed" and len(values) != 1):
        raise SystemExit(f"--batches {spec!r}: want random, fixed:N or cycle:A,B,... (positive integers)")
    return [values[i % len(values)] for i in range(steps)]


def profile_summary(prof, steps: int) -> dict:
    """Kernel time a step and the CPU operators with the most self time."""
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    gpu_us = sum(e.self_device_time_total for e in kernels)
    cpu = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                 key=lambda e: e.self_cpu_time_total, reverse=True)
    return {"gpu_ms_per_step": gpu_us / 1e3 / steps, "kernels": sum(e.count for e in kernels),
            "cpu_self_ms": {e.key[:48]: round(e.self_cpu_time_total / 1e3, 1) for e in cpu[:12]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="random")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    if args.steps < 1 or (args.profile and args.steps <= 10):
        raise SystemExit("--steps: at least 1, and more than 10 with --profile")
    sizes = batch_sizes(args.batches, args.steps)  # seeds torch too, before the models
    nz, dev = 100, "cuda"
    g, d, opt_g, opt_d = gan_setup(nz, 128, dev)
    times, prof = [], None
    torch.cuda.synchronize()
    for i, b in enumerate(sizes):
        if args.profile and i == 10:
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                      torch.profiler.ProfilerActivity.CUDA])
            prof.__enter__()
        t0 = time.perf_counter()
        gan_step(g, d, opt_g, opt_d, b, nz, dev)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    result = {"total": sum(times), "first5_ms": [round(t * 1e3, 1) for t in times[:5]],
              "median_ms": sorted(times)[len(times) // 2] * 1e3,
              "last10_median_ms": sorted(times[-10:])[5] * 1e3 if len(times) >= 10 else None,
              "peak_reserved": torch.cuda.max_memory_reserved(), "peak_allocated": torch.cuda.max_memory_allocated()}
    if prof is not None:
        prof.__exit__(None, None, None)
        result["after10_s"] = sum(times[10:])
        try:
            result["profile"] = profile_summary(prof, args.steps - 10)
        except (AttributeError, TypeError) as e:  # the profiler's API moves between releases
            result["profile"] = {"error": repr(e)}
    result["stats"] = {k: v for k, v in torch.cuda.memory_stats().items()
                       if k.startswith("xseg.") or k in ("allocation.all.allocated", "num_device_alloc",
                                                         "num_device_free")}
    print("RESULT " + json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
