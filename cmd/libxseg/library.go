package main

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// maxDevices bounds the device ordinals the library serves. The hot path
// finds a device's allocator in a fixed array of atomic pointers, without a
// lock and without allocating.
const maxDevices = 64

// device is one device's allocator, published once made.
type device struct {
	a *xseg.DeviceAllocator
}

// library is the state behind the C API: the driver, the configuration and
// one allocator per device, all made lazily at first use. It is safe for
// concurrent use; malloc, free and recordStream take no lock of their own
// once the device's allocator exists.
type library struct {
	getenv     func(string) string
	openDriver func(backend xseg.Backend, hostCapacity uint64) (vmm.Driver, error)

	// onStart, if set, learns the release threshold of the configuration
	// once the library has started (the process's library: the free queue
	// goes direct with a threshold, freequeue.go).
	onStart func(releaseThreshold uint64)
	// oomWait, if set, is every allocator's OOM wait hook (the process's
	// library: the free queue goes direct while an allocation waits for
	// memory, freequeue.go).
	oomWait func(waiting bool)

	level  *slog.LevelVar
	log    *slog.Logger
	logErr error // why XSEG_LOG did not parse: the first use fails with it

	devs [maxDevices]atomic.Pointer[device]

	mu struct {
		sync.Mutex
		conf    string // from configure; applied over XSEG_CONF
		started bool
		drv     vmm.Driver
		cfg     xseg.Config
		err     error // why the driver could not be opened, kept for good
	}
}

// newLibrary makes a library that reads its environment through getenv and
// opens its driver with openDriver, both at first use.
func newLibrary(getenv func(string) string, openDriver func(xseg.Backend, uint64) (vmm.Driver, error)) *library {
	l := &library{getenv: getenv, openDriver: openDriver, level: new(slog.LevelVar)}
	lv, err := parseLevel(getenv(envLog))
	if err != nil {
		l.logErr = fmt.Errorf("%s: %w", envLog, err)
	}
	l.level.Set(lv)
	l.log = newLogger(l.level)
	return l
}

// allocator returns dev's allocator, making it (and, the first time, the
// driver) if need be. This is the first use that reads the configuration.
func (l *library) allocator(dev int) (*xseg.DeviceAllocator, error) {
	if dev >= 0 && dev < maxDevices {
		if d := l.devs[dev].Load(); d != nil {
			return d.a, nil
		}
	}
	return l.openDevice(dev)
}

// existing returns dev's allocator if it was made, nil if not.
func (l *library) existing(dev int) (*xseg.DeviceAllocator, error) {
	if dev < 0 || dev >= maxDevices {
		return nil, fmt.Errorf("device %d out of range [0, %d): %w", dev, maxDevices, vmm.ErrInvalid)
	}
	if d := l.devs[dev].Load(); d != nil {
		return d.a, nil
	}
	return nil, nil
}

func (l *library) openDevice(dev int) (*xseg.DeviceAllocator, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if dev < 0 || dev >= maxDevices {
		return nil, fmt.Errorf("device %d out of range [0, %d): %w", dev, maxDevices, vmm.ErrInvalid)
	}
	if d := l.devs[dev].Load(); d != nil {
		return d.a, nil
	}
	l.startLocked()
	if l.mu.err != nil {
		return nil, l.mu.err
	}
	n, err := l.mu.drv.DeviceCount()
	if err != nil {
		return nil, fmt.Errorf("counting devices: %w", err)
	}
	if dev >= n {
		return nil, fmt.Errorf("device %d: the %s backend has %d devices: %w", dev, l.mu.drv.Backend(), n, vmm.ErrInvalid)
	}
	cfg := l.mu.cfg
	a, err := xseg.Open(xseg.Options{Driver: l.mu.drv, Device: vmm.Device(dev), Config: &cfg, Logger: l.log})
	if err != nil {
		return nil, fmt.Errorf("opening the allocator of device %d: %w", dev, err)
	}
	if l.oomWait != nil {
		a.SetOOMWaitHook(l.oomWait)
	}
	l.devs[dev].Store(&device{a: a})
	l.log.Info("xseg: allocator ready", "device", dev, "backend", l.mu.drv.Backend())
	return a, nil
}

// startLocked reads the configuration and opens the driver, once. A failure
// is kept: every later use reports the same reason. l.mu is held.
func (l *library) startLocked() {
	if l.mu.started {
		return
	}
	l.mu.started = true
	if l.logErr != nil {
		l.mu.err = l.logErr
		return
	}
	cfg, err := l.configLocked(l.mu.conf)
	if err != nil {
		l.mu.err = err
		return
	}
	l.mu.cfg = cfg
	if l.onStart != nil {
		l.onStart(cfg.ReleaseThreshold)
	}
	backend, capacity, err := backendFromEnv(l.getenv)
	if err != nil {
		l.mu.err = err
		return
	}
	drv, err := l.openDriver(backend, capacity)
	if err != nil {
		// openDriver's error names the backend; the hint helps only
		// where CUDA failed.
		if backend == xseg.BackendCUDA {
			err = fmt.Errorf("%w (set %s=host to use host memory instead)", err, envBackend)
		}
		l.mu.err = err
		return
	}
	l.mu.drv = drv
}

// driver returns the driver once the library has started with one, nil
// before that or when it could not be opened.
func (l *library) driver() vmm.Driver {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.drv
}

// configLocked is the configuration of XSEG_CONF (and its aliases) with
// conf applied on top.
//
// On the CUDA backend pages are created exportable (shareable:true) unless
// the configuration says otherwise, as PyTorch's expandable segments do, so
// that xseg_share works on any tensor; it costs nothing on CUDA. The host
// backend (CI) keeps the default, which spends no file descriptor a page.
func (l *library) configLocked(conf string) (xseg.Config, error) {
	base := xseg.DefaultConfig()
	if backend, _, err := backendFromEnv(l.getenv); err == nil && backend == xseg.BackendCUDA {
		base.Shareable = true
	}
	cfg, err := spec.ApplyEnv(base, l.getenv) // its errors name the variable
	if err != nil {
		return cfg, err
	}
	if conf != "" {
		// Not quoted: ParseConfig's error quotes the bad part, briefly.
		if cfg, err = xseg.ParseConfig(cfg, conf); err != nil {
			return cfg, fmt.Errorf("the configuration of xseg_configure: %w", err)
		}
	}
	return cfg, nil
}

// configure sets the configuration string applied over XSEG_CONF at first
// use. It fails once the library has started, and on a string that does not
// parse; a later call replaces an earlier one.
func (l *library) configure(conf string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.started {
		return fmt.Errorf("configuring after first use (the configuration is read once, at the first allocation): %w", vmm.ErrInUse)
	}
	if _, err := l.configLocked(conf); err != nil {
		return err
	}
	l.mu.conf = conf
	return nil
}
