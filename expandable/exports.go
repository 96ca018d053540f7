package expandable

import (
	"fmt"
	"sync"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// exports keeps the posix fd each shared physical allocation was exported
// as, so that sharing it again costs a dup instead of an export (the
// driver's export of a 1 GiB allocation takes most of a millisecond). An
// entry lives exactly as long as its allocation: pages.release drops it
// when the driver has released the handle, for the driver may hand out the
// same handle number for a new allocation afterwards, and the kept fd
// would hold the old memory. Only pinned allocations are exported, and a
// pinned allocation is never released, so an entry cannot go while a
// share is being made of it. Its own lock: exports happen outside the
// Heap's lock, releases under it.
type exports struct {
	mu  sync.Mutex
	fds map[vmm.Handle]*handles.FD
}

// exportFD returns a new fd of allocation h (the caller's to close): a dup
// of the kept export, exporting h first if it has none.
func (p *pages) exportFD(h vmm.Handle) (int, error) {
	e := &p.exports
	e.mu.Lock()
	defer e.mu.Unlock()
	kept := e.fds[h]
	if kept == nil {
		raw, err := p.d.ExportFD(h)
		if err != nil {
			return -1, err
		}
		if kept, err = handles.NewFD(raw); err != nil {
			return -1, err
		}
		if e.fds == nil {
			e.fds = make(map[vmm.Handle]*handles.FD)
		}
		e.fds[h] = kept
	}
	dup, err := kept.Dup()
	if err != nil {
		return -1, fmt.Errorf("duplicating the kept export of allocation %#x: %w", uint64(h), err)
	}
	return dup.Disown(), nil
}

// release releases allocation h and then closes its kept export, if any.
// If the driver fails, h is still live and keeps its export. Once the
// driver has released h the call succeeds: the caller must not keep h, and
// close(2) frees the fd number even when it reports an error.
func (p *pages) release(h vmm.Handle) error {
	if err := p.d.Release(h); err != nil {
		return err
	}
	e := &p.exports
	e.mu.Lock()
	kept := e.fds[h]
	delete(e.fds, h)
	e.mu.Unlock()
	if kept != nil {
		_ = kept.Close()
	}
	return nil
}

// keptExports is how many allocations have a kept export (for tests).
func (p *pages) keptExports() int {
	p.exports.mu.Lock()
	defer p.exports.mu.Unlock()
	return len(p.exports.fds)
}
