package host

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// Per-device access. The host keeps one protection per mapping (the union
// of what SetAccess granted every device, see SetAccess), so whether the
// host process may touch a byte says nothing about which virtual device
// may. The ledger does keep each device's access, and two rules read it,
// the same rules the CUDA backend follows:
//
//   - GetAccess reports one device's access to a mapping;
//   - work that a device must do is refused with vmm.ErrInvalid when no
//     device may do it: CopyDtoD needs one device that may read the whole
//     source and write the whole destination (on a GPU the copy runs on
//     that device), and MemsetAsync on a stream made by StreamCreate needs
//     the stream's device to be allowed to write. A copy between two
//     devices' memory therefore needs peer access granted with SetAccess,
//     as on a GPU. Plain allocations (MemAlloc) are open to every device.

// GetAccess reports the access dev has to the mapping that contains ptr:
// what SetAccess last granted it there, vmm.AccessNone if nothing. An
// address that is not mapped, or a device past the last, is vmm.ErrInvalid.
func (d *Driver) GetAccess(ptr vmm.DevicePtr, dev vmm.Device) (vmm.Access, error) {
	if err := d.enter(); err != nil {
		return vmm.AccessNone, err
	}
	defer d.life.RUnlock()
	if err := d.checkDevice(dev); err != nil {
		return vmm.AccessNone, fmt.Errorf("getting the access at %v: %w", ptr, err)
	}
	m, ok := d.books.Lookup(ptr)
	if !ok {
		return vmm.AccessNone, fmt.Errorf("getting the access of device %d at %v: not mapped: %w", dev, ptr, vmm.ErrInvalid)
	}
	return accessOf(m.Access, dev), nil
}

// accessOf is dev's entry in a mapping's access list.
func accessOf(list []vmm.AccessDesc, dev vmm.Device) vmm.Access {
	for _, a := range list {
		if a.Device == dev {
			return a.Flags
		}
	}
	return vmm.AccessNone
}

// span is device memory that work touches and the access it needs.
type span = ledger.Span

// workDevice reports ErrInvalid unless one device may touch every span (a
// device with access to the mapping at the start of a span is a candidate).
// Spans in plain allocations need nothing. d.prot is held, and the spans
// have passed checkTouch.
func (d *Driver) workDevice(what string, spans ...span) error {
	_, _, err := d.books.Toucher(what, spans...)
	return err
}
