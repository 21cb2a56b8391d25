// Package config loads the bridge's configuration from defaults, a YAML file,
// STUDENT_BRIDGE_* environment variables and command-line flags, in rising
// order of precedence, with one viper instance per load.
package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-viper/mapstructure/v2"
	"github.com/spf13/pflag"
	"github.com/spf13/viper"
	"k8s.io/apimachinery/pkg/labels"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// EnvPrefix prefixes every environment variable: nats.urls is read from
// STUDENT_BRIDGE_NATS_URLS.
const EnvPrefix = "STUDENT_BRIDGE"

// Config is the whole configuration of the bridge.
type Config struct {
	Kubeconfig          string         `mapstructure:"kubeconfig"`
	Master              string         `mapstructure:"master"`
	Cluster             string         `mapstructure:"cluster"`
	Namespaces          []string       `mapstructure:"namespaces"`
	LabelSelector       string         `mapstructure:"labelSelector"`
	Workers             int            `mapstructure:"workers"`
	KubeAPIQPS          float32        `mapstructure:"kubeAPIQPS"`
	KubeAPIBurst        int            `mapstructure:"kubeAPIBurst"`
	MetricsAddr         string         `mapstructure:"metricsAddr"`
	HealthAddr          string         `mapstructure:"healthAddr"`
	PprofAddr           string         `mapstructure:"pprofAddr"`
	KubernetesEvents    bool           `mapstructure:"kubernetesEvents"`
	KubernetesEventsQPS float64        `mapstructure:"kubernetesEventsQPS"`
	LeaderElection      LeaderElection `mapstructure:"leaderElection"`
	Retry               Retry          `mapstructure:"retry"`
	NATS                NATS           `mapstructure:"nats"`
	ShutdownTimeout     time.Duration  `mapstructure:"shutdownTimeout"`
	Snapshot            Snapshot       `mapstructure:"snapshot"`
	Receipts            Receipts       `mapstructure:"receipts"`
	Shards              Shards         `mapstructure:"shards"`
	Services            Services       `mapstructure:"services"`
	State               State          `mapstructure:"state"`
	Deletes             Deletes        `mapstructure:"deletes"`
	Status              Status         `mapstructure:"status"`
	Tail                Tail           `mapstructure:"tail"`
}

// State configures the record store: the JetStream key-value bucket that
// remembers what was published per Student.
type State struct {
	Bucket   string `mapstructure:"bucket"`
	Create   bool   `mapstructure:"create"`
	Storage  string `mapstructure:"storage"`
	Replicas int    `mapstructure:"replicas"`
}

// Deletes chooses how deletes are guaranteed.
type Deletes struct {
	HoldWithFinalizer bool `mapstructure:"holdWithFinalizer"`
}

// Status configures the status view written on Students.
type Status struct {
	Enabled bool    `mapstructure:"enabled"`
	QPS     float64 `mapstructure:"qps"`
}

// Shards configures active-active replicas.
type Shards struct {
	Count int `mapstructure:"count"`
}

// Receipts configures the bucket where services report what they applied.
type Receipts struct {
	Bucket string `mapstructure:"bucket"`
	Create bool   `mapstructure:"create"`
}

// Services configures which business services must report before a
// Student shows InSync.
type Services struct {
	Expected []string `mapstructure:"expected"`
}

// Snapshot configures bridge-side replay: snapshot events of every current
// Student, at startup and on request.
type Snapshot struct {
	OnStartup      bool   `mapstructure:"onStartup"`
	RequestSubject string `mapstructure:"requestSubject"`
}

// Tail configures `student-bridge tail`, the consumer side.
type Tail struct {
	Subjects     []string `mapstructure:"subjects"`
	Output       string   `mapstructure:"output"`
	Deliver      string   `mapstructure:"deliver"`
	Since        string   `mapstructure:"since"`
	FromSequence uint64   `mapstructure:"fromSequence"`
	Durable      string   `mapstructure:"durable"`
	Follow       bool     `mapstructure:"follow"`
}

// LeaderElection configures the lease that keeps one replica active.
type LeaderElection struct {
	Enabled       bool          `mapstructure:"enabled"`
	Namespace     string        `mapstructure:"namespace"`
	ID            string        `mapstructure:"id"`
	LeaseDuration time.Duration `mapstructure:"leaseDuration"`
	RenewDeadline time.Duration `mapstructure:"renewDeadline"`
	RetryPeriod   time.Duration `mapstructure:"retryPeriod"`
}

// Retry bounds the exponential backoff of failed publishes.
type Retry struct {
	BaseDelay time.Duration `mapstructure:"baseDelay"`
	MaxDelay  time.Duration `mapstructure:"maxDelay"`
}

