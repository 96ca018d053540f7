"""A fourth set of held-out workloads (bench/holdout, RESULTS round 37):
kinds that neither the corpus (workloads.py) nor the earlier held-out sets
(holdout.py, holdout2.py, holdout3.py) have, recorded to check the default
policy on programs it was not tuned on. No test or default looks at their
traces.

    python3 -m xseg.record -o recsys_sparse.trace.gz -- holdout4.py recsys_sparse --seed 0
    python3 record_all.py --workloads holdout4.py --out DIR

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
from workloads import main, seeded, workload


@workload
def recsys_sparse(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A DLRM-shaped recommender: 8 embedding tables (0.5M-2M rows of 64
    floats; sum-pooled bags, sparse gradients, SparseAdam), a bottom MLP
    over 13 dense features and a top MLP over the pairwise dot products of
    the 9 feature vectors (Adam), 30 steps of a random batch (512-16,384)
    whose bags hold 1-64 ids each."""
    rng = seeded(seed)
    if small:
        rows, dim, tables, steps, batch, bag = (100, 400), 8, 3, 3, (4, 16), (1, 5)
    else:
        rows, dim, tables, steps, batch, bag = (500_000, 2_000_000), 64, 8, 30, (512, 16_384), (1, 64)
    pairs = (tables + 1) * tables // 2
    with torch.device(device):
        embs = nn.ModuleList(nn.EmbeddingBag(rng.randint(*rows), dim, mode="sum", sparse=True) for _ in range(tables))
        bottom = nn.Sequential(nn.Linear(13, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, dim), nn.ReLU())
        top = nn.Sequential(nn.Linear(dim + pairs, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, 1))
        upper = torch.triu_indices(tables + 1, tables + 1, offset=1)
    sparse_opt = torch.optim.SparseAdam(list(embs.parameters()), lr=1e-3)
    dense_opt = torch.optim.Adam([*bottom.parameters(), *top.parameters()], lr=1e-3)
    losses: List[float] = []
    for _ in range(steps):
        b = rng.randint(*batch)
        x = bottom(torch.randn(b, 13, device=device))
        feats = [x]
        for e in embs:
            lengths = torch.randint(bag[0], bag[1] + 1, (b,), device=device)
            offsets = torch.cumsum(lengths, 0) - lengths
            ids = torch.randint(0, e.num_embeddings, (int(lengths.sum()),), device=device)
            feats.append(e(ids, offsets))
        z = torch.stack(feats, 1)
        inter = torch.bmm(z, z.transpose(1, 2))[:, upper[0], upper[1]]
        logit = top(torch.cat([x, inter], 1)).squeeze(1)
        y = torch.randint(0, 2, (b,), device=device).float()
        loss = F.binary_cross_entropy_with_logits(logit, y)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del x, feats, z, inter, logit, y, loss
    return {"losses": losses[-2:]}


