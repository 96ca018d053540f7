"""xseg's PEP 517 build backend: standard library only, so that
``pip install ./python`` and ``pip wheel ./python`` work with no package
index reachable (``[build-system] requires = []``).

build_wheel compiles libxseg.so from the Go module (the parent of python/,
or $XSEG_GO_ROOT) with ``go build -buildmode=c-shared`` and ships it inside
the package as ``xseg/libxseg.so``, with every file of ``xseg/`` (caches
left out) and the top-level module ``xseg_torch.py``. $XSEG_PREBUILT_LIB
naming an existing libxseg.so ships that instead (machines without Go).
The wheel is tagged ``py3-none-<platform>``: the library is loaded with
ctypes, so any CPython 3.9+ of that platform takes it.

build_sdist writes a source archive with the Go module's sources under
``go/``; building a wheel from it needs Go, a C compiler and the Go
module proxy (or a filled module cache).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from typing import Dict, Iterator, List, NoReturn, Optional, Tuple

NAME = "xseg"
SUMMARY = "xseg: a GPU memory allocator with expandable segments, as PyTorch's CUDA allocator"
LICENSE = "Apache-2.0"  # the repository's LICENSE file
REQUIRES_PYTHON = ">=3.9"
EXTRAS = {"torch": ["torch>=2.3"]}

LIB_NAME = "libxseg.so"
PACKAGE_DIR = "xseg"
TOP_LEVEL_MODULES = ("xseg_torch.py",)

# python/, where pyproject.toml is: this file is python/build_backend/xseg_build.py.
PROJECT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SKIP_DIRS = {"__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so", ".swp", "~")
_VERSION_RE = re.compile(r'^\s*#\s*define\s+XSEG_VERSION\s+"([^"]+)"', re.M)


class BuildError(RuntimeError):
    """The wheel cannot be built; the message says why and what to do."""


# --- locating the inputs ---

def go_root() -> str:
    """The Go module root that holds cmd/libxseg: $XSEG_GO_ROOT, else go/
    inside the project (an unpacked sdist), else the parent of python/ (the
    repository)."""
    env = os.environ.get("XSEG_GO_ROOT")
    if env:
        root = os.path.abspath(env)
        if not os.path.isfile(os.path.join(root, "cmd", "libxseg", "xseg.h")):
            raise BuildError(f"xseg: XSEG_GO_ROOT={env} has no cmd/libxseg/xseg.h: it is not xseg's Go module")
        return root
    tried = [os.path.join(PROJECT_DIR, "go"), os.path.dirname(PROJECT_DIR)]
    for root in tried:
        if os.path.isfile(os.path.join(root, "go.mod")) and os.path.isfile(
                os.path.join(root, "cmd", "libxseg", "xseg.h")):
            return root
    raise BuildError("xseg: cannot find xseg's Go module (go.mod and cmd/libxseg/xseg.h) in "
                     + " or ".join(tried) + "; set XSEG_GO_ROOT to it, or XSEG_PREBUILT_LIB to a built libxseg.so")


def version() -> str:
    """XSEG_VERSION of cmd/libxseg/xseg.h, else (no Go module, a prebuilt
    library) __version__ of xseg/__init__.py."""
    try:
        header = os.path.join(go_root(), "cmd", "libxseg", "xseg.h")
    except BuildError:
        header = None
    if header is not None:
        with open(header, encoding="utf-8") as f:
            m = _VERSION_RE.search(f.read())
        if not m:
            raise BuildError(f"xseg: {header} defines no XSEG_VERSION")
        return m.group(1)
    init = os.path.join(PROJECT_DIR, PACKAGE_DIR, "__init__.py")
    with open(init, encoding="utf-8") as f:
        m = re.search(r'^__version__\s*=\s*"([^"]+)"', f.read(), re.M)
    if not m:
        raise BuildError(f"xseg: no version: neither cmd/libxseg/xseg.h nor __version__ in {init}")
    return m.group(1)


def platform_tag() -> str:
    """The wheel platform tag of this machine: linux_x86_64, linux_aarch64, ..."""
    plat = sysconfig.get_platform()
    if plat == "linux-x86_64" and sys.maxsize <= 2 ** 32:
        plat = "linux-i686"  # a 32-bit Python on a 64-bit kernel
    return re.sub(r"[^A-Za-z0-9_]", "_", plat)


def wheel_tag() -> str:
    return f"py3-none-{platform_tag()}"


def _find_go() -> str:
    go = shutil.which("go")
    if go:
        return go
    for cand in (os.path.join(os.environ.get("GOROOT", ""), "bin", "go"), "/usr/local/go/bin/go"):
        if os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    raise BuildError(
        "xseg: building libxseg.so needs Go 1.25 or newer (the go command was not found on PATH nor at "
        "/usr/local/go/bin/go). Install Go (the official release unpacked at /usr/local/go, or your "
        "distribution's golang package), with cgo and a C compiler (gcc and g++); or build libxseg.so "
        "elsewhere and point XSEG_PREBUILT_LIB at it.")


def _go_env(go: str, env: Dict[str, str], *names: str) -> List[str]:
    out = subprocess.run([go, "env"] + list(names), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True)
    if out.returncode != 0:
        raise BuildError(f"xseg: `{go} env` failed:\n{out.stdout}")
    return out.stdout.splitlines()


def _check_compilers(go: str, env: Dict[str, str]) -> None:
    cc, cxx = (_go_env(go, env, "CC", "CXX") + ["", ""])[:2]
    for what, cmd, pkg in (("C", cc or "gcc", "gcc libc6-dev"), ("C++", cxx or "g++", "g++")):
        exe = cmd.split()[0] if cmd.split() else cmd
        if not shutil.which(exe):
            raise BuildError(
                f"xseg: building libxseg.so needs cgo and a {what} compiler, and {exe!r} (go env "
                f"{'CC' if what == 'C' else 'CXX'}) was not found. Install one (Debian/Ubuntu: apt-get install "
                f"{pkg}; Fedora/RHEL: dnf install {'gcc' if what == 'C' else 'gcc-c++'}), or set "
                f"{'CC' if what == 'C' else 'CXX'} to yours; or point XSEG_PREBUILT_LIB at a libxseg.so built "
                "elsewhere.")


def build_library(out_dir: str, log=None) -> str:
    """Compile libxseg.so into out_dir with Go and return its path (or copy
    $XSEG_PREBUILT_LIB there). log (a text stream) receives progress."""
    log = log if log is not None else sys.stderr
    dest = os.path.join(out_dir, LIB_NAME)
    prebuilt = os.environ.get("XSEG_PREBUILT_LIB")
    if prebuilt:
        if not os.path.isfile(prebuilt):
            raise BuildError(f"xseg: XSEG_PREBUILT_LIB={prebuilt} does not exist")
        print(f"xseg: shipping the prebuilt {prebuilt} (XSEG_PREBUILT_LIB)", file=log)
        if not (os.path.exists(dest) and os.path.samefile(prebuilt, dest)):
            shutil.copyfile(prebuilt, dest)
        return dest
    root = go_root()
    env = dict(os.environ, CGO_ENABLED="1")
    go = _find_go()
    env["PATH"] = os.path.dirname(go) + os.pathsep + env.get("PATH", "")
    _check_compilers(go, env)
    cmd = [go, "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w", "-o", dest, "./cmd/libxseg"]
    print(f"xseg: in {root}: CGO_ENABLED=1 {' '.join(cmd)}", file=log)
    log.flush()
    t = time.monotonic()
    res = subprocess.run(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True)
    if res.returncode != 0 or not os.path.isfile(dest):
        raise BuildError(f"xseg: `{' '.join(cmd)}` in {root} failed (exit {res.returncode}):\n{res.stdout}")
    # go build writes the cgo export header beside the library; the
    # package has no use for it (cmd/libxseg/xseg.h is the API).
    header = os.path.join(out_dir, "libxseg.h")
    if os.path.isfile(header):
        os.unlink(header)
    print(f"xseg: built {dest} ({os.path.getsize(dest)} bytes) in {time.monotonic() - t:.1f}s", file=log)
    return dest


def _package_files() -> List[Tuple[str, str]]:
    """(path in the wheel, path on disk) of every file of the package and
    the top-level modules, caches and built libraries left out."""
    files = []
    pkg = os.path.join(PROJECT_DIR, PACKAGE_DIR)
    if not os.path.isfile(os.path.join(pkg, "__init__.py")):
        raise BuildError(f"xseg: {pkg}/__init__.py is missing")
    for dirpath, dirnames, filenames in os.walk(pkg):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith(_SKIP_SUFFIXES) or name.startswith("."):
                continue
            full = os.path.join(dirpath, name)
            files.append((os.path.relpath(full, PROJECT_DIR).replace(os.sep, "/"), full))
    for mod in TOP_LEVEL_MODULES:
        full = os.path.join(PROJECT_DIR, mod)
        if os.path.isfile(full):
            files.append((mod, full))
    return files


# --- metadata ---

def _dist_info(ver: str) -> str:
    return f"{NAME}-{ver}.dist-info"


def _metadata(ver: str) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {ver}",
        f"Summary: {SUMMARY}",
        f"License: {LICENSE}",
        "Platform: Linux",
        "Classifier: Operating System :: POSIX :: Linux",
        "Classifier: Programming Language :: Python :: 3",
        "Classifier: Programming Language :: Go",
        f"Requires-Python: {REQUIRES_PYTHON}",
    ]
    for extra, reqs in sorted(EXTRAS.items()):
        lines.append(f"Provides-Extra: {extra}")
        lines += [f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]
    readme = os.path.join(PROJECT_DIR, "README.md")
    body = ""
    if os.path.isfile(readme):
        lines.append("Description-Content-Type: text/markdown")
        with open(readme, encoding="utf-8") as f:
            body = f.read()
    return "\n".join(lines) + "\n\n" + body


def _wheel_file() -> str:
    return ("Wheel-Version: 1.0\n"
            "Generator: xseg_build (python/build_backend)\n"
            "Root-Is-Purelib: false\n"
            f"Tag: {wheel_tag()}\n")


def _write_metadata_dir(directory: str, ver: str) -> str:
    name = _dist_info(ver)
    d = os.path.join(directory, name)
    os.makedirs(d, exist_ok=True)
    for fname, text in (("METADATA", _metadata(ver)), ("WHEEL", _wheel_file()),
                        ("top_level.txt", "xseg\nxseg_torch\n")):
        with open(os.path.join(d, fname), "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
    return name


# --- the wheel ---

def _epoch() -> int:
    """The files' time: $SOURCE_DATE_EPOCH, else 1980-01-01 (zip's first),
    so that a build is reproducible."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    return max(int(epoch), 315532800) if epoch.isdigit() else 315532800


