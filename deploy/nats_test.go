package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/tail"
)

// startShippedNATS runs deploy/nats/nats.conf, parsed by nats-server's own
// loader, as a single embedded server with the passwords given.
func startShippedNATS(t *testing.T, bridgePassword, consumerPassword string) string {
	t.Helper()
	t.Setenv("POD_NAME", "nats-0")
	t.Setenv("BRIDGE_PASSWORD", bridgePassword)
	t.Setenv("CONSUMER_PASSWORD", consumerPassword)
	opts, err := natsserver.ProcessConfigFile(filepath.Join(stack.RepoRoot(), "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf does not parse: %v", err)
	}
	if !opts.JetStream || opts.StoreDir != "/data" || opts.ServerName != "nats-0" || len(opts.Users) != 2 {
		t.Fatalf("nats.conf parsed to jetstream=%v store=%s name=%s users=%d", opts.JetStream, opts.StoreDir, opts.ServerName, len(opts.Users))
	}
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
	return srv.ClientURL()
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
	if err := stack.Eventually(5*time.Second, func() error {
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
	ctx := context.Background()
	url := startShippedNATS(t, "bridge-secret", "consumer-secret")

	// The bridge, configured as the Deployment configures it: user bridge,
	// password from a mounted file.
	secretDir := t.TempDir()
	pwFile := filepath.Join(secretDir, "bridge-password")
	if err := os.WriteFile(pwFile, []byte("bridge-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "nats-config-check-"}}
	if err := st.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.New(nil).Load("")
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS.URLs = url
	cfg.NATS.Auth.User = "bridge"
	cfg.NATS.Auth.PasswordFile = pwFile
	cfg.Namespaces = []string{ns.Name}
	cfg.LeaderElection.Enabled = false
	cfg.MetricsAddr, cfg.HealthAddr = "0", "0"
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- bridge.Run(runCtx, cfg, st.RestConfig) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge: %v", err)
		}
	}()

	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "object-name"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}

	consumer, consumerErrs := connectAs(t, url, "consumer", "consumer-secret")
	var out bytes.Buffer
	if err := stack.Eventually(30*time.Second, func() error {
		out.Reset()
		tctx, tcancel := context.WithTimeout(ctx, 10*time.Second)
		defer tcancel()
		if err := tail.Run(tctx, consumer, tail.Options{Stream: "STUDENTS", Subjects: []string{"student.>"}, Deliver: tail.DeliverAll, Out: &out}); err != nil {
			return err
		}
		if !strings.Contains(out.String(), "created  "+ns.Name+"/object-name") {
			return fmt.Errorf("consumer read %q", out.String())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	// The record store works with the shipped permissions: the record is
	// written, and removed once the Student's deletion is published.
	bridgeKV := recordStore(t, url)
	if err := stack.Eventually(30*time.Second, func() error {
		_, err := bridgeKV.Get(ctx, string(stu.UID))
		return err
	}); err != nil {
		t.Fatalf("record of %s: %v", stu.Name, err)
	}
	if err := st.Client.Delete(ctx, stu); err != nil {
		t.Fatal(err)
	}
	if err := stack.Eventually(30*time.Second, func() error {
		if _, err := bridgeKV.Get(ctx, string(stu.UID)); !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyDeleted) {
			return fmt.Errorf("record still there after the delete (%v)", err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	expectViolation(t, consumer, consumerErrs, "student.created")
	bridgeConn, bridgeErrs := connectAs(t, url, "bridge", "bridge-secret")
	expectViolation(t, bridgeConn, bridgeErrs, "billing.invoice")

	if _, err := nats.Connect(url, nats.UserInfo("bridge", "wrong")); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("a wrong password was not refused: %v", err)
	}
}

// recordStore opens the bridge's record store as the bridge's own user.
func recordStore(t *testing.T, url string) jetstream.KeyValue {
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
	if err := stack.Eventually(30*time.Second, func() error {
		kv, err = js.KeyValue(context.Background(), "STUDENT_BRIDGE_PUBLISHED")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return kv
}
