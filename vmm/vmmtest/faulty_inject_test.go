package vmmtest_test

import (
	"errors"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// callOp calls the method of f that op names, with zero arguments, and
// returns its error.
func callOp(t *testing.T, f *vmmtest.Faulty, op vmmtest.Op) error {
	t.Helper()
	m := reflect.ValueOf(f).MethodByName(string(op))
	require.True(t, m.IsValid(), "Faulty has no method %s", op)
	args := make([]reflect.Value, m.Type().NumIn())
	for i := range args {
		args[i] = reflect.Zero(m.Type().In(i))
	}
	out := m.Call(args)
	err, _ := out[len(out)-1].Interface().(error)
	return err
}

// failing calls op n times and returns the numbers (InjectedError.Call) of
// the calls that failed on purpose; any other error fails the test.
func failing(t *testing.T, f *vmmtest.Faulty, op vmmtest.Op, n int) []int {
	t.Helper()
	var failed []int
	for range n {
		if err := callOp(t, f, op); err != nil {
			var inj *vmmtest.InjectedError
			require.ErrorAs(t, err, &inj)
			require.Equal(t, op, inj.Op)
			failed = append(failed, inj.Call)
		}
	}
	return failed
}

// TestFaultyEveryOp fails each operation in turn through its method: every
// operation AllOps derives has a method that reports that operation, and
// counts its calls apart from the others'.
func TestFaultyEveryOp(t *testing.T) {
	ops := vmmtest.AllOps().List()
	for _, op := range []vmmtest.Op{vmmtest.OpMap, vmmtest.OpClose, vmmtest.OpExportAllocFD, vmmtest.OpMemsetAsync} {
		require.Contains(t, ops, op)
	}
	for _, never := range []vmmtest.Op{"Backend", "Usage", "Unwrap", "FailNth"} {
		require.NotContains(t, ops, never)
	}
	require.True(t, slices.IsSorted(ops))
	f := openFaulty(t)
	for _, op := range ops {
		f.Reset()
		f.Inject(vmmtest.Injector{Where: vmmtest.Ops(op)})
		err := callOp(t, f, op)
		var inj *vmmtest.InjectedError
		require.ErrorAs(t, err, &inj, "%s", op)
		require.Equal(t, op, inj.Op, "the method %s reports another operation", op)
		require.Equal(t, 1, inj.Call)
		for _, other := range ops {
			want := 0
			if other == op {
				want = 1
			}
			require.Equal(t, want, f.Calls(other), "calls of %s after one of %s", other, op)
		}
	}
}

func TestWhere(t *testing.T) {
	ops := vmmtest.AllOps().List()
	require.Equal(t, ops, vmmtest.Where(nil).List(), "the nil Where holds every operation")
	mapping := vmmtest.Ops(vmmtest.OpUnmap, vmmtest.OpMap)
	require.Equal(t, []vmmtest.Op{vmmtest.OpMap, vmmtest.OpUnmap}, mapping.List())
	require.True(t, mapping.Has(vmmtest.OpMap))
	require.False(t, mapping.Has(vmmtest.OpReserve))
	require.False(t, mapping.Not().Has(vmmtest.OpMap))
	require.Len(t, mapping.Not().List(), len(ops)-2)
	require.Equal(t, []vmmtest.Op{vmmtest.OpMap},
		mapping.And(vmmtest.Ops(vmmtest.OpMap, vmmtest.OpCreate)).List())
	require.Equal(t, []vmmtest.Op{vmmtest.OpCreate, vmmtest.OpMap, vmmtest.OpUnmap},
		mapping.Or(vmmtest.Ops(vmmtest.OpCreate)).List())
	require.Empty(t, vmmtest.Ops().List())
	require.Panics(t, func() { vmmtest.Ops("Mapp") }, "a name that is no operation")

	type mapper interface {
		Map(ptr vmm.DevicePtr, size uint64, h vmm.Handle, offset uint64) error
		Backend() string
	}
	require.Equal(t, []vmmtest.Op{vmmtest.OpMap}, vmmtest.OpsOf[mapper]().List())
	require.Equal(t, ops, vmmtest.OpsOf[vmm.Driver]().Or(vmmtest.DataOps()).Or(vmmtest.SharingOps()).List())
	require.Panics(t, func() { vmmtest.OpsOf[int]() })

	categories := map[string]vmmtest.Where{"device": vmmtest.DeviceOps(), "range": vmmtest.RangeOps(),
		"page": vmmtest.PageOps(), "sharing": vmmtest.SharingOps(), "stream": vmmtest.StreamOps(),
		"data": vmmtest.DataOps(), "plain": vmmtest.PlainOps()}
	in := map[vmmtest.Op]string{}
	for name, w := range categories {
		require.NotEmpty(t, w.List(), name)
		for _, op := range w.List() {
			require.Empty(t, in[op], "%s is in categories %s and %s", op, in[op], name)
			in[op] = name
		}
	}
	require.True(t, vmmtest.PageOps().Has(vmmtest.OpSetAccess), "SetAccess is a vmm.Pages method")
	require.True(t, vmmtest.RangeOps().Has(vmmtest.OpReserve))
	require.True(t, vmmtest.StreamOps().Has(vmmtest.OpEventRecord))
	require.Empty(t, in[vmmtest.OpClose])
}

// TestWhenCounts checks the counting Whens and their combinators on one
// operation.
func TestWhenCounts(t *testing.T) {
	for _, c := range []struct {
		name  string
		when  vmmtest.When
		calls int
		want  []int
	}{
		{"OnNth", vmmtest.OnNth(3), 10, []int{3}},
		{"EveryNth", vmmtest.EveryNth(3), 10, []int{3, 6, 9}},
		{"Always", vmmtest.Always(), 3, []int{1, 2, 3}},
		{"zero", vmmtest.When{}, 3, []int{1, 2, 3}},
		{"Times", vmmtest.EveryNth(2).Times(2), 10, []int{2, 4}},
		{"Once", vmmtest.EveryNth(3).Once(), 10, []int{3}},
		{"And", vmmtest.EveryNth(2).And(vmmtest.EveryNth(3)), 13, []int{6, 12}},
		{"Or", vmmtest.EveryNth(2).Or(vmmtest.EveryNth(3)), 10, []int{2, 3, 4, 6, 8, 9, 10}},
		{"Not", vmmtest.EveryNth(2).Not(), 6, []int{1, 3, 5}},
		{"Then", vmmtest.OnNth(2).Then(vmmtest.Always()), 5, []int{2, 3, 4, 5}},
		{"Then restarts", vmmtest.OnNth(2).Then(vmmtest.OnNth(2)), 8, []int{2, 4}},
		{"Times of Then", vmmtest.OnNth(2).Then(vmmtest.Always()).Times(3), 8, []int{2, 3, 4}},
		{"WhenFunc", vmmtest.WhenFunc(func(c vmmtest.Call) bool { return c.N > 4 }), 6, []int{5, 6}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := openFaulty(t)
			f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDeviceCount), When: c.when})
			require.Equal(t, c.want, failing(t, f, vmmtest.OpDeviceCount, c.calls))
			require.Equal(t, c.calls, f.Calls(vmmtest.OpDeviceCount))
		})
	}
	require.Panics(t, func() { vmmtest.OnNth(0) })
	require.Panics(t, func() { vmmtest.EveryNth(0) })
	require.Panics(t, func() { vmmtest.Always().Times(0) })
	require.Panics(t, func() { vmmtest.WithProbability(1.5, 1) })
}

