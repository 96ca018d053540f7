"""The workloads of the trace corpus (bench/traces/README.md, "Corpus"): short
PyTorch programs of different kinds, each a function of a seed, to record
with xseg.record:

    python3 -m xseg.record -o generate_small.trace.gz -- workloads.py generate_small --seed 0

Models are built from configurations with random weights (no downloads);
inputs are random. Given the seed a workload makes the same allocations in
the same order (shapes, batch sizes and lengths come from
random.Random(seed); tensor values from torch.manual_seed(seed)), up to
the library versions, which choose kernels and their workspaces.

``--device cpu --small`` runs a tiny version of a workload on the CPU, to
check the program where there is no GPU; it records nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import time
from typing import Any, Callable, Dict

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

WORKLOADS: Dict[str, Callable[..., Dict[str, Any]]] = {}


def workload(fn: Callable[..., Dict[str, Any]]) -> Callable[..., Dict[str, Any]]:
    """Register fn(seed, device, small) under its name. record_all.py finds
    the names by reading this file (no torch there): keep the decorator
    written as @workload on a top-level def."""
    WORKLOADS[fn.__name__] = fn
    return fn


def seeded(seed: int) -> random.Random:
    torch.manual_seed(seed)
    return random.Random(seed)


def build(cls: Any, config: Any, dtype: torch.dtype, device: str) -> nn.Module:
    """A transformers model of config, made directly on device in dtype
    (random weights; no float32 copy first)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config)
    finally:
        torch.set_default_dtype(old)
    return model


def padded_mask(rng: random.Random, b: int, t: int, shortest: int) -> torch.Tensor:
    """An attention mask (on the CPU) for b rows of t tokens, each row
    padded on the right after a random length of shortest to t tokens."""
    mask = torch.ones(b, t, dtype=torch.long)
    for row in range(b):
        mask[row, rng.randint(shortest, t):] = 0
    return mask


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """Scaled dot-product attention (PyTorch's fused kernels where there are
    any; by hand on an old CPU-only torch, for --small)."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=causal)
    w = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        w = w.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return w.softmax(-1) @ v


# --- (a), (b): generation with a KV cache ----------------------------------


def generate_requests(model: nn.Module, vocab: int, rng: random.Random, device: str, requests: int,
                      batch: tuple, prompt: tuple, new: tuple) -> Dict[str, Any]:
    """Serve requests with model.generate: each has a random batch size, a
    padded prompt length (rows left-padded to random lengths between half of
    it and all of it) and a number of new tokens, decoded greedily to
    exactly that many (min_new_tokens: an end-of-sequence token does not
    stop it). The KV cache is transformers' default (DynamicCache, grown
    a step at a time)."""
    model.eval()
    shapes = []
    with torch.inference_mode():
        for _ in range(requests):
            b, p, n = rng.randint(*batch), rng.randint(*prompt), rng.randint(*new)
            ids = torch.randint(1, vocab, (b, p))
            mask = torch.ones(b, p, dtype=torch.long)
            for row in range(b):
                pad = p - rng.randint((p + 1) // 2, p)
                ids[row, :pad] = 0
                mask[row, :pad] = 0
            ids, mask = ids.to(device), mask.to(device)
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0, use_cache=True)
            assert tuple(out.shape) == (b, p + n), (tuple(out.shape), b, p, n)
            shapes.append((b, p, n))
            del ids, mask, out
    return {"requests": shapes, "tokens": sum(b * (p + n) for b, p, n in shapes)}


@workload
def generate_small(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """GPT-2 small (124M, fp16) serving 24 generate() requests: batch 1-64,
    prompt 32-896, 8-40 new tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    rng = seeded(seed)
    if small:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=128, vocab_size=1000)
        dtype, limits = torch.float32, dict(requests=3, batch=(1, 4), prompt=(4, 32), new=(2, 6))
    else:
        cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024)
        dtype, limits = torch.float16, dict(requests=24, batch=(1, 64), prompt=(32, 896), new=(8, 40))
    model = build(GPT2LMHeadModel, cfg, dtype, device)
    return generate_requests(model, cfg.vocab_size, rng, device, **limits)


@workload
def generate_large(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A 1.1B Llama (TinyLlama's shape: 22 layers, hidden 2048, GQA 32/8
    heads; bf16) serving 16 generate() requests: batch 1-32, prompt
    64-1536, 8-32 new tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = seeded(seed)
    if small:
        cfg = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
        dtype, limits = torch.float32, dict(requests=3, batch=(1, 4), prompt=(4, 32), new=(2, 6))
    else:
        cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                          num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048)
        dtype, limits = torch.bfloat16, dict(requests=16, batch=(1, 32), prompt=(64, 1536), new=(8, 32))
    model = build(LlamaForCausalLM, cfg, dtype, device)
    return generate_requests(model, cfg.vocab_size, rng, device, **limits)


