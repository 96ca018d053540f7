package handles

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"

	"github.com/xseg-dev/xseg/vmm"
)

// A share's authentication memfd is what makes its descriptor's fd
// numbers trustworthy for pidfd_getfd, which copies whatever the exporter
// has open at a number now: after the share closed, the number may name
// another share's page, or any file of the exporter if the descriptor was
// forged. The exporter makes one small memfd per share and puts its fd
// number in the descriptor (Descriptor.AuthFD). Its content names the
// share, and it is sealed against every change, so its holders (importers
// fetch it too) cannot alter it:
//
//	off  size  field
//	  0     4  magic "XSGA"
//	  4     2  version (1)
//	  6     2  zero
//	  8     4  exporter pid
//	 12    16  the share's token
//	 28     4  page count n
//	 32  20*n  per page: the exporter's fd number (u32), then the page
//	           file's st_dev (u64) and st_ino (u64)
//
// Version 2, for a share made for one importer, adds one more entry of the
// same form after the pages: the share's claim memfd (see claim.go).
//
// The importer fetches the memfd first and checks that it holds the
// descriptor's token, pid and fd numbers (Descriptor.CheckAuth); only the
// holder of the descriptor knows the token, and only the live share's
// memfd holds it. It then fetches the pages and checks each one's
// identity against the list. The inode of a CUDA-exported fd may not tell
// pages apart, so the importer finally fetches the auth memfd again and
// checks that it is the same file: the exporter closes the auth memfd
// before the page fds, so while the same file is at that number, the page
// numbers were still the share's when they were fetched.
const (
	authMagic        = "XSGA"
	authVersion      = 1
	authVersionClaim = 2
	authHeader       = 32
	authEntry        = 20
)

// FileID is the identity of an open file: (st_dev, st_ino).
type FileID struct{ Dev, Ino uint64 }

// Auth is what an authentication memfd vouches for: each page file's
// identity, in page order, and the share's claim memfd, if it has one.
type Auth struct {
	Pages []FileID
	Claim *FileRef
}

// FileRef is one file of the exporter: its fd number there and its
// identity.
type FileRef struct {
	FD int
	ID FileID
}

// NewAuth makes the sealed authentication memfd of a share with token tok
// whose pages are pages, in page order, and whose claim memfd is claim
// (nil for none; see above). The caller owns the result and must close it
// before it closes any of pages, or claim.
func NewAuth(tok Token, pages []*FD, claim *FD) (*FD, error) {
	version, files := uint16(authVersion), pages
	if claim != nil {
		version, files = authVersionClaim, append(append([]*FD(nil), pages...), claim)
	}
	b := make([]byte, 0, authHeader+authEntry*len(files))
	b = append(b, authMagic...)
	b = binary.LittleEndian.AppendUint16(b, version)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(os.Getpid()))
	b = append(b, tok[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pages)))
	for i, p := range files {
		if p == nil || p.Int() < 0 {
			return nil, fmt.Errorf("authenticating file %d: closed: %w", i, vmm.ErrInvalid)
		}
		id, err := FileIDOf(p.Int())
		if err != nil {
			return nil, fmt.Errorf("authenticating file %d: %w", i, err)
		}
		b = binary.LittleEndian.AppendUint32(b, uint32(p.Int()))
		b = binary.LittleEndian.AppendUint64(b, id.Dev)
		b = binary.LittleEndian.AppendUint64(b, id.Ino)
	}
	return newSealedFile(b)
}

// CheckAuth reads the authentication memfd fd (fetched from the exporter
// at d.AuthFD) and checks that it is a sealed auth memfd of d's exporter
// for d's token and d's fd numbers. It returns the identity of each page
// file, in page order, and the claim memfd's, if the share has one. Any
// mismatch is an error wrapping vmm.ErrInvalid.
func (d *Descriptor) CheckAuth(fd int) (Auth, error) {
	b, err := d.readAuth(fd)
	if err != nil {
		return Auth{}, err
	}
	return d.parseAuth(b)
}

// authSizes are the sizes an authentication of n pages may have: without
// a claim entry, and with one.
func authSizes(n int) (int, int) {
	return authHeader + authEntry*n, authHeader + authEntry*(n+1)
}

// parseAuth checks the content of an authentication memfd against d.
func (d *Descriptor) parseAuth(b []byte) (Auth, error) {
	le := binary.LittleEndian
	var tok Token
	copy(tok[:], b[12:28])
	plain, claimed := authSizes(len(d.PageFDs))
	v := le.Uint16(b[4:])
	switch {
	case string(b[:4]) != authMagic || v != authVersion && v != authVersionClaim:
		return Auth{}, authErr("fd %d is not an authentication memfd", d.AuthFD)
	case v == authVersion && len(b) != plain || v == authVersionClaim && len(b) != claimed:
		return Auth{}, authErr("fd %d holds %d bytes, a version-%d authentication of %d pages holds %d or %d", d.AuthFD, len(b), v, len(d.PageFDs), plain, claimed)
	case int(le.Uint32(b[8:])) != d.ExporterPID:
		return Auth{}, authErr("fd %d authenticates a share of pid %d", d.AuthFD, le.Uint32(b[8:]))
	case !tok.Equal(d.Token):
		return Auth{}, authErr("fd %d authenticates another share (its token differs)", d.AuthFD)
	case int(le.Uint32(b[28:])) != len(d.PageFDs):
		return Auth{}, authErr("fd %d authenticates %d pages, the descriptor names %d", d.AuthFD, le.Uint32(b[28:]), len(d.PageFDs))
	}
	a := Auth{Pages: make([]FileID, len(d.PageFDs))}
	for i, want := range d.PageFDs {
		e := b[authHeader+i*authEntry:]
		if got := int(le.Uint32(e)); got != want {
			return Auth{}, authErr("page %d is fd %d of the exporter, the descriptor says %d", i, got, want)
		}
		a.Pages[i] = FileID{Dev: le.Uint64(e[4:]), Ino: le.Uint64(e[12:])}
	}
	if v == authVersionClaim {
		e := b[authHeader+len(d.PageFDs)*authEntry:]
		a.Claim = &FileRef{FD: int(le.Uint32(e)), ID: FileID{Dev: le.Uint64(e[4:]), Ino: le.Uint64(e[12:])}}
		if a.Claim.FD > math.MaxInt32 {
			return Auth{}, authErr("claim fd number %d", a.Claim.FD)
		}
	}
	return a, nil
}

func authErr(format string, args ...any) error {
	return fmt.Errorf("authenticating the descriptor: "+format+": %w", append(args, vmm.ErrInvalid)...)
}
