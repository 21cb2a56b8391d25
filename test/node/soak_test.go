package node_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/soak"
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
	soakSettled    = flag.Duration("soak-settled", soak.Settled, "Time from the soak's start its trends are read from (at least half the soak is needed).")
	soakFaults     = flag.String("soak-faults", "", "Only the faults whose names match this regular expression (e.g. 'pod deleted|container killed'); empty: all.")
	soakOut        = flag.String("soak-out", "", "Results file (JSON) of the soak; empty: none.")
	soakProfiles   = flag.String("soak-profiles", "", "Directory for the bridge pods' heap profiles at -soak-settled and at the end (settled/, end/; compare with go tool pprof -diff_base); empty: none. It turns the pods' pprof endpoints on.")
)

// TestSoak runs the soak for -soak. At the end: every change seen in the
// stream, verify clean, the Mirror's state equal to the API server's, and
// no quantity of the bridge pods that grows (soak.Bounded): the total heap
// and RSS within 5 % of their level at soak.Settled by their slope,
// goroutines and descriptors too. (Per pod there is no trend to read: the
// faults replace pods.)
func TestSoak(t *testing.T) {
	needNode(t)
	if *soakFor <= 0 {
		t.Skip("the soak runs with make soak (-soak DURATION)")
	}
	s := defaultInstalled(t)
	if *soakProfiles != "" {
		servePprof(t)
	}
	nc := connectNATS(t, natsURL(t, "consumer", s.consumer))
	roster := connectNATS(t, natsURL(t, "roster", s.roster))
	res := soak.Results{Date: time.Now().UTC().Format(time.DateOnly), Commit: stack.RepoCommit(), Duration: soakFor.String(),
		Rate: *soakRate, Students: *soakStudents, FaultEvery: soakFaultEvery.String(), SampleEvery: soakSampleEach.String(), Settled: soakSettled.String()}

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
	faults := selectFaults(t, append(nodeFaults(s), storeFaults(s)...), *soakFaults)
	nextFault, nextSample := start.Add(*soakFaultEvery), start
	profiled := *soakProfiles == ""
	for i := 0; time.Since(start) < *soakFor; {
		if now := time.Now(); !now.Before(nextSample) {
			res.Samples = append(res.Samples, soakSample(t, nc, roster, l.ns, time.Since(start)))
			nextSample = nextSample.Add(*soakSampleEach)
			if !profiled && time.Since(start) >= *soakSettled {
				heapProfiles(t, filepath.Join(*soakProfiles, "settled"))
				profiled = true
			}
		}
		if now := time.Now(); !now.Before(nextFault) {
			f := faults[i%len(faults)]
			i++
			at := time.Since(start)
			f.do(t)()
			recovered := time.Since(start) - at // from the fault, not from the wait after it
			res.Faults = append(res.Faults, soak.Fault{Name: f.name, Minute: at.Minutes(), RecoveryS: recovered.Seconds()})
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
	if *soakProfiles != "" {
		heapProfiles(t, filepath.Join(*soakProfiles, "end"))
	}

	r := l.finish(t, 5*time.Minute)
	res.End = soak.End{Changes: r.changes, Rate: r.rate, LongestWaitS: r.longest.Seconds(), Gaps: m.Gaps(), RetriedWrites: r.retried}
	verifyClean(t, s)
	res.End.MirrorChecked, res.End.MirrorDiffer = checkMirror(t, m, l.ns)
	res.Limits = streamLimits(t, nc, roster)
	res.Slopes = soak.Slopes(res.Samples, *soakSettled)
	t.Logf("soak of %s: %d changes at %.0f/s (%d writes tried again), the longest wait %.1fs, %d faults, the Mirror agrees on %d Students, %d gaps",
		soakFor, r.changes, r.rate, r.retried, r.longest.Seconds(), len(res.Faults), res.End.MirrorChecked, res.End.Gaps)
	for _, g := range res.Slopes {
		t.Logf("  %-36s at %s %.0f, at the end %.0f, %+.1f an hour", g.Quantity, soakSettled, g.Settled, g.End, g.PerHour)
	}
	if *soakFor >= 2**soakSettled { // else too short to read a trend
		for _, g := range soak.Overgrown(res.Slopes, *soakFor, *soakSettled) {
			if g.Settled == 0 {
				continue // nothing at the settle time to grow from
			}
			t.Errorf("%s grew %+.1f %% (%+.1f an hour) from %.0f at %s: more than %.0f %%",
				g.Quantity, 100*g.Grown(*soakFor, *soakSettled), g.PerHour, g.Settled, soakSettled, 100*soak.MaxGrowth)
		}
	}
	res.Passed = !t.Failed()
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
}

// pprofPort is the port servePprof has the bridge pods serve pprof on.
const pprofPort = "6060"

// servePprof turns the bridge pods' pprof endpoints on (through the
// environment, which a rollout gives new pods) and waits for the pods.
func servePprof(t *testing.T) {
	t.Helper()
	var uids []types.UID
	for _, p := range podsOf(t, "student-bridge") {
		uids = append(uids, p.UID)
	}
	kubectl(t, nil, "-n", systemNS, "set", "env", "deployment/student-bridge", "STUDENT_BRIDGE_PPROFADDR=:"+pprofPort)
	waitPods(t, "student-bridge", 3, without(uids...))
}

// heapProfiles saves each Ready bridge pod's heap profile in dir. The
// pods differ between two calls (faults replace them): compare the sums,
// go tool pprof -diff_base 'settled/*' 'end/*'.
func heapProfiles(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range podsOf(t, "student-bridge") {
		if !podReady(&p) {
			continue
		}
		if err := saveHeapProfile(p.Status.PodIP, filepath.Join(dir, p.Name+".pb.gz")); err != nil {
			t.Logf("the heap profile of %s: %v", p.Name, err) // a pod a fault is replacing
		}
	}
}

// saveHeapProfile writes the heap profile a pod at ip serves to file.
func saveHeapProfile(ip, file string) error {
	resp, err := http.Get("http://" + net.JoinHostPort(ip, pprofPort) + "/debug/pprof/heap")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s", resp.Status)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o644)
}

// selectFaults keeps the faults whose names match the regular expression
// expr (all of them when it is empty).
func selectFaults(t *testing.T, faults []fault, expr string) []fault {
	t.Helper()
	re, err := regexp.Compile(expr)
	if err != nil {
		t.Fatalf("-soak-faults: %v", err)
	}
	var out []fault
	for _, f := range faults {
		if re.MatchString(f.name) {
			out = append(out, f)
		}
	}
	if len(out) == 0 {
		t.Fatalf("-soak-faults %q matches no fault", expr)
	}
	return out
}

// soakStreams are the streams the soak samples, each with the connection
// (user) allowed to read it.
func soakStreams(nc, roster *nats.Conn) []struct {
	conn *nats.Conn
	name string
} {
	return []struct {
		conn *nats.Conn
		name string
	}{{nc, "STUDENTS"}, {nc, recordStream}, {roster, "KV_STUDENT_BRIDGE_RECEIPTS"}}
}

// streamLimits reads the configured limits of the streams the soak samples.
func streamLimits(t *testing.T, nc, roster *nats.Conn) map[string]soak.Limits {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := map[string]soak.Limits{}
	for _, st := range soakStreams(nc, roster) {
		js, err := jetstream.New(st.conn)
		if err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(ctx, st.name)
		if err != nil {
			t.Fatalf("stream %s: %v", st.name, err)
		}
		c := s.CachedInfo().Config
		out[st.name] = soak.Limits{MaxAge: c.MaxAge.String(), MaxBytes: c.MaxBytes, MaxMsgs: c.MaxMsgs}
	}
	return out
}

// soakSample samples the deployment; ns is the load's namespace.
func soakSample(t *testing.T, nc, roster *nats.Conn, ns string, at time.Duration) soak.Sample {
	t.Helper()
	sm := soak.Sample{Minute: at.Minutes(), Pods: map[string]map[string]float64{}, Totals: map[string]float64{}}
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
	for _, st := range soakStreams(nc, roster) {
		js, err := jetstream.New(st.conn)
		if err != nil {
			continue
		}
		if s, err := js.Stream(ctx, st.name); err == nil {
			info := s.CachedInfo()
			sm.Totals[st.name+" messages"], sm.Totals[st.name+" bytes"] = float64(info.State.Msgs), float64(info.State.Bytes)
		}
	}
	// Counted, not read: an hour's Events are many.
	var events eventsv1.EventList
	if err := nd.c.List(ctx, &events, client.InNamespace(ns), client.Limit(1)); err == nil {
		n := int64(len(events.Items))
		if events.RemainingItemCount != nil {
			n += *events.RemainingItemCount
		}
		sm.Totals["Kubernetes Events"] = float64(n)
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
// returns the number of Students compared, and of those that differ.
func checkMirror(t *testing.T, m *consumer.Mirror, ns string) (checked, differ int) {
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
	return len(want), len(wrong)
}
