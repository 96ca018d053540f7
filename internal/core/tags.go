package core

import (
	"fmt"
	"slices"
	"unicode/utf8"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Tags name memory that can be paused: its physical pages given back while
// its addresses stay reserved, and mapped again later at the same
// addresses (pause.go).
//
// A tag is a private pool with a name. Tag(name) makes the pool the first
// time, in the id range spec.TagPoolFirst that PyTorch's pool ids never
// reach, and holds one use of it that is never released, so a tag lives
// as long as the Heap. Allocations reach it as they reach any private
// pool: AllocInPool with its id, or every allocation whose stream a route
// accepts while BeginAllocateToPool(id) is active (a region, or a CUDA
// graph captured into the tag). Because it is a private pool, its pages
// are never unmapped while it is live: not by EmptyCache, the OOM policy,
// page stealing or the release threshold; only Pause gives them back.

// ErrPaused is spec.ErrPaused.
var ErrPaused = spec.ErrPaused

// maxTagName bounds a tag's name in bytes (the C API passes names as C
// strings; nothing needs longer ones).
const maxTagName = 256

// tagState is what a tag's pool holds besides a private pool's books.
type tagState struct {
	name string
	// pause is the current pause, nil while the tag is live.
	pause *pauseState
	// pauses and remaps count pauses and the resumes that mapped pages
	// again (spec.TagStats).
	pauses, remaps int64
	// routed is whether BeginAllocateToPool ever routed allocations to
	// the tag (a CUDA graph captured into it, say, which addresses its
	// free blocks on replay): then Pause keeps the free pages' addresses
	// and Resume maps them again; else Pause gives them back for good.
	routed bool
}

// paused reports whether pp is a paused tag's pool. pp may be nil.
func (pp *privatePool) paused() bool { return pp != nil && pp.tag != nil && pp.tag.pause != nil }

func (pp *privatePool) pausedError(rs uint64) error {
	return fmt.Errorf("allocating %d bytes in tag %q: %w", rs, pp.tag.name, ErrPaused)
}

// Tag returns the id of the private pool of tag name, making the tag if it
// does not exist. A name is 1 to 256 bytes of UTF-8 without NUL.
func (h *Heap) Tag(name string) (PoolID, error) {
	if err := checkTagName(name); err != nil {
		return PoolID{}, err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return PoolID{}, fmt.Errorf("making tag %q: %w", name, vmm.ErrClosed)
	}
	if pp := h.mu.tags[name]; pp != nil {
		return pp.id, nil
	}
	h.mu.nextTag++
	id := PoolID{First: spec.TagPoolFirst, Second: h.mu.nextTag}
	pp := h.retainLocked(id)
	pp.tag = &tagState{name: name}
	if h.mu.tags == nil {
		h.mu.tags = make(map[string]*privatePool)
	}
	h.mu.tags[name] = pp
	return id, nil
}

func checkTagName(name string) error {
	if name == "" || len(name) > maxTagName || !utf8.ValidString(name) || slices.Contains([]byte(name), 0) {
		return fmt.Errorf("tag name %q: want 1 to %d bytes of UTF-8 without NUL: %w", name, maxTagName, vmm.ErrInvalid)
	}
	return nil
}

// Tags returns the names of the tags, sorted.
func (h *Heap) Tags() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tagNamesLocked()
}

func (h *Heap) tagNamesLocked() []string {
	names := make([]string, 0, len(h.mu.tags))
	for name := range h.mu.tags {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// tagPoolsLocked returns the pools of the named tags, in the order named,
// or of every tag, by name, when none is named. An unknown name is
// vmm.ErrInvalid.
func (h *Heap) tagPoolsLocked(what string, names []string) ([]*privatePool, error) {
	if h.mu.closed {
		return nil, fmt.Errorf("%s tags %q: %w", what, names, vmm.ErrClosed)
	}
	if len(names) == 0 {
		names = h.tagNamesLocked()
	}
	pools := make([]*privatePool, 0, len(names))
	for _, name := range names {
		pp := h.mu.tags[name]
		if pp == nil {
			return nil, fmt.Errorf("%s tag %q: no such tag: %w", what, name, vmm.ErrInvalid)
		}
		if !slices.Contains(pools, pp) {
			pools = append(pools, pp)
		}
	}
	return pools, nil
}

// TagStats returns the statistics of tag name.
func (h *Heap) TagStats(name string) (spec.TagStats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.mu.closed {
		return spec.TagStats{}, fmt.Errorf("statistics of tag %q: %w", name, vmm.ErrClosed)
	}
	pp := h.mu.tags[name]
	if pp == nil {
		return spec.TagStats{}, fmt.Errorf("statistics of tag %q: no such tag: %w", name, vmm.ErrInvalid)
	}
	ts := spec.TagStats{Name: name, ID: pp.id, Pauses: pp.tag.pauses, Remaps: pp.tag.remaps}
	forPoolBlocks(pp, func(b *block) {
		if b.state == stAllocated {
			ts.AllocatedBytes += b.size
			ts.Allocations++
		}
	})
	if p := pp.tag.pause; p != nil {
		ts.Paused, ts.Backup, ts.PausedBytes = true, p.backup != nil, p.bytes
		for _, data := range p.backup {
			ts.BackupBytes += uint64(len(data))
		}
	} else {
		ts.ReservedBytes = poolMapped(pp)
	}
	return ts, nil
}

// TagSet is the tag half of an allocator's API (the root package's
// xseg.Tagger), over a Heap. Both allocators embed it; Pause and Resume
// need a Backing that is a Pauser (the expandable allocator's).
type TagSet struct{ h *Heap }

// NewTagSet returns the tags of h.
func NewTagSet(h *Heap) TagSet { return TagSet{h: h} }

// Tag returns the private pool of tag name, making the tag if need be.
func (t TagSet) Tag(name string) (PoolID, error) { return t.h.Tag(name) }

// Tags returns the names of the tags, sorted.
func (t TagSet) Tags() []string { return t.h.Tags() }

// TagStats returns the statistics of tag name.
func (t TagSet) TagStats(name string) (spec.TagStats, error) { return t.h.TagStats(name) }

// Pause gives back the physical memory of the named tags (every tag when
// none is named), keeping a host copy of their allocated blocks if backup.
func (t TagSet) Pause(backup bool, tags ...string) error { return t.h.Pause(backup, tags...) }

// Resume maps the named paused tags (every paused tag when none is named)
// again at their addresses.
func (t TagSet) Resume(tags ...string) error { return t.h.Resume(tags...) }

// verifyTagsLocked checks the tags' books (check.go): every tag's pool is
// the pool of its id, in the tags' id range, and holds its own use; every
// pool in that range is a tag's.
func (h *Heap) verifyTagsLocked() error {
	for name, pp := range h.mu.tags {
		if pp.tag == nil || pp.tag.name != name || h.mu.pools[pp.id] != pp || !pp.id.IsTag() || pp.uses < 1 {
			return fmt.Errorf("tag %q: pool %v is not its own (uses %d)", name, pp.id, pp.uses)
		}
	}
	for id, pp := range h.mu.pools {
		if id.IsTag() != (pp.tag != nil) || (pp.tag != nil && h.mu.tags[pp.tag.name] != pp) {
			return fmt.Errorf("pool %v: in the tags' id range %v, a tag's pool %v", id, id.IsTag(), pp.tag != nil)
		}
	}
	return nil
}
