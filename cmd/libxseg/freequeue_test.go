//go:build cgo

package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

// The free queue is process-wide C state: these tests take it one at a
// time and leave it empty and on.
var fqTest sync.Mutex

func takeQueue(t *testing.T) {
	fqTest.Lock()
	drainWith(func(uint64, int, bool) {})
	t.Cleanup(func() {
		setFreesDirect(false)
		drainWith(func(uint64, int, bool) {})
		fqTest.Unlock()
	})
}

type parked struct {
	ptr uint64
	dev int
}

// TestFreeQueueOrder: parked frees come out once each, in the order
// parked, across the ring's wrap.
func TestFreeQueueOrder(t *testing.T) {
	takeQueue(t)
	var got []parked
	rec := func(p uint64, d int, _ bool) { got = append(got, parked{p, d}) }
	var want []parked
	for round := range 5 { // 5 x 100 entries: past the 256-entry ring's wrap
		for i := range 100 {
			e := parked{uint64(round*1000+i+1) << 9, i % 3}
			require.True(t, parkFree(e.ptr, e.dev))
			want = append(want, e)
		}
		drainWith(rec)
	}
	require.Equal(t, want, got)
	drainWith(func(uint64, int, bool) { t.Fatal("an empty queue applied a free") })
}

// TestFreeQueueFull: the ring takes XSEG_FQ_CAP frees, then refuses (the
// caller frees through Go), and takes more once drained. Direct refuses.
func TestFreeQueueFull(t *testing.T) {
	takeQueue(t)
	n := 0
	for parkFree(uint64(n+1)<<9, 0) {
		n++
		require.LessOrEqual(t, n, fqCap, "the ring took more than its capacity")
	}
	require.Equal(t, fqCap, n)
	applied := 0
	drainWith(func(uint64, int, bool) { applied++ })
	require.Equal(t, fqCap, applied)
	require.True(t, parkFree(1<<9, 0))
	drainWith(func(uint64, int, bool) {})

	setFreesDirect(true)
	require.False(t, parkFree(1<<9, 0), "a direct queue parked a free")
	setFreesDirect(false)
	require.True(t, parkFree(1<<9, 0))
}

// TestFreeQueuePanic: an apply that panics is recorded as xseg_free's
// failure; the other frees are applied, and no drain waits for it.
func TestFreeQueuePanic(t *testing.T) {
	takeQueue(t)
	for i := range 20 {
		require.True(t, parkFree(uint64(i+1)<<9, 0))
	}
	var seen []uint64
	drainWith(func(p uint64, _ int, _ bool) {
		seen = append(seen, p)
		if p == 3<<9 {
			panic("boom")
		}
	})
	require.Contains(t, lastErr.text(), "xseg_free: panic: boom")
	require.Len(t, seen, 20)
	for i, p := range seen {
		require.Equal(t, uint64(i+1)<<9, p)
	}
	require.True(t, parkFree(99<<9, 0))
	var after []uint64
	drainWith(func(p uint64, _ int, _ bool) { after = append(after, p) })
	require.Equal(t, []uint64{99 << 9}, after)
}

