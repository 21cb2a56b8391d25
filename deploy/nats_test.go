package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	studentconsumer "github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/tail"
	"github.com/student-bridge/student-bridge/internal/verify"
)

// shippedNATSOptions parses deploy/nats/nats.conf with nats-server's own
// loader, with the passwords given.
func shippedNATSOptions(t *testing.T, bridgePassword, consumerPassword string) *natsserver.Options {
	t.Helper()
	t.Setenv("POD_NAME", "nats-0")
	t.Setenv("BRIDGE_PASSWORD", bridgePassword)
	t.Setenv("CONSUMER_PASSWORD", consumerPassword)
	t.Setenv("ROSTER_PASSWORD", "roster-secret")
	opts, err := natsserver.ProcessConfigFile(filepath.Join(stack.RepoRoot(), "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf does not parse: %v", err)
	}
	if !opts.JetStream || opts.StoreDir != "/data" || opts.ServerName != "nats-0" || len(opts.Users) != 3 {
		t.Fatalf("nats.conf parsed to jetstream=%v store=%s name=%s users=%d", opts.JetStream, opts.StoreDir, opts.ServerName, len(opts.Users))
	}
	if !opts.SyncAlways {
		t.Errorf("nats.conf: JetStream acknowledges before it syncs to disk (sync_interval %s); want sync_interval: always", opts.SyncInterval)
	}
	return opts
}

// startShippedNATS runs deploy/nats/nats.conf as a single embedded server.
func startShippedNATS(t *testing.T, bridgePassword, consumerPassword string) string {
	t.Helper()
	return startNATS(t, shippedNATSOptions(t, bridgePassword, consumerPassword))
}

// startNATS runs a parsed server configuration as a single embedded server.
func startNATS(t *testing.T, opts *natsserver.Options) string {
	t.Helper()
	return startServer(t, opts).ClientURL()
}

// startServer is startNATS, returning the server.
func startServer(t *testing.T, opts *natsserver.Options) *natsserver.Server {
	t.Helper()
	// Only what a pod provides differs here: the volume and the ports.
	opts.StoreDir = t.TempDir()
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.NoLog, opts.NoSigs = true, true
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// permissionErrors connects as user and collects the asynchronous
// permission violations the server reports.
func connectAs(t *testing.T, url, user, password string) (*nats.Conn, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var errs []string
	nc, err := nats.Connect(url, nats.UserInfo(user, password), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err.Error())
	}))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	return nc, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

