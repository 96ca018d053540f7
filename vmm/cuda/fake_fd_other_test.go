//go:build !linux

package cuda

import "errors"

var errNoFakeFD = errors.New("the fake's exported fds are Linux pipes")

func newFakeFD() (int, uint64, error) { return -1, 0, errNoFakeFD }
func fakeFDID(int) (uint64, error)    { return 0, errNoFakeFD }
func closeFakeFD(int) error           { return errNoFakeFD }
