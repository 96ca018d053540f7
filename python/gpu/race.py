"""The two-stream race of PyTorch's CUDA semantics notes, under xseg.

Each iteration: x is written on stream A; stream B waits for A, sleeps
(torch.cuda._sleep), then reads x into y; x is freed on A and a tensor of the
same size is at once allocated on A and overwritten there while B still
sleeps. If the allocator hands x's memory out again, B reads the overwrite
and y is wrong. x.record_stream(B) tells PyTorch's allocator about B; under
xseg it helps only if xseg_torch routes it to xseg (the default).

    python3 race.py [--no-route] [--iters 100] [--allocator xseg|native]

Prints the count of correct iterations and of iterations in which the new
tensor reused x's address, then "RACE {json}". Exits 0 when the outcome is
the expected one: all correct with routing, corruption detected without."""
import argparse
import json
import os
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--no-route", dest="route", action="store_false")
ap.add_argument("--iters", type=int, default=100)
ap.add_argument("--allocator", choices=["xseg", "native"], default="xseg")
ap.add_argument("--cycles", type=int, default=50_000_000)
ap.add_argument("--lib", default=None)
args = ap.parse_args()

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
if args.allocator == "xseg":
    import xseg_torch  # noqa: E402
    xseg_torch.install(args.lib, route_record_stream=args.route)

n = 4 << 20  # 16 MiB of float32: the large pool
A, B = torch.cuda.Stream(), torch.cuda.Stream()
correct = reused = 0
for i in range(args.iters):
    with torch.cuda.stream(A):
        x = torch.full((n,), float(i + 1), device="cuda")
    B.wait_stream(A)
    with torch.cuda.stream(B):
        torch.cuda._sleep(args.cycles)
        y = x * 1.0  # reads x once B's sleep is over
    x.record_stream(B)  # the same call either way; --no-route keeps it from xseg
    addr = x.data_ptr()
    del x  # freed on A, its allocation stream
    with torch.cuda.stream(A):
        z = torch.empty((n,), device="cuda")
        z.fill_(-1.0)  # runs on A at once, while B still sleeps
    reused += z.data_ptr() == addr
    torch.cuda.synchronize()
    correct += bool((y == float(i + 1)).all().item())
    del y, z

label = f"{args.allocator} record_stream {'routed' if args.route else 'not routed'}"
print(f"[{label}] correct {correct}/{args.iters}, address reused {reused}/{args.iters}, "
      f"corrupted {args.iters - correct}")
if args.allocator == "xseg":
    st = xseg_torch.stats()
    print(f"[{label}] xseg num_syncs {st['num_syncs']} reserved peak {st['reserved_bytes.all.peak']}"
          f" last error {xseg_torch.last_error()}")
print("RACE " + json.dumps({"allocator": args.allocator, "route": args.route, "iters": args.iters,
                            "correct": correct, "reused": reused}))
expected = correct == args.iters if args.route else correct < args.iters
sys.exit(0 if expected else 1)
