package vmmtest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestFaultyGetAccess fails a GetAccess call: the error is injected, counted,
// and the next call reaches the driver.
func TestFaultyGetAccess(t *testing.T) {
	f := openFaulty(t)
	const g = 2 << 20
	p, err := f.Reserve(g, 0)
	require.NoError(t, err)
	h, err := f.Create(1, g, vmm.HandleNone)
	require.NoError(t, err)
	require.NoError(t, f.Map(p, g, h, 0))
	require.NoError(t, f.SetAccess(p, g, vmm.ReadWrite(1)))
	f.FailNth(vmmtest.OpGetAccess, 1, nil)
	_, err = f.GetAccess(p, 1)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	got, err := f.GetAccess(p, 1)
	require.NoError(t, err)
	require.Equal(t, vmm.AccessReadWrite, got)
	require.Equal(t, 2, f.Calls(vmmtest.OpGetAccess))
	require.NoError(t, f.Unmap(p, g))
	require.NoError(t, f.Release(h))
	require.NoError(t, f.Unreserve(p, g))
}
