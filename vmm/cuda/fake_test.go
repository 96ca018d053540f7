package cuda

import (
	"fmt"
	"slices"
	"sync"

	"github.com/xseg-dev/xseg/vmm"
)

// fakeCUDA is an in-Go fake of the CUDA driver's entry points, a symbols
// the Driver runs over in tests without a GPU. It keeps the driver's state
// (retained contexts, reservations, pages, mappings and their access,
// plain allocations, streams, events, exported handles) and answers with
// the CUresult the driver gives for a misuse, so that a Driver bug that
// lets one through shows as a driver error. It holds the bytes of pages and
// allocations, so copies round-trip. It records every call with its
// context, and fails the calls it is told to (failNext).
//
// A context is valid while its device's primary context is retained; a
// call given any other context fails with CUDA_ERROR_INVALID_CONTEXT.
// Context 0 stands for the fallback context (device 0's), as on a Go
// thread that has none. Copies check that the context's device may touch
// every byte: the real driver would fault the context for good, the fake
// answers CUDA_ERROR_ILLEGAL_ADDRESS.
type fakeCUDA struct {
	gran uint64 // granularity of every device
	devs []fakeDevice

	// ipcSelf lets this process open its own IPC handles (CUDA refuses,
	// with CUDA_ERROR_INVALID_CONTEXT); ipcSameAddress makes a second
	// open of one handle answer the address of the first.
	ipcSelf, ipcSameAddress bool

	mu struct {
		sync.Mutex
		calls    []fakeCall
		fail     map[string][]Result
		retained []int // per device
		fallback cuContext
		next     uint64 // last handle, stream, event or id handed out
		nextAddr vmm.DevicePtr
		ranges   map[vmm.DevicePtr]uint64 // reservations: base -> size
		pages    map[vmm.Handle]*fakePage
		maps     []*fakeMapping
		allocs   map[vmm.DevicePtr]*fakeMem
		streams  map[vmm.Stream]int
		events   map[vmm.Event]int
		pending  map[vmm.Event]int   // queries left that answer not ready
		shared   map[uint64]*fakeMem // exported: fd inode, fabric id or IPC id -> memory
		opened   map[vmm.DevicePtr]*fakeMem
		reopened map[vmm.DevicePtr]int // opens of an opened address, beyond the first
	}
}

// fakeDevice is what the fake reports of one device.
type fakeDevice struct {
	total   uint64
	attrs   map[int]int
	fabricE Result // what a fabric page's cuMemCreate answers, if not 0
	used    uint64 // bytes of pages and allocations made on it
}

// fakeMem is the memory of a page or allocation, shared by its imports.
type fakeMem struct {
	dev    int
	size   uint64
	types  vmm.HandleType
	chunks map[uint64][]byte // sparse bytes, fakeChunk each
	owned  bool              // counts in its device's used bytes
}

const fakeChunk = 4096

// fakePage is a handle: a created or an imported page.
type fakePage struct{ mem *fakeMem }

// fakeMapping is a page mapped at ptr, and the access of each device.
type fakeMapping struct {
	ptr    vmm.DevicePtr
	size   uint64
	mem    *fakeMem
	access map[int]vmm.Access
}

// fakeCall is one call the fake answered (or failed).
type fakeCall struct {
	name string
	ctx  cuContext
}

// newFake makes a fake of n devices of total bytes each, with VMM, POSIX fd
// and fabric handles, and RDMA with VMM, and a granularity of 2 MiB.
func newFake(n int, total uint64) *fakeCUDA {
	f := &fakeCUDA{gran: 2 << 20}
	for range n {
		f.devs = append(f.devs, fakeDevice{total: total, attrs: map[int]int{
			attrVMM: 1, attrPosixFD: 1, attrFabric: 1, attrRDMAWithVMM: 1}})
	}
	f.mu.fail = map[string][]Result{}
	f.mu.retained = make([]int, n)
	f.mu.nextAddr = 0x7f00_0000_0000
	f.mu.ranges = map[vmm.DevicePtr]uint64{}
	f.mu.pages = map[vmm.Handle]*fakePage{}
	f.mu.allocs = map[vmm.DevicePtr]*fakeMem{}
	f.mu.streams = map[vmm.Stream]int{}
	f.mu.events = map[vmm.Event]int{}
	f.mu.pending = map[vmm.Event]int{}
	f.mu.shared = map[uint64]*fakeMem{}
	f.mu.opened = map[vmm.DevicePtr]*fakeMem{}
	f.mu.reopened = map[vmm.DevicePtr]int{}
	return f
}

var _ symbols = (*fakeCUDA)(nil)

// ctxOf is the context the fake hands out for device i.
func ctxOf(i int) cuContext { return cuContext(0xc0de_0000 + i) }

// failNext makes the next calls of the entry point name (the symbols
// method's name) fail with rs, one each, before they do anything; a 0 in
// rs lets its call through.
func (f *fakeCUDA) failNext(name string, rs ...Result) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.fail[name] = append(f.mu.fail[name], rs...)
}

// calls returns the names of the calls made so far, failed ones too.
func (f *fakeCUDA) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, len(f.mu.calls))
	for i, c := range f.mu.calls {
		names[i] = c.name
	}
	return names
}

