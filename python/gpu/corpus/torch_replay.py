"""Replay allocation traces through PyTorch's own CUDA allocator and report
how much memory it reserved for them.

    python3 torch_replay.py [--conf native|expandable|async|RAW] [--json] TRACE...

A trace is xseg's format (docs/DESIGN.md, "Trace format"; the rules are in
the documentation of Go package bench/trace): one event a line,
``a <id> <bytes> <stream>`` or ``f <id>``, gzip-compressed when the file
name ends in .gz. Each allocation is made with
``torch.cuda.caching_allocator_alloc`` on a ``torch.cuda.Stream`` of its
trace stream (0: the current stream), each free with
``caching_allocator_delete``: no kernel runs, so only the allocator's
placement decides what it reserves.

--conf picks the allocator, before torch is imported (PyTorch reads
PYTORCH_CUDA_ALLOC_CONF when CUDA starts, so one process measures one
configuration): native (the variable unset), expandable
(expandable_segments:True), async (backend:cudaMallocAsync), or any other
text, used as the variable's value. Without --conf the environment's value
stands.

For each trace it reports the trace's peak of live bytes, the allocator's
peak reserved bytes during the replay and their ratio, and the time per
event of the Python loop (the tool's overhead included: compare it only
with other runs of this tool). Peak reserved is PyTorch's
``reserved_bytes.all.peak`` (``torch.cuda.max_memory_reserved``). For
cudaMallocAsync PyTorch fills that from the pool's ReservedMemHigh
attribute; where a build does not (the key is absent, or 0 after a replay
that allocated), the tool falls back to the drop in the driver's free
memory (``torch.cuda.mem_get_info``) from before the replay to its end,
before anything is freed: cudaMallocAsync's pool keeps what it reserved
(PyTorch sets its release threshold to the maximum) unless an allocation
failed and PyTorch trimmed it, so at the end that drop is the peak. The
result's ``reserved_source`` says which was used; ``driver_used`` is that
drop for every configuration, as a cross-check. ``segments_expandable``
says whether the native allocator's segments were expandable ones (from
its snapshot), so a configuration that did not take is seen.

Several traces in one process replay one after another; all blocks are
freed and the cache emptied between them, but a fresh process per trace
(as record_all.py runs it) is the clean measurement.

The replay logic takes its allocator as an argument (``replay(trace,
allocator)``), so it is tested without torch (python/tests/test_corpus.py).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

CONFS = {
    "native": None,
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
}

# An event: (is_alloc, slot, bytes, stream index). Slots are dense numbers
# for the trace's ids, stream indexes positions in Trace.streams.
Event = Tuple[bool, int, int, int]


class TraceError(ValueError):
    """A trace that breaks the format's rules, with the line it broke them on."""

    def __init__(self, name: str, line: int, text: str, why: str) -> None:
        super().__init__(f"{name}:{line}: {why}: {text[:60]!r}")
        self.line = line


