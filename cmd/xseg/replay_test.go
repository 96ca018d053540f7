package main

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bench/trace"
	"github.com/xseg-dev/xseg/vmm"
)

// writeTrace writes text to a file in a temporary folder, gzipped if the
// name ends in .gz, and returns its path.
func writeTrace(t *testing.T, name, text string) string {
	t.Helper()
	data := []byte(text)
	if strings.HasSuffix(name, ".gz") {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		_, err := w.Write(data)
		require.NoError(t, err)
		require.NoError(t, w.Close())
		data = b.Bytes()
	}
	path := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}

// synthetic is a small trace on two streams whose peak of live bytes is
// known: 3 MiB + 100 KiB + 600 B, then 40 MiB + 100 KiB + 600 B (the peak,
// 42,045,016 bytes), then 40 MiB + 600 B; small and large pools both used.
const synthetic = `a 1 3145728 0
a 2 102400 1
a 3 600 0
f 1
a 4 41943040 0
f 2
a 5 512 1
f 5
f 3
`

const syntheticPeak = 41943040 + 102400 + 600

func TestReplayJSON(t *testing.T) {
	a := writeTrace(t, "a.trace.gz", synthetic)
	b := writeTrace(t, "b.trace", synthetic+"f 4\n")
	out, stderr, err := run(t, "replay", "--backend", "host", "--json", a, b)
	require.NoError(t, err, stderr)
	require.Empty(t, stderr, "no progress line when stderr is not a terminal")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	for i, line := range lines {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		require.Equal(t, []string{"events", "late_maps", "maps", "ns_per_event", "ooms", "peak_live", "peak_reserved",
			"ratio", "retired", "retries", "syncs", "trace", "unmaps"}, keys)
		require.LessOrEqual(t, m["late_maps"], m["maps"])
		require.Equal(t, []string{a, b}[i], m["trace"])
		require.EqualValues(t, 9+i, m["events"])
		require.EqualValues(t, syntheticPeak, m["peak_live"])
		require.GreaterOrEqual(t, m["ratio"], 1.0)
		require.GreaterOrEqual(t, m["peak_reserved"], float64(syntheticPeak))
		require.Greater(t, m["maps"], 0.0)
		require.Greater(t, m["ns_per_event"], 0.0)
		require.EqualValues(t, 0, m["ooms"])
		require.EqualValues(t, 0, m["retries"])
	}
}

func TestReplayTable(t *testing.T) {
	a := writeTrace(t, "a.trace.gz", synthetic)
	out, _, err := run(t, "replay", "--backend", "host", "--allocator", "expandable", a)
	require.NoError(t, err)
	require.Contains(t, out, "backend host, allocator expandable, device 0\n")
	require.Regexp(t, `trace +events +peak live +peak reserved +peak reserved / peak live +ns/event +maps +late maps +unmaps +retries +ooms`, out)
	// 42,045,016 bytes of live peak are 40.1 MiB; the reserved peak is whole
	// pages (the small pool's 2 MiB and the large pool's 20 MiB).
	require.Regexp(t, fmt.Sprintf(`%s +9 +40\.098 MiB +\d+\.\d{3} MiB +1\.\d{4} +\d+ +\d+ +\d+ +\d+ +0 +0`, regexpQuote(a)), out)
}

