package expandable

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/internal/core"
	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
	"github.com/xseg-dev/xseg/vmm/vmmtest"
)

// Tests of pause and resume (pause.go, internal/core/pause.go) on the host
// backend, whose pages are memory files: a page made anew reads as zeros.

const tagName = "weights"

// pauseEnv is an allocator over Faulty(host) with the tag "weights".
type pauseEnv struct {
	t    testing.TB
	host *host.Driver
	f    *vmmtest.Faulty
	a    *Allocator
	id   core.PoolID
}

func newPauseEnv(t testing.TB, hd *host.Driver, cfg Config) *pauseEnv {
	t.Helper()
	f := vmmtest.NewFaulty(hd)
	a, err := New(f, 0, cfg, nil)
	require.NoError(t, err)
	e := &pauseEnv{t: t, host: hd, f: f, a: a}
	e.id, err = a.Tag(tagName)
	require.NoError(t, err)
	return e
}

// newPaused is a pauseEnv on a host driver that the test checks for
// leaks and closes, after the allocator.
func newPaused(t *testing.T, cfg Config) *pauseEnv {
	t.Helper()
	e := newPauseEnv(t, vmmtest.HostDriver(t, 0), cfg)
	t.Cleanup(func() { require.NoError(t, e.a.Close()) })
	return e
}

// block is an allocation whose bytes the test knows.
type block struct {
	ptr  vmm.DevicePtr
	size uint64
	seed uint64
}

// tagBytes is the pattern of a block: size bytes from seed. The slices
// are shared: read them only.
func tagBytes(size, seed uint64) []byte {
	key := [2]uint64{size, seed}
	if b, ok := patterns.Load(key); ok {
		return b.([]byte)
	}
	b := make([]byte, (size+7)/8*8)
	r := rand.New(rand.NewPCG(seed, size))
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	patterns.Store(key, b[:size])
	return b[:size]
}

var patterns sync.Map

// allocTagged allocates blocks of the sizes in the tag and writes a
// pattern into each.
func (e *pauseEnv) allocTagged(sizes ...uint64) []block {
	e.t.Helper()
	var bs []block
	for i, size := range sizes {
		p, err := e.a.AllocInPool(e.id, size, 0)
		require.NoError(e.t, err)
		b := block{ptr: p, size: size, seed: uint64(i) + 1}
		require.NoError(e.t, e.host.CopyHtoD(p, tagBytes(size, b.seed)))
		bs = append(bs, b)
	}
	return bs
}

// intact reports whether every block holds its pattern.
func (e *pauseEnv) intact(bs []block) error {
	for _, b := range bs {
		got := make([]byte, b.size)
		if err := e.host.CopyDtoH(got, b.ptr); err != nil {
			return err
		}
		if !bytes.Equal(got, tagBytes(b.size, b.seed)) {
			return fmt.Errorf("block %v+%d does not hold its bytes", b.ptr, b.size)
		}
	}
	return nil
}

func (e *pauseEnv) tagStats() core.PoolCheckpoint {
	e.t.Helper()
	cp, err := e.a.CheckpointPool(e.id)
	require.NoError(e.t, err)
	return cp
}

// reservedIsHeld checks that ReservedBytes is every page the driver holds
// for the allocator: mapped, cached and stuck pages alike.
func (e *pauseEnv) reservedIsHeld() {
	e.t.Helper()
	require.Equal(e.t, e.host.Usage().HandleBytes, uint64(e.a.Stats().ReservedBytes.All.Current), "ReservedBytes against the driver's pages")
}

// sizes of the tag's blocks in most tests: two small-pool blocks and
// large-pool blocks over three 20 MiB pages.
var tagSizes = []uint64{4 << 10, 100 << 10, 3 * mib, 25 * mib}

