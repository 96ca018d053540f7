package xseg

import (
	"fmt"
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
func ParseBackend(s string) (Backend, error) {
	b := Backend(s)
	if err := b.check(); err != nil {
		return "", err
	}
	if b == "" {
		b = BackendAuto
	}
	return b, nil
}

// MarshalText returns the name.
func (b Backend) MarshalText() ([]byte, error) { return []byte(b), nil }

// UnmarshalText reads a name as ParseBackend does, so that a Backend can
// be a flag (flag.TextVar) or a field of a configuration file.
func (b *Backend) UnmarshalText(text []byte) error {
	v, err := ParseBackend(string(text))
	if err != nil {
		return err
	}
	*b = v
	return nil
}

func (b Backend) check() error {
	switch b {
	case "", BackendAuto, BackendCUDA, BackendHost:
		return nil
	}
	return fmt.Errorf("xseg: unknown backend %q (want %s): %w", string(b), names(Backends()), vmm.ErrInvalid)
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
	k := AllocatorKind(s)
	if err := k.check(); err != nil {
		return "", err
	}
	if k == "" {
		k = AllocatorAuto
	}
	return k, nil
}

// MarshalText returns the name.
func (k AllocatorKind) MarshalText() ([]byte, error) { return []byte(k), nil }

// UnmarshalText reads a name as ParseAllocatorKind does, so that an
// AllocatorKind can be a flag (flag.TextVar) or a field of a
// configuration file.
func (k *AllocatorKind) UnmarshalText(text []byte) error {
	v, err := ParseAllocatorKind(string(text))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

func (k AllocatorKind) check() error {
	switch k {
	case "", AllocatorAuto, AllocatorExpandable, AllocatorFallback:
		return nil
	}
	return fmt.Errorf("xseg: unknown allocator %q (want %s): %w", string(k), names(AllocatorKinds()), vmm.ErrInvalid)
}

// names lists values as "a, b or c".
func names[T ~string](values []T) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return strings.Join(s[:len(s)-1], ", ") + " or " + s[len(s)-1]
}
