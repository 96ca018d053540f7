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

// TestMaxMappings: past Options.MaxMappings (a range or a plain allocation
// one, a mapped page two) Reserve, Map and MemAlloc fail with
// vmm.ErrOutOfMemory and change nothing; giving one back makes room. The
// default is three quarters of vm.max_map_count: a replay with tens of
// thousands of streams, a range each, ran the process out of mappings and
// the Go runtime died (fatal error: out of memory) instead of an
// allocation failing. An allocator on such a driver reports OOM.
func TestMaxMappings(t *testing.T) {
	_, err := host.Open(host.Options{MaxMappings: -2})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Greater(t, host.DefaultMaxMappings(), 1000, "vm.max_map_count is at least Linux's 65530 on CI machines")

	d := open(t, host.Options{MaxMappings: 4})
	r1, err := d.Reserve(8<<20, 0) // 1
	require.NoError(t, err)
	h, err := d.Create(0, 2<<20, vmm.HandleNone)
	require.NoError(t, err)
	require.NoError(t, d.Map(r1, 2<<20, h, 0)) // 3
	before := d.Usage()
	r2, err := d.Reserve(8<<20, 0) // 4: fits
	require.NoError(t, err)
	_, err = d.Reserve(8<<20, 0) // 5
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "MaxMappings")
	_, err = d.MemAlloc(0, 1<<20)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	h2, err := d.Create(0, 2<<20, vmm.HandleNone)
	require.NoError(t, err)
	require.ErrorIs(t, d.Map(r1.Add(2<<20), 2<<20, h2, 0), vmm.ErrOutOfMemory)
	u := d.Usage()
	require.Equal(t, before.Mappings, u.Mappings, "a refused map maps nothing")
	require.Equal(t, before.Ranges+1, u.Ranges)
	require.NoError(t, d.Unmap(r1, 2<<20)) // 2
	require.NoError(t, d.Map(r1.Add(2<<20), 2<<20, h2, 0), "an unmap made room")
	require.NoError(t, d.Unmap(r1.Add(2<<20), 2<<20))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Release(h2))
	require.NoError(t, d.Unreserve(r1, 8<<20))
	require.NoError(t, d.Unreserve(r2, 8<<20))
}
