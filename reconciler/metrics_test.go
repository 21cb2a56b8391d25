package reconciler_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/student-bridge/student-bridge/reconciler"
	"github.com/student-bridge/student-bridge/sink"
)

// TestErrorReasonNamesEachSinkError: a failed publish is counted under the
// reason of the sink error it wraps, however deep, so that an operator's
// alert on "other" means an error nobody has named yet. A record write that
// timed out in a partition and landed after all comes back as a conflict on
// its retry: that is "conflict", not "other".
func TestErrorReasonNamesEachSinkError(t *testing.T) {
	wrap := func(err error) error {
		return fmt.Errorf("record %s before it goes out: write record %s: %w", "e1", "u1", err)
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{wrap(sink.ErrUnavailable), "unavailable"},
		{wrap(sink.ErrNotConnected), "not_connected"},
		{wrap(sink.ErrRejected), "rejected"},
		{wrap(sink.ErrTooLarge), "too_large"},
		{wrap(sink.ErrClosed), "closed"},
		{wrap(sink.ErrConflict), "conflict"},
		// A flush of several held-back records fails with each one's error:
		// the first named reason in the list counts it.
		{errors.Join(wrap(sink.ErrConflict), wrap(sink.ErrUnavailable)), "unavailable"},
		{errors.New("something new"), "other"},
	} {
		if got := reconciler.ErrorReason(c.err); got != c.want {
			t.Errorf("ErrorReason(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
