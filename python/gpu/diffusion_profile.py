# One diffusion sampling request at a time (holdout2.py's sampler and its
# ddim_request), timed and profiled on the CPU side, under PyTorch's
# allocator ("native") or xseg (XSEG_CONF from the environment):
#   python3 python/gpu/diffusion_profile.py native|xseg   (from the repository root)
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

mode = sys.argv[1]
if mode != "native":
    import xseg
    xseg.install()
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus"))
from holdout2 import ddim_request  # noqa: E402
from workloads import UNet  # noqa: E402

model = UNet().cuda().eval()
alphas_bar = torch.cumprod(1 - torch.linspace(1e-4, 0.02, 1000, device="cuda"), dim=0)


def request(b, h, w, n):
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        ddim_request(model, alphas_bar, b, h, w, n, "cuda")
    torch.cuda.synchronize()


request(9, 80, 48, 3)  # warm-up: kernels and the layouts of both shapes
request(13, 96, 96, 2)
t0 = time.perf_counter()
request(9, 80, 48, 25)
t1 = time.perf_counter()
request(13, 96, 96, 25)
t2 = time.perf_counter()
print(f"TIME {mode} small {t1 - t0:.3f} big {t2 - t1:.3f}")
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    request(13, 96, 96, 10)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
