//go:build cgo

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
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

// TestLibraryCacheInfo: PyTorch's cacheInfo (256 MiB host device): the
// driver's free memory plus the bytes held that no block uses, under the
// memory limit the limit less the bytes in use; a failed MemInfo is the
// call's error and changes nothing.
func TestLibraryCacheInfo(t *testing.T) {
	var faulty *vmmtest.Faulty
	l := newLibrary(env{envBackend: "host", envHostCapacity: fmt.Sprint(256 << 20)}.get,
		func(backend xseg.Backend, capacity uint64) (vmm.Driver, error) {
			d, err := xseg.OpenDriver(backend, capacity)
			if err != nil {
				return nil, err
			}
			faulty = vmmtest.NewFaulty(d)
			return faulty, nil
		})
	t.Cleanup(func() {
		if d := l.devs[0].Load(); d != nil {
			require.NoError(t, d.a.Close())
		}
		if faulty != nil {
			require.NoError(t, faulty.Close())
		}
	})
	n, err := l.cacheInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(256<<20), n, "nothing held: the whole device")

	p, err := l.malloc(64<<20, 0, 0)
	require.NoError(t, err)
	n, err = l.cacheInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(192<<20), n, "64 MiB in use")

	require.NoError(t, l.free(p, 0))
	n, err = l.cacheInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(256<<20), n, "freed pages held count: they are recycled into a growth")

	p, err = l.malloc(64<<20, 0, 0)
	require.NoError(t, err)
	require.NoError(t, l.setMemoryLimit(0, 160<<20))
	n, err = l.cacheInfo(0)
	require.NoError(t, err)
	require.Equal(t, uint64(96<<20), n, "the limit less the bytes in use")
	require.NoError(t, l.setMemoryLimit(0, 0))

	faulty.FailNth(vmmtest.OpMemInfo, 1, nil)
	_, err = l.cacheInfo(0)
	require.ErrorContains(t, err, "memory of device 0")
	var inj *vmmtest.InjectedError
	require.ErrorAs(t, err, &inj)
	n, err = l.cacheInfo(0)
	require.NoError(t, err, "the next call answers")
	require.Equal(t, uint64(192<<20), n)
	require.NoError(t, l.free(p, 0))

	_, err = l.cacheInfo(1)
	require.ErrorIs(t, err, vmm.ErrInvalid, "the host backend has one device")
	_, err = l.cacheInfo(-1)
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

// TestLibraryEmptyCacheHook: PyTorch's reset hook keeps a capturing
// device's cache and returns nil, where the C API's empty_cache fails
// with ErrCapturing; outside captures both empty it.
func TestLibraryEmptyCacheHook(t *testing.T) {
	l := hostLibrary(t, nil)
	p, err := l.malloc(8<<20, 0, 0)
	require.NoError(t, err)
	require.NoError(t, l.free(p, 0))
	held := stats(t, l, 0).ReservedBytes.All.Current
	require.Positive(t, held)
	a, err := l.existing(0)
	require.NoError(t, err)
	id := xseg.PoolID{First: 0, Second: 9}
	require.NoError(t, a.BeginAllocateToPool(id, func(vmm.Stream) bool { return true }))
	require.ErrorIs(t, l.emptyCache(0), xseg.ErrCapturing)
	require.ErrorIs(t, l.emptyCache(-1), vmm.ErrInUse)
	require.NoError(t, l.emptyCacheHook(), "quiet during a capture")
	require.Equal(t, held, stats(t, l, 0).ReservedBytes.All.Current, "nothing unmapped during the capture")
	require.NoError(t, a.EndAllocateToPool(id))
	require.NoError(t, a.ReleasePool(id))
	require.NoError(t, l.emptyCacheHook())
	require.Zero(t, stats(t, l, 0).ReservedBytes.All.Current, "emptied outside captures")
}
