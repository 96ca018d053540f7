package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

func TestCapacityFlag(t *testing.T) {
	var c capacityFlag
	require.Equal(t, "0", c.String(), "not given: pflag shows no default")
	for _, v := range []struct {
		in   string
		want uint64
	}{{"24GiB", 24 << 30}, {"512 MiB", 512 << 20}, {"2097152", 2 << 20}, {"1.5GiB", 3 << 29}} {
		require.NoError(t, c.Set(v.in), v.in)
		require.Equal(t, v.want, uint64(c), v.in)
	}
	require.Equal(t, "1.5 GiB", c.String())
	for in, want := range map[string]string{
		"24":    "24 bytes is not a multiple of the granularity 2 MiB; did you mean 24GiB?",
		"3MiB":  "3145728 bytes is not a multiple of the granularity 2 MiB",
		"24G":   "24000000000 bytes is not a multiple of the granularity 2 MiB",
		"0":     "want a positive multiple of the granularity 2 MiB",
		"-1GiB": "not a byte size: negative",
		"lots":  "not a byte size (want " + bytesize.Syntax + ")",
	} {
		require.EqualError(t, c.Set(in), want, in)
		require.Equal(t, uint64(3<<29), uint64(c), "a bad value changes nothing")
	}
}

// TestFlagErrorsNameTheFlag: a bad value is reported as "--flag value:
// what is wrong", once prefixed, without the usage text.
func TestFlagErrorsNameTheFlag(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--capacity", "24", tr}, "xseg: --capacity 24: 24 bytes is not a multiple of the granularity 2 MiB; did you mean 24GiB?"},
		{[]string{"replay", "--capacity", "lots", tr}, "xseg: --capacity lots: not a byte size (want " + bytesize.Syntax + ")"},
		{[]string{"info", "--capacity", "-2GiB"}, "xseg: --capacity -2GiB: not a byte size: negative"},
		// Fractions of a byte were dropped: 2 MiB and 1 GiB.
		{[]string{"info", "--capacity", "2097152.9"}, "xseg: --capacity 2097152.9: not a byte size: not a whole number of bytes: between 2097152 and 2097153"},
		{[]string{"replay", "--capacity", "1.0000000001GiB", tr}, "xseg: --capacity 1.0000000001GiB: not a byte size: not a whole number of bytes: between 1073741824 and 1073741825"},
		{[]string{"replay", "--backend", "rocm", tr}, `xseg: --backend rocm: "rocm" is not one of auto, host, cuda`},
		{[]string{"replay", "--backend", "host", "--device", "3", tr}, "xseg: --device 3: the host backend has 1 device, ordinal 0: invalid argument"},
		{[]string{"replay", "--backend", "host", "--device", "-1", tr}, "xseg: --device -1: the host backend has 1 device, ordinal 0: invalid argument"},
	} {
		_, stderr, err := run(t, c.args...)
		require.Error(t, err, c.args)
		require.Equal(t, c.want, errorLine(err), c.args)
		require.NotContains(t, stderr, "Usage:", c.args)
	}
}

func TestEnumFlag(t *testing.T) {
	e := newEnum("auto", "auto", "host", "cuda")
	require.Equal(t, "auto|host|cuda", e.Type())
	require.NoError(t, e.Set("host"))
	require.Equal(t, "host", e.String())
	err := e.Set("rocm")
	require.ErrorContains(t, err, `"rocm" is not one of auto, host, cuda`)
	require.Equal(t, "host", e.String(), "a bad value changes nothing")
}

// --capacity above host.MaxCapacity is refused at parsing: 1 EiB was
// accepted, info said "1 EiB total", and a 100-byte allocation then failed
// with an out-of-memory error whose cause (ENOMEM reserving the capacity
// as address space) came last.
func TestCapacityFlagMax(t *testing.T) {
	const want = "more than 4 TiB, the most a host-backend device may have: its memory is reserved as address space, " +
		"once for each range of the allocator, and x86-64 gives a process 128 TiB"
	var c capacityFlag
	require.NoError(t, c.Set("4TiB"))
	require.Equal(t, host.MaxCapacity, uint64(c))
	for _, in := range []string{"1EiB", "4100GiB", "128TiB", "64TiB"} {
		require.EqualError(t, c.Set(in), want, in)
		require.Equal(t, host.MaxCapacity, uint64(c), "a bad value changes nothing")
	}
	tr := writeTrace(t, "a.trace", synthetic)
	for _, args := range [][]string{{"info", "--capacity", "1EiB"}, {"replay", "--backend", "host", "--capacity", "1EiB", tr}} {
		out, stderr, err := run(t, args...)
		require.Error(t, err, args)
		require.Equal(t, "xseg: --capacity 1EiB: "+want, errorLine(err), args)
		require.Empty(t, out, args)
		require.NotContains(t, stderr, "Usage:", args)
	}
	// libxseg's XSEG_HOST_CAPACITY goes to xseg.OpenDriver, which host.Open
	// checks.
	_, err := xseg.OpenDriver(xseg.BackendHost, 1<<60)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "xseg: opening the host backend: host: capacity 1152921504606846976 is more than MaxCapacity")
}
