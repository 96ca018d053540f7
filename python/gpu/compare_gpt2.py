"""Run train_gpt2.py under native PyTorch, expandable segments and xseg, each
in its own process, and compare: xseg's loss within 1e-3 relative of native
at every step, its median tokens/s (steps 3..10) within 2% of native, and the
three peak reserved figures side by side. Exits 1 if a check fails.
Usage: python3 compare_gpt2.py [--steps 10] [--lib PATH]"""
import argparse
import json
import os
import subprocess
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--lib", default=None)
args = ap.parse_args()
script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_gpt2.py")
results = {}
for mode in ("native", "expandable", "xseg"):
    cmd = [sys.executable, script, mode, "--steps", str(args.steps)]
    if args.lib:
        cmd += ["--lib", args.lib]
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-4000:])
        sys.exit(f"{mode} failed with exit status {p.returncode}")
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
    results[mode] = json.loads(line[len("RESULT "):])

nat, xs = results["native"], results["xseg"]
ok = True
worst = 0.0
for i, (a, b) in enumerate(zip(nat["losses"], xs["losses"]), 1):
    rel = abs(a - b) / abs(a)
    worst = max(worst, rel)
    if rel > 1e-3:
        ok = False
        print(f"FAIL step {i}: native loss {a:.6f} xseg {b:.6f} (relative {rel:.2e})")
print(f"loss: worst relative difference xseg vs native {worst:.2e} over {len(nat['losses'])} steps (limit 1e-3)")
ratio = xs["median_tokens_per_s"] / nat["median_tokens_per_s"]
print(f"tokens/s median steps 3..{args.steps}: native {nat['median_tokens_per_s']:.0f} "
      f"expandable {results['expandable']['median_tokens_per_s']:.0f} xseg {xs['median_tokens_per_s']:.0f} "
      f"(xseg/native {ratio:.4f}, limit 0.98)")
if ratio < 0.98:
    ok = False
    print("FAIL tokens/s: xseg is more than 2% slower than native")
for mode, r in results.items():
    print(f"peak reserved [{mode}]: {r['peak_reserved']} bytes ({r['peak_reserved'] / 2**30:.3f} GiB), "
          f"peak allocated {r['peak_allocated']} ({r['peak_reserved'] / max(r['peak_allocated'], 1):.3f} reserved/allocated)")
print("xseg counters:", {k: v for k, v in xs.items() if k.startswith("num_")})
print("GPT2 COMPARE", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