// NATS configures the connection, the encoding and the stream.
type NATS struct {
	URLs           string        `mapstructure:"urls"`
	Name           string        `mapstructure:"name"`
	Mode           string        `mapstructure:"mode"`
	Encoding       string        `mapstructure:"encoding"`
	SubjectPrefix  string        `mapstructure:"subjectPrefix"`
	SubjectLayout  string        `mapstructure:"subjectLayout"`
	ConnectTimeout time.Duration `mapstructure:"connectTimeout"`
	ReconnectWait  time.Duration `mapstructure:"reconnectWait"`
	MaxReconnects  int           `mapstructure:"maxReconnects"`
	AckTimeout     time.Duration `mapstructure:"ackTimeout"`
	Auth           Auth          `mapstructure:"auth"`
	TLS            TLS           `mapstructure:"tls"`
	Stream         Stream        `mapstructure:"stream"`
}

// Auth holds NATS credentials. Secrets come from files or environment
// variables, never from flags, and are never logged.
type Auth struct {
	User         string `mapstructure:"user"`
	Password     string `mapstructure:"password"`
	PasswordFile string `mapstructure:"passwordFile"`
	Token        string `mapstructure:"token"`
	TokenFile    string `mapstructure:"tokenFile"`
	NkeySeedFile string `mapstructure:"nkeySeedFile"`
	CredsFile    string `mapstructure:"credsFile"`
}

// TLS configures server verification and client certificates.
type TLS struct {
	CAFile   string `mapstructure:"caFile"`
	CertFile string `mapstructure:"certFile"`
	KeyFile  string `mapstructure:"keyFile"`
}

// Stream configures the JetStream stream.
type Stream struct {
	Name       string        `mapstructure:"name"`
	Create     bool          `mapstructure:"create"`
	Storage    string        `mapstructure:"storage"`
	Replicas   int           `mapstructure:"replicas"`
	MaxAge     time.Duration `mapstructure:"maxAge"`
	MaxBytes   int64         `mapstructure:"maxBytes"`
	MaxMsgs    int64         `mapstructure:"maxMsgs"`
	Discard    string        `mapstructure:"discard"`
	Duplicates time.Duration `mapstructure:"duplicates"`
}

// Setting is one configuration key: its default, its flag (empty for keys
// that must not be flags, like secrets) and what it means.
type Setting struct {
	Key     string
	Flag    string
	Default any
	Help    string
}

