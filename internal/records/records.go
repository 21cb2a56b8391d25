// Package records keeps what the bridge published per Student: the
// record store (a JetStream key-value bucket, sink.Store), read once at a
// start and then kept current by the bridge's own writes.
package records

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
	"unique"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/sink"
)

const (
	resultSuccess = "success"
	resultError   = "error"
)

var (
	storeOps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "student_bridge_record_store_operations_total",
		Help: "Operations on the record store (the key-value bucket of what was published), by operation (load, get, put, delete) and result (success, conflict, error).",
	}, []string{"op", "result"})
	loadDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "student_bridge_record_store_load_duration_seconds",
		Help:    "How long reading the whole record store took at a start; nothing is published before.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
	})
	recordsGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_records",
		Help: "Students the bridge holds a published record of.",
	})
	unsavedGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "student_bridge_records_unsaved",
		Help: "Published records the record store has not accepted yet; while above 0 the bridge publishes nothing new.",
	})
)

var registerOnce sync.Once

// RegisterMetrics registers the records' metrics with controller-runtime's
// registry, once per process, every series at 0.
func RegisterMetrics() {
	registerOnce.Do(func() {
		metrics.Registry.MustRegister(storeOps, loadDuration, recordsGauge, unsavedGauge)
		for _, op := range []string{"load", "get", "put", "delete"} {
			for _, result := range []string{resultSuccess, "conflict", resultError} {
				storeOps.WithLabelValues(op, result)
			}
		}
	})
}

// Set is the bridge's memory of what it published: the record store
// (a sink.Store, a JetStream key-value bucket in production), loaded once
// and then kept current by the bridge's own writes. Reconciles read it
// instead of the Student's status.
//
// A record whose write failed stays in memory as unsaved: the event is out,
// so it must not be published again, and nothing new is published until the
// store takes the write (fail closed: a store that cannot record would let a
// restart republish everything).
//
// No round trip to the store is made under mu, which every reconcile and
// the informer's transform (Share) take: a store that stops answering
// holds up the Student whose record is being written, not the others.
type Set struct {
	store sink.Store

	// flushing is held by the one flusher writing unsaved records.
	flushing sync.Mutex

	mu     sync.Mutex
	byUID  map[types.UID]*entry
	byName map[types.NamespacedName][]types.UID
	loaded chan struct{}
	once   sync.Once
	// unsaved are the uids whose latest record the store has not taken.
	unsaved map[types.UID]struct{}
	// afterLoad is called once the first Load finished.
	afterLoad []func()
	// shown is what this Set added to the process's gauges.
	shown struct{ records, unsaved int }
}

type entry struct {
	rec      studentv1.StudentRecord
	revision uint64 // 0: not in the store
}

// New returns an empty Set; Load fills it from a store.
func New() *Set {
	return &Set{
		byUID:   map[types.UID]*entry{},
		byName:  map[types.NamespacedName][]types.UID{},
		loaded:  make(chan struct{}),
		unsaved: map[types.UID]struct{}{},
	}
}

