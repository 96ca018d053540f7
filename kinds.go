package xseg

import (
	"fmt"
	"slices"
	"strings"

	"github.com/xseg-dev/xseg/vmm"
)

// Backend names the memory backend Open and OpenDriver use. The zero
// value means BackendAuto.
type Backend string

const (
	// BackendAuto is CUDA if a driver and a device are there, else the
	// host backend.
	BackendAuto Backend = "auto"
	// BackendCUDA is the CUDA driver (package vmm/cuda).
	BackendCUDA Backend = "cuda"
	// BackendHost runs the driver contract on host memory (package
	// vmm/host).
	BackendHost Backend = "host"
)

// Backends lists the backends, BackendAuto first.
func Backends() []Backend { return []Backend{BackendAuto, BackendHost, BackendCUDA} }

// ParseBackend reads a backend name as flags and environment variables
// give it: "auto" (or ""), "host" or "cuda". Any other name is an error,
// matching vmm.ErrInvalid, that lists the valid ones.
func ParseBackend(s string) (Backend, error) { return parseName("backend", s, Backends()) }

// MarshalText returns the name.
func (b Backend) MarshalText() ([]byte, error) { return []byte(b), nil }

// UnmarshalText reads a name as ParseBackend does, so that a Backend can
// be a flag (flag.TextVar) or a field of a configuration file.
func (b *Backend) UnmarshalText(text []byte) error { return unmarshalName(b, text, ParseBackend) }

func (b Backend) check() error {
	_, err := ParseBackend(string(b))
	return err
}

// AllocatorKind names one of xseg's allocators, or how Open picks one. The
// zero value means AllocatorAuto.
type AllocatorKind string

const (
	// AllocatorAuto picks expandable where the device supports virtual
	// memory management, fallback where it does not.
	AllocatorAuto AllocatorKind = "auto"
	// AllocatorExpandable is package expandable: segments that grow by
	// pages mapped on demand.
	AllocatorExpandable AllocatorKind = "expandable"
	// AllocatorFallback is package fallback: the same block core over
	// plain allocations.
	AllocatorFallback AllocatorKind = "fallback"
)

// AllocatorKinds lists the allocator choices, AllocatorAuto first.
func AllocatorKinds() []AllocatorKind {
	return []AllocatorKind{AllocatorAuto, AllocatorExpandable, AllocatorFallback}
}

// ParseAllocatorKind reads an allocator name as flags and environment
// variables give it: "auto" (or ""), "expandable" or "fallback". Any other
// name is an error, matching vmm.ErrInvalid, that lists the valid ones.
func ParseAllocatorKind(s string) (AllocatorKind, error) {
	return parseName("allocator", s, AllocatorKinds())
}

// MarshalText returns the name.
func (k AllocatorKind) MarshalText() ([]byte, error) { return []byte(k), nil }

// UnmarshalText reads a name as ParseAllocatorKind does, so that an
// AllocatorKind can be a flag (flag.TextVar) or a field of a
// configuration file.
func (k *AllocatorKind) UnmarshalText(text []byte) error {
	return unmarshalName(k, text, ParseAllocatorKind)
}

func (k AllocatorKind) check() error {
	_, err := ParseAllocatorKind(string(k))
	return err
}

// parseName returns s as one of valid, the first (auto) for "", or an
// error that names what s should be and lists valid.
func parseName[T ~string](what, s string, valid []T) (T, error) {
	if s == "" {
		return valid[0], nil
	}
	if slices.Contains(valid, T(s)) {
		return T(s), nil
	}
	names := make([]string, len(valid))
	for i, v := range valid {
		names[i] = string(v)
	}
	list := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	return "", fmt.Errorf("xseg: unknown %s %q (want %s): %w", what, s, list, vmm.ErrInvalid)
}

// unmarshalName sets *p to parse(text), or leaves it and fails.
func unmarshalName[T ~string](p *T, text []byte, parse func(string) (T, error)) error {
	v, err := parse(string(text))
	if err != nil {
		return err
	}
	*p = v
	return nil
}
