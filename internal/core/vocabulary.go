package core

import "github.com/xseg-dev/xseg/spec"

// The types and functions the allocators share with their users live in
// package spec; the core uses them under their old names.

type (
	Config          = spec.Config
	Stat            = spec.Stat
	PoolStat        = spec.PoolStat
	Pool            = spec.Pool
	Stats           = spec.Stats
	PoolID          = spec.PoolID
	PoolCheckpoint  = spec.PoolCheckpoint
	CheckpointBlock = spec.CheckpointBlock
	HistoryEvent    = spec.HistoryEvent
	BlockState      = spec.BlockState
	Block           = spec.Block
	Range           = spec.Range
	Segment         = spec.Segment
	Snapshot        = spec.Snapshot
)

const (
	KiB               = spec.KiB
	MiB               = spec.MiB
	TiB               = spec.TiB
	Small             = spec.Small
	Large             = spec.Large
	NumPools          = spec.NumPools
	MaxOOMRetries     = spec.MaxOOMRetries
	MaxHistoryEntries = spec.MaxHistoryEntries

	BlockAllocated = spec.BlockAllocated
	BlockPending   = spec.BlockPending
	BlockFree      = spec.BlockFree

	ActionAlloc         = spec.ActionAlloc
	ActionFreeRequested = spec.ActionFreeRequested
	ActionFreeCompleted = spec.ActionFreeCompleted
	ActionSegmentMap    = spec.ActionSegmentMap
	ActionSegmentUnmap  = spec.ActionSegmentUnmap
	ActionSegmentAlloc  = spec.ActionSegmentAlloc
	ActionSegmentFree   = spec.ActionSegmentFree
	ActionOOM           = spec.ActionOOM
)

// DefaultConfig is spec.DefaultConfig.
func DefaultConfig() Config { return spec.DefaultConfig() }

// ClassicConfig is spec.ClassicConfig.
func ClassicConfig() Config { return spec.ClassicConfig() }

// SteadyConfig is spec.SteadyConfig.
func SteadyConfig() Config { return spec.SteadyConfig() }