// TestFreeQueueConcurrent (run it under -race): producers park frees while
// others drain; every free is applied exactly once, and a drain that
// returns has applied every free its goroutine parked before it began,
// even while another drain held some of them.
func TestFreeQueueConcurrent(t *testing.T) {
	takeQueue(t)
	const producers, each = 6, 3000
	var applied [producers * each]atomic.Int32
	apply := func(p uint64, _ int, _ bool) {
		applied[p>>9-1].Add(1)
	}
	var wg sync.WaitGroup
	for g := range producers {
		wg.Go(func() {
			for i := range each {
				id := g*each + i
				for !parkFree(uint64(id+1)<<9, g) {
					drainWith(apply) // full: as xseg_free, through Go
				}
				if i%3 == 0 {
					drainWith(apply)
					if applied[id].Load() != 1 {
						t.Errorf("free %d not applied when its producer's drain returned", id)
						return
					}
				}
			}
		})
	}
	stop := make(chan struct{})
	var drainers sync.WaitGroup
	for range 2 {
		drainers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					drainWith(apply)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	drainers.Wait()
	drainWith(apply)
	for id := range applied {
		require.Equal(t, int32(1), applied[id].Load(), "free %d", id)
	}
}

// TestFreeQueueDrainsApplyInOrder: two drains at once take different
// chunks, and the later chunk is applied only after the earlier one, however
// slow that is: a block taken back and freed again is two entries, which
// must reach Go in the order parked.
func TestFreeQueueDrainsApplyInOrder(t *testing.T) {
	takeQueue(t)
	const n = 4 * fqChunk
	for i := range n {
		require.True(t, parkFree(uint64(i+1)<<9, 0))
	}
	var mu sync.Mutex
	var got []uint64
	first := make(chan struct{})
	apply := func(p uint64, _ int, _ bool) {
		if p == 1<<9 {
			close(first)
			time.Sleep(50 * time.Millisecond) // the first chunk is slow
		}
		mu.Lock()
		got = append(got, p)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	wg.Go(func() { drainWith(apply) })
	<-first // the first drain holds the first chunk
	wg.Go(func() { drainWith(apply) })
	wg.Wait()
	require.Len(t, got, n)
	for i, p := range got {
		require.Equal(t, uint64(i+1)<<9, p, "entry %d applied out of order", i)
	}
}

// TestFreeQueueDirectWithThreshold: a configuration with a release
// threshold turns the queue off at start, as its pages go back at the free.
func TestFreeQueueDirectWithThreshold(t *testing.T) {
	for _, c := range []struct {
		conf string
		want uint64
	}{{"", 0}, {"release_threshold_mb:64", 64 << 20}} {
		l := hostLibrary(t, env{"XSEG_CONF": c.conf})
		got := ^uint64(0)
		l.onStart = func(th uint64) { got = th }
		_, err := l.malloc(4096, 0, 0)
		require.NoError(t, err)
		require.Equal(t, c.want, got, c.conf)
	}
	require.NotNil(t, lib.onStart, "the process's library does not tell the queue its threshold")
}

// TestExportsDrainFirst: every export applies the parked frees before its
// own work (right after its deferred catch), so no call observes the
// library before a free that returned earlier; and every export but the
// plain allocation and free starts a new epoch of the free queue when it
// begins and returns (drainFrees and catch), so that nothing it does can
// meet a block taken back under the rules of the epoch before.
func TestExportsDrainFirst(t *testing.T) {
	plain := map[string]bool{"xsegGoMalloc": true, "xsegGoMallocOrError": true, "xsegGoFree": true}
	n, nPlain := 0, 0
	for _, e := range goExports(t) {
		fn := e.fn
		n++
		catchFn, drainFn := "catch", "drainFrees"
		if plain[fn.Name.Name] {
			catchFn, drainFn = "catchPlain", "drainPlain"
			nPlain++
		}
		drains, deferred := false, false
		for _, st := range fn.Body.List {
			if d, ok := st.(*ast.DeferStmt); ok && isCall(d.Call, catchFn) {
				deferred = true
				continue
			}
			if e, ok := st.(*ast.ExprStmt); ok && deferred {
				if c, ok := e.X.(*ast.CallExpr); ok && isCall(c, drainFn) {
					drains = true
				}
			}
			if deferred {
				break
			}
		}
		require.True(t, drains, "%s: %s does not call %s right after its deferred %s", e.file, fn.Name.Name, drainFn, catchFn)
	}
	require.GreaterOrEqual(t, n, 30, "found too few exports")
	require.Equal(t, len(plain), nPlain, "a plain export is missing")
}

// TestExportsBehindShim: Go exports only xsegGo... functions, never one
// under a name of xseg.h: each C entry point is a wrapper in C or C++
// that refuses in a child forked after the library loaded before it calls
// into Go (the memory-limit and history functions were exported directly
// and hung such a child).
func TestExportsBehindShim(t *testing.T) {
	for _, e := range goExports(t) {
		require.True(t, strings.HasPrefix(e.fn.Name.Name, "xsegGo"), "%s: %s is exported to C without a shim.c wrapper (no fork guard)", e.file, e.fn.Name.Name)
	}
}

// goExport is a function of the package exported to C, and its file.
type goExport struct {
	file string
	fn   *ast.FuncDecl
}

// goExports parses the package's non-test files and returns its
// functions exported to C (//export).
func goExports(t *testing.T) []goExport {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	var out []goExport
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range file.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Doc != nil && exported(fn) {
				out = append(out, goExport{f, fn})
			}
		}
	}
	return out
}

