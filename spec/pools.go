package spec

import (
	"encoding/json"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// PoolID names a private pool, as PyTorch's MempoolId_t (a pair of
// integers) does. The zero PoolID names no private pool.
type PoolID struct {
	First, Second uint64
}

// IsZero reports whether id names no private pool.
func (id PoolID) IsZero() bool { return id == PoolID{} }

func (id PoolID) String() string { return fmt.Sprintf("(%d, %d)", id.First, id.Second) }

// MarshalJSON writes the id as PyTorch writes a pool id: [first, second].
func (id PoolID) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, "[%d,%d]", id.First, id.Second), nil
}

// UnmarshalJSON reads what MarshalJSON writes.
func (id *PoolID) UnmarshalJSON(b []byte) error {
	var pair [2]uint64
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("pool id: want [first, second]: %w", err)
	}
	id.First, id.Second = pair[0], pair[1]
	return nil
}

// A PoolCheckpoint is the allocation state of a private pool at one moment:
// which blocks were allocated. PyTorch's CUDA graph trees (the
// torch.compile "reduce-overhead" mode) take one after recording a graph
// and put the pool back to it before recording the next one after replays,
// because a replay changes the bytes but not the allocator's books.
type PoolCheckpoint struct {
	ID     PoolID            `json:"id"`
	Blocks []CheckpointBlock `json:"blocks"` // allocated blocks, in address order
}

// CheckpointBlock is one allocated block of a checkpoint.
type CheckpointBlock struct {
	Ptr       vmm.DevicePtr `json:"ptr"`
	Size      uint64        `json:"size"`
	Requested uint64        `json:"requested"`
}
