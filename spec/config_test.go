package spec

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xseg-dev/xseg/vmm"
)

func TestParseConfigIssueExample(t *testing.T) {
	c, err := ParseConfig(DefaultConfig(), "large_page_mb:20,release_threshold_mb:512,oom_max_retries:3,oom_delay_ms:200,oom_wait_ms:1000")
	require.NoError(t, err)
	require.Equal(t, uint64(20*MiB), c.LargePageSize)
	require.Equal(t, uint64(512*MiB), c.ReleaseThreshold)
	require.Equal(t, 3, c.OOMMaxRetries)
	require.Equal(t, 200*time.Millisecond, c.OOMDelay)
	require.Equal(t, time.Second, c.OOMWait)
	require.Equal(t, DefaultConfig().SmallPageSize, c.SmallPageSize)
}

// TestParseConfigPolicy: "policy" sets the page policy's fields, and keys
// after it change them further; other fields stay.
func TestParseConfigPolicy(t *testing.T) {
	c, err := ParseConfig(DefaultConfig(), "oom_max_retries:2,policy:classic")
	require.NoError(t, err)
	want := ClassicConfig()
	want.OOMMaxRetries = 2
	require.Equal(t, want, c)
	c, err = ParseConfig(ClassicConfig(), "policy:default,large_page_mb:4")
	require.NoError(t, err)
	want = DefaultConfig()
	want.LargePageSize = 4 * MiB
	require.Equal(t, want, c)
	// steady: the default's pages, nothing moved or cached; a policy
	// sets the page cache too, so each undoes the others whole.
	st := SteadyConfig()
	require.NoError(t, st.Validate())
	require.False(t, st.RecyclePages)
	require.Equal(t, uint64(64*MiB), st.ChunkBytes, "chunks, never split: nothing moves pages")
	require.Zero(t, st.PageCacheBytes)
	require.Equal(t, DefaultConfig().LargePageSize, st.LargePageSize)
	require.Equal(t, DefaultConfig().SmallLimit, st.SmallLimit)
	for conf, want := range map[string]Config{
		"page_cache_mb:64,policy:steady": st,
		"policy:steady,policy:default":   DefaultConfig(),
		"policy:steady,policy:classic":   ClassicConfig(),
		"policy:classic,policy:steady":   st,
	} {
		c, err := ParseConfig(DefaultConfig(), conf)
		require.NoError(t, err, conf)
		require.Equal(t, want, c, conf)
	}
	c, err = ParseConfig(DefaultConfig(), "policy:steady,page_cache_mb:32")
	require.NoError(t, err)
	require.Equal(t, uint64(32*MiB), c.PageCacheBytes)
	for _, bad := range []string{"policy:", "policy:tight", "policy:Classic", "policy:1", "policy:Steady"} {
		_, err := ParseConfig(DefaultConfig(), bad)
		require.ErrorContains(t, err, "not a policy", bad)
	}
}

func TestParseConfigKeysAndAliases(t *testing.T) {
	c, err := ParseConfig(DefaultConfig(), " small_page_mb:4 , small_limit_kb:512,page_cache_mb:0,OOM_SIZE_FACTOR:0.5,OOM_VERBOSE:true,shareable:1,OOM_MAX_RETRIES:2,OOM_DELAY_MS:7,recycle_pages:true,chunk_mb:64")
	require.NoError(t, err)
	require.True(t, c.RecyclePages)
	require.Equal(t, uint64(64*MiB), c.ChunkBytes)
	require.Zero(t, ClassicConfig().ChunkBytes, "chunks are off in the classic policy")
	require.False(t, ClassicConfig().RecyclePages)
	require.True(t, DefaultConfig().RecyclePages, "and on by default")
	require.Equal(t, uint64(1024*MiB), DefaultConfig().ChunkBytes)
	require.Equal(t, uint64(4*MiB), c.SmallPageSize)
	require.Equal(t, uint64(512*KiB), c.SmallLimit)
	require.Zero(t, c.PageCacheBytes)
	require.Equal(t, 0.5, c.OOMSizeFactor)
	require.True(t, c.OOMVerbose)
	require.True(t, c.Shareable)
	require.Equal(t, 2, c.OOMMaxRetries)
	require.Equal(t, 7*time.Millisecond, c.OOMDelay)
}

