package core

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

const (
	// MiB and KiB are byte units for the configuration.
	KiB = 1 << 10
	MiB = 1 << 20
)

// Config tunes an allocator. The zero value is not useful; start from
// DefaultConfig. A Config is a plain value, copied by the allocators.
type Config struct {
	// SmallPageSize and LargePageSize are the page sizes of the small and
	// large pools (for fallback: the size of their segments). Both must be
	// multiples of the device's granularity.
	SmallPageSize, LargePageSize uint64
	// SmallLimit: requests of at most this many bytes go to the small pool.
	SmallLimit uint64
	// ReleaseThreshold: when the free bytes cached in mapped pages pass it,
	// whole free pages are unmapped until they no longer do. 0: off.
	ReleaseThreshold uint64
	// PageCacheBytes bounds the physical pages kept, unmapped, for reuse
	// before new ones are created. 0: no cache.
	PageCacheBytes uint64
	// OOMMaxRetries: after the cache has been emptied, retry this many
	// times with exponential backoff from OOMDelay, for memory that other
	// processes hold.
	OOMMaxRetries int
	OOMDelay      time.Duration
	// OOMWait: wait up to this long for frees by other goroutines of this
	// process before failing. 0: do not wait.
	OOMWait time.Duration
	// OOMSizeFactor: AllocAtMost shrinks its request by this factor at
	// each step, in (0, 1).
	OOMSizeFactor float64
	// OOMVerbose logs every step of the OOM policy at level Info.
	OOMVerbose bool
	// Shareable creates pages exportable as POSIX file descriptors (for
	// IPC). It costs one file descriptor per page on the host backend.
	Shareable bool
}

// DefaultConfig returns the defaults: 2 MiB small pages for requests up to
// 1 MiB, 20 MiB large pages, no release threshold, a 128 MiB page cache, no
// OOM waits or retries, size factor 0.8, not shareable.
func DefaultConfig() Config {
	return Config{
		SmallPageSize:  2 * MiB,
		LargePageSize:  20 * MiB,
		SmallLimit:     1 * MiB,
		PageCacheBytes: 128 * MiB,
		OOMDelay:       100 * time.Millisecond,
		OOMSizeFactor:  0.8,
	}
}

// Validate checks the values that do not depend on the device.
func (c Config) Validate() error {
	switch {
	case c.SmallPageSize == 0 || c.LargePageSize == 0:
		return fmt.Errorf("config: page sizes must be positive")
	case c.SmallLimit == 0 || c.SmallLimit > c.SmallPageSize:
		return fmt.Errorf("config: small_limit_kb (%d bytes) must be positive and at most the small page size %d", c.SmallLimit, c.SmallPageSize)
	case c.OOMMaxRetries < 0:
		return fmt.Errorf("config: oom_max_retries %d is negative", c.OOMMaxRetries)
	case c.OOMDelay < 0 || c.OOMWait < 0:
		return fmt.Errorf("config: oom_delay_ms and oom_wait_ms must not be negative")
	case !(c.OOMSizeFactor > 0 && c.OOMSizeFactor < 1):
		return fmt.Errorf("config: oom_size_factor %v is not in (0, 1)", c.OOMSizeFactor)
	}
	return nil
}

