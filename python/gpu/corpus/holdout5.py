"""A fifth set of held-out workloads (bench/holdout, RESULTS round 37):
kinds that neither the corpus (workloads.py) nor the earlier held-out sets
have, recorded to check the default policy on programs it was not tuned
on. No test or default looks at their traces.

    python3 -m xseg.record -o retrieval_topk.trace.gz -- holdout5.py retrieval_topk --seed 0
    python3 record_all.py --workloads holdout5.py --out DIR

Same conventions as workloads.py: models built with random weights, inputs
random, shapes from random.Random(seed); ``--device cpu --small`` runs a
tiny version to check the program.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, List

import torch
import torch.nn as nn
import torch.nn.functional as F

# workload registers in workloads.py's table, which main runs from;
# record_all.py finds this file's workloads by that decorator's name.
from workloads import GPT, main, seeded, workload


@workload
def compiled_lm_train(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """The corpus's GPT (8 layers, d 768, no checkpointing; fp32 weights,
    bf16 autocast, AdamW) compiled with torch.compile (Inductor, dynamic
    shapes) and trained for 24 steps of batch 4-32 at a sequence length of
    128, 256, 512 or 1,024, so that the compiled graph's buffers change
    size from step to step. ``--small`` runs it eagerly."""
    rng = seeded(seed)
    if small:
        vocab, d, layers, heads, lengths, batch, steps = 500, 32, 2, 2, [8, 16], (1, 4), 3
    else:
        vocab, d, layers, heads, lengths, batch, steps = 32000, 768, 8, 12, [128, 256, 512, 1024], (4, 32), 24
    model = GPT(vocab, d, layers, heads, max(lengths), checkpointed=False).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    step_model = model if small else torch.compile(model, dynamic=True)
    dev_type = "cuda" if device.startswith("cuda") else "cpu"
    losses: List[float] = []
    for _ in range(steps):
        b, n = rng.randint(*batch), rng.choice(lengths)
        ids = torch.randint(0, vocab, (b, n + 1), device=device)
        with torch.autocast(dev_type, dtype=torch.bfloat16):
            logits = step_model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, vocab).float(), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del ids, logits, loss
    return {"losses": losses[-2:]}


def dcgan(nz: int, ch: int) -> tuple:
    """A DCGAN generator (nz -> 3 x 64 x 64) and discriminator of width ch."""
    g = nn.Sequential(
        nn.ConvTranspose2d(nz, ch * 8, 4, 1, 0, bias=False), nn.BatchNorm2d(ch * 8), nn.ReLU(True),
        nn.ConvTranspose2d(ch * 8, ch * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 4), nn.ReLU(True),
        nn.ConvTranspose2d(ch * 4, ch * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 2), nn.ReLU(True),
        nn.ConvTranspose2d(ch * 2, ch, 4, 2, 1, bias=False), nn.BatchNorm2d(ch), nn.ReLU(True),
        nn.ConvTranspose2d(ch, 3, 4, 2, 1, bias=False), nn.Tanh())
    d = nn.Sequential(
        nn.Conv2d(3, ch, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, True),
        nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 2), nn.LeakyReLU(0.2, True),
        nn.Conv2d(ch * 2, ch * 4, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 4), nn.LeakyReLU(0.2, True),
        nn.Conv2d(ch * 4, ch * 8, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 8), nn.LeakyReLU(0.2, True),
        nn.Conv2d(ch * 8, 1, 4, 1, 0, bias=False))
    return g, d


def gan_step(g: nn.Module, d: nn.Module, opt_g: Any, opt_d: Any, b: int, nz: int, device: str) -> float:
    """One step of gan_train at batch b: a discriminator update on real and
    detached fake images, then a generator update through the
    discriminator. It returns the generator's loss."""
    real = torch.rand(b, 3, 64, 64, device=device) * 2 - 1
    fake = g(torch.randn(b, nz, 1, 1, device=device))
    ones, zeros = torch.ones(b, device=device), torch.zeros(b, device=device)
    loss_d = (F.binary_cross_entropy_with_logits(d(real).view(-1), ones)
              + F.binary_cross_entropy_with_logits(d(fake.detach()).view(-1), zeros))
    loss_d.backward()
    opt_d.step()
    opt_d.zero_grad(set_to_none=True)
    loss_g = F.binary_cross_entropy_with_logits(d(fake).view(-1), ones)
    loss_g.backward()
    opt_g.step()
    opt_g.zero_grad(set_to_none=True)
    opt_d.zero_grad(set_to_none=True)  # the generator's backward went through d
    return loss_g.item()


def gan_setup(nz: int, ch: int, device: str) -> tuple:
    """gan_train's models and optimizers: (g, d, opt_g, opt_d)."""
    g, d = dcgan(nz, ch)
    g, d = g.to(device), d.to(device)
    opt_g = torch.optim.Adam(g.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(d.parameters(), lr=2e-4, betas=(0.5, 0.999))
    return g, d, opt_g, opt_d


@workload
def gan_train(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A DCGAN (64 x 64 images, width 128; fp32, Adam) trained for 40
    steps of batch 32-512: each step a discriminator update on real and
    detached fake images, then a generator update through the
    discriminator, two models and two optimizers taking turns."""
    rng = seeded(seed)
    nz = 100
    if small:
        ch, batch, steps = 4, (2, 4), 2
    else:
        ch, batch, steps = 128, (32, 512), 40
    g, d, opt_g, opt_d = gan_setup(nz, ch, device)
    losses = [gan_step(g, d, opt_g, opt_d, rng.randint(*batch), nz, device) for _ in range(steps)]
    return {"losses": losses[-2:]}


@workload
def retrieval_topk(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """Brute-force nearest-neighbour search: an index of 4M vectors of 256
    (fp16, 2 GiB) searched by 30 query batches of 16-4,096 queries, in
    chunks of 65,536 rows (a score matrix, its top 100 a chunk, then the
    chunks' candidates merged by another top 100)."""
    rng = seeded(seed)
    if small:
        rows, dim, chunk, batches, queries, k = 5000, 8, 1024, 3, (2, 8), 5
    else:
        rows, dim, chunk, batches, queries, k = 4 << 20, 256, 1 << 16, 30, (16, 4096), 100
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    index = F.normalize(torch.randn(rows, dim, device=device), dim=1).to(dtype)
    checks: List[int] = []
    with torch.inference_mode():
        for _ in range(batches):
            q = F.normalize(torch.randn(rng.randint(*queries), dim, device=device), dim=1).to(dtype)
            best_s, best_i = [], []
            for start in range(0, rows, chunk):
                scores = q @ index[start:start + chunk].T
                s, i = scores.topk(k, dim=1)
                best_s.append(s)
                best_i.append(i + start)
                del scores
            s, pos = torch.cat(best_s, 1).topk(k, dim=1)
            ids = torch.cat(best_i, 1).gather(1, pos)
            checks.append(int(ids[0, 0]))
            del q, best_s, best_i, s, pos, ids
    return {"first_hits": checks[-3:]}


if __name__ == "__main__":
    sys.exit(main())
