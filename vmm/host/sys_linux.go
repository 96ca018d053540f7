package host

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// The raw memory system calls of the backend. They take and return addresses
// as integers: the memory behind them is never a Go object, and unix.Mmap's
// []byte registry cannot place a mapping at a fixed address.

// osPage is the kernel's page size, the unit of mmap and mprotect.
var osPage = uint64(unix.Getpagesize())

// Flags of the anonymous mapping that holds a reservation: no access, no
// memory, no swap accounting. Unmap puts the same mapping back, so the kernel
// can merge it with the rest of the reservation again.
const (
	reserveProt  = unix.PROT_NONE
	reserveFlags = unix.MAP_PRIVATE | unix.MAP_ANONYMOUS | unix.MAP_NORESERVE
)

// mmap maps size bytes; with MAP_FIXED in flags exactly at addr.
func mmap(addr uintptr, size uint64, prot, flags, fd int, off int64) (uintptr, error) {
	r, _, errno := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(size), uintptr(prot), uintptr(flags), uintptr(fd), uintptr(off))
	if errno != 0 {
		return 0, errno
	}
	if flags&unix.MAP_FIXED != 0 && r != addr {
		return r, fmt.Errorf("mmap placed a fixed mapping at %#x, not %#x: %w", r, addr, vmm.ErrInvalid)
	}
	return r, nil
}

// munmap removes every mapping in [addr, addr+size).
func munmap(addr uintptr, size uint64) error {
	if _, _, errno := unix.Syscall(unix.SYS_MUNMAP, addr, uintptr(size), 0); errno != 0 {
		return errno
	}
	return nil
}

// mprotect sets the protection of [addr, addr+size).
func mprotect(addr uintptr, size uint64, prot int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MPROTECT, addr, uintptr(size), uintptr(prot)); errno != 0 {
		return errno
	}
	return nil
}

// unbacked puts a reservation's anonymous PROT_NONE mapping over [addr,
// addr+size), replacing whatever was mapped there.
func unbacked(addr uintptr, size uint64) error {
	_, err := mmap(addr, size, reserveProt, reserveFlags|unix.MAP_FIXED, -1, 0)
	return err
}

// protOf is the protection that makes a mapping usable by every device of
// access: the host has one protection for all of them.
func protOf(access []vmm.AccessDesc) int {
	prot := unix.PROT_NONE
	for _, a := range access {
		switch a.Flags {
		case vmm.AccessReadWrite:
			return unix.PROT_READ | unix.PROT_WRITE
		case vmm.AccessRead:
			prot = unix.PROT_READ
		}
	}
	return prot
}

// hostBytes views n bytes of mapped memory at p as a slice. The caller has
// checked, under Driver.prot, that all of it is mapped with the protection
// it is about to use; otherwise touching the slice kills the process.
func hostBytes(p vmm.DevicePtr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	addr := uintptr(p)
	base := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(base), n)
}

// sysErr wraps a system call's error with the vmm sentinel it amounts to,
// keeping the errno reachable through errors.As.
func sysErr(err error) error {
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return err
	}
	switch errno {
	case unix.ENOMEM, unix.ENOSPC, unix.EFBIG, unix.EMFILE, unix.ENFILE:
		return fmt.Errorf("%w (%w)", errno, vmm.ErrOutOfMemory)
	case unix.EINVAL, unix.EBADF:
		return fmt.Errorf("%w (%w)", errno, vmm.ErrInvalid)
	case unix.ENOSYS, unix.EOPNOTSUPP:
		return fmt.Errorf("%w (%w)", errno, vmm.ErrNotSupported)
	}
	return errno
}

// roundUp rounds n up to a multiple of the power of two a; ok is false on
// overflow.
func roundUp(n, a uint64) (uint64, bool) {
	r := (n + a - 1) &^ (a - 1)
	return r, r >= n && n <= math.MaxUint64-(a-1)
}
