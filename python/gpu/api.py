"""Checks of xseg_torch on a GPU, each printing one "API ..." line:
install() refuses once CUDA is initialized; installed() says clearly that
PyTorch cannot swap back; stats / empty_cache / reset_peak_stats / snapshot
work under PyTorch; what an out-of-memory looks like to PyTorch.
Usage: python3 api.py [--lib PATH]. Exits 1 if a check fails."""
import os
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
lib = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--lib" else None
failed = 0


def report(ok, what):
    global failed
    failed += not ok
    print(f"API {'ok  ' if ok else 'FAIL'} {what}", flush=True)


def child(code):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": os.path.join(here, "..")})
    return p.returncode, p.stdout + p.stderr


rc, out = child("import torch, xseg_torch\ntorch.zeros(1, device='cuda')\nxseg_torch.install()")
report(rc != 0 and "already initialized" in out, "install() after CUDA init raises: "
       + out.strip().splitlines()[-1][:200])
rc, out = child("import torch, xseg_torch\nwith xseg_torch.installed():\n"
                "    x = torch.ones(1 << 20, device='cuda')\n    assert x.sum().item() == 1 << 20\n"
                "    print('block ran under xseg', xseg_torch.memory_allocated() >= 4 << 20)")
report(rc != 0 and "block ran under xseg True" in out and "cannot put PyTorch's allocator back" in out,
       "installed() runs the block, then raises: " + out.strip().splitlines()[-1][:240])
rc, out = child("import torch, xseg_torch\nwith xseg_torch.installed(keep=True):\n"
                "    x = torch.ones(10, device='cuda'); del x\nprint('kept', xseg_torch.is_installed())")
report(rc == 0 and "kept True" in out, "installed(keep=True) leaves xseg installed quietly")

rc, out = child("import torch, xseg_torch\nxseg_torch.install(raise_on_oom=False)\n"
                "t = torch.empty(4 * 80 << 30, dtype=torch.uint8, device='cuda')\n"
                "print('NULL tensor at', hex(t.data_ptr()))")
print("API info raise_on_oom=False (xseg_malloc returns NULL), PyTorch did: "
      + (out.strip().splitlines() or ["nothing"])[-1][:200], flush=True)

import torch  # noqa: E402
import xseg_torch  # noqa: E402
xseg_torch.install(lib, conf="oom_max_retries:0")
xseg_torch.install(lib)  # again: only the routing may change
x = torch.randn(64 << 20, device="cuda")  # 256 MiB
st = xseg_torch.stats()
report(st["allocated_bytes.all.current"] >= 256 << 20 and st["reserved_bytes.all.current"] >= 256 << 20,
       f"stats under PyTorch: allocated {st['allocated_bytes.all.current']} reserved "
       f"{st['reserved_bytes.all.current']} device total {xseg_torch.memory_total()}")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    y = x * 2
x.record_stream(s)
report(xseg_torch.last_error() is None, f"record_stream routed (last error {xseg_torch.last_error()})")
del x, y
torch.cuda.synchronize()
xseg_torch.empty_cache()
st = xseg_torch.stats()
report(st["reserved_bytes.all.current"] < 256 << 20,
       f"empty_cache gave pages back: reserved now {st['reserved_bytes.all.current']}")
xseg_torch.reset_peak_stats()
report(xseg_torch.peak_memory() == xseg_torch.memory_used(), "reset_peak_stats")
snap = xseg_torch.snapshot()
report("segments" in snap and "stats" in snap, f"snapshot: {len(snap['segments'])} segments")

too_big = 4 * xseg_torch.memory_total()
try:
    t = torch.empty(too_big, dtype=torch.uint8, device="cuda")
    report(False, f"OOM: a {too_big} byte tensor came back at {t.data_ptr():#x}")
    del t
except RuntimeError as e:  # torch.OutOfMemoryError is a RuntimeError too
    report("out of memory" in str(e), f"OOM raises {type(e).__name__}: {str(e).splitlines()[0][:200]}")
print(f"OOM xseg last error: {xseg_torch.last_error()}")
report(xseg_torch.num_ooms() >= 1, f"num_ooms {xseg_torch.num_ooms()}")
z = torch.ones(1 << 20, device="cuda")
report(z.sum().item() == 1 << 20, "allocation after the OOM works")
sys.exit(1 if failed else 0)
