package studentwatch_test

import (
	"context"
	"os"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	codecs "k8s.io/apimachinery/pkg/runtime/serializer"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/studentwatch"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// TestSeesWhatControllerRuntimeSees watches and lists the same Students
// with this package's client and with the REST client controller-runtime's
// cache makes, against the API server: every event and every list item
// decodes to the same Student, including the labelled one the selector
// keeps and not the other.
func TestSeesWhatControllerRuntimeSees(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := stacktest.Namespace(t, st.Client, "watch")
	hc, err := rest.HTTPClientFor(st.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	scheme := st.Client.Scheme()
	ours, err := studentwatch.NewClient(st.RestConfig, hc, scheme)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := apiutil.RESTClientForGVK(studentv1.GroupVersion.WithKind("Student"), false, false, st.RestConfig, codecs.NewCodecFactory(scheme), hc)
	if err != nil {
		t.Fatal(err)
	}
	selector := labels.SelectorFromSet(labels.Set{"year": "1"})
	lws := []*toolscache.ListWatch{studentwatch.ListWatch(ours, ns, selector), studentwatch.ListWatch(theirs, ns, selector)}
	var watches []watch.Interface
	for _, lw := range lws {
		w, err := lw.WatchWithContext(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		watches = append(watches, w)
	}

	skipped := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "li"},
		Spec: studentv1.StudentSpec{Name: "li", School: "pku"}}
	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wang", Labels: map[string]string{"year": "1"}},
		Spec: studentv1.StudentSpec{Name: "王", School: "清华 \"china\""}}
	for _, s := range []*studentv1.Student{skipped, stu} {
		if err := st.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	stu.Spec.School = "pku"
	if err := st.Client.Update(ctx, stu); err != nil {
		t.Fatal(err)
	}
	var lists []runtime.Object
	for _, lw := range lws {
		l, err := lw.ListWithContext(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lists = append(lists, l)
	}
	if items := lists[0].(*studentv1.StudentList).Items; len(items) != 1 || items[0].Name != stu.Name {
		t.Fatalf("listed %v, want %s alone", items, stu.Name)
	}
	if !reflect.DeepEqual(lists[0], lists[1]) {
		t.Fatalf("lists differ:\n%+v\n%+v", lists[0], lists[1])
	}
	if err := st.Client.Delete(ctx, stu); err != nil {
		t.Fatal(err)
	}

	for _, want := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
		var got []watch.Event
		for _, w := range watches {
			got = append(got, next(ctx, t, w))
		}
		if got[0].Type != want || got[0].Object.(*studentv1.Student).Name != stu.Name {
			t.Fatalf("got %s of %+v, want %s of %s", got[0].Type, got[0].Object, want, stu.Name)
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Fatalf("%s events differ:\n%+v\n%+v", want, got[0], got[1])
		}
	}
}

// next is w's next event but bookmarks (their times are the server's to
// choose, not the same for two watches).
func next(ctx context.Context, t *testing.T, w watch.Interface) watch.Event {
	t.Helper()
	for {
		select {
		case ev := <-w.ResultChan():
			if ev.Type != watch.Bookmark {
				return ev
			}
		case <-ctx.Done():
			t.Fatal("no event")
		}
	}
}
