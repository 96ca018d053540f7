package vmmtest

import "github.com/xseg-dev/xseg/vmm"

// The optional driver interfaces as calls on any vmm.Driver: a driver
// without the interface answers vmm.ErrNotSupported, as a wrapper over a
// backend without it does. The suites use them so that a backend and a
// wrapped backend are checked alike.

// MemsetAsync queues a memset on s through d's vmm.AsyncMemsetter.
func MemsetAsync(d vmm.Driver, dst vmm.DevicePtr, value byte, n uint64, s vmm.Stream) error {
	a, err := vmm.AsyncMemsetterOf(d)
	if err != nil {
		return err
	}
	return a.MemsetAsync(dst, value, n, s)
}

func exportAllocFD(d vmm.Driver, p vmm.DevicePtr) (int, uint64, error) {
	a, err := vmm.AllocFDOf(d)
	if err != nil {
		return -1, 0, err
	}
	return a.ExportAllocFD(p)
}

func exportAllocIPC(d vmm.Driver, p vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	a, err := vmm.AllocIPCOf(d)
	if err != nil {
		return vmm.IPCMemHandle{}, err
	}
	return a.ExportAllocIPC(p)
}

func openAllocIPC(d vmm.Driver, h vmm.IPCMemHandle, dev vmm.Device) (vmm.DevicePtr, uint64, error) {
	a, err := vmm.AllocIPCOf(d)
	if err != nil {
		return 0, 0, err
	}
	return a.OpenAllocIPC(h, dev)
}

func closeAllocIPC(d vmm.Driver, p vmm.DevicePtr) error {
	a, err := vmm.AllocIPCOf(d)
	if err != nil {
		return err
	}
	return a.CloseAllocIPC(p)
}
