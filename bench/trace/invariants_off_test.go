//go:build !invariants

package trace_test

// invariantsBuild: built with -tags invariants, whose checks make a replay
// 4 to 20 times slower (the latter with -race).
const invariantsBuild = false