func isCall(c *ast.CallExpr, name string) bool {
	id, ok := c.Fun.(*ast.Ident)
	return ok && id.Name == name
}

func exported(fn *ast.FuncDecl) bool {
	for _, c := range fn.Doc.List {
		if c.Text == "//export "+fn.Name.Name {
			return true
		}
	}
	return false
}

// TestTakeBackMatching: a parked block comes back only for exactly its
// request, device and stream as remembered in this epoch, newest first,
// within the last XSEG_FQ_SCAN entries, never after a later free of the
// same address; the drain sees the entries taken back as such.
func TestTakeBackMatching(t *testing.T) {
	takeQueue(t)
	newEpoch()
	e := loadEpoch()
	const s1, s2 = vmm.Stream(0x7000), vmm.Stream(0x8000)
	blk := func(i int) uint64 { return uint64(i) << 20 }
	rememberBlock(blk(1), 1000, 0, s1, e)
	rememberBlock(blk(2), 1000, 0, s1, e)
	rememberBlock(blk(3), 1000, 1, s1, e)
	rememberBlock(blk(4), 1000, 0, s2, e)
	rememberBlock(blk(5), 1000, 0, s1, 0)   // not plain
	rememberBlock(blk(6), 1000, 0, s1, e-1) // another epoch
	for i := 1; i <= 6; i++ {
		dev := 0
		if i == 3 {
			dev = 1
		}
		require.True(t, parkFree(blk(i), dev))
	}
	require.Zero(t, takeBack(1001, 0, s1), "another request")
	require.Zero(t, takeBack(1000, 2, s1), "another device")
	require.Zero(t, takeBack(1000, 1, s2), "device 1 has none on s2")
	require.Equal(t, blk(4), takeBack(1000, 0, s2))
	require.Equal(t, blk(3), takeBack(1000, 1, s1))
	require.Equal(t, blk(2), takeBack(1000, 0, s1), "the newest first; 5 and 6 are not plain in this epoch")
	require.Equal(t, blk(1), takeBack(1000, 0, s1))
	require.Zero(t, takeBack(1000, 0, s1), "every block taken")

	// A block taken back is remembered again: freed, it comes back again.
	require.True(t, parkFree(blk(1), 0))
	require.Equal(t, blk(1), takeBack(1000, 0, s1))
	// Freed twice: never.
	require.True(t, parkFree(blk(1), 0))
	require.True(t, parkFree(blk(1), 0))
	require.Zero(t, takeBack(1000, 0, s1), "a block freed twice came back")

	// A free the remembered block's device does not match is parked plain.
	rememberBlock(blk(7), 512, 0, s1, e)
	require.True(t, parkFree(blk(7), 1))
	require.Zero(t, takeBack(512, 0, s1))
	require.Zero(t, takeBack(512, 1, s1))

	// Past the scan window: only the last XSEG_FQ_SCAN entries are looked at.
	rememberBlock(blk(8), 2048, 0, s1, e)
	require.True(t, parkFree(blk(8), 0))
	for i := range fqScan {
		require.True(t, parkFree(blk(100+i), 0))
	}
	require.Zero(t, takeBack(2048, 0, s1), "an entry past the scan window came back")

	// A new epoch: nothing remembered before comes back.
	rememberBlock(blk(9), 4096, 0, s1, e)
	require.True(t, parkFree(blk(9), 0))
	newEpoch()
	require.Zero(t, takeBack(4096, 0, s1), "a block of the last epoch came back")

	// The drain: every entry once, in order, the ones taken back marked.
	var got []string
	drainWith(func(p uint64, d int, reused bool) {
		got = append(got, fmt.Sprintf("%d/%d/%v", p>>20, d, reused))
	})
	want := []string{"1/0/true", "2/0/true", "3/1/true", "4/0/true", "5/0/false", "6/0/false", "1/0/true", "1/0/false", "1/0/false", "7/1/false", "8/0/false"}
	for i := range fqScan {
		want = append(want, fmt.Sprintf("%d/0/false", 100+i))
	}
	want = append(want, "9/0/false")
	require.Equal(t, want, got)

	// Direct: nothing is taken back.
	rememberBlock(blk(10), 512, 0, s1, loadEpoch())
	require.True(t, parkFree(blk(10), 0))
	setFreesDirect(true)
	require.Zero(t, takeBack(512, 0, s1))
	setFreesDirect(false)
}

