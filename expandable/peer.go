package expandable

import (
	"errors"
	"fmt"
	"slices"

	"github.com/xseg-dev/xseg/vmm"
)

// Peer access. Memory mapped with the VMM API is reachable only by the
// devices SetAccess names; enabling peer access between devices
// (cuCtxEnablePeerAccess) does not change that. EnablePeerAccess grants a
// peer device read-write access to every page the allocator has mapped
// (one SetAccess for each run of adjacent mapped pages) and to every page
// it maps later (each new run is mapped with one SetAccess that names the
// owner and all enabled peers), and to the imported mappings registered
// with AddImported. DisablePeerAccess takes it back.

// EnablePeerAccess grants device peer read-write access to all memory of
// the allocator, mapped now or later. Enabling a peer twice does nothing.
// The allocator's own device, or a device the driver does not have, is
// vmm.ErrInvalid. If the driver fails part way, the access granted by this
// call is revoked and the peer is not enabled. It is safe to call
// concurrently with every other method; after Close it fails with
// vmm.ErrClosed.
func (a *Allocator) EnablePeerAccess(peer vmm.Device) error {
	if err := a.checkPeer("enabling", peer); err != nil {
		return err
	}
	p := a.pages
	p.mu.Lock()
	defer p.mu.Unlock()
	if slices.Contains(p.mu.peers, peer) {
		return nil
	}
	grant := []vmm.AccessDesc{{Device: peer, Flags: vmm.AccessReadWrite}}
	var done []span
	err := p.eachRunLocked(func(r span) error {
		if err := p.d.SetAccess(r.ptr, r.size, grant); err != nil {
			return fmt.Errorf("granting device %d access to %v+%d: %w", peer, r.ptr, r.size, err)
		}
		done = append(done, r)
		return nil
	})
	if err != nil {
		revoke := []vmm.AccessDesc{{Device: peer, Flags: vmm.AccessNone}}
		for _, r := range done {
			if rerr := p.d.SetAccess(r.ptr, r.size, revoke); rerr != nil {
				err = errors.Join(err, fmt.Errorf("revoking it again at %v+%d: %w", r.ptr, r.size, rerr))
			}
		}
		return fmt.Errorf("expandable: enabling peer access of device %d to device %d's memory: %w", peer, a.dev, err)
	}
	p.mu.peers = append(p.mu.peers, peer)
	p.setAccessListLocked()
	return nil
}

// DisablePeerAccess revokes the access EnablePeerAccess granted device
// peer: pages mapped from now on are not granted to it, and every mapped
// page is set to vmm.AccessNone for it. Disabling a peer that is not
// enabled does nothing. If the driver fails part way, the peer stays
// disabled for new pages and the error names the runs it still reaches.
// It is safe to call concurrently with every other method; after Close it
// fails with vmm.ErrClosed.
func (a *Allocator) DisablePeerAccess(peer vmm.Device) error {
	if err := a.checkPeer("disabling", peer); err != nil {
		return err
	}
	p := a.pages
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.mu.peers, peer)
	if i < 0 {
		return nil
	}
	p.mu.peers = slices.Delete(p.mu.peers, i, i+1)
	p.setAccessListLocked()
	revoke := []vmm.AccessDesc{{Device: peer, Flags: vmm.AccessNone}}
	var errs []error
	_ = p.eachRunLocked(func(r span) error {
		if err := p.d.SetAccess(r.ptr, r.size, revoke); err != nil {
			errs = append(errs, fmt.Errorf("revoking at %v+%d (device %d keeps access there): %w", r.ptr, r.size, peer, err))
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("expandable: disabling peer access of device %d to device %d's memory: %w", peer, a.dev, err)
	}
	return nil
}

// Peers returns the devices with peer access, in the order enabled.
func (a *Allocator) Peers() []vmm.Device {
	a.pages.mu.Lock()
	defer a.pages.mu.Unlock()
	return slices.Clone(a.pages.mu.peers)
}

// AccessList returns the access a new mapping of this allocator's memory
// should be given: read-write for the allocator's device and every peer.
// An importer (package ipc) that maps memory for this device uses it, then
// registers the mapping with AddImported.
func (a *Allocator) AccessList() []vmm.AccessDesc {
	a.pages.mu.Lock()
	defer a.pages.mu.Unlock()
	return slices.Clone(a.pages.accessLocked())
}

// checkPeer reports vmm.ErrClosed once the allocator is closed, and
// vmm.ErrInvalid unless peer is a device of the driver other than the
// allocator's. what is "enabling" or "disabling".
func (a *Allocator) checkPeer(what string, peer vmm.Device) error {
	if a.heap.Closed() {
		return fmt.Errorf("expandable: %s peer access of device %d: %w", what, peer, vmm.ErrClosed)
	}
	if peer == a.dev {
		return fmt.Errorf("expandable: peer access: device %d is the allocator's own device: %w", peer, vmm.ErrInvalid)
	}
	n, err := a.d.DeviceCount()
	if err != nil {
		return fmt.Errorf("expandable: peer access for device %d: %w", peer, err)
	}
	if peer < 0 || int(peer) >= n {
		return fmt.Errorf("expandable: peer access: device %d: the %s driver has %d devices: %w", peer, a.d.Backend(), n, vmm.ErrInvalid)
	}
	return nil
}

// setAccessListLocked rebuilds the access list of new runs from the peers.
// p.mu is held.
func (p *pages) setAccessListLocked() {
	if len(p.mu.peers) == 0 {
		p.mu.access = nil
		return
	}
	list := slices.Clone(p.rw)
	for _, d := range p.mu.peers {
		list = append(list, vmm.AccessDesc{Device: d, Flags: vmm.AccessReadWrite})
	}
	p.mu.access = list
}

// span is a run of mapped memory.
type span struct {
	ptr  vmm.DevicePtr
	size uint64
}

// eachRunLocked calls f for every run of adjacent mapped pages of every
// segment, then for every registered imported mapping, and stops at the
// first error. p.mu is held.
func (p *pages) eachRunLocked(f func(span) error) error {
	for seg := range p.mu.segs {
		sp := seg.Data.(*segPages)
		for i := 0; i < len(sp.handles); {
			if sp.handles[i] == 0 {
				i++
				continue
			}
			j := i
			for j < len(sp.handles) && sp.handles[j] != 0 {
				j++
			}
			r := span{seg.Base.Add(uint64(i) * seg.PageSize), uint64(j-i) * seg.PageSize}
			if err := f(r); err != nil {
				return err
			}
			i = j
		}
	}
	for ptr, size := range p.mu.imported {
		if err := f(span{ptr, size}); err != nil {
			return err
		}
	}
	return nil
}
