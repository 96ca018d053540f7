package vmmtest

import (
	"bytes"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// memAlloc makes a plain allocation and frees it when the test ends, unless
// the test did.
func (e *env) memAlloc(size uint64) vmm.DevicePtr {
	e.t.Helper()
	p, err := e.d.MemAlloc(e.dev, size)
	require.NoError(e.t, err, "MemAlloc(%d, %d)", e.dev, size)
	require.NotZero(e.t, p, "MemAlloc returned address 0")
	e.t.Cleanup(func() {
		if err := e.d.MemFree(p); !gone(err) {
			e.t.Errorf("cleanup: MemFree(%v): %v", p, err)
		}
	})
	return p
}

// testCopyRoundTrip writes bytes to mapped pages and reads them back, whole
// and in pieces at odd offsets.
func testCopyRoundTrip(t *testing.T, c Config) {
	e := open(t, c)
	p, _ := e.backed(2)
	data := pattern(int(2*e.gran), 1)
	e.write(p, data)
	require.True(t, bytes.Equal(data, e.read(p, len(data))), "round trip of %d bytes", len(data))

	piece := pattern(4097, 2)
	at := p.Add(e.gran - 2000) // across the boundary of two granules
	e.write(at, piece)
	require.True(t, bytes.Equal(piece, e.read(at, len(piece))), "round trip at an odd offset")
	require.Equal(t, data[:e.gran-2000], e.read(p, int(e.gran-2000)), "bytes before the piece changed")
	require.NoError(t, e.d.CopyHtoD(p, nil), "CopyHtoD of 0 bytes")
	require.NoError(t, e.d.CopyDtoH(nil, p), "CopyDtoH of 0 bytes")
}

// testCopyUnmapped checks that copies to or from addresses with no
// accessible mapping are refused.
func testCopyUnmapped(t *testing.T, c Config) {
	e := open(t, c)
	p := e.reserve(2 * e.gran)
	h := e.create(e.gran, vmm.HandleNone)
	e.mapRW(p, e.gran, h, 0)
	buf := make([]byte, 64)
	hole := p.Add(e.gran)
	requireIs(t, e.d.CopyHtoD(hole, buf), vmm.ErrInvalid, "CopyHtoD to a reserved, unmapped address")
	requireIs(t, e.d.CopyDtoH(buf, hole), vmm.ErrInvalid, "CopyDtoH from a reserved, unmapped address")
	requireIs(t, e.d.CopyHtoD(hole-32, buf), vmm.ErrInvalid, "CopyHtoD running off the end of a mapping")
	requireIs(t, e.d.Memset(hole, 1, 64), vmm.ErrInvalid, "Memset of an unmapped address")
	requireIs(t, MemsetAsync(e.d, hole, 1, 64, 0), vmm.ErrInvalid, "MemsetAsync of an unmapped address")
	requireIs(t, e.d.CopyDtoD(hole, p, 64), vmm.ErrInvalid, "CopyDtoD to an unmapped address")
	// The mapped granule was not touched by the refused calls.
	require.Equal(t, make([]byte, 32), e.read(hole-32, 32), "bytes before the hole")
}

// testMemset sets runs of bytes of any size and checks the bytes around them.
func testMemset(t *testing.T, c Config) {
	e := open(t, c)
	p, _ := e.backed(2)
	size := int(2 * e.gran)
	require.NoError(t, e.d.Memset(p, 0xa5, uint64(size)), "Memset of two granules")
	want := bytes.Repeat([]byte{0xa5}, size)
	require.True(t, bytes.Equal(want, e.read(p, size)), "bytes after Memset")

	at, n := int(e.gran)-3, 1001
	require.NoError(t, e.d.Memset(p.Add(uint64(at)), 0x3c, uint64(n)), "Memset of %d bytes at offset %d", n, at)
	copy(want[at:at+n], bytes.Repeat([]byte{0x3c}, n))
	require.True(t, bytes.Equal(want, e.read(p, size)), "bytes after an odd-sized Memset")
	require.NoError(t, e.d.Memset(p, 0, 0), "Memset of 0 bytes")
}

// testCopyDtoD copies between two pages and within one.
func testCopyDtoD(t *testing.T, c Config) {
	e := open(t, c)
	a, _ := e.backed(1)
	b, _ := e.backed(1)
	data := pattern(int(e.gran), 4)
	e.write(a, data)
	require.NoError(t, e.d.Memset(b, 0, e.gran))
	require.NoError(t, e.d.CopyDtoD(b.Add(100), a.Add(200), 5000), "CopyDtoD between pages")
	got := e.read(b, int(e.gran))
	require.Equal(t, data[200:5200], got[100:5100], "copied bytes")
	require.Equal(t, make([]byte, 100), got[:100], "bytes before the copy")
	require.Equal(t, make([]byte, int(e.gran)-5100), got[5100:], "bytes after the copy")
	require.NoError(t, e.d.CopyDtoD(a, a.Add(e.gran/2), e.gran/2), "CopyDtoD within a page")
	require.Equal(t, data[e.gran/2:], e.read(a, int(e.gran/2)), "bytes copied within a page")
}

// testAlias maps one page at two addresses: both show the same bytes.
func testAlias(t *testing.T, c Config) {
	e := open(t, c)
	h := e.create(e.gran, vmm.HandleNone)
	p := e.reserve(e.gran)
	q := e.reserve(2 * e.gran)
	e.mapRW(p, e.gran, h, 0)
	e.mapRW(q.Add(e.gran), e.gran, h, 0)
	data := pattern(int(e.gran), 5)
	e.write(p, data)
	require.True(t, bytes.Equal(data, e.read(q.Add(e.gran), len(data))), "bytes through the second mapping")
	e.write(q.Add(e.gran+10), []byte("alias"))
	require.Equal(t, []byte("alias"), e.read(p.Add(10), 5), "bytes written through the second mapping")
}

// testMemAlloc checks plain allocations: data, double free, unknown
// pointers and memory beyond the device's.
func testMemAlloc(t *testing.T, c Config) {
	e := openAny(t, c)
	a := e.memAlloc(3000)
	b := e.memAlloc(1 << 20)
	require.True(t, b >= a.Add(3000) || a >= b.Add(1<<20), "allocations %v and %v overlap", a, b)
	data := pattern(3000, 6)
	e.write(a, data)
	require.Equal(t, data, e.read(a, 3000), "round trip through a plain allocation")
	require.NoError(t, e.d.CopyDtoD(b.Add(7), a, 3000))
	require.Equal(t, data, e.read(b.Add(7), 3000), "CopyDtoD between plain allocations")
	require.NoError(t, e.d.Memset(a, 9, 3000))
	require.Equal(t, bytes.Repeat([]byte{9}, 3000), e.read(a, 3000), "Memset of a plain allocation")

	require.NoError(t, e.d.MemFree(a))
	requireIs(t, e.d.MemFree(a), vmm.ErrInvalid, "MemFree twice")
	requireIs(t, e.d.MemFree(b.Add(16)), vmm.ErrInvalid, "MemFree inside an allocation")

	_, total, err := e.d.MemInfo(e.dev)
	require.NoError(t, err)
	big := total + 8<<30
	x, err := e.d.MemAlloc(e.dev, big)
	if err == nil {
		require.NoError(t, e.d.MemFree(x))
	}
	requireIs(t, err, vmm.ErrOutOfMemory, "MemAlloc(%d bytes) beyond the device's memory", big)
	x, err = e.d.MemAlloc(e.dev, math.MaxUint64)
	if err == nil {
		require.NoError(t, e.d.MemFree(x))
	}
	requireIs(t, err, vmm.ErrOutOfMemory, "MemAlloc(%d bytes)", uint64(math.MaxUint64))
}

// testWrapAround checks that a copy or memset whose end runs past the top
// of the address space is refused with ErrInvalid, from mapped memory and
// from a plain allocation alike: its end wraps around to a low address,
// which must not pass for "inside", and the work must not reach the device.
func testWrapAround(t *testing.T, c Config) {
	e := open(t, c)
	p, _ := e.backed(1)
	e.write(p, pattern(64, 10))
	a := e.memAlloc(4096)
	s := e.stream()
	const n = math.MaxUint64 // p+n is p-1
	for _, at := range []vmm.DevicePtr{p, a.Add(1)} {
		requireIs(t, e.d.Memset(at, 1, n), vmm.ErrInvalid, "Memset of %d bytes at %v", uint64(n), at)
		requireIs(t, MemsetAsync(e.d, at, 1, n, 0), vmm.ErrInvalid, "MemsetAsync of %d bytes at %v", uint64(n), at)
		requireIs(t, MemsetAsync(e.d, at, 1, n, s), vmm.ErrInvalid, "MemsetAsync of %d bytes at %v on a stream", uint64(n), at)
		requireIs(t, e.d.CopyDtoD(at, p, n), vmm.ErrInvalid, "CopyDtoD of %d bytes to %v", uint64(n), at)
		requireIs(t, e.d.CopyDtoD(p, at, n), vmm.ErrInvalid, "CopyDtoD of %d bytes from %v", uint64(n), at)
	}
	require.Equal(t, pattern(64, 10), e.read(p, 64), "bytes after the refused calls")
}
