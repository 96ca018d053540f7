"""The ctypes layer (xseg._lib, re-exported by xseg) on the host backend,
without torch. Tests that need a fresh library or a configuration of their
own run in a subprocess (run_py); the others share this process's library,
unconfigured, and so check differences rather than absolute figures."""

import builtins
import ctypes
import os
import subprocess
import sys
import threading

import pytest

import xseg
from xseg import _lib
from conftest import CAPACITY, MiB, child_env, header_version, last_json

GiB = 1 << 30


def stats():
    return _lib.flatten(_lib.raw_stats(0))


# --- the library and the package ---

def test_version_matches_header():
    v = xseg.version()
    assert v == _lib.version()
    want = header_version()
    if want is not None:
        assert v == want, "libxseg's version differs from XSEG_VERSION in cmd/libxseg/xseg.h"
    assert v == xseg.__version__, "xseg.__version__ differs from the library's version"


def test_loaded_library_is_the_one_under_test(lib_path):
    assert _lib.loaded() is _lib.load()
    assert _lib.library_path() == lib_path
    assert os.environ["XSEG_LIB"] == lib_path


def test_package_finds_its_own_library(monkeypatch):
    packaged = os.path.join(os.path.dirname(os.path.abspath(xseg.__file__)), "libxseg.so")
    if not os.path.isfile(packaged):
        pytest.skip("this xseg package ships no libxseg.so (a source tree, not a wheel)")
    monkeypatch.delenv("XSEG_LIB", raising=False)
    assert xseg.find_library() == packaged


def test_find_library_errors(monkeypatch, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        xseg.find_library(str(tmp_path / "libxseg.so"))
    monkeypatch.setenv("XSEG_LIB", str(tmp_path / "nothing.so"))
    with pytest.raises(FileNotFoundError):
        xseg.find_library()


def test_find_library_says_a_directory_is_one(monkeypatch, tmp_path):
    # Audit C, D6: XSEG_LIB=/tmp said "library /tmp does not exist".
    for find in (lambda: xseg.find_library(str(tmp_path)),
                 lambda: monkeypatch.setenv("XSEG_LIB", str(tmp_path)) or xseg.find_library()):
        with pytest.raises(FileNotFoundError, match="is a directory") as e:
            find()
        assert "does not exist" not in str(e.value)
        assert "did you mean" not in str(e.value)  # no libxseg.so in it to point at
    (tmp_path / "libxseg.so").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"is a directory.*did you mean .*libxseg\.so\?"):
        xseg.find_library(str(tmp_path))


def test_a_library_that_is_not_xseg_is_not_called_older():
    # Audit C, D6: XSEG_LIB=libm.so.6 said "... lacks xseg_malloc, ... (all
    # 42 names): it is older than this package".
    import ctypes.util
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        pytest.skip("no libm or libc to load")
    with pytest.raises(xseg.XsegError, match="is not an xseg library") as e:
        _lib._declare(ctypes.CDLL(name))
    assert "older" not in str(e.value) and "lacks" not in str(e.value), e.value

    class Partial:  # an xseg of an earlier version: some of the names
        _name = "/old/libxseg.so"
        xseg_malloc = xseg_free = object()
    with pytest.raises(xseg.XsegError, match="lacks .*xseg_malloc_at_most.*: it is older than this package") as e:
        _lib._declare(Partial())
    assert "xseg_malloc," not in str(e.value) and "xseg_free," not in str(e.value)


def test_load_is_once(libxseg, tmp_path):
    assert xseg.load() is libxseg
    with pytest.raises(xseg.XsegError, match="already loaded"):
        xseg.load(str(tmp_path / "libxseg.so"))


def test_star_import_shadows_no_builtin():
    ns = {}
    exec("from xseg import *", ns)
    names = set(ns) - {"__builtins__"}
    assert names, "from xseg import * imported nothing"
    assert not names & set(dir(builtins)), f"xseg's * shadows builtins: {sorted(names & set(dir(builtins)))}"
    assert names == set(xseg.__all__)


def test_all_is_defined():
    missing = [n for n in xseg.__all__ if not hasattr(xseg, n)]
    assert not missing, missing
    assert len(set(xseg.__all__)) == len(xseg.__all__)


def test_errors_are_exceptions():
    assert issubclass(xseg.XsegError, RuntimeError)
    assert issubclass(xseg.OutOfMemoryError, xseg.XsegError)
    assert issubclass(xseg.OutOfMemoryError, MemoryError)
    assert xseg.XsegError is _lib.XsegError and xseg.OutOfMemoryError is _lib.OutOfMemoryError


def test_import_needs_no_torch(run_py):
    proc = run_py("""
        print(json.dumps(["torch" in sys.modules, xseg.version()]))
    """)
    assert last_json(proc) == [False, _lib.version()]


# --- allocation ---

def test_malloc_gives_writable_host_memory():
    before = stats()
    n = 5 * MiB + 3
    p = xseg.malloc(n)
    q = xseg.malloc(4096)
    try:
        assert p and q and p != q
        ctypes.memset(p, 0x5A, n)
        assert ctypes.string_at(p, 4) == b"ZZZZ" and ctypes.string_at(p + n - 1, 1) == b"Z"
        ctypes.memmove(q, b"xseg" * 1024, 4096)
        ctypes.memmove(p + 100, q, 4096)
        assert ctypes.string_at(p + 100, 8) == b"xsegxseg"
        assert ctypes.string_at(p + 99, 1) == b"Z" and ctypes.string_at(p + 4196, 1) == b"Z"
        st = stats()
        assert st["allocation.all.current"] == before["allocation.all.current"] + 2
        assert st["requested_bytes.all.current"] == before["requested_bytes.all.current"] + n + 4096
        assert st["allocated_bytes.all.current"] >= before["allocated_bytes.all.current"] + n + 4096
    finally:
        xseg.free(p)
        xseg.free(q)
    after = stats()
    assert after["allocation.all.current"] == before["allocation.all.current"]
    assert after["allocated_bytes.all.current"] == before["allocated_bytes.all.current"]


