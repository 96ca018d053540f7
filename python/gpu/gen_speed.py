"""Text generation with a KV cache under one allocator, timed: a random-weight
Llama-shaped decoder (16 layers, hidden 1,024, fp16) answers REQS requests
(default 9) of random batch (1-23), prompt (16-1,023 tokens) and new tokens
(8-63), greedy, from a fixed seed, in its own process:

    python3 gen_speed.py native|xseg

The first two requests warm up; the rest are timed. Prints one line
"RESULT {json}": seconds and tokens of the timed requests, tokens/s, a sum
of the generated ids (fp16 matmuls need not be bitwise repeatable, so it
may differ between runs under any allocator), peak reserved bytes and,
under xseg, its page work (maps, unmaps, waits, and their milliseconds).
XSEG_CONF chooses xseg's policy."""
import json
import os
import sys
import time

mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode not in ("native", "xseg"):
    sys.exit("usage: gen_speed.py native|xseg")
os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch  # noqa: E402
if mode == "xseg":
    import xseg_torch  # noqa: E402
    xseg_torch.install()
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

torch.manual_seed(0)
cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                  num_key_value_heads=16, vocab_size=32000, max_position_embeddings=4096)
model = LlamaForCausalLM(cfg).half().cuda().eval()
g = torch.Generator().manual_seed(7)
seconds, tokens, idsum = 0.0, 0, 0
with torch.inference_mode():
    for r in range(int(os.environ.get("REQS", "9"))):
        b = int(torch.randint(1, 24, (1,), generator=g))
        p = int(torch.randint(16, 1024, (1,), generator=g))
        n = int(torch.randint(8, 64, (1,), generator=g))
        ids = torch.randint(0, cfg.vocab_size, (b, p), generator=g).cuda()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
        if r >= 2:
            seconds += time.perf_counter() - t0
            tokens += b * n
        idsum += int(out.sum())
res = {"mode": mode, "conf": os.environ.get("XSEG_CONF", ""), "seconds": round(seconds, 3), "tokens": tokens,
       "tokens_per_s": round(tokens / seconds, 1) if seconds else None, "idsum": idsum,
       "peak_reserved": torch.cuda.max_memory_reserved()}
if mode == "xseg":
    st = xseg_torch.stats()
    res["peak_reserved"] = st["reserved_bytes.all.peak"]
    for k in ("num_maps", "num_unmaps", "num_syncs", "num_pages_created"):
        res[k] = st.get(k)
    res["page_ms"] = round((st.get("page_ns") or 0) / 1e6, 1)
    res["sync_ms"] = round((st.get("sync_ns") or 0) / 1e6, 1)
print("RESULT " + json.dumps(res))
