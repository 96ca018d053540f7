"""Record the trace corpus and measure PyTorch's three allocators on it.

    python3 record_all.py --out DIR [--workloads FILE] [--only NAME ...] [--seed N] [--budget SECONDS] [--replay-only]

For each workload of workloads.py, in order: run it in a fresh process
under xseg's recorder (``python3 -m xseg.record``, PyTorch's native
allocator) to write DIR/<name>.trace.gz, then replay that trace with
torch_replay.py in three fresh processes, one per allocator configuration
(native, expandable_segments:True, backend:cudaMallocAsync: PyTorch reads
the configuration when CUDA starts). After each workload DIR/corpus.json
(everything measured) and DIR/corpus.md (tables for bench/traces/README.md)
are written again, so a run cut short keeps what it finished.

--budget is the wall time for the whole run: a step that would start with
less than --min-step seconds left is skipped (and said so), and each step's
timeout (--record-timeout, --replay-timeout) is cut to what is left.
--replay-only replays traces already in DIR. Logs of every step go to
DIR/logs/.

Needs xseg.record importable (an installed xseg wheel, or python/ of the
source tree on PYTHONPATH); this script itself needs no torch.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
WORKLOADS_PY = os.path.join(HERE, "workloads.py")
REPLAY_PY = os.path.join(HERE, "torch_replay.py")
CONFS = ["native", "expandable", "async"]
CONF_TITLES = {"native": "native", "expandable": "expandable", "async": "cudaMallocAsync"}


def discover(path: str = WORKLOADS_PY) -> List[Tuple[str, str]]:
    """The workloads of workloads.py, in file order, as (name, description):
    top-level functions decorated with @workload, read without importing the
    file (it imports torch)."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "workload" for d in node.decorator_list):
            found.append((node.name, " ".join((ast.get_docstring(node) or "").split())))
    return found


class Clock:
    """The run's budget: what is left, and a step's timeout within it."""

    def __init__(self, budget: float, min_step: float, now: Any = time.monotonic) -> None:
        self.now = now
        self.deadline = now() + budget
        self.min_step = min_step

    def timeout(self, wanted: float) -> Optional[float]:
        """wanted, cut to what is left; None when too little is left to start."""
        left = self.deadline - self.now()
        if left < self.min_step:
            return None
        return min(wanted, left)


def run_step(cmd: List[str], env: Dict[str, str], timeout: float, log: str) -> Dict[str, Any]:
    """Run cmd in its own process group with a timeout (the whole group is
    killed when it runs out); its stdout and stderr go to log. Returns rc
    (None on a timeout), seconds and stdout."""
    t0 = time.monotonic()
    with open(log, "w") as lf:
        lf.write("$ " + " ".join(cmd) + "\n")
        lf.flush()
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=lf, universal_newlines=True,
                             start_new_session=True)
        try:
            out, _ = p.communicate(timeout=timeout)
            rc: Optional[int] = p.returncode
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            rc = None
        lf.write(out)
        lf.write(f"\n# exit {rc if rc is not None else 'timeout after %.0fs' % timeout}\n")
    return {"rc": rc, "seconds": round(time.monotonic() - t0, 2), "stdout": out}


def tagged_json(stdout: str, tag: str = "") -> Optional[Dict[str, Any]]:
    """The JSON object on the last line of stdout that starts with tag
    (tag "" : the last line that is a JSON object)."""
    for line in reversed(stdout.splitlines()):
        if tag and not line.startswith(tag):
            continue
        text = line[len(tag):].strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except ValueError:
                continue
    return None


def clean_env() -> Dict[str, str]:
    """The environment of a step: PyTorch's allocator configuration unset
    (torch_replay.py sets its own), unbuffered output."""
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def budgeted_step(cmd: List[str], clock: Clock, timeout: float, log: str) -> Dict[str, Any]:
    """run_step within the budget, or {"skipped": "budget"}."""
    t = clock.timeout(timeout)
    if t is None:
        return {"skipped": "budget"}
    return run_step(cmd, clean_env(), t, log)


