package main

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stages"
)

// Counts is the counts phase as data: what each operation cost the
// bridges in requests, counted by the bridges themselves and by the
// servers that served them.
type Counts struct {
	Date     string     `json:"date"`
	Replicas int        `json:"replicas"`
	Shards   int        `json:"shards"`
	Rows     []CountRow `json:"rows"`
}

// CountRow is one operation (at a rate, for the changes): every request
// the bridges made from its first change until they were quiet again.
type CountRow struct {
	// Operation is create, update or delete (Changes Students, at Rate
	// per second), rest (nothing changing, for Seconds), handover (a
	// replica stops, the others take its shards) or rejoin (it starts
	// again and takes its share back).
	Operation string  `json:"operation"`
	Rate      int     `json:"rate,omitempty"`
	Changes   int     `json:"changes,omitempty"`
	Seconds   float64 `json:"seconds"`
	// JetStream is the bridges' student_bridge_jetstream_requests_total
	// by request; Stages how often each stage ran.
	JetStream map[string]float64 `json:"jetstream"`
	Stages    map[string]float64 `json:"stages"`
	// NATSSent is what the bridges counted sending to NATS; NATSServer
	// what the server counted receiving from their connections (connz).
	NATSSent   float64 `json:"natsSent"`
	NATSServer float64 `json:"natsServer"`
	// API is the bridges' student_bridge_api_requests_total by "verb
	// resource"; APIServer the API server's apiserver_request_total by
	// the same, less the benchmark's own requests (its creates, patches
	// and deletes of Students), for the resources the bridge uses.
	API       map[string]float64 `json:"api"`
	APIServer map[string]float64 `json:"apiServer"`
}

// countsShape is what the counts phase runs: the deployments' three
// replicas over 16 shards, as processes.
const countsReplicas, countsShards = 3, 16

// countsChanges is how many Students an operation changes at rate: ten
// seconds' worth at 1/s, three seconds' at higher rates.
func countsChanges(rate int) int {
	if rate < 10 {
		return 10 * rate
	}
	return 3 * rate
}

// counts runs the counts phase: three bridge processes over 16 shards as
// deployed; the requests at rest, then for each rate the creates, updates
// and deletes of countsChanges(rate) Students, and before the last rate's
// deletes, with its Students in place, a replica's handover and its
// rejoin.
func counts(ctx context.Context, e *env, rates []int, rest time.Duration) (Counts, error) {
	out := Counts{Date: time.Now().UTC().Format(time.DateOnly), Replicas: countsReplicas, Shards: countsShards}
	b, err := e.prepare()
	if err != nil {
		return out, err
	}
	r := &run{id: "counts", tr: newTracker()}
	r.ns, r.prefix, r.stream = "bench-counts", "benchcounts", "BENCHCOUNTS"
	if err := newNamespace(ctx, e, r.ns, true); err != nil {
		return out, err
	}
	args := append(processArgs(b, e, r, countsReplicas), "--nats-name", "bench-counts")
	defer func() { stopProcs(r.procs) }()
	for range countsReplicas {
		p, err := startProcess(b, args)
		if err != nil {
			return out, err
		}
		r.procs = append(r.procs, p)
	}
	if err := settled(ctx, e, r, countsReplicas, countsShards, 60*time.Second); err != nil {
		return out, err
	}
	c := &counter{e: e, r: r}
	if err := c.quiet(ctx); err != nil {
		return out, err
	}
	if rest > 0 {
		row, err := c.during(ctx, "rest", func() error { time.Sleep(rest); return nil })
		if err != nil {
			return out, err
		}
		out.Rows = append(out.Rows, row)
	}
	n := 0 // names the Students
	for i, rate := range rates {
		changes := countsChanges(rate)
		names := make([]string, changes)
		for i := range names {
			n++
			names[i] = fmt.Sprintf("s%d", n)
		}
		for _, op := range []string{"create", "update", "delete"} {
			if op == "delete" && i == len(rates)-1 {
				rows, err := handover(ctx, e, r, c, b, args)
				if err != nil {
					return out, err
				}
				out.Rows = append(out.Rows, rows...)
			}
			row, err := c.during(ctx, op, func() error { return changeAll(ctx, e.st.Client, r.ns, op, names, rate) })
			if err != nil {
				return out, fmt.Errorf("%s at %d/s: %w", op, rate, err)
			}
			row.Rate, row.Changes = rate, changes
			subtract(row.APIServer, map[string]string{"create": "create students", "update": "patch students", "delete": "delete students"}[op], changes)
			out.Rows = append(out.Rows, row)
		}
	}
	return out, nil
}

