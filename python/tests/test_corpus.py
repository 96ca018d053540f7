"""The trace corpus's tools (python/gpu/corpus) without torch or a GPU:
torch_replay.py's parsing, replay loop and arithmetic through a fake
allocator, and record_all.py's discovery, budget, steps and tables (its
replays by a stand-in for Python that prints what torch_replay.py would).
The one test that needs PyTorch and CUDA skips without them."""

import gzip
import json
import os
import stat
import sys
import textwrap

import pytest

from conftest import PYTHON_DIR

sys.path.insert(0, os.path.join(PYTHON_DIR, "gpu", "corpus"))
import record_all  # noqa: E402
import torch_replay as tr  # noqa: E402

MiB = 1 << 20

# Two streams (0 and 7); id 5 freed on another stream than the default;
# id 2 of 0 bytes; ids 9 and 4 still live at the end.
TRACE = """a 1 1000 0
a 5 3000000 7

a 2 0 0
f 1
a 9 2000 0
f 5
f 2
a 4 700 7
"""
PEAK = 3000000 + 2000  # ids 5 and 9 together
END = 2000 + 700


class FakeAllocator(tr.Allocator):
    """Reserves 2 MiB segments a stream, a bump pointer in each, never
    reusing freed bytes: what it reserves is easy to work out by hand."""

    SEGMENT = 2 * MiB

    def __init__(self):
        self.calls = []
        self.live = {}  # ptr -> (size, stream)
        self.reserved = 0
        self.tops = {}  # stream -> bytes used in its current segment
        self.next_ptr = 0x1000
        self.started = self.finished = False

    def stream(self, ident):
        return f"s{ident}"

    def alloc(self, size, stream):
        assert self.started and not self.finished
        self.calls.append(("a", size, stream))
        if size == 0:
            return 0
        top = self.tops.get(stream)
        if top is None or top + size > self.SEGMENT:
            self.reserved += max(self.SEGMENT, size)
            top = 0
        self.tops[stream] = top + size
        ptr, self.next_ptr = self.next_ptr, self.next_ptr + size
        self.live[ptr] = (size, stream)
        return ptr

    def free(self, ptr):
        assert ptr in self.live, f"free of {ptr:#x}, which is not live"
        self.calls.append(("f", ptr))
        del self.live[ptr]

    def start(self):
        self.started = True

    def finish(self):
        self.finished = True
        self.live_at_finish = sum(s for s, _ in self.live.values())
        return {"max_reserved": self.reserved, "reserved_source": "fake"}


def test_parse():
    t = tr.parse(TRACE.splitlines(), "x")
    assert (t.allocs, t.frees, len(t.events), t.slots) == (5, 3, 8, 5)
    assert t.streams == [0, 7]
    assert t.peak_live == PEAK
    assert t.live_at_end == END
    assert t.events[1] == (True, 1, 3000000, 1)  # id 5: the second slot, stream 7 at index 1
    assert t.events[3] == (False, 0, 1000, 0)  # f 1


@pytest.mark.parametrize("text, line, why", [
    ("a 1 10 0\na 1 10 0\n", 2, "allocated twice"),
    ("a 1 10 0\nf 2\n", 2, "before it was allocated"),
    ("a 1 10 0\nf 1\nf 1\n", 3, "freed twice"),
    ("a 1 10\n", 1, "not 'a"),
    ("x 1\n", 1, "not 'a"),
    ("a 1 ten 0\n", 1, "not a number"),
    ("\na 1 -10 0\n", 2, "negative"),
])
def test_parse_rejects(text, line, why):
    with pytest.raises(tr.TraceError, match=why) as e:
        tr.parse(text.splitlines(), "bad")
    assert e.value.line == line
    assert str(e.value).startswith(f"bad:{line}: ")


def test_read_gzip_and_name(tmp_path):
    path = tmp_path / "gpt2_mini.trace.gz"
    with gzip.open(path, "wt") as f:
        f.write(TRACE)
    t = tr.read(str(path))
    assert t.name == "gpt2_mini"
    assert t.peak_live == PEAK
    plain = tmp_path / "plain.trace"
    plain.write_text(TRACE)
    assert tr.read(str(plain)).name == "plain"


