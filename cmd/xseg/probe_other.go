//go:build !linux

package main

// probePidfdGetfd says no on systems other than Linux, which have no
// pidfd_getfd.
func probePidfdGetfd() probeResult {
	return probeResult{Status: probeNo, Detail: "pidfd_getfd is a Linux system call"}
}
