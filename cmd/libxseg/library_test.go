package main

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// env is a stand-in environment.
type env map[string]string

func (e env) get(k string) string { return e[k] }

func hostLibrary(t *testing.T, extra env) *library {
	e := env{envBackend: "host", envHostCapacity: fmt.Sprint(256 << 20)}
	for k, v := range extra {
		e[k] = v
	}
	var drv vmm.Driver
	l := newLibrary(e.get, func(backend xseg.Backend, capacity uint64) (vmm.Driver, error) {
		require.Equal(t, xseg.BackendHost, backend)
		require.Equal(t, uint64(256<<20), capacity)
		d, err := xseg.OpenDriver(backend, capacity)
		drv = d
		return d, err
	})
	t.Cleanup(func() {
		for i := range l.devs {
			if d := l.devs[i].Load(); d != nil {
				require.NoError(t, d.a.Close())
			}
		}
		if drv != nil {
			require.NoError(t, drv.Close())
		}
	})
	return l
}

func stats(t *testing.T, l *library, dev int) statsReport {
	b, err := l.statsJSON(dev)
	require.NoError(t, err)
	var r statsReport
	require.NoError(t, json.Unmarshal(b, &r))
	return r
}

func TestLibraryAllocFree(t *testing.T) {
	l := hostLibrary(t, nil)
	require.Zero(t, stats(t, l, 0).AllocatedBytes.All.Current)

	p, err := l.malloc(0, 0, 0)
	require.NoError(t, err)
	require.Zero(t, p)
	_, err = l.malloc(-1, 0, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)

	a, err := l.malloc(4096, 0, 0)
	require.NoError(t, err)
	b, err := l.malloc(30<<20, 0, 0)
	require.NoError(t, err)
	r := stats(t, l, 0)
	require.GreaterOrEqual(t, r.AllocatedBytes.All.Current, int64(4096+30<<20))
	require.Equal(t, int64(2), r.Allocations.All.Current)
	require.Equal(t, uint64(256<<20), r.DeviceTotal)

	known, err := l.recordStream(a, 0)
	require.NoError(t, err)
	require.True(t, known)
	known, err = l.recordStream(a+1<<40, 0)
	require.NoError(t, err)
	require.False(t, known, "memory xseg never handed out")
	known, err = l.recordStream(a, vmm.Stream(0x1234))
	require.ErrorContains(t, err, "stream 0x1234 cannot be used on device 0: ", "xseg's block, a stream that is not live")
	require.True(t, known, "the block is xseg's: the caller must hear of the failure")

	require.NoError(t, l.free(a, 0))
	require.ErrorIs(t, l.free(a, 0), vmm.ErrInvalid, "double free")
	require.ErrorIs(t, l.free(b+8, 0), vmm.ErrInvalid, "interior pointer")
	require.ErrorIs(t, l.free(b, 3), vmm.ErrInvalid, "device without allocations")
	require.ErrorIs(t, l.free(b, 99), vmm.ErrInvalid, "device out of range")
	require.NoError(t, l.free(0, 0))
	require.NoError(t, l.free(b, 0))

	r = stats(t, l, 0)
	require.Zero(t, r.AllocatedBytes.All.Current)
	require.NotZero(t, r.ReservedBytes.All.Current)
	require.NoError(t, l.resetPeakStats(-1))
	// A device the backend does not have is an error for the calls that
	// act on a device, as for those that read one.
	require.ErrorContains(t, l.emptyCache(3), "the host backend has 1 devices")
	require.ErrorIs(t, l.resetPeakStats(3), vmm.ErrInvalid)
	require.NoError(t, l.emptyCache(0), "a device without allocations has nothing to do")
	require.NoError(t, l.emptyCache(-1))
	r = stats(t, l, 0)
	require.Zero(t, r.ReservedBytes.All.Current)
	require.Zero(t, r.AllocatedBytes.All.Peak)
}

