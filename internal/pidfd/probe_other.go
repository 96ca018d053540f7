//go:build !linux

package pidfd

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// Probe reports vmm.ErrNotSupported: pidfd_getfd is a Linux system call.
func Probe() error {
	return fmt.Errorf("pidfd_getfd is a Linux system call: %w", vmm.ErrNotSupported)
}
