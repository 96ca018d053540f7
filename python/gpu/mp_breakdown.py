"""Where the time of a torch.multiprocessing share goes: a 1 GiB CUDA tensor
put on a Queue, read in a spawned child, as python/gpu/dropin.py mp does,
with the producer's share and the consumer's open timed inside the path.

    python3 python/gpu/mp_breakdown.py            # native, then xseg under XSEG_CONF
    python3 python/gpu/mp_breakdown.py xseg       # one mode

Each round: put -> share start (the reducer's stream sync), share, share end
-> rebuild start (pickling, the pipe, unpickling), open (xseg: open_block;
native: rebuild_cuda_tensor whole), the rest of the rebuild, the first read.
xseg's rows split further: put -> the stream sync's start (to_sync: the
feeder thread, pickling) and the sync itself; after_open into as_tensor
(open_block's return -> _open_bytes's: the __cuda_array_interface__
tensor) and set_ (the rest of _rebuild_tensor: the typed tensor over the
storage, requires_grad, the class). open_stages_ms splits xseg's open by
libxseg's own timing of it, logged at debug level in the consumer
(go_fetch: pidfd_getfd or the socket, and the lease asked for;
go_reserve; go_import; go_map: the maps and the one SetAccess; go_lease:
the wait for the lease's answer left after them; go_allocations: how many
of the exporter's allocations the block spans; go_reused: 1 where the
open took over the mapping kept from the last round's,
XSEG_IMPORT_KEEP_MS; go_claimed: 1 where it claimed the share for one
importer and so waited for no answer from the producer); what open has beyond
their sum is ctypes, cgo, descriptor parsing and the debug line itself (a
few us, inside open_block).
to_reduce, in both modes, is put -> the tensor's reducer starting in the
feeder thread (the reducer the pickler has for torch.Tensor, wrapped).
Medians of 5 rounds (MP_N) after a warm-up, in ms. Prints RESULT <json>.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
N = (1 << 30) // 4


def _wrap(owner, name, log, key):
    fn = getattr(owner, name)

    def timed(*a, **k):
        s = time.monotonic()
        try:
            return fn(*a, **k)
        finally:
            log.setdefault(key, []).append((s, time.monotonic()))
    setattr(owner, name, timed)


def _consumer(mode, q_in, q_out):
    log = {}
    if mode == "xseg":
        import xseg._lib
        import xseg._torch
        # Each open then logs its stages (fetch, reserve, import, map,
        # lease wait) to stderr, which main() reads.
        xseg._lib.set_log_level("debug")
        _wrap(xseg._lib, "open_block", log, "open")
        _wrap(xseg._torch, "_open_bytes", log, "open_bytes")
        _wrap(xseg._torch, "_rebuild_tensor", log, "rebuild")
    else:
        import torch.multiprocessing.reductions as red
        _wrap(red, "rebuild_cuda_tensor", log, "rebuild")
    while True:
        item = q_in.get()
        if item is None:
            return
        t, t0, expect = item
        first = t[-1].item()
        t1 = time.monotonic()
        ok = first == expect
        d0 = time.monotonic()
        del t, item
        d1 = time.monotonic()
        q_out.put({"t1": t1, "ok": ok, "log": dict(log), "drop_ms": (d1 - d0) * 1e3})
        log.clear()


def produce(mode):
    os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    log = {}
    if mode == "xseg":
        sys.path.append(os.path.join(here, ".."))
        import xseg
        xseg.install()
        import xseg._lib
        _wrap(xseg._lib, "share_block", log, "share")
    import torch
    import torch.multiprocessing as tmp
    if mode == "xseg":
        # The reducer's stream sync (install() registered the reducer
        # itself with the pickler: wrapping the module's name would not
        # time it).
        _wrap(torch.cuda.Stream, "synchronize", log, "sync")
    # When the feeder thread reaches the tensor's reducer, in both modes:
    # the reducer registered for torch.Tensor (PyTorch's, or install()'s)
    # wrapped where the pickler looks it up.
    from multiprocessing.reduction import ForkingPickler
    reducer = ForkingPickler._extra_reducers[torch.Tensor]

    def timed_reducer(t):
        log.setdefault("reduce", []).append((time.monotonic(), 0.0))
        return reducer(t)
    ForkingPickler.register(torch.Tensor, timed_reducer)
    ctx = tmp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_consumer, args=(mode, q_in, q_out))
    p.start()
    rows = []
    for i in range(1 + int(os.environ.get("MP_N", "5"))):
        t = torch.full((N,), float(i + 1), device="cuda")
        torch.cuda.synchronize()
        log.clear()
        t0 = time.monotonic()
        q_in.put((t, t0, float(i + 1)))
        r = q_out.get(timeout=120)
        del t
        if i == 0:
            continue
        ms = lambda a, b: (b - a) * 1e3  # noqa: E731
        row = {"total": ms(t0, r["t1"]), "ok": r["ok"], "drop": r["drop_ms"]}
        if "reduce" in log:
            row["to_reduce"] = ms(t0, log["reduce"][0][0])
        reb = r["log"].get("rebuild", [(t0, t0)])[0]
        if "share" in log:
            s0, s1 = log["share"][0]
            row.update(to_share=ms(t0, s0), share=ms(s0, s1), to_rebuild=ms(s1, reb[0]))
            if "sync" in log:
                y0, y1 = log["sync"][-1]
                row.update(to_sync=ms(t0, y0), sync=ms(y0, y1))
        else:
            row.update(to_rebuild=ms(t0, reb[0]))
        if "open" in r["log"]:
            o0, o1 = r["log"]["open"][0]
            row.update(before_open=ms(reb[0], o0), open=ms(o0, o1), after_open=ms(o1, reb[1]))
            if "open_bytes" in r["log"]:
                b1 = r["log"]["open_bytes"][0][1]
                row.update(as_tensor=ms(o1, b1), set_=ms(b1, reb[1]))
        row.update(rebuild=ms(*reb), read=ms(reb[1], r["t1"]))
        rows.append(row)
    q_in.put(None)
    p.join(60)
    keys = [k for k in rows[0] if k != "ok"]
    med = {k: round(statistics.median(r[k] for r in rows), 3) for k in keys}
    print("RESULT " + json.dumps({"mode": mode, "conf": os.environ.get("XSEG_CONF", ""), "median_ms": med,
                                  "all_ok": all(r["ok"] for r in rows), "exit": p.exitcode}))
    if os.environ.get("MP_ROWS"):  # every round's row, for the spread
        for r in rows:
            print("ROW " + json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}))


def open_stages(stderr):
    """Medians in ms of the stages libxseg logs for each open in the
    consumer (its debug line "xseg: opened a shared block"), the warm-up
    round's left out; {} if there are none."""
    rows = []
    for line in stderr.splitlines():
        if "opened a shared block" in line:
            kv = dict(re.findall(r"(\w+)_us=([0-9.]+)", line))
            row = {k: float(v) / 1e3 for k, v in kv.items()}
            a = re.search(r"allocations=(\d+)", line)
            if a:
                row["allocations"] = int(a.group(1))
            row["reused"] = 1.0 if "reused=true" in line else 0.0
            row["claimed"] = 1.0 if "claimed=true" in line else 0.0
            rows.append(row)
    rows = rows[1:]
    if not rows:
        return {}
    return {"go_" + k: round(statistics.median(r.get(k, 0) for r in rows), 3) for k in rows[0]}


def main():
    modes = sys.argv[1:] or ["native", "xseg"]
    for m in modes:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", m], capture_output=True, text=True)
        lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
        for l in out.stdout.splitlines():
            if l.startswith("ROW "):
                print(m, l)
        if os.environ.get("MP_ROWS"):
            for l in out.stderr.splitlines():
                if "opened a shared block" in l:
                    print(m, "OPEN", " ".join(re.findall(r"(?:reused|claimed|fetch_us|lease_us|map_us)=\S+", l)))
        if not lines:
            print(f"{m} failed ({out.returncode}): {out.stderr[-3000:]}")
            continue
        res = json.loads(lines[-1][len("RESULT "):])
        stages = open_stages(out.stderr)
        if stages:
            res["open_stages_ms"] = stages
        print("RESULT " + json.dumps(res))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        produce(sys.argv[2])
    else:
        main()
