package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

func TestGrowbufHost(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run([]string{"-backend", "host", "-from", "8MiB", "-to", "32MiB", "-step", "2MiB"}, &out))
	s := out.String()
	t.Log("\n" + s)
	require.Contains(t, s, "8 MiB -> 32 MiB in 2 MiB steps (12 grows)")
	require.Contains(t, s, "expandable.Buffer.Grow     address kept: true, data kept (32 MiB copied back and checked)")
	require.Contains(t, s, "MemAlloc+CopyDtoD+MemFree  address kept: false, data kept (32 MiB copied back and checked)")
	require.Contains(t, s, "of which MemAlloc")
	require.Contains(t, s, "per grow, plain / buffer:")
}

// TestCheckFindsLoss proves the check can fail: a region overwritten
// after the pattern was written is found.
func TestCheckFindsLoss(t *testing.T) {
	d, err := host.Open(host.Options{Capacity: 1 << 30})
	require.NoError(t, err)
	vmmtest.CheckLeaks(t, d)
	defer func() { require.NoError(t, d.Close()) }()
	p, err := d.MemAlloc(0, 8<<20)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.MemFree(p)) }()
	require.NoError(t, fill(d, p, 0, 8<<20, 2<<20))
	require.NoError(t, check(d, p, 8<<20, 2<<20))
	require.NoError(t, d.Memset(p.Add(5<<20), 0, 1))
	require.ErrorContains(t, check(d, p, 8<<20, 2<<20), "region at offset 4194304 does not hold its pattern")
}

func TestFlags(t *testing.T) {
	_, err := parseFlags([]string{"-from", "3MiB", "-to", "8MiB"})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	c, err := parseFlags([]string{"-from", "1GiB", "-to", "16GiB"})
	require.NoError(t, err)
	require.Equal(t, uint64(7680), (c.to-c.from)/c.step)
	_, err = parseFlags([]string{"-step", "2XiB"})
	require.ErrorContains(t, err, `invalid value "2XiB" for flag -step: not a byte size`)
	_, err = parseFlags([]string{"-step", "-2MiB"})
	require.ErrorContains(t, err, "not a byte size: negative")
	// The one syntax: spaces, lower case and plain bytes are read too.
	c, err = parseFlags([]string{"-from", "1 gib", "-to", "2147483648", "-step", "512MiB"})
	require.NoError(t, err)
	require.Equal(t, config{backend: "auto", from: 1 << 30, to: 2 << 30, step: 512 << 20, baseline: true, verify: true}, c)
}
