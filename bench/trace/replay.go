package trace

import (
	"errors"
	"fmt"
	"time"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Allocator is what Replay drives. xseg.Allocator and the allocators of
// package expandable satisfy it.
type Allocator interface {
	Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error)
	Free(ptr vmm.DevicePtr) error
	Stats() spec.Stats
}

// ProgressEvery is how many events pass between two calls of
// Options.Progress.
const ProgressEvery = 1 << 16

// Options tune a replay.
type Options struct {
	// Streams are the allocator streams of the trace's streams:
	// Streams[i] stands for Trace.Streams[i]. Nil: every event on
	// vmm.Stream(0).
	Streams []vmm.Stream
	// Progress, if not nil, is called every ProgressEvery events with the
	// number of events done, and once more at the end. It runs inside the
	// timed loop: keep it cheap.
	Progress func(done int)
	// Sample, if not nil, is called every SampleEvery events (every event
	// if SampleEvery < 1) with the number of events done, and once more
	// at the end: `xseg replay --plot` reads the allocator's Stats there.
	// It runs inside the timed loop.
	Sample      func(done int)
	SampleEvery int
}

// Result is what a replay measured. The JSON keys are those of
// `xseg replay --json`.
type Result struct {
	Trace  string `json:"trace"`
	Events int    `json:"events"`
	// PeakLive is the trace's peak of live bytes (Trace.PeakLive).
	PeakLive uint64 `json:"peak_live"`
	// PeakReserved is the allocator's peak of reserved bytes
	// (Stats().ReservedBytes.All.Peak).
	PeakReserved uint64 `json:"peak_reserved"`
	// Ratio is PeakReserved / PeakLive (0 for a trace with no live bytes).
	Ratio float64 `json:"ratio"`
	// NsPerEvent is the replay's wall time over the number of events.
	NsPerEvent float64 `json:"ns_per_event"`
	// Maps, Unmaps, Syncs, Retired, Retries and OOMs are the allocator's
	// Maps, Unmaps, Syncs, PagesRetired, NumAllocRetries and NumOOMs at
	// the end of the events.
	Maps    int64 `json:"maps"`
	Unmaps  int64 `json:"unmaps"`
	Syncs   int64 `json:"syncs"`
	Retired int64 `json:"retired"`
	Retries int64 `json:"retries"`
	OOMs    int64 `json:"ooms"`
	// LateMaps are the pages mapped over the second half of the events:
	// by the events after the first N/2 of N (N/2 rounded down, and at
	// least 1, so that a trace of one event has no second half and no
	// late maps); Maps at the end less Maps at that point, 0 if the
	// replay stopped before it. A loop whose layout has settled maps none
	// there, one whose layout moves every step keeps mapping
	// (policy:steady is for such loops). A trace whose live memory still
	// grows in its second half maps there too.
	LateMaps int64 `json:"late_maps"`
	// FailedAllocs counts allocations that failed with vmm.ErrOutOfMemory;
	// FirstFailure is the first of those errors.
	FailedAllocs int   `json:"-"`
	FirstFailure error `json:"-"`
}

// Replay drives a with the events of t in order and measures it. An
// allocation of 0 bytes is not sent to the allocator (PyTorch returns a
// null pointer for it), nor is its free. An allocation that fails with
// vmm.ErrOutOfMemory is counted in Result.FailedAllocs and the replay goes
// on without that block; any other error of the allocator stops the replay
// and comes back naming the trace line. Blocks live at the end of the
// events (or when the replay stops) are freed after the timing. Give
// Replay a fresh allocator: the peak and the counts it reports are the
// allocator's since it was opened.
func Replay(t *Trace, a Allocator, opt Options) (Result, error) {
	streams := opt.Streams
	if streams == nil {
		streams = make([]vmm.Stream, len(t.Streams))
	}
	if len(streams) != len(t.Streams) {
		return Result{}, fmt.Errorf("replaying %s: %d streams given for the trace's %d: %w",
			t.Name, len(streams), len(t.Streams), vmm.ErrInvalid)
	}
	res := Result{Trace: t.Name, Events: len(t.Events), PeakLive: t.PeakLive}
	ptrs := make([]vmm.DevicePtr, t.Slots) // 0: not allocated (never a block's address)
	start := time.Now()
	mid := int64(-1)
	err := run(t, a, streams, ptrs, &res, &mid, opt)
	elapsed := time.Since(start)
	st := a.Stats()
	if len(t.Events) > 0 {
		res.NsPerEvent = float64(elapsed.Nanoseconds()) / float64(len(t.Events))
	}
	res.PeakReserved = uint64(max(st.ReservedBytes.All.Peak, 0))
	if res.PeakLive > 0 {
		res.Ratio = float64(res.PeakReserved) / float64(res.PeakLive)
	}
	res.Maps, res.Unmaps, res.Syncs, res.Retired = st.Maps, st.Unmaps, st.Syncs, st.PagesRetired
	if mid >= 0 {
		res.LateMaps = st.Maps - mid
	}
	res.Retries, res.OOMs = st.NumAllocRetries, st.NumOOMs
	return res, errors.Join(err, freeLive(t, a, ptrs))
}

