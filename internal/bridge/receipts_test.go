package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestReceiptsShowOnTheStudent: what services report in the receipts bucket
// shows on the Student: each service's state, "n/m" of the expected ones,
// the InSync condition, a Warning Event for a failure; malformed receipts
// are skipped without hiding the others; a deleted Student's receipts are
// removed.
func TestReceiptsShowOnTheStudent(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "receipts")
	cfg.Services.Expected = []string{"billing", "library"}
	startBridge(t, cfg)
	nc := natsConn(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}

	stu := newStudent(ns, "object-name", "wang", "china")
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	published := func() *studentv1.PublishedEvent {
		var last *studentv1.PublishedEvent
		if err := stacktest.Eventually(30*time.Second, func() error {
			s := getStudent(t, ns, stu.Name)
			if s.Status.LastPublished == nil || s.Status.LastPublished.Generation != s.Generation {
				return fmt.Errorf("generation %d not published yet", s.Generation)
			}
			last = s.Status.LastPublished
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return last
	}
	first := published()

	var kv jetstream.KeyValue
	if err := stacktest.Eventually(30*time.Second, func() error {
		kv, err = js.KeyValue(ctx, cfg.Receipts.Bucket)
		return err
	}); err != nil {
		t.Fatalf("the bridge created no receipts bucket: %v", err)
	}
	report := func(service string, ev *studentv1.PublishedEvent, result, message string) {
		t.Helper()
		b, _ := json.Marshal(studentv1.Receipt{Service: service, UID: string(stu.UID), Namespace: ns, Name: stu.Name,
			EventID: ev.ID, Generation: ev.Generation, Result: result, Message: message, Time: metav1.Now()})
		if _, err := kv.Put(ctx, studentv1.ReceiptKey(service, string(stu.UID)), b); err != nil {
			t.Fatal(err)
		}
	}
	// expect waits until the Student shows inSync and the states of the
	// services given.
	expect := func(inSync string, cond metav1.ConditionStatus, states map[string]string) *studentv1.Student {
		t.Helper()
		var s *studentv1.Student
		if err := stacktest.Eventually(30*time.Second, func() error {
			s = getStudent(t, ns, stu.Name)
			got := map[string]string{}
			for _, svc := range s.Status.Services {
				got[svc.Name] = svc.State
			}
			c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionInSync)
			if s.Status.ServicesInSync != inSync || c == nil || c.Status != cond || fmt.Sprint(got) != fmt.Sprint(states) {
				return fmt.Errorf("servicesInSync %q, InSync %v, services %v; want %q, %s, %v", s.Status.ServicesInSync, c, got, inSync, cond, states)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return s
	}

	expect("0/2", metav1.ConditionFalse, map[string]string{"billing": "Behind", "library": "Behind"})
	report("billing", first, studentv1.ResultApplied, "")
	expect("1/2", metav1.ConditionFalse, map[string]string{"billing": "InSync", "library": "Behind"})
	report("library", first, studentv1.ResultApplied, "")
	// A service nobody expects is shown, not required.
	report("audit", first, studentv1.ResultFailed, "disk full")
	s := expect("2/2", metav1.ConditionTrue, map[string]string{"audit": "Failed", "billing": "InSync", "library": "InSync"})
	for _, svc := range s.Status.Services {
		if svc.Name == "billing" && (svc.AppliedEventID != first.ID || svc.AppliedGeneration != first.Generation) {
			t.Errorf("billing shows %s generation %d, want %s %d", svc.AppliedEventID, svc.AppliedGeneration, first.ID, first.Generation)
		}
	}

	// Malformed receipts are skipped; the good ones stay shown.
	for key, value := range map[string]string{
		"billing.not-json":               "{",
		"library." + string(stu.UID):     `{"service":"billing","uid":"` + string(stu.UID) + `","namespace":"` + ns + `","name":"object-name","eventID":"x","result":"applied"}`,
		"library.ffff-not-a-student-uid": `{"service":"library","uid":"ffff-not-a-student-uid","namespace":"` + ns + `","name":"object-name","eventID":"x","result":"applied"}`,
		"billing." + string(stu.UID):     `{"service":"billing","uid":"` + string(stu.UID) + `","namespace":"` + ns + `","name":"object-name","eventID":"x","result":"failed","message":"` + strings.Repeat("x", 2000) + `"}`,
	} {
		if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		if m, u := receiptCount(t, "malformed"), receiptCount(t, "unknownStudent"); m < 3 || u < 1 {
			return fmt.Errorf("receipts counted malformed %v, unknownStudent %v; want at least 3 and 1", m, u)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	expect("2/2", metav1.ConditionTrue, map[string]string{"audit": "Failed", "billing": "InSync", "library": "InSync"})

	// A receipt of another cluster's Student (a fleet's, come home to the
	// wrong bucket) is neither malformed nor unknown: not this bridge's.
	unknown, other := receiptCount(t, "unknownStudent"), receiptCount(t, "otherCluster")
	if _, err := kv.Put(ctx, "library.west-uid", []byte(`{"service":"library","uid":"west-uid","cluster":"west","namespace":"`+ns+`","name":"object-name","eventID":"x","result":"applied"}`)); err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		if n := receiptCount(t, "otherCluster"); n != other+1 {
			return fmt.Errorf("receipts counted otherCluster %v, want %v", n, other+1)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := receiptCount(t, "unknownStudent"); n != unknown {
		t.Fatalf("another cluster's receipt counted unknownStudent (%v, was %v)", n, unknown)
	}

	// A change: both services are behind until they report it.
	patch(t, getStudent(t, s.Namespace, s.Name), func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	second := published()
	if second.ID == first.ID {
		t.Fatal("the update was not published")
	}
	expect("0/2", metav1.ConditionFalse, map[string]string{"audit": "Failed", "billing": "Behind", "library": "Behind"})
	report("billing", second, studentv1.ResultFailed, "account locked")
	s = expect("0/2", metav1.ConditionFalse, map[string]string{"audit": "Failed", "billing": "Failed", "library": "Behind"})
	if c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionInSync); c.Reason != studentv1.ReasonServiceFailed || !strings.Contains(c.Message, "account locked") {
		t.Errorf("InSync %s: %s, want %s naming the failure", c.Reason, c.Message, studentv1.ReasonServiceFailed)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		for _, e := range kubeEvents(t, ns, stu.Name) {
			if e.Type == "Warning" && e.Reason == studentv1.ReasonServiceFailed && strings.Contains(e.Note, "billing") && strings.Contains(e.Note, "account locked") {
				return nil
			}
		}
		return errors.New("no ServiceFailed Warning Event naming billing")
	}); err != nil {
		t.Error(err)
	}
	report("billing", second, studentv1.ResultApplied, "")
	report("library", second, studentv1.ResultApplied, "")
	expect("2/2", metav1.ConditionTrue, map[string]string{"audit": "Failed", "billing": "InSync", "library": "InSync"})

	// Deleted: its receipts go with it.
	if err := st.Client.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		for _, svc := range []string{"billing", "library", "audit"} {
			if _, err := kv.Get(ctx, studentv1.ReceiptKey(svc, string(stu.UID))); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("receipt of %s after the delete: %v", svc, err)
			}
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// TestReceiptOfTheDeletedEventGoes: a service's receipt of a Student's
// deleted event that comes after the bridge removed its receipts, while
// the Student is still there (another finalizer holds it), goes with the
// Student, from the bucket and from the bridge's memory. Kept, one
// would pile up for every deleted Student.
func TestReceiptOfTheDeletedEventGoes(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "late")
	startBridge(t, cfg)
	js, err := jetstream.New(natsConn(t))
	if err != nil {
		t.Fatal(err)
	}
	const hold = "example.com/hold"
	stu := newStudent(ns, "late", "wang", "china")
	stu.Finalizers = []string{hold}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 1)
	if err := st.Client.Delete(ctx, stu); err != nil {
		t.Fatal(err)
	}
	var deleted stacktest.Received
	stacktest.WaitFor(t, "the deleted event", func() error {
		got, err := stacktest.StreamEvents(ctx, natsConn(t), cfg.NATS.Stream.Name)
		if err != nil || len(got) < 2 {
			return fmt.Errorf("%d events: %v", len(got), err)
		}
		deleted = got[1]
		return nil
	})
	kv, err := js.KeyValue(ctx, cfg.Receipts.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	applied := receiptCount(t, studentv1.ResultApplied)
	b, _ := json.Marshal(studentv1.Receipt{Service: "billing", UID: string(stu.UID), Namespace: ns, Name: stu.Name,
		EventID: deleted.Event.ID(), Generation: stu.Generation, Result: studentv1.ResultApplied, Time: metav1.Now()})
	key := studentv1.ReceiptKey("billing", string(stu.UID))
	if _, err := kv.Put(ctx, key, b); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the late receipt taken", func() error {
		if n := receiptCount(t, studentv1.ResultApplied); n <= applied {
			return fmt.Errorf("receipts counted applied %v", n)
		}
		return nil
	})
	held := getStudent(t, ns, stu.Name)
	patch(t, held, func(s *studentv1.Student) { s.Finalizers = nil })
	stacktest.WaitFor(t, "the late receipt gone with the Student", func() error {
		if _, err := kv.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("the receipt of the deleted Student: %v", err)
		}
		return nil
	})
}

// receiptCount reads student_bridge_receipts_total{result} of this
// process (every bridge of this test binary counts).
func receiptCount(t *testing.T, result string) float64 {
	t.Helper()
	v, err := stacktest.Counter("student_bridge_receipts_total", "result", result)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestReceiptAfterTheStudentWentGoes: a service's receipt written after
// the Student is gone (the usual order for its deleted event: the bridge
// removes the finalizer as soon as the event is acknowledged) is removed
// from the bucket by the sweep, every records.deleteMarkerAge, while a
// living Student's receipt stays, and so does the receipt of a Student
// this replica's cache does not have yet but the record store does (a
// Student just created, published by another replica).
func TestReceiptAfterTheStudentWentGoes(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	cfg := testConfig(t, ns, "after")
	cfg.Records.DeleteMarkerAge = 2 * time.Second
	startBridge(t, cfg)
	js, err := jetstream.New(natsConn(t))
	if err != nil {
		t.Fatal(err)
	}
	gone, kept := newStudent(ns, "gone", "wang", "china"), newStudent(ns, "kept", "li", "china")
	for _, s := range []*studentv1.Student{gone, kept} {
		if err := st.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	waitStream(t, natsConn(t), cfg.NATS.Stream.Name, 2)
	if err := st.Client.Delete(ctx, gone); err != nil {
		t.Fatal(err)
	}
	var deleted, created stacktest.Received
	stacktest.WaitFor(t, "the deleted event, and the Student gone", func() error {
		got, err := stacktest.StreamEvents(ctx, natsConn(t), cfg.NATS.Stream.Name)
		if err != nil || len(got) < 3 {
			return fmt.Errorf("%d events: %v", len(got), err)
		}
		deleted = got[2]
		for _, ev := range got {
			if ev.Data.Metadata.Name == kept.Name {
				created = ev
			}
		}
		var s studentv1.Student
		if err := st.Client.Get(ctx, client.ObjectKeyFromObject(gone), &s); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the deleted Student: %v", err)
		}
		return nil
	})
	kv, err := js.KeyValue(ctx, cfg.Receipts.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func(s *studentv1.Student, eventID string) string {
		b, _ := json.Marshal(studentv1.Receipt{Service: "billing", UID: string(s.UID), Namespace: ns, Name: s.Name,
			EventID: eventID, Generation: s.Generation, Result: studentv1.ResultApplied, Time: metav1.Now()})
		key := studentv1.ReceiptKey("billing", string(s.UID))
		if _, err := kv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
		return key
	}
	keptKey := put(kept, created.Event.ID())
	records, err := js.KeyValue(ctx, cfg.Records.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	newer := newStudent(ns, "newer", "zhao", "china")
	newer.UID = "6d1e5b8c-0000-4000-8000-000000000001"
	rec, _ := json.Marshal(studentv1.StudentRecord{Namespace: ns, Name: newer.Name, UID: newer.UID,
		Published: studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "e", Time: metav1.Now()}})
	if _, err := records.Put(ctx, contract.RecordKey(newer.UID), rec); err != nil {
		t.Fatal(err)
	}
	newerKey := put(newer, "e")
	unknown := receiptCount(t, "unknownStudent")
	goneKey := put(gone, deleted.Event.ID())
	stacktest.WaitFor(t, "the late receipt read", func() error {
		if n := receiptCount(t, "unknownStudent"); n <= unknown {
			return fmt.Errorf("receipts counted unknownStudent %v", n)
		}
		return nil
	})
	stacktest.WaitFor(t, "the late receipt removed", func() error {
		if _, err := kv.Get(ctx, goneKey); !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("the receipt of the gone Student: %v", err)
		}
		return nil
	})
	// Two more sweeps: the living Student's receipt stays.
	time.Sleep(2 * cfg.Records.DeleteMarkerAge)
	if _, err := kv.Get(ctx, keptKey); err != nil {
		t.Fatalf("the receipt of a living Student: %v", err)
	}
	if _, err := kv.Get(ctx, newerKey); err != nil {
		t.Fatalf("the receipt of a Student with a record, not yet in the cache: %v", err)
	}
}
