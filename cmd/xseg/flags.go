package main

import (
	"fmt"
	"slices"
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
// size in bytesize's syntax that is a whole number of its pages. Zero (not
// given) means the backend's default.
type capacityFlag uint64

func (c *capacityFlag) String() string {
	if *c == 0 {
		return "0" // pflag's help shows no default for it
	}
	return bytesize.Format(uint64(*c))
}

// Type names the values in the help text.
func (c *capacityFlag) Type() string { return "SIZE" }

// Set reads a size such as 24GiB and checks it against the page size.
func (c *capacityFlag) Set(s string) error {
	n, err := bytesize.ParseMultiple(s, host.DefaultGranularity, "the granularity")
	if err != nil {
		return err
	}
	*c = capacityFlag(n)
	return nil
}
