package main

import (
	"errors"
	"fmt"
	"time"

	"github.com/xseg-dev/xseg/bytesize"
	"github.com/xseg-dev/xseg/expandable"
	"github.com/xseg-dev/xseg/vmm"
)

// result is what one way of growing measured.
type result struct {
	steps      []time.Duration // each grow's time, pattern writes excluded
	head, tail span            // the grows of the first and last window(c) bytes
	addrKept   bool
	checked    uint64 // bytes copied back and found right (0: not checked)
	parts      string // a breakdown, if the way has parts
}

// span sums the grows of a stretch of sizes.
type span struct {
	n   int
	sum time.Duration
}

func (s *span) add(d time.Duration) { s.n++; s.sum += d }

func (s span) mean() float64 {
	if s.n == 0 {
		return 0
	}
	return float64(s.sum.Microseconds()) / float64(s.n)
}

func (r *result) record(c config, size uint64, d time.Duration) {
	r.steps = append(r.steps, d)
	if size-c.from <= window(c) {
		r.head.add(d)
	}
	if c.to-size < window(c) {
		r.tail.add(d)
	}
}

// window is the stretch of sizes the head and tail means cover: 512 MiB,
// or a quarter of the growth if that is less.
func window(c config) uint64 { return max(min(512<<20, (c.to-c.from)/4/c.step*c.step), c.step) }

func (r *result) mean() float64 {
	var s span
	for _, d := range r.steps {
		s.add(d)
	}
	return s.mean()
}

func (r *result) line(c config, name string) string {
	var total, most time.Duration
	for _, d := range r.steps {
		total += d
		most = max(most, d)
	}
	check := "not checked"
	if r.checked > 0 {
		check = fmt.Sprintf("kept (%s copied back and checked)", bytesize.Format(r.checked))
	}
	return fmt.Sprintf("%-26s address kept: %v, data %s\n%26s per grow: mean %.1f us, first %s %.1f us, last %s %.1f us, max %.1f us; all grows %.1f ms%s",
		name, r.addrKept, check, "", r.mean(), bytesize.Format(window(c)), r.head.mean(), bytesize.Format(window(c)), r.tail.mean(),
		float64(most.Nanoseconds())/1e3, float64(total.Microseconds())/1e3, r.parts)
}

// growBuffer grows an expandable.Buffer from c.from to c.to.
func growBuffer(d vmm.Driver, c config) (*result, error) {
	b, err := expandable.NewBuffer(d, c.dev, c.to, expandable.BufferOptions{PageSize: c.step})
	if err != nil {
		return nil, err
	}
	r, err := growBufferSteps(d, b, c)
	return r, errors.Join(err, b.Close())
}

func growBufferSteps(d vmm.Driver, b *expandable.Buffer, c config) (*result, error) {
	r := &result{addrKept: true}
	ptr := b.Ptr()
	if err := b.Grow(c.from); err != nil {
		return nil, err
	}
	if err := fill(d, ptr, 0, c.from, c.step); err != nil {
		return nil, err
	}
	for size := c.from; size < c.to; size += c.step {
		t0 := time.Now()
		if err := b.Grow(c.step); err != nil {
			return nil, fmt.Errorf("growing %s by %s: %w", bytesize.Format(size), bytesize.Format(c.step), err)
		}
		r.record(c, size+c.step, time.Since(t0))
		r.addrKept = r.addrKept && b.Ptr() == ptr
		if err := fill(d, ptr, size, c.step, c.step); err != nil {
			return nil, err
		}
	}
	if c.verify {
		if err := check(d, ptr, c.to, c.step); err != nil {
			return nil, err
		}
		r.checked = c.to
	}
	return r, nil
}

// growPlain grows by allocate-copy-free from c.from to c.to.
func growPlain(d vmm.Driver, c config) (*result, error) {
	cur, err := d.MemAlloc(c.dev, c.from)
	if err != nil {
		return nil, err
	}
	r := &result{addrKept: true}
	var alloc, cp, free time.Duration
	err = fill(d, cur, 0, c.from, c.step)
	for size := c.from; err == nil && size < c.to; size += c.step {
		t0 := time.Now()
		var next vmm.DevicePtr
		if next, err = d.MemAlloc(c.dev, size+c.step); err != nil {
			break
		}
		t1 := time.Now()
		if err = d.CopyDtoD(next, cur, size); err != nil {
			err = errors.Join(err, d.MemFree(next))
			break
		}
		t2 := time.Now()
		err = d.MemFree(cur)
		cur = next
		t3 := time.Now()
		alloc, cp, free = alloc+t1.Sub(t0), cp+t2.Sub(t1), free+t3.Sub(t2)
		r.record(c, size+c.step, t3.Sub(t0))
		r.addrKept = false
		if err == nil {
			err = fill(d, cur, size, c.step, c.step)
		}
	}
	if err == nil && c.verify {
		if err = check(d, cur, c.to, c.step); err == nil {
			r.checked = c.to
		}
	}
	if n := len(r.steps); n > 0 {
		us := func(t time.Duration) float64 { return float64(t.Nanoseconds()) / 1e3 / float64(n) }
		r.parts = fmt.Sprintf("\n%26s of which MemAlloc %.1f us, CopyDtoD %.1f us, MemFree %.1f us", "", us(alloc), us(cp), us(free))
	}
	return r, errors.Join(err, d.MemFree(cur))
}
