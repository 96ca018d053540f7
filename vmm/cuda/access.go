package cuda

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// GetAccess asks the driver (cuMemGetAccess) what access device dev has to
// the mapping that contains ptr. The address must be mapped by this Driver
// (the books are asked first, so that a stray address is vmm.ErrInvalid
// without reaching the driver). The driver's answer, not the books', is
// returned: it is what a kernel on dev will meet.
func (d *Driver) GetAccess(ptr vmm.DevicePtr, dev vmm.Device) (vmm.Access, error) {
	if err := d.live(); err != nil {
		return vmm.AccessNone, err
	}
	s, err := d.device(dev)
	if err != nil {
		return vmm.AccessNone, fmt.Errorf("getting the access at %v: %w", ptr, err)
	}
	if _, ok := d.books.Lookup(ptr); !ok {
		return vmm.AccessNone, fmt.Errorf("getting the access of device %d at %v: not mapped: %w", dev, ptr, vmm.ErrInvalid)
	}
	a, err := d.sym.memGetAccess(0, s.cu, ptr)
	if err != nil {
		return vmm.AccessNone, fmt.Errorf("cuMemGetAccess at %v for device %d: %w", ptr, dev, err)
	}
	return a, nil
}
