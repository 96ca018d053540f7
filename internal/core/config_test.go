package core

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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

func TestParseConfigKeysAndAliases(t *testing.T) {
	c, err := ParseConfig(DefaultConfig(), " small_page_mb:4 , small_limit_kb:512,page_cache_mb:0,OOM_SIZE_FACTOR:0.5,OOM_VERBOSE:true,shareable:1,OOM_MAX_RETRIES:2,OOM_DELAY_MS:7")
	require.NoError(t, err)
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