// handover stops the last of the run's bridge processes and counts what
// the others do to take its shards, then starts it again (with args) and
// counts what all do until it holds its share.
func handover(ctx context.Context, e *env, r *run, c *counter, b *binaries, args []string) ([]CountRow, error) {
	var out []CountRow
	leaving := r.procs[len(r.procs)-1]
	r.procs = r.procs[:len(r.procs)-1]
	row, err := c.during(ctx, "handover", func() error {
		stopProcs([]*proc{leaving})
		return settled(ctx, e, r, countsReplicas-1, countsShards, 60*time.Second)
	})
	if err != nil {
		return out, err
	}
	out = append(out, row)
	row, err = c.during(ctx, "rejoin", func() error {
		p, err := startProcess(b, args)
		if err != nil {
			return err
		}
		r.procs = append(r.procs, p)
		return settled(ctx, e, r, countsReplicas, countsShards, 60*time.Second)
	})
	return append(out, row), err
}

// changeAll creates, patches (a new school) or deletes the Students names at
// rate per second.
func changeAll(ctx context.Context, c client.Client, ns, op string, names []string, rate int) error {
	var errs []error
	pace(rate, time.Duration(len(names))*time.Second/time.Duration(rate), func(i int, _ time.Time) {
		if i >= len(names) {
			return
		}
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: names[i]}}
		var err error
		switch op {
		case "create":
			s.Spec = studentv1.StudentSpec{Name: names[i], School: "s1"}
			err = c.Create(ctx, s)
		case "update":
			err = c.Patch(ctx, s, client.RawPatch("application/merge-patch+json", []byte(`{"spec":{"school":"s2"}}`)))
		case "delete":
			err = c.Delete(ctx, s)
		}
		if err != nil {
			errs = append(errs, err)
		}
	})
	if len(errs) > 0 {
		return fmt.Errorf("%d of %d %ss failed, the first: %w", len(errs), len(names), op, errs[0])
	}
	return nil
}

// subtract takes the benchmark's own n requests of key off the API
// server's count.
func subtract(m map[string]float64, key string, n int) {
	if m[key] -= float64(n); m[key] == 0 {
		delete(m, key)
	}
}

// counter reads what the run's bridge processes and the servers counted.
type counter struct {
	e *env
	r *run
}

// reading is the counts at one moment.
type reading struct {
	at                   time.Time
	jetstream, stages    map[string]float64
	api, apiServer       map[string]float64
	natsSent, natsServer float64
}

// during counts the requests from before do until the bridges are quiet
// after it.
func (c *counter) during(ctx context.Context, op string, do func() error) (CountRow, error) {
	before, err := c.read(ctx)
	if err != nil {
		return CountRow{}, err
	}
	lists := leaseLists.Load()
	if err := do(); err != nil {
		return CountRow{}, err
	}
	if op != "rest" {
		if err := c.quiet(ctx); err != nil {
			return CountRow{}, err
		}
	}
	after, err := c.read(ctx)
	if err != nil {
		return CountRow{}, err
	}
	row := CountRow{
		Operation:  op,
		Seconds:    after.at.Sub(before.at).Seconds(),
		JetStream:  delta(after.jetstream, before.jetstream),
		Stages:     delta(after.stages, before.stages),
		NATSSent:   after.natsSent - before.natsSent,
		NATSServer: after.natsServer - before.natsServer,
		API:        delta(after.api, before.api),
		APIServer:  delta(after.apiServer, before.apiServer),
	}
	// The benchmark's own reads of the Leases, waiting for the shards to
	// settle.
	subtract(row.APIServer, "list leases", int(leaseLists.Load()-lists))
	return row, nil
}

