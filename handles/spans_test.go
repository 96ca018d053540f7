package handles

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// validSpans is validAuthed over allocations of 1, 4 and 1 pages of 2 MiB:
// the block starts 4 KiB into the first and ends 4 KiB into the last.
func validSpans() *Descriptor {
	d := validAuthed()
	d.Spans = []int{1, 4, 1}
	d.Length = 10 << 20
	return d
}

// validFabricSpans is a fabric descriptor over allocations of 3 and 1
// pages whose block starts past the first page of the first allocation.
func validFabricSpans() *Descriptor {
	d := validFabric()
	d.PageCount, d.Fabric = 2, d.Fabric[:2]
	d.Spans = []int{3, 1}
	d.Offset, d.Length = 5<<20, 2<<20
	return d
}

// validSocketSpans is a posix-fd descriptor without fd numbers (socket
// only): version 3 without an authentication fd.
func validSocketSpans() *Descriptor {
	d := validSpans()
	d.PageFDs, d.HasAuth, d.AuthFD = nil, false, 0
	return d
}

func TestDescriptorSpansRoundTrip(t *testing.T) {
	for name, d := range map[string]*Descriptor{"posix": validSpans(), "fabric": validFabricSpans(), "socket-only": validSocketSpans()} {
		t.Run(name, func(t *testing.T) {
			b, err := d.MarshalBinary()
			require.NoError(t, err)
			require.EqualValues(t, Version, binary.LittleEndian.Uint16(b[4:]))
			got, err := ParseDescriptor(b)
			require.NoError(t, err)
			require.Equal(t, d, got)
			total := 0
			for _, s := range d.Spans {
				total += s
			}
			require.Equal(t, total, got.TotalPages())
			require.Equal(t, d.PageSize*uint64(total), got.Bytes())
			requireTruncationsRejected(t, d)
		})
	}
}

// TestDescriptorSpansLayout: version 3 is version 2's bytes (with the
// authentication fd) followed by the spans as uint32.
func TestDescriptorSpansLayout(t *testing.T) {
	le := binary.LittleEndian
	d := validSpans()
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	d.Spans = nil
	v2 := marshalUnchecked(d) // its extent is not valid over 3 pages
	require.EqualValues(t, VersionAuth, le.Uint16(v2[4:]))
	require.Len(t, b, len(v2)+3*4)
	require.Equal(t, v2[6:], b[6:len(v2)], "version 2's fields, auth fd included")
	require.EqualValues(t, 6, le.Uint32(b[len(v2)-4:]), "the authentication fd before the spans")
	for i, s := range []uint32{1, 4, 1} {
		require.Equal(t, s, le.Uint32(b[len(v2)+4*i:]), "span %d", i)
	}

	// Without fd numbers there is no authentication fd in version 3.
	b, err = validSocketSpans().MarshalBinary()
	require.NoError(t, err)
	n := int(le.Uint16(b[72:]))
	require.EqualValues(t, 0, le.Uint32(b[74+n:]), "no handles")
	require.Len(t, b, 74+n+4+3*4)
}

// TestDescriptorSpansAllOnes: spans of one page each are no spans: written
// byte for byte as without them, read back as nil; a version 3 that
// carries them is refused (it has one encoding only).
func TestDescriptorSpansAllOnes(t *testing.T) {
	for name, d := range map[string]*Descriptor{"v1": validPosix(), "v2": validAuthed(), "fabric": validFabric()} {
		t.Run(name, func(t *testing.T) {
			want, err := d.MarshalBinary()
			require.NoError(t, err)
			d.Spans = []int{1, 1, 1}
			got, err := d.MarshalBinary()
			require.NoError(t, err)
			require.Equal(t, want, got)
			p, err := ParseDescriptor(got)
			require.NoError(t, err)
			require.Nil(t, p.Spans)
			require.Equal(t, d.Bytes(), p.Bytes())

			forged := append([]byte(nil), got...)
			binary.LittleEndian.PutUint16(forged[4:], Version)
			if d.Kind == KindPosixFD && !d.HasAuth {
				forged = binary.LittleEndian.AppendUint32(forged, 6) // the auth fd v3 has with fd numbers
			}
			for range 3 {
				forged = binary.LittleEndian.AppendUint32(forged, 1)
			}
			_, err = ParseDescriptor(forged)
			require.ErrorIs(t, err, vmm.ErrInvalid)
			require.ErrorContains(t, err, "all one page")
		})
	}
}

