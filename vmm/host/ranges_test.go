package host_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

func TestReserve(t *testing.T) {
	d := open(t, host.Options{})
	for _, align := range []uint64{0, 4096, gran, 1 << 30} {
		ptr, err := d.Reserve(3*gran, align)
		require.NoError(t, err)
		require.Zero(t, uint64(ptr)%max(align, gran), "align %d", align)
		require.Equal(t, 1, vmasIn(t, ptr, 3*gran), "trimmed to one mapping")
		require.NoError(t, d.Unreserve(ptr, 3*gran))
		require.Zero(t, vmasIn(t, ptr, 3*gran))
	}
	// 80 GiB costs nothing.
	ptr, err := d.Reserve(80<<30, 0)
	require.NoError(t, err)
	require.ErrorIs(t, d.Unreserve(ptr, 40<<30), vmm.ErrInvalid, "half a range")
	require.NoError(t, d.Unreserve(ptr, 80<<30))
	require.ErrorIs(t, d.Unreserve(ptr, 80<<30), vmm.ErrInvalid, "twice")

	_, err = d.Reserve(gran, 3*gran)
	require.ErrorIs(t, err, vmm.ErrInvalid, "alignment not a power of two")
	_, err = d.Reserve(gran+4096, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "size not a multiple of the granularity")
	_, err = d.Reserve(0, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = d.Reserve(^uint64(0)&^(gran-1), 1<<62)
	require.ErrorIs(t, err, vmm.ErrInvalid, "overflow")
}

func TestMapRules(t *testing.T) {
	d := open(t, host.Options{})
	ptr, err := d.Reserve(4*gran, 0)
	require.NoError(t, err)
	h, err := d.Create(0, 2*gran, vmm.HandleNone)
	require.NoError(t, err)

	require.ErrorIs(t, d.Map(ptr+4096, gran, h, 0), vmm.ErrInvalid, "misaligned address")
	require.ErrorIs(t, d.Map(ptr, gran, h, 4096), vmm.ErrInvalid, "misaligned offset")
	require.ErrorIs(t, d.Map(ptr, 3*gran, h, 0), vmm.ErrInvalid, "past the page")
	require.ErrorIs(t, d.Map(ptr.Add(3*gran), 2*gran, h, 0), vmm.ErrInvalid, "past the reservation")
	require.NoError(t, d.Map(ptr.Add(gran), 2*gran, h, 0))
	require.ErrorIs(t, d.Map(ptr, 2*gran, h, 0), vmm.ErrInvalid, "overlap")
	require.ErrorIs(t, d.Map(ptr.Add(3*gran), gran, h, gran), vmm.ErrNotSupported, "part of a page")
	h2, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	require.NoError(t, d.Map(ptr.Add(3*gran), gran, h2, 0), "a second page right after")
	require.ErrorIs(t, d.Unreserve(ptr, 4*gran), vmm.ErrInUse)
	require.ErrorIs(t, d.Unmap(ptr.Add(gran), gran), vmm.ErrInvalid, "half a mapping")
	require.ErrorIs(t, d.Unmap(ptr, gran), vmm.ErrInvalid, "nothing mapped")
	require.ErrorIs(t, d.SetAccess(ptr, 2*gran, vmm.ReadWrite(0)), vmm.ErrInvalid, "partly mapped")
	require.ErrorIs(t, d.SetAccess(ptr.Add(gran), 2*gran, vmm.ReadWrite(7)), vmm.ErrInvalid, "no device 7")
	require.NoError(t, d.SetAccess(ptr.Add(gran), 3*gran, vmm.ReadWrite(0)))

	// One set-access call made the whole run writable.
	require.NoError(t, d.Memset(ptr.Add(gran), 0x11, 3*gran))
	b := make([]byte, 1)
	require.NoError(t, d.CopyDtoH(b, ptr.Add(4*gran-1)))
	require.Equal(t, byte(0x11), b[0])

	require.NoError(t, d.Unmap(ptr.Add(gran), 3*gran), "a run of two mappings")
	require.ErrorIs(t, d.Unmap(ptr.Add(gran), 3*gran), vmm.ErrInvalid, "twice")
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Release(h2))
	require.ErrorIs(t, d.Release(h), vmm.ErrInvalid, "twice")
	require.ErrorIs(t, d.Map(ptr, gran, h, 0), vmm.ErrInvalid, "released page")
	require.NoError(t, d.Unreserve(ptr, 4*gran))
}

