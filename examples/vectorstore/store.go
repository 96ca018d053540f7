package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
)

// store keeps fixed-size float32 vectors one after another in a growable
// buffer: appending grows the buffer in place, so the vectors never move
// and no copy is made. It is safe for concurrent use.
type store struct {
	d   vmm.Driver
	buf *expandable.Buffer
	dim int
	mu  sync.Mutex // serializes appends: grow, then write at the old end
	// n is the number of vectors written: an append counts its vectors
	// once they are on the device, so a read never sees a vector that is
	// not written yet, or that a failed append left behind.
	n atomic.Int64
}

func newStore(d vmm.Driver, dim int, maxBytes uint64) (*store, error) {
	buf, err := expandable.NewBuffer(d, 0, maxBytes, expandable.BufferOptions{})
	if err != nil {
		return nil, err
	}
	return &store{d: d, buf: buf, dim: dim}, nil
}

func (s *store) vecBytes() uint64 { return uint64(s.dim) * 4 }

// count is the number of vectors stored.
func (s *store) count() int { return int(s.n.Load()) }

// add appends vecs, each of s.dim values, and returns the index of the
// first. If it fails, nothing changes.
func (s *store) add(vecs [][]float32) (int, error) {
	// Check every vector before making room for them: the request's
	// count of vectors is the client's to choose.
	for i, v := range vecs {
		if len(v) != s.dim {
			return 0, fmt.Errorf("vector %d has %d values, want %d: %w", i, len(v), s.dim, vmm.ErrInvalid)
		}
	}
	raw := make([]byte, 0, uint64(len(vecs))*s.vecBytes())
	for _, v := range vecs {
		for _, x := range v {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(x))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	off := s.buf.Len()
	if err := s.buf.Grow(uint64(len(raw))); err != nil {
		return 0, err
	}
	if err := s.d.CopyHtoD(s.buf.Ptr().Add(off), raw); err != nil {
		// Shrink restores the length even if it fails to unmap.
		return 0, errors.Join(fmt.Errorf("writing %d vectors: %w", len(vecs), err), s.buf.Shrink(uint64(len(raw))))
	}
	s.n.Store(int64((off + uint64(len(raw))) / s.vecBytes()))
	return int(off / s.vecBytes()), nil
}

// get reads vector i back from the device.
func (s *store) get(i int) ([]float32, error) {
	if i < 0 || i >= s.count() {
		return nil, fmt.Errorf("vector %d of %d: %w", i, s.count(), vmm.ErrInvalid)
	}
	raw := make([]byte, s.vecBytes())
	if err := s.d.CopyDtoH(raw, s.buf.Ptr().Add(uint64(i)*s.vecBytes())); err != nil {
		return nil, err
	}
	v := make([]float32, s.dim)
	for j := range v {
		v[j] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*j:]))
	}
	return v, nil
}

func (s *store) close() error { return s.buf.Close() }