def test_replay_with_fake_allocator():
    t = tr.parse(TRACE.splitlines(), "x")
    fake = FakeAllocator()
    ticks = iter([10.0, 10.4])
    r = tr.replay(t, fake, clock=lambda: next(ticks))
    # Stream 0: a segment for id 1 (ids 2 and 9 fit in it); stream 7: id 5
    # is larger than a segment (its own 3000000), id 4 opens another.
    assert fake.reserved == 2 * MiB + 3000000 + 2 * MiB
    assert r["max_reserved"] == fake.reserved
    assert r["peak_live"] == PEAK
    assert r["ratio"] == pytest.approx(fake.reserved / PEAK)
    assert r["seconds"] == pytest.approx(0.4)
    assert r["us_per_event"] == pytest.approx(0.4 / 8 * 1e6)
    assert (r["events"], r["allocs"], r["frees"], r["streams"], r["live_at_end"]) == (8, 5, 3, 2, END)
    assert r["reserved_source"] == "fake"
    # Each allocation on its stream's handle; the 0-byte block never freed;
    # what was live at the end measured before it was freed, then freed.
    assert [c for c in fake.calls if c[0] == "a"] == [
        ("a", 1000, "s0"), ("a", 3000000, "s7"), ("a", 0, "s0"), ("a", 2000, "s0"), ("a", 700, "s7")]
    assert fake.live_at_finish == END
    assert fake.live == {}
    assert len([c for c in fake.calls if c[0] == "f"]) == 4


def test_ratio_of_an_empty_trace():
    t = tr.parse(["a 1 0 0", "f 1"], "empty")
    r = tr.replay(t, FakeAllocator())
    assert r["peak_live"] == 0 and r["ratio"] is None
    assert tr.result(tr.parse([], "none"), {"max_reserved": 0}, 0.0)["us_per_event"] is None


def test_measurements():
    stats = {"reserved_bytes.all.peak": 50 * MiB, "allocated_bytes.all.peak": 33 * MiB,
             "num_alloc_retries": 0, "num_ooms": 0}
    m = tr.measurements(stats, driver_used=52 * MiB, base_reserved=2 * MiB, base_allocated=1 * MiB,
                        backend="native")
    assert m["max_reserved"] == 48 * MiB and m["reserved_source"] == "memory_stats"
    assert m["max_allocated"] == 32 * MiB and m["driver_used"] == 52 * MiB
    assert (m["retries"], m["ooms"], m["backend"]) == (0, 0, "native")
    # A cudaMallocAsync build without the pool's peak: the driver's drop.
    for st in ({}, {"reserved_bytes.all.peak": 0}):
        m = tr.measurements(st, 40 * MiB, 0, 0, "cudaMallocAsync")
        assert m["max_reserved"] == 40 * MiB and m["reserved_source"] == "mem_get_info"
        assert m["max_allocated"] is None and m["retries"] is None


def test_set_conf():
    env = {"PYTORCH_CUDA_ALLOC_CONF": "garbage_collection_threshold:0.6", "PYTORCH_ALLOC_CONF": "x"}
    assert tr.set_conf("native", env) == "native"
    assert env == {}
    assert tr.set_conf("expandable", env) == "expandable"
    assert env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert tr.set_conf("async", env) == "async"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "backend:cudaMallocAsync"
    assert tr.set_conf("max_split_size_mb:128", env) == "max_split_size_mb:128"
    assert tr.set_conf(None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}) == "expandable"
    assert tr.set_conf(None, {}) == "native"


class FakeCuda:
    """torch.cuda as torch_replay.py uses it, over a FakeAllocator; with
    pool_peak=False its memory_stats have no reserved peak (as a
    cudaMallocAsync build might), and only mem_get_info sees the memory."""

    def __init__(self, pool_peak=True):
        self.fake = FakeAllocator()
        self.fake.start()
        self.pool_peak = pool_peak
        self.peak_reset = False

    def init(self):
        pass

    def current_device(self):
        return 0

    def current_stream(self):
        return "s0"

    def Stream(self):
        return "side"

    def caching_allocator_alloc(self, size, device, stream):
        assert device == 0 and self.peak_reset
        return self.fake.alloc(size, stream)

    def caching_allocator_delete(self, ptr):
        self.fake.free(ptr)

    def synchronize(self):
        pass

    def empty_cache(self):
        pass

    def reset_peak_memory_stats(self):
        self.peak_reset = True

    def memory_stats(self):
        if not self.pool_peak:
            return {}
        return {"reserved_bytes.all.peak": self.fake.reserved, "reserved_bytes.all.current": 0,
                "allocated_bytes.all.peak": 3 * MiB, "allocated_bytes.all.current": 0,
                "num_alloc_retries": 0, "num_ooms": 0}

    def mem_get_info(self):
        return (80 << 30) - self.fake.reserved, 80 << 30

    def get_allocator_backend(self):
        return "native" if self.pool_peak else "cudaMallocAsync"

    def get_device_name(self):
        return "Fake GPU"

    @property
    def memory(self):
        cuda = self

        class Memory:
            @staticmethod
            def _snapshot():
                if not cuda.pool_peak:
                    raise RuntimeError("snapshots are not supported by cudaMallocAsync")
                return {"segments": [{"is_expandable": False}, {"is_expandable": False}]}
        return Memory


