//go:build !cgo || !linux

package cuda

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

var _ vmm.Driver = (*Driver)(nil)

// Driver is the vmm.Driver of the CUDA driver API. This build has no cgo
// (or is not Linux), so Open always fails and no Driver exists; the methods
// are here so that code using the type builds everywhere.
type Driver struct{}

var errNoCgo = fmt.Errorf("vmm/cuda: built without cgo: %w", vmm.ErrNotSupported)

// Open fails with an error matching vmm.ErrNotSupported: this build cannot
// load the CUDA driver.
func Open() (*Driver, error) { return nil, errNoCgo }

// driverErrorText has no driver to ask in this build.
func driverErrorText(Result) (name, text string, ok bool) { return "", "", false }

// Backend returns "cuda".
func (*Driver) Backend() string { return "cuda" }

// The methods below fail with ErrNotSupported; see Driver.

func (*Driver) DriverVersion() (int, error)                   { return 0, errNoCgo }
func (*Driver) DeviceCount() (int, error)                     { return 0, errNoCgo }
func (*Driver) DeviceInfo(vmm.Device) (vmm.DeviceInfo, error) { return vmm.DeviceInfo{}, errNoCgo }
func (*Driver) MemInfo(vmm.Device) (uint64, uint64, error)    { return 0, 0, errNoCgo }
func (*Driver) Reserve(uint64, uint64) (vmm.DevicePtr, error) { return 0, errNoCgo }
func (*Driver) Unreserve(vmm.DevicePtr, uint64) error         { return errNoCgo }
func (*Driver) Release(vmm.Handle) error                      { return errNoCgo }
func (*Driver) Map(vmm.DevicePtr, uint64, vmm.Handle, uint64) error {
	return errNoCgo
}
func (*Driver) Unmap(vmm.DevicePtr, uint64) error { return errNoCgo }
func (*Driver) Create(vmm.Device, uint64, vmm.HandleType) (vmm.Handle, error) {
	return 0, errNoCgo
}
func (*Driver) SetAccess(vmm.DevicePtr, uint64, []vmm.AccessDesc) error { return errNoCgo }
func (*Driver) ExportFD(vmm.Handle) (int, error)                        { return -1, errNoCgo }
func (*Driver) ImportFD(int) (vmm.Handle, error)                        { return 0, errNoCgo }
func (*Driver) ExportFabric(vmm.Handle) (vmm.FabricHandle, error) {
	return vmm.FabricHandle{}, errNoCgo
}
func (*Driver) ImportFabric(vmm.FabricHandle) (vmm.Handle, error) { return 0, errNoCgo }
func (*Driver) StreamCreate(vmm.Device) (vmm.Stream, error)       { return 0, errNoCgo }
func (*Driver) StreamDestroy(vmm.Stream) error                    { return errNoCgo }
func (*Driver) StreamSynchronize(vmm.Stream) error                { return errNoCgo }
func (*Driver) DeviceSynchronize(vmm.Device) error                { return errNoCgo }
func (*Driver) EventCreate(vmm.Device) (vmm.Event, error)         { return 0, errNoCgo }
func (*Driver) EventRecord(vmm.Event, vmm.Stream) error           { return errNoCgo }
func (*Driver) EventQuery(vmm.Event) (bool, error)                { return false, errNoCgo }
func (*Driver) EventSynchronize(vmm.Event) error                  { return errNoCgo }
func (*Driver) EventDestroy(vmm.Event) error                      { return errNoCgo }
func (*Driver) CopyHtoD(vmm.DevicePtr, []byte) error              { return errNoCgo }
func (*Driver) CopyDtoH([]byte, vmm.DevicePtr) error              { return errNoCgo }
func (*Driver) CopyDtoD(vmm.DevicePtr, vmm.DevicePtr, uint64) error {
	return errNoCgo
}
func (*Driver) Memset(vmm.DevicePtr, byte, uint64) error                  { return errNoCgo }
func (*Driver) MemsetAsync(vmm.DevicePtr, byte, uint64, vmm.Stream) error { return errNoCgo }
func (*Driver) MemAlloc(vmm.Device, uint64) (vmm.DevicePtr, error)        { return 0, errNoCgo }
func (*Driver) MemFree(vmm.DevicePtr) error                               { return errNoCgo }
func (*Driver) Usage() vmm.Usage                                          { return vmm.Usage{} }
func (*Driver) Close() error                                              { return nil }