func TestPauseKeepsContentsAndAddresses(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(tagSizes...)
	other, err := e.a.Alloc(5*mib, 0) // the shared pools are not the tag's
	require.NoError(t, err)
	require.NoError(t, e.host.CopyHtoD(other, tagBytes(5*mib, 99)))
	before := e.a.Stats()
	live, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.Equal(t, uint64(2*mib+40*mib), live.ReservedBytes, "one small page, two large ones")
	require.Equal(t, int64(4), live.Allocations)
	freeBefore, _, err := e.host.MemInfo(0)
	require.NoError(t, err)
	mapsBefore := e.host.Usage().Mappings

	require.NoError(t, e.a.Pause(true, tagName))
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.True(t, ts.Paused)
	require.True(t, ts.Backup)
	require.Zero(t, ts.ReservedBytes)
	require.Equal(t, live.ReservedBytes, ts.PausedBytes)
	require.Equal(t, live.AllocatedBytes, ts.AllocatedBytes, "blocks stay allocated")
	require.Equal(t, uint64(4<<10+100<<10+3*mib+25*mib), ts.BackupBytes, "the requested bytes of each block")
	require.Equal(t, int64(1), ts.Pauses)
	paused := e.a.Stats()
	require.Equal(t, before.ReservedBytes.All.Current-int64(live.ReservedBytes), paused.ReservedBytes.All.Current, "ReservedBytes drops by the tag's pages")
	require.Equal(t, before.AllocatedBytes, paused.AllocatedBytes)
	e.reservedIsHeld()
	free, _, err := e.host.MemInfo(0)
	require.NoError(t, err)
	require.Equal(t, freeBefore+live.ReservedBytes, free, "the device has the pages back")
	require.Equal(t, mapsBefore-3, e.host.Usage().Mappings)
	_, err = e.host.GetAccess(bs[0].ptr, 0)
	require.ErrorIs(t, err, vmm.ErrInvalid, "nothing is mapped at a paused block")

	_, err = e.a.AllocInPool(e.id, 4096, 0)
	require.ErrorIs(t, err, ErrPausedForTest)
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, `tag "weights"`)

	require.NoError(t, e.a.Resume(tagName))
	require.NoError(t, e.intact(bs), "the backup is restored")
	require.NoError(t, e.intact([]block{{other, 5 * mib, 99}}))
	require.Equal(t, before.ReservedBytes.All.Current, e.a.Stats().ReservedBytes.All.Current)
	e.reservedIsHeld()
	ts, err = e.a.TagStats(tagName)
	require.NoError(t, err)
	require.False(t, ts.Paused)
	require.Equal(t, live.ReservedBytes, ts.ReservedBytes)
	require.Zero(t, ts.BackupBytes)
	require.Equal(t, int64(1), ts.Remaps)
	for _, b := range bs {
		a, err := e.host.GetAccess(b.ptr, 0)
		require.NoError(t, err)
		require.Equal(t, vmm.AccessReadWrite, a)
	}
	p, err := e.a.AllocInPool(e.id, 4096, 0)
	require.NoError(t, err, "a resumed tag allocates")
	require.NoError(t, e.a.Free(p))
}

// ErrPausedForTest is core.ErrPaused, the error the root package exports.
var ErrPausedForTest = core.ErrPaused

func TestPauseWithoutBackup(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(tagSizes...)
	cp := e.tagStats()
	require.NoError(t, e.a.Pause(false))
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.True(t, ts.Paused)
	require.False(t, ts.Backup)
	require.Zero(t, ts.BackupBytes)
	require.NoError(t, e.a.Resume())
	require.Equal(t, cp, e.tagStats(), "the same blocks at the same addresses")
	for _, b := range bs {
		got := make([]byte, b.size)
		require.NoError(t, e.host.CopyDtoH(got, b.ptr))
		require.Equal(t, make([]byte, b.size), got, "new pages read as zeros on the host backend")
	}
}

