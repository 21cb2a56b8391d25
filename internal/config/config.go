// Package config loads the bridge's configuration from defaults, a YAML file,
// STUDENT_BRIDGE_* environment variables and command-line flags, in rising
// order of precedence, with one viper instance per load.
//
// Config is the settings table: each field's tags give its key (the path in
// the file; its environment variable is derived from it, see EnvName), its
// flag, its default, the values it accepts and its help. Flags, --help,
// configs/student-bridge.yaml and the Helm chart's schema are made from
// them; nothing else lists a setting.
package config

import (
	"time"
)

// EnvPrefix prefixes every environment variable: nats.urls is read from
// STUDENT_BRIDGE_NATS_URLS.
const EnvPrefix = "STUDENT_BRIDGE"

// Config is the whole configuration of the bridge and of its subcommands.
// Tags: key (required), flag (none for secrets, which come from files or
// the environment), short, default (empty: the type's zero value; a
// duration as time.ParseDuration reads it, a list comma separated),
// choices (|-separated) and help.
type Config struct {
	Kubeconfig          string         `key:"kubeconfig" flag:"kubeconfig" help:"Path to a kubeconfig. Only required if out-of-cluster; KUBECONFIG and in-cluster config are used otherwise."`
	Master              string         `key:"master" flag:"master" help:"The address of the Kubernetes API server. Overrides any value in kubeconfig. Only required if out-of-cluster."`
	Cluster             string         `key:"cluster" flag:"cluster" default:"default" help:"Cluster name used in the CloudEvent source (/clusters/<cluster>/apis/example.k8s.io/v1/students)."`
	Namespaces          []string       `key:"namespaces" flag:"namespaces" help:"Namespaces to watch, comma separated. Empty watches all namespaces."`
	LabelSelector       string         `key:"labelSelector" flag:"label-selector" help:"Only Students matching this label selector are published."`
	Workers             int            `key:"workers" flag:"workers" default:"16" help:"Students reconciled concurrently; each waits for its JetStream ack and API writes, so this bounds throughput."`
	KubeAPIQPS          float32        `key:"kubeAPIQPS" flag:"kube-api-qps" default:"500" help:"Requests per second the bridge may send to the Kubernetes API (finalizers, status, Events)."`
	KubeAPIBurst        int            `key:"kubeAPIBurst" flag:"kube-api-burst" default:"1000" help:"Burst above kubeAPIQPS."`
	KubeAPICompression  bool           `key:"kubeAPICompression" flag:"kube-api-compression" help:"Ask the Kubernetes API server for gzip-compressed responses, the Students' watch included. Off by default, as in Kubernetes' own control plane: next to the API server, compressing costs CPU on both ends and saves no time. Turn it on when the bridge reaches the API server over a slow link; a kubeconfig's disable-compression still turns it off."`
	MetricsAddr         string         `key:"metricsAddr" flag:"metrics-bind-address" default:":8080" help:"Address of the Prometheus /metrics endpoint; \"0\" disables it."`
	HealthAddr          string         `key:"healthAddr" flag:"health-probe-bind-address" default:":8081" help:"Address of the /healthz and /readyz endpoints; \"0\" disables them."`
	PprofAddr           string         `key:"pprofAddr" flag:"pprof-bind-address" help:"Address of the Go pprof endpoints (/debug/pprof/); empty disables them. Do not expose it."`
	KubernetesEvents    bool           `key:"kubernetesEvents" flag:"kubernetes-events" default:"true" help:"Record a Kubernetes Event on the Student for every publish and failure."`
	KubernetesEventsQPS float64        `key:"kubernetesEventsQPS" flag:"kubernetes-events-qps" default:"10" help:"Most Kubernetes Events (each an API write) per second for the whole bridge (with shards, each replica writes the share of the shards it holds). Events wait in a queue of 1000; when it is full, the oldest are dropped and counted, so the newest get written: they never slow publishing."`
	ShutdownTimeout     time.Duration  `key:"shutdownTimeout" flag:"shutdown-timeout" default:"30s" help:"How long a graceful shutdown waits for in-flight publishes."`
	LeaderElection      LeaderElection `key:"leaderElection"`
	Retry               Retry          `key:"retry"`
	NATS                NATS           `key:"nats"`
	Records             Records        `key:"records"`
	Deletes             Deletes        `key:"deletes"`
	Status              Status         `key:"status"`
	Snapshot            Snapshot       `key:"snapshot"`
	Shards              Shards         `key:"shards"`
	Receipts            Receipts       `key:"receipts"`
	Fleet               Fleet          `key:"fleet"`
	Services            Services       `key:"services"`
	Tail                Tail           `key:"tail"`
}

