package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/verify"
)

// world is a control plane, a NATS server and the truth of what a test did
// to its Students.
type world struct {
	st     *stack.Stack
	nc     *nats.Conn
	admin  string // kubeconfig path of an admin user
	stream string
	// cluster is the bridge's cluster setting ("default" unless a test of
	// many clusters names it).
	cluster string

	mu      sync.Mutex
	states  map[types.UID]map[string]bool // every spec+labels a Student had
	deleted map[types.UID]string          // uid -> name of deleted Students
	changes int
	patches int // PATCHes of Students made by the test itself
	// latest is the last state (stateKey) each Student had.
	latest map[types.UID]string
	// inexactDeletes: the bridge runs without the finalizer policy, so a
	// deleted event may carry an earlier state of the Student (the last
	// published one) instead of its final state.
	inexactDeletes bool
}

func newWorld(t *testing.T) *world {
	t.Helper()
	return newWorldWith(t, stack.Options{})
}

func newWorldWith(t *testing.T, opts stack.Options) *world {
	t.Helper()
	st, err := stack.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := st.Stop(); err != nil {
			t.Error(err)
		}
	})
	nc := stacktest.Connect(t, st.NATSURL())
	w := &world{st: st, nc: nc, stream: "STUDENTS", cluster: "default", states: map[types.UID]map[string]bool{}, deleted: map[types.UID]string{}, latest: map[types.UID]string{}}
	w.admin = w.kubeconfig(t, envtest.User{Name: "admin", Groups: []string{"system:masters"}})
	return w
}

func (w *world) kubeconfig(t *testing.T, u envtest.User) string {
	t.Helper()
	au, err := w.st.Env.AddUser(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := au.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), u.Name+".kubeconfig")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// bridgeArgs are the flags of a bridge process in this world.
func (w *world) bridgeArgs(kubeconfig string, extra ...string) []string {
	if w.st.Cluster != nil {
		extra = append([]string{"--stream-replicas=3", "--records-replicas=3"}, extra...)
	}
	return append([]string{
		"--kubeconfig", kubeconfig,
		"--nats-url", w.st.NATSURL(),
		"--leader-elect=false",
		"--metrics-bind-address", "0",
		"--health-probe-bind-address", "0",
		"--retry-base-delay", "100ms",
		"--retry-max-delay", "1s",
		"--nats-reconnect-wait", "200ms",
		"--nats-ack-timeout", "2s",
	}, extra...)
}

func stateKey(s *studentv1.Student) string {
	var ls []string
	for k, v := range s.Labels {
		ls = append(ls, k+"="+v)
	}
	sort.Strings(ls)
	return s.Spec.Name + "|" + s.Spec.School + "|" + strings.Join(ls, ",")
}

func (w *world) record(s *studentv1.Student) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.states[s.UID] == nil {
		w.states[s.UID] = map[string]bool{}
	}
	w.states[s.UID][stateKey(s)] = true
	w.latest[s.UID] = stateKey(s)
	w.changes++
}

func (w *world) create(t *testing.T, ns, name, school string) *studentv1.Student {
	t.Helper()
	s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: studentv1.StudentSpec{Name: name, School: school}}
	if err := w.st.Client.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	w.record(s)
	return s
}

func (w *world) update(t *testing.T, ns, name, school string) {
	t.Helper()
	var s studentv1.Student
	if err := w.st.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	orig := s.DeepCopy()
	s.Spec.School = school
	// Every update relabels too: labels are published state as well.
	w.mu.Lock()
	rev := strconv.Itoa(w.changes)
	w.mu.Unlock()
	if s.Labels == nil {
		s.Labels = map[string]string{}
	}
	s.Labels["rev"] = rev
	if err := w.st.Client.Patch(context.Background(), &s, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.patches++
	w.mu.Unlock()
	w.record(&s)
}

func (w *world) delete(t *testing.T, ns, name string) {
	t.Helper()
	var s studentv1.Student
	if err := w.st.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil {
		t.Fatal(err)
	}
	if err := w.st.Client.Delete(context.Background(), &s); err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.deleted[s.UID] = name
	w.changes++
	w.mu.Unlock()
}

// requireHeld fails the test unless the deleted Student ns/name still
// exists, held by the finalizer.
func (w *world) requireHeld(t *testing.T, ns, name, why string) {
	t.Helper()
	var s studentv1.Student
	if err := w.st.Client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &s); err != nil || s.DeletionTimestamp.IsZero() {
		t.Fatalf("%s: deleted Student %s not held: %v %v", why, name, err, s.DeletionTimestamp)
	}
}

