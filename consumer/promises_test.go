//go:build !nostack

package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// failingFor is a recorder whose handler fails the changes of the Student
// name while failing is true (it is at first).
func failingFor(name string) (rec *recorder, failing *atomic.Bool) {
	failing = &atomic.Bool{}
	failing.Store(true)
	rec = &recorder{fail: func(c consumer.Change) error {
		if c.Name == name && failing.Load() {
			return errors.New("not now")
		}
		return nil
	}}
	return rec, failing
}

// ackFloor is the stream sequence up to which service's durable consumer
// acknowledged.
func (w *world) ackFloor(t *testing.T, service string) uint64 {
	t.Helper()
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(context.Background(), w.cfg.NATS.Stream.Name, service)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.AckFloor.Stream
}

// schools lists, for each change of the Student name handed over, the
// school it carried ("deleted" for a delete).
func schools(cs []consumer.Change, name string) []string {
	var out []string
	for _, c := range cs {
		if c.Name != name {
			continue
		}
		if c.New == nil {
			out = append(out, "deleted")
		} else {
			out = append(out, c.New.Spec.School)
		}
	}
	return out
}

// TestMirrorAcksOnlyHandledEvents: live events are acknowledged up to the
// longest prefix of handled ones: while the first Student's change fails,
// nothing is acknowledged, though the second's was applied; once it is
// applied, both are.
func TestMirrorAcksOnlyHandledEvents(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "ackprefix")
	rec, failing := failingFor("first")
	m, _ := w.mirror(t, "roster", rec.handle)
	w.waitAcked(t, "roster", 0) // the durable consumer exists: live from here
	w.create(t, "first", "china")
	w.waitPublished(t, 1) // first's event is sequence 1
	second := w.create(t, "second", "china")
	w.waitPublished(t, 2)
	stacktest.WaitFor(t, "second applied while first fails", func() error {
		if _, ok := m.State()[string(second.UID)]; !ok {
			return errors.New("second not applied")
		}
		return nil
	})
	// A few more retries of first, none of which may move the ack floor.
	calls := func() int {
		n := 0
		for _, c := range rec.snapshot() {
			if c.Name == "first" {
				n++
			}
		}
		return n
	}
	tried := calls()
	stacktest.WaitFor(t, "three more tries of first", func() error {
		if n := calls() - tried; n < 3 {
			return fmt.Errorf("first tried %d more times", n)
		}
		return nil
	})
	if floor := w.ackFloor(t, "roster"); floor != 0 {
		t.Fatalf("while the first event's change fails, acknowledged up to %d, want 0", floor)
	}
	failing.Store(false)
	w.waitAcked(t, "roster", 2)
}

// TestMirrorHoldsBackOnlyTheFailingStudent: while a Student's change
// fails, its later changes wait and are coalesced into one (never handed
// over one by one), and other Students are applied meanwhile.
func TestMirrorHoldsBackOnlyTheFailingStudent(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "holdback")
	rec, failing := failingFor("stubborn")
	// A retry 3 s after the failure: both later changes come before it.
	m, _ := w.mirror(t, "roster", rec.handle, func(o *consumer.MirrorOptions) {
		o.RetryBaseDelay, o.RetryMaxDelay = 3*time.Second, 3*time.Second
	})
	w.waitAcked(t, "roster", 0)
	stubborn := w.create(t, "stubborn", "china")
	stacktest.WaitFor(t, "stubborn's first change failed", func() error {
		if n := len(schools(rec.snapshot(), "stubborn")); n == 0 {
			return errors.New("not handed over yet")
		}
		return nil
	})
	w.update(t, stubborn, "peking")
	w.update(t, stubborn, "tsinghua")
	other := w.create(t, "other", "china")
	w.waitPublished(t, 4)
	stacktest.WaitFor(t, "other applied while stubborn waits", func() error {
		if _, ok := m.State()[string(other.UID)]; !ok {
			return errors.New("other not applied")
		}
		return nil
	})
	failing.Store(false)
	stacktest.WaitFor(t, "stubborn applied at its newest state", func() error {
		if d, ok := m.State()[string(stubborn.UID)]; !ok || d.Spec.School != "tsinghua" {
			return fmt.Errorf("stubborn applied: %+v", d)
		}
		return nil
	})
	got := schools(rec.take(), "stubborn")
	for i, school := range got {
		if school == "peking" || school == "tsinghua" && i != len(got)-1 {
			t.Fatalf("stubborn handed over as %v: its later changes must wait for the retry and come as one (tsinghua), last", got)
		}
	}
}

