//go:build race

package core

import "sync"

// heapLock is sync.Mutex under the race detector, which cannot see the
// release store of heaplock.go as synchronisation.
type heapLock struct{ sync.Mutex }

// counts is heaplock.go's: a sync.Mutex is never biased.
func (l *heapLock) counts() (biases, revokes uint64) { return 0, 0 }
