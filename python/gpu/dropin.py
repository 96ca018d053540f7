"""PyTorch's memory API with xseg installed, beside PyTorch's own allocator on
the same workload (issue 14). Each allocator runs in its own process:

    python3 dropin.py                 # both, side by side; exit 1 if a check fails
    python3 dropin.py calls native|xseg   # one side, prints "RESULT {json}"
    python3 dropin.py mp native|xseg      # 1 GiB through a torch.multiprocessing Queue

The side-by-side run times the multiprocessing check with a native and an
xseg producer alive at once, taking turns round by round (mp_paired).

xseg comes from `import xseg` (the installed wheel; python/ of the source
tree only if none is installed)."""
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

here = os.path.dirname(os.path.abspath(__file__))


def use(mode):
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode == "xseg":
        try:
            import xseg
        except ImportError:
            sys.path.append(os.path.join(here, ".."))
            import xseg
        xseg.install()
        return xseg
    return None


def workload(torch, steps=20):
    """A small MLP training loop with fixed seeds; returns the losses."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator(device="cuda").manual_seed(1)
    losses = []
    for i in range(steps):
        x = torch.randn(64 + 8 * (i % 5), 1024, device="cuda", generator=g)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, opt, losses


def calls(mode):
    xs = use(mode)
    import torch
    r = {"mode": mode}
    model, opt, losses = workload(torch)
    torch.cuda.synchronize()
    c = torch.cuda
    r["losses"] = losses
    r["memory_allocated"] = c.memory_allocated()
    r["memory_reserved"] = c.memory_reserved()
    r["max_memory_allocated"] = c.max_memory_allocated()
    r["max_memory_reserved"] = c.max_memory_reserved()
    st = c.memory_stats()
    r["memory_stats_keys"] = sorted(st)
    r["memory_stats_sample"] = {k: st[k] for k in ("allocation.all.current", "allocated_bytes.all.current",
                                                  "requested_bytes.all.current", "active_bytes.all.current",
                                                  "num_alloc_retries", "num_ooms")}
    nested = c.memory_stats_as_nested_dict()
    r["nested_top_keys"] = sorted(nested)
    summ = c.memory_summary()
    r["memory_summary_lines"] = len(summ.splitlines())
    r["memory_summary_head"] = summ.splitlines()[:6]
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del big
    r["max_after_big"] = c.max_memory_allocated()
    c.reset_peak_memory_stats()
    r["max_after_reset"] = c.max_memory_allocated()
    before = c.memory_stats()["allocation.all.allocated"]
    c.reset_accumulated_memory_stats()
    r["allocations_accumulated_before_after_reset"] = [before, c.memory_stats()["allocation.all.allocated"]]
    r["reserved_before_empty_cache"] = c.memory_reserved()
    c.empty_cache()
    r["reserved_after_empty_cache"] = c.memory_reserved()
    r["mem_get_info"] = list(c.mem_get_info())
    snap = c.memory_snapshot()
    r["snapshot_segments"] = len(snap)
    r["snapshot_blocks"] = sum(len(s["blocks"]) for s in snap)
    r["snapshot_segment_keys"] = sorted(snap[0]) if snap else []
    r["snapshot_allocated_sum"] = sum(b["size"] for s in snap for b in s["blocks"] if b["state"] == "active_allocated")

    # memory_viz: record, run a few steps, dump, load back, and feed the
    # pickle to PyTorch's own memory_viz processors.
    c.memory._record_memory_history(max_entries=100000)
    for i in range(3):
        x = torch.randn(128, 1024, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    c.empty_cache()
    try:
        torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
    except torch.cuda.OutOfMemoryError:
        pass
    torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "snap.pickle")
    c.memory._dump_snapshot(path)
    c.memory._record_memory_history(enabled=None)
    with open(path, "rb") as f:
        loaded = pickle.load(f)
    r["viz_keys"] = sorted(loaded)
    actions = {}
    for trace in loaded["device_traces"]:
        for e in trace:
            actions[e["action"]] = actions.get(e["action"], 0) + 1
    r["viz_actions"] = actions
    r["viz_segments"] = len(loaded["segments"])
    r["viz_block_keys"] = sorted(loaded["segments"][0]["blocks"][0]) if loaded["segments"] else []
    from torch.cuda import _memory_viz as mv
    r["viz_trace_plot_bytes"] = len(mv.trace_plot(loaded))
    r["viz_segment_plot_bytes"] = len(mv.segment_plot(loaded))
    r["viz_segsum_lines"] = len(mv.segsum(loaded).splitlines())
    r["viz_trace_lines"] = len(mv.trace(loaded).splitlines())

    # Out of memory: torch.OutOfMemoryError, "CUDA out of memory." first.
    try:
        huge = torch.empty(1 << 46, dtype=torch.uint8, device="cuda")
        r["oom"] = "no error"
        del huge
    except torch.cuda.OutOfMemoryError as e:
        r["oom"] = {"type": type(e).__name__, "matches": "CUDA out of memory." in str(e), "message": str(e)[:400]}
    except RuntimeError as e:
        r["oom"] = {"type": "RuntimeError (not OOM)", "matches": False, "message": str(e)[:400]}

    # set_per_process_memory_fraction(0.1), then an allocation past it.
    total = c.mem_get_info()[1]
    c.set_per_process_memory_fraction(0.1)
    r["fraction_get"] = c.get_per_process_memory_fraction()
    try:
        past = torch.empty(int(total * 0.15), dtype=torch.uint8, device="cuda")
        r["fraction_oom"] = "no error"
        del past
    except torch.cuda.OutOfMemoryError as e:
        r["fraction_oom"] = {"matches": "CUDA out of memory." in str(e), "message": str(e)[:300]}
    small = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")
    r["fraction_small_ok"] = small.numel() > 0
    del small
    c.set_per_process_memory_fraction(1.0)

    # torch.cuda.MemPool / use_mem_pool.
    try:
        pool = c.MemPool()
        with c.use_mem_pool(pool):
            t = torch.ones(1 << 20, device="cuda")
        u = torch.ones(1 << 20, device="cuda")
        in_pool = [s for s in pool.snapshot() if s["segment_pool_id"] == tuple(pool.id)]
        r["mempool"] = {"ok": float(t.sum().item()) == float(1 << 20), "pool_segments": len(in_pool),
                        "tensor_in_pool": any(s["address"] <= t.data_ptr() < s["address"] + s["total_size"]
                                              for s in in_pool),
                        "other_not_in_pool": not any(s["address"] <= u.data_ptr() < s["address"] + s["total_size"]
                                                     for s in in_pool)}
        del t, u, pool
    except Exception as e:  # report, do not hide
        r["mempool"] = {"error": f"{type(e).__name__}: {e}"[:300]}

    if xs is not None:
        t = xs.allocate_tensor(1 << 20, torch.float32)
        r["allocate_tensor"] = [t.numel(), t.dtype == torch.float32, t.is_cuda]
        r["get_memory_stats"] = xs.get_memory_stats()
    print("RESULT " + json.dumps(r))


# torch.multiprocessing: 1 GiB through a Queue, put to first read.

def _consumer(q_in, q_out):
    # Unpickling the first tensor imports torch (and, for xseg's, xseg).
    while True:
        item = q_in.get()
        if item is None:
            return
        t, t0, expect = item
        first = t[-1].item()
        t1 = time.monotonic()
        ok = first == expect and bool((t[:: 1 << 20] == expect).all().item())
        del t, item
        q_out.put((t1 - t0, ok))


def mp(mode, serve=False):
    """1 GiB CUDA tensors through a torch.multiprocessing Queue to a spawned
    consumer: a warm-up round (the consumer's CUDA start-up), 5 timed
    rounds, then the producer drops its tensor before the consumer reads
    it. With serve, rounds run one at a time as stdin asks ("round",
    "drop", "exit"), each answered with a JSON line: mp_paired() takes
    turns between a native and an xseg producer, so that both see the
    machine in the same state."""
    use(mode)
    import torch
    import torch.multiprocessing as tmp
    ctx = tmp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consumer, args=(q_in, q_out))
    p.start()
    n = (1 << 30) // 4
    i = 0

    def one_round():
        nonlocal i
        i += 1
        t = torch.full((n,), float(i), device="cuda")
        torch.cuda.synchronize()
        t0 = time.monotonic()
        q_in.put((t, t0, float(i)))
        dt, ok = q_out.get(timeout=120)
        del t
        return dt * 1e3, ok

    def after_drop():
        # The producer drops its tensor before the consumer reads: the
        # memory must stay until the consumer lets go.
        t = torch.full((n,), 42.0, device="cuda")
        q_in.put((t, time.monotonic(), 42.0))
        del t
        torch.cuda.empty_cache()
        scribble = torch.full((n,), -1.0, device="cuda")
        _, ok = q_out.get(timeout=120)
        del scribble
        return ok

    def finish():
        q_in.put(None)
        p.join(60)
        return p.exitcode

    if serve:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "round":
                ms, ok = one_round()
                print(json.dumps({"ms": ms, "ok": ok}), flush=True)
            elif cmd == "drop":
                print(json.dumps({"ok": after_drop()}), flush=True)
            else:
                print(json.dumps({"exit": finish()}), flush=True)
                return
        finish()
        return
    one_round()  # the first includes the consumer's CUDA start-up
    rounds = [one_round() for _ in range(5)]
    ok_after_drop = after_drop()
    code = finish()
    times = [ms for ms, _ in rounds]
    r = {"mode": mode, "ms": times, "median_ms": statistics.median(times), "all_read_right": all(ok for _, ok in rounds),
         "read_right_after_producer_dropped": ok_after_drop, "child_exit": code}
    print("RESULT " + json.dumps(r))


# Timed rounds of mp_paired. With 5, two of seven paired runs on one
# machine put xseg's median above native's (0.90 against 0.82 ms, 0.72
# against 0.64), one with each of two builds whose sharing paths are the
# same (bench/RESULTS.md round 33): single rounds vary by a third.
ROUNDS = 15
# How far xseg's median may lie above native's before the check fails.
MP_SLACK = 1.25


def mp_paired():
    """mp() for native and xseg at once, in two producer processes (each
    with its consumer) that take turns: a warm-up round each, then ROUNDS
    timed rounds each, which of the two goes first alternating, then the
    after-drop check and the exits. Returns {mode: mp()'s RESULT}."""
    procs = {m: subprocess.Popen([sys.executable, os.path.abspath(__file__), "mp-serve", m], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for m in ("native", "xseg")}

    def ask(m, cmd):
        pr = procs[m]
        pr.stdin.write(cmd + "\n")
        pr.stdin.flush()
        line = pr.stdout.readline()
        if not line:
            raise SystemExit(f"mp-serve {m} ended without an answer to {cmd!r} (exit status {pr.wait()})")
        return json.loads(line)

    try:
        for m in procs:
            ask(m, "round")  # warm-up
        got = {m: [] for m in procs}
        for k in range(ROUNDS):
            for m in (("native", "xseg") if k % 2 == 0 else ("xseg", "native")):
                got[m].append(ask(m, "round"))
        res = {}
        for m in procs:
            drop = ask(m, "drop")["ok"]
            code = ask(m, "exit")["exit"]
            times = [g["ms"] for g in got[m]]
            res[m] = {"mode": m, "ms": times, "median_ms": statistics.median(times),
                      "all_read_right": all(g["ok"] for g in got[m]), "read_right_after_producer_dropped": drop,
                      "child_exit": code}
        return res
    finally:
        for pr in procs.values():
            if pr.poll() is None:
                pr.kill()
            pr.wait()


def run(*args):
    p = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True)
    sys.stdout.write(p.stdout[-3000:] if p.returncode else "")
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-6000:])
        raise SystemExit(f"{' '.join(args)} failed with exit status {p.returncode}")
    line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main():
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    nat, xs = run("calls", "native"), run("calls", "xseg")
    for k in sorted(set(nat) | set(xs)):
        if k in ("memory_stats_keys",):
            continue
        print(f"{k}:\n  native: {json.dumps(nat.get(k))[:600]}\n  xseg:   {json.dumps(xs.get(k))[:600]}")
    missing = sorted(set(nat["memory_stats_keys"]) - set(xs["memory_stats_keys"]))
    check(not missing, f"every memory_stats key of PyTorch's allocator present under xseg (missing: {missing})")
    check(nat["losses"] == xs["losses"], "same losses at every step")
    for k in ("memory_allocated", "max_memory_allocated"):
        check(nat[k] == xs[k], f"{k} equal: native {nat[k]}, xseg {xs[k]}")
    check(xs["max_after_reset"] < xs["max_after_big"], "reset_peak_memory_stats lowers the peak")
    check(xs["allocations_accumulated_before_after_reset"][1] == 0, "reset_accumulated_memory_stats zeroes counts")
    check(xs["reserved_after_empty_cache"] < xs["reserved_before_empty_cache"], "empty_cache gives memory back")
    check(xs["snapshot_segments"] > 0 and xs["snapshot_allocated_sum"] == xs["memory_allocated"],
          "memory_snapshot blocks add up to memory_allocated")
    for a in ("alloc", "free_requested", "free_completed", "segment_map", "segment_unmap", "oom"):
        check(xs["viz_actions"].get(a, 0) > 0, f"memory_viz trace has {a} actions")
    check(isinstance(xs["oom"], dict) and xs["oom"]["type"] == "OutOfMemoryError" and xs["oom"]["matches"],
          "OOM is torch.OutOfMemoryError starting 'CUDA out of memory.'")
    check(isinstance(xs["fraction_oom"], dict) and xs["fraction_oom"]["matches"] and xs["fraction_small_ok"],
          "set_per_process_memory_fraction(0.1): past it raises OOM, below works")
    check(xs["mempool"].get("ok") and xs["mempool"].get("tensor_in_pool") and xs["mempool"].get("other_not_in_pool"),
          "torch.cuda.MemPool / use_mem_pool route to a private pool")
    print("memory_stats keys: native", len(nat["memory_stats_keys"]), "xseg", len(xs["memory_stats_keys"]))

    runs = mp_paired()
    for mode, r in runs.items():
        print(f"mp {mode}: put->first read ms {['%.2f' % t for t in r['ms']]} median {r['median_ms']:.2f}; "
              f"read right {r['all_read_right']}; after producer dropped {r['read_right_after_producer_dropped']}")
    n, x = runs["native"], runs["xseg"]
    check(x["all_read_right"] and x["read_right_after_producer_dropped"] and x["child_exit"] == 0,
          "xseg: 1 GiB through torch.multiprocessing read right, also after the producer dropped it")
    # xseg and PyTorch's IPC are at parity here (README: xseg's median was
    # the lower one in 13 of 21 rounds), so a strict comparison fails on
    # noise; MP_SLACK bounds the ratio instead, well below what a real
    # regression costs (a 1 GiB block on 20 MiB pages took 3.5 ms against
    # 0.44 to 0.60, docs/DESIGN.md, round 16).
    ratio = x["median_ms"] / n["median_ms"]
    check(ratio <= MP_SLACK,
          f"xseg put->first read median {x['median_ms']:.3f} ms vs native {n['median_ms']:.3f} ms "
          f"(ratio {ratio:.2f}, at most {MP_SLACK})")
    if failures:
        print(f"{len(failures)} checks failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "calls":
        calls(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "mp":
        mp(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "mp-serve":
        mp(sys.argv[2], serve=True)
    else:
        main()