func TestLibraryBadDevices(t *testing.T) {
	l := hostLibrary(t, nil)
	_, err := l.malloc(64, 1, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "the host backend has one device")
	require.ErrorContains(t, err, "device 1")
	_, err = l.malloc(64, -1, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = l.statsJSON(2)
	require.ErrorIs(t, err, vmm.ErrInvalid, "once started, a missing device is an error")
	_, err = l.snapshotJSON(maxDevices)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorIs(t, l.emptyCache(-2), vmm.ErrInvalid)
	require.ErrorContains(t, l.emptyCache(5), "the host backend has 1 devices", "a device the backend does not have")
	require.NoError(t, l.emptyCache(0), "nothing cached on a device without allocations")
}

func TestLibrarySnapshot(t *testing.T) {
	l := hostLibrary(t, nil)
	b, err := l.snapshotJSON(0)
	require.NoError(t, err)
	require.JSONEq(t, `[]`, string(mustField(t, b, "segments")))

	p, err := l.malloc(1000, 0, 0)
	require.NoError(t, err)
	b, err = l.snapshotJSON(0)
	require.NoError(t, err)
	var snap xseg.Snapshot
	require.NoError(t, json.Unmarshal(b, &snap))
	require.NotEmpty(t, snap.Segments)
	found := false
	for _, s := range snap.Segments {
		for _, blk := range s.Blocks {
			found = found || (blk.Ptr == p && blk.State == "allocated")
		}
	}
	require.True(t, found, "the block at %v is in the snapshot", p)
	require.NoError(t, l.free(p, 0))
}

func mustField(t *testing.T, b []byte, name string) json.RawMessage {
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &m))
	return m[name]
}

func TestLibraryConfigure(t *testing.T) {
	l := hostLibrary(t, env{"XSEG_CONF": "oom_max_retries:2"})
	require.ErrorContains(t, l.configure("oom_max_retries:x"), "oom_max_retries")
	require.ErrorContains(t, l.configure("bogus:1"), "bogus")
	require.NoError(t, l.configure("large_page_mb:40"))
	require.NoError(t, l.configure("large_page_mb:60"), "a later call replaces an earlier one")

	p, err := l.malloc(5<<20, 0, 0)
	require.NoError(t, err)
	require.Equal(t, 2, l.mu.cfg.OOMMaxRetries, "XSEG_CONF is read")
	require.Equal(t, uint64(60<<20), l.mu.cfg.LargePageSize, "configure applies over XSEG_CONF")
	require.Equal(t, int64(60<<20), stats(t, l, 0).ReservedBytes.All.Current, "one 60 MiB large page")
	require.ErrorIs(t, l.configure("large_page_mb:20"), vmm.ErrInUse, "too late")
	require.NoError(t, l.free(p, 0))
}

