package node_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// load changes Students from outside the cluster (the API server's
// client, as any user's) at a steady rate, and times each change until a
// reader of the cluster's stream saw an event carrying it.
type load struct {
	ns   string
	rate int
	// level is the number of Students the load keeps around: below it a
	// change is a create (40 unless set).
	level int
	// c writes the changes, without a client-side rate limit: the API
	// server, not the test's client, bounds the load, as with many users.
	c client.Client

	mu     sync.Mutex
	writes map[string][]write // by Student name
	seen   map[string][]seen  // by Student name
	live   []string
	next   int
	errs   []error
	// invalid are the load's events that break the contract.
	invalid []error
	// acrossUpgrade: the previous release publishes some of the events.
	acrossUpgrade bool
	// skipped counts the changes due while every one was in flight.
	skipped int
	// made counts the changes made.
	made int
	// retried counts the writes tried again after a timeout.
	retried int
	// slowestWrite is the longest a change's requests took to return: the
	// API server's delay, which the bridge's own requests (its Lease
	// renewals and takeovers among them) meet too.
	slowestWrite time.Duration

	stop, done chan struct{}
	started    time.Time
	sub        jetstream.ConsumeContext
}

// testNamespaces are the namespaces tests made Students in, removed with
// the bridge's installation.
var testNamespaces []string

// write is one change the load made: a create or update (its generation)
// or a delete (generation 0).
type write struct {
	gen int64
	at  time.Time
}

// seen is one event the reader received.
type seen struct {
	gen     int64
	deleted bool
	at      time.Time
}

// startLoad starts rate changes a second in a new namespace and a reader
// of the stream through nc. acrossUpgrade: the previous release publishes
// some of the events, without dataschema.
func startLoad(t *testing.T, nc *nats.Conn, rate int, acrossUpgrade bool, opts ...func(*load)) *load {
	t.Helper()
	l := &load{c: unthrottledClient(t), rate: rate, level: 40, acrossUpgrade: acrossUpgrade, writes: map[string][]write{}, seen: map[string][]seen{}, stop: make(chan struct{}), done: make(chan struct{})}
	for _, o := range opts {
		o(l)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "load-"}}
	if err := nd.c.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	l.ns = ns.Name
	testNamespaces = append(testNamespaces, ns.Name)
	// The CRD may be moments old (helm install): until the API server's
	// admission (the finalizer policy) knows the kind, creates fail with
	// 503. Wait for a dry-run create to pass it.
	if err := stacktest.Eventually(time.Minute, func() error {
		probe := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: "probe"}, Spec: studentv1.StudentSpec{Name: "probe", School: "probe"}}
		return nd.c.Create(context.Background(), probe, client.DryRunAll)
	}); err != nil {
		t.Fatal(err)
	}
	// The stream, read as a service reads it (an ordered consumer from
	// now on): a core subscription would miss what is published while its
	// connection moves off a NATS pod the fault removed.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, "STUDENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"student.*"}, DeliverPolicy: jetstream.DeliverNewPolicy})
	if err != nil {
		t.Fatal(err)
	}
	l.sub, err = cons.Consume(func(msg jetstream.Msg) {
		at := time.Now()
		decode := stacktest.Decode
		if l.acrossUpgrade {
			decode = stacktest.DecodeAcrossUpgrade
		}
		r, err := decode(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
		if r.Data.Metadata.Namespace != l.ns {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		if err != nil {
			l.invalid = append(l.invalid, err)
			return
		}
		name := r.Data.Metadata.Name
		l.seen[name] = append(l.seen[name], seen{gen: r.Data.Metadata.Generation, deleted: r.Event.Type() == studentv1.EventTypeDeleted, at: at})
	})
	if err != nil {
		t.Fatal(err)
	}
	go l.run()
	return l
}

// run starts rate changes a second, up to 256 at once, so that the API
// server's latency does not lower the rate. It counts what is due since
// the start rather than ticks, which a busy machine may drop.
func (l *load) run() {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		close(l.done)
	}()
	sem := make(chan struct{}, 256)
	tick := time.NewTicker(time.Second / time.Duration(l.rate))
	defer tick.Stop()
	l.started = time.Now()
	made := 0
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		for due := int(time.Since(l.started).Seconds() * float64(l.rate)); made < due; made++ {
			select {
			case sem <- struct{}{}:
			default:
				l.mu.Lock()
				l.skipped++ // all in flight: the API server is the bound
				l.mu.Unlock()
				continue
			}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				if err := l.change(); err != nil {
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
				}
			}()
		}
	}
}

