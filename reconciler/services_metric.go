package reconciler

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// serviceStudents is student_bridge_service_students: per business service
// and state, how many Students (published, not deleted) it has applied in
// their latest version, not yet, or failed on, as their status shows it.
// It is counted when scraped, from the records and receipts in memory;
// with shards, each replica counts the Students of the shards it holds, so
// the replicas' series add up to the whole.
var serviceStudents = &servicesCollector{
	desc: prometheus.NewDesc("student_bridge_service_students",
		"Students per business service and state (InSync, Behind, Failed), as their status shows them; with shards, of the shards held here.",
		[]string{"service", "state"}, nil),
	sources: map[*StudentReconciler]struct{}{},
}

type servicesCollector struct {
	desc    *prometheus.Desc
	mu      sync.Mutex
	sources map[*StudentReconciler]struct{}
}

// CountServices adds r's Students to student_bridge_service_students until
// the returned function is called.
func (r *StudentReconciler) CountServices() (remove func()) {
	c := serviceStudents
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sources[r] = struct{}{}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		delete(c.sources, r)
	}
}

func (c *servicesCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *servicesCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	sources := make([]*StudentReconciler, 0, len(c.sources))
	for r := range c.sources {
		sources = append(sources, r)
	}
	c.mu.Unlock()
	counts := map[string]map[string]int{}
	for _, r := range sources {
		for service, states := range r.serviceCounts() {
			if counts[service] == nil {
				counts[service] = map[string]int{}
			}
			for state, n := range states {
				counts[service][state] += n
			}
		}
	}
	for service, states := range counts {
		// Every state of a service, 0 included, so that an alert on one
		// sees it come and go.
		for _, state := range []string{studentv1.ServiceInSync, studentv1.ServiceBehind, studentv1.ServiceFailed} {
			ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(states[state]), service, state)
		}
	}
}

// serviceCounts counts, per service and state, the Students r publishes
// for (its shards') that are published and not deleted.
func (r *StudentReconciler) serviceCounts() map[string]map[string]int {
	out := map[string]map[string]int{}
	if r.receipts.None() {
		return out // and no copy of every record at each scrape
	}
	for _, rec := range r.records.All() {
		if rec.Pending || rec.Published.Type == studentv1.EventTypeDeleted {
			continue
		}
		if !r.shards.Owns(types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}) {
			continue
		}
		var s studentv1.StudentStatus
		r.receipts.ApplyTo(&s, string(rec.UID), &rec.Published)
		for _, svc := range s.Services {
			if out[svc.Name] == nil {
				out[svc.Name] = map[string]int{}
			}
			out[svc.Name][svc.State]++
		}
	}
	return out
}
