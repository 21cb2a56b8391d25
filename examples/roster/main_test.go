package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridgetest"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var st *stack.Stack

func TestMain(m *testing.M) {
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// TestRosterWalkthrough is the walkthrough of docs/services.md: with the example
// running, the Student shows 1/1; stopped, an edit shows 0/1 (Behind);
// started again, it catches up: 1/1.
func TestRosterWalkthrough(t *testing.T) {
	ctx := context.Background()
	w := bridgetest.Start(t, st, "roster")
	var out stacktest.Buffer
	start := func() func() {
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- run(rctx, []string{"--nats-url", st.NATS.URL(), "--stream", w.Config.NATS.Stream.Name,
				"--subjects", w.Config.NATS.SubjectPrefix + ".>", "--receipts-bucket", w.Config.Receipts.Bucket}, &out)
		}()
		return func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("roster: %v", err)
			}
		}
	}
	stop := start()
	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: "object-name"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	shows := func(inSync, state string) {
		t.Helper()
		if err := stacktest.Eventually(30*time.Second, func() error {
			var s studentv1.Student
			if err := st.Client.Get(ctx, client.ObjectKeyFromObject(stu), &s); err != nil {
				return err
			}
			c := meta.FindStatusCondition(s.Status.Conditions, studentv1.ConditionInSync)
			if s.Status.ServicesInSync != inSync || len(s.Status.Services) != 1 || s.Status.Services[0].State != state || c == nil {
				return fmt.Errorf("servicesInSync %q, services %+v", s.Status.ServicesInSync, s.Status.Services)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	shows("1/1", studentv1.ServiceInSync)
	stop()

	bridgetest.Patch(t, st.Client, stu.DeepCopy(), func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	shows("0/1", studentv1.ServiceBehind)

	stop = start()
	defer stop()
	shows("1/1", studentv1.ServiceInSync)
	for _, line := range []string{"enrolled " + w.Namespace + "/object-name at china", "updated  " + w.Namespace + "/object-name at tsinghua"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("roster printed %q, want a line %q", out.String(), line)
		}
	}
}
