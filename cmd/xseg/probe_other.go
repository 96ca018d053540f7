//go:build !linux

package main

import "os"

// probePidfdGetfd says no on systems other than Linux, which have no
// pidfd_getfd.
func probePidfdGetfd() probeResult {
	return probeResult{Status: probeNo, Detail: "pidfd_getfd is a Linux system call"}
}

// isTerminal reports false: progress lines are for Linux terminals only.
func isTerminal(*os.File) bool { return false }