def test_malloc_zero_and_free_null():
    assert xseg.malloc(0) == 0
    xseg.free(0)  # nothing to do


def test_malloc_negative_size():
    with pytest.raises(ValueError, match="negative"):
        xseg.malloc(-1)


def test_free_of_a_bad_pointer_raises():
    with pytest.raises(xseg.XsegError) as e:
        xseg.free(0x7F0000002000)
    assert "xseg_free_block" in str(e.value)
    assert "xseg_free_block" in xseg.last_error()


def test_double_free_raises():
    p = xseg.malloc(1000)
    xseg.free(p)
    with pytest.raises(xseg.XsegError, match="not allocated"):
        xseg.free(p)


def test_out_of_memory_beyond_capacity():
    before = stats()["num_ooms"]
    with pytest.raises(xseg.OutOfMemoryError) as e:
        xseg.malloc(2 * CAPACITY)
    assert "out of memory" in str(e.value)
    assert isinstance(e.value, MemoryError) and isinstance(e.value, xseg.XsegError)
    assert stats()["num_ooms"] == before + 1
    p = xseg.malloc(MiB)  # the library goes on working
    xseg.free(p)


def test_malloc_at_most_argument_errors():
    for mx, mn in ((1, 2), (10, 0), (0, 0), (10, -1), (2 ** 64, 2 ** 62 + 1), (2 ** 65, 2 ** 64)):
        with pytest.raises(ValueError):
            xseg.malloc_at_most(mx, mn)


def test_malloc_at_most_as_much_as_possible(run_py):
    # Audit C, D5: max_bytes above 2**62 was refused ("need 0 < min <= max
    # <= 2^62"), undocumented; it is taken as 2**62, so that a huge max
    # asks for as much as there is.
    got = last_json(run_py("""
        out = []
        for mx in (2 ** 62, 2 ** 62 + 1, 2 ** 63, 2 ** 64, 2 ** 100):
            p, n = xseg.malloc_at_most(mx, MiB)
            ctypes.memset(p, 7, n)
            xseg.free(p)
            out.append(n)
        print(json.dumps(out))
    """))
    for n in got:
        assert MiB <= n <= CAPACITY, got
    assert "2**62" in xseg.malloc_at_most.__doc__


def test_malloc_at_most_without_pressure():
    p, n = xseg.malloc_at_most(8 * MiB, MiB)
    try:
        assert p and n == 8 * MiB
        ctypes.memset(p, 1, n)
    finally:
        xseg.free(p)


def test_record_stream():
    p = xseg.malloc(1000)
    try:
        assert xseg.record_stream(p, 0) is True
    finally:
        xseg.free(p)
    assert xseg.record_stream(0x10000, 0) is False


def test_bad_devices_raise():
    with pytest.raises(xseg.XsegError, match="device 9"):
        _lib.raw_stats(9)
    with pytest.raises(xseg.XsegError):
        _lib.empty_cache(-7)
    with pytest.raises(xseg.XsegError):
        xseg.memory_fraction(9)
    with pytest.raises(ValueError):
        xseg.set_memory_fraction(1.5, 0)
    with pytest.raises(ValueError):
        xseg.set_memory_fraction(-0.1, 0)


class _Index:
    """An integer of another type (numpy's, torch's): it has __index__."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return self.v


def test_integer_arguments_are_checked_not_wrapped():
    # ctypes alone would wrap these (device 2**32 is device 0, size 2**64
    # is size 0) or truncate a float: every call checks first, and the
    # library is never reached (its last error does not change).
    before = xseg.last_error()
    bad = [
        (lambda: xseg.malloc(1.5), TypeError, "size must be an integer, not float"),
        (lambda: xseg.malloc(2 ** 64), OverflowError, "argument 1"),
        (lambda: xseg.malloc(10, device=2 ** 32), OverflowError, "argument 2"),
        (lambda: xseg.malloc(10, device=0.0), TypeError, "argument 2"),
        (lambda: xseg.malloc(10, stream=-1), OverflowError, "argument 3"),
        (lambda: xseg.malloc(10, stream=2 ** 64), OverflowError, "argument 3"),
        (lambda: xseg.malloc(10, stream=1.0), TypeError, "argument 3"),
        (lambda: xseg.malloc(10, stream="0x1"), TypeError, "argument 3 must be an integer, not str"),
        (lambda: xseg.record_stream(0x1000, b"s"), TypeError, "argument 2 must be an integer, not bytes"),
        (lambda: xseg.free("0x1000"), TypeError, "argument 1 must be an integer, not str"),
        (lambda: xseg.free(2 ** 64), OverflowError, "argument 1"),
        (lambda: xseg.free(1.5), TypeError, "argument 1"),
        (lambda: xseg.malloc_at_most(MiB, 1, device=2 ** 32), OverflowError, "argument 3"),
        (lambda: xseg.malloc_at_most(4096.0, 1), TypeError, "max_bytes must be an integer"),
        (lambda: _lib.malloc_in_pool(1.0, (1, 1)), TypeError, "size must be an integer"),
        (lambda: _lib.raw_stats(2 ** 31), OverflowError, "argument 1"),
        (lambda: _lib.empty_cache(-(2 ** 31) - 1), OverflowError, "argument 1"),
        (lambda: _lib.record_history(0, 2 ** 64), OverflowError, "argument 2"),
        (lambda: _lib.pool_retain(0, (2 ** 64, 0)), OverflowError, "argument 2"),
        (lambda: xseg.load().xseg_malloc(1.5, 0, None), TypeError, "xseg_malloc argument 1"),
        (lambda: xseg.load().xseg_free_block(0x1000, "0"), TypeError, "xseg_free_block argument 2"),
    ]
    for call, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            call()
    assert xseg.last_error() == before
    p = xseg.malloc(_Index(4096), device=_Index(0))  # integers of other types pass
    try:
        assert p
    finally:
        xseg.free(_Index(p))


def test_bool_is_no_device_or_integer():
    # Audit C, D6: xseg.malloc(100, device=True) was device 1, while
    # xseg.stats(True) and the other functions that take a device raise
    # TypeError for a bool.
    before = xseg.last_error()
    for call in (lambda: xseg.malloc(100, device=True), lambda: xseg.malloc(100, False),
                 lambda: xseg.malloc_at_most(MiB, 1, device=True), lambda: xseg.malloc_in_pool(100, (1, 1), True),
                 lambda: xseg.free(0x1000, device=True), lambda: xseg.cache_info(False),
                 lambda: xseg.memory_fraction(True), lambda: xseg.share_block(0x1000, True)):
        with pytest.raises(TypeError, match="must be an integer, not bool"):
            call()
    with pytest.raises(TypeError, match="malloc's size must be an integer, not bool"):
        xseg.malloc(True)
    assert xseg.last_error() == before  # none of them reached the library


class _HasIndex:
    """A device of torch.device's shape: an ``index`` attribute."""

    def __init__(self, index):
        self.index = index


