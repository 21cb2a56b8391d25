package soak

import (
	"bytes"
	"fmt"
	"image/color"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Markdown renders a soak for the docs: the run, what its end found, each
// fault and its recovery, each quantity's trend once settled and the
// streams' limits, and the plot (chart, a path relative to the page).
func Markdown(res Results, chart string) string {
	var b strings.Builder
	verdict := "every check held"
	if !res.Passed {
		verdict = "a check failed"
	}
	fmt.Fprintf(&b, "Soak of %s (commit %s): %s at %d changes a second around %d Students, a fault every %s, sampled every %s; %s.\n\n",
		res.Date, res.Commit, res.Duration, res.Rate, res.Students, res.FaultEvery, res.SampleEvery, verdict)
	e := res.End
	b.WriteString("| changes | rate | longest wait of a change | Students the Mirror agrees on | Students it differs on | gaps the Mirror saw |\n| ---: | ---: | ---: | ---: | ---: | ---: |\n")
	fmt.Fprintf(&b, "| %d | %.1f/s | %.1f s | %d | %d | %d |\n\n", e.Changes, e.Rate, e.LongestWaitS, e.MirrorChecked, e.MirrorDiffer, e.Gaps)
	if e.RetriedWrites > 0 {
		fmt.Fprintf(&b, "The API server timed out %d of the load's writes; the load tried them again, as a user's client does.\n\n", e.RetriedWrites)
	}

	b.WriteString("| minute | fault | Ready again after |\n| ---: | --- | ---: |\n")
	for _, f := range res.Faults {
		fmt.Fprintf(&b, "| %.1f | %s | %.1f s |\n", f.Minute, f.Name, f.RecoveryS)
	}
	b.WriteString("\n")

	d, settled := res.Durations()
	fmt.Fprintf(&b, "| quantity (summed over pods) | at minute %.0f | at the end | slope an hour | grown after minute %.0f | bound |\n| --- | ---: | ---: | ---: | ---: | --- |\n",
		settled.Minutes(), settled.Minutes())
	// The trends are read from the samples again, so that every run's
	// table reads them the same way (Slopes), whichever way its run did.
	for _, g := range Slopes(res.Samples, settled) {
		bound := ""
		if slices.Contains(Bounded, g.Quantity) {
			bound = fmt.Sprintf("at most %+.0f %%", 100*MaxGrowth)
		} else if l, ok := res.Limits[strings.TrimSuffix(strings.TrimSuffix(g.Quantity, " messages"), " bytes")]; ok {
			bound = l.String(strings.HasSuffix(g.Quantity, " bytes"))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %+.1f %% | %s |\n", g.Quantity, figure(g.Settled), figure(g.End), figure(g.PerHour), 100*g.Grown(d, settled), bound)
	}
	fmt.Fprintf(&b, "\n![%s over time: memory, goroutines and descriptors, the stream and buckets; dashed lines are faults](%s)\n", res.Duration, chart)
	return b.String()
}

// String says a stream's limit on its bytes or its messages, and its age.
func (l Limits) String(bytes bool) string {
	var parts []string
	switch {
	case bytes && l.MaxBytes > 0:
		parts = append(parts, fmt.Sprintf("at most %s", figure(float64(l.MaxBytes))))
	case !bytes && l.MaxMsgs > 0:
		parts = append(parts, fmt.Sprintf("at most %d", l.MaxMsgs))
	}
	if l.MaxAge != "" && l.MaxAge != "0s" {
		parts = append(parts, "kept "+l.MaxAge)
	}
	if len(parts) == 0 {
		return "no limit"
	}
	return strings.Join(parts, ", ")
}

// figure is a number in k, M or G, with three digits.
func figure(v float64) string {
	a := v
	if a < 0 {
		a = -a
	}
	switch {
	case a >= 1e9:
		return fmt.Sprintf("%.3gG", v/1e9)
	case a >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case a >= 1e4:
		return fmt.Sprintf("%.3gk", v/1e3)
	default:
		return fmt.Sprintf("%.4g", v)
	}
}

// panels are the plot's three: each a title, the unit its totals are
// divided by, and the totals.
var panels = []struct {
	title  string
	unit   float64
	totals []string
}{
	{"memory, MiB (summed over pods)", 1 << 20, []string{"bridge RSS bytes", "bridge heap bytes", "NATS RSS bytes"}},
	{"goroutines, descriptors, subscriptions", 1, []string{"bridge goroutines", "bridge open fds", "NATS subscriptions", "NATS connections"}},
	{"messages and Events, thousands", 1000, []string{"STUDENTS messages", "KV_STUDENT_BRIDGE_PUBLISHED messages", "KV_STUDENT_BRIDGE_RECEIPTS messages", "Kubernetes Events"}},
}

// Chart draws the soak's totals over time, one panel of panels above the
// other, with each fault a dashed line, as SVG.
func Chart(res Results) ([]byte, error) {
	var rows [][]*plot.Plot
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.title
		if i == len(panels)-1 {
			p.X.Label.Text = "minutes"
		}
		top := 0.0
		var lines []any
		for _, name := range pn.totals {
			var pts plotter.XYs
			for _, s := range res.Samples {
				if v, ok := s.Totals[name]; ok {
					pts = append(pts, plotter.XY{X: s.Minute, Y: v / pn.unit})
					top = max(top, v/pn.unit)
				}
			}
			if len(pts) > 0 {
				lines = append(lines, name, pts)
			}
		}
		if err := plotutil.AddLines(p, lines...); err != nil {
			return nil, err
		}
		for _, f := range res.Faults {
			l, err := plotter.NewLine(plotter.XYs{{X: f.Minute, Y: 0}, {X: f.Minute, Y: top}})
			if err != nil {
				return nil, err
			}
			l.Color, l.Dashes = color.Gray{Y: 150}, []vg.Length{vg.Points(3), vg.Points(3)}
			p.Add(l)
		}
		p.Y.Min = 0
		p.Legend.Top, p.Legend.Left = true, true
		rows = append(rows, []*plot.Plot{p})
	}
	c := vgsvg.New(9*vg.Inch, 11*vg.Inch)
	dc := draw.New(c)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadY: vg.Points(12), PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(6)}
	for j, cs := range plot.Align(rows, tiles, dc) {
		rows[j][0].Draw(cs[0])
	}
	var b bytes.Buffer
	if _, err := c.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
