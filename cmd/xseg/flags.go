package main

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
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

// byteSize is a flag of a number of bytes, with an optional unit: B, KiB,
// MiB, GiB, TiB (K, M, G, T mean the same) or KB, MB, GB, TB (powers of
// 1000). Zero means "the default".
type byteSize uint64

var byteUnits = map[string]uint64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
	"g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

func (b *byteSize) String() string { return strconv.FormatUint(uint64(*b), 10) }

// Type names the values in the help text.
func (b *byteSize) Type() string { return "BYTES" }

// Set parses a size such as 141GiB, 24G, 1000000 or 1.5TB.
func (b *byteSize) Set(s string) error {
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteSize(v)
	return nil
}

func parseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := byteUnits[unit]
	if !ok || num == "" {
		return 0, fmt.Errorf("bad size %q (want a number of bytes, optionally with a unit: KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil || n > math.MaxUint64/mult {
			return 0, fmt.Errorf("bad size %q: out of range", s)
		}
		return n * mult, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*float64(mult) >= math.MaxUint64 {
		return 0, fmt.Errorf("bad size %q", s)
	}
	return uint64(f * float64(mult)), nil
}