@workload
def speech_lstm_ctc(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A speech recognizer's shape: two strided 1-D convolutions over 80
    mel features, a 3-layer bidirectional LSTM (hidden 512, cuDNN) over
    packed sequences, and CTC loss over 32 symbols; fp32, Adam, 30 steps of
    4-48 utterances of 200-3,000 frames each (padded to the longest, lengths
    kept)."""
    rng = seeded(seed)
    if small:
        feats, hidden, layers, steps, batch, frames = 8, 16, 1, 3, (2, 4), (20, 60)
    else:
        feats, hidden, layers, steps, batch, frames = 80, 512, 3, 30, (4, 48), (200, 3000)
    vocab = 32
    with torch.device(device):
        front = nn.Sequential(nn.Conv1d(feats, hidden, 5, stride=2, padding=2), nn.GELU(),
                              nn.Conv1d(hidden, hidden, 5, stride=2, padding=2), nn.GELU())
        rnn = nn.LSTM(hidden, hidden, num_layers=layers, bidirectional=True, batch_first=True)
        head = nn.Linear(2 * hidden, vocab)
    opt = torch.optim.Adam([*front.parameters(), *rnn.parameters(), *head.parameters()], lr=3e-4)
    losses: List[float] = []
    for _ in range(steps):
        b = rng.randint(*batch)
        lens = sorted((rng.randint(*frames) for _ in range(b)), reverse=True)
        x = torch.randn(b, feats, lens[0], device=device)
        h = front(x).transpose(1, 2)
        out_lens = [(n + 3) // 4 for n in lens]  # each convolution halves, rounding up
        packed = nn.utils.rnn.pack_padded_sequence(h, out_lens, batch_first=True)
        y, _ = rnn(packed)
        y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True)
        logp = head(y).log_softmax(-1).transpose(0, 1)
        target_lens = [rng.randint(max(1, n // 8), max(1, n // 3)) for n in out_lens]
        targets = torch.randint(1, vocab, (sum(target_lens),), device=device)
        loss = F.ctc_loss(logp, targets, torch.tensor(out_lens), torch.tensor(target_lens), zero_infinity=True)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del x, h, packed, y, logp, targets, loss
    return {"losses": losses[-2:]}


@workload
def ppo_rollout(seed: int, device: str = "cuda", small: bool = False) -> Dict[str, Any]:
    """A PPO loop's shape: 64-512 environments stepped on the GPU (a random
    nonlinear system, observations of 256 floats, 16 discrete actions), an
    actor-critic MLP (three layers of 1,024, fp32) rolled out for 64-256
    steps with each step's tensors kept in lists and stacked at the end,
    advantages by GAE, then 4 epochs of 8 shuffled minibatches (Adam); 12
    iterations."""
    rng = seeded(seed)
    if small:
        obs_dim, acts, hid, iters, envs, horizon = 8, 4, 16, 2, (2, 4), (3, 6)
    else:
        obs_dim, acts, hid, iters, envs, horizon = 256, 16, 1024, 12, (64, 512), (64, 256)
    with torch.device(device):
        trunk = nn.Sequential(nn.Linear(obs_dim, hid), nn.Tanh(), nn.Linear(hid, hid), nn.Tanh(),
                              nn.Linear(hid, hid), nn.Tanh())
        pi, vf = nn.Linear(hid, acts), nn.Linear(hid, 1)
        dyn = torch.randn(obs_dim, obs_dim) / obs_dim ** 0.5
        push = torch.randn(acts, obs_dim) / acts ** 0.5
    opt = torch.optim.Adam([*trunk.parameters(), *pi.parameters(), *vf.parameters()], lr=3e-4)
    losses: List[float] = []
    for _ in range(iters):
        n, steps = rng.randint(*envs), rng.randint(*horizon)
        s = torch.randn(n, obs_dim, device=device)
        obs, act, logp, val, rew = [], [], [], [], []
        with torch.no_grad():
            for _ in range(steps):
                h = trunk(s)
                dist = torch.distributions.Categorical(logits=pi(h))
                a = dist.sample()
                obs.append(s)
                act.append(a)
                logp.append(dist.log_prob(a))
                val.append(vf(h).squeeze(1))
                s = torch.tanh(s @ dyn + F.one_hot(a, acts).float() @ push + 0.1 * torch.randn_like(s))
                rew.append(-(s ** 2).mean(1))
            O, A, LP, V, R = (torch.stack(t) for t in (obs, act, logp, val, rew))
            del obs, act, logp, val, rew
            adv = torch.zeros_like(R)
            last = torch.zeros(n, device=device)
            next_v = vf(trunk(s)).squeeze(1)
            for t in reversed(range(steps)):
                last = R[t] + 0.99 * next_v - V[t] + 0.99 * 0.95 * last
                adv[t] = last
                next_v = V[t]
            ret = adv + V
        O, A, LP, adv, ret = (x.flatten(0, 1) for x in (O, A, LP, adv, ret))
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        total = O.shape[0]
        mb = max(1, total // 8)
        for _ in range(4):
            perm = torch.randperm(total, device=device)
            for i in range(0, total, mb):
                idx = perm[i:i + mb]
                h = trunk(O[idx])
                dist = torch.distributions.Categorical(logits=pi(h))
                ratio = (dist.log_prob(A[idx]) - LP[idx]).exp()
                pg = -torch.min(ratio * adv[idx], ratio.clamp(0.8, 1.2) * adv[idx]).mean()
                v_loss = (vf(h).squeeze(1) - ret[idx]).pow(2).mean()
                loss = pg + 0.5 * v_loss - 0.01 * dist.entropy().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        del O, A, LP, V, R, adv, ret, loss
    return {"losses": losses[-2:]}


if __name__ == "__main__":
    sys.exit(main())
