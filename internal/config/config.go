// Package config loads the bridge's configuration from defaults, a YAML file,
// STUDENT_BRIDGE_* environment variables and command-line flags, in rising
// order of precedence, with one viper instance per load.
package config

import (
	"time"
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
	MemoryLimit         string         `mapstructure:"memoryLimit"`
	KubernetesEvents    bool           `mapstructure:"kubernetesEvents"`
	KubernetesEventsQPS float64        `mapstructure:"kubernetesEventsQPS"`
	LeaderElection      LeaderElection `mapstructure:"leaderElection"`
	Retry               Retry          `mapstructure:"retry"`
	NATS                NATS           `mapstructure:"nats"`
	ShutdownTimeout     time.Duration  `mapstructure:"shutdownTimeout"`
	Snapshot            Snapshot       `mapstructure:"snapshot"`
	Receipts            Receipts       `mapstructure:"receipts"`
	Fleet               Fleet          `mapstructure:"fleet"`
	Shards              Shards         `mapstructure:"shards"`
	Services            Services       `mapstructure:"services"`
	State               State          `mapstructure:"state"`
	Tracing             Tracing        `mapstructure:"tracing"`
	Deletes             Deletes        `mapstructure:"deletes"`
	Status              Status         `mapstructure:"status"`
	Tail                Tail           `mapstructure:"tail"`
}

// Tracing configures OpenTelemetry traces, exported over OTLP/gRPC.
type Tracing struct {
	Endpoint string `mapstructure:"endpoint"`
	Insecure bool   `mapstructure:"insecure"`
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

// Fleet configures a bridge in one cluster of many fanned into a hub
// (docs/fleet.md).
type Fleet struct {
	HubDomain      string `mapstructure:"hubDomain"`
	ReceiptsBucket string `mapstructure:"receiptsBucket"`
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
	OnStartup      bool          `mapstructure:"onStartup"`
	RequestSubject string        `mapstructure:"requestSubject"`
	MinInterval    time.Duration `mapstructure:"minInterval"`
}

// Tail configures `student-bridge tail`, the consumer side.
type Tail struct {
	Cluster      string   `mapstructure:"cluster"`
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
