package spec

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xseg-dev/xseg/vmm"
)

const (
	// MiB and KiB are byte units for the configuration.
	KiB = 1 << 10
	MiB = 1 << 20
	// TiB is the largest page size: a page is reserved and mapped whole,
	// and a larger one (large_page_mb:17592186044414 is 2^64 - 2 MiB)
	// overflows the rounding of the reservation to 0 bytes.
	TiB = 1 << 40
)

// MaxOOMRetries bounds Config.OOMMaxRetries: with the capped backoff a
// thousand retries already sleep over an hour in one allocation.
const MaxOOMRetries = 1000

// MaxOOMWait bounds Config.OOMDelay and Config.OOMWait: an allocation that
// fails is not held up for days by a typo.
const MaxOOMWait = time.Hour

// MaxConfigLen bounds the length of a configuration string: the dozen
// keys fit in a few hundred bytes, and an error must not echo megabytes.
const MaxConfigLen = 64 << 10

// maxQuoted is the most bytes of a bad key or value an error quotes.
const maxQuoted = 32

// quote quotes s, cut to maxQuoted bytes (marked "...") if longer.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(s[:maxQuoted]) + "..."
	}
	return strconv.Quote(s)
}

// Config tunes an allocator. The zero value is not useful; start from
// DefaultConfig. A Config is a plain value, copied by the allocators.
type Config struct {
	// SmallPageSize and LargePageSize are the page sizes of the small and
	// large pools (for fallback: the size of their segments). Both must be
	// multiples of the device's granularity.
	SmallPageSize, LargePageSize uint64
	// SmallLimit: requests of at most this many bytes go to the small pool.
	// 0: no small pool; every request goes to the large pool, so that one
	// range per stream serves all sizes and its free pages serve any of
	// them.
	SmallLimit uint64
	// ReleaseThreshold: when the free bytes cached in mapped pages pass it,
	// whole free pages are unmapped until they no longer do. 0: off.
	ReleaseThreshold uint64
	// PageCacheBytes bounds the physical pages kept, unmapped, for reuse
	// before new ones are created. 0: no cache.
	PageCacheBytes uint64
	// RecyclePages: before a growth creates pages, it unmaps as many whole
	// free pages of its stream's ranges as it needs, however many the page
	// cache holds, and maps them where it grows; PageCacheBytes then
	// bounds only the pages kept between growths. Without it a growth
	// takes at most what the cache has room for. It costs an unmap and a
	// map a recycled page, and keeps reserved bytes near live bytes where
	// free memory is scattered across a range. The expandable allocator
	// only.
	RecyclePages bool
	// SizeClasses: each (stream, pool) of the shared pools is split into
	// ranges by size class, one range for requests under a page and one
	// for each power of two of whole pages ([1, 2) pages, [2, 4), ...):
	// blocks of very different sizes never share a page, so a long-lived
	// block is not left alone between the holes of freed temporaries of
	// another size. Whole free pages move between the classes' ranges
	// as they do between ranges under RecyclePages, which it needs. That
	// page traffic is its cost: on an H100, 1.7 to 12 times the default's
	// replay time per event, and GPT-2 small trained 26 % slower
	// (bench/RESULTS.md round 29). For memory-bound work whose host time
	// is not what limits it. The expandable allocator only.
	SizeClasses bool
	// PackLongLived: a request of a page or more, not a whole number of
	// pages, that is predicted to outlive the temporaries allocated
	// around it goes to the free block at the lowest address that fits it
	// among the pages already mapped, not one it would end inside a
	// chunk of (none: placed as any other request). Long-lived blocks
	// then lie side by side and share the pages they partly fill, where
	// best fit would put each at the start of a temporary's freed pages
	// and leave the rest of its last page stranded once the pages around
	// it are recycled. Where that place starts on a page boundary and
	// pages are recycled (RecyclePages), the request may instead continue
	// a live block's pages through a lower hole, mapping pages that the
	// growth recycles from the top of the range. The prediction stands in
	// for the call site an allocator cannot see: the request's size and
	// the sizes of its stream's last three requests of a page or more; a
	// block is predicted long-lived when the last block allocated at that
	// point of the sequence is still allocated (a model's KV cache,
	// weights and saved activations, not its temporaries). It makes no
	// range; a wrong prediction costs placement, never correctness.
	// bench/RESULTS.md rounds 41 and 43. The expandable allocator only.
	PackLongLived bool
	// SettleChains (off by default): with PackLongLived, a request stops
	// continuing a live block's pages through a hole whose pages went
	// round three times between such a continuation and recycling (a
	// growth elsewhere taking them as free pages): a loop that needs those
	// pages in both places at different times of its step moves them
	// there and back in every step, forever. GPT-2 small's training loop
	// does, 30 pages a step on the host replay; with SettleChains 13 to
	// 17, at the same peak, and on an H100 7 % fewer maps and 43 % fewer
	// waits over 50 steps, with tokens/s the same within the loan's noise.
	// It costs memory where the continuations it stops would have shared
	// pages: up to 0.0015 of peak live memory on perturbed GPT-2 loops,
	// held-out qwen_sampling's worst variant 1.0100 -> 1.0119
	// (bench/RESULTS.md round 46). The expandable allocator only.
	SettleChains bool
	// ChunkBytes: a growth of the expandable allocator at the end of its
	// range backs the pages that lie wholly inside the block it grows for
	// with physical allocations ("chunks") of up to this many bytes,
	// rounded down to whole pages of the pool (less than two pages: no
	// chunks for it), each mapped with one Map, instead
	// of one allocation a page (the page the block ends in, which a later
	// block may share, stays a page of its own; so do growths into holes
	// inside the range, and growths that stay within the most the
	// allocator has reserved since it was made or last emptied with
	// EmptyCache: memory held before was given back by a split or by
	// recycling, where sizes turn over, so a chunk there would be split
	// again; a loop settles on pages instead of splitting every step). A chunk is unmapped only whole (the core rounds
	// free ranges in to whole chunks) and released when unmapped, never
	// cached. A block carved from a free chunk that would end inside it
	// splits it first: the chunk is unmapped, after waiting for its
	// stream, and the block grows into the hole, so that no chunk holds a
	// live block and free memory at once. 0: off, one allocation a page.
	// Sharing a block on chunks exports each chunk whole (one fd, kept
	// for as long as the chunk lives).
	ChunkBytes uint64
	// ChunkMinBytes: a growth uses chunks only when the pages wholly
	// inside its block come to at least this many bytes; smaller growths
	// get one allocation a page. It keeps the splitting (a stream wait
	// and an unmap) to the rare large blocks, where a chunk saves the
	// most maps and an importer the most imports. 0: any growth.
	ChunkMinBytes uint64
	// OOMMaxRetries: after the cache has been emptied, retry this many
	// times with exponential backoff from OOMDelay, for memory that other
	// processes hold; at most MaxOOMRetries. Each delay is capped at the
	// smaller of 5 s and 50 times OOMDelay.
	OOMMaxRetries int
	OOMDelay      time.Duration // at most MaxOOMWait
	// OOMWait: wait up to this long for frees by other goroutines of this
	// process before failing, at most MaxOOMWait. 0: do not wait.
	OOMWait time.Duration
	// OOMSizeFactor: AllocAtMost shrinks its request by this factor at
	// each step, in (0, 1), and by at least 1/64 of its first request.
	OOMSizeFactor float64
	// OOMVerbose logs every step of the OOM policy at level Info.
	OOMVerbose bool
	// Shareable creates pages exportable as POSIX file descriptors (for
	// IPC). It costs one file descriptor per page on the host backend.
	Shareable bool
	// WholePages rounds every block up to whole pages of its pool, so
	// that sharing a block (which exports whole pages) exposes nothing
	// but the block, at the cost of the rounding. The expandable
	// allocator only: a fallback block shares its whole segment.
	WholePages bool
}

