package cuda

import (
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// span is device memory a copy or memset touches, and the access it needs.
type span = ledger.Span

// workCtx picks the context that copies and memsets run in: that of a
// device allowed to touch every span (the device of the page mapped at the
// first span first). Touching memory that is not mapped or not accessible
// would fault the context for good, so it is refused with vmm.ErrInvalid
// before the driver sees it. Context 0 (any) serves spans that all lie
// in plain allocations.
func (d *Driver) workCtx(what string, spans ...span) (cuContext, error) {
	dev, found, err := d.books.Toucher(what, spans...)
	if err != nil || !found {
		return 0, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	return s.ctx, nil
}

// CopyHtoD copies src to dst and waits until the bytes are there.
func (d *Driver) CopyHtoD(dst vmm.DevicePtr, src []byte) error {
	if err := d.live(); err != nil || len(src) == 0 {
		return err
	}
	what := fmt.Sprintf("copying %d bytes to %v", len(src), dst)
	c, err := d.workCtx(what, span{Ptr: dst, N: uint64(len(src)), Want: vmm.AccessReadWrite})
	if err != nil {
		return err
	}
	if err := d.sym.memcpyHtoD(c, dst, src); err != nil {
		return fmt.Errorf("cuMemcpyHtoD %v+%d: %w", dst, len(src), err)
	}
	return nil
}

// CopyDtoH copies len(dst) bytes from src into dst.
func (d *Driver) CopyDtoH(dst []byte, src vmm.DevicePtr) error {
	if err := d.live(); err != nil || len(dst) == 0 {
		return err
	}
	what := fmt.Sprintf("copying %d bytes from %v", len(dst), src)
	c, err := d.workCtx(what, span{Ptr: src, N: uint64(len(dst)), Want: vmm.AccessRead})
	if err != nil {
		return err
	}
	if err := d.sym.memcpyDtoH(c, dst, src); err != nil {
		return fmt.Errorf("cuMemcpyDtoH %v+%d: %w", src, len(dst), err)
	}
	return nil
}

// CopyDtoD copies n bytes from src to dst, on a device that may read the
// one and write the other, and waits.
func (d *Driver) CopyDtoD(dst, src vmm.DevicePtr, n uint64) error {
	if err := d.live(); err != nil || n == 0 {
		return err
	}
	what := fmt.Sprintf("copying %d bytes from %v to %v", n, src, dst)
	c, err := d.workCtx(what, span{Ptr: dst, N: n, Want: vmm.AccessReadWrite}, span{Ptr: src, N: n, Want: vmm.AccessRead})
	if err != nil {
		return err
	}
	if err := d.sym.memcpyDtoD(c, dst, src, n); err != nil {
		return fmt.Errorf("cuMemcpy %v <- %v, %d bytes: %w", dst, src, n, err)
	}
	return nil
}

// Memset sets n bytes at dst to value and waits.
func (d *Driver) Memset(dst vmm.DevicePtr, value byte, n uint64) error {
	if err := d.live(); err != nil || n == 0 {
		return err
	}
	what := fmt.Sprintf("setting %d bytes at %v", n, dst)
	c, err := d.workCtx(what, span{Ptr: dst, N: n, Want: vmm.AccessReadWrite})
	if err != nil {
		return err
	}
	if err := d.sym.memsetD8(c, dst, value, n); err != nil {
		return fmt.Errorf("cuMemsetD8 %v+%d: %w", dst, n, err)
	}
	return nil
}

// MemsetAsync queues the memset of n bytes at dst on stream st and returns.
// On a stream made here it runs in the stream's context, whose device must
// be allowed to write there.
func (d *Driver) MemsetAsync(dst vmm.DevicePtr, value byte, n uint64, st vmm.Stream) error {
	if err := d.live(); err != nil || n == 0 {
		return err
	}
	what := fmt.Sprintf("setting %d bytes at %v on stream %#x", n, dst, uintptr(st))
	sp := span{Ptr: dst, N: n, Want: vmm.AccessReadWrite}
	c, dev, ours, err := d.streamCtx(st)
	if err != nil {
		return err
	}
	if ours {
		if err := d.books.May(dev, sp); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	} else {
		if c, err = d.workCtx(what, sp); err != nil {
			return err
		}
	}
	if err := d.sym.memsetD8Async(c, dst, value, n, st); err != nil {
		return fmt.Errorf("cuMemsetD8Async %v+%d on stream %#x: %w", dst, n, uintptr(st), err)
	}
	return nil
}
