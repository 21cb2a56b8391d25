package main

import (
	"slices"

	"github.com/go-logr/logr"
)

// lazyValues is a logr.LogSink that keeps the values WithValues adds and
// hands them to the sink under it only with a line it writes. zap encodes
// them at once, and controller-runtime adds four to a logger made for each
// reconcile (the Student, its namespace and name, the reconcile's id), of
// which almost none writes a line: under load, a visible share of the
// bridge's CPU went to encoding values nobody read. The lines are the same:
// the values come before the line's own, as zap puts them.
type lazyValues struct {
	sink logr.LogSink
	kv   []any
}

// newLazyValues wraps l's sink. That sink was initialized for logr's own
// frame when l was made; it is told of lazyValues' frame here, so the
// caller zap reports stays the caller's.
func newLazyValues(l logr.Logger) logr.Logger {
	sink := l.GetSink()
	if s, ok := sink.(logr.CallDepthLogSink); ok {
		sink = s.WithCallDepth(1)
	}
	return logr.New(&lazyValues{sink: sink})
}

// Init does nothing: the sink under it is initialized (newLazyValues).
func (l *lazyValues) Init(logr.RuntimeInfo) {}

func (l *lazyValues) Enabled(level int) bool { return l.sink.Enabled(level) }

func (l *lazyValues) Info(level int, msg string, kv ...any) {
	l.sink.Info(level, msg, l.with(kv)...)
}

func (l *lazyValues) Error(err error, msg string, kv ...any) {
	l.sink.Error(err, msg, l.with(kv)...)
}

func (l *lazyValues) WithValues(kv ...any) logr.LogSink {
	if len(l.kv) == 0 {
		kv = slices.Clone(kv) // the caller's slice, kept
	}
	return &lazyValues{sink: l.sink, kv: l.with(kv)}
}

func (l *lazyValues) WithName(name string) logr.LogSink {
	return &lazyValues{sink: l.sink.WithName(name), kv: l.kv}
}

func (l *lazyValues) WithCallDepth(depth int) logr.LogSink {
	if s, ok := l.sink.(logr.CallDepthLogSink); ok {
		return &lazyValues{sink: s.WithCallDepth(depth), kv: l.kv}
	}
	return l
}

// with is l's values, then kv, in a slice of its own (l.kv is shared by
// the loggers made from l).
func (l *lazyValues) with(kv []any) []any {
	if len(l.kv) == 0 {
		return kv
	}
	return append(l.kv[:len(l.kv):len(l.kv)], kv...)
}