// TestWhenStartsWhenArmed: counts start when the injector is armed, the
// call numbers of errors and of Call.N since Reset.
func TestWhenStartsWhenArmed(t *testing.T) {
	f := openFaulty(t)
	require.Empty(t, failing(t, f, vmmtest.OpDeviceCount, 3))
	when := vmmtest.OnNth(2)
	f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDeviceCount), When: when})
	require.Equal(t, []int{5}, failing(t, f, vmmtest.OpDeviceCount, 3))
	// The same When arms a second injector with its own count.
	f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDeviceCount), When: when})
	require.Equal(t, []int{8}, failing(t, f, vmmtest.OpDeviceCount, 3))
	f.Reset()
	require.Empty(t, failing(t, f, vmmtest.OpDeviceCount, 3), "Reset disarms")
}

func TestWhenWithProbability(t *testing.T) {
	run := func(seed uint64, p float64, calls int) []int {
		f := openFaulty(t)
		f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDeviceCount), When: vmmtest.WithProbability(p, seed)})
		return failing(t, f, vmmtest.OpDeviceCount, calls)
	}
	a := run(7, 0.5, 200)
	require.Equal(t, a, run(7, 0.5, 200), "the same seed fails the same calls")
	require.NotEqual(t, a, run(8, 0.5, 200), "another seed fails others")
	require.Empty(t, run(7, 0, 100))
	require.Len(t, run(7, 1, 100), 100)
	n := len(run(3, 0.25, 4000))
	require.InDelta(t, 1000, n, 150, "failures of 4000 calls at p = 0.25")
}

