//go:build !linux

package host

import (
	"fmt"
	"os"
	"runtime"

	"github.com/xseg-dev/xseg/vmm"
)

// The backend is made of Linux calls: memfds and their seals, mmap at
// fixed addresses, fallocate. On other systems the package builds, and
// every call below answers errNoHost, so Open fails with
// vmm.ErrNotSupported when it makes the first arena.

var errNoHost = fmt.Errorf("the host backend needs Linux (memfd, mmap at fixed addresses), not %s: %w", runtime.GOOS, vmm.ErrNotSupported)

var osPage = uint64(os.Getpagesize())

const (
	protNone  = 0
	protRead  = 1
	protWrite = 2
)

func reserveAnywhere(uint64) (uintptr, error)        { return 0, errNoHost }
func mapFile(uintptr, uint64, int, int, int64) error { return errNoHost }
func mapAnonymous(uint64) (uintptr, error)           { return 0, errNoHost }
func munmap(uintptr, uint64) error                   { return errNoHost }
func mprotect(uintptr, uint64, int) error            { return errNoHost }
func unbacked(uintptr, uint64) error                 { return errNoHost }
func createArenaFile(string) (int, error)            { return -1, errNoHost }
func createSealable(string) (int, error)             { return -1, errNoHost }
func truncate(int, uint64) error                     { return errNoHost }
func sizeAndSeal(int, uint64) error                  { return errNoHost }
func checkSealed(int) error                          { return errNoHost }
func punch(int, uint64, uint64) error                { return errNoHost }
func closeFD(int) error                              { return errNoHost }
func dupFD(int) (int, error)                         { return -1, errNoHost }
func pwrite(int, []byte, int64) (int, error)         { return 0, errNoHost }
func regularFileSize(int) (int64, error)             { return 0, errNoHost }
func fdName(int) (string, error)                     { return "", errNoHost }
func sysErr(err error) error                         { return err }

// hostName names this machine for the device UUIDs.
func hostName() string {
	h, _ := os.Hostname()
	return h
}

func maxMapCount() int { return 0 }
