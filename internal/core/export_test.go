package core

// MaxExact is maxExact, for the tests of package core_test.
const MaxExact = maxExact
