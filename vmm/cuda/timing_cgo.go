//go:build cgo && linux

package cuda

/*
#include <time.h>
#include "xseg_cuda.h"

#cgo noescape xs_time_reserve
#cgo noescape xs_time_page
#cgo noescape xs_time_access
#cgo noescape xs_time_query

// These loops time driver calls straight from C, with a context current for
// the whole loop and no Go in between: the baseline the benchmarks hold the
// Go methods against. Each adds the nanoseconds spent in each step to out.

static uint64_t xs_now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

// out: cuMemAddressReserve, cuMemAddressFree.
static CUresult xs_time_reserve_loop(xs_syms *s, size_t size, int n, uint64_t *out) {
	for (int i = 0; i < n; i++) {
		CUdeviceptr p = 0;
		uint64_t t0 = xs_now();
		CUresult r = s->cuMemAddressReserve(&p, size, 0, 0, 0);
		uint64_t t1 = xs_now();
		if (r != CUDA_SUCCESS) return r;
		r = s->cuMemAddressFree(p, size);
		uint64_t t2 = xs_now();
		if (r != CUDA_SUCCESS) return r;
		out[0] += t1 - t0;
		out[1] += t2 - t1;
	}
	return CUDA_SUCCESS;
}

// out: cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease of
// one page of size bytes on device d, mapped at ptr.
static CUresult xs_time_page_loop(xs_syms *s, CUdeviceptr ptr, size_t size, CUdevice d, int rdma, int n, uint64_t *out) {
	CUmemAllocationProp p = {0};
	p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
	p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
	p.location.id = d;
	p.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
	CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, d}, 3};
	for (int i = 0; i < n; i++) {
		CUmemGenericAllocationHandle h = 0;
		CUresult r;
		uint64_t t[6];
		t[0] = xs_now();
		if ((r = s->cuMemCreate(&h, size, &p, 0)) != CUDA_SUCCESS) return r;
		t[1] = xs_now();
		if ((r = s->cuMemMap(ptr, size, 0, h, 0)) != CUDA_SUCCESS) return r;
		t[2] = xs_now();
		if ((r = s->cuMemSetAccess(ptr, size, &a, 1)) != CUDA_SUCCESS) return r;
		t[3] = xs_now();
		if ((r = s->cuMemUnmap(ptr, size)) != CUDA_SUCCESS) return r;
		t[4] = xs_now();
		if ((r = s->cuMemRelease(h)) != CUDA_SUCCESS) return r;
		t[5] = xs_now();
		for (int k = 0; k < 5; k++) out[k] += t[k + 1] - t[k];
	}
	return CUDA_SUCCESS;
}

// out: cuMemSetAccess of [ptr, ptr+size), already mapped, for device d.
static CUresult xs_time_access_loop(xs_syms *s, CUdeviceptr ptr, size_t size, CUdevice d, int n, uint64_t *out) {
	CUmemAccessDesc a = {{CU_MEM_LOCATION_TYPE_DEVICE, d}, 3};
	for (int i = 0; i < n; i++) {
		uint64_t t0 = xs_now();
		CUresult r = s->cuMemSetAccess(ptr, size, &a, 1);
		out[0] += xs_now() - t0;
		if (r != CUDA_SUCCESS) return r;
	}
	return CUDA_SUCCESS;
}

// out: cuEventQuery of event e (complete, so it returns at once).
static CUresult xs_time_query_loop(xs_syms *s, uintptr_t e, int n, uint64_t *out) {
	uint64_t t0 = xs_now();
	for (int i = 0; i < n; i++) {
		CUresult r = s->cuEventQuery((CUevent)e);
		if (r != CUDA_SUCCESS) return r;
	}
	out[0] += xs_now() - t0;
	return CUDA_SUCCESS;
}

static CUresult xs_time_query(xs_syms *s, xs_ctx c, uintptr_t e, int n, uint64_t *out) { XS_IN_CTX(s, c, xs_time_query_loop(s, e, n, out)); }
static CUresult xs_time_reserve(xs_syms *s, size_t size, int n, uint64_t *out) { XS_IN_CTX(s, NULL, xs_time_reserve_loop(s, size, n, out)); }
static CUresult xs_time_page(xs_syms *s, CUdeviceptr ptr, size_t size, CUdevice d, int rdma, int n, uint64_t *out) { XS_IN_CTX(s, NULL, xs_time_page_loop(s, ptr, size, d, rdma, n, out)); }
static CUresult xs_time_access(xs_syms *s, CUdeviceptr ptr, size_t size, CUdevice d, int n, uint64_t *out) { XS_IN_CTX(s, NULL, xs_time_access_loop(s, ptr, size, d, n, out)); }
*/
import "C"

