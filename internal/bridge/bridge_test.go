package bridge_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestLifecycle follows the tutorial: create the sample Student, edit it,
// relabel it, touch only annotations and status, delete it.
func TestLifecycle(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "student")
	startBridge(t, cfg)
	nc := natsConn(t)
	sub, err := stacktest.Subscribe(nc, "student.*")
	if err != nil {
		t.Fatal(err)
	}

	// Create: exactly one student.created, with every attribute of the contract.
	stu := newStudent(ns, "object-name", "wang", "china")
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	created := waitStream(t, nc, cfg.NATS.Stream.Name, 1)[0]
	if created.Subject != "student.created" {
		t.Errorf("subject = %q, want student.created", created.Subject)
	}
	ev := created.Event
	checkAttrs(t, ev, studentv1.EventTypeCreated, ns+"/object-name")
	if got := created.Header.Get("Nats-Msg-Id"); got != ev.ID() {
		t.Errorf("Nats-Msg-Id = %q, want the CloudEvent id %q", got, ev.ID())
	}
	if got := created.Header.Get("Content-Type"); got != "application/cloudevents+json" {
		t.Errorf("structured mode Content-Type = %q", got)
	}
	s := getStudent(t, ns, "object-name")
	wantMeta := studentv1.EventObjectMeta{Namespace: ns, Name: "object-name", UID: string(s.UID), Generation: 1, ResourceVersion: created.Data.Metadata.ResourceVersion}
	if created.Data.Metadata.UID != wantMeta.UID || created.Data.Metadata.Generation != 1 || created.Data.Metadata.Namespace != ns || created.Data.Metadata.ResourceVersion == "" {
		t.Errorf("data.metadata = %+v, want %+v", created.Data.Metadata, wantMeta)
	}
	if created.Data.Spec != (studentv1.StudentSpec{Name: "wang", School: "china"}) || created.Data.PreviousSpec != nil {
		t.Errorf("data spec = %+v previous = %+v", created.Data.Spec, created.Data.PreviousSpec)
	}

	// Status and the Normal Event follow the publish.
	stacktest.WaitFor(t, "status shows the created event", func() error {
		s = getStudent(t, ns, "object-name")
		c := publishedCondition(s)
		switch {
		case c == nil || c.Status != metav1.ConditionTrue || c.ObservedGeneration != 1:
			return fmt.Errorf("Published condition %+v", c)
		case s.Status.ObservedGeneration != 1:
			return fmt.Errorf("observedGeneration %d", s.Status.ObservedGeneration)
		case s.Status.LastPublished == nil || s.Status.LastPublished.ID != ev.ID() || s.Status.LastPublished.Sequence != int64(created.Sequence) ||
			s.Status.LastPublished.Type != studentv1.EventTypeCreated || s.Status.LastPublished.Spec != stu.Spec:
			return fmt.Errorf("lastPublished %+v", s.Status.LastPublished)
		}
		return nil
	})
	if !containsString(s.Finalizers, studentv1.Finalizer) {
		t.Errorf("finalizers %v lack %s", s.Finalizers, studentv1.Finalizer)
	}
	stacktest.WaitFor(t, "a Normal Published event naming subject and id", func() error {
		for _, e := range kubeEvents(t, ns, "object-name") {
			if e.Type == corev1.EventTypeNormal && e.Reason == studentv1.ReasonPublished && strings.Contains(e.Note, "student.created") && strings.Contains(e.Note, ev.ID()) {
				return nil
			}
		}
		return errors.New("not recorded")
	})

	// kubectl edit: the spec changes.
	patch(t, s, func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	updated := waitStream(t, nc, cfg.NATS.Stream.Name, 2)[1]
	checkAttrs(t, updated.Event, studentv1.EventTypeUpdated, ns+"/object-name")
	if updated.Subject != "student.updated" || updated.Data.Spec.School != "tsinghua" ||
		updated.Data.PreviousSpec == nil || updated.Data.PreviousSpec.School != "china" || updated.Data.Metadata.Generation != 2 {
		t.Errorf("updated event: subject %s data %+v previous %+v", updated.Subject, updated.Data, updated.Data.PreviousSpec)
	}

	// A label change is a change.
	patch(t, getStudent(t, ns, "object-name"), func(s *studentv1.Student) { s.Labels = map[string]string{"grade": "3"} })
	relabelled := waitStream(t, nc, cfg.NATS.Stream.Name, 3)[2]
	if relabelled.Event.Type() != studentv1.EventTypeUpdated || relabelled.Data.Metadata.Labels["grade"] != "3" || relabelled.Data.Metadata.Generation != 2 {
		t.Errorf("label update: %s %+v", relabelled.Event.Type(), relabelled.Data.Metadata)
	}

	// Annotation-only and status-only changes publish nothing. The next spec
	// change is the barrier: it must be the very next event.
	patch(t, getStudent(t, ns, "object-name"), func(s *studentv1.Student) { s.Annotations = map[string]string{"note": "x"} })
	s = getStudent(t, ns, "object-name")
	orig := s.DeepCopy()
	s.Status.Conditions = append(s.Status.Conditions, metav1.Condition{Type: "Audited", Status: metav1.ConditionTrue, Reason: "Manual", LastTransitionTime: metav1.Now()})
	if err := st.Client.Status().Patch(ctx, s, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	patch(t, getStudent(t, ns, "object-name"), func(s *studentv1.Student) { s.Spec.Name = "wang wei" })
	barrier := waitStream(t, nc, cfg.NATS.Stream.Name, 4)[3]
	if barrier.Data.Spec.Name != "wang wei" || barrier.Data.PreviousSpec.Name != "wang" {
		t.Errorf("event after annotation/status changes is %s %+v, want the spec change", barrier.Event.Type(), barrier.Data)
	}

	// Delete: one student.deleted with the final state, then the object goes.
	if err := st.Client.Delete(ctx, getStudent(t, ns, "object-name")); err != nil {
		t.Fatal(err)
	}
	deleted := waitStream(t, nc, cfg.NATS.Stream.Name, 5)[4]
	checkAttrs(t, deleted.Event, studentv1.EventTypeDeleted, ns+"/object-name")
	if deleted.Subject != "student.deleted" || deleted.Data.Spec.Name != "wang wei" || deleted.Data.Metadata.Labels["grade"] != "3" {
		t.Errorf("deleted event: %s %+v", deleted.Subject, deleted.Data)
	}
	stacktest.WaitFor(t, "the Student is gone", func() error {
		err := st.Client.Get(ctx, client.ObjectKeyFromObject(s), &studentv1.Student{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err %v)", err)
	})

	// The core subscription saw the same five events, in order.
	got, err := sub.Events()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"created", "updated", "updated", "updated", "deleted"}
	if len(got) != len(want) {
		t.Fatalf("student.* subscription got %v, want %v", types(got), want)
	}
	for i, r := range got {
		if r.Subject != "student."+want[i] {
			t.Errorf("subscription event %d on %s, want student.%s", i, r.Subject, want[i])
		}
	}
}

func checkAttrs(t *testing.T, ev cloudevents.Event, typ, subject string) {
	t.Helper()
	if err := ev.Validate(); err != nil {
		t.Errorf("invalid CloudEvent: %v", err)
	}
	switch {
	case ev.SpecVersion() != "1.0":
		t.Errorf("specversion %q", ev.SpecVersion())
	case ev.Type() != typ:
		t.Errorf("type %q, want %q", ev.Type(), typ)
	case ev.Source() != "/clusters/test/apis/example.k8s.io/v1/students":
		t.Errorf("source %q", ev.Source())
	case ev.Subject() != subject:
		t.Errorf("subject %q, want %q", ev.Subject(), subject)
	case len(ev.ID()) != 32:
		t.Errorf("id %q is not the 32-hex-digit change id", ev.ID())
	case ev.Time().IsZero() || time.Since(ev.Time()) > time.Minute:
		t.Errorf("time %v", ev.Time())
	case ev.DataContentType() != "application/json":
		t.Errorf("datacontenttype %q", ev.DataContentType())
	}
}

// patch applies change to s with a merge patch, as kubectl edit would.
func patch(t *testing.T, s *studentv1.Student, change func(*studentv1.Student)) {
	t.Helper()
	orig := s.DeepCopy()
	change(s)
	if err := st.Client.Patch(context.Background(), s, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
