package main

import (
	"fmt"
	"strconv"
	"strings"
)

// sizeFlag is a flag.Value of bytes written as 512, 2MiB, 16GiB.
type sizeFlag uint64

func (s *sizeFlag) String() string { return human(uint64(*s)) }

// Set parses a number with an optional KiB, MiB, GiB or TiB suffix.
func (s *sizeFlag) Set(v string) error {
	shift := 0
	for _, u := range []struct {
		suffix string
		shift  int
	}{{"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}} {
		if strings.HasSuffix(v, u.suffix) {
			v, shift = strings.TrimSpace(strings.TrimSuffix(v, u.suffix)), u.shift
			break
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n > (1<<(64-shift))-1 {
		return fmt.Errorf("size %q: want a number with an optional KiB, MiB, GiB or TiB suffix", v)
	}
	*s = sizeFlag(n << shift)
	return nil
}