func TestDescriptorSpansRejects(t *testing.T) {
	cases := map[string]func(d *Descriptor){
		"zero span":             func(d *Descriptor) { d.Spans[1] = 0 },
		"negative span":         func(d *Descriptor) { d.Spans[1] = -1 },
		"huge span":             func(d *Descriptor) { d.Spans[1] = 1<<32 - 1 },
		"span past MaxPages":    func(d *Descriptor) { d.Spans[1] = MaxPages + 1 },
		"total past MaxPages":   func(d *Descriptor) { d.Spans[1] = MaxPages - 1 },
		"fewer spans":           func(d *Descriptor) { d.Spans = d.Spans[:2] },
		"more spans":            func(d *Descriptor) { d.Spans = append(d.Spans, 1) },
		"offset past first":     func(d *Descriptor) { d.Offset, d.Length = 2<<20, 9<<20 },
		"ends before last":      func(d *Descriptor) { d.Length = 10<<20 - 4096 },
		"past the allocations":  func(d *Descriptor) { d.Length = 12<<20 - 4095 },
		"zero length":           func(d *Descriptor) { d.Length = 0 },
		"length overflow":       func(d *Descriptor) { d.Length = 1<<64 - 4096 },
		"fds without auth":      func(d *Descriptor) { d.HasAuth, d.AuthFD = false, 0 },
		"cuda-ipc with spans":   func(d *Descriptor) { d.Kind, d.PageFDs, d.HasAuth, d.AuthFD = KindCUDAIPC, nil, false, 0; d.IPC[0] = 1 },
		"unknown kind, spans":   func(d *Descriptor) { d.Kind = 9 },
		"one-page cuda-ipc":     func(d *Descriptor) { *d = *validCUDAIPC(); d.Spans = []int{2} },
		"fabric, first skipped": func(d *Descriptor) { *d = *validFabricSpans(); d.Offset = 6 << 20 },
		"fabric, last untouched": func(d *Descriptor) {
			*d = *validFabricSpans()
			d.Offset, d.Length = 0, 6<<20
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			d := validSpans()
			mutate(d)
			_, err := d.MarshalBinary()
			require.ErrorIs(t, err, vmm.ErrInvalid)
			// The same descriptor written without validation must not parse.
			_, err = ParseDescriptor(marshalUnchecked(d))
			require.ErrorIs(t, err, vmm.ErrInvalid)
		})
	}
}

// TestDescriptorSpansBounds: what the spans allow that one page each does
// not, exactly at the edges.
func TestDescriptorSpansBounds(t *testing.T) {
	d := validFabricSpans()
	d.Offset, d.Length = 6<<20-1, 2
	require.NoError(t, d.Validate(), "from the last byte of a 3-page first allocation")
	d.Length = 1
	require.ErrorContains(t, d.Validate(), "before the last", "the block must reach into the last allocation")
	d.Length = 2<<20 + 1
	require.NoError(t, d.Validate(), "to the last byte of the last allocation")
	d.Length++
	require.ErrorIs(t, d.Validate(), vmm.ErrInvalid)

	d = validSpans()
	d.Spans = []int{1, MaxPages - 2, 1}
	d.Length = (MaxPages-1)*d.PageSize + 1 - d.Offset
	require.NoError(t, d.Validate(), "MaxPages in all")
	require.Equal(t, uint64(MaxPages)*d.PageSize, d.Bytes())
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	_, err = ParseDescriptor(b)
	require.NoError(t, err)
	d.Spans[1]++
	d.Length += d.PageSize
	require.ErrorContains(t, d.Validate(), "more than")

	d = validFabricSpans()
	d.PageSize = MaxPageSize
	d.Offset, d.Length = 0, 3*MaxPageSize+1
	require.NoError(t, d.Validate(), "pages of 1 TiB")
	require.Equal(t, uint64(4*MaxPageSize), d.Bytes())
}

// TestParseSpansFraming: the spans' bytes are checked before anything is
// allocated for them, and the wire's values are refused, not wrapped.
func TestParseSpansFraming(t *testing.T) {
	le := binary.LittleEndian
	d := validSocketSpans()
	d.PageCount, d.Spans = MaxPages, nil
	d.Length = d.PageSize*MaxPages - d.Offset
	b := marshalUnchecked(d)
	le.PutUint16(b[4:], Version)
	_, err := ParseDescriptor(b)
	require.ErrorContains(t, err, "truncated", "a million spans with no bytes behind them")

	good, err := validSpans().MarshalBinary()
	require.NoError(t, err)
	for _, v := range []uint32{0, 1<<32 - 1, MaxPages + 1, 1 << 31} {
		bad := append([]byte(nil), good...)
		le.PutUint32(bad[len(bad)-8:], v) // the middle span
		_, err := ParseDescriptor(bad)
		require.ErrorIs(t, err, vmm.ErrInvalid, "span %d", v)
	}
	bad := append([]byte(nil), good...)
	le.PutUint32(bad[len(bad)-8:], MaxPages-1) // 1 + (MaxPages-1) + 1 pages
	_, err = ParseDescriptor(bad)
	require.ErrorContains(t, err, "more than")

	// A version-2 reader's view: version 3 bytes read as version 2 have
	// trailing bytes; version 2 bytes read as version 3 lack the spans.
	bad = append([]byte(nil), good...)
	le.PutUint16(bad[4:], VersionAuth)
	_, err = ParseDescriptor(bad)
	require.ErrorContains(t, err, "trailing")
}
