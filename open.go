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

// OpenDriver opens a backend: "cuda", "host", or "auto" (or ""), which
// tries CUDA and falls back to the host backend when CUDA answers
// vmm.ErrNotSupported (no driver, no device, a build without cgo).
// hostCapacity is the host backend's memory per device (0: its default).
// The caller closes the driver.
func OpenDriver(backend string, hostCapacity uint64) (vmm.Driver, error) {
	switch backend {
	case "cuda":
		return openCUDA()
	case "host":
		return openHost(hostCapacity)
	case "", "auto":
		d, err := openCUDA()
		if err == nil {
			return d, nil
		}
		if !errors.Is(err, vmm.ErrNotSupported) {
			return nil, err
		}
		return openHost(hostCapacity)
	}
	return nil, fmt.Errorf("xseg: unknown backend %q (want auto, host or cuda): %w", backend, vmm.ErrInvalid)
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
func Open(o Options) (Allocator, error) {
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
	a, err := newAllocator(d, o, cfg)
	if err != nil {
		if owned {
			err = errors.Join(err, d.Close())
		}
		return nil, err
	}
	if owned {
		return &owning{Allocator: a, d: d}, nil
	}
	return a, nil
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

func newAllocator(d vmm.Driver, o Options, cfg Config) (Allocator, error) {
	c, err := ChooseAllocator(d, o.Device, o.Allocator)
	if err != nil {
		return nil, err
	}
	var a Allocator
	if c.Allocator == "fallback" {
		a, err = fallback.New(d, o.Device, cfg, o.Logger)
	} else {
		a, err = expandable.New(d, o.Device, cfg, o.Logger)
	}
	if err != nil {
		return nil, fmt.Errorf("xseg: %w", err)
	}
	return a, nil
}

// owning is an allocator that closes the driver Open opened for it.
type owning struct {
	Allocator
	d vmm.Driver
}

// Close closes the allocator, then the driver.
func (o *owning) Close() error {
	return errors.Join(o.Allocator.Close(), o.d.Close())
}
