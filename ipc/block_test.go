//go:build linux

package ipc

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// memfdDriver is the part of a vmm.Driver ShareBlock uses, over memfd
// pages; the embedded nil Driver panics if anything else is called.
type memfdDriver struct {
	vmm.Driver
	pages  map[vmm.Handle]int
	fabric bool
}

func (d *memfdDriver) DeviceInfo(dev vmm.Device) (vmm.DeviceInfo, error) {
	return vmm.DeviceInfo{Ordinal: dev, UUID: [16]byte{9, 9}, Fabric: d.fabric, PosixFD: true}, nil
}

func (d *memfdDriver) ExportFD(h vmm.Handle) (int, error) {
	fd, ok := d.pages[h]
	if !ok {
		return -1, fmt.Errorf("page %d: %w", h, vmm.ErrInvalid)
	}
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}

func (d *memfdDriver) ExportFabric(h vmm.Handle) (vmm.FabricHandle, error) {
	if h == 2 { // one page not exportable as fabric: fall back quietly
		return vmm.FabricHandle{}, fmt.Errorf("page %d: %w", h, vmm.ErrNotSupported)
	}
	return vmm.FabricHandle{byte(h), 0xfa}, nil
}

// pinSource pins a fixed block and counts unpins.
type pinSource struct {
	pages  []vmm.Handle
	unpins atomic.Int32 // leases end on the exporter's goroutines
}

func (s *pinSource) PinBlock(ptr vmm.DevicePtr) (Pin, error) {
	if ptr != 0x1000 {
		return Pin{}, fmt.Errorf("no block at %v: %w", ptr, vmm.ErrInvalid)
	}
	return Pin{PageSize: 4096, Pages: s.pages, Offset: 16, Length: 4096 + 100,
		Unpin: func() error { s.unpins.Add(1); return nil }}, nil
}

func TestShareBlock(t *testing.T) {
	requireNoFDLeak(t)
	pages := makePages(t, 2, 4096)
	defer func() { require.NoError(t, handles.CloseAll(pages)) }()
	drv := &memfdDriver{pages: map[vmm.Handle]int{1: pages[0].Int(), 2: pages[1].Int()}, fabric: true}
	src := &pinSource{pages: []vmm.Handle{1, 2}}
	e := newExporter(t, ExporterOptions{})

	_, err := e.ShareBlock(drv, src, 0x2000)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	s, err := e.ShareBlock(drv, src, 0x1000)
	require.NoError(t, err)
	d := s.Descriptor()
	require.Equal(t, handles.KindPosixFD, d.Kind, "fabric export failed for a page: posix fds")
	require.Equal(t, [16]byte{9, 9}, d.DeviceUUID)
	require.EqualValues(t, 16, d.Offset)
	r, err := Fetch(context.Background(), d, FetchOptions{Transports: []Transport{TransportSocket}})
	require.NoError(t, err)
	for i := range pages {
		var a, b unix.Stat_t
		require.NoError(t, unix.Fstat(pages[i].Int(), &a))
		require.NoError(t, unix.Fstat(r.FDs[i].Int(), &b))
		require.Equal(t, a.Ino, b.Ino)
	}
	require.True(t, r.Leased(), "a socket fetch holds a lease")
	require.Eventually(t, func() bool { return s.Leases() == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, s.Close())
	require.Zero(t, src.unpins.Load(), "a closed share stays pinned while an importer holds a lease")
	require.NoError(t, r.Close())
	require.Eventually(t, func() bool { return src.unpins.Load() == 1 }, 5*time.Second, time.Millisecond,
		"the last lease's end unpins")
	require.Zero(t, s.Leases())

	src.pages = []vmm.Handle{1, 1}
	s, err = e.ShareBlock(drv, src, 0x1000)
	require.NoError(t, err)
	require.Equal(t, handles.KindFabric, s.Descriptor().Kind)
	require.NoError(t, s.Close())
	require.EqualValues(t, 2, src.unpins.Load())

	drv.fabric = false
	src.pages = []vmm.Handle{1, 7}
	_, err = e.ShareBlock(drv, src, 0x1000)
	require.ErrorIs(t, err, vmm.ErrInvalid, "export failure unwinds")
	require.EqualValues(t, 3, src.unpins.Load(), "and unpins")
}
