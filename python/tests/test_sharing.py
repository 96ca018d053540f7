"""Cross-process sharing through the ctypes layer, on the host backend: an
exporter process (configured shareable:true) shares a block, importer
processes open it from its descriptor, and both see each other's writes.
Each side is its own Python process: a process has one xseg."""

import re

import pytest

import xseg
from conftest import MiB, last_json

SIZE = 3 * MiB

# The exporter: shares a block filled with 0xA5 and answers commands.
EXPORTER = """
import ctypes
xseg.configure("shareable:true")
importers = int(sys.argv[1])
p = xseg.malloc(%d)
ctypes.memset(p, 0xA5, %d)
desc = xseg.share_block(p, importers=importers)
print(json.dumps({"desc": desc.hex(), "ptr": p}))
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "check":
        print(json.dumps([ctypes.string_at(p, 16).hex(), ctypes.string_at(p + %d - 16, 16).hex()]))
    elif cmd == "unshare":
        out = []
        for _ in range(2):
            try:
                xseg.unshare(desc)
                out.append("ok")
            except xseg.XsegError as e:
                out.append("XsegError: " + str(e))
        print(json.dumps(out))
    elif cmd == "free":
        xseg.free(p)
        q = xseg.malloc(%d)  # the shared pages stay out of reuse
        ctypes.memset(q, 0x11, %d)
        print(json.dumps(q != p))
    elif cmd == "reuse":
        xseg.free(p)
        q = xseg.malloc(%d)  # the block again, if no lease pins it
        print(json.dumps(q == p))
        p = q
    elif cmd == "exit":
        break
""" % (SIZE, SIZE, SIZE, SIZE, SIZE, SIZE)

# An importer: opens the descriptor (argv[1], hex), reads the block, writes
# 0x3C at both ends, prints what it saw; or the error.
IMPORTER = """
import ctypes
desc = bytes.fromhex(sys.argv[1])
try:
    m = xseg.open_block(desc)
except xseg.XsegError as e:
    print(json.dumps({"error": str(e)}))
    sys.exit(0)
with m:
    seen = [ctypes.string_at(m.ptr, 16).hex(), ctypes.string_at(m.ptr + m.size - 16, 16).hex()]
    ctypes.memset(m.ptr, 0x3C, 16)
    ctypes.memset(m.ptr + m.size - 16, 0x3C, 16)
    try:
        xseg.unshare(desc)
        unshare = "ok"
    except xseg.XsegError as e:
        unshare = "XsegError: " + str(e)
print(json.dumps({"size": m.size, "seen": seen, "unshare": unshare}))
"""

A5 = "a5" * 16
C3 = "3c" * 16


def _start_exporter(spawn_py, importers):
    exp = spawn_py(EXPORTER, args=[str(importers)])
    first = exp.recv_json()
    return exp, first["desc"]


def test_share_and_open_between_processes(spawn_py, run_py):
    exp, desc = _start_exporter(spawn_py, importers=1)
    assert len(desc) > 8

    got = last_json(run_py(IMPORTER, args=[desc]))
    assert "error" not in got, got
    assert got["size"] == SIZE
    assert got["seen"] == [A5, A5], "the importer sees the exporter's bytes"
    assert got["unshare"].startswith("XsegError"), "only the exporter can unshare"

    exp.send("check")
    assert exp.recv_json() == [C3, C3], "the exporter sees the importer's writes"

    # importers=1: the share ended with the first open.
    again = last_json(run_py(IMPORTER, args=[desc]))
    assert "error" in again, f"a second importer opened a share for one: {again}"

    exp.send("exit")
    rc, err = exp.finish()
    assert rc == 0, err


def test_unlimited_share_until_unshare(spawn_py, run_py):
    exp, desc = _start_exporter(spawn_py, importers=0)
    for _ in range(2):
        got = last_json(run_py(IMPORTER, args=[desc]))
        assert got.get("seen", [None])[0] in (A5, C3), got
    exp.send("unshare")
    first, second = exp.recv_json()
    assert first == "ok"
    assert second.startswith("XsegError"), "unshare of a descriptor no longer shared"
    late = last_json(run_py(IMPORTER, args=[desc]))
    assert "error" in late, f"opened after unshare: {late}"
    exp.send("exit")
    assert exp.finish()[0] == 0


def test_mapping_outlives_free_and_exporter(spawn_py):
    exp, desc = _start_exporter(spawn_py, importers=1)
    imp = spawn_py("""
        import ctypes
        m = xseg.open_block(bytes.fromhex(sys.argv[1]))
        print(json.dumps(m.size))
        sys.stdin.readline()
        print(json.dumps(ctypes.string_at(m.ptr, 16).hex()))
        m.close()
        m.close()  # closing twice is harmless
    """, args=[desc])
    assert imp.recv_json() == SIZE
    exp.send("free")
    assert exp.recv_json() is True, "a freed shared block was handed out again"
    exp.send("exit")
    assert exp.finish()[0] == 0
    imp.send("read")
    assert imp.recv_json() == A5, "the importer's mapping changed after the exporter freed it and exited"
    rc, err = imp.finish()
    assert rc == 0, err