// Records configures the record store: the JetStream key-value bucket that
// remembers what was published per Student.
type Records struct {
	Bucket   string `key:"bucket" flag:"records-bucket" default:"STUDENT_BRIDGE_PUBLISHED" help:"JetStream key-value bucket that records what was published per Student (one key per uid). Each bridge needs its own."`
	Create   bool   `key:"create" flag:"records-create" default:"true" help:"Create the bucket if it is missing. An existing bucket is never changed."`
	Storage  string `key:"storage" flag:"records-storage" default:"file" choices:"file|memory" help:"Storage of a created bucket: file or memory."`
	Replicas int    `key:"replicas" flag:"records-replicas" default:"1" help:"Replicas of a created bucket (3 on a 3-node cluster)."`
	// DeleteMarkerAge: a removed record's delete marker refuses a first
	// record for its uid while it is there.
	DeleteMarkerAge time.Duration `key:"deleteMarkerAge" flag:"records-delete-marker-age" default:"10m" help:"How long a removed record's delete marker stays in the bucket: while it is there, a replica that lost the Student (paused before its first reservation) cannot write a first record for it. Older markers, and those of removed receipts, are purged at the start and every that long; the receipts of Students that are gone are removed as often."`
	Store           string        `key:"store" flag:"records-store" default:"bucket" choices:"bucket|stream" help:"Where the records live: bucket (records.bucket), or stream, a prototype: in the events' stream under <subjectPrefix>-records.<uid>, each change one atomic batch of its event and its record (nats-server 2.12 or later; verify, services and fleets read only a bucket; docs/one-write.md)."`
}

// RecordsInStream is records.store's value for records kept in the
// events' stream.
const RecordsInStream = "stream"

// Deletes chooses how deletes are guaranteed.
type Deletes struct {
	HoldWithFinalizer bool `key:"holdWithFinalizer" flag:"hold-deletes-with-finalizer" default:"true" help:"Hold a deleted Student with a finalizer until its deleted event is acknowledged, so it carries the exact final state. false: the bridge writes nothing to Students; a delete carries the watch's final state, or the last published state if it happened while the bridge was down."`
}

// Status configures the status view written on Students.
type Status struct {
	Enabled bool    `key:"enabled" flag:"status" default:"true" help:"Write the status view (lastPublished, the Published condition) on Students. The bridge never reads it."`
	QPS     float64 `key:"qps" flag:"status-qps" default:"10" help:"Most status writes per second by the whole bridge (with shards, each replica writes the share of the shards it holds); writes are coalesced per Student and wait while changes are waiting. Failures are written first."`
}

// Shards configures active-active replicas.
type Shards struct {
	Count int `key:"count" flag:"shards" default:"1" help:"1: one replica (the leader, leaderElection) publishes for every Student. More: every replica publishes for the shards it holds (a hash of namespace/name; a Lease per shard, see docs/scaling.md). All replicas and the record store must agree on it."`
}

// Fleet configures a bridge in one cluster of many fanned into a hub
// (docs/fleet.md).
type Fleet struct {
	HubDomain      string `key:"hubDomain" flag:"fleet-hub-domain" help:"JetStream domain of the hub this cluster's NATS is a leaf node of (docs/fleet.md). Set, the bridge is one of a fleet: cluster must name this cluster and be its NATS's JetStream domain, snapshot requests are also answered on <snapshot.requestSubject>.<cluster>, and the receipts bucket sources this cluster's receipts from the hub's. Empty: one cluster."`
	ReceiptsBucket string `key:"receiptsBucket" flag:"fleet-receipts-bucket" default:"STUDENT_FLEET_RECEIPTS" help:"The hub's receipts bucket (keys <cluster>.<service>.<uid>) that the receipts bucket sources this cluster's keys from, with fleet.hubDomain."`
}

// Receipts configures the bucket where services report what they applied.
type Receipts struct {
	Bucket string `key:"bucket" flag:"receipts-bucket" default:"STUDENT_BRIDGE_RECEIPTS" help:"JetStream key-value bucket where services report what they applied (key <service>.<uid>); shown on the Student's status. Empty disables receipts."`
	Create bool   `key:"create" flag:"receipts-create" default:"true" help:"Create the receipts bucket if it is missing (like the record store: records.storage, records.replicas). An existing bucket is never changed."`
}

