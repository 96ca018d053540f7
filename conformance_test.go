package xseg_test

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/internal/alloctest"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/host"
)

func expandableOn(t testing.TB, d vmm.Driver) xseg.Allocator {
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Driver: d, Allocator: "expandable", Config: &cfg})
	require.NoError(t, err)
	return a
}

// TestAllocatorConformanceHost runs the allocator suite on the host backend
// (4 GiB per device, so out-of-memory paths are reached quickly).
func TestAllocatorConformanceHost(t *testing.T) {
	alloctest.Run(t, alloctest.Config{
		Name: "expandable-host",
		Driver: func(t testing.TB) vmm.Driver {
			d, err := host.Open(host.Options{Capacity: 4 << 30})
			require.NoError(t, err)
			return d
		},
		Open: expandableOn,
	})
}

// TestAllocatorConformanceCUDA runs the same suite on a GPU. It skips when
// no driver or device is present, and fails then if XSEG_REQUIRE_GPU=1.
func TestAllocatorConformanceCUDA(t *testing.T) {
	probe, err := cuda.Open()
	if err != nil {
		if errors.Is(err, vmm.ErrNotSupported) && os.Getenv("XSEG_REQUIRE_GPU") != "1" {
			t.Skipf("no CUDA driver or device: %v", err)
		}
		t.Fatalf("opening CUDA (XSEG_REQUIRE_GPU=%q): %v", os.Getenv("XSEG_REQUIRE_GPU"), err)
	}
	require.NoError(t, probe.Close())
	alloctest.Run(t, alloctest.Config{
		Name: "expandable-cuda",
		Driver: func(t testing.TB) vmm.Driver {
			d, err := cuda.Open()
			require.NoError(t, err)
			return d
		},
		Open: expandableOn,
	})
}
