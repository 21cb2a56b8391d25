package node_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// The soak (make soak): deploy/default on the node for hours, under a
// steady load, with a fault of the node tier's on a schedule and a service
// (consumer.Mirror, as roster) writing receipts throughout. Off unless
// -soak gives its length.
var (
	soakFor        = flag.Duration("soak", 0, "Run TestSoak for this long (make soak); 0 skips it.")
	soakRate       = flag.Int("soak-rate", 50, "Changes a second the soak's load makes.")
	soakStudents   = flag.Int("soak-students", 5000, "Students the soak's load keeps around.")
	soakFaultEvery = flag.Duration("soak-fault-every", 5*time.Minute, "Time between the soak's faults, which cycle through the node tier's.")
	soakSampleEach = flag.Duration("soak-sample", 30*time.Second, "Time between the soak's samples.")
	soakOut        = flag.String("soak-out", "", "Results file (JSON) of the soak; empty: none.")
)

// soakSettled is when the soak's quantities are compared from: the load
// has filled the Students up to its level and the caches are warm.
const soakSettled = 10 * time.Minute

// SoakResults is what a soak leaves: its settings, a sample every
// -soak-sample, each fault and how long the deployment took to be Ready
// again, and what the end's checks found.
type SoakResults struct {
	Date     string       `json:"date"`
	Commit   string       `json:"commit"`
	Duration string       `json:"duration"`
	Rate     int          `json:"rate"`
	Students int          `json:"students"`
	Samples  []SoakSample `json:"samples"`
	Faults   []SoakFault  `json:"faults"`
	End      SoakEnd      `json:"end"`
	Slopes   []SoakGrowth `json:"slopes"`
}

// SoakSample is the deployment at one moment: each quantity by pod (bridge
// pods' memory, heap, goroutines, descriptors and shards; NATS pods'
// memory, connections and subscriptions) and the stream's, buckets' and
// Events' sizes.
type SoakSample struct {
	Minute float64                       `json:"minute"`
	Pods   map[string]map[string]float64 `json:"pods"`
	Totals map[string]float64            `json:"totals"`
}

// SoakFault is one fault: when, and how long from it until Ready again.
type SoakFault struct {
	Name      string  `json:"name"`
	Minute    float64 `json:"minute"`
	RecoveryS float64 `json:"recoverySeconds"`
}

// SoakEnd is what the end's checks found.
type SoakEnd struct {
	Changes       int     `json:"changes"`
	Rate          float64 `json:"rate"`
	LongestWaitS  float64 `json:"longestWaitSeconds"`
	MirrorChecked int     `json:"mirrorStudents"`
	Gaps          int64   `json:"gaps"`
}

// SoakGrowth is one quantity's level at soakSettled, at the end, and its
// slope between (least squares, per hour).
type SoakGrowth struct {
	Quantity string  `json:"quantity"`
	Settled  float64 `json:"settled"`
	End      float64 `json:"end"`
	PerHour  float64 `json:"perHour"`
}

