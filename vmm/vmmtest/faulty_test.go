package vmmtest_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// openFaulty wraps a fresh host driver, checked for leaks.
func openFaulty(t *testing.T) *vmmtest.Faulty {
	f := vmmtest.NewFaulty(openHost(t))
	t.Cleanup(func() { require.NoError(t, f.Unwrap().Close()) })
	vmmtest.CheckLeaks(t, f)
	return f
}

func TestFaultyFailNthDefault(t *testing.T) {
	f := openFaulty(t)
	const g = 2 << 20
	f.FailNth(vmmtest.OpCreate, 2, nil)
	h1, err := f.Create(0, g, vmm.HandleNone)
	require.NoError(t, err, "first Create")
	_, err = f.Create(0, g, vmm.HandleNone)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory, "second Create")
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.Contains(t, err.Error(), "injected")
	var inj *vmmtest.InjectedError
	require.ErrorAs(t, err, &inj)
	require.Equal(t, vmmtest.OpCreate, inj.Op)
	require.Equal(t, 2, inj.Call)
	require.Equal(t, 1, f.Unwrap().Usage().Handles, "the failed Create reached the driver")
	h3, err := f.Create(0, g, vmm.HandleNone)
	require.NoError(t, err, "third Create")
	require.Equal(t, 3, f.Calls(vmmtest.OpCreate))
	require.Zero(t, f.Calls(vmmtest.OpRelease))
	require.NoError(t, f.Release(h1))
	require.NoError(t, f.Release(h3))
	require.Equal(t, 2, f.Calls(vmmtest.OpRelease))

	f.FailNth(vmmtest.OpReserve, 1, nil)
	_, err = f.Reserve(g, 0)
	require.ErrorIs(t, err, vmmtest.ErrInjected)
	require.NotErrorIs(t, err, vmm.ErrOutOfMemory, "only Create and MemAlloc default to out of memory")
}

func TestFaultyFailNthGivenError(t *testing.T) {
	f := openFaulty(t)
	const g = 2 << 20
	p, err := f.Reserve(g, 0)
	require.NoError(t, err)
	h, err := f.Create(0, g, vmm.HandleNone)
	require.NoError(t, err)
	f.FailNth(vmmtest.OpMap, 1, vmm.ErrInUse)
	f.FailNth(vmmtest.OpMap, 3, nil)
	err = f.Map(p, g, h, 0)
	require.ErrorIs(t, err, vmm.ErrInUse, "first Map")
	require.Zero(t, f.Usage().Mappings, "the failed Map reached the driver")
	require.NoError(t, f.Map(p, g, h, 0), "second Map")
	require.NoError(t, f.Unmap(p, g))
	require.ErrorIs(t, f.Map(p, g, h, 0), vmmtest.ErrInjected, "third Map")
	require.NoError(t, f.Map(p, g, h, 0), "fourth Map")
	require.Equal(t, 4, f.Calls(vmmtest.OpMap))
	require.NoError(t, f.Unmap(p, g))
	require.NoError(t, f.Release(h))
	require.NoError(t, f.Unreserve(p, g))
}

func TestFaultyReset(t *testing.T) {
	f := openFaulty(t)
	f.FailNth(vmmtest.OpDeviceCount, 1, nil)
	f.Reset()
	n, err := f.DeviceCount()
	require.NoError(t, err, "a failure armed before Reset")
	require.Equal(t, 2, n)
	require.Equal(t, 1, f.Calls(vmmtest.OpDeviceCount))
	f.Reset()
	require.Zero(t, f.Calls(vmmtest.OpDeviceCount))
	require.Panics(t, func() { f.FailNth(vmmtest.OpMap, 0, nil) })
}

func TestFaultyConcurrent(t *testing.T) {
	f := openFaulty(t)
	const workers, calls = 4, 25
	f.FailNth(vmmtest.OpDeviceCount, 50, nil)
	var mu sync.Mutex
	var failed []int
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range calls {
				if _, err := f.DeviceCount(); err != nil {
					call := -1 // not an injected failure
					var inj *vmmtest.InjectedError
					if errors.As(err, &inj) {
						call = inj.Call
					}
					mu.Lock()
					failed = append(failed, call)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	require.Equal(t, []int{50}, failed)
	require.Equal(t, workers*calls, f.Calls(vmmtest.OpDeviceCount))
}

// backPage is the kind of code Faulty exists for: it makes a readable page
// and undoes what it did when a step fails.
func backPage(d vmm.Driver, size uint64) (err error) {
	p, err := d.Reserve(size, 0)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unreserve(p, size)) }()
	h, err := d.Create(0, size, vmm.HandlePosixFD)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Release(h)) }()
	if err := d.Map(p, size, h, 0); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, d.Unmap(p, size)) }()
	if err := d.SetAccess(p, size, vmm.ReadWrite(0)); err != nil {
		return err
	}
	return d.Memset(p, 1, size)
}

// TestFaultyUnwind fails each step of backPage in turn: each failure comes
// back to the caller and leaves nothing behind (CheckLeaks).
func TestFaultyUnwind(t *testing.T) {
	for _, op := range []vmmtest.Op{vmmtest.OpReserve, vmmtest.OpCreate, vmmtest.OpMap, vmmtest.OpSetAccess, vmmtest.OpMemset} {
		t.Run(string(op), func(t *testing.T) {
			f := openFaulty(t)
			f.FailNth(op, 1, nil)
			err := backPage(f, 2<<20)
			require.ErrorIs(t, err, vmmtest.ErrInjected)
			require.Equal(t, 1, f.Calls(op))
			require.NoError(t, backPage(f, 2<<20), "the next try")
		})
	}
}
