//go:build !race && !amd64

package core

import "sync/atomic"

// releaseStore stores v at p; without amd64's store ordering it takes
// sync/atomic's store.
func releaseStore(p *uint32, v uint32) { atomic.StoreUint32(p, v) }