func regexpQuote(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\.+*?()|[]{}^$`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

func TestReplayBadTrace(t *testing.T) {
	good := writeTrace(t, "good.trace", synthetic)
	bad := writeTrace(t, "bad.trace.gz", "a 1 10 0\na 2 20 0\nf 3\n")
	out, _, err := run(t, "replay", "--backend", "host", "--json", good, bad)
	require.ErrorContains(t, err, bad+":3: free of id 3, never allocated")
	require.Empty(t, out, "every trace is checked before any replay")

	_, _, err = run(t, "replay", "--backend", "host", filepath.Join(t.TempDir(), "missing.trace"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestReplayOutOfMemory(t *testing.T) {
	// 64 MiB of host memory; the trace wants 100 MiB at once.
	tr := writeTrace(t, "big.trace", "a 1 41943040 0\na 2 62914560 0\nf 1\nf 2\na 3 1024 0\n")
	out, _, err := run(t, "replay", "--backend", "host", "--capacity", "64MiB", "--json", tr)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, "1 allocation failed")
	require.ErrorContains(t, err, tr+":2: id 2, trace stream 0: allocating 62914560 bytes on stream 0x0")
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m), "the result is printed all the same")
	require.GreaterOrEqual(t, m["ooms"], 1.0)
	require.LessOrEqual(t, m["peak_reserved"], float64(64<<20))

	// The table does not print a ratio the failures flattered.
	out, _, err = run(t, "replay", "--backend", "host", "--capacity", "64MiB", tr)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.Regexp(t, `big\.trace +5 +100\.000 MiB +\d+\.\d{3} MiB +n/a \(OOM\)`, out)
	require.Contains(t, out, "n/a (OOM): allocations failed")
}

func TestReplayFlags(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	_, _, err := run(t, "replay", "--backend", "cuda", "--capacity", "1GiB", tr)
	require.ErrorContains(t, err, "--capacity sets the host backend's memory")
	_, _, err = run(t, "replay", "--capacity", "lots", tr)
	require.ErrorContains(t, err, "--capacity lots: not a byte size")
	_, _, err = run(t, "replay", "--allocator", "slab", tr)
	require.ErrorContains(t, err, `"slab" is not one of auto, expandable, fallback`)
	_, _, err = run(t, "replay")
	require.ErrorContains(t, err, "requires at least 1 arg")
	_, _, err = run(t, "replay", "--backend", "host", "--conf", "no_such_key:1", tr)
	require.ErrorContains(t, err, "no_such_key")
}

func TestReplayConf(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	peakReserved := func(args ...string) float64 {
		out, _, err := run(t, append([]string{"replay", "--backend", "host", "--json"}, append(args, tr)...)...)
		require.NoError(t, err)
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &m))
		return m["peak_reserved"].(float64)
	}
	// With 100 MiB large pages, the first large block maps a whole one;
	// with the default 20 MiB pages, 43 MiB of large blocks never need 100.
	require.Less(t, peakReserved(), float64(100<<20))
	require.GreaterOrEqual(t, peakReserved("--conf", "large_page_mb:100"), float64(100<<20))
}

// TestReplayShippedTraces replays the traces the project carries, as the
// README's main command does (the host backend here; a second stream for
// gpt2_varlen). Sparse host pages make it quick: well under a second.
func TestReplayShippedTraces(t *testing.T) {
	dir := filepath.Join("..", "..", "bench", "traces")
	out, _, err := run(t, "replay", "--backend", "host", "--json",
		filepath.Join(dir, "gpt2_train.trace.gz"), filepath.Join(dir, "gpt2_varlen.trace.gz"))
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	for i, want := range []struct{ events, peak float64 }{{8989, 15775644680}, {34484, 25520191792}} {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &m))
		require.Equal(t, want.events, m["events"])
		require.Equal(t, want.peak, m["peak_live"])
		require.GreaterOrEqual(t, m["ratio"], 1.0)
		require.EqualValues(t, 0, m["ooms"])
		t.Logf("%s", lines[i])
	}
}

// Issue 15: `xseg replay --backend cuda` without a driver printed "xseg:
// xseg: opening the CUDA backend": package xseg's errors start with
// "xseg: " and main added its own.
func TestErrorLineSaysXsegOnce(t *testing.T) {
	_, err := xseg.OpenDriver("tpu", 0)
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "xseg: "), err.Error())
	line := errorLine(err)
	require.Equal(t, 1, strings.Count(line, "xseg:"), line)
	require.Equal(t, `xseg: unknown backend "tpu" (want auto, host or cuda): invalid argument`, line)
	require.Equal(t, "xseg: --capacity sets the host backend's memory", errorLine(errors.New("--capacity sets the host backend's memory")))
}

// Issue 15: a gzip of blank lines took 5 GB to report an empty trace, and
// a 10 MB line made a 10 MB error.
func TestReplayBlankAndLongLines(t *testing.T) {
	blank := writeTrace(t, "blank.trace.gz", strings.Repeat("\n", 1<<20))
	out, _, err := run(t, "replay", "--backend", "host", "--json", blank)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	require.EqualValues(t, 0, m["events"])

	long := writeTrace(t, "long.trace.gz", "a 1 10 0\n"+strings.Repeat("a", 10<<20)+"\n")
	_, _, err = run(t, "replay", "--backend", "host", long)
	require.EqualError(t, err, long+":2: line longer than 4096 bytes")
}

// Issue 15: large_page_mb:17592186044414 was accepted and then failed the
// first allocation as "reserving 0 bytes"; it fails as configuration.
func TestReplayHugePageConf(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	_, _, err := run(t, "replay", "--backend", "host", "--conf", "large_page_mb:17592186044414", tr)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "--conf: config: large_page_mb: a page of 18446744073707454464 bytes is larger than 1 TiB")
	require.NotContains(t, err.Error(), "reserving")
}

func TestReplayPerturbJSON(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	out, _, err := run(t, "replay", "--backend", "host", "--json", "--perturb", "3", "--seed", "5", tr)
	require.NoError(t, err)
	var rep struct {
		Trace    string  `json:"trace"`
		PeakLive uint64  `json:"peak_live"`
		Ratio    float64 `json:"ratio"`
		Variants []struct {
			Seed     uint64  `json:"seed"`
			Trace    string  `json:"trace"`
			Events   int     `json:"events"`
			PeakLive uint64  `json:"peak_live"`
			Ratio    float64 `json:"ratio"`
			Maps     int64   `json:"maps"`
		} `json:"variants"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Equal(t, tr, rep.Trace)
	require.EqualValues(t, syntheticPeak, rep.PeakLive, "the trace's own result is unchanged")
	require.Len(t, rep.Variants, 3)
	for i, v := range rep.Variants {
		require.EqualValues(t, 5+i, v.Seed)
		require.Equal(t, fmt.Sprintf("%s (seed %d)", tr, 5+i), v.Trace)
		require.Equal(t, 10, v.Events, "one event more: the first block")
		// The first block (1.5 to 20 MiB) is live at the peak; sizes grow by
		// less than 5 %.
		require.Greater(t, v.PeakLive, uint64(syntheticPeak+3<<19))
		require.Less(t, v.PeakLive, uint64(syntheticPeak*105/100+20<<20))
		require.GreaterOrEqual(t, v.Ratio, 1.0)
		require.Positive(t, v.Maps)
	}
	require.NotEqual(t, rep.Variants[0].PeakLive, rep.Variants[1].PeakLive)

	again, _, err := run(t, "replay", "--backend", "host", "--json", "--perturb", "1", "--seed", "6", tr)
	require.NoError(t, err)
	var one struct {
		Variants []struct {
			PeakLive uint64 `json:"peak_live"`
			Ratio    float64
		} `json:"variants"`
	}
	require.NoError(t, json.Unmarshal([]byte(again), &one))
	require.Len(t, one.Variants, 1)
	require.Equal(t, rep.Variants[1].PeakLive, one.Variants[0].PeakLive, "a seed replays alone as in a run of several")
	require.Equal(t, rep.Variants[1].Ratio, one.Variants[0].Ratio)
}

