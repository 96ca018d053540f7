package pidfd

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// Probe reports whether this process can use pidfd_getfd at all: nil if
// it can; an error wrapping vmm.ErrNotSupported if it cannot (the kernel
// lacks the call, or a seccomp filter or security module refuses it);
// any other error when the probe could not tell. A definite answer is
// cached; "could not tell" is not, and the next call probes again. A yes
// does not promise access to another process: that takes ptrace rights
// over it (same uid and no stricter Yama policy, or CAP_SYS_PTRACE),
// which ipc's Fetch finds out when it tries. Safe for concurrent use.
func Probe() error { return probed.get(probeSelf) }

var probed cache

// cache keeps the first definite answer of a probe.
type cache struct {
	mu   sync.Mutex
	done bool
	err  error
}

// get returns the cached answer, or probes with f and caches a definite
// answer (nil, or an error wrapping vmm.ErrNotSupported).
func (c *cache) get(f func() error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return c.err
	}
	err := f()
	if err == nil || errors.Is(err, vmm.ErrNotSupported) {
		c.done, c.err = true, err
	}
	return err
}

// probeSelf opens a pidfd on this process and copies one of its own fds
// (the pidfd itself) through it.
func probeSelf() error {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return classify("pidfd_open", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, pidfd, 0)
	if err != nil {
		return classify("pidfd_getfd", err)
	}
	return unix.Close(fd)
}

// classify turns the error of the probe's call into its answer.
//
// ENOSYS: the kernel is older than 5.6. EPERM and EACCES: a policy refuses
// the call. Neither can be a ptrace refusal: the probe works on its own
// process, to which ptrace access is always granted (the kernel checks the
// same thread group before asking any security module), and the kernel
// reports a ptrace refusal as EPERM anyway. EPERM is what seccomp filters
// answer (Docker's default profile among them); EACCES is a security
// module (SELinux, AppArmor) refusing this process the fd it would
// receive, or a filter set to answer EACCES. A policy answers the next
// call the same way, so all three are a definite no. Anything else (EMFILE,
// ENOMEM, ...) says nothing about the call: the probe could not tell.
func classify(call string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOSYS:
			return fmt.Errorf("probing %s: the kernel lacks it (Linux 5.6 or later has it): %w (%w, %s)", call, vmm.ErrNotSupported, err, unix.ErrnoName(errno))
		case unix.EPERM, unix.EACCES:
			return fmt.Errorf("probing %s: refused by a seccomp filter or a security module: %w (%w, %s)", call, vmm.ErrNotSupported, err, unix.ErrnoName(errno))
		}
		return fmt.Errorf("probing %s: %w (%s)", call, err, unix.ErrnoName(errno))
	}
	return fmt.Errorf("probing %s: %w", call, err)
}
