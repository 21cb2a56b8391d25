package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	pprofile "github.com/google/pprof/profile"
)

// Profile is what a bridge process spent its CPU and its allocations on
// during the middle half of a repetition (BENCH_PROFILE_DIR): the CPU
// profile's and the allocation profile's samples, each counted for one
// category (categories), per change the process published.
type Profile struct {
	// Process is the process's index in the variant (a bridge or an
	// informer); Seconds how long both profiles ran.
	Process int     `json:"process"`
	Seconds float64 `json:"seconds"`
	// CPUSeconds and Allocs are the profiles' totals: CPU time sampled,
	// objects allocated (sampled, scaled to the estimate pprof shows).
	CPUSeconds float64 `json:"cpuSeconds"`
	Allocs     int64   `json:"allocs"`
	// Categories, in the order of categories.
	Categories []ProfileShare `json:"categories"`
}

// ProfileShare is one category's part of a profile.
type ProfileShare struct {
	Name       string  `json:"name"`
	CPUSeconds float64 `json:"cpuSeconds"`
	Allocs     int64   `json:"allocs"`
}

// categories say what a sample's stack is spent on: a sample counts for
// the first category one of whose prefixes begins one of its frames'
// function names, so the work a change is for (its event, its NATS
// writes, its API server writes) comes before what it passes through (the
// reconcile, the informer, HTTP/2). Garbage collection comes first: its
// workers and assists are the collector's work whoever started them.
var categories = []struct {
	name, help string
	prefixes   []string
}{
	{"garbage collection", "the collector's workers, its assists and sweeping",
		[]string{"runtime.gcBgMarkWorker", "runtime.gcAssistAlloc", "runtime.gcDrain", "runtime.bgsweep", "runtime.bgscavenge", "runtime.sweepone", "runtime.markroot", "runtime.scanobject", "runtime.gcStart", "runtime.gcMarkDone"}},
	{"event built and encoded", "the CloudEvent of a change: its attributes, validation and JSON",
		[]string{"github.com/student-bridge/student-bridge/api/contract.", "github.com/cloudevents/sdk-go/"}},
	{"NATS: reservation, publish, record", "the writes to JetStream and their acks, the records, the NATS connection's reads and writes",
		[]string{"github.com/student-bridge/student-bridge/internal/natssink.", "github.com/student-bridge/student-bridge/internal/records.", "github.com/nats-io/"}},
	{"API server writes: finalizer, status, Events", "the requests the bridge makes of the API server",
		// controller-runtime's client by its writes: its Get and List
		// read the cache (below).
		[]string{"sigs.k8s.io/controller-runtime/pkg/client.(*client).Create", "sigs.k8s.io/controller-runtime/pkg/client.(*client).Update",
			"sigs.k8s.io/controller-runtime/pkg/client.(*client).Patch", "sigs.k8s.io/controller-runtime/pkg/client.(*client).Delete",
			"sigs.k8s.io/controller-runtime/pkg/client.(*client).Apply", "sigs.k8s.io/controller-runtime/pkg/client.(*typedClient).",
			"sigs.k8s.io/controller-runtime/pkg/client.(*unstructuredClient).", "sigs.k8s.io/controller-runtime/pkg/client.(*metadataClient).",
			"sigs.k8s.io/controller-runtime/pkg/client.(*subResourceClient).", "sigs.k8s.io/controller-runtime/pkg/client.createMergePatch",
			"sigs.k8s.io/controller-runtime/pkg/client.(*mergeFromPatch).", "k8s.io/client-go/rest.(*Request)", "github.com/student-bridge/student-bridge/internal/statusview.", "github.com/student-bridge/student-bridge/internal/kubeevents.", "k8s.io/client-go/tools/record.", "k8s.io/client-go/tools/events."}},
	{"watch events decoded, cache", "the informer: the watch's stream decoded into Students, the cache, its handlers and the reconcile's reads of it",
		[]string{"sigs.k8s.io/controller-runtime/pkg/client.(*client).Get", "sigs.k8s.io/controller-runtime/pkg/client.(*client).List", "k8s.io/client-go/tools/cache.", "k8s.io/apimachinery/pkg/watch.", "k8s.io/client-go/rest/watch.", "k8s.io/apimachinery/pkg/runtime/serializer", "github.com/student-bridge/student-bridge/internal/watchjson.", "sigs.k8s.io/controller-runtime/pkg/cache.", "sigs.k8s.io/controller-runtime/pkg/internal/source."}},
	{"HTTP/2 and TLS", "the API server connection, shared by the watch and the writes",
		[]string{"golang.org/x/net/http2.", "net/http.", "crypto/"}},
	{"metrics and traces", "Prometheus collectors and OpenTelemetry spans",
		[]string{"github.com/prometheus/", "go.opentelemetry.io/"}},
	{"reconcile and queue", "the rest of a reconcile and the work queue",
		[]string{"github.com/student-bridge/student-bridge/reconciler.", "github.com/student-bridge/student-bridge/internal/queue.", "sigs.k8s.io/controller-runtime/pkg/internal/controller.", "k8s.io/client-go/util/workqueue."}},
	{"scheduler, wake-ups and syscalls", "goroutines parked and woken, timers, the network poller, system calls",
		[]string{"runtime.", "syscall.", "internal/poll.", "internal/runtime/", "time."}},
}