// Services configures which business services must report before a
// Student shows InSync.
type Services struct {
	Expected []string `key:"expected" flag:"expected-services" help:"Services that must report a change applied before the Student shows InSync, comma separated. Receipts of other services are shown but not required."`
}

// Snapshot configures bridge-side replay: snapshot events of every current
// Student, at startup and on request.
type Snapshot struct {
	OnStartup      bool          `key:"onStartup" flag:"snapshot-on-startup" help:"Publish a snapshot event (student.snapshot) of every Student when the bridge becomes leader."`
	RequestSubject string        `key:"requestSubject" flag:"snapshot-request-subject" default:"student-bridge.snapshot" help:"NATS subject on which the leader answers snapshot requests; empty disables them. Must not be under the stream's subjects."`
	MinInterval    time.Duration `key:"minInterval" flag:"snapshot-min-interval" default:"5m" help:"Requests for a namespace (or all) within this long of a snapshot that covered it, whose events the stream still holds, are answered by that snapshot instead of a new one; requests during a snapshot wait for it. 0: only those during one share it."`
}

// Tail configures `student-bridge tail`, the consumer side.
type Tail struct {
	Cluster      string   `key:"cluster" flag:"cluster" help:"On a fleet's hub (docs/fleet.md): read the hub's stream (STUDENTS_FLEET unless nats.stream.name says otherwise) and only this cluster's events, <nats.subjectPrefix>.<cluster>.>; \"*\" reads every cluster's."`
	Subjects     []string `key:"subjects" flag:"subjects" help:"Subjects to read, comma separated; default <nats.subjectPrefix>.> (everything)."`
	Output       string   `key:"output" flag:"output" short:"o" default:"text" choices:"text|json" help:"text: one readable line per event; json: one CloudEvent JSON object per line."`
	Deliver      string   `key:"deliver" flag:"deliver" default:"new" choices:"new|all|last|since|sequence" help:"new: only events from now on; all: the whole stream; last: the last event of every Student, then new ones; since: from tail.since; sequence: from tail.fromSequence."`
	Since        string   `key:"since" flag:"since" help:"With deliver=since: an RFC 3339 time or a duration back from now, e.g. 1h."`
	FromSequence uint64   `key:"fromSequence" flag:"from-sequence" help:"With deliver=sequence: the first stream sequence to print."`
	Durable      string   `key:"durable" flag:"durable" help:"Name of a durable consumer: a restarted tail resumes after the last event it printed."`
	Follow       bool     `key:"follow" flag:"follow" default:"true" help:"Keep waiting for new events; false exits once the stream is read to its end."`
}

// LeaderElection configures the lease that keeps one replica active.
type LeaderElection struct {
	Enabled       bool          `key:"enabled" flag:"leader-elect" default:"true" help:"Use a Lease so that only one replica publishes at a time."`
	Namespace     string        `key:"namespace" flag:"leader-election-namespace" help:"Namespace of the Lease; defaults to the pod's namespace in-cluster, else \"default\"."`
	ID            string        `key:"id" flag:"leader-election-id" default:"student-bridge.example.k8s.io" help:"Name of the Lease."`
	LeaseDuration time.Duration `key:"leaseDuration" flag:"leader-election-lease-duration" default:"15s" help:"How long a standby waits after the leader's last renewal before it takes over; with shards, how long a replica's shards stay held after its member Lease's last renewal."`
	RenewDeadline time.Duration `key:"renewDeadline" flag:"leader-election-renew-deadline" default:"10s" help:"How long the leader keeps trying to renew before it steps down; with shards, a replica renews its member Lease every leaseDuration - renewDeadline and gives up its shards when it could not renew for renewDeadline."`
	RetryPeriod   time.Duration `key:"retryPeriod" flag:"leader-election-retry-period" default:"2s" help:"How often replicas try to acquire or renew the Lease; with shards, how often they read the Leases and contest shards."`
}

// Retry bounds the exponential backoff of failed publishes.
type Retry struct {
	BaseDelay time.Duration `key:"baseDelay" flag:"retry-base-delay" default:"500ms" help:"First delay before a failed publish is retried; it doubles on each failure; a publish NATS failed is retried at once when another succeeds."`
	MaxDelay  time.Duration `key:"maxDelay" flag:"retry-max-delay" default:"1m" help:"Longest delay between retries of a failed publish."`
}

