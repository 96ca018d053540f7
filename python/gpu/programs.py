"""Everyday PyTorch programs, run unchanged under PyTorch's own allocator and
under xseg (installed and nothing else changed), each allocator in its own
process, and once more started by `python3 -m xseg` (the program file
unchanged); the results must agree.

    python3 programs.py                  # both sides; exit 1 if any program differs
    python3 programs.py run native|xseg  # one side, prints "RESULT {json}"
    python3 -m xseg programs.py run launched  # the xseg side, started by xseg's launcher
    python3 programs.py run xseg NAME... # only the named programs

Each program is a small piece of code of the kind people already run
(mixed precision, checkpointing, streams, DataLoader with pinned memory,
cudnn autotuning, CUDA graphs, torch.compile, serialization, Hugging Face
generation, the deprecated memory aliases...). It returns what it computed;
a program that raises returns the exception's type. A program agrees when
both sides raised the same type, or neither raised and the results are
equal (floats within the program's tolerance: 0 unless an autotuner may
pick other kernels). None of them was written for xseg: they are the
checks a user's own script would make."""
import gc
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import traceback

here = os.path.dirname(os.path.abspath(__file__))
# Deterministic cuBLAS, so that both sides compute the same bits.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

PROGRAMS = []  # (name, tolerance, fn)


def program(tol=0.0):
    def add(fn):
        PROGRAMS.append((fn.__name__, tol, fn))
        return fn
    return add


def mlp(torch, d=256):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)).cuda()


def batches(torch, n, d=256, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(32 + 8 * (i % 3), d, device="cuda", generator=g) for i in range(n)]


