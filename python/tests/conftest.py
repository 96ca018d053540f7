"""Fixtures for xseg's Python tests.

They run without torch and without a GPU, on xseg's host backend: host
memory stands in for the device (1 GiB of it), so a block's address is real
memory that ctypes can read and write.

The library under test is $XSEG_LIB if set, else the libxseg.so inside the
xseg package that imports (an installed wheel: put its folder on
PYTHONPATH), else one built with Go into a temporary folder for the session
(with the package's own build backend). The fixture `libxseg` makes it
$XSEG_LIB for this process and every subprocess.

A process has one xseg, configured once, before its first allocation: the
tests that need a fresh library or a configuration of their own run a small
Python program in a subprocess (`run_py`, `spawn_py`).

The Go runtime inside libxseg.so reads the environment the process started
with, not os.environ: when pytest was not started with the settings below
(XSEG_BACKEND=host, XSEG_HOST_CAPACITY=1 GiB, no XSEG_CONF), pytest_configure
starts it again with them (os.execve, once), before anything is collected.
"""

import json
import os
import queue
import re
import subprocess
import sys
import textwrap
import threading

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)  # python/ of the source tree (or an sdist)
CAPACITY = 1 << 30
MiB = 1 << 20

# The environment of the library: for every child, and (see
# pytest_configure) for this process.
TEST_ENV = {"XSEG_BACKEND": "host", "XSEG_HOST_CAPACITY": str(CAPACITY), "XSEG_CONF": ""}
os.environ.update(TEST_ENV)
_REEXEC = "XSEG_TESTS_REEXECUTED"


def _started_with_test_env():
    try:
        with open("/proc/self/environ", "rb") as f:
            start = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return True  # no /proc: nothing to check against
    return all(start.get(k.encode(), b"").decode() == v for k, v in TEST_ENV.items())


def pytest_configure(config):
    if _started_with_test_env():
        return
    if os.environ.get(_REEXEC):
        raise pytest.UsageError(f"xseg tests: started again with {TEST_ENV}, but /proc/self/environ "
                                "does not show it; run pytest with those variables set")
    capman = config.pluginmanager.getplugin("capturemanager")
    if capman is not None:
        capman.stop_global_capturing()  # give the new process the real stdout and stderr
    sys.stdout.flush()
    sys.stderr.flush()
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, "-m", "pytest"] + sys.argv[1:])
    os.execve(sys.executable, [sys.executable] + argv[1:], dict(os.environ, **{_REEXEC: "1"}))


try:
    import xseg  # an installed package, or one on PYTHONPATH
except ImportError:
    sys.path.insert(0, PYTHON_DIR)
    import xseg

from xseg import _lib  # noqa: E402

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(xseg.__file__)))
_GIVEN_LIB = os.environ.get("XSEG_LIB") or None


def _source_go_root():
    env = os.environ.get("XSEG_GO_ROOT")
    if env:
        return env
    for root in (os.path.join(PYTHON_DIR, "go"), os.path.dirname(PYTHON_DIR)):
        if os.path.isfile(os.path.join(root, "cmd", "libxseg", "xseg.h")):
            return root
    return None


def header_version():
    """XSEG_VERSION of cmd/libxseg/xseg.h when the Go sources are at hand,
    else None."""
    root = _source_go_root()
    if root is None:
        return None
    with open(os.path.join(root, "cmd", "libxseg", "xseg.h"), encoding="utf-8") as f:
        m = re.search(r'#define\s+XSEG_VERSION\s+"([^"]+)"', f.read())
    return m.group(1) if m else None


def _build_with_go(out_dir):
    backend = os.path.join(PYTHON_DIR, "build_backend")
    if not os.path.isfile(os.path.join(backend, "xseg_build.py")):
        pytest.exit("xseg tests: no libxseg.so to test: set XSEG_LIB, or install the xseg wheel "
                    "(PYTHONPATH=its folder), or run from the source tree with Go", returncode=4)
    sys.path.insert(0, backend)
    try:
        import xseg_build
    finally:
        sys.path.remove(backend)
    env_prebuilt = os.environ.pop("XSEG_PREBUILT_LIB", None)
    try:
        return xseg_build.build_library(str(out_dir), log=sys.stderr)
    except xseg_build.BuildError as e:
        pytest.exit(f"xseg tests: building libxseg.so failed: {e}\n(or set XSEG_LIB, or install the wheel)",
                    returncode=4)
    finally:
        if env_prebuilt is not None:
            os.environ["XSEG_PREBUILT_LIB"] = env_prebuilt


