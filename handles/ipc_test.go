package handles

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// validCUDAIPC is a cuda-ipc descriptor: one 20 MiB allocation, a 6 MiB
// block 3 MiB into it.
func validCUDAIPC() *Descriptor {
	d := validPosix()
	d.Kind, d.PageFDs = KindCUDAIPC, nil
	d.PageSize, d.PageCount, d.Offset, d.Length = 20<<20, 1, 3<<20, 6<<20
	d.IPC[0], d.IPC[63] = 0xc1, 0xa0
	return d
}

func TestCUDAIPCRoundTrip(t *testing.T) {
	for name, d := range map[string]*Descriptor{"socket": validCUDAIPC(), "no socket": func() *Descriptor {
		d := validCUDAIPC()
		d.Endpoint = ""
		return d
	}()} {
		t.Run(name, func(t *testing.T) {
			b, err := d.MarshalBinary()
			require.NoError(t, err)
			n := len(d.Endpoint)
			require.EqualValues(t, KindCUDAIPC, binary.LittleEndian.Uint16(b[6:]))
			require.EqualValues(t, 1, binary.LittleEndian.Uint32(b[74+n:]), "one handle")
			require.Equal(t, d.IPC[:], b[78+n:], "the handle's 64 bytes end the descriptor")
			got, err := ParseDescriptor(b)
			require.NoError(t, err)
			require.Equal(t, d, got)
			require.Equal(t, "cuda-ipc", got.Kind.String())
			require.Equal(t, vmm.HandleNone, got.Kind.HandleType())
		})
	}
}

// TestCUDAIPCRejects: malformed cuda-ipc descriptors are refused, by
// MarshalBinary and by ParseDescriptor, with an error that says why.
func TestCUDAIPCRejects(t *testing.T) {
	cases := map[string]struct {
		mutate func(d *Descriptor)
		says   string
	}{
		"two pages":      {func(d *Descriptor) { d.PageCount = 2; d.Length = 30 << 20 }, "one allocation, one page"},
		"zero handle":    {func(d *Descriptor) { d.IPC = IPCHandle{} }, "0 handles in a cuda-ipc descriptor"},
		"with fds":       {func(d *Descriptor) { d.PageFDs = []int{5} }, "2 handles in a cuda-ipc descriptor"},
		"with fabric":    {func(d *Descriptor) { d.Fabric = []Fabric{{1}}; d.IPC = IPCHandle{} }, "carries handles of another kind"},
		"posix with ipc": {func(d *Descriptor) { d.Kind = KindPosixFD }, "carries handles of another kind"},
		"past the end":   {func(d *Descriptor) { d.Length = 18 << 20 }, "outside 1 pages"},
		"offset too far": {func(d *Descriptor) { d.Offset = 20 << 20; d.Length = 1 }, "outside 1 pages"},
		"zero length":    {func(d *Descriptor) { d.Length = 0 }, "zero length"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			d := validCUDAIPC()
			c.mutate(d)
			_, err := d.MarshalBinary()
			require.ErrorIs(t, err, vmm.ErrInvalid)
			require.ErrorContains(t, err, c.says)
			if name == "with fabric" {
				return // on the wire a fabric handle reads as the IPC handle
			}
			_, err = ParseDescriptor(marshalUnchecked(d))
			require.ErrorIs(t, err, vmm.ErrInvalid)
			if name != "posix with ipc" { // on the wire: an fd and 60 stray bytes
				require.ErrorContains(t, err, c.says)
			}
		})
	}
}

func TestCUDAIPCRejectsFraming(t *testing.T) {
	requireTruncationsRejected(t, validCUDAIPC())
	// Two handles on the wire for the one page.
	d := validCUDAIPC()
	b := marshalUnchecked(d)
	n := len(d.Endpoint)
	binary.LittleEndian.PutUint32(b[74+n:], 2)
	_, err := ParseDescriptor(append(b, d.IPC[:]...))
	require.ErrorContains(t, err, "2 handles in a cuda-ipc descriptor")
}
