package handles

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strings"

	"github.com/xseg-dev/xseg/vmm"
)

// Wire format, versions 1 to 3. All integers are little endian; fields
// appear in exactly this order and nothing follows the last one:
//
//	off  size  field
//	  0     4  magic "XSGD"
//	  4     2  version (1, 2 or 3)
//	  6     2  kind (1 posix-fd, 2 fabric, 3 cuda-ipc)
//	  8     4  exporter pid
//	 12    16  device UUID
//	 28     8  page size
//	 36     4  page count c (of handles: of allocations)
//	 40     8  offset of the block in the pages
//	 48     8  length of the block
//	 56    16  token
//	 72     2  endpoint length n (<= 107)
//	 74     n  endpoint bytes
//	74+n    4  handle count h (c, or 0 for posix-fd without fd numbers)
//	78+n     h handles: int32 fd numbers (posix-fd), 64-byte fabric handles,
//	         or one 64-byte CUDA IPC handle (cuda-ipc; page count 1)
//	         version 2, and version 3 with fd numbers:
//	  ...   4  the exporter's fd number of the share's authentication
//	         memfd (see auth.go); posix-fd with fd numbers only
//	         version 3 only:
//	  ...  4c  the spans: uint32 pages of page size each allocation holds,
//	         each at least 1, at most MaxPages in all, not all 1
//
// Kind 3 was added without a new version: the layout is unchanged, and a
// reader that predates it refuses the descriptor as of an unknown kind.
// Version 2 adds the authentication fd, without which the fd numbers are
// not to be trusted (pidfd_getfd would copy whatever the exporter has open
// at that number now). A descriptor with one is written as version 2, so
// that a reader that predates it refuses it instead of trusting bare fd
// numbers; every other descriptor is still written as version 1, which
// older readers read as before. Version 3 adds the spans, for allocations
// of several pages: written only for a descriptor with spans (posix-fd or
// fabric), which a reader that predates it must refuse, for it would map
// one page of each allocation at the wrong places. A version-3 descriptor
// with fd numbers always carries its authentication fd. This package reads
// all three; a version-1 descriptor with fd numbers parses (the socket
// transport serves it), and the importer's pidfd transport refuses it.
const (
	// Version is the newest wire format version this package writes and
	// reads: a descriptor with spans.
	Version = 3
	// VersionAuth is the version of a descriptor with an authentication
	// fd and without spans.
	VersionAuth = 2
	// VersionNoAuth is the version of a descriptor without an
	// authentication fd and without spans.
	VersionNoAuth = 1
	magic         = "XSGD"
	headerSize    = 74
)

// MarshalBinary validates d and encodes it in the wire format.
func (d *Descriptor) MarshalBinary() ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	spans := NormalSpans(d.Spans)
	b := make([]byte, 0, headerSize+len(d.Endpoint)+4+len(d.PageFDs)*4+len(d.Fabric)*64+4+len(spans)*4)
	b = append(b, magic...)
	b = le.AppendUint16(b, d.version())
	b = le.AppendUint16(b, uint16(d.Kind))
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
	if d.Kind == KindCUDAIPC {
		b = append(b, d.IPC[:]...)
	}
	if d.HasAuth {
		b = le.AppendUint32(b, uint32(d.AuthFD))
	}
	for _, n := range spans {
		b = le.AppendUint32(b, uint32(n))
	}
	return b, nil
}

// version is the wire version d is written in: the oldest that holds it.
func (d *Descriptor) version() uint16 {
	switch {
	case NormalSpans(d.Spans) != nil:
		return Version
	case d.HasAuth:
		return VersionAuth
	}
	return VersionNoAuth
}