func TestReplayPerturbTable(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	out, _, err := run(t, "replay", "--backend", "host", "--perturb", "4", "--jitter", "0.02", tr)
	require.NoError(t, err)
	require.Contains(t, out, "peak reserved / peak live of 4 variants a trace, seeds 1 to 4: "+
		"a first block of 1.5 MiB to 20 MiB live to the end, every distinct size raised by up to 2 %")
	require.Regexp(t, `trace +trace's ratio +variants +best +median +worst +worst seed\n`, out)
	m := regexp.MustCompile(regexpQuote(tr) + ` +(1\.\d{4}) +4 +(1\.\d{4}) +(1\.\d{4}) +(1\.\d{4}) +([1-4])\n`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	require.LessOrEqual(t, m[2], m[3])
	require.LessOrEqual(t, m[3], m[4])
}

func TestReplayPerturbFlags(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	none := filepath.Join(t.TempDir(), "none")
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--perturb", "-1"}, "--perturb -1: want a number of variants, 0 or more"},
		{[]string{"--perturb", "2", "--jitter", "1.5"}, "--jitter 1.5: perturbation: jitter 1.5 is not in [0, 1]: invalid argument"},
		{[]string{"--perturb", "2", "--jitter", "NaN"}, "--jitter NaN: perturbation: jitter NaN is not in [0, 1]: invalid argument"},
		{[]string{"--seed", "3"}, "--seed applies to the variants of --perturb N, and --perturb is 0"},
		{[]string{"--jitter", "0.1"}, "--jitter applies to the variants of --perturb N, and --perturb is 0"},
		// --seed -1 was strconv's "strconv.ParseUint: parsing "-1":
		// invalid syntax"; now in words, as the other flags.
		{[]string{"--perturb", "2", "--seed", "-1"}, "--seed -1: want a seed, a whole number from 0 to 18446744073709551615"},
		{[]string{"--perturb", "2", "--seed", "18446744073709551616"}, "--seed 18446744073709551616: want a seed, a whole number from 0 to 18446744073709551615"},
		{[]string{"--perturb", "2", "--seed", "x"}, "--seed x: want a seed, a whole number from 0 to 18446744073709551615"},
		{[]string{"--perturb", "two"}, "--perturb two: not a whole number"},
		{[]string{"--perturb", "2", "--jitter", "lots"}, "--jitter lots: not a number"},
		{[]string{"--device", "99999999999999999999"}, "--device 99999999999999999999: out of range"},
		{[]string{"--json=maybe"}, "--json maybe: want true or false"},
		{[]string{"--write-variants", t.TempDir()}, "--write-variants applies to the variants of --perturb N, and --perturb is 0"},
		{[]string{"--perturb", "1", "--write-variants", tr}, "--write-variants " + tr + ": not a directory"},
		{[]string{"--perturb", "1", "--write-variants", none}, "--write-variants: stat " + none + ": no such file or directory"},
		// The seeds wrapped past 2^64-1 to 0: "seeds 18446744073709551615 to 0".
		{[]string{"--perturb", "2", "--seed", "18446744073709551615"}, "--seed 18446744073709551615 with --perturb 2: the last seed would be 18446744073709551615 + 1, past 18446744073709551615"},
		{[]string{"--perturb", "5", "--seed", "18446744073709551612"}, "--seed 18446744073709551612 with --perturb 5: the last seed would be 18446744073709551612 + 4, past 18446744073709551615"},
	} {
		out, stderr, err := run(t, append(append([]string{"replay", "--backend", "host"}, c.args...), tr)...)
		require.EqualError(t, err, c.msg, "%v", c.args)
		// The usage text above the error buried it (18 lines of it).
		require.Empty(t, out, "%v", c.args)
		require.Empty(t, stderr, "%v", c.args)
	}
}

