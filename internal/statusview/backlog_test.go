package statusview

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

func key(i int) types.NamespacedName {
	return types.NamespacedName{Namespace: "school", Name: fmt.Sprintf("s-%d", i)}
}

// TestBacklogOnceEachInOrder: a Student asked for again while it waits
// keeps its place and its first time; once taken, asking queues it again.
func TestBacklogOnceEachInOrder(t *testing.T) {
	b := newBacklog()
	t0 := time.Unix(1000, 0)
	for i := range 5 {
		b.add(key(i), t0.Add(time.Duration(i)*time.Second))
	}
	b.add(key(1), t0.Add(time.Hour)) // waiting: no second place, no later time
	ctx := context.Background()
	for i := range 5 {
		k, at, ok := b.next(ctx)
		if !ok || k != key(i) || !at.Equal(t0.Add(time.Duration(i)*time.Second)) {
			t.Fatalf("take %d: %v asked at %v (ok %v), want %v asked at %v", i, k, at, ok, key(i), t0.Add(time.Duration(i)*time.Second))
		}
		if i == 2 {
			b.add(key(2), t0.Add(time.Minute)) // asked again while written
		}
	}
	if k, at, ok := b.next(ctx); !ok || k != key(2) || !at.Equal(t0.Add(time.Minute)) {
		t.Fatalf("after the five: %v asked at %v (ok %v), want %v asked again at %v", k, at, ok, key(2), t0.Add(time.Minute))
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if k, _, ok := b.next(done); ok {
		t.Fatalf("an empty backlog gave %v", k)
	}
}

// TestBacklogWaitsForAKey: next waits for an add, and lets go on ctx.
// synctest.Wait returns once next is blocked waiting, so the add is the
// one that wakes it.
func TestBacklogWaitsForAKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newBacklog()
		got := make(chan types.NamespacedName, 1)
		go func() {
			k, _, _ := b.next(context.Background())
			got <- k
		}()
		synctest.Wait()
		select {
		case k := <-got:
			t.Fatalf("next gave %v from an empty backlog", k)
		default:
		}
		b.add(key(7), time.Now())
		synctest.Wait()
		select {
		case k := <-got:
			if k != key(7) {
				t.Fatalf("took %v, want %v", k, key(7))
			}
		default:
			t.Fatal("next did not wake up for an add")
		}
	})
}

// TestBacklogLetsGoOfADrainedRestart: what a restart queued (every
// Student) is given back once written, and a queue that never empties
// does not keep what was taken from it.
func TestBacklogLetsGoOfADrainedRestart(t *testing.T) {
	b := newBacklog()
	ctx := context.Background()
	for i := range 10000 {
		b.add(key(i), time.Time{})
	}
	for range 10000 {
		if _, _, ok := b.next(ctx); !ok {
			t.Fatal("backlog ended early")
		}
	}
	if b.asked != nil || b.order != nil {
		t.Fatalf("drained backlog holds a map of %d and a slice of capacity %d", len(b.asked), cap(b.order))
	}
	// A steady trickle: one in, one out, always one waiting.
	b.add(key(0), time.Time{})
	for i := 1; i < 10000; i++ {
		b.add(key(i), time.Time{})
		if _, _, ok := b.next(ctx); !ok {
			t.Fatal("backlog ended early")
		}
	}
	if c := cap(b.order); c > 64 {
		t.Fatalf("a backlog of one holds a slice of capacity %d", c)
	}
}

// TestBacklogUnchangedLast: the Students a start found published as they
// are wait behind every other ask, in their order and at the time they
// were asked for, and are let go of once taken.
func TestBacklogUnchangedLast(t *testing.T) {
	b := newBacklog()
	t0, t1 := time.Unix(1000, 0), time.Unix(2000, 0)
	for i := range 3 {
		b.addUnchanged(key(i), t0.Add(time.Duration(i)*time.Second)) // one time: the first
	}
	b.add(key(10), t1)
	b.add(key(1), t1) // asked again for a change: written first
	want := []struct {
		key types.NamespacedName
		at  time.Time
	}{{key(10), t1}, {key(1), t1}, {key(0), t0}, {key(1), t0}, {key(2), t0}}
	ctx := context.Background()
	for i, w := range want {
		k, at, ok := b.next(ctx)
		if !ok || k != w.key || !at.Equal(w.at) {
			t.Fatalf("take %d: %v asked at %v (ok %v), want %v asked at %v", i, k, at, ok, w.key, w.at)
		}
	}
	if b.unchanged != nil {
		t.Fatalf("drained backlog holds a list of capacity %d", cap(b.unchanged))
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if k, _, ok := b.next(done); ok {
		t.Fatalf("an empty backlog gave %v", k)
	}
}
