//go:build linux

package ipc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// seedAround is the pattern the exporter writes over its allocations
// outside the shared block.
const seedAround = 3

// spanBlock is a BlockSource of one block over host allocations of
// several pages each (as the expandable allocator's chunks), mapped whole
// and contiguously in the exporter: the extent holds seedAround's pattern
// from its start, the block seedParent's from its own.
type spanBlock struct {
	d              vmm.Driver
	base           vmm.DevicePtr
	total          uint64
	pages          []vmm.Handle
	spans          []int
	offset, length uint64
	unpins         atomic.Int32
}

const spanPS = host.DefaultGranularity

// newSpanBlock makes the allocations of spans (pages of 2 MiB each) and
// places a block of length bytes at offset from the first one's start.
func newSpanBlock(t *testing.T, d vmm.Driver, spans []int, offset, length uint64) *spanBlock {
	t.Helper()
	b := &spanBlock{d: d, spans: spans, offset: offset, length: length}
	for _, s := range spans {
		b.total += uint64(s) * spanPS
	}
	var err error
	b.base, err = d.Reserve(b.total, 0)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Unreserve(b.base, b.total)) })
	at := b.base
	for _, s := range spans {
		h, err := d.Create(0, uint64(s)*spanPS, vmm.HandlePosixFD)
		require.NoError(t, err)
		b.pages = append(b.pages, h)
		t.Cleanup(func() { require.NoError(t, d.Release(h)) })
		require.NoError(t, d.Map(at, uint64(s)*spanPS, h, 0))
		t.Cleanup(func(at vmm.DevicePtr, n uint64) func() {
			return func() { require.NoError(t, d.Unmap(at, n)) }
		}(at, uint64(s)*spanPS))
		at = at.Add(uint64(s) * spanPS)
	}
	require.NoError(t, d.SetAccess(b.base, b.total, vmm.ReadWrite(0)))
	require.NoError(t, writePattern(d, b.base, b.total, seedAround))
	require.NoError(t, writePattern(d, b.ptr(), length, seedParent))
	return b
}

func (b *spanBlock) ptr() vmm.DevicePtr { return b.base.Add(b.offset) }

func (b *spanBlock) PinBlock(ptr vmm.DevicePtr) (Pin, error) {
	if ptr != b.ptr() {
		return Pin{}, fmt.Errorf("no block at %v: %w", ptr, vmm.ErrInvalid)
	}
	return Pin{Device: 0, PageSize: spanPS, Pages: b.pages, Spans: b.spans, Offset: b.offset, Length: b.length,
		Unpin: func() error { b.unpins.Add(1); return nil }}, nil
}

// readPatternFrom checks that the n bytes at ptr hold seed's pattern as it
// lies at byte from of what it was written over.
func readPatternFrom(d vmm.Driver, ptr vmm.DevicePtr, from, n uint64, seed byte) error {
	got, want := make([]byte, n), make([]byte, n)
	if err := d.CopyDtoH(got, ptr); err != nil {
		return err
	}
	fillPatternAt(want, seed, from)
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("pattern %d differs at byte %d of [%d, +%d)", seed, from+uint64(i), from, n)
		}
	}
	return nil
}

// spanCases are blocks over allocations of several pages: starting past
// the first page of the first allocation, ending early in a long last
// one, one allocation of two pages, and all single pages (the old wire
// format) for comparison.
var spanCases = []struct {
	name           string
	spans          []int
	offset, length uint64
}{
	{"3,1", []int{3, 1}, 5<<20 + 123, 2<<20 - 123 + 4096},
	{"1,4,1", []int{1, 4, 1}, 4096 + 5, 11<<20 + 3 - 4096 - 5},
	{"1,1,2", []int{1, 1, 2}, 100, 5<<20 - 100},
	{"2", []int{2}, 3 << 20, 512 << 10},
	{"4,2 whole", []int{4, 2}, 0, 12 << 20},
	{"1,1 no spans", []int{1, 1}, 1 << 20, 2 << 20},
}

