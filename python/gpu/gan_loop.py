"""Times holdout5.py's GAN training loop step by step (bench/RESULTS.md
round 37): gan_train's models, batches and steps, with the GPU
synchronized after each step, printing one RESULT line of JSON: the 40
steps' seconds, the first five steps in ms, the median step, and the
allocator's statistics (xseg's own under "xseg." when it is installed).
From the repository root:

    python3 python/gpu/gan_loop.py                 # PyTorch's allocator
    python3 -m xseg python/gpu/gan_loop.py         # xseg
    python3 -m xseg --conf large_page_mb:8 python/gpu/gan_loop.py
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))

import torch  # noqa: E402

from holdout5 import gan_setup, gan_step  # noqa: E402
from workloads import seeded  # noqa: E402


def main() -> int:
    rng, nz, dev = seeded(0), 100, "cuda"
    g, d, opt_g, opt_d = gan_setup(nz, 128, dev)
    times = []
    torch.cuda.synchronize()
    for _ in range(40):
        b = rng.randint(32, 512)
        t0 = time.perf_counter()
        gan_step(g, d, opt_g, opt_d, b, nz, dev)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    stats = {k: v for k, v in torch.cuda.memory_stats().items()
             if k.startswith("xseg.") or k in ("allocation.all.allocated", "num_device_alloc", "num_device_free")}
    print("RESULT " + json.dumps({"total": sum(times), "first5_ms": [round(t * 1e3, 1) for t in times[:5]],
                                  "median_ms": sorted(times)[len(times) // 2] * 1e3, "stats": stats}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