// Settings lists every key. The documented file configs/student-bridge.yaml
// and the --help text are kept in line with it by tests.
var Settings = []Setting{
	{"kubeconfig", "kubeconfig", "", "Path to a kubeconfig. Only required if out-of-cluster; KUBECONFIG and in-cluster config are used otherwise."},
	{"master", "master", "", "The address of the Kubernetes API server. Overrides any value in kubeconfig. Only required if out-of-cluster."},
	{"cluster", "cluster", "default", "Cluster name used in the CloudEvent source (/clusters/<cluster>/apis/example.k8s.io/v1/students)."},
	{"namespaces", "namespaces", []string{}, "Namespaces to watch, comma separated. Empty watches all namespaces."},
	{"labelSelector", "label-selector", "", "Only Students matching this label selector are published."},
	{"workers", "workers", 16, "Students reconciled concurrently; each waits for its JetStream ack and API writes, so this bounds throughput."},
	{"kubeAPIQPS", "kube-api-qps", float32(500), "Requests per second the bridge may send to the Kubernetes API (finalizers, status, Events)."},
	{"kubeAPIBurst", "kube-api-burst", 1000, "Burst above kubeAPIQPS."},
	{"metricsAddr", "metrics-bind-address", ":8080", "Address of the Prometheus /metrics endpoint; \"0\" disables it."},
	{"healthAddr", "health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints; \"0\" disables them."},
	{"pprofAddr", "pprof-bind-address", "", "Address of the Go pprof endpoints (/debug/pprof/); empty disables them. Do not expose it."},
	{"kubernetesEvents", "kubernetes-events", true, "Record a Kubernetes Event on the Student for every publish and failure."},
	{"kubernetesEventsQPS", "kubernetes-events-qps", float64(10), "Most Kubernetes Events (each an API write) per second for the whole bridge (with shards, each replica writes the share of the shards it holds). Events wait in a queue of 1000 and beyond it are dropped and counted: they never slow publishing."},
	{"shutdownTimeout", "shutdown-timeout", dur("30s"), "How long a graceful shutdown waits for in-flight publishes."},
	{"leaderElection.enabled", "leader-elect", true, "Use a Lease so that only one replica publishes at a time."},
	{"leaderElection.namespace", "leader-election-namespace", "", "Namespace of the Lease; defaults to the pod's namespace in-cluster, else \"default\"."},
	{"leaderElection.id", "leader-election-id", "student-bridge.example.k8s.io", "Name of the Lease."},
	{"leaderElection.leaseDuration", "leader-election-lease-duration", dur("15s"), "How long a standby waits after the leader's last renewal before it takes over; with shards, how long a replica's shards stay held after its member Lease's last renewal."},
	{"leaderElection.renewDeadline", "leader-election-renew-deadline", dur("10s"), "How long the leader keeps trying to renew before it steps down; with shards, a replica renews its member Lease every leaseDuration - renewDeadline and gives up its shards when it could not renew for renewDeadline."},
	{"leaderElection.retryPeriod", "leader-election-retry-period", dur("2s"), "How often replicas try to acquire or renew the Lease; with shards, how often they read the Leases and contest shards."},
	{"retry.baseDelay", "retry-base-delay", dur("500ms"), "First delay before a failed publish is retried; it doubles on each failure."},
	{"retry.maxDelay", "retry-max-delay", dur("1m"), "Longest delay between retries of a failed publish."},
	{"nats.urls", "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated."},
	{"nats.name", "nats-name", "student-bridge", "Connection name shown by the NATS server."},
	{"nats.mode", "nats-mode", "jetstream", "jetstream: wait for the stream's ack (at-least-once). core: publish and flush (at-most-once)."},
	{"nats.encoding", "nats-encoding", "structured", "CloudEvents NATS binding mode: structured (JSON body) or binary (ce-* headers)."},
	{"nats.subjectPrefix", "subject-prefix", "student", "First token of every subject."},
	{"nats.subjectLayout", "subject-layout", "{prefix}.{op}", "Subject layout; tokens {prefix} {op} {namespace} {name}. Must start with {prefix}."},
	{"nats.connectTimeout", "nats-connect-timeout", dur("5s"), "Timeout of one connection attempt."},
	{"nats.reconnectWait", "nats-reconnect-wait", dur("2s"), "Wait between reconnection attempts."},
	{"nats.maxReconnects", "nats-max-reconnects", -1, "Reconnection attempts before giving up; -1 retries forever."},
	{"nats.ackTimeout", "nats-ack-timeout", dur("5s"), "How long one publish (or record write) waits for the JetStream acknowledgement. Writes failing for 3 times as long on a live connection move it to another server of the cluster."},
	{"nats.auth.user", "nats-user", "", "NATS user name (password from nats.auth.passwordFile or STUDENT_BRIDGE_NATS_AUTH_PASSWORD)."},
	{"nats.auth.password", "", "", "NATS password; set it by environment variable, not in a file in version control."},
	{"nats.auth.passwordFile", "nats-password-file", "", "File holding the NATS password."},
	{"nats.auth.token", "", "", "NATS token; set it by environment variable."},
	{"nats.auth.tokenFile", "nats-token-file", "", "File holding the NATS token."},
	{"nats.auth.nkeySeedFile", "nats-nkey-seed-file", "", "File holding an NKey seed."},
	{"nats.auth.credsFile", "nats-creds-file", "", "JWT credentials file (user JWT and NKey seed)."},
	{"nats.tls.caFile", "nats-tls-ca-file", "", "CA bundle to verify the NATS server."},
	{"nats.tls.certFile", "nats-tls-cert-file", "", "Client certificate for mutual TLS."},
	{"nats.tls.keyFile", "nats-tls-key-file", "", "Client key for mutual TLS."},
	{"nats.stream.name", "stream-name", "STUDENTS", "JetStream stream that stores the events."},
	{"nats.stream.create", "stream-create", true, "Create the stream if it is missing. An existing stream is never changed."},
	{"nats.stream.storage", "stream-storage", "file", "Storage of a created stream: file or memory."},
	{"nats.stream.replicas", "stream-replicas", 1, "Replicas of a created stream (3 on a 3-node cluster)."},
	{"nats.stream.maxAge", "stream-max-age", dur("0s"), "Drop events older than this; 0 keeps them (bounded by the size limits)."},
	{"nats.stream.maxBytes", "stream-max-bytes", int64(0), "Size limit of a created stream in bytes; 0 is unlimited."},
	{"nats.stream.maxMsgs", "stream-max-msgs", int64(0), "Message limit of a created stream; 0 is unlimited."},
	{"nats.stream.discard", "stream-discard", "old", "When a created stream is full: old drops the oldest events, new refuses new ones (the bridge retries)."},
	{"nats.stream.duplicates", "stream-duplicate-window", dur("2m"), "Window in which the stream drops an event whose id it already stored."},
	{"state.bucket", "state-bucket", "STUDENT_BRIDGE_PUBLISHED", "JetStream key-value bucket that records what was published per Student (one key per uid). Each bridge needs its own."},
	{"state.create", "state-create", true, "Create the bucket if it is missing. An existing bucket is never changed."},
	{"state.storage", "state-storage", "file", "Storage of a created bucket: file or memory."},
	{"state.replicas", "state-replicas", 1, "Replicas of a created bucket (3 on a 3-node cluster)."},
	{"deletes.holdWithFinalizer", "hold-deletes-with-finalizer", true, "Hold a deleted Student with a finalizer until its deleted event is acknowledged, so it carries the exact final state. false: the bridge writes nothing to Students; a delete carries the watch's final state, or the last published state if it happened while the bridge was down."},
	{"status.enabled", "status", true, "Write the status view (lastPublished, the Published condition) on Students. The bridge never reads it."},
	{"status.qps", "status-qps", float64(10), "Most status writes per second by the whole bridge (with shards, each replica writes the share of the shards it holds); writes are coalesced per Student and wait while changes are waiting. Failures are written first."},
	{"snapshot.onStartup", "snapshot-on-startup", false, "Publish a snapshot event (student.snapshot) of every Student when the bridge becomes leader."},
	{"snapshot.requestSubject", "snapshot-request-subject", "student-bridge.snapshot", "NATS subject on which the leader answers snapshot requests; empty disables them. Must not be under the stream's subjects."},
	{"shards.count", "shards", 1, "1: one replica (the leader, leaderElection) publishes for every Student. More: every replica publishes, the Students shared out by this many shards (a hash of namespace/name), a Lease per shard (<leaderElection.id>-shard-<n>, written when it changes hands) held while its holder renews its member Lease (timed by leaderElection.*). All replicas and the record store must agree on it."},
	{"receipts.bucket", "receipts-bucket", "STUDENT_BRIDGE_RECEIPTS", "JetStream key-value bucket where services report what they applied (key <service>.<uid>); shown on the Student's status. Empty disables receipts."},
	{"receipts.create", "receipts-create", true, "Create the receipts bucket if it is missing (like the record store: state.storage, state.replicas). An existing bucket is never changed."},
	{"services.expected", "expected-services", []string{}, "Services that must report a change applied before the Student shows InSync, comma separated. Receipts of other services are shown but not required."},
}