# --- (c): encoder fine-tuning ----------------------------------------------


@workload
def encoder_finetune(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """BERT-base (110M, fp32/TF32) fine-tuned for sequence classification
    with AdamW: 40 steps of batch 32, each padded to its own random length
    (32-512) with rows of random lengths under it (dynamic padding)."""
    from transformers import BertConfig, BertForSequenceClassification

    rng = seeded(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    if small:
        cfg = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                         vocab_size=1000, max_position_embeddings=64, num_labels=4)
        steps, batch, lengths = 3, 4, (8, 64)
    else:
        cfg = BertConfig(num_labels=4)
        steps, batch, lengths = 40, 32, (32, 512)
    model = build(BertForSequenceClassification, cfg, torch.float32, device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    seen = []
    for _ in range(steps):
        length = rng.randint(*lengths)
        rows = [rng.randint(max(1, length // 4), length) for _ in range(batch)]
        rows[rng.randrange(batch)] = length  # the batch is padded to its longest row
        ids = torch.randint(1, cfg.vocab_size, (batch, length))
        mask = torch.zeros(batch, length, dtype=torch.long)
        for i, n in enumerate(rows):
            mask[i, :n] = 1
        ids = ids * mask
        labels = torch.randint(0, cfg.num_labels, (batch,))
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen.append(length)
        del out
    return {"lengths": seen}


# --- (d): a diffusion UNet -------------------------------------------------


def timestep_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    args = t.float()[:, None] * freqs[None]
    return torch.cat([args.cos(), args.sin()], dim=1)


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, tdim: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(32, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.temb = nn.Linear(tdim, cout)
        self.norm2 = nn.GroupNorm(32, cout)
        self.drop = nn.Dropout(0.1)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.temb(F.silu(temb))[:, :, None, None]
        h = self.conv2(self.drop(F.silu(self.norm2(h))))
        return h + self.skip(x)


class SelfAttention2d(nn.Module):
    def __init__(self, ch: int, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm = nn.GroupNorm(32, ch)
        self.qkv = nn.Conv2d(ch, 3 * ch, 1)
        self.proj = nn.Conv2d(ch, ch, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, self.heads, c // self.heads, h * w).unbind(1)
        o = attention(q.transpose(-2, -1), k.transpose(-2, -1), v.transpose(-2, -1), causal=False)
        return x + self.proj(o.transpose(-2, -1).reshape(b, c, h, w))


class UNet(nn.Module):
    """A DDPM-style UNet: levels of ResBlocks (channels chans[i] at 1/2^i of
    the input's size), self-attention at the levels in attn, skip
    connections concatenated on the way up, a sinusoidal timestep embedding
    added in every ResBlock."""

    def __init__(self, chans: tuple = (128, 256, 256, 512), attn: tuple = (2, 3), blocks: int = 2,
                 cin: int = 3) -> None:
        super().__init__()
        self.base = chans[0]
        tdim = 4 * chans[0]
        self.temb = nn.Sequential(nn.Linear(chans[0], tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(cin, chans[0], 3, padding=1)
        self.down = nn.ModuleList()
        skips, ch = [chans[0]], chans[0]
        for i, c in enumerate(chans):
            for _ in range(blocks):
                self.down.append(nn.ModuleList([ResBlock(ch, c, tdim),
                                                 SelfAttention2d(c) if i in attn else nn.Identity()]))
                ch = c
                skips.append(ch)
            if i < len(chans) - 1:
                self.down.append(nn.Conv2d(ch, ch, 3, stride=2, padding=1))
                skips.append(ch)
        self.mid = nn.ModuleList([ResBlock(ch, ch, tdim), SelfAttention2d(ch), ResBlock(ch, ch, tdim)])
        self.up = nn.ModuleList()
        for i, c in reversed(list(enumerate(chans))):
            for _ in range(blocks + 1):
                self.up.append(nn.ModuleList([ResBlock(ch + skips.pop(), c, tdim),
                                              SelfAttention2d(c) if i in attn else nn.Identity()]))
                ch = c
            if i > 0:
                self.up.append(nn.Conv2d(ch, ch, 3, padding=1))  # after a nearest-neighbour upsample
        self.out = nn.Sequential(nn.GroupNorm(32, ch), nn.SiLU(), nn.Conv2d(ch, cin, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        temb = self.temb(timestep_embedding(t, self.base))
        h = self.inp(x)
        hs = [h]
        for m in self.down:
            if isinstance(m, nn.ModuleList):
                h = m[1](m[0](h, temb))
            else:
                h = m(h)
            hs.append(h)
        h = self.mid[2](self.mid[1](self.mid[0](h, temb)), temb)
        for m in self.up:
            if isinstance(m, nn.ModuleList):
                h = m[1](m[0](torch.cat([h, hs.pop()], dim=1), temb))
            else:
                h = m(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(h)


@workload
def unet_diffusion(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A DDPM-style UNet (channels 128-256-256-512, attention at the two
    lowest levels, 74M parameters, fp32/TF32) trained on noise
    prediction with AdamW and an EMA copy of the weights: 20 steps of batch
    32, each of a random aspect-ratio bucket (48-80 pixels a side)."""
    rng = seeded(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if small:
        model = UNet(chans=(32, 64), attn=(1,), blocks=1).to(device)
        steps, batch, buckets = 3, 2, [(16, 16), (8, 24)]
    else:
        model = UNet().to(device)
        steps, batch = 20, 32
        buckets = [(64, 64), (48, 80), (80, 48), (56, 72), (72, 56)]
    ema = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    betas = torch.linspace(1e-4, 0.02, 1000, device=device)
    alphas_bar = torch.cumprod(1 - betas, dim=0)
    seen = []
    for _ in range(steps):
        h, w = rng.choice(buckets)
        x0 = torch.randn(batch, 3, h, w, device=device)
        t = torch.randint(0, 1000, (batch,), device=device)
        noise = torch.randn_like(x0)
        a = alphas_bar[t][:, None, None, None]
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        loss = F.mse_loss(model(xt, t), noise)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.lerp_(p, 1 - 0.999)
        seen.append((h, w))
        del x0, t, noise, a, xt, loss
    return {"buckets": seen, "parameters": sum(p.numel() for p in model.parameters())}


# --- (e): mixed precision with activation checkpointing --------------------


class Block(nn.Module):
    """A pre-norm GPT block."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(attention(q, k, v, causal=True).transpose(1, 2).reshape(b, n, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A GPT of Blocks, each checkpointed unless checkpointed is False."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, seq: int, checkpointed: bool = True) -> None:
        super().__init__()
        self.checkpointed = checkpointed
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        nn.init.normal_(self.tok.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.checkpointed else blk(x)
        return self.head(self.ln(x))


@workload
def amp_checkpoint(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A 335M-parameter GPT (24 layers, d 1024, fp32 weights) trained under
    bf16 autocast with every block checkpointed (torch.utils.checkpoint,
    non-reentrant) and AdamW: 12 steps of 2 micro-batches of 4 x 2048
    tokens (gradient accumulation)."""
    rng = seeded(seed)
    if small:
        vocab, d, layers, heads, seq, micro, batch, steps = 1000, 64, 2, 2, 32, 2, 2, 2
    else:
        vocab, d, layers, heads, seq, micro, batch, steps = 32000, 1024, 24, 16, 2048, 2, 4, 12
    model = GPT(vocab, d, layers, heads, seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    losses = []
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    for _ in range(steps):
        for _ in range(micro):
            ids = torch.randint(0, vocab, (batch, seq + 1), generator=gen).to(device)
            with torch.autocast(dev_type, dtype=torch.bfloat16):
                logits = model(ids[:, :-1])
                loss = F.cross_entropy(logits.reshape(-1, vocab).float(), ids[:, 1:].reshape(-1)) / micro
            loss.backward()
            losses.append(loss.item())
            del ids, logits, loss
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {"losses": losses[-2:], "parameters": sum(p.numel() for p in model.parameters())}


# --- (f): a two-stream input pipeline --------------------------------------


class PatchViT(nn.Module):
    """A ViT-S/16-like classifier (d 384, 12 layers, 6 heads)."""

    def __init__(self, d: int = 384, layers: int = 12, heads: int = 6, patch: int = 16, size: int = 224,
                 classes: int = 1000) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, d, patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.1, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


@workload
def two_stream_pipeline(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """Image classification (a ViT-S/16, fp32/TF32, AdamW) fed by a producer
    on a side stream: it copies a pinned uint8 batch (random size 32-128)
    to the GPU, random-crops, resizes to 224, flips and normalizes it while
    the default stream trains on the batch before; the consumer waits on
    the side stream and calls record_stream on what it takes. 40 steps."""
    rng = seeded(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cuda = device.startswith("cuda")
    if small:
        size, patch, sizes, steps, raw = 32, 8, (2, 4), 3, 40
        model = PatchViT(d=32, layers=2, heads=2, patch=patch, size=size, classes=10).to(device)
    else:
        size, sizes, steps, raw = 224, (32, 128), 40, 256
        model = PatchViT().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    side = torch.cuda.Stream() if cuda else None
    host = torch.randint(0, 256, (sizes[1], 3, raw, raw), dtype=torch.uint8)
    labels = torch.randint(0, 10, (sizes[1],))
    if cuda:
        host, labels = host.pin_memory(), labels.pin_memory()
    with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
        mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    def produce() -> tuple:
        b = rng.randint(*sizes)
        crop = rng.randint(raw // 2, raw)
        i, j = rng.randint(0, raw - crop), rng.randint(0, raw - crop)
        with torch.cuda.stream(side) if cuda else contextlib.nullcontext():
            x = host[:b].to(device, non_blocking=True)
            x = x[:, :, i:i + crop, j:j + crop].float()
            x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
            if rng.random() < 0.5:
                x = x.flip(3)
            x = (x - mean) / std
            y = labels[:b].to(device, non_blocking=True)
        return x, y, b

    seen = []
    nxt = produce()
    for _ in range(steps):
        if cuda:
            torch.cuda.current_stream().wait_stream(side)
        x, y, b = nxt
        if cuda:
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
        nxt = produce()  # overlaps the training step below
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        seen.append(b)
        del x, y, loss
    return {"batches": seen}


# --- (g): a long-lived growing buffer --------------------------------------


@workload
def growing_store(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A streaming indexer: each of 64 steps embeds 16k-96k new documents
    (an MLP in bf16), appends them to an fp16 embedding store grown by
    torch.cat (the old store freed after each copy; it ends near 3.7 GB)
    and keeps their raw features as one more chunk in a list (ending near
    1.8 GB); then scores 256-2048 queries against the whole store in blocks
    of 512k rows (top 16), and trains the query encoder one step (AdamW)
    against 8192 negatives sampled from the store."""
    rng = seeded(seed)
    if small:
        steps, docs, queries, fdim, edim, hidden, block, negatives = 4, (8, 32), (2, 8), 16, 8, 32, 24, 16
    else:
        steps, docs, queries, fdim, edim, hidden, block, negatives = (
            64, (16384, 98304), (256, 2048), 256, 512, 2048, 1 << 19, 8192)
    low = torch.bfloat16
    half = torch.float16 if device.startswith("cuda") else torch.float32  # old CPU torch lacks fp16 matmul
    doc_encoder = nn.Sequential(nn.Linear(fdim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                nn.Linear(hidden, edim)).to(device, low).eval()
    query_encoder = nn.Sequential(nn.Linear(edim, hidden), nn.GELU(), nn.Linear(hidden, edim)).to(device)
    opt = torch.optim.AdamW(query_encoder.parameters(), lr=1e-4)
    store = torch.empty(0, edim, device=device, dtype=half)
    chunks = []
    sizes = []
    for _ in range(steps):
        n = rng.randint(*docs)
        feats = torch.randn(n, fdim, device=device, dtype=half)
        with torch.no_grad():
            emb = F.normalize(doc_encoder(feats.to(low)).float(), dim=1).to(half)
        store = torch.cat([store, emb])  # a new store; the old one is freed
        chunks.append(feats)
        del emb
        q = F.normalize(torch.randn(rng.randint(*queries), edim, device=device), dim=1)
        with torch.no_grad():
            qe = query_encoder(q).to(half)
            vals, idx = [], []
            for s in range(0, store.shape[0], block):
                rows = store[s:s + block]
                top = (qe @ rows.T).topk(min(16, rows.shape[0]), dim=1)
                vals.append(top.values)
                idx.append(top.indices + s)
                del rows, top
            vals, pick = torch.cat(vals, 1).topk(min(16, store.shape[0]), dim=1)
            idx = torch.cat(idx, 1).gather(1, pick)
        pos = store[idx[:, 0]].float()
        neg = store[torch.randint(0, store.shape[0], (negatives,), device=device)].float()
        z = F.normalize(query_encoder(q), dim=1)
        logits = torch.cat([(z * pos).sum(1, keepdim=True), z @ neg.T], dim=1) / 0.07
        loss = F.cross_entropy(logits, torch.zeros(len(q), dtype=torch.long, device=device))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sizes.append(store.shape[0])
        del q, qe, vals, idx, pick, pos, neg, z, logits, loss
    return {"store_rows": sizes[-1], "store_bytes": store.numel() * store.element_size(),
            "chunk_bytes": sum(c.numel() * c.element_size() for c in chunks)}


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description="Run one workload of the trace corpus.")
    p.add_argument("name", choices=sorted(WORKLOADS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda")
    p.add_argument("--small", action="store_true", help="a tiny version (to check it runs, e.g. on the CPU)")
    ns = p.parse_args(argv)
    t0 = time.perf_counter()
    info = WORKLOADS[ns.name](ns.seed, device=ns.device, small=ns.small)
    if ns.device.startswith("cuda"):
        torch.cuda.synchronize()
        info["max_allocated"] = torch.cuda.max_memory_allocated()
        info["max_reserved"] = torch.cuda.max_memory_reserved()
    info["seconds"] = time.perf_counter() - t0
    print("WORKLOAD " + json.dumps({"name": ns.name, "seed": ns.seed, **info}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
