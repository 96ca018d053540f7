package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// run runs the command line with args and returns stdout, stderr and the
// error.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := newRootCmd(&stdout, &stderr)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return stdout.String(), stderr.String(), err
}

// requireGPU reports whether the GPU runs demand a driver.
func requireGPU() bool { return os.Getenv("XSEG_REQUIRE_GPU") == "1" }

func TestInfoJSON(t *testing.T) {
	out, _, err := run(t, "info", "--json")
	require.NoError(t, err)
	var rep infoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.NotEmpty(t, rep.Devices)
	d0 := rep.Devices[0]
	require.Empty(t, d0.Error)
	require.True(t, d0.VMM)
	require.NotZero(t, d0.TotalMemory)
	require.NotZero(t, d0.Granularity)
	require.Equal(t, xseg.AllocatorExpandable, d0.Allocator, "a device with VMM gets the expandable allocator")
	require.Contains(t, d0.AllocatorReason, "auto: ")
	require.Contains(t, rep.BackendReason, "auto: ")
	if rep.CUDA.Available {
		require.Equal(t, "cuda", rep.Backend)
		require.NotZero(t, rep.DriverVersion)
		return
	}
	require.False(t, requireGPU(), "XSEG_REQUIRE_GPU=1 but no CUDA driver: %s", rep.CUDA.Reason)
	require.Equal(t, "host", rep.Backend, "no driver here: the host backend is described")
	require.Contains(t, rep.CUDA.Reason, vmm.ErrNotSupported.Error())
	require.Zero(t, rep.DriverVersion)
	require.Equal(t, uint64(2<<20), d0.Granularity)
	require.True(t, d0.PosixFD)
	require.False(t, d0.Fabric)
	require.Equal(t, d0.TotalMemory, d0.FreeMemory, "a fresh host driver has nothing allocated")
}

