// Package pidfd probes whether this process can use pidfd_getfd, the
// system call of ipc's pidfd transport. Package ipc (ProbePidfdGetfd) and
// the xseg command (xseg info) both ask it, so both give one answer.
package pidfd