func TestParseConfigErrorsNameTheKey(t *testing.T) {
	for s, key := range map[string]string{
		"bogus:1":             "bogus",
		"large_page_mb:x":     "large_page_mb",
		"oom_size_factor:1.5": "oom_size_factor",
		"oom_verbose:maybe":   "oom_verbose",
		"oom_delay_ms:-1":     "oom_delay_ms",
		"OOM_MAX_RETRIES:z":   "OOM_MAX_RETRIES",
		"small_limit_kb:4096": "small_limit_kb",
		"large_page_mb":       "large_page_mb",
		"chunk_mb:-1":         "chunk_mb",
		"chunk_mb:1.5":        "chunk_mb",
	} {
		_, err := ParseConfig(DefaultConfig(), s)
		require.ErrorContains(t, err, key, "parsing %q", s)
	}
}

func TestConfigFromEnv(t *testing.T) {
	env := map[string]string{"OOM_MAX_RETRIES": "5", "OOM_DELAY_MS": "10", "XSEG_CONF": "oom_max_retries:1,page_cache_mb:8"}
	c, err := ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, 1, c.OOMMaxRetries, "XSEG_CONF wins over the seed variables")
	require.Equal(t, 10*time.Millisecond, c.OOMDelay)
	require.Equal(t, uint64(8*MiB), c.PageCacheBytes)

	env = map[string]string{"OOM_SIZE_FACTOR": "2"}
	_, err = ConfigFromEnv(func(k string) string { return env[k] })
	require.ErrorContains(t, err, "OOM_SIZE_FACTOR")
}

// Issue 15: large_page_mb:17592186044414 (2^64 - 2 MiB in bytes) passed
// validation and failed later as "reserving 0 bytes". Page sizes past
// 1 TiB, and sizes that overflow 64 bits, fail here, naming the key.
func TestParseConfigPageSizeBound(t *testing.T) {
	for s, key := range map[string]string{
		"large_page_mb:17592186044414": "large_page_mb",
		"large_page_mb:1048577":        "large_page_mb",
		"small_page_mb:17592186044416": "small_page_mb",
		"small_page_mb:1048577":        "small_page_mb",
		"page_cache_mb:17592186044416": "page_cache_mb",
		"chunk_mb:1048577":             "chunk_mb",
		"chunk_mb:17592186044416":      "chunk_mb",
	} {
		_, err := ParseConfig(DefaultConfig(), s)
		require.ErrorContains(t, err, key, s)
		require.NotContains(t, err.Error(), "reserving", s)
	}
	_, err := ParseConfig(DefaultConfig(), "large_page_mb:17592186044414")
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "larger than 1 TiB")
	c, err := ParseConfig(DefaultConfig(), "large_page_mb:1048576")
	require.NoError(t, err, "1 TiB is allowed")
	require.Equal(t, uint64(TiB), c.LargePageSize)
	require.ErrorContains(t, Config{SmallPageSize: 2 * MiB, LargePageSize: TiB + 2*MiB, SmallLimit: MiB, OOMSizeFactor: 0.5}.Validate(), "large_page_mb")
}

