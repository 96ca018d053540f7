package main

import (
	"bytes"
	"fmt"
)

import "github.com/xseg-dev/xseg/vmm"

// value is the byte that fills region i (of step bytes) of a buffer.
func value(i uint64) byte { return byte(i*151 + 13) }

// fill sets each step-sized region of [off, off+n) at base to its value.
func fill(d vmm.Driver, base vmm.DevicePtr, off, n, step uint64) error {
	for at := off; at < off+n; at += step {
		if err := d.Memset(base.Add(at), value(at/step), step); err != nil {
			return fmt.Errorf("writing the pattern at offset %d: %w", at, err)
		}
	}
	return nil
}

// check copies size bytes at base back in chunks and checks every region.
func check(d vmm.Driver, base vmm.DevicePtr, size, step uint64) error {
	chunk := min(size, max(step, 1<<30/step*step))
	host := make([]byte, chunk)
	for off := uint64(0); off < size; off += chunk {
		n := min(chunk, size-off)
		if err := d.CopyDtoH(host[:n], base.Add(off)); err != nil {
			return fmt.Errorf("copying back %d bytes at offset %d: %w", n, off, err)
		}
		for r := uint64(0); r < n; r += step {
			reg := host[r : r+step]
			if want := value((off + r) / step); reg[0] != want || !bytes.Equal(reg[1:], reg[:step-1]) {
				return fmt.Errorf("region at offset %d does not hold its pattern %#x (first byte %#x): data lost", off+r, want, reg[0])
			}
		}
	}
	return nil
}