// Load reads every record of store, which the Set then writes to.
func (r *Set) Load(ctx context.Context, store sink.Store) error {
	start := time.Now()
	all, err := readStore(ctx, store)
	if err != nil {
		return fmt.Errorf("load records: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.store = store
	clear(r.byUID)
	clear(r.byName)
	clear(r.unsaved)
	for _, sr := range all {
		r.setLocked(sr.rec, sr.revision, true)
	}
	r.gaugesLocked()
	loadDuration.Observe(time.Since(start).Seconds())
	r.once.Do(func() {
		close(r.loaded)
		for _, f := range r.afterLoad {
			f()
		}
		r.afterLoad = nil
	})
	return nil
}

// Committer is the store, if it stores events with their records (nil
// otherwise, or before the first Load).
func (r *Set) Committer() sink.Committer {
	r.mu.Lock()
	defer r.mu.Unlock()
	c, _ := r.store.(sink.Committer)
	return c
}

// WhenLoaded calls f once the first Load finished: at once if it has.
func (r *Set) WhenLoaded(f func()) {
	r.mu.Lock()
	if !r.Loaded() { // Load closes loaded under the lock
		r.afterLoad = append(r.afterLoad, f)
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	f()
}

// ReloadWhere replaces the records for which in is true with what the
// store holds: a replica that gained a shard takes over the records
// another replica wrote.
//
// A replica holds every record from its start, so most of the store is
// what it holds already: a record held at the revision the store has is
// not decoded again (decoding is most of a reload at scale, and a
// failover waits for the reload).
func (r *Set) ReloadWhere(ctx context.Context, in func(studentv1.StudentRecord) bool) error {
	if err := r.Wait(ctx); err != nil {
		return err
	}
	r.mu.Lock()
	held := make(map[types.UID]uint64, len(r.byUID))
	for uid, e := range r.byUID {
		if _, unsaved := r.unsaved[uid]; e.revision != 0 && !unsaved {
			held[uid] = e.revision
		}
	}
	r.mu.Unlock()
	same := map[types.UID]bool{}
	fresh, err := readStoreExcept(ctx, r.store, func(key string, revision uint64) bool {
		if held[types.UID(key)] == revision {
			same[types.UID(key)] = true
			return true
		}
		return false
	})
	if err != nil {
		return fmt.Errorf("reload records: %w", err)
	}
	stored := make(map[types.UID]storedRecord, len(fresh))
	for _, sr := range fresh {
		stored[sr.rec.UID] = sr
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for uid, e := range r.byUID {
		if !in(e.rec) || same[uid] {
			continue
		}
		// A record whose write failed (its event is out) stays over an
		// older one in the store: taking the store's would number the
		// next event as the one already out.
		if _, unsaved := r.unsaved[uid]; unsaved {
			if sr, ok := stored[uid]; ok && r.keepNewerLocked(uid, e, sr.rec, sr.revision) {
				delete(stored, uid)
				continue
			}
		}
		r.dropLocked(uid)
	}
	for _, sr := range fresh {
		if _, ok := stored[sr.rec.UID]; ok && in(sr.rec) {
			r.setLocked(sr.rec, sr.revision, true)
		}
	}
	r.gaugesLocked()
	return nil
}

// storedRecord is a record as the store holds it, at its revision.
type storedRecord struct {
	rec      studentv1.StudentRecord
	revision uint64
}

// readStore reads every record of store. A key that holds no record of a
// Student under its uid (another key, e.g. the shard count, or a value
// that is not ours to interpret) is left alone rather than guessed at.
func readStore(ctx context.Context, store sink.Store) ([]storedRecord, error) {
	return readStoreExcept(ctx, store, func(string, uint64) bool { return false })
}

// readStoreExcept is readStore without the keys skip says need no
// decoding.
func readStoreExcept(ctx context.Context, store sink.Store, skip func(key string, revision uint64) bool) ([]storedRecord, error) {
	all, err := store.Load(ctx)
	if err != nil {
		storeOps.WithLabelValues("load", resultError).Inc()
		return nil, err
	}
	storeOps.WithLabelValues("load", resultSuccess).Inc()
	// Sized once: grown by appends, a large store's slice is copied over
	// and over.
	n := 0
	for _, rec := range all {
		if !skip(rec.Key, rec.Revision) {
			all[n] = rec
			n++
		}
	}
	out := make([]storedRecord, 0, n)
	for _, rec := range all[:n] {
		if sr, ok := parseStored(rec.Key, rec); ok {
			// Held once, not once per record.
			sr.Namespace, sr.Published.Type = intern(sr.Namespace), intern(sr.Published.Type)
			out = append(out, storedRecord{rec: sr, revision: rec.Revision})
		}
	}
	return out, nil
}

// Stored reads every record from the store, as it is now (every replica's
// writes, not only this one's).
func (r *Set) Stored(ctx context.Context) ([]studentv1.StudentRecord, error) {
	if err := r.Wait(ctx); err != nil {
		return nil, err
	}
	r.mu.Lock()
	store := r.store
	r.mu.Unlock()
	all, err := readStore(ctx, store)
	if err != nil {
		return nil, fmt.Errorf("read records: %w", err)
	}
	out := make([]studentv1.StudentRecord, len(all))
	for i, sr := range all {
		out[i] = sr.rec
	}
	return out, nil
}

// Wait blocks until the first Load finished.
func (r *Set) Wait(ctx context.Context) error {
	select {
	case <-r.loaded:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting for the record store to load: %w", ctx.Err())
	}
}

// Loaded says whether the first Load finished.
func (r *Set) Loaded() bool {
	select {
	case <-r.loaded:
		return true
	default:
		return false
	}
}

// Get returns the record of uid.
func (r *Set) Get(uid types.UID) (studentv1.StudentRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byUID[uid]
	if !ok {
		return studentv1.StudentRecord{}, false
	}
	return e.rec, true
}

// InStore reports whether the record store holds a record of uid, read
// from the store itself: another replica may have written or removed it
// since this one last did.
func (r *Set) InStore(ctx context.Context, uid types.UID) (bool, error) {
	r.mu.Lock()
	store := r.store
	r.mu.Unlock()
	if store == nil {
		return false, errors.New("the records are not loaded yet")
	}
	_, err := store.Get(ctx, contract.RecordKey(uid))
	if errors.Is(err, sink.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// ForName returns the records of every uid that had name key, those keep
// (if not nil) is true for. A reconcile asks twice for those it has work
// for, of which there are none most of the time: none, no allocation.
func (r *Set) ForName(key types.NamespacedName, keep func(*studentv1.StudentRecord) bool) []studentv1.StudentRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []studentv1.StudentRecord
	for _, uid := range r.byName[key] {
		if rec := &r.byUID[uid].rec; keep == nil || keep(rec) {
			out = append(out, *rec)
		}
	}
	return out
}

// Share points the strings of s that equal its record's at the record's:
// the cache and the records then hold a Student's uid, name, published
// spec and the id its status names once, not twice. It is for a Student
// on its way into the cache (a transform), which nothing reads yet; one
// without a record, or before the records are loaded, keeps its own.
func (r *Set) Share(s *studentv1.Student) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byUID[s.UID]
	if !ok {
		return
	}
	rec := &e.rec
	s.UID = rec.UID
	s.Name = same(s.Name, rec.Name)
	s.Spec.Name = same(s.Spec.Name, rec.Published.Spec.Name)
	s.Spec.School = same(s.Spec.School, rec.Published.Spec.School)
	if lp := s.Status.LastPublished; lp != nil {
		lp.ID = same(lp.ID, rec.Published.ID)
	}
}

// same is held if it equals s, else s.
func same(s, held string) string {
	if s == held {
		return held
	}
	return s
}

// Len is the number of records.
func (r *Set) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.byUID)
}

// All returns every record.
func (r *Set) All() []studentv1.StudentRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]studentv1.StudentRecord, 0, len(r.byUID))
	for _, e := range r.byUID {
		out = append(out, e.rec)
	}
	return out
}