// change makes one change: a create while fewer than l.level Students
// live (or a quarter of the time), else an update (twice as often) or a
// delete.
func (l *load) change() error {
	l.mu.Lock()
	r := rand.Float64()
	var op, name string
	switch {
	case len(l.live) < l.level || r < 0.25:
		op, name = "create", fmt.Sprintf("s-%05d", l.next)
		l.next++
	case r < 0.75:
		op, name = "update", l.live[rand.IntN(len(l.live))]
	default:
		i := rand.IntN(len(l.live))
		op, name = "delete", l.live[i]
		l.live = append(l.live[:i], l.live[i+1:]...)
	}
	l.mu.Unlock()
	// A write that timed out may or may not have happened: as a user's
	// client does, the load tries it again, twice at most, and a create
	// or delete that did happen is then found done.
	var gen int64
	var start time.Time
	tries := 0
	err := retry.OnError(wait.Backoff{Steps: 3}, transient, func() error {
		if tries++; tries > 1 {
			l.mu.Lock()
			l.retried++
			l.mu.Unlock()
		}
		start = time.Now()
		var err error
		gen, err = l.write(op, name, tries > 1)
		return err
	})
	if errors.Is(err, errNoUpdate) {
		return nil
	}
	if err != nil {
		return err
	}
	at := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slowestWrite = max(l.slowestWrite, at.Sub(start))
	l.writes[name] = append(l.writes[name], write{gen: gen, at: at})
	l.made++
	if op == "create" {
		l.live = append(l.live, name)
	}
	return nil
}

// write makes one op on the Student name within 10 s and returns its
// generation (0 once deleted); again says an earlier try may have made
// it already.
func (l *load) write(op, name string, again bool) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: l.ns, Name: name}}
	switch op {
	case "create":
		s.Spec = studentv1.StudentSpec{Name: name, School: "school-0"}
		err := l.c.Create(ctx, s)
		if again && apierrors.IsAlreadyExists(err) {
			err = l.c.Get(ctx, client.ObjectKeyFromObject(s), s)
		}
		if err != nil {
			return 0, fmt.Errorf("create %s: %w", name, err)
		}
		return s.Generation, nil
	case "update":
		// As a user's client does: read again and retry when the bridge's
		// finalizer or status write (or a concurrent change) came between.
		err := retry.RetryOnConflict(updateBackoff, func() error {
			if err := l.c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
				return err
			}
			s.Spec.School = fmt.Sprintf("school-%d", s.Generation)
			return l.c.Update(ctx, s)
		})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return 0, errNoUpdate // deleted by a change in flight, or lost every race
		}
		if err != nil {
			return 0, fmt.Errorf("update %s: %w", name, err)
		}
		return s.Generation, nil
	default:
		err := l.c.Delete(ctx, s)
		if again && apierrors.IsNotFound(err) {
			err = nil
		}
		if err != nil {
			return 0, fmt.Errorf("delete %s: %w", name, err)
		}
		return 0, nil
	}
}

// errNoUpdate says an update found nothing to change: not a change made.
var errNoUpdate = errors.New("no update happened")

// transient reports whether a write's error says only that it took too
// long or the API server asked to come back: its outcome is unknown.
func transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) ||
		apierrors.IsTooManyRequests(err) || utilnet.IsConnectionReset(err) || utilnet.IsProbableEOF(err)
}

