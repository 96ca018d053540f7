package handles

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// The system calls of the package: those behind FD and the authentication
// memfd (auth.go). Off Linux, sys_other.go answers them with
// vmm.ErrNotSupported.

// closeRaw closes the descriptor raw.
func closeRaw(raw int) error { return unix.Close(raw) }

// dupRaw returns a new close-on-exec descriptor of raw's open file.
func dupRaw(raw int) (int, error) { return unix.FcntlInt(uintptr(raw), unix.F_DUPFD_CLOEXEC, 0) }

// authSeals forbid any change: content, size, and the seals.
const authSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// claimSeals are the seals of a claim memfd from its making (its size),
// and claimedSeals those its first claimant adds (its content, and no
// more seals).
const (
	claimSeals   = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
	claimedSeals = unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
)

// NewClaim makes an unclaimed claim memfd (see claim.go).
func NewClaim() (*FD, error) {
	return newShareMemfd("claim", func(raw int) error {
		if err := unix.Ftruncate(raw, claimSize); err != nil {
			return err
		}
		_, err := unix.FcntlInt(uintptr(raw), unix.F_ADD_SEALS, claimSeals)
		return err
	})
}

// newShareMemfd makes a sealable memfd for a share's what ("auth", "claim")
// and sets it up with fill; on failure it is closed.
func newShareMemfd(what string, fill func(raw int) error) (*FD, error) {
	raw, err := unix.MemfdCreate("xseg-share-"+what, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("creating the share's %s memfd: %w", what, err)
	}
	fd, err := NewFD(raw)
	if err != nil {
		return nil, err
	}
	if err := fill(raw); err != nil {
		return nil, fmt.Errorf("filling the share's %s memfd: %w (closing it: %v)", what, err, fd.Close())
	}
	return fd, nil
}

// claimFile writes b (a claimant) into the claim memfd raw unless it is
// sealed already, seals it, and reads back who it names.
func claimFile(raw int, b []byte) (Claimant, error) {
	seals, err := unix.FcntlInt(uintptr(raw), unix.F_GET_SEALS, 0)
	if err != nil || seals&claimSeals != claimSeals {
		return Claimant{}, fmt.Errorf("fd %d is not a claim memfd (seals %#x, %v): %w", raw, seals, err, vmm.ErrInvalid)
	}
	// Either may fail with EPERM: another claimant sealed first.
	if n, err := unix.Pwrite(raw, b, 0); err != nil && err != unix.EPERM {
		return Claimant{}, fmt.Errorf("writing the claim: %w", err)
	} else if err == nil && n != len(b) {
		return Claimant{}, fmt.Errorf("writing the claim: %d of %d bytes: %w", n, len(b), vmm.ErrInvalid)
	}
	_, err = unix.FcntlInt(uintptr(raw), unix.F_ADD_SEALS, claimedSeals)
	if err != nil && err != unix.EPERM {
		return Claimant{}, fmt.Errorf("sealing the claim: %w", err)
	}
	if err == nil {
		seals = claimedSeals // this call sealed it: nothing more to ask
	} else if seals, err = unix.FcntlInt(uintptr(raw), unix.F_GET_SEALS, 0); err != nil {
		seals = 0
	}
	if seals&claimedSeals != claimedSeals {
		// Sealed against more seals but not against writes: not a
		// claim any claimant made.
		return Claimant{}, fmt.Errorf("the claim memfd is not sealed against writes (seals %#x, %v): %w", seals, err, vmm.ErrInvalid)
	}
	got := make([]byte, claimSize+1)
	n, err := unix.Pread(raw, got, 0)
	if err != nil || n != claimSize {
		return Claimant{}, fmt.Errorf("reading the claim: %d bytes, %v: %w", n, err, vmm.ErrInvalid)
	}
	return parseClaimant(got[:claimSize])
}

// FileIDOf returns the identity of the file fd names.
func FileIDOf(fd int) (FileID, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return FileID{}, fmt.Errorf("fstat of fd %d: %w", fd, err)
	}
	return FileID{Dev: st.Dev, Ino: st.Ino}, nil
}

// newSealedFile makes a memfd holding b, sealed against every change.
func newSealedFile(b []byte) (*FD, error) {
	return newShareMemfd("auth", func(raw int) error { return writeSealed(raw, b) })
}

// writeSealed writes b at the start of the memfd raw and seals it.
func writeSealed(raw int, b []byte) error {
	for done := 0; done < len(b); {
		n, err := unix.Pwrite(raw, b[done:], int64(done))
		if err != nil {
			return err
		}
		done += n
	}
	_, err := unix.FcntlInt(uintptr(raw), unix.F_ADD_SEALS, authSeals)
	return err
}

// readAuth reads the authentication memfd fd, which must be sealed and
// hold as many bytes as d's authentication does.
func (d *Descriptor) readAuth(fd int) ([]byte, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&authSeals != authSeals {
		return nil, authErr("fd %d is not a sealed memfd (seals %#x, %v)", d.AuthFD, seals, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat of the authentication memfd: %w", err)
	}
	plain, claimed := authSizes(len(d.PageFDs))
	if st.Size != int64(plain) && st.Size != int64(claimed) {
		return nil, authErr("fd %d holds %d bytes, an authentication of %d pages holds %d or %d", d.AuthFD, st.Size, len(d.PageFDs), plain, claimed)
	}
	want := int(st.Size)
	b := make([]byte, want)
	if n, err := unix.Pread(fd, b, 0); err != nil || n != want {
		return nil, fmt.Errorf("reading the authentication memfd: %d of %d bytes: %v: %w", n, want, err, vmm.ErrInvalid)
	}
	return b, nil
}

// kcmpFile is KCMP_FILE of linux/kcmp.h: compare two file descriptors'
// open files.
const kcmpFile = 0

// SameOpenFile reports whether fds a and b of this process name the same
// open file (one struct file: a dup, an fd passed over a socket or copied
// by pidfd_getfd from one), with kcmp(2). Unlike FileIDOf it tells apart
// files that share an inode (anonymous-inode files, as a CUDA export may
// be). While a holds its file, no other file can compare equal to it. It
// fails (wrapping vmm.ErrNotSupported for ENOSYS, EPERM from a seccomp
// filter) where kcmp is not allowed.
func SameOpenFile(a, b *FD) (bool, error) {
	if a == nil || b == nil || a.Int() < 0 || b.Int() < 0 {
		return false, fmt.Errorf("comparing a closed fd: %w", vmm.ErrInvalid)
	}
	pid := uintptr(unix.Getpid())
	r, _, errno := unix.Syscall6(unix.SYS_KCMP, pid, pid, kcmpFile, uintptr(a.Int()), uintptr(b.Int()), 0)
	switch {
	case errno == unix.ENOSYS || errno == unix.EPERM:
		return false, fmt.Errorf("kcmp: %w (%w)", vmm.ErrNotSupported, errno)
	case errno != 0:
		return false, fmt.Errorf("kcmp of fds %d and %d: %w", a.Int(), b.Int(), errno)
	}
	return r == 0, nil
}
