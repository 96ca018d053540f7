package cuda

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// fakeTotal is the memory of each fake device: small, so that the
// out-of-memory cases are quick.
const fakeTotal = 1 << 30

// openFake makes a Driver over the fake f, closed when tb ends,
// after checking that it let go of every primary context it retained.
func openFake(tb testing.TB, f *fakeCUDA) *Driver {
	tb.Helper()
	d, err := open(f, 12080)
	require.NoError(tb, err)
	tb.Cleanup(func() {
		require.NoError(tb, d.Close())
		require.Equal(tb, make([]int, len(f.devs)), f.retained(), "primary contexts still retained after Close")
	})
	return d
}

// TestConformanceFake runs the vmm conformance suite against the Driver
// over the fake driver, on both of two devices: the Driver's own logic
// (books, contexts, undo paths) meets the whole contract without a GPU.
func TestConformanceFake(t *testing.T) {
	for _, dev := range []vmm.Device{0, 1} {
		t.Run(fmt.Sprintf("device%d", dev), func(t *testing.T) {
			vmmtest.Run(t, vmmtest.Config{
				Name: "cuda over the fake",
				Open: func(t testing.TB) vmm.Driver {
					d, err := open(newFake(2, fakeTotal), 12080)
					require.NoError(t, err)
					return d
				},
				Device: dev,
			})
		})
	}
}