func TestPauseIdempotent(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(tagSizes...)
	require.NoError(t, e.a.Resume(tagName), "resuming a live tag does nothing")
	require.NoError(t, e.a.Pause(true, tagName))
	calls := e.f.Calls(vmmtest.OpUnmap)
	require.NoError(t, e.a.Pause(false, tagName, tagName), "pausing a paused tag does nothing")
	require.Equal(t, calls, e.f.Calls(vmmtest.OpUnmap))
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.True(t, ts.Backup, "the first pause's backup is kept")
	require.Equal(t, int64(1), ts.Pauses)
	require.NoError(t, e.a.Resume(tagName))
	require.NoError(t, e.a.Resume(tagName))
	require.NoError(t, e.intact(bs))
	ts, err = e.a.TagStats(tagName)
	require.NoError(t, err)
	require.Equal(t, int64(1), ts.Remaps)
}

func TestPauseSeveralTags(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(3*mib, 4096)
	kv, err := e.a.Tag("kv_cache")
	require.NoError(t, err)
	again, err := e.a.Tag("kv_cache")
	require.NoError(t, err)
	require.Equal(t, kv, again, "a tag is made once")
	require.NotEqual(t, e.id, kv)
	require.True(t, kv.IsTag())
	require.Equal(t, []string{"kv_cache", "weights"}, e.a.Tags())
	k, err := e.a.AllocInPool(kv, 30*mib, 0)
	require.NoError(t, err)

	require.NoError(t, e.a.Pause(true, tagName))
	require.NoError(t, e.a.Pause(false, "kv_cache"))
	require.Zero(t, e.a.Stats().ReservedBytes.All.Current, "both tags paused, nothing else held")
	require.NoError(t, e.a.Resume(), "every paused tag")
	require.NoError(t, e.intact(bs))
	require.NoError(t, e.host.Memset(k, 1, 30*mib), "kv_cache is mapped again")
	require.NoError(t, e.a.Pause(false), "every tag")
	for _, name := range e.a.Tags() {
		ts, err := e.a.TagStats(name)
		require.NoError(t, err)
		require.True(t, ts.Paused, name)
	}
	require.ErrorIs(t, e.a.Pause(false, "nope"), vmm.ErrInvalid)
	require.ErrorIs(t, e.a.Resume("nope"), vmm.ErrInvalid)
	_, err = e.a.TagStats("nope")
	require.ErrorIs(t, err, vmm.ErrInvalid)
}

func TestTagNamesAndPoolCalls(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	for _, bad := range []string{"", "a\x00b", string([]byte{0xff}), string(make([]byte, 257))} {
		_, err := e.a.Tag(bad)
		require.ErrorIs(t, err, vmm.ErrInvalid, "%q", bad)
	}
	require.ErrorIs(t, e.a.ReleasePool(e.id), vmm.ErrInvalid, "a tag's own use is never released")
	require.NoError(t, e.a.RetainPool(e.id))
	require.NoError(t, e.a.ReleasePool(e.id), "other uses are")
	unknown := core.PoolID{First: e.id.First, Second: 77}
	require.ErrorIs(t, e.a.RetainPool(unknown), vmm.ErrInvalid, "the tags' id range holds tags only")
	require.ErrorIs(t, e.a.BeginAllocateToPool(unknown, nil), vmm.ErrInvalid)
	p, err := e.a.AllocInPool(e.id, 4096, 0)
	require.NoError(t, err)
	require.NoError(t, e.a.Free(p))
}

func TestFreeInPausedTag(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(tagSizes...)
	require.NoError(t, e.a.Pause(true))
	require.NoError(t, e.a.Free(bs[1].ptr), "a block of a paused tag can be freed")
	require.ErrorIs(t, e.a.Free(bs[1].ptr), vmm.ErrInvalid, "once")
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.Equal(t, int64(3), ts.Allocations)
	require.Zero(t, ts.ReservedBytes)
	require.Equal(t, int64(tagSizes[0]+tagSizes[2]+tagSizes[3]), e.a.Stats().RequestedBytes.All.Current)
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact([]block{bs[0], bs[2], bs[3]}))
	cp := e.tagStats()
	require.Len(t, cp.Blocks, 3)
	p, err := e.a.AllocInPool(e.id, tagSizes[1], 0)
	require.NoError(t, err)
	require.Equal(t, bs[1].ptr, p, "the freed block's place is free again")
}

