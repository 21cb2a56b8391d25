//go:build !nostack

package config_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
)

func load(t *testing.T, file string, args ...string) (*config.Config, error) {
	t.Helper()
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	l := config.NewLoader(fs, config.BridgeCommand)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return l.Load(file)
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestDocumentedFileIsTheDefaults keeps configs/student-bridge.yaml honest:
// it must load and say exactly what the built-in defaults are.
func TestDocumentedFileIsTheDefaults(t *testing.T) {
	defaults, err := load(t, "")
	if err != nil {
		t.Fatal(err)
	}
	documented, err := load(t, filepath.Join(stack.RepoRoot(), "configs", "student-bridge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(defaults, documented) {
		t.Errorf("configs/student-bridge.yaml differs from the defaults:\n file     %+v\n defaults %+v", documented, defaults)
	}
	b, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "configs", "student-bridge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != config.DocumentedYAML() {
		t.Errorf("configs/student-bridge.yaml is stale: run make generate")
	}
	for _, s := range append(config.Settings, config.TailSettings...) {
		if !strings.Contains(string(b), config.EnvName(s.Key)) {
			t.Errorf("configs/student-bridge.yaml does not document %s (%s)", s.Key, config.EnvName(s.Key))
		}
	}
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "workers: 2\nnats:\n  urls: nats://file:4222\n  stream:\n    name: FROMFILE\n")

	cfg, err := load(t, file)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Workers != 2 || cfg.NATS.URLs != "nats://file:4222" || cfg.NATS.Stream.Name != "FROMFILE" || cfg.NATS.Mode != "jetstream" {
		t.Errorf("file over defaults: %+v", cfg)
	}

	t.Setenv("STUDENT_BRIDGE_WORKERS", "3")
	t.Setenv("STUDENT_BRIDGE_NATS_URLS", "nats://env:4222")
	cfg, err = load(t, file)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Workers != 3 || cfg.NATS.URLs != "nats://env:4222" || cfg.NATS.Stream.Name != "FROMFILE" {
		t.Errorf("env over file: workers %d urls %s stream %s", cfg.Workers, cfg.NATS.URLs, cfg.NATS.Stream.Name)
	}

	cfg, err = load(t, file, "--workers=5", "--stream-name=FROMFLAG", "--namespaces=a, b", "--retry-max-delay=3s")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Workers != 5 || cfg.NATS.URLs != "nats://env:4222" || cfg.NATS.Stream.Name != "FROMFLAG" ||
		!reflect.DeepEqual(cfg.Namespaces, []string{"a", "b"}) || cfg.Retry.MaxDelay != 3*time.Second {
		t.Errorf("flag over env: %+v", cfg)
	}
}

func TestSecretsFromEnvironment(t *testing.T) {
	t.Setenv("STUDENT_BRIDGE_NATS_AUTH_PASSWORD", "s3cret")
	cfg, err := load(t, "")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NATS.Auth.Password != "s3cret" {
		t.Errorf("password from env = %q", cfg.NATS.Auth.Password)
	}
}

