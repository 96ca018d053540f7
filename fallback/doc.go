// Package fallback will hold the allocator for drivers and devices without
// virtual memory management: the same Allocator API and block core as package
// expandable, over fixed segments of plain allocations (cuMemAlloc on CUDA,
// anonymous memory on the host backend). It is the subject of issue 6 and
// holds no code yet; xseg.Open reports vmm.ErrNotSupported when asked for it.
package fallback
