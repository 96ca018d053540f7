package fallback

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// newAlloc makes an allocator over d that the test closes at its end.
func newAlloc(t testing.TB, d vmm.Driver, cfg Config) *Allocator {
	t.Helper()
	a, err := New(d, 0, cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()) })
	return a
}

// segmentSizes lists the sizes of a's segments in address order.
func segmentSizes(a *Allocator) []uint64 {
	var out []uint64
	for _, s := range a.Snapshot().Segments {
		out = append(out, s.Reserved)
	}
	return out
}
