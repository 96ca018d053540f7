package spec

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// ErrNotAllocated: the pointer is not the start of a block the allocator
// has handed out (never was, or was freed). RecordStream fails with an
// error matching it (and vmm.ErrInvalid), so that a caller asking several
// allocators which one owns a pointer can tell "not mine" from a real
// failure, such as a stream that is not live.
var ErrNotAllocated = fmt.Errorf("not an allocated block: %w", vmm.ErrInvalid)
