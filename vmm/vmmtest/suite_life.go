package vmmtest

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// testConcurrent runs the whole life of a page from several goroutines at
// once: the driver is safe for concurrent use and keeps each one's bytes.
func testConcurrent(t *testing.T, c Config) {
	e := open(t, c)
	const workers, rounds = 4, 6
	var wg sync.WaitGroup
	errs := make([]error, workers)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				if err := pageLife(e.d, e.dev, e.gran, byte(w*rounds+r)); err != nil {
					errs[w] = fmt.Errorf("worker %d, round %d: %w", w, r, err)
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
}

// pageLife creates a page, runs pageLifeOf on it and releases it.
func pageLife(d vmm.Driver, dev vmm.Device, size uint64, seed byte) (err error) {
	h, err := d.Create(dev, size, vmm.HandleNone)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Release(h)) }()
	return pageLifeOf(d, dev, size, h, seed)
}

// pageLifeOf maps page h in a new range, writes bytes made from seed to it,
// reads them back, and gives the range back, undoing what it did on failure.
func pageLifeOf(d vmm.Driver, dev vmm.Device, size uint64, h vmm.Handle, seed byte) (err error) {
	p, err := d.Reserve(size, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unreserve(p, size)) }()
	if err := d.Map(p, size, h, 0); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unmap(p, size)) }()
	if err := d.SetAccess(p, size, vmm.ReadWrite(dev)); err != nil {
		return err
	}
	want := pattern(int(min(size, 64<<10)), seed)
	at := p.Add(size - uint64(len(want)))
	if err := d.CopyHtoD(at, want); err != nil {
		return err
	}
	got := make([]byte, len(want))
	if err := d.CopyDtoH(got, at); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("page at %v does not hold what was written to it", p)
	}
	return nil
}

// testClosed checks that every call on a closed driver fails with ErrClosed
// and that Close is idempotent.
func testClosed(t *testing.T, c Config) {
	e := openAny(t, c)
	d := e.d
	require.NoError(t, d.Close(), "Close")
	require.NoError(t, d.Close(), "second Close")
	is := func(err error, what string) {
		t.Helper()
		requireIs(t, err, vmm.ErrClosed, "%s after Close", what)
	}
	_, err := d.DriverVersion()
	is(err, "DriverVersion")
	_, err = d.DeviceCount()
	is(err, "DeviceCount")
	_, err = d.DeviceInfo(e.dev)
	is(err, "DeviceInfo")
	_, _, err = d.MemInfo(e.dev)
	is(err, "MemInfo")
	_, err = d.Reserve(e.gran, 0)
	is(err, "Reserve")
	is(d.Unreserve(0x200000, e.gran), "Unreserve")
	_, err = d.Create(e.dev, e.gran, vmm.HandleNone)
	is(err, "Create")
	is(d.Release(1), "Release")
	is(d.Map(0x200000, e.gran, 1, 0), "Map")
	is(d.Unmap(0x200000, e.gran), "Unmap")
	is(d.SetAccess(0x200000, e.gran, vmm.ReadWrite(e.dev)), "SetAccess")
	_, err = d.ExportFD(1)
	is(err, "ExportFD")
	_, err = d.ImportFD(0)
	is(err, "ImportFD")
	_, err = d.ExportFabric(1)
	is(err, "ExportFabric")
	_, err = d.ImportFabric(vmm.FabricHandle{})
	is(err, "ImportFabric")
	_, err = d.StreamCreate(e.dev)
	is(err, "StreamCreate")
	is(d.StreamDestroy(1), "StreamDestroy")
	is(d.StreamSynchronize(0), "StreamSynchronize")
	_, err = d.EventCreate(e.dev)
	is(err, "EventCreate")
	is(d.EventRecord(1, 0), "EventRecord")
	_, err = d.EventQuery(1)
	is(err, "EventQuery")
	is(d.EventSynchronize(1), "EventSynchronize")
	is(d.EventDestroy(1), "EventDestroy")
	is(d.CopyHtoD(0x200000, []byte{1}), "CopyHtoD")
	is(d.CopyDtoH(make([]byte, 1), 0x200000), "CopyDtoH")
	is(d.CopyDtoD(0x200000, 0x400000, 1), "CopyDtoD")
	is(d.Memset(0x200000, 0, 1), "Memset")
	is(MemsetAsync(d, 0x200000, 0, 1, 0), "MemsetAsync")
	_, err = d.MemAlloc(e.dev, 4096)
	is(err, "MemAlloc")
	is(d.MemFree(0x200000), "MemFree")
	require.True(t, d.Usage().Zero(), "Usage after Close: %v", d.Usage())
}
