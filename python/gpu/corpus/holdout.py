"""Held-out workloads: programs of kinds the corpus (workloads.py) does not
have, recorded to check that the default policy holds on workloads it was
not tuned on (bench/RESULTS.md round 33). They are not in bench/traces and
no test or default looks at them.

    python3 -m xseg.record -o seq2seq_beam.trace.gz -- holdout.py seq2seq_beam --seed 0
    python3 record_all.py --workloads holdout.py --out DIR

Same conventions as workloads.py: models built from configurations with
random weights, inputs random, shapes from random.Random(seed);
``--device cpu --small`` runs a tiny version to check the program.
"""

from __future__ import annotations

import sys
from typing import Any, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F

# workload registers in workloads.py's table, which main runs from;
# record_all.py finds this file's workloads by that decorator's name.
from workloads import build, main, seeded, workload


@workload
def seq2seq_beam(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A T5 encoder-decoder (T5-base's shape: 12+12 layers, d 768; bf16)
    translating 16 requests with beam search (2-4 beams, which reorders the
    KV cache every step): batch 1-24, source 16-512 tokens, 8-48 new."""
    from transformers import T5Config, T5ForConditionalGeneration

    rng = seeded(seed)
    if small:
        cfg = T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=1000)
        dtype, requests, batch, source, new = torch.float32, 3, (1, 3), (4, 24), (2, 6)
    else:
        cfg = T5Config(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12, vocab_size=32128)
        dtype, requests, batch, source, new = torch.bfloat16, 16, (1, 24), (16, 512), (8, 48)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = 0, 0, 1
    model = build(T5ForConditionalGeneration, cfg, dtype, device).eval()
    shapes = []
    with torch.inference_mode():
        for _ in range(requests):
            b, s, n, beams = rng.randint(*batch), rng.randint(*source), rng.randint(*new), rng.randint(2, 4)
            ids = torch.randint(2, cfg.vocab_size, (b, s))
            mask = torch.ones(b, s, dtype=torch.long)
            for row in range(b):
                keep = rng.randint((s + 1) // 2, s)
                ids[row, keep:], mask[row, keep:] = 0, 0
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), num_beams=beams,
                                 max_new_tokens=n, min_new_tokens=n, do_sample=False, early_stopping=False)
            shapes.append((b, s, n, beams))
            del ids, mask, out
    return {"requests": shapes}


@workload
def qwen_sampling(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A 0.5B Qwen2 decoder (24 layers, hidden 896, GQA 14/2 heads, tied
    embeddings of 151,936 tokens; fp16) serving 20 sampled requests
    (top-k 50, temperature 0.8): batch 1-48, prompt 16-1024, 4-64 new
    tokens, rows left-padded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    rng = seeded(seed)
    if small:
        cfg = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
        dtype, requests, batch, prompt, new = torch.float32, 3, (1, 3), (4, 24), (2, 6)
    else:
        cfg = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                          num_key_value_heads=2, vocab_size=151936, max_position_embeddings=2048,
                          tie_word_embeddings=True)
        dtype, requests, batch, prompt, new = torch.float16, 20, (1, 48), (16, 1024), (4, 64)
    model = build(Qwen2ForCausalLM, cfg, dtype, device).eval()
    gen_seed = rng.randrange(1 << 31)
    shapes = []
    with torch.inference_mode():
        for i in range(requests):
            b, p, n = rng.randint(*batch), rng.randint(*prompt), rng.randint(*new)
            ids = torch.randint(1, cfg.vocab_size, (b, p))
            mask = torch.ones(b, p, dtype=torch.long)
            for row in range(b):
                pad = p - rng.randint((p + 1) // 2, p)
                ids[row, :pad], mask[row, :pad] = 0, 0
            torch.manual_seed(gen_seed + i)
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=n,
                                 min_new_tokens=n, do_sample=True, top_k=50, temperature=0.8, pad_token_id=0)
            assert tuple(out.shape) == (b, p + n), (tuple(out.shape), b, p, n)
            shapes.append((b, p, n))
            del ids, mask, out
    return {"requests": shapes}


class Bottleneck(nn.Module):
    """A ResNet bottleneck block (1x1, 3x3, 1x1 convolutions)."""

    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        cout = 4 * mid
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.skip = None
        if stride != 1 or cin != cout:
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.body(x) + (x if self.skip is None else self.skip(x)))


def resnet(depths: tuple, width: int, classes: int = 1000) -> nn.Module:
    layers = [nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, stride=2, padding=1)]
    cin = width
    for i, n in enumerate(depths):
        mid = width * 2 ** i
        for j in range(n):
            layers.append(Bottleneck(cin, mid, 2 if j == 0 and i > 0 else 1))
            cin = 4 * mid
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


@workload
def cnn_infer(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A ResNet-50 (fp16, channels-last, eval mode) classifying 40 batches
    of random size (1-192) and resolution (128-384 pixels, multiples of
    32): convolution workspaces and activations that change size with
    every batch."""
    rng = seeded(seed)
    if small:
        model, batches, batch, res = resnet((1, 1, 1, 1), 8, 10), 3, (1, 4), (2, 3)
    else:
        model, batches, batch, res = resnet((3, 4, 6, 3), 64), 40, (1, 192), (4, 12)
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    model = model.to(device=device, dtype=dtype, memory_format=torch.channels_last).eval()
    seen = []
    with torch.inference_mode():
        for _ in range(batches):
            b, r = rng.randint(*batch), 32 * rng.randint(*res)
            x = torch.randn(b, 3, r, r, dtype=dtype).to(device, memory_format=torch.channels_last)
            top = model(x).argmax(1)
            seen.append((b, r))
            del x, top
    return {"batches": seen}


class MoE(nn.Module):
    """A mixture-of-experts feed-forward layer: top-2 routing over e experts,
    each expert run on the tokens routed to it (gathered, then scattered
    back), so that every expert's activations change size every step."""

    def __init__(self, d: int, hidden: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(d, experts, bias=False)
        self.w1 = nn.ModuleList(nn.Linear(d, hidden) for _ in range(experts))
        self.w2 = nn.ModuleList(nn.Linear(hidden, d) for _ in range(experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(2, dim=-1)
        out = torch.zeros_like(flat)
        for e in range(len(self.w1)):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel() == 0:
                continue
            h = self.w2[e](F.gelu(self.w1[e](flat[rows])))
            out = out.index_add(0, rows, (h * weights[rows, slot, None].to(h.dtype)).to(out.dtype))
        return out.reshape(x.shape)


class MoEBlock(nn.Module):
    def __init__(self, d: int, heads: int, experts: int) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.moe = MoE(d, 2 * d, experts)

    def forward(self, x: torch.Tensor, causal: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.moe(self.n2(x))


@workload
def moe_train(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A mixture-of-experts language model (8 layers, d 768, 8 experts of
    hidden 1536, top-2 routing) trained under bf16 autocast with AdamW for
    24 steps of a random batch (4-16) of random length (128-1024): the
    experts' token counts, and so their activations, differ every step."""
    rng = seeded(seed)
    if small:
        vocab, d, layers, heads, experts, steps, batch, length = 1000, 32, 2, 2, 4, 3, (1, 3), (8, 32)
    else:
        vocab, d, layers, heads, experts, steps, batch, length = 32000, 768, 8, 12, 8, 24, (4, 16), (128, 1024)
    emb = nn.Embedding(vocab, d).to(device)
    blocks = nn.ModuleList(MoEBlock(d, heads, experts) for _ in range(layers)).to(device)
    head = nn.Linear(d, vocab, bias=False).to(device)
    params = [*emb.parameters(), *blocks.parameters(), *head.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    losses = []
    for _ in range(steps):
        b, t = rng.randint(*batch), rng.randint(*length)
        ids = torch.randint(0, vocab, (b, t + 1), generator=gen).to(device)
        causal = torch.triu(torch.full((t, t), float("-inf"), device=device), 1)
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            x = emb(ids[:, :-1])
            for blk in blocks:
                x = blk(x, causal)
            loss = F.cross_entropy(head(x).reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del ids, causal, x, loss
    return {"losses": losses[-2:]}


if __name__ == "__main__":
    sys.exit(main())