// Issue 15: a 10 MiB configuration value made a 20 MiB error. The string
// is bounded, and errors quote a short prefix of a bad key or value.
func TestParseConfigErrorsShort(t *testing.T) {
	_, err := ParseConfig(DefaultConfig(), "oom_max_retries:1,"+strings.Repeat("x", MaxConfigLen))
	require.ErrorIs(t, err, vmm.ErrInvalid)
	require.ErrorContains(t, err, "more than the 65536")
	require.Less(t, len(err.Error()), 200)

	long := strings.Repeat("7x", MaxConfigLen/8)
	for _, s := range []string{
		"large_page_mb:" + long, "oom_delay_ms:" + long, "oom_verbose:" + long, "oom_max_retries:" + long,
		"oom_size_factor:" + long, long + ":1", long, "OOM_DELAY_MS:" + long,
	} {
		_, err := ParseConfig(DefaultConfig(), s)
		require.Error(t, err)
		// 200 bytes and, for an unknown key, the list of the keys.
		require.Less(t, len(err.Error()), 200+len(keyList()), "%.100s...", err)
		require.Contains(t, err.Error(), `7x7x7x"...`, "a prefix of the bad text is quoted")
	}
	c, err := ParseConfig(DefaultConfig(), strings.Repeat(" ", MaxConfigLen-20)+"oom_max_retries:4")
	require.NoError(t, err, "a string at the bound parses")
	require.Equal(t, 4, c.OOMMaxRetries)
}

// FuzzParseConfig feeds ParseConfig arbitrary strings: it must not panic,
// its errors must stay short, and a configuration it accepts must
// validate, with page sizes a reservation can hold.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{"", "large_page_mb:20,release_threshold_mb:512,oom_max_retries:3,oom_delay_ms:200,oom_wait_ms:1000",
		" small_page_mb:4 , small_limit_kb:512,page_cache_mb:0,OOM_SIZE_FACTOR:0.5,OOM_VERBOSE:true,shareable:1",
		"large_page_mb:17592186044414", "small_limit_kb:4096", "oom_size_factor:1e-300", "large_page_mb", ",,,:,",
		"OOM_MAX_RETRIES:65535", "oom_delay_ms:4294967295", "shareable:T"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConfig(DefaultConfig(), s)
		if err != nil {
			// Quoting writes a byte as up to 4: two quoted pieces of
			// maxQuoted bytes, about 150 of message, and the list of
			// keys an unknown key's error gives (it grows with the keys).
			if n := len(err.Error()); n > 8*maxQuoted+150+len(keyList()) {
				t.Fatalf("an error of %d bytes: %.200s...", n, err)
			}
			return
		}
		if err := c.Validate(); err != nil {
			t.Fatalf("%q parsed to a configuration that does not validate: %v", s, err)
		}
		if c.SmallPageSize > TiB || c.LargePageSize > TiB {
			t.Fatalf("%q: pages of %d and %d bytes", s, c.SmallPageSize, c.LargePageSize)
		}
	})
}

// Issue 15 item 10: oom_max_retries is bounded.
func TestOOMMaxRetriesBounded(t *testing.T) {
	c, err := ParseConfig(DefaultConfig(), "oom_max_retries:1000")
	require.NoError(t, err)
	require.Equal(t, MaxOOMRetries, c.OOMMaxRetries)
	_, err = ParseConfig(DefaultConfig(), "oom_max_retries:1001")
	require.ErrorContains(t, err, "oom_max_retries")
	c = DefaultConfig()
	c.OOMMaxRetries = math.MaxInt
	require.Error(t, c.Validate())
}

// ApplyEnv keeps a caller's default unless the environment overrides it,
// and returns the base unchanged on an error.
func TestApplyEnv(t *testing.T) {
	base := DefaultConfig()
	base.Shareable = true
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	c, err := ApplyEnv(base, env(nil))
	require.NoError(t, err)
	require.Equal(t, base, c)

	c, err = ApplyEnv(base, env(map[string]string{"OOM_MAX_RETRIES": "4", "XSEG_CONF": "page_cache_mb:0"}))
	require.NoError(t, err)
	require.True(t, c.Shareable, "the base's default stays")
	require.Equal(t, 4, c.OOMMaxRetries)
	require.Zero(t, c.PageCacheBytes)

	c, err = ApplyEnv(base, env(map[string]string{"XSEG_CONF": "shareable:false"}))
	require.NoError(t, err)
	require.False(t, c.Shareable, "the environment has the last word")

	c, err = ApplyEnv(base, env(map[string]string{"XSEG_CONF": "oom_max_retries:2,bogus:1"}))
	require.ErrorContains(t, err, "environment XSEG_CONF: config: unknown key \"bogus\"")
	require.Equal(t, base, c, "an error returns the base")
	c, err = ApplyEnv(base, env(map[string]string{"OOM_DELAY_MS": "soon"}))
	require.ErrorContains(t, err, "environment OOM_DELAY_MS")
	require.Equal(t, base, c)

	d, err := ConfigFromEnv(env(map[string]string{"XSEG_CONF": "shareable:true"}))
	require.NoError(t, err)
	require.True(t, d.Shareable)
	require.Equal(t, DefaultConfig().LargePageSize, d.LargePageSize)
}