func TestLibraryStartFailureKept(t *testing.T) {
	calls := 0
	l := newLibrary(env{}.get, func(backend xseg.Backend, _ uint64) (vmm.Driver, error) {
		calls++
		require.Equal(t, xseg.BackendCUDA, backend, "CUDA is the default backend")
		return nil, fmt.Errorf("dlopen libcuda.so.1: no such file: %w", vmm.ErrNotSupported)
	})
	for range 3 {
		_, err := l.malloc(100, 0, 0)
		require.ErrorIs(t, err, vmm.ErrNotSupported)
		require.ErrorContains(t, err, "libcuda.so.1")
		require.ErrorContains(t, err, "XSEG_BACKEND=host")
	}
	require.Equal(t, 1, calls, "the driver is opened once")
	b, err := l.statsJSON(0)
	require.NoError(t, err, "stats work without a driver")
	require.Contains(t, string(b), `"device_total_bytes":0`)

	bad := newLibrary(env{envBackend: "tpu"}.get, nil)
	_, err = bad.malloc(100, 0, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	bad = newLibrary(env{envBackend: "host", envHostCapacity: "lots"}.get, nil)
	_, err = bad.malloc(100, 0, 0)
	require.ErrorContains(t, err, envHostCapacity)
	bad = newLibrary(env{"XSEG_CONF": "nope"}.get, nil)
	_, err = bad.malloc(100, 0, 0)
	require.ErrorContains(t, err, "XSEG_CONF")
}

// TestLibraryConcurrent runs allocating goroutines beside stats, snapshot
// and empty-cache calls (run it with -race), starting the library from
// several goroutines at once.
func TestLibraryConcurrent(t *testing.T) {
	l := hostLibrary(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 6 {
		wg.Go(func() {
			for i := range 300 {
				n := int64(512 + (i*g*7919)%(3<<20))
				p, err := l.malloc(n, 0, 0)
				if err == nil {
					_, err = l.recordStream(p, 0)
				}
				if err == nil {
					err = l.free(p, 0)
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			if _, err := l.statsJSON(0); err != nil {
				errs <- err
			}
			if _, err := l.snapshotJSON(0); err != nil {
				errs <- err
			}
			if err := l.emptyCache(-1); err != nil {
				errs <- err
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Zero(t, stats(t, l, 0).Allocations.All.Current)
}

func TestParseLevel(t *testing.T) {
	for s, want := range map[string]slog.Level{"": levelOff, "off": levelOff, "1": slog.LevelInfo, "info": slog.LevelInfo, "DEBUG": slog.LevelDebug, "warn": slog.LevelWarn, "error": slog.LevelError} {
		got, err := parseLevel(s)
		require.NoError(t, err, s)
		require.Equal(t, want, got, s)
	}
	_, err := parseLevel("loud")
	require.ErrorIs(t, err, vmm.ErrInvalid)
	_, err = parseLevel(strings.Repeat("x", 10<<10))
	require.Less(t, len(err.Error()), 200, "a long level is quoted short")
	l := newLibrary(env{envLog: "debug"}.get, nil)
	require.Equal(t, slog.LevelDebug, l.level.Level(), "XSEG_LOG is read at load")
}

// On CUDA pages are exportable unless the configuration says otherwise; on
// the host backend they are not, unless asked for.
func TestShareableDefault(t *testing.T) {
	for _, tc := range []struct {
		env  env
		want bool
	}{
		{env{}, true},
		{env{"XSEG_CONF": "shareable:false"}, false},
		{env{"XSEG_BACKEND": "host"}, false},
		{env{"XSEG_BACKEND": "host", "XSEG_CONF": "shareable:true"}, true},
		{env{"XSEG_CONF": "oom_max_retries:2"}, true},
		{env{"XSEG_CONF": "oom_max_retries:2,shareable:false"}, false},
		{env{"OOM_MAX_RETRIES": "3"}, true},
		{env{"XSEG_BACKEND": "host", "OOM_VERBOSE": "1"}, false},
	} {
		l := newLibrary(tc.env.get, nil)
		cfg, err := l.configLocked("")
		require.NoError(t, err, "%v", tc.env)
		require.Equal(t, tc.want, cfg.Shareable, "%v", tc.env)
	}
}

// Issue 15: an invalid XSEG_LOG was ignored silently. As a bad
// XSEG_BACKEND, it fails the first use, and every later one, naming it.
func TestLibraryBadLogLevelFailsFirstUse(t *testing.T) {
	opened := false
	l := newLibrary(env{envLog: "loud", envBackend: "host"}.get, func(xseg.Backend, uint64) (vmm.Driver, error) {
		opened = true
		return nil, fmt.Errorf("opened: %w", vmm.ErrNotSupported)
	})
	require.Equal(t, levelOff, l.level.Level(), "the log stays off")
	for range 2 {
		_, err := l.malloc(100, 0, 0)
		require.ErrorIs(t, err, vmm.ErrInvalid)
		require.ErrorContains(t, err, `XSEG_LOG: log level "loud": want off, error, warn, info or debug`)
	}
	require.False(t, opened, "no driver is opened")
	require.NoError(t, newLibrary(env{envLog: " Warn "}.get, nil).logErr)
}

// Issue 15: XSEG_HOST_CAPACITY=1000 failed as "opening the host backend
// (set XSEG_BACKEND=host ...)" with XSEG_BACKEND=host already set. The
// capacity is checked with its unit; the hint is for CUDA only.
func TestLibraryHostCapacityMessage(t *testing.T) {
	for s, want := range map[string]string{
		"1000":    "1000 bytes is not a multiple of the granularity 2 MiB; did you mean 1000GiB?",
		"0":       "want a positive multiple of the granularity 2 MiB",
		"-5":      "not a byte size: negative",
		"3145728": "3145728 bytes is not a multiple of the granularity 2 MiB",
		"3MiB":    "3145728 bytes is not a multiple of the granularity 2 MiB",
		"lots":    "not a byte size (want a number of bytes with an optional unit, e.g. 24GiB, 512MiB or 1000000)",
		// One syntax with the command line's --capacity: no hexadecimal.
		"0x40000000": "not a byte size",
	} {
		_, _, err := backendFromEnv(env{envBackend: "host", envHostCapacity: s}.get)
		require.ErrorIs(t, err, vmm.ErrInvalid, s)
		require.ErrorContains(t, err, `XSEG_HOST_CAPACITY="`+s+`": `+want, s)
	}
	for s, want := range map[string]uint64{"1073741824": 1 << 30, "1GiB": 1 << 30, " 512 MiB ": 512 << 20} {
		_, c, err := backendFromEnv(env{envBackend: "host", envHostCapacity: s}.get)
		require.NoError(t, err, s)
		require.Equal(t, want, c, s)
	}
	_, _, err := backendFromEnv(env{envBackend: "host", envHostCapacity: strings.Repeat("9", 1<<20)}.get)
	require.ErrorContains(t, err, "...")
	require.Less(t, len(err.Error()), 300, "the value is quoted cut short")

	l := newLibrary(env{envBackend: "host", envHostCapacity: "1000"}.get, xseg.OpenDriver)
	_, err = l.malloc(100, 0, 0)
	require.ErrorContains(t, err, "multiple of the granularity 2 MiB")
	require.NotContains(t, err.Error(), "set XSEG_BACKEND=host")

	// A host backend that fails to open gets no hint either.
	l = newLibrary(env{envBackend: "host"}.get, func(xseg.Backend, uint64) (vmm.Driver, error) {
		return nil, fmt.Errorf("xseg: opening the host backend: no memfd: %w", vmm.ErrNotSupported)
	})
	_, err = l.malloc(100, 0, 0)
	require.EqualError(t, err, "xseg: opening the host backend: no memfd: not supported")
}

// Issue 15: xseg_configure of a 10 MiB value made a 20 MiB last error:
// the library quoted the whole string around core's quote of the value.
func TestLibraryConfigureErrorShort(t *testing.T) {
	l := hostLibrary(t, nil)
	for _, conf := range []string{
		"large_page_mb:" + strings.Repeat("9", 10<<20),
		"oom_max_retries:1," + strings.Repeat("q", 10<<20),
		strings.Repeat("k", 1000) + ":1",
	} {
		err := l.configure(conf)
		require.Error(t, err)
		require.Less(t, len(err.Error()), 450, "%.500s", err) // an unknown key's error lists the keys
	}
	err := l.configure("large_page_mb:" + strings.Repeat("9", 100))
	require.EqualError(t, err, `the configuration of xseg_configure: config: key "large_page_mb": "99999999999999999999999999999999"... MiB is more bytes than 64 bits hold: invalid argument`)
}

// Issue 15: an allocation waiting for frees (oom_wait_ms) when its
// allocator closed failed as "allocating N bytes: allocating N bytes:
// closed": core's wait and its caller both named the request.
func TestLibraryClosedWhileWaitingMessage(t *testing.T) {
	l := hostLibrary(t, env{"XSEG_CONF": "oom_wait_ms:60000"})
	keep, err := l.malloc(200<<20, 0, 0)
	require.NoError(t, err)
	require.NotZero(t, keep)
	a := l.devs[0].Load().a
	errc := make(chan error, 1)
	go func() {
		_, err := l.malloc(100<<20, 0, 0) // more than the 56 MiB left: waits
		errc <- err
	}()
	// The count goes up under the lock the waiter holds until it waits.
	require.Eventually(t, func() bool { return a.Stats().NumAllocRetries > 0 }, 30*time.Second, time.Millisecond)
	require.NoError(t, a.Close()) // wakes the waiter; a second Close is nil
	err = <-errc
	require.ErrorIs(t, err, vmm.ErrClosed)
	require.Equal(t, 1, strings.Count(err.Error(), "allocating 104857600 bytes"), err.Error())
}

// TestMillisFromEnv: XSEG_IMPORT_KEEP_MS and XSEG_LEASE_ACK_MS unset are
// their defaults (1 s kept; ipc's default wait, 0), "0" keeps nothing and
// does not wait (negative), whole milliseconds up to each one's bound are
// taken, the rest is an error that names the variable.
func TestMillisFromEnv(t *testing.T) {
	for _, v := range []struct {
		name  string
		read  func(func(string) string) (time.Duration, error)
		unset time.Duration
		ok    map[string]time.Duration
		bad   []string
	}{
		{envImportKeep, importKeepFromEnv, defaultImportKeep,
			map[string]time.Duration{"0": 0, " 250 ": 250 * time.Millisecond, "3600000": time.Hour},
			[]string{"-1", "1.5", "1s", "3600001", "99999999999999999999", "x"}},
		{envLeaseAck, leaseAckFromEnv, 0,
			map[string]time.Duration{"0": -1, " 5 ": 5 * time.Millisecond, "60000": time.Minute},
			[]string{"-1", "2.5", "20ms", "60001", "99999999999999999999", "x"}},
	} {
		d, err := v.read(env{}.get)
		require.NoError(t, err, v.name)
		require.Equal(t, v.unset, d, v.name)
		for s, want := range v.ok {
			d, err := v.read(env{v.name: s}.get)
			require.NoError(t, err, "%s=%s", v.name, s)
			require.Equal(t, want, d, "%s=%s", v.name, s)
		}
		for _, s := range v.bad {
			_, err := v.read(env{v.name: s}.get)
			require.ErrorIs(t, err, vmm.ErrInvalid, "%s=%s", v.name, s)
			require.ErrorContains(t, err, v.name, s)
		}
	}
}