// TestReplayJitterMinusZero: --jitter -0 printed "raised by up to -0 %".
func TestReplayJitterMinusZero(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	out, _, err := run(t, "replay", "--backend", "host", "--perturb", "1", "--jitter", "-0", tr)
	require.NoError(t, err)
	require.Contains(t, out, "every distinct size raised by up to 0 %")
	require.NotContains(t, out, "-0")
}

// TestReplayPerturbOutOfMemory: a variant whose allocations fail is
// reported, and fails the command, like the trace itself.
func TestReplayPerturbOutOfMemory(t *testing.T) {
	// 64 MiB of host memory: the trace needs 60 MiB, a variant more.
	tr := writeTrace(t, "big.trace", "a 1 62914560 0\nf 1\n")
	out, _, err := run(t, "replay", "--backend", "host", "--capacity", "64MiB", "--json", "--perturb", "1", "--seed", "2", tr)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.ErrorContains(t, err, tr+" (seed 2): 1 allocation failed")
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	require.Len(t, m["variants"], 1)
}

// TestReplayPerturbOutOfMemoryTable: the variants' table printed the
// ratios of replays whose allocations failed (the trace's own as 0.4000
// under a first table that said n/a (OOM), and the variants' best, median
// and worst), though such a ratio flatters the allocator. It says n/a
// (OOM) where the first table does, and the worst seed is the first
// variant that failed.
func TestReplayPerturbOutOfMemoryTable(t *testing.T) {
	// 64 MiB of host memory. fails: the trace itself wants 100 MiB at
	// once. fits: the trace needs 60 MiB and fits, its variants (a first
	// block of 1.5 MiB or more besides) do not.
	fails := writeTrace(t, "fails.trace", "a 1 41943040 0\na 2 62914560 0\nf 1\nf 2\na 3 1024 0\n")
	fits := writeTrace(t, "fits.trace", "a 1 62914560 0\nf 1\n")
	out, _, err := run(t, "replay", "--backend", "host", "--capacity", "64MiB", "--perturb", "2", "--seed", "7", fails, fits)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	_, variants, ok := strings.Cut(out, "\npeak reserved / peak live of 2 variants")
	require.True(t, ok, out)
	require.Regexp(t, `fails\.trace +n/a \(OOM\) +2 +n/a \(OOM\) +n/a \(OOM\) +n/a \(OOM\) +7 *\n`, variants)
	require.Regexp(t, `fits\.trace +1\.\d{4} +2 +n/a \(OOM\) +n/a \(OOM\) +n/a \(OOM\) +7 *\n`, variants)
	require.NotRegexp(t, `0\.\d{4}`, variants, "no flattered ratio")

	// Variants that fail under a trace that does not: the legend is printed.
	out, _, err = run(t, "replay", "--backend", "host", "--capacity", "64MiB", "--perturb", "1", fits)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	require.Contains(t, out, "n/a (OOM): allocations failed")
}

