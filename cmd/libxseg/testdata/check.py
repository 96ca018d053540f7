"""A smoke test of libxseg.so through the Python package xseg of this source
tree (python/xseg), on the host backend, without torch. Usage: python3
check.py LIB, with XSEG_BACKEND=host and XSEG_HOST_CAPACITY=1073741824 in
the environment (TestCAPI's "Python" subtest). Prints "ok" or raises. The
real Python tests are python/tests (pytest)."""
import ctypes
import importlib.util
import os
import sys
import threading

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.normpath(os.path.join(here, "..", "..", "..", "python")))
import xseg  # noqa: E402

assert os.path.dirname(xseg.__file__).endswith(os.path.join("python", "xseg")), xseg.__file__

lib = xseg.load(sys.argv[1])
assert xseg.load() is lib, "load is once"
try:
    xseg.load("/nonexistent/libxseg.so")
    raise AssertionError("a second library path was accepted")
except xseg.XsegError:
    pass
assert xseg.version() == "0.1.0", xseg.version()
assert xseg.last_error() is None, xseg.last_error()

st = xseg.stats(0)
for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.large_pool.current",
            "requested_bytes.small_pool.allocated", "allocation.all.current", "segment.all.peak",
            "num_alloc_retries", "num_ooms"):
    assert key in st, f"missing stats key {key}"
assert st["allocated_bytes.all.current"] == 0

# Configure before the first allocation; a bad string is a ValueError naming the key.
try:
    xseg.configure("no_such_key:3")
    raise AssertionError("bad configuration accepted")
except ValueError as e:
    assert "no_such_key" in str(e), e
xseg.configure("oom_max_retries:1,shareable:true")
xseg.set_log_level("off")

MiB = 1 << 20
p = xseg.malloc(5 * MiB)
q = xseg.malloc(100)
assert p and q and p != q
ctypes.memset(p, 7, 5 * MiB)  # host backend: the block is real memory
assert ctypes.string_at(p + 5 * MiB - 1, 1) == b"\x07"
st = xseg.stats(0)
assert st["allocation.all.current"] == 2, st["allocation.all.current"]
assert st["requested_bytes.all.current"] == 5 * MiB + 100, st["requested_bytes.all.current"]
assert st["reserved_bytes.all.current"] >= 5 * MiB
assert xseg.record_stream(p, 0) is True and xseg.record_stream(0x10000, 0) is False

# Sharing: this process opens its own share (a second mapping of the pages).
desc = xseg.share_block(p)
with xseg.open_block(desc) as m:
    assert m.size == 5 * MiB and m.ptr != p
    assert ctypes.string_at(m.ptr, 4) == b"\x07" * 4
    ctypes.memset(m.ptr, 9, 4)
assert ctypes.string_at(p, 4) == b"\x09" * 4
xseg.unshare(desc)
try:
    xseg.open_block(b"garbage")
    raise AssertionError("opened garbage")
except xseg.XsegError:
    pass

xseg.free(p)
xseg.free(q)
assert xseg.stats(0)["allocated_bytes.all.current"] == 0

# Bad input raises, never crashes.
try:
    xseg.free(0x7F0000002000)
    raise AssertionError("freed a pointer xseg did not hand out")
except xseg.XsegError as e:
    assert "xseg_free" in str(e), e
try:
    xseg.malloc(-1)
    raise AssertionError("negative size accepted")
except ValueError:
    pass
try:
    xseg.malloc(4 << 30)
    raise AssertionError("allocated past the capacity")
except xseg.OutOfMemoryError as e:
    assert "out of memory" in str(e), e
assert xseg.stats(0)["num_ooms"] == 1

# Threads started by Python call in concurrently.
errors = []


def work():
    try:
        for i in range(300):
            xseg.free(xseg.malloc(1000 + i * 5000))
    except Exception as e:
        errors.append(e)


ts = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not errors, errors[:3]
assert xseg.stats(0)["allocation.all.current"] == 0

# install() needs torch; without it the error is an ImportError, not a crash.
if importlib.util.find_spec("torch") is None:
    try:
        xseg.install()
        raise AssertionError("install without torch")
    except ImportError:
        pass
print("ok")
