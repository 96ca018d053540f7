package main

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/xseg-dev/xseg"
	"github.com/xseg-dev/xseg/vmm"
)

// service is a model server that gives its GPU memory back while idle: its
// weights live in tag "weights" (paused with a host backup: they cost a
// load to make again) and its KV cache in tag "kv_cache" (paused without:
// a cache is rebuilt by the next request). After idle without a request
// it pauses both; the next request resumes them at the same addresses, so
// every pointer the service holds (and any CUDA graph it captured) stays
// valid.
//
// Requests and the idle pause take one lock: no request touches memory
// while it is paused, and no pause happens under a request. A service is
// safe for concurrent use.
type service struct {
	a          *xseg.DeviceAllocator
	weights    xseg.Tagged
	kv         xseg.Tagged
	w, cache   vmm.DevicePtr
	wLen, cLen uint64
	idle       time.Duration

	mu struct {
		sync.Mutex
		closed bool
		paused bool
		timer  *time.Timer
		// sleeps and wakes count pauses and resumes; err is the first
		// error of a pause the timer made.
		sleeps, wakes int
		err           error
	}
}

// weightByte is byte i of the model's weights, as the service loads them.
func weightByte(i uint64) byte { return byte(i*131 + i>>16) }

// newService allocates and "loads" weightBytes of weights and a KV cache
// of cacheBytes, and pauses both after idle without a request.
func newService(a *xseg.DeviceAllocator, weightBytes, cacheBytes uint64, idle time.Duration) (*service, error) {
	s := &service{a: a, wLen: weightBytes, cLen: cacheBytes, idle: idle}
	var err error
	if s.weights, err = a.Tagged("weights"); err != nil {
		return nil, err
	}
	if s.kv, err = a.Tagged("kv_cache"); err != nil {
		return nil, err
	}
	if s.w, err = s.weights.Alloc(weightBytes, 0); err != nil {
		return nil, err
	}
	if s.cache, err = s.kv.Alloc(cacheBytes, 0); err != nil {
		return nil, errors.Join(err, s.weights.Free(s.w))
	}
	load := make([]byte, weightBytes)
	for i := range load {
		load[i] = weightByte(uint64(i))
	}
	if err := a.Driver().CopyHtoD(s.w, load); err != nil {
		return nil, errors.Join(err, s.weights.Free(s.w), s.kv.Free(s.cache))
	}
	s.mu.timer = time.AfterFunc(idle, s.sleepIfIdle)
	return s, nil
}

// Query answers a request: weight i, read from device memory, after it
// writes the request into the KV cache. A paused service resumes first.
func (s *service) Query(i uint64) (byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return 0, fmt.Errorf("query %d: the service is closed", i)
	}
	if s.mu.paused {
		if err := s.a.Resume("weights", "kv_cache"); err != nil {
			return 0, fmt.Errorf("query %d: waking up: %w", i, err)
		}
		s.mu.paused = false
		s.mu.wakes++
	}
	s.mu.timer.Reset(s.idle)
	if err := s.a.Driver().Memset(s.cache.Add(i%s.cLen), 1, 1); err != nil {
		return 0, fmt.Errorf("query %d: %w", i, err)
	}
	b := make([]byte, 1)
	if err := s.a.Driver().CopyDtoH(b, s.w.Add(i%s.wLen)); err != nil {
		return 0, fmt.Errorf("query %d: %w", i, err)
	}
	return b[0], nil
}

// sleepIfIdle pauses both tags: the timer calls it after idle without a
// request (a request that came meanwhile has reset the timer; Stop
// missed it only if it came during this call's wait for the lock, and
// then the pause is one idle period early, no harm).
func (s *service) sleepIfIdle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed || s.mu.paused {
		return
	}
	// Each tag is paused wholly or not at all; the next request resumes
	// whichever was.
	werr, kerr := s.weights.Pause(true), s.kv.Pause(false)
	if err := errors.Join(werr, kerr); err != nil && s.mu.err == nil {
		s.mu.err = err
	}
	if werr != nil && kerr != nil {
		// Nothing was paused (an allocator that cannot pause, such as
		// the fallback allocator, fails every time): the service stays
		// awake, and tries again once idle after the next request.
		return
	}
	s.mu.paused = true
	s.mu.sleeps++
}

// pauseErr returns the first error of a pause the timer made.
func (s *service) pauseErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err
}

// Sleeping reports whether the service is paused, and how often it has
// paused and resumed.
func (s *service) Sleeping() (paused bool, sleeps, wakes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.paused, s.mu.sleeps, s.mu.wakes
}

// Close stops the idle timer and frees the service's memory (paused or
// not); it returns the error of any pause the timer made.
func (s *service) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil
	}
	s.mu.closed = true
	s.mu.timer.Stop()
	return errors.Join(s.mu.err, s.weights.Free(s.w), s.kv.Free(s.cache))
}
