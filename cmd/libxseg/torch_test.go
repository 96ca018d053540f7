//go:build cgo

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

func TestLibraryMallocAtMost(t *testing.T) {
	l := hostLibrary(t, nil)
	for _, c := range [][2]uint64{{1 << 20, 0}, {1 << 20, 2 << 20}, {1 << 63, 1 << 63}, {1<<62 + 1, 1<<62 + 1}} {
		_, _, err := l.mallocAtMost(c[0], c[1], 0, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid, "max %d min %d", c[0], c[1])
	}
	// "As much as possible": a max past 2^62 is 2^62, which the first
	// attempt cuts to what the device has.
	for _, max := range []uint64{1<<62 + 1, 1 << 63, ^uint64(0)} {
		p, n, err := l.mallocAtMost(max, 1, 0, 0)
		require.NoError(t, err, "max %d", max)
		require.LessOrEqual(t, n, uint64(256<<20))
		require.NoError(t, l.free(p, 0))
	}
	_, _, err := l.mallocAtMost(1<<20, 1<<10, 99, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	// 1 GiB asked of a 256 MiB device: the size factor shrinks it.
	p, n, err := l.mallocAtMost(1<<30, 1<<20, 0, 0)
	require.NoError(t, err)
	require.NotZero(t, p)
	require.LessOrEqual(t, n, uint64(256<<20))
	require.GreaterOrEqual(t, n, uint64(1<<20))
	require.EqualValues(t, n, stats(t, l, 0).RequestedBytes.All.Current)
	// Nothing left: even min fails, as out of memory.
	_, _, err = l.mallocAtMost(1<<30, 200<<20, 0, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.NoError(t, l.free(p, 0))
}

func TestLibraryOOMText(t *testing.T) {
	l := hostLibrary(t, nil)
	keep, err := l.malloc(100<<20, 0, 0)
	require.NoError(t, err)
	_, err = l.malloc(1<<30, 0, 0)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	text := l.oomText(1<<30, 0, err)
	require.True(t, strings.HasPrefix(text, "CUDA out of memory. Tried to allocate 1.0 GiB. GPU 0 has a total capacity of 256 MiB of which "), text)
	require.Contains(t, text, "Of the memory xseg holds on it, 100 MiB is allocated")
	require.Contains(t, text, "xseg: ")
	require.Contains(t, text, err.Error())
	require.NoError(t, l.free(keep, 0))

	// Before any allocator exists the text still starts the same way.
	fresh := hostLibrary(t, nil)
	require.True(t, strings.HasPrefix(fresh.oomText(-1, 3, vmm.ErrOutOfMemory), "CUDA out of memory. Tried to allocate 0 B."))
}

func TestLibraryRetainPool(t *testing.T) {
	l := hostLibrary(t, nil)
	id := xseg.PoolID{First: 0, Second: 7}
	require.NoError(t, l.retainPool(0, id))
	p, err := l.mallocInPool(4<<20, 0, 0, id)
	require.NoError(t, err)
	b, err := l.poolJSON(0, id, false)
	require.NoError(t, err)
	require.Contains(t, string(b), "[")
	require.NoError(t, l.free(p, 0))
	require.Positive(t, stats(t, l, 0).ReservedBytes.All.Current)
	require.NoError(t, l.releasePool(0, id), "the last use gives the pool back")
	require.Zero(t, stats(t, l, 0).ReservedBytes.All.Current)
	require.ErrorIs(t, l.releasePool(0, id), vmm.ErrInvalid, "released twice")
	require.Error(t, l.retainPool(-1, id))
}

func TestLibraryResetAccumulated(t *testing.T) {
	l := hostLibrary(t, nil)
	p, err := l.malloc(1<<20, 0, 0)
	require.NoError(t, err)
	require.NoError(t, l.free(p, 0))
	require.EqualValues(t, 1, stats(t, l, 0).Allocations.All.Allocated)
	require.NoError(t, l.resetAccumulatedStats(-1))
	st := stats(t, l, 0)
	require.Zero(t, st.Allocations.All.Allocated)
	require.Zero(t, st.Allocations.All.Freed)
	require.EqualValues(t, 1, st.Allocations.All.Peak)
	require.Error(t, l.resetAccumulatedStats(77))
}
