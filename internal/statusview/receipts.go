package statusview

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/sink"
)

var receiptUpdates = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "student_bridge_receipts_total",
	Help: "Updates of the receipts bucket the bridge read, by result (applied, failed, removed, malformed, unknownStudent, otherCluster: a fleet's other cluster).",
}, []string{"result"})

// CountReceipt counts one update of the receipts bucket by result.
func CountReceipt(result string) { receiptUpdates.WithLabelValues(result).Inc() }

// maxServices bounds how many services one Student's status lists.
const maxServices = 64

// Receipts is the bridge's view of the receipts bucket: per Student uid,
// the last receipt of every service. The bridge reads it to show on each
// Student what the services applied, and removes the receipts of deleted
// Students.
//
// A nil *Receipts is a bridge with receipts off: it has none, and its
// methods do nothing.
type Receipts struct {
	// Expected are the services that must have applied the latest change
	// for a Student to be InSync; with none, every reporting service is.
	Expected []string

	mu sync.Mutex
	// store is the receipts bucket, for removing the receipts of deleted
	// Students; nil removes nothing.
	store sink.Store
	byUID map[string]map[string]studentv1.Receipt
}

// NewReceipts returns an empty view; store may be set later (SetStore).
func NewReceipts(expected []string, store sink.Store) *Receipts {
	return &Receipts{Expected: expected, store: store, byUID: map[string]map[string]studentv1.Receipt{}}
}

// None reports that no service is expected and none reported: no Student
// shows a service.
func (r *Receipts) None() bool {
	if r == nil {
		return true
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Expected) == 0 && len(r.byUID) == 0
}

// SetStore sets the bucket receipts are removed from.
func (r *Receipts) SetStore(store sink.Store) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.store = store
}

// Set records rec and returns the receipt it replaced (nil if none).
func (r *Receipts) Set(rec studentv1.Receipt) *studentv1.Receipt {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.byUID[rec.UID]
	if m == nil {
		m = map[string]studentv1.Receipt{}
		r.byUID[rec.UID] = m
	}
	prev, had := m[rec.Service]
	m[rec.Service] = rec
	if !had {
		return nil
	}
	return &prev
}

// Remove drops the receipt of key (<service>.<uid>) and returns it.
func (r *Receipts) Remove(key string) (studentv1.Receipt, bool) {
	if r == nil {
		return studentv1.Receipt{}, false
	}
	service, uid, ok := strings.Cut(key, ".")
	if !ok {
		return studentv1.Receipt{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, had := r.byUID[uid][service]
	delete(r.byUID[uid], service)
	if len(r.byUID[uid]) == 0 {
		delete(r.byUID, uid)
	}
	return rec, had
}

// Len is the number of receipts held.
func (r *Receipts) Len() int {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.byUID {
		n += len(m)
	}
	return n
}

// Students returns the Student each uid the view holds receipts of names
// (the namespace and name of its latest receipt).
func (r *Receipts) Students() map[string]types.NamespacedName {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]types.NamespacedName, len(r.byUID))
	for uid, m := range r.byUID {
		for _, rec := range m {
			out[uid] = types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}
			break
		}
	}
	return out
}

// Forget removes every receipt of the Student with uid, from the view and
// from the bucket: a deleted Student's receipts are of no use.
func (r *Receipts) Forget(ctx context.Context, uid string) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	services := make([]string, 0, len(r.byUID[uid]))
	for s := range r.byUID[uid] {
		services = append(services, s)
	}
	delete(r.byUID, uid)
	store := r.store
	r.mu.Unlock()
	if store == nil {
		return nil
	}
	var errs []error
	for _, s := range services {
		if err := store.Delete(ctx, studentv1.ReceiptKey(s, uid), 0); err != nil && !errors.Is(err, sink.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove the receipts of %s: %w", uid, err)
	}
	return nil
}

// ApplyTo adds to s what the services reported about the Student with uid,
// given the event last published for it: status.services, servicesInSync
// and the InSync condition.
func (r *Receipts) ApplyTo(s *studentv1.StudentStatus, uid string, last *studentv1.PublishedEvent) {
	if r == nil {
		return
	}
	r.mu.Lock()
	reported := make(map[string]studentv1.Receipt, len(r.byUID[uid]))
	for k, v := range r.byUID[uid] {
		reported[k] = v
	}
	r.mu.Unlock()
	services, inSync, cond := ServicesView(reported, r.Expected, last)
	s.Services, s.ServicesInSync = services, inSync
	if cond == nil {
		meta.RemoveStatusCondition(&s.Conditions, studentv1.ConditionInSync)
		return
	}
	meta.SetStatusCondition(&s.Conditions, *cond)
}

// ServicesView is what a Student shows of its receipts (by service), given
// the services expected and the event last published: a ServiceStatus per
// reporting or expected service, how many of the required ones applied the
// latest change ("1/2"), and the InSync condition. The required services
// are the expected ones, else every reporting one; with none, there is no
// condition.
func ServicesView(reported map[string]studentv1.Receipt, expected []string, last *studentv1.PublishedEvent) ([]studentv1.ServiceStatus, string, *metav1.Condition) {
	required := expected
	if len(required) == 0 {
		for name := range reported {
			required = append(required, name)
		}
	}
	if len(required) == 0 {
		return nil, "", nil
	}
	names := append([]string(nil), required...)
	for name := range reported {
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	names = slices.Compact(names)
	var services []studentv1.ServiceStatus
	var behind, failed []string
	inSync := 0
	for _, name := range names {
		st := serviceStatus(name, reported, last)
		if len(services) < maxServices {
			services = append(services, st)
		}
		if !slices.Contains(required, name) {
			continue
		}
		switch st.State {
		case studentv1.ServiceInSync:
			inSync++
		case studentv1.ServiceFailed:
			failed = append(failed, name+": "+st.Message)
		default:
			behind = append(behind, name)
		}
	}
	cond := &metav1.Condition{Type: studentv1.ConditionInSync, Status: metav1.ConditionTrue, Reason: studentv1.ReasonAllApplied,
		Message: fmt.Sprintf("%d of %d services applied the latest change", inSync, len(required))}
	switch {
	case len(failed) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, studentv1.ReasonServiceFailed
		cond.Message = truncate("failed: "+strings.Join(failed, "; "), 1024)
	case len(behind) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, studentv1.ReasonServicesBehind
		cond.Message = truncate("not yet applied the latest change: "+strings.Join(behind, ", "), 1024)
	}
	return services, fmt.Sprintf("%d/%d", inSync, len(required)), cond
}

func serviceStatus(name string, reported map[string]studentv1.Receipt, last *studentv1.PublishedEvent) studentv1.ServiceStatus {
	rec, ok := reported[name]
	if !ok {
		return studentv1.ServiceStatus{Name: name, State: studentv1.ServiceBehind, Message: "no receipt yet"}
	}
	publishedID := ""
	if last != nil {
		publishedID = last.ID
	}
	return studentv1.ServiceStatus{Name: name, State: rec.State(publishedID), AppliedEventID: rec.EventID, AppliedGeneration: rec.Generation,
		Message: rec.Message, Time: rec.Time.DeepCopy(), TraceID: rec.TraceID}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
