package trace

import (
	"cmp"
	"slices"
)

// VariantResult is the replay of the variant of a trace that Perturb made
// with seed Seed. The JSON keys are those of Result and "seed".
type VariantResult struct {
	Seed uint64 `json:"seed"`
	Result
}

// Spread is how the ratios of a trace's variants spread.
type Spread struct {
	// Variants is the number of variants.
	Variants int
	// Best, Median and Worst are the lowest, median and highest Ratio.
	// With an even number of variants the median is the mean of the two
	// middle ones.
	Best, Median, Worst float64
	// WorstSeed is the seed of the variant with the highest Ratio (the
	// first such seed given).
	WorstSeed uint64
}

// SpreadOf summarises the ratios of vs; the zero Spread for none.
func SpreadOf(vs []VariantResult) Spread {
	if len(vs) == 0 {
		return Spread{}
	}
	worst := slices.MaxFunc(vs, func(a, b VariantResult) int { return cmp.Compare(a.Ratio, b.Ratio) })
	ratios := make([]float64, len(vs))
	for i, v := range vs {
		ratios[i] = v.Ratio
	}
	slices.Sort(ratios)
	n := len(ratios)
	median := ratios[n/2]
	if n%2 == 0 {
		median = (ratios[n/2-1] + ratios[n/2]) / 2
	}
	return Spread{Variants: n, Best: ratios[0], Median: median, Worst: worst.Ratio, WorstSeed: worst.Seed}
}
