package stages

import (
	"testing"
	"time"
)

func TestQuantile(t *testing.T) {
	// 10 observations at or below 1 ms, 80 in (1 ms, 2 ms], 10 in (2 ms, 4 ms].
	h := Histogram{Count: 100, Bounds: []float64{0.001, 0.002, 0.004}, Cumulative: []uint64{10, 90, 100}}
	for _, tc := range []struct {
		q    float64
		want time.Duration
	}{
		{0.05, 500 * time.Microsecond},  // half-way into the first bucket
		{0.5, 1500 * time.Microsecond},  // 40 of the second bucket's 80
		{0.99, 3800 * time.Microsecond}, // 9 of the third's 10
	} {
		if got := h.Quantile(tc.q); got != tc.want {
			t.Errorf("Quantile(%v) = %v, want %v", tc.q, got, tc.want)
		}
	}
	if got := (Histogram{}).Quantile(0.5); got != 0 {
		t.Errorf("empty Quantile = %v, want 0", got)
	}
}

func TestSinceAndAdd(t *testing.T) {
	before := map[string]Histogram{"queue": {Count: 3, Sum: 1, Bounds: []float64{1, 2}, Cumulative: []uint64{2, 3}}}
	after := map[string]Histogram{"queue": {Count: 7, Sum: 4, Bounds: []float64{1, 2}, Cumulative: []uint64{3, 7}}}
	d := Since(before, after)["queue"]
	if d.Count != 4 || d.Sum != 3 || d.Cumulative[0] != 1 || d.Cumulative[1] != 4 {
		t.Fatalf("Since = %+v, want count 4, sum 3, cumulative [1 4]", d)
	}
	s := Add(Histogram{}, d)
	s = Add(s, d)
	if s.Count != 8 || s.Cumulative[1] != 8 {
		t.Fatalf("Add = %+v, want count 8, cumulative [.. 8]", s)
	}
}
