package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// probePidfdGetfd reports whether this process may use pidfd_getfd here:
// it opens a pidfd on itself and takes one of its own descriptors through
// it. A kernel older than 5.6 (ENOSYS) or a seccomp or LSM policy that
// refuses the calls (EPERM, EACCES) is "no"; any other failure is
// "unknown". Taking another process's descriptors needs, besides, ptrace
// permission over that process (same uid and no stricter Yama policy, or
// CAP_SYS_PTRACE); package ipc falls back to SCM_RIGHTS where it lacks it.
func probePidfdGetfd() probeResult {
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return probeFailure("pidfd_open", err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, pidfd, 0)
	if err != nil {
		return probeFailure("pidfd_getfd", err)
	}
	unix.Close(fd)
	return probeResult{Status: probeYes, Detail: "pidfd_open and pidfd_getfd work on this process; another process's descriptors also need ptrace permission over it"}
}

// probeFailure classifies the error of a probe's system call.
func probeFailure(call string, err error) probeResult {
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.ENOSYS, unix.EPERM, unix.EACCES:
			return probeResult{Status: probeNo, Detail: fmt.Sprintf("%s: %v (%s)", call, err, unix.ErrnoName(errno))}
		}
	}
	return probeResult{Status: probeUnknown, Detail: fmt.Sprintf("%s: %v", call, err)}
}
