package host_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// A capacity above MaxCapacity is refused by Open: it was accepted (1 EiB
// included), and the first allocation then failed with an out-of-memory
// error whose cause, ENOMEM reserving the capacity as address space, came
// last. libxseg's XSEG_HOST_CAPACITY reaches Open through xseg.OpenDriver.
func TestOpenRefusesCapacityAboveMax(t *testing.T) {
	for _, c := range []uint64{host.MaxCapacity + host.DefaultGranularity, 128 << 40, 1 << 60} {
		d, err := host.Open(host.Options{Capacity: c})
		require.ErrorIs(t, err, vmm.ErrInvalid, c)
		require.Nil(t, d)
		require.ErrorContains(t, err, "more than MaxCapacity 4398046511104 (4 TiB)", c)
		require.ErrorContains(t, err, "address space", c)
	}
	d, err := host.Open(host.Options{Capacity: host.MaxCapacity})
	require.NoError(t, err, "MaxCapacity itself is allowed")
	info, err := d.DeviceInfo(0)
	require.NoError(t, err)
	require.Equal(t, host.MaxCapacity, info.TotalMemory)
	p, err := d.Reserve(host.MaxCapacity, 0)
	require.NoError(t, err, "a device's whole capacity can be reserved")
	require.NoError(t, d.Unreserve(p, host.MaxCapacity))
	require.NoError(t, d.Close())
}
