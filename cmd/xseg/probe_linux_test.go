package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
)

func TestProbePidfdGetfd(t *testing.T) {
	p := probePidfdGetfd()
	if p.Status == probeNo && errors.Is(ipc.ProbePidfdGetfd(), unix.ENOSYS) {
		t.Skipf("kernel without pidfd_getfd: %s", p.Detail)
	}
	// Development and CI machines allow it (a process may take its own
	// descriptors).
	require.Equal(t, probeYes, p.Status, p.Detail)
	require.NoError(t, ipc.ProbePidfdGetfd(), "xseg info and package ipc agree")
}

func TestProbeAnswer(t *testing.T) {
	refused := fmt.Errorf("probing pidfd_getfd: refused: %w (%w)", vmm.ErrNotSupported, unix.EACCES)
	for _, c := range []struct {
		err  error
		want probeStatus
	}{
		{nil, probeYes},
		{refused, probeNo},
		{fmt.Errorf("probing pidfd_getfd: %w", unix.EMFILE), probeUnknown},
	} {
		p := probeAnswer(c.err)
		require.Equal(t, c.want, p.Status, "%v", c.err)
		if c.err != nil {
			require.Equal(t, c.err.Error(), p.Detail, "the detail is the probe's error")
		}
	}
}
