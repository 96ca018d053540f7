package handles

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

func validPosix() *Descriptor {
	return &Descriptor{
		Kind:        KindPosixFD,
		ExporterPID: 4242,
		DeviceUUID:  [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		PageSize:    2 << 20,
		PageCount:   3,
		Offset:      4096,
		Length:      5 << 20,
		Endpoint:    "@xseg-4242-abcdef",
		Token:       Token{0xde, 0xad, 0xbe, 0xef, 15: 1},
		PageFDs:     []int{7, 8, 9},
	}
}

func validFabric() *Descriptor {
	d := validPosix()
	d.Kind, d.PageFDs, d.Endpoint = KindFabric, nil, ""
	d.Fabric = make([]Fabric, d.PageCount)
	for i := range d.Fabric {
		d.Fabric[i][0], d.Fabric[i][63] = byte(i+1), 0x5a
	}
	return d
}

// validAuthed is validPosix with an authentication fd: wire version 2.
func validAuthed() *Descriptor {
	d := validPosix()
	d.HasAuth, d.AuthFD = true, 6
	return d
}

func TestDescriptorRoundTrip(t *testing.T) {
	noFDs := validPosix()
	noFDs.PageFDs = nil
	for name, d := range map[string]*Descriptor{"posix": validPosix(), "posix-socket-only": noFDs, "fabric": validFabric(), "authed": validAuthed()} {
		t.Run(name, func(t *testing.T) {
			b, err := d.MarshalBinary()
			require.NoError(t, err)
			got, err := ParseDescriptor(b)
			require.NoError(t, err)
			require.Equal(t, d, got)
		})
	}
}

// TestDescriptorLayout pins the byte positions of the wire format.
func TestDescriptorLayout(t *testing.T) {
	d := validPosix()
	b, err := d.MarshalBinary()
	require.NoError(t, err)
	le := binary.LittleEndian
	require.Equal(t, "XSGD", string(b[0:4]))
	require.EqualValues(t, VersionNoAuth, le.Uint16(b[4:]), "without an authentication fd: version 1, as before")
	require.EqualValues(t, KindPosixFD, le.Uint16(b[6:]))
	require.EqualValues(t, 4242, le.Uint32(b[8:]))
	require.Equal(t, d.DeviceUUID[:], b[12:28])
	require.EqualValues(t, 2<<20, le.Uint64(b[28:]))
	require.EqualValues(t, 3, le.Uint32(b[36:]))
	require.EqualValues(t, 4096, le.Uint64(b[40:]))
	require.EqualValues(t, 5<<20, le.Uint64(b[48:]))
	require.Equal(t, d.Token[:], b[56:72])
	n := int(le.Uint16(b[72:]))
	require.Equal(t, d.Endpoint, string(b[74:74+n]))
	require.EqualValues(t, 3, le.Uint32(b[74+n:]))
	require.EqualValues(t, 9, le.Uint32(b[74+n+4+8:]))
	require.Len(t, b, 74+n+4+3*4)
}

func TestParseRejects(t *testing.T) {
	cases := map[string]func(d *Descriptor){
		"zero pid":          func(d *Descriptor) { d.ExporterPID = 0 },
		"huge pid":          func(d *Descriptor) { d.ExporterPID = MaxPID + 1 },
		"page size not 4K":  func(d *Descriptor) { d.PageSize = 3<<20 + 512 },
		"page size small":   func(d *Descriptor) { d.PageSize = 2048; d.Offset = 0; d.Length = 1 },
		"zero pages":        func(d *Descriptor) { d.PageCount = 0; d.PageFDs = nil },
		"zero length":       func(d *Descriptor) { d.Length = 0 },
		"past the pages":    func(d *Descriptor) { d.Length = 6 << 20 },
		"offset overflow":   func(d *Descriptor) { d.Offset = 1<<64 - 1 },
		"offset whole page": func(d *Descriptor) { d.Offset = 2 << 20; d.Length = 1 << 20 },
		"spare last page":   func(d *Descriptor) { d.Length = 1 << 20 },
		"fd count mismatch": func(d *Descriptor) { d.PageFDs = d.PageFDs[:2] },
		"negative fd":       func(d *Descriptor) { d.PageFDs[1] = -1 },
		"unknown kind":      func(d *Descriptor) { d.Kind = 9 },
		"zero token":        func(d *Descriptor) { d.Token = Token{} },
		"long endpoint":     func(d *Descriptor) { d.Endpoint = string(make([]byte, 108)) },
		"NUL in endpoint":   func(d *Descriptor) { d.Endpoint = "@a\x00b" },
		"fabric with fds":   func(d *Descriptor) { d.Kind = KindFabric },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			d := validPosix()
			mutate(d)
			_, err := d.MarshalBinary()
			require.ErrorIs(t, err, vmm.ErrInvalid)
			// The same descriptor written without validation must not parse.
			_, err = ParseDescriptor(marshalUnchecked(d))
			require.ErrorIs(t, err, vmm.ErrInvalid)
		})
	}
}

