package reconciler_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/reconciler"
)

// TestWatchSyncedAfterTheInitialList: the controller starts its workers
// once the Students' watch says it synced, and the start's catch-up
// counts what was queued until then, so the handler must have been given
// every Student of the initial list by then. After it, the watch hands
// on what passes the predicates: an update they drop never reaches the
// handler, a delete does.
func TestWatchSyncedAfterTheInitialList(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := stacktest.Namespace(t, st.Client, "watch")
	const n = 40
	for i := range n {
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("s%d", i)}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
		if err := st.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	c, err := cache.New(st.RestConfig, cache.Options{Scheme: scheme.New(), DefaultNamespaces: map[string]cache.Config{ns: {}}})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()

	var initial, updates atomic.Int32
	deleted := make(chan string, 1)
	h := handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if e.IsInInitialList {
				initial.Add(1)
			}
		},
		UpdateFunc: func(context.Context, event.UpdateEvent, workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			updates.Add(1)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, _ workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			deleted <- e.Object.GetName()
		},
	}
	noUpdates := predicate.Funcs{UpdateFunc: func(event.UpdateEvent) bool { return false }}
	w := reconciler.NewStudentWatch(c, h, noUpdates)
	q := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request]())
	defer q.ShutDown()
	if err := w.Start(ctx, q); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitForSync(ctx); err != nil {
		t.Fatal(err)
	}
	if got := initial.Load(); got != n {
		t.Fatalf("the watch said it synced with %d of the initial list's %d Students given to the handler", got, n)
	}

	s := &studentv1.Student{}
	if err := st.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "s0"}, s); err != nil {
		t.Fatal(err)
	}
	s.Spec.School = "beijing"
	if err := st.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := st.Client.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-deleted:
		if name != "s0" {
			t.Fatalf("the handler was given the delete of %q, not of s0", name)
		}
	case <-ctx.Done():
		t.Fatal("the handler was never given the delete")
	}
	// One handler's events come in order: the update came before the
	// delete, or never.
	if got := updates.Load(); got != 0 {
		t.Fatalf("the handler was given %d update(s) the predicate drops", got)
	}
}