// Choices lists the values a string key accepts, where they are few. The
// Helm chart's values.schema.json is generated with them, and Validate and
// ValidateTail check them.
var Choices = map[string][]string{
	"nats.mode":           {"jetstream", "core"},
	"nats.encoding":       {"structured", "binary"},
	"nats.stream.storage": {"file", "memory"},
	"nats.stream.discard": {"old", "new"},
	"state.storage":       {"file", "memory"},
	"tail.output":         {"text", "json"},
	"tail.deliver":        {"new", "all", "last", "since", "sequence"},
}

// TailSettings are the keys of `student-bridge tail`; they live in the same
// file, under tail:.
var TailSettings = []Setting{
	{"tail.subjects", "subjects", []string{}, "Subjects to read, comma separated; default <nats.subjectPrefix>.> (everything)."},
	{"tail.output", "output", "text", "text: one readable line per event; json: one CloudEvent JSON object per line."},
	{"tail.deliver", "deliver", "new", "new: only events from now on; all: the whole stream; last: the last event of every Student, then new ones; since: from tail.since; sequence: from tail.fromSequence."},
	{"tail.since", "since", "", "With deliver=since: an RFC 3339 time or a duration back from now, e.g. 1h."},
	{"tail.fromSequence", "from-sequence", uint64(0), "With deliver=sequence: the first stream sequence to print."},
	{"tail.durable", "durable", "", "Name of a durable consumer: a restarted tail resumes after the last event it printed."},
	{"tail.follow", "follow", true, "Keep waiting for new events; false exits once the stream is read to its end."},
}

// natsConnectionKeys are the nats.* keys tail shares with the bridge.
var natsConnectionKeys = []string{"nats.urls", "nats.name", "nats.connectTimeout", "nats.reconnectWait", "nats.maxReconnects",
	"nats.subjectPrefix", "nats.stream.name", "nats.auth.", "nats.tls."}

// Loader reads configuration. Create one per load with New or NewTail.
type Loader struct {
	v        *viper.Viper
	validate func(*Config) error
}

// New returns the bridge's Loader, with every default set and the bridge's
// flags registered on fs (which may be nil).
func New(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).Validate
	l.addFlags(fs, Settings)
	return l
}

// NewTail returns the Loader of `student-bridge tail`: the tail.* flags and
// the NATS connection flags it shares with the bridge.
func NewTail(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).ValidateTail
	l.addFlags(fs, connectionSettings())
	l.addFlags(fs, TailSettings)
	return l
}

// NewSnapshotLoader returns the Loader of `student-bridge snapshot`: the NATS
// connection flags and snapshot.requestSubject.
func NewSnapshotLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateConnection
	l.addFlags(fs, connectionSettings())
	for _, s := range Settings {
		if s.Key == "snapshot.requestSubject" {
			l.addFlags(fs, []Setting{s})
		}
	}
	return l
}

