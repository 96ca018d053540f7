package core

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Issue 15 item 10: the OOM backoff doubled without a cap (100 ms and 20
// retries slept 29 hours in one Alloc) and at 40 retries the shift
// overflowed to a negative delay. Each delay is now capped at the smaller
// of 5 s and 50 times the base, for any retry count.
func TestBackoffDelayBounded(t *testing.T) {
	for _, base := range []time.Duration{time.Nanosecond, time.Millisecond, 100 * time.Millisecond, time.Second, time.Hour, math.MaxInt64} {
		limit := min(5*time.Second, 50*base)
		if base > 5*time.Second {
			limit = 5 * time.Second
		}
		prev := time.Duration(0)
		for _, i := range []int{0, 1, 2, 5, 10, 20, 39, 40, 63, 64, 100, 1000, math.MaxInt} {
			d := BackoffDelay(base, i)
			require.Positive(t, d, "base %v retry %d", base, i)
			require.LessOrEqual(t, d, limit, "base %v retry %d", base, i)
			require.GreaterOrEqual(t, d, prev, "base %v retry %d: never shorter than before", base, i)
			prev = d
		}
		require.Equal(t, limit, BackoffDelay(base, 1000))
	}
	require.Equal(t, 100*time.Millisecond, BackoffDelay(100*time.Millisecond, 0))
	require.Equal(t, 400*time.Millisecond, BackoffDelay(100*time.Millisecond, 2))
	require.Equal(t, 5*time.Second, BackoffDelay(100*time.Millisecond, 20))
	require.Equal(t, 50*time.Millisecond, BackoffDelay(time.Millisecond, 40))
	require.Zero(t, BackoffDelay(0, 10))
}
