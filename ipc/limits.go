package ipc

import (
	"fmt"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// checkFits refuses a descriptor whose shared extent (its pages in all,
// Descriptor.TotalPages, times page size) is larger than the importing device's memory, before any
// address space is reserved for it. The wire format allows 2^60 bytes,
// and Open reserves the whole extent: a descriptor of 16 pages of 1 TiB
// would make the importer reserve 16 TiB. No real share is larger than
// the device it lives on; a device much smaller than the exporter's can
// refuse a share it could in fact map (the pages live on the exporter's
// device), which the error says.
func checkFits(drv vmm.Driver, dev vmm.Device, d *handles.Descriptor) error {
	info, err := drv.DeviceInfo(dev)
	if err != nil {
		return fmt.Errorf("reading the memory of device %d: %w", dev, err)
	}
	if size := d.Bytes(); size > info.TotalMemory {
		return fmt.Errorf("the shared extent of %d pages of %d bytes (%d bytes) exceeds device %d's %d bytes of memory: %w",
			d.TotalPages(), d.PageSize, size, dev, info.TotalMemory, vmm.ErrInvalid)
	}
	return nil
}
