package main

/*
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	xseg "github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// Tags: pause and resume at stable addresses (xseg.Tagger) from C. A tag
// is a named private pool of one device's allocator; allocations reach it
// through xseg_malloc_in_pool with the id xseg_tag returns, or through a
// region (xseg_begin_region, in pools.cc: the calling thread's allocations
// on the device go to the tag until xseg_end_region), which routes in C++
// as PyTorch's pool filters do but marks no pool active in Go: an open
// region is no stream capture, so it neither defers frees nor forbids a
// pause (an allocation in a region of a paused tag fails with
// xseg.ErrPaused).

// maxTagName bounds a tag name read from C, as the allocator bounds it.
const maxTagName = 256

// tagName reads a tag name from C: NULL, more than maxTagName bytes (read
// no further than one byte past that: the string may not end) and what
// the allocator refuses (empty, not UTF-8) are errors.
func tagName(p *C.char) (string, error) {
	if p == nil {
		return "", fmt.Errorf("tag name is NULL: %w", vmm.ErrInvalid)
	}
	n := C.strnlen(p, maxTagName+1)
	if n > maxTagName {
		return "", fmt.Errorf("tag name longer than %d bytes: %w", maxTagName, vmm.ErrInvalid)
	}
	return C.GoStringN(p, C.int(n)), nil
}

// tagNames reads the tag argument of xseg_pause and xseg_resume: NULL is
// every tag (nil), anything else one name.
func tagNames(p *C.char) ([]string, error) {
	if p == nil {
		return nil, nil
	}
	name, err := tagName(p)
	if err != nil {
		return nil, err
	}
	return []string{name}, nil
}

// tag returns the pool of tag name on dev, making the allocator and the
// tag if need be.
func (l *library) tag(dev int, name string) (xseg.PoolID, error) {
	a, err := l.allocator(dev)
	if err != nil {
		return xseg.PoolID{}, err
	}
	return a.Tag(name)
}

// forTags calls fn with tags for dev's allocator, or for every allocator
// made so far when dev is -1. tags nil is every tag: a device without an
// allocator has none, and nothing to do. A named tag must exist: on dev,
// or (dev -1) on at least one device, and only the devices that have it
// are called.
func (l *library) forTags(dev int, tags []string, fn func(a *xseg.DeviceAllocator, tags []string) error) error {
	found := tags == nil
	err := l.each(dev, func(a *xseg.DeviceAllocator) error {
		if tags != nil && dev == -1 && !slices.Contains(a.Tags(), tags[0]) {
			return nil
		}
		found = true
		return fn(a, tags)
	})
	if err == nil && !found {
		where := fmt.Sprintf("device %d", dev)
		if dev == -1 {
			where = "any device"
		}
		return fmt.Errorf("tag %q: no such tag on %s: %w", tags[0], where, vmm.ErrInvalid)
	}
	return err
}

// pause pauses tags (nil: every tag) of dev (-1: every device).
func (l *library) pause(dev int, tags []string, backup bool) error {
	return l.forTags(dev, tags, func(a *xseg.DeviceAllocator, tags []string) error { return a.Pause(backup, tags...) })
}

// resume resumes tags (nil: every paused tag) of dev (-1: every device).
func (l *library) resume(dev int, tags []string) error {
	return l.forTags(dev, tags, func(a *xseg.DeviceAllocator, tags []string) error { return a.Resume(tags...) })
}

// tagStatsJSON is the statistics of tag name on dev as JSON
// (xseg.TagStats).
func (l *library) tagStatsJSON(dev int, name string) ([]byte, error) {
	a, err := l.known(dev)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, fmt.Errorf("statistics of tag %q: device %d has no tags: %w", name, dev, vmm.ErrInvalid)
	}
	ts, err := a.TagStats(name)
	if err != nil {
		return nil, err
	}
	return json.Marshal(ts)
}

// tagsJSON is the statistics of every tag of dev, by name, as a JSON
// array; empty for a device without an allocator.
func (l *library) tagsJSON(dev int) ([]byte, error) {
	a, err := l.known(dev)
	if err != nil {
		return nil, err
	}
	all := []xseg.TagStats{}
	if a != nil {
		for _, name := range a.Tags() {
			ts, err := a.TagStats(name)
			if err != nil {
				return nil, err
			}
			all = append(all, ts)
		}
	}
	return json.Marshal(all)
}

//export xsegGoTag
func xsegGoTag(device C.int, name *C.char, first, second *C.ulonglong) (rc C.int) {
	rc = -1
	defer catch("xseg_tag")
	drainFrees()
	n, err := tagName(name)
	if err == nil && (first == nil || second == nil) {
		err = fmt.Errorf("tag %q: first or second is NULL: %w", n, vmm.ErrInvalid)
	}
	if err != nil {
		return status("xseg_tag", err)
	}
	id, err := lib.tag(int(device), n)
	if err != nil {
		return status("xseg_tag", fmt.Errorf("tag %q on device %d: %w", n, int(device), err))
	}
	*first, *second = C.ulonglong(id.First), C.ulonglong(id.Second)
	return 0
}

//export xsegGoPause
func xsegGoPause(device C.int, tag *C.char, backup C.int) (rc C.int) {
	rc = -1
	defer catch("xseg_pause")
	drainFrees()
	tags, err := tagNames(tag)
	if err == nil {
		err = lib.pause(int(device), tags, backup != 0)
	}
	return status("xseg_pause", err)
}

//export xsegGoResume
func xsegGoResume(device C.int, tag *C.char) (rc C.int) {
	rc = -1
	defer catch("xseg_resume")
	drainFrees()
	tags, err := tagNames(tag)
	if err == nil {
		err = lib.resume(int(device), tags)
	}
	return status("xseg_resume", err)
}

//export xsegGoTagStatsJSON
func xsegGoTagStatsJSON(device C.int, tag *C.char) (s *C.char) {
	defer catch("xseg_tag_stats_json")
	drainFrees()
	name, err := tagName(tag)
	var b []byte
	if err == nil {
		b, err = lib.tagStatsJSON(int(device), name)
	}
	return jsonOut("xseg_tag_stats_json", b, err)
}

//export xsegGoTagsJSON
func xsegGoTagsJSON(device C.int) (s *C.char) {
	defer catch("xseg_tags_json")
	drainFrees()
	b, err := lib.tagsJSON(int(device))
	return jsonOut("xseg_tags_json", b, err)
}

// xsegGoSetError records a failure of C or C++ code (pools.cc's regions)
// for xseg_last_error.
//
//export xsegGoSetError
func xsegGoSetError(name, msg *C.char) {
	defer catch("xseg_set_error")
	drainFrees()
	fail(C.GoString(name), errors.New(C.GoString(msg)))
}
