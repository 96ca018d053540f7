package xseg

import (
	"errors"
	"fmt"
	"os"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/fallback"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/cuda"
	"github.com/xseg-dev/xseg/vmm/host"
)

// OpenDriver opens a backend: BackendCUDA, BackendHost, or BackendAuto
// (or ""), which tries CUDA and falls back to the host backend when CUDA
// answers vmm.ErrNotSupported (no driver, no device, a build without cgo).
// hostCapacity is the host backend's memory per device (0: its default).
// An unknown backend is an error matching vmm.ErrInvalid. The caller
// closes the driver.
func OpenDriver(backend Backend, hostCapacity uint64) (vmm.Driver, error) {
	if err := backend.check(); err != nil {
		return nil, err
	}
	switch backend {
	case BackendCUDA:
		return openCUDA()
	case BackendHost:
		return openHost(hostCapacity)
	}
	d, err := openCUDA()
	if err == nil {
		return d, nil
	}
	if !errors.Is(err, vmm.ErrNotSupported) {
		return nil, err
	}
	return openHost(hostCapacity)
}

func openCUDA() (vmm.Driver, error) {
	d, err := cuda.Open()
	if err != nil {
		return nil, fmt.Errorf("xseg: opening the CUDA backend: %w", err)
	}
	return d, nil
}

func openHost(capacity uint64) (vmm.Driver, error) {
	d, err := host.Open(host.Options{Capacity: capacity})
	if err != nil {
		return nil, fmt.Errorf("xseg: opening the host backend: %w", err)
	}
	return d, nil
}

// Open makes an allocator as o says: on the backend o.Backend names (auto:
// CUDA if a driver and device are there, else the host backend), the
// allocator ChooseAllocator picks for o.Device (auto: expandable where the
// device supports virtual memory management, fallback where it does not).
// The allocator closes the driver on Close if Open opened it.
func Open(o Options) (*DeviceAllocator, error) {
	cfg, err := o.config()
	if err != nil {
		return nil, err
	}
	d, owned := o.Driver, false
	if d == nil {
		if d, err = OpenDriver(o.Backend, o.HostCapacity); err != nil {
			return nil, err
		}
		owned = true
	}
	a, err := newAllocator(d, o, cfg, owned)
	if err != nil && owned {
		err = errors.Join(err, d.Close())
	}
	return a, err
}

func (o Options) config() (Config, error) {
	if o.Config != nil {
		return *o.Config, nil
	}
	cfg, err := ConfigFromEnv(os.Getenv)
	if err != nil {
		return cfg, fmt.Errorf("xseg: %w", err)
	}
	return cfg, nil
}

func newAllocator(d vmm.Driver, o Options, cfg Config, owned bool) (*DeviceAllocator, error) {
	c, err := ChooseAllocator(d, o.Device, o.Allocator)
	if err != nil {
		return nil, err
	}
	var e engine
	if c.Allocator == AllocatorFallback {
		e, err = fallback.New(d, o.Device, cfg, o.Logger)
	} else {
		e, err = expandable.New(d, o.Device, cfg, o.Logger)
	}
	if err != nil {
		return nil, fmt.Errorf("xseg: %w", err)
	}
	return newDeviceAllocator(e, c.Allocator, owned), nil
}
