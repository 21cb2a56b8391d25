package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stages"
)

// change is one create, update or delete the generator scheduled.
type change struct {
	name      string
	op        string // created, updated, deleted
	gen       int64  // generation after the change (0 for deletes)
	scheduled time.Time
	doneAt    time.Time // when the API call returned
	err       error
}

// receipt is one event a variant delivered: name, operation and generation.
type receipt struct {
	name string
	op   string
	gen  int64
	id   string
	at   time.Time
}

// tracker records changes and receipts; result matches them. A receipt of
// a created or updated event with generation G satisfies every change of
// that Student up to G that was scheduled before it (the bridge coalesces);
// a deleted receipt satisfies the delete.
type tracker struct {
	mu       sync.Mutex
	changes  []*change
	receipts map[string][]receipt // by Student name, in arrival order
	received map[string]int       // id -> count, for duplicates
	events   int
}

func newTracker() *tracker {
	return &tracker{receipts: map[string][]receipt{}, received: map[string]int{}}
}

func (t *tracker) add(c *change) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.changes = append(t.changes, c)
}

func (t *tracker) receive(r receipt) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.events++
	if r.id != "" {
		t.received[r.id]++
	}
	t.receipts[r.name] = append(t.receipts[r.name], r)
}

// seen reports whether any receipt for name arrived.
func (t *tracker) seen(name string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.receipts[name]) > 0
}

// latency is when the first receipt that satisfies c arrived, after c was
// scheduled.
func (t *tracker) latency(c *change) (time.Duration, bool) {
	for _, r := range t.receipts[c.name] {
		if r.at.Before(c.scheduled) {
			continue
		}
		ok := false
		switch r.op {
		case "deleted":
			// Names are never reused: the delete is the Student's last
			// state, so it covers every change before it (a Student the
			// bridge first saw deleting is published as deleted only).
			ok = true
		case "created", "updated":
			ok = c.op != "deleted" && c.gen <= r.gen
		}
		if ok {
			return r.at.Sub(c.scheduled), true
		}
	}
	return 0, false
}

// result summarises one run of one variant at one rate.
type result struct {
	variant   string
	rate      int
	made      int
	failed    int // API calls that failed (e.g. the API server refused)
	covered   int
	lostFinal int // Students whose last change was never delivered
	// unobserved counts Students created and deleted before the variant
	// published anything for them: consistent for consumers, not a loss
	// (the bridge's finalizer is added by its first reconcile).
	unobserved int
	lostNames  []string
	duplicates int
	events     int
	p50, p99   time.Duration
	p999       time.Duration
	// apiP99 is the p99 of the changes' own API calls, from the change's
	// scheduled time to the call's return: the part of the latency that
	// is the API server's (and the generator's) before any watch sees it.
	apiP99        time.Duration
	behind        bool // the generator could not keep the rate
	studentWrites int64
	eventWrites   int64
	cpuSeconds    float64 // this process: generator, NATS, subscriber, the bridge
	ownCPU        float64 // the variant's own processes, if it runs as processes
	// natsSent and natsReceived: the messages its processes sent to NATS
	// and received from it.
	natsSent, natsReceived float64
	controlPlaneCPU        float64 // kube-apiserver and etcd
	// receiptToStatus: from a service applying a change to the Student
	// showing it (variants with services); applied counts the changes
	// the services applied.
	receiptToStatus []time.Duration
	applied         int64
	// stages is what the bridge's stage histograms observed in the run.
	stages map[string]stages.Histogram
	// drained is the changes covered per second, from the first change
	// scheduled to the last event that covered one: at a rate beyond the
	// variant's capacity, its capacity.
	drained float64
	// profiles are the bridge processes' (BENCH_PROFILE_DIR).
	profiles []Profile
}

