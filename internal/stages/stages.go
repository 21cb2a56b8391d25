// Package stages is student_bridge_stage_duration_seconds: the stages of a
// change, observed by the bridge (Observe, observe.go), and read from the
// metrics registry of the process, for the benchmark and the tests: a
// snapshot per stage, the difference of two snapshots, and quantiles
// estimated from the buckets as Prometheus' histogram_quantile does.
package stages

import (
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Metric is the histogram's name.
const Metric = "student_bridge_stage_duration_seconds"

// Histogram is one stage's cumulative histogram.
type Histogram struct {
	Count uint64
	Sum   float64
	// Bounds are the upper bounds of the buckets, ascending; Cumulative
	// the observations at or below each.
	Bounds     []float64
	Cumulative []uint64
}

// Snapshot reads every stage's histogram now, from this process's
// registry.
func Snapshot() (map[string]Histogram, error) {
	families, err := metrics.Registry.(prometheus.Gatherer).Gather()
	if err != nil {
		return nil, err
	}
	return FromFamilies(families), nil
}

// Gather reads the metrics a process serves as /metrics text at url (a
// bridge running as a process of its own); FromFamilies picks the stages
// out of them.
func Gather(url string) ([]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	byName, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	families := make([]*dto.MetricFamily, 0, len(byName))
	for _, f := range byName {
		families = append(families, f)
	}
	return families, nil
}

// FromFamilies picks the stage histograms out of gathered metrics.
func FromFamilies(families []*dto.MetricFamily) map[string]Histogram {
	out := map[string]Histogram{}
	for _, f := range families {
		if f.GetName() != Metric {
			continue
		}
		for _, m := range f.GetMetric() {
			stage := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					stage = l.GetValue()
				}
			}
			h := m.GetHistogram()
			s := Histogram{Count: h.GetSampleCount(), Sum: h.GetSampleSum()}
			for _, b := range h.GetBucket() {
				// The +Inf bucket a scrape in text format carries is the
				// count: Quantile counts what lies above the last bound as
				// the last bound.
				if math.IsInf(b.GetUpperBound(), 1) {
					continue
				}
				s.Bounds = append(s.Bounds, b.GetUpperBound())
				s.Cumulative = append(s.Cumulative, b.GetCumulativeCount())
			}
			out[stage] = s
		}
	}
	return out
}

// Sum adds the histograms of several bridges (replicas), stage by stage.
func Sum(all ...map[string]Histogram) map[string]Histogram {
	out := map[string]Histogram{}
	for _, m := range all {
		for stage, h := range m {
			out[stage] = Add(out[stage], h)
		}
	}
	return out
}

// Since is what was observed in each stage between before and after.
func Since(before, after map[string]Histogram) map[string]Histogram {
	out := map[string]Histogram{}
	for stage, a := range after {
		b := before[stage]
		d := Histogram{Count: a.Count - b.Count, Sum: a.Sum - b.Sum, Bounds: a.Bounds}
		for i, c := range a.Cumulative {
			if i < len(b.Cumulative) {
				c -= b.Cumulative[i]
			}
			d.Cumulative = append(d.Cumulative, c)
		}
		out[stage] = d
	}
	return out
}

// Add sums histograms of the same buckets (repetitions of one cell).
func Add(a, b Histogram) Histogram {
	if a.Bounds == nil {
		return b
	}
	out := Histogram{Count: a.Count + b.Count, Sum: a.Sum + b.Sum, Bounds: a.Bounds}
	for i := range a.Cumulative {
		out.Cumulative = append(out.Cumulative, a.Cumulative[i]+b.Cumulative[i])
	}
	return out
}

// Quantile estimates the q-quantile (0 < q < 1) by linear interpolation
// within the bucket it falls in; observations above the last bound count
// as the last bound. It is 0 without observations.
func (h Histogram) Quantile(q float64) time.Duration {
	if h.Count == 0 {
		return 0
	}
	rank := q * float64(h.Count)
	lower, below := 0.0, uint64(0)
	for i, c := range h.Cumulative {
		if float64(c) >= rank {
			inBucket := float64(c - below)
			frac := 1.0
			if inBucket > 0 {
				frac = (rank - float64(below)) / inBucket
			}
			return seconds(lower + (h.Bounds[i]-lower)*frac)
		}
		lower, below = h.Bounds[i], c
	}
	return seconds(lower)
}

func seconds(s float64) time.Duration {
	if math.IsInf(s, 0) || math.IsNaN(s) {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}