// Save writes rec to the store with compare-and-set. On a conflict the
// record is read again (another writer owns the truth) and the error wraps
// sink.ErrConflict. On any other failure rec is kept as unsaved and the
// error returned: the event it records is out and must not go out again.
//
// The write goes out without holding the lock, so reconciles of other
// Students read and write theirs meanwhile; a Student is never reconciled
// twice at once, so nobody else in this bridge writes the same key. While
// earlier records wait for the store (after a failure), rec joins them and
// the flusher writes them all.
func (r *Set) Save(ctx context.Context, rec studentv1.StudentRecord) error {
	uid := rec.UID
	r.mu.Lock()
	if len(r.unsaved) > 0 {
		r.mu.Unlock()
		// Under flushing, no write of uid's older record is in flight.
		r.flushing.Lock()
		defer r.flushing.Unlock()
		r.mu.Lock()
		r.setLocked(rec, r.revisionLocked(uid), false)
		r.mu.Unlock()
		return r.flushHeld(ctx)
	}
	revision := r.revisionLocked(uid)
	r.setLocked(rec, revision, true)
	e := r.byUID[uid]
	r.mu.Unlock()
	return r.put(ctx, uid, e, rec, revision)
}

// put writes rec, held as e for uid, over the store's revision, and
// settles the outcome. It takes the lock only around memory.
func (r *Set) put(ctx context.Context, uid types.UID, e *entry, rec studentv1.StudentRecord, revision uint64) error {
	value, err := encode(rec)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", uid, err)
	}
	newRevision, err := r.store.Put(ctx, contract.RecordKey(uid), value, revision)
	return r.settle(ctx, uid, e, newRevision, err)
}