func (t *tracker) result(variant string, rate int) result {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := result{variant: variant, rate: rate, events: t.events}
	var lats, apiCalls []time.Duration
	last := map[string]*change{}
	var first, end time.Time
	for _, c := range t.changes {
		if c.err != nil {
			r.failed++
			continue
		}
		r.made++
		if first.IsZero() || c.scheduled.Before(first) {
			first = c.scheduled
		}
		if l, ok := t.latency(c); ok {
			r.covered++
			lats = append(lats, l)
			apiCalls = append(apiCalls, c.doneAt.Sub(c.scheduled))
			if at := c.scheduled.Add(l); at.After(end) {
				end = at
			}
		}
		if prev := last[c.name]; prev == nil || prev.scheduled.Before(c.scheduled) {
			last[c.name] = c
		}
	}
	for _, c := range last {
		if _, ok := t.latency(c); !ok {
			if c.op == "deleted" && len(t.receipts[c.name]) == 0 {
				r.unobserved++
				continue
			}
			r.lostFinal++
			r.lostNames = append(r.lostNames, c.name)
			if os.Getenv("BENCH_DEBUG") != "" {
				fmt.Fprintf(os.Stderr, "lost final %s %s gen %d scheduled %s done %s; receipts:", c.name, c.op, c.gen, c.scheduled.Format("15:04:05.000"), c.doneAt.Format("15:04:05.000"))
				for _, rc := range t.receipts[c.name] {
					fmt.Fprintf(os.Stderr, " %s/%d@%s", rc.op, rc.gen, rc.at.Format("15:04:05.000"))
				}
				fmt.Fprintln(os.Stderr)
			}
		}
	}
	for _, n := range t.received {
		if n > 1 {
			r.duplicates += n - 1
		}
	}
	slices.Sort(lats)
	r.p50, r.p99, r.p999 = pct(lats, 0.50), pct(lats, 0.99), pct(lats, 0.999)
	slices.Sort(apiCalls)
	r.apiP99 = pct(apiCalls, 0.99)
	if d := end.Sub(first).Seconds(); d > 0 {
		r.drained = float64(r.covered) / d
	}
	return r
}

func pct(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s)-1) * p)
	return s[i]
}

// generate makes changes at rate per second for d, open loop: each change
// is scheduled at start+i/rate and handed to a pool of workers, so a slow
// API server shows up as latency, not as a lower rate.
func generate(ctx context.Context, c client.Client, ns string, rate int, d time.Duration, tr *tracker, seed uint64) (behind bool) {
	rng := rand.New(rand.NewPCG(seed, seed))
	jobs := make(chan *change, rate*int(d.Seconds()+1))
	var wg sync.WaitGroup
	var mu sync.Mutex
	alive := map[string]int64{} // name -> generation, Students that exist
	var names []string
	busy := map[string]bool{}
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ch := range jobs {
				apply(ctx, c, ns, ch)
				mu.Lock()
				delete(busy, ch.name)
				mu.Unlock()
				tr.add(ch)
			}
		}()
	}
	seq := 0
	behind = pace(rate, d, func(_ int, at time.Time) {
		mu.Lock()
		ch := &change{scheduled: at}
		p := rng.Float64()
		// Pick an existing, idle Student for updates and deletes.
		var pick string
		if len(names) > 0 && p >= 0.4 {
			for try := 0; try < 5; try++ {
				n := names[rng.IntN(len(names))]
				if !busy[n] {
					pick = n
					break
				}
			}
		}
		switch {
		case pick == "":
			seq++
			ch.name, ch.op, ch.gen = fmt.Sprintf("s-%d-%d", seed, seq), "created", 1
			names = append(names, ch.name)
			alive[ch.name] = 1
		case p < 0.8:
			alive[pick]++
			ch.name, ch.op, ch.gen = pick, "updated", alive[pick]
		default:
			ch.name, ch.op = pick, "deleted"
			delete(alive, pick)
			for k, n := range names {
				if n == pick {
					names = append(names[:k], names[k+1:]...)
					break
				}
			}
		}
		busy[ch.name] = true
		mu.Unlock()
		jobs <- ch
	})
	close(jobs)
	wg.Wait()
	return behind
}

// pace calls send for change i at start+i/rate, for d, open loop, and
// reports whether it fell more than 500ms behind its schedule.
func pace(rate int, d time.Duration, send func(i int, at time.Time)) (behind bool) {
	start := time.Now()
	for i := range int(float64(rate) * d.Seconds()) {
		at := start.Add(time.Duration(float64(i) / float64(rate) * float64(time.Second)))
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		} else if -w > 500*time.Millisecond {
			behind = true
		}
		send(i, at)
	}
	return behind
}

func apply(ctx context.Context, c client.Client, ns string, ch *change) {
	switch ch.op {
	case "created":
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ch.name}, Spec: studentv1.StudentSpec{Name: ch.name, School: "s1"}}
		ch.err = c.Create(ctx, s)
	case "updated":
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ch.name}}
		patch := []byte(fmt.Sprintf(`{"spec":{"school":"s%d"}}`, ch.gen))
		ch.err = c.Patch(ctx, s, client.RawPatch("application/merge-patch+json", patch))
		if ch.err == nil {
			ch.gen = s.Generation
		}
	case "deleted":
		ch.err = c.Delete(ctx, &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: ch.name}})
	}
	ch.doneAt = time.Now()
}
