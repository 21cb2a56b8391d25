package main

import (
	"fmt"
	"strings"
	"time"
)

// Scale is the memory, restart and failover phases (-students) as data:
// the bridge as a process of its own at each count of Students, then the
// receipts it holds, what its restarts republished, and three replicas'
// failover over the same Students. Durations are in milliseconds, memory
// in MB (of 2^20 bytes for RSS, as /proc reports it in KB; of 10^6 bytes
// for the Go heap, as the runtime's metric is read).
type Scale struct {
	// SettleWindow, SettleBound: steady memory is sampled once RSS moved
	// less than 1% in the window after a garbage collection, or at the
	// bound.
	SettleWindow string `json:"settleWindow"`
	SettleBound  string `json:"settleBound"`
	// MemoryLimit is the deployments' container memory limit, which the
	// limited rows run under (GOMEMLIMIT 90% of it).
	MemoryLimit string `json:"memoryLimit"`
	// RestartReps is how many restarts, and starts of the raw informer's
	// process, each restart row has.
	RestartReps int `json:"restartReps"`
	// LoadRate, LoadDeletes and LoadSteady are the restart under load's
	// changes per second, most deletes while down, and steady window.
	LoadRate    int    `json:"loadRate"`
	LoadDeletes int    `json:"loadDeletes"`
	LoadSteady  string `json:"loadSteady"`
	// Rest is the process with no Student.
	Rest   Memory       `json:"rest"`
	Counts []ScaleCount `json:"counts"`
	// Receipts is the memory of two services' receipts for every Student
	// left after the last count.
	Receipts Receipts `json:"receipts"`
	// Republished counts the events the restarts with every Student
	// published sent: nothing should be.
	Republished uint64   `json:"republished"`
	Failover    Failover `json:"failover"`
}

// Memory is a process's memory at one moment.
type Memory struct {
	RSSMB  float64 `json:"rssMB"`
	HeapMB float64 `json:"heapMB"`
}

// memoryOf is the memory of RSS in KB and the heap in MB.
func memoryOf(rssKB int64, heapMB float64) Memory {
	return Memory{RSSMB: float64(rssKB) / 1024, HeapMB: heapMB}
}

// ScaleCount is the bridge process at one count of Students.
type ScaleCount struct {
	Students int `json:"students"`
	// Publishing is 3 s after the last Student was published.
	Publishing Memory `json:"publishing"`
	// AfterRestart is 3 s after a restart's catch-up ended; Steady once
	// settled (in SettledMs; Bounded if at the bound). Limited: the
	// same with the deployments' memory limit.
	AfterRestart        Memory  `json:"afterRestart"`
	Steady              Memory  `json:"steady"`
	SettledMs           float64 `json:"settledMs"`
	Bounded             bool    `json:"bounded,omitempty"`
	AfterRestartLimited Memory  `json:"afterRestartLimited"`
	SteadyLimited       Memory  `json:"steadyLimited"`
	SettledLimitedMs    float64 `json:"settledLimitedMs"`
	BoundedLimited      bool    `json:"boundedLimited,omitempty"`
	// Restart is a restart with every Student published; UnderLoad one
	// while Students change.
	Restart   Restart          `json:"restart"`
	UnderLoad RestartUnderLoad `json:"underLoad"`
}

// Restart is the restarts with every Student published against a raw
// informer's sync, each list sorted.
type Restart struct {
	// Students are those left (restarts under load deleted some).
	Students int     `json:"students"`
	ReadyMs  float64 `json:"readyMs"`
	// CaughtUpMs: from each start until its catch-up ended; CatchUpMs:
	// of it, the catch-up (student_bridge_catch_up_duration_seconds).
	CaughtUpMs []float64 `json:"caughtUpMs"`
	CatchUpMs  []float64 `json:"catchUpMs"`
	// InformerProcessMs: the raw informer started as a process of its
	// own, until synced; InformerMs: in the benchmark's process.
	InformerProcessMs []float64 `json:"informerProcessMs"`
	InformerMs        float64   `json:"informerMs"`
}