def _zip_time() -> Tuple[int, int, int, int, int, int]:
    return tuple(time.gmtime(_epoch())[:6])  # type: ignore[return-value]


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


class _WheelWriter:
    def __init__(self, path: str) -> None:
        self.zf = zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED)
        self.records: List[Tuple[str, str, str]] = []
        self.when = _zip_time()

    def add(self, arcname: str, data: bytes, executable: bool = False) -> None:
        info = zipfile.ZipInfo(arcname, date_time=self.when)
        mode = 0o755 if executable else 0o644
        info.external_attr = (stat.S_IFREG | mode) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, data)
        self.records.append((arcname, _record_hash(data), str(len(data))))

    def close(self, record_name: str) -> None:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        for row in self.records:
            w.writerow(row)
        w.writerow((record_name, "", ""))
        info = zipfile.ZipInfo(record_name, date_time=self.when)
        info.external_attr = (stat.S_IFREG | 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        self.zf.writestr(info, buf.getvalue().encode())
        self.zf.close()


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _build(wheel_directory: str, editable: bool) -> str:
    ver = version()
    os.makedirs(wheel_directory, exist_ok=True)
    wheel_name = f"{NAME}-{ver}-{wheel_tag()}.whl"
    dist_info = _dist_info(ver)
    with tempfile.TemporaryDirectory(prefix="xseg-build-") as tmp:
        # An editable install's library stays in the source tree, where the
        # .pth file leads.
        lib = build_library(os.path.join(PROJECT_DIR, PACKAGE_DIR) if editable else tmp)
        meta_dir = os.path.join(tmp, "meta")
        _write_metadata_dir(meta_dir, ver)
        out = os.path.join(wheel_directory, wheel_name)
        partial = out + ".part"
        w = _WheelWriter(partial)
        try:
            if editable:
                w.add(f"__editable__.{NAME}.pth", (PROJECT_DIR + "\n").encode())
            else:
                for arc, full in _package_files():
                    w.add(arc, _read(full))
                w.add(f"{PACKAGE_DIR}/{LIB_NAME}", _read(lib), executable=True)
            for fname in ("METADATA", "WHEEL", "top_level.txt"):
                w.add(f"{dist_info}/{fname}", _read(os.path.join(meta_dir, dist_info, fname)))
            w.close(f"{dist_info}/RECORD")
        except BaseException:
            w.zf.close()
            os.unlink(partial)
            raise
        os.replace(partial, out)
    print(f"xseg: wrote {out}", file=sys.stderr)
    return wheel_name


def _fail(e: BuildError) -> NoReturn:
    # pip shows the backend's traceback; the message is what matters, so
    # print it plainly last as well.
    print(f"\n{e}\n", file=sys.stderr)
    raise e


# --- the PEP 517 / PEP 660 hooks ---

def get_requires_for_build_wheel(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_sdist(config_settings=None) -> List[str]:
    return []


def get_requires_for_build_editable(config_settings=None) -> List[str]:
    return []


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings=None) -> str:
    try:
        return _write_metadata_dir(metadata_directory, version())
    except BuildError as e:
        _fail(e)


def prepare_metadata_for_build_editable(metadata_directory: str, config_settings=None) -> str:
    return prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory: str, config_settings=None, metadata_directory: Optional[str] = None) -> str:
    try:
        return _build(wheel_directory, editable=False)
    except BuildError as e:
        _fail(e)


