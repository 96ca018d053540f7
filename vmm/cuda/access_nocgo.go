//go:build !cgo || !linux

package cuda

import "github.com/xseg-dev/xseg/vmm"

// GetAccess fails with ErrNotSupported; see Driver.
func (*Driver) GetAccess(vmm.DevicePtr, vmm.Device) (vmm.Access, error) {
	return vmm.AccessNone, errNoCgo
}