def train(opt, xs, loss_of):
    """Optimizer steps on loss_of(x) for each x; the losses."""
    losses = []
    for x in xs:
        loss = loss_of(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@program()
def stats_before_any_tensor(torch):
    # First thing in the process: no CUDA tensor yet.
    return {"allocated": torch.cuda.memory_allocated(), "max_allocated": torch.cuda.max_memory_allocated(),
            "stats_is_dict": isinstance(torch.cuda.memory_stats(), dict)}


@program()
def deprecated_aliases(torch):
    import warnings
    base = torch.cuda.memory_allocated()
    x = torch.empty(1000, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cached = torch.cuda.memory_cached()
        max_cached = torch.cuda.max_memory_cached()
        torch.cuda.reset_max_memory_allocated()
        torch.cuda.reset_max_memory_cached()
    r = {"delta": torch.cuda.memory_allocated() - base, "cached_covers": cached >= x.numel() * 4,
         "max_cached_covers": max_cached >= cached, "max_after_reset": torch.cuda.max_memory_allocated() - base}
    del x
    return r


@program()
def amp_grad_scaler(torch):
    model = mlp(torch)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    losses = []
    for x in batches(torch, 8):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return {"losses": losses, "scale": scaler.get_scale()}


@program()
def activation_checkpointing(torch):
    from torch.utils.checkpoint import checkpoint
    model = mlp(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return {"losses": train(opt, batches(torch, 6), lambda x: (checkpoint(model, x, use_reentrant=False) - x).pow(2).mean())}


@program()
def attention_sdpa(torch):
    torch.manual_seed(2)
    q, k, v = (torch.randn(4, 8, 512, 64, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.float().sum().backward()
    return {"out": out.float().sum().item(), "grad": q.grad.float().abs().sum().item()}


@program(tol=1e-3)
def conv_cudnn_benchmark(torch):
    torch.backends.cudnn.benchmark = True
    try:
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                                  torch.nn.Conv2d(32, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
                                  torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)).cuda()
        opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
        g = torch.Generator(device="cuda").manual_seed(3)
        losses = []
        for i in range(6):
            x = torch.randn(16, 3, 64 + 16 * (i % 2), 64, device="cuda", generator=g)
            y = torch.randint(0, 10, (16,), device="cuda", generator=g)
            loss = torch.nn.functional.cross_entropy(net(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return {"losses": losses}
    finally:
        torch.backends.cudnn.benchmark = False


@program()
def side_stream_record_stream(torch):
    s = torch.cuda.Stream()
    sums = []
    for i in range(20):
        a = torch.full((1 << 20,), float(i), device="cuda")
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            b = a * 2 + 1
        a.record_stream(s)
        del a  # freed while s may still read it
        torch.cuda.current_stream().wait_stream(s)
        b.record_stream(torch.cuda.current_stream())
        c = torch.empty(1 << 20, device="cuda").fill_(-1.0)  # may reuse a's block once that is safe
        sums.append((b.sum() + c.sum()).item())
    return {"sums": sums}


@program()
def pinned_dataloader(torch):
    from torch.utils.data import DataLoader, TensorDataset
    g = torch.Generator().manual_seed(4)
    ds = TensorDataset(torch.randn(512, 64, generator=g), torch.randint(0, 4, (512,), generator=g))
    loader = DataLoader(ds, batch_size=64, shuffle=False, pin_memory=True, num_workers=2)
    total, labels = torch.zeros((), device="cuda", dtype=torch.float64), 0
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        total += x.double().sum()
        labels += int(y.sum().item())
    return {"total": total.item(), "labels": labels}


@program()
def graphed_callables(torch):
    model = mlp(torch, 128)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    sample = torch.randn(16, 128, device="cuda", requires_grad=True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    g = torch.Generator(device="cuda").manual_seed(5)
    xs = [torch.randn(16, 128, device="cuda", generator=g) for _ in range(6)]
    return {"losses": train(opt, xs, lambda x: (graphed(x) - x).pow(2).mean())}


@program()
def cuda_graph_capture_replay(torch):
    static_in = torch.zeros(4096, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up on a side stream, as PyTorch's docs do
        for _ in range(3):
            static_out = (static_in * 3).sin() + 1
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tmp = static_in * 3
        static_out = tmp.sin() + 1
        del tmp
    outs = []
    for i in range(5):
        static_in.copy_(torch.arange(4096, device="cuda", dtype=torch.float32) * (i + 1))
        junk = torch.randn(1 << 18, device="cuda")  # allocations between replays
        graph.replay()
        outs.append(static_out.sum().item())
        del junk
    torch.cuda.empty_cache()  # the graph's memory must survive it
    graph.replay()
    outs.append(static_out.sum().item())
    return {"outs": outs}


@program()
def caching_allocator_alloc_delete(torch):
    base = torch.cuda.memory_allocated()
    s = torch.cuda.Stream()
    p = torch.cuda.caching_allocator_alloc(1 << 20, stream=s)
    during = torch.cuda.memory_allocated() - base
    torch.cuda.caching_allocator_delete(p)
    return {"during": during, "after": torch.cuda.memory_allocated() - base, "nonzero": p != 0}


@program()
def save_load_cuda_tensor(torch):
    import io
    t = torch.arange(10000, device="cuda", dtype=torch.float32).reshape(100, 100)[::2]
    buf = io.BytesIO()
    torch.save({"t": t, "n": 3}, buf)
    buf.seek(0)
    back = torch.load(buf, map_location="cuda")
    return {"equal": bool(torch.equal(back["t"], t)), "device": str(back["t"].device), "stride": list(back["t"].stride())}


@program()
def device_queries(torch):
    free, total = torch.cuda.mem_get_info()
    processes = torch.cuda.list_gpu_processes()
    torch.cuda.ipc_collect()
    return {"free_le_total": 0 < free <= total, "processes_is_str": isinstance(processes, str),
            "backend_is_str": isinstance(torch.cuda.memory.get_allocator_backend(), str)}


@program()
def sparse_and_nested(torch):
    i = torch.tensor([[0, 1, 2, 5], [3, 0, 2, 1]], device="cuda")
    v = torch.tensor([1.0, 2.0, 3.0, 4.0], device="cuda")
    sp = torch.sparse_coo_tensor(i, v, (8, 4)).coalesce()
    dense = torch.ones(4, 3, device="cuda")
    nt = torch.nested.nested_tensor([torch.ones(2, 5, device="cuda"), torch.ones(3, 5, device="cuda") * 2])
    return {"spmm": torch.sparse.mm(sp, dense).sum().item(), "nested": [t.sum().item() for t in nt.unbind()]}


@program()
def fraction_then_train(torch):
    torch.cuda.set_per_process_memory_fraction(0.5)
    try:
        model = mlp(torch)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return {"losses": train(opt, batches(torch, 4), lambda x: (model(x) - x).pow(2).mean())}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)


@program()
def big_block_then_empty_cache(torch):
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    x.fill_(7)
    s = int(x[::4096].sum().item())
    reserved_with = torch.cuda.memory_reserved()
    del x
    torch.cuda.empty_cache()
    return {"sum": s, "gave_back_1_gib": reserved_with - torch.cuda.memory_reserved() >= 1 << 30}


@program()
def many_sizes_live_counts(torch):
    # What a program can rely on whatever the allocator: how many blocks
    # are live and the bytes they asked for (allocated_bytes counts each
    # allocator's own rounding and splitting, so it may differ).
    import random
    rnd = random.Random(6)
    s0 = torch.cuda.memory_stats()
    live, trace = [], []
    for _ in range(400):
        if live and rnd.random() < 0.45:
            live.pop(rnd.randrange(len(live)))
        else:
            live.append(torch.empty(rnd.choice([1, 7, 513, 4096, 70000, 1 << 20, 3 << 20, 30 << 20]) + rnd.randrange(100),
                                    dtype=torch.uint8, device="cuda"))
        s = torch.cuda.memory_stats()
        trace.append([s["allocation.all.current"] - s0.get("allocation.all.current", 0),
                      s["requested_bytes.all.current"] - s0.get("requested_bytes.all.current", 0),
                      torch.cuda.memory_allocated() >= sum(t.numel() for t in live)])
    return {"live_blocks_requested_bytes_covered": trace}


@program()
def rng_state_and_events(torch):
    st = torch.cuda.get_rng_state()
    a = torch.rand(1000, device="cuda")
    torch.cuda.set_rng_state(st)
    b = torch.rand(1000, device="cuda")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    c = torch.randn(1 << 20, device="cuda").exp().sum()
    e1.record()
    e1.synchronize()
    return {"same_draws": bool(torch.equal(a, b)), "elapsed_ok": e0.elapsed_time(e1) >= 0, "finite": bool(c.isfinite())}


@program()
def mempool_snapshot_and_use_count(torch):
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        t = torch.ones(1 << 20, device="cuda")
    r = {"sum": t.sum().item()}
    try:
        r["use_count_is_int"] = isinstance(pool.use_count(), int)
    except Exception as e:  # a missing method is a difference too: both sides report it
        r["use_count"] = type(e).__name__
    del t
    return r


@program()
def spawn_process_with_cuda_tensor(torch):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    p = ctx.Process(target=_child_sum, args=(t, q))
    p.start()
    got = q.get(timeout=120)
    p.join(60)
    return {"child_sum": got, "exit": p.exitcode}


def _child_sum(t, q):
    q.put(float(t.double().sum().item()))


@program()
def hf_generate_kv_cache(torch):
    try:
        import transformers
    except ImportError:
        return {"skipped": "no transformers"}
    transformers.logging.set_verbosity_error()
    cfg = transformers.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=1000, n_positions=256)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).cuda().eval()
    g = torch.Generator(device="cuda").manual_seed(7)
    ids = torch.randint(0, 1000, (3, 17), device="cuda", generator=g)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                             pad_token_id=0)
    return {"tokens": out.tolist()}


@program()
def hf_static_cache_generate(torch):
    # With a static cache, transformers' generate compiles the decoding
    # step itself (torch.compile; "compiled" says whether Dynamo made any
    # graph), so this is also compiled decoding from a preallocated cache.
    if importlib.util.find_spec("transformers") is None:
        return {"skipped": "no transformers"}
    import transformers
    from torch._dynamo.utils import counters
    transformers.logging.set_verbosity_error()
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                                   num_attention_heads=8, num_key_value_heads=4, vocab_size=1000,
                                   max_position_embeddings=512)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).cuda().eval()
    graphs = counters["stats"]["unique_graphs"]
    # Greedy generation with the cache preallocated to its full length, as
    # the recipe for compiled decoding has it: three requests of other
    # batch and prompt sizes.
    g = torch.Generator(device="cuda").manual_seed(11)
    tokens = []
    for b, n, new in ((2, 19, 16), (3, 7, 24), (2, 33, 8)):
        ids = torch.randint(0, 1000, (b, n), device="cuda", generator=g)
        with torch.inference_mode():
            r = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                               pad_token_id=0, cache_implementation="static")
        tokens.append(r.tolist())
    return {"tokens": tokens, "compiled": counters["stats"]["unique_graphs"] > graphs}


@program()
def mempool_dropped_while_its_tensors_live(torch):
    # A MemPool object deleted while tensors made in it are alive: the
    # tensors stay valid, later allocations outside it work, and freeing
    # the tensors gives the memory back.
    import gc
    base = torch.cuda.memory_allocated()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        a = torch.full((1 << 18,), 3.0, device="cuda")
        b = torch.full((5 << 18,), 1.0, device="cuda")
    del pool
    gc.collect()
    c = torch.full((3 << 18,), 2.0, device="cuda")
    a.add_(1)
    s = (a.sum() + b.sum() + c.sum()).item()
    del a, b, c
    gc.collect()
    torch.cuda.synchronize()
    back = torch.cuda.memory_allocated() == base
    torch.cuda.empty_cache()
    d = torch.ones(9 << 18, device="cuda")
    return {"sum": s, "allocated_back_to_base": back, "after": d.sum().item()}


@program(tol=1e-5)
def compile_default(torch):
    model = mlp(torch, 128)
    f = torch.compile(model)
    return {"out": [f(x).sum().item() for x in batches(torch, 3, 128)]}


@program(tol=1e-5)
def compile_reduce_overhead(torch):
    model = mlp(torch, 128)
    f = torch.compile(model, mode="reduce-overhead")
    x = torch.randn(32, 128, device="cuda", generator=torch.Generator(device="cuda").manual_seed(8))
    outs = []
    with torch.no_grad():
        for i in range(5):
            outs.append(f(x * (i + 1)).sum().item())
    return {"out": outs}


@program()
def profiler_with_memory(torch):
    from torch.profiler import ProfilerActivity, profile
    model = mlp(torch, 128)
    x = torch.randn(64, 128, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        model(x).sum().backward()
        torch.cuda.synchronize()
    return {"events": len(prof.key_averages()) > 0}


@program()
def threads_allocating_at_once(torch):
    import threading
    sums, errors = [0.0] * 4, []

    def work(k):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                for i in range(150):
                    t = torch.full(((i % 7 + 1) * 4099,), float(k + 1), device="cuda")
                    u = torch.empty((i % 5 + 1) << 16, device="cuda")
                    sums[k] += t.sum().item()
                    del t, u
        except Exception as e:  # reported, not lost with the thread
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return {"sums": sums, "errors": errors}


@program()
def fsdp2_one_rank(torch):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        model = mlp(torch, 128)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return {"losses": train(opt, batches(torch, 4, 128), lambda x: (model(x) - x).pow(2).mean())}
    finally:
        dist.destroy_process_group()


@program()
def allocator_settings_call(torch):
    torch.cuda.memory._set_allocator_settings("garbage_collection_threshold:0.6")
    return {"called": True}


@program()
def empty_cache_during_capture(torch):
    g = torch.cuda.CUDAGraph()
    x = torch.zeros(1024, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        y = x + 1
        torch.cuda.empty_cache()
    g.replay()
    return {"y": y.sum().item()}


@program()
def oom_batch_finder(torch):
    # Halve the batch until it fits, as accelerate's find_executable_batch_size does.
    batch, tries = 1 << 40, 0
    while batch > 0:
        try:
            torch.empty(batch, dtype=torch.uint8, device="cuda").numel()
            break
        except torch.cuda.OutOfMemoryError:
            batch //= 2
            tries += 1
    torch.cuda.empty_cache()
    after = torch.ones(1 << 20, device="cuda").sum().item()
    return {"found": batch > 0, "tried_more_than_once": tries > 0, "after": after}


@program()
def zero_size_and_many_small(torch):
    z = torch.empty(0, device="cuda")
    small = [torch.full((3,), float(i), device="cuda") for i in range(20000)]
    total = torch.stack(small).sum().item()
    del small
    return {"zero_numel": z.numel(), "zero_ptr": z.data_ptr(), "total": total}


@program()
def dlpack_round_trip(torch):
    from torch.utils.dlpack import from_dlpack, to_dlpack
    t = torch.arange(1000, device="cuda", dtype=torch.float32)
    back = from_dlpack(to_dlpack(t))
    back += 1
    return {"shares_memory": back.data_ptr() == t.data_ptr(), "sum": t.sum().item()}


@program()
def snapshot_shape_and_viz(torch):
    from torch.cuda import _memory_viz
    keep = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (512, 3 << 20, 25 << 20)]
    snap = torch.cuda.memory._snapshot()
    seg = next(s for s in snap["segments"] if s["blocks"])
    summary = _memory_viz.segsum(snap) if hasattr(_memory_viz, "segsum") else ""
    text = _memory_viz.trace(snap) if hasattr(_memory_viz, "trace") else ""
    del keep
    # The keys PyTorch's snapshot has and tools read (extra keys are harmless).
    top = ("segments", "device_traces")
    segment = ("device", "address", "total_size", "allocated_size", "active_size", "requested_size", "stream",
               "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks")
    block = ("address", "size", "requested_size", "state", "frames")
    return {"top": {k: k in snap for k in top}, "segment": {k: k in seg for k in segment},
            "block": {k: k in seg["blocks"][0] for k in block},
            "viz_text": isinstance(text, str) and isinstance(summary, str)}


@program()
def external_stream(torch):
    s = torch.cuda.Stream()
    ext = torch.cuda.ExternalStream(s.cuda_stream)
    with torch.cuda.stream(ext):
        a = torch.arange(1 << 16, device="cuda", dtype=torch.float32)
        b = (a * 2).sum()
    ext.synchronize()
    del a
    return {"b": b.item()}


@program()
def fraction_query_and_caching_switch(torch):
    r = {}
    if hasattr(torch.cuda, "get_per_process_memory_fraction"):
        r["fraction"] = torch.cuda.get_per_process_memory_fraction()
    enable = getattr(torch.cuda.memory, "caching_allocator_enable", None)
    if enable is not None:
        try:
            enable(True)
            r["caching_enable"] = "ok"
        except Exception as e:
            r["caching_enable"] = type(e).__name__
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is not None:
        r["host_stats_is_dict"] = isinstance(stats(), dict)
    return r


class _Indexed:
    """A dataset whose items are CUDA tensors made in the worker."""

    def __len__(self):
        return 8

    def __getitem__(self, i):
        import torch
        return torch.full((1024,), float(i), device="cuda")


@program()
def dataloader_spawn_workers_cuda_items(torch):
    from torch.utils.data import DataLoader
    loader = DataLoader(_Indexed(), batch_size=2, num_workers=2, multiprocessing_context="spawn")
    return {"sums": [b.sum().item() for b in loader]}


@program()
def saved_tensors_on_cpu(torch):
    model = mlp(torch, 128)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)

    def loss_of(x):
        with torch.autograd.graph.save_on_cpu(pin_memory=True):
            return (model(x) - x).pow(2).mean()
    return {"losses": train(opt, batches(torch, 4, 128), loss_of)}


@program(tol=1e-5)
def compile_reduce_overhead_training_shapes(torch):
    # Graph trees with several shapes, forward and backward, re-entered.
    model = mlp(torch, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    f = torch.compile(model, mode="reduce-overhead")
    g = torch.Generator(device="cuda").manual_seed(9)
    losses = []
    for i in range(9):
        x = torch.randn(8 * (1 + i % 3), 64, device="cuda", generator=g)
        loss = (f(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


@program()
def empty_cache_while_a_side_stream_works(torch):
    s = torch.cuda.Stream()
    a = torch.full((1 << 24,), 1.0, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(20):
            a.mul_(1.01)  # queued work on a, on s
        total = a.sum()
    a.record_stream(s)
    del a
    torch.cuda.empty_cache()  # a's memory may go only after s is done with it
    junk = [torch.full((1 << 24,), -5.0, device="cuda") for _ in range(4)]
    torch.cuda.current_stream().wait_stream(s)
    r = total.item()
    del junk
    return {"total": round(r, 1)}


@program()
def graph_in_a_mempool(torch):
    pool = torch.cuda.MemPool()
    x = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id):
        y = x * 3
    x.fill_(2)
    g.replay()
    return {"y": y.sum().item()}


@program()
def free_on_another_thread(torch):
    import threading
    ptrs = [torch.cuda.caching_allocator_alloc(n) for n in (512, 70000, 3 << 20)]
    base = torch.cuda.memory_allocated()
    t = threading.Thread(target=lambda: [torch.cuda.caching_allocator_delete(p) for p in ptrs])
    t.start()
    t.join()
    return {"freed": base - torch.cuda.memory_allocated() > 0}


# Libraries that take their workspaces from the caching allocator: cuDNN's
# RNNs, cuSOLVER, cuFFT's plan cache, CUB's sort and unique, and functorch's
# transforms over them.

@program(tol=1e-5)
def lstm_cudnn_training(torch):
    torch.manual_seed(4)
    rnn = torch.nn.LSTM(48, 96, num_layers=2, batch_first=True, dropout=0.0).cuda()
    head = torch.nn.Linear(96, 1).cuda()
    opt = torch.optim.Adam(list(rnn.parameters()) + list(head.parameters()), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(5)
    losses = []
    for i in range(4):
        x = torch.randn(8, 20 + 7 * i, 48, device="cuda", generator=g)
        out, _ = rnn(x)
        loss = head(out[:, -1]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"losses": losses}


@program(tol=1e-4)
def linalg_solvers(torch):
    g = torch.Generator(device="cuda").manual_seed(6)
    a = torch.randn(96, 96, device="cuda", dtype=torch.float64, generator=g)
    spd = a @ a.T + 96 * torch.eye(96, device="cuda", dtype=torch.float64)
    b = torch.randn(96, 5, device="cuda", dtype=torch.float64, generator=g)
    batch = torch.randn(16, 24, 24, device="cuda", dtype=torch.float64, generator=g)
    return {"eigh": torch.linalg.eigvalsh(spd)[-3:].tolist(),
            "svd": torch.linalg.svdvals(a)[:3].tolist(),
            "solve": torch.linalg.solve(spd, b).abs().sum().item(),
            "cholesky": torch.linalg.cholesky(spd).diagonal().sum().item(),
            "inv_batched": torch.linalg.inv(batch).abs().sum().item(),
            "qr": torch.linalg.qr(a).R.diagonal().abs().sum().item()}


@program(tol=1e-4)
def fft_plan_cache(torch):
    g = torch.Generator(device="cuda").manual_seed(7)
    sums = []
    for n in (1000, 1024, 4097, 1000):  # a size seen again uses its cached plan
        x = torch.randn(8, n, device="cuda", generator=g)
        y = torch.fft.irfft(torch.fft.rfft(x) * 0.5, n=n)
        sums.append((y - 0.5 * x).abs().max().item() < 1e-4)
        sums.append(torch.fft.fft2(x.reshape(8, -1, 1).expand(8, n, 4).contiguous()).abs().sum().item())
    return {"checks": sums, "plans": torch.backends.cuda.cufft_plan_cache.size}


@program()
def sort_unique_nonzero(torch):
    g = torch.Generator(device="cuda").manual_seed(8)
    x = torch.randint(0, 5000, (3_000_000,), device="cuda", generator=g)
    s, idx = torch.sort(x, stable=True)
    u, counts = torch.unique(x, return_counts=True)
    top = torch.topk(x.float(), 10).values
    return {"sorted": bool((s[1:] >= s[:-1]).all().item()), "idx_sum": idx[:1000].sum().item(),
            "unique": u.numel(), "counts": counts[:5].tolist(), "nonzero": torch.nonzero(x > 4990).shape[0],
            "top": top.tolist()}


@program(tol=1e-5)
def functorch_vmap_grad(torch):
    from torch.func import functional_call, grad, vmap
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).cuda()
    params = {k: v.detach() for k, v in model.named_parameters()}
    x = torch.randn(64, 16, device="cuda")
    y = torch.randn(64, 1, device="cuda")

    def loss(p, xi, yi):
        return (functional_call(model, p, (xi.unsqueeze(0),)) - yi).pow(2).sum()

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))(params, x, y)
    return {k: v.abs().sum().item() for k, v in sorted(per_sample.items())}


def run_side(mode, names):
    if mode == "launched":  # started by python3 -m xseg: installed already
        import xseg
        assert xseg.is_installed(), "python3 -m xseg did not install xseg"
    if mode == "xseg":
        try:
            import xseg
        except ImportError:
            sys.path.append(os.path.join(here, ".."))
            import xseg
        xseg.install()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    res = {}
    for name, _, fn in PROGRAMS:
        if names and name not in names:
            continue
        gc.collect()  # what earlier programs left is freed before this one counts
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        try:
            res[name] = {"result": fn(torch)}
        except Exception as e:
            res[name] = {"error": type(e).__name__, "message": str(e)[:400],
                         "where": traceback.format_exc().splitlines()[-3:]}
        res[name]["seconds"] = round(time.perf_counter() - t0, 2)
        torch.cuda.synchronize()
    print("RESULT " + json.dumps(res), flush=True)


def close(a, b, tol):
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isfinite(a) and abs(a - b) <= tol * max(abs(a), abs(b), 1e-30))
    return a == b


def side(mode, names):
    launcher = ["-m", "xseg"] if mode == "launched" else []
    p = subprocess.run([sys.executable, *launcher, os.path.abspath(__file__), "run", mode, *names],
                       capture_output=True, text=True, timeout=900)
    lines = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        sys.stdout.write(p.stdout[-3000:] + p.stderr[-6000:])
        raise SystemExit(f"{mode} side failed with exit status {p.returncode}")
    return json.loads(lines[-1][len("RESULT "):])


def main(names):
    nat, xs, launched = side("native", names), side("xseg", names), side("launched", names)
    bad = compare(nat, xs, "xseg")
    bad += [b + " (launched)" for b in compare(nat, launched, "python3 -m xseg")]
    print(f"{len(nat) - len(set(b.split(' ')[0] for b in bad))} of {len(nat)} programs agree under install() and "
          "python3 -m xseg" + (f"; differ: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


def compare(nat, xs, label):
    bad = []
    for name, tol, _ in PROGRAMS:
        if name not in nat:
            continue
        n, x = nat[name], xs.get(name, {"error": "missing"})
        if "error" in n or "error" in x:
            ok = n.get("error") == x.get("error")
            what = f"native {n.get('error', 'ok')}, xseg {x.get('error', 'ok')}: {x.get('message', n.get('message', ''))}"
        else:
            ok = close(n["result"], x["result"], tol)
            what = "same results" if ok else f"native {json.dumps(n['result'])[:300]} xseg {json.dumps(x['result'])[:300]}"
        print(f"{'ok  ' if ok else 'FAIL'} {name} [{label}] ({n['seconds']} s / {x.get('seconds')} s): {what}")
        if not ok:
            bad.append(name)
            for line in x.get("where", []):
                print("     " + line)
    return bad


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "run":
        run_side(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(main(sys.argv[1:]))