// TestReplayWriteVariants: --write-variants writes each variant, which
// replays alone to the variant's own ratio, and replaces no file.
func TestReplayWriteVariants(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	dir := t.TempDir()
	out, _, err := run(t, "replay", "--backend", "host", "--json", "--perturb", "2", "--seed", "3", "--write-variants", dir, tr)
	require.NoError(t, err)
	var rep struct {
		Variants []struct {
			Seed     uint64  `json:"seed"`
			PeakLive uint64  `json:"peak_live"`
			Ratio    float64 `json:"ratio"`
		} `json:"variants"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.Len(t, rep.Variants, 2)
	for _, v := range rep.Variants {
		f := filepath.Join(dir, fmt.Sprintf("a.seed%d.trace.gz", v.Seed))
		one, _, err := run(t, "replay", "--backend", "host", "--json", f)
		require.NoError(t, err)
		var r struct {
			Events   int     `json:"events"`
			PeakLive uint64  `json:"peak_live"`
			Ratio    float64 `json:"ratio"`
		}
		require.NoError(t, json.Unmarshal([]byte(one), &r))
		require.Equal(t, 10, r.Events, "the first block and the trace's events")
		require.Equal(t, v.PeakLive, r.PeakLive)
		require.Equal(t, v.Ratio, r.Ratio)
	}
	_, _, err = run(t, "replay", "--backend", "host", "--perturb", "1", "--seed", "3", "--write-variants", dir, tr)
	require.ErrorIs(t, err, os.ErrExist, "a variant written before is not replaced")
}

// TestReplayWriteVariantsSameNames: two traces of one base name in one
// run (a/x.trace and b/x.trace, or x.trace and x.trace.gz) wanted the
// same variant files; the second failed with "file exists" and its
// variants were never replayed. The second trace's variants are named
// x-2.seed<S>.trace.gz, the third's x-3..., as --plot names its files.
func TestReplayWriteVariantsSameNames(t *testing.T) {
	a := writeTrace(t, "x.trace", synthetic)
	b := writeTrace(t, "x.trace", synthetic+"f 4\n")
	c := writeTrace(t, "x.trace.gz", synthetic)
	dir := t.TempDir()
	out, _, err := run(t, "replay", "--backend", "host", "--json", "--perturb", "2", "--write-variants", dir, a, b, c)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	for i, name := range []string{"x", "x-2", "x-3"} {
		var rep struct {
			Trace    string `json:"trace"`
			Events   int    `json:"events"`
			Variants []struct {
				Seed     uint64 `json:"seed"`
				PeakLive uint64 `json:"peak_live"`
			} `json:"variants"`
		}
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &rep))
		require.Equal(t, []string{a, b, c}[i], rep.Trace)
		require.Len(t, rep.Variants, 2, "every trace's variants are replayed")
		for _, v := range rep.Variants {
			tr, err := trace.ReadFile(filepath.Join(dir, fmt.Sprintf("%s.seed%d.trace.gz", name, v.Seed)))
			require.NoError(t, err)
			require.Len(t, tr.Events, rep.Events+1, "%s: the variant of %s", name, rep.Trace)
			require.Equal(t, v.PeakLive, tr.PeakLive)
		}
	}
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, entries, 6)

	// The help says how the files are named.
	out, _, err = run(t, "replay", "--help")
	require.NoError(t, err)
	require.Contains(t, out, "NAME-2.seed<S>.trace.gz")
}

// A bad XSEG_CONF fails replay up front, naming the variable, as a bad
// --conf does: it was reported per trace after the "backend host..."
// header.
func TestReplayBadEnvConfig(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	t.Setenv("XSEG_CONF", "foo:1")
	for _, args := range [][]string{{}, {"--json"}, {"--conf", "large_page_mb:4"}} {
		out, _, err := run(t, append(append([]string{"replay", "--backend", "host"}, args...), tr, tr)...)
		require.Error(t, err, args)
		require.True(t, strings.HasPrefix(errorLine(err), `xseg: environment XSEG_CONF: config: unknown key "foo" (the keys: `), "%v: %s", args, errorLine(err))
		require.Empty(t, out, "nothing printed before the error: %v", args)
	}
	t.Setenv("XSEG_CONF", "large_page_mb:100")
	out, _, err := run(t, "replay", "--backend", "host", "--json", tr)
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &m))
	require.GreaterOrEqual(t, m["peak_reserved"], float64(100<<20), "the environment's configuration is used")
}

// A trace that never holds a live byte (empty, or 0-byte allocations
// only) has no ratio: the table says n/a, where it said 0.0000; --json
// keeps ratio 0, as trace.Result documents.
func TestReplayNoLiveBytesRatio(t *testing.T) {
	empty := writeTrace(t, "empty.trace", "")
	zero := writeTrace(t, "zero.trace", "a 0 0 0\nf 0\n")
	good := writeTrace(t, "good.trace", synthetic)
	out, _, err := run(t, "replay", "--backend", "host", empty, zero, good)
	require.NoError(t, err)
	require.NotContains(t, out, "0.0000")
	require.Regexp(t, `empty\.trace +0 +0 B +0 B +n/a +\d+ +0 +0 +0 +0 +0 *\n`, out)
	require.Regexp(t, `zero\.trace +2 +0 B +0 B +n/a +\d+ +0 +0 +0 +0 +0 *\n`, out)
	require.Regexp(t, `good\.trace +9 +40\.098 MiB +\d+\.\d{3} MiB +1\.\d{4} `, out)
	require.Contains(t, out, "n/a: the trace never holds a live byte, so there is no ratio (--json gives 0)")

	out, _, err = run(t, "replay", "--backend", "host", good)
	require.NoError(t, err)
	require.NotContains(t, out, "n/a", "no legend without such a trace")

	out, _, err = run(t, "replay", "--backend", "host", "--perturb", "1", empty)
	require.NoError(t, err)
	require.Regexp(t, `empty\.trace +n/a +1 +1\.\d{4} `, out, "the variants' table too")

	out, _, err = run(t, "replay", "--backend", "host", "--json", empty, zero)
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		require.Zero(t, m["ratio"], line)
	}
}

// The fallback allocator ignores the expandable allocator's page policy:
// --conf size_classes:1 failed with "size_classes needs recycle_pages ...
// invalid argument: invalid argument" although recycling was on.
func TestReplayFallbackIgnoresExpandablePolicy(t *testing.T) {
	tr := writeTrace(t, "a.trace", synthetic)
	for _, conf := range []string{"size_classes:1", "chunk_mb:64,chunk_min_mb:8", "recycle_pages:0"} {
		out, _, err := run(t, "replay", "--backend", "host", "--allocator", "fallback", "--conf", conf, tr)
		require.NoError(t, err, conf)
		require.Contains(t, out, "backend host, allocator fallback, device 0\n", conf)
	}
	t.Setenv("XSEG_CONF", "size_classes:1")
	_, _, err := run(t, "replay", "--backend", "host", "--allocator", "fallback", tr)
	require.NoError(t, err, "XSEG_CONF=size_classes:1 does not break the fallback allocator")
}
