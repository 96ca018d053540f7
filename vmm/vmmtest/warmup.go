package vmmtest

import (
	"errors"
	"os"
	"testing"

	"github.com/xseg-dev/xseg/vmm"
)

// warmUp opens a driver and makes one of each kind of object the suite
// makes, then gives everything back. A driver library may open descriptors
// the first time it does something and keep them for the life of the process
// (the CUDA driver does); doing it once before the subtests keeps the fd
// check from blaming the first subtest for them. It is best effort: the
// subtests report what goes wrong, precisely, so errors here are only
// logged.
func warmUp(t *testing.T, c Config) {
	t.Helper()
	warmRuntimeFDs()
	d := c.Open(t)
	if d == nil {
		return
	}
	err := errors.Join(warmPage(d, c.Device), warmStream(d, c.Device), d.Close())
	if err != nil {
		t.Logf("vmmtest: warm-up of %s: %v", c.Name, err)
	}
	keepPeer(t, c)
}

// warmPage makes an exportable page, maps it, exports and imports it, and a
// plain allocation, and gives them back.
func warmPage(d vmm.Driver, dev vmm.Device) (err error) {
	info, err := d.DeviceInfo(dev)
	if err != nil {
		return err
	}
	a, err := d.MemAlloc(dev, 4096)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.MemFree(a)) }()
	if !info.VMM || !info.PosixFD {
		return nil
	}
	g := info.Granularity
	h, err := d.Create(dev, g, vmm.HandlePosixFD)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Release(h)) }()
	fd, err := d.ExportFD(h)
	if err != nil {
		return err
	}
	imp, err := d.ImportFD(fd)
	err = errors.Join(err, closeFD(fd))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Release(imp)) }()
	return pageLifeOf(d, dev, g, imp, 0)
}

// warmStream makes a stream and an event and uses them once.
func warmStream(d vmm.Driver, dev vmm.Device) (err error) {
	s, err := d.StreamCreate(dev)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.StreamDestroy(s)) }()
	e, err := d.EventCreate(dev)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.EventDestroy(e)) }()
	if err := d.EventRecord(e, s); err != nil {
		return err
	}
	return errors.Join(d.StreamSynchronize(s), d.EventSynchronize(e))
}

// closeFD closes fd, a descriptor a driver returned.
func closeFD(fd int) error { return os.NewFile(uintptr(fd), "exported").Close() }
