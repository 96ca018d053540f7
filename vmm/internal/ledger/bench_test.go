package ledger_test

import (
	"testing"

	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/internal/ledger"
)

// BenchmarkPageCycle is the ledger's share of growing and shrinking by one
// page: add a page, map it, grant access, unmap, release. The reservation
// already holds 1000 mapped pages, as a warm allocator's would.
func BenchmarkPageCycle(b *testing.B) {
	l := ledger.New(G)
	l.AddRange(base, 2048*G)
	for i := uint64(0); i < 1000; i++ {
		h := vmm.Handle(1000 + i)
		l.AddPage(h, 0, G, vmm.HandleNone)
		if _, err := l.BeginMap(at(i), G, h, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var buf [1]ledger.Mapping
	for b.Loop() {
		l.AddPage(1, 0, G, vmm.HandleNone)
		if _, err := l.BeginMap(at(1500), G, 1, 0); err != nil {
			b.Fatal(err)
		}
		if _, err := l.SetAccess(at(1500), G, vmm.ReadWrite(0)); err != nil {
			b.Fatal(err)
		}
		if _, err := l.BeginUnmap(at(1500), G, buf[:0]); err != nil {
			b.Fatal(err)
		}
		if _, err := l.BeginRelease(1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSetAccessRun64 grants access over a run of 64 fresh mappings.
func BenchmarkSetAccessRun64(b *testing.B) {
	l := ledger.New(G)
	l.AddRange(base, 2048*G)
	for i := uint64(0); i < 64; i++ {
		l.AddPage(vmm.Handle(1+i), 0, G, vmm.HandleNone)
	}
	b.ReportAllocs()
	buf := make([]ledger.Mapping, 0, 64)
	for b.Loop() {
		for i := uint64(0); i < 64; i++ {
			if _, err := l.BeginMap(at(i), G, vmm.Handle(1+i), 0); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := l.SetAccess(base, 64*G, vmm.ReadWrite(0)); err != nil {
			b.Fatal(err)
		}
		if _, err := l.BeginUnmap(base, 64*G, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOps times each operation of a page's cycle on its own, in a
// reservation that already holds 1000 mapped pages, so that the Go layer's
// share of each driver call can be read off one by one.
func BenchmarkOps(b *testing.B) {
	warm := func(b *testing.B) *ledger.Ledger {
		l := ledger.New(G)
		l.AddRange(base, 2048*G)
		for i := uint64(0); i < 1000; i++ {
			h := vmm.Handle(1000 + i)
			l.AddPage(h, 0, G, vmm.HandleNone)
			if _, err := l.BeginMap(at(i), G, h, 0); err != nil {
				b.Fatal(err)
			}
		}
		l.AddPage(1, 0, G, vmm.HandleNone)
		b.ReportAllocs()
		return l
	}
	rw := vmm.ReadWrite(0)
	b.Run("create+release", func(b *testing.B) {
		l := warm(b)
		for b.Loop() {
			l.AddPage(2, 0, G, vmm.HandleNone)
			if _, err := l.BeginRelease(2); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("map+undo", func(b *testing.B) {
		l := warm(b)
		for b.Loop() {
			m, err := l.BeginMap(at(1500), G, 1, 0)
			if err != nil {
				b.Fatal(err)
			}
			l.UndoMap(m)
		}
	})
	b.Run("access", func(b *testing.B) {
		l := warm(b)
		for b.Loop() {
			if _, err := l.GrantAccess(at(500), G, rw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("unmap+undo", func(b *testing.B) {
		l := warm(b)
		var buf [1]ledger.Mapping
		for b.Loop() {
			ms, err := l.BeginUnmap(at(500), G, buf[:0])
			if err != nil {
				b.Fatal(err)
			}
			l.UndoUnmap(ms)
		}
	})
	b.Run("access64", func(b *testing.B) {
		l := warm(b)
		for b.Loop() {
			if _, err := l.GrantAccess(at(100), 64*G, rw); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("access64-copying", func(b *testing.B) {
		l := warm(b)
		for b.Loop() {
			if _, err := l.SetAccess(at(100), 64*G, rw); err != nil {
				b.Fatal(err)
			}
		}
	})
}