// DefaultConfig returns the defaults: one pool of 2 MiB pages a stream,
// free pages recycled where the heap grows (RecyclePages) and chunks of
// up to 1 GiB for large growths past the most the Heap has held
// (ChunkBytes); no release threshold, a 128 MiB page cache, no OOM waits
// or retries, size factor 0.8, not shareable. It keeps peak reserved
// memory at or below PyTorch's expandable segments on every trace of
// bench/traces (bench/RESULTS.md round 18). ClassicConfig is the policy
// before it.
func DefaultConfig() Config {
	return Config{
		SmallPageSize:  2 * MiB,
		LargePageSize:  2 * MiB,
		SmallLimit:     0,
		RecyclePages:   true,
		PackLongLived:  true,
		ChunkBytes:     1024 * MiB,
		PageCacheBytes: 128 * MiB,
		OOMDelay:       100 * time.Millisecond,
		OOMSizeFactor:  0.8,
	}
}

// ClassicConfig returns the page policy of xseg before 2026-11 (PyTorch's
// expandable segments' layout): 2 MiB small pages for requests up to
// 1 MiB, 20 MiB large pages, no recycling, no chunks; the rest as
// DefaultConfig. The fallback allocator's default; XSEG_CONF's
// "policy:classic" selects it.
func ClassicConfig() Config {
	c := DefaultConfig()
	c.SmallPageSize, c.LargePageSize, c.SmallLimit = 2*MiB, 20*MiB, 1*MiB
	c.RecyclePages, c.ChunkBytes, c.PackLongLived = false, 0, false
	return c
}

