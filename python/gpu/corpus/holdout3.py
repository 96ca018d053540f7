"""A third set of held-out workloads (bench/holdout, RESULTS round 36):
kinds that neither the corpus (workloads.py) nor the first two held-out
sets (holdout.py, holdout2.py) have, recorded to check the default policy
on programs it was not tuned on. No test or default looks at their traces.

    python3 -m xseg.record -o vit_varres_train.trace.gz -- holdout3.py vit_varres_train --seed 0
    python3 record_all.py --workloads holdout3.py --out DIR

Same conventions as workloads.py: models built from configurations with
random weights, inputs random, shapes from random.Random(seed);
``--device cpu --small`` runs a tiny version to check the program.
"""

from __future__ import annotations

import sys
from typing import Any, Dict

import torch

# workload registers in workloads.py's table, which main runs from;
# record_all.py finds this file's workloads by that decorator's name.
from workloads import build, main, padded_mask, seeded, workload


def autocast_for(device: str) -> Any:
    """bf16 autocast on the device's type."""
    return torch.autocast("cuda" if device.startswith("cuda") else "cpu", dtype=torch.bfloat16)


@workload
def vit_varres_train(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A ViT-Base classifier (12 layers, hidden 768, patches of 16; fp32
    weights, bf16 autocast, AdamW) trained for 24 steps on a random batch
    (8-96) of images at a random resolution (160-320 pixels a side, the
    position embeddings interpolated), so the token count changes every
    step."""
    from transformers import ViTConfig, ViTForImageClassification

    rng = seeded(seed)
    if small:
        cfg = ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                        image_size=32, patch_size=8, num_labels=10)
        steps, batch, sides = 3, (1, 4), [16, 24, 32, 40]
    else:
        cfg = ViTConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                        image_size=224, patch_size=16, num_labels=1000)
        steps, batch, sides = 24, (8, 96), [160, 192, 224, 256, 288, 320]
    model = build(ViTForImageClassification, cfg, torch.float32, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    losses, shapes = [], []
    for _ in range(steps):
        b, side = rng.randint(*batch), rng.choice(sides)
        x = torch.randn(b, 3, side, side, device=device)
        y = torch.randint(0, cfg.num_labels, (b,), device=device)
        with autocast_for(device):
            out = model(pixel_values=x, labels=y, interpolate_pos_encoding=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        shapes.append((b, side))
        del x, y, out
    return {"losses": losses[-2:], "shapes": shapes}


@workload
def assisted_generation(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """Speculative (assisted) greedy decoding: a 4-layer draft model
    proposes tokens that a 16-layer Llama-shaped target (hidden 2048,
    16/8 heads; fp16) checks, both with KV caches that are cut back to the
    accepted prefix every round. 8 requests of one prompt (16-1,024 tokens)
    and 8-64 new tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    rng = seeded(seed)
    if small:
        target_cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=500, max_position_embeddings=256)
        draft_cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=1, vocab_size=500, max_position_embeddings=256)
        dtype, requests, prompt, new = torch.float32, 2, (4, 16), (3, 6)
    else:
        target_cfg = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=16,
                                 num_attention_heads=16, num_key_value_heads=8, vocab_size=32000,
                                 max_position_embeddings=2048)
        draft_cfg = LlamaConfig(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
                                num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
        dtype, requests, prompt, new = torch.float16, 8, (16, 1024), (8, 64)
    target = build(LlamaForCausalLM, target_cfg, dtype, device).eval()
    draft = build(LlamaForCausalLM, draft_cfg, dtype, device).eval()
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    seen = []
    with torch.inference_mode():
        for _ in range(requests):
            n, m = rng.randint(*prompt), rng.randint(*new)
            ids = torch.randint(3, target_cfg.vocab_size, (1, n), generator=gen).to(device)
            out = target.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=draft,
                                  max_new_tokens=m, do_sample=False, pad_token_id=0)
            seen.append((n, m, out.shape[1] - n))
            del ids, out
    return {"requests": seen}


@workload
def clip_contrastive(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """Contrastive image-text training of a CLIP-shaped dual encoder
    (a 12-layer ViT-B/32 image tower, a 12-layer text tower of width 512;
    bf16 autocast, AdamW) for 24 steps of a random batch (32-384) of
    224-pixel images and captions padded to a random length (8-77)."""
    from transformers import CLIPConfig, CLIPModel

    rng = seeded(seed)
    if small:
        text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=16, vocab_size=100)
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      image_size=32, patch_size=8)
        steps, batch, length, side, proj = 3, (2, 6), (4, 16), 32, 16
    else:
        text = dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8,
                    max_position_embeddings=77, vocab_size=49408)
        vision = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                      image_size=224, patch_size=32)
        steps, batch, length, side, proj = 24, (32, 384), (8, 77), 224, 512
    cfg = CLIPConfig(text_config=text, vision_config=vision, projection_dim=proj)
    model = build(CLIPModel, cfg, torch.float32, device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    vocab = text["vocab_size"]
    losses, shapes = [], []
    for _ in range(steps):
        b, t = rng.randint(*batch), rng.randint(*length)
        ids = torch.randint(0, vocab, (b, t), device=device)
        mask = padded_mask(rng, b, t, 1).to(device)
        pixels = torch.randn(b, 3, side, side, device=device)
        with autocast_for(device):
            out = model(input_ids=ids, attention_mask=mask, pixel_values=pixels, return_loss=True)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(out.loss.item())
        shapes.append((b, t))
        del ids, mask, pixels, out
    return {"losses": losses[-2:], "shapes": shapes}


if __name__ == "__main__":
    sys.exit(main())
