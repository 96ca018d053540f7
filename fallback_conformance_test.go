package xseg_test

import (
	"errors"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/internal/alloctest"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/host"
)

var _ xseg.Allocator = (*fallback.Allocator)(nil)

func fallbackOn(t testing.TB, d vmm.Driver) xseg.Allocator {
	cfg := xseg.DefaultConfig()
	a, err := xseg.Open(xseg.Options{Driver: d, Allocator: "fallback", Config: &cfg})
	require.NoError(t, err)
	require.Equal(t, xseg.AllocatorFallback, a.Kind())
	return a
}

// TestAllocatorConformanceFallbackHost runs the allocator suite on the
// fallback allocator over the host backend's plain allocations.
func TestAllocatorConformanceFallbackHost(t *testing.T) {
	alloctest.Run(t, alloctest.Config{
		Name: "fallback-host",
		Driver: func(t testing.TB) vmm.Driver {
			d, err := host.Open(host.Options{Capacity: 4 << 30})
			require.NoError(t, err)
			return d
		},
		Open: fallbackOn,
	})
}

// TestAllocatorConformanceFallbackNoVMM runs the suite where the choice
// is automatic, on a device that reports no VMM.
func TestAllocatorConformanceFallbackNoVMM(t *testing.T) {
	alloctest.Run(t, alloctest.Config{
		Name: "fallback-novmm",
		Driver: func(t testing.TB) vmm.Driver {
			d, err := host.Open(host.Options{Capacity: 4 << 30})
			require.NoError(t, err)
			return noVMM{d}
		},
		Open: func(t testing.TB, d vmm.Driver) xseg.Allocator {
			cfg := xseg.DefaultConfig()
			a, err := xseg.Open(xseg.Options{Driver: d, Config: &cfg})
			require.NoError(t, err)
			require.Equal(t, xseg.AllocatorFallback, a.Kind())
			return a
		},
	})
}

// TestAllocatorConformanceFallbackCUDA runs the suite on the fallback
// allocator over cuMemAlloc. It skips when no driver or device is
// present, and fails then if XSEG_REQUIRE_GPU=1.
func TestAllocatorConformanceFallbackCUDA(t *testing.T) {
	probe, err := cuda.Open()
	if err != nil {
		if errors.Is(err, vmm.ErrNotSupported) && os.Getenv("XSEG_REQUIRE_GPU") != "1" {
			t.Skipf("no CUDA driver or device: %v", err)
		}
		t.Fatalf("opening CUDA (XSEG_REQUIRE_GPU=%q): %v", os.Getenv("XSEG_REQUIRE_GPU"), err)
	}
	require.NoError(t, probe.Close())
	alloctest.Run(t, alloctest.Config{
		Name: "fallback-cuda",
		Driver: func(t testing.TB) vmm.Driver {
			d, err := cuda.Open()
			require.NoError(t, err)
			return d
		},
		Open: fallbackOn,
	})
}
