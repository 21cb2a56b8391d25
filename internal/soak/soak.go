// Package soak is what a soak of the deployment leaves (make soak, run by
// test/node's TestSoak): its settings, a sample of every pod, the stream
// and the buckets over time, each fault and its recovery, and what the
// end's checks found. It reads each quantity's trend, and renders a run
// for the docs: a table and a plot over time.
package soak

import (
	"maps"
	"slices"
	"time"
)

// Settled is when a soak's quantities are compared from by default: the
// load has filled the Students up to its level, the caches are warm, and
// the record store and the receipts bucket have been purged once. Their
// delete markers are purged once ten minutes old (records'
// deleteMarkerAge), and the first fault, five minutes in, restarts every
// pod: before 15 minutes the buckets, and the pods' memory with them, are
// still filling towards the level they then keep.
const Settled = 15 * time.Minute

// Bounded are the totals that must not grow once a soak has settled, and
// how much they may: the bridge pods' heap and RSS within 5 % of their
// level when settled, goroutines, descriptors and NATS subscriptions as
// flat (5 % is a few goroutines of a few hundred: a leak per handover or
// per snapshot is more within the hour).
var Bounded = []string{"bridge heap bytes", "bridge RSS bytes", "bridge goroutines", "bridge open fds", "NATS subscriptions"}

// MaxGrowth is how much a bounded quantity may grow after Settled, as a
// share of its level then.
const MaxGrowth = 0.05

// Results is one soak.
type Results struct {
	Date        string `json:"date"`
	Commit      string `json:"commit"`
	Duration    string `json:"duration"`
	Rate        int    `json:"rate"`
	Students    int    `json:"students"`
	FaultEvery  string `json:"faultEvery"`
	SampleEvery string `json:"sampleEvery"`
	// Settled is when the trends are read from (Settled unless set).
	Settled string   `json:"settled"`
	Samples []Sample `json:"samples"`
	Faults  []Fault  `json:"faults"`
	// Limits are the stream's and buckets' configured limits, by stream.
	Limits map[string]Limits `json:"limits"`
	End    End               `json:"end"`
	Slopes []Growth          `json:"slopes"`
	// Passed is whether every check of the soak held.
	Passed bool `json:"passed"`
}

// Sample is the deployment at one moment: each quantity by pod (bridge
// pods' memory, heap, goroutines, descriptors and shards; NATS pods'
// memory, connections and subscriptions) and the totals: those summed
// over pods ("bridge heap bytes"), the stream's, buckets' and Events'.
type Sample struct {
	Minute float64                       `json:"minute"`
	Pods   map[string]map[string]float64 `json:"pods"`
	Totals map[string]float64            `json:"totals"`
}

// Fault is one fault: when, and how long from it until the deployment was
// Ready again.
type Fault struct {
	Name      string  `json:"name"`
	Minute    float64 `json:"minute"`
	RecoveryS float64 `json:"recoverySeconds"`
}

// Limits are a stream's configured limits (0: none).
type Limits struct {
	MaxAge   string `json:"maxAge"`
	MaxBytes int64  `json:"maxBytes"`
	MaxMsgs  int64  `json:"maxMsgs"`
}

// End is what the end's checks found.
type End struct {
	Changes       int     `json:"changes"`
	Rate          float64 `json:"rate"`
	LongestWaitS  float64 `json:"longestWaitSeconds"`
	MirrorChecked int     `json:"mirrorStudents"`
	MirrorDiffer  int     `json:"mirrorDiffer"`
	Gaps          int64   `json:"gaps"`
	// RetriedWrites counts the load's writes tried again after the API
	// server timed them out.
	RetriedWrites int `json:"retriedWrites,omitempty"`
}

// Growth is one quantity's level once settled, at the end, and its slope
// between (Theil-Sen, per hour).
type Growth struct {
	Quantity string  `json:"quantity"`
	Settled  float64 `json:"settled"`
	End      float64 `json:"end"`
	PerHour  float64 `json:"perHour"`
}

// Grown is how much g grew from settled to the end of a soak of d by its
// slope, as a share of its level when settled (0 when it had none).
func (g Growth) Grown(d, settled time.Duration) float64 {
	if g.Settled == 0 || d <= settled {
		return 0
	}
	return g.PerHour * (d - settled).Hours() / g.Settled
}

// Overgrown are the Bounded quantities of slopes that grew more than
// MaxGrowth in a soak of d, read from settled.
func Overgrown(slopes []Growth, d, settled time.Duration) []Growth {
	var out []Growth
	for _, g := range slopes {
		if slices.Contains(Bounded, g.Quantity) && g.Grown(d, settled) > MaxGrowth {
			out = append(out, g)
		}
	}
	return out
}

// Durations are the soak's length and when it settled.
func (r Results) Durations() (d, settled time.Duration) {
	d, _ = time.ParseDuration(r.Duration)
	settled, err := time.ParseDuration(r.Settled)
	if err != nil {
		settled = Settled
	}
	return d, settled
}

// Slopes reads, for each total, its level at settled, at the end, and its
// slope between.
func Slopes(samples []Sample, settled time.Duration) []Growth {
	names := map[string]bool{}
	for _, s := range samples {
		for n := range s.Totals {
			names[n] = true
		}
	}
	var out []Growth
	for _, n := range slices.Sorted(maps.Keys(names)) {
		var xs, ys []float64
		for _, s := range samples {
			if v, ok := s.Totals[n]; ok && s.Minute >= settled.Minutes() {
				xs, ys = append(xs, s.Minute/60), append(ys, v)
			}
		}
		if len(xs) < 2 {
			continue
		}
		out = append(out, Growth{Quantity: n, Settled: ys[0], End: ys[len(ys)-1], PerHour: slope(xs, ys)})
	}
	return out
}

// slope is the Theil-Sen estimate of ys's slope against xs: the median of
// the slopes between every two samples. A least-squares line is pulled by
// a transient near either end (a rollout restart's new pods loading every
// Student: a peak of minutes); the median of the pairs is not, while a
// steady growth moves every pair.
func slope(xs, ys []float64) float64 {
	var slopes []float64
	for i := range xs {
		for j := i + 1; j < len(xs); j++ {
			if dx := xs[j] - xs[i]; dx != 0 {
				slopes = append(slopes, (ys[j]-ys[i])/dx)
			}
		}
	}
	if len(slopes) == 0 {
		return 0
	}
	slices.Sort(slopes)
	if n := len(slopes); n%2 == 0 {
		return (slopes[n/2-1] + slopes[n/2]) / 2
	}
	return slopes[len(slopes)/2]
}
