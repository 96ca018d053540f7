package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestSteadyNeverSteals: under SteadyConfig a growth makes pages and
// leaves the free pages elsewhere mapped, where the default would move
// them; only an allocation that runs out of memory unmaps them (the OOM
// policy), and then succeeds.
func TestSteadyNeverSteals(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		unmaps bool
	}{{"steady", SteadyConfig(), false}, {"default", DefaultConfig(), true}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAlloc(t, vmmtest.HostDriver(t, 512*mib), tc.cfg)
			held, err := alloc(a, 40*mib, 2*mib)
			require.NoError(t, err)
			require.NoError(t, a.Free(held[0]))
			p, err := a.Alloc(60*mib, 0)
			require.NoError(t, err)
			st := a.Stats()
			require.Equal(t, tc.unmaps, st.Unmaps > 0, "unmaps %d", st.Unmaps)
			if !tc.unmaps {
				require.EqualValues(t, 102*mib, st.ReservedBytes.All.Current, "the 40 MiB freed stay mapped")
			}
			require.NoError(t, a.Free(p))
		})
	}
	// A growth maps its inside as chunks of up to 64 MiB, and a block
	// carved from a freed chunk does not split it: nothing is unmapped.
	t.Run("chunks", func(t *testing.T) {
		a := newAlloc(t, vmmtest.HostDriver(t, 512*mib), SteadyConfig())
		p, err := a.Alloc(100*mib, 0)
		require.NoError(t, err)
		st := a.Stats()
		maps := st.Maps
		require.True(t, maps >= 2 && maps <= 3, "100 MiB in chunks of up to 64 MiB (and a last page), not 50 pages: %d maps", maps)
		require.NoError(t, a.Free(p))
		q, err := a.Alloc(10*mib, 0)
		require.NoError(t, err)
		st = a.Stats()
		require.Zero(t, st.Unmaps, "a chunk split")
		require.Equal(t, maps, st.Maps)
		require.EqualValues(t, 100*mib, st.ReservedBytes.All.Current)
		require.NoError(t, a.Free(q))
		require.NoError(t, a.EmptyCache())
		require.Zero(t, a.Stats().ReservedBytes.All.Current, "EmptyCache gives the chunks back whole")
	})
	t.Run("oom", func(t *testing.T) {
		a := newAlloc(t, vmmtest.HostDriver(t, 512*mib), SteadyConfig())
		require.NoError(t, freeHalves(a))
		p, err := a.Alloc(220*mib, 0) // 304 mapped of 512, no free block of 220: only with the free 300 given back
		require.NoError(t, err)
		st := a.Stats()
		require.Positive(t, st.Unmaps)
		require.LessOrEqual(t, st.ReservedBytes.All.Current, int64(512*mib))
		require.NoError(t, a.Free(p))
	})
}

// freeHalves leaves two free blocks of 150 MiB, each followed by a live
// one of 2 MiB: 304 MiB mapped, no free block of more than 150.
func freeHalves(a *Allocator) error {
	held, err := alloc(a, 150*mib, 2*mib, 150*mib, 2*mib)
	if err != nil {
		return err
	}
	if err := a.Free(held[0]); err != nil {
		return err
	}
	return a.Free(held[2])
}
