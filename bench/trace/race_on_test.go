//go:build race

package trace_test

// raceBuild: built with -race, which makes a replay some ten times slower.
const raceBuild = true
