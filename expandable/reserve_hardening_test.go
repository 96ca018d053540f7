package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

const (
	gib = 1 << 30
	tib = 1 << 40
)

// Issue 15 item 13: every (stream, pool) reserved the device's whole
// memory of address space, so a trace with 1,000 streams failed from
// stream 929 with 149 GB free (on a 1 TiB device, from stream 128): the
// 128 TiB of x86-64 address space ran out. A stream other than the
// default one now reserves in proportion to what it uses.
func TestThousandStreams(t *testing.T) {
	d := vmmtest.HostDriver(t, tib)
	streams := make([]vmm.Stream, 1000)
	for i := range streams {
		s, err := d.StreamCreate(0)
		require.NoError(t, err)
		streams[i] = s
	}
	t.Cleanup(func() { // after the allocator's Close
		for _, s := range streams {
			require.NoError(t, d.StreamDestroy(s))
		}
	})
	a := newAlloc(t, d, core.ClassicConfig())
	ptrs := make([]vmm.DevicePtr, 0, 2*len(streams))
	for i, s := range streams {
		p, err := a.Alloc(4*core.MiB, s)
		require.NoError(t, err, "stream %d of %d", i+1, len(streams))
		q, err := a.Alloc(4*core.KiB, s)
		require.NoError(t, err, "stream %d of %d, small pool", i+1, len(streams))
		ptrs = append(ptrs, p, q)
	}
	var reserved uint64
	for _, seg := range a.Snapshot().Segments {
		reserved += seg.Reserved
	}
	perStream := roundUp(gib, 20*core.MiB) + roundUp(gib, 2*core.MiB)
	require.Equal(t, uint64(len(streams))*perStream, reserved, "1 GiB of address space a (stream, pool), rounded to pages")
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
}

// Issue 15 item 13: the default stream keeps one reservation of the whole
// device, so a single-stream program (and the replays) never meets a
// segment's end; another stream's segments grow geometrically, so few are
// made however far it grows.
func TestReservationsGrowGeometrically(t *testing.T) {
	d := vmmtest.HostDriver(t, tib)
	s, err := d.StreamCreate(0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.StreamDestroy(s)) })
	a := newAlloc(t, d, core.ClassicConfig())
	var ptrs []vmm.DevicePtr
	for range 96 { // 6 GiB in 64 MiB blocks on each stream
		for _, st := range []vmm.Stream{0, s} {
			p, err := a.Alloc(64*core.MiB, st)
			require.NoError(t, err)
			ptrs = append(ptrs, p)
		}
	}
	var sizes []uint64
	for _, seg := range a.Snapshot().Segments {
		if seg.Stream == 0 {
			require.Equal(t, roundUp(tib, 20*core.MiB), seg.Reserved, "the default stream reserves the whole device")
			continue
		}
		sizes = append(sizes, seg.Reserved)
	}
	first := roundUp(gib, 20*core.MiB)
	require.ElementsMatch(t, []uint64{first, 2 * first, 4 * first}, sizes, "1 + 2 + 4 GiB hold the 6 GiB")
	for _, p := range ptrs {
		require.NoError(t, a.Free(p))
	}
	require.NoError(t, a.EmptyCache())
	require.Empty(t, a.Snapshot().Segments)
}
