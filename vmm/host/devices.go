package host

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
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
type span struct {
	ptr  vmm.DevicePtr
	n    uint64
	want vmm.Access
}

// inAlloc reports whether s lies inside one plain allocation.
func (d *Driver) inAlloc(s span) bool {
	base, size, ok := d.books.AllocAt(s.ptr)
	return ok && s.ptr.Add(s.n) <= base.Add(size)
}

// workDevice reports ErrInvalid unless one device may touch every span (a
// device with access to the mapping at the start of a span is a candidate).
// Spans in plain allocations need nothing. d.prot is held, and the spans
// have passed checkTouch.
func (d *Driver) workDevice(what string, spans ...span) error {
	var cands []vmm.Device
	for _, s := range spans {
		if d.inAlloc(s) || s.n == 0 {
			continue
		}
		m, ok := d.books.Lookup(s.ptr)
		if !ok {
			return fmt.Errorf("%s: %v is not mapped: %w", what, s.ptr, vmm.ErrInvalid)
		}
		for _, a := range m.Access {
			cands = append(cands, a.Device)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	var first error
	for _, dev := range cands {
		err := d.deviceMay(dev, spans)
		if err == nil {
			return nil
		}
		if first == nil {
			first = err
		}
	}
	return fmt.Errorf("%s: no device may touch both (grant peer access with SetAccess): %w", what, first)
}

// deviceMay reports ErrInvalid unless dev may touch every span.
func (d *Driver) deviceMay(dev vmm.Device, spans []span) error {
	for _, s := range spans {
		if d.inAlloc(s) || s.n == 0 {
			continue
		}
		if err := d.books.Accessible(s.ptr, s.n, dev, s.want); err != nil {
			return err
		}
	}
	return nil
}