// NewServicesLoader returns the Loader of `student-bridge services`: the
// NATS connection flags, the record store and receipts buckets and the
// expected services.
func NewServicesLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateConnection
	l.addFlags(fs, connectionSettings())
	for _, s := range Settings {
		switch s.Key {
		case "state.bucket", "receipts.bucket", "services.expected":
			l.addFlags(fs, []Setting{s})
		}
	}
	return l
}

// NewVerifyLoader returns the Loader of `student-bridge verify`: the NATS
// connection flags, where the Kubernetes API is, which Students the bridge
// watches, its cluster name and its record store.
func NewVerifyLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateVerify
	l.addFlags(fs, connectionSettings())
	for _, s := range Settings {
		switch s.Key {
		case "kubeconfig", "master", "cluster", "namespaces", "labelSelector", "state.bucket":
			l.addFlags(fs, []Setting{s})
		}
	}
	return l
}

// NewReleaseLoader returns the Loader of `student-bridge release-finalizers`:
// where the Kubernetes API is, which Students the bridge watched and its
// leader election Lease.
func NewReleaseLoader(fs *pflag.FlagSet) *Loader {
	l := newLoader()
	l.validate = (*Config).validateRelease
	for _, s := range Settings {
		switch {
		case s.Key == "kubeconfig", s.Key == "master", s.Key == "namespaces", s.Key == "labelSelector", s.Key == "shards.count",
			strings.HasPrefix(s.Key, "leaderElection."):
			l.addFlags(fs, []Setting{s})
		}
	}
	return l
}

func connectionSettings() []Setting {
	var shared []Setting
	for _, s := range Settings {
		for _, k := range natsConnectionKeys {
			if s.Key == k || (strings.HasSuffix(k, ".") && strings.HasPrefix(s.Key, k)) {
				shared = append(shared, s)
			}
		}
	}
	return shared
}

func newLoader() *Loader {
	v := viper.New()
	v.SetEnvPrefix(EnvPrefix)
	v.SetEnvKeyReplacer(strings.NewReplacer(".", "_"))
	v.AutomaticEnv()
	for _, s := range allSettings() {
		v.SetDefault(s.Key, s.Default)
		// AutomaticEnv only answers keys viper is asked for; binding makes
		// Unmarshal see environment variables of nested keys too.
		_ = v.BindEnv(s.Key, EnvName(s.Key))
	}
	return &Loader{v: v}
}

func allSettings() []Setting {
	return append(append([]Setting(nil), Settings...), TailSettings...)
}

func (l *Loader) addFlags(fs *pflag.FlagSet, settings []Setting) {
	if fs == nil {
		return
	}
	for _, s := range settings {
		if s.Flag == "" {
			continue
		}
		short := ""
		if s.Flag == "output" {
			short = "o"
		}
		switch d := s.Default.(type) {
		case bool:
			fs.BoolP(s.Flag, short, d, s.Help)
		case int:
			fs.IntP(s.Flag, short, d, s.Help)
		case int64:
			fs.Int64P(s.Flag, short, d, s.Help)
		case uint64:
			fs.Uint64P(s.Flag, short, d, s.Help)
		case float32:
			fs.Float32P(s.Flag, short, d, s.Help)
		case float64:
			fs.Float64P(s.Flag, short, d, s.Help)
		case time.Duration:
			fs.DurationP(s.Flag, short, d, s.Help)
		case []string:
			fs.StringSliceP(s.Flag, short, d, s.Help)
		default:
			fs.StringP(s.Flag, short, fmt.Sprint(d), s.Help)
		}
		_ = l.v.BindPFlag(s.Key, fs.Lookup(s.Flag))
	}
}

// dur parses a default duration; the defaults are constants, so a bad one is
// a programming error.
func dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}