// Copies check the protection first: a misuse is an error, not SIGSEGV.
func TestCopiesCheckAccess(t *testing.T) {
	d := open(t, host.Options{Devices: 2})
	ptr, err := d.Reserve(2*gran, 0)
	require.NoError(t, err)
	h, err := d.Create(0, gran, vmm.HandleNone)
	require.NoError(t, err)
	buf := make([]byte, 64)

	require.ErrorIs(t, d.CopyHtoD(ptr, buf), vmm.ErrInvalid, "reserved only")
	require.NoError(t, d.Map(ptr, gran, h, 0))
	require.ErrorIs(t, d.CopyHtoD(ptr, buf), vmm.ErrInvalid, "no access")
	require.ErrorIs(t, d.CopyDtoH(buf, ptr), vmm.ErrInvalid, "no access")

	require.NoError(t, d.SetAccess(ptr, gran, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessRead}}))
	require.NoError(t, d.CopyDtoH(buf, ptr))
	require.ErrorIs(t, d.CopyHtoD(ptr, buf), vmm.ErrInvalid, "read only")
	require.ErrorIs(t, d.Memset(ptr, 1, 1), vmm.ErrInvalid, "read only")

	// One device's read-write access makes the mapping writable.
	require.NoError(t, d.SetAccess(ptr, gran, vmm.ReadWrite(1)))
	require.NoError(t, d.CopyHtoD(ptr, fill(64, 5)))
	require.ErrorIs(t, d.CopyDtoH(make([]byte, 2*gran), ptr), vmm.ErrInvalid, "past the mapping")
	require.ErrorIs(t, d.CopyDtoD(ptr.Add(gran), ptr, 64), vmm.ErrInvalid, "destination unmapped")
	require.NoError(t, d.CopyDtoD(ptr.Add(1000), ptr, 64))
	require.NoError(t, d.CopyDtoD(ptr.Add(32), ptr, 64), "overlapping")
	require.NoError(t, d.CopyDtoH(buf, ptr.Add(32)))
	require.Equal(t, fill(64, 5), buf, "overlapping copy moves like memmove")

	require.NoError(t, d.SetAccess(ptr, gran, []vmm.AccessDesc{{Device: 0, Flags: vmm.AccessNone}, {Device: 1, Flags: vmm.AccessNone}}))
	require.ErrorIs(t, d.CopyDtoH(buf, ptr), vmm.ErrInvalid, "access taken away")
	require.NoError(t, d.CopyDtoH(nil, ptr), "zero bytes")

	require.NoError(t, d.Unmap(ptr, gran))
	require.NoError(t, d.Release(h))
	require.NoError(t, d.Unreserve(ptr, 2*gran))
}

