package vmmtest

import (
	"errors"
	"testing"

	"github.com/xseg-dev/xseg/vmm"
)

// keepPeer opens a driver that stays open until t ends and warms the peer
// device on it (warmPeer). The CUDA driver opens descriptors of a GPU when
// its primary context is first retained and closes them when the last
// retainer lets go; holding the peer's context for the whole suite keeps
// the fd check from blaming the peer subtests for them (the caller of Run
// holds device 0's the same way). Errors are only logged.
func keepPeer(t *testing.T, c Config) {
	d := c.Open(t)
	if d == nil {
		return
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("vmmtest: closing the driver that kept the peer device warm: %v", err)
		}
	})
	if err := warmPeer(d, c.Device); err != nil {
		t.Logf("vmmtest: warm-up of the peer device of %s: %v", c.Name, err)
	}
}

// warmPeer does, on the first device other than dev (if there is one),
// what warmUp does on dev, and then grants it access to a page of dev and
// writes the page from its stream: the CUDA driver opens descriptors of the
// second GPU the first time its context is used, and keeps them.
func warmPeer(d vmm.Driver, dev vmm.Device) (err error) {
	n, err := d.DeviceCount()
	if err != nil || n < 2 {
		return err
	}
	peer := vmm.Device(0)
	if dev == 0 {
		peer = 1
	}
	if err := errors.Join(warmPage(d, peer), warmStream(d, peer)); err != nil {
		return err
	}
	info, err := d.DeviceInfo(dev)
	if err != nil || !info.VMM {
		return err
	}
	g := info.Granularity
	p, err := d.Reserve(g, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unreserve(p, g)) }()
	h, err := d.Create(dev, g, vmm.HandleNone)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Release(h)) }()
	if err := d.Map(p, g, h, 0); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unmap(p, g)) }()
	both := []vmm.AccessDesc{{Device: dev, Flags: vmm.AccessReadWrite}, {Device: peer, Flags: vmm.AccessReadWrite}}
	if err := d.SetAccess(p, g, both); err != nil {
		return err
	}
	s, err := d.StreamCreate(peer)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.StreamDestroy(s)) }()
	if err := MemsetAsync(d, p, 1, g, s); err != nil {
		return err
	}
	return d.StreamSynchronize(s)
}
