package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/vmm/host"
)

// enumFlag is a string flag that accepts only the listed values.
type enumFlag[T ~string] struct {
	value   T
	allowed []T
}

func newEnum[T ~string](def T, allowed ...T) *enumFlag[T] {
	return &enumFlag[T]{value: def, allowed: allowed}
}

func (e *enumFlag[T]) String() string { return string(e.value) }

// Type names the values in the help text.
func (e *enumFlag[T]) Type() string { return e.join("|") }

func (e *enumFlag[T]) join(sep string) string {
	s := make([]string, len(e.allowed))
	for i, v := range e.allowed {
		s[i] = string(v)
	}
	return strings.Join(s, sep)
}

// Set accepts one of the allowed values.
func (e *enumFlag[T]) Set(s string) error {
	if !slices.Contains(e.allowed, T(s)) {
		return fmt.Errorf("%q is not one of %s", s, e.join(", "))
	}
	e.value = T(s)
	return nil
}

// capacityFlag is --capacity: the host backend's memory per device, a
// size in bytesize's syntax that is a whole number of its pages and at
// most host.MaxCapacity. Zero (not given) means the backend's default.
type capacityFlag uint64

func (c *capacityFlag) String() string {
	if *c == 0 {
		return "0" // pflag's help shows no default for it
	}
	return bytesize.Format(uint64(*c))
}

// Type names the values in the help text.
func (c *capacityFlag) Type() string { return "SIZE" }

// Set reads a size such as 24GiB and checks it against the page size and
// host.MaxCapacity.
func (c *capacityFlag) Set(s string) error {
	n, err := bytesize.ParseMultiple(s, host.DefaultGranularity, "the granularity")
	if err != nil {
		return err
	}
	if n > host.MaxCapacity {
		return fmt.Errorf("more than %s, the most a host-backend device may have: its memory is reserved as address space, "+
			"once for each range of the allocator, and x86-64 gives a process 128 TiB", bytesize.Format(host.MaxCapacity))
	}
	*c = capacityFlag(n)
	return nil
}

// capacityUsage is the help of --capacity.
var capacityUsage = "memory of each host-backend device, a multiple of 2 MiB up to " + bytesize.Format(host.MaxCapacity) +
	" (it is reserved as address space): " + bytesize.Syntax + " (default " + bytesize.Format(host.DefaultCapacity) + ")"

// seedFlag is --seed: a seed of the perturbation, a whole number that
// fits 64 bits.
type seedFlag uint64

func (f *seedFlag) String() string { return strconv.FormatUint(uint64(*f), 10) }

// Type names the values in the help text.
func (f *seedFlag) Type() string { return "uint" }

// Set reads a seed, with words of its own where strconv's would show.
func (f *seedFlag) Set(s string) error {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 0, 64) // base 0, as pflag's Uint64Var
	if err != nil {
		return fmt.Errorf("want a seed, a whole number from 0 to %d", uint64(math.MaxUint64))
	}
	*f = seedFlag(n)
	return nil
}