// run is the timed loop. It sets *mid to the allocator's Maps when it
// reaches the second half of the events (Result.LateMaps).
func run(t *Trace, a Allocator, streams []vmm.Stream, ptrs []vmm.DevicePtr, res *Result, mid *int64, opt Options) error {
	progress, sample, every := opt.Progress, opt.Sample, max(opt.SampleEvery, 1)
	half := max(len(t.Events)/2, 1)
	for i := range t.Events {
		if i == half {
			*mid = a.Stats().Maps
		}
		e := &t.Events[i]
		if e.Op == OpAlloc {
			if e.Size != 0 {
				p, err := a.Alloc(e.Size, streams[e.Stream])
				switch {
				case err == nil:
					ptrs[e.Slot] = p
				case errors.Is(err, vmm.ErrOutOfMemory):
					res.FailedAllocs++
					if res.FirstFailure == nil {
						res.FirstFailure = eventError(t, e, err)
					}
				default:
					return eventError(t, e, err)
				}
			}
		} else if p := ptrs[e.Slot]; p != 0 {
			if err := a.Free(p); err != nil {
				return eventError(t, e, err)
			}
			ptrs[e.Slot] = 0
		}
		if progress != nil && i&(ProgressEvery-1) == ProgressEvery-1 {
			progress(i + 1)
		}
		if sample != nil && (i+1)%every == 0 {
			sample(i + 1)
		}
	}
	if progress != nil {
		progress(len(t.Events))
	}
	if sample != nil && len(t.Events)%every != 0 {
		sample(len(t.Events))
	}
	return nil
}

// eventError says which event of t failed.
func eventError(t *Trace, e *Event, err error) error {
	id := t.IDs[e.Slot]
	if e.Op == OpAlloc {
		// err names the size (the allocator's errors do); the trace's
		// stream number is not the driver's stream it names.
		return fmt.Errorf("%s:%d: id %d, trace stream %d: %w",
			t.Name, e.Line, id, t.Streams[e.Stream], err)
	}
	return fmt.Errorf("%s:%d: freeing id %d: %w", t.Name, e.Line, id, err)
}

// freeLive frees every block still allocated.
func freeLive(t *Trace, a Allocator, ptrs []vmm.DevicePtr) error {
	var errs []error
	for slot, p := range ptrs {
		if p == 0 {
			continue
		}
		if err := a.Free(p); err != nil {
			errs = append(errs, fmt.Errorf("%s: freeing id %d after the replay: %w", t.Name, t.IDs[slot], err))
		}
		ptrs[slot] = 0
	}
	return errors.Join(errs...)
}

// OpenStreams makes the streams of t on dev: trace stream 0 is
// vmm.Stream(0), the default stream, and every other one a new stream of
// d. The returned function destroys the streams it made; call it when the
// replay is over.
func OpenStreams(d vmm.Driver, dev vmm.Device, t *Trace) ([]vmm.Stream, func() error, error) {
	streams := make([]vmm.Stream, len(t.Streams))
	var made []vmm.Stream
	destroy := func() error {
		var errs []error
		for _, s := range made {
			if err := d.StreamDestroy(s); err != nil {
				errs = append(errs, fmt.Errorf("destroying stream %#x: %w", uintptr(s), err))
			}
		}
		made = nil
		return errors.Join(errs...)
	}
	for i, n := range t.Streams {
		if n == 0 {
			continue
		}
		s, err := d.StreamCreate(dev)
		if err != nil {
			return nil, nil, errors.Join(fmt.Errorf("creating stream for trace stream %d: %w", n, err), destroy())
		}
		streams[i] = s
		made = append(made, s)
	}
	return streams, destroy, nil
}
