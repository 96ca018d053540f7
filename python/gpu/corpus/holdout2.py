"""A second set of held-out workloads (bench/holdout, RESULTS round 35):
kinds neither the corpus (workloads.py) nor the first held-out set
(holdout.py) has, recorded to check the default policy on programs it was
not tuned on. No test or default looks at their traces.

    python3 -m xseg.record -o lora_finetune.trace.gz -- holdout2.py lora_finetune --seed 0
    python3 record_all.py --workloads holdout2.py --out DIR

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
from workloads import UNet, build, main, padded_mask, seeded, workload


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update (fp32
    adapters over bf16 weights), as parameter-efficient fine-tuning does."""

    def __init__(self, base: nn.Linear, rank: int) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features, device=base.weight.device) * 0.01)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank, device=base.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base(x) + F.linear(F.linear(x.float(), self.a), self.b).to(x.dtype)


@workload
def lora_finetune(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """LoRA fine-tuning of a Llama-shaped decoder (16 layers, hidden 1536,
    24/8 heads; bf16, frozen) with rank-16 adapters on the query, value
    and MLP projections (fp32, AdamW): 30 steps of a random batch (1-12)
    of rows padded to a random length (64-1024)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = seeded(seed)
    if small:
        cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, vocab_size=1000, max_position_embeddings=128)
        dtype, steps, batch, length, rank = torch.float32, 3, (1, 3), (8, 32), 4
    else:
        cfg = LlamaConfig(hidden_size=1536, intermediate_size=4096, num_hidden_layers=16, num_attention_heads=24,
                          num_key_value_heads=8, vocab_size=32000, max_position_embeddings=1024)
        dtype, steps, batch, length, rank = torch.bfloat16, 30, (1, 12), (64, 1024), 16
    model = build(LlamaForCausalLM, cfg, dtype, device)
    model.requires_grad_(False)
    for layer in model.model.layers:
        layer.self_attn.q_proj = LoRALinear(layer.self_attn.q_proj, rank)
        layer.self_attn.v_proj = LoRALinear(layer.self_attn.v_proj, rank)
        layer.mlp.down_proj = LoRALinear(layer.mlp.down_proj, rank)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    losses, shapes = [], []
    for _ in range(steps):
        b, t = rng.randint(*batch), rng.randint(*length)
        ids = torch.randint(0, cfg.vocab_size, (b, t), generator=gen)
        mask = padded_mask(rng, b, t, t // 4 + 1)
        labels = ids.masked_fill(mask == 0, -100)
        out = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        shapes.append((b, t))
        del ids, mask, labels, out
    return {"losses": losses[-2:], "shapes": shapes, "trainable": sum(p.numel() for p in params)}


def ddim_request(model: nn.Module, alphas_bar: torch.Tensor, b: int, h: int, w: int, n: int,
                 device: str) -> None:
    """One sampling request: b images of h x w from noise in n DDIM steps,
    each running the model on the batch doubled (classifier-free guidance,
    scale 3). The caller holds inference mode and autocast."""
    x = torch.randn(b, 3, h, w, device=device)
    ts = torch.linspace(999, 0, n, device=device).long()
    for i, t in enumerate(ts):
        eps_both = model(torch.cat([x, x]), t.repeat(2 * b))
        eps_u, eps_c = eps_both.chunk(2)
        eps = (eps_u + 3.0 * (eps_c - eps_u)).float()
        a = alphas_bar[t]
        a_prev = alphas_bar[ts[i + 1]] if i + 1 < len(ts) else torch.ones((), device=device)
        x0 = (x - (1 - a).sqrt() * eps) / a.sqrt()
        x = a_prev.sqrt() * x0 + (1 - a_prev).sqrt() * eps
        del eps_both, eps_u, eps_c, eps, x0
    del x, ts


@workload
def diffusion_sampling(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """Sampling from a DDPM-style UNet (workloads.py's, channels
    128-256-256-512; fp16 autocast) with DDIM and classifier-free guidance (the
    batch doubled for the unconditioned half): 10 requests of a random
    batch (1-24), a random resolution bucket (32-96 pixels a side) and
    10-30 denoising steps, in inference mode."""
    rng = seeded(seed)
    if small:
        model = UNet(chans=(32, 64), attn=(1,), blocks=1).to(device).eval()
        requests, batch, buckets, steps = 2, (1, 2), [(16, 16), (8, 24)], (2, 3)
    else:
        model = UNet().to(device).eval()
        requests, batch, steps = 10, (1, 24), (10, 30)
        buckets = [(32, 32), (64, 64), (96, 96), (48, 80), (80, 48), (64, 96)]
    betas = torch.linspace(1e-4, 0.02, 1000, device=device)
    alphas_bar = torch.cumprod(1 - betas, dim=0)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    half = torch.float16 if dev_type == "cuda" else torch.bfloat16
    seen = []
    with torch.inference_mode(), torch.autocast(dev_type, dtype=half):
        for _ in range(requests):
            b, (h, w), n = rng.randint(*batch), rng.choice(buckets), rng.randint(*steps)
            ddim_request(model, alphas_bar, b, h, w, n, device)
            seen.append((b, h, w, n))
    return {"requests": seen}


class GraphConv(nn.Module):
    """Mean aggregation over in-edges (index_add), then a linear layer."""

    def __init__(self, din: int, dout: int) -> None:
        super().__init__()
        self.lin = nn.Linear(2 * din, dout)

    def forward(self, x: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, deg: torch.Tensor) -> torch.Tensor:
        agg = torch.zeros_like(x).index_add_(0, dst, x[src]) / deg[:, None]
        return self.lin(torch.cat([x, agg], dim=1))


@workload
def gnn_varsize(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A 4-layer graph network (features 256, mean aggregation by
    index_add) trained with Adam for 40 steps, each on a new random graph
    of 2k-200k nodes and 4-16 edges a node: gathers and scatters whose
    sizes differ every step."""
    rng = seeded(seed)
    if small:
        d, layers, steps, nodes, fanout = 16, 2, 3, (10, 40), (2, 4)
    else:
        d, layers, steps, nodes, fanout = 256, 4, 40, (2000, 200000), (4, 16)
    convs = nn.ModuleList(GraphConv(d, d) for _ in range(layers)).to(device)
    head = nn.Linear(d, 16).to(device)
    opt = torch.optim.Adam([*convs.parameters(), *head.parameters()], lr=1e-3)
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    seen, losses = [], []
    for _ in range(steps):
        n, k = rng.randint(*nodes), rng.randint(*fanout)
        x = torch.randn(n, d, generator=gen).to(device)
        src = torch.randint(0, n, (n * k,), generator=gen).to(device)
        dst = torch.randint(0, n, (n * k,), generator=gen).to(device)
        y = torch.randint(0, 16, (n,), generator=gen).to(device)
        deg = torch.bincount(dst, minlength=n).clamp(min=1).float()
        h = x
        for conv in convs:
            h = F.relu(conv(h, src, dst, deg))
        loss = F.cross_entropy(head(h), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        seen.append((n, k))
        del x, src, dst, y, deg, h, loss
    return {"graphs": seen, "losses": losses[-2:]}


if __name__ == "__main__":
    sys.exit(main())
