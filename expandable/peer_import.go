package expandable

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// AddImported registers [ptr, ptr+size), memory another process shared
// that an importer (package ipc) has mapped on this allocator's device, so
// that the enabled peers reach it: they are granted read-write access now
// (one SetAccess; none when no peer is enabled), and peers enabled later
// are granted it too. The mapping must be whole mappings of the driver, and
// must be registered until the importer unmaps it: call RemoveImported
// first. Registering an address twice is vmm.ErrInvalid. Safe for
// concurrent use.
func (a *Allocator) AddImported(ptr vmm.DevicePtr, size uint64) error {
	p := a.pages
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, dup := p.mu.imported[ptr]; dup {
		return fmt.Errorf("expandable: imported mapping %v is already registered: %w", ptr, vmm.ErrInvalid)
	}
	if len(p.mu.peers) > 0 {
		grant := p.mu.access[len(p.rw):]
		if err := p.d.SetAccess(ptr, size, grant); err != nil {
			return fmt.Errorf("expandable: granting peers %v access to the imported mapping %v+%d: %w", p.mu.peers, ptr, size, err)
		}
	}
	if p.mu.imported == nil {
		p.mu.imported = make(map[vmm.DevicePtr]uint64)
	}
	p.mu.imported[ptr] = size
	return nil
}

// RemoveImported forgets an imported mapping AddImported registered; it
// changes no access. An address not registered is vmm.ErrInvalid. Safe for
// concurrent use.
func (a *Allocator) RemoveImported(ptr vmm.DevicePtr) error {
	p := a.pages
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.mu.imported[ptr]; !ok {
		return fmt.Errorf("expandable: imported mapping %v is not registered: %w", ptr, vmm.ErrInvalid)
	}
	delete(p.mu.imported, ptr)
	return nil
}
