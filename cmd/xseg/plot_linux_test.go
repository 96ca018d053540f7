package main

import (
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPlotFailedWriteKeepsOldPlot: a plot whose write failed (a full
// disk) left a truncated image at its path, in place of the plot that was
// there. The image is written to a temporary file in the same folder and
// renamed over the path only once whole; a failed one is removed.
func TestPlotFailedWriteKeepsOldPlot(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "p.png")
	require.NoError(t, os.WriteFile(path, []byte("the plot before"), 0o600))
	p, _ := replayedPlot(t, path)
	restore := limitFileSize(t, 4096) // a PNG plot takes tens of KiB
	err := p.write(io.Discard)
	restore()
	require.ErrorIs(t, err, syscall.EFBIG)
	require.ErrorContains(t, err, "--plot "+path+": ")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "the plot before", string(got), "the earlier plot is kept")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1, "no partial file left behind")

	// Written whole, it replaces the earlier plot, whose mode it keeps.
	require.NoError(t, p.write(io.Discard))
	requirePNG(t, path)
	st, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	entries, err = os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 1)
}

// limitFileSize makes this process's writes to regular files past n bytes
// fail with EFBIG (Go ignores SIGXFSZ), as on a full disk, until restore
// or the end of the test.
func limitFileSize(t *testing.T, n uint64) (restore func()) {
	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old))
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: n, Max: old.Max}))
	restore = func() { require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)) }
	t.Cleanup(restore)
	return restore
}
