package ledger_test

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// model is the plainest possible book of mappings: a map from granule to
// the mapping covering it. The ledger must answer every operation as the
// model does.
type model struct {
	ranges []modelRange
	pages  map[vmm.Handle]*modelPage
	at     map[vmm.DevicePtr]*ledger.Mapping // by granule
}

type modelRange struct {
	ptr  vmm.DevicePtr
	size uint64
	live bool
}

type modelPage struct {
	size uint64
	maps int
}

// Three reservations: two adjacent (the second spanning three chunks of
// 512 granules) and one apart.
func newModel() *model {
	return &model{
		ranges: []modelRange{
			{base, 8 * G, true},
			{at(8), 1100 * G, true},
			{at(5000), 40 * G, true},
		},
		pages: map[vmm.Handle]*modelPage{},
		at:    map[vmm.DevicePtr]*ledger.Mapping{},
	}
}

func (m *model) rangeOf(ptr vmm.DevicePtr, size uint64) bool {
	for _, r := range m.ranges {
		if r.live && ptr >= r.ptr && uint64(ptr-r.ptr)+size <= r.size {
			return true
		}
	}
	return false
}

// cover returns the mappings that exactly cover [ptr, ptr+size), or nil.
func (m *model) cover(ptr vmm.DevicePtr, size uint64) []*ledger.Mapping {
	var out []*ledger.Mapping
	for p := ptr; p < ptr.Add(size); {
		x := m.at[p]
		if x == nil || x.Ptr != p || x.Ptr.Add(x.Size) > ptr.Add(size) {
			return nil
		}
		out = append(out, x)
		p = p.Add(x.Size)
	}
	return out
}

func (m *model) usage() (mappings int, bytes uint64) {
	seen := map[*ledger.Mapping]bool{}
	for _, x := range m.at {
		if !seen[x] {
			seen[x] = true
			mappings++
			bytes += x.Size
		}
	}
	return mappings, bytes
}

// pick returns an address near a boundary worth testing: range ends,
// chunk ends, or anywhere.
func pick(rng *rand.Rand) vmm.DevicePtr {
	hot := []uint64{0, 7, 8, 9, 15, 8 + 510, 8 + 511, 8 + 512, 8 + 1023, 8 + 1024, 8 + 1099, 1108, 5000, 5039, 5040}
	g := hot[rng.IntN(len(hot))] + uint64(rng.IntN(5)) - 2
	if rng.IntN(3) == 0 {
		g = uint64(rng.IntN(1120))
	}
	return at(g)
}

func TestLedgerMatchesModel(t *testing.T) {
	for seed := range uint64(4) {
		runModel(t, rand.New(rand.NewPCG(seed, 7)), 4000)
	}
}

