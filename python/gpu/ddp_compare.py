"""Run ddp_gpt2.py with torchrun (2 processes, NCCL) natively and with xseg
installed in each rank, and compare: per-step loss within 1e-3 relative,
median step time (steps 3..N) of xseg within 3% of native, the all-reduce
correct on xseg memory. Exits 1 if a check fails.
Usage: python3 ddp_compare.py [--steps 10] [--lib PATH] [--nproc 2]"""
import argparse
import json
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--lib", default=None)
ap.add_argument("--nproc", type=int, default=2)
args = ap.parse_args()
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ddp_gpt2.py")
env = dict(os.environ, NCCL_NVLS_ENABLE=os.environ.get("NCCL_NVLS_ENABLE", "0"),
           TORCH_SYMM_MEM_DISABLE_MULTICAST=os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
           PYTHONUNBUFFERED="1")
results = {}
for mode in ("native", "xseg"):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.nproc),
           script, mode, "--steps", str(args.steps)]
    if args.lib:
        cmd += ["--lib", args.lib]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-4000:])
        sys.exit(f"{mode} failed with exit status {p.returncode}")
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
    results[mode] = json.loads(line[len("RESULT "):])

nat, xs = results["native"], results["xseg"]
worst = max(abs(a - b) / abs(a) for a, b in zip(nat["losses"], xs["losses"]))
slow = xs["median_step_s"] / nat["median_step_s"] - 1
checks = {
    "loss within 1e-3 relative at every step": worst <= 1e-3,
    "median step time within 3% of native": slow <= 0.03,
    "all-reduce correct (native)": nat["allreduce_ok"],
    "all-reduce correct on xseg memory": xs["allreduce_ok"] and xs["allreduce_in_xseg"],
}
print(f"DDP COMPARE: ranks {nat['world']}, steps {len(nat['losses'])}")
print("loss: " + " ".join(f"{a:.6f}/{b:.6f}" for a, b in zip(nat["losses"], xs["losses"])) + f"  worst relative {worst:.2e}")
print(f"median step ms (steps 3..): native {nat['median_step_s'] * 1e3:.2f}  xseg {xs['median_step_s'] * 1e3:.2f}  ({slow * 100:+.2f}%)")
print(f"peak reserved / allocated per rank 0: native {nat['reserved_bytes.all.peak']} / {nat['allocated_bytes.all.peak']}"
      f"  xseg {xs['reserved_bytes.all.peak']} / {xs['allocated_bytes.all.peak']}")
print("xseg counters rank 0: " + json.dumps({k: xs[k] for k in ("num_maps", "num_set_access_calls", "num_pages_created", "num_ooms")}))
for k, v in checks.items():
    print(f"CHECK {'ok  ' if v else 'FAIL'} {k}")
sys.exit(0 if all(checks.values()) else 1)
