package statusview

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

func TestServicesView(t *testing.T) {
	last := &studentv1.PublishedEvent{ID: "e2", Generation: 2}
	applied := func(id string) studentv1.Receipt {
		return studentv1.Receipt{EventID: id, Result: studentv1.ResultApplied}
	}
	failed := studentv1.Receipt{EventID: "e2", Result: studentv1.ResultFailed, Message: "disk full"}
	for _, tc := range []struct {
		name     string
		reported map[string]studentv1.Receipt
		expected []string
		last     *studentv1.PublishedEvent
		inSync   string
		cond     metav1.ConditionStatus // "" for no condition
		reason   string
		states   map[string]string
	}{
		{name: "nothing expected, nothing reported", last: last},
		{name: "expected, none reported", expected: []string{"billing"}, last: last, inSync: "0/1",
			cond: metav1.ConditionFalse, reason: studentv1.ReasonServicesBehind, states: map[string]string{"billing": studentv1.ServiceBehind}},
		{name: "expected applied the latest", reported: map[string]studentv1.Receipt{"billing": applied("e2")}, expected: []string{"billing"}, last: last,
			inSync: "1/1", cond: metav1.ConditionTrue, reason: studentv1.ReasonAllApplied, states: map[string]string{"billing": studentv1.ServiceInSync}},
		{name: "expected applied an earlier change", reported: map[string]studentv1.Receipt{"billing": applied("e1")}, expected: []string{"billing"}, last: last,
			inSync: "0/1", cond: metav1.ConditionFalse, reason: studentv1.ReasonServicesBehind, states: map[string]string{"billing": studentv1.ServiceBehind}},
		{name: "a failure wins over behind", reported: map[string]studentv1.Receipt{"billing": failed, "library": applied("e1")}, expected: []string{"billing", "library"}, last: last,
			inSync: "0/2", cond: metav1.ConditionFalse, reason: studentv1.ReasonServiceFailed, states: map[string]string{"billing": studentv1.ServiceFailed, "library": studentv1.ServiceBehind}},
		{name: "an unexpected service is shown, not required", reported: map[string]studentv1.Receipt{"billing": applied("e2"), "audit": failed}, expected: []string{"billing"}, last: last,
			inSync: "1/1", cond: metav1.ConditionTrue, reason: studentv1.ReasonAllApplied, states: map[string]string{"billing": studentv1.ServiceInSync, "audit": studentv1.ServiceFailed}},
		{name: "nothing expected: every reporting service is required", reported: map[string]studentv1.Receipt{"billing": applied("e2"), "library": applied("e1")}, last: last,
			inSync: "1/2", cond: metav1.ConditionFalse, reason: studentv1.ReasonServicesBehind, states: map[string]string{"billing": studentv1.ServiceInSync, "library": studentv1.ServiceBehind}},
		{name: "nothing published yet", reported: map[string]studentv1.Receipt{"billing": applied("e2")}, expected: []string{"billing"},
			inSync: "0/1", cond: metav1.ConditionFalse, reason: studentv1.ReasonServicesBehind, states: map[string]string{"billing": studentv1.ServiceBehind}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			services, inSync, cond := ServicesView(tc.reported, tc.expected, tc.last)
			if inSync != tc.inSync {
				t.Errorf("servicesInSync %q, want %q", inSync, tc.inSync)
			}
			switch {
			case tc.cond == "" && cond != nil:
				t.Errorf("condition %+v, want none", cond)
			case tc.cond != "" && (cond == nil || cond.Status != tc.cond || cond.Reason != tc.reason):
				t.Errorf("condition %+v, want %s %s", cond, tc.cond, tc.reason)
			}
			got := map[string]string{}
			for i, s := range services {
				got[s.Name] = s.State
				if i > 0 && services[i-1].Name >= s.Name {
					t.Errorf("services not sorted by name: %v", services)
				}
			}
			if len(got) != len(tc.states) {
				t.Errorf("services %v, want %v", got, tc.states)
			}
			for name, state := range tc.states {
				if got[name] != state {
					t.Errorf("%s is %q, want %q", name, got[name], state)
				}
			}
		})
	}
}
