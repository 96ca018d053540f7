package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCAPI builds libxseg.so as users do and loads it, as PyTorch does,
// with dlopen from a C program and with Python's ctypes, on the host
// backend: every export, bad input included.
func TestCAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the c-shared library; not in -short")
	}
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skipf("no C compiler to build a c-shared library: %v", err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skipf("no Go toolchain to build the c-shared library (the GPU machine has none; python/gpu/run.sh tests the library there): %v", err)
	}
	dir := t.TempDir()
	lib := filepath.Join(dir, "libxseg.so")
	run(t, 3*time.Minute, nil, "go", "build", "-buildmode=c-shared", "-o", lib, ".")
	check := filepath.Join(dir, "check")
	run(t, time.Minute, nil, cc, "-O2", "-Wall", "-I.", "-o", check, "testdata/check.c", "-ldl", "-lpthread")

	host := []string{"XSEG_BACKEND=host", "XSEG_HOST_CAPACITY=1073741824", "XSEG_CONF=", "XSEG_LOG="}
	t.Run("C", func(t *testing.T) {
		out := run(t, time.Minute, host, check, lib)
		require.Contains(t, out, "\nok\n", out)
		t.Log(strings.TrimSpace(out))
		// Sharing, bad arguments to xseg_open first, in a process of its
		// own (a shareable allocator).
		out = run(t, time.Minute, host, check, lib, "share")
		require.Equal(t, "ok", strings.TrimSpace(out))
	})
	t.Run("NoDriver", func(t *testing.T) {
		out := run(t, time.Minute, []string{"XSEG_BACKEND=tpu"}, check, lib, "nodriver")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, out)
		require.Contains(t, lines[0], "XSEG_BACKEND=\"tpu\"")
		require.Equal(t, lines[0], lines[1], "the reason is kept for every later call")

		// Issue 15: a bad XSEG_LOG was ignored; it fails as XSEG_BACKEND does.
		out = run(t, time.Minute, append(host, "XSEG_LOG=loud"), check, lib, "nodriver")
		lines = strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, out)
		require.Equal(t, `xseg_malloc: 1048576 bytes on device 0: XSEG_LOG: log level "loud": want off, error, warn, info or debug: invalid argument`, lines[0])
		require.Equal(t, lines[0], lines[1])

		out = run(t, time.Minute, []string{"XSEG_BACKEND="}, check, lib, "nodriver")
		lines = strings.Split(strings.TrimSpace(out), "\n")
		require.Len(t, lines, 2, out)
		if lines[0] == "allocated" {
			t.Log("a CUDA driver is present: the CUDA backend allocated")
			return
		}
		require.NotEqual(t, "1", os.Getenv("XSEG_REQUIRE_GPU"), "the CUDA backend failed: %s", lines[0])
		require.Contains(t, lines[0], "opening the CUDA backend")
		require.Contains(t, lines[0], "set XSEG_BACKEND=host")
		require.Contains(t, lines[0], "not supported")
		require.Equal(t, lines[0], lines[1])
	})
	t.Run("TakeBack", func(t *testing.T) {
		// Blocks taken back by xseg_malloc without a call into Go.
		prog := filepath.Join(dir, "takeback")
		run(t, time.Minute, nil, cc, "-O2", "-Wall", "-I.", "-o", prog, "testdata/takeback.c", "-ldl", "-lpthread")
		out := run(t, 2*time.Minute, host, prog, lib)
		require.Contains(t, out, "ok\n", out)
	})
	t.Run("Fork", func(t *testing.T) {
		// A child forked after the library loaded is refused at once,
		// with the reason, instead of hanging in the Go runtime.
		prog := filepath.Join(dir, "fork")
		run(t, time.Minute, nil, cc, "-O2", "-Wall", "-I.", "-o", prog, "testdata/fork.c", "-ldl")
		for range 5 { // the hang came in most runs, not all
			out := run(t, time.Minute, host, prog, lib)
			require.Equal(t, "ok", strings.TrimSpace(out))
		}
	})
	t.Run("Limits", func(t *testing.T) {
		// The memory-limit and history exports from C, bad input included.
		prog := filepath.Join(dir, "limits")
		run(t, time.Minute, nil, cc, "-O2", "-Wall", "-I.", "-o", prog, "testdata/limits.c", "-ldl", "-lm")
		out := run(t, time.Minute, host, prog, lib)
		require.Contains(t, out, "ok\n", out)
	})
	t.Run("Tags", func(t *testing.T) {
		// Tags, regions, pause and resume from C, bad input included; a
		// shared block refusing a pause in a process of its own (a
		// shareable allocator).
		prog := filepath.Join(dir, "tags")
		run(t, time.Minute, nil, cc, "-O2", "-Wall", "-I.", "-o", prog, "testdata/tags.c", "-ldl", "-lpthread")
		out := run(t, time.Minute, host, prog, lib)
		require.Equal(t, "ok", strings.TrimSpace(out))
		out = run(t, time.Minute, host, prog, lib, "share")
		require.Equal(t, "ok", strings.TrimSpace(out))
	})
	t.Run("Throw", func(t *testing.T) {
		cxx, err := exec.LookPath("c++")
		if err != nil {
			t.Skipf("no C++ compiler: %v", err)
		}
		prog := filepath.Join(dir, "throw")
		run(t, time.Minute, nil, cxx, "-O2", "-Wall", "-I.", "-o", prog, "testdata/throw.cc", "-ldl")
		out := run(t, time.Minute, host, prog, lib)
		require.Contains(t, out, "\nok\n", out)
	})
	t.Run("CacheInfo", func(t *testing.T) {
		cxx, err := exec.LookPath("c++")
		if err != nil {
			t.Skipf("no C++ compiler: %v", err)
		}
		fake := filepath.Join(dir, "fake", "libtorch_cuda.so")
		require.NoError(t, os.MkdirAll(filepath.Dir(fake), 0o755))
		run(t, time.Minute, nil, cxx, "-O2", "-Wall", "-shared", "-fPIC", "-Wl,-soname,libtorch_cuda.so", "-o", fake, "testdata/fake_torch.cc")
		prog := filepath.Join(dir, "cacheinfo")
		run(t, time.Minute, nil, cxx, "-O2", "-Wall", "-I.", "-o", prog, "testdata/cacheinfo.cc", "-ldl")
		out := run(t, time.Minute, host, prog, lib, fake)
		require.Equal(t, "ok", strings.TrimSpace(out))
	})
	t.Run("Pools", func(t *testing.T) {
		cxx, err := exec.LookPath("c++")
		if err != nil {
			t.Skipf("no C++ compiler: %v", err)
		}
		prog := filepath.Join(dir, "pools")
		run(t, time.Minute, nil, cxx, "-O2", "-Wall", "-std=c++17", "-I.", "-o", prog, "testdata/pools.cc", "-ldl")
		out := run(t, time.Minute, host, prog, lib)
		require.Contains(t, out, "ok\n", out)
	})
	t.Run("Python", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Skipf("no python3: %v", err)
		}
		// check.py imports the package of this tree (python/xseg) and
		// loads lib through it; python/tests is the real suite.
		env := append([]string{"PYTHONDONTWRITEBYTECODE=1", "XSEG_LIB="}, host...)
		out := run(t, time.Minute, env, py, "testdata/check.py", lib)
		require.Equal(t, "ok", strings.TrimSpace(out))
	})
}

// run runs a command with env added to the test's environment and returns
// its combined output, failing the test if it fails.
func run(t *testing.T, timeout time.Duration, env []string, name string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append(os.Environ(), "CGO_ENABLED=1"), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", name, strings.Join(args, " "), out)
	return string(out)
}