def build_editable(wheel_directory: str, config_settings=None, metadata_directory: Optional[str] = None) -> str:
    """An editable install: a .pth file that puts python/ on sys.path, and
    libxseg.so built into python/xseg/ (where find_library looks first)."""
    try:
        return _build(wheel_directory, editable=True)
    except BuildError as e:
        _fail(e)


# --- the sdist ---

_GO_SUFFIXES = (".go", ".c", ".cc", ".cpp", ".h", ".hpp", ".s", ".S")
_GO_SKIP_DIRS = {"testdata", "python", "node_modules"}


def _go_sources(root: str) -> Iterator[Tuple[str, str]]:
    """(path relative to root, path on disk) of what `go build
    ./cmd/libxseg` may need: go.mod, go.sum and the non-test sources of
    every package (hidden folders, testdata and python/ left out)."""
    for name in ("go.mod", "go.sum"):
        if os.path.isfile(os.path.join(root, name)):
            yield name, os.path.join(root, name)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames
                             if not d.startswith((".", "_")) and d not in _GO_SKIP_DIRS)
        for name in sorted(filenames):
            if name.endswith(_GO_SUFFIXES) and not name.endswith("_test.go"):
                full = os.path.join(dirpath, name)
                yield os.path.relpath(full, root).replace(os.sep, "/"), full


