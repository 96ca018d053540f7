package cuda

import (
	"encoding/binary"

	"github.com/xseg-dev/xseg/vmm"
)

// The entry points of fakeCUDA for streams, events, copies, plain
// allocations and legacy IPC. Work is done at once: a stream never has
// anything queued, and an event is complete when recorded (unless
// notReady says otherwise).

func (f *fakeCUDA) streamCreate(c cuContext) (vmm.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("streamCreate", c); err != nil {
		return 0, err
	}
	i, _ := f.ctxDevice(c)
	s := vmm.Stream(0x5000_0000 + f.id())
	f.mu.streams[s] = i
	return s, nil
}

// stream checks that s is 0 or a live stream of context c's device.
func (f *fakeCUDA) stream(c cuContext, s vmm.Stream) error {
	if s == 0 {
		return nil
	}
	dev, ok := f.mu.streams[s]
	if i, _ := f.ctxDevice(c); !ok || dev != i {
		return ErrorInvalidHandle
	}
	return nil
}

func (f *fakeCUDA) streamDestroy(c cuContext, s vmm.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("streamDestroy", c); err != nil {
		return err
	}
	if err := f.stream(c, s); err != nil || s == 0 {
		return ErrorInvalidHandle
	}
	delete(f.mu.streams, s)
	return nil
}

func (f *fakeCUDA) streamSynchronize(c cuContext, s vmm.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("streamSynchronize", c); err != nil {
		return err
	}
	return f.stream(c, s)
}

func (f *fakeCUDA) ctxSynchronize(c cuContext) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.enter("ctxSynchronize", c)
}

func (f *fakeCUDA) eventCreate(c cuContext) (vmm.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("eventCreate", c); err != nil {
		return 0, err
	}
	i, _ := f.ctxDevice(c)
	e := vmm.Event(0xe000_0000 + f.id())
	f.mu.events[e] = i
	return e, nil
}

// event checks that e is a live event of context c's device.
func (f *fakeCUDA) event(c cuContext, e vmm.Event) error {
	dev, ok := f.mu.events[e]
	if i, _ := f.ctxDevice(c); !ok || dev != i {
		return ErrorInvalidHandle
	}
	return nil
}

func (f *fakeCUDA) eventRecord(c cuContext, e vmm.Event, s vmm.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("eventRecord", c); err != nil {
		return err
	}
	if err := f.event(c, e); err != nil {
		return err
	}
	return f.stream(c, s)
}

// notReady makes the next n queries of e answer that it is not complete.
func (f *fakeCUDA) notReady(e vmm.Event, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.pending[e] = n
}

func (f *fakeCUDA) eventQuery(c cuContext, e vmm.Event) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("eventQuery", c); err != nil {
		return false, err
	}
	if err := f.event(c, e); err != nil {
		return false, err
	}
	if f.mu.pending[e] > 0 {
		f.mu.pending[e]--
		return false, nil
	}
	return true, nil
}

func (f *fakeCUDA) eventSynchronize(c cuContext, e vmm.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("eventSynchronize", c); err != nil {
		return err
	}
	delete(f.mu.pending, e)
	return f.event(c, e)
}

func (f *fakeCUDA) eventDestroy(c cuContext, e vmm.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("eventDestroy", c); err != nil {
		return err
	}
	if err := f.event(c, e); err != nil {
		return err
	}
	delete(f.mu.events, e)
	return nil
}

// piece is a run of bytes of one fakeMem.
type piece struct {
	mem      *fakeMem
	off, len uint64
}

// pieces resolves [p, p+n) to the memory behind it, for context c's device
// to read (or write): mappings that grant the device that access, and plain
// allocations (opened IPC ones too), which every device may touch. Anything
// else would fault the context: CUDA_ERROR_ILLEGAL_ADDRESS.
func (f *fakeCUDA) pieces(c cuContext, p vmm.DevicePtr, n uint64, write bool) ([]piece, error) {
	dev, _ := f.ctxDevice(c)
	want := vmm.AccessRead
	if write {
		want = vmm.AccessReadWrite
	}
	var ps []piece
	for n > 0 {
		var mem *fakeMem
		var base vmm.DevicePtr
		var size uint64
		if m := f.mappingAt(p); m != nil {
			if m.access[dev] < want {
				return nil, ErrorIllegalAddress
			}
			mem, base, size = m.mem, m.ptr, m.size
		} else if a, b := f.allocAt(p); a != nil {
			mem, base, size = a, b, a.size
		} else {
			return nil, ErrorIllegalAddress
		}
		off := uint64(p - base)
		k := min(n, size-off)
		ps = append(ps, piece{mem, off, k})
		p, n = p.Add(k), n-k
	}
	return ps, nil
}

// allocAt returns the plain allocation (or opened one) holding p.
func (f *fakeCUDA) allocAt(p vmm.DevicePtr) (*fakeMem, vmm.DevicePtr) {
	for _, set := range []map[vmm.DevicePtr]*fakeMem{f.mu.allocs, f.mu.opened} {
		for base, a := range set {
			if p >= base && p < base.Add(a.size) {
				return a, base
			}
		}
	}
	return nil, 0
}

// access copies between b and the pieces, into the pieces if write.
func access(ps []piece, b []byte, write bool) {
	for _, p := range ps {
		for k := uint64(0); k < p.len; {
			at := p.off + k
			ci, co := at/fakeChunk, at%fakeChunk
			chunk := p.mem.chunks[ci]
			if chunk == nil && write {
				if p.mem.chunks == nil {
					p.mem.chunks = map[uint64][]byte{}
				}
				chunk = make([]byte, fakeChunk)
				p.mem.chunks[ci] = chunk
			}
			m := min(p.len-k, fakeChunk-co)
			switch {
			case write:
				copy(chunk[co:co+m], b[:m])
			case chunk == nil:
				clear(b[:m])
			default:
				copy(b[:m], chunk[co:co+m])
			}
			b, k = b[m:], k+m
		}
	}
}