// Keys of the XSEG_CONF syntax, with what they set:
//
//	small_page_mb, large_page_mb   SmallPageSize, LargePageSize (MiB)
//	small_limit_kb                 SmallLimit (KiB)
//	release_threshold_mb           ReleaseThreshold (MiB, 0 = off)
//	page_cache_mb                  PageCacheBytes (MiB)
//	oom_max_retries                OOMMaxRetries
//	oom_delay_ms, oom_wait_ms      OOMDelay, OOMWait (milliseconds)
//	oom_size_factor                OOMSizeFactor
//	oom_verbose, shareable         OOMVerbose, Shareable (true/false/1/0)
//
// and the seed allocator's names OOM_MAX_RETRIES, OOM_DELAY_MS,
// OOM_SIZE_FACTOR and OOM_VERBOSE as aliases.
var configKeys = map[string]func(c *Config, v string) error{
	"small_page_mb":        mib(func(c *Config) *uint64 { return &c.SmallPageSize }, MiB),
	"large_page_mb":        mib(func(c *Config) *uint64 { return &c.LargePageSize }, MiB),
	"small_limit_kb":       mib(func(c *Config) *uint64 { return &c.SmallLimit }, KiB),
	"release_threshold_mb": mib(func(c *Config) *uint64 { return &c.ReleaseThreshold }, MiB),
	"page_cache_mb":        mib(func(c *Config) *uint64 { return &c.PageCacheBytes }, MiB),
	"oom_max_retries":      setRetries,
	"oom_delay_ms":         millis(func(c *Config) *time.Duration { return &c.OOMDelay }),
	"oom_wait_ms":          millis(func(c *Config) *time.Duration { return &c.OOMWait }),
	"oom_size_factor":      setFactor,
	"oom_verbose":          boolean(func(c *Config) *bool { return &c.OOMVerbose }),
	"shareable":            boolean(func(c *Config) *bool { return &c.Shareable }),
}

// envAliases are the seed allocator's names, accepted as keys of XSEG_CONF
// and read from the environment by ConfigFromEnv.
var envAliases = map[string]string{
	"OOM_MAX_RETRIES": "oom_max_retries",
	"OOM_DELAY_MS":    "oom_delay_ms",
	"OOM_SIZE_FACTOR": "oom_size_factor",
	"OOM_VERBOSE":     "oom_verbose",
}

func mib(field func(*Config) *uint64, unit uint64) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n > math.MaxUint64/unit {
			return fmt.Errorf("not a size: %q", v)
		}
		*field(c) = n * unit
		return nil
	}
}

func millis(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return fmt.Errorf("not a number of milliseconds: %q", v)
		}
		*field(c) = time.Duration(n) * time.Millisecond
		return nil
	}
}

func boolean(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %q", v)
		}
		*field(c) = b
		return nil
	}
}

func setRetries(c *Config, v string) error {
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil {
		return fmt.Errorf("not a count: %q", v)
	}
	c.OOMMaxRetries = int(n)
	return nil
}

func setFactor(c *Config, v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f < 1) {
		return fmt.Errorf("not a factor in (0, 1): %q", v)
	}
	c.OOMSizeFactor = f
	return nil
}

// ParseConfig applies s, in the XSEG_CONF syntax "key:value,key:value", to
// base and returns the result. Spaces around keys and values are ignored;
// an empty s returns base. Unknown keys and bad values are errors that name
// the key.
func ParseConfig(base Config, s string) (Config, error) {
	c := base
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, val, ok := strings.Cut(item, ":")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if !ok {
			return base, fmt.Errorf("config: %q: want key:value", item)
		}
		if err := setKey(&c, key, val); err != nil {
			return base, err
		}
	}
	if err := c.Validate(); err != nil {
		return base, err
	}
	return c, nil
}

func setKey(c *Config, key, val string) error {
	name := key
	if alias, ok := envAliases[key]; ok {
		name = alias
	}
	set, ok := configKeys[name]
	if !ok {
		return fmt.Errorf("config: unknown key %q", key)
	}
	if err := set(c, val); err != nil {
		return fmt.Errorf("config: key %q: %w", key, err)
	}
	return nil
}

// ConfigFromEnv returns DefaultConfig changed first by the seed variables
// OOM_MAX_RETRIES, OOM_DELAY_MS, OOM_SIZE_FACTOR and OOM_VERBOSE, then by
// XSEG_CONF. getenv is os.Getenv or a stand-in for tests.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	for _, env := range []string{"OOM_MAX_RETRIES", "OOM_DELAY_MS", "OOM_SIZE_FACTOR", "OOM_VERBOSE"} {
		if v := strings.TrimSpace(getenv(env)); v != "" {
			if err := setKey(&c, env, v); err != nil {
				return DefaultConfig(), fmt.Errorf("environment %s: %w", env, err)
			}
		}
	}
	c, err := ParseConfig(c, getenv("XSEG_CONF"))
	if err != nil {
		return DefaultConfig(), fmt.Errorf("environment XSEG_CONF: %w", err)
	}
	return c, nil
}