@pytest.mark.parametrize("pool_peak", [True, False])
def test_main_with_fake_torch(tmp_path, monkeypatch, capsys, pool_peak):
    path = tmp_path / "x.trace"
    path.write_text(TRACE)
    cuda = FakeCuda(pool_peak)
    monkeypatch.setitem(sys.modules, "torch", type(sys)("torch"))
    sys.modules["torch"].cuda = cuda
    sys.modules["torch"].__version__ = "0.fake"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "")  # main() sets it; this puts it back
    conf = "native" if pool_peak else "async"
    assert tr.main(["--conf", conf, "--json", str(path)]) == 0
    assert os.environ.get("PYTORCH_CUDA_ALLOC_CONF") == (None if pool_peak else "backend:cudaMallocAsync")
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    reserved = 2 * MiB + 3000000 + 2 * MiB
    assert r["max_reserved"] == reserved and r["driver_used"] == reserved
    assert r["reserved_source"] == ("memory_stats" if pool_peak else "mem_get_info")
    assert r["ratio"] == pytest.approx(reserved / PEAK)
    assert (r["conf"], r["torch"], r["device_name"]) == (conf, "0.fake", "Fake GPU")
    assert r["segments_expandable"] is (False if pool_peak else None)
    assert cuda.fake.live == {}
    # Without --json, one line for a person.
    assert tr.main(["--conf", conf, str(path)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"x [{conf}] events=8 streams=2 peak_live={PEAK} max_reserved=")


def test_discover_workloads():
    found = record_all.discover()
    assert [n for n, _ in found] == ["generate_small", "generate_large", "encoder_finetune", "unet_diffusion",
                                     "amp_checkpoint", "two_stream_pipeline", "growing_store"]
    assert all(doc for _, doc in found)


def test_discover_holdout_workloads(tmp_path, capsys):
    holdout = os.path.join(os.path.dirname(record_all.WORKLOADS_PY), "holdout.py")
    found = record_all.discover(holdout)
    assert [n for n, _ in found] == ["seq2seq_beam", "qwen_sampling", "cnn_infer", "moe_train"]
    assert all(doc for _, doc in found)
    # --workloads picks the file: its names are the ones --only knows, and
    # the record step runs that file.
    with pytest.raises(SystemExit):
        record_all.main(["--out", str(tmp_path / "x"), "--workloads", holdout, "--only", "growing_store"])
    assert "seq2seq_beam, qwen_sampling" in capsys.readouterr().err
    out = tmp_path / "out"
    record_all.main(["--out", str(out), "--workloads", holdout, "--only", "cnn_infer", "--python",
                     fake_python(tmp_path), "--budget", "120", "--min-step", "1"])
    (w,) = json.loads((out / "corpus.json").read_text())["workloads"]
    assert w["name"] == "cnn_infer" and w["record"]["ok"]
    assert w["record"]["info"]["script"] == "holdout.py"


@pytest.mark.parametrize("script, names", [
    ("holdout2.py", ["lora_finetune", "diffusion_sampling", "gnn_varsize"]),
    ("holdout3.py", ["vit_varres_train", "assisted_generation", "clip_contrastive"]),
    ("holdout4.py", ["recsys_sparse", "speech_lstm_ctc", "ppo_rollout"]),
    ("holdout5.py", ["compiled_lm_train", "gan_train", "retrieval_topk"]),
])
def test_discover_later_holdout_workloads(script, names):
    found = record_all.discover(os.path.join(os.path.dirname(record_all.WORKLOADS_PY), script))
    assert [n for n, _ in found] == names
    assert all(doc for _, doc in found)


def test_clock():
    now = [100.0]
    c = record_all.Clock(budget=60, min_step=20, now=lambda: now[0])
    assert c.timeout(30) == 30
    now[0] = 130.0
    assert c.timeout(45) == 30  # cut to what is left
    now[0] = 141.0
    assert c.timeout(45) is None  # 19 s left: too little to start


def test_run_step_timeout_kills(tmp_path):
    log = tmp_path / "step.log"
    r = record_all.run_step([sys.executable, "-c", "import time; print('started', flush=True); time.sleep(60)"],
                            dict(os.environ), 1.0, str(log))
    assert r["rc"] is None and r["seconds"] < 30
    assert "started" in r["stdout"]
    assert "timeout after 1s" in log.read_text()
    r = record_all.run_step([sys.executable, "-c", "import sys; print('{\"a\": 1}'); sys.exit(3)"],
                            dict(os.environ), 30, str(log))
    assert r["rc"] == 3 and record_all.tagged_json(r["stdout"]) == {"a": 1}


def test_tagged_json():
    out = 'noise\nWORKLOAD {"name": "x"}\n{"b": 2}\nWORKLOAD not json\n'
    assert record_all.tagged_json(out, "WORKLOAD ") == {"name": "x"}
    assert record_all.tagged_json(out) == {"b": 2}
    assert record_all.tagged_json("nothing\n") is None


FAKE_PYTHON = """\
#!{python}
# Stands in for Python running python3 -m xseg.record -o TRACE -- workloads.py NAME
# (writes TRACE, prints the workload's line) or torch_replay.py --conf CONF --json TRACE.
import gzip, json, sys
args = sys.argv[1:]
if args[:2] == ["-m", "xseg.record"]:
    with gzip.open(args[args.index("-o") + 1], "wt") as f:
        f.write("a 0 4000 0\\n")
    print("WORKLOAD " + json.dumps({{"name": args[args.index("--") + 2], "seconds": 12.25,
                                    "max_reserved": 6000,
                                    "script": args[args.index("--") + 1].rsplit("/", 1)[-1]}}))
    sys.exit(0)
conf = args[args.index("--conf") + 1]
if conf == "async":
    sys.exit(2)
reserved = {{"native": 6000, "expandable": 4100}}[conf]
print(json.dumps({{"trace": "t", "events": 1234567, "streams": 2, "peak_live": 4000, "max_reserved": reserved,
                  "reserved_source": "memory_stats" if conf == "native" else "mem_get_info",
                  "ratio": reserved / 4000, "us_per_event": 2.5, "retries": 0, "conf": conf,
                  "segments_expandable": False}}))
"""


def fake_python(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return str(fake)


def test_record_all(tmp_path, capsys):
    out = tmp_path / "out"
    rc = record_all.main(["--out", str(out), "--only", "growing_store", "--python", fake_python(tmp_path),
                          "--budget", "120", "--min-step", "1"])
    assert rc == 1  # the async replay failed
    assert (out / "growing_store.trace.gz").exists()
    res = json.loads((out / "corpus.json").read_text())
    (w,) = res["workloads"]
    assert w["name"] == "growing_store"
    assert w["record"]["ok"] and w["record"]["info"]["name"] == "growing_store"
    assert w["replays"]["native"]["ok"] and w["replays"]["native"]["result"]["ratio"] == 1.5
    assert w["replays"]["async"]["rc"] == 2 and not w["replays"]["async"]["ok"]
    md = (out / "corpus.md").read_text()
    assert "| growing_store | 1,234,567 | 2 | 4,000 | 1.500, 1.025*, failed |" in md
    assert "| growing_store | PyTorch expandable | 4,100 | 1.02500* | 2.50 us | 0 |" in md
    assert "| growing_store | 12.2 s | " in md and " | 6,000 | 6,000 |" in md
    for log in ("growing_store.record.log", "growing_store.replay.native.log", "growing_store.replay.async.log"):
        assert (out / "logs" / log).exists()
    printed = capsys.readouterr().out
    assert "growing_store: record ok in" in printed
    assert "growing_store: replay async: failed (exit 2)" in printed
    lines = {line.split(":")[1].strip(): line for line in printed.splitlines() if line.startswith("growing_store: ")}
    assert "segments are not expandable" in lines["replay expandable"]
    assert "WARNING" not in lines["replay native"]

    # Again, replaying the trace it left: no record step.
    rc = record_all.main(["--out", str(out), "--only", "growing_store", "--python", fake_python(tmp_path),
                          "--replay-only"])
    (w,) = json.loads((out / "corpus.json").read_text())["workloads"]
    assert "record" not in w and w["replays"]["expandable"]["ok"]


def test_record_all_skips_past_budget(tmp_path):
    out = tmp_path / "out"
    rc = record_all.main(["--out", str(out), "--only", "unet_diffusion", "--replay-only", "--budget", "0"])
    assert rc == 1
    (w,) = json.loads((out / "corpus.json").read_text())["workloads"]
    assert all(r == {"skipped": "budget"} for r in w["replays"].values())
    assert "| unet_diffusion | - | - | - | skipped, skipped, skipped |" in (out / "corpus.md").read_text()
    rc = record_all.main(["--out", str(out), "--only", "unet_diffusion", "--budget", "0"])
    assert rc == 1
    (w,) = json.loads((out / "corpus.json").read_text())["workloads"]
    assert w["record"] == {"skipped": "budget"} and w["replays"] == {}
    assert "| unet_diffusion | - | - | - | -, -, - |" in (out / "corpus.md").read_text()


def test_torch_replay_on_gpu(tmp_path):
    """The real allocator, where there is PyTorch with CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    path = tmp_path / "t.trace"
    path.write_text(TRACE)
    import subprocess
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {os.path.dirname(tr.__file__)!r})
        import torch_replay; torch_replay.main(["--conf", "native", "--json", {str(path)!r}])
    """)
    proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, universal_newlines=True,
                          timeout=120, check=True)
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["peak_live"] == PEAK and r["reserved_source"] == "memory_stats"
    assert r["ratio"] >= 1.0 and r["backend"] == "native"


