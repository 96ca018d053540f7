//go:build linux

package ipc

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// countFDs counts this process's open descriptors.
func countFDs() (int, error) {
	ents, err := os.ReadDir("/proc/self/fd")
	return len(ents), err
}

func requireNoFDLeak(t *testing.T) {
	t.Helper()
	before, err := countFDs()
	require.NoError(t, err)
	goroutines := runtime.NumGoroutine()
	t.Cleanup(func() {
		// The exporter's goroutines close their ends of finished
		// exchanges a moment after the importer has its answer.
		deadline := time.Now().Add(2 * time.Second)
		after, err := countFDs()
		for err == nil && after != before && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			after, err = countFDs()
		}
		require.NoError(t, err)
		require.Equal(t, before, after, "fds leaked")
		vmmtest.WaitGoroutines(t, goroutines, time.Until(deadline))
	})
}

// makePages makes n memfd pages of size bytes.
func makePages(t *testing.T, n int, size uint64) []*handles.FD {
	t.Helper()
	fds := make([]*handles.FD, 0, n)
	for i := 0; i < n; i++ {
		fd, err := sealedMemfd(fmt.Sprintf("xseg-page-%d", i), size)
		require.NoError(t, err)
		fds = append(fds, fd)
	}
	return fds
}

// sealedMemfd makes a memfd of size bytes sealed as the host backend seals
// the pages it exports (an importer's ImportFD refuses others).
func sealedMemfd(name string, size uint64) (*handles.FD, error) {
	raw, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, err
	}
	fd, err := handles.NewFD(raw)
	if err != nil {
		return nil, err
	}
	if err := unix.Ftruncate(raw, int64(size)); err != nil {
		return nil, errors.Join(err, fd.Close())
	}
	const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(uintptr(raw), unix.F_ADD_SEALS, seals); err != nil {
		return nil, errors.Join(err, fd.Close())
	}
	return fd, nil
}

// mapping is the pages of a descriptor mapped contiguously, as the host
// backend would: one PROT_NONE reservation, one MAP_FIXED|MAP_SHARED per
// page.
type mapping struct {
	region []byte
	block  []byte
}

func mapPages(fds []*handles.FD, pageSize, offset, length uint64) (*mapping, error) {
	total := pageSize * uint64(len(fds))
	region, err := unix.Mmap(-1, 0, int(total), unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserving %d bytes: %w", total, err)
	}
	base := unsafe.Pointer(unsafe.SliceData(region))
	for i, fd := range fds {
		at := unsafe.Add(base, uint64(i)*pageSize)
		if _, err := unix.MmapPtr(fd.Int(), 0, at, uintptr(pageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED); err != nil {
			_ = unix.Munmap(region)
			return nil, fmt.Errorf("mapping page %d: %w", i, err)
		}
	}
	return &mapping{region: region, block: region[offset : offset+length]}, nil
}

func (m *mapping) unmap() error { return unix.Munmap(m.region) }

// tile is the pattern unit: a prime length, so the pattern differs in
// every page.
const tile = 4099

func patternTile(seed byte) []byte {
	b := make([]byte, tile)
	for i := range b {
		b[i] = seed*31 + byte(i*7) + byte(i>>8)
	}
	return b
}

func fillPattern(b []byte, seed byte) {
	p := patternTile(seed)
	for off := 0; off < len(b); off += tile {
		copy(b[off:], p)
	}
}

// checkPattern returns an error naming the first differing tile.
func checkPattern(b []byte, seed byte) error {
	p := patternTile(seed)
	for off := 0; off < len(b); off += tile {
		end := min(off+tile, len(b))
		if !bytes.Equal(b[off:end], p[:end-off]) {
			return fmt.Errorf("pattern %d differs in bytes [%d, %d)", seed, off, end)
		}
	}
	return nil
}