func expectViolation(t *testing.T, nc *nats.Conn, errs func() []string, subject string) {
	t.Helper()
	if err := nc.Publish(subject, []byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	if err := stacktest.Eventually(5*time.Second, func() error {
		for _, e := range errs() {
			if strings.Contains(strings.ToLower(e), "permissions violation") && strings.Contains(e, subject) {
				return nil
			}
		}
		return fmt.Errorf("no permissions violation for %s; errors %v", subject, errs())
	}); err != nil {
		t.Error(err)
	}
}

// TestShippedNATSConfig: with the shipped server config and credentials
// layout, the bridge creates its stream and publishes on student.>, a
// consumer reads the stream, and neither can publish where it must not.
func TestShippedNATSConfig(t *testing.T) {
	checkBridgeAndConsumer(t, startShippedNATS(t, "bridge-secret", "consumer-secret"))
}

// checkBridgeAndConsumer runs the bridge as user bridge (password
// bridge-secret) against url and checks what it and user consumer
// (consumer-secret) may and may not do.
func checkBridgeAndConsumer(t *testing.T, url string) {
	ctx := context.Background()

	ns := stacktest.Namespace(t, st.Client, "nats-config-check")
	cfg := runBridgeAs(t, url, ns, nil)

	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "object-name"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}

	consumer, consumerErrs := connectAs(t, url, "consumer", "consumer-secret")
	var out bytes.Buffer
	if err := stacktest.Eventually(30*time.Second, func() error {
		out.Reset()
		tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
		defer tcancel()
		if err := tail.Run(tctx, consumer, tail.Options{Stream: "STUDENTS", Subjects: []string{"student.>"}, Deliver: tail.DeliverAll, Out: &out}); err != nil {
			return err
		}
		if !strings.Contains(out.String(), "created  "+ns+"/object-name") {
			return fmt.Errorf("consumer read %q", out.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The record store works with the shipped permissions: the record is
	// written, and removed once the Student's deletion is published.
	bridgeKV := bridgeBucket(t, url, "STUDENT_BRIDGE_PUBLISHED")
	if err := stacktest.Eventually(30*time.Second, func() error {
		_, err := bridgeKV.Get(ctx, string(stu.UID))
		return err
	}); err != nil {
		t.Fatalf("record of %s: %v", stu.Name, err)
	}
	if err := st.Client.Delete(ctx, stu); err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		if _, err := bridgeKV.Get(ctx, string(stu.UID)); !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
			return fmt.Errorf("record still there after the delete (%v)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The receipts bucket is created and watched with the shipped
	// permissions, and the bridge purges both buckets' delete markers
	// (records.deleteMarkerAge): a removed receipt leaves one too.
	bridgeReceipts := bridgeBucket(t, url, "STUDENT_BRIDGE_RECEIPTS")
	if err := bridgeReceipts.Delete(ctx, "roster."+string(stu.UID)); err != nil {
		t.Fatal(err)
	}
	for _, kv := range []jetstream.KeyValue{bridgeKV, bridgeReceipts} {
		if err := kv.PurgeDeletes(ctx); err != nil {
			t.Errorf("the bridge purging the delete markers of %s: %v", kv.Bucket(), err)
		}
	}

	// A business service, as user roster, mirrors the Students and writes
	// its own receipts, and no other service's.
	rosterConn, rosterErrs := connectAs(t, url, "roster", "roster-secret")
	applied := make(chan string, 16)
	mirror, err := studentconsumer.NewMirror(rosterConn, studentconsumer.MirrorOptions{Service: "roster",
		Handler: func(_ context.Context, c studentconsumer.Change) error {
			applied <- c.Name
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	mdone := make(chan error, 1)
	go func() { mdone <- mirror.Run(mctx) }()
	defer func() {
		mcancel()
		if err := <-mdone; err != nil {
			t.Errorf("mirror as roster: %v", err)
		}
	}()
	second := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "second"}, Spec: studentv1.StudentSpec{Name: "li", School: "china"}}
	if err := st.Client.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	select {
	case name := <-applied:
		if name != "second" {
			t.Errorf("roster applied %s, want second", name)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the mirror as roster applied nothing; permission errors: %v", rosterErrs())
	}
	rosterJS, err := jetstream.New(rosterConn)
	if err != nil {
		t.Fatal(err)
	}
	receipts, err := rosterJS.KeyValue(ctx, "STUDENT_BRIDGE_RECEIPTS")
	if err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		_, err := receipts.Get(ctx, studentv1.ReceiptKey("roster", string(second.UID)))
		return err
	}); err != nil {
		t.Errorf("roster's receipt: %v (permission errors %v)", err, rosterErrs())
	}
	expectViolation(t, rosterConn, rosterErrs, "$KV.STUDENT_BRIDGE_RECEIPTS.billing."+string(second.UID))
	expectViolation(t, rosterConn, rosterErrs, "student.created")
	// Nor may it read through, change or delete another service's consumer.
	expectViolation(t, rosterConn, rosterErrs, "$JS.API.CONSUMER.MSG.NEXT.STUDENTS.billing")
	expectViolation(t, rosterConn, rosterErrs, "$JS.API.CONSUMER.CREATE.STUDENTS.billing.student.>")
	expectViolation(t, rosterConn, rosterErrs, "$JS.API.CONSUMER.DELETE.STUDENTS.billing")
	expectViolation(t, rosterConn, rosterErrs, "$JS.API.CONSUMER.MSG.NEXT.STUDENTS.billing~rebuild")
	expectViolation(t, consumer, consumerErrs, "$KV.STUDENT_BRIDGE_RECEIPTS.roster."+string(second.UID))

	expectViolation(t, consumer, consumerErrs, "student.created")
	bridgeConn, bridgeErrs := connectAs(t, url, "bridge", "bridge-secret")
	// verify reads all it compares as either user, and finds the stream
	// telling the truth.
	for user, nc := range map[string]*nats.Conn{"consumer": consumer, "bridge": bridgeConn} {
		src := verify.Source{NATS: nc, Stream: "STUDENTS", Bucket: "STUDENT_BRIDGE_PUBLISHED", Kube: st.Client, Namespaces: []string{ns}, Cluster: cfg.Cluster}
		if err := stacktest.Eventually(30*time.Second, func() error {
			r, err := verify.Verify(ctx, src, verify.Options{})
			if err != nil {
				return err
			}
			if r.Events != 3 || !r.RecordsRead {
				return fmt.Errorf("verify read %d events (records read: %v), want 3", r.Events, r.RecordsRead)
			}
			return r.Err()
		}); err != nil {
			t.Errorf("verify as %s: %v", user, err)
		}
	}
	expectViolation(t, consumer, consumerErrs, "$KV.STUDENT_BRIDGE_PUBLISHED."+string(second.UID))
	expectViolation(t, bridgeConn, bridgeErrs, "billing.invoice")

	if _, err := nats.Connect(url, nats.UserInfo("bridge", "wrong")); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("a wrong password was not refused: %v", err)
	}
}

// runBridgeAs runs the bridge for the Students of ns until the test ends,
// configured as the Deployment configures it (user bridge, password from a
// mounted file) and then by adjust, if set.
func runBridgeAs(t *testing.T, url, ns string, adjust func(*config.Config)) *config.Config {
	t.Helper()
	pwFile := filepath.Join(t.TempDir(), "bridge-password")
	if err := os.WriteFile(pwFile, []byte("bridge-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.NewLoader(nil, config.BridgeCommand).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS.URLs = url
	cfg.NATS.Auth.User = "bridge"
	cfg.NATS.Auth.PasswordFile = pwFile
	cfg.Namespaces = []string{ns}
	cfg.LeaderElection.Enabled = false
	cfg.MetricsAddr, cfg.HealthAddr = "0", "0"
	if adjust != nil {
		adjust(cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bridge.Run(ctx, cfg, st.RestConfig) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge: %v", err)
		}
	})
	return cfg
}

// bridgeBucket opens a bucket of the bridge (once it exists) as the
// bridge's own user.
func bridgeBucket(t *testing.T, url, bucket string) jetstream.KeyValue {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo("bridge", "bridge-secret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var kv jetstream.KeyValue
	if err := stacktest.Eventually(30*time.Second, func() error {
		kv, err = js.KeyValue(context.Background(), bucket)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return kv
}

// chartValues is what the tests read of values for the official NATS
// chart.
type chartValues struct {
	Config struct {
		Merge     map[string]any `json:"merge"`
		JetStream struct {
			Enabled bool           `json:"enabled"`
			Merge   map[string]any `json:"merge"`
		} `json:"jetstream"`
		Cluster struct {
			Enabled  bool `json:"enabled"`
			Replicas int  `json:"replicas"`
		} `json:"cluster"`
		Leafnodes struct {
			Enabled bool `json:"enabled"`
			Port    int  `json:"port"`
		} `json:"leafnodes"`
	} `json:"config"`
	Container struct {
		Env map[string]corev1.EnvVar `json:"env"`
	} `json:"container"`
}

// readChartValues reads values files under deploy/helm, each over the
// ones before as helm install -f merges them (maps deeply, the rest
// replaced).
func readChartValues(t *testing.T, files ...string) chartValues {
	t.Helper()
	merged := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "deploy", "helm", f))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		mergeValues(merged, m)
	}
	b, _ := json.Marshal(merged)
	var v chartValues
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func mergeValues(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeValues(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// parseChartConfig renders the merge blocks of values into a nats.conf as
// the official NATS chart does (nats.formatConfig: the block as JSON,
// "<< x >>" strings written raw) and parses it with nats-server's own
// loader, with env set; the leaf node listener the chart adds
// (config.leafnodes) listens on a free port.
func parseChartConfig(t *testing.T, values chartValues, env map[string]string) *natsserver.Options {
	t.Helper()
	// toPrettyRawJson: indented, '<', '>' and '&' not escaped.
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	// The chart renders config.jetstream.merge into the jetstream block.
	merged := map[string]any{"jetstream": values.Config.JetStream.Merge}
	for k, v := range values.Config.Merge {
		merged[k] = v
	}
	if err := enc.Encode(merged); err != nil {
		t.Fatal(err)
	}
	conf := regexp.MustCompile(`"<<\s+(.*?)\s+>>"`).ReplaceAllString(js.String(), "${1}")
	file := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	opts, err := natsserver.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("the merge blocks do not parse:\n%s\n%v", conf, err)
	}
	if !opts.SyncAlways {
		t.Errorf("JetStream acknowledges before it syncs to disk (sync_interval %s); want config.jetstream.merge.sync_interval: always", opts.SyncInterval)
	}
	if values.Config.Leafnodes.Enabled {
		opts.LeafNode.Host, opts.LeafNode.Port, opts.LeafNode.NoAdvertise = "127.0.0.1", -1, true
	}
	opts.JetStream = true
	return opts
}

// natsChartConfig parses deploy/helm/nats-values.yaml (parseChartConfig)
// and checks it is a 3-node JetStream cluster whose passwords come from
// the bridge's Secret.
func natsChartConfig(t *testing.T, bridgePassword, consumerPassword string) *natsserver.Options {
	t.Helper()
	values := readChartValues(t, "nats-values.yaml")
	if !values.Config.JetStream.Enabled || !values.Config.Cluster.Enabled || values.Config.Cluster.Replicas != 3 {
		t.Errorf("nats-values.yaml: want a 3-node JetStream cluster, got %+v", values.Config)
	}
	checkSecretEnv(t, "nats-values.yaml", values, "student-bridge-nats", map[string]string{"BRIDGE_PASSWORD": "bridge-password", "CONSUMER_PASSWORD": "consumer-password", "ROSTER_PASSWORD": "roster-password"})
	return parseChartConfig(t, values, map[string]string{"BRIDGE_PASSWORD": bridgePassword, "CONSUMER_PASSWORD": consumerPassword, "ROSTER_PASSWORD": "roster-secret"})
}

// checkSecretEnv checks that each variable of want comes from its key of
// Secret secret.
func checkSecretEnv(t *testing.T, file string, values chartValues, secret string, want map[string]string) {
	t.Helper()
	for env, key := range want {
		ref := values.Container.Env[env].ValueFrom
		if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != secret || ref.SecretKeyRef.Key != key {
			t.Errorf("%s: container.env.%s does not come from Secret %s key %s", file, env, secret, key)
		}
	}
}

// TestNATSChartValues: the users deploy/helm/nats-values.yaml gives the
// official NATS chart have exactly the permissions deploy/nats grants, and
// the bridge and a consumer work with them.
func TestNATSChartValues(t *testing.T) {
	chart := natsChartConfig(t, "bridge-secret", "consumer-secret")
	shipped := shippedNATSOptions(t, "bridge-secret", "consumer-secret")
	perms := func(opts *natsserver.Options) map[string]*natsserver.Permissions {
		out := map[string]*natsserver.Permissions{}
		for _, u := range opts.Users {
			out[u.Username] = u.Permissions
		}
		return out
	}
	c, s := perms(chart), perms(shipped)
	if len(c) != 3 || !reflect.DeepEqual(c, s) {
		cj, _ := json.Marshal(c)
		sj, _ := json.Marshal(s)
		t.Errorf("the NATS chart's users differ from deploy/nats:\nchart  %s\nnats.conf %s", cj, sj)
	}
	checkBridgeAndConsumer(t, startNATS(t, chart))
}