def test_compare_variants(tmp_path, capsys):
    import compare_variants as cv

    xseg = [
        json.dumps({"trace": "bench/traces/unet.trace.gz", "ratio": 1.007, "variants": [
            {"seed": 1, "ratio": 1.02}, {"seed": 2, "ratio": 1.05}, {"seed": 3, "ratio": None}]}),
        "",
        json.dumps({"trace": "/x/gen.trace", "ratio": 1.0, "variants": [{"seed": 1, "ratio": 1.01}]}),
    ]
    tdir = tmp_path / "torch"
    tdir.mkdir()
    (tdir / "a.json").write_text("a warning\n" + json.dumps(
        {"trace": "/v/unet.seed1.trace.gz", "conf": "expandable", "ratio": 1.03}) + "\n")
    (tdir / "b.json").write_text(json.dumps(
        {"trace": "unet.seed2", "conf": "expandable", "ratio": 1.04}) + "\n{broken\n")
    (tdir / "c.json").write_text(json.dumps(
        {"trace": "/v/gen.seed1.trace.gz", "conf": "native", "ratio": 1.3}) + "\n")
    (tdir / "d.json").write_text(json.dumps(
        {"trace": "/v/gen.trace.gz", "conf": "expandable", "ratio": 1.1}) + "\n")  # not a variant
    (tdir / "sub").mkdir()

    xs = cv.xseg_ratios(xseg)
    assert xs == {"unet": {1: 1.02, 2: 1.05}, "gen": {1: 1.01}}
    ts = cv.torch_ratios(cv.read_torch_dir(str(tdir)))
    assert ts == {"expandable": {"unet": {1: 1.03, 2: 1.04}}, "native": {"gen": {1: 1.3}}}
    rows, summary = cv.compare(xs, ts)
    assert rows[0] == ("gen", 1, 1.01, {"expandable": None, "native": 1.3})
    by = {s["trace"]: s for s in summary}
    assert by["unet"]["expandable"] == {"measured": 2, "worst": 1.04, "median": 1.04, "xseg_above": [2]}
    assert by["unet"]["native"]["measured"] == 0
    assert by["gen"]["native"]["xseg_above"] == []

    xf = tmp_path / "x.jsonl"
    xf.write_text("\n".join(xseg) + "\n")
    assert cv.main([str(xf), str(tdir), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| unet | 2 | 1.0500 | 1.0400, 1.0400 | seed 2 | -, - (0 measured) | none |" in out
    assert "seed 1: xseg" not in out