// TestWhenAfter drives After with a clock the test sets.
func TestWhenAfter(t *testing.T) {
	f := openFaulty(t)
	var now atomic.Int64 // seconds
	f.SetClock(func() time.Time { return time.Unix(now.Load(), 0) })
	now.Store(100)
	var seen []time.Time
	f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDeviceCount), When: vmmtest.After(time.Minute)},
		vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDriverVersion), When: vmmtest.WhenFunc(func(c vmmtest.Call) bool {
			seen = append(seen, c.Time)
			return false
		})})
	require.Empty(t, failing(t, f, vmmtest.OpDeviceCount, 2))
	now.Store(159)
	require.Empty(t, failing(t, f, vmmtest.OpDeviceCount, 1))
	now.Store(160)
	require.Equal(t, []int{4, 5}, failing(t, f, vmmtest.OpDeviceCount, 2))
	require.Empty(t, failing(t, f, vmmtest.OpDriverVersion, 1))
	require.Equal(t, []time.Time{time.Unix(160, 0)}, seen, "Call.Time is the clock's")
}

// TestWhenAfterFailureOf chains a failure of one operation to another's.
func TestWhenAfterFailureOf(t *testing.T) {
	f := openFaulty(t)
	f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDriverVersion), When: vmmtest.OnNth(2)},
		vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDeviceCount), When: vmmtest.AfterFailureOf(vmmtest.Ops(vmmtest.OpDriverVersion))})
	require.Empty(t, failing(t, f, vmmtest.OpDeviceCount, 2))
	require.Equal(t, []int{2}, failing(t, f, vmmtest.OpDriverVersion, 3))
	require.Equal(t, []int{3, 4}, failing(t, f, vmmtest.OpDeviceCount, 2))

	f.Reset()
	f.FailNthThen(vmmtest.OpDeviceCount, 2, vmmtest.OpDriverVersion)
	require.Empty(t, failing(t, f, vmmtest.OpDriverVersion, 1), "before the first failure")
	require.Equal(t, []int{2}, failing(t, f, vmmtest.OpDeviceCount, 3))
	require.Equal(t, []int{2}, failing(t, f, vmmtest.OpDriverVersion, 3), "the next call after it, once")

	f.Reset()
	f.FailNthThen(vmmtest.OpDeviceCount, 1, vmmtest.OpDeviceCount)
	require.Equal(t, []int{1, 2}, failing(t, f, vmmtest.OpDeviceCount, 4), "an op chained to itself fails the call after")
}

// TestWhenPerOp: counts are of the calls an injector sees, of all its
// operations together, unless PerOp gives each its own; Calls and the call
// numbers of errors are per operation.
func TestWhenPerOp(t *testing.T) {
	both := vmmtest.Ops(vmmtest.OpDeviceCount, vmmtest.OpDriverVersion)
	for _, c := range []struct {
		name     string
		when     vmmtest.When
		failures []string
	}{
		{"together", vmmtest.OnNth(2), []string{"DriverVersion#1"}},
		{"PerOp", vmmtest.PerOp(vmmtest.OnNth(2)), []string{"DeviceCount#2", "DriverVersion#2"}},
		{"PerOp Once", vmmtest.PerOp(vmmtest.Always().Once()), []string{"DeviceCount#1", "DriverVersion#1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := openFaulty(t)
			f.Inject(vmmtest.Injector{Where: both, When: c.when})
			f.FailNth(vmmtest.OpMemInfo, 2, nil)
			var got []string
			for _, op := range []vmmtest.Op{vmmtest.OpDeviceCount, vmmtest.OpDriverVersion, vmmtest.OpMemInfo,
				vmmtest.OpDeviceCount, vmmtest.OpDriverVersion, vmmtest.OpDeviceCount, vmmtest.OpDriverVersion} {
				var inj *vmmtest.InjectedError
				if errors.As(callOp(t, f, op), &inj) && inj.Op != vmmtest.OpMemInfo {
					got = append(got, string(inj.Op)+"#"+string(rune('0'+inj.Call)))
				}
			}
			require.Equal(t, c.failures, got)
			require.Equal(t, 3, f.Calls(vmmtest.OpDeviceCount))
			require.Equal(t, 3, f.Calls(vmmtest.OpDriverVersion))
			require.Equal(t, 1, f.Calls(vmmtest.OpMemInfo))
			require.ErrorIs(t, callOp(t, f, vmmtest.OpMemInfo), vmmtest.ErrInjected,
				"the second MemInfo fails, whatever came between")
		})
	}
}