// TestPauseLeavesSharedPoolsAlone: EmptyCache, the OOM policy and the
// release threshold never touch a paused tag, and pausing a tag touches
// nothing else.
func TestPauseLeavesSharedPoolsAlone(t *testing.T) {
	cfg := ClassicConfig()
	cfg.ReleaseThreshold = 1
	e := newPauseEnv(t, vmmtest.HostDriver(t, 200*mib), cfg)
	defer func() { require.NoError(t, e.a.Close()) }()
	bs := e.allocTagged(tagSizes...)
	require.NoError(t, e.a.Pause(true))
	require.NoError(t, e.a.EmptyCache())
	// The release threshold counts the shared pools' free pages right
	// while a tag is paused: a freed page is unmapped at once.
	p, err := e.a.Alloc(20*mib, 0)
	require.NoError(t, err)
	unmaps := e.a.Stats().Unmaps
	require.NoError(t, e.a.Free(p))
	require.Equal(t, unmaps+1, e.a.Stats().Unmaps, "the threshold unmaps the freed page")
	// The OOM policy: fill the device, fail, free.
	var held []vmm.DevicePtr
	for {
		p, err := e.a.Alloc(20*mib, 0)
		if err != nil {
			require.ErrorIs(t, err, vmm.ErrOutOfMemory)
			break
		}
		held = append(held, p)
	}
	require.Len(t, held, 10, "the paused tag's pages went back to the device")
	for _, p := range held {
		require.NoError(t, e.a.Free(p))
	}
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.True(t, ts.Paused)
	require.NoError(t, e.a.Free(bs[0].ptr), "a free in a paused tag under a release threshold")
	e.reservedIsHeld()
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs[1:]))
}

// TestResumeOutOfMemory: a Resume that finds the device full gives back
// the free pages of the shared pools and tries again; one that still does
// not fit fails and leaves the tag paused, to be retried.
func TestResumeOutOfMemory(t *testing.T) {
	e := newPauseEnv(t, vmmtest.HostDriver(t, 100*mib), ClassicConfig())
	defer func() { require.NoError(t, e.a.Close()) }()
	bs := e.allocTagged(3*mib, 25*mib) // 2 MiB + 40 MiB
	require.NoError(t, e.a.Pause(true))
	p, err := e.a.Alloc(80*mib, 0)
	require.NoError(t, err)
	err = e.a.Resume()
	require.ErrorIs(t, err, vmm.ErrOutOfMemory)
	ts, serr := e.a.TagStats(tagName)
	require.NoError(t, serr)
	require.True(t, ts.Paused, "a failed resume leaves the tag paused")
	e.reservedIsHeld()
	require.NoError(t, e.a.Free(p)) // cached as free pages of the shared large pool
	require.Equal(t, int64(80*mib), e.a.Stats().ReservedBytes.All.Current)
	require.NoError(t, e.a.Resume(), "the shared pools' free pages go back for it")
	require.NoError(t, e.intact(bs))
	e.reservedIsHeld()

	require.NoError(t, e.a.Pause(true))
	e.a.SetMemoryLimit(20 * mib)
	require.ErrorIs(t, e.a.Resume(), vmm.ErrOutOfMemory, "the memory limit holds")
	e.a.SetMemoryLimit(0)
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs))
}

// TestPauseRefusesSharedBlocks: a tag with a block pinned for another
// process is not paused; the error names the block.
func TestPauseRefusesSharedBlocks(t *testing.T) {
	cfg := ClassicConfig()
	cfg.Shareable = true
	e := newPaused(t, cfg)
	bs := e.allocTagged(tagSizes...)
	pin, err := e.a.PinBlock(bs[2].ptr)
	require.NoError(t, err)
	err = e.a.Pause(true, tagName)
	require.ErrorIs(t, err, vmm.ErrInUse)
	require.ErrorContains(t, err, bs[2].ptr.String())
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.False(t, ts.Paused)
	require.NoError(t, e.intact(bs))
	// Freed by its owner, still pinned: still shared.
	require.NoError(t, e.a.Free(bs[2].ptr))
	require.ErrorIs(t, e.a.Pause(false), vmm.ErrInUse)
	require.NoError(t, pin.Unpin())
	require.NoError(t, e.a.Pause(true))
	_, err = e.a.PinBlock(bs[0].ptr)
	require.ErrorIs(t, err, ErrPausedForTest, "a paused block cannot be shared")
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact([]block{bs[0], bs[1], bs[3]}))
}

