package core

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// TestChainCyclesBooks follows the books of Config.SettleChains on one
// segment: a page completes a cycle when a chain growth mapped it and a
// growth recycled it; any other unmap ends its chain without a cycle, and
// an unmapped span reports the most cycles of its pages.
func TestChainCyclesBooks(t *testing.T) {
	const ps = 2 << 20
	s := &Seg{Base: vmm.DevicePtr(1 << 40), Size: 64 * ps, PageSize: ps}
	at := func(i int) vmm.DevicePtr { return s.Base.Add(uint64(i) * ps) }

	require.Zero(t, s.noteUnmapped(at(0), 4*ps, true), "no chain yet")
	require.Nil(t, s.chained, "books made for nothing")

	s.noteMapped(at(2), 3*ps, true) // pages 2, 3, 4
	require.Len(t, s.chained, 3)
	for round := uint8(1); round <= 3; round++ {
		require.Equal(t, round, s.noteUnmapped(at(3), 2*ps, true), "round %d", round) // pages 3, 4
		require.Zero(t, s.noteUnmapped(at(5), ps, true), "page 5 was never chained")
		s.noteMapped(at(3), 2*ps, true)
	}
	require.Equal(t, uint8(1), s.noteUnmapped(at(2), ps, true), "page 2 went round once")
	// An unmap that is not a growth's (EmptyCache, a split) ends the
	// chain and counts no cycle, but a hole still reports the pages' count.
	require.Equal(t, uint8(3), s.noteUnmapped(at(3), 2*ps, false))
	require.Empty(t, s.chained)
	// Pages mapped by any other growth are no chain's.
	s.noteMapped(at(3), 2*ps, true)
	s.noteMapped(at(3), 2*ps, false)
	require.Empty(t, s.chained)
	require.Equal(t, uint8(3), s.noteUnmapped(at(3), 2*ps, true), "no cycle without a chain")
	// The count saturates.
	for range 300 {
		s.noteMapped(at(10), ps, true)
		s.noteUnmapped(at(10), ps, true)
	}
	require.Equal(t, uint8(255), s.cycles[10])
}
