package ipc

import (
	"errors"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
)

// The pidfd transport is made of Linux calls (pidfd_linux.go); elsewhere
// pidfd_other.go answers vmm.ErrNotSupported.

var pidfdProbe struct {
	sync.Mutex
	done bool
	err  error
}

// ProbePidfdGetfd reports whether this process can use pidfd_getfd at all:
// nil if it can, an error wrapping vmm.ErrNotSupported if the kernel lacks
// it or a seccomp filter forbids it, any other error when the probe could
// not tell (that answer is not cached; the next call probes again). A yes
// does not promise access to another process: that takes ptrace rights
// over it, which Fetch finds out when it tries. Safe for concurrent use.
func ProbePidfdGetfd() error {
	pidfdProbe.Lock()
	defer pidfdProbe.Unlock()
	if pidfdProbe.done {
		return pidfdProbe.err
	}
	err := probePidfdGetfd()
	if err == nil || errors.Is(err, vmm.ErrNotSupported) {
		pidfdProbe.done, pidfdProbe.err = true, err
	}
	return err
}
