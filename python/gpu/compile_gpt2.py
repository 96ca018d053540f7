"""torch.compile(mode="reduce-overhead") on GPT-2 small (random weights,
dropout off), under xseg or PyTorch's own allocator (issue 13).

    python3 compile_gpt2.py xseg|native infer|train|tree

infer: batch 8 x 256 tokens, logits of the compiled model against eager;
train: 12 steps of AdamW on batch 8 x 256, losses of the compiled model
against an eager copy from the same weights; tree: a graph tree over three
prompt lengths that makes PyTorch checkpoint the pool. Prints
"COMPILE <allocator> <mode> ok|FAIL maxdiff=... median_ms=... peak_reserved_mib=..."
with the median of the steady-state step time (CUDA events), and exits 1 on
a mismatch.
"""
import copy
import os
import sys

which, mode = sys.argv[1], sys.argv[2]
if which == "xseg":
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import xseg_torch
    xseg_torch.install()
import torch
from torch_setup import median_ms
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
cfg = GPT2Config(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
model = GPT2LMHeadModel(cfg).cuda()
ids = torch.randint(0, cfg.vocab_size, (8, 256), device="cuda")


def peak_reserved():
    if which == "xseg":
        return xseg_torch.max_memory_reserved()
    return torch.cuda.max_memory_reserved()


if mode == "infer":
    model.eval()
    with torch.no_grad():
        ref = model(ids).logits.float()
        cm = torch.compile(model, mode="reduce-overhead")
        outs = []
        for _ in range(5):
            torch.compiler.cudagraph_mark_step_begin()
            outs.append(cm(ids).logits.float().clone())

        def step():
            torch.compiler.cudagraph_mark_step_begin()
            cm(ids)
        med = median_ms(torch, step, int(os.environ.get("STEPS", "50")))
    diff = max(float((o - ref).abs().max()) for o in outs)
    ok = diff < 1e-2 * max(1.0, float(ref.abs().max()))
elif mode == "tree":
    # A graph tree that must checkpoint: graphs for two prompt lengths
    # recorded as parent and child, replayed, then a third length appears
    # while the first one's outputs are live (warm-up in the execution
    # state: PyTorch puts the pool back to its checkpoint).
    model.eval()
    lens = {"a": 256, "b": 128, "c": 64}
    inputs = {k: ids[:, :n].contiguous() for k, n in lens.items()}
    with torch.no_grad():
        refs = {k: model(v).logits.float() for k, v in inputs.items()}
        cm = torch.compile(model, mode="reduce-overhead")
        diff = 0.0
        for second in "bbbbcccc":
            torch.compiler.cudagraph_mark_step_begin()
            oa = cm(inputs["a"]).logits
            o2 = cm(inputs[second]).logits
            diff = max(diff, float((oa.float() - refs["a"]).abs().max()), float((o2.float() - refs[second]).abs().max()))

        def step():
            torch.compiler.cudagraph_mark_step_begin()
            cm(inputs["a"])
            cm(inputs["c"])
        med = median_ms(torch, step, 30)
    ok = diff < 1e-2 * max(1.0, float(refs["a"].abs().max()))
else:
    eager = copy.deepcopy(model)
    model.train()
    eager.train()
    cm = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    eopt = torch.optim.AdamW(eager.parameters(), lr=1e-4)

    def train_step(m, o):
        torch.compiler.cudagraph_mark_step_begin()
        loss = m(ids, labels=ids).loss
        loss.backward()
        o.step()
        o.zero_grad(set_to_none=True)
        return loss.detach().clone()

    losses, elosses = [], []
    for _ in range(12):
        losses.append(float(train_step(cm, opt)))
        elosses.append(float(train_step(eager, eopt)))
    med = median_ms(torch, lambda: train_step(cm, opt), 20)
    diff = max(abs(a - b) / abs(b) for a, b in zip(losses, elosses))
    ok = diff < 1e-3 and losses[-1] < losses[0]
    print(f"losses compiled {losses[0]:.4f} -> {losses[-1]:.4f}, eager {elosses[0]:.4f} -> {elosses[-1]:.4f}")
if which == "xseg":
    print("graph-tree calls routed to xseg:", xseg_torch.graph_tree_calls())
print(f"COMPILE {which} {mode} {'ok' if ok else 'FAIL'} maxdiff={diff:.3g} median_ms={med:.3f} "
      f"peak_reserved_mib={peak_reserved() / 2**20:.0f}", flush=True)
sys.exit(0 if ok else 1)