// SteadyConfig returns the page policy for a loop that makes the same
// allocations every step (a training loop at a fixed shape, above all a
// convolutional one) and whose steps are short beside a page's move: one
// pool of 2 MiB pages a stream, as DefaultConfig, but pages are mapped
// where the heap first needs them and stay there: no recycling and no
// page cache, so a growth never unmaps a free page elsewhere. The inside
// of each growth is mapped as chunks of up to 64 MiB, one physical
// allocation each, never split (nothing would move their free pages), so
// a first step that maps gigabytes makes tens of allocations, not
// thousands; a chunk partly used by a live block keeps its free part
// mapped until the block is freed, also when an allocation runs out of
// memory. Whole free pages and chunks go back to the driver on
// EmptyCache, above a release threshold and when an allocation runs out
// of memory. The default's tight layout can need page moves in every
// step of such a loop, forever (ResNet-50 43 to 50 % and a GAN 23 to 67 %
// slower than under PyTorch's allocator on an H100, bench/RESULTS.md
// round 38); this one maps in the first steps only and holds what the
// loop's layout needs, more than the default's (1.01 to 1.35 times peak
// live bytes on made-up loops, TestSteadyPolicy; about what PyTorch's
// expandable segments hold on the recorded traces). The rest as
// DefaultConfig; XSEG_CONF's "policy:steady" selects it.
func SteadyConfig() Config {
	c := DefaultConfig()
	c.RecyclePages, c.ChunkBytes, c.PageCacheBytes, c.PackLongLived = false, 64*MiB, 0, false
	return c
}

// setPagePolicy sets c's page policy's fields (page sizes, small limit,
// recycling, chunks, size classes, packing, page cache) to p's.
func (c *Config) setPagePolicy(p Config) {
	c.SmallPageSize, c.LargePageSize, c.SmallLimit = p.SmallPageSize, p.LargePageSize, p.SmallLimit
	c.RecyclePages, c.ChunkBytes, c.ChunkMinBytes, c.SizeClasses = p.RecyclePages, p.ChunkBytes, p.ChunkMinBytes, p.SizeClasses
	c.PackLongLived, c.SettleChains = p.PackLongLived, p.SettleChains
	c.PageCacheBytes = p.PageCacheBytes
}

// Validate checks the values that do not depend on the device.
func (c Config) Validate() error {
	switch {
	case c.SmallPageSize == 0 || c.LargePageSize == 0:
		return fmt.Errorf("config: page sizes (small_page_mb, large_page_mb) must be positive: %w", vmm.ErrInvalid)
	case c.SmallPageSize > TiB:
		return fmt.Errorf("config: small_page_mb: a page of %d bytes is larger than 1 TiB (1048576 MiB): %w", c.SmallPageSize, vmm.ErrInvalid)
	case c.LargePageSize > TiB:
		return fmt.Errorf("config: large_page_mb: a page of %d bytes is larger than 1 TiB (1048576 MiB): %w", c.LargePageSize, vmm.ErrInvalid)
	case c.SmallLimit > c.SmallPageSize:
		return fmt.Errorf("config: small_limit_kb (%d bytes) must be at most the small page size %d: %w", c.SmallLimit, c.SmallPageSize, vmm.ErrInvalid)
	case c.ChunkBytes > TiB:
		return fmt.Errorf("config: chunk_mb: a chunk of %d bytes is larger than 1 TiB (1048576 MiB): %w", c.ChunkBytes, vmm.ErrInvalid)
	case c.SizeClasses && !c.RecyclePages:
		return fmt.Errorf("config: size_classes needs recycle_pages (free pages must move between the classes' ranges): %w", vmm.ErrInvalid)
	case c.ChunkMinBytes > TiB:
		return fmt.Errorf("config: chunk_min_mb: %d bytes is more than 1 TiB (1048576 MiB): %w", c.ChunkMinBytes, vmm.ErrInvalid)
	case c.OOMMaxRetries < 0 || c.OOMMaxRetries > MaxOOMRetries:
		return fmt.Errorf("config: oom_max_retries %d is not in [0, %d]: %w", c.OOMMaxRetries, MaxOOMRetries, vmm.ErrInvalid)
	case c.OOMDelay < 0 || c.OOMWait < 0:
		return fmt.Errorf("config: oom_delay_ms and oom_wait_ms must not be negative: %w", vmm.ErrInvalid)
	case c.OOMDelay > MaxOOMWait || c.OOMWait > MaxOOMWait:
		return fmt.Errorf("config: oom_delay_ms and oom_wait_ms are at most %d (an hour): %v and %v: %w", MaxOOMWait.Milliseconds(), c.OOMDelay, c.OOMWait, vmm.ErrInvalid)
	case !(c.OOMSizeFactor > 0 && c.OOMSizeFactor < 1):
		return fmt.Errorf("config: oom_size_factor %v is not in (0, 1): %w", c.OOMSizeFactor, vmm.ErrInvalid)
	}
	return nil
}