// TestOpenSpans shares blocks over allocations of several pages and opens
// them through each transport in this process: the importer reserves the
// whole extent, maps each allocation whole with one Map at its place,
// reads the exporter's bytes at the block and around it, and its writes
// land in the exporter's memory.
func TestOpenSpans(t *testing.T) {
	for _, tr := range []Transport{TransportPidfd, TransportSocket} {
		for _, c := range spanCases {
			t.Run(tr.String()+"/"+c.name, func(t *testing.T) {
				if tr == TransportPidfd {
					requirePidfd(t)
				}
				requireNoFDLeak(t)
				exp := backendDriver(t, "host")
				imp := backendDriver(t, "host")
				b := newSpanBlock(t, exp, c.spans, c.offset, c.length)
				e := newExporter(t, ExporterOptions{})
				s, err := e.ShareBlock(exp, b, b.ptr())
				require.NoError(t, err)
				d := s.Descriptor()
				require.Equal(t, len(c.spans), d.PageCount, "one handle per allocation")
				require.Equal(t, b.total, d.Bytes())
				desc, err := s.MarshalBinary()
				require.NoError(t, err)
				want := handles.Version
				if handles.NormalSpans(c.spans) == nil {
					want = handles.VersionAuth
					require.Nil(t, d.Spans)
				} else {
					require.Equal(t, c.spans, d.Spans)
				}
				require.EqualValues(t, want, desc[4], "wire version")

				m, err := Open(context.Background(), desc, imp, 0, OpenOptions{Fetch: FetchOptions{Transports: []Transport{tr}}})
				require.NoError(t, err)
				require.Equal(t, tr, m.Via())
				u := imp.Usage()
				require.Equal(t, 1, u.Ranges)
				require.Equal(t, b.total, u.RangeBytes, "the whole extent is reserved")
				require.Equal(t, len(c.spans), u.Mappings, "one mapping per allocation")
				require.Equal(t, len(c.spans), u.Handles, "one import per allocation")
				require.Equal(t, b.total, u.HandleBytes)
				require.EqualValues(t, c.length, m.Len())
				base := m.Ptr() - vmm.DevicePtr(c.offset)
				require.NoError(t, readPattern(imp, m.Ptr(), m.Len(), seedParent), "the block")
				require.NoError(t, readPatternFrom(imp, base, 0, c.offset, seedAround), "before the block")
				end := c.offset + c.length
				require.NoError(t, readPatternFrom(imp, base.Add(end), end, b.total-end, seedAround), "after the block")
				a, err := imp.GetAccess(base.Add(b.total-spanPS), 0)
				require.NoError(t, err)
				require.Equal(t, vmm.AccessReadWrite, a, "access granted to the last page")

				require.NoError(t, writePattern(imp, m.Ptr(), m.Len(), seedChild))
				require.NoError(t, readPattern(exp, b.ptr(), c.length, seedChild), "the exporter reads the importer's bytes")
				require.NoError(t, readPatternFrom(exp, b.base, 0, c.offset, seedAround))

				require.NoError(t, m.Close())
				require.True(t, imp.Usage().Zero(), "Close gives everything back: %v", imp.Usage())
				require.NoError(t, s.Close())
				require.Eventually(t, func() bool { return b.unpins.Load() == 1 }, 5*time.Second, time.Millisecond)
			})
		}
	}
}

// TestOpenSpansAcrossProcesses: a child opens a block over allocations of
// 1, 4 and 1 pages through each transport, reads the parent's bytes and
// writes its own, which the parent reads; the child's driver holds
// nothing after Close.
func TestOpenSpansAcrossProcesses(t *testing.T) {
	for _, tr := range []string{"pidfd", "socket"} {
		t.Run(tr, func(t *testing.T) {
			if tr == "pidfd" {
				requirePidfd(t)
			}
			exp := backendDriver(t, "host")
			c := spanCases[1]
			b := newSpanBlock(t, exp, c.spans, c.offset, c.length)
			e := newExporter(t, ExporterOptions{})
			p := startChild(t, "open", nil, envBackend+"=host", envTransports+"="+tr)
			p.until(t, "ready")
			s, err := e.ShareBlock(exp, b, b.ptr())
			require.NoError(t, err)
			require.Equal(t, c.spans, s.Descriptor().Spans)
			p.send(t, descLine(t, s))
			p.until(t, "written")
			require.Equal(t, tr, p.rep["via"])
			require.NoError(t, readPattern(exp, b.ptr(), c.length, seedChild), "the parent reads the child's bytes")
			require.NoError(t, readPatternFrom(exp, b.base, 0, c.offset, seedAround), "the child wrote only the block")
			p.send(t, "close")
			p.until(t, "closed")
			rep := p.wait(t)
			requireChildFDs(t, rep)
			require.Equal(t, vmm.Usage{}.String(), rep["usage"], "the child's driver holds nothing after Close")
			require.NoError(t, s.Close())
			require.Eventually(t, func() bool { return b.unpins.Load() == 1 }, 5*time.Second, time.Millisecond)
		})
	}
}

func descLine(t *testing.T, s *Share) string {
	t.Helper()
	return "desc " + descEnv(t, s)[len(envDesc)+1:]
}

