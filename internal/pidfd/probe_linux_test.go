package pidfd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

func TestProbe(t *testing.T) {
	err := Probe()
	if errors.Is(err, unix.ENOSYS) {
		t.Skipf("kernel without pidfd_getfd: %v", err)
	}
	// Development and CI machines allow it (DESIGN.md, facts).
	require.NoError(t, err)
	require.NoError(t, Probe(), "a definite answer is cached")
}

func TestClassify(t *testing.T) {
	for errno, refused := range map[unix.Errno]bool{
		unix.ENOSYS: true,
		unix.EPERM:  true,
		unix.EACCES: true,
		unix.EMFILE: false,
		unix.EBADF:  false,
		unix.ENOMEM: false,
	} {
		err := classify("pidfd_getfd", fmt.Errorf("wrapped: %w", errno))
		require.Equal(t, refused, errors.Is(err, vmm.ErrNotSupported), "%s", unix.ErrnoName(errno))
		require.ErrorIs(t, err, errno, "the errno is kept")
		require.ErrorContains(t, err, "probing pidfd_getfd: ")
		require.ErrorContains(t, err, unix.ErrnoName(errno))
	}
	err := classify("pidfd_open", errors.New("no errno"))
	require.NotErrorIs(t, err, vmm.ErrNotSupported, "an error without an errno tells nothing")
	require.EqualError(t, err, "probing pidfd_open: no errno")
}

// TestCacheKeepsDefiniteAnswers: a "could not tell" is probed again, the
// first definite answer is kept.
func TestCacheKeepsDefiniteAnswers(t *testing.T) {
	for _, final := range []error{nil, classify("pidfd_getfd", unix.EACCES)} {
		var c cache
		answers := []error{classify("pidfd_getfd", unix.EMFILE), classify("pidfd_open", unix.ENOMEM), final}
		calls := 0
		f := func() error { calls++; return answers[calls-1] }
		require.ErrorIs(t, c.get(f), unix.EMFILE)
		require.ErrorIs(t, c.get(f), unix.ENOMEM)
		for range 3 {
			require.Equal(t, final, c.get(f))
		}
		require.Equal(t, 3, calls, "probed until the definite answer, not after")
	}
}
