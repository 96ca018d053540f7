package main

/*
#include <stdint.h>
#include <stddef.h>
#include <sys/types.h>
*/
import "C"

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/xseg-dev/xseg/ipc"
	"github.com/xseg-dev/xseg/vmm"
)

// sharing is the library's cross-process state: one exporter (serving its
// abstract socket, made at the first share), the open shares by their
// descriptor bytes, one importer for the library's driver (made at the
// first open: the opens of one descriptor share a mapping, and those of
// one CUDA IPC handle one open) and the mappings opened here by handle
// number. It is safe for concurrent use.
type sharing struct {
	mu struct {
		sync.Mutex
		exp      *ipc.Exporter
		shares   map[string]*ipc.Share // by hex of the descriptor
		imp      *ipc.Importer
		ackWait  time.Duration // XSEG_LEASE_ACK_MS, read with imp
		mappings map[int64]*ipc.Mapping
		next     int64
	}
}

var shared sharing

func init() { dropKeptImports = shared.dropKept }

// maxImporters bounds the importers of one share (xseg_share_for).
const maxImporters = 1 << 20

// share shares the live block at ptr of device's allocator and returns its
// descriptor. The allocator must be shareable (shareable:true in
// XSEG_CONF or xseg_configure).
func (s *sharing) share(ptr vmm.DevicePtr, device, importers int) ([]byte, error) {
	if importers < 0 || importers > maxImporters {
		return nil, fmt.Errorf("importers %d: want 0 to %d (0: until xseg_unshare): %w", importers, maxImporters, vmm.ErrInvalid)
	}
	a, err := lib.existing(device)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, fmt.Errorf("device %d has no allocator whose blocks can be shared: %w", device, vmm.ErrInvalid)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.exp == nil {
		exp, err := ipc.NewExporter(ipc.ExporterOptions{OnError: func(err error) {
			lib.log.Warn("xseg: serving an importer", "err", err)
		}})
		if err != nil {
			return nil, err
		}
		s.mu.exp = exp
		s.mu.shares = make(map[string]*ipc.Share)
	}
	// A share for one importer (a torch.multiprocessing message) is
	// claimable: its importer reads without waiting for this process.
	shareBlock := s.mu.exp.ShareBlock
	if importers == 1 {
		shareBlock = s.mu.exp.ShareBlockOnce
	}
	sh, err := shareBlock(lib.driver(), a, ptr)
	if err != nil {
		return nil, err
	}
	b, err := sh.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("%w (closing the share: %v)", err, sh.Close())
	}
	key := hex.EncodeToString(b)
	s.mu.shares[key] = sh
	if importers > 0 {
		// Ends by itself; forget it then (in a goroutine: the importer's
		// lease may be granted while this lock is held).
		err = sh.CloseAfter(importers, func() { go s.forget(key, sh) })
		if err != nil {
			delete(s.mu.shares, key)
			return nil, errors.Join(err, sh.Close())
		}
	}
	return b, nil
}

// forget drops the share under key if it is still sh.
func (s *sharing) forget(key string, sh *ipc.Share) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.shares[key] == sh {
		delete(s.mu.shares, key)
	}
}

// unshare closes the share that desc names: no new importer is served;
// the block stays pinned until every importer has let go.
func (s *sharing) unshare(desc []byte) error {
	s.mu.Lock()
	sh := s.mu.shares[hex.EncodeToString(desc)]
	delete(s.mu.shares, hex.EncodeToString(desc))
	s.mu.Unlock()
	if sh == nil {
		return fmt.Errorf("no share of this process has this descriptor: %w", vmm.ErrInvalid)
	}
	return sh.Close()
}

