package spec

import "github.com/xseg-dev/xseg/vmm"

// BlockState is the state of a block in a snapshot.
type BlockState string

const (
	BlockAllocated BlockState = "allocated"
	// BlockPending: freed by the caller, waiting for stream work recorded
	// with RecordStream before it can be reused.
	BlockPending BlockState = "pending"
	BlockFree    BlockState = "free"
)

// Block is one block of a segment in a snapshot.
type Block struct {
	Ptr       vmm.DevicePtr `json:"ptr"`
	Size      uint64        `json:"size"`
	Requested uint64        `json:"requested"`
	State     BlockState    `json:"state"`
}

// Range is a run of mapped pages in a snapshot.
type Range struct {
	Ptr  vmm.DevicePtr `json:"ptr"`
	Size uint64        `json:"size"`
}

// Segment is one segment: for the expandable allocator a reserved range of
// one (device, stream, pool), for fallback one plain allocation.
type Segment struct {
	Device vmm.Device `json:"device"`
	Stream vmm.Stream `json:"stream"`
	Pool   string     `json:"pool"`
	// PrivatePool is the private pool the segment belongs to; zero for
	// the shared pools.
	PrivatePool PoolID        `json:"segment_pool_id"`
	Base        vmm.DevicePtr `json:"base"`
	Reserved    uint64        `json:"reserved_size"`
	PageSize    uint64        `json:"page_size"`
	Mapped      []Range       `json:"mapped"`
	Blocks      []Block       `json:"blocks"`
}

// Snapshot is the allocator's state at one moment.
type Snapshot struct {
	Segments []Segment `json:"segments"`
	Stats    Stats     `json:"stats"`
}