def test_share_needs_a_shareable_allocator():
    p = xseg.malloc(MiB)
    try:
        with pytest.raises(xseg.XsegError, match="shareable"):
            xseg.share_block(p)
    finally:
        xseg.free(p)


def test_importers_out_of_range_names_the_range():
    # Audit C, D6: "1048577 importers: invalid argument".
    for n in (-1, (1 << 20) + 1):
        with pytest.raises(xseg.XsegError, match=rf"importers {n}: want 0 to 1048576"):
            xseg.share_block(0x1000, importers=n)


def test_open_after_the_exporter_exited_is_one_line(spawn_py, run_py):
    # Audit C, D6: each transport's failure stood on a line of its own
    # ("pidfd_open(N): no such process\nsocket: dial ...") in the
    # one-line text of xseg_last_error.
    exp, desc = _start_exporter(spawn_py, importers=0)
    exp.send("exit")
    assert exp.finish()[0] == 0
    got = last_json(run_py(IMPORTER, args=[desc]))
    err = got.get("error")
    assert err, got
    assert "\n" not in err, err
    assert "; socket: " in err, err


def test_unshare_of_an_unknown_descriptor():
    with pytest.raises(xseg.XsegError):
        xseg.unshare(b"garbage")
    with pytest.raises(xseg.XsegError):
        xseg.unshare(b"")


def test_descriptors_must_be_bytes_like():
    before = xseg.last_error()
    for arg in ("abc", 5, None, [1, 2], 1.5):
        for call in (xseg.open_block, xseg.unshare):
            with pytest.raises(TypeError, match=r"needs a descriptor \(bytes-like.*\), not "
                                                + type(arg).__name__):
                call(arg)
    assert xseg.last_error() == before  # none of them reached the library
    for desc in (bytearray(b"garbage"), memoryview(b"garbage")):  # bytes-like: the library says no
        with pytest.raises(xseg.XsegError):
            xseg.unshare(desc)
        with pytest.raises(xseg.XsegError):
            xseg.open_block(desc)


def test_open_of_garbage_is_an_error_not_a_crash(run_py):
    proc = run_py("""
        import ctypes, random
        xseg.configure("shareable:true")
        p = xseg.malloc(MiB)
        ctypes.memset(p, 7, MiB)
        desc = xseg.share_block(p)
        rnd = random.Random(1)
        bad = [b"", b"garbage", b"\\0" * 64, bytes(rnd.randrange(256) for _ in range(1000)),
               desc[:4] + bytes(rnd.randrange(256) for _ in range(200)), desc + b"trailing"]
        bad += [desc[:n] for n in range(len(desc))]
        errors = 0
        for d in bad:
            try:
                xseg.open_block(d).close()
            except xseg.XsegError:
                errors += 1
        # One byte changed at a time: an error or a mapping, never a crash.
        mutated = 0
        for i in range(len(desc)):
            d = bytearray(desc)
            d[i] ^= 0x5A
            try:
                xseg.open_block(bytes(d)).close()
            except xseg.XsegError:
                pass
            mutated += 1
        with xseg.open_block(desc) as m:  # the real one still opens
            same = ctypes.string_at(m.ptr, 4) == b"\\x07" * 4
        q = xseg.malloc(MiB)
        xseg.free(q)
        print(json.dumps({"bad": len(bad), "errors": errors, "mutated": mutated, "same": same}))
    """)
    out = last_json(proc)
    assert out["errors"] == out["bad"], out
    assert out["mutated"] > 8 and out["same"] is True, out


def test_descriptors_do_not_alias_the_share_buffer(run_py):
    # share_block reuses one buffer per thread: each descriptor it returns
    # must be a copy of its own, also with shares made on several threads
    # at once, and open_block takes bytes, bytearray and memoryview alike.
    proc = run_py("""
        import threading
        xseg.configure("shareable:true")
        blocks = [xseg.malloc(MiB) for _ in range(8)]
        for i, p in enumerate(blocks):
            ctypes.memset(p, i + 1, MiB)
        descs = [None] * len(blocks)
        def share(i):
            descs[i] = xseg.share_block(blocks[i])
        threads = [threading.Thread(target=share, args=(i,)) for i in range(len(blocks))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        first = bytes(descs[0])
        again = xseg.share_block(blocks[0])  # overwrites this thread's buffer
        seen = []
        for i, d in enumerate(descs):
            arg = (d, bytearray(d), memoryview(d))[i % 3]
            with xseg.open_block(arg) as m:
                seen.append(ctypes.string_at(m.ptr, 1)[0])
        print(json.dumps({"types": sorted({type(d).__name__ for d in descs}), "distinct": len(set(descs)),
                          "kept": descs[0] == first and again != first, "seen": seen}))
    """)
    out = last_json(proc)
    assert out["types"] == ["bytes"]
    assert out["distinct"] == 8 and out["kept"], out
    assert out["seen"] == list(range(1, 9)), out


