package trace

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRecordedTrace parses what python/xseg/record.py writes for its test
// snapshot (python/tests/test_record.py checks that the file is exactly
// that conversion): the recorder and the parser agree on the format.
func TestRecordedTrace(t *testing.T) {
	tr, err := ReadFile(filepath.Join("testdata", "recorded.trace"))
	require.NoError(t, err)
	require.Len(t, tr.Events, 7)
	require.Equal(t, []uint32{0, 1}, tr.Streams, "the default stream and one side stream")
	require.Equal(t, uint64(6<<20+3<<20+512), tr.PeakLive)
	require.Equal(t, 1, tr.LiveAtEnd)
}