// TestPauseCapture: a tag routes a capture like any private pool; a graph
// captured into it finds every address mapped again after resume. Pause
// and resume wait for no capture.
func TestPauseCapture(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	s, err := e.host.StreamCreate(0)
	require.NoError(t, err)
	defer func() { require.NoError(t, e.host.StreamDestroy(s)) }()
	require.NoError(t, e.a.BeginAllocateToPool(e.id, onStream(s)))
	in, err := e.a.Alloc(1*mib, s)
	require.NoError(t, err)
	tmp, err := e.a.Alloc(8*mib, s)
	require.NoError(t, err)
	require.NoError(t, e.a.Free(tmp)) // a temporary of the graph
	require.ErrorIs(t, e.a.Pause(true), vmm.ErrInUse)
	require.ErrorIs(t, e.a.Resume(), vmm.ErrInUse)
	require.ErrorIs(t, e.a.Pause(true), spec.ErrCapturing, "as EmptyCache's")
	require.ErrorIs(t, e.a.Resume(), spec.ErrCapturing)
	require.NoError(t, e.a.EndAllocateToPool(e.id))
	cp := e.tagStats()
	require.Equal(t, []core.CheckpointBlock{{Ptr: in, Size: 1 * mib, Requested: 1 * mib}}, cp.Blocks, "the capture's block is the tag's")
	bs := []block{{in, 1 * mib, 5}}
	require.NoError(t, e.host.CopyHtoD(in, tagBytes(1*mib, 5)))
	snap := e.a.Snapshot()
	require.NoError(t, e.a.Pause(true))
	for _, seg := range e.a.Snapshot().Segments {
		if seg.PrivatePool == e.id {
			require.Empty(t, seg.Mapped, "a paused segment maps nothing")
			require.NotEmpty(t, seg.Blocks, "and keeps its blocks")
		}
	}
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs))
	require.Equal(t, snap.Segments, e.a.Snapshot().Segments, "the same segments, runs and blocks")
	// The graph's temporary is mapped at its address again.
	require.NoError(t, e.host.Memset(tmp, 7, 8*mib))
}

// TestPauseGivesFreePagesBack: the whole free pages of a tag go back at
// Pause for good: Resume maps only the pages its allocated blocks are in,
// the blocks keep their bytes, and the tag grows again when asked. A tag
// that a route ever reached (TestPauseCapture: a graph addresses its
// free blocks) gets every page back instead. Under both policies, with
// the host driver's pages checked against ReservedBytes throughout.
func TestPauseGivesFreePagesBack(t *testing.T) {
	underPolicies(t, func(t *testing.T, cfg Config) {
		e := newPaused(t, cfg)
		bs := e.allocTagged(1*mib, 3*mib)
		tmp := e.allocTagged(64 * mib)
		before := e.a.Stats().ReservedBytes.All.Current
		require.NoError(t, e.a.Free(tmp[0].ptr))
		require.Equal(t, before, e.a.Stats().ReservedBytes.All.Current, "a live tag keeps its free pages")
		require.NoError(t, e.a.Pause(true))
		e.reservedIsHeld()
		require.NoError(t, e.a.Resume())
		e.reservedIsHeld()
		require.NoError(t, e.intact(bs))
		after := e.a.Stats().ReservedBytes.All.Current
		require.LessOrEqual(t, after, before-60*mib, "Resume mapped the free pages again")
		for _, seg := range e.a.Snapshot().Segments {
			if seg.PrivatePool != e.id {
				continue
			}
			var mapped uint64
			for _, r := range seg.Mapped {
				mapped += r.Size
			}
			require.LessOrEqual(t, mapped, 2*seg.PageSize+4*mib, "pages mapped beyond the live blocks'")
		}
		again := e.allocTagged(64 * mib)
		require.NoError(t, e.intact(bs))
		require.NoError(t, e.a.Free(again[0].ptr))
		for _, b := range bs {
			require.NoError(t, e.a.Free(b.ptr))
		}
	})
}

