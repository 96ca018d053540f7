package main

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
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
	require.Regexp(t, `(?m)^backend: +host$`, out)
	require.Regexp(t, `(?m)^CUDA driver: +`, out)
	require.Regexp(t, `(?m)^pidfd_getfd: +(yes|no|unknown) \(`, out)
	require.Regexp(t, `(?m)^  vmm: +yes, granularity 2 MiB \(recommended 2 MiB\)$`, out)
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
