"""Pause and resume under a GPT-2 small (issue 18, must-show 1), on a GPU:

    python3 pause_gpt2.py [--tiny] [--batch 8] [--max-len 1024] [--dtype float32]

A GPT-2 small of random weights (fixed seed; plain PyTorch, no download:
12 layers, 768 wide, 12 heads, vocabulary 50257) has its weights allocated
in xseg.region("weights") and a static KV cache in xseg.region("kv").
Before the pause it generates greedily from a fixed prompt and captures a
CUDA graph of the prompt's forward pass (outside any region: the graph's
own pool). Then it pauses "weights" with a backup and "kv" without, reads
torch.cuda.mem_get_info, resumes, replays the graph at once and generates
again. It prints the figures and one line "RESULT {json}"; it exits 1 if
free memory rose by less than 95 % of the bytes paused, the graph's output
or the generated tokens differ, or an address moved.

python/tests/test_torch_gpu.py imports run() and TINY from here.
"""
import argparse
import json
import math
import os
import sys
import time

try:
    import xseg
except ImportError:
    sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import xseg

SMALL = dict(vocab=50257, ctx=1024, dim=768, layers=12, heads=12, batch=8, prompt=32, new_tokens=32,
             max_len=1024, dtype="float32")
TINY = dict(vocab=1000, ctx=128, dim=128, layers=2, heads=4, batch=2, prompt=16, new_tokens=16,
            max_len=128, dtype="float32")


def build(torch, cfg):
    """The model class for cfg (torch imported by the caller, after
    xseg.install())."""
    nn, F = torch.nn, torch.nn.functional
    d, h = cfg["dim"], cfg["heads"]
    hd = d // h

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x, kv, pos):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4)
            kv[0, :, :, pos:pos + t] = k
            kv[1, :, :, pos:pos + t] = v
            keys, vals = kv[0, :, :, :pos + t], kv[1, :, :, :pos + t]
            # A prompt starts at 0 (causal); a decode step sees every key.
            a = F.scaled_dot_product_attention(q, keys, vals, is_causal=t > 1)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg["vocab"], d), nn.Embedding(cfg["ctx"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln = nn.LayerNorm(d)
            for p in self.parameters():
                if p.dim() > 1:
                    nn.init.normal_(p, std=0.02)

        def forward(self, ids, cache, pos):
            t = ids.shape[1]
            x = self.wte(ids) + self.wpe(torch.arange(pos, pos + t, device=ids.device))
            for i, blk in enumerate(self.blocks):
                x = blk(x, cache[i], pos)
            return self.ln(x) @ self.wte.weight.t()

    return GPT


def generate(torch, model, cache, prompt, n):
    """Greedy tokens after prompt, n of them, with the static cache."""
    with torch.no_grad():
        logits = model(prompt, cache, 0)
        tok = logits[:, -1].argmax(-1, keepdim=True)
        out = [tok]
        for i in range(n - 1):
            tok = model(tok, cache, prompt.shape[1] + i)[:, -1].argmax(-1, keepdim=True)
            out.append(tok)
    return torch.cat(out, 1)


def addresses(model, cache):
    return [p.data_ptr() for p in model.parameters()] + [cache.data_ptr()]


def run(cfg):
    """The experiment; xseg must be installed and torch imported. Returns
    the figures (see the module's doc)."""
    import torch
    dtype = getattr(torch, cfg["dtype"])
    torch.manual_seed(0)
    GPT = build(torch, cfg)
    with xseg.region("weights"):
        model = GPT().to(device="cuda", dtype=dtype).eval()
    hd = cfg["dim"] // cfg["heads"]
    with xseg.region("kv"):
        cache = torch.zeros(cfg["layers"], 2, cfg["batch"], cfg["heads"], cfg["max_len"], hd,
                            device="cuda", dtype=dtype)
    gen = torch.Generator().manual_seed(1234)
    prompt = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["prompt"]), generator=gen).cuda()
    before = generate(torch, model, cache, prompt, cfg["new_tokens"])

    # A CUDA graph of the prompt's forward pass, captured before the pause.
    static_prompt = prompt.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s), torch.no_grad():
        for _ in range(2):
            model(static_prompt, cache, 0)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_logits = model(static_prompt, cache, 0)
    graph.replay()
    torch.cuda.synchronize()
    graph_before = static_logits.clone()
    addr_before = addresses(model, cache)

    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    t0 = time.perf_counter()
    xseg.pause("weights", backup=True)
    t1 = time.perf_counter()
    xseg.pause("kv")
    t2 = time.perf_counter()
    free1 = torch.cuda.mem_get_info()[0]
    st = xseg.tags()
    paused = st["weights"]["paused_bytes"] + st["kv"]["paused_bytes"]
    t3 = time.perf_counter()
    xseg.resume()
    t4 = time.perf_counter()
    graph.replay()  # right after resume: the same addresses are mapped again
    torch.cuda.synchronize()
    graph_same = bool(torch.equal(static_logits, graph_before))
    after = generate(torch, model, cache, prompt, cfg["new_tokens"])
    torch.cuda.synchronize()
    after_st = xseg.tags()
    r = dict(
        weights_bytes=st["weights"]["paused_bytes"], kv_bytes=st["kv"]["paused_bytes"],
        backup_bytes=st["weights"]["backup_bytes"], paused_bytes=paused, free_rise=free1 - free0,
        free_rise_ratio=(free1 - free0) / paused if paused else math.nan,
        pause_weights_ms=(t1 - t0) * 1e3, pause_kv_ms=(t2 - t1) * 1e3, resume_ms=(t4 - t3) * 1e3,
        tokens_same=bool(torch.equal(before, after)), graph_same=graph_same,
        addresses_same=addresses(model, cache) == addr_before,
        remaps={n: s["remaps"] for n, s in after_st.items()},
        live=not any(s["paused"] for s in after_st.values()),
        tokens=before[0, :8].tolist())
    r["ok"] = bool(r["free_rise_ratio"] >= 0.95 and r["tokens_same"] and r["graph_same"] and r["addresses_same"]
                   and r["live"])
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny", action="store_true", help="a tiny model instead of GPT-2 small")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--max-len", type=int)
    ap.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    args = ap.parse_args()
    cfg = dict(TINY if args.tiny else SMALL)
    for k in ("batch", "max_len", "dtype"):
        if getattr(args, k) is not None:
            cfg[k] = getattr(args, k)
    xseg.install()
    import torch
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, xseg {xseg.version()}, config {cfg}")
    r = run(cfg)
    mib = float(1 << 20)
    print(f"paused: weights {r['weights_bytes'] / mib:.1f} MiB (backup {r['backup_bytes'] / mib:.1f} MiB), "
          f"kv {r['kv_bytes'] / mib:.1f} MiB")
    print(f"mem_get_info free rose by {r['free_rise'] / mib:.1f} MiB = {100 * r['free_rise_ratio']:.1f} % "
          "of the bytes paused (need >= 95 %)")
    print(f"pause weights (backup) {r['pause_weights_ms']:.1f} ms, pause kv {r['pause_kv_ms']:.1f} ms, "
          f"resume both {r['resume_ms']:.1f} ms")
    print(f"graph captured before the pause, replayed after resume: {'same' if r['graph_same'] else 'DIFFERENT'}")
    print(f"greedy tokens after resume: {'same' if r['tokens_same'] else 'DIFFERENT'} (first: {r['tokens']})")
    print(f"addresses kept: {r['addresses_same']}; remaps {r['remaps']}")
    print("RESULT " + json.dumps(r))
    sys.exit(0 if r["ok"] else 1)


if __name__ == "__main__":
    main()
