package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]uint64{
		"0":         0,
		"1000":      1000,
		"141GiB":    141 << 30,
		"141 gib":   141 << 30,
		"24G":       24 << 30,
		"2MiB":      2 << 20,
		"1.5TB":     1.5e12,
		"0.5KiB":    512,
		"10b":       10,
		"3tib":      3 << 40,
		"16777216k": 16 << 30,
	} {
		got, err := parseBytes(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "GiB", "-1", "12XB", "1e9", "18446744073709551616", "17179869184GiB", "1.2.3G", "nan"} {
		_, err := parseBytes(in)
		require.Error(t, err, in)
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
