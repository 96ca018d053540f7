package xseg

import (
	"log/slog"

	"github.com/xseg-dev/xseg/spec"
	"github.com/xseg-dev/xseg/vmm"
)

// Config tunes an allocator: page sizes, the small-pool limit, the release
// threshold, the page cache, the OOM policy and sharing. It is
// spec.Config, where its fields are documented.
type Config = spec.Config

// DefaultConfig returns the defaults (see spec.DefaultConfig): one pool of
// 2 MiB pages a stream, recycled where the heap grows, chunks of up to
// 1 GiB for large growths, no release threshold, a 128 MiB page cache, no
// OOM waits or retries, size factor 0.8.
func DefaultConfig() Config { return spec.DefaultConfig() }

// ClassicConfig returns the page policy before 2026-11 (see
// spec.ClassicConfig): 2 MiB small pages for requests up to 1 MiB, 20 MiB
// large pages, no recycling.
func ClassicConfig() Config { return spec.ClassicConfig() }

// SteadyConfig returns the page policy for loops that make the same
// allocations every step (see spec.SteadyConfig): 2 MiB pages mapped
// where first needed and never moved, chunks of up to 64 MiB never split,
// no page cache.
func SteadyConfig() Config { return spec.SteadyConfig() }

// ParseConfig applies s, in the XSEG_CONF syntax "key:value,key:value", to
// base (see spec.ParseConfig for the keys). Unknown keys and bad values
// are errors that name the key.
func ParseConfig(base Config, s string) (Config, error) { return spec.ParseConfig(base, s) }

// ConfigFromEnv returns the defaults changed by the environment variables
// OOM_MAX_RETRIES, OOM_DELAY_MS, OOM_SIZE_FACTOR, OOM_VERBOSE and then
// XSEG_CONF (see spec.ConfigFromEnv). getenv is usually os.Getenv.
func ConfigFromEnv(getenv func(string) string) (Config, error) { return spec.ConfigFromEnv(getenv) }

// Options say what Open makes. The zero value picks everything
// automatically: CUDA device 0 if a driver and device are there, else the
// host backend; the expandable allocator where the device supports
// virtual memory management, else the fallback allocator (see
// ChooseAllocator); the configuration from the environment.
type Options struct {
	// Backend is BackendAuto (or ""), BackendHost or BackendCUDA.
	// Ignored when Driver is set.
	Backend Backend
	// Allocator is AllocatorAuto (or ""), AllocatorExpandable or
	// AllocatorFallback; any allocator can be forced on any backend,
	// except expandable on a device without VMM (vmm.ErrNotSupported).
	Allocator AllocatorKind
	// Driver, if set, is used instead of opening one; the allocator does
	// not close it.
	Driver vmm.Driver
	// Device is the device to allocate on.
	Device vmm.Device
	// HostCapacity is the host backend's memory per device; 0: the host
	// backend's default.
	HostCapacity uint64
	// Config is the allocator configuration; nil: ConfigFromEnv(os.Getenv).
	Config *Config
	// Logger receives the OOM policy's messages; nil: none.
	Logger *slog.Logger
}
