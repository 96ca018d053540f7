package ipc

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/xseg-dev/xseg/handles"
	"github.com/xseg-dev/xseg/vmm"
)

// Extent places a shared block inside its pages.
type Extent struct {
	// DeviceUUID is the device the pages live on (zero for host memory).
	DeviceUUID [16]byte
	// PageSize is the size of every page, a power of two.
	PageSize uint64
	// Offset and Length place the block inside the pages; the pages must
	// be exactly the block rounded out to pages.
	Offset, Length uint64
}

// A Share is one range shared by an Exporter. It owns the page fds it
// serves (posix-fd kind) and keeps them open, at the fd numbers its
// descriptor names, until Close. It is safe for concurrent use.
type Share struct {
	e    *Exporter
	desc handles.Descriptor

	mu struct {
		sync.RWMutex
		closed  bool
		fds     []*handles.FD
		release func() error
	}
}

// ShareFDs shares pages given as fds, one per page of ext.PageSize, in page
// order. The share takes ownership of fds, also when it fails. release, if
// not nil, is called once when the share closes (an allocator's unpin).
// The descriptor carries the fd numbers (for pidfd) and the socket, if the
// exporter serves one.
func (e *Exporter) ShareFDs(fds []*handles.FD, ext Extent, release func() error) (*Share, error) {
	s := &Share{e: e}
	s.mu.fds, s.mu.release = fds, release
	s.desc = e.descriptor(handles.KindPosixFD, len(fds), ext)
	for _, fd := range fds {
		if fd == nil || fd.Int() < 0 {
			return nil, errors.Join(fmt.Errorf("sharing a closed fd: %w", vmm.ErrInvalid), s.Close())
		}
		s.desc.PageFDs = append(s.desc.PageFDs, fd.Int())
	}
	return s, e.add(s)
}

// ShareFabric shares pages given as fabric handles: the descriptor carries
// them and no transport is involved. release is as for ShareFDs.
func (e *Exporter) ShareFabric(pages []handles.Fabric, ext Extent, release func() error) (*Share, error) {
	s := &Share{e: e}
	s.mu.release = release
	s.desc = e.descriptor(handles.KindFabric, len(pages), ext)
	s.desc.Endpoint = ""
	s.desc.Fabric = append([]handles.Fabric(nil), pages...)
	return s, e.add(s)
}

func (e *Exporter) descriptor(kind handles.Kind, pages int, ext Extent) handles.Descriptor {
	return handles.Descriptor{
		Kind: kind, ExporterPID: os.Getpid(), DeviceUUID: ext.DeviceUUID,
		PageSize: ext.PageSize, PageCount: pages, Offset: ext.Offset, Length: ext.Length,
		Endpoint: e.endpoint,
	}
}

// add gives s its token, validates it and registers it; on failure it
// closes s.
func (e *Exporter) add(s *Share) error {
	tok, err := handles.NewToken()
	if err == nil {
		s.desc.Token = tok
		err = s.desc.Validate()
	}
	if err == nil {
		e.mu.Lock()
		if e.mu.closed {
			err = errClosedExporter()
		} else {
			e.mu.shares[s] = struct{}{}
		}
		e.mu.Unlock()
	}
	if err != nil {
		return errors.Join(fmt.Errorf("sharing %d pages: %w", s.desc.PageCount, err), s.Close())
	}
	return nil
}

// Descriptor returns a copy of the share's descriptor.
func (s *Share) Descriptor() *handles.Descriptor {
	d := s.desc
	d.PageFDs = append([]int(nil), s.desc.PageFDs...)
	d.Fabric = append([]handles.Fabric(nil), s.desc.Fabric...)
	return &d
}

// MarshalBinary returns the descriptor in its wire form, the bytes the
// caller hands to importers any way it likes.
func (s *Share) MarshalBinary() ([]byte, error) { return s.desc.MarshalBinary() }

// Close stops serving the share, closes its fds and calls its release.
// Importers keep what they already fetched; new fetches fail. Close is
// idempotent.
func (s *Share) Close() error {
	s.e.mu.Lock()
	delete(s.e.mu.shares, s)
	s.e.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil
	}
	s.mu.closed = true
	err := handles.CloseAll(s.mu.fds)
	if s.mu.release != nil {
		err = errors.Join(err, s.mu.release())
	}
	return err
}
