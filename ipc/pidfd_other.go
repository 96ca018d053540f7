//go:build !linux

package ipc

import (
	"fmt"
	"runtime"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

var errNoPidfd = fmt.Errorf("pidfd_getfd is a Linux call, not %s's: %w", runtime.GOOS, vmm.ErrNotSupported)

func fetchPidfd(*handles.Descriptor) ([]*handles.FD, error) { return nil, errNoPidfd }
