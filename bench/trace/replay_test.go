package trace

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// fakeAlloc is a bump allocator that reserves each block rounded up to
// 1024 bytes and never reuses addresses. It fails the allocation number
// oomAt (from 1) with ErrOutOfMemory and the free of address badFree.
type fakeAlloc struct {
	next    vmm.DevicePtr
	live    map[vmm.DevicePtr]uint64
	streams map[vmm.Stream]int
	st      spec.Stats
	allocs  int
	oomAt   int
	badFree vmm.DevicePtr
}

func newFake() *fakeAlloc {
	return &fakeAlloc{next: 0x10000, live: map[vmm.DevicePtr]uint64{}, streams: map[vmm.Stream]int{}}
}

func (f *fakeAlloc) Alloc(size uint64, s vmm.Stream) (vmm.DevicePtr, error) {
	f.allocs++
	if f.allocs == f.oomAt {
		f.st.NumOOMs++
		return 0, fmt.Errorf("fake: %w", vmm.ErrOutOfMemory)
	}
	if size == 0 {
		return 0, fmt.Errorf("fake: size 0: %w", vmm.ErrInvalid)
	}
	r := (size + 1023) &^ 1023
	p := f.next
	f.next += vmm.DevicePtr(r)
	f.live[p] = r
	f.streams[s]++
	f.st.ReservedBytes.All.Add(int64(r))
	f.st.Maps++
	return p, nil
}

func (f *fakeAlloc) Free(p vmm.DevicePtr) error {
	r, ok := f.live[p]
	if !ok || p == f.badFree {
		return fmt.Errorf("fake: free %v: %w", p, vmm.ErrInvalid)
	}
	delete(f.live, p)
	f.st.ReservedBytes.All.Add(-int64(r))
	f.st.Unmaps++
	return nil
}

func (f *fakeAlloc) Stats() spec.Stats { return f.st }

func parse(t *testing.T, s string) *Trace {
	t.Helper()
	tr, err := Parse("t", strings.NewReader(s))
	require.NoError(t, err)
	return tr
}

func TestReplay(t *testing.T) {
	tr := parse(t, good)
	f := newFake()
	var progress []int
	res, err := Replay(tr, f, Options{Streams: []vmm.Stream{0, 42}, Progress: func(n int) { progress = append(progress, n) }})
	require.NoError(t, err)
	// reserved: 1024, 4096, 5120 (peak), 4096, 6144 (peak), 5120, 2048;
	// of the four allocations, the last (event 5 of 7) is in the second half.
	require.Equal(t, Result{Trace: "t", Events: 7, PeakLive: 5500, PeakReserved: 6144,
		Ratio: 6144.0 / 5500, NsPerEvent: res.NsPerEvent, Maps: 4, Unmaps: 3, LateMaps: 1}, res)
	require.Greater(t, res.NsPerEvent, 0.0)
	require.Empty(t, f.live, "blocks live at the end are freed")
	require.Equal(t, map[vmm.Stream]int{0: 2, 42: 2}, f.streams)
	require.Equal(t, []int{7}, progress)
}

// TestReplayLateMapsShortTraces: late maps are those of the events after
// the first N/2 (rounded down, at least 1) of N. A trace of one event
// counted its only map as late: N/2 is 0, so its "second half" was the
// whole trace.
func TestReplayLateMapsShortTraces(t *testing.T) {
	for _, c := range []struct {
		trace      string
		maps, late int64
	}{
		{"a 1 512 0\n", 1, 0},
		{"a 1 512 0\na 2 512 0\n", 2, 1},
		{"a 1 512 0\na 2 512 0\na 3 512 0\n", 3, 2},
		{"a 1 512 0\na 2 512 0\na 3 512 0\na 4 512 0\n", 4, 2},
		{"", 0, 0},
	} {
		res, err := Replay(parse(t, c.trace), newFake(), Options{})
		require.NoError(t, err)
		require.Equal(t, c.maps, res.Maps, "%q", c.trace)
		require.Equal(t, c.late, res.LateMaps, "%q", c.trace)
	}
}

func TestReplayJSONKeys(t *testing.T) {
	b, err := json.Marshal(Result{FailedAllocs: 3, FirstFailure: errors.New("x")})
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	require.Equal(t, []string{"events", "late_maps", "maps", "ns_per_event", "ooms", "peak_live", "peak_reserved",
		"ratio", "retired", "retries", "syncs", "trace", "unmaps"}, keys)
}

func TestReplayOutOfMemoryGoesOn(t *testing.T) {
	tr := parse(t, good)
	f := newFake()
	f.oomAt = 2 // id 8, freed at line 8
	res, err := Replay(tr, f, Options{})
	require.NoError(t, err)
	require.Equal(t, 1, res.FailedAllocs)
	require.EqualValues(t, 1, res.OOMs)
	require.ErrorIs(t, res.FirstFailure, vmm.ErrOutOfMemory)
	require.Contains(t, res.FirstFailure.Error(), "t:2: id 8, trace stream 5: ")
	require.EqualValues(t, 3, res.Maps)
	require.Empty(t, f.live)
}

func TestReplayErrorStops(t *testing.T) {
	tr := parse(t, good)
	f := newFake()
	f.badFree = 0x10000 // id 7, freed at line 5
	_, err := Replay(tr, f, Options{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.Contains(t, err.Error(), "t:5: freeing id 7")
	require.Contains(t, err.Error(), "freeing id 7 after the replay", "the live block is still freed (and fails again)")
	require.Len(t, f.live, 1)
}

func TestReplayZeroSize(t *testing.T) {
	tr := parse(t, "a 1 0 0\na 2 10 0\nf 1\nf 2\n")
	f := newFake()
	res, err := Replay(tr, f, Options{})
	require.NoError(t, err, "a 0-byte allocation never reaches the allocator")
	require.Equal(t, 1, f.allocs)
	require.Equal(t, uint64(10), res.PeakLive)
}

func TestReplayStreamsMismatch(t *testing.T) {
	_, err := Replay(parse(t, good), newFake(), Options{Streams: []vmm.Stream{0}})
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

func TestReplayProgress(t *testing.T) {
	var b strings.Builder
	n := ProgressEvery + 10
	for i := range n {
		fmt.Fprintf(&b, "a %d 1 0\n", i)
	}
	var progress []int
	_, err := Replay(parse(t, b.String()), newFake(), Options{Progress: func(d int) { progress = append(progress, d) }})
	require.NoError(t, err)
	require.Equal(t, []int{ProgressEvery, n}, progress)
}
