#!/usr/bin/env python3
"""Write a SYNTHETIC allocation trace shaped like HF-style autoregressive
generation with a dynamic KV cache (each decode step concatenates one token
onto every layer's key and value tensors: a new, slightly larger block is
allocated and the old one freed), large temporary attention buffers in the
prefill, and random batch, prompt and new-token counts per request; one
stream. It is a stand-in for policy work where no recorded trace of that
kind exists yet: a model of what PyTorch allocates, not a recording, and
named synthetic_* so it is never mistaken for one.

    python3 tools/synth_generate.py --seed 1 --requests 12 -o synthetic_generate.trace.gz
"""
import argparse
import gzip
import random


class Trace:
    def __init__(self):
        self.lines, self.next_id, self.live = [], 0, {}

    def alloc(self, size):
        size = max(512, (size + 511) // 512 * 512)
        i = self.next_id
        self.next_id += 1
        self.lines.append(f"a {i} {size} 0")
        self.live[i] = size
        return i

    def free(self, i):
        del self.live[i]
        self.lines.append(f"f {i}")


def generate(seed, requests, layers, hidden, heads, vocab, max_batch, max_prompt, max_new):
    rnd = random.Random(seed)
    t, e = Trace(), 2  # fp16
    d = hidden // heads
    # weights: embeddings and per-layer matrices, live to the end
    t.alloc(vocab * hidden * e)
    for _ in range(layers):
        for n in (3 * hidden * hidden, hidden * hidden, 4 * hidden * hidden, 4 * hidden * hidden, 2 * hidden, 2 * hidden):
            t.alloc(n * e)
    for _ in range(requests):
        b = rnd.randint(1, max_batch)
        p = rnd.randint(16, max_prompt)
        n = rnd.randint(16, max_new)
        ids = t.alloc(b * p * 8)
        cache = []
        x = t.alloc(b * p * hidden * e)
        for _ in range(layers):  # prefill
            h = t.alloc(b * p * hidden * e)
            qkv = t.alloc(b * p * 3 * hidden * e)
            k, v = t.alloc(b * heads * p * d * e), t.alloc(b * heads * p * d * e)
            cache.append([k, v])
            scores = t.alloc(b * heads * p * p * e)
            probs = t.alloc(b * heads * p * p * e)
            t.free(scores)
            att = t.alloc(b * p * hidden * e)
            t.free(probs)
            t.free(qkv)
            o = t.alloc(b * p * hidden * e)
            t.free(att)
            up = t.alloc(b * p * 4 * hidden * e)
            act = t.alloc(b * p * 4 * hidden * e)
            t.free(up)
            down = t.alloc(b * p * hidden * e)
            t.free(act)
            t.free(h)
            t.free(o)
            t.free(x)
            x = down
        logits = t.alloc(b * vocab * 4)
        t.free(x)
        out = t.alloc(b * (p + n) * 8)
        t.free(logits)
        for step in range(n):  # decode: one token, caches grow by one
            s = p + step + 1
            x = t.alloc(b * hidden * e)
            for layer in range(layers):
                qkv = t.alloc(b * 3 * hidden * e)
                k_old, v_old = cache[layer]
                k = t.alloc(b * heads * s * d * e)
                t.free(k_old)
                v = t.alloc(b * heads * s * d * e)
                t.free(v_old)
                cache[layer] = [k, v]
                scores = t.alloc(b * heads * s * e)
                att = t.alloc(b * hidden * e)
                t.free(scores)
                t.free(qkv)
                up = t.alloc(b * 4 * hidden * e)
                down = t.alloc(b * hidden * e)
                t.free(up)
                t.free(att)
                t.free(x)
                x = down
            logits = t.alloc(b * vocab * 4)
            t.free(x)
            t.free(logits)
        for k, v in cache:
            t.free(k)
            t.free(v)
        t.free(out)
        t.free(ids)
    return t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--requests", type=int, default=12)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--max-prompt", type=int, default=1024)
    ap.add_argument("--max-new", type=int, default=128)
    a = ap.parse_args()
    t = generate(a.seed, a.requests, a.layers, a.hidden, a.heads, a.vocab, a.max_batch, a.max_prompt, a.max_new)
    with gzip.open(a.out, "wt") as f:
        f.write("\n".join(t.lines) + "\n")


if __name__ == "__main__":
    main()
