"""xseg.record without torch or a GPU: a snapshot dict of the shape
torch.cuda.memory._snapshot() returns becomes the trace format that
`xseg replay` reads (bench/trace's Go test parses the same trace)."""

import contextlib
import gzip
import os
import re

import pytest

from conftest import PYTHON_DIR
from xseg import record

MiB = 1 << 20
SIDE = 0x55D0C0DE  # a side stream's cudaStream_t as PyTorch records it

# device 0's trace: two blocks on the default stream, one on a side stream;
# an address freed and used again; a free of a block allocated before
# recording began; actions that are not allocations or frees.
SNAPSHOT = {
    "segments": [],
    "device_traces": [
        [
            {"action": "segment_alloc", "addr": 0x7F0000000000, "size": 20 * MiB, "stream": 0},
            {"action": "alloc", "addr": 0x7F0000000000, "size": 4 * MiB, "stream": 0},
            {"action": "alloc", "addr": 0x7F0000400000, "size": 512, "stream": SIDE},
            {"action": "free_requested", "addr": 0x7F0000000000, "size": 4 * MiB, "stream": 0},
            {"action": "free_completed", "addr": 0x7F0000000000, "size": 4 * MiB, "stream": 0},
            {"action": "free_completed", "addr": 0x7E0000000000, "size": 1 * MiB, "stream": 0},
            {"action": "alloc", "addr": 0x7F0000000000, "size": 6 * MiB, "stream": 0},
            {"action": "oom", "addr": 0, "size": 1 << 40, "stream": 0},
            {"action": "alloc", "addr": 0x7F0000A00000, "size": 3 * MiB, "stream": 0},
            {"action": "free_requested", "addr": 0x7F0000400000, "size": 512, "stream": SIDE},
            {"action": "free_completed", "addr": 0x7F0000400000, "size": 512, "stream": SIDE},
            {"action": "snapshot", "addr": 0, "size": 0, "stream": 0},
            {"action": "free_requested", "addr": 0x7F0000000000, "size": 6 * MiB, "stream": 0},
        ],
        [],
    ],
}

EXPECTED = """a 0 4194304 0
a 1 512 1
f 0
a 2 6291456 0
a 3 3145728 0
f 1
f 2
"""

# The trace bench/trace's TestRecordedTrace parses.
GO_TESTDATA = os.path.join(os.path.dirname(PYTHON_DIR), "bench", "trace", "testdata", "recorded.trace")

LINE = re.compile(r"^(a (\d+) (\d+) (\d+)|f (\d+))$")


def check_format(text):
    """The rules of bench/trace/doc.go: ids allocated once, freed at most
    once and after their allocation; streams unsigned, 0 the default."""
    live, seen = set(), set()
    for n, line in enumerate(text.splitlines(), 1):
        m = LINE.match(line)
        assert m, f"line {n}: {line!r}"
        if m.group(2) is not None:
            i = int(m.group(2))
            assert i not in seen, f"line {n}: id {i} allocated twice"
            seen.add(i)
            live.add(i)
        else:
            i = int(m.group(5))
            assert i in live, f"line {n}: free of id {i}, not live"
            live.remove(i)
    return live


def test_convert():
    t = record.convert(SNAPSHOT)
    assert t.text() == EXPECTED
    assert check_format(t.text()) == {3}
    assert (t.allocs, t.frees) == (4, 3)
    assert t.streams == {0: 0, SIDE: 1}
    assert t.peak_live == 6 * MiB + 3 * MiB + 512  # the 512-byte block is freed after the 3 MiB one comes
    assert list(t.live.values()) == [3]


def test_go_testdata_is_this_conversion():
    # Go's test parses the committed file; it must be what convert writes.
    if not os.path.exists(GO_TESTDATA):
        pytest.skip(f"no {GO_TESTDATA}: not run from the repository")
    with open(GO_TESTDATA) as f:
        assert f.read() == EXPECTED


def test_free_completed_without_requests():
    # Without free_requested entries, free_completed marks the frees.
    snap = {"device_traces": [[e for e in SNAPSHOT["device_traces"][0] if e["action"] != "free_requested"]]}
    text = record.convert(snap).text()
    assert text == EXPECTED.replace("f 2\n", "")  # the last block's free was only requested


def test_lost_free_and_devices():
    addr = 0x7F0000000000
    snap = {"device_traces": [[], [
        {"action": "alloc", "addr": addr, "size": 100, "stream": 7},
        {"action": "alloc", "addr": addr, "size": 200, "stream": 0},
    ]]}
    t = record.convert(snap)  # the only device with events: 1
    assert t.text() == "a 0 100 1\nf 0\na 1 200 0\n", "a lost free is put back before the reuse"
    assert record.convert(snap, device=0).text() == ""
    with pytest.raises(ValueError, match="device 2"):
        record.convert(snap, device=2)
    both = {"device_traces": [snap["device_traces"][1], snap["device_traces"][1]]}
    with pytest.raises(ValueError, match=r"devices \[0, 1\]"):
        record.convert(both)
    with pytest.raises(ValueError, match="no device_traces"):
        record.convert({"segments": []})


