package ipc

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// fetchPidfd copies the exporter's page fds into this process with
// pidfd_getfd. The new fds are close-on-exec. On failure nothing is left
// open.
func fetchPidfd(d *handles.Descriptor) ([]*handles.FD, error) {
	if d.Kind != handles.KindPosixFD || len(d.PageFDs) == 0 {
		return nil, fmt.Errorf("descriptor carries no fd numbers: %w", vmm.ErrNotSupported)
	}
	pidfd, err := unix.PidfdOpen(d.ExporterPID, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", d.ExporterPID, syscallErr(err))
	}
	defer unix.Close(pidfd)
	fds := make([]*handles.FD, 0, len(d.PageFDs))
	for i, n := range d.PageFDs {
		raw, err := unix.PidfdGetfd(pidfd, n, 0)
		if err == nil {
			var fd *handles.FD
			if fd, err = handles.NewFD(raw); err == nil {
				fds = append(fds, fd)
				continue
			}
		}
		_ = handles.CloseAll(fds)
		return nil, fmt.Errorf("pidfd_getfd of page %d (fd %d of pid %d): %w", i, n, d.ExporterPID, syscallErr(err))
	}
	return fds, nil
}

// syscallErr adds vmm.ErrNotSupported to ENOSYS, keeping the errno.
func syscallErr(err error) error {
	if errors.Is(err, unix.ENOSYS) {
		return fmt.Errorf("%w (%w)", vmm.ErrNotSupported, err)
	}
	return err
}

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

// probePidfdGetfd copies one of this process's own fds (the pidfd itself)
// through pidfd_getfd; on oneself ptrace access is always granted, so a
// refusal means a filter.
func probePidfdGetfd() error {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return probeErr("pidfd_open", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, pidfd, 0)
	if err != nil {
		return probeErr("pidfd_getfd", err)
	}
	return unix.Close(fd)
}

func probeErr(call string, err error) error {
	if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
		return fmt.Errorf("probing %s: %w (%w)", call, vmm.ErrNotSupported, err)
	}
	return fmt.Errorf("probing %s: %w", call, err)
}
