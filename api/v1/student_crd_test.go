//go:build !nostack

package v1_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

func sample(t *testing.T) *studentv1.Student {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "configs", "samples", "student-instance.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var s studentv1.Student
	if err := yaml.UnmarshalStrict(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestSampleRoundTrips(t *testing.T) {
	ctx := context.Background()
	s := sample(t)
	s.Namespace = "default"
	if s.Name != "object-name" || s.Spec.Name != "wang" || s.Spec.School != "china" {
		t.Fatalf("sample is not the tutorial's instance: %+v", s)
	}
	if err := st.Client.Create(ctx, s); err != nil {
		t.Fatalf("sample rejected: %v", err)
	}
	t.Cleanup(func() { _ = st.Client.Delete(ctx, s) })

	var got studentv1.Student
	if err := st.Client.Get(ctx, client.ObjectKeyFromObject(s), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec != s.Spec || got.Name != "object-name" || got.UID == "" || got.Generation != 1 {
		t.Errorf("read back %+v, want spec %+v", got, s.Spec)
	}

	// Status is a subresource: the main resource ignores it, /status takes it.
	got.Status.ObservedGeneration = 7
	if err := st.Client.Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	if got.Status.ObservedGeneration != 0 {
		t.Errorf("an update of the main resource wrote status: %+v", got.Status)
	}
	got.Status = studentv1.StudentStatus{
		ObservedGeneration: 1,
		LastPublished: &studentv1.PublishedEvent{
			Type: studentv1.EventTypeCreated, ID: "abc", Time: metav1.Now().Rfc3339Copy(), Generation: 1, Sequence: 3,
			Spec: got.Spec, Labels: map[string]string{"a": "b"},
		},
		Conditions: []metav1.Condition{{Type: studentv1.ConditionPublished, Status: metav1.ConditionTrue, Reason: studentv1.ReasonPublished, LastTransitionTime: metav1.Now().Rfc3339Copy()}},
	}
	want := got.Status.DeepCopy()
	if err := st.Client.Status().Update(ctx, &got); err != nil {
		t.Fatal(err)
	}
	var again studentv1.Student
	if err := st.Client.Get(ctx, client.ObjectKeyFromObject(s), &again); err != nil {
		t.Fatal(err)
	}
	if again.Status.LastPublished == nil || !lastEqual(again.Status.LastPublished, want.LastPublished) {
		t.Errorf("status round trip: got %+v, want %+v", again.Status.LastPublished, want.LastPublished)
	}
	if len(again.Status.Conditions) != 1 || again.Status.Conditions[0].Type != studentv1.ConditionPublished {
		t.Errorf("conditions round trip: %+v", again.Status.Conditions)
	}
}

func lastEqual(a, b *studentv1.PublishedEvent) bool {
	return a.Type == b.Type && a.ID == b.ID && a.Time.Equal(&b.Time) && a.Generation == b.Generation &&
		a.Sequence == b.Sequence && a.Spec == b.Spec && fmt.Sprint(a.Labels) == fmt.Sprint(b.Labels)
}

// TestInvalidStudentsRejected sends raw objects, so that missing fields and
// wrong types reach the API server instead of being fixed by Go types.
func TestInvalidStudentsRejected(t *testing.T) {
	long := strings.Repeat("x", 257)
	cases := []struct {
		name string
		spec any // nil: no spec at all
		want string
	}{
		{"missing spec", nil, "spec: Required value"},
		{"missing name", map[string]any{"school": "china"}, "spec.name: Required value"},
		{"missing school", map[string]any{"name": "wang"}, "spec.school: Required value"},
		{"empty name", map[string]any{"name": "", "school": "china"}, "spec.name: Invalid value"},
		{"empty school", map[string]any{"name": "wang", "school": ""}, "spec.school: Invalid value"},
		{"name too long", map[string]any{"name": long, "school": "china"}, "spec.name: Too long"},
		{"school too long", map[string]any{"name": "wang", "school": long}, "spec.school: Too long"},
		{"name not a string", map[string]any{"name": 42, "school": "china"}, "spec.name: Invalid value"},
		{"school not a string", map[string]any{"name": "wang", "school": []any{"a"}}, "spec.school: Invalid value"},
		{"spec not an object", "wang", "spec: Invalid value"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "example.k8s.io/v1",
				"kind":       "Student",
				"metadata":   map[string]any{"name": fmt.Sprintf("bad-%d", i), "namespace": "default"},
			}}
			if tc.spec != nil {
				u.Object["spec"] = tc.spec
			}
			err := st.Client.Create(ctx, u)
			if err == nil {
				_ = st.Client.Delete(ctx, u)
				t.Fatalf("accepted %v", tc.spec)
			}
			if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) {
				t.Errorf("error is not Invalid/BadRequest: %v", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			// Nothing half-written is left behind.
			got := &unstructured.Unstructured{}
			got.SetAPIVersion("example.k8s.io/v1")
			got.SetKind("Student")
			if err := st.Client.Get(ctx, client.ObjectKeyFromObject(u), got); !apierrors.IsNotFound(err) {
				t.Errorf("after a rejected create, get returned %v", err)
			}
		})
	}
}

func TestShortNameAndColumns(t *testing.T) {
	dc, err := discovery.NewDiscoveryClientForConfig(st.RestConfig)
	if err != nil {
		t.Fatal(err)
	}
	res, err := dc.ServerResourcesForGroupVersion("example.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, r := range res.APIResources {
		if r.Name == "students" {
			found = true
			if fmt.Sprint(r.ShortNames) != "[stu]" || !r.Namespaced || r.Kind != "Student" {
				t.Errorf("students resource: %+v", r)
			}
		}
	}
	if !found {
		t.Fatalf("students not served: %+v", res.APIResources)
	}

	// The built kubectl resolves the short name and prints the columns.
	ctx := context.Background()
	s := sample(t)
	s.Namespace = "default"
	s.Name = "columns"
	if err := st.Client.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Client.Delete(ctx, s) })
	s.Status.ServicesInSync = "1/2"
	if err := st.Client.Status().Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	out := stacktest.Kubectl(t, stacktest.AdminKubeconfig(t, st.Env), "get", "stu", "-n", "default", "columns")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get stu printed %q", out)
	}
	if got := strings.Fields(lines[0]); strings.Join(got, " ") != "NAME STUDENT SCHOOL PUBLISHED IN-SYNC AGE" {
		t.Errorf("columns %v", got)
	}
	if got := strings.Fields(lines[1]); len(got) < 5 || got[0] != "columns" || got[1] != "wang" || got[2] != "china" || got[len(got)-2] != "1/2" {
		t.Errorf("row %v", got)
	}
}