def record(name: str, seed: int, out: str, clock: Clock, timeout: float, python: str,
           script: str = WORKLOADS_PY) -> Dict[str, Any]:
    """Record workload name into out/<name>.trace.gz."""
    trace = os.path.join(out, name + ".trace.gz")
    if os.path.exists(trace):
        os.remove(trace)  # a failed run must not leave an old trace to replay
    cmd = [python, "-m", "xseg.record", "-o", trace, "--", script, name, "--seed", str(seed)]
    r = budgeted_step(cmd, clock, timeout, os.path.join(out, "logs", name + ".record.log"))
    if "stdout" in r:
        r["info"] = tagged_json(r.pop("stdout"), "WORKLOAD ")
        r["ok"] = r["rc"] == 0 and os.path.exists(trace)
    return r


def replay(name: str, conf: str, out: str, clock: Clock, timeout: float, python: str) -> Dict[str, Any]:
    """Replay out/<name>.trace.gz under conf in a fresh process."""
    cmd = [python, REPLAY_PY, "--conf", conf, "--json", os.path.join(out, name + ".trace.gz")]
    r = budgeted_step(cmd, clock, timeout, os.path.join(out, "logs", f"{name}.replay.{conf}.log"))
    if "stdout" in r:
        r["result"] = tagged_json(r.pop("stdout"))
        r["ok"] = r["rc"] == 0 and r["result"] is not None
    return r


def fmt_int(n: Optional[int]) -> str:
    return f"{n:,}" if isinstance(n, int) else "-"


def fmt_ratio(r: Dict[str, Any], digits: int) -> str:
    if not r:
        return "-"
    res = r.get("result") if r.get("ok") else None
    if not res or res.get("ratio") is None:
        return "skipped" if r.get("skipped") else "failed"
    mark = "" if res.get("reserved_source") == "memory_stats" else "*"
    return f"{res['ratio']:.{digits}f}{mark}"