// Commit writes rec with its event through commit (a sink.Committer's
// Commit of the record's key and value at the revision held), both or
// neither. On success rec is held at its new revision, with its event's
// stream sequence. On a conflict
// (another writer, or this very change committed by an attempt whose
// answer was lost) the record is read again and the error wraps
// sink.ErrConflict. On any other failure memory stays as it was: the
// event is not known to be out, and publishing it again is safe, since
// the record's fence refuses a second commit.
func (r *Set) Commit(ctx context.Context, rec studentv1.StudentRecord, commit func(key string, value []byte, revision uint64) (newRevision, eventSequence uint64, err error)) error {
	uid := rec.UID
	value, err := encode(rec)
	if err != nil {
		return fmt.Errorf("encode record %s: %w", uid, err)
	}
	r.mu.Lock()
	revision := r.revisionLocked(uid)
	r.mu.Unlock()
	newRevision, eventSequence, err := commit(contract.RecordKey(uid), value, revision)
	storeOps.WithLabelValues("put", opResult(err)).Inc()
	switch {
	case err == nil:
		rec.Published.Sequence = int64(eventSequence)
		r.mu.Lock()
		defer r.mu.Unlock()
		r.setLocked(rec, newRevision, true)
		r.gaugesLocked()
		return nil
	case errors.Is(err, sink.ErrConflict):
		r.reread(ctx, uid, nil)
	}
	return fmt.Errorf("commit record %s: %w", uid, err)
}

// settle records the outcome of writing entry e of uid: its new
// revision, or, on a conflict or a record that will never fit, what the
// store holds (another writer's record is the truth, and holding back one
// that never fits would block every other Student), or else e kept as
// unsaved. A conflict with a record older than e keeps e too: its event
// is out, and the record that says so must not be lost to an older one.
func (r *Set) settle(ctx context.Context, uid types.UID, e *entry, revision uint64, err error) error {
	storeOps.WithLabelValues("put", opResult(err)).Inc()
	r.mu.Lock()
	current := r.byUID[uid] == e
	switch {
	case err == nil:
		e.revision = revision
		if current {
			delete(r.unsaved, uid)
		}
		r.gaugesLocked()
		r.mu.Unlock()
		return nil
	case errors.Is(err, sink.ErrConflict) && current && !e.rec.Reserved():
		// The store may hold a record older than e, whose event is out
		// (the store took a write of ours whose answer was lost, say):
		// then e is written over it, not forgotten. A reservation's event
		// is not out: whoever wrote first keeps the number, and e is
		// forgotten.
		r.mu.Unlock()
		r.reread(ctx, uid, e)
	case errors.Is(err, sink.ErrConflict), errors.Is(err, sink.ErrTooLarge):
		r.mu.Unlock()
		r.reread(ctx, uid, nil)
	default:
		if current {
			r.unsaved[uid] = struct{}{}
		}
		r.gaugesLocked()
		r.mu.Unlock()
	}
	return fmt.Errorf("write record %s: %w", uid, err)
}

