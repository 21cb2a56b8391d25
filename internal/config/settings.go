package config

// The settings table: every key once, with its default, flag and help.
// Flags, environment variables, configs/student-bridge.yaml and the Helm
// chart's schema are all made from it.

import (
	"time"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

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
	{"memoryLimit", "memory-limit", "", "The container's memory limit, in bytes or as a quantity (512Mi); the shipped Deployment and chart set it from the downward API (limits.memory). The bridge sets the Go runtime's soft memory limit to 90% of it, so the garbage collector works harder before the container would be killed. Empty: GOMEMLIMIT, if set, else no limit. GOMEMLIMIT wins over it."},
	{"tracing.endpoint", "tracing-endpoint", "", "OTLP/gRPC endpoint (host:port) to export traces to: a span per publish, continued from a Student's opentelemetry.io/trace-context annotation and carried in the CloudEvent (traceparent). Empty: the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables, else no tracing."},
	{"tracing.insecure", "tracing-insecure", false, "Export traces without TLS (a collector on the node or in the cluster)."},
	{"kubernetesEvents", "kubernetes-events", true, "Record a Kubernetes Event on the Student for every publish and failure."},
	{"kubernetesEventsQPS", "kubernetes-events-qps", float64(10), "Most Kubernetes Events (each an API write) per second for the whole bridge (with shards, each replica writes the share of the shards it holds). Events wait in a queue of 1000; when it is full, the oldest are dropped and counted, so the newest get written: they never slow publishing."},
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
	{"nats.subjectPrefix", "subject-prefix", studentv1.DefaultSubjectPrefix, "First token of every subject."},
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
	{"nats.stream.name", "stream-name", studentv1.DefaultStream, "JetStream stream that stores the events."},
	{"nats.stream.create", "stream-create", true, "Create the stream if it is missing. An existing stream is never changed."},
	{"nats.stream.storage", "stream-storage", "file", "Storage of a created stream: file or memory."},
	{"nats.stream.replicas", "stream-replicas", 1, "Replicas of a created stream (3 on a 3-node cluster)."},
	{"nats.stream.maxAge", "stream-max-age", dur("0s"), "Drop events older than this; 0 keeps them (bounded by the size limits)."},
	{"nats.stream.maxBytes", "stream-max-bytes", int64(0), "Size limit of a created stream in bytes; 0 is unlimited."},
	{"nats.stream.maxMsgs", "stream-max-msgs", int64(0), "Message limit of a created stream; 0 is unlimited."},
	{"nats.stream.discard", "stream-discard", "old", "When a created stream is full: old drops the oldest events, new refuses new ones (the bridge retries)."},
	{"nats.stream.duplicates", "stream-duplicate-window", dur("2m"), "Window in which the stream drops an event whose id it already stored."},
	{"state.bucket", "state-bucket", studentv1.DefaultRecordsBucket, "JetStream key-value bucket that records what was published per Student (one key per uid). Each bridge needs its own."},
	{"state.create", "state-create", true, "Create the bucket if it is missing. An existing bucket is never changed."},
	{"state.storage", "state-storage", "file", "Storage of a created bucket: file or memory."},
	{"state.replicas", "state-replicas", 1, "Replicas of a created bucket (3 on a 3-node cluster)."},
	{"deletes.holdWithFinalizer", "hold-deletes-with-finalizer", true, "Hold a deleted Student with a finalizer until its deleted event is acknowledged, so it carries the exact final state. false: the bridge writes nothing to Students; a delete carries the watch's final state, or the last published state if it happened while the bridge was down."},
	{"status.enabled", "status", true, "Write the status view (lastPublished, the Published condition) on Students. The bridge never reads it."},
	{"status.qps", "status-qps", float64(10), "Most status writes per second by the whole bridge (with shards, each replica writes the share of the shards it holds); writes are coalesced per Student and wait while changes are waiting. Failures are written first."},
	{"snapshot.onStartup", "snapshot-on-startup", false, "Publish a snapshot event (student.snapshot) of every Student when the bridge becomes leader."},
	{"snapshot.requestSubject", "snapshot-request-subject", studentv1.DefaultSnapshotSubject, "NATS subject on which the leader answers snapshot requests; empty disables them. Must not be under the stream's subjects."},
	{"snapshot.minInterval", "snapshot-min-interval", dur("5m"), "Requests for a namespace (or all) within this long of a snapshot that covered it, whose events the stream still holds, are answered by that snapshot instead of a new one; requests during a snapshot wait for it. 0: only those during one share it."},
	{"shards.count", "shards", 1, "1: one replica (the leader, leaderElection) publishes for every Student. More: every replica publishes for the shards it holds (a hash of namespace/name; a Lease per shard, see docs/scaling.md). All replicas and the record store must agree on it."},
	{"receipts.bucket", "receipts-bucket", studentv1.ReceiptsBucket, "JetStream key-value bucket where services report what they applied (key <service>.<uid>); shown on the Student's status. Empty disables receipts."},
	{"receipts.create", "receipts-create", true, "Create the receipts bucket if it is missing (like the record store: state.storage, state.replicas). An existing bucket is never changed."},
	{"fleet.hubDomain", "fleet-hub-domain", "", "JetStream domain of the hub this cluster's NATS is a leaf node of (docs/fleet.md). Set, the bridge is one of a fleet: cluster must name this cluster and be its NATS's JetStream domain, snapshot requests are also answered on <snapshot.requestSubject>.<cluster>, and the receipts bucket sources this cluster's receipts from the hub's. Empty: one cluster."},
	{"fleet.receiptsBucket", "fleet-receipts-bucket", studentv1.FleetReceiptsBucket, "The hub's receipts bucket (keys <cluster>.<service>.<uid>) that the receipts bucket sources this cluster's keys from, with fleet.hubDomain."},
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
	{"tail.cluster", "cluster", "", "On a fleet's hub (docs/fleet.md): read the hub's stream (STUDENTS_FLEET unless nats.stream.name says otherwise) and only this cluster's events, <nats.subjectPrefix>.<cluster>.>; \"*\" reads every cluster's."},
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

// dur parses a default duration; the defaults are constants, so a bad one is
// a programming error.
func dur(s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		panic(err)
	}
	return d
}