class Trace:
    """A parsed, checked trace."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.events: List[Event] = []
        self.streams: List[int] = [0]  # trace stream ids; index 0 is stream 0
        self.slots = 0  # distinct ids
        self.allocs = 0
        self.frees = 0
        self.peak_live = 0  # bytes
        self.live_at_end = 0  # bytes


def parse(lines: Iterable[str], name: str = "trace") -> Trace:
    """Parse and check the lines of a trace: an id is allocated once and
    freed at most once, after its allocation; streams are unsigned; blank
    lines are ignored."""
    t = Trace(name)
    slot_of: Dict[int, int] = {}
    size_of: Dict[int, int] = {}  # live slot -> bytes
    stream_index = {0: 0}
    live = 0
    for n, line in enumerate(lines, 1):
        f = line.split()
        if not f:
            continue
        try:
            nums = [int(x) for x in f[1:]]
        except ValueError:
            raise TraceError(name, n, line, "not a number") from None
        if any(x < 0 for x in nums):
            raise TraceError(name, n, line, "a negative number")
        if f[0] == "a" and len(nums) == 3:
            ident, size, stream = nums
            if ident in slot_of:
                raise TraceError(name, n, line, f"id {ident} allocated twice")
            slot = slot_of[ident] = t.slots
            t.slots += 1
            s = stream_index.get(stream)
            if s is None:
                s = stream_index[stream] = len(t.streams)
                t.streams.append(stream)
            size_of[slot] = size
            live += size
            t.peak_live = max(t.peak_live, live)
            t.allocs += 1
            t.events.append((True, slot, size, s))
        elif f[0] == "f" and len(nums) == 1:
            slot = slot_of.get(nums[0])
            if slot is None:
                raise TraceError(name, n, line, f"id {nums[0]} freed before it was allocated")
            size = size_of.pop(slot, None)
            if size is None:
                raise TraceError(name, n, line, f"id {nums[0]} freed twice")
            live -= size
            t.frees += 1
            t.events.append((False, slot, size, 0))
        else:
            raise TraceError(name, n, line, "not 'a <id> <bytes> <stream>' nor 'f <id>'")
    t.live_at_end = live
    return t


def trace_name(path: str) -> str:
    """The name of a trace file: its base name less .gz and .trace."""
    base = os.path.basename(path)
    for ext in (".gz", ".trace"):
        if base.endswith(ext):
            base = base[: -len(ext)]
    return base


def read(path: str) -> Trace:
    """Read and parse a trace file (gzip if its name ends in .gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return parse(f, trace_name(path))


class Allocator:
    """What replay() needs of an allocator. stream(id) returns the handle of
    trace stream id; alloc(bytes, handle) returns a non-zero address (0 for
    0 bytes); free(address) frees it. start() is called before the first
    event, finish() after the last, before anything left is freed: it
    returns a dict with at least "max_reserved" (bytes) and
    "reserved_source"."""

    def stream(self, ident: int) -> Any:
        raise NotImplementedError

    def alloc(self, size: int, stream: Any) -> int:
        raise NotImplementedError

    def free(self, ptr: int) -> None:
        raise NotImplementedError

    def start(self) -> None:
        pass

    def finish(self) -> Dict[str, Any]:
        raise NotImplementedError


def replay(trace: Trace, allocator: Allocator, clock: Callable[[], float] = time.perf_counter) -> Dict[str, Any]:
    """Replay trace's events through allocator; return the result (see
    result()). Blocks live at the end are freed after the measurement."""
    streams = [allocator.stream(s) for s in trace.streams]
    ptrs = [0] * trace.slots
    alloc, free = allocator.alloc, allocator.free
    allocator.start()
    t0 = clock()
    for is_alloc, slot, size, s in trace.events:
        if is_alloc:
            ptrs[slot] = alloc(size, streams[s])
        elif ptrs[slot]:
            free(ptrs[slot])
            ptrs[slot] = 0
    t1 = clock()
    measured = allocator.finish()
    for p in ptrs:
        if p:
            free(p)
    return result(trace, measured, t1 - t0)


def result(trace: Trace, measured: Dict[str, Any], seconds: float) -> Dict[str, Any]:
    """The report of one replay: the trace's counts and peak live bytes,
    what the allocator measured, ratio = max_reserved / peak_live (None for
    a trace that never holds a byte) and us_per_event."""
    events = len(trace.events)
    r: Dict[str, Any] = {
        "trace": trace.name,
        "events": events,
        "allocs": trace.allocs,
        "frees": trace.frees,
        "streams": len(trace.streams),
        "peak_live": trace.peak_live,
        "live_at_end": trace.live_at_end,
    }
    r.update(measured)
    r["ratio"] = r["max_reserved"] / trace.peak_live if trace.peak_live else None
    r["seconds"] = seconds
    r["us_per_event"] = seconds / events * 1e6 if events else None
    return r


class TorchAllocator(Allocator):
    """PyTorch's CUDA caching allocator (whichever backend and options
    PYTORCH_CUDA_ALLOC_CONF chose) on the current device."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cuda = torch.cuda
        self.cuda.init()
        self.device = self.cuda.current_device()
        self.alloc_fn = self.cuda.caching_allocator_alloc
        self.free = self.cuda.caching_allocator_delete

    def stream(self, ident: int) -> Any:
        return self.cuda.current_stream() if ident == 0 else self.cuda.Stream()

    def alloc(self, size: int, stream: Any) -> int:
        if size == 0:
            return 0
        return self.alloc_fn(size, self.device, stream)

    def start(self) -> None:
        cuda = self.cuda
        cuda.synchronize()
        cuda.empty_cache()
        cuda.reset_peak_memory_stats()
        st = cuda.memory_stats()
        self.base_reserved = st.get("reserved_bytes.all.current", 0)
        self.base_allocated = st.get("allocated_bytes.all.current", 0)
        self.free_before = cuda.mem_get_info()[0]

    def finish(self) -> Dict[str, Any]:
        cuda = self.cuda
        cuda.synchronize()
        st = cuda.memory_stats()
        driver_used = self.free_before - cuda.mem_get_info()[0]
        m = measurements(st, driver_used, self.base_reserved, self.base_allocated, cuda.get_allocator_backend())
        m["segments_expandable"] = self.expandable()
        return m

    def expandable(self) -> Optional[bool]:
        """Whether the native allocator's segments are expandable ones (so
        that expandable_segments:True took effect); None where PyTorch's
        snapshot does not say (cudaMallocAsync keeps no segments)."""
        try:
            segments = self.cuda.memory._snapshot().get("segments") or []
        except Exception:  # a backend or build without snapshots
            return None
        flags = [s.get("is_expandable") for s in segments if "is_expandable" in s]
        return any(flags) if flags else None


def measurements(stats: Dict[str, Any], driver_used: int, base_reserved: int, base_allocated: int,
                 backend: str) -> Dict[str, Any]:
    """What a replay measured, from PyTorch's memory_stats() after it and the
    drop in the driver's free memory: max_reserved is the stats' peak
    reserved less what was reserved before, or, where the stats have no
    peak (absent or 0), driver_used."""
    peak = stats.get("reserved_bytes.all.peak")
    if peak:
        reserved, source = peak - base_reserved, "memory_stats"
    else:
        reserved, source = driver_used, "mem_get_info"
    allocated = stats.get("allocated_bytes.all.peak")
    return {
        "backend": backend,
        "max_reserved": reserved,
        "reserved_source": source,
        "driver_used": driver_used,
        "base_reserved": base_reserved,
        "max_allocated": allocated - base_allocated if allocated is not None else None,
        "retries": stats.get("num_alloc_retries"),
        "ooms": stats.get("num_ooms"),
    }


def describe(r: Dict[str, Any], conf: str) -> str:
    """One line for a person."""
    ratio = f"{r['ratio']:.5f}" if r["ratio"] is not None else "-"
    us = f"{r['us_per_event']:.2f}" if r["us_per_event"] is not None else "-"
    return (f"{r['trace']} [{conf}] events={r['events']} streams={r['streams']} peak_live={r['peak_live']} "
            f"max_reserved={r['max_reserved']} ({r['reserved_source']}) reserved/live={ratio} "
            f"us_per_event={us} driver_used={r['driver_used']} max_allocated={r['max_allocated']} "
            f"retries={r['retries']} ooms={r['ooms']}")


def set_conf(conf: Optional[str], environ: Dict[str, str]) -> str:
    """Set the allocator's configuration in environ for --conf (None: keep
    it); returns the name it is reported under."""
    if conf is not None:
        value = CONFS.get(conf, conf)
        environ.pop("PYTORCH_ALLOC_CONF", None)  # newer PyTorch reads this one first
        if value is None:
            environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        else:
            environ["PYTORCH_CUDA_ALLOC_CONF"] = value
    value = environ.get("PYTORCH_ALLOC_CONF") or environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    for name, v in CONFS.items():
        if (v or "") == value:
            return name
    return value


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="Replay xseg traces through PyTorch's CUDA allocator.")
    p.add_argument("--conf", help="native, expandable, async, or a PYTORCH_CUDA_ALLOC_CONF value")
    p.add_argument("--json", action="store_true", help="print one JSON object a trace")
    p.add_argument("traces", nargs="+")
    ns = p.parse_args(argv)
    conf = set_conf(ns.conf, os.environ)  # before torch starts CUDA
    traces = [read(path) for path in ns.traces]  # a bad trace fails before CUDA starts
    import torch

    alloc = TorchAllocator(torch)
    for t in traces:
        r = replay(t, alloc)
        r["conf"] = conf
        r["torch"] = torch.__version__
        r["device_name"] = torch.cuda.get_device_name()
        print(json.dumps(r) if ns.json else describe(r, conf), flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