// configKeys are the keys of the XSEG_CONF syntax (ParseConfig lists them).
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
	"whole_pages":          boolean(func(c *Config) *bool { return &c.WholePages }),
	"recycle_pages":        boolean(func(c *Config) *bool { return &c.RecyclePages }),
	"size_classes":         boolean(func(c *Config) *bool { return &c.SizeClasses }),
	"pack_long_lived":      boolean(func(c *Config) *bool { return &c.PackLongLived }),
	"settle_chains":        boolean(func(c *Config) *bool { return &c.SettleChains }),
	"chunk_mb":             mib(func(c *Config) *uint64 { return &c.ChunkBytes }, MiB),
	"chunk_min_mb":         mib(func(c *Config) *uint64 { return &c.ChunkMinBytes }, MiB),
	"policy":               setPolicy,
}

// setPolicy sets the page policy's fields (page sizes, small limit,
// recycling, chunks, packing, page cache) to ClassicConfig's, SteadyConfig's or
// DefaultConfig's; keys after it change them further.
func setPolicy(c *Config, v string) error {
	switch v {
	case "classic":
		c.setPagePolicy(ClassicConfig())
	case "steady":
		c.setPagePolicy(SteadyConfig())
	case "default":
		c.setPagePolicy(DefaultConfig())
	default:
		return fmt.Errorf("not a policy (classic, steady or default): %s", quote(v))
	}
	return nil
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
	name := "MiB"
	if unit == KiB {
		name = "KiB"
	}
	return func(c *Config, v string) error {
		n, err := whole(v, name, math.MaxUint64/unit, "more bytes than 64 bits hold")
		if err != nil {
			return err
		}
		*field(c) = n * unit
		return nil
	}
}

func millis(field func(*Config) *time.Duration) func(*Config, string) error {
	return func(c *Config, v string) error {
		n, err := whole(v, "milliseconds", uint64(MaxOOMWait.Milliseconds()), fmt.Sprintf("more than the %d (an hour) allowed", MaxOOMWait.Milliseconds()))
		if err != nil {
			return err
		}
		*field(c) = time.Duration(n) * time.Millisecond
		return nil
	}
}

// whole parses v as a whole number of unit, written without a unit of its
// own, of at most most; over says what a larger number is.
func whole(v, unit string, most uint64, over string) (uint64, error) {
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, fmt.Errorf("want a whole number of %s, without a unit: %s", unit, quote(v))
	}
	if err != nil || n > most {
		return 0, fmt.Errorf("%s %s is %s", quote(v), unit, over)
	}
	return n, nil
}

func boolean(field func(*Config) *bool) func(*Config, string) error {
	return func(c *Config, v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %s", quote(v))
		}
		*field(c) = b
		return nil
	}
}

func setRetries(c *Config, v string) error {
	n, err := whole(v, "retries", MaxOOMRetries, fmt.Sprintf("more than the %d allowed", MaxOOMRetries))
	if err != nil {
		return err
	}
	c.OOMMaxRetries = int(n)
	return nil
}

func setFactor(c *Config, v string) error {
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0 && f < 1) {
		return fmt.Errorf("not a factor in (0, 1): %s", quote(v))
	}
	c.OOMSizeFactor = f
	return nil
}