func TestBadValuesNameTheKey(t *testing.T) {
	cases := []struct {
		name string
		file string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown key", "natz:\n  url: x\n", nil, nil, "natz.url"},
		{"a key that is gone", "tracing:\n  endpoint: x:4317\n", nil, nil, "tracing.endpoint"},
		{"bad duration", "retry:\n  maxDelay: soon\n", nil, nil, "retry.maxDelay"},
		{"bad number", "workers: many\n", nil, nil, "workers"},
		{"zero workers", "", nil, []string{"--workers=0"}, "workers"},
		{"bad mode", "", map[string]string{"STUDENT_BRIDGE_NATS_MODE": "kafka"}, nil, "nats.mode"},
		{"bad encoding", "nats:\n  encoding: xml\n", nil, nil, "nats.encoding"},
		{"bad discard", "", nil, []string{"--stream-discard=sometimes"}, "nats.stream.discard"},
		{"bad storage", "", nil, []string{"--stream-storage=tape"}, "nats.stream.storage"},
		{"stream name with dot", "", nil, []string{"--stream-name=a.b"}, "nats.stream.name"},
		{"no duplicate window", "", nil, []string{"--stream-duplicate-window=0s"}, "nats.stream.duplicates"},
		{"missing creds file", "", nil, []string{"--nats-creds-file=/does/not/exist"}, "nats.auth.credsFile"},
		{"cert without key", "", nil, []string{"--nats-tls-cert-file=" + os.Args[0]}, "nats.tls.certFile"},
		{"bad metrics address", "", nil, []string{"--metrics-bind-address=8080"}, "metricsAddr"},
		{"bad pprof address", "", nil, []string{"--pprof-bind-address=6060"}, "pprofAddr"},
		{"no Events budget", "kubernetesEventsQPS: 0\n", nil, nil, "kubernetesEventsQPS"},
		{"fleet without a cluster name", "", nil, []string{"--fleet-hub-domain=hub"}, "cluster"},
		{"fleet cluster not a token", "", nil, []string{"--fleet-hub-domain=hub", "--cluster=east.1"}, "cluster"},
		{"hub domain is the cluster", "", nil, []string{"--fleet-hub-domain=east", "--cluster=east"}, "fleet.hubDomain"},
		{"hub receipts bucket with dot", "", nil, []string{"--fleet-hub-domain=hub", "--cluster=east", "--fleet-receipts-bucket=a.b"}, "fleet.receiptsBucket"},
		{"max below base", "", nil, []string{"--retry-base-delay=2s", "--retry-max-delay=1s"}, "retry.maxDelay"},
		{"not yaml", "workers: [\n", nil, nil, "config file"},
		{"no shards", "", nil, []string{"--shards=0"}, "shards.count"},
		{"startup snapshot from every replica", "", nil, []string{"--shards=16", "--snapshot-on-startup"}, "snapshot.onStartup"},
		{"shard Leases renewed too rarely", "", nil, []string{"--shards=16", "--leader-election-lease-duration=3s", "--leader-election-retry-period=2s", "--leader-election-renew-deadline=2500ms"}, "leaderElection.leaseDuration"},
		{"member Lease never renewed in time", "", nil, []string{"--shards=16", "--leader-elect=false", "--leader-election-renew-deadline=20s"}, "leaderElection.renewDeadline"},
		{"expected service with a dot", "", nil, []string{"--expected-services=billing.eu"}, "services.expected"},
		{"receipts in the record store", "", nil, []string{"--receipts-bucket=STUDENT_BRIDGE_PUBLISHED"}, "receipts.bucket"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			file := ""
			if tc.file != "" {
				file = writeFile(t, tc.file)
			}
			_, err := load(t, file, tc.args...)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", err, tc.want)
			}
		})
	}
}

func TestMissingFileIsAnError(t *testing.T) {
	_, err := load(t, filepath.Join(t.TempDir(), "nope.yaml"))
	if err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("err = %v", err)
	}
}

func TestRedacted(t *testing.T) {
	got := config.Redacted("nats://user:pw@a:4222, tls://tok@b:4222,nats://c:4222")
	if want := "nats://redacted@a:4222,tls://redacted@b:4222,nats://c:4222"; got != want {
		t.Errorf("Redacted = %q, want %q", got, want)
	}
}

// TestTailSettings: tail's defaults (new events, follow, text), its tail:
// section of the file, STUDENT_BRIDGE_TAIL_* over the file and flags over
// both.
func TestTailSettings(t *testing.T) {
	loadTail := func(file string, args ...string) *config.Config {
		t.Helper()
		fs := pflag.NewFlagSet("tail", pflag.ContinueOnError)
		l := config.NewLoader(fs, config.TailCommand)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := l.Load(file)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	if c := loadTail("").Tail; c.Deliver != "new" || !c.Follow || c.Output != "text" || c.Durable != "" {
		t.Errorf("defaults: %+v", c)
	}
	file := writeFile(t, "tail:\n  deliver: since\n  since: 1h\n  output: json\n  durable: billing\n")
	if c := loadTail(file).Tail; c.Deliver != "since" || c.Since != "1h" || c.Output != "json" || c.Durable != "billing" {
		t.Errorf("tail: section: %+v", c)
	}
	t.Setenv("STUDENT_BRIDGE_TAIL_DURABLE", "audit")
	t.Setenv("STUDENT_BRIDGE_TAIL_FOLLOW", "false")
	if c := loadTail(file).Tail; c.Durable != "audit" || c.Follow || c.Deliver != "since" {
		t.Errorf("env over file: %+v", c)
	}
	if c := loadTail(file, "--deliver=all", "--follow").Tail; c.Deliver != "all" || !c.Follow {
		t.Errorf("flags over env and file: %+v", c)
	}
	since, err := config.SinceTime("1h", time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC))
	if err != nil || !since.Equal(time.Date(2026, 1, 1, 11, 0, 0, 0, time.UTC)) {
		t.Errorf("--since 1h: %v %v", since, err)
	}
}

