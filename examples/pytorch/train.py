"""Train a small MLP on random data with xseg as PyTorch's CUDA allocator.

    go build -buildmode=c-shared -o libxseg.so ./cmd/libxseg   # from the repository root
    XSEG_LIB=$PWD/libxseg.so python3 examples/pytorch/train.py --steps 200

It installs xseg before the first CUDA allocation, trains with a batch size
that changes every step (the case expandable segments are for), and prints
PyTorch's loss and xseg's statistics. It exits non-zero if the loss did not
fall or xseg handed out no memory.
"""

import argparse
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import xseg_torch  # noqa: E402

xseg_torch.install()  # before torch allocates anything; XSEG_CONF tunes it

import torch  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--width", type=int, default=2048)
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(512, args.width), torch.nn.GELU(),
        torch.nn.Linear(args.width, args.width), torch.nn.GELU(),
        torch.nn.Linear(args.width, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    target = torch.nn.Linear(512, 10).to(dev)  # the function to learn

    first = last = None
    for step in range(args.steps):
        batch = 256 + 64 * (step % 13)  # a new shape most steps
        x = torch.randn(batch, 512, device=dev)
        with torch.no_grad():
            y = target(x).argmax(dim=1)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step == 0:
            first = loss.item()
        last = loss.item()
    torch.cuda.synchronize()

    st = xseg_torch.stats()
    print(f"xseg {xseg_torch.version()}: loss {first:.3f} -> {last:.3f} in {args.steps} steps")
    print("peak allocated {:.1f} MiB, peak reserved {:.1f} MiB, maps {}, retries {}, ooms {}".format(
        st["allocated_bytes.all.peak"] / 2**20, st["reserved_bytes.all.peak"] / 2**20,
        st.get("num_maps", 0), st["num_alloc_retries"], st["num_ooms"]))
    # install() routes torch.cuda.memory_allocated() and memory_stats() to
    # xseg too; this reads xseg's own statistics, which have num_maps.
    if not last < first or st["allocated_bytes.all.peak"] <= 0:
        print("FAIL: the loss did not fall or xseg served nothing", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
