package spec

import (
	"fmt"
	"math"

	"github.com/xseg-dev/xseg/vmm"
)

// ErrPaused: the tag is paused. An allocation in a paused tag fails with
// an error matching it (and vmm.ErrInvalid) until the tag is resumed.
var ErrPaused = fmt.Errorf("the tag is paused (resume it first): %w", vmm.ErrInvalid)

// ErrCapturing: a CUDA graph capture is underway on the device (a private
// pool is active), so the call, which would wait for the device or unmap
// pages, is refused; nothing changed. It matches vmm.ErrInUse.
var ErrCapturing = fmt.Errorf("a CUDA graph capture is underway (a private pool is active): %w", vmm.ErrInUse)

// TagPoolFirst is PoolID.First of every tag's private pool: tags number
// their pools (TagPoolFirst, 1), (TagPoolFirst, 2), ... in the order they
// are made, apart from the ids PyTorch hands out, which count up from
// zero.
const TagPoolFirst = math.MaxUint64

// IsTag reports whether id is in the range of ids that tags' pools take.
func (id PoolID) IsTag() bool { return id.First == TagPoolFirst }

// TagStats are the statistics of one tag: a named private pool whose
// physical memory can be given back (paused) and mapped again at the same
// addresses (resumed).
type TagStats struct {
	Name string `json:"name"`
	// ID is the tag's private pool.
	ID PoolID `json:"id"`
	// Paused reports whether the tag is paused now; Backup whether that
	// pause kept a host copy of the tag's allocated blocks.
	Paused bool `json:"paused"`
	Backup bool `json:"backup"`
	// ReservedBytes is the bytes of pages mapped for the tag now: 0 while
	// paused. PausedBytes is what Resume maps again (0 while live): the
	// pages the tag's allocated blocks are in, or every page it had mapped
	// for a tag a capture was routed to; the free pages the pause gave
	// back for good are in neither.
	ReservedBytes uint64 `json:"reserved_bytes"`
	PausedBytes   uint64 `json:"paused_bytes"`
	// AllocatedBytes and Allocations are the tag's allocated blocks, which
	// keep their addresses across a pause.
	AllocatedBytes uint64 `json:"allocated_bytes"`
	Allocations    int64  `json:"allocations"`
	// BackupBytes is the host memory the current pause's backup holds.
	BackupBytes uint64 `json:"backup_bytes"`
	// Pauses counts the pauses of the tag; Remaps the resumes that mapped
	// its pages again. Addresses stay, physical pages do not: whoever
	// registered the tag's memory with something that holds on to pages
	// (an NCCL buffer registration, an IB memory region) registers again
	// when Remaps has moved.
	Pauses int64 `json:"pauses"`
	Remaps int64 `json:"remaps"`
}
