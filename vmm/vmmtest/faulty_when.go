package vmmtest

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Call is what a [When] knows of a call it judges.
type Call struct {
	Op Op
	// N is the call's number among the calls of Op since NewFaulty or Reset,
	// from 1 (what Calls counts).
	N int
	// Time is when the call reached Faulty, by its clock (SetClock).
	Time time.Time
}

// When is the half of an [Injector] that says which of the calls its Where
// lets through fail. A When is a description: each injector that uses it
// starts its own copy when it is armed, with its counts at zero, so one When
// may arm several injectors or drivers. Counting ones (OnNth, EveryNth,
// Times) count the calls their injector sees, of every operation in its
// Where together; PerOp counts each operation apart. The zero When fails
// every call.
type When struct {
	start func(armed time.Time) trigger
}

// trigger is a started When: fires judges each call the injector sees, in
// order; failed hears of every injected failure, of any injector, after the
// call that failed was judged by all.
type trigger struct {
	fires  func(c Call) bool
	failed func(op Op) // nil: failures do not matter to it
}

func (t trigger) observe(op Op) {
	if t.failed != nil {
		t.failed(op)
	}
}

// begin starts a copy of w at the time its injector was armed.
func (w When) begin(armed time.Time) trigger {
	if w.start == nil {
		return Always().start(armed)
	}
	return w.start(armed)
}

// counting makes a When that fires on the calls whose number, among those
// its copy sees, satisfies hit.
func counting(hit func(seen int) bool) When {
	return When{start: func(time.Time) trigger {
		seen := 0
		return trigger{fires: func(Call) bool { seen++; return hit(seen) }}
	}}
}

func positive(what string, n int) {
	if n < 1 {
		panic(fmt.Sprintf("vmmtest: %s(%d): n must be at least 1", what, n))
	}
}

// Always fires on every call.
func Always() When { return WhenFunc(func(Call) bool { return true }) }

// WhenFunc fires on the calls for which pred returns true. pred runs under
// Faulty's lock and must not call the driver.
func WhenFunc(pred func(c Call) bool) When {
	return When{start: func(time.Time) trigger { return trigger{fires: pred} }}
}

// OnNth fires on the n-th call its injector sees (1: the first), once.
func OnNth(n int) When {
	positive("OnNth", n)
	return counting(func(seen int) bool { return seen == n })
}

// EveryNth fires on every n-th call its injector sees: n, 2n, 3n, ...
func EveryNth(n int) When {
	positive("EveryNth", n)
	return counting(func(seen int) bool { return seen%n == 0 })
}

// WithProbability fires on each call with probability p, drawing from a
// generator seeded with seed: the same seed fails the same calls of the same
// sequence (one draw per call seen, in the order the calls arrive).
func WithProbability(p float64, seed uint64) When {
	if p < 0 || p > 1 {
		panic(fmt.Sprintf("vmmtest: WithProbability(%v): p must be within [0, 1]", p))
	}
	return When{start: func(time.Time) trigger {
		rng := rand.New(rand.NewPCG(seed, seed))
		return trigger{fires: func(Call) bool { return rng.Float64() < p }}
	}}
}

// After fires on every call that comes d or more after its injector was
// armed, by Faulty's clock (SetClock).
func After(d time.Duration) When {
	return When{start: func(armed time.Time) trigger {
		return trigger{fires: func(c Call) bool { return c.Time.Sub(armed) >= d }}
	}}
}

// AfterFailureOf fires on every call after the first injected failure of an
// operation in w since its injector was armed (by any injector). With Once it
// fails the undo of a failed step: AfterFailureOf(Ops(OpMap)).Once() on
// Ops(OpUnmap).
func AfterFailureOf(w Where) When {
	return When{start: func(time.Time) trigger {
		failed := false
		return trigger{
			fires:  func(Call) bool { return failed },
			failed: func(op Op) { failed = failed || w.Has(op) },
		}
	}}
}

// And fires when both w and v do. Both see every call, so the counts of
// each do not depend on the other.
func (w When) And(v When) When {
	return both(w, v, func(a, b bool) bool { return a && b })
}

// Or fires when w or v does. Both see every call.
func (w When) Or(v When) When {
	return both(w, v, func(a, b bool) bool { return a || b })
}

func both(w, v When, join func(a, b bool) bool) When {
	return When{start: func(armed time.Time) trigger {
		a, b := w.begin(armed), v.begin(armed)
		return trigger{
			fires:  func(c Call) bool { return join(a.fires(c), b.fires(c)) },
			failed: func(op Op) { a.observe(op); b.observe(op) },
		}
	}}
}

// Not fires on the calls w does not fire on.
func (w When) Not() When {
	return When{start: func(armed time.Time) trigger {
		t := w.begin(armed)
		return trigger{fires: func(c Call) bool { return !t.fires(c) }, failed: t.observe}
	}}
}

// Times fires as w does, k times at most.
func (w When) Times(k int) When {
	positive("Times", k)
	return When{start: func(armed time.Time) trigger {
		t, fired := w.begin(armed), 0
		return trigger{
			fires: func(c Call) bool {
				if fired == k || !t.fires(c) {
					return false
				}
				fired++
				return true
			},
			failed: t.observe,
		}
	}}
}

// Once fires as w does, the first time only.
func (w When) Once() When { return w.Times(1) }

// Then fires as w does until w has fired once; from the next call on, v
// decides, started (its counts at zero) when w fired. OnNth(2).Then(Always())
// fails the second call and every call after it.
func (w When) Then(v When) When {
	return When{start: func(armed time.Time) trigger {
		cur, switched := w.begin(armed), false
		return trigger{
			fires: func(c Call) bool {
				if switched {
					return cur.fires(c)
				}
				if !cur.fires(c) {
					return false
				}
				cur, switched = v.begin(c.Time), true
				return true
			},
			failed: func(op Op) { cur.observe(op) },
		}
	}}
}

// PerOp runs a copy of w for each operation: OnNth(2) fails the second
// call of every operation in its injector's Where instead of the second call
// among them all.
func PerOp(w When) When {
	return When{start: func(armed time.Time) trigger {
		per := make(map[Op]trigger, len(allOps))
		for _, op := range allOps {
			per[op] = w.begin(armed)
		}
		return trigger{
			fires: func(c Call) bool { return per[c.Op].fires(c) },
			failed: func(op Op) {
				for _, t := range per {
					t.observe(op)
				}
			},
		}
	}}
}
