package xseg

import (
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// TagStats are the statistics of one tag (see spec.TagStats).
type TagStats = spec.TagStats

// ErrPaused: the tag is paused. Allocating in a paused tag fails with an
// error matching it and vmm.ErrInvalid.
var ErrPaused = spec.ErrPaused

// ErrNotAllocated: the pointer is not the start of a block the allocator
// has handed out; RecordStream's error for it matches ErrNotAllocated
// and vmm.ErrInvalid.
var ErrNotAllocated = spec.ErrNotAllocated

// ErrCapturing is spec.ErrCapturing: a CUDA graph capture is underway, so
// a call that would wait or unmap (EmptyCache) is refused.
var ErrCapturing = spec.ErrCapturing

// Tagger is pause and resume at stable addresses: the physical memory of
// tagged allocations goes back to the device while their addresses stay
// reserved, and comes back at the same addresses, so pointers held
// anywhere (kernel arguments, CUDA graphs captured earlier) stay valid.
// It is what vLLM's CuMemAllocator (sleep / wake_up) and
// torch_memory_saver (pause / resume) do for RL post-training and
// inference servers that hand GPUs back and forth.
//
// A tag is a private pool with a name (see Pools). Tag makes it and
// returns its id: AllocInPool with the id allocates in the tag, and
// BeginAllocateToPool with the id routes the allocations of a region, or
// of a CUDA graph capture, into it. Its pages are never given back while
// it is live (not by EmptyCache, the OOM policy or a release threshold),
// only by Pause.
//
// Pause(backup, tags...) pauses the named tags (all when none is named):
// it waits for all work on the device, copies the requested bytes of the
// tags' allocated blocks to host memory if backup, then gives back to the
// driver the tags' whole free pages for good (as EmptyCache does a
// shared pool's; it releases the allocator's page cache too) and unmaps
// and releases every page left. Blocks stay allocated at their
// addresses; ReservedBytes drops by the pages given back. Allocating in a
// paused tag fails with ErrPaused; freeing a block of a paused tag works
// (the block is not restored). Resume(tags...) maps new pages at the same
// addresses, the runs the pause unmapped (the pages allocated blocks are
// in), granting the device and every peer enabled with EnablePeerAccess
// access, and copies the backup back; without backup the bytes are
// unspecified (zero on the host backend). A tag that BeginAllocateToPool
// ever made active keeps its free pages' addresses instead: Pause unmaps
// them with the rest and Resume maps them again (see CUDA graphs below). Both are idempotent: pausing a paused tag or resuming a live
// one does nothing. Each tag is paused or resumed fully or not at all:
// after an error, TagStats says which; a failed Resume leaves the tag
// paused with its backup, and can be retried.
//
// Memory shared with other processes: Pause refuses, with an error
// matching vmm.ErrInUse that names the block, a tag with a block pinned
// for sharing (PinBlock, ipc.Exporter): the importer maps the same
// physical pages, which pausing would neither free nor keep coherent.
// Unshare it first.
//
// CUDA graphs: a graph captured into a tag (BeginAllocateToPool with the
// tag's id) replays after Resume, since every address it was captured
// with, its free temporaries' included, is mapped again; without backup,
// the graph's inputs and temporaries must be written again first. Pause
// and Resume fail with ErrCapturing (which matches vmm.ErrInUse) while a
// capture (an active pool) is underway.
//
// Remapping: the addresses stay, the physical pages do not. TagStats
// counts the resumes (Remaps); whoever registered the memory with
// something that holds on to pages (NCCL buffer registration, RDMA memory
// regions) registers it again when Remaps has moved.
//
// The backup is plain Go memory: on CUDA a copy to pinned (page-locked)
// host memory would go at full PCIe speed, pageable memory goes at a
// fraction of it. Pause and Resume hold the allocator's lock while they
// copy: other calls wait.
//
// The expandable allocator has it all; the fallback allocator has tags
// and their statistics, but its Pause and Resume fail with
// vmm.ErrNotSupported (a plain allocation cannot be mapped again at its
// address). After Close, Pause and Resume fail with vmm.ErrClosed. Safe
// for concurrent use.
type Tagger interface {
	// Tag returns the id of the private pool of tag name, making the tag
	// if it does not exist. A name is 1 to 256 bytes of UTF-8 without NUL.
	Tag(name string) (PoolID, error)
	// Tags returns the names of the tags, sorted.
	Tags() []string
	// TagStats returns the statistics of tag name.
	TagStats(name string) (TagStats, error)
	// Pause pauses the named tags, every tag when none is named.
	Pause(backup bool, tags ...string) error
	// Resume resumes the named tags, every paused tag when none is named.
	Resume(tags ...string) error
}

var _ Tagger = (*DeviceAllocator)(nil)

// Tag returns the id of the private pool of tag name, making the tag if
// need be (see Tagger).
func (a *DeviceAllocator) Tag(name string) (PoolID, error) { return a.e.Tag(name) }

// Tags returns the names of the tags, sorted.
func (a *DeviceAllocator) Tags() []string { return a.e.Tags() }

// TagStats returns the statistics of tag name.
func (a *DeviceAllocator) TagStats(name string) (TagStats, error) { return a.e.TagStats(name) }

// Pause gives back the physical memory of the named tags (every tag when
// none is named), keeping a host copy of their blocks if backup (see
// Tagger).
func (a *DeviceAllocator) Pause(backup bool, tags ...string) error { return a.e.Pause(backup, tags...) }

// Resume maps the named tags (every paused tag when none is named) again
// at their addresses and restores their backup (see Tagger).
func (a *DeviceAllocator) Resume(tags ...string) error { return a.e.Resume(tags...) }

// Tagged is a handle on one tag of a DeviceAllocator. It is a small
// value, safe to copy and to use from many goroutines.
type Tagged struct {
	a    *DeviceAllocator
	name string
	id   PoolID
}

// Tagged returns a handle on tag name, making the tag if need be.
func (a *DeviceAllocator) Tagged(name string) (Tagged, error) {
	id, err := a.Tag(name)
	if err != nil {
		return Tagged{}, err
	}
	return Tagged{a: a, name: name, id: id}, nil
}

// Name is the tag's name.
func (t Tagged) Name() string { return t.name }

// ID is the tag's private pool.
func (t Tagged) ID() PoolID { return t.id }

// Alloc returns a block of at least size bytes in the tag, for use on
// stream s. In a paused tag it fails with ErrPaused.
func (t Tagged) Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	return t.a.AllocInPool(t.id, size, s)
}

// Free gives a block back: DeviceAllocator.Free, for blocks of any tag or
// none; a block of a paused tag can be freed.
func (t Tagged) Free(ptr vmm.DevicePtr) error { return t.a.Free(ptr) }

// Pause pauses the tag (see Tagger).
func (t Tagged) Pause(backup bool) error { return t.a.Pause(backup, t.name) }

// Resume resumes the tag (see Tagger).
func (t Tagged) Resume() error { return t.a.Resume(t.name) }

// Stats returns the tag's statistics.
func (t Tagged) Stats() (TagStats, error) { return t.a.TagStats(t.name) }
