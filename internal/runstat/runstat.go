// Package runstat reads what the process spent so far (CPU time, context
// switches, goroutines started), for benchmarks that report it per
// operation: on a busy machine the CPU an operation takes is steadier than
// its time, and a goroutine hand-off that parks a thread and wakes another
// shows in the context switches.
package runstat

import (
	"runtime/metrics"
	"syscall"
	"testing"
)

// Sample is what the process spent until it was taken.
type Sample struct {
	// CPU is the process's CPU time, user and system, in ns.
	CPU int64
	// Switches counts its threads' voluntary and involuntary context
	// switches (the kernel's count).
	Switches int64
	// Goroutines counts the goroutines it started.
	Goroutines uint64
}

// Take reads the process's counters.
func Take() Sample {
	var s Sample
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.CPU = ru.Utime.Nano() + ru.Stime.Nano()
		s.Switches = ru.Nvcsw + ru.Nivcsw
	}
	m := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(m)
	s.Goroutines = m[0].Value.Uint64()
	return s
}

// Report reports what the process spent since before, per iteration of b:
// goroutines/op, ctxsw/op and cpu-ns/op.
func Report(b *testing.B, before Sample) {
	b.Helper()
	now, n := Take(), float64(b.N)
	b.ReportMetric(float64(now.Goroutines-before.Goroutines)/n, "goroutines/op")
	b.ReportMetric(float64(now.Switches-before.Switches)/n, "ctxsw/op")
	b.ReportMetric(float64(now.CPU-before.CPU)/n, "cpu-ns/op")
}
