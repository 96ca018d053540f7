//go:build !cgo

package main

import (
	"fmt"
	"os"
)

// Without cgo there is no C API: the package still builds (and its Go
// parts test) with CGO_ENABLED=0, as a command that says what to do.
func main() {
	fmt.Fprintln(os.Stderr, "libxseg is a C library: build it with CGO_ENABLED=1 go build -buildmode=c-shared -o libxseg.so ./cmd/libxseg")
	os.Exit(2)
}