// EnvName is the environment variable of key.
func EnvName(key string) string {
	return EnvPrefix + "_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// Load reads file (if not empty), then the environment and the flags, and
// returns the validated configuration.
func (l *Loader) Load(file string) (*Config, error) {
	if file != "" {
		l.v.SetConfigFile(file)
		l.v.SetConfigType("yaml")
		if err := l.v.ReadInConfig(); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
		if err := checkKnownKeys(l.v.AllKeys()); err != nil {
			return nil, fmt.Errorf("config file %s: %w", file, err)
		}
	}
	var c Config
	var md mapstructure.Metadata
	err := l.v.Unmarshal(&c, func(dc *mapstructure.DecoderConfig) {
		dc.Metadata = &md
		dc.ErrorUnused = false
		dc.DecodeHook = mapstructure.ComposeDecodeHookFunc(
			mapstructure.StringToTimeDurationHookFunc(),
			mapstructure.StringToSliceHookFunc(","),
		)
	})
	if err != nil {
		return nil, fmt.Errorf("config: %w", explainDecodeError(err))
	}
	c.Namespaces = trimAll(c.Namespaces)
	c.Tail.Subjects = trimAll(c.Tail.Subjects)
	c.Services.Expected = trimAll(c.Services.Expected)
	if err := l.validate(&c); err != nil {
		return nil, err
	}
	return &c, nil
}

func checkKnownKeys(keys []string) error {
	known := map[string]bool{}
	for _, s := range allSettings() {
		known[strings.ToLower(s.Key)] = true
	}
	var unknown []string
	for _, k := range keys {
		if !known[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("unknown key(s) %s", strings.Join(unknown, ", "))
	}
	return nil
}

// explainDecodeError keeps mapstructure's message, which names the key, but
// drops its "decoding failed due to the following error(s)" preamble.
func explainDecodeError(err error) error {
	var de *mapstructure.DecodeError
	if errors.As(err, &de) {
		return fmt.Errorf("key %s: %w", de.Name(), de.Unwrap())
	}
	return err
}

func trimAll(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func bad(key string, format string, args ...any) error {
	return fmt.Errorf("config key %s (env %s): %s", key, EnvName(key), fmt.Sprintf(format, args...))
}

// validBucketName: letters, digits, '_' and '-' only.
func validBucketName(name string) bool {
	return strings.Trim(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") == ""
}

func isChoice(key, val string) bool { return slices.Contains(Choices[key], val) }

// notAChoice is the error for val, which is not one of key's Choices.
func notAChoice(key, val string) error {
	c := Choices[key]
	return bad(key, "%q: want %s or %s", val, strings.Join(c[:len(c)-1], ", "), c[len(c)-1])
}

// Validate checks every key the bridge uses and names the first bad one.
func (c *Config) Validate() error {
	if err := c.validateConnection(); err != nil {
		return err
	}
	switch {
	case c.Cluster == "" || strings.ContainsAny(c.Cluster, "/ \t"):
		return bad("cluster", "%q must be non-empty without '/' or spaces", c.Cluster)
	case c.Workers < 1:
		return bad("workers", "%d must be at least 1", c.Workers)
	case c.KubeAPIQPS <= 0:
		return bad("kubeAPIQPS", "%v must be positive", c.KubeAPIQPS)
	case c.KubeAPIBurst < 1:
		return bad("kubeAPIBurst", "%d must be at least 1", c.KubeAPIBurst)
	case c.KubernetesEvents && c.KubernetesEventsQPS <= 0:
		return bad("kubernetesEventsQPS", "%v must be positive (or set kubernetesEvents to false)", c.KubernetesEventsQPS)
	case c.LeaderElection.Enabled && (c.LeaderElection.RetryPeriod <= 0 || c.LeaderElection.RenewDeadline <= c.LeaderElection.RetryPeriod):
		return bad("leaderElection.renewDeadline", "%s must be longer than leaderElection.retryPeriod (%s), which must be positive", c.LeaderElection.RenewDeadline, c.LeaderElection.RetryPeriod)
	case c.LeaderElection.Enabled && c.LeaderElection.LeaseDuration <= c.LeaderElection.RenewDeadline:
		return bad("leaderElection.leaseDuration", "%s must be longer than leaderElection.renewDeadline (%s)", c.LeaderElection.LeaseDuration, c.LeaderElection.RenewDeadline)
	case c.Retry.BaseDelay <= 0:
		return bad("retry.baseDelay", "%s must be positive", c.Retry.BaseDelay)
	case c.Retry.MaxDelay < c.Retry.BaseDelay:
		return bad("retry.maxDelay", "%s must be at least retry.baseDelay (%s)", c.Retry.MaxDelay, c.Retry.BaseDelay)
	case c.ShutdownTimeout <= 0:
		return bad("shutdownTimeout", "%s must be positive", c.ShutdownTimeout)
	case c.LeaderElection.Enabled && c.LeaderElection.ID == "":
		return bad("leaderElection.id", "must be set when leader election is enabled")
	case !isChoice("nats.mode", c.NATS.Mode):
		return notAChoice("nats.mode", c.NATS.Mode)
	case !isChoice("nats.encoding", c.NATS.Encoding):
		return notAChoice("nats.encoding", c.NATS.Encoding)
	case c.NATS.AckTimeout <= 0:
		return bad("nats.ackTimeout", "%s must be positive", c.NATS.AckTimeout)
	case !isChoice("nats.stream.storage", c.NATS.Stream.Storage):
		return notAChoice("nats.stream.storage", c.NATS.Stream.Storage)
	case c.NATS.Stream.Replicas < 1 || c.NATS.Stream.Replicas > 5:
		return bad("nats.stream.replicas", "%d: want 1 to 5", c.NATS.Stream.Replicas)
	case c.NATS.Stream.MaxAge < 0:
		return bad("nats.stream.maxAge", "%s must not be negative", c.NATS.Stream.MaxAge)
	case c.NATS.Stream.MaxBytes < 0:
		return bad("nats.stream.maxBytes", "%d must not be negative", c.NATS.Stream.MaxBytes)
	case c.NATS.Stream.MaxMsgs < 0:
		return bad("nats.stream.maxMsgs", "%d must not be negative", c.NATS.Stream.MaxMsgs)
	case !isChoice("nats.stream.discard", c.NATS.Stream.Discard):
		return notAChoice("nats.stream.discard", c.NATS.Stream.Discard)
	case c.NATS.Stream.Duplicates <= 0:
		return bad("nats.stream.duplicates", "%s must be positive: ids deduplicate republished events", c.NATS.Stream.Duplicates)
	case c.State.Bucket == "" || !validBucketName(c.State.Bucket):
		return bad("state.bucket", "%q must be non-empty and only letters, digits, '_' and '-'", c.State.Bucket)
	case !isChoice("state.storage", c.State.Storage):
		return notAChoice("state.storage", c.State.Storage)
	case c.State.Replicas < 1 || c.State.Replicas > 5:
		return bad("state.replicas", "%d: want 1 to 5", c.State.Replicas)
	case c.Status.Enabled && c.Status.QPS <= 0:
		return bad("status.qps", "%v must be positive (or set status.enabled to false)", c.Status.QPS)
	case c.Receipts.Bucket != "" && !validBucketName(c.Receipts.Bucket):
		return bad("receipts.bucket", "%q must be only letters, digits, '_' and '-'", c.Receipts.Bucket)
	case c.Receipts.Bucket != "" && c.Receipts.Bucket == c.State.Bucket:
		return bad("receipts.bucket", "%q is the record store's bucket (state.bucket)", c.Receipts.Bucket)
	case c.Shards.Count < 1 || c.Shards.Count > 1024:
		return bad("shards.count", "%d: want 1 to 1024", c.Shards.Count)
	case c.Shards.Count > 1 && c.Snapshot.OnStartup:
		return bad("snapshot.onStartup", "every replica would publish a snapshot with shards.count %d; request one instead (snapshot.requestSubject)", c.Shards.Count)
	case c.Shards.Count > 1 && (c.LeaderElection.RetryPeriod <= 0 || c.LeaderElection.LeaseDuration <= 2*c.LeaderElection.RetryPeriod):
		return bad("leaderElection.leaseDuration", "%s must be more than twice leaderElection.retryPeriod (%s) for shard Leases", c.LeaderElection.LeaseDuration, c.LeaderElection.RetryPeriod)
	case c.Shards.Count > 1 && (c.LeaderElection.RenewDeadline <= c.LeaderElection.RetryPeriod || c.LeaderElection.RenewDeadline >= c.LeaderElection.LeaseDuration):
		return bad("leaderElection.renewDeadline", "%s must be between leaderElection.retryPeriod (%s) and leaderElection.leaseDuration (%s): a replica renews its member Lease every leaseDuration - renewDeadline and gives up its shards when it could not renew for renewDeadline",
			c.LeaderElection.RenewDeadline, c.LeaderElection.RetryPeriod, c.LeaderElection.LeaseDuration)
	case len(c.Services.Expected) > 0 && c.Receipts.Bucket == "":
		return bad("services.expected", "needs receipts.bucket")
	case strings.ContainsAny(c.Snapshot.RequestSubject, " \t*>"):
		return bad("snapshot.requestSubject", "%q must be a literal subject", c.Snapshot.RequestSubject)
	case c.Snapshot.RequestSubject != "" && strings.HasPrefix(c.Snapshot.RequestSubject, c.NATS.SubjectPrefix+"."):
		return bad("snapshot.requestSubject", "%q is under the stream's subjects %s.>; requests would be stored as events", c.Snapshot.RequestSubject, c.NATS.SubjectPrefix)
	}
	for _, svc := range c.Services.Expected {
		if !studentv1.ValidServiceName(svc) {
			return bad("services.expected", "%q is not a service name (letters, digits, '-', '_', up to 63)", svc)
		}
	}
	for _, addr := range []struct{ key, val string }{{"metricsAddr", c.MetricsAddr}, {"healthAddr", c.HealthAddr}, {"pprofAddr", c.PprofAddr}} {
		if addr.val == "0" || (addr.key == "pprofAddr" && addr.val == "") {
			continue
		}
		if _, _, err := net.SplitHostPort(addr.val); err != nil {
			return bad(addr.key, "%q is not host:port: %v", addr.val, err)
		}
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return bad("kubeconfig", "%v", err)
		}
	}
	return nil
}

// validateRelease checks the keys `student-bridge release-finalizers` uses.
func (c *Config) validateRelease() error {
	switch {
	case c.LeaderElection.Enabled && c.LeaderElection.ID == "":
		return bad("leaderElection.id", "must be set when leader election is enabled")
	case c.LeaderElection.Enabled && c.LeaderElection.RetryPeriod <= 0:
		return bad("leaderElection.retryPeriod", "%s must be positive", c.LeaderElection.RetryPeriod)
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return bad("kubeconfig", "%v", err)
		}
	}
	return nil
}

// validateVerify checks the keys `student-bridge verify` uses.
func (c *Config) validateVerify() error {
	if err := c.validateConnection(); err != nil {
		return err
	}
	if _, err := labels.Parse(c.LabelSelector); err != nil {
		return bad("labelSelector", "%v", err)
	}
	if c.Kubeconfig != "" {
		if _, err := os.Stat(c.Kubeconfig); err != nil {
			return bad("kubeconfig", "%v", err)
		}
	}
	return nil
}

// ValidateTail checks the keys `student-bridge tail` uses.
func (c *Config) ValidateTail() error {
	if err := c.validateConnection(); err != nil {
		return err
	}
	t := c.Tail
	switch {
	case !isChoice("tail.output", t.Output):
		return notAChoice("tail.output", t.Output)
	case t.Deliver == "since" && t.Since == "":
		return bad("tail.since", "must be set with tail.deliver=since")
	case t.Deliver == "sequence" && t.FromSequence == 0:
		return bad("tail.fromSequence", "must be at least 1 with tail.deliver=sequence")
	case !isChoice("tail.deliver", t.Deliver):
		return notAChoice("tail.deliver", t.Deliver)
	case strings.ContainsAny(t.Durable, ". *>\t"):
		return bad("tail.durable", "%q must not contain '.', '*', '>' or spaces", t.Durable)
	}
	if t.Since != "" {
		if _, err := SinceTime(t.Since, time.Now()); err != nil {
			return bad("tail.since", "%v", err)
		}
	}
	return nil
}

// SinceTime parses tail.since: an RFC 3339 time, or a duration before now.
func SinceTime(since string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(since); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("duration %s must not be negative", since)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, since)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", since)
	}
	return t, nil
}