def test_device_arguments_are_checked():
    # The functions that take PyTorch's device argument map None to the
    # current device (0 without torch) and accept ints, integers of other
    # types (__index__: numpy's) and torch.device-like objects; anything
    # else raises TypeError naming the argument, instead of meaning
    # device 0.
    from xseg._torch import _device
    assert [_device(d) for d in (None, 0, 1, 7, _Index(1), _HasIndex(1), _HasIndex(_Index(2)), _HasIndex(None))] \
        == [0, 0, 1, 7, 1, 1, 2, 0]
    assert xseg.stats()["device"] == 0 and xseg.stats(None)["device"] == 0
    assert xseg.stats(_Index(0))["device"] == 0 and xseg.stats(_HasIndex(0))["device"] == 0
    assert xseg.memory_allocated(_Index(0)) == xseg.memory_allocated(0)
    bad = [1.5, 2.0, [1], (1,), True, False, b"1", object(), _HasIndex(1.0), _HasIndex(True)]
    for arg in bad:
        with pytest.raises(TypeError, match="device argument") as e:
            xseg.stats(arg)
        assert type(arg).__name__ in str(e.value) or type(arg.index).__name__ in str(e.value)
    with pytest.raises(TypeError, match="device argument.*not float"):
        xseg.memory_allocated(2.0)
    with pytest.raises(TypeError, match="device argument.*not list"):
        xseg.tag_stats("t", [0])
    with pytest.raises(ValueError, match="negative"):
        xseg.stats(_Index(-1))
    with pytest.raises(ValueError, match="negative"):
        xseg.stats(_HasIndex(-1))


def test_pool_ids_are_pairs():
    before = xseg.last_error()
    for call in (lambda pool: xseg.pool_retain(0, pool), lambda pool: xseg.pool_release(0, pool),
                 lambda pool: xseg.pool_allocations(pool, 0), lambda pool: _lib.malloc_in_pool(4096, pool)):
        for pool in ((1,), (1, 2, 3), [], [7]):
            with pytest.raises(ValueError, match=r"pool id is a pair of integers \(first, second\), not \d values"):
                call(pool)
        for pool in (5, None, "ab", b"ab"):
            with pytest.raises(TypeError, match=r"pool id is a pair of integers \(first, second\), not "
                                                + type(pool).__name__):
                call(pool)
        with pytest.raises(TypeError, match="argument 2 must be an integer, not float|argument 4"):
            call((1.0, 2))
    assert xseg.last_error() == before  # none of them reached the library


def test_set_memory_fraction_reports_its_own_failure(run_py):
    # The setter is void in C: its failure is the thread's error, which the
    # read-back's failure must not hide; a stale one must not fail a good
    # call. (A process of its own: the fraction set stays.)
    got = last_json(run_py("""
        out = []
        for dev in (9, 9):  # the same failure again is reported again
            try:
                xseg.set_memory_fraction(0.3, dev)
                out.append("no error")
            except xseg.XsegError as e:
                out.append(str(e))
        xseg.set_memory_fraction(0.5, 0)
        out.append(xseg.memory_fraction(0))
        print(json.dumps(out))
    """))
    for msg in got[:2]:
        assert msg.startswith("xseg: set_memory_fraction(0.3, 9) failed: xseg_set_memory_fraction: device 9"), got
        assert "xseg_memory_fraction:" not in msg, got
    assert got[2] == 0.5, got


def test_strings_with_nul_raise():
    with pytest.raises(ValueError, match="NUL"):
        xseg.configure("oom_max_retries:1\0,shareable:true")
    with pytest.raises(ValueError, match="NUL"):
        xseg.set_log_level("off\0debug")


def test_set_log_level():
    for level in ("error", "warn", "off"):
        xseg.set_log_level(level)
    with pytest.raises(ValueError, match="loud"):
        xseg.set_log_level("loud")


def test_snapshot_shows_a_block():
    p = xseg.malloc(3 * MiB)
    try:
        snap = _lib.raw_snapshot(0)
        blocks = [b for seg in snap["segments"] for b in seg["blocks"]]
        mine = [b for b in blocks if b["ptr"] == p]
        assert len(mine) == 1 and mine[0]["state"] == "allocated" and mine[0]["requested"] == 3 * MiB, mine
    finally:
        xseg.free(p)


def test_pools():
    pool = (7, 8)
    xseg.pool_retain(0, pool)
    try:
        assert xseg.pool_allocations(pool, 0) == []
        lib = xseg.load()
        p = lib.xseg_malloc_in_pool(4096, 0, None, *pool)
        assert p, xseg.last_error()
        assert xseg.pool_allocations(pool, 0) == [p]
        xseg.free(p)
        assert xseg.pool_allocations(pool, 0) == []
    finally:
        xseg.pool_release(0, pool)
    with pytest.raises(xseg.XsegError):
        xseg.pool_allocations(pool, 0)
    with pytest.raises(xseg.XsegError, match="no use"):
        xseg.pool_release(0, pool)