// ParseDescriptor decodes and validates a descriptor in the wire format.
// b is untrusted: any malformed, truncated, oversized or inconsistent input,
// an unknown version, and trailing bytes give an error wrapping
// vmm.ErrInvalid; it never panics. The result does not alias b.
func ParseDescriptor(b []byte) (*Descriptor, error) {
	r := reader{b: b}
	if m := r.bytes(4); m != nil && string(m) != magic {
		return nil, invalid("bad magic %q", m)
	}
	v := r.u16()
	if r.err == nil && (v < VersionNoAuth || v > Version) {
		return nil, invalid("unknown version %d (this build reads %d to %d)", v, VersionNoAuth, Version)
	}
	d := &Descriptor{Kind: Kind(r.u16()), ExporterPID: int(r.u32())}
	copy(d.DeviceUUID[:], r.bytes(16))
	d.PageSize = r.u64()
	d.PageCount = int(r.u32())
	d.Offset = r.u64()
	d.Length = r.u64()
	copy(d.Token[:], r.bytes(16))
	d.Endpoint = string(r.bytes(int(r.u16())))
	n := int(r.u32())
	if r.err != nil {
		return nil, r.err
	}
	if err := d.validateHandleCount(n); err != nil {
		return nil, err
	}
	if err := d.readHandles(&r, n); err != nil {
		return nil, err
	}
	if v == VersionAuth || v == Version && d.Kind == KindPosixFD && n > 0 {
		d.AuthFD, d.HasAuth = int(int32(r.u32())), true
		if r.err != nil {
			return nil, r.err
		}
	}
	if v == Version {
		if err := d.readSpans(&r); err != nil {
			return nil, err
		}
	}
	if len(r.b) != 0 {
		return nil, invalid("%d trailing bytes", len(r.b))
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return d, nil
}

// readHandles reads n handles of d's kind.
func (d *Descriptor) readHandles(r *reader, n int) error {
	if n == 0 {
		return nil
	}
	size := 4
	if d.Kind == KindFabric || d.Kind == KindCUDAIPC {
		size = 64
	}
	if len(r.b)/size < n {
		return invalid("truncated: %d handles need %d bytes, %d left", n, n*size, len(r.b))
	}
	switch d.Kind {
	case KindPosixFD:
		d.PageFDs = make([]int, n)
		for i := range d.PageFDs {
			d.PageFDs[i] = int(int32(r.u32()))
		}
	case KindFabric:
		d.Fabric = make([]Fabric, n)
		for i := range d.Fabric {
			copy(d.Fabric[i][:], r.bytes(64))
		}
	case KindCUDAIPC:
		copy(d.IPC[:], r.bytes(64))
	}
	return r.err
}

// readSpans reads the PageCount spans of a version-3 descriptor.
func (d *Descriptor) readSpans(r *reader) error {
	if len(r.b)/4 < d.PageCount {
		return invalid("truncated: %d spans need %d bytes, %d left", d.PageCount, 4*d.PageCount, len(r.b))
	}
	d.Spans = make([]int, d.PageCount)
	for i := range d.Spans {
		// Above MaxPages (and negative where int is 32 bits): Validate
		// refuses it.
		d.Spans[i] = int(min(r.u32(), MaxPages+1))
	}
	if NormalSpans(d.Spans) == nil {
		return invalid("version %d descriptor whose allocations are all one page (written as version %d or %d)", Version, VersionNoAuth, VersionAuth)
	}
	return r.err
}

// handleCount is the number of handles d carries in the wire format.
func (d *Descriptor) handleCount() int {
	n := len(d.PageFDs) + len(d.Fabric)
	if !d.IPC.IsZero() {
		n++
	}
	return n
}

// validateHandleCount checks a handle count against kind and page count
// before anything is allocated for it.
func (d *Descriptor) validateHandleCount(n int) error {
	if d.PageCount <= 0 || d.PageCount > MaxPages {
		return invalid("page count %d outside 1..%d", d.PageCount, MaxPages)
	}
	switch d.Kind {
	case KindPosixFD:
		if n != 0 && n != d.PageCount {
			return invalid("%d fd numbers for %d pages", n, d.PageCount)
		}
	case KindFabric:
		if n != d.PageCount {
			return invalid("%d fabric handles for %d pages", n, d.PageCount)
		}
	case KindCUDAIPC:
		if d.PageCount != 1 {
			return invalid("cuda-ipc descriptor of %d pages: it names one allocation, one page", d.PageCount)
		}
		if n != 1 {
			return invalid("%d handles in a cuda-ipc descriptor: want one", n)
		}
	default:
		return invalid("unknown handle kind %d", uint16(d.Kind))
	}
	return nil
}

// Validate checks every field of d; MarshalBinary and ParseDescriptor call
// it. The error wraps vmm.ErrInvalid.
func (d *Descriptor) Validate() error {
	if d.ExporterPID <= 0 || d.ExporterPID > MaxPID {
		return invalid("exporter pid %d outside 1..%d", d.ExporterPID, MaxPID)
	}
	if d.PageSize < MinPageSize || d.PageSize > MaxPageSize || d.PageSize%MinPageSize != 0 {
		return invalid("page size %d is not a multiple of %d in %d..%d", d.PageSize, MinPageSize, MinPageSize, uint64(MaxPageSize))
	}
	if err := d.validateHandleCount(d.handleCount()); err != nil {
		return err
	}
	if d.foreignHandles() {
		return invalid("%s descriptor carries handles of another kind", d.Kind)
	}
	if err := d.validateSpans(); err != nil {
		return err
	}
	if err := d.validateExtent(); err != nil {
		return err
	}
	if err := CheckEndpoint(d.Endpoint); err != nil {
		return err
	}
	if d.Token.IsZero() {
		return invalid("zero token")
	}
	for i, fd := range d.PageFDs {
		if fd < 0 || fd > math.MaxInt32 {
			return invalid("fd number %d of page %d", fd, i)
		}
	}
	if err := d.validateAuth(); err != nil {
		return err
	}
	for i, f := range d.Fabric {
		if f.IsZero() {
			return invalid("zero fabric handle of page %d", i)
		}
	}
	return nil
}

// CheckEndpoint checks that a descriptor can name the socket ep
// (Descriptor.Endpoint): at most MaxEndpoint bytes, no NUL, and not "@"
// alone (an abstract name needs a name); "" (no socket) is fine. An
// exporter checks its endpoint with it before it listens. The error wraps
// vmm.ErrInvalid.
func CheckEndpoint(ep string) error {
	if len(ep) > MaxEndpoint || strings.IndexByte(ep, 0) >= 0 || ep == "@" {
		return invalid("endpoint %q: want at most %d bytes without NUL", ep, MaxEndpoint)
	}
	return nil
}

// validateAuth checks the authentication fd against the kind and the fd
// numbers it vouches for.
func (d *Descriptor) validateAuth() error {
	switch {
	case !d.HasAuth && d.AuthFD != 0:
		return invalid("authentication fd %d without HasAuth", d.AuthFD)
	case !d.HasAuth:
		return nil
	case d.Kind != KindPosixFD || len(d.PageFDs) == 0:
		return invalid("authentication fd in a %s descriptor without fd numbers", d.Kind)
	case d.AuthFD < 0 || d.AuthFD > math.MaxInt32:
		return invalid("authentication fd number %d", d.AuthFD)
	}
	return nil
}

// foreignHandles reports whether d carries handles that its kind does not.
func (d *Descriptor) foreignHandles() bool {
	switch d.Kind {
	case KindPosixFD:
		return len(d.Fabric) != 0 || !d.IPC.IsZero()
	case KindFabric:
		return len(d.PageFDs) != 0 || !d.IPC.IsZero()
	case KindCUDAIPC:
		return len(d.PageFDs) != 0 || len(d.Fabric) != 0
	}
	return false
}

// validateSpans checks the spans against the kind, the handle count and
// MaxPages. Called after validateHandleCount: PageCount is in 1..MaxPages.
func (d *Descriptor) validateSpans() error {
	if d.Spans == nil {
		return nil
	}
	switch {
	case d.Kind != KindPosixFD && d.Kind != KindFabric:
		return invalid("%s descriptor with spans: it names one allocation", d.Kind)
	case len(d.Spans) != d.PageCount:
		return invalid("%d spans for %d allocations", len(d.Spans), d.PageCount)
	}
	var total uint64
	for i, s := range d.Spans {
		if s < 1 || s > MaxPages {
			return invalid("allocation %d spans %d pages: want 1..%d", i, s, MaxPages)
		}
		if total += uint64(s); total > MaxPages {
			return invalid("allocations of more than %d pages in all", MaxPages)
		}
	}
	if len(d.PageFDs) != 0 && !d.HasAuth && NormalSpans(d.Spans) != nil {
		return invalid("fd numbers with spans but without an authentication fd")
	}
	return nil
}

// validateExtent checks that [Offset, Offset+Length) lies in the pages
// without overflow and that the allocations are the block rounded out: it
// starts inside the first and reaches into the last. Called after
// validateSpans.
func (d *Descriptor) validateExtent() error {
	hi, total := bits.Mul64(d.PageSize, uint64(d.TotalPages()))
	if hi != 0 {
		return invalid("%d pages of %d bytes overflow", d.TotalPages(), d.PageSize)
	}
	// Spans are at most MaxPages: the allocations' bytes fit as total does.
	first := d.PageSize * uint64(d.Span(0))
	last := d.PageSize * uint64(d.Span(d.PageCount-1))
	end, carry := bits.Add64(d.Offset, d.Length, 0)
	switch {
	case d.Length == 0:
		return invalid("zero length")
	case carry != 0 || end > total:
		return invalid("block [%d, +%d) outside %d pages of %d bytes", d.Offset, d.Length, d.TotalPages(), d.PageSize)
	case d.Offset >= first:
		return invalid("offset %d skips the whole first allocation of %d bytes", d.Offset, first)
	case end <= total-last:
		return invalid("block ends at %d, before the last of %d allocations", end, d.PageCount)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("descriptor: "+format+": %w", append(args, vmm.ErrInvalid)...)
}

// reader decodes little-endian fields; after the first short read every
// read returns zero and err says where the input ended.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n > len(r.b) {
		r.err = invalid("truncated at byte %d: need %d more, have %d", r.off, n, len(r.b))
		return nil
	}
	v := r.b[:n:n]
	r.b, r.off = r.b[n:], r.off+n
	return v
}

func (r *reader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}
