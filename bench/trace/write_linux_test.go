package trace

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteFileSaysTheCauseOnce: on a full disk WriteFile said the cause
// twice, "writing x: write f: no space left on device" and again "write
// f: no space left on device": the gzip writer's Close repeats the error
// its Write returned. RLIMIT_FSIZE fails the writes here as a full disk
// would (Go ignores SIGXFSZ).
func TestWriteFileSaysTheCauseOnce(t *testing.T) {
	tr := shipped(t, "gpt2_train")
	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old))
	defer func() { require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old)) }()
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_FSIZE, &syscall.Rlimit{Cur: 1024, Max: old.Max}))
	for _, name := range []string{"x.trace.gz", "x.trace"} {
		p := filepath.Join(t.TempDir(), name)
		err := WriteFile(p, tr)
		require.ErrorIs(t, err, syscall.EFBIG, name)
		require.Equal(t, 1, strings.Count(err.Error(), "file too large"), "%s: %v", name, err)
		_, err = os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist, "%s: the partial file is removed", name)
	}
}
