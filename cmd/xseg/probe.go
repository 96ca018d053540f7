package main

import (
	"errors"

	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
)

// probePidfdGetfd reports whether this process may use pidfd_getfd here,
// with package ipc's answer (ipc.ProbePidfdGetfd): "no" where the kernel lacks
// the call or a seccomp filter or security module refuses it (ENOSYS,
// EPERM, EACCES on this very process; other systems than Linux), "unknown"
// where the probe could not tell. Taking another process's descriptors
// needs, besides, ptrace permission over that process (same uid and no
// stricter Yama policy, or CAP_SYS_PTRACE); package ipc falls back to
// SCM_RIGHTS where it lacks it.
func probePidfdGetfd() probeResult { return probeAnswer(ipc.ProbePidfdGetfd()) }

// probeAnswer is the probe result that err, ipc.ProbePidfdGetfd's answer, stands for.
func probeAnswer(err error) probeResult {
	switch {
	case err == nil:
		return probeResult{Status: probeYes, Detail: "pidfd_open and pidfd_getfd work on this process; another process's descriptors also need ptrace permission over it"}
	case errors.Is(err, vmm.ErrNotSupported):
		return probeResult{Status: probeNo, Detail: err.Error()}
	}
	return probeResult{Status: probeUnknown, Detail: err.Error()}
}