// Latencies are the p50 and p99 of N changes' latencies (0 without any).
type Latencies struct {
	P50ms float64 `json:"p50ms"`
	P99ms float64 `json:"p99ms"`
	N     int     `json:"n"`
}

// latenciesOf are the latencies of sorted d.
func latenciesOf(d []time.Duration) Latencies {
	if len(d) == 0 {
		return Latencies{}
	}
	return Latencies{P50ms: toMS(d[len(d)*50/100]), P99ms: toMS(d[len(d)*99/100]), N: len(d)}
}

// RestartUnderLoad is a restart while a generator changes Students, with
// some deleted while the bridge was down.
type RestartUnderLoad struct {
	Students           int     `json:"students"`
	IdleCatchUpMs      float64 `json:"idleCatchUpMs"`
	CatchUpMs          float64 `json:"catchUpMs"`
	Deletes            int     `json:"deletes"`
	DeletesPublishedMs float64 `json:"deletesPublishedMs"`
	// Steady: the live changes before the stop; During: made from the
	// start until the catch-up ended; AfterPublishing: of those, made
	// once the bridge could publish (CouldPublishMs after the start).
	Steady          Latencies `json:"steady"`
	During          Latencies `json:"during"`
	CouldPublishMs  float64   `json:"couldPublishMs"`
	AfterPublishing Latencies `json:"afterPublishing"`
	// InformerSyncedMs: a raw informer's process started under the same
	// load, until synced; InformerDuring: the changes made meanwhile.
	InformerSyncedMs float64   `json:"informerSyncedMs"`
	InformerDuring   Latencies `json:"informerDuring"`
}

// Receipts is the bridge's memory with two services' receipts.
type Receipts struct {
	Students int `json:"students"`
	Receipts int `json:"receipts"`
	// Before they were written, once read, and steady after a restart.
	Before Memory `json:"before"`
	Read   Memory `json:"read"`
	Steady Memory `json:"steady"`
}

// Failover is three replicas over 16 shards, one SIGKILLed.
type Failover struct {
	Students    int     `json:"students"`
	PublishedMs float64 `json:"publishedMs"`
	// Replicas at rest, every Student published.
	Replicas []ReplicaAtRest `json:"replicas"`
	// PerShard Students of every shard changed right after the kill;
	// those of the killed replica's MovedShards shards were published
	// MovedFirstMs to MovedLastMs after it, the others' by StayedLastMs.
	PerShard     int     `json:"perShard"`
	MovedShards  int     `json:"movedShards"`
	MovedFirstMs float64 `json:"movedFirstMs"`
	MovedLastMs  float64 `json:"movedLastMs"`
	StayedLastMs float64 `json:"stayedLastMs"`
	// Loads of gained shards by the survivors, and their time in all.
	Loads   float64 `json:"loads"`
	LoadsMs float64 `json:"loadsMs"`
}

// ReplicaAtRest is one replica's memory and shards.
type ReplicaAtRest struct {
	Memory
	Shards float64 `json:"shards"`
}

// settledIn shows how long memory took to settle.
func settledIn(ms float64, bounded bool) string {
	s := fromMS(ms).Round(time.Second).String()
	if bounded {
		s += " (bound)"
	}
	return s
}

// msOfList is d in milliseconds (msList undoes it).
func msOfList(d []time.Duration) []float64 {
	out := make([]float64, len(d))
	for i, x := range d {
		out[i] = toMS(x)
	}
	return out
}

func msList(ms []float64) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = fromMS(m)
	}
	return out
}

func roundedMS(ms float64) string { return rounded(fromMS(ms)) }

func msOf(x float64) string { return ms(fromMS(x)) }

