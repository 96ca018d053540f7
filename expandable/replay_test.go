package expandable

import (
	"bufio"
	"compress/gzip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// traceEvent is one line of a trace: an allocation (size > 0) or a free.
type traceEvent struct {
	id     uint64
	size   uint64
	stream uint64
}

func readTrace(t testing.TB, path string) []traceEvent {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		t.Skipf("trace %s not found", path)
	}
	require.NoError(t, err)
	defer f.Close()
	z, err := gzip.NewReader(f)
	require.NoError(t, err)
	var evs []traceEvent
	sc := bufio.NewScanner(z)
	for n := 1; sc.Scan(); n++ {
		fs := strings.Fields(sc.Text())
		num := func(i int) uint64 {
			v, err := strconv.ParseUint(fs[i], 10, 64)
			require.NoError(t, err, "line %d", n)
			return v
		}
		switch {
		case len(fs) == 4 && fs[0] == "a":
			evs = append(evs, traceEvent{id: num(1), size: num(2), stream: num(3)})
		case len(fs) == 2 && fs[0] == "f":
			evs = append(evs, traceEvent{id: num(1)})
		default:
			t.Fatalf("%s line %d: bad event %q", path, n, sc.Text())
		}
	}
	require.NoError(t, sc.Err())
	return evs
}

type replayResult struct {
	peakLive, peakReserved uint64
	ratio                  float64
	perEvent               time.Duration
}

// replay drives a with the events and returns peak live bytes of the trace
// and peak reserved bytes of the allocator.
func replay(t testing.TB, a *Allocator, evs []traceEvent) replayResult {
	streams := map[uint64]vmm.Stream{0: 0}
	live := map[uint64]struct {
		ptr  vmm.DevicePtr
		size uint64
	}{}
	var cur, peak uint64
	start := time.Now()
	for _, e := range evs {
		if e.size == 0 {
			b, ok := live[e.id]
			require.True(t, ok, "free of unknown id %d", e.id)
			require.NoError(t, a.Free(b.ptr))
			cur -= b.size
			delete(live, e.id)
			continue
		}
		s, ok := streams[e.stream]
		if !ok {
			var err error
			s, err = a.Driver().StreamCreate(a.Device())
			require.NoError(t, err)
			streams[e.stream] = s
			defer func() { require.NoError(t, a.Driver().StreamDestroy(s)) }()
		}
		ptr, err := a.Alloc(e.size, s)
		require.NoError(t, err)
		live[e.id] = struct {
			ptr  vmm.DevicePtr
			size uint64
		}{ptr, e.size}
		cur += e.size
		peak = max(peak, cur)
	}
	el := time.Since(start)
	st := a.Stats()
	r := replayResult{peakLive: peak, peakReserved: uint64(st.ReservedBytes.All.Peak), perEvent: el / time.Duration(len(evs))}
	r.ratio = float64(r.peakReserved) / float64(r.peakLive)
	t.Logf("peak reserved small %d large %d; peak allocated small %d large %d all %d",
		st.ReservedBytes.Small.Peak, st.ReservedBytes.Large.Peak, st.AllocatedBytes.Small.Peak, st.AllocatedBytes.Large.Peak, st.AllocatedBytes.All.Peak)
	require.NoError(t, a.Close())
	return r
}

func TestReplayTraces(t *testing.T) {
	if testing.Short() {
		t.Skip("replays are long")
	}
	for _, tc := range []struct {
		name  string
		limit float64
	}{
		// Targets 1.004 and 1.005 (PyTorch's expandable segments:
		// 1.00433 and 1.00469). Reached: 754 large pages at the peak of
		// gpt2_train (1.00300), and gpt2_varlen at PyTorch's 1.00469.
		// One 20 MiB page moves either ratio by 0.0013 (train) or 0.0008
		// (varlen): the guards sit just above what is reached.
		{"gpt2_train", 1.0031},
		{"gpt2_varlen", 1.0047},
	} {
		t.Run(tc.name, func(t *testing.T) {
			evs := readTrace(t, filepath.Join("..", "bench", "traces", tc.name+".trace.gz"))
			a := newAlloc(t, vmmtest.HostDriver(t, 0), ClassicConfig())
			r := replay(t, a, evs)
			st := a.Stats()
			t.Logf("%s: %d events, peak live %d, peak reserved %d, ratio %.5f, %v/event, maps %d, set-access calls %d",
				tc.name, len(evs), r.peakLive, r.peakReserved, r.ratio, r.perEvent, st.Maps, st.SetAccessCalls)
			require.LessOrEqual(t, r.ratio, tc.limit)
		})
	}
}
