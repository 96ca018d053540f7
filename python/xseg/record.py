"""Record the CUDA allocations of a PyTorch program as a trace that
``xseg replay`` reads.

From the command line, around a script and its arguments::

    python3 -m xseg.record -o train.trace.gz -- train.py --steps 10

or around a piece of a program::

    import xseg.record
    with xseg.record.record("train.trace.gz"):
        train()

PyTorch's own caching allocator records the history
(``torch.cuda.memory._record_memory_history``), so record with PyTorch's
allocator, not with xseg installed. The snapshot's trace of one device is
then written one event a line (gzip-compressed if the path ends in ``.gz``)::

    a <id> <bytes> <stream>   an allocation, called <id>, on <stream>
    f <id>                    the free of the block called <id>

Ids count from 0 in order of allocation. Stream 0 is the device's default
stream (PyTorch records it as 0); every other stream gets the next number in
order of first use. A free is the program's (``free_requested``) where
PyTorch records those, else the allocator's (``free_completed``). Blocks
allocated before recording began are not in the trace, nor their frees;
blocks still live at the end stay live. ``convert`` does the conversion of a
snapshot dict alone and needs no torch.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import runpy
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

__all__ = ["Trace", "convert", "write", "record", "parser", "main"]

# Enough for hours of a training loop's allocations; each entry costs PyTorch
# a few hundred bytes (more with stacks, which are not kept: context=None).
DEFAULT_MAX_ENTRIES = 2_000_000


class Trace:
    """A converted trace: its lines (without newlines) and what they hold."""

    def __init__(self) -> None:
        self.lines: List[str] = []
        self.allocs = 0
        self.frees = 0
        self.streams: Dict[int, int] = {0: 0}  # PyTorch's stream -> trace stream
        self.live: Dict[int, int] = {}  # address -> id of the live block there
        self.peak_live = 0
        self._live_bytes = 0
        self._sizes: Dict[int, int] = {}  # id -> bytes

    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)

    def _alloc(self, addr: int, size: int, stream: int) -> None:
        if addr in self.live:
            # The free of the block before was lost (a full ring of entries):
            # free it here, so that ids stay unique and frees follow allocs.
            self._free(addr)
        s = self.streams.setdefault(stream, len(self.streams))
        i = self.allocs
        self.allocs += 1
        self.live[addr] = i
        self._sizes[i] = size
        self._live_bytes += size
        self.peak_live = max(self.peak_live, self._live_bytes)
        self.lines.append(f"a {i} {size} {s}")

    def _free(self, addr: int) -> None:
        i = self.live.pop(addr, None)
        if i is None:
            return  # allocated before recording began
        self.frees += 1
        self._live_bytes -= self._sizes.pop(i)
        self.lines.append(f"f {i}")


def _device_trace(snapshot: Dict[str, Any], device: Optional[int]) -> Tuple[int, List[Dict[str, Any]]]:
    """The number of the device whose events to convert, and its events,
    each checked to be a dict."""
    if not isinstance(snapshot, dict):
        raise ValueError(f"xseg.record: the snapshot is a {type(snapshot).__name__}, not a dict")
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list):
        raise ValueError("xseg.record: the snapshot has no device_traces (was history recorded?)")
    for d, t in enumerate(traces):
        if t is not None and not isinstance(t, list):
            raise ValueError(f"xseg.record: device {d}: the trace is a {type(t).__name__}, not a list of events")
    if device is None:
        busy = [d for d, t in enumerate(traces) if t]
        if len(busy) > 1:
            raise ValueError(f"xseg.record: devices {busy} all have events; say which one (device=, --device)")
        if not busy:
            return 0, []
        device = busy[0]
    elif not 0 <= device < len(traces):
        raise ValueError(f"xseg.record: device {device}: the snapshot has traces of {len(traces)} device(s)")
    events = traces[device] or []
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise ValueError(f"xseg.record: device {device}, event {i}: not a dict but a {type(e).__name__}")
    return device, events


def _whole(device: int, i: int, e: Dict[str, Any], key: str, default: Optional[int] = None) -> int:
    """The whole number e[key] of event i (default where it has no key
    and default is not None), or a ValueError that names the event."""
    where = f"xseg.record: device {device}, event {i} ({e.get('action')})"
    if key not in e and default is not None:
        return default
    if key not in e:
        raise ValueError(f"{where}: no {key!r}")
    v = e[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}: {key} {v!r} is not a whole number")
    return v


def convert(snapshot: Dict[str, Any], device: Optional[int] = None) -> Trace:
    """Convert a snapshot (what ``torch.cuda.memory._snapshot()`` returns)
    into a trace: the events of ``device``, or of the only device with
    events. Actions other than allocations and frees (segment maps, OOMs,
    snapshots) are left out. A snapshot the trace cannot be made of (an
    allocation or free without an ``addr``, a ``size`` or ``stream`` that
    is not a whole number, a size outside [0, 2**64)) raises ValueError
    naming the device and the event's index."""
    device, events = _device_trace(snapshot, device)
    free_action = "free_requested" if any(e.get("action") == "free_requested" for e in events) else "free_completed"
    t = Trace()
    for i, e in enumerate(events):
        action = e.get("action")
        if action == "alloc":
            addr, size = _whole(device, i, e, "addr"), _whole(device, i, e, "size")
            if not 0 <= size < 1 << 64:
                raise ValueError(f"xseg.record: device {device}, event {i} (alloc): size {size} is not in [0, 2**64)")
            t._alloc(addr, size, _whole(device, i, e, "stream", 0))
        elif action == free_action:
            t._free(_whole(device, i, e, "addr"))
    return t


