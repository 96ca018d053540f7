//go:build cgo && linux

package cuda

/*
#include "xseg_cuda.h"

#cgo noescape xs_memGetAccess

// Trampoline of cuMemGetAccess for a device location; runs in context c
// (NULL: any context), see XS_IN_CTX.
static CUresult xs_memGetAccess(xs_syms *s, CUcontext c, unsigned long long *flags, CUdevice d, CUdeviceptr p) {
	CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, d};
	XS_IN_CTX(s, c, s->cuMemGetAccess(flags, &loc, p));
}
*/
import "C"

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr);
func (t symtab) memGetAccess(c C.CUcontext, d C.CUdevice, ptr vmm.DevicePtr) (vmm.Access, error) {
	var flags C.ulonglong
	err := result(C.xs_memGetAccess(t.p, c, &flags, d, C.CUdeviceptr(ptr)))
	return vmm.Access(flags), err
}

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
	a, err := d.sym.memGetAccess(nil, s.cu, ptr)
	if err != nil {
		return vmm.AccessNone, fmt.Errorf("cuMemGetAccess at %v for device %d: %w", ptr, dev, err)
	}
	return a, nil
}