def test_concurrent_malloc_free_from_8_threads():
    before = stats()["allocation.all.current"]
    errors = []
    barrier = threading.Barrier(8)

    def work(k):
        try:
            barrier.wait()
            held = []
            for i in range(200):
                n = 512 + ((i * 7919 + k * 104729) % (2 * MiB))
                p = xseg.malloc(n)
                ctypes.memset(p, k, n)
                held.append((p, n))
                if len(held) > 4:
                    q, m = held.pop(0)
                    # Nobody else wrote into this block while it was ours.
                    assert ctypes.string_at(q, 1) == bytes([k]) and ctypes.string_at(q + m - 1, 1) == bytes([k])
                    xseg.free(q)
            for q, m in held:
                assert ctypes.string_at(q + m // 2, 1) == bytes([k])
                xseg.free(q)
        except BaseException as e:  # reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=work, args=(k + 1,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert stats()["allocation.all.current"] == before


def test_each_thread_gets_its_own_failure():
    # Two threads fail differently at once: each exception names its own
    # call's reason and has its type (xseg_thread_error), where the
    # process-wide last error would often be the other thread's.
    errors = []
    barrier = threading.Barrier(2)

    def oom():
        barrier.wait()
        for _ in range(3000):
            try:
                xseg.malloc(2 * CAPACITY)
                errors.append("2 x capacity allocated")
            except xseg.OutOfMemoryError as e:
                if "out of memory" not in str(e):
                    errors.append(f"oom thread: {e}")
            except BaseException as e:
                errors.append(f"oom thread: {type(e).__name__}: {e}")

    def bad_free():
        barrier.wait()
        for _ in range(3000):
            try:
                xseg.free(0x7F0000002000)
                errors.append("a bad free passed")
            except xseg.OutOfMemoryError as e:
                errors.append(f"free thread got an OOM: {e}")
            except xseg.XsegError as e:
                if "xseg_free_block" not in str(e):
                    errors.append(f"free thread: {e}")

    ts = [threading.Thread(target=oom), threading.Thread(target=bad_free)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors[:3]


# --- a fresh library in a subprocess ---

STATS_KEYS = [
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "allocated_bytes.all.allocated",
    "allocated_bytes.all.freed", "allocated_bytes.large_pool.current", "allocated_bytes.small_pool.current",
    "reserved_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.all.current",
    "requested_bytes.all.current", "allocation.all.current", "allocation.all.peak", "active.all.current",
    "segment.all.current", "segment.all.peak", "num_alloc_retries", "num_ooms", "device_total_bytes",
    "device_free_bytes", "memory_limit_bytes",
]


def test_stats_keys_and_values(run_py):
    # The classic policy has a small and a large pool, whose counters this
    # checks apart (the default has one pool of 2 MiB pages a stream).
    proc = run_py(env={"XSEG_CONF": "policy:classic"}, code="""
        out = {"fresh": stats()}
        p = xseg.malloc(5 * MiB)
        q = xseg.malloc(100)
        out["two"] = stats()
        xseg.free(p)
        xseg.free(q)
        out["freed"] = stats()
        _lib.empty_cache()
        out["emptied"] = stats()
        print(json.dumps(out))
    """)
    out = last_json(proc)
    fresh, two, freed, emptied = out["fresh"], out["two"], out["freed"], out["emptied"]
    for key in STATS_KEYS:
        assert key in fresh, f"missing stats key {key}"
    assert all(v == 0 for k, v in fresh.items() if k.split(".")[0] not in ("device", "device_total_bytes",
                                                                            "device_free_bytes")), fresh
    assert two["allocation.all.current"] == 2 and two["allocation.large_pool.current"] == 1
    assert two["allocation.small_pool.current"] == 1
    assert two["requested_bytes.all.current"] == 5 * MiB + 100
    assert two["allocated_bytes.large_pool.current"] == 5 * MiB
    assert 100 <= two["allocated_bytes.small_pool.current"] <= 4096  # rounded up to whole units
    assert two["allocated_bytes.all.current"] == (two["allocated_bytes.large_pool.current"]
                                                  + two["allocated_bytes.small_pool.current"])
    assert two["active_bytes.all.current"] == two["allocated_bytes.all.current"]
    assert two["reserved_bytes.all.current"] >= two["allocated_bytes.all.current"]
    assert two["reserved_bytes.all.peak"] == two["reserved_bytes.all.current"]
    assert two["segment.all.current"] >= 1
    assert two["device_total_bytes"] == 1 << 30
    assert two["device_free_bytes"] == (1 << 30) - two["reserved_bytes.all.current"]

    assert freed["allocation.all.current"] == 0 and freed["allocated_bytes.all.current"] == 0
    assert freed["allocation.all.peak"] == 2 and freed["allocated_bytes.all.peak"] == two["allocated_bytes.all.current"]
    assert freed["allocation.all.allocated"] == 2 and freed["allocation.all.freed"] == 2
    assert freed["allocated_bytes.all.freed"] == freed["allocated_bytes.all.allocated"]
    assert freed["reserved_bytes.all.current"] == two["reserved_bytes.all.current"], "freeing keeps the cache"
    assert emptied["reserved_bytes.all.current"] == 0
    assert emptied["reserved_bytes.all.peak"] == two["reserved_bytes.all.peak"]


def test_configure_errors_and_success(run_py):
    proc = run_py("""
        out = {}
        for conf in ("no_such_key:3", "oom_max_retries:abc"):
            try:
                xseg.configure(conf)
                out[conf] = "accepted"
            except ValueError as e:
                out[conf] = "ValueError: " + str(e)
        xseg.configure("oom_max_retries:0,shareable:true")
        p = xseg.malloc(MiB)
        out["shared"] = len(xseg.share_block(p)) > 0
        try:
            xseg.configure("oom_max_retries:2")
            out["late"] = "accepted"
        except Exception as e:
            out["late"] = type(e).__name__ + ": " + str(e)
        print(json.dumps(out))
    """)
    out = last_json(proc)
    assert out["no_such_key:3"].startswith("ValueError") and "no_such_key" in out["no_such_key:3"], out
    assert out["oom_max_retries:abc"].startswith("ValueError") and "oom_max_retries" in out["oom_max_retries:abc"]
    assert out["shared"] is True, "the configuration given before the first allocation applies"
    assert out["late"].startswith("XsegError: "), f"configure after the first allocation: {out['late']}"


@pytest.mark.parametrize("conf,moves", [("policy:steady", False), ("", True)])
def test_policy_steady_leaves_free_pages_in_place(run_py, conf, moves):
    # A growth past a freed block: the default moves its pages to where the
    # heap grows, policy:steady makes new ones and leaves them mapped.
    proc = run_py("""
        p, q = xseg.malloc(40 * MiB), xseg.malloc(2 * MiB)
        xseg.free(p)
        r = xseg.malloc(60 * MiB)
        out = {k: stats()[k] for k in ("num_unmaps", "reserved_bytes.all.current")}
        xseg.free(q)
        xseg.free(r)
        print(json.dumps(out))
    """, env={"XSEG_CONF": conf})
    out = last_json(proc)
    assert (out["num_unmaps"] > 0) == moves, out
    if not moves:
        assert out["reserved_bytes.all.current"] == 102 * MiB, out


def test_unknown_policy_is_refused(run_py):
    proc = run_py("""
        try:
            xseg.configure("policy:Steady")
            print(json.dumps("accepted"))
        except ValueError as e:
            print(json.dumps(str(e)))
    """)
    out = last_json(proc)
    assert "not a policy" in out and "steady" in out, out


@pytest.mark.parametrize("value,error", [("yes", "not a boolean"), ("", "not a boolean"), ("2", "not a boolean"), ("1", None)])
def test_settle_chains_takes_a_boolean(run_py, value, error):
    # settle_chains (issue 17, round 46) is parsed as every boolean key:
    # anything but true/false/1/0 is refused with the key named, and
    # nothing is allocated or configured by the refusal.
    proc = run_py(f"""
        try:
            xseg.configure("settle_chains:{value}")
            p = xseg.malloc(3 * MiB)
            xseg.free(p)
            print(json.dumps("accepted"))
        except ValueError as e:
            print(json.dumps(str(e) + " | reserved " + str(stats()["reserved_bytes.all.current"])))
    """)
    out = last_json(proc)
    if error is None:
        assert out == "accepted", out
    else:
        assert "settle_chains" in out and error in out and out.endswith("| reserved 0"), out


def test_bad_XSEG_CONF_fails_the_first_allocation(run_py):
    proc = run_py("""
        try:
            xseg.malloc(1)
            print(json.dumps("allocated"))
        except xseg.XsegError as e:
            print(json.dumps(str(e)))
    """, env={"XSEG_CONF": "no_such_key:1"})
    assert "no_such_key" in last_json(proc)


def test_oom_counts_and_reset_accumulated(run_py):
    proc = run_py("""
        out = {}
        p = xseg.malloc(200 * MiB)
        xseg.free(p)
        try:
            xseg.malloc(2 << 30)
            out["oom"] = None
        except xseg.OutOfMemoryError as e:
            out["oom"] = str(e)
        out["before"] = stats()
        xseg.reset_accumulated_stats()
        out["after"] = stats()
        print(json.dumps(out))
    """)
    out = last_json(proc)
    assert out["oom"] and "out of memory" in out["oom"]
    before, after = out["before"], out["after"]
    assert before["num_ooms"] == 1 and before["allocation.all.allocated"] == 1
    assert before["allocated_bytes.all.allocated"] == 200 * MiB
    for key in ("num_ooms", "num_alloc_retries", "allocation.all.allocated", "allocation.all.freed",
                "allocated_bytes.all.allocated", "allocated_bytes.all.freed", "requested_bytes.all.allocated",
                "segment.all.allocated"):
        assert after[key] == 0, key
    # Current values and peaks are not accumulated counts.
    assert after["reserved_bytes.all.current"] == before["reserved_bytes.all.current"] > 0
    assert after["allocated_bytes.all.peak"] == before["allocated_bytes.all.peak"] == 200 * MiB


def test_reset_peak_stats(run_py):
    proc = run_py("""
        p = xseg.malloc(64 * MiB)
        q = xseg.malloc(MiB)
        xseg.free(p)
        before = stats()
        xseg.reset_peak_stats()
        after = stats()
        print(json.dumps([before, after]))
    """)
    before, after = last_json(proc)
    assert before["allocated_bytes.all.peak"] >= 65 * MiB
    for kind in ("allocated_bytes", "reserved_bytes", "active_bytes", "requested_bytes", "allocation", "segment"):
        assert after[kind + ".all.peak"] == after[kind + ".all.current"], kind
    assert after["allocated_bytes.all.peak"] == MiB


def test_malloc_at_most_under_capacity_pressure(run_py):
    proc = run_py("""
        hold = xseg.malloc(900 * MiB)
        p, n = xseg.malloc_at_most(512 * MiB, MiB)
        ctypes.memset(p, 3, n)
        out = {"n": n, "ooms": stats()["num_ooms"]}
        try:
            xseg.malloc_at_most(512 * MiB, 400 * MiB)
            out["too_big"] = None
        except xseg.OutOfMemoryError as e:
            out["too_big"] = str(e)
        print(json.dumps(out))
    """)
    out = last_json(proc)
    assert MiB <= out["n"] < 512 * MiB, out
    assert out["n"] <= (1 << 30) - 900 * MiB
    assert out["too_big"] and "out of memory" in out["too_big"], out


def test_memory_fraction_limits_growth(run_py):
    proc = run_py("""
        out = {}
        out["initial"] = xseg.memory_fraction(0)
        xseg.set_memory_fraction(0.25, 0)
        out["set"] = xseg.memory_fraction(0)
        out["limit_bytes"] = stats()["memory_limit_bytes"]
        p = xseg.malloc(200 * MiB)
        try:
            xseg.malloc(100 * MiB)
            out["over"] = None
        except xseg.OutOfMemoryError as e:
            out["over"] = str(e)
        xseg.set_memory_fraction(1.0, 0)
        out["raised"] = xseg.memory_fraction(0)
        q = xseg.malloc(100 * MiB)
        ctypes.memset(q, 9, 100 * MiB)
        out["after"] = stats()["allocated_bytes.all.current"]
        print(json.dumps(out))
    """)
    out = last_json(proc)
    assert out["initial"] == 0.0
    assert out["set"] == 0.25
    assert out["limit_bytes"] == 256 * MiB
    assert out["over"] is not None, "an allocation past the 256 MiB limit succeeded"
    assert "out of memory" in out["over"] and "limit" in out["over"], out["over"]
    assert out["raised"] == 1.0
    assert out["after"] == 300 * MiB


def test_cache_info(run_py):
    proc = run_py("""
        out = {"empty": xseg.cache_info(0)}
        p = xseg.malloc(64 * MiB)
        out["in_use"] = xseg.cache_info(0)
        xseg.set_memory_fraction(0.125, 0)
        out["limited"] = xseg.cache_info(0)
        xseg.set_memory_fraction(1.0, 0)
        xseg.free(p)
        out["freed"] = xseg.cache_info(0)
        for bad in (1, -1, 2**31):
            try:
                xseg.cache_info(bad)
                out[str(bad)] = None
            except (xseg.XsegError, OverflowError) as e:
                out[str(bad)] = type(e).__name__ + ": " + str(e)
        try:
            xseg.cache_info(0.5)
        except TypeError as e:
            out["float"] = str(e)
        lib = xseg.load()
        out["route"] = lib.xseg_torch_route_cache_info()
        out["route_reason"] = xseg.thread_error()
        print(json.dumps(out))
    """)
    out = last_json(proc)
    total = out["empty"]
    assert total >= 512 * MiB, out
    assert out["in_use"] == total - 64 * MiB
    assert out["limited"] == total // 8 - 64 * MiB, "the limit less the bytes in use"
    assert out["freed"] == total
    assert out["1"] and "XsegError" in out["1"] and "device 1" in out["1"], out
    assert out["-1"] and "XsegError" in out["-1"], out
    assert out["2147483648"] and "OverflowError" in out["2147483648"], out
    assert "float" in out
    assert out["route"] == -1 and "not among the loaded libraries" in out["route_reason"], out


def test_memory_fraction_zero_allows_no_growth(run_py):
    # A fraction of 0 is a limit of 0 bytes, not "no limit": the stats say
    # a limit is set, cache_info (cuDNN's workspace bound) offers nothing
    # and torch.cuda.get_per_process_memory_fraction reads 0.0, as under
    # PyTorch's own allocator; with no limit it reads 1.0.
    proc = run_py("""
        from xseg import _torch
        out = {"none": [_torch._fraction_or_one(0), xseg.stats()["memory_limit_set"]]}
        xseg.set_memory_fraction(0.0, 0)
        out["zero"] = [_torch._fraction_or_one(0), xseg.stats()["memory_limit_set"], xseg.cache_info(0)]
        try:
            xseg.malloc(MiB)
            out["err"] = None
        except xseg.OutOfMemoryError as e:
            out["err"] = str(e)
        print(json.dumps(out))
    """)
    out = last_json(proc)
    assert "limit" in (out["err"] or "")
    assert out["none"] == [1.0, False]
    assert out["zero"] == [0.0, True, 0]


def test_history_records_allocations(run_py):
    proc = run_py("""
        xseg.record_history(0, 1000)
        p = xseg.malloc(3 * MiB)
        xseg.free(p)
        _lib.empty_cache()
        h = xseg.history(0)
        xseg.record_history(0, 0)
        print(json.dumps({"p": p, "h": h, "stopped": xseg.history(0)}))
    """)
    out = last_json(proc)
    h, p = out["h"], out["p"]
    actions = [e["action"] for e in h]
    for want in ("alloc", "free_requested", "free_completed", "segment_map", "segment_unmap"):
        assert want in actions, (want, actions)
    assert actions.index("alloc") < actions.index("free_requested") <= actions.index("free_completed")
    alloc = h[actions.index("alloc")]
    assert alloc["addr"] == p and alloc["size"] >= 3 * MiB
    for key in ("action", "addr", "size", "stream", "time_us", "device_free"):
        assert key in alloc, key
    times = [e["time_us"] for e in h]
    assert times == sorted(times), "oldest first"
    assert out["stopped"] == []


def test_history_keeps_the_last_entries(run_py):
    proc = run_py("""
        xseg.record_history(0, 5)
        for _ in range(10):
            xseg.free(xseg.malloc(4096))
        print(json.dumps(xseg.history(0)))
    """)
    h = last_json(proc)
    assert len(h) == 5, h
    assert {e["action"] for e in h} <= {"alloc", "free_requested", "free_completed", "segment_map"}


def _launch(tmp_path, *args, extra_path=None):
    env = child_env()
    if extra_path:
        env["PYTHONPATH"] = os.pathsep.join([extra_path, env["PYTHONPATH"]])
    return subprocess.run([sys.executable, "-m", "xseg", *args], cwd=str(tmp_path), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True, timeout=120)


def test_launcher_refuses_bad_command_lines(tmp_path):
    p = _launch(tmp_path)
    assert p.returncode == 2 and "a script or -m MODULE is needed" in p.stderr, p.stderr
    p = _launch(tmp_path, "no_such_script.py", "--x")
    assert p.returncode == 2 and "no such script: no_such_script.py" in p.stderr, p.stderr
    (tmp_path / "s.py").write_text("print('ran')\n")
    p = _launch(tmp_path, "--log", "loud", "s.py")
    assert p.returncode == 2 and "invalid choice: 'loud'" in p.stderr, p.stderr
    p = _launch(tmp_path, "--help")
    assert p.returncode == 0 and "python3 -m xseg" in p.stdout and "--conf" in p.stdout
    assert "ran" not in p.stdout + p.stderr


def test_launcher_needs_torch_and_runs_nothing_without_it(tmp_path):
    # A torch that cannot be imported stands in for a machine without one.
    fake = tmp_path / "fake"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("raise ImportError('no torch on this machine')\n")
    (tmp_path / "s.py").write_text("print('ran')\n")
    p = _launch(tmp_path, "s.py", extra_path=str(fake))
    assert p.returncode == 1, (p.stdout, p.stderr)
    assert "xseg: PyTorch is needed to install xseg as its allocator: no torch on this machine" in p.stderr
    assert "ran" not in p.stdout


def test_native_ipc_handles_are_parsed_strictly():
    # PyTorch's shareIpcHandle: 64 raw bytes (older PyTorch), or a version
    # byte, a type byte and the 64 bytes of a cudaMalloc block's handle.
    from xseg import _nativeipc
    h = bytes(range(64))
    assert _nativeipc.parse_handle(h) == h
    assert _nativeipc.parse_handle(bytearray(h)) == h
    assert _nativeipc.parse_handle(b"\x02c" + h) == h
    assert _nativeipc.parse_handle(b"\x01c" + h) == h
    with pytest.raises(xseg.XsegError, match="expandable segments.*install xseg in that process"):
        _nativeipc.parse_handle(b"\x02e" + b"\x00" * 40)
    with pytest.raises(xseg.XsegError, match="newer than"):
        _nativeipc.parse_handle(b"\x03c" + h)
    for bad in (b"", b"\x02", b"\x02c" + h[:63], b"\x02c" + h + b"!", b"\x02x" + h, h[:63]):
        with pytest.raises(xseg.XsegError):
            _nativeipc.parse_handle(bad)
    for bad in (None, "c" * 66, 64, memoryview(h)):
        with pytest.raises(TypeError):
            _nativeipc.parse_handle(bad)
    # Every byte reaches the driver's struct, NULs and what follows them
    # included (ctypes' own char-array fill stops at the first NUL).
    raw = bytes([7, 0, 0, 9]) + bytes(range(1, 61))
    assert bytes(_nativeipc.handle_struct(raw)) == raw
    with pytest.raises(ValueError):
        _nativeipc.handle_struct(raw[:63])
    with pytest.raises(TypeError, match="8 values"):
        _nativeipc.new_shared_cuda(0, h)
    assert _nativeipc.opened() == 0


def test_native_ipc_opens_a_handle_once_and_closes_after_its_last_storage(monkeypatch):
    # The driver stands in: one open per handle and device however many
    # storages, one close after the last; a failed open leaves nothing.
    from xseg import _nativeipc
    calls = []

    class Driver:
        rc = 0

        def ensure_context(self, device):
            calls.append(("ctx", device))

        def open(self, pptr, handle, flags):
            calls.append(("open", bytes(handle), flags))
            if self.rc:
                return self.rc
            pptr._obj.value = 0x7000 + len(calls)
            return 0

        def close(self, ptr):
            calls.append(("close", ptr))
            return 0

        def error(self, rc):
            return f"E{rc}"

    d = Driver()
    monkeypatch.setattr(_nativeipc, "_driver_obj", [d])
    monkeypatch.setattr(_nativeipc, "_opened", {})
    raw, other = bytes(range(64)), bytes(range(1, 65))
    p = _nativeipc._open(raw, 0)
    assert _nativeipc._open(raw, 0) == p and _nativeipc.opened() == 1
    assert [c[0] for c in calls].count("open") == 1 and calls[1] == ("open", raw, 1)
    q = _nativeipc._open(raw, 1)  # another device: its own open
    assert q != p and _nativeipc.opened() == 2
    _nativeipc._close(raw, 0)
    assert not [c for c in calls if c[0] == "close"]
    _nativeipc._close(raw, 0)
    assert [c for c in calls if c[0] == "close"] == [("close", p)] and _nativeipc.opened() == 1
    _nativeipc._close(raw, 0)  # once more: nothing left to close
    _nativeipc._close(raw, 1)
    assert _nativeipc.opened() == 0
    d.rc = 201
    with pytest.raises(xseg.XsegError, match="E201"):
        _nativeipc._open(other, 0)
    assert _nativeipc.opened() == 0


def _fake_torch(log, as_tensor_error=None, event_error=None):
    """Just enough of torch for xseg._nativeipc.new_shared_cuda, recording
    what it is asked to do."""
    import contextlib
    import types

    class Stream:
        def __init__(self, dev):
            self.dev = dev

        def wait_event(self, ev):
            if event_error:
                raise event_error
            log.append(("wait_event", self.dev))

        def synchronize(self):
            log.append(("sync", self.dev))

    class Storage:
        @staticmethod
        def _release_ipc_counter_cuda(handle, offset):
            log.append(("release_counter", handle, offset))

    class Tensor:
        def __init__(self, held):
            self.held = held

        def untyped_storage(self):
            return self

    def as_tensor(held, device=None):
        if as_tensor_error:
            raise as_tensor_error
        return Tensor(held)

    cuda = types.SimpleNamespace(
        device=lambda d: contextlib.nullcontext(),
        current_stream=lambda d: Stream(d),
        Event=types.SimpleNamespace(from_ipc_handle=lambda d, h: ("event", d, h)))
    return types.SimpleNamespace(cuda=cuda, as_tensor=as_tensor, device=lambda kind, d: (kind, d),
                                 UntypedStorage=Storage)


class _StandInDriver:
    """The CUDA driver calls of xseg._nativeipc, failing where told."""

    def __init__(self, log):
        self.log, self.open_rc, self.close_rc, self.context_error = log, 0, 0, None

    def ensure_context(self, device):
        if self.context_error:
            raise self.context_error
        self.log.append(("ctx", device))

    def open(self, pptr, handle, flags):
        self.log.append(("open",))
        if self.open_rc:
            return self.open_rc
        pptr._obj.value = 0x9000
        return 0

    def close(self, ptr):
        self.log.append(("close", ptr))
        return self.close_rc

    def error(self, rc):
        return f"E{rc}"


def test_native_ipc_faults_leave_nothing_open(monkeypatch):
    # Each step of receiving a native producer's tensor fails in turn; the
    # undo closes what was opened and gives the producer's counter back,
    # and a failure before the open opens nothing.
    import gc
    from xseg import _nativeipc
    h = b"\x02c" + bytes(range(64))
    args = (0, h, 4096, 512, b"/torch_ref", 3, b"\x00" * 64, True)
    log = []
    d = _StandInDriver(log)
    monkeypatch.setattr(_nativeipc, "_driver_obj", [d])
    monkeypatch.setattr(_nativeipc, "_opened", {})

    # As it should go: the storage arrives; dropping it syncs, closes and
    # releases the counter, once.
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    st = _nativeipc.new_shared_cuda(*args)
    assert st.held.__cuda_array_interface__["data"] == (0x9000 + 512, False)
    assert st.held.__cuda_array_interface__["shape"] == (4096,)
    assert ("wait_event", 0) in log and _nativeipc.opened() == 1
    del st
    gc.collect()
    assert [e for e in log if e[0] in ("sync", "close", "release_counter")] == [
        ("sync", 0), ("close", 0x9000), ("release_counter", b"/torch_ref", 3)]
    assert _nativeipc.opened() == 0

    # Building the tensor fails after the open: undone.
    log.clear()
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log, as_tensor_error=RuntimeError("as_tensor")))
    with pytest.raises(RuntimeError, match="as_tensor"):
        _nativeipc.new_shared_cuda(*args)
    gc.collect()
    assert ("close", 0x9000) in log and ("release_counter", b"/torch_ref", 3) in log
    assert _nativeipc.opened() == 0

    # The producer's event cannot be waited for: nothing is opened.
    log.clear()
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log, event_error=RuntimeError("event")))
    with pytest.raises(RuntimeError, match="event"):
        _nativeipc.new_shared_cuda(*args)
    assert ("open",) not in log and _nativeipc.opened() == 0

    # No CUDA context can be made current, or the open fails: XsegError,
    # nothing opened.
    monkeypatch.setitem(sys.modules, "torch", _fake_torch(log))
    d.context_error = xseg.XsegError("xseg: making device 0's CUDA context current: E3")
    with pytest.raises(xseg.XsegError, match="context current"):
        _nativeipc.new_shared_cuda(*args)
    d.context_error = None
    d.open_rc = 1
    with pytest.raises(xseg.XsegError, match="E1"):
        _nativeipc.new_shared_cuda(*args)
    assert _nativeipc.opened() == 0

    # The close fails: a warning, the entry gone, the counter still given back.
    d.open_rc, d.close_rc = 0, 700
    log.clear()
    st = _nativeipc.new_shared_cuda(*args)
    del st
    gc.collect()
    assert ("close", 0x9000) in log and ("release_counter", b"/torch_ref", 3) in log
    assert _nativeipc.opened() == 0

    # Bad values from the pickle: refused before anything is opened.
    for bad, err in (((0, h, -1, 0, b"r", 0, b"e", False), ValueError),
                     ((0, h, 1, 0, "r", 0, b"e", False), TypeError),
                     ((0, b"\x02e" + b"\x00" * 8, 1, 0, b"r", 0, b"e", False), xseg.XsegError)):
        log.clear()
        with pytest.raises(err):
            _nativeipc.new_shared_cuda(*bad)
        assert ("open",) not in log
    assert _nativeipc.opened() == 0