// count returns how many calls of name were made.
func (f *fakeCUDA) count(name string) int {
	n := 0
	for _, c := range f.calls() {
		if c == name {
			n++
		}
	}
	return n
}

// lastCtx returns the context of the last call of name.
func (f *fakeCUDA) lastCtx(name string) (cuContext, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.mu.calls) - 1; i >= 0; i-- {
		if f.mu.calls[i].name == name {
			return f.mu.calls[i].ctx, true
		}
	}
	return 0, false
}

// retained returns the retain count of each device's primary context.
func (f *fakeCUDA) retained() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.mu.retained)
}

// enter records a call of name in context c (-1: a call without one) and
// returns the error it must fail with: an injected one, or
// CUDA_ERROR_INVALID_CONTEXT for a context that is not live. f.mu is held.
func (f *fakeCUDA) enter(name string, c cuContext) error {
	f.mu.calls = append(f.mu.calls, fakeCall{name, c})
	if rs := f.mu.fail[name]; len(rs) > 0 {
		f.mu.fail[name] = rs[1:]
		if rs[0] != 0 {
			return rs[0]
		}
	}
	if c == ^cuContext(0) {
		return nil
	}
	if _, ok := f.ctxDevice(c); !ok {
		return ErrorInvalidContext
	}
	return nil
}

// ctxDevice returns the device of context c (0: the fallback's), if live.
func (f *fakeCUDA) ctxDevice(c cuContext) (int, bool) {
	if c == 0 {
		c = f.mu.fallback
	}
	i := int(c - ctxOf(0))
	if i < 0 || i >= len(f.devs) || f.mu.retained[i] == 0 {
		return 0, false
	}
	return i, true
}

// noCtx is the context argument of enter for calls that take none.
const noCtx = ^cuContext(0)

func (f *fakeCUDA) id() uint64 {
	f.mu.next++
	return f.mu.next
}

func (f *fakeCUDA) device(d cuDevice) (*fakeDevice, error) {
	if d < 0 || int(d) >= len(f.devs) {
		return nil, ErrorInvalidDevice
	}
	return &f.devs[d], nil
}

func (f *fakeCUDA) deviceGetCount() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("deviceGetCount", noCtx); err != nil {
		return 0, err
	}
	return len(f.devs), nil
}

func (f *fakeCUDA) deviceGet(ordinal vmm.Device) (cuDevice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("deviceGet", noCtx); err != nil {
		return 0, err
	}
	if _, err := f.device(cuDevice(ordinal)); err != nil {
		return 0, err
	}
	return cuDevice(ordinal), nil
}

func (f *fakeCUDA) deviceGetName(d cuDevice) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("deviceGetName", noCtx); err != nil {
		return "", err
	}
	if _, err := f.device(d); err != nil {
		return "", err
	}
	return fmt.Sprintf("Fake GPU %d", d), nil
}

func (f *fakeCUDA) deviceGetUUID(d cuDevice) ([16]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("deviceGetUUID", noCtx); err != nil {
		return [16]byte{}, err
	}
	if _, err := f.device(d); err != nil {
		return [16]byte{}, err
	}
	return [16]byte{0xfa, 0xce, 15: byte(d + 1)}, nil
}

func (f *fakeCUDA) deviceTotalMem(d cuDevice) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("deviceTotalMem", noCtx); err != nil {
		return 0, err
	}
	dev, err := f.device(d)
	if err != nil {
		return 0, err
	}
	return dev.total, nil
}

func (f *fakeCUDA) deviceGetAttribute(attr int, d cuDevice) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("deviceGetAttribute", noCtx); err != nil {
		return 0, err
	}
	dev, err := f.device(d)
	if err != nil {
		return 0, err
	}
	v, ok := dev.attrs[attr]
	if !ok && attr != attrVMM && attr != attrPosixFD && attr != attrFabric && attr != attrRDMAWithVMM {
		return 0, ErrorInvalidValue
	}
	return v, nil
}

func (f *fakeCUDA) primaryCtxRetain(d cuDevice) (cuContext, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("primaryCtxRetain", noCtx); err != nil {
		return 0, err
	}
	if _, err := f.device(d); err != nil {
		return 0, err
	}
	f.mu.retained[d]++
	return ctxOf(int(d)), nil
}

func (f *fakeCUDA) primaryCtxRelease(d cuDevice) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("primaryCtxRelease", noCtx); err != nil {
		return err
	}
	if _, err := f.device(d); err != nil {
		return err
	}
	if f.mu.retained[d] == 0 {
		return ErrorInvalidContext
	}
	f.mu.retained[d]--
	return nil
}

func (f *fakeCUDA) setFallback(c cuContext) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.fallback = c
}

func (f *fakeCUDA) granularity(c cuContext, d cuDevice, recommended bool) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("granularity", c); err != nil {
		return 0, err
	}
	if _, err := f.device(d); err != nil {
		return 0, err
	}
	if recommended {
		return 2 * f.gran, nil
	}
	return f.gran, nil
}

func (f *fakeCUDA) memGetInfo(c cuContext) (free, total uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enter("memGetInfo", c); err != nil {
		return 0, 0, err
	}
	i, _ := f.ctxDevice(c)
	dev := f.devs[i]
	return dev.total - dev.used, dev.total, nil
}
