package vmmtest_test

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// hostOptions keep capacity errors quick: 1 GiB a device, two devices so
// that device ordinals are exercised. (Package vmm/host runs the suite itself;
// here it runs through the wrapper, which must be transparent.)
var hostOptions = host.Options{Devices: 2, Capacity: 1 << 30}

func TestMain(m *testing.M) {
	vmmtest.ChildMain(func() (vmm.Driver, error) { return host.Open(hostOptions) })
	os.Exit(m.Run())
}

func openHost(t testing.TB) vmm.Driver {
	d, err := host.Open(hostOptions)
	require.NoError(t, err, "host.Open")
	return d
}

// TestFaultyHost runs the suite through a Faulty with nothing armed: the
// wrapper must be transparent.
func TestFaultyHost(t *testing.T) {
	vmmtest.Run(t, vmmtest.Config{Name: "faulty host", Open: func(t testing.TB) vmm.Driver {
		return vmmtest.NewFaulty(openHost(t))
	}})
}