@pytest.fixture(scope="session")
def lib_path(tmp_path_factory):
    """The path of the libxseg.so under test (see the module's doc)."""
    if _GIVEN_LIB:
        path = os.path.abspath(_GIVEN_LIB)
    else:
        packaged = os.path.join(os.path.dirname(os.path.abspath(xseg.__file__)), _lib.LIB_NAME)
        if os.path.isfile(packaged):
            path = packaged
        else:
            path = _build_with_go(tmp_path_factory.mktemp("libxseg"))
    os.environ["XSEG_LIB"] = path
    return path


@pytest.fixture(scope="session", autouse=True)
def libxseg(lib_path):
    """The library, loaded in this process (unconfigured: XSEG_CONF empty)."""
    return _lib.load(lib_path)


def child_env(extra=None):
    """The environment of a child: the test's (XSEG_LIB, the host backend),
    with this xseg package first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


PRELUDE = """\
import ctypes, json, os, sys
import xseg
from xseg import _lib
MiB = 1 << 20
def stats():
    return _lib.flatten(_lib.raw_stats(0))
"""


def _program(code):
    return PRELUDE + textwrap.dedent(code)


@pytest.fixture
def run_py(libxseg, tmp_path):
    """run_py(code, env=None, ok=True, timeout=120, args=()) runs code (after
    PRELUDE: ctypes, json, os, sys, xseg, _lib, MiB, stats()) in a fresh
    Python with its own xseg, and returns the CompletedProcess (text). With
    ok=True, a non-zero exit fails the test with the child's output."""
    def run(code, env=None, ok=True, timeout=120, args=()):
        proc = subprocess.run([sys.executable, "-c", _program(code)] + list(args), cwd=str(tmp_path),
                              env=child_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              universal_newlines=True, timeout=timeout)
        if ok and proc.returncode != 0:
            pytest.fail(f"child exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}",
                        pytrace=False)
        return proc
    return run


class Child:
    """A Python child with a line protocol: send(text) writes a line to its
    stdin, recv() returns its next stdout line (failing the test on a
    timeout or if the child exits first), recv_json() decodes one."""

    def __init__(self, popen):
        self.proc = popen
        self._lines = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def send(self, text):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout=60):
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.proc.kill()
            pytest.fail(f"child printed nothing in {timeout}s; stderr:\n{self.finish()[1]}", pytrace=False)
        if line is None:
            rc, err = self.finish()
            pytest.fail(f"child exited ({rc}) before answering; stderr:\n{err}", pytrace=False)
        return line

    def recv_json(self, timeout=60):
        return json.loads(self.recv(timeout))

    def finish(self, timeout=60):
        """Close stdin, wait for the exit; (exit status, stderr)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        err = self.proc.stderr.read()
        self.proc.stderr.close()
        self._reader.join(10)
        return self.proc.returncode, err


@pytest.fixture
def spawn_py(libxseg, tmp_path):
    """spawn_py(code, env=None, args=()) starts code (after PRELUDE) in a
    fresh Python and returns a Child to talk to it line by line; a child
    still running at the end of the test is killed."""
    children = []

    def spawn(code, env=None, args=()):
        p = subprocess.Popen([sys.executable, "-u", "-c", _program(code)] + list(args), cwd=str(tmp_path),
                             env=child_env(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True)
        children.append(Child(p))
        return children[-1]

    yield spawn
    for c in children:
        if c.proc.poll() is None:
            c.proc.kill()
        if not c.proc.stderr.closed:
            c.finish()


def last_json(proc):
    """The JSON value of the last line a child printed."""
    lines = proc.stdout.strip().splitlines()
    assert lines, f"the child printed nothing; stderr:\n{proc.stderr}"
    return json.loads(lines[-1])