func (c *Config) validateConnection() error {
	switch {
	case strings.TrimSpace(c.NATS.URLs) == "":
		return bad("nats.urls", "must name at least one server")
	case c.NATS.ConnectTimeout <= 0:
		return bad("nats.connectTimeout", "%s must be positive", c.NATS.ConnectTimeout)
	case c.NATS.ReconnectWait <= 0:
		return bad("nats.reconnectWait", "%s must be positive", c.NATS.ReconnectWait)
	case c.NATS.MaxReconnects < -1:
		return bad("nats.maxReconnects", "%d: want -1 (forever) or more", c.NATS.MaxReconnects)
	case c.NATS.Auth.Password != "" && c.NATS.Auth.PasswordFile != "":
		return bad("nats.auth.passwordFile", "set either the password or the password file, not both")
	case c.NATS.Auth.Token != "" && c.NATS.Auth.TokenFile != "":
		return bad("nats.auth.tokenFile", "set either the token or the token file, not both")
	case (c.NATS.TLS.CertFile == "") != (c.NATS.TLS.KeyFile == ""):
		return bad("nats.tls.certFile", "the client certificate and key (nats.tls.keyFile) go together")
	case c.NATS.Stream.Name == "" || strings.ContainsAny(c.NATS.Stream.Name, ". *>\t"):
		return bad("nats.stream.name", "%q must be non-empty without '.', '*', '>' or spaces", c.NATS.Stream.Name)
	}
	for _, f := range []struct{ key, path string }{
		{"nats.auth.passwordFile", c.NATS.Auth.PasswordFile}, {"nats.auth.tokenFile", c.NATS.Auth.TokenFile},
		{"nats.auth.nkeySeedFile", c.NATS.Auth.NkeySeedFile}, {"nats.auth.credsFile", c.NATS.Auth.CredsFile},
		{"nats.tls.caFile", c.NATS.TLS.CAFile}, {"nats.tls.certFile", c.NATS.TLS.CertFile}, {"nats.tls.keyFile", c.NATS.TLS.KeyFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return bad(f.key, "%v", err)
		}
	}
	return nil
}

// Redacted returns the NATS URLs with any user info replaced, for logs.
func Redacted(urls string) string {
	var out []string
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if scheme, rest, ok := strings.Cut(u, "://"); ok {
			if _, host, ok := strings.Cut(rest, "@"); ok {
				u = scheme + "://redacted@" + host
			}
		}
		out = append(out, u)
	}
	return strings.Join(out, ",")
}