// unthrottledClient is a client of the admin's with no client-side rate
// limit, for the tests' writes at a rate: the API server's own flow
// control bounds them, as it bounds many users.
func unthrottledClient(t *testing.T) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(nd.cfg)
	cfg.QPS = -1 // client-go: no rate limiter when QPS is negative
	c, err := client.New(cfg, client.Options{Scheme: scheme.New()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// updateBackoff retries an update that conflicted for up to about 1.5 s:
// the load itself changes the same few Students concurrently.
var updateBackoff = wait.Backoff{Steps: 10, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.2}

// result is what a load saw: the changes it made, their rate, and the
// longest wait of one for its event, with the slowest few.
type result struct {
	changes int
	rate    float64
	skipped int
	longest time.Duration
	slowest []string
	// slowestWrite is the longest a change's requests took.
	slowestWrite time.Duration
	// retried counts the writes tried again after a timeout.
	retried int
}

// finish stops the load and waits until every change made was seen, up to
// timeout. A change's wait runs from its write's return to the first event
// carrying it (its generation or a later one, or the delete).
func (l *load) finish(t *testing.T, timeout time.Duration) result {
	t.Helper()
	close(l.stop)
	<-l.done
	took := time.Since(l.started)
	type wait struct {
		what string
		d    time.Duration
	}
	var waits []wait
	err := stacktest.Eventually(timeout, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		waits = waits[:0]
		var missing []string
		for name, ws := range l.writes {
			for _, w := range ws {
				at, ok := l.covered(name, w)
				if !ok {
					missing = append(missing, fmt.Sprintf("%s gen %d", name, w.gen))
					continue
				}
				waits = append(waits, wait{fmt.Sprintf("%s gen %d", name, w.gen), at.Sub(w.at)})
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("%d changes not seen in the stream, e.g. %v", len(missing), missing[:min(5, len(missing))])
		}
		return nil
	})
	l.sub.Stop()
	if err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	if len(l.errs) > 0 {
		t.Errorf("%d of the load's writes failed, e.g. %v", len(l.errs), l.errs[0])
	}
	if len(l.invalid) > 0 {
		t.Errorf("%d of the load's events break the contract, e.g. %v", len(l.invalid), l.invalid[0])
	}
	l.mu.Unlock()
	if len(waits) == 0 {
		t.Fatal("the load made no change")
	}
	sort.Slice(waits, func(i, j int) bool { return waits[i].d > waits[j].d })
	l.mu.Lock()
	r := result{changes: len(waits), rate: float64(len(waits)) / took.Seconds(), skipped: l.skipped, longest: waits[0].d, slowestWrite: l.slowestWrite, retried: l.retried}
	l.mu.Unlock()
	for _, w := range waits[:min(3, len(waits))] {
		r.slowest = append(r.slowest, fmt.Sprintf("%s %.2fs", w.what, w.d.Seconds()))
	}
	return r
}

// waitChanges waits until the load has made n more changes: seconds of
// it, counted in what it made rather than in time.
func (l *load) waitChanges(t *testing.T, n int) {
	t.Helper()
	l.mu.Lock()
	until := l.made + n
	l.mu.Unlock()
	err := stacktest.Eventually(2*time.Minute, func() error {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.made < until {
			return fmt.Errorf("%d of %d more changes made", n-(until-l.made), n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// finishClean lets the load make 3 s of changes more after what (a fault,
// an upgrade) was over in took, then stops it and fails t unless every change reached
// the stream at 50 changes a second or more, none waited past maxWait and
// the API server's own delay, and verify finds nothing. The delay counts
// because the bridge cannot beat the API server: its Lease renewals and
// takeovers, its watch, wait on it as the load's writes do (on two busy
// CPUs a write took over 10 s).
func (l *load) finishClean(t *testing.T, s secrets, what string, took time.Duration) {
	t.Helper()
	l.waitChanges(t, 3*l.rate)
	r := l.finish(t, 3*time.Minute)
	verifyClean(t, s)
	t.Logf("%s in %.1fs; %d changes at %.0f/s (%d skipped), the longest wait for an event %.2fs (slowest: %v), the slowest write %.2fs, %d tried again",
		what, took.Seconds(), r.changes, r.rate, r.skipped, r.longest.Seconds(), r.slowest, r.slowestWrite.Seconds(), r.retried)
	if r.rate < 50 {
		t.Errorf("the load made %.0f changes a second, under the 50 it is promised under", r.rate)
	}
	if limit := maxWait + r.slowestWrite; r.longest > limit {
		t.Errorf("a change waited %.1fs for its event, over the shard Lease's %s, the retry and the API server's delay (%s)",
			r.longest.Seconds(), leaseDuration, limit.Round(100*time.Millisecond))
	}
}

// covered returns when the first event carrying w arrived.
func (l *load) covered(name string, w write) (time.Time, bool) {
	for _, s := range l.seen[name] {
		if (w.gen == 0 && s.deleted) || (w.gen > 0 && (s.gen >= w.gen || s.deleted) && s.at.After(w.at.Add(-time.Minute))) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// verifyClean runs `student-bridge verify` (the image's binary, from the
// host) against the cluster's API server and NATS, and fails t on any
// finding.
func verifyClean(t *testing.T, s secrets) {
	t.Helper()
	cmd := exec.Command(filepath.Join(nd.bin, "image", "student-bridge"), "verify", "--settle", "5s")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+nd.kubeconfig,
		"STUDENT_BRIDGE_NATS_URLS="+strings.Replace(natsURL(t, "x", "y"), "x:y@", "", 1),
		"STUDENT_BRIDGE_NATS_AUTH_USER=consumer", "STUDENT_BRIDGE_NATS_AUTH_PASSWORD="+s.consumer)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("student-bridge verify: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "no findings") {
		t.Fatalf("student-bridge verify exited 0 without saying it found nothing:\n%s", out)
	}
}