// TestResumeRestoresPeerAccess: pages mapped by Resume are granted to
// every enabled peer, as new pages are.
func TestResumeRestoresPeerAccess(t *testing.T) {
	hd, err := host.Open(host.Options{Devices: 2})
	require.NoError(t, err)
	vmmtest.CheckLeaks(t, hd)
	defer func() { require.NoError(t, hd.Close()) }()
	e := newPauseEnv(t, hd, ClassicConfig())
	defer func() { require.NoError(t, e.a.Close()) }()
	bs := e.allocTagged(tagSizes...)
	require.NoError(t, e.a.EnablePeerAccess(1))
	require.NoError(t, e.a.Pause(true))
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs))
	for _, b := range bs {
		for _, dev := range []vmm.Device{0, 1} {
			a, err := hd.GetAccess(b.ptr, dev)
			require.NoError(t, err)
			require.Equal(t, vmm.AccessReadWrite, a, "device %d at %v", dev, b.ptr)
		}
	}
}

// TestPauseCycles: a thousand pauses and resumes leave the driver, the
// fds and the Go heap as they were.
func TestPauseCycles(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(4<<10, 64<<10, 1*mib+4096) // a small page and a large one
	start := e.host.Usage()
	cycles := 1000
	if testing.Short() {
		cycles = 100
	}
	var ms runtime.MemStats
	heapAfter := func() uint64 {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	var heap0 uint64
	for i := range cycles {
		if i == 10 {
			heap0 = heapAfter()
		}
		require.NoError(t, e.a.Pause(i%2 == 0))
		require.NoError(t, e.a.Resume())
		require.Equal(t, start, e.host.Usage(), "cycle %d", i)
	}
	require.Less(t, heapAfter(), heap0+1*mib, "backups are not kept")
	for _, b := range bs {
		require.NoError(t, e.host.CopyHtoD(b.ptr, tagBytes(b.size, b.seed)))
	}
	require.NoError(t, e.a.Pause(true))
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs))
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.Equal(t, int64(cycles+1), ts.Remaps)
	require.Zero(t, ts.BackupBytes)
	e.reservedIsHeld()
}

// TestPauseConcurrent runs pauses, resumes, allocations and frees in the
// tag and in the shared pools, and statistics, at once (run with -race
// and -tags invariants). Blocks allocated before and kept throughout hold
// their bytes: every pause keeps a backup.
func TestPauseConcurrent(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	kept := e.allocTagged(4<<10, 3*mib)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	var seed uint64
	run := func(f func(r *rand.Rand) error) {
		seed++
		r := rand.New(rand.NewPCG(seed, 1))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if err := f(r); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for range 2 {
		run(func(r *rand.Rand) error {
			if r.IntN(2) == 0 {
				return e.a.Pause(true)
			}
			return e.a.Resume()
		})
	}
	for range 2 {
		run(func(r *rand.Rand) error {
			p, err := e.a.AllocInPool(e.id, uint64(1+r.IntN(4<<20)), 0)
			if errors.Is(err, ErrPausedForTest) {
				return nil
			}
			if err != nil {
				return err
			}
			return e.a.Free(p)
		})
	}
	run(func(r *rand.Rand) error {
		size := uint64(1 + r.IntN(3<<20))
		p, err := e.a.Alloc(size, 0)
		if err != nil {
			return err
		}
		want := tagBytes(size, size)
		got := make([]byte, size)
		err = errors.Join(e.host.CopyHtoD(p, want), e.host.CopyDtoH(got, p))
		if err == nil && !bytes.Equal(want, got) {
			err = fmt.Errorf("a shared block at %v changed under a pause", p)
		}
		return errors.Join(err, e.a.Free(p))
	})
	run(func(*rand.Rand) error {
		_, err := e.a.TagStats(tagName)
		_ = e.a.Stats()
		_ = e.a.Snapshot()
		return errors.Join(err, e.a.EmptyCache())
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(kept))
	e.reservedIsHeld()
}

// TestCloseWhilePaused: Close gives back a paused tag's reservations and
// the pages a failed pause left stuck.
// TestResumeOverStuckPages: the pages a failed pause could not unmap are
// unmapped by the Resume that maps the tag again.
func TestResumeOverStuckPages(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(tagSizes...)
	usage := e.host.Usage()
	e.f.FailNth(vmmtest.OpUnmap, 3, nil)
	require.ErrorIs(t, e.a.Pause(true), vmmtest.ErrInjected)
	require.Equal(t, usage.Mappings-2, e.host.Usage().Mappings, "the third page stays mapped")
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs))
	require.Equal(t, usage, e.host.Usage())
	e.reservedIsHeld()
}

