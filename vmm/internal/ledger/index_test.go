package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// White-box tests of the granule index: where chunks are made and let go.

const (
	g2   = uint64(2 << 20)
	base = vmm.DevicePtr(0x7f00_0000_0000)
)

func granule(n uint64) vmm.DevicePtr { return base.Add(n * g2) }

// withPages returns a ledger with one reservation of n granules at base
// and pages 1..k of one granule each.
func withPages(t *testing.T, n uint64, k int) *Ledger {
	t.Helper()
	l := New(g2)
	l.AddRange(base, n*g2)
	for h := 1; h <= k; h++ {
		l.AddPage(vmm.Handle(h), 0, g2, vmm.HandleNone)
	}
	return l
}

func (l *Ledger) chunksIn(ptr vmm.DevicePtr) int {
	r := l.rangeAt(ptr)
	n := len(r.sparse)
	for _, c := range r.dir {
		if c != nil {
			n++
		}
	}
	return n
}

func TestChunksComeAndGo(t *testing.T) {
	l := withPages(t, 3*chunkLen, 3)
	r := l.rangeAt(base)
	require.Nil(t, r.dir, "an unused reservation has no directory")

	// A mapping on each side of the first chunk boundary, and one in the
	// last granule: two chunks of three.
	for i, g := range []uint64{chunkLen - 1, chunkLen, 3*chunkLen - 1} {
		_, err := l.BeginMap(granule(g), g2, vmm.Handle(i+1), 0)
		require.NoError(t, err, "granule %d", g)
	}
	require.Len(t, r.dir, 3)
	require.Equal(t, 3, l.chunksIn(base))
	for i, g := range []uint64{chunkLen - 1, chunkLen, 3*chunkLen - 1} {
		m, ok := l.Lookup(granule(g).Add(g2 - 1))
		require.True(t, ok)
		require.Equal(t, vmm.Handle(i+1), m.Handle)
	}

	ms, err := l.BeginUnmap(granule(chunkLen-1), 2*g2, nil)
	require.NoError(t, err, "one call across the chunk boundary")
	require.Len(t, ms, 2)
	require.Equal(t, 1, l.chunksIn(base), "emptied chunks are let go")
	require.Len(t, l.spare, 2, "and kept for reuse")

	l.UndoUnmap(ms)
	require.Equal(t, 3, l.chunksIn(base))
	require.Empty(t, l.spare, "reused")

	_, err = l.BeginUnmap(granule(chunkLen-1), 2*g2, nil)
	require.NoError(t, err)
	_, err = l.BeginUnmap(granule(3*chunkLen-1), g2, nil)
	require.NoError(t, err)
	require.Zero(t, l.chunksIn(base))
	require.LessOrEqual(t, len(l.spare), maxSpare)
	require.NoError(t, l.BeginUnreserve(base, 3*chunkLen*g2))
	require.Empty(t, l.ranges, "the reservation and its directory are gone")
	require.Nil(t, l.last)
}

// A mapping wider than a chunk fills slots in three chunks and leaves them
// all when it goes.
func TestMappingAcrossChunks(t *testing.T) {
	l := New(g2)
	l.AddRange(base, 4*chunkLen*g2)
	size := (chunkLen + 2) * g2
	l.AddPage(1, 0, size, vmm.HandleNone)
	m, err := l.BeginMap(granule(chunkLen-1), size, 1, 0)
	require.NoError(t, err)
	require.Equal(t, 3, l.chunksIn(base))
	for _, g := range []uint64{chunkLen - 1, chunkLen, 2*chunkLen - 1, 2 * chunkLen} {
		got, ok := l.Lookup(granule(g))
		require.True(t, ok, "granule %d", g)
		require.Equal(t, m, got)
	}
	_, ok := l.Lookup(granule(2*chunkLen + 1))
	require.False(t, ok)
	l.UndoMap(m)
	require.Zero(t, l.chunksIn(base))
	require.Zero(t, l.Usage().Mappings)
	require.Zero(t, l.Usage().MappedBytes)
}

// A reservation of more chunks than a directory may hold keeps its chunks
// in a map, and a huge one costs nothing until used.
func TestSparseReservation(t *testing.T) {
	l := New(g2)
	huge := uint64(1) << 62 // 2^41 granules: no directory could hold them
	l.AddRange(base, huge)
	l.AddPage(1, 0, g2, vmm.HandleNone)
	l.AddPage(2, 0, g2, vmm.HandleNone)
	last := base.Add(huge - g2)
	_, err := l.BeginMap(last, g2, 1, 0)
	require.NoError(t, err, "the last granule")
	_, err = l.BeginMap(granule((maxDense+5)*chunkLen), g2, 2, 0)
	require.NoError(t, err)
	r := l.rangeAt(base)
	require.Nil(t, r.dir)
	require.Len(t, r.sparse, 2)
	m, ok := l.Lookup(last.Add(g2 - 1))
	require.True(t, ok)
	require.Equal(t, vmm.Handle(1), m.Handle)

	_, err = l.BeginMap(last, 2*g2, 2, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "past the end")
	_, err = l.BeginUnmap(last, g2, nil)
	require.NoError(t, err)
	require.Len(t, r.sparse, 1)
}

// Granting access over a run with a gap changes nothing: what the walk
// granted before it met the gap is put back.
func TestGrantAccessGapUndoes(t *testing.T) {
	l := withPages(t, 8, 3)
	for i, g := range []uint64{0, 1, 3} {
		_, err := l.BeginMap(granule(g), g2, vmm.Handle(i+1), 0)
		require.NoError(t, err)
	}
	ro := []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessRead}}
	_, err := l.GrantAccess(granule(1), g2, ro)
	require.NoError(t, err)
	_, err = l.GrantAccess(granule(0), 4*g2, vmm.ReadWrite(0))
	require.ErrorIs(t, err, vmm.ErrInvalid)
	m0, _ := l.Lookup(granule(0))
	m1, _ := l.Lookup(granule(1))
	require.Empty(t, m0.Access)
	require.Equal(t, ro, m1.Access)
}
