package reconciler

import (
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/statusview"
)

// View is the status stu should show now (the status writer's view
// function): statusview.View of its record and last failure, with the
// services' receipts.
func (r *StudentReconciler) View(stu *studentv1.Student) studentv1.StudentStatus {
	var failure error
	if v, ok := r.failures.Load(client.ObjectKeyFromObject(stu)); ok {
		failure = v.(error)
	}
	last := lastPublished(r.records.Get(stu.UID))
	s := statusview.View(stu, last, failure)
	r.receipts.ApplyTo(&s, string(stu.UID), last)
	return s
}
