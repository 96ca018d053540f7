//go:build !cgo || !linux

package cuda

import "github.com/xseg-dev/xseg/vmm"

// The legacy IPC methods fail with ErrNotSupported in this build; see
// Driver.

func (*Driver) ExportAllocIPC(vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	return vmm.IPCMemHandle{}, errNoCgo
}
func (*Driver) OpenAllocIPC(vmm.IPCMemHandle, vmm.Device) (vmm.DevicePtr, uint64, error) {
	return 0, 0, errNoCgo
}
func (*Driver) CloseAllocIPC(vmm.DevicePtr) error                { return errNoCgo }
func (*Driver) ExportAllocFD(vmm.DevicePtr) (int, uint64, error) { return -1, 0, errNoCgo }