def write(snapshot: Dict[str, Any], path: str, device: Optional[int] = None) -> Trace:
    """Convert ``snapshot`` and write the trace to ``path`` (gzip if it ends
    in .gz)."""
    t = convert(snapshot, device)
    data = t.text().encode()
    if path.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        with open(path, "wb") as f:
            f.write(data)
    return t


@contextlib.contextmanager
def record(path: str, device: Optional[int] = None, max_entries: int = DEFAULT_MAX_ENTRIES) -> Iterator[None]:
    """Record the CUDA allocations made inside the ``with`` block and write
    them as a trace to ``path`` when it ends (also when it raises).
    ``device`` is the device whose events are written (default: the only
    one with events)."""
    import torch  # noqa: imported here: convert() needs no torch

    if not torch.cuda.is_available():
        raise RuntimeError("xseg.record: PyTorch sees no CUDA device: there are no allocations to record")
    memory = torch.cuda.memory
    memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=max_entries)
    try:
        yield
    finally:
        torch.cuda.synchronize()
        snapshot = memory._snapshot()
        memory._record_memory_history(enabled=None)
        t = write(snapshot, path, device)
        print(f"xseg.record: {path}: {len(t.lines)} events ({t.allocs} allocations, {t.frees} frees), "
              f"{len(t.streams)} stream(s), peak live {t.peak_live} bytes, {len(t.live)} block(s) live at the end",
              file=sys.stderr)


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: a whole number, low or more."""
    def parse(s: str) -> int:
        try:
            n = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not a whole number") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"{n}: want {low} or more")
        return n
    return parse


def parser() -> argparse.ArgumentParser:
    """The command line of ``python3 -m xseg.record``."""
    p = argparse.ArgumentParser(
        prog="python3 -m xseg.record",
        description="Run a PyTorch script and record its CUDA allocations as a trace for `xseg replay`.")
    p.add_argument("-o", "--output", required=True, help="trace file to write (.gz: gzip-compressed)")
    p.add_argument("--device", type=_at_least(0), default=None, help="device whose events to write (default: the only one with events)")
    p.add_argument("--max-entries", type=_at_least(1), default=DEFAULT_MAX_ENTRIES,
                   help="events PyTorch keeps (older ones are dropped) (default %(default)s)")
    p.add_argument("script", help="the Python script to run")
    p.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """``python3 -m xseg.record -o TRACE [--device N] -- SCRIPT [ARGS...]``:
    run SCRIPT as ``python3 SCRIPT ARGS...`` would, recording its CUDA
    allocations, and write the trace to TRACE."""
    p = parser()
    ns = p.parse_args(argv)
    out_dir = os.path.dirname(os.path.abspath(ns.output))
    # Checked before the workload runs, not after.
    if os.path.isdir(ns.output):
        p.error(f"-o {ns.output}: a directory; name the trace file to write")
    if not os.access(out_dir, os.W_OK):
        p.error(f"cannot write to {out_dir}")
    sys.argv = [ns.script] + ns.args
    sys.path.insert(0, os.path.dirname(os.path.abspath(ns.script)))
    with record(ns.output, ns.device, ns.max_entries):
        runpy.run_path(ns.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
