package expandable

import (
	"fmt"

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
		ps := seg.PageSize
		off := uint64(b-seg.Base) % ps
		first := int(uint64(b-seg.Base) / ps)
		n := int((off + size + ps - 1) / ps)
		sp := seg.Data.(*segPages)
		if first+n > len(sp.handles) {
			return fmt.Errorf("pinning block %v: pages %d..%d not mapped: %w", b, first, first+n-1, vmm.ErrInvalid)
		}
		for i := first; i < first+n; i++ {
			if _, ok := sp.chunkAt(i); ok {
				return fmt.Errorf("pinning block %v: page %d is part of a chunk (chunk_mb), which sharing does not export yet: %w", b, i, vmm.ErrNotSupported)
			}
		}
		pin.Pages = make([]vmm.Handle, n)
		for i := range pin.Pages {
			if pin.Pages[i] = sp.handles[first+i]; pin.Pages[i] == 0 {
				return fmt.Errorf("pinning block %v: page %d not mapped: %w", b, first+i, vmm.ErrInvalid)
			}
		}
		pin.PageSize, pin.Offset, pin.Length = ps, off, size
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