// open maps the block desc names for device and returns a handle number.
// With deferLease the lease's answer is left for awaitLease (see
// ipc.OpenOptions.DeferLease).
func (s *sharing) open(desc []byte, device int, deferLease bool) (int64, *ipc.Mapping, error) {
	if _, err := lib.allocator(device); err != nil { // starts the driver
		return 0, nil, err
	}
	imp, ack, err := s.importer()
	if err != nil {
		return 0, nil, err
	}
	m, err := imp.Open(context.Background(), desc, vmm.Device(device), ipc.OpenOptions{DeferLease: deferLease, Fetch: ipc.FetchOptions{LeaseAckWait: ack}})
	if err != nil {
		return 0, nil, err
	}
	if lib.log.Enabled(context.Background(), slog.LevelDebug) {
		st, us := m.Stages(), func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
		lib.log.Debug("xseg: opened a shared block", "device", device, "bytes", m.Len(), "via", m.Via().String(),
			"allocations", m.Allocations(), "reused", m.Reused(), "claimed", m.Claimed(), "fetch_us", us(st.Fetch), "reserve_us", us(st.Reserve), "import_us", us(st.Import),
			"map_us", us(st.Map), "lease_us", us(st.Lease))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.mappings == nil {
		s.mu.mappings = make(map[int64]*ipc.Mapping)
	}
	s.mu.next++
	s.mu.mappings[s.mu.next] = m
	return s.mu.next, m, nil
}

// importer returns the importer of the library's driver, which has
// started (the driver never changes after that), and the lease-end wait
// of its opens. It keeps closed mappings for XSEG_IMPORT_KEEP_MS
// (ipc.ImporterOptions.KeepFor) and waits XSEG_LEASE_ACK_MS for the
// exporter when a lease ends (ipc.FetchOptions.LeaseAckWait); a value it
// cannot read is an error of every open.
func (s *sharing) importer() (*ipc.Importer, time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.imp == nil {
		keep, err := importKeepFromEnv(lib.getenv)
		if err != nil {
			return nil, 0, err
		}
		ack, err := leaseAckFromEnv(lib.getenv)
		if err != nil {
			return nil, 0, err
		}
		imp, err := ipc.NewImporterWith(lib.driver(), ipc.ImporterOptions{KeepFor: keep, OnError: func(err error) {
			lib.log.Warn("xseg: dropping a kept mapping", "err", err)
		}})
		if err != nil {
			return nil, 0, err
		}
		s.mu.imp, s.mu.ackWait = imp, ack
	}
	return s.mu.imp, s.mu.ackWait, nil
}

// dropKept tears down the mappings the importer keeps, if it was made.
func (s *sharing) dropKept() error {
	s.mu.Lock()
	imp := s.mu.imp
	s.mu.Unlock()
	if imp == nil {
		return nil
	}
	return imp.DropKept()
}

// awaitLease waits for the lease of the mapping of handle h (an open
// with deferLease; nil at once for others).
func (s *sharing) awaitLease(h int64) error {
	s.mu.Lock()
	m := s.mu.mappings[h]
	s.mu.Unlock()
	if m == nil {
		return fmt.Errorf("no mapping has handle %d: %w", h, vmm.ErrInvalid)
	}
	return m.AwaitLease()
}

// close closes the mapping of handle h.
func (s *sharing) close(h int64) error {
	s.mu.Lock()
	m := s.mu.mappings[h]
	delete(s.mu.mappings, h)
	s.mu.Unlock()
	if m == nil {
		return fmt.Errorf("no mapping has handle %d: %w", h, vmm.ErrInvalid)
	}
	return m.Close()
}

// oneLine is err for the one-line text of xseg_last_error: errors.Join
// (ipc joins the failure of each transport an open tried, or an error and
// the failure of undoing what it had done) puts a newline between causes,
// which oneLine makes "; ". errors.Is and errors.As still see every cause.
func oneLine(err error) error {
	if err == nil || !strings.Contains(err.Error(), "\n") {
		return err
	}
	return lineJoined{err}
}

// lineJoined is an error whose text has "; " for each newline of its
// cause's.
type lineJoined struct{ cause error }

func (e lineJoined) Error() string { return strings.ReplaceAll(e.cause.Error(), "\n", "; ") }
func (e lineJoined) Unwrap() error { return e.cause }

// maxDescLen bounds a descriptor given to xseg_open or xseg_unshare.
const maxDescLen = 1 << 24

// cBytes copies n bytes of C memory at p (nil or n out of range: nil).
func cBytes(p unsafe.Pointer, n C.size_t) []byte {
	if p == nil || n == 0 || n > maxDescLen {
		return nil
	}
	return C.GoBytes(p, C.int(n))
}

// checkOpenArgs checks the arguments of xseg_open before anything is
// opened: a mapping opened for a call that then cannot hand out its
// handle would pin the exporter's pages for good.
func checkOpenArgs(desc unsafe.Pointer, length uint64, ptr, size bool) error {
	switch {
	case desc == nil:
		return fmt.Errorf("desc is NULL: %w", vmm.ErrInvalid)
	case length == 0 || length > maxDescLen:
		return fmt.Errorf("descriptor of %d bytes (want 1 to %d): %w", length, maxDescLen, vmm.ErrInvalid)
	case !ptr:
		return fmt.Errorf("ptr is NULL (it receives the mapping's address): %w", vmm.ErrInvalid)
	case !size:
		return fmt.Errorf("size is NULL (it receives the mapping's length): %w", vmm.ErrInvalid)
	}
	return nil
}

//export xsegGoShare
func xsegGoShare(ptr C.uintptr_t, device, importers C.int, out unsafe.Pointer, capacity C.size_t) (n C.ssize_t) {
	n = -1
	defer catch("xseg_share")
	drainFrees()
	if out == nil {
		fail("xseg_share", fmt.Errorf("%#x on device %d: out is NULL: %w", uintptr(ptr), int(device), vmm.ErrInvalid))
		return -1
	}
	b, err := shared.share(vmm.DevicePtr(ptr), int(device), int(importers))
	if err != nil {
		fail("xseg_share", oneLine(fmt.Errorf("%#x on device %d: %w", uintptr(ptr), int(device), err)))
		return -1
	}
	if uint64(len(b)) > uint64(capacity) {
		undone := "the share is undone"
		if err := shared.unshare(b); err != nil {
			undone = fmt.Sprintf("undoing the share failed: %v", oneLine(err))
		}
		fail("xseg_share", fmt.Errorf("the descriptor takes %d bytes, the buffer has %d (%s): %w", len(b), uint64(capacity), undone, vmm.ErrInvalid))
		return -1
	}
	copy(unsafe.Slice((*byte)(out), len(b)), b)
	return C.ssize_t(len(b))
}

//export xsegGoUnshare
func xsegGoUnshare(desc unsafe.Pointer, length C.size_t) (rc C.int) {
	rc = -1
	defer catch("xseg_unshare")
	drainFrees()
	return status("xseg_unshare", oneLine(shared.unshare(cBytes(desc, length))))
}

// xsegGoOpen is xseg_open (wait 1) and xseg_open_nowait (wait 0); ptr and
// size are NULL where the caller's are (shim.c passes its own locals
// otherwise, and copies them out only for a handle).
//
//export xsegGoOpen
func xsegGoOpen(desc unsafe.Pointer, length C.size_t, device C.int, ptr *C.uintptr_t, size *C.size_t, wait C.int) (h C.int64_t) {
	h = -1
	name := "xseg_open"
	if wait == 0 {
		name = "xseg_open_nowait"
	}
	defer catch(name)
	drainFrees()
	if err := checkOpenArgs(desc, uint64(length), ptr != nil, size != nil); err != nil {
		fail(name, err)
		return -1
	}
	id, m, err := shared.open(cBytes(desc, length), int(device), wait == 0)
	if err != nil {
		fail(name, oneLine(fmt.Errorf("on device %d: %w", int(device), err)))
		return -1
	}
	// Runs before catch, also on a panic: a mapping whose handle is not
	// handed out is closed, never left pinning the exporter's pages.
	defer func() {
		if h < 0 {
			if err := shared.close(id); err != nil {
				fail(name, oneLine(fmt.Errorf("closing the mapping of a failed call: %w", err)))
			}
		}
	}()
	*ptr, *size = C.uintptr_t(m.Ptr()), C.size_t(m.Len())
	return C.int64_t(id)
}

//export xsegGoOpenWait
func xsegGoOpenWait(h C.int64_t) (rc C.int) {
	rc = -1
	defer catch("xseg_open_wait")
	drainFrees()
	return status("xseg_open_wait", oneLine(shared.awaitLease(int64(h))))
}

//export xsegGoClose
func xsegGoClose(h C.int64_t) (rc C.int) {
	rc = -1
	defer catch("xseg_close")
	drainFrees()
	return status("xseg_close", oneLine(shared.close(int64(h))))
}