def _project_files() -> Iterator[Tuple[str, str]]:
    for name in ("pyproject.toml", "README.md") + TOP_LEVEL_MODULES:
        full = os.path.join(PROJECT_DIR, name)
        if os.path.isfile(full):
            yield name, full
    for sub in ("build_backend", PACKAGE_DIR, "tests"):
        top = os.path.join(PROJECT_DIR, sub)
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
            for name in sorted(filenames):
                if not name.endswith(_SKIP_SUFFIXES) and not name.startswith("."):
                    full = os.path.join(dirpath, name)
                    yield os.path.relpath(full, PROJECT_DIR).replace(os.sep, "/"), full


def build_sdist(sdist_directory: str, config_settings=None) -> str:
    """A .tar.gz with the package, this backend, the tests, and the Go
    module's sources under go/ (where go_root() looks)."""
    try:
        ver = version()
        root = go_root()
    except BuildError as e:
        _fail(e)
    base = f"{NAME}-{ver}"
    os.makedirs(sdist_directory, exist_ok=True)
    out = os.path.join(sdist_directory, base + ".tar.gz")
    mtime = _epoch()

    def add(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
        info = tarfile.TarInfo(f"{base}/{arcname}")
        info.size, info.mtime, info.mode = len(data), mtime, 0o644
        info.uname = info.gname = "root"
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        add(tar, "PKG-INFO", _metadata(ver).encode())
        for arc, full in _project_files():
            add(tar, arc, _read(full))
        for arc, full in _go_sources(root):
            add(tar, "go/" + arc, _read(full))
    print(f"xseg: wrote {out}", file=sys.stderr)
    return os.path.basename(out)


if __name__ == "__main__":
    # python3 python/build_backend/xseg_build.py [wheel|sdist] [OUT_DIR]:
    # the same as pip's build, for machines without pip.
    what = sys.argv[1] if len(sys.argv) > 1 else "wheel"
    dest = sys.argv[2] if len(sys.argv) > 2 else os.path.join(PROJECT_DIR, "dist")
    hooks = {"wheel": build_wheel, "sdist": build_sdist, "editable": build_editable}
    if what not in hooks:
        sys.exit(f"usage: {sys.argv[0]} [wheel|sdist|editable] [OUT_DIR]")
    try:
        print(os.path.join(dest, hooks[what](dest)))
    except BuildError as e:
        sys.exit(str(e))
