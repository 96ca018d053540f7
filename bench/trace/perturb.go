package trace

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// Perturbation says how Perturb derives a variant of a trace. The zero
// value changes nothing; DefaultPerturbation is the one `xseg replay
// --perturb` uses.
type Perturbation struct {
	// Seed picks the variant: the same trace, Perturbation and Seed give
	// the same variant, on any machine and Go version.
	Seed uint64
	// ShiftMin and ShiftMax bound the size of a block allocated before the
	// trace's first event, on its first stream, and never freed: every
	// later address moves by it. Its size is drawn in [ShiftMin,
	// ShiftMax] in steps of ShiftStep bytes (ShiftMin is rounded up to
	// one). ShiftMax 0: no such block.
	ShiftMin, ShiftMax uint64
	// Jitter raises every distinct allocation size by a fraction drawn in
	// [0, Jitter), once per size and seed: blocks of one size in the trace
	// stay of one size in the variant, so the trace's pattern of reuse is
	// kept. The raise is rounded down to a multiple of ShiftStep bytes,
	// so a size that is a multiple of 512 stays one (and sizes under
	// 512/Jitter bytes do not change). 0: sizes stay as they are.
	Jitter float64
}

// ShiftStep is the granularity of the sizes a Perturbation draws: PyTorch
// rounds allocations to 512 bytes.
const ShiftStep = 512

// DefaultJitter is DefaultPerturbation's Jitter: 5 %.
const DefaultJitter = 0.05

// DefaultPerturbation is a long-lived first block of 1.5 to 20 MiB and
// sizes raised by up to DefaultJitter: perturbations small enough that a
// policy's ratio should barely move under them, and large enough to move
// every address and to change which free range fits which block.
func DefaultPerturbation(seed uint64) Perturbation {
	return Perturbation{Seed: seed, ShiftMin: 3 << 19, ShiftMax: 20 << 20, Jitter: DefaultJitter}
}

// Validate reports a Perturbation that Perturb cannot apply: a Jitter
// outside [0, 1], or no multiple of ShiftStep in [ShiftMin, ShiftMax].
func (p Perturbation) Validate() error {
	switch {
	case math.IsNaN(p.Jitter) || p.Jitter < 0 || p.Jitter > 1:
		return fmt.Errorf("perturbation: jitter %v is not in [0, 1]: %w", p.Jitter, vmm.ErrInvalid)
	case p.ShiftMax != 0 && (roundUp(p.ShiftMin) > p.ShiftMax || roundUp(p.ShiftMin) < p.ShiftMin):
		return fmt.Errorf("perturbation: no multiple of %d bytes in [%d, %d]: %w", ShiftStep, p.ShiftMin, p.ShiftMax, vmm.ErrInvalid)
	}
	return nil
}

// Perturb returns a variant of t as p says (see Perturbation), named after
// t and the seed. Its PeakLive and LiveAtEnd are the variant's own, the
// long-lived block included: a replay's ratio stays peak reserved over
// peak live of what was replayed. The added block's event has Line 0 and
// the others keep their lines in t's file. t is not changed.
func Perturb(t *Trace, p Perturbation) (*Trace, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	v := &Trace{Name: fmt.Sprintf("%s (seed %d)", t.Name, p.Seed), Streams: t.Streams, IDs: t.IDs}
	events := make([]Event, 0, len(t.Events)+1)
	first := uint32(0) // the slot of t's slot 0 in v
	if p.ShiftMax != 0 {
		id, err := unusedID(t.IDs)
		if err != nil || t.Slots >= math.MaxUint32 {
			return nil, errors.Join(err, fmt.Errorf("perturbing %s: no slot left for a first block: %w", t.Name, vmm.ErrInvalid))
		}
		v.IDs = append([]uint64{id}, t.IDs...)
		if len(v.Streams) == 0 {
			v.Streams = []uint32{0}
		}
		events = append(events, Event{Op: OpAlloc, Size: p.shiftSize()})
		first = 1
	}
	v.IDs = slices.Clip(v.IDs)
	raised := make(map[uint64]uint64) // size -> the variant's size
	for _, e := range t.Events {
		e.Slot += first
		if e.Op == OpAlloc {
			n, ok := raised[e.Size]
			if !ok {
				n = p.raise(e.Size)
				raised[e.Size] = n
			}
			e.Size = n
		}
		events = append(events, e)
	}
	v.Events, v.Slots = events, len(v.IDs)
	if err := v.measure(); err != nil {
		return nil, fmt.Errorf("perturbing %s: %w", t.Name, err)
	}
	return v, nil
}

// measure sets PeakLive and LiveAtEnd from the events.
func (t *Trace) measure() error {
	sizes := make([]uint64, t.Slots)
	var live uint64
	t.PeakLive, t.LiveAtEnd = 0, 0
	for _, e := range t.Events {
		if e.Op == OpFree {
			live -= sizes[e.Slot]
			t.LiveAtEnd--
			continue
		}
		if live > math.MaxUint64-e.Size {
			return fmt.Errorf("line %d: live bytes overflow 64 bits: %w", e.Line, vmm.ErrInvalid)
		}
		sizes[e.Slot] = e.Size
		live += e.Size
		t.LiveAtEnd++
		t.PeakLive = max(t.PeakLive, live)
	}
	return nil
}

// unusedID returns an id that no slot of ids has: one more than the
// largest, or the smallest free one when the largest is MaxUint64.
func unusedID(ids []uint64) (uint64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	if m := slices.Max(ids); m < math.MaxUint64 {
		return m + 1, nil
	}
	sorted := slices.Sorted(slices.Values(ids))
	for i, id := range sorted {
		if id != uint64(i) {
			return uint64(i), nil
		}
	}
	return 0, errors.New("every id is taken") // unreachable: a trace has fewer than 2^32 ids
}

// shiftSize draws the first block's size.
func (p Perturbation) shiftSize() uint64 {
	lo := roundUp(p.ShiftMin)
	steps := (p.ShiftMax-lo)/ShiftStep + 1
	return lo + draw(p.Seed, shiftStream)%steps*ShiftStep
}

// raise is size in the variant: size plus a fraction in [0, Jitter) of
// it, rounded down to a multiple of ShiftStep.
func (p Perturbation) raise(size uint64) uint64 {
	if p.Jitter == 0 {
		return size
	}
	frac := p.Jitter * unit(draw(p.Seed, size))
	r := uint64(float64(size)*frac) &^ (ShiftStep - 1)
	if size > math.MaxUint64-r {
		return size
	}
	return size + r
}

// shiftStream keeps the first block's draw apart from the sizes' draws
// (which are keyed by the size): no allocation is 2^64-1 bytes.
const shiftStream = math.MaxUint64

// roundUp rounds n up to a multiple of ShiftStep, saturating: past the
// largest multiple, it returns that one, below n (Validate refuses it).
func roundUp(n uint64) uint64 {
	if n > math.MaxUint64-(ShiftStep-1) {
		return math.MaxUint64 &^ (ShiftStep - 1)
	}
	return (n + ShiftStep - 1) &^ (ShiftStep - 1)
}

// draw is a random number for (seed, key): SplitMix64's finaliser over
// both. It depends on nothing else (not the order of the trace's sizes,
// not math/rand's streams), so a baseline recorded once stays valid.
func draw(seed, key uint64) uint64 {
	return mix(mix(seed) ^ key)
}

func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// unit maps x to [0, 1) with 53 bits.
func unit(x uint64) float64 { return float64(x>>11) / (1 << 53) }