// restartTable is the scale phases' restart with every Student published,
// against a raw informer's sync.
func restartTable(s Scale) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Restart with every Student published: ready (/readyz), caught up (the start's catch-up ended: every Student that needed a reconcile had it; "+
		"one published as it is needs none), against a raw informer's sync of the same Students (a new cache, list and watch): "+
		"started as a process of its own, as a controller restarts (the reference), and in the benchmark's running process. "+
		"Restarts and the informer's process alternate, %d of each: median (min-max); ready is of the first.\n\n"+
		"| Students | ready | caught up | of it, the catch-up | raw informer process: synced after | caught up / informer process | raw informer in this process: synced after | caught up / it |\n"+
		"| --- | --- | --- | --- | --- | --- | --- | --- |\n", s.RestartReps)
	for _, c := range s.Counts {
		r := c.Restart
		caughtUp, informers := msList(r.CaughtUpMs), msList(r.InformerProcessMs)
		fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %.2fx | %s | %.2fx |\n", r.Students, roundedMS(r.ReadyMs), spreadAs(caughtUp, rounded),
			spreadAs(msList(r.CatchUpMs), rounded), spreadAs(informers, rounded), median(caughtUp).Seconds()/median(informers).Seconds(),
			roundedMS(r.InformerMs), median(caughtUp).Seconds()/fromMS(r.InformerMs).Seconds())
	}
	return b.String()
}

