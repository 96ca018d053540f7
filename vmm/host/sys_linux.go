package host

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

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

// Protections of a mapping, as protOf combines them.
const (
	protNone  = unix.PROT_NONE
	protRead  = unix.PROT_READ
	protWrite = unix.PROT_WRITE
)

// reserveAnywhere reserves size bytes where the kernel likes: the reserved
// state of a range.
func reserveAnywhere(size uint64) (uintptr, error) {
	return mmap(0, size, reserveProt, reserveFlags, -1, 0)
}

// mapFile maps size bytes of the file fd from off exactly at addr, shared
// and with protection prot, replacing whatever was mapped there.
func mapFile(addr uintptr, size uint64, prot, fd int, off int64) error {
	_, err := mmap(addr, size, prot, unix.MAP_SHARED|unix.MAP_FIXED, fd, off)
	return err
}

// mapAnonymous maps size bytes of private, readable and writable memory
// wherever the kernel likes: a plain allocation.
func mapAnonymous(size uint64) (uintptr, error) {
	return mmap(0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, -1, 0)
}

// The file calls of the backend, on memfds.

// createArenaFile makes the memfd of a device's arena.
func createArenaFile(name string) (int, error) { return unix.MemfdCreate(name, unix.MFD_CLOEXEC) }

// truncate sets the length of the file fd.
func truncate(fd int, size uint64) error { return unix.Ftruncate(fd, int64(size)) }

// punch gives the memory behind [off, off+size) back to the system; the file
// keeps its length and the bytes read as zero from then on. It touches no
// guarded state and runs without the Driver's lock.
func punch(fd int, off, size uint64) error {
	return unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(off), int64(size))
}

// closeFD closes fd.
func closeFD(fd int) error { return unix.Close(fd) }

// dupFD returns a new close-on-exec descriptor of fd's open file.
func dupFD(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// pwrite writes b at offset off of fd.
func pwrite(fd int, b []byte, off int64) (int, error) { return unix.Pwrite(fd, b, off) }

// regularFileSize returns the length of fd's file, which must be a regular
// file (a memfd is one), else vmm.ErrInvalid.
func regularFileSize(fd int) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, sysErr(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("not a memory file (mode %#o): %w", st.Mode, vmm.ErrInvalid)
	}
	return st.Size, nil
}

// fdName is the name of fd's file as /proc/self/fd shows it; a memfd's
// reads "/memfd:NAME (deleted)".
func fdName(fd int) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Readlink("/proc/self/fd/"+strconv.Itoa(fd), buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// hostName names this machine for the device UUIDs.
func hostName() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Nodename[:])
}

// maxMapCount is the process's limit of memory mappings
// (vm.max_map_count), 0 when it cannot be read.
func maxMapCount() int {
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0
	}
	return n
}
