package handles

import (
	"bytes"
	"errors"
	"reflect"
	"testing"

	"github.com/xseg-dev/xseg/vmm"
)

// FuzzParseDescriptor feeds arbitrary bytes to ParseDescriptor: it must
// never panic, every failure must wrap vmm.ErrInvalid, and whatever parses
// must marshal back to the same bytes and parse again to the same value.
func FuzzParseDescriptor(f *testing.F) {
	noFDs := validPosix()
	noFDs.PageFDs = nil
	for _, d := range []*Descriptor{validPosix(), noFDs, validFabric(), validCUDAIPC(), validAuthed(),
		validSpans(), validFabricSpans(), validSocketSpans()} {
		b, err := d.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		for _, n := range []int{0, 3, 4, 6, 8, 40, headerSize - 1, headerSize + 2, len(b) - 1} {
			f.Add(b[:n])
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDescriptor(b)
		if err != nil {
			if !errors.Is(err, vmm.ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		out, err := d.MarshalBinary()
		if err != nil {
			t.Fatalf("parsed descriptor does not marshal: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("round trip changed the bytes:\n in %x\nout %x", b, out)
		}
		again, err := ParseDescriptor(out)
		if err != nil {
			t.Fatalf("re-parse: %v", err)
		}
		if !reflect.DeepEqual(d, again) {
			t.Fatalf("re-parse differs: %+v vs %+v", d, again)
		}
	})
}
