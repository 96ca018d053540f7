"""One rank of PyTorch DDP training of GPT-2 small (the model of
the gpt2_train trace in bench/traces: random weights, fixed seed, batch 8 x 1024 per rank,
AdamW) over NCCL, under PyTorch's allocator or xseg. Run it with torchrun:

    torchrun --standalone --nproc_per_node 2 ddp_gpt2.py native|xseg [--steps 10] [--lib PATH]

Each rank uses the GPU of its LOCAL_RANK. With xseg, xseg_torch.install()
runs in every rank before CUDA starts, so the model, the gradients, DDP's
buckets and the all-reduce inputs are xseg memory. After training, an
explicit all-reduce (SUM) of a 256 MiB tensor holding rank+1 checks the
result on every element and that the tensor is a block of xseg's snapshot.
Rank 0 prints each step's loss (the mean over ranks) and step time (the
slowest rank's), then "RESULT {json}"."""
import argparse
import json
import os
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["native", "xseg"])
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--lib", default=None)
args = ap.parse_args()

# Multicast stays off on these machines (see KINDS.md); keep what is set.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
if args.mode == "xseg":
    import xseg_torch  # noqa: E402
    xseg_torch.install(args.lib)
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl", device_id=dev)
rank, world = dist.get_rank(), dist.get_world_size()


def say(*a):
    if rank == 0:
        print(f"[{args.mode}]", *a, flush=True)


say("env NCCL_NVLS_ENABLE", os.environ.get("NCCL_NVLS_ENABLE"),
    "TORCH_SYMM_MEM_DISABLE_MULTICAST", os.environ.get("TORCH_SYMM_MEM_DISABLE_MULTICAST"),
    "world", world, "torch", torch.__version__, "nccl", torch.cuda.nccl.version())
torch.manual_seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
model = DDP(GPT2LMHeadModel(cfg).to(dev), device_ids=[local])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
gen = torch.Generator().manual_seed(1234 + rank)
batch, seq = 8, 1024
losses, times = [], []
for step in range(1, args.steps + 1):
    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).to(dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = torch.tensor([time.perf_counter() - t0], device=dev, dtype=torch.float64)
    mean = loss.detach().to(torch.float64).reshape(1)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    dist.all_reduce(mean)
    losses.append(mean.item() / world)
    times.append(dt.item())
    say(f"step {step:2d} loss {losses[-1]:.6f} step_ms {times[-1] * 1e3:.2f}")
    del x, loss

# The explicit all-reduce: 64 Mi float32 (256 MiB) of rank+1 each.
n = 64 << 20
t = torch.full((n,), float(rank + 1), device=dev)
in_xseg = None
if args.mode == "xseg":
    blocks = [b for s in xseg_torch.snapshot(local)["segments"] for b in s.get("blocks") or []]
    in_xseg = any(b["ptr"] == t.data_ptr() and b["state"] == "allocated" for b in blocks)
dist.all_reduce(t)
want = float(world * (world + 1) // 2)
ok = bool(torch.all(t == want).item())
flags = torch.tensor([int(ok), int(in_xseg is not False)], device=dev)
dist.all_reduce(flags, op=dist.ReduceOp.MIN)
ok, in_xseg_all = bool(flags[0].item()), bool(flags[1].item())
say(f"all-reduce of {n} float32 (rank+1): every element {want} on every rank: {ok}"
    + ("" if in_xseg is None else f"; the tensor is an xseg block on every rank: {in_xseg_all}"))

extra = {}
if args.mode == "xseg":
    st = xseg_torch.stats(local)
    extra = {k: st[k] for k in ("reserved_bytes.all.peak", "allocated_bytes.all.peak", "num_maps",
                                "num_set_access_calls", "num_pages_created", "num_ooms")}
else:
    extra = {"reserved_bytes.all.peak": torch.cuda.max_memory_reserved(dev),
             "allocated_bytes.all.peak": torch.cuda.max_memory_allocated(dev)}
median = statistics.median(times[2:]) if len(times) > 2 else statistics.median(times)
if rank == 0:
    print("RESULT " + json.dumps({"mode": args.mode, "world": world, "losses": losses, "step_s": times,
                                  "median_step_s": median, "allreduce_ok": ok,
                                  "allreduce_in_xseg": in_xseg_all if args.mode == "xseg" else None,
                                  **extra}), flush=True)
dist.destroy_process_group()
sys.exit(0 if ok and in_xseg_all else 1)