func TestInfoText(t *testing.T) {
	out, _, err := run(t, "info", "--backend", "host")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^backend: +host: simulated GPUs on host memory \(asked for\)$`, out)
	require.Regexp(t, `(?m)^CUDA driver: +`, out)
	require.Regexp(t, `(?m)^pidfd_getfd: +(yes|no|unknown) \(`, out)
	require.Regexp(t, `(?m)^  vmm: +yes, granularity 2 MiB \(recommended 2 MiB\)$`, out)
	require.Regexp(t, `(?m)^  allocator: +expandable \(auto: device 0 \(.*\) of the host backend supports virtual memory management\)$`, out)
}

func TestInfoForcedAllocator(t *testing.T) {
	out, _, err := run(t, "info", "--backend", "host", "--allocator", "fallback", "--json")
	require.NoError(t, err)
	var rep infoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.Equal(t, "asked for", rep.BackendReason)
	require.Equal(t, xseg.AllocatorFallback, rep.Devices[0].Allocator)
	require.Contains(t, rep.Devices[0].AllocatorReason, "asked for")
	_, _, err = run(t, "info", "--allocator", "slab")
	require.ErrorContains(t, err, `"slab" is not one of auto, expandable, fallback`)
}

// noVMM is a driver whose devices report no virtual memory management.
type noVMM struct{ vmm.Driver }

func (n noVMM) DeviceInfo(dev vmm.Device) (vmm.DeviceInfo, error) {
	info, err := n.Driver.DeviceInfo(dev)
	info.VMM = false
	return info, err
}

// TestInfoDeviceWithoutVMM: on a device that reports no VMM, info says
// that auto chooses fallback and why, and that expandable cannot be had.
func TestInfoDeviceWithoutVMM(t *testing.T) {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	defer func() { require.NoError(t, d.Close()) }()
	rep := &infoReport{Devices: []deviceReport{}}
	require.NoError(t, describe(noVMM{d}, rep, "auto"))
	d0 := rep.Devices[0]
	require.False(t, d0.VMM)
	require.Equal(t, xseg.AllocatorFallback, d0.Allocator)
	require.Contains(t, d0.AllocatorReason, "has no virtual memory management")
	var text bytes.Buffer
	require.NoError(t, printInfo(&text, rep))
	require.Regexp(t, `(?m)^  allocator: +fallback \(auto: .* has no virtual memory management, so segments are plain allocations\)$`, text.String())

	rep = &infoReport{Devices: []deviceReport{}}
	require.NoError(t, describe(noVMM{d}, rep, "expandable"))
	require.Empty(t, rep.Devices[0].Allocator)
	require.Contains(t, rep.Devices[0].AllocatorError, vmm.ErrNotSupported.Error())
	text.Reset()
	require.NoError(t, printInfo(&text, rep))
	require.Regexp(t, `(?m)^  allocator: +none: .*has no virtual memory management`, text.String())
}

func TestInfoCUDAWithoutDriver(t *testing.T) {
	_, _, err := run(t, "info", "--backend", "cuda")
	if err == nil {
		return // a driver is here; TestInfoJSON covers it
	}
	require.False(t, requireGPU(), "XSEG_REQUIRE_GPU=1 but no CUDA driver: %v", err)
	require.ErrorIs(t, err, vmm.ErrNotSupported)
}

func TestInfoBadFlag(t *testing.T) {
	_, _, err := run(t, "info", "--backend", "rocm")
	require.ErrorContains(t, err, `"rocm" is not one of auto, host, cuda`)
	_, _, err = run(t, "info", "extra")
	require.Error(t, err)
}

// TestInfoHostSimulated: the host backend's device is said to be a
// simulation, with its made-up uuid and the configured capacity.
func TestInfoHostSimulated(t *testing.T) {
	out, _, err := run(t, "info", "--backend", "host", "--capacity", "24GiB")
	require.NoError(t, err)
	require.Regexp(t, `(?m)^device 0: +xseg host device 0: simulated GPU on host memory$`, out)
	require.Regexp(t, `(?m)^  uuid: +GPU-[0-9a-f-]+ \(made up by the host backend\)$`, out)
	require.Regexp(t, `(?m)^  memory: +24 GiB total \(the host backend's configured capacity\), 24 GiB free$`, out)
	require.NotContains(t, out, "141", "the default capacity is not shown when another is set")
	require.NotContains(t, out, "xseg: ", "no error text inside the report keeps package xseg's prefix")

	out, _, err = run(t, "info", "--backend", "host", "--json")
	require.NoError(t, err)
	var rep infoReport
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	require.True(t, rep.Devices[0].Simulated)
	require.Equal(t, uint64(141<<30), rep.Devices[0].TotalMemory, "the default capacity")

	_, _, err = run(t, "info", "--backend", "cuda", "--capacity", "24GiB")
	require.ErrorContains(t, err, "--capacity sets the host backend's memory")
}

// TestBare: an error of package xseg inside another message loses its
// prefix, and errors.Is still finds its cause.
func TestBare(t *testing.T) {
	_, err := xseg.OpenDriver("tpu", 0)
	wrapped := fmt.Errorf("trace: opening the allocator: %w", bare(err))
	require.Equal(t, `xseg: trace: opening the allocator: unknown backend "tpu" (want auto, host or cuda): invalid argument`, errorLine(wrapped))
	require.ErrorIs(t, wrapped, vmm.ErrInvalid)
	plain := errors.New("no prefix")
	require.Same(t, plain, bare(plain))
	require.NoError(t, bare(nil))
}

// A bad XSEG_CONF fails info, with the parser's message, as it fails
// xseg.Open: info said (exit 0) it would choose expandable.
func TestInfoBadEnvConfig(t *testing.T) {
	t.Setenv("XSEG_CONF", "foo:1")
	for _, args := range [][]string{{"info"}, {"info", "--json"}, {"info", "--backend", "host", "--allocator", "fallback"}} {
		out, _, err := run(t, args...)
		require.Error(t, err, args)
		require.True(t, strings.HasPrefix(errorLine(err), `xseg: environment XSEG_CONF: config: unknown key "foo" (the keys: chunk_mb,`), "%s: %s", args, errorLine(err))
		require.Empty(t, out, args)
	}
	t.Setenv("XSEG_CONF", "size_classes:1")
	_, _, err := run(t, "info", "--backend", "host")
	require.NoError(t, err, "a good one changes nothing")
}
