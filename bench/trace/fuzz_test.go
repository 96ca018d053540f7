package trace

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/xseg-dev/xseg/vmm"
)

// FuzzParse feeds Parse arbitrary input, plain and gzipped: it must not
// panic, its errors must stay short, and a trace it accepts must keep its
// own rules.
func FuzzParse(f *testing.F) {
	for _, s := range []string{good, "", "\n\n\n", "a 1 2 0\r\nf 1", "a\t18446744073709551615  4 3\r\nf 18446744073709551615",
		"a 1 2 0\nf 2\n", "a 1 2 0\nf 1\nf 1\n", "x 1\n", "a 1 18446744073709551615 0\na 2 1 0\n",
		"a 1 2 " + strings.Repeat("9", 100) + "\n", strings.Repeat(" ", MaxLineLen+1), "a 1 2 4294967295\n"} {
		f.Add([]byte(s))
		f.Add(gz(f, s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := Parse("fuzz", bytes.NewReader(data))
		if err != nil {
			// %q writes a byte as up to 4: the quoted line and field,
			// and about 200 bytes of message.
			if n := len(err.Error()); n > 4*(maxQuoted+maxQuotedField)+200 {
				t.Fatalf("an error of %d bytes: %.200s...", n, err)
			}
			return
		}
		checkTrace(t, tr)
		v, err := Perturb(tr, DefaultPerturbation(uint64(len(data))))
		if err != nil {
			if !errors.Is(err, vmm.ErrInvalid) {
				t.Fatalf("perturbing: %v", err)
			}
			return
		}
		checkTrace(t, v)
		// What Write writes of the variant reads back as the variant.
		var buf bytes.Buffer
		if err := v.Write(&buf); err != nil {
			t.Fatalf("writing a variant: %v", err)
		}
		back, err := Parse("back", &buf)
		if err != nil {
			t.Fatalf("reading back a written variant: %v", err)
		}
		sameTrace(t, v, back)
	})
}

// sameTrace fails unless got has want's ids, streams, peak and events,
// line numbers aside (got's are its own file's).
func sameTrace(t *testing.T, want, got *Trace) {
	t.Helper()
	if !slices.Equal(want.IDs, got.IDs) || !slices.Equal(want.Streams, got.Streams) || want.Slots != got.Slots ||
		want.PeakLive != got.PeakLive || want.LiveAtEnd != got.LiveAtEnd || len(want.Events) != len(got.Events) {
		t.Fatalf("read back: %d ids, streams %v, peak %d, %d live at the end, %d events; want %d, %v, %d, %d, %d",
			len(got.IDs), got.Streams, got.PeakLive, got.LiveAtEnd, len(got.Events),
			len(want.IDs), want.Streams, want.PeakLive, want.LiveAtEnd, len(want.Events))
	}
	for i, e := range want.Events {
		g := got.Events[i]
		g.Line = e.Line
		if g != e {
			t.Fatalf("event %d read back as %+v, want %+v", i, got.Events[i], e)
		}
	}
}

// checkTrace checks the invariants of a parsed trace.
func checkTrace(t *testing.T, tr *Trace) {
	t.Helper()
	if tr.Slots != len(tr.IDs) {
		t.Fatalf("%d slots, %d ids", tr.Slots, len(tr.IDs))
	}
	live := make([]bool, tr.Slots)
	var bytesLive, peak uint64
	sizes := make([]uint64, tr.Slots)
	line, nLive := uint32(0), 0
	for i, e := range tr.Events {
		if e.Line <= line && (i != 0 || e.Line != 0) { // Line 0: a perturbation's first block
			t.Fatalf("event lines not increasing: %d after %d", e.Line, line)
		}
		line = e.Line
		if int(e.Slot) >= tr.Slots {
			t.Fatalf("slot %d of %d", e.Slot, tr.Slots)
		}
		switch e.Op {
		case OpAlloc:
			if int(e.Stream) >= len(tr.Streams) {
				t.Fatalf("stream %d of %d", e.Stream, len(tr.Streams))
			}
			live[e.Slot], sizes[e.Slot] = true, e.Size
			bytesLive += e.Size
			nLive++
			peak = max(peak, bytesLive)
		case OpFree:
			if !live[e.Slot] {
				t.Fatalf("free of slot %d, not live", e.Slot)
			}
			live[e.Slot] = false
			bytesLive -= sizes[e.Slot]
			nLive--
		default:
			t.Fatalf("op %v", e.Op)
		}
	}
	if peak != tr.PeakLive || nLive != tr.LiveAtEnd {
		t.Fatalf("peak %d live at end %d, the trace says %d and %d", peak, nLive, tr.PeakLive, tr.LiveAtEnd)
	}
}