// otherCategory is what no category claims.
const otherCategory = "other"

// category names the category of a stack of function names, innermost
// first (as pprof gives them).
func category(frames []string) string {
	for _, c := range categories {
		for _, f := range frames {
			for _, p := range c.prefixes {
				if strings.HasPrefix(f, p) {
					return c.name
				}
			}
		}
	}
	return otherCategory
}

// frames are the function names of a sample, innermost first.
func frames(s *pprofile.Sample) []string {
	var names []string
	for _, loc := range s.Location {
		for _, line := range loc.Line {
			if line.Function != nil {
				names = append(names, line.Function.Name)
			}
		}
	}
	return names
}

// summarise adds the samples of the CPU profile and the allocation
// profile of one process (files written by saveProfile) into a Profile.
func summarise(process int, seconds float64, cpuFile, allocsFile string) (Profile, error) {
	sum := Profile{Process: process, Seconds: seconds}
	cpu := map[string]float64{}
	allocs := map[string]int64{}
	if err := eachSample(cpuFile, "cpu", func(frames []string, v int64) {
		sec := float64(v) / 1e9
		cpu[category(frames)] += sec
		sum.CPUSeconds += sec
	}); err != nil {
		return Profile{}, err
	}
	if err := eachSample(allocsFile, "alloc_objects", func(frames []string, v int64) {
		allocs[category(frames)] += v
		sum.Allocs += v
	}); err != nil {
		return Profile{}, err
	}
	for _, name := range categoryNames() {
		sum.Categories = append(sum.Categories, ProfileShare{Name: name, CPUSeconds: cpu[name], Allocs: allocs[name]})
	}
	return sum, nil
}

func categoryNames() []string {
	var names []string
	for _, c := range categories {
		names = append(names, c.name)
	}
	return append(names, otherCategory)
}

// eachSample calls do with the frames and the value of the sample type
// named typ of every sample in the profile file.
func eachSample(file, typ string, do func(frames []string, v int64)) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := pprofile.Parse(f)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	i := slices.IndexFunc(p.SampleType, func(t *pprofile.ValueType) bool { return t.Type == typ })
	if i < 0 {
		return fmt.Errorf("%s: no %s samples", file, typ)
	}
	for _, s := range p.Sample {
		do(frames(s), s.Value[i])
	}
	return nil
}

// profileTable shows, for each cell of a variant with profiles, where its
// processes' CPU and allocations went: each category's share, and per
// change (the repetitions' profiles added up, over the changes made while
// they ran: the repetition's, in proportion to the time profiled).
func profileTable(res Results) (string, error) {
	type cell struct {
		name    string
		rate    int
		sum     Profile
		changes float64
	}
	duration, err := time.ParseDuration(res.Duration)
	if err != nil || duration <= 0 {
		return "", fmt.Errorf("the run's duration %q: %v", res.Duration, err)
	}
	var cells []cell
	for _, c := range res.Cells {
		var sum Profile
		changes := 0.0
		for _, rep := range c.Reps {
			for _, p := range rep.Profiles {
				if sum.Categories == nil {
					sum.Categories = make([]ProfileShare, len(p.Categories))
				}
				sum.CPUSeconds += p.CPUSeconds
				sum.Allocs += p.Allocs
				for i, s := range p.Categories {
					sum.Categories[i].Name = s.Name
					sum.Categories[i].CPUSeconds += s.CPUSeconds
					sum.Categories[i].Allocs += s.Allocs
				}
			}
			if len(rep.Profiles) > 0 { // the processes ran at the same time
				changes += float64(rep.Made) * rep.Profiles[0].Seconds / duration.Seconds()
			}
		}
		if sum.Categories != nil && changes > 0 {
			cells = append(cells, cell{c.Variant, c.Rate, sum, changes})
		}
	}
	if len(cells) == 0 {
		return "", fmt.Errorf("no profiles in this run (BENCH_PROFILE_DIR)")
	}
	var b strings.Builder
	b.WriteString("| category |")
	for _, c := range cells {
		fmt.Fprintf(&b, " %s at %d/s: CPU | allocs |", c.name, c.rate)
	}
	b.WriteString("\n| --- |")
	for range cells {
		b.WriteString(" ---: | ---: |")
	}
	b.WriteString("\n")
	for i, name := range categoryNames() {
		fmt.Fprintf(&b, "| %s |", name)
		for _, c := range cells {
			s := c.sum.Categories[i]
			fmt.Fprintf(&b, " %.0f %% (%.0f µs) | %.0f %% (%.0f) |", 100*s.CPUSeconds/c.sum.CPUSeconds, 1e6*s.CPUSeconds/c.changes,
				100*float64(s.Allocs)/float64(c.sum.Allocs), float64(s.Allocs)/c.changes)
		}
		b.WriteString("\n")
	}
	b.WriteString("| **per change** |")
	for _, c := range cells {
		fmt.Fprintf(&b, " **%.0f µs** | **%.0f** |", 1e6*c.sum.CPUSeconds/c.changes, float64(c.sum.Allocs)/c.changes)
	}
	b.WriteString("\n\nWhat each category holds:\n\n")
	for _, c := range categories {
		fmt.Fprintf(&b, "- **%s**: %s.\n", c.name, c.help)
	}
	return b.String(), nil
}
