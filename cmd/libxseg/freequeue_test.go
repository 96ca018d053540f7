//go:build cgo

package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// The free queue is process-wide C state: these tests take it one at a
// time and leave it empty and on.
var fqTest sync.Mutex

func takeQueue(t *testing.T) {
	fqTest.Lock()
	drainWith(func(uint64, int) {})
	t.Cleanup(func() {
		setFreesDirect(false)
		drainWith(func(uint64, int) {})
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
	rec := func(p uint64, d int) { got = append(got, parked{p, d}) }
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
	drainWith(func(uint64, int) { t.Fatal("an empty queue applied a free") })
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
	drainWith(func(uint64, int) { applied++ })
	require.Equal(t, fqCap, applied)
	require.True(t, parkFree(1<<9, 0))
	drainWith(func(uint64, int) {})

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
	drainWith(func(p uint64, _ int) {
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
	drainWith(func(p uint64, _ int) { after = append(after, p) })
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
	apply := func(p uint64, _ int) {
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
// library before a free that returned earlier.
func TestExportsDrainFirst(t *testing.T) {
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	fset := token.NewFileSet()
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, parser.ParseComments)
		require.NoError(t, err)
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Doc == nil || !exported(fn) {
				continue
			}
			n++
			drains, deferred := false, false
			for _, st := range fn.Body.List {
				if d, ok := st.(*ast.DeferStmt); ok && isCall(d.Call, "catch") {
					deferred = true
					continue
				}
				if e, ok := st.(*ast.ExprStmt); ok && deferred {
					if c, ok := e.X.(*ast.CallExpr); ok && isCall(c, "drainFrees") {
						drains = true
					}
				}
				if deferred {
					break
				}
			}
			require.True(t, drains, "%s: %s does not call drainFrees right after its deferred catch", f, fn.Name.Name)
		}
	}
	require.GreaterOrEqual(t, n, 30, "found too few exports")
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
