//go:build !race

package core

// releaseStore stores v at p with a plain MOV: on amd64 a store is never
// reordered before earlier loads or stores, so it releases what the
// holder wrote, without the locked instruction sync/atomic's Store is.
//
//go:noescape
func releaseStore(p *uint32, v uint32)