// TestSoak runs the soak for -soak. At the end: every change seen in the
// stream, verify clean, the Mirror's state equal to the API server's, and
// no quantity of the bridge pods that grows: the total heap and RSS within
// 5 % of their level at soakSettled by their slope, goroutines and
// descriptors too. (Per pod there is no trend to read: the faults replace
// pods.)
func TestSoak(t *testing.T) {
	needNode(t)
	if *soakFor <= 0 {
		t.Skip("the soak runs with make soak (-soak DURATION)")
	}
	s := defaultInstalled(t)
	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	roster := connectNATS(t, natsURL(t, "roster", s.roster))
	res := SoakResults{Date: time.Now().UTC().Format(time.DateOnly), Commit: stack.RepoCommit(), Duration: soakFor.String(), Rate: *soakRate, Students: *soakStudents}

	l := startLoad(t, nc, *soakRate, false, func(l *load) { l.level = *soakStudents })
	m, err := consumer.NewMirror(roster, consumer.MirrorOptions{Service: "roster", Stream: "STUDENTS", Subjects: "student.>",
		ReceiptsBucket: "STUDENT_BRIDGE_RECEIPTS", SnapshotSubject: consumer.NoSnapshots,
		Handler: func(context.Context, consumer.Change) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stopMirror := context.WithCancel(context.Background())
	mirrorDone := make(chan error, 1)
	go func() { mirrorDone <- m.Run(ctx) }()
	defer func() {
		stopMirror()
		if err := <-mirrorDone; err != nil {
			t.Errorf("the Mirror: %v", err)
		}
	}()

	start := time.Now()
	faults := nodeFaults(s)
	nextFault, nextSample := start.Add(*soakFaultEvery), start
	for i := 0; time.Since(start) < *soakFor; {
		if now := time.Now(); !now.Before(nextSample) {
			res.Samples = append(res.Samples, soakSample(t, nc, roster, l.ns, time.Since(start)))
			nextSample = nextSample.Add(*soakSampleEach)
		}
		if now := time.Now(); !now.Before(nextFault) {
			f := faults[i%len(faults)]
			i++
			at := time.Since(start)
			f.do(t)()
			recovered := time.Since(start) - at // from the fault, not from the wait after it
			res.Faults = append(res.Faults, SoakFault{Name: f.name, Minute: at.Minutes(), RecoveryS: recovered.Seconds()})
			t.Logf("%s at %.1f min: Ready again in %.1fs", f.name, at.Minutes(), recovered.Seconds())
			nextFault = time.Now().Add(*soakFaultEvery)
		}
		next := nextSample
		if nextFault.Before(next) {
			next = nextFault
		}
		time.Sleep(time.Until(next)) // the schedule's next step
	}
	res.Samples = append(res.Samples, soakSample(t, nc, roster, l.ns, time.Since(start)))

	r := l.finish(t, 5*time.Minute)
	res.End = SoakEnd{Changes: r.changes, Rate: r.rate, LongestWaitS: r.longest.Seconds(), Gaps: m.Gaps()}
	verifyClean(t, s)
	res.End.MirrorChecked = checkMirror(t, m, l.ns)
	res.Slopes = soakSlopes(res.Samples)
	if *soakOut != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(*soakOut), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(*soakOut, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("soak of %s: %d changes at %.0f/s, the longest wait %.1fs, %d faults, the Mirror agrees on %d Students, %d gaps",
		soakFor, r.changes, r.rate, r.longest.Seconds(), len(res.Faults), res.End.MirrorChecked, res.End.Gaps)
	for _, g := range res.Slopes {
		t.Logf("  %-28s at %s %.0f, at the end %.0f, %+.1f an hour", g.Quantity, soakSettled, g.Settled, g.End, g.PerHour)
		if *soakFor < 2*soakSettled || g.Settled == 0 {
			continue // too short to read a trend
		}
		left := (*soakFor - soakSettled).Hours()
		if grows := g.PerHour * left; grows > 0.05*g.Settled && slices.Contains(boundedQuantities, g.Quantity) {
			t.Errorf("%s grew %.0f (%+.1f an hour) from %.0f at %s: more than 5%%", g.Quantity, grows, g.PerHour, g.Settled, soakSettled)
		}
	}
}

// boundedQuantities are the totals that must not grow once the soak
// settled.
var boundedQuantities = []string{"bridge heap bytes", "bridge RSS bytes", "bridge goroutines", "bridge open fds", "NATS subscriptions"}

// soakSample samples the deployment; ns is the load's namespace.
func soakSample(t *testing.T, nc, roster *nats.Conn, ns string, at time.Duration) SoakSample {
	t.Helper()
	sm := SoakSample{Minute: at.Minutes(), Pods: map[string]map[string]float64{}, Totals: map[string]float64{}}
	for _, p := range podsOf(t, "student-bridge") {
		if !podReady(&p) {
			continue
		}
		q := map[string]float64{}
		if _, rss, err := cgroupMemory(&p, strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")); err == nil {
			q["RSS bytes"] = float64(rss)
		}
		if b, err := podMetrics(&p); err == nil {
			for series, name := range map[string]string{"go_memstats_heap_inuse_bytes": "heap bytes", "go_goroutines": "goroutines",
				"process_open_fds": "open fds", "student_bridge_shards_held": "shards"} {
				if v, ok := seriesValue(b, series); ok {
					q[name] = v
				}
			}
		}
		sm.Pods[p.Name] = q
		for name, v := range q {
			sm.Totals["bridge "+name] += v
		}
	}
	for _, p := range podsOf(t, "nats") {
		q := map[string]float64{}
		if _, rss, err := cgroupMemory(&p, strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")); err == nil {
			q["RSS bytes"] = float64(rss)
		}
		if v, err := natsVarz(&p); err == nil {
			q["connections"], q["subscriptions"] = v.Connections, v.Subscriptions
		}
		sm.Pods[p.Name] = q
		for name, v := range q {
			sm.Totals["NATS "+name] += v
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, st := range []struct {
		conn *nats.Conn
		name string
	}{{nc, "STUDENTS"}, {nc, "KV_STUDENT_BRIDGE_PUBLISHED"}, {roster, "KV_STUDENT_BRIDGE_RECEIPTS"}} {
		js, err := jetstream.New(st.conn)
		if err != nil {
			continue
		}
		if s, err := js.Stream(ctx, st.name); err == nil {
			info := s.CachedInfo()
			sm.Totals[st.name+" messages"], sm.Totals[st.name+" bytes"] = float64(info.State.Msgs), float64(info.State.Bytes)
		}
	}
	var events eventsv1.EventList
	if err := nd.c.List(ctx, &events, client.InNamespace(ns)); err == nil {
		sm.Totals["Kubernetes Events"] = float64(len(events.Items))
	}
	return sm
}

// seriesValue is the value of series (name{labels} as exposed) in a
// metrics page.
func seriesValue(page, series string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}

// varz is what the soak reads of a NATS server's /varz.
type varz struct {
	Connections   float64 `json:"connections"`
	Subscriptions float64 `json:"subscriptions"`
}

func natsVarz(p *corev1.Pod) (varz, error) {
	var v varz
	resp, err := http.Get("http://" + p.Status.PodIP + ":8222/varz")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	return v, json.NewDecoder(resp.Body).Decode(&v)
}

// checkMirror fails t unless the Mirror's state of ns is the API server's:
// every Student there at its generation and spec, none that is gone. It
// returns the number of Students compared.
func checkMirror(t *testing.T, m *consumer.Mirror, ns string) int {
	t.Helper()
	var students studentv1.StudentList
	if err := nd.c.List(context.Background(), &students, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	want := map[string]studentv1.Student{}
	for _, s := range students.Items {
		if s.DeletionTimestamp == nil {
			want[string(s.UID)] = s
		}
	}
	var wrong []string
	err := stacktest.Eventually(2*time.Minute, func() error {
		wrong = wrong[:0]
		got := map[string]consumer.Desired{}
		for _, d := range m.State() {
			if d.Namespace == ns {
				got[d.UID] = d
			}
		}
		for uid, s := range want {
			if d, ok := got[uid]; !ok || d.Generation != s.Generation || d.Spec != s.Spec {
				wrong = append(wrong, fmt.Sprintf("%s: the Mirror has %+v, the API server generation %d %+v", s.Name, d, s.Generation, s.Spec))
			}
		}
		for uid, d := range got {
			if _, ok := want[uid]; !ok {
				wrong = append(wrong, fmt.Sprintf("%s: deleted, the Mirror still has it", d.Name))
			}
		}
		if len(wrong) > 0 {
			return fmt.Errorf("%d Students differ, e.g. %v", len(wrong), wrong[:min(3, len(wrong))])
		}
		return nil
	})
	if err != nil {
		t.Error(err)
	}
	return len(want)
}

// soakSlopes reads, for each total, its level at soakSettled, at the end,
// and its least-squares slope between.
func soakSlopes(samples []SoakSample) []SoakGrowth {
	names := map[string]bool{}
	for _, s := range samples {
		for n := range s.Totals {
			names[n] = true
		}
	}
	var out []SoakGrowth
	for _, n := range slices.Sorted(maps.Keys(names)) {
		var xs, ys []float64
		for _, s := range samples {
			if v, ok := s.Totals[n]; ok && s.Minute >= soakSettled.Minutes() {
				xs, ys = append(xs, s.Minute/60), append(ys, v)
			}
		}
		if len(xs) < 2 {
			continue
		}
		out = append(out, SoakGrowth{Quantity: n, Settled: ys[0], End: ys[len(ys)-1], PerHour: slope(xs, ys)})
	}
	return out
}

func slope(xs, ys []float64) float64 {
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(ys))
	var num, den float64
	for i := range xs {
		num += (xs[i] - mx) * (ys[i] - my)
		den += (xs[i] - mx) * (xs[i] - mx)
	}
	if den == 0 {
		return 0
	}
	return num / den
}
