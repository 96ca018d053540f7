package host_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// conformanceOptions: two devices, so that the suite also runs on a device
// other than 0, and a capacity that makes out-of-memory cases quick.
var conformanceOptions = host.Options{Devices: 2, Capacity: 1 << 30}

func TestMain(m *testing.M) {
	vmmtest.ChildMain(func() (vmm.Driver, error) { return host.Open(conformanceOptions) })
	os.Exit(m.Run())
}

func openConformance(t testing.TB) vmm.Driver {
	d, err := host.Open(conformanceOptions)
	require.NoError(t, err, "host.Open")
	return d
}

func TestConformance(t *testing.T) {
	for _, dev := range []vmm.Device{0, 1} {
		name := fmt.Sprintf("device%d", dev)
		t.Run(name, func(t *testing.T) {
			vmmtest.Run(t, vmmtest.Config{
				Name:         "host " + name,
				Open:         openConformance,
				Device:       dev,
				CrossProcess: true,
			})
		})
	}
}
