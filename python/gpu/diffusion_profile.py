# One diffusion sampling request at a time (the held-out UNet sampler of
# python/gpu/corpus/holdout2.py), timed and profiled on the CPU side, under
# PyTorch's allocator ("native") or xseg (XSEG_CONF from the environment):
#   python3 python/gpu/diffusion_profile.py native|xseg   (from the repository root)
import sys
import time

import torch
mode = sys.argv[1]
if mode != "native":
    import xseg
    xseg.install()
sys.path.insert(0, "python/gpu/corpus")
from workloads import UNet
model = UNet().cuda().eval()
def request(b, h, w, n):
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        x = torch.randn(b, 3, h, w, device="cuda")
        ts = torch.linspace(999, 0, n, device="cuda").long()
        for t in ts:
            e = model(torch.cat([x, x]), t.repeat(2 * b))
            eu, ec = e.chunk(2)
            x = x - 0.01 * (eu + 3 * (ec - eu)).float()
    torch.cuda.synchronize()
request(9, 80, 48, 3)
request(13, 96, 96, 2)
t0 = time.perf_counter(); request(9, 80, 48, 25); t1 = time.perf_counter()
t2 = time.perf_counter(); request(13, 96, 96, 25); t3 = time.perf_counter()
print(f"TIME {mode} small {t1-t0:.3f} big {t3-t2:.3f}")
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    request(13, 96, 96, 10)
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=40))