// TestFreeQueueOOMWait: an allocation waiting in the OOM policy (oom_wait_ms,
// or the retries' backoff) gets the memory a free from another thread gives
// back while it waits, through the real hook (oomWait), whether that free
// was parked just before the wait began or made during it (the queue is
// direct then). Before the hook, the parked free stayed parked: the
// allocation waited out its whole time and failed. The queue is on again
// once no allocation waits.
func TestFreeQueueOOMWait(t *testing.T) {
	for _, c := range []struct{ name, conf string }{
		{"wait", "oom_wait_ms:20000"},
		{"retries", "oom_max_retries:6,oom_delay_ms:500"},
	} {
		for _, before := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/parked-before-%v", c.name, before), func(t *testing.T) {
				takeQueue(t)
				l := hostLibrary(t, env{"XSEG_CONF": c.conf})
				l.oomWait = oomWait
				old := lib
				lib = l // xsegGoFree and the drains apply frees to the process's library
				t.Cleanup(func() { lib = old })

				big, err := l.malloc(192<<20, 0, 0) // of the device's 256 MiB
				require.NoError(t, err)
				hold, err := l.malloc(32<<20, 0, 0)
				require.NoError(t, err)
				if before {
					// Parked as the wait begins, before the queue goes
					// direct: the allocation's own drain came earlier, so
					// only the hook's drain applies it.
					once := false
					l.devs[0].Load().a.SetOOMWaitHook(func(waiting bool) {
						if waiting && !once {
							once = true
							require.True(t, parkFree(uint64(big), 0))
						}
						oomWait(waiting)
					})
				} else {
					go func() {
						time.Sleep(200 * time.Millisecond)
						freeAsC(uint64(big), 0)
					}()
				}
				start := time.Now()
				p, err := l.malloc(128<<20, 0, 0)
				require.NoError(t, err, "the free made while the allocation waited did not reach it")
				require.Less(t, time.Since(start), 10*time.Second)
				require.NoError(t, l.free(p, 0))
				require.NoError(t, l.free(hold, 0))
				require.True(t, parkFree(1<<9, 0), "the queue stayed direct after the wait")
				drainWith(func(uint64, int, bool) {})
			})
		}
	}
}

// TestFreeQueueNoParkPastWaitDrain: a free racing with an allocation that
// begins to wait (oomWait(true)) is either refused by the queue (it goes to
// Go at once) or applied by the wait's drain: it never stays parked after
// it. xseg_fq_push checks the direct word again under the ring's lock, and
// the wait takes that lock before it drains.
func TestFreeQueueNoParkPastWaitDrain(t *testing.T) {
	takeQueue(t)
	l := hostLibrary(t, nil)
	old := lib
	lib = l // the drain applies frees to the process's library
	t.Cleanup(func() { lib = old })
	for i := range 3000 {
		var wg sync.WaitGroup
		var parked bool
		wg.Go(func() { parked = parkFree(uint64(i+1)<<9, 0) })
		wg.Go(func() { oomWait(true) })
		wg.Wait()
		if parked {
			require.Equal(t, fqTail(), fqApplied.Load(), "round %d: a free parked past the wait's drain", i)
		}
		oomWait(false)
	}
}
