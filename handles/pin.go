package handles

import "github.com/xseg-dev/xseg/vmm"

// Pin is the physical pages behind a live allocator block, held for
// sharing: an allocator's PinBlock returns one (package ipc names the
// interface), and package ipc exports the pages. It lives here, below both
// the allocators and ipc, so that an allocator can implement ipc's
// interface without importing ipc.
//
// A Pin is a plain value; its Unpin is called exactly once, by whoever
// holds the pin when the last user of the pages has let go.
type Pin struct {
	// Device holds the pages.
	Device vmm.Device
	// PageSize is the size of every page.
	PageSize uint64
	// Pages are the physical allocations the block touches, in address
	// order: the block rounded out to whole allocations. Empty when Alloc
	// is set.
	Pages []vmm.Handle
	// Spans, when not nil, has one entry per entry of Pages: how many
	// pages of PageSize that allocation holds (a chunk of the expandable
	// allocator's Config.ChunkBytes holds several and is mapped only
	// whole). Nil: every allocation is one page.
	Spans []int
	// Alloc, when not zero, is the base of the plain allocation
	// (vmm.Driver.MemAlloc) that holds the block: the fallback allocator's
	// segment. The pin then has no Pages; PageSize is the allocation's
	// size, and Offset and Length place the block inside it.
	Alloc vmm.DevicePtr
	// Offset and Length place the block inside the pages: Offset is from
	// the start of the first allocation.
	Offset, Length uint64
	// ExportFD, when not nil, returns a new posix fd of Pages[i], which
	// the caller closes: a copy of an export the allocator keeps for as
	// long as the allocation lives, so that sharing it again costs no
	// export. It fails once Unpin has been called. Nil: the sharer
	// exports the page with the driver.
	ExportFD func(i int) (int, error)
	// Unpin lets the allocator reuse, unmap and release the pages again.
	Unpin func() error
}
