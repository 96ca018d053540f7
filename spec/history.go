package spec

import "github.com/xseg-dev/xseg/vmm"

// The actions of history events, with PyTorch's names.
const (
	// ActionAlloc: a block was handed out.
	ActionAlloc = "alloc"
	// ActionFreeRequested: the caller freed a block.
	ActionFreeRequested = "free_requested"
	// ActionFreeCompleted: a freed block became reusable: at the free, or
	// once the work of the other streams that used it completed (and the
	// last pin of a shared block went).
	ActionFreeCompleted = "free_completed"
	// ActionSegmentMap and ActionSegmentUnmap: physical pages were mapped
	// into or unmapped from a segment's range (expandable allocator).
	ActionSegmentMap   = "segment_map"
	ActionSegmentUnmap = "segment_unmap"
	// ActionSegmentAlloc and ActionSegmentFree: a segment that is one
	// plain allocation (fallback allocator) was made or freed.
	ActionSegmentAlloc = "segment_alloc"
	ActionSegmentFree  = "segment_free"
	// ActionOOM: an allocation failed for want of memory; Size is the
	// request, DeviceFree the device's free memory then.
	ActionOOM = "oom"
)

// MaxHistoryEntries bounds RecordHistory's maxEntries.
const MaxHistoryEntries = 1 << 24

// HistoryEvent is one event of the allocation history. Size is the
// block's rounded size for block events, the run's length for segment
// events and the request for ActionOOM.
type HistoryEvent struct {
	Action string        `json:"action"`
	Addr   vmm.DevicePtr `json:"addr"`
	Size   uint64        `json:"size"`
	Stream vmm.Stream    `json:"stream"`
	TimeUS int64         `json:"time_us"` // Unix time in microseconds
	// Pool is the private pool of the block or segment; zero for the
	// shared pools.
	Pool PoolID `json:"segment_pool_id,omitzero"`
	// DeviceFree is the device's free memory, for ActionOOM.
	DeviceFree uint64 `json:"device_free"`
}
