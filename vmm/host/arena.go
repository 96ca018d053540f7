package host

import "fmt"

// arena is the one sparse memfd that holds the unexportable pages of a
// device. Pages are extents of it; nothing of the file takes memory until a
// mapping of it is touched, and Release punches the page's bytes out again.
// An arena is guarded by the Driver's mu.
type arena struct {
	fd   int
	size uint64 // the file's length
	free freeList
}

// newArena makes the arena of device dev, size bytes long.
func newArena(dev int, size uint64) (*arena, error) {
	fd, err := createArenaFile(fmt.Sprintf("xseg-host-arena-dev%d", dev))
	if err != nil {
		return nil, fmt.Errorf("creating the arena memfd of device %d: %w", dev, sysErr(err))
	}
	if err := truncate(fd, size); err != nil {
		cerr := closeFD(fd)
		return nil, fmt.Errorf("sizing the arena of device %d to %d bytes: %w (closing it: %v)", dev, size, sysErr(err), cerr)
	}
	a := &arena{fd: fd, size: size}
	a.free.give(0, size)
	return a, nil
}

// alloc finds size free bytes in the arena. The capacity of the device is
// checked by the caller, so a failure to find room here is fragmentation:
// the file then grows by size bytes (it is sparse, growing costs nothing).
func (a *arena) alloc(size uint64) (uint64, error) {
	if off, ok := a.free.take(size); ok {
		return off, nil
	}
	if err := truncate(a.fd, a.size+size); err != nil {
		return 0, fmt.Errorf("growing the arena from %d by %d bytes: %w", a.size, size, sysErr(err))
	}
	a.free.give(a.size, size)
	a.size += size
	off, ok := a.free.take(size)
	if !ok {
		panic(fmt.Sprintf("host: no room for %d bytes in an arena just grown by as much", size))
	}
	return off, nil
}