def test_write(tmp_path):
    for name in ("t.trace", "t.trace.gz"):
        path = str(tmp_path / name)
        record.write(SNAPSHOT, path)
        opener = gzip.open if name.endswith(".gz") else open
        with opener(path, "rt") as f:
            assert f.read() == EXPECTED


def test_command_line():
    ns = record.parser().parse_args(["-o", "t.gz", "--device", "1", "--", "train.py", "--steps", "3"])
    assert (ns.output, ns.device, ns.script, ns.args) == ("t.gz", 1, "train.py", ["--steps", "3"])
    with pytest.raises(SystemExit):
        record.main(["-o", "/proc/no/such/dir/t.gz", "train.py"])


def _one(*events):
    return {"device_traces": [list(events)]}


@pytest.mark.parametrize("events, match", [
    # A missing key was a bare KeyError: 'size' naming no event.
    ([{"action": "alloc", "addr": 16, "stream": 0}], r"event 0 \(alloc\): no 'size'"),
    ([{"action": "alloc", "size": 512}], r"event 0 \(alloc\): no 'addr'"),
    ([{"action": "alloc", "addr": 16, "size": 512}, {"action": "free_completed"}],
     r"event 1 \(free_completed\): no 'addr'"),
    # int(1.5) made a 1-byte allocation without a word; int("x") said
    # "invalid literal" and int(None) "NoneType", naming no event.
    ([{"action": "alloc", "addr": 16, "size": 1.5}], r"event 0 \(alloc\): size 1\.5 is not a whole number"),
    ([{"action": "alloc", "addr": 16, "size": "512x"}], r"event 0 \(alloc\): size '512x' is not a whole number"),
    ([{"action": "alloc", "addr": None, "size": 512}], r"event 0 \(alloc\): addr None is not a whole number"),
    ([{"action": "alloc", "addr": 16, "size": 512, "stream": None}], r"event 0 \(alloc\): stream None"),
    ([{"action": "alloc", "addr": 16, "size": True}], r"event 0 \(alloc\): size True"),
    # Sizes the trace format cannot hold: xseg replay refused the trace
    # written, after the workload had run.
    ([{"action": "alloc", "addr": 16, "size": -1}], r"event 0 \(alloc\): size -1 is not in \[0, 2\*\*64\)"),
    ([{"action": "alloc", "addr": 16, "size": 1 << 64}], r"event 0 \(alloc\): size 18446744073709551616 is not in"),
    # An event that is not a dict was an AttributeError.
    ([{"action": "alloc", "addr": 16, "size": 512}, ["alloc", 16, 512]], r"event 1: not a dict"),
    ([None], r"event 0: not a dict"),
])
def test_convert_bad_events(events, match):
    with pytest.raises(ValueError, match=r"^xseg\.record: device 0, " + match):
        record.convert(_one(*events))


def test_convert_bad_traces():
    # A device's trace that is not a list was iterated as one (a dict's
    # keys, a string's characters).
    for traces, match in [
        ([{"action": "alloc"}], r"device 0: the trace is a dict, not a list of events"),
        ([[], "alloc"], r"device 1: the trace is a str, not a list of events"),
    ]:
        with pytest.raises(ValueError, match=match):
            record.convert({"device_traces": traces})
    with pytest.raises(ValueError, match="not a dict"):
        record.convert([])  # a snapshot that is not a dict
    # Other actions are left out, whatever they hold.
    snap = _one({"action": "alloc", "addr": 16, "size": 512}, {"action": "segment_map"}, {"action": "oom", "size": "?"},
                {"action": "free_requested", "addr": 16})
    assert record.convert(snap).text() == "a 0 512 0\nf 0\n"


def test_main_checks_before_running(tmp_path, monkeypatch):
    # --device -1, --max-entries 0 and an output that is a directory were
    # found wrong only after the workload had run (or not at all).
    ran = []

    @contextlib.contextmanager
    def fake_record(path, device=None, max_entries=record.DEFAULT_MAX_ENTRIES):
        ran.append(path)
        yield

    monkeypatch.setattr(record, "record", fake_record)
    script = tmp_path / "work.py"
    script.write_text("")
    out = str(tmp_path / "t.trace.gz")
    for argv in (["-o", out, "--device", "-1", str(script)],
                 ["-o", out, "--max-entries", "0", str(script)],
                 ["-o", out, "--max-entries", "-5", str(script)],
                 ["-o", str(tmp_path), str(script)]):
        with pytest.raises(SystemExit) as e:
            record.main(argv)
        assert e.value.code == 2, argv
    assert ran == [], "the workload did not run"
    assert record.main(["-o", out, "--device", "0", "--max-entries", "1", str(script)]) == 0
    assert ran == [out]