// TestInjectorOrder: every injector sees every call of its operations, and
// the last one armed that fires gives the error.
func TestInjectorOrder(t *testing.T) {
	f := openFaulty(t)
	first, second := errors.New("first"), errors.New("second")
	dc := vmmtest.Ops(vmmtest.OpDeviceCount)
	f.Inject(vmmtest.Injector{Where: dc, When: vmmtest.OnNth(1), Err: first},
		vmmtest.Injector{Where: dc, When: vmmtest.OnNth(2), Err: second},
		vmmtest.Injector{Where: dc, When: vmmtest.OnNth(3)})
	f.FailNth(vmmtest.OpDeviceCount, 3, vmm.ErrInUse)
	_, err := f.DeviceCount()
	require.ErrorIs(t, err, first)
	_, err = f.DeviceCount()
	require.ErrorIs(t, err, second, "the second injector counted the call the first failed")
	_, err = f.DeviceCount()
	require.ErrorIs(t, err, vmm.ErrInUse, "the last armed wins")
	require.NotErrorIs(t, err, vmmtest.ErrInjected)
	_, err = f.DeviceCount()
	require.NoError(t, err)

	f.Reset()
	f.Inject(vmmtest.Injector{Where: vmmtest.PlainOps().Or(vmmtest.PageOps()), When: vmmtest.Always()})
	_, err = f.MemAlloc(0, 4096)
	require.ErrorIs(t, err, vmm.ErrOutOfMemory, "the default cause follows the operation failed")
	_, err = f.DeviceCount()
	require.NoError(t, err, "outside the Where")
}

// TestFaultyConcurrentProbability: callers racing through Faulty see the
// same failures, by call number, as one caller does: the injectors judge
// the calls one at a time in the order they arrive.
func TestFaultyConcurrentProbability(t *testing.T) {
	const workers, calls, seed = 8, 100, 11
	inject := func(f *vmmtest.Faulty) {
		f.Inject(vmmtest.Injector{Where: vmmtest.DeviceOps(), When: vmmtest.PerOp(vmmtest.WithProbability(0.3, seed))},
			vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpMemInfo), When: vmmtest.EveryNth(7).Times(20)})
	}
	ops := []vmmtest.Op{vmmtest.OpDeviceCount, vmmtest.OpMemInfo}
	want := map[vmmtest.Op][]int{}
	f := openFaulty(t)
	inject(f)
	for _, op := range ops {
		want[op] = failing(t, f, op, workers*calls/2)
	}

	f.Reset()
	inject(f)
	var mu sync.Mutex
	got := map[vmmtest.Op][]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				op := ops[(w+i)%2]
				var err error
				if op == vmmtest.OpDeviceCount {
					_, err = f.DeviceCount()
				} else {
					_, _, err = f.MemInfo(0)
				}
				var inj *vmmtest.InjectedError
				if errors.As(err, &inj) {
					mu.Lock()
					got[op] = append(got[op], inj.Call)
					mu.Unlock()
				} else if err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Go(func() { // arming and reading meanwhile
		for range calls {
			f.Inject(vmmtest.Injector{Where: vmmtest.Ops(vmmtest.OpDriverVersion), When: vmmtest.OnNth(1)})
			_ = f.Calls(vmmtest.OpDeviceCount)
		}
	})
	wg.Wait()
	for _, op := range ops {
		slices.Sort(got[op])
		require.Equal(t, want[op], got[op], "%s", op)
		require.Equal(t, workers*calls/2, f.Calls(op))
	}
	require.NotEmpty(t, want[vmmtest.OpDeviceCount])
	require.Greater(t, len(want[vmmtest.OpMemInfo]), 20)
}
