package host_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// A 25 GB replay's worth of 2 MiB pages (12,000) mapped one after another
// costs neither an fd nor a kernel mapping per page, so it stays far from
// `ulimit -n` and vm.max_map_count.
func TestTwelveThousandPages(t *testing.T) {
	const n = 12000
	d := open(t, host.Options{})
	size := uint64(n) * gran
	ptr, err := d.Reserve(size, 0)
	require.NoError(t, err)
	fds := fdCount(t)
	hs := make([]vmm.Handle, n)
	for i := range hs {
		hs[i], err = d.Create(0, gran, vmm.HandleNone)
		require.NoError(t, err)
		require.NoError(t, d.Map(ptr.Add(uint64(i)*gran), gran, hs[i], 0))
	}
	require.NoError(t, d.SetAccess(ptr, size, vmm.ReadWrite(0)))
	require.Equal(t, fds, fdCount(t))
	require.Equal(t, 1, vmasIn(t, ptr, size))
	require.NoError(t, d.Memset(ptr.Add(size-4096), 1, 4096), "the last page is usable")

	require.NoError(t, d.Unmap(ptr, size), "one call for the whole run")
	for _, h := range hs {
		require.NoError(t, d.Release(h))
	}
	require.NoError(t, d.Unreserve(ptr, size))
}
