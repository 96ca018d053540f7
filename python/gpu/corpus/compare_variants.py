"""Set xseg's ratio on each perturbed variant of a trace beside PyTorch's
on the same variant.

    python3 compare_variants.py XSEG_JSONL TORCH_DIR [--markdown]

XSEG_JSONL holds the lines of ``xseg replay --json --perturb N
--write-variants DIR TRACE...``: one object a trace, its "variants" one
result a seed. TORCH_DIR holds ``torch_replay.py --json`` output, one file
a run, for the files that ``--write-variants`` wrote (``NAME.seedS.trace.gz``),
each object with its "conf" (native, expandable, async). For each trace
and seed it prints xseg's ratio and each configuration's, and for each
trace the worst of each and the seeds on which xseg's ratio is above a
configuration's on the same variant (issue 17 asks xseg's default to stay
at or below PyTorch's expandable segments on every perturbation).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, Iterable, List, Optional, Tuple

# A trace's name as --write-variants names its files, as torch_replay.py
# names its results (torch_replay.py imports no torch at module level).
from torch_replay import trace_name

# A written variant's name as torch_replay.py reports it (the file's name
# without ".trace.gz") or its path.
VARIANT = re.compile(r"^(?P<name>.+)\.seed(?P<seed>\d+)(\.trace)?(\.gz)?$")


def xseg_ratios(lines: Iterable[str]) -> Dict[str, Dict[int, float]]:
    """{trace name: {seed: ratio}} from xseg replay's JSON lines; lines
    that are not objects (blank, or a message) are skipped, a variant without a ratio (failed allocations) is
    left out."""
    out: Dict[str, Dict[int, float]] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        seeds = out.setdefault(trace_name(r["trace"]), {})
        for v in r.get("variants") or []:
            if v.get("ratio") is not None:
                seeds[int(v["seed"])] = float(v["ratio"])
    return out


def torch_ratios(results: Iterable[Dict[str, Any]]) -> Dict[str, Dict[str, Dict[int, float]]]:
    """{conf: {trace name: {seed: ratio}}} from torch_replay.py's objects,
    whose "trace" is the path of a written variant; others are skipped."""
    out: Dict[str, Dict[str, Dict[int, float]]] = {}
    for r in results:
        m = VARIANT.match(os.path.basename(str(r.get("trace", ""))))
        if not m or r.get("ratio") is None:
            continue
        out.setdefault(r["conf"], {}).setdefault(m["name"], {})[int(m["seed"])] = float(r["ratio"])
    return out


def read_torch_dir(path: str) -> List[Dict[str, Any]]:
    """Every JSON object a line in the files of path (not its subfolders);
    lines that are not JSON objects (warnings) are skipped."""
    results = []
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if not os.path.isfile(full):
            continue
        with open(full) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    try:
                        results.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
    return results


Row = Tuple[str, int, float, Dict[str, Optional[float]]]


def compare(xs: Dict[str, Dict[int, float]], ts: Dict[str, Dict[str, Dict[int, float]]]) -> Tuple[List[Row], List[Dict[str, Any]]]:
    """Rows (trace, seed, xseg's ratio, {conf: ratio or None}) and one
    summary a trace: xseg's worst, each conf's worst and median, the seeds
    where xseg is above the conf on the same variant, and how many seeds
    each conf has."""
    confs = sorted(ts)
    rows: List[Row] = []
    summary = []
    for name in sorted(xs):
        seeds = sorted(xs[name])
        s: Dict[str, Any] = {"trace": name, "seeds": len(seeds), "xseg_worst": max(xs[name].values()) if seeds else None}
        for seed in seeds:
            rows.append((name, seed, xs[name][seed], {c: ts[c].get(name, {}).get(seed) for c in confs}))
        for c in confs:
            got = {seed: ts[c].get(name, {}).get(seed) for seed in seeds}
            have = sorted(v for v in got.values() if v is not None)
            s[c] = {
                "measured": len(have),
                "worst": have[-1] if have else None,
                "median": have[len(have) // 2] if have else None,
                "xseg_above": [seed for seed in seeds if got[seed] is not None and xs[name][seed] > got[seed]],
            }
        summary.append(s)
    return rows, summary


def fmt(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.4f}"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="xseg's ratio on each variant beside PyTorch's on the same variant.")
    p.add_argument("xseg_jsonl")
    p.add_argument("torch_dir")
    p.add_argument("--markdown", action="store_true", help="print the summary as a markdown table")
    ns = p.parse_args(argv)
    with open(ns.xseg_jsonl) as f:
        xs = xseg_ratios(f)
    ts = torch_ratios(read_torch_dir(ns.torch_dir))
    rows, summary = compare(xs, ts)
    confs = sorted(ts)
    if not ns.markdown:
        for name, seed, x, t in rows:
            print(f"{name} seed {seed}: xseg {x:.4f} " + " ".join(f"{c} {fmt(t[c])}" for c in confs))
    head = "| trace | seeds | xseg worst | " + " | ".join(f"{c} median, worst | xseg above {c} on" for c in confs) + " |"
    print(head)
    print("|" + " --- |" * (3 + 2 * len(confs)))
    for s in summary:
        cells = [s["trace"], str(s["seeds"]), fmt(s["xseg_worst"])]
        for c in confs:
            cs = s[c]
            measured = "" if cs["measured"] == s["seeds"] else f" ({cs['measured']} measured)"
            cells.append(f"{fmt(cs['median'])}, {fmt(cs['worst'])}{measured}")
            cells.append(", ".join(f"seed {x}" for x in cs["xseg_above"]) or "none")
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