// scaleTables are the tables of the memory, restart and failover phases.
func scaleTables(s Scale) string {
	var b strings.Builder
	b.WriteString("Memory of the bridge process (RSS and Go heap in use, from its own /metrics). \"Publishing\" is 3 s after the " +
		"last of the Students was published, with what creating them left for the garbage collector. " +
		"\"Steady\" is after a restart with every Student already published, the cost of watching them, once settled: " +
		"after a garbage collection, RSS moving less than 1% in " + s.SettleWindow + " (bounded at " + s.SettleBound + "); " +
		"\"after a restart\" is 3 s after its catch-up ended, with the list's peak still held: what a memory limit must allow. " +
		"Without a memory limit, and with the deployments' memoryLimit (" + s.MemoryLimit + ": GOMEMLIMIT 90% of it).\n\n" +
		"| Students | RSS MB publishing | heap MB publishing | RSS MB after a restart | RSS MB steady | heap MB steady | settled after | " +
		"RSS MB after a restart, memoryLimit | RSS MB steady, memoryLimit | heap MB steady, memoryLimit | settled after |\n" +
		"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	fmt.Fprintf(&b, "| 0 | %.1f | %.1f | - | %.1f | %.1f | - | - | - | - | - |\n", s.Rest.RSSMB, s.Rest.HeapMB, s.Rest.RSSMB, s.Rest.HeapMB)
	for _, c := range s.Counts {
		fmt.Fprintf(&b, "| %d | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %.1f | %.1f | %.1f | %s |\n", c.Students, c.Publishing.RSSMB, c.Publishing.HeapMB,
			c.AfterRestart.RSSMB, c.Steady.RSSMB, c.Steady.HeapMB, settledIn(c.SettledMs, c.Bounded),
			c.AfterRestartLimited.RSSMB, c.SteadyLimited.RSSMB, c.SteadyLimited.HeapMB, settledIn(c.SettledLimitedMs, c.BoundedLimited))
	}
	if len(s.Counts) == 0 {
		return b.String()
	}
	lo, hi := s.Counts[0], s.Counts[len(s.Counts)-1]
	if hi.Students > lo.Students {
		n := float64(hi.Students - lo.Students)
		fmt.Fprintf(&b, "\nSteady RSS slope between %d and %d Students: %.2f KB per Student (with memoryLimit: %.2f KB); at %d, %.2f KB per Student (%.2f KB with memoryLimit), the process at rest with none subtracted.\n",
			lo.Students, hi.Students, (hi.Steady.RSSMB-lo.Steady.RSSMB)*1024/n, (hi.SteadyLimited.RSSMB-lo.SteadyLimited.RSSMB)*1024/n,
			hi.Students, (hi.Steady.RSSMB-s.Rest.RSSMB)*1024/float64(hi.Students), (hi.SteadyLimited.RSSMB-s.Rest.RSSMB)*1024/float64(hi.Students))
	}

	b.WriteString("\n" + restartTable(s))
	fmt.Fprintf(&b, "\nRestart under load: a generator changes Students at %d/s; the bridge is stopped, %d Students are deleted (per count, at most a tenth), "+
		"and it starts again while the changes go on. The idle catch-up is the median of the restarts above. Steady is the live changes' latency (change to its event on NATS) in the %s before the stop; "+
		"during the catch-up, of the changes made from the start until the catch-up ended, and of those made after the bridge could publish "+
		"(student_bridge_publishing_start_time_seconds: its records loaded and its cache synced; nothing is published before), and how long after the start that was. "+
		"The reference: a raw informer started as a process under the same load (as the restarts' reference, the bridge running), how long until it synced, "+
		"and how long the changes made from its start until then took to reach it: a change made while a controller lists waits for the list.\n\n"+
		"| Students | catch-up, idle | catch-up, under load | ratio | deletes made while down, published after | live p50 / p99 ms, steady | live p50 / p99 ms, during the catch-up | p99 ratio | "+
		"could publish after | live p50 / p99 ms, after it could publish | p99 ratio | "+
		"raw informer, synced after | its live p50 / p99 ms during its start | bridge / informer p99 |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
		s.LoadRate, s.LoadDeletes, s.LoadSteady)
	// ratio is a's p99 over b's, "-" without both.
	ratio := func(a, b Latencies) string {
		if b.P99ms == 0 || a.N == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1fx", a.P99ms/b.P99ms)
	}
	for _, c := range s.Counts {
		l := c.UnderLoad
		fmt.Fprintf(&b, "| %d | %s | %s | %.2fx | %d, %s after the start | %s / %s | %s / %s (%d changes) | %s | %s | %s / %s (%d changes) | %s | %s | %s / %s (%d changes) | %s |\n",
			l.Students, roundedMS(l.IdleCatchUpMs), roundedMS(l.CatchUpMs), l.CatchUpMs/l.IdleCatchUpMs, l.Deletes, roundedMS(l.DeletesPublishedMs),
			msOf(l.Steady.P50ms), msOf(l.Steady.P99ms), msOf(l.During.P50ms), msOf(l.During.P99ms), l.During.N, ratio(l.During, l.Steady),
			roundedMS(l.CouldPublishMs), msOf(l.AfterPublishing.P50ms), msOf(l.AfterPublishing.P99ms), l.AfterPublishing.N, ratio(l.AfterPublishing, l.Steady),
			roundedMS(l.InformerSyncedMs), msOf(l.InformerDuring.P50ms), msOf(l.InformerDuring.P99ms), l.InformerDuring.N, ratio(l.During, l.InformerDuring))
	}

	rc := s.Receipts
	fmt.Fprintf(&b, "\nWith two services' receipts for each of the %d Students (%d receipts): RSS %.1f MB, heap %.1f MB once read (%.1f MB, %.1f MB before); steady after a restart RSS %.1f MB, heap %.1f MB: %.2f KB RSS per Student more than without (steady).\n",
		rc.Students, rc.Receipts, rc.Read.RSSMB, rc.Read.HeapMB, rc.Before.RSSMB, rc.Before.HeapMB, rc.Steady.RSSMB, rc.Steady.HeapMB,
		(rc.Steady.RSSMB-hi.Steady.RSSMB)*1024/float64(rc.Students))
	fmt.Fprintf(&b, "\nEvents republished by the restarts with every Student published: %d.\n", s.Republished)

	f := s.Failover
	fmt.Fprintf(&b, "\nFailover at %d Students: three replicas over 16 shards as processes, Lease timing as shipped (15s / 10s / 2s), no Kubernetes Events; "+
		"every Student published by them after %s. Memory of each replica at rest:", f.Students, roundedMS(f.PublishedMs))
	for i, r := range f.Replicas {
		fmt.Fprintf(&b, " replica %d RSS %.1f MB, heap %.1f MB (%v shards);", i+1, r.RSSMB, r.HeapMB, r.Shards)
	}
	fmt.Fprintf(&b, "\nThe other two restarted once (as a rolling update would), then one replica SIGKILLed, %d Students of every shard changed at once: the changes of its %d shards published after %s (first) to %s (last) from the kill; "+
		"of the other shards' after at most %s. The survivors loaded the gained shards in %.0f loads taking %s in all (of the pause).\n",
		f.PerShard, f.MovedShards, roundedMS(f.MovedFirstMs), roundedMS(f.MovedLastMs), roundedMS(f.StayedLastMs), f.Loads, roundedMS(f.LoadsMs))
	return b.String()
}