func TestParseRejectsFraming(t *testing.T) {
	good := requireTruncationsRejected(t, validFabric())

	bad := append([]byte(nil), good...)
	bad[4] = 4
	_, err := ParseDescriptor(bad)
	require.ErrorContains(t, err, "unknown version 4")
	bad[4] = 0
	_, err = ParseDescriptor(bad)
	require.ErrorContains(t, err, "unknown version 0")
	bad[4] = 3
	_, err = ParseDescriptor(bad)
	require.ErrorContains(t, err, "truncated", "version 3 without its spans")
	bad[4] = 2
	_, err = ParseDescriptor(bad)
	require.ErrorIs(t, err, vmm.ErrInvalid, "version 2 without its authentication fd")
	bad = append([]byte(nil), good...)
	bad[0] = 'Y'
	_, err = ParseDescriptor(bad)
	require.ErrorContains(t, err, "bad magic")

	// A huge handle count with no bytes behind it must fail before allocating.
	d := validPosix()
	d.PageCount, d.PageFDs = MaxPages, nil
	d.Length = d.PageSize*MaxPages - d.Offset
	b := marshalUnchecked(d)
	binary.LittleEndian.PutUint32(b[len(b)-4:], MaxPages)
	_, err = ParseDescriptor(b)
	require.ErrorContains(t, err, "truncated")
}

func TestParseDoesNotAlias(t *testing.T) {
	b, err := validFabric().MarshalBinary()
	require.NoError(t, err)
	d, err := ParseDescriptor(b)
	require.NoError(t, err)
	for i := range b {
		b[i] = 0xff
	}
	require.Equal(t, validFabric(), d)
}

func TestTokens(t *testing.T) {
	a, err := NewToken()
	require.NoError(t, err)
	b, err := NewToken()
	require.NoError(t, err)
	require.False(t, a.IsZero())
	require.False(t, a.Equal(b))
	require.True(t, a.Equal(a))
}

// marshalUnchecked encodes d like MarshalBinary without validating it.
func marshalUnchecked(d *Descriptor) []byte {
	le := binary.LittleEndian
	b := append([]byte(magic), 0, 0, 0, 0)
	le.PutUint16(b[4:], d.version())
	le.PutUint16(b[6:], uint16(d.Kind))
	b = le.AppendUint32(b, uint32(d.ExporterPID))
	b = append(b, d.DeviceUUID[:]...)
	b = le.AppendUint64(b, d.PageSize)
	b = le.AppendUint32(b, uint32(d.PageCount))
	b = le.AppendUint64(b, d.Offset)
	b = le.AppendUint64(b, d.Length)
	b = append(b, d.Token[:]...)
	b = le.AppendUint16(b, uint16(len(d.Endpoint)))
	b = append(b, d.Endpoint...)
	b = le.AppendUint32(b, uint32(d.handleCount()))
	for _, fd := range d.PageFDs {
		b = le.AppendUint32(b, uint32(fd))
	}
	for _, f := range d.Fabric {
		b = append(b, f[:]...)
	}
	if !d.IPC.IsZero() {
		b = append(b, d.IPC[:]...)
	}
	if d.HasAuth {
		b = le.AppendUint32(b, uint32(d.AuthFD))
	}
	if d.version() == Version {
		for _, n := range d.Spans {
			b = le.AppendUint32(b, uint32(n))
		}
	}
	return b
}

// requireTruncationsRejected checks that every prefix of d's encoding and
// the encoding with a byte more fail to parse, and returns the encoding.
func requireTruncationsRejected(t *testing.T, d *Descriptor) []byte {
	t.Helper()
	good, err := d.MarshalBinary()
	require.NoError(t, err)
	for n := 0; n < len(good); n++ {
		_, err := ParseDescriptor(good[:n])
		require.ErrorIs(t, err, vmm.ErrInvalid, "truncated to %d bytes", n)
	}
	_, err = ParseDescriptor(append(good[:len(good):len(good)], 0))
	require.ErrorContains(t, err, "trailing")
	return good
}
