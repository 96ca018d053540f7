//go:build !invariants

package core

// invariantsOn is false in release builds: checkLocked is never called.
const invariantsOn = false
