package trace

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteRoundTrip(t *testing.T) {
	tr := shipped(t, "gpt2_varlen") // two streams
	v, err := Perturb(tr, DefaultPerturbation(7))
	require.NoError(t, err)
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		tr   *Trace
	}{{"trace.gz", tr}, {"variant.trace", v}, {"variant.trace.gz", v}} {
		p := filepath.Join(dir, c.name)
		require.NoError(t, WriteFile(p, c.tr))
		got, err := ReadFile(p)
		require.NoError(t, err)
		sameTrace(t, c.tr, got)
		for i, e := range got.Events {
			require.Equal(t, uint32(i+1), e.Line, "the written file's own lines")
		}
		// A variant written and read replays as itself: its first block
		// is an allocation of its own id before the trace's first event.
		require.Equal(t, c.tr.Events[0].Size, got.Events[0].Size)
		// The file is the one asked for: gzip or text.
		raw, err := os.ReadFile(p)
		require.NoError(t, err)
		require.Equal(t, strings.HasSuffix(c.name, ".gz"), bytes.HasPrefix(raw, []byte{0x1f, 0x8b}), c.name)
	}
}

func TestWriteFileKeepsExistingFiles(t *testing.T) {
	tr := shipped(t, "gpt2_train")
	p := filepath.Join(t.TempDir(), "x.trace")
	require.NoError(t, os.WriteFile(p, []byte("mine\n"), 0o644))
	err := WriteFile(p, tr)
	require.ErrorIs(t, err, os.ErrExist)
	got, err := os.ReadFile(p)
	require.NoError(t, err)
	require.Equal(t, "mine\n", string(got), "an existing file is not replaced")
	require.Error(t, WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir.trace"), tr))
}

func TestWriteRejectsBrokenTraces(t *testing.T) {
	base := func() *Trace {
		return &Trace{Name: "t", IDs: []uint64{5}, Streams: []uint32{0}, Slots: 1,
			Events: []Event{{Op: OpAlloc, Size: 512, Slot: 0}, {Op: OpFree, Slot: 0}}}
	}
	var buf bytes.Buffer
	require.NoError(t, base().Write(&buf))
	require.Equal(t, "a 5 512 0\nf 5\n", buf.String())
	for name, mend := range map[string]func(*Trace){
		"slot":   func(tr *Trace) { tr.Events[1].Slot = 3 },
		"stream": func(tr *Trace) { tr.Events[0].Stream = 1 },
		"op":     func(tr *Trace) { tr.Events[1].Op = 'x' },
	} {
		tr := base()
		mend(tr)
		require.Error(t, tr.Write(&bytes.Buffer{}), name)
		// WriteFile leaves no partial file behind.
		p := filepath.Join(t.TempDir(), name+".trace.gz")
		require.Error(t, WriteFile(p, tr), name)
		_, err := os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist, name)
	}
}

type failingWriter struct{ after int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.after <= 0 {
		return 0, errors.New("disk full")
	}
	w.after--
	return len(p), nil
}

func TestWriteReportsWriterErrors(t *testing.T) {
	tr := shipped(t, "gpt2_train")
	err := tr.Write(&failingWriter{})
	require.ErrorContains(t, err, "disk full")
}
