package core_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// reuser is what libxseg's free queue asks of an allocator.
type reuser interface {
	allocator
	AllocReusable(size uint64, s vmm.Stream) (vmm.DevicePtr, bool, error)
	CountReused(ptr vmm.DevicePtr) error
}

// TestAllocReusable: a block of the warm path may be taken back; not while
// history is recorded, in a private pool's route, or under a release
// threshold. Errors are Alloc's.
func TestAllocReusable(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.DefaultConfig()).(reuser)
		p, ok, err := a.AllocReusable(1000, 0)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, a.Free(p))
		p, ok, err = a.AllocReusable(2<<20, 0)
		require.NoError(t, err)
		if k.name == "expandable" { // fallback's pages are its segments
			require.False(t, ok, "a block of a whole page is reusable")
		}
		require.NoError(t, a.Free(p))

		require.NoError(t, a.RecordHistory(10))
		p, ok, err = a.AllocReusable(1000, 0)
		require.NoError(t, err)
		require.False(t, ok, "reusable while history is recorded")
		require.NoError(t, a.RecordHistory(0))
		require.NoError(t, a.Free(p))

		id := core.PoolID{First: 1, Second: 7}
		require.NoError(t, a.BeginAllocateToPool(id, func(vmm.Stream) bool { return true }))
		p, ok, err = a.AllocReusable(1000, 0)
		require.NoError(t, err)
		require.False(t, ok, "reusable in a private pool's route")
		require.NoError(t, a.EndAllocateToPool(id))
		require.NoError(t, a.Free(p))
		require.NoError(t, a.ReleasePool(id))

		_, ok, err = a.AllocReusable(0, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		require.False(t, ok)
		_, ok, err = a.AllocReusable(1<<40, 0)
		require.ErrorIs(t, err, vmm.ErrOutOfMemory)
		require.False(t, ok)

		cfg := core.DefaultConfig()
		cfg.ReleaseThreshold = 64 << 20
		b := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), cfg).(reuser)
		p, ok, err = b.AllocReusable(1000, 0)
		require.NoError(t, err)
		require.False(t, ok, "reusable under a release threshold")
		require.NoError(t, b.Free(p))
	})
}

// TestCountReused: a pair taken back counts as one allocation and one free
// of the block in the accumulated statistics, and moves no current value
// or peak; blocks that are not allocated are refused, changing nothing.
func TestCountReused(t *testing.T) {
	forKinds(t, func(t *testing.T, k kind) {
		a := newAlloc(t, k, vmmtest.HostDriver(t, 1<<30), core.DefaultConfig()).(reuser)
		p, err := a.Alloc(1000, 0)
		require.NoError(t, err)
		q, err := a.Alloc(3<<20, 0)
		require.NoError(t, err)
		require.NoError(t, a.Free(q))
		before := a.Stats()
		require.NoError(t, a.CountReused(p))
		require.NoError(t, a.CountReused(p))
		after := a.Stats()
		require.Equal(t, before.Allocations.All.Allocated+2, after.Allocations.All.Allocated)
		require.Equal(t, before.Allocations.All.Freed+2, after.Allocations.All.Freed)
		require.Equal(t, before.AllocatedBytes.All.Allocated+2*1024, after.AllocatedBytes.All.Allocated)
		require.Equal(t, before.AllocatedBytes.All.Freed+2*1024, after.AllocatedBytes.All.Freed)
		require.Equal(t, before.RequestedBytes.All.Allocated+2000, after.RequestedBytes.All.Allocated)
		require.Equal(t, before.AllocatedBytes.All.Current, after.AllocatedBytes.All.Current)
		require.Equal(t, before.AllocatedBytes.All.Peak, after.AllocatedBytes.All.Peak)
		require.Equal(t, before.ActiveBytes.All.Current, after.ActiveBytes.All.Current)
		require.Equal(t, before.ActiveBytes.All.Peak, after.ActiveBytes.All.Peak)
		require.Equal(t, before.ActiveBytes.All.Allocated+2*1024, after.ActiveBytes.All.Allocated, "active bytes share the allocated totals")

		require.ErrorIs(t, a.CountReused(q), vmm.ErrInvalid, "a free block")
		require.ErrorIs(t, a.CountReused(p+512), vmm.ErrInvalid, "an interior pointer")
		require.ErrorIs(t, a.CountReused(0), vmm.ErrInvalid)
		require.Equal(t, after, a.Stats(), "refusals changed the statistics")

		// With history on, the pair shows as a free and an allocation.
		require.NoError(t, a.RecordHistory(10))
		require.NoError(t, a.CountReused(p))
		require.Equal(t, []string{"free_requested", "free_completed", "alloc"}, actions(a.History()))
		require.NoError(t, a.RecordHistory(0))
		require.NoError(t, a.Free(p))

		// After Close, the error says so (libxseg's free queue may
		// still hold a pointer then).
		r, err := a.Alloc(1000, 0)
		require.NoError(t, err)
		require.NoError(t, a.Close())
		require.ErrorIs(t, a.CountReused(r), vmm.ErrClosed)
	})
}
