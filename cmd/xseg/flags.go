package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xseg-dev/xseg/internal/bytesize"
	"github.com/xseg-dev/xseg/vmm/host"
)

// enumFlag is a string flag that accepts only the listed values.
type enumFlag struct {
	value   string
	allowed []string
}

func newEnum(def string, allowed ...string) *enumFlag {
	return &enumFlag{value: def, allowed: allowed}
}

func (e *enumFlag) String() string { return e.value }

// Type names the values in the help text.
func (e *enumFlag) Type() string { return strings.Join(e.allowed, "|") }

// Set accepts one of the allowed values.
func (e *enumFlag) Set(s string) error {
	if !slices.Contains(e.allowed, s) {
		return fmt.Errorf("%q is not one of %s", s, strings.Join(e.allowed, ", "))
	}
	e.value = s
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
