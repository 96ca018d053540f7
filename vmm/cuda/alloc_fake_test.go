package cuda

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// nullVMM is a fake whose page calls do nothing and allocate nothing, so
// that AllocsPerRun over it counts the Driver's own allocations.
type nullVMM struct {
	*fakeCUDA
	next vmm.Handle
}

func (*nullVMM) memMap(cuContext, vmm.DevicePtr, uint64, uint64, vmm.Handle) error { return nil }
func (*nullVMM) memUnmap(cuContext, vmm.DevicePtr, uint64) error                   { return nil }
func (*nullVMM) memSetAccess(cuContext, vmm.DevicePtr, uint64, []vmm.AccessDesc) error {
	return nil
}
func (*nullVMM) memRelease(cuContext, vmm.Handle) error { return nil }
func (n *nullVMM) memCreate(cuContext, uint64, cuDevice, vmm.HandleType, bool) (vmm.Handle, error) {
	n.next++
	return n.next, nil
}
func (*nullVMM) eventQuery(cuContext, vmm.Event) (bool, error) { return false, nil }

// TestHotPathAllocs checks that the calls of the hot path (a page's
// create, map, access, unmap and release, and an event query) allocate
// nothing in the Driver beyond what the books do, measured over a symbol
// table that allocates nothing.
func TestHotPathAllocs(t *testing.T) {
	f := newFake(1, fakeTotal)
	d := openFake(t, f)
	p, err := d.Reserve(gran, 0)
	require.NoError(t, err)
	e, err := d.EventCreate(0)
	require.NoError(t, err)
	d.sym = &nullVMM{fakeCUDA: f}
	access := vmm.ReadWrite(0)
	cycle := func() {
		h, err := d.Create(0, gran, vmm.HandleNone)
		require.NoError(t, err)
		require.NoError(t, d.Map(p, gran, h, 0))
		require.NoError(t, d.SetAccess(p, gran, access))
		require.NoError(t, d.Unmap(p, gran))
		require.NoError(t, d.Release(h))
	}
	cycle()
	require.Zero(t, testing.AllocsPerRun(100, cycle), "allocations in a page's cycle")
	require.Zero(t, testing.AllocsPerRun(100, func() {
		done, err := d.EventQuery(e)
		require.NoError(t, err)
		require.False(t, done)
	}), "allocations in EventQuery")
	d.sym = f
	require.NoError(t, d.EventDestroy(e))
	require.NoError(t, d.Unreserve(p, gran))
}
