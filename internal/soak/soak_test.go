package soak

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"
)

// sampleSettle is when the samples below settle.
const sampleSettle = 10 * time.Minute

// samples is a soak of an hour sampled each minute: goroutines flat with
// noise until minute 10, then one more every minute (60 an hour), the
// heap flat.
func samples() []Sample {
	var out []Sample
	for m := 0; m <= 60; m++ {
		g := 300.0 + float64(m%3)
		if m > 10 {
			g += float64(m - 10)
		}
		out = append(out, Sample{Minute: float64(m), Totals: map[string]float64{"bridge goroutines": g, "bridge heap bytes": 50e6}})
	}
	return out
}

func TestSlopesReadTheTrendAfterSettling(t *testing.T) {
	got := map[string]Growth{}
	for _, g := range Slopes(samples(), sampleSettle) {
		got[g.Quantity] = g
	}
	g := got["bridge goroutines"]
	if math.Abs(g.PerHour-60) > 2 || g.Settled != 301 || g.End != 350 {
		t.Errorf("goroutines: %+v, want about 60 an hour from 301 to 350", g)
	}
	if grown := g.Grown(time.Hour, sampleSettle); math.Abs(grown-50.0/301) > 0.01 {
		t.Errorf("goroutines grew %.3f, want about %.3f", grown, 50.0/301)
	}
	if h := got["bridge heap bytes"]; h.PerHour != 0 || h.Grown(time.Hour, sampleSettle) != 0 {
		t.Errorf("a flat heap: %+v", h)
	}
	if len(Slopes(samples()[:10], sampleSettle)) != 0 {
		t.Error("a trend read from samples all before settling")
	}
}

// A flat heap with a transient peak near the end (a rollout restart's new
// pods loading everything) has no trend; a least-squares line read one
// of 15 % an hour into the soak of 2026-12-06.
func TestSlopesIgnoreATransient(t *testing.T) {
	var samples []Sample
	for m := 10; m <= 60; m++ {
		h := 105e6 + float64(m%3)*1e6
		if m >= 46 && m <= 49 {
			h = 155e6
		}
		samples = append(samples, Sample{Minute: float64(m), Totals: map[string]float64{"bridge heap bytes": h}})
	}
	g := Slopes(samples, sampleSettle)[0]
	if grown := g.Grown(time.Hour, sampleSettle); math.Abs(grown) > 0.01 {
		t.Errorf("a flat heap with a transient grew %+.1f %% (%+.0f an hour)", 100*grown, g.PerHour)
	}
}

func TestMarkdownAndChart(t *testing.T) {
	res := Results{Date: "2026-12-06", Commit: "abc", Duration: "1h0m0s", Rate: 50, Students: 5000, FaultEvery: "5m0s", SampleEvery: "1m0s", Settled: sampleSettle.String(),
		Samples: samples(), Faults: []Fault{{Name: "pod deleted", Minute: 5, RecoveryS: 12.5}},
		Limits: map[string]Limits{"STUDENTS": {MaxAge: "168h0m0s", MaxBytes: 1 << 30}}, End: End{Changes: 180000, Rate: 50}, Passed: true}
	for _, s := range res.Samples {
		s.Totals["STUDENTS bytes"] = 1e6 + s.Minute*1e6/60
	}
	md := Markdown(res, "results/soak.svg")
	for _, want := range []string{"1h0m0s at 50 changes a second around 5000 Students", "every check held", "| 5.0 | pod deleted | 12.5 s |",
		"| bridge goroutines | 301 | 350 |", "at most +5 %", "at most 1.07G, kept 168h0m0s", "| STUDENTS bytes | 1.17M | 2M | 1M | +71.4 % |", "![1h0m0s over time", "(results/soak.svg)"} {
		if !strings.Contains(md, want) {
			t.Errorf("the table lacks %q:\n%s", want, md)
		}
	}
	svg, err := Chart(res)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<svg", "bridge goroutines", "memory, MiB", "minutes"} {
		if !strings.Contains(string(svg), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
	if again, _ := Chart(res); string(again) != string(svg) {
		t.Error("the chart differs when drawn twice: make verify-gen would never be clean")
	}
}

// The committed soaks read at the default settle time: the fourth hour's
// receipts were never removed (its heap grew with them) and it fails; the
// fifth, with the receipts swept, passes.
func TestCommittedSoaksAtTheDefaultSettleTime(t *testing.T) {
	for file, want := range map[string]bool{"soak-2026-12-06-4.json": false, "soak-2026-12-06-5.json": true} {
		b, err := os.ReadFile("../../docs/results/" + file)
		if err != nil {
			t.Fatal(err)
		}
		var res Results
		if err := json.Unmarshal(b, &res); err != nil {
			t.Fatal(err)
		}
		d, _ := res.Durations()
		var grown []string
		for _, g := range Overgrown(Slopes(res.Samples, Settled), d, Settled) {
			grown = append(grown, g.Quantity)
		}
		if bounded := len(grown) == 0; bounded != want {
			t.Errorf("%s read from %s: grown %v, want bounded %v", file, Settled, grown, want)
		}
	}
}
