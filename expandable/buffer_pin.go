package expandable

import (
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// PinBlock returns the pages behind the whole buffer (ptr must be Ptr()):
// every mapped page up to Len rounded up, with Offset 0 and Length Len,
// and keeps Shrink from unmapping them until the pin's Unpin is called
// (only its first call counts). It implements ipc.BlockSource. A buffer
// made without BufferOptions.Shareable fails with vmm.ErrNotSupported, an
// empty buffer or another ptr with vmm.ErrInvalid.
func (b *Buffer) PinBlock(ptr vmm.DevicePtr) (handles.Pin, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.mu.closed:
		return handles.Pin{}, fmt.Errorf("buffer: pinning: %w", vmm.ErrClosed)
	case b.types&vmm.HandlePosixFD == 0:
		return handles.Pin{}, fmt.Errorf("buffer: pinning: pages not created shareable (set BufferOptions.Shareable): %w", vmm.ErrNotSupported)
	case ptr != b.base:
		return handles.Pin{}, fmt.Errorf("buffer: pinning %v: the buffer starts at %v: %w", ptr, b.base, vmm.ErrInvalid)
	case b.mu.len == 0:
		return handles.Pin{}, fmt.Errorf("buffer: pinning an empty buffer: %w", vmm.ErrInvalid)
	}
	n := int(roundUp(b.mu.len, b.ps) / b.ps)
	if b.mu.pins == nil {
		b.mu.pins = map[*int]int{}
	}
	key := new(int)
	b.mu.pins[key] = n
	var once sync.Once
	unpin := func() error {
		once.Do(func() {
			b.mu.Lock()
			delete(b.mu.pins, key)
			b.mu.Unlock()
		})
		return nil
	}
	return handles.Pin{
		Device: b.dev, PageSize: b.ps, Length: b.mu.len,
		Pages: append([]vmm.Handle(nil), b.mu.pages[:n]...),
		Unpin: unpin,
	}, nil
}

// pinnedPages is the most pages any live pin holds.
func (b *Buffer) pinnedPages() int {
	most := 0
	for _, n := range b.mu.pins {
		most = max(most, n)
	}
	return most
}
