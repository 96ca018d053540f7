package host

import (
	"math"
	"unsafe"

	"github.com/xseg-dev/xseg/vmm"
)

// The portable half of the backend's system-call layer. The calls
// themselves are in sys_linux.go and seal_linux.go; elsewhere
// sys_other.go answers each of them with vmm.ErrNotSupported, so that the
// package builds on every system and Open fails there.

// protOf is the protection that makes a mapping usable by every device of
// access: the host has one protection for all of them.
func protOf(access []vmm.AccessDesc) int {
	prot := protNone
	for _, a := range access {
		switch a.Flags {
		case vmm.AccessReadWrite:
			return protRead | protWrite
		case vmm.AccessRead:
			prot = protRead
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

// roundUp rounds n up to a multiple of the power of two a; ok is false on
// overflow.
func roundUp(n, a uint64) (uint64, bool) {
	r := (n + a - 1) &^ (a - 1)
	return r, r >= n && n <= math.MaxUint64-(a-1)
}