// TestOpenSpansNeedsWholeMaps: a spans descriptor whose spans are
// dropped (what a reader of version 2 would map: one page per handle)
// does not map on a driver that maps allocations only whole; with them it
// does. The importer's mapping is what the spans make it.
func TestOpenSpansNeedsWholeMaps(t *testing.T) {
	requireNoFDLeak(t)
	exp := backendDriver(t, "host")
	imp := backendDriver(t, "host")
	c := spanCases[0]
	b := newSpanBlock(t, exp, c.spans, c.offset, c.length)
	e := newExporter(t, ExporterOptions{})
	s, err := e.ShareBlock(exp, b, b.ptr())
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	d := s.Descriptor()
	d.Spans = nil
	d.PageCount = 4 // the pages, as if each were an allocation
	_, err = d.MarshalBinary()
	require.ErrorIs(t, err, vmm.ErrInvalid, "4 pages named by 2 fds")
	d = s.Descriptor()
	d.Spans, d.Offset, d.Length = nil, 4096, spanPS
	forged, err := d.MarshalBinary()
	require.NoError(t, err)
	_, err = Open(context.Background(), forged, imp, 0, OpenOptions{})
	require.ErrorIs(t, err, vmm.ErrNotSupported, "a page of a 3-page allocation is not mapped alone")
	require.True(t, imp.Usage().Zero(), "the failed Open undid everything: %v", imp.Usage())
}

// TestOpenSpansChecksFits: the extent checked against the device is the
// pages of all allocations, not one page per handle.
func TestOpenSpansChecksFits(t *testing.T) {
	imp, err := host.Open(host.Options{Capacity: 8 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, imp.Close()) })
	d := &handles.Descriptor{Kind: handles.KindFabric, ExporterPID: 1, PageSize: spanPS, PageCount: 2,
		Spans: []int{4, 1}, Offset: 0, Length: 9 << 20, Token: handles.Token{1},
		Fabric: []handles.Fabric{{1}, {2}}}
	desc, err := d.MarshalBinary()
	require.NoError(t, err)
	_, err = NewImporter(imp).Open(context.Background(), desc, 0, OpenOptions{})
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "5 pages")
	require.False(t, errors.Is(err, ErrNotOffered))
}

// TestShareExtentSpans: ShareFabric and ShareFDs put Extent.Spans in the
// descriptor (all ones as none), and refuse spans that do not match the
// handles or the block.
func TestShareExtentSpans(t *testing.T) {
	requireNoFDLeak(t)
	e := newExporter(t, ExporterOptions{})
	fabs := []handles.Fabric{{1}, {2}}
	ext := Extent{PageSize: spanPS, Spans: []int{3, 1}, Offset: 5 << 20, Length: 2 << 20}
	s, err := e.ShareFabric(fabs, ext, nil)
	require.NoError(t, err)
	ext.Spans[0] = 7 // the share keeps its own copy
	d := s.Descriptor()
	require.Equal(t, []int{3, 1}, d.Spans)
	d.Spans[1] = 9
	require.Equal(t, []int{3, 1}, s.Descriptor().Spans, "Descriptor returns a copy")
	b, err := s.MarshalBinary()
	require.NoError(t, err)
	require.EqualValues(t, handles.Version, b[4])
	require.NoError(t, s.Close())

	s, err = e.ShareFabric(fabs, Extent{PageSize: spanPS, Spans: []int{1, 1}, Offset: 1 << 20, Length: 2 << 20}, nil)
	require.NoError(t, err)
	require.Nil(t, s.Descriptor().Spans, "spans of one page each are none")
	require.NoError(t, s.Close())

	for name, ext := range map[string]Extent{
		"fewer spans":         {PageSize: spanPS, Spans: []int{3}, Offset: 5 << 20, Length: 1 << 20},
		"zero span":           {PageSize: spanPS, Spans: []int{0, 1}, Offset: 0, Length: 1 << 20},
		"offset past first":   {PageSize: spanPS, Spans: []int{1, 3}, Offset: 2 << 20, Length: 5 << 20},
		"block short of last": {PageSize: spanPS, Spans: []int{1, 3}, Offset: 0, Length: 2 << 20},
	} {
		t.Run(name, func(t *testing.T) {
			released := 0
			_, err := e.ShareFabric(fabs, ext, func() error { released++; return nil })
			require.ErrorIs(t, err, vmm.ErrInvalid)
			require.Equal(t, 1, released, "a refused share releases")
			pages := makePages(t, 2, spanPS)
			_, err = e.ShareFDs(pages, ext, nil)
			require.ErrorIs(t, err, vmm.ErrInvalid, "and closes its fds")
		})
	}
}