// delta is after less before, without the keys that did not change.
func delta(after, before map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// quiet waits until the bridges made no request but their Leases' for 3
// s: the changes published, their status and Events written.
func (c *counter) quiet(ctx context.Context) error {
	deadline := time.Now().Add(3 * time.Minute)
	last, since := -1.0, time.Now()
	for time.Now().Before(deadline) {
		rd, err := c.readBridges()
		if err != nil {
			return err
		}
		sum := 0.0
		for _, m := range []map[string]float64{rd.jetstream, rd.api} {
			for k, v := range m {
				if !strings.HasSuffix(k, " leases") {
					sum += v
				}
			}
		}
		if sum != last {
			last, since = sum, time.Now()
		} else if time.Since(since) >= 3*time.Second {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("the bridges did not go quiet within 3 minutes")
}

// read gathers the counts of the bridges that run, of the API server and
// of the NATS server.
func (c *counter) read(ctx context.Context) (reading, error) {
	rd, err := c.readBridges()
	if err != nil {
		return rd, err
	}
	if rd.apiServer, err = apiServerRequests(ctx, c.e); err != nil {
		return rd, err
	}
	connz, err := c.e.st.NATS.Server.Connz(&natsserver.ConnzOptions{State: natsserver.ConnAll, Limit: 1 << 20})
	if err != nil {
		return rd, err
	}
	for _, ci := range connz.Conns {
		if ci.Name == "bench-counts" {
			rd.natsServer += float64(ci.InMsgs)
		}
	}
	return rd, nil
}

// readBridges gathers the counts of the bridges that run, from their
// /metrics; quiet polls only these.
func (c *counter) readBridges() (reading, error) {
	rd := reading{at: time.Now(), jetstream: map[string]float64{}, stages: map[string]float64{}, api: map[string]float64{}}
	for _, p := range c.r.procs {
		families, err := stages.Gather(p.metrics)
		if err != nil {
			return rd, err
		}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				l := labelMap(m)
				switch f.GetName() {
				case "student_bridge_jetstream_requests_total":
					rd.jetstream[l["request"]] += m.GetCounter().GetValue()
				case "student_bridge_api_requests_total":
					rd.api[l["verb"]+" "+l["resource"]] += m.GetCounter().GetValue()
				case "student_bridge_nats_messages_sent_total":
					rd.natsSent += m.GetCounter().GetValue()
				case stages.Metric:
					rd.stages[l["stage"]] += float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return rd, nil
}

func labelMap(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// apiVerbs are the API server's verbs (apiserver_request_total) as the
// bridge names them (student_bridge_api_requests_total).
var apiVerbs = map[string]string{"GET": "get", "LIST": "list", "WATCH": "watch", "POST": "create", "PUT": "update",
	"PATCH": "patch", "APPLY": "patch", "DELETE": "delete", "DELETECOLLECTION": "deletecollection"}

// bridgeResources are the resources the bridge reads or writes.
var bridgeResources = []string{"students", "students/status", "events", "leases"}

// apiServerRequests is the API server's count of the requests it served,
// of the resources the bridge uses, by "verb resource".
func apiServerRequests(ctx context.Context, e *env) (map[string]float64, error) {
	cs, err := kubernetes.NewForConfig(e.st.RestConfig)
	if err != nil {
		return nil, err
	}
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("the API server's metrics: %w", err)
	}
	out := map[string]float64{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		l := labelMap(m)
		resource := l["resource"]
		if l["subresource"] != "" {
			resource += "/" + l["subresource"]
		}
		if !slices.Contains(bridgeResources, resource) {
			continue
		}
		verb, ok := apiVerbs[l["verb"]]
		if !ok {
			verb = strings.ToLower(l["verb"])
		}
		out[verb+" "+resource] += m.GetCounter().GetValue()
	}
	return out, nil
}

// countsTable renders the counts phase: per change for the changes, per
// second at rest, in all for a handover and a rejoin; each count as the
// bridges made it, with the server's own where it differs.
func countsTable(c Counts) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Requests, %d bridge processes over %d shards as deployed (%s), counted by the bridges (`student_bridge_jetstream_requests_total`, `student_bridge_api_requests_total`) "+
		"and, in brackets where they differ, by the servers (NATS's connz, kube-apiserver's `apiserver_request_total`, less the benchmark's own requests); Leases are left out of the changes' rows:\n\n", c.Replicas, c.Shards, c.Date)
	b.WriteString("| operation | per | JetStream requests | NATS messages sent | API requests |\n| --- | --- | --- | --- | --- |\n")
	for _, row := range c.Rows {
		per, unit := 1.0, "in all"
		switch {
		case row.Changes > 0:
			per, unit = float64(row.Changes), fmt.Sprintf("change (%d at %d/s)", row.Changes, row.Rate)
		case row.Operation == "rest":
			per, unit = row.Seconds, fmt.Sprintf("second (%.0f s)", row.Seconds)
		}
		api, server := row.API, row.APIServer
		if row.Changes > 0 {
			api, server = withoutLeases(api), withoutLeases(server)
		}
		js := perKey(row.JetStream, nil, per)
		if w, rec := row.Stages[stages.WriteAhead], row.Stages[stages.Record]; w+rec > 0 {
			js += fmt.Sprintf(" (of the writes: write-ahead %s, record %s)", countOf(w/per), countOf(rec/per))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", row.Operation, unit, js,
			both(row.NATSSent/per, row.NATSServer/per), perKey(api, server, per))
	}
	return b.String()
}

func withoutLeases(m map[string]float64) map[string]float64 {
	out := maps.Clone(m)
	maps.DeleteFunc(out, func(k string, _ float64) bool { return strings.HasSuffix(k, " leases") })
	return out
}

// perKey lists m's counts divided by per, each with other's where that
// differs, for the keys of either, in their order.
func perKey(m, other map[string]float64, per float64) string {
	union := map[string]bool{}
	for k := range m {
		union[k] = true
	}
	for k := range other {
		union[k] = true
	}
	keys := slices.Sorted(maps.Keys(union))
	if len(keys) == 0 {
		return "0"
	}
	var parts []string
	for _, k := range keys {
		s := fmt.Sprintf("%s %s", k, countOf(m[k]/per))
		if other != nil && countOf(other[k]/per) != countOf(m[k]/per) {
			s += " (" + countOf(other[k]/per) + ")"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// both is a count with the server's in brackets where it differs.
func both(mine, server float64) string {
	if countOf(mine) == countOf(server) {
		return countOf(mine)
	}
	return countOf(mine) + " (" + countOf(server) + ")"
}

func countOf(x float64) string { return fmt.Sprintf("%.2f", x) }
