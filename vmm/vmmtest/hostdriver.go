package vmmtest

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm/host"
)

// HostDriver opens a host-backend driver of the given capacity (0: the
// default) that the test closes at its end, after checking that nothing
// leaked: the driver of the allocators' tests on a machine without a GPU.
func HostDriver(t testing.TB, capacity uint64) *host.Driver {
	t.Helper()
	d, err := host.Open(host.Options{Capacity: capacity})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	CheckLeaks(t, d)
	return d
}