import (
	"fmt"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

// The functions below let the benchmarks compare a Go method with the same
// driver call made from C. They bypass the books: the caller keeps the
// ranges it passes free of anything the Driver knows about.

// rawReserve times n cuMemAddressReserve + cuMemAddressFree pairs of size
// bytes, made from C.
func (d *Driver) rawReserve(size uint64, n int) (reserve, free time.Duration, err error) {
	var out [2]C.uint64_t
	if err := result(C.xs_time_reserve(d.symtab().p, C.size_t(size), C.int(n), &out[0])); err != nil {
		return 0, 0, fmt.Errorf("timing cuMemAddressReserve from C: %w", err)
	}
	return time.Duration(out[0]), time.Duration(out[1]), nil
}

// rawPage times n cycles of cuMemCreate, cuMemMap, cuMemSetAccess,
// cuMemUnmap and cuMemRelease of one page of size bytes on dev, mapped at
// ptr, made from C. The totals are in that order.
func (d *Driver) rawPage(dev vmm.Device, ptr vmm.DevicePtr, size uint64, n int) ([5]time.Duration, error) {
	var res [5]time.Duration
	s, err := d.device(dev)
	if err != nil {
		return res, err
	}
	var out [5]C.uint64_t
	rdma := C.int(0)
	if s.rdma {
		rdma = 1
	}
	if err := result(C.xs_time_page(d.symtab().p, C.CUdeviceptr(ptr), C.size_t(size), C.CUdevice(s.cu), rdma, C.int(n), &out[0])); err != nil {
		return res, fmt.Errorf("timing a page cycle from C: %w", err)
	}
	for i := range out {
		res[i] = time.Duration(out[i])
	}
	return res, nil
}

// rawAccess times n cuMemSetAccess calls over [ptr, ptr+size), mapped, for
// dev, made from C.
func (d *Driver) rawAccess(dev vmm.Device, ptr vmm.DevicePtr, size uint64, n int) (time.Duration, error) {
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	var out [1]C.uint64_t
	if err := result(C.xs_time_access(d.symtab().p, C.CUdeviceptr(ptr), C.size_t(size), C.CUdevice(s.cu), C.int(n), &out[0])); err != nil {
		return 0, fmt.Errorf("timing cuMemSetAccess from C: %w", err)
	}
	return time.Duration(out[0]), nil
}

// rawEventQuery times n cuEventQuery calls of e, an event of dev that has
// completed, made from C in one loop.
func (d *Driver) rawEventQuery(dev vmm.Device, e vmm.Event, n int) (time.Duration, error) {
	s, err := d.device(dev)
	if err != nil {
		return 0, err
	}
	var out [1]C.uint64_t
	if err := result(C.xs_time_query(d.symtab().p, C.xs_ctx(s.ctx), C.uintptr_t(e), C.int(n), &out[0])); err != nil {
		return 0, fmt.Errorf("timing cuEventQuery from C: %w", err)
	}
	return time.Duration(out[0]), nil
}

// timed returns the nanoseconds the trampolines have spent in driver calls
// and in all (context handling included) so far; zero unless built with
// -tags xsegtiming. It reads the symbol table without a cgo crossing.
func (d *Driver) timed() (calls, trampolines time.Duration) {
	p := d.symtab().p
	return time.Duration(p.timed_calls), time.Duration(p.timed_trampolines)
}

// symtab returns the symbol table of libcuda that d calls through; d must
// have been made by Open.
func (d *Driver) symtab() symtab { return d.sym.(symtab) }

// currentContext returns the calling thread's current context and whether
// it is dev's primary context as retained by d. Tests use it, on a locked
// thread, to check that calls leave the thread as they found it.
func (d *Driver) currentContext(dev vmm.Device) (uintptr, bool, error) {
	c, err := d.symtab().ctxGetCurrent()
	if err != nil {
		return 0, false, err
	}
	s, err := d.device(dev)
	if err != nil {
		return 0, false, err
	}
	return uintptr(c), c == s.ctx, nil
}

// setCurrentContext makes dev's primary context (or none, if dev < 0)
// current on the calling thread, which the caller keeps locked.
func (d *Driver) setCurrentContext(dev vmm.Device) error {
	if dev < 0 {
		return d.symtab().ctxSetCurrent(0)
	}
	s, err := d.device(dev)
	if err != nil {
		return err
	}
	return d.symtab().ctxSetCurrent(s.ctx)
}
