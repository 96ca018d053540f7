"""Exercise libxseg.so through python/xseg_torch.py with ctypes, on the host
backend, without torch. Usage: python3 check.py LIB. Prints "ok" or raises."""
import ctypes
import importlib.util
import os
import sys
import threading

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "xseg_torch", os.path.join(here, "..", "..", "..", "python", "xseg_torch.py"))
xt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(xt)

lib = xt.load(sys.argv[1])
assert xt.load() is lib, "load is once"
try:
    xt.load("/nonexistent/libxseg.so")
    raise AssertionError("a second library path was accepted")
except RuntimeError:
    pass
assert xt.version() == "0.1.0", xt.version()
assert xt.last_error() is None, xt.last_error()

st = xt.stats()
for key in ("allocated_bytes.all.current", "reserved_bytes.all.peak", "active_bytes.large_pool.current",
            "requested_bytes.small_pool.allocated", "allocation.all.current", "segment.all.peak",
            "num_alloc_retries", "num_ooms", "device_total_bytes"):
    assert key in st, f"missing stats key {key}"
assert st["allocated_bytes.all.current"] == 0 and xt.memory_total() == 0

# Configure before first use; a bad string is a ValueError naming the key.
try:
    xt._configure(lib, "no_such_key:3", False)
    raise AssertionError("bad configuration accepted")
except ValueError as e:
    assert "no_such_key" in str(e), e
xt._configure(lib, "oom_max_retries:1", "warn")
lib.xseg_set_log_level(b"off")

stream = ctypes.c_void_p(0)
p = lib.xseg_malloc(5 << 20, 0, stream)
q = lib.xseg_malloc(100, 0, stream)
assert p and q and p != q
ctypes.memset(p, 7, 5 << 20)  # host backend: the block is real memory
assert ctypes.string_at(p + (5 << 20) - 1, 1) == b"\x07"
assert xt.memory_used() >= (5 << 20) + 100, xt.memory_used()
assert xt.memory_reserved() >= 5 << 20
assert xt.memory_total() == 1 << 30, xt.memory_total()
assert 0 < xt.memory_free() <= xt.memory_total()
assert lib.xseg_record_stream(p, None) == 0
assert lib.xseg_record_stream(0x10000, None) == 1
snap = xt.snapshot()
assert len(snap["segments"]) >= 1 and snap["stats"]["allocation"]["all"]["current"] == 2, snap["stats"]
lib.xseg_free(p, 5 << 20, 0, stream)
lib.xseg_free(q, 100, 0, stream)
assert xt.memory_allocated() == 0
assert xt.peak_memory() >= (5 << 20) + 100 and xt.max_memory_reserved() >= 5 << 20
xt.reset_peak_stats()
assert xt.max_memory_allocated() == 0
xt.clear_cache()
assert xt.memory_reserved() == 0, xt.memory_reserved()

# Bad input is recorded, never fatal.
lib.xseg_free(0x7F0000002000, 8, 0, stream)
assert "xseg_free" in xt.last_error(), xt.last_error()
assert lib.xseg_malloc(-1, 0, stream) is None and "negative size" in xt.last_error()
try:
    xt.stats(9)
    raise AssertionError("stats of a missing device")
except RuntimeError as e:
    assert "device 9" in str(e), e
try:
    xt.empty_cache(-7)
    raise AssertionError("empty_cache(-7) accepted")
except RuntimeError:
    pass
assert lib.xseg_malloc(4 << 30, 0, stream) is None and xt.num_ooms() == 1
assert xt.num_alloc_retries() >= 0

# Threads started by Python call in concurrently.
errors = []
def work():
    for i in range(300):
        n = 1000 + i * 5000
        b = lib.xseg_malloc(n, 0, stream)
        if not b:
            errors.append(xt.last_error())
            continue
        lib.xseg_free(b, n, 0, stream)
ts = [threading.Thread(target=work) for _ in range(4)]
[t.start() for t in ts]
[t.join() for t in ts]
assert not errors, errors[:3]
assert xt.stats()["allocation.all.current"] == 0

# install() needs torch; without it the error is an ImportError, not a crash.
if importlib.util.find_spec("torch") is None:
    try:
        xt.install()
        raise AssertionError("install without torch")
    except ImportError:
        pass
print("ok")
