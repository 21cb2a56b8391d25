package main

import (
	"fmt"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// latencyChart draws each variant's p99 latency (the median of its
// repetitions) against the rate, both on log scales when there are rates
// enough, into an SVG file.
func latencyChart(path string, rates []int, results map[cellKey][]result) error {
	p := plot.New()
	p.Title.Text = "p99 latency, change made to event received (median of the repetitions)"
	p.X.Label.Text = "changes per second"
	p.Y.Label.Text = "p99 latency, ms"
	if len(rates) > 1 {
		p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
		p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	}
	var lines []any
	for _, v := range variants {
		var pts plotter.XYs
		for _, rate := range rates {
			rs, ok := results[cellKey{v.name, rate}]
			if !ok {
				continue
			}
			if p99 := median(durations(rs, func(r result) time.Duration { return r.p99 })); p99 > 0 {
				pts = append(pts, plotter.XY{X: float64(rate), Y: float64(p99) / float64(time.Millisecond)})
			}
		}
		if len(pts) > 0 {
			lines = append(lines, v.name, pts)
		}
	}
	return save(p, path, lines)
}

// memoryChart draws the bridge's RSS and Go heap against the Students it
// watches: while publishing them, after a restart, and steady.
func memoryChart(path string, s Scale) error {
	p := plot.New()
	p.Title.Text = "Memory of the bridge process against the Students it watches"
	p.X.Label.Text = "Students"
	p.Y.Label.Text = "MB"
	// The process with no Student, never restarted, is every series'
	// first point.
	rest := ScaleCount{Publishing: s.Rest, Steady: s.Rest, AfterRestartLimited: s.Rest, SteadyLimited: Memory{RSSMB: s.Rest.RSSMB}}
	series := []struct {
		name string
		of   func(ScaleCount) float64
	}{
		{"RSS, publishing", func(c ScaleCount) float64 { return c.Publishing.RSSMB }},
		{"RSS, steady", func(c ScaleCount) float64 { return c.Steady.RSSMB }},
		{"RSS after a restart, memoryLimit " + s.MemoryLimit, func(c ScaleCount) float64 { return c.AfterRestartLimited.RSSMB }},
		{"RSS, steady with memoryLimit " + s.MemoryLimit, func(c ScaleCount) float64 { return c.SteadyLimited.RSSMB }},
		{"heap in use, publishing", func(c ScaleCount) float64 { return c.Publishing.HeapMB }},
		{"heap in use, steady", func(c ScaleCount) float64 { return c.Steady.HeapMB }},
	}
	var lines []any
	for _, se := range series {
		pts := plotter.XYs{{X: 0, Y: se.of(rest)}}
		for _, c := range s.Counts {
			pts = append(pts, plotter.XY{X: float64(c.Students), Y: se.of(c)})
		}
		lines = append(lines, se.name, pts)
	}
	return save(p, path, lines)
}

// restartChart draws the time a restart takes until every Student is
// reconciled, and a raw informer's sync, against the Students.
func restartChart(path string, s Scale) error {
	p := plot.New()
	p.Title.Text = "Restart with every Student published"
	p.X.Label.Text = "Students"
	p.Y.Label.Text = "seconds"
	var restart, informer plotter.XYs
	for _, c := range s.Counts {
		restart = append(restart, plotter.XY{X: float64(c.Students), Y: median(msList(c.Restart.CaughtUpMs)).Seconds()})
		informer = append(informer, plotter.XY{X: float64(c.Students), Y: median(msList(c.Restart.InformerProcessMs)).Seconds()})
	}
	if len(restart) == 0 {
		return nil
	}
	return save(p, path, []any{"bridge: caught up", restart, "raw informer: synced", informer})
}

func save(p *plot.Plot, path string, lines []any) error {
	if len(lines) == 0 {
		return nil
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	p.Legend.Top, p.Legend.Left = true, true
	if err := p.Save(9*vg.Inch, 6*vg.Inch, path); err != nil {
		return fmt.Errorf("chart %s: %w", path, err)
	}
	return nil
}
