package trace

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const good = `a 7 1000 0
a 8 3000 5

a 9 500 0
f 7
a 10 2000 5
f 9
f 8
`

func gz(t testing.TB, s string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := gzip.NewWriter(&b)
	_, err := w.Write([]byte(s))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

func TestParseGood(t *testing.T) {
	for name, data := range map[string][]byte{"plain": []byte(good), "gzip": gz(t, good)} {
		t.Run(name, func(t *testing.T) {
			tr, err := Parse("t", bytes.NewReader(data))
			require.NoError(t, err)
			require.Len(t, tr.Events, 7)
			require.Equal(t, []uint32{0, 5}, tr.Streams)
			require.Equal(t, []uint64{7, 8, 9, 10}, tr.IDs)
			require.Equal(t, 4, tr.Slots)
			// live: 1000, 4000, 4500 (peak), 3500, 5500 (peak), 5000, 2000
			require.Equal(t, uint64(5500), tr.PeakLive)
			require.Equal(t, 1, tr.LiveAtEnd)
			require.Equal(t, Event{Op: OpAlloc, Size: 3000, Slot: 1, Line: 2, Stream: 1}, tr.Events[1])
			require.Equal(t, Event{Op: OpAlloc, Size: 500, Slot: 2, Line: 4, Stream: 0}, tr.Events[2])
			require.Equal(t, Event{Op: OpFree, Slot: 0, Line: 5}, tr.Events[3])
			require.Equal(t, Event{Op: OpFree, Slot: 1, Line: 8}, tr.Events[6])
		})
	}
}

func TestParseTolerates(t *testing.T) {
	// CRLF line ends, tabs, repeated spaces, no final newline, huge ids.
	tr, err := Parse("t", strings.NewReader("a\t18446744073709551615  4 3\r\nf 18446744073709551615"))
	require.NoError(t, err)
	require.Len(t, tr.Events, 2)
	require.Equal(t, []uint32{3}, tr.Streams)
	require.Equal(t, uint64(4), tr.PeakLive)
	require.Equal(t, 0, tr.LiveAtEnd)

	tr, err = Parse("empty", strings.NewReader(""))
	require.NoError(t, err)
	require.Empty(t, tr.Events)
}

func TestParseBad(t *testing.T) {
	for _, c := range []struct {
		name, text string
		line       int
		msg        string
	}{
		{"kind", "a 1 2 0\nx 1\n", 2, `unknown event "x"`},
		{"long kind", "alloc 1 2 0\n", 1, `unknown event "alloc"`},
		{"alloc fields", "a 1 2\n", 1, "an allocation has 4 fields"},
		{"alloc extra", "a 1 2 0 9\n", 1, "this line 5"},
		{"free fields", "a 1 2 0\nf 1 2\n", 2, "a free has 2 fields"},
		{"id", "a x1 2 0\n", 1, `bad id "x1"`},
		{"negative id", "a -1 2 0\n", 1, `bad id "-1"`},
		{"size", "a 1 2.5 0\n", 1, `bad size "2.5"`},
		{"size overflow", "a 1 18446744073709551616 0\n", 1, "bad size"},
		{"stream", "a 1 2 s\n", 1, `bad stream "s"`},
		{"stream range", "a 1 2 4294967296\n", 1, "bad stream"},
		{"duplicate", "a 1 2 0\n\na 1 3 0\n", 3, "duplicate id 1 (allocated at line 1)"},
		{"reused after free", "a 1 2 0\nf 1\na 1 3 0\n", 3, "duplicate id 1"},
		{"unknown free", "a 1 2 0\nf 2\n", 2, "free of id 2, never allocated"},
		{"double free", "a 1 2 0\nf 1\nf 1\n", 3, "id 1 freed twice (first at line 2)"},
		{"live overflow", "a 1 18446744073709551615 0\na 2 1 0\n", 2, "overflow"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.trace", bytes.NewReader(gz(t, c.text)))
			var se *SyntaxError
			require.ErrorAs(t, err, &se)
			require.Equal(t, c.line, se.Line)
			require.Equal(t, "bad.trace", se.Name)
			require.Contains(t, se.Msg, c.msg)
			lines := strings.Split(c.text, "\n")
			require.Equal(t, lines[c.line-1], se.Text)
			require.Contains(t, err.Error(), "bad.trace:")
		})
	}
}

func TestParseLongLineShortened(t *testing.T) {
	_, err := Parse("t", strings.NewReader("q"+strings.Repeat(" 1", 200)))
	var se *SyntaxError
	require.ErrorAs(t, err, &se)
	require.Len(t, se.Text, 80)
	require.True(t, strings.HasSuffix(se.Text, "..."))
}

func TestParseBadGzip(t *testing.T) {
	data := gz(t, good)
	_, err := Parse("t", bytes.NewReader(data[:len(data)/2]))
	require.Error(t, err)
	var se *SyntaxError
	require.False(t, errors.As(err, &se), "a truncated file is a read error, not a syntax error: %v", err)
}

// TestParseBadGzipSaysWhere: a truncated gzip, or one followed by bytes
// that are not gzip, failed with "reading trace t: unexpected EOF", which
// named neither the gzip data nor how far the trace had parsed. The error
// names both, and is still a read error (io.ErrUnexpectedEOF), not a
// syntax error.
func TestParseBadGzipSaysWhere(t *testing.T) {
	var text strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&text, "a %d %d 0\nf %d\n", i, 1000+i*7, i)
	}
	data := gz(t, text.String())
	for name, bad := range map[string][]byte{
		"truncated":      data[:len(data)/2],
		"trailing bytes": append(append([]byte(nil), gz(t, good)...), "garbage\n"...),
	} {
		_, err := Parse("t.gz", bytes.NewReader(bad))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, name)
		var se *SyntaxError
		require.False(t, errors.As(err, &se), name)
		require.Regexp(t, `^reading trace t\.gz at line \d+: the gzip data ends early \(a truncated file, or bytes after it that are not gzip\): unexpected EOF$`, err.Error(), name)
	}
	_, err := Parse("t.gz", bytes.NewReader(data[:len(data)/2]))
	n, _ := strconv.Atoi(regexp.MustCompile(`line (\d+)`).FindStringSubmatch(err.Error())[1])
	require.Greater(t, n, 100, "the line the data ends in, past the events parsed")
}

func TestReadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.trace.gz")
	require.NoError(t, os.WriteFile(path, gz(t, good), 0o644))
	tr, err := ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, path, tr.Name)
	require.Equal(t, uint64(5500), tr.PeakLive)

	_, err = ReadFile(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// TestShippedTraces checks the traces the project carries against the
// figures of their README.
func TestShippedTraces(t *testing.T) {
	for _, c := range []struct {
		name    string
		events  int
		streams int
		peak    uint64
	}{
		{"gpt2_train", 8989, 1, 15775644680},
		{"gpt2_varlen", 34484, 2, 25520191792},
	} {
		tr, err := ReadFile(filepath.Join("..", "traces", c.name+".trace.gz"))
		require.NoError(t, err)
		require.Len(t, tr.Events, c.events, c.name)
		require.Len(t, tr.Streams, c.streams, c.name)
		require.Equal(t, c.peak, tr.PeakLive, c.name)
	}
}

func BenchmarkParse(b *testing.B) {
	data, err := os.ReadFile(filepath.Join("..", "traces", "gpt2_varlen.trace.gz"))
	require.NoError(b, err)
	var events int
	for b.Loop() {
		tr, err := Parse("varlen", bytes.NewReader(data))
		if err != nil {
			b.Fatal(err)
		}
		events = len(tr.Events)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*events), "ns/event")
}

// gzLines is a gzip of n copies of line.
func gzLines(t testing.TB, line string, n int) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	require.NoError(t, err)
	chunk := []byte(strings.Repeat(line, 1<<12))
	for ; n >= 1<<12; n -= 1 << 12 {
		_, err = w.Write(chunk)
		require.NoError(t, err)
	}
	_, err = w.Write([]byte(strings.Repeat(line, n)))
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return b.Bytes()
}

// Issue 15: a 398 KiB gzip of newlines took 5.2 GB to parse. Parse read the
// whole inflated input and sized the events and the id map by its line
// count; it must stream, its memory bounded by the events, not the lines.
func TestParseBlankLinesBoundedMemory(t *testing.T) {
	const lines = 8 << 20
	data := gzLines(t, "\n", lines)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr, err := Parse("blank", bytes.NewReader(data))
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Empty(t, tr.Events, "blank lines are no events")
	require.Zero(t, cap(tr.Events), "nothing sized by the line count")
	allocated := after.TotalAlloc - before.TotalAlloc
	require.Less(t, allocated, uint64(2<<20), "parsing %d MiB of blank lines allocated %d bytes", lines>>20, allocated)

	// A few events among the blank lines keep their line numbers.
	tr, err = Parse("sparse", strings.NewReader(strings.Repeat("\n", 1000)+"a 1 5 0\n\n\nf 1\n"))
	require.NoError(t, err)
	require.Equal(t, []Event{{Op: OpAlloc, Size: 5, Line: 1001}, {Op: OpFree, Line: 1004}}, tr.Events)
}

// Issue 15: a 10 MB line made a 10 MB error. A line past MaxLineLen fails
// by its number, without its text, and without being read whole.
func TestParseLineTooLong(t *testing.T) {
	for name, line := range map[string]string{
		"one huge field": strings.Repeat("x", 10<<20),
		"just too long":  "a 1 2 0" + strings.Repeat(" ", MaxLineLen-7),
		"huge id":        "a " + strings.Repeat("9", 10<<20) + " 1 0",
	} {
		t.Run(name, func(t *testing.T) {
			text := "a 7 1 0\n" + line + "\nf 7\n"
			for _, data := range [][]byte{[]byte(text), gz(t, text)} {
				_, err := Parse("long", bytes.NewReader(data))
				var se *SyntaxError
				require.ErrorAs(t, err, &se)
				require.Equal(t, 2, se.Line)
				require.Contains(t, se.Msg, "longer than 4096 bytes")
				require.Empty(t, se.Text)
				require.Equal(t, "long:2: line longer than 4096 bytes", err.Error())
			}
		})
	}
	// At the bound, it parses.
	tr, err := Parse("ok", strings.NewReader("a 1 2 0"+strings.Repeat(" ", MaxLineLen-8)+"\n"))
	require.NoError(t, err)
	require.Len(t, tr.Events, 1)
}

// Issue 15: errors quoted whole fields of the input; each quotes at most a
// few dozen bytes of a field and maxQuoted of the line.
func TestParseErrorsQuoteLittle(t *testing.T) {
	long := strings.Repeat("z", 2000)
	for _, text := range []string{
		long + " 1\n",
		"a " + long + " 2 0\n",
		"a 1 " + long + " 0\n",
		"a 1 2 " + long + "\n",
		"f " + long + "\n",
	} {
		_, err := Parse("q", strings.NewReader(text))
		var se *SyntaxError
		require.ErrorAs(t, err, &se)
		require.LessOrEqual(t, len(se.Text), maxQuoted)
		require.NotContains(t, se.Msg, strings.Repeat("z", maxQuotedField))
		require.Less(t, len(err.Error()), 250, err.Error())
	}
}