// startAndPublish starts a bridge with args, creates default/object-name
// and returns once its created event is in the stream.
func (w *world) startAndPublish(t *testing.T, args ...string) *proc {
	t.Helper()
	p := start(t, t.TempDir(), args...)
	w.create(t, "default", "object-name", "china")
	if err := stacktest.Eventually(60*time.Second, func() error {
		events, err := stacktest.StreamEvents(context.Background(), w.nc, w.stream)
		if err != nil || len(events) != 1 {
			return fmt.Errorf("stream holds %d events (%v), want the created", len(events), err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return p
}

// report is what a fault test measured.
type report struct {
	Changes    int // creates, updates and deletes made
	Students   int // Students that exist at the end
	Deleted    int
	Delivered  int // events in the stream
	Duplicates int // events that repeat an earlier (uid, type, state) beyond the stream's dedup
	OutOfOrder int // events of an older generation than an earlier event of their Student
	// Unobserved counts Students created and deleted while no bridge could
	// see them: nothing was published for them, neither created nor deleted,
	// which is consistent for consumers (they never learnt of them).
	Unobserved int
	Recovery   time.Duration
}

func (r report) String() string {
	return fmt.Sprintf("changes=%d students=%d deleted=%d delivered=%d duplicates=%d out-of-order=%d unobserved=%d recovery=%s",
		r.Changes, r.Students, r.Deleted, r.Delivered, r.Duplicates, r.OutOfOrder, r.Unobserved, r.Recovery.Round(10*time.Millisecond))
}

// verify checks the stream against the API server's truth with the
// checker of `student-bridge verify` (every Student's last event carries
// its current state, every deleted one's last event is deleted, the record
// store agrees, no id twice, no gap in a Student's sequence, nothing out of
// order), and then with what only the test knows: no event carries a state
// that never existed, and a deleted event carries the Student's final
// state (or, without the finalizer policy, a state it had).
func (w *world) verify(ns string) (report, error) {
	ctx := context.Background()
	src := verify.Source{NATS: w.nc, Stream: w.stream, Bucket: "STUDENT_BRIDGE_PUBLISHED", Kube: w.st.Client, Namespaces: []string{ns}, Cluster: w.cluster}
	checked, err := verify.Verify(ctx, src, verify.Options{Strict: true})
	if err != nil {
		return report{}, err
	}
	events, err := stacktest.StreamEvents(ctx, w.nc, w.stream)
	if err != nil {
		return report{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	r := report{Changes: w.changes, Delivered: len(events), Deleted: len(w.deleted), Students: checked.Students,
		OutOfOrder: checked.Count(verify.OutOfOrder)}
	if err := checked.Err(); err != nil {
		return r, err
	}

	last := map[string]stacktest.Received{}
	seen := map[string]bool{}
	for _, e := range events {
		uid := e.Data.Metadata.UID
		st := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Labels: e.Data.Metadata.Labels}, Spec: e.Data.Spec}
		if e.Event.Type() != studentv1.EventTypeDeleted && !w.states[types.UID(uid)][stateKey(st)] {
			return r, fmt.Errorf("event %s for %s carries a state that never existed: %s", e.Event.Type(), e.Data.Metadata.Name, stateKey(st))
		}
		key := uid + " " + e.Event.Type() + " " + stateKey(st)
		if seen[key] {
			r.Duplicates++
		}
		seen[key] = true
		last[uid] = e
	}
	for uid, name := range w.deleted {
		var s studentv1.Student
		if err := w.st.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &s); err == nil && s.UID == uid {
			return r, fmt.Errorf("deleted Student %s is still held by the finalizer", name)
		}
		e, published := last[string(uid)]
		if !published {
			r.Unobserved++
			continue
		}
		// The checker saw to it that its last event is deleted.
		got := stateKey(&studentv1.Student{ObjectMeta: metav1.ObjectMeta{Labels: e.Data.Metadata.Labels}, Spec: e.Data.Spec})
		if !w.inexactDeletes && got != w.latest[uid] {
			return r, fmt.Errorf("the deleted event of %s carries %s, not its final state %s", name, got, w.latest[uid])
		}
		if !w.states[uid][got] {
			return r, fmt.Errorf("the deleted event of %s carries %s, a state it never had", name, got)
		}
	}
	return r, nil
}

// waitVerified polls verify until it passes and returns the report with the
// time it took.
func (w *world) waitVerified(t *testing.T, ns string, timeout time.Duration) report {
	t.Helper()
	start := time.Now()
	var r report
	if err := stacktest.Eventually(timeout, func() error {
		var err error
		r, err = w.verify(ns)
		return err
	}); err != nil {
		t.Fatalf("not recovered after %s: %v (%s)", timeout, err, r)
	}
	// Duplicates are bounded by the stream's window: none reach it here.
	if r.Duplicates != 0 {
		t.Errorf("%d duplicate events in the stream (%s)", r.Duplicates, r)
	}
	r.Recovery = time.Since(start)
	return r
}

// bridgeUser creates a user bound to the generated RBAC of deploy/rbac
// (the ClusterRole, and the Role in namespace ns) and returns its
// kubeconfig. drop removes rules for the named resources first.
func (w *world) bridgeUser(t *testing.T, name, ns string, drop ...string) string {
	t.Helper()
	ctx := context.Background()
	b, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "deploy", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var role struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
			t.Fatal(err)
		}
		var rules []rbacv1.PolicyRule
		for _, r := range role.Rules {
			keep := true
			for _, d := range drop {
				for _, res := range r.Resources {
					if res == d {
						keep = false
					}
				}
			}
			if keep {
				rules = append(rules, r)
			}
		}
		subject := []rbacv1.Subject{{Kind: "User", Name: name, APIGroup: rbacv1.GroupName}}
		switch role.Kind {
		case "ClusterRole":
			mustCreate(t, w.st.Client.Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}))
			mustCreate(t, w.st.Client.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}, Subjects: subject}))
		case "Role":
			mustCreate(t, w.st.Client.Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Rules: rules}))
			mustCreate(t, w.st.Client.Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}, Subjects: subject}))
		}
	}
	return w.kubeconfig(t, envtest.User{Name: name})
}

// mustCreate fails the test on any error.
func mustCreate(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ensureNamespace creates namespace name unless it exists: the one place
// where AlreadyExists is fine.
func ensureNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

type natsMsg = nats.Msg

// userClient is a client authenticated as the named user (created with
// bridgeUser).
func userClient(t *testing.T, w *world, name string) client.Client {
	t.Helper()
	au, err := w.st.Env.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(au.Config(), client.Options{Scheme: w.st.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// recordStore opens the bridge's record store (the default bucket).
func recordStore(t *testing.T, nc *nats.Conn) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), "STUDENT_BRIDGE_PUBLISHED")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}