// TestChoicesAreWhatValidateAccepts: the choices the Helm chart's schema is
// generated from are exactly the values the bridge accepts.
func TestChoicesAreWhatValidateAccepts(t *testing.T) {
	checked := 0
	for _, s := range append(config.Settings, config.TailSettings...) {
		key, choices := s.Key, s.Choices
		if choices == nil {
			continue
		}
		checked++
		load := func() error {
			if strings.HasPrefix(key, "tail.") {
				_, err := config.NewLoader(nil, config.TailCommand).Load("")
				return err
			}
			_, err := config.NewLoader(nil, config.BridgeCommand).Load("")
			return err
		}
		for _, c := range choices {
			t.Setenv(config.EnvName(key), c)
			if key == "tail.deliver" && c == "since" {
				t.Setenv(config.EnvName("tail.since"), "1h")
			}
			if key == "tail.deliver" && c == "sequence" {
				t.Setenv(config.EnvName("tail.fromSequence"), "1")
			}
			if err := load(); err != nil {
				t.Errorf("%s=%s is a choice but is refused: %v", key, c, err)
			}
		}
		t.Setenv(config.EnvName(key), "bogus")
		if err := load(); err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s=bogus: %v, want an error naming the key", key, err)
		}
		t.Setenv(config.EnvName(key), choices[0])
	}
	if checked < 7 {
		t.Errorf("%d keys have choices; the table had 7", checked)
	}
}

// statedDefault finds "`key` (default V" and "`key`, default V" in prose.
var statedDefault = regexp.MustCompile("`([a-zA-Z][a-zA-Z.]*)`(?:,| \\()\\s*default\\s+`?([^\\s`,;)]+)")

// TestDocsStateTheDefaults: a default the README or a page of docs/ states
// next to its key is the key's default in the settings table.
func TestDocsStateTheDefaults(t *testing.T) {
	defaults := map[string]any{}
	for _, s := range config.Settings {
		defaults[s.Key] = s.Default
	}
	pages, _ := filepath.Glob(filepath.Join(stack.RepoRoot(), "docs", "*.md"))
	checked := 0
	for _, page := range append(pages, filepath.Join(stack.RepoRoot(), "README.md")) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range statedDefault.FindAllStringSubmatch(string(b), -1) {
			def, ok := defaults[m[1]]
			if !ok {
				continue // not a config key (a chart value, a tail option)
			}
			checked++
			stated := strings.TrimSuffix(strings.TrimSuffix(m[2], "."), "/s")
			if !sameDefault(def, stated) {
				t.Errorf("%s says %s defaults to %s; the settings say %v", filepath.Base(page), m[1], stated, def)
			}
		}
	}
	if checked < 4 {
		t.Errorf("found %d stated defaults in the docs; the pattern no longer matches their prose", checked)
	}
}

func sameDefault(def any, stated string) bool {
	switch d := def.(type) {
	case time.Duration:
		v, err := time.ParseDuration(stated)
		return err == nil && v == d
	case float64, float32, int, int64, uint64:
		v, err := strconv.ParseFloat(stated, 64)
		return err == nil && fmt.Sprint(v) == fmt.Sprint(d)
	}
	return fmt.Sprint(def) == stated
}

// TestDefaultsAreTheContracts: the defaults that name the contract's
// stream, subjects and buckets (tags cannot refer to constants) are the
// contract's.
func TestDefaultsAreTheContracts(t *testing.T) {
	for key, want := range map[string]string{
		"nats.subjectPrefix":      studentv1.DefaultSubjectPrefix,
		"nats.stream.name":        studentv1.DefaultStream,
		"records.bucket":          studentv1.DefaultRecordsBucket,
		"snapshot.requestSubject": studentv1.DefaultSnapshotSubject,
		"receipts.bucket":         studentv1.ReceiptsBucket,
		"fleet.receiptsBucket":    studentv1.FleetReceiptsBucket,
	} {
		if s, _ := config.Lookup(key); s.Default != want {
			t.Errorf("%s defaults to %v; the contract says %q", key, s.Default, want)
		}
	}
}
