//go:build !linux

package ipc

import (
	"fmt"
	"runtime"
	"time"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

var errNoPidfd = fmt.Errorf("pidfd_getfd is a Linux call, not %s's: %w", runtime.GOOS, vmm.ErrNotSupported)

func fetchPidfd(*handles.Descriptor) ([]*handles.FD, *handles.FD, error) {
	return nil, nil, errNoPidfd
}

// waitGone cannot watch a process here: it says gone at once (no claim
// is ever held here: claims need the Linux memfds).
func waitGone(int, time.Duration, ...<-chan struct{}) bool { return true }
