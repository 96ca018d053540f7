package main

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/vmm"
	"github.com/xseg-dev/xseg/vmm/host"
)

// Environment variables the library reads at first use (XSEG_LOG at load).
// XSEG_CONF and its aliases are read by spec.ApplyEnv.
const (
	// envBackend selects the backend: "cuda" (the default) or "host".
	envBackend = "XSEG_BACKEND"
	// envHostCapacity is the host backend's capacity, a multiple of its
	// 2 MiB page, in package bytesize's syntax: 24GiB, 512MiB or plain
	// bytes (default: the host backend's own, host.DefaultCapacity).
	envHostCapacity = "XSEG_HOST_CAPACITY"
	// envLog is the log level: off (the default), error, warn, info, debug.
	envLog = "XSEG_LOG"
	// envImportKeep is how long, in milliseconds, a block opened from
	// another process stays mapped after its last close, for a later
	// share of the same allocations (ipc.ImporterOptions.KeepFor):
	// defaultImportKeep when unset, 0 to keep none.
	envImportKeep = "XSEG_IMPORT_KEEP_MS"
	// envLeaseAck is how long, in milliseconds, closing an opened block
	// waits for its exporter to end the lease (ipc.FetchOptions.LeaseAckWait):
	// ipc.LeaseAckWait when unset, 0 not to wait.
	envLeaseAck = "XSEG_LEASE_ACK_MS"
)

// maxLeaseAck bounds XSEG_LEASE_ACK_MS: a minute.
const maxLeaseAck = time.Minute

// leaseAckFromEnv reads XSEG_LEASE_ACK_MS as an ipc.FetchOptions.LeaseAckWait:
// 0 (the default wait) when unset, negative (no wait) for "0".
func leaseAckFromEnv(getenv func(string) string) (time.Duration, error) {
	d, set, err := millisFromEnv(getenv, envLeaseAck, maxLeaseAck)
	if set && err == nil && d == 0 {
		return -1, nil
	}
	return d, err
}

// defaultImportKeep is the KeepFor of the library's importer when
// XSEG_IMPORT_KEEP_MS is unset.
const defaultImportKeep = time.Second

// maxImportKeep bounds XSEG_IMPORT_KEEP_MS: an hour.
const maxImportKeep = time.Hour

// importKeepFromEnv reads XSEG_IMPORT_KEEP_MS.
func importKeepFromEnv(getenv func(string) string) (time.Duration, error) {
	d, set, err := millisFromEnv(getenv, envImportKeep, maxImportKeep)
	if !set {
		return defaultImportKeep, err
	}
	return d, err
}

// millisFromEnv reads variable name as whole milliseconds from 0 to limit;
// set reports whether it was set. A value it cannot read is an error that
// names the variable.
func millisFromEnv(getenv func(string) string, name string, limit time.Duration) (d time.Duration, set bool, err error) {
	s := strings.TrimSpace(getenv(name))
	if s == "" {
		return 0, false, nil
	}
	ms, err := strconv.ParseUint(s, 10, 32)
	if err != nil || time.Duration(ms)*time.Millisecond > limit {
		return 0, true, fmt.Errorf("%s=%q: want whole milliseconds from 0 to %d: %w", name, bounded(s), limit.Milliseconds(), vmm.ErrInvalid)
	}
	return time.Duration(ms) * time.Millisecond, true, nil
}

// levelOff is a level above every record's: nothing is logged.
const levelOff = slog.Level(math.MaxInt32)

// backendFromEnv reads the backend and the host capacity (0: the backend's
// default).
func backendFromEnv(getenv func(string) string) (backend xseg.Backend, capacity uint64, err error) {
	backend = xseg.Backend(strings.ToLower(strings.TrimSpace(getenv(envBackend))))
	switch backend {
	case "":
		backend = xseg.BackendCUDA
	case xseg.BackendCUDA, xseg.BackendHost:
	default:
		return "", 0, fmt.Errorf("%s=%q: want cuda or host: %w", envBackend, string(backend), vmm.ErrInvalid)
	}
	if s := strings.TrimSpace(getenv(envHostCapacity)); s != "" {
		// Checked here, with the unit, rather than failing later as a
		// backend that does not open.
		capacity, err = bytesize.ParseMultiple(s, host.DefaultGranularity, "the granularity")
		if err != nil {
			return "", 0, fmt.Errorf("%s=%q: %w: %w", envHostCapacity, bounded(s), err, vmm.ErrInvalid)
		}
	}
	return backend, capacity, nil
}

// parseLevel reads a log level: "" and "off" (or "0", "false") turn logging
// off, "1" or "true" mean info.
func parseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "off", "0", "false", "none":
		return levelOff, nil
	case "1", "true", "on", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return levelOff, fmt.Errorf("log level %q: want off, error, warn, info or debug: %w", bounded(s), vmm.ErrInvalid)
}

// newLogger writes text records at or above level to standard error.
func newLogger(level *slog.LevelVar) *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// bounded is s cut to 64 bytes, for an error text that quotes a value read
// from the environment or a caller.
func bounded(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "..."
}