// Stat.Add keeps PyTorch's meanings for both signs.
func TestStatAdd(t *testing.T) {
	var s PoolStat
	s.Add(Small, 10)
	s.Add(Large, 5)
	s.Add(Small, -4)
	require.Equal(t, Stat{Current: 6, Peak: 10, Allocated: 10, Freed: 4}, s.Small)
	require.Equal(t, Stat{Current: 5, Peak: 5, Allocated: 5}, s.Large)
	require.Equal(t, Stat{Current: 11, Peak: 15, Allocated: 15, Freed: 4}, s.All)
	s.ResetPeak()
	require.Equal(t, int64(11), s.All.Peak)
	require.Equal(t, "small", Small.String())
	require.Equal(t, "large", Large.String())
}

// The errors say what a value should be: a unit where none is taken, a
// count past its bound, an unknown key with the keys there are.
func TestParseConfigErrorsSayWhatIsWanted(t *testing.T) {
	for s, want := range map[string]string{
		"large_page_mb:20MiB":                "want a whole number of MiB, without a unit",
		"small_limit_kb:1.5":                 "want a whole number of KiB",
		"release_threshold_mb:-1":            "want a whole number of MiB",
		"large_page_mb:99999999999999999999": "more bytes than 64 bits hold",
		"oom_max_retries:99999":              "more than the 1000 allowed",
		"oom_max_retries:5000":               "more than the 1000 allowed",
		"oom_max_retries:x":                  "want a whole number of retries",
		"oom_delay_ms:99999999999":           "more than the 3600000 (an hour) allowed",
		"oom_wait_ms:3600001":                "more than the 3600000 (an hour) allowed",
		"oom_delay_ms:1s":                    "want a whole number of milliseconds",
		"foo:1":                              "unknown key \"foo\" (the keys: chunk_mb, chunk_min_mb, large_page_mb,",
	} {
		_, err := ParseConfig(DefaultConfig(), s)
		require.ErrorIs(t, err, vmm.ErrInvalid, s)
		require.ErrorContains(t, err, want, s)
	}
	c, err := ParseConfig(DefaultConfig(), "oom_wait_ms:3600000,oom_delay_ms:3600000,oom_max_retries:1000")
	require.NoError(t, err, "the bounds themselves")
	require.Equal(t, time.Hour, c.OOMWait)
	c = DefaultConfig()
	c.OOMWait = time.Hour + 1
	require.ErrorIs(t, c.Validate(), vmm.ErrInvalid, "Validate holds the bound for Go callers")
}

// TestParseConfigSettleChains: settle_chains is a boolean, off by
// default, part of the page policy that a policy key sets whole.
func TestParseConfigSettleChains(t *testing.T) {
	require.False(t, DefaultConfig().SettleChains)
	for conf, want := range map[string]bool{
		"settle_chains:1":                   true,
		"settle_chains:true,policy:default": false,
		"policy:default,settle_chains:1":    true,
		"settle_chains:0":                   false,
	} {
		c, err := ParseConfig(DefaultConfig(), conf)
		require.NoError(t, err, conf)
		require.Equal(t, want, c.SettleChains, conf)
	}
	_, err := ParseConfig(DefaultConfig(), "settle_chains:yes")
	require.ErrorContains(t, err, `key "settle_chains": not a boolean`)
}
