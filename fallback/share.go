package fallback

import (
	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// PinBlock returns the plain allocation behind the allocated block at ptr
// (its segment: Pin.Alloc is the segment's base, Pin.PageSize its size,
// Pin.Offset and Pin.Length the block's place in it and the size its
// caller asked for), and keeps the block from being reused until the
// Pin's Unpin is called, even if it is freed in between: a freed pinned
// block stays out of the free lists (counted as active, not allocated),
// so its segment is never wholly free and EmptyCache, the OOM policy and
// the release threshold do not give it back. It implements
// ipc.BlockSource: package ipc shares the segment through CUDA's legacy
// IPC on CUDA and as a memfd on the host backend (see
// vmm.Driver.ExportAllocIPC and ExportAllocFD). Close frees pinned
// segments too; processes that opened them keep their own references.
//
// Every block of a fallback allocator can be shared: plain allocations
// need no exportable handle type, so Config.Shareable is not needed.
// PinBlock is safe for concurrent use; Unpin may be called from any
// goroutine, and only its first call counts.
func (a *Allocator) PinBlock(ptr vmm.DevicePtr) (handles.Pin, error) {
	pin := handles.Pin{Device: a.dev}
	unpin, err := a.heap.Pin(ptr, func(seg *core.Seg, b vmm.DevicePtr, size uint64) error {
		pin.Alloc, pin.PageSize = seg.Base, seg.Size
		pin.Offset, pin.Length = uint64(b-seg.Base), size
		return nil
	})
	if err != nil {
		return handles.Pin{}, err
	}
	pin.Unpin = unpin
	return pin, nil
}

// Pinned reports how many blocks are pinned by PinBlock now.
func (a *Allocator) Pinned() int { return a.heap.Pinned() }
