package main

import (
	"strings"
	"testing"
)

// TestParseGoBench: every value and unit of each run's line is kept, the
// lines of other benchmarks and go test's own are not.
func TestParseGoBench(t *testing.T) {
	out := `goos: linux
BenchmarkOneChange-2   	    2000	    402486 ns/op	         5.721 ctxsw/op	    130056 publish-ns/op	   42233 B/op	     259 allocs/op
BenchmarkOneChangeOther-2   	    10	    1 ns/op
BenchmarkOneChange-2   	    2100	    398000 ns/op	         5.5 ctxsw/op	    129000 publish-ns/op	   42100 B/op	     258 allocs/op
PASS
`
	g := GoBench{Name: "BenchmarkOneChange", Units: map[string][]float64{}}
	if err := parseGoBench(out, &g); err != nil {
		t.Fatal(err)
	}
	if got := g.Units["ns/op"]; len(got) != 2 || got[0] != 402486 || got[1] != 398000 {
		t.Errorf("ns/op %v", got)
	}
	if got := g.Units["allocs/op"]; len(got) != 2 || got[1] != 258 {
		t.Errorf("allocs/op %v", got)
	}
	table := goBenchTable(g)
	for _, want := range []string{"| ns/op | 402486 (398000-402486) |", "| ctxsw/op | 5.72 (5.5-5.72) |", "| allocs/op | 259 (258-259) |", "| publish-ns/op |"} {
		if !strings.Contains(table, want) {
			t.Errorf("the table lacks %q:\n%s", want, table)
		}
	}
	if err := parseGoBench("PASS\n", &GoBench{Name: "BenchmarkOneChange", Units: map[string][]float64{}}); err == nil {
		t.Error("no result line parsed without an error")
	}
}
