package fallback

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// TestFaultMatrix fails every driver operation of the fallback
// allocator's alloc, empty-cache and close paths, alone and with the
// operation that undoes it; after each case Close reaches nil and nothing
// is held.
func TestFaultMatrix(t *testing.T) {
	scenario := func(name string, setup, act func(a *Allocator) error, again bool) vmmtest.Scenario {
		return vmmtest.Scenario{Name: name, Setup: func(d vmm.Driver) (vmmtest.Subject, error) {
			cfg := DefaultConfig()
			cfg.OOMMaxRetries = 0
			a, err := New(d, 0, cfg, nil)
			if err != nil {
				return vmmtest.Subject{}, err
			}
			if err := setup(a); err != nil {
				return vmmtest.Subject{}, errors.Join(err, a.Close())
			}
			s := vmmtest.Subject{Act: func() error { return act(a) }, Close: a.Close}
			if again {
				s.Again = a.EmptyCache
			}
			return s, nil
		}}
	}
	var held []vmm.DevicePtr
	allocs := func(a *Allocator) error {
		held = held[:0]
		for _, size := range []uint64{4096, 3 << 20, 12 << 20, 64 << 20} {
			p, err := a.Alloc(size, 0)
			if err != nil {
				return err
			}
			held = append(held, p)
		}
		return nil
	}
	none := func(*Allocator) error { return nil }
	freeSome := func(a *Allocator) error { return errors.Join(allocs(a), a.Free(held[1]), a.Free(held[3])) }
	scenarios := []vmmtest.Scenario{
		scenario("alloc", none, allocs, true),
		scenario("empty-cache", freeSome, func(a *Allocator) error { return a.EmptyCache() }, true),
		scenario("close", freeSome, func(a *Allocator) error { return a.Close() }, false),
	}
	n := vmmtest.RunMatrix(t, func() (vmm.Driver, error) { return host.Open(host.Options{Capacity: 1 << 30}) }, scenarios)
	require.Greater(t, n, 10)
	if !t.Failed() {
		t.Logf("fault matrix: %d cases, 0 leaks", n)
	}
}