// Flush writes the records whose write failed before. It returns nil once
// the store holds everything this bridge published; only then may it
// publish again. While another reconcile's flush is under way it does not
// wait for it: it returns an error at once, and the caller tries again.
func (r *Set) Flush(ctx context.Context) error {
	if r.Unsaved() == 0 {
		return nil
	}
	if !r.flushing.TryLock() {
		return ErrFlushing
	}
	defer r.flushing.Unlock()
	return r.flushHeld(ctx)
}

// ErrFlushing is Flush's answer while another flush is under way. The
// records are held back because the broker failed, so a caller told this
// waits for the broker as it would for sink.ErrNotConnected: the flush
// under way is the broker's retry.
var ErrFlushing = errors.New("another reconcile is writing the held-back records")

// Unsaved reports how many records wait for the store.
func (r *Set) Unsaved() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.unsaved)
}

// Remove deletes the record of uid from the store and from memory.
//
// As in Save, the delete goes out without holding the lock: every
// reconcile reads the records, and one delete's round trip would hold them
// all up. The compare-and-set on the revision read here keeps it safe: a
// write of the same key meanwhile (a flush of unsaved records) makes the
// delete conflict, and the record is read again.
func (r *Set) Remove(ctx context.Context, uid types.UID) error {
	r.mu.Lock()
	e, ok := r.byUID[uid]
	if !ok {
		r.mu.Unlock()
		return nil
	}
	revision := e.revision
	r.mu.Unlock()

	var err error
	if revision != 0 {
		err = r.store.Delete(ctx, contract.RecordKey(uid), revision)
		storeOps.WithLabelValues("delete", opResult(err)).Inc()
	}
	if errors.Is(err, sink.ErrConflict) {
		r.reread(ctx, uid, nil)
	}
	if err != nil {
		return fmt.Errorf("delete record %s: %w", uid, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropLocked(uid)
	r.gaugesLocked()
	return nil
}

// flushHeld writes the unsaved records one after another, with flushing
// held and mu taken only around memory. It stops at the first write the
// store does not answer (the rest would wait as long, each); a conflict
// or a record that never fits is settled and the flush goes on.
func (r *Set) flushHeld(ctx context.Context) error {
	type pending struct {
		uid      types.UID
		e        *entry
		rec      studentv1.StudentRecord
		revision uint64
	}
	r.mu.Lock()
	todo := make([]pending, 0, len(r.unsaved))
	for uid := range r.unsaved {
		e := r.byUID[uid]
		todo = append(todo, pending{uid, e, e.rec, e.revision})
	}
	r.mu.Unlock()
	var errs []error
	for _, p := range todo {
		err := r.put(ctx, p.uid, p.e, p.rec, p.revision)
		if err == nil {
			continue
		}
		errs = append(errs, err)
		if !errors.Is(err, sink.ErrConflict) && !errors.Is(err, sink.ErrTooLarge) {
			break
		}
	}
	return errors.Join(errs...)
}

// reread replaces the memory of uid with what the store holds, unless
// newer is held for uid and the store's record is older than it (an
// earlier number of the Student's events): then newer stays, unsaved, at
// the store's revision, so that its next write goes over that record. The
// read goes out without the lock; a failed one keeps the memory as it is,
// and is logged and counted.
func (r *Set) reread(ctx context.Context, uid types.UID, newer *entry) {
	key := contract.RecordKey(uid)
	rec, err := r.store.Get(ctx, key)
	switch {
	case err == nil, errors.Is(err, sink.ErrNotFound):
		storeOps.WithLabelValues("get", resultSuccess).Inc()
	default:
		storeOps.WithLabelValues("get", resultError).Inc()
		log.FromContext(ctx).Error(err, "Reading a record again after a failed write failed; the bridge's memory of it stays", "uid", uid)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.gaugesLocked()
	if errors.Is(err, sink.ErrNotFound) {
		r.dropLocked(uid)
		return
	}
	sr, ok := parseStored(key, rec)
	switch {
	case err != nil || !ok:
	case newer != nil && r.keepNewerLocked(uid, newer, sr, rec.Revision):
	default:
		r.setLocked(sr, rec.Revision, true)
	}
}

// gaugesLocked brings this Set's share of the gauges of records held and
// unsaved up to date. The gauges are the process's: the sums over its
// Sets, one per bridge it runs (the dev stack and the tests run several).
func (r *Set) gaugesLocked() {
	recordsGauge.Add(float64(len(r.byUID) - r.shown.records))
	unsavedGauge.Add(float64(len(r.unsaved) - r.shown.unsaved))
	r.shown.records, r.shown.unsaved = len(r.byUID), len(r.unsaved)
}

// Forget takes this Set's share out of the process's gauges, once its
// bridge stopped; the Set is not used after.
func (r *Set) Forget() {
	r.mu.Lock()
	defer r.mu.Unlock()
	recordsGauge.Sub(float64(r.shown.records))
	unsavedGauge.Sub(float64(r.shown.unsaved))
	r.shown.records, r.shown.unsaved = 0, 0
}

// keepNewerLocked keeps e, held for uid, over the store's record stored
// at revision when the store's is older (an earlier number of the
// Student's events): e stays, unsaved, at the store's revision, so that
// its next write goes over that record. It reports whether it kept e.
func (r *Set) keepNewerLocked(uid types.UID, e *entry, stored studentv1.StudentRecord, revision uint64) bool {
	if stored.Published.StudentSequence >= e.rec.Published.StudentSequence {
		return false
	}
	e.revision = revision
	r.unsaved[uid] = struct{}{}
	return true
}

// parseStored is the Student's record a store holds under key, with the
// stream sequence of the event it was committed with, if the store knows.
func parseStored(key string, rec sink.Record) (studentv1.StudentRecord, bool) {
	sr, ok := contract.ParseRecord(key, rec.Value)
	if ok && rec.EventSequence != 0 {
		sr.Published.Sequence = int64(rec.EventSequence)
	}
	return sr, ok
}

func (r *Set) revisionLocked(uid types.UID) uint64 {
	if e, ok := r.byUID[uid]; ok {
		return e.revision
	}
	return 0
}

func (r *Set) setLocked(rec studentv1.StudentRecord, revision uint64, saved bool) {
	uid := rec.UID
	key := types.NamespacedName{Namespace: rec.Namespace, Name: rec.Name}
	if _, ok := r.byUID[uid]; !ok {
		r.byName[key] = append(r.byName[key], uid)
	}
	if saved {
		delete(r.unsaved, uid)
	} else {
		r.unsaved[uid] = struct{}{}
	}
	r.byUID[uid] = &entry{rec: rec, revision: revision}
}

func (r *Set) dropLocked(uid types.UID) {
	e, ok := r.byUID[uid]
	if !ok {
		return
	}
	delete(r.unsaved, uid)
	delete(r.byUID, uid)
	key := types.NamespacedName{Namespace: e.rec.Namespace, Name: e.rec.Name}
	uids := r.byName[key]
	for i, u := range uids {
		if u == uid {
			uids = append(uids[:i], uids[i+1:]...)
			break
		}
	}
	if len(uids) == 0 {
		delete(r.byName, key)
	} else {
		r.byName[key] = uids
	}
}

func opResult(err error) string {
	switch {
	case err == nil:
		return resultSuccess
	case errors.Is(err, sink.ErrConflict):
		return "conflict"
	}
	return resultError
}

// intern returns s held once for the process (unique.Make): the namespace
// and event type many records share cost their bytes once.
func intern(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}
