package bytesize

import (
	"errors"
	"flag"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]uint64{
		"0":                    0,
		"1000000":              1000000,
		"24GiB":                24 << 30,
		" 24 gib ":             24 << 30,
		"512MiB":               512 << 20,
		"2Mi":                  2 << 20,
		"1.5TB":                1.5e12,
		"0.5KiB":               512,
		"10B":                  10,
		"3tib":                 3 << 40,
		"24GB":                 24e9,
		"24G":                  24e9, // humanize: a bare G is SI
		"18446744073709551615": 1<<64 - 1,
		"15EiB":                15 << 60,
		// Decimals that make whole bytes, in exact arithmetic: 4.35 *
		// 10^6 in float64 is 4349999.999..., which humanize truncates.
		"4.35MB":   4350000,
		"2.0":      2,
		"1,000.5K": 1000500,
		"0.001KB":  1,
	} {
		got, err := Parse(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for in, why := range map[string]string{
		"":                     "empty",
		"   ":                  "empty",
		"-1":                   "negative",
		"-1GiB":                "negative",
		"+5":                   "want a number",
		"GiB":                  "want a number",
		"nan":                  "want a number",
		".5GiB":                "want a number",
		"12XB":                 "want a number",
		"1e9":                  "want a number",
		"1.2.3G":               "want a number",
		"18446744073709551616": "larger than 16 EiB",
		"17179869184GiB":       "larger than 16 EiB",
		"16EiB":                "larger than 16 EiB",
		// Sizes that are not whole bytes were truncated.
		"2097152.9":                   "not a whole number of bytes: between 2097152 and 2097153",
		"1.0000000001GiB":             "not a whole number of bytes: between 1073741824 and 1073741825",
		"0.5":                         "not a whole number of bytes: between 0 and 1",
		"1.0000000000000000000001KiB": "not a whole number of bytes: between 1024 and 1025",
	} {
		_, err := Parse(in)
		require.ErrorIs(t, err, ErrSyntax, in)
		require.ErrorContains(t, err, why, in)
	}
}

func TestFormat(t *testing.T) {
	for n, want := range map[uint64]string{
		0:               "0 B",
		24:              "24 B",
		1000:            "1000 B",
		2 << 20:         "2 MiB",
		141 << 30:       "141 GiB",
		15775644680:     "14.69 GiB",
		15823011840:     "14.74 GiB",
		1 << 63:         "8 EiB",
		1.5 * (1 << 30): "1.5 GiB",
	} {
		require.Equal(t, want, Format(n), n)
		if n != 15775644680 && n != 15823011840 {
			back, err := Parse(Format(n))
			require.NoError(t, err)
			require.Equal(t, n, back, "%s reads back", Format(n))
		}
	}
}

func TestParseMultiple(t *testing.T) {
	n, err := ParseMultiple("24GiB", 2<<20, "the granularity")
	require.NoError(t, err)
	require.Equal(t, uint64(24<<30), n)
	for in, want := range map[string]string{
		"24":      "24 bytes is not a multiple of the granularity 2 MiB; did you mean 24GiB?",
		"1":       "1 byte is not a multiple of the granularity 2 MiB; did you mean 1GiB?",
		"3145728": "3145728 bytes is not a multiple of the granularity 2 MiB",
		"3MiB":    "3145728 bytes is not a multiple of the granularity 2 MiB",
		"0":       "want a positive multiple of the granularity 2 MiB",
		"24GB":    "24000000000 bytes is not a multiple of the granularity 2 MiB; did you mean 24GiB (GB is 10^9 bytes, GiB 2^30)?",
		"512 mb":  "512000000 bytes is not a multiple of the granularity 2 MiB; did you mean 512MiB (MB is 10^6 bytes, MiB 2^20)?",
		"3MB":     "3000000 bytes is not a multiple of the granularity 2 MiB",
		"lots":    "not a byte size (want " + Syntax + ")",
	} {
		_, err := ParseMultiple(in, 2<<20, "the granularity")
		require.EqualError(t, err, want, in)
		require.Equal(t, in == "lots", errors.Is(err, ErrSyntax), in)
	}
	_, err = ParseMultiple("3", 3<<19, "a page of")
	require.EqualError(t, err, "3 bytes is not a multiple of a page of 1.5 MiB; did you mean 3GiB?")
	_, err = ParseMultiple("1", 3<<19, "a page of")
	require.EqualError(t, err, "1 byte is not a multiple of a page of 1.5 MiB", "neither 1GiB nor 1MiB is one: no hint")
}

// TestFlag: one value type serves the standard flag package and pflag.
func TestFlag(t *testing.T) {
	var f Flag
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Var(&f, "size", "")
	require.NoError(t, fs.Parse([]string{"-size", "512MiB"}))
	require.Equal(t, Flag(512<<20), f)
	require.Equal(t, "512 MiB", f.String())

	var g Flag
	pfs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	pfs.Var(&g, "capacity", "")
	require.Equal(t, "SIZE", pfs.Lookup("capacity").Value.Type())
	err := pfs.Parse([]string{"--capacity", "-3"})
	require.ErrorIs(t, err, ErrSyntax)
	require.Zero(t, g, "a bad value changes nothing")
}

func TestFormatFixed(t *testing.T) {
	for n, want := range map[uint64]string{
		0:                       "0 B",
		1023:                    "1023 B",
		1024:                    "1.000 KiB",
		7_602_176_000:           "7.080 GiB",
		2 << 20:                 "2.000 MiB",
		1<<64 - 1:               "16.000 EiB",
		uint64(1.5 * (1 << 40)): "1.500 TiB",
	} {
		require.Equal(t, want, FormatFixed(n, 3), n)
	}
	require.Equal(t, "7.1 GiB", FormatFixed(7_602_176_000, 1))
}
