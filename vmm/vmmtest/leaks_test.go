//go:build linux

package vmmtest_test

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// recorder is a testing.TB whose errors and cleanups are kept, so that
// CheckLeaks can be seen to fail.
type recorder struct {
	testing.TB
	errs     []string
	cleanups []func()
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// Fatalf records, as Errorf: the helpers under test return after it.
func (r *recorder) Fatalf(format string, args ...any) { r.Errorf(format, args...) }

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// finish runs the cleanups, last first, as testing does.
func (r *recorder) finish() string {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	return strings.Join(r.errs, "\n")
}

func TestCheckLeaksClean(t *testing.T) {
	d := openHost(t)
	defer d.Close()
	r := &recorder{TB: t}
	vmmtest.CheckLeaks(r, d)
	h, err := d.Create(0, 2<<20, vmm.HandlePosixFD)
	require.NoError(t, err)
	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	require.NoError(t, unix.Close(fd))
	require.NoError(t, d.Release(h))
	require.Empty(t, r.finish())
}

func TestCheckLeaksPage(t *testing.T) {
	d := openHost(t)
	defer d.Close()
	r := &recorder{TB: t}
	vmmtest.CheckLeaks(r, d)
	h, err := d.Create(0, 2<<20, vmm.HandleNone)
	require.NoError(t, err)
	require.Contains(t, r.finish(), "handles=1")
	require.NoError(t, d.Release(h))
}

func TestCheckLeaksFD(t *testing.T) {
	d := openHost(t)
	defer d.Close()
	r := &recorder{TB: t}
	vmmtest.CheckLeaks(r, d)
	h, err := d.Create(0, 2<<20, vmm.HandlePosixFD)
	require.NoError(t, err)
	fd, err := d.ExportFD(h)
	require.NoError(t, err)
	require.NoError(t, d.Release(h))
	msg := r.finish()
	require.NoError(t, unix.Close(fd))
	require.Contains(t, msg, fmt.Sprintf("fd %d -> ", fd))
	require.Contains(t, msg, "1 file descriptors")
}

// TestWaitGoroutines: a goroutine that ends within the wait passes; one
// still blocked fails, naming the count and showing its stack.
func TestWaitGoroutines(t *testing.T) {
	n := settledGoroutines(t)
	var wg sync.WaitGroup
	wg.Go(func() { time.Sleep(20 * time.Millisecond) })
	r := &recorder{TB: t}
	vmmtest.WaitGoroutines(r, n, 2*time.Second)
	require.Empty(t, r.finish())
	wg.Wait()

	block := make(chan struct{})
	wg.Go(func() { <-block })
	r = &recorder{TB: t}
	vmmtest.WaitGoroutines(r, n, 30*time.Millisecond)
	msg := r.finish()
	close(block)
	wg.Wait() // gone before the next test (or -count run) counts
	require.Contains(t, msg, "goroutines leaked")
	require.Contains(t, msg, "TestWaitGoroutines")
}

// settledGoroutines waits until the goroutines earlier tests left are
// gone (the count has not changed for 50 ms, or 2 s have passed) and
// returns the count: a baseline taken while one of them is still
// finishing would hide a goroutine the test starts.
func settledGoroutines(t *testing.T) int {
	t.Helper()
	n, since := runtime.NumGoroutine(), time.Now()
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if g := runtime.NumGoroutine(); g != n {
			n, since = g, time.Now()
		} else if time.Since(since) >= 50*time.Millisecond {
			break
		}
	}
	return n
}