// TestMirrorSkipsUnchangedSnapshots: a snapshot of Students that did not
// change since the service applied them reaches no handler; a real change
// after it does.
func TestMirrorSkipsUnchangedSnapshots(t *testing.T) {
	t.Parallel()
	w := newWorld(t, "samesnap")
	rec := &recorder{}
	m, _ := w.mirror(t, "roster", rec.handle)
	a := w.create(t, "a", "china")
	w.create(t, "b", "china")
	w.waitPublished(t, 2)
	stacktest.WaitFor(t, "both applied", func() error {
		if n := len(m.State()); n != 2 {
			return fmt.Errorf("%d applied", n)
		}
		return nil
	})
	if n := len(rec.take()); n != 2 {
		t.Fatalf("%d changes handed over for two created Students, want 2", n)
	}
	body, _ := json.Marshal(studentv1.SnapshotRequest{})
	reply, err := w.nc.Request(w.cfg.Snapshot.RequestSubject, body, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var r studentv1.SnapshotReply
	if err := json.Unmarshal(reply.Data, &r); err != nil || r.Error != "" || r.Published != 2 {
		t.Fatalf("snapshot reply %s (%v), want 2 published", reply.Data, err)
	}
	w.waitPublished(t, 4)
	w.waitAcked(t, "roster", 4)
	if cs := rec.take(); len(cs) != 0 {
		t.Fatalf("a snapshot of unchanged Students handed over %d changes (%v), want none", len(cs), names(cs))
	}
	w.update(t, a, "peking")
	w.waitPublished(t, 5)
	stacktest.WaitFor(t, "the update applied", func() error {
		if got := schools(rec.snapshot(), "a"); fmt.Sprint(got) != "[peking]" {
			return fmt.Errorf("a handed over as %v, want [peking]", got)
		}
		return nil
	})
}

// snapshot returns the changes so far, keeping them.
func (r *recorder) snapshot() []consumer.Change {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]consumer.Change(nil), r.changes...)
}

// TestRestartedMirrorAsksForASnapshot: a service that was stopped while
// events it had not seen left the stream asks the bridge for a snapshot
// when it starts again, and ends with every Student, also those whose only
// event it missed.
func TestRestartedMirrorAsksForASnapshot(t *testing.T) {
	t.Parallel()
	// The stream keeps 40 events. Seen: s00-s09 (sequences 1-10). Then,
	// with the service stopped, s10-s39 created (11-40) and s00-s09
	// updated three times (41-70): s10-s29 have no event left.
	w := newWorldWith(t, "agedrestart", worldOptions{maxMsgs: 40})
	rec := &recorder{}
	_, stop := w.mirror(t, "late", rec.handle)
	var students []*studentv1.Student
	for i := range 10 {
		students = append(students, w.create(t, fmt.Sprintf("s%02d", i), "china"))
	}
	w.waitAcked(t, "late", 10)
	stop()
	for i := 10; i < 40; i++ {
		w.create(t, fmt.Sprintf("s%02d", i), "china")
	}
	w.waitSequences(t, 0, 40)
	for round := range 3 {
		for _, s := range students {
			w.update(t, s, fmt.Sprintf("school-%d", round))
		}
		w.waitSequences(t, 0, uint64(40+10*(round+1)))
	}
	w.waitSequences(t, 31, 70)
	m, _ := w.mirror(t, "late", rec.handle)
	w.waitSame(t, m)
}