def trace_facts(w: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The trace's own counts, from whichever replay finished."""
    for conf in CONFS:
        r = w["replays"].get(conf, {})
        if r.get("ok"):
            return r["result"]
    return None


def markdown(results: Dict[str, Any]) -> str:
    """Two tables: rows in the columns of bench/traces/README.md's table of
    traces, and the replays in detail."""
    lines = ["| trace | events | streams | peak live bytes | PyTorch peak reserved / peak live "
             "(native, expandable, cudaMallocAsync) |", "| --- | --- | --- | --- | --- |"]
    for w in results["workloads"]:
        facts = trace_facts(w) or {}
        ratios = ", ".join(fmt_ratio(w["replays"].get(c, {}), 3) for c in CONFS)
        lines.append(f"| {w['name']} | {fmt_int(facts.get('events'))} | {facts.get('streams', '-')} | "
                     f"{fmt_int(facts.get('peak_live'))} | {ratios} |")
    lines += ["", "| trace | allocator | peak reserved (bytes) | reserved / live | time per event (Python loop) "
              "| retries |", "| --- | --- | --- | --- | --- | --- |"]
    for w in results["workloads"]:
        for conf in CONFS:
            r = w["replays"].get(conf, {})
            res = r.get("result") or {}
            us = f"{res['us_per_event']:.2f} us" if res.get("us_per_event") is not None else "-"
            lines.append(f"| {w['name']} | PyTorch {CONF_TITLES[conf]} | {fmt_int(res.get('max_reserved'))} | "
                         f"{fmt_ratio(r, 5)} | {us} | {res.get('retries', '-')} |")
    lines += ["", "`*`: peak reserved from the drop in the driver's free memory (torch.cuda.mem_get_info), "
              "not from PyTorch's memory_stats (see torch_replay.py).", ""]
    recorded = [w for w in results["workloads"] if w.get("record")]
    if recorded:
        lines += ["| trace | workload time | record step time | peak reserved of the recorded run (native) "
                  "| of its replay (native) |", "| --- | --- | --- | --- | --- |"]
        for w in recorded:
            rec, info = w["record"], w["record"].get("info") or {}
            res = w["replays"].get("native", {}).get("result") or {}
            secs = f"{info['seconds']:.1f} s" if "seconds" in info else "-"
            step = f"{rec['seconds']:.1f} s" if "seconds" in rec else "-"
            lines.append(f"| {w['name']} | {secs} | {step} | {fmt_int(info.get('max_reserved'))} | "
                         f"{fmt_int(res.get('max_reserved'))} |")
        lines.append("")
    return "\n".join(lines)


def save(results: Dict[str, Any], out: str) -> None:
    with open(os.path.join(out, "corpus.json"), "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "corpus.md"), "w") as f:
        f.write(markdown(results))


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Record the trace corpus and replay it through PyTorch's allocators.")
    p.add_argument("--out", required=True, help="folder for traces, corpus.json, corpus.md and logs/")
    p.add_argument("--workloads", default=WORKLOADS_PY,
                   help="the file of workloads (default: workloads.py; holdout.py has the held-out ones)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="these workloads only")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=540, help="seconds for the whole run (default %(default)s)")
    p.add_argument("--min-step", type=float, default=25, help="seconds a step needs left to start (default %(default)s)")
    p.add_argument("--record-timeout", type=float, default=150)
    p.add_argument("--replay-timeout", type=float, default=90)
    p.add_argument("--replay-only", action="store_true", help="replay the traces already in --out")
    p.add_argument("--python", default=sys.executable, help="the Python of the steps (default: this one)")
    ns = p.parse_args(argv)
    known = discover(os.path.abspath(ns.workloads))
    names = [n for n, _ in known]
    for n in ns.only or []:
        if n not in names:
            p.error(f"no workload {n!r}; there are {', '.join(names)}")
    if not ns.replay_only:
        try:
            importlib.import_module("xseg.record")  # the steps run it: fail here rather than in each
        except ImportError as e:
            p.error(f"xseg.record does not import ({e}): put an installed xseg, or python/, on PYTHONPATH")
    os.makedirs(os.path.join(ns.out, "logs"), exist_ok=True)
    clock = Clock(ns.budget, ns.min_step)
    results: Dict[str, Any] = {"seed": ns.seed, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "workloads": []}
    failed = 0
    for name, doc in known:
        if ns.only and name not in ns.only:
            continue
        w: Dict[str, Any] = {"name": name, "description": doc, "seed": ns.seed, "replays": {}}
        results["workloads"].append(w)
        if not ns.replay_only:
            w["record"] = record(name, ns.seed, ns.out, clock, ns.record_timeout, ns.python,
                                 os.path.abspath(ns.workloads))
            print(f"{name}: record {summary(w['record'])}", flush=True)
            if not w["record"].get("ok"):
                failed += 1
                save(results, ns.out)
                continue
        for conf in CONFS:
            r = w["replays"][conf] = replay(name, conf, ns.out, clock, ns.replay_timeout, ns.python)
            failed += not r.get("ok")
            print(f"{name}: replay {conf}: {summary(r)}", flush=True)
        save(results, ns.out)
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    save(results, ns.out)
    print(markdown(results))
    return 1 if failed else 0


def summary(r: Dict[str, Any]) -> str:
    if r.get("skipped"):
        return f"skipped ({r['skipped']})"
    state = "ok" if r.get("ok") else ("timeout" if r["rc"] is None else f"failed (exit {r['rc']})")
    res = r.get("result")
    extra = ""
    if res:
        extra = (f", peak live {res['peak_live']:,}, reserved {res['max_reserved']:,} ({res['reserved_source']}), "
                 f"ratio {res['ratio']:.5f}" if res.get("ratio") is not None else "")
    if res and res.get("conf") == "expandable" and res.get("segments_expandable") is False:
        extra += " -- WARNING: its segments are not expandable (was the configuration read?)"
    return f"{state} in {r['seconds']}s{extra}"


if __name__ == "__main__":
    sys.exit(main())
