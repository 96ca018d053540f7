package handles

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/xseg-dev/xseg/vmm"
)

// A share meant for exactly one importer (one torch.multiprocessing
// message) has a claim memfd besides its authentication memfd. It decides,
// with no round trip to the exporter, which importer the share is held
// for: the first one to seal it. Until that importer's lease request is
// served (or it exits), the exporter serves nobody else and keeps the
// pages, also past its own Close. So an importer that won the claim may
// read the pages at once, before the exporter has answered.
//
// The memfd holds 16 bytes, and its size is sealed:
//
//	off  size  field
//	  0     4  pid of the claimant (as the exporter sees it: the same pid
//	           namespace, as pidfd_getfd needs anyway)
//	  4     4  zero
//	  8     8  the claimant's nonce, random per open
//
// Claiming is: write one's own (pid, nonce), seal the file against writes
// and further seals, read it back. The kernel serialises the writes and
// the seal on the file's inode; the first seal fixes the content, every
// write after it fails, and every claimant reads the same winner. The
// exporter claims the same way for a peer whose request brings no nonce
// (a socket importer, an older one), so that one rule decides for all.
const claimSize = 16

// Claimant names who a share is held for: a process, and one open in it.
type Claimant struct {
	PID   int
	Nonce uint64
}

// NewNonce returns a random nonce for a claim. Its top bit is set, so a
// nonce below 1<<63 (an exporter claiming a share in its own name, with a
// fixed one) never equals an importer's.
func NewNonce() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("making a claim nonce: %w", err)
	}
	return binary.LittleEndian.Uint64(b[:]) | 1<<63, nil
}

func (c Claimant) bytes() []byte {
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, claimSize), uint32(c.PID))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return binary.LittleEndian.AppendUint64(b, c.Nonce)
}

// parseClaimant reads a sealed claim's content; a zero pid or nonce
// (nobody wrote, or someone wrote zeroes) names nobody.
func parseClaimant(b []byte) (Claimant, error) {
	le := binary.LittleEndian
	c := Claimant{PID: int(le.Uint32(b)), Nonce: le.Uint64(b[8:])}
	if c.PID <= 0 || c.PID > MaxPID || c.Nonce == 0 || le.Uint32(b[4:]) != 0 {
		return Claimant{}, fmt.Errorf("the claim names nobody (pid %d, nonce %#x): %w", c.PID, c.Nonce, vmm.ErrInvalid)
	}
	return c, nil
}

// ClaimFor claims the share whose claim memfd is fd for c, and returns
// the claimant the share is held for: c if this call won, else whoever
// sealed the file first. A file that is not a claim memfd, or whose
// content names nobody, is an error wrapping vmm.ErrInvalid; the caller
// then holds no claim.
func ClaimFor(fd *FD, c Claimant) (Claimant, error) {
	if fd == nil || fd.Int() < 0 {
		return Claimant{}, fmt.Errorf("claiming through a closed fd: %w", vmm.ErrInvalid)
	}
	if c.PID <= 0 || c.PID > MaxPID || c.Nonce == 0 {
		return Claimant{}, fmt.Errorf("claiming for pid %d nonce %#x: %w", c.PID, c.Nonce, vmm.ErrInvalid)
	}
	return claimFile(fd.Int(), c.bytes())
}