func runModel(t *testing.T, rng *rand.Rand, steps int) {
	l := ledger.New(G)
	m := newModel()
	for _, r := range m.ranges {
		l.AddRange(r.ptr, r.size)
	}
	var lastUnmapped []ledger.Mapping
	next := vmm.Handle(1)
	for step := range steps {
		switch op := rng.IntN(9); op {
		case 0: // a page of 1 to 3 granules
			size := uint64(1+rng.IntN(3)) * G
			l.AddPage(next, 0, size, vmm.HandleNone)
			m.pages[next] = &modelPage{size: size}
			next++
		case 1, 2: // map a page, maybe a stale one
			h := vmm.Handle(1 + rng.IntN(int(next)))
			p := pick(rng)
			size := uint64(1+rng.IntN(3)) * G
			mp := m.pages[h]
			ok := mp != nil && mp.size == size && m.rangeOf(p, size)
			for q := p; ok && q < p.Add(size); q = q.Add(G) {
				ok = m.at[q] == nil
			}
			_, err := l.BeginMap(p, size, h, 0)
			require.Equal(t, ok, err == nil, "step %d: map %v+%d of %d: %v", step, p, size, h, err)
			if ok {
				x := &ledger.Mapping{Ptr: p, Size: size, Handle: h}
				for q := p; q < p.Add(size); q = q.Add(G) {
					m.at[q] = x
				}
				mp.maps++
			}
		case 3, 4: // unmap a run; sometimes undo it
			p, size := pick(rng), uint64(1+rng.IntN(6))*G
			want := m.cover(p, size)
			ms, err := l.BeginUnmap(p, size, nil)
			require.Equal(t, want != nil, err == nil, "step %d: unmap %v+%d: %v", step, p, size, err)
			require.Len(t, ms, len(want))
			for i, x := range want {
				require.Equal(t, x.Ptr, ms[i].Ptr)
				require.Equal(t, x.Handle, ms[i].Handle)
				for q := x.Ptr; q < x.Ptr.Add(x.Size); q = q.Add(G) {
					delete(m.at, q)
				}
				if mp := m.pages[x.Handle]; mp != nil { // nil: an undo put back a mapping of a page released in between
					mp.maps--
				}
			}
			lastUnmapped = ms
		case 5: // a failed unmap: put the last run back
			l.UndoUnmap(lastUnmapped)
			for _, x := range lastUnmapped {
				free := true // else a map took the place meanwhile
				for q := x.Ptr; q < x.Ptr.Add(x.Size); q = q.Add(G) {
					free = free && m.at[q] == nil
				}
				if !free {
					continue
				}
				for q := x.Ptr; q < x.Ptr.Add(x.Size); q = q.Add(G) {
					m.at[q] = &x
				}
				if mp := m.pages[x.Handle]; mp != nil {
					mp.maps++
				}
			}
			lastUnmapped = nil
		case 6: // grant access, device 0 or 1
			p, size := pick(rng), uint64(1+rng.IntN(6))*G
			dev := vmm.Device(rng.IntN(2))
			want := m.cover(p, size)
			_, err := l.GrantAccess(p, size, vmm.ReadWrite(dev))
			require.Equal(t, want != nil, err == nil, "step %d: access %v+%d: %v", step, p, size, err)
			for _, x := range want {
				x.Access = grant(x.Access, dev)
			}
		case 7: // release a page
			h := vmm.Handle(1 + rng.IntN(int(next)))
			mp := m.pages[h]
			_, err := l.BeginRelease(h)
			require.Equal(t, mp != nil && mp.maps == 0, err == nil, "step %d: release %d: %v", step, h, err)
			if err == nil {
				delete(m.pages, h)
			}
		case 8: // unreserve and reserve again, if nothing is mapped
			i := rng.IntN(len(m.ranges))
			r := m.ranges[i]
			empty := true
			for q := r.ptr; q < r.ptr.Add(r.size); q = q.Add(G) {
				empty = empty && m.at[q] == nil
			}
			err := l.BeginUnreserve(r.ptr, r.size)
			require.Equal(t, empty, err == nil, "step %d: unreserve %v: %v", step, r.ptr, err)
			if err == nil {
				l.UndoUnreserve(r.ptr, r.size)
			}
		}
		checkModel(t, l, m, pick(rng), step)
	}
}

// grant gives dev read-write access in the list acc, as SetAccess merges.
func grant(acc []vmm.AccessDesc, dev vmm.Device) []vmm.AccessDesc {
	var out []vmm.AccessDesc
	for _, a := range acc {
		if a.Device != dev {
			out = append(out, a)
		}
	}
	return append(out, vmm.AccessDesc{Device: dev, Flags: vmm.AccessReadWrite})
}

func checkModel(t *testing.T, l *ledger.Ledger, m *model, p vmm.DevicePtr, step int) {
	n, bytes := m.usage()
	u := l.Usage()
	require.Equal(t, n, u.Mappings, "step %d", step)
	require.Equal(t, bytes, u.MappedBytes, "step %d", step)
	got, ok := l.Lookup(p.Add(G / 2))
	want := m.at[p]
	require.Equal(t, want != nil, ok, "step %d: lookup %v", step, p)
	if ok {
		require.Equal(t, want.Ptr, got.Ptr, "step %d", step)
		require.Equal(t, want.Size, got.Size, "step %d", step)
		require.Equal(t, want.Handle, got.Handle, "step %d", step)
		require.ElementsMatch(t, want.Access, got.Access, "step %d", step)
	}
}

// FuzzLedgerModel runs the model comparison from a seed the fuzzer picks.
func FuzzLedgerModel(f *testing.F) {
	for _, seed := range []uint64{11, 12, 13} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, seed uint64) {
		runModel(t, rand.New(rand.NewPCG(seed, 7)), 500)
	})
}
