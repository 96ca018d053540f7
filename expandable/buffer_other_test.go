//go:build !linux

package expandable

import "os"

func closeFD(fd int) error { return os.NewFile(uintptr(fd), "exported page").Close() }