// move reads (or writes) b at device address p for context c.
func (f *fakeCUDA) move(c cuContext, p vmm.DevicePtr, b []byte, write bool) error {
	ps, err := f.pieces(c, p, uint64(len(b)), write)
	if err != nil {
		return err
	}
	access(ps, b, write)
	return nil
}

func (f *fakeCUDA) memcpyHtoD(c cuContext, dst vmm.DevicePtr, src []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memcpyHtoD", c); err != nil {
		return err
	}
	return f.move(c, dst, src, true)
}

func (f *fakeCUDA) memcpyDtoH(c cuContext, dst []byte, src vmm.DevicePtr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memcpyDtoH", c); err != nil {
		return err
	}
	return f.move(c, src, dst, false)
}

func (f *fakeCUDA) memcpyDtoD(c cuContext, dst, src vmm.DevicePtr, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memcpyDtoD", c); err != nil {
		return err
	}
	if _, err := f.pieces(c, dst, n, true); err != nil {
		return err
	}
	b := make([]byte, n)
	if err := f.move(c, src, b, false); err != nil {
		return err
	}
	return f.move(c, dst, b, true)
}

func (f *fakeCUDA) memset(c cuContext, dst vmm.DevicePtr, v byte, n uint64) error {
	b := make([]byte, n)
	for i := range b {
		b[i] = v
	}
	return f.move(c, dst, b, true)
}

func (f *fakeCUDA) memsetD8(c cuContext, dst vmm.DevicePtr, v byte, n uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memsetD8", c); err != nil {
		return err
	}
	return f.memset(c, dst, v, n)
}

func (f *fakeCUDA) memsetD8Async(c cuContext, dst vmm.DevicePtr, v byte, n uint64, s vmm.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memsetD8Async", c); err != nil {
		return err
	}
	if err := f.stream(c, s); err != nil {
		return err
	}
	return f.memset(c, dst, v, n)
}

func (f *fakeCUDA) memAlloc(c cuContext, size uint64) (vmm.DevicePtr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memAlloc", c); err != nil {
		return 0, err
	}
	i, _ := f.ctxDevice(c)
	dev := &f.devs[i]
	if size == 0 {
		return 0, ErrorInvalidValue
	}
	if dev.total-dev.used < size {
		return 0, ErrorOutOfMemory
	}
	dev.used += size
	p := f.mu.nextAddr
	f.mu.nextAddr = p.Add((size + 2*f.gran - 1) / f.gran * f.gran)
	f.mu.allocs[p] = &fakeMem{dev: i, size: size, owned: true}
	return p, nil
}

func (f *fakeCUDA) memFree(c cuContext, p vmm.DevicePtr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memFree", c); err != nil {
		return err
	}
	a, ok := f.mu.allocs[p]
	if !ok {
		return ErrorInvalidValue
	}
	delete(f.mu.allocs, p)
	f.devs[a.dev].used -= a.size
	return nil
}

// An IPC handle of the fake holds a marker and an id of the allocation.
func (f *fakeCUDA) ipcGetMemHandle(c cuContext, p vmm.DevicePtr) (vmm.IPCMemHandle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ipcGetMemHandle", c); err != nil {
		return vmm.IPCMemHandle{}, err
	}
	a, ok := f.mu.allocs[p]
	if !ok {
		return vmm.IPCMemHandle{}, ErrorInvalidValue
	}
	id := 1<<62 | f.id()
	f.mu.shared[id] = a
	var h vmm.IPCMemHandle
	binary.LittleEndian.PutUint64(h[:], id)
	return h, nil
}

func (f *fakeCUDA) ipcOpenMemHandle(c cuContext, h vmm.IPCMemHandle) (vmm.DevicePtr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ipcOpenMemHandle", c); err != nil {
		return 0, err
	}
	a, ok := f.mu.shared[binary.LittleEndian.Uint64(h[:])]
	switch {
	case !ok:
		return 0, ErrorInvalidValue
	case !f.ipcSelf:
		return 0, ErrorInvalidContext // CUDA: a handle of this very process
	}
	if f.ipcSameAddress {
		for p, o := range f.mu.opened {
			if o == a {
				f.mu.reopened[p]++
				return p, nil
			}
		}
	}
	p := f.mu.nextAddr
	f.mu.nextAddr = p.Add((a.size + 2*f.gran - 1) / f.gran * f.gran)
	f.mu.opened[p] = a
	return p, nil
}

func (f *fakeCUDA) ipcCloseMemHandle(c cuContext, p vmm.DevicePtr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("ipcCloseMemHandle", c); err != nil {
		return err
	}
	if _, ok := f.mu.opened[p]; !ok {
		return ErrorInvalidValue
	}
	if f.mu.reopened[p] > 0 {
		f.mu.reopened[p]--
		return nil
	}
	delete(f.mu.opened, p)
	return nil
}

func (f *fakeCUDA) memGetAddressRange(c cuContext, p vmm.DevicePtr) (vmm.DevicePtr, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memGetAddressRange", c); err != nil {
		return 0, 0, err
	}
	a, base := f.allocAt(p)
	if a == nil {
		return 0, 0, ErrorInvalidValue
	}
	return base, a.size, nil
}