// NATS configures the connection, the encoding and the stream.
type NATS struct {
	URLs           string        `key:"urls" flag:"nats-url" default:"nats://127.0.0.1:4222" help:"NATS server URL(s), comma separated."`
	Name           string        `key:"name" flag:"nats-name" default:"student-bridge" help:"Connection name shown by the NATS server."`
	Mode           string        `key:"mode" flag:"nats-mode" default:"jetstream" choices:"jetstream|core" help:"jetstream: wait for the stream's ack (at-least-once). core: publish and flush (at-most-once)."`
	Encoding       string        `key:"encoding" flag:"nats-encoding" default:"structured" choices:"structured|binary" help:"CloudEvents NATS binding mode: structured (JSON body) or binary (ce-* headers)."`
	SubjectPrefix  string        `key:"subjectPrefix" flag:"subject-prefix" default:"student" help:"First token of every subject."`
	SubjectLayout  string        `key:"subjectLayout" flag:"subject-layout" default:"{prefix}.{op}" help:"Subject layout; tokens {prefix} {op} {namespace} {name}. Must start with {prefix}."`
	ConnectTimeout time.Duration `key:"connectTimeout" flag:"nats-connect-timeout" default:"5s" help:"Timeout of one connection attempt."`
	ReconnectWait  time.Duration `key:"reconnectWait" flag:"nats-reconnect-wait" default:"2s" help:"Wait between reconnection attempts."`
	MaxReconnects  int           `key:"maxReconnects" flag:"nats-max-reconnects" default:"-1" help:"Reconnection attempts before giving up; -1 retries forever."`
	AckTimeout     time.Duration `key:"ackTimeout" flag:"nats-ack-timeout" default:"5s" help:"How long one publish (or record write) waits for the JetStream acknowledgement. Writes failing for 3 times as long on a live connection move it to another server of the cluster."`
	Auth           Auth          `key:"auth"`
	TLS            TLS           `key:"tls"`
	Stream         Stream        `key:"stream"`
}

// Auth holds NATS credentials. Secrets come from files or environment
// variables, never from flags, and are never logged.
type Auth struct {
	User         string `key:"user" flag:"nats-user" help:"NATS user name (password from nats.auth.passwordFile or STUDENT_BRIDGE_NATS_AUTH_PASSWORD)."`
	Password     string `key:"password" help:"NATS password; set it by environment variable, not in a file in version control."`
	PasswordFile string `key:"passwordFile" flag:"nats-password-file" help:"File holding the NATS password."`
	Token        string `key:"token" help:"NATS token; set it by environment variable."`
	TokenFile    string `key:"tokenFile" flag:"nats-token-file" help:"File holding the NATS token."`
	NkeySeedFile string `key:"nkeySeedFile" flag:"nats-nkey-seed-file" help:"File holding an NKey seed."`
	CredsFile    string `key:"credsFile" flag:"nats-creds-file" help:"JWT credentials file (user JWT and NKey seed)."`
}

// TLS configures server verification and client certificates.
type TLS struct {
	CAFile   string `key:"caFile" flag:"nats-tls-ca-file" help:"CA bundle to verify the NATS server."`
	CertFile string `key:"certFile" flag:"nats-tls-cert-file" help:"Client certificate for mutual TLS."`
	KeyFile  string `key:"keyFile" flag:"nats-tls-key-file" help:"Client key for mutual TLS."`
}

// Stream configures the JetStream stream.
type Stream struct {
	Name       string        `key:"name" flag:"stream-name" default:"STUDENTS" help:"JetStream stream that stores the events."`
	Create     bool          `key:"create" flag:"stream-create" default:"true" help:"Create the stream if it is missing. An existing stream is never changed."`
	Storage    string        `key:"storage" flag:"stream-storage" default:"file" choices:"file|memory" help:"Storage of a created stream: file or memory."`
	Replicas   int           `key:"replicas" flag:"stream-replicas" default:"1" help:"Replicas of a created stream (3 on a 3-node cluster)."`
	MaxAge     time.Duration `key:"maxAge" flag:"stream-max-age" help:"Drop events older than this; 0 keeps them (bounded by the size limits)."`
	MaxBytes   int64         `key:"maxBytes" flag:"stream-max-bytes" help:"Size limit of a created stream in bytes; 0 is unlimited."`
	MaxMsgs    int64         `key:"maxMsgs" flag:"stream-max-msgs" help:"Message limit of a created stream; 0 is unlimited."`
	Discard    string        `key:"discard" flag:"stream-discard" default:"old" choices:"old|new" help:"When a created stream is full: old drops the oldest events, new refuses new ones (the bridge retries)."`
	Duplicates time.Duration `key:"duplicates" flag:"stream-duplicate-window" default:"2m" help:"Window in which the stream drops an event whose id it already stored."`
}