// TestPauseHistory: the history records a pause's unmaps and a resume's
// maps as the tag's pool's.
func TestPauseHistory(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	e.allocTagged(3 * mib)
	require.NoError(t, e.a.RecordHistory(100))
	require.NoError(t, e.a.Pause(false))
	require.NoError(t, e.a.Resume())
	var got []string
	for _, ev := range e.a.History() {
		require.Equal(t, e.id, ev.Pool)
		got = append(got, ev.Action)
	}
	require.Equal(t, []string{core.ActionSegmentUnmap, core.ActionSegmentMap}, got)
}

func TestCloseWhilePaused(t *testing.T) {
	hd := vmmtest.HostDriver(t, 0)
	e := newPauseEnv(t, hd, ClassicConfig())
	e.allocTagged(tagSizes...)
	e.f.FailNth(vmmtest.OpUnmap, 2, nil)
	require.ErrorIs(t, e.a.Pause(true), vmmtest.ErrInjected)
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.True(t, ts.Paused, "a pause whose unmap fails still pauses")
	require.NotZero(t, e.host.Usage().Mappings, "with the pages it could not unmap held")
	e.reservedIsHeld()
	e.f.FailNth(vmmtest.OpUnreserve, 1, nil)
	require.ErrorIs(t, e.a.Close(), vmmtest.ErrInjected)
	require.NoError(t, e.a.Close(), "a second Close gives back what the first kept")
	require.True(t, hd.Usage().Zero(), "%v", hd.Usage())
	_, err = e.a.TagStats(tagName)
	require.ErrorIs(t, err, vmm.ErrClosed)
	require.ErrorIs(t, e.a.Resume(), vmm.ErrClosed)
}

// TestRestorePoolRefusesBadRequested: a checkpoint block whose requested
// bytes are 0 or more than its size (a checkpoint read back from JSON
// may hold anything) is refused before anything changes. Accepted, it
// made RequestedBytes exceed AllocatedBytes, and a tag's pause backed up
// and restored bytes past the block (or none of them).
func TestRestorePoolRefusesBadRequested(t *testing.T) {
	e := newPaused(t, ClassicConfig())
	bs := e.allocTagged(4096, 4096)
	cp := e.tagStats()
	require.Len(t, cp.Blocks, 2)
	require.NoError(t, e.a.Free(bs[0].ptr))
	for _, req := range []uint64{0, cp.Blocks[0].Size + 512} {
		bad := core.PoolCheckpoint{ID: cp.ID, Blocks: slices.Clone(cp.Blocks)}
		bad.Blocks[0].Requested = req
		freed, allocated, err := e.a.RestorePool(bad)
		require.ErrorIs(t, err, vmm.ErrInvalid, "requested %d of a block of %d", req, bad.Blocks[0].Size)
		require.Empty(t, freed)
		require.Empty(t, allocated)
		st := e.a.Stats()
		require.Equal(t, int64(4096), st.RequestedBytes.All.Current, "requested %d", req)
		require.LessOrEqual(t, st.RequestedBytes.All.Current, st.AllocatedBytes.All.Current)
	}
	_, allocated, err := e.a.RestorePool(cp)
	require.NoError(t, err)
	require.Equal(t, []vmm.DevicePtr{bs[0].ptr}, allocated)
	require.NoError(t, e.host.CopyHtoD(bs[0].ptr, tagBytes(bs[0].size, bs[0].seed)))
	require.NoError(t, e.a.Pause(true))
	ts, err := e.a.TagStats(tagName)
	require.NoError(t, err)
	require.Equal(t, uint64(2*4096), ts.BackupBytes)
	require.NoError(t, e.a.Resume())
	require.NoError(t, e.intact(bs))
}