def test_open_logs_its_stages_at_debug(spawn_py, run_py):
    # At log level debug each open says where its time went (what
    # python/gpu/mp_breakdown.py reads); at the default level it says
    # nothing.
    exp, desc = _start_exporter(spawn_py, importers=0)
    quiet = run_py(IMPORTER, args=[desc])
    assert "error" not in last_json(quiet)
    assert "opened a shared block" not in quiet.stderr
    loud = run_py(IMPORTER, args=[desc], env={"XSEG_LOG": "debug"})
    assert "error" not in last_json(loud)
    lines = [l for l in loud.stderr.splitlines() if "opened a shared block" in l]
    assert len(lines) == 1, loud.stderr
    kv = dict(re.findall(r"(\w+)=(\S+)", lines[0]))
    assert kv["via"] in ("pidfd", "socket") and int(kv["bytes"]) == SIZE, kv
    for k in ("fetch_us", "reserve_us", "import_us", "map_us", "lease_us"):
        assert float(kv[k]) >= 0, kv
    assert float(kv["fetch_us"]) > 0 and float(kv["import_us"]) > 0, kv
    exp.send("exit")
    rc, err = exp.finish()
    assert rc == 0, err


def test_open_without_waiting_for_the_lease(spawn_py, run_py):
    """open_block(wait=False) returns the mapping at once; wait() takes the
    lease (the share for one importer then ends), after which the bytes
    are read; wait() again returns at once, and on a closed mapping it
    raises."""
    exp, desc = _start_exporter(spawn_py, importers=1)
    got = last_json(run_py("""
        import ctypes
        m = xseg.open_block(bytes.fromhex(sys.argv[1]), wait=False)
        m.wait()
        m.wait()
        seen = ctypes.string_at(m.ptr, 16).hex()
        m.close()
        try:
            m.wait()
            closed = "no error"
        except xseg.XsegError as e:
            closed = str(e)
        print(json.dumps({"seen": seen, "closed": closed}))
    """, args=[desc]))
    assert got["seen"] == A5, got
    assert "closed mapping" in got["closed"], got
    again = last_json(run_py(IMPORTER, args=[desc]))
    assert "error" in again, f"the lease taken by wait() did not end the share: {again}"
    exp.send("exit")
    assert exp.finish()[0] == 0


def test_racing_importers_of_a_share_for_one(spawn_py, run_py):
    """Two processes open a share for one importer at once: exactly one
    gets it, and it claimed the share (its open waited for no answer from
    the exporter: claimed=true in its debug log) and read the exporter's
    bytes; the other is refused with an error, not wrong bytes."""
    import threading
    exp, desc = _start_exporter(spawn_py, importers=1)
    out = [None, None]

    def one(i):
        out[i] = run_py(IMPORTER, args=[desc], env={"XSEG_LOG": "debug"})

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = [last_json(p) for p in out]
    won = [i for i in range(2) if "error" not in got[i]]
    assert len(won) == 1, got
    assert got[won[0]]["seen"] == [A5, A5], got
    assert "claimed=true" in out[won[0]].stderr, out[won[0]].stderr
    assert "no share" in got[1 - won[0]]["error"] or "held for another" in got[1 - won[0]]["error"], got
    exp.send("exit")
    assert exp.finish()[0] == 0


def test_lease_ended_by_the_time_close_returns(spawn_py):
    """An importer closes its mapping of a share for one and, still alive,
    says so; the exporter, told right after, frees the block and allocates
    the size again: it gets the same block, because the importer's close
    returned only once the exporter had dropped the lease (no unpin racing
    the next allocation, as a torch.multiprocessing producer's would)."""
    for _ in range(3):
        exp, desc = _start_exporter(spawn_py, importers=1)
        imp = spawn_py("""
            m = xseg.open_block(bytes.fromhex(sys.argv[1]))
            m.close()
            print(json.dumps("closed"))
            sys.stdin.readline()
        """, args=[desc], env={"XSEG_LEASE_ACK_MS": "60000"})  # no time bound to trip a loaded machine
        assert imp.recv_json() == "closed"
        exp.send("reuse")
        assert exp.recv_json() is True, "the block was still pinned after the importer's close"
        imp.send("exit")
        assert imp.finish()[0] == 0
        exp.send("exit")
        assert exp.finish()[0] == 0


def test_bad_lease_ack_wait_is_an_open_error(spawn_py, run_py):
    """XSEG_LEASE_ACK_MS that is not whole milliseconds up to a minute makes
    the open fail with an error that names it, and opens nothing."""
    exp, desc = _start_exporter(spawn_py, importers=0)
    for bad in ("-1", "2.5", "60001", "soon"):
        got = last_json(run_py(IMPORTER, args=[desc], env={"XSEG_LEASE_ACK_MS": bad}))
        assert "XSEG_LEASE_ACK_MS" in got.get("error", ""), (bad, got)
    ok = last_json(run_py(IMPORTER, args=[desc], env={"XSEG_LEASE_ACK_MS": "0"}))
    assert ok.get("seen", [None])[0] in (A5, C3), ok
    exp.send("exit")
    assert exp.finish()[0] == 0
