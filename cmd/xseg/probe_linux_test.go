package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestProbePidfdGetfd(t *testing.T) {
	p := probePidfdGetfd()
	if p.Status == probeNo && strings.Contains(p.Detail, "ENOSYS") {
		t.Skipf("kernel without pidfd_getfd: %s", p.Detail)
	}
	// Development and CI machines allow it (a process may take its own
	// descriptors).
	require.Equal(t, probeYes, p.Status, p.Detail)
}

func TestProbeFailure(t *testing.T) {
	for errno, want := range map[unix.Errno]probeStatus{
		unix.ENOSYS: probeNo,
		unix.EPERM:  probeNo,
		unix.EACCES: probeNo,
		unix.EMFILE: probeUnknown,
		unix.EBADF:  probeUnknown,
	} {
		p := probeFailure("pidfd_getfd", errno)
		require.Equal(t, want, p.Status, errno.Error())
		require.Contains(t, p.Detail, "pidfd_getfd: "+errno.Error())
		if want == probeNo {
			require.Contains(t, p.Detail, unix.ErrnoName(errno))
		}
	}
}
