//go:build cgo

package main

import (
	"encoding/json"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// TestLibraryMemoryFraction: the memory limit through the library, as
// PyTorch's memory_fraction_fn reaches it (256 MiB host device).
func TestLibraryMemoryFraction(t *testing.T) {
	l := hostLibrary(t, nil)
	for _, f := range []float64{-0.1, 1.01, math.NaN(), math.Inf(-1)} {
		require.ErrorIs(t, l.setMemoryFraction(f, 0), vmm.ErrInvalid, "%v", f)
	}
	a, err := l.existing(0)
	require.NoError(t, err)
	require.Nil(t, a, "a bad fraction makes no allocator")
	f, err := l.memoryFraction(0)
	require.NoError(t, err)
	require.Zero(t, f, "no allocator, no limit")

	require.NoError(t, l.setMemoryFraction(0.25, 0))
	f, err = l.memoryFraction(0)
	require.NoError(t, err)
	require.Equal(t, 0.25, f)
	require.Equal(t, uint64(64<<20), stats(t, l, 0).MemoryLimit)
	_, err = l.malloc(100<<20, 0, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "memory limit of 67108864 bytes, set as memory fraction 0.25")
	require.ErrorIs(t, l.setMemoryFraction(2, 0), vmm.ErrInvalid)
	f, err = l.memoryFraction(0)
	require.NoError(t, err)
	require.Equal(t, 0.25, f, "unchanged")

	require.ErrorIs(t, l.setMemoryFraction(0.5, 1), vmm.ErrInvalid, "the host backend has one device")
	require.ErrorIs(t, l.setMemoryFraction(0.5, maxDevices), vmm.ErrInvalid)
	_, err = l.memoryFraction(-1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = l.memoryFraction(1)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	require.NoError(t, l.setMemoryLimit(0, 0))
	f, err = l.memoryFraction(0)
	require.NoError(t, err)
	require.Zero(t, f)
	p, err := l.malloc(100<<20, 0, 0)
	require.NoError(t, err, "no limit now")
	require.NoError(t, l.free(p, 0))
	require.ErrorIs(t, l.setMemoryLimit(5, 1), vmm.ErrInvalid)
}

// TestLibraryHistory: the history through the library, as JSON with
// PyTorch's keys.
func TestLibraryHistory(t *testing.T) {
	l := hostLibrary(t, nil)
	b, err := l.historyJSON(0)
	require.NoError(t, err)
	require.JSONEq(t, `[]`, string(b), "no allocator yet")
	require.ErrorIs(t, l.recordHistory(0, xseg.MaxHistoryEntries+1), vmm.ErrInvalid)
	a, err := l.existing(0)
	require.NoError(t, err)
	require.Nil(t, a, "a bad bound makes no allocator")
	_, err = l.historyJSON(-1)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	require.NoError(t, l.recordHistory(0, 10))
	p, err := l.malloc(1000, 0, 0)
	require.NoError(t, err)
	require.NoError(t, l.free(p, 0))
	b, err = l.historyJSON(0)
	require.NoError(t, err)
	var events []map[string]any
	require.NoError(t, json.Unmarshal(b, &events))
	var got []string
	for _, e := range events {
		got = append(got, e["action"].(string))
		keys := make([]string, 0, len(e))
		for k := range e {
			keys = append(keys, k)
		}
		require.ElementsMatch(t, []string{"action", "addr", "size", "stream", "time_us", "device_free"}, keys)
	}
	require.Equal(t, []string{"segment_map", "alloc", "free_requested", "free_completed"}, got)
	require.Equal(t, float64(p), events[1]["addr"])
	require.Equal(t, float64(1024), events[1]["size"])

	require.NoError(t, l.recordHistory(0, 0))
	b, err = l.historyJSON(0)
	require.NoError(t, err)
	require.JSONEq(t, `[]`, string(b), "off drops the events")
}
