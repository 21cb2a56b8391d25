package natssink

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// StreamConfig is what the bridge asks of its JetStream stream.
type StreamConfig struct {
	// Name of the stream, e.g. STUDENTS.
	Name string
	// Subject the stream must capture, e.g. "student.>".
	Subject string
	// Storage is "file" or "memory".
	Storage string
	// Replicas is the number of stream replicas (1 for a single server).
	Replicas int
	// MaxAge drops events older than this; 0 keeps them forever.
	MaxAge time.Duration
	// MaxBytes and MaxMsgs limit the stream's size; 0 means unlimited.
	MaxBytes int64
	MaxMsgs  int64
	// Discard is "old" (drop the oldest when full) or "new" (refuse new
	// events when full; the bridge retries until space exists).
	Discard string
	// Duplicates is the window in which the stream drops an event whose id it
	// already stored.
	Duplicates time.Duration
	// Records, if set, is the subject prefix of the records the stream
	// keeps beside the events (StreamRecords): the stream captures it and
	// allows atomic batches, per-message TTLs and rollups.
	Records string
}

// ErrStreamConflict means the stream exists but does not capture the bridge's
// subjects. The bridge never changes an existing stream; an operator must.
var ErrStreamConflict = errors.New("natssink: stream does not capture the bridge's subjects")

// EnsureStream returns the stream's info, creating the stream first if it is
// missing and create is true. An existing stream is never changed: if it does
// not capture cfg.Subject, the error wraps ErrStreamConflict.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig, create bool) (*jetstream.StreamInfo, error) {
	s, err := js.Stream(ctx, cfg.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && create:
		sc, err := streamConfig(cfg)
		if err != nil {
			return nil, err
		}
		s, err = js.CreateStream(ctx, sc)
		if err != nil {
			return nil, fmt.Errorf("create stream %s: %w", cfg.Name, err)
		}
		return s.CachedInfo(), nil
	case err != nil:
		return nil, fmt.Errorf("look up stream %s: %w", cfg.Name, err)
	}
	info := s.CachedInfo()
	if err := captures(info, cfg.Subject); err != nil {
		return nil, err
	}
	if cfg.Records != "" {
		if err := captures(info, cfg.Records+".>"); err != nil {
			return nil, err
		}
		if c := info.Config; !c.AllowAtomicPublish || !c.AllowMsgTTL || !c.AllowRollup {
			return nil, fmt.Errorf("%w: stream %s does not allow atomic batches, per-message TTLs and rollups (allow_atomic %t, allow_msg_ttl %t, allow_rollup_hdrs %t), which records in the stream need",
				ErrStreamConflict, cfg.Name, c.AllowAtomicPublish, c.AllowMsgTTL, c.AllowRollup)
		}
	}
	return info, nil
}

// captures says why the stream does not capture subject, if it does not.
func captures(info *jetstream.StreamInfo, subject string) error {
	for _, subj := range info.Config.Subjects {
		if SubjectCovers(subj, subject) {
			return nil
		}
	}
	return fmt.Errorf("%w: stream %s exists with subjects %v, which do not capture %q; add %q to the stream or configure another stream name",
		ErrStreamConflict, info.Config.Name, info.Config.Subjects, subject, subject)
}

func streamConfig(cfg StreamConfig) (jetstream.StreamConfig, error) {
	sc := jetstream.StreamConfig{
		Name:        cfg.Name,
		Description: "Student changes published by student-bridge",
		Subjects:    []string{cfg.Subject},
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		MaxMsgs:     cfg.MaxMsgs,
		Duplicates:  cfg.Duplicates,
	}
	if cfg.Records != "" {
		sc.Subjects = append(sc.Subjects, cfg.Records+".>")
		sc.AllowAtomicPublish, sc.AllowMsgTTL, sc.AllowRollup = true, true, true
	}
	if sc.MaxBytes == 0 {
		sc.MaxBytes = -1
	}
	if sc.MaxMsgs == 0 {
		sc.MaxMsgs = -1
	}
	var err error
	if sc.Storage, err = Storage(cfg.Storage); err != nil {
		return sc, fmt.Errorf("stream %w", err)
	}
	switch cfg.Discard {
	case "old", "":
		sc.Discard = jetstream.DiscardOld
	case "new":
		sc.Discard = jetstream.DiscardNew
	default:
		return sc, fmt.Errorf("stream discard %q: want old or new", cfg.Discard)
	}
	return sc, nil
}

// SubjectCovers reports whether every subject matched by sub is also matched
// by the (possibly wildcard) subject filter.
func SubjectCovers(filter, sub string) bool {
	f := strings.Split(filter, ".")
	s := strings.Split(sub, ".")
	for i, ft := range f {
		if ft == ">" {
			return i < len(s)
		}
		if i >= len(s) {
			return false
		}
		switch {
		case s[i] == ">":
			return false
		case ft == "*":
		case ft != s[i] || s[i] == "*":
			return false
		}
	}
	return len(f) == len(s)
}

// Storage is the JetStream storage a configuration names: "file" (or
// empty) or "memory".
func Storage(name string) (jetstream.StorageType, error) {
	switch name {
	case "file", "":
		return jetstream.FileStorage, nil
	case "memory":
		return jetstream.MemoryStorage, nil
	}
	return 0, fmt.Errorf("storage %q: want file or memory", name)
}
