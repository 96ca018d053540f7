package host

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
)

// Exportable memory files are sealed against any change of size. Another
// process that holds such a file (an importer) could otherwise truncate
// it, and every mapping of the lost bytes, the exporter's own included,
// would die of SIGBUS on its next touch: one peer could crash all the
// others. With the seals, ftruncate fails for everybody, this driver too,
// so a memfd is sealed only once it has its final size.
//
// Writes are not sealed: sharing read-write is the point.

// exportSeals are the seals of every memfd the driver exports. F_SEAL_SEAL
// keeps anyone from adding F_SEAL_WRITE later, which would make the
// exporter's writable mapping the last one ever allowed.
const exportSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// createSealable makes a memfd that accepts seals (see sealSize).
func createSealable(name string) (int, error) {
	return unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
}

// sizeAndSeal gives the memfd fd its size and seals it there.
func sizeAndSeal(fd int, size uint64) error {
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fmt.Errorf("sizing the memfd to %d bytes: %w", size, sysErr(err))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, exportSeals); err != nil {
		return fmt.Errorf("sealing the memfd's size: %w", sysErr(err))
	}
	return nil
}

// checkSealed refuses an fd whose size anyone could still change: a file
// that is not a memfd this backend exported (a forged or foreign fd), or
// one exported by a build that did not seal. Mapping it would hand its
// holders a way to crash this process.
func checkSealed(fd int) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a sealable memory file (F_GET_SEALS: %v): %w", err, vmm.ErrInvalid)
	}
	if seals&exportSeals != exportSeals {
		return fmt.Errorf("memory file not sealed against truncation (seals %#x, want %#x): another holder could shrink it under the mapping: %w",
			seals, exportSeals, vmm.ErrInvalid)
	}
	return nil
}
