package cuda

import (
	"errors"
	"os"
	"testing"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func TestMain(m *testing.M) {
	vmmtest.ChildMain(func() (vmm.Driver, error) { return Open() })
	os.Exit(m.Run())
}

// openGPU opens the driver for tb and closes it when tb ends. Without a
// driver or a device (an error matching vmm.ErrNotSupported) it skips, with
// the reason, unless XSEG_REQUIRE_GPU=1 says the GPU must be there; any
// other error fails tb.
func openGPU(tb testing.TB) *Driver {
	tb.Helper()
	d, err := Open()
	switch {
	case err == nil:
	case os.Getenv("XSEG_REQUIRE_GPU") == "1":
		tb.Fatalf("XSEG_REQUIRE_GPU=1, but the CUDA driver does not open: %v", err)
	case errors.Is(err, vmm.ErrNotSupported):
		tb.Skipf("no CUDA driver or device: %v", err)
	default:
		tb.Fatalf("opening the CUDA driver: %v", err)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("closing the CUDA driver: %v", err)
		}
	})
	return d
}
