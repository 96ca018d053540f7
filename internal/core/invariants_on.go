//go:build invariants

package core

// invariantsOn turns on checkLocked after every operation (build tag
// invariants).
const invariantsOn = true
