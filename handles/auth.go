package handles

import (
	"encoding/binary"
	"fmt"
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
	authMagic   = "XSGA"
	authVersion = 1
	authHeader  = 32
	authEntry   = 20
)

// FileID is the identity of an open file: (st_dev, st_ino).
type FileID struct{ Dev, Ino uint64 }

// NewAuth makes the sealed authentication memfd of a share with token tok
// whose pages are pages, in page order (see above). The caller owns the
// result and must close it before it closes any of pages.
func NewAuth(tok Token, pages []*FD) (*FD, error) {
	b := make([]byte, 0, authHeader+authEntry*len(pages))
	b = append(b, authMagic...)
	b = binary.LittleEndian.AppendUint16(b, authVersion)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, uint32(os.Getpid()))
	b = append(b, tok[:]...)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pages)))
	for i, p := range pages {
		id, err := FileIDOf(p.Int())
		if err != nil {
			return nil, fmt.Errorf("authenticating page %d: %w", i, err)
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
// file, in page order. Any mismatch is an error wrapping vmm.ErrInvalid.
func (d *Descriptor) CheckAuth(fd int) ([]FileID, error) {
	b, err := d.readAuth(fd)
	if err != nil {
		return nil, err
	}
	return d.parseAuth(b)
}

// parseAuth checks the content of an authentication memfd against d.
func (d *Descriptor) parseAuth(b []byte) ([]FileID, error) {
	le := binary.LittleEndian
	var tok Token
	copy(tok[:], b[12:28])
	switch {
	case string(b[:4]) != authMagic || le.Uint16(b[4:]) != authVersion:
		return nil, authErr("fd %d is not an authentication memfd", d.AuthFD)
	case int(le.Uint32(b[8:])) != d.ExporterPID:
		return nil, authErr("fd %d authenticates a share of pid %d", d.AuthFD, le.Uint32(b[8:]))
	case !tok.Equal(d.Token):
		return nil, authErr("fd %d authenticates another share (its token differs)", d.AuthFD)
	case int(le.Uint32(b[28:])) != len(d.PageFDs):
		return nil, authErr("fd %d authenticates %d pages, the descriptor names %d", d.AuthFD, le.Uint32(b[28:]), len(d.PageFDs))
	}
	ids := make([]FileID, len(d.PageFDs))
	for i, want := range d.PageFDs {
		e := b[authHeader+i*authEntry:]
		if got := int(le.Uint32(e)); got != want {
			return nil, authErr("page %d is fd %d of the exporter, the descriptor says %d", i, got, want)
		}
		ids[i] = FileID{Dev: le.Uint64(e[4:]), Ino: le.Uint64(e[12:])}
	}
	return ids, nil
}

func authErr(format string, args ...any) error {
	return fmt.Errorf("authenticating the descriptor: "+format+": %w", append(args, vmm.ErrInvalid)...)
}
