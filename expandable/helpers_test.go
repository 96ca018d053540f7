package expandable

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// newAlloc makes an allocator over d that the test closes at its end.
func newAlloc(t testing.TB, d vmm.Driver, cfg Config) *Allocator {
	t.Helper()
	a, err := New(d, 0, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// hostOpen opens a host driver the caller closes, for tests that check
// leaks themselves.
func hostOpen(capacity uint64) (*host.Driver, error) {
	return host.Open(host.Options{Capacity: capacity})
}

// underPolicies runs f as a subtest under the default page policy and
// under the classic one (PyTorch's expandable segments' layout).
func underPolicies(t *testing.T, f func(t *testing.T, cfg Config)) {
	t.Helper()
	for _, p := range []struct {
		name string
		cfg  Config
	}{{"default", DefaultConfig()}, {"classic", ClassicConfig()}} {
		t.Run(p.name, func(t *testing.T) { f(t, p.cfg) })
	}
}
