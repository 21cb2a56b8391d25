package statusview

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unique"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/sink"
)

func failing(s studentv1.StudentStatus) bool {
	c := meta.FindStatusCondition(s.Conditions, studentv1.ConditionPublished)
	return c != nil && c.Status == metav1.ConditionFalse
}

// TrimStatus is status as the bridge's cache keeps it: lastPublished
// without the spec and labels that were published (the record store has
// them; the cache need not hold them twice), and the Published condition
// without its message where the message says only what lastPublished does
// (publishedMessage). The view is trimmed alike before it is compared with
// what the cache holds, so statuses that differ still differ trimmed.
func TrimStatus(s studentv1.StudentStatus) studentv1.StudentStatus {
	if s.LastPublished == nil {
		return s
	}
	lp := *s.LastPublished
	lp.Spec, lp.Labels = studentv1.StudentSpec{}, nil
	s.LastPublished = &lp
	i := slices.IndexFunc(s.Conditions, func(c metav1.Condition) bool { return c.Type == studentv1.ConditionPublished })
	if i >= 0 && s.Conditions[i].Reason == studentv1.ReasonPublished && isPublishedMessage(s.Conditions[i].Message, &lp) {
		s.Conditions = slices.Clone(s.Conditions) // the caller's stay whole
		s.Conditions[i].Message = ""
	}
	return s
}

// TrimForCache is what the bridge's cache keeps of a Student it watches:
// no managed fields nor annotations (never published nor read), the status
// trimmed (TrimStatus), and the strings most Students share (namespace,
// finalizers, the event type, the conditions' type, status and reason)
// held once rather than once per Student.
func TrimForCache(s *studentv1.Student) {
	s.ManagedFields = nil
	s.Annotations = nil
	s.Namespace = intern(s.Namespace)
	for i, f := range s.Finalizers {
		s.Finalizers[i] = intern(f)
	}
	s.Status = TrimStatus(s.Status)
	if lp := s.Status.LastPublished; lp != nil {
		lp.Type = intern(lp.Type)
	}
	for i := range s.Status.Conditions {
		c := &s.Status.Conditions[i]
		c.Type, c.Status, c.Reason = intern(c.Type), metav1.ConditionStatus(intern(string(c.Status))), intern(c.Reason)
	}
}

// intern returns s held once for the process: a string many Students share
// (a namespace, an event type) costs its bytes once, not once per Student.
func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// publishedMessage is the message of the Published condition once last is
// what the Student shows.
func publishedMessage(last *studentv1.PublishedEvent) string {
	return fmt.Sprintf("%s %s published as stream sequence %d", last.Type, last.ID, last.Sequence)
}

// isPublishedMessage reports whether m is publishedMessage(last), without
// building it.
func isPublishedMessage(m string, last *studentv1.PublishedEvent) bool {
	rest, ok := strings.CutPrefix(m, last.Type)
	for _, part := range []string{" ", last.ID, " published as stream sequence "} {
		if !ok {
			return false
		}
		rest, ok = strings.CutPrefix(rest, part)
	}
	var digits [20]byte
	return ok && rest == string(strconv.AppendInt(digits[:0], last.Sequence, 10))
}

// View is the status stu shows, given the event last published for it
// (nil if none) and the last publish failure (nil if none). Conditions
// other than Published are kept as they are.
func View(stu *studentv1.Student, last *studentv1.PublishedEvent, failure error) studentv1.StudentStatus {
	s := *stu.Status.DeepCopy()
	s.LastPublished = last.DeepCopy()
	s.ObservedGeneration = stu.Generation
	meta.SetStatusCondition(&s.Conditions, publishedCondition(stu, last, failure))
	return s
}

// publishedCondition is the Published condition of stu: False with the
// last failure, True once what was last published is its current state,
// Unknown (Pending) before.
func publishedCondition(stu *studentv1.Student, last *studentv1.PublishedEvent, pubErr error) metav1.Condition {
	c := metav1.Condition{
		Type:               studentv1.ConditionPublished,
		ObservedGeneration: stu.Generation,
	}
	switch {
	case pubErr != nil:
		c.Status = metav1.ConditionFalse
		c.Reason = FailureReason(pubErr)
		c.Message = pubErr.Error()
	case last != nil && contract.NextChange(stu, last) == "":
		c.Status = metav1.ConditionTrue
		c.Reason = studentv1.ReasonPublished
		c.Message = publishedMessage(last)
	default:
		c.Status = metav1.ConditionUnknown
		c.Reason = "Pending"
		c.Message = "the current state is not published yet"
	}
	return c
}

// FailureReason is the reason a publish failure shows in the Published
// condition and its Warning Event: Invalid for an event the broker can
// never take (too large), PublishFailed for anything retried.
func FailureReason(err error) string {
	if errors.Is(err, sink.ErrTooLarge) {
		return studentv1.ReasonInvalid
	}
	return studentv1.ReasonPublishFailed
}
