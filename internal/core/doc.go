// Package core is the block core shared by xseg's allocators: blocks in
// address order, best-fit search over free blocks per (device, stream, pool),
// split and merge, rounding, stream-ordered reuse and statistics. The
// expandable allocator runs it over segments that grow by pages; the fallback
// allocator over fixed segments of plain allocations.
package core
