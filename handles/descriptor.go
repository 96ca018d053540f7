package handles

import (
	"crypto/rand"
	"crypto/subtle"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Kind is the kind of page handle a descriptor carries.
type Kind uint16

const (
	// KindPosixFD: the pages are POSIX file descriptors of the exporter,
	// fetched through a transport (pidfd_getfd or the exporter's socket).
	KindPosixFD Kind = 1
	// KindFabric: the pages are fabric handles carried in the descriptor.
	KindFabric Kind = 2
	// KindCUDAIPC: one plain allocation (cuMemAlloc) of the exporter,
	// named by CUDA's legacy IPC handle carried in the descriptor. The
	// descriptor has exactly one page: the whole allocation, rounded up to
	// MinPageSize; Offset and Length place the block inside it.
	KindCUDAIPC Kind = 3
)

// HandleType returns the vmm handle type of k (HandleNone if k is unknown
// or names no VMM page, as KindCUDAIPC).
func (k Kind) HandleType() vmm.HandleType {
	switch k {
	case KindPosixFD:
		return vmm.HandlePosixFD
	case KindFabric:
		return vmm.HandleFabric
	}
	return vmm.HandleNone
}

func (k Kind) String() string {
	switch k {
	case KindPosixFD:
		return "posix-fd"
	case KindFabric:
		return "fabric"
	case KindCUDAIPC:
		return "cuda-ipc"
	}
	return fmt.Sprintf("Kind(%d)", uint16(k))
}

// Token is the random secret of one share: an importer proves with it that
// it was given the descriptor.
type Token [16]byte

// NewToken returns a token from crypto/rand.
func NewToken() (Token, error) {
	var t Token
	if _, err := rand.Read(t[:]); err != nil {
		return Token{}, fmt.Errorf("making share token: %w", err)
	}
	return t, nil
}

// Equal compares two tokens in constant time.
func (t Token) Equal(u Token) bool { return subtle.ConstantTimeCompare(t[:], u[:]) == 1 }

// IsZero reports whether t is all zeroes (never a token NewToken makes).
func (t Token) IsZero() bool { return t == Token{} }

// Limits of the wire format.
const (
	// MinPageSize and MaxPageSize bound Descriptor.PageSize, which is a
	// multiple of MinPageSize.
	MinPageSize = 1 << 12
	MaxPageSize = 1 << 40
	// MaxPages bounds the pages of a descriptor: Descriptor.PageCount,
	// and the pages its allocations hold in all (Descriptor.Spans).
	MaxPages = 1 << 20
	// MaxEndpoint bounds the length of Descriptor.Endpoint: a Unix socket
	// path (sun_path holds 108 bytes with its terminating NUL).
	MaxEndpoint = 107
	// MaxPID bounds Descriptor.ExporterPID (Linux's PID_MAX_LIMIT).
	MaxPID = 1 << 22
)

// Descriptor describes one shared range: which pages, where the block lies
// inside them, who exports them and how to fetch them. Its wire form
// (MarshalBinary, ParseDescriptor) is what an exporter hands out and an
// importer receives from any channel; the importer treats it as untrusted.
//
// The handles name physical allocations, in address order: each holds one
// page of PageSize, or, where Spans is set, Spans[i] pages (an allocation
// the driver maps only whole, as the expandable allocator's chunks). They
// are exactly the allocations the block touches, rounded out: the block
// starts inside the first allocation (Offset is less than its bytes) and
// reaches into the last one. Allocation i of the range is PageFDs[i]
// (exporter's fd numbers, KindPosixFD) or Fabric[i] (KindFabric); a
// KindCUDAIPC descriptor has one page, named by IPC, and no spans.
//
// A Descriptor is a plain value; it is not safe for concurrent mutation.
type Descriptor struct {
	// Kind of the page handles.
	Kind Kind
	// ExporterPID is the exporting process.
	ExporterPID int
	// DeviceUUID is the UUID of the device the pages live on (all zero on
	// the host backend).
	DeviceUUID [16]byte
	// PageSize is the size of every page, a multiple of MinPageSize (the
	// allocator's large pages are 20 MiB under ClassicConfig: not a power
	// of two).
	PageSize uint64
	// PageCount is the number of handles: of allocations, each one page
	// unless Spans says otherwise.
	PageCount int
	// Spans, when not nil, has PageCount entries: how many pages of
	// PageSize allocation i holds (at least one; MaxPages in all). An
	// importer maps each allocation whole. Nil: every allocation is one
	// page. A descriptor with spans is written as wire version 3; one whose
	// spans are all 1 is written as if they were nil. KindPosixFD and
	// KindFabric only; with fd numbers it needs an authentication fd.
	Spans []int
	// Offset and Length place the shared block inside the pages: Offset is
	// from the start of the first allocation.
	Offset, Length uint64
	// Endpoint names the exporter's Unix socket: "@name" for an abstract
	// socket, else a filesystem path; empty when it serves none.
	Endpoint string
	// Token is the share's secret, checked by the exporter's socket.
	Token Token
	// PageFDs are the exporter's own fd numbers of the pages, for
	// pidfd_getfd: empty, or PageCount of them. KindPosixFD only.
	PageFDs []int
	// Fabric are the pages' fabric handles: PageCount of them. KindFabric
	// only.
	Fabric []Fabric
	// IPC is the CUDA legacy IPC handle of the one page (an allocation):
	// set for KindCUDAIPC only, all zero otherwise.
	IPC IPCHandle
	// HasAuth says that AuthFD is set: the exporter's fd number of the
	// share's authentication memfd (see NewAuth), which an importer
	// fetches with pidfd_getfd before the pages to check that the fd
	// numbers still name this share's pages. KindPosixFD with PageFDs
	// only; a descriptor with it is written as wire version 2.
	HasAuth bool
	AuthFD  int
}

// Bytes returns PageSize times TotalPages, the size of the shared extent.
// Call it on a validated descriptor only.
func (d *Descriptor) Bytes() uint64 { return d.PageSize * uint64(d.TotalPages()) }

// TotalPages returns the pages of PageSize the allocations hold in all:
// PageCount without spans. Call it on a validated descriptor only.
func (d *Descriptor) TotalPages() int {
	if d.Spans == nil {
		return d.PageCount
	}
	n := 0
	for _, s := range d.Spans {
		n += s
	}
	return n
}

// Span returns how many pages allocation i holds: Spans[i], or 1 without
// spans.
func (d *Descriptor) Span(i int) int {
	if d.Spans == nil {
		return 1
	}
	return d.Spans[i]
}

// NormalSpans returns spans as a descriptor carries them: nil when every
// allocation is one page (or there are none), else a copy.
func NormalSpans(spans []int) []int {
	for _, s := range spans {
		if s != 1 {
			return append([]int(nil), spans...)
		}
	}
	return nil
}
