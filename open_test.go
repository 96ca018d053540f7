package xseg_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

var _ xseg.Allocator = (*expandable.Allocator)(nil)

func TestOpenHost(t *testing.T) {
	a, err := xseg.Open(xseg.Options{Backend: "host", HostCapacity: 1 << 30})
	require.NoError(t, err)
	p, err := a.Alloc(3<<20, 0)
	require.NoError(t, err)
	require.NotZero(t, p)
	require.Equal(t, int64(3<<20), a.Stats().AllocatedBytes.All.Current)
	require.NoError(t, a.Free(p))
	require.NoError(t, a.Close())
	_, err = a.Alloc(1, 0)
	require.ErrorIs(t, err, vmm.ErrClosed)
}

func TestOpenGivenDriverIsNotClosed(t *testing.T) {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	defer d.Close()
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Driver: d, Config: &cfg})
	require.NoError(t, err)
	_, err = a.Alloc(1<<20, 0)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	require.True(t, d.Usage().Zero(), "allocator left %v", d.Usage())
	_, err = d.DeviceCount()
	require.NoError(t, err, "the driver given to Open must stay open")
}

func TestOpenRefusals(t *testing.T) {
	_, err := xseg.Open(xseg.Options{Backend: "host", Allocator: "bogus"})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = xseg.OpenDriver("tpu", 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	t.Setenv("XSEG_CONF", "no_such_key:1")
	_, err = xseg.Open(xseg.Options{Backend: "host"})
	require.ErrorContains(t, err, "no_such_key")
}

func TestOpenAutoFallsBackToHost(t *testing.T) {
	d, err := xseg.OpenDriver("auto", 1<<30)
	require.NoError(t, err)
	defer d.Close()
	require.Contains(t, []string{"host", "cuda"}, d.Backend())
}