// TestAllocWaitingForMemoryInPausedTag: an allocation in a tag that runs
// out of memory and waits (OOMWait, or the backoff of OOMMaxRetries)
// releases the lock; a Pause of the tag meanwhile makes it fail with
// ErrPaused. It went on in the paused tag: it grew the tag's segment
// with pages the books then counted twice, and the allocation succeeded
// there, after which Resume failed (it mapped the runs again over them)
// and Close left the range and the pages with the driver.
func TestAllocWaitingForMemoryInPausedTag(t *testing.T) {
	for _, wait := range []string{"backoff", "wait"} {
		t.Run(wait, func(t *testing.T) {
			cfg := ClassicConfig()
			if wait == "backoff" {
				cfg.OOMMaxRetries, cfg.OOMDelay = 50, 20*time.Millisecond
			} else {
				cfg.OOMMaxRetries, cfg.OOMWait = 0, 100*time.Millisecond
			}
			e := newPauseEnv(t, vmmtest.HostDriver(t, 64*mib), cfg) // room for one 40 MiB block
			defer func() { require.NoError(t, e.a.Close()) }()
			bs := e.allocTagged(40 * mib)
			done := make(chan error, 1)
			go func() {
				_, err := e.a.AllocInPool(e.id, 40*mib, 0)
				done <- err
			}()
			// The allocation counts a retry (two in the backoff) under
			// the lock, then releases it to wait.
			waiting := int64(1)
			if wait == "backoff" {
				waiting = 2
			}
			require.Eventually(t, func() bool { return e.a.Stats().NumAllocRetries >= waiting }, 10*time.Second, time.Millisecond)
			require.NoError(t, e.a.Pause(true))
			err := <-done
			require.ErrorIs(t, err, ErrPausedForTest)
			require.ErrorContains(t, err, `tag "weights" was paused`)
			ts, err := e.a.TagStats(tagName)
			require.NoError(t, err)
			require.Equal(t, int64(1), ts.Allocations)
			require.Equal(t, uint64(40*mib), ts.PausedBytes)
			e.reservedIsHeld()
			require.NoError(t, e.a.Resume())
			require.NoError(t, e.intact(bs))
			e.reservedIsHeld()
		})
	}
}

// TestAllocWaitingForMemoryInReleasedPool: a private pool given back
// while an allocation in it waits for memory makes the allocation fail;
// it grew a state no books held any more, which Close never gave back.
func TestAllocWaitingForMemoryInReleasedPool(t *testing.T) {
	cfg := ClassicConfig()
	cfg.OOMMaxRetries, cfg.OOMDelay = 50, 20*time.Millisecond
	hd := vmmtest.HostDriver(t, 64*mib)
	a, err := New(hd, 0, cfg, nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close()) }()
	other, err := a.Alloc(40*mib, 0)
	require.NoError(t, err)
	id := core.PoolID{First: 1, Second: 2}
	require.NoError(t, a.RetainPool(id))
	done := make(chan error, 1)
	go func() {
		_, err := a.AllocInPool(id, 40*mib, 0)
		done <- err
	}()
	require.Eventually(t, func() bool { return a.Stats().NumAllocRetries >= 2 }, 10*time.Second, time.Millisecond)
	require.NoError(t, a.ReleasePool(id))
	require.NoError(t, a.Free(other))
	require.NoError(t, a.EmptyCache())
	err = <-done
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "released")
	require.Zero(t, a.Stats().ReservedBytes.All.Current)
	require.Zero(t, hd.Usage().HandleBytes, "no page is held")
}
