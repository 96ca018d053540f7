package expandable

import (
	"fmt"
	"sync/atomic"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/vmm"
)

// ErrNotShareable: the allocator's pages were not created exportable, so
// its blocks cannot be shared. Set Config.Shareable (XSEG_CONF
// "shareable:true") when the allocator is made.
var ErrNotShareable = fmt.Errorf("allocator not configured shareable (set Config.Shareable, or shareable:true in XSEG_CONF): %w", vmm.ErrNotSupported)

// PinBlock returns the physical pages behind the allocated block at ptr,
// rounded out to whole pages, with the block's offset in them and its
// length (the size its caller asked for), and keeps them from being
// reused, unmapped or released until the Pin's Unpin is called, even if
// the block is freed in between: a freed pinned block stays out of the
// free lists (counted as active, not allocated) until its last unpin, and
// EmptyCache, the OOM policy and the release threshold leave its pages
// mapped. It implements ipc.BlockSource. Close unmaps pinned pages too;
// processes that imported them keep their own references.
//
// An allocator made without Config.Shareable fails with ErrNotShareable.
// PinBlock is safe for concurrent use; Unpin may be called from any
// goroutine, and only its first call counts.
func (a *Allocator) PinBlock(ptr vmm.DevicePtr) (handles.Pin, error) {
	if !a.heap.Config().Shareable {
		return handles.Pin{}, fmt.Errorf("pinning block %v: %w", ptr, ErrNotShareable)
	}
	pin := handles.Pin{Device: a.dev}
	unpin, err := a.heap.Pin(ptr, func(seg *core.Seg, b vmm.DevicePtr, size uint64) error {
		return pinPages(&pin, seg, b, size)
	})
	if err != nil {
		return handles.Pin{}, err
	}
	// After the unpin the allocations may be released and their handle
	// numbers reused: the pin exports nothing then.
	var unpinned atomic.Bool
	pin.Unpin = func() error { unpinned.Store(true); return unpin() }
	pages := pin.Pages
	pin.ExportFD = func(i int) (int, error) {
		if unpinned.Load() {
			return -1, fmt.Errorf("exporting allocation %d of block %v: the pin has ended: %w", i, ptr, vmm.ErrInvalid)
		}
		return a.pages.exportFD(pages[i])
	}
	return pin, nil
}

// Pinned reports how many blocks are pinned by PinBlock now.
func (a *Allocator) Pinned() int { return a.heap.Pinned() }

// pinPages fills pin with the allocations behind the block [b, b+size) of
// seg: its pages, each a page of its own or part of a chunk, rounded out
// to whole allocations (the driver maps a chunk only whole, so importers
// map all of it), with Spans where a chunk is among them.
func pinPages(pin *handles.Pin, seg *core.Seg, b vmm.DevicePtr, size uint64) error {
	ps := seg.PageSize
	first := int(uint64(b-seg.Base) / ps)
	last := int((uint64(b-seg.Base) + size - 1) / ps)
	sp := seg.Data.(*segPages)
	if last >= len(sp.handles) {
		return fmt.Errorf("pinning block %v: pages %d..%d not mapped: %w", b, first, last, vmm.ErrInvalid)
	}
	start := first
	if c, ok := sp.chunkAt(first); ok {
		start = int(c.first)
	}
	chunked := false
	for i := start; i <= last; {
		h, n := sp.handles[i], 1
		if c, ok := sp.chunkAt(i); ok {
			n, chunked = int(c.first+c.n)-i, true
		}
		if h == 0 {
			return fmt.Errorf("pinning block %v: page %d not mapped: %w", b, i, vmm.ErrInvalid)
		}
		pin.Pages = append(pin.Pages, h)
		pin.Spans = append(pin.Spans, n)
		i += n
	}
	if !chunked {
		pin.Spans = nil
	}
	pin.PageSize, pin.Offset, pin.Length = ps, uint64(b-seg.Base)-uint64(start)*ps, size
	return nil
}