def test_native_ipc_context_calls_fail_cleanly():
    # _Driver.ensure_context over stand-ins for the four driver calls: a
    # current context needs nothing more; each later call failing in turn
    # raises XsegError with the driver's name for the error.
    from xseg import _nativeipc
    calls = []

    def driver(current=0, fail=None):
        d = object.__new__(_nativeipc._Driver)

        def call(name, rc=0, set_to=None):
            def f(*a):
                calls.append(name)
                if set_to is not None:
                    a[0]._obj.value = set_to
                return 9 if fail == name else rc
            return f
        d.current = call("current", set_to=current)
        d.device = call("device", set_to=0)
        d.retain = call("retain", set_to=0x55)
        d.set_current = call("set_current")
        d._name = lambda rc, p: (setattr(p._obj, "value", b"CUDA_ERROR_NINE"), 0)[1]
        return d

    driver(current=0x77).ensure_context(0)
    assert calls == ["current"]
    calls.clear()
    driver().ensure_context(1)
    assert calls == ["current", "device", "retain", "set_current"]
    for step in ("device", "retain", "set_current"):
        calls.clear()
        with pytest.raises(xseg.XsegError, match="device 2's CUDA context current: CUDA_ERROR_NINE"):
            driver(fail=step).ensure_context(2)
        assert calls[-1] == step


