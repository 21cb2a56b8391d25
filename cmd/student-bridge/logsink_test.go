package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	uzap "go.uber.org/zap"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// emit logs what a reconcile's logger does: values added in two steps, a
// line, an error, and a line below the level.
func emit(l logr.Logger) {
	l = l.WithName("bridge").WithValues("Student", klog.KRef("default", "wang"), "namespace", "default", "name", "wang")
	l = l.WithValues("reconcileID", "r1")
	l.Info("published", "type", "created", "sequence", 1)
	l.Error(errors.New("boom"), "Reconciler error", "attempt", 2)
	l.V(1).Info("not written", "x", 3)
}

// lines decodes each JSON line, without its time and stack trace.
func lines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not JSON: %q", line)
		}
		delete(m, "ts")
		delete(m, "stacktrace")
		out = append(out, m)
	}
	return out
}

// TestLazyValuesWritesWhatZapWrites: the lines, their fields and the
// caller zap names are those of the zap logger without lazyValues.
func TestLazyValuesWritesWhatZapWrites(t *testing.T) {
	var direct, lazy bytes.Buffer
	opts := func(b *bytes.Buffer) zap.Opts {
		return func(o *zap.Options) {
			o.DestWriter = b
			o.ZapOpts = append(o.ZapOpts, uzap.AddCaller())
		}
	}
	emit(zap.New(opts(&direct)))
	emit(newLazyValues(zap.New(opts(&lazy))))
	want, got := lines(t, &direct), lines(t, &lazy)
	if len(want) != 2 {
		t.Fatalf("zap wrote %d lines, want 2: %v", len(want), want)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("lazyValues wrote\n%v\nzap wrote\n%v", got, want)
	}
	if c, _ := want[0]["caller"].(string); !strings.HasPrefix(c, "student-bridge/logsink_test.go:") {
		t.Fatalf("caller %q, want emit's line", c)
	}
}

// countingSink counts the values handed to it by WithValues.
type countingSink struct {
	logr.LogSink
	withValues int
	info       [][]any
}

func (c *countingSink) Init(logr.RuntimeInfo)  {}
func (c *countingSink) Enabled(level int) bool { return level == 0 }
func (c *countingSink) Info(_ int, _ string, kv ...any) {
	c.info = append(c.info, kv)
}
func (c *countingSink) WithValues(...any) logr.LogSink { c.withValues++; return c }

// TestLazyValuesKeepsValuesUntilALine: loggers made with values and never
// written to cost the sink nothing; a line gets all their values, in order.
func TestLazyValuesKeepsValuesUntilALine(t *testing.T) {
	sink := &countingSink{}
	base := newLazyValues(logr.New(sink))
	for i := range 100 {
		l := base.WithValues("Student", "default/wang", "name", "wang").WithValues("reconcileID", i)
		l.V(1).Info("below the level")
		if i == 99 {
			l.Info("written", "type", "created")
		}
	}
	if sink.withValues != 0 {
		t.Fatalf("the sink was handed values %d times for loggers that wrote one line", sink.withValues)
	}
	want := [][]any{{"Student", "default/wang", "name", "wang", "reconcileID", 99, "type", "created"}}
	if !reflect.DeepEqual(sink.info, want) {
		t.Fatalf("the line carried %v, want %v", sink.info, want)
	}
}
