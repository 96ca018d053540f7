package cuda

import (
	"testing"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestConformance runs the vmm conformance suite against the CUDA driver,
// its export/import test across two processes too. It skips without a GPU
// (fails under XSEG_REQUIRE_GPU=1).
func TestConformance(t *testing.T) {
	openGPU(t) // skip early, with the reason, where there is no GPU
	vmmtest.Run(t, vmmtest.Config{
		Name: "cuda",
		Open: func(t testing.TB) vmm.Driver {
			d, err := Open()
			if err != nil {
				t.Fatalf("opening the CUDA driver: %v", err)
			}
			return d
		},
		Device:       0,
		CrossProcess: true,
	})
}