def test_forked_child_is_refused():
    """A child forked after the library loaded gets an error that says why
    at its first call, instead of hanging in the Go runtime (libxseg's
    fork guard); the parent goes on."""
    xseg.load()
    r, w = os.pipe()
    import warnings
    with warnings.catch_warnings():  # Python 3.12 warns of fork with threads: the point here
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        os.close(r)
        code = 3
        try:
            import signal
            signal.alarm(20)
            try:
                xseg.malloc(4096)
                code = 1
            except xseg.XsegError as e:
                os.write(w, str(e).encode()[:4000])
                code = 0
            # The memory-limit and history functions refuse too (they
            # called into Go and hung, or answered from the parent's state).
            for call in (lambda: xseg.set_memory_fraction(0.5, 0), lambda: xseg.memory_fraction(0),
                         lambda: xseg.cache_info(0), lambda: xseg.record_history(0, 16),
                         lambda: xseg.history(0)):
                try:
                    call()
                    code = 4
                except xseg.XsegError as e:
                    if "forked" not in str(e):
                        code = 5
        finally:
            os._exit(code)
    os.close(w)
    msg = b""
    while chunk := os.read(r, 4096):
        msg += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (status, msg)
    assert b"forked" in msg and b"spawn" in msg, msg
    p = xseg.malloc(4096)
    assert p
    xseg.free(p)
