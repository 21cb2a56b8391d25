package config

// Validation: each command checks the keys it uses and names the first
// bad one, with its environment variable.

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

func bad(key string, format string, args ...any) error {
	return fmt.Errorf("config key %s (env %s): %s", key, EnvName(key), fmt.Sprintf(format, args...))
}

// validBucketName: letters, digits, '_' and '-' only.
func validBucketName(name string) bool {
	return strings.Trim(name, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-") == ""
}

func isChoice(key, val string) bool { return slices.Contains(choices(key), val) }

func choices(key string) []string {
	s, _ := Lookup(key)
	return s.Choices
}

// notAChoice is the error for val, which is not one of key's choices.
func notAChoice(key, val string) error {
	c := choices(key)
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
	case c.Records.Bucket == "" || !validBucketName(c.Records.Bucket):
		return bad("records.bucket", "%q must be non-empty and only letters, digits, '_' and '-'", c.Records.Bucket)
	case !isChoice("records.storage", c.Records.Storage):
		return notAChoice("records.storage", c.Records.Storage)
	case c.Records.Replicas < 1 || c.Records.Replicas > 5:
		return bad("records.replicas", "%d: want 1 to 5", c.Records.Replicas)
	case c.Records.DeleteMarkerAge <= 0:
		return bad("records.deleteMarkerAge", "%s must be positive", c.Records.DeleteMarkerAge)
	case !isChoice("records.store", c.Records.Store):
		return notAChoice("records.store", c.Records.Store)
	case c.Records.Store == RecordsInStream && c.NATS.Mode != "jetstream":
		return bad("records.store", "%q needs nats.mode jetstream: the records live in the events' stream", c.Records.Store)
	case c.Status.Enabled && c.Status.QPS <= 0:
		return bad("status.qps", "%v must be positive (or set status.enabled to false)", c.Status.QPS)
	case c.Receipts.Bucket != "" && !validBucketName(c.Receipts.Bucket):
		return bad("receipts.bucket", "%q must be only letters, digits, '_' and '-'", c.Receipts.Bucket)
	case c.Receipts.Bucket != "" && c.Receipts.Bucket == c.Records.Bucket:
		return bad("receipts.bucket", "%q is the record store's bucket (records.bucket)", c.Receipts.Bucket)
	case c.Shards.Count < 1 || c.Shards.Count > 1024:
		return bad("shards.count", "%d: want 1 to 1024", c.Shards.Count)
	case c.Shards.Count > 1 && c.Snapshot.OnStartup:
		return bad("snapshot.onStartup", "every replica would publish a snapshot with shards.count %d; request one instead (snapshot.requestSubject)", c.Shards.Count)
	case c.Shards.Count > 1 && (c.LeaderElection.RetryPeriod <= 0 || c.LeaderElection.LeaseDuration <= 2*c.LeaderElection.RetryPeriod):
		return bad("leaderElection.leaseDuration", "%s must be more than twice leaderElection.retryPeriod (%s) for shard Leases", c.LeaderElection.LeaseDuration, c.LeaderElection.RetryPeriod)
	case c.Shards.Count > 1 && (c.LeaderElection.RenewDeadline <= c.LeaderElection.RetryPeriod || c.LeaderElection.RenewDeadline >= c.LeaderElection.LeaseDuration):
		return bad("leaderElection.renewDeadline", "%s must be between leaderElection.retryPeriod (%s) and leaderElection.leaseDuration (%s): a replica renews its member Lease every leaseDuration - renewDeadline and gives up its shards when it could not renew for renewDeadline",
			c.LeaderElection.RenewDeadline, c.LeaderElection.RetryPeriod, c.LeaderElection.LeaseDuration)
	case c.Fleet.HubDomain != "" && (c.Cluster == "default" || !studentv1.ValidClusterName(c.Cluster)):
		return bad("cluster", "%q: in a fleet (fleet.hubDomain) name this cluster, as its NATS's JetStream domain is named (letters, digits, '-', '_', up to 63): two clusters of one name would collide on the hub", c.Cluster)
	case c.Fleet.HubDomain != "" && (!studentv1.ValidClusterName(c.Fleet.HubDomain) || c.Fleet.HubDomain == c.Cluster):
		return bad("fleet.hubDomain", "%q must be a JetStream domain (letters, digits, '-', '_') other than the cluster's", c.Fleet.HubDomain)
	case c.Fleet.HubDomain != "" && !validBucketName(c.Fleet.ReceiptsBucket):
		return bad("fleet.receiptsBucket", "%q must be only letters, digits, '_' and '-'", c.Fleet.ReceiptsBucket)
	case len(c.Services.Expected) > 0 && c.Receipts.Bucket == "":
		return bad("services.expected", "needs receipts.bucket")
	case strings.ContainsAny(c.Snapshot.RequestSubject, " \t*>"):
		return bad("snapshot.requestSubject", "%q must be a literal subject", c.Snapshot.RequestSubject)
	case c.Snapshot.MinInterval < 0:
		return bad("snapshot.minInterval", "%s must not be negative", c.Snapshot.MinInterval)
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
	return c.validateKubeconfig()
}

// validateKubeconfig checks that a kubeconfig named is there.
func (c *Config) validateKubeconfig() error {
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
	return c.validateKubeconfig()
}

// validateVerify checks the keys `student-bridge verify` uses.
func (c *Config) validateVerify() error {
	if err := c.validateConnection(); err != nil {
		return err
	}
	if _, err := labels.Parse(c.LabelSelector); err != nil {
		return bad("labelSelector", "%v", err)
	}
	return c.validateKubeconfig()
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
	case t.Cluster != "" && t.Cluster != "*" && !studentv1.ValidClusterName(t.Cluster):
		return bad("tail.cluster", "%q is not a cluster name (letters, digits, '-', '_')", t.Cluster)
	case t.Cluster != "" && len(t.Subjects) > 0:
		return bad("tail.cluster", "set either tail.cluster or tail.subjects, not both")
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