func TestMemAlloc(t *testing.T) {
	d := open(t, host.Options{})
	p, err := d.MemAlloc(0, 100)
	require.NoError(t, err)
	require.Equal(t, vmm.Usage{Allocs: 1, AllocBytes: 100}, d.Usage())
	require.NoError(t, d.Memset(p, 7, 100))
	b := make([]byte, 100)
	require.NoError(t, d.CopyDtoH(b, p))
	for _, c := range b {
		require.Equal(t, byte(7), c)
	}
	require.ErrorIs(t, d.CopyDtoH(make([]byte, 101), p), vmm.ErrInvalid, "past the allocation")
	require.ErrorIs(t, d.MemFree(p+1), vmm.ErrInvalid)
	_, err = d.MemAlloc(0, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = d.MemAlloc(3, 1)
	require.ErrorIs(t, err, vmm.ErrInvalid, "no device 3")
	require.NoError(t, d.MemFree(p))
	require.ErrorIs(t, d.MemFree(p), vmm.ErrInvalid, "twice")
}

func TestStreamsAndEvents(t *testing.T) {
	d := open(t, host.Options{Devices: 2})
	s, err := d.StreamCreate(1)
	require.NoError(t, err)
	require.NotZero(t, s)
	_, err = d.StreamCreate(2)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	e, err := d.EventCreate(1)
	require.NoError(t, err)
	require.NoError(t, d.EventRecord(e, s))
	require.NoError(t, d.EventRecord(e, 0), "the default stream")
	done, err := d.EventQuery(e)
	require.NoError(t, err)
	require.True(t, done)
	require.NoError(t, d.EventSynchronize(e))
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.StreamSynchronize(0))
	require.Equal(t, vmm.Usage{Streams: 1, Events: 1}, d.Usage())

	require.NoError(t, d.StreamDestroy(s))
	require.ErrorIs(t, d.StreamDestroy(s), vmm.ErrInvalid)
	require.ErrorIs(t, d.StreamSynchronize(s), vmm.ErrInvalid)
	require.ErrorIs(t, d.EventRecord(e, s), vmm.ErrInvalid, "destroyed stream")
	require.ErrorIs(t, d.StreamDestroy(0), vmm.ErrInvalid, "the default stream")
	require.NoError(t, d.EventDestroy(e))
	require.ErrorIs(t, d.EventDestroy(e), vmm.ErrInvalid)
	_, err = d.EventQuery(e)
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

func TestInfo(t *testing.T) {
	d := open(t, host.Options{Devices: 2, Capacity: 8 * gran})
	require.Equal(t, "host", d.Backend())
	n, err := d.DeviceCount()
	require.NoError(t, err)
	require.Equal(t, 2, n)
	i0, err := d.DeviceInfo(0)
	require.NoError(t, err)
	i1, err := d.DeviceInfo(1)
	require.NoError(t, err)
	require.Equal(t, "xseg host device 1", i1.Name)
	require.True(t, i1.VMM && i1.PosixFD && !i1.Fabric)
	require.Equal(t, gran, i1.Granularity)
	require.Equal(t, 8*gran, i1.TotalMemory)
	require.NotEqual(t, i0.UUID, i1.UUID)
	_, err = d.DeviceInfo(2)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	other := open(t, host.Options{Devices: 2})
	o1, err := other.DeviceInfo(1)
	require.NoError(t, err)
	require.Equal(t, i1.UUID, o1.UUID, "the same device in every driver of the machine")

	_, err = host.Open(host.Options{Granularity: 3 << 20})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = host.Open(host.Options{Capacity: gran + 1})
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

func TestClosed(t *testing.T) {
	d, err := host.Open(host.Options{})
	require.NoError(t, err)
	require.NoError(t, d.Close())
	require.NoError(t, d.Close(), "idempotent")
	_, err = d.Reserve(gran, 0)
	errs := []error{err}
	_, err = d.Create(0, gran, vmm.HandleNone)
	errs = append(errs, err, d.Release(1), d.Map(0, gran, 1, 0), d.Unmap(0, gran),
		d.SetAccess(0, gran, vmm.ReadWrite(0)), d.Unreserve(0, gran),
		d.CopyHtoD(0, nil), d.CopyDtoH(nil, 0), d.CopyDtoD(0, 0, 0), d.Memset(0, 0, 0),
		d.MemsetAsync(0, 0, 0, 0), d.MemFree(0), d.StreamDestroy(1), d.StreamSynchronize(0),
		d.EventRecord(1, 0), d.EventSynchronize(1), d.EventDestroy(1))
	_, err = d.DriverVersion()
	errs = append(errs, err)
	_, err = d.DeviceCount()
	errs = append(errs, err)
	_, err = d.DeviceInfo(0)
	errs = append(errs, err)
	_, _, err = d.MemInfo(0)
	errs = append(errs, err)
	_, err = d.ExportFD(1)
	errs = append(errs, err)
	_, err = d.ImportFD(0)
	errs = append(errs, err)
	_, err = d.ExportFabric(1)
	errs = append(errs, err)
	_, err = d.ImportFabric(vmm.FabricHandle{})
	errs = append(errs, err)
	_, err = d.MemAlloc(0, 1)
	errs = append(errs, err)
	_, err = d.StreamCreate(0)
	errs = append(errs, err)
	_, err = d.EventCreate(0)
	errs = append(errs, err)
	_, err = d.EventQuery(1)
	errs = append(errs, err)
	for i, err := range errs {
		require.ErrorIs(t, err, vmm.ErrClosed, "call %d", i)
	}
}

// Mapping, access changes, unmapping and copies from many goroutines at
// once keep the books and the kernel in step (run with -race).
func TestConcurrentUse(t *testing.T) {
	d := open(t, host.Options{Capacity: 64 * gran})
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() { errc <- churn(d, byte(g)) })
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
}

// churn maps, writes, checks and unmaps a page twenty times.
func churn(d *host.Driver, seed byte) error {
	ptr, err := d.Reserve(2*gran, 0)
	if err != nil {
		return err
	}
	for range 20 {
		h, err := d.Create(0, gran, vmm.HandleNone)
		if err != nil {
			return err
		}
		want := fill(4096, seed)
		got := make([]byte, len(want))
		err = errors.Join(d.Map(ptr, gran, h, 0), d.SetAccess(ptr, gran, vmm.ReadWrite(0)),
			d.CopyHtoD(ptr.Add(gran-4096), want), d.CopyDtoH(got, ptr.Add(gran-4096)))
		if err != nil {
			return err
		}
		if string(got) != string(want) {
			return errors.New("read back other bytes than written")
		}
		if err := errors.Join(d.Unmap(ptr, gran), d.Release(h)); err != nil {
			return err
		}
	}
	return d.Unreserve(ptr, 2*gran)
}
