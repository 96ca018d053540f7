package ipc

import "github.com/xseg-dev/xseg/internal/pidfd"

// The pidfd transport is made of Linux calls (pidfd_linux.go); elsewhere
// pidfd_other.go answers vmm.ErrNotSupported.

// ProbePidfdGetfd reports whether this process can use pidfd_getfd at
// all: nil if it can, an error wrapping vmm.ErrNotSupported if the kernel
// lacks it or a seccomp filter or security module refuses it (EPERM or
// EACCES on this very process, which ptrace rights cannot explain; on
// systems other than Linux), any other error when the probe could not
// tell (that answer is not cached; the next call probes again). A yes does
// not promise access to another process: that takes ptrace rights over
// it, which Fetch finds out when it tries. xseg info gives the same
// answer. Safe for concurrent use.
func ProbePidfdGetfd() error { return pidfd.Probe() }