// ParseConfig applies s, in the XSEG_CONF syntax "key:value,key:value", to
// base and returns the result. Spaces around keys and values are ignored;
// an empty s returns base. Unknown keys and bad values are errors that name
// the key and quote at most the first 32 bytes of what is wrong; s may be
// at most MaxConfigLen bytes long, and page sizes at most 1 TiB. Sizes and
// durations are whole numbers in the key's unit, without a unit of their
// own ("large_page_mb:20", not "20MiB").
//
// The keys, with the fields of Config they set:
//
//	small_page_mb, large_page_mb   SmallPageSize, LargePageSize (MiB)
//	small_limit_kb                 SmallLimit (KiB; 0: no small pool)
//	release_threshold_mb           ReleaseThreshold (MiB, 0 = off)
//	page_cache_mb                  PageCacheBytes (MiB)
//	oom_max_retries                OOMMaxRetries (at most MaxOOMRetries)
//	oom_delay_ms, oom_wait_ms      OOMDelay, OOMWait (milliseconds, at most an hour)
//	oom_size_factor                OOMSizeFactor (in (0, 1))
//	oom_verbose, shareable         OOMVerbose, Shareable (true/false/1/0)
//	whole_pages                    WholePages (true/false/1/0)
//	recycle_pages                  RecyclePages (true/false/1/0)
//	size_classes                   SizeClasses (true/false/1/0)
//	pack_long_lived                PackLongLived (true/false/1/0)
//	settle_chains                  SettleChains (true/false/1/0)
//	chunk_mb                       ChunkBytes (MiB, 0 = off; whole pages)
//	chunk_min_mb                   ChunkMinBytes (MiB)
//	policy                         "classic": the page policy of
//	                               ClassicConfig (before the keys after it);
//	                               "steady": SteadyConfig's;
//	                               "default": DefaultConfig's
//
// and the seed allocator's names OOM_MAX_RETRIES, OOM_DELAY_MS,
// OOM_SIZE_FACTOR and OOM_VERBOSE as aliases.
func ParseConfig(base Config, s string) (Config, error) {
	if len(s) > MaxConfigLen {
		return base, fmt.Errorf("config: %d bytes, more than the %d a configuration may have: %w", len(s), MaxConfigLen, vmm.ErrInvalid)
	}
	c := base
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, val, ok := strings.Cut(item, ":")
		key, val = strings.TrimSpace(key), strings.TrimSpace(val)
		if !ok {
			return base, fmt.Errorf("config: %s: want key:value", quote(item))
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
		return fmt.Errorf("config: unknown key %s (the keys: %s): %w", quote(key), keyList(), vmm.ErrInvalid)
	}
	if err := set(c, val); err != nil {
		return fmt.Errorf("config: key %s: %w: %w", quote(key), err, vmm.ErrInvalid)
	}
	return nil
}

// keyList is the keys of the XSEG_CONF syntax, sorted, for an error.
func keyList() string {
	return strings.Join(slices.Sorted(maps.Keys(configKeys)), ", ")
}

// ConfigFromEnv returns DefaultConfig changed first by the seed variables
// OOM_MAX_RETRIES, OOM_DELAY_MS, OOM_SIZE_FACTOR and OOM_VERBOSE, then by
// XSEG_CONF. getenv is os.Getenv or a stand-in for tests. On an error it
// returns DefaultConfig.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	return ApplyEnv(DefaultConfig(), getenv)
}

// ApplyEnv is ConfigFromEnv over base instead of the defaults: base
// changed by the seed variables, then by XSEG_CONF. A program that wants a
// default of its own (say, Shareable) sets it in base, and the
// environment still has the last word. On an error it returns base.
func ApplyEnv(base Config, getenv func(string) string) (Config, error) {
	c := base
	for _, env := range []string{"OOM_MAX_RETRIES", "OOM_DELAY_MS", "OOM_SIZE_FACTOR", "OOM_VERBOSE"} {
		if v := strings.TrimSpace(getenv(env)); v != "" {
			if err := setKey(&c, env, v); err != nil {
				return base, fmt.Errorf("environment %s: %w", env, err)
			}
		}
	}
	c, err := ParseConfig(c, getenv("XSEG_CONF"))
	if err != nil {
		return base, fmt.Errorf("environment XSEG_CONF: %w", err)
	}
	return c, nil
}
