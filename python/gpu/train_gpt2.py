"""GPT-2 small training (the model of the gpt2_train trace in bench/traces: random weights,
fixed seed, batch 8 x 1024, AdamW) for a few steps under one allocator, in
its own process:

    python3 train_gpt2.py native|expandable|xseg [--steps 10] [--lib PATH]

Prints each step's loss and tokens/s, then one line "RESULT {json}" with the
losses, tokens/s, their median over steps 3..N and the peak reserved bytes
(xseg's from its own stats); under xseg also "first_steps": for each of the
first 4 steps, the ms the allocator spent in page work and in waits, and
the pages it created, mapped and its waits. compare_gpt2.py runs all three modes."""
import argparse
import json
import statistics
import time

from torch_setup import choose_allocator

ap = argparse.ArgumentParser()
ap.add_argument("mode", choices=["native", "expandable", "xseg"])
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--lib", default=None)
args = ap.parse_args()

choose_allocator(args.mode)  # before torch is imported
import torch  # noqa: E402
if args.mode == "xseg":
    import xseg_torch  # noqa: E402
    xseg_torch.install(args.lib)
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

torch.manual_seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
model = GPT2LMHeadModel(cfg).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
gen = torch.Generator().manual_seed(1234)
batch, seq = 8, 1024
losses, rates = [], []
per_step, last = [], {}  # xseg: the allocator's work in each of the first steps
for step in range(1, args.steps + 1):
    x = torch.randint(0, cfg.vocab_size, (batch, seq), generator=gen).cuda()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    losses.append(loss.item())
    rates.append(batch * seq / dt)
    if args.mode == "xseg" and step <= 4:
        # The allocator's own work in each of the first steps, outside the
        # timed region: its page work and waits, in ms, and their counts.
        st = xseg_torch.stats()
        now = {k: st.get(k, 0) for k in ("page_ns", "sync_ns", "num_pages_created", "num_maps", "num_syncs")}
        per_step.append({k: (now[k] - last.get(k, 0)) / (1e6 if k.endswith("_ns") else 1) for k in now})
        last = now
    print(f"[{args.mode}] step {step:2d} loss {losses[-1]:.6f} tokens/s {rates[-1]:.0f}", flush=True)
    del x, loss

if args.mode == "xseg":
    st = xseg_torch.stats()
    peak_reserved, peak_allocated = st["reserved_bytes.all.peak"], st["allocated_bytes.all.peak"]
    extra = {k: st.get(k) for k in ("num_alloc_retries", "num_ooms", "num_maps", "num_unmaps",
                                "num_set_access_calls", "num_pages_created", "num_pages_reused", "num_pages_retired", "num_syncs",
                                "page_ns", "sync_ns")}
    extra["first_steps"] = per_step
else:
    peak_reserved, peak_allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    st = torch.cuda.memory_stats()
    extra = {k: st.get(k) for k in ("num_alloc_retries", "num_ooms")}
extra["num_allocs"] = st.get("allocation.all.allocated")
median = statistics.median(rates[2:]) if len(rates) > 2 else statistics.median(rates)
print("RESULT " + json.dumps({"mode": args.mode, "losses": losses, "tokens_per_s": rates,
                              "median_tokens_per_s": median, "peak_reserved": peak_reserved,
                              "peak_allocated": peak_allocated, **extra}), flush=True)
