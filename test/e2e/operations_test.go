package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestSecretsNeverLogged: a bridge that needs its NATS password, given by
// environment or inside the URL, connects, publishes and stops at debug
// level, and its output never holds the password.
func TestSecretsNeverLogged(t *testing.T) {
	const secret = "hunter2-secret"
	w := newWorldWith(t, stack.Options{NATS: stack.NATSOptions{Configure: func(o *natsserver.Options) {
		o.Users = []*natsserver.User{{Username: "bridge", Password: secret}, {Username: "test", Password: "test"}}
		o.NoAuthUser = "test" // the test's own connection
	}}})
	host := strings.TrimPrefix(w.st.NATS.URL(), "nats://")
	for _, tc := range []struct {
		name string
		env  []string
		url  string
	}{
		{"env", []string{"STUDENT_BRIDGE_NATS_AUTH_USER=bridge", "STUDENT_BRIDGE_NATS_AUTH_PASSWORD=" + secret}, w.st.NATS.URL()},
		{"url", nil, fmt.Sprintf("nats://bridge:%s@%s", secret, host)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(w.bridgeArgs(w.admin, "--zap-log-level=debug"), "--nats-url", tc.url)
			p := startWithEnv(t, tc.env, args...)
			p.waitOutput(t, "stream ready", 30*time.Second)
			w.create(t, "default", "secret-"+tc.name, "china")
			p.waitOutput(t, `"published"`, 30*time.Second)
			if err := p.stop(t, syscall.SIGTERM); err != nil {
				t.Fatalf("exit: %v", err)
			}
			out := p.output()
			if !strings.Contains(out, "connected to NATS") {
				t.Errorf("no debug line of the connection in the output")
			}
			if strings.Contains(out, secret) {
				t.Errorf("the password is in the output:\n%s", out)
			}
		})
	}
}

// TestOperations: what the README's Operations section promises, checked on
// the real binary with its defaults: leader election with the documented
// Lease, /readyz following NATS, pprof off, the metrics moving, retries
// backing off, and a clean exit on SIGTERM.
func TestOperations(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	metricsAddr := fmt.Sprintf("127.0.0.1:%d", stacktest.FreePorts(t, 1))
	healthAddr := fmt.Sprintf("127.0.0.1:%d", stacktest.FreePorts(t, 1))
	p := start(t, t.TempDir(), "--kubeconfig", w.admin, "--nats-url", w.st.NATS.URL(),
		"--metrics-bind-address", metricsAddr, "--health-probe-bind-address", healthAddr,
		"--retry-base-delay", "100ms", "--retry-max-delay", "1s", "--nats-reconnect-wait", "200ms", "--nats-ack-timeout", "1s")

	// Leader election is on by default, with the documented Lease.
	stacktest.WaitFor(t, "the Lease held", func() error {
		var lease coordinationv1.Lease
		if err := w.st.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "student-bridge.example.k8s.io"}, &lease); err != nil {
			return err
		}
		if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
			return fmt.Errorf("no holder")
		}
		return nil
	})
	ready := func() int { return httpStatus(t, "http://"+healthAddr+"/readyz") }
	stacktest.WaitFor(t, "ready", func() error { return wantStatus(ready(), 200) })

	w.create(t, "default", "ops", "china")
	stacktest.WaitFor(t, "the metrics of a publish", func() error {
		m := scrape(t, metricsAddr)
		for name, min := range map[string]float64{
			`student_bridge_events_published_total{result="success",type="io.k8s.example.student.created"}`: 1,
			`student_bridge_record_store_operations_total{op="put",result="success"}`:                       2,
			`student_bridge_records`:        1,
			`student_bridge_nats_connected`: 1,
		} {
			if m[name] < min {
				return fmt.Errorf("%s = %v, want at least %v", name, m[name], min)
			}
		}
		return nil
	})
	for _, addr := range []string{metricsAddr, healthAddr} {
		if code := httpStatus(t, "http://"+addr+"/debug/pprof/"); code == 200 {
			t.Errorf("pprof is served on %s by default", addr)
		}
	}

	// NATS down: not ready, and retries back off (base 100ms, max 1s).
	w.st.NATS.Shutdown()
	stacktest.WaitFor(t, "not ready without NATS", func() error {
		if code := ready(); code == 200 {
			return fmt.Errorf("/readyz %d", code)
		}
		return nil
	})
	before := scrape(t, metricsAddr)[`student_bridge_record_store_operations_total{op="put",result="error"}`]
	w.create(t, "default", "while-down", "china")
	time.Sleep(4 * time.Second) // the window the attempts are counted in
	attempts := scrape(t, metricsAddr)[`student_bridge_record_store_operations_total{op="put",result="error"}`] - before
	if attempts < 3 || attempts > 12 {
		t.Errorf("%v failed attempts in 4s, want 3 to 12 (exponential backoff from 100ms to 1s)", attempts)
	}
	if err := w.st.NATS.Restart(); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "ready again", func() error { return wantStatus(ready(), 200) })
	w.waitVerified(t, "default", 60*time.Second)

	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Errorf("SIGTERM: exit %v", err)
	}
	if !strings.Contains(p.output(), `"stopped"`) {
		t.Errorf("no \"stopped\" line after SIGTERM")
	}
}

func wantStatus(got, want int) error {
	if got != want {
		return fmt.Errorf("HTTP %d, want %d", got, want)
	}
	return nil
}

func httpStatus(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// scrape reads the bridge's metrics: series (name{labels}) to value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestKubeconfigSources: the tutorial's --master overrides the kubeconfig's
// server; without flags, KUBECONFIG and then ~/.kube/config are used.
func TestKubeconfigSources(t *testing.T) {
	w := newWorld(t)
	b, err := os.ReadFile(w.admin)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.Load(b)
	if err != nil {
		t.Fatal(err)
	}
	server := ""
	for _, c := range kc.Clusters {
		server = c.Server
	}
	wrong := filepath.Join(t.TempDir(), "wrong-server.kubeconfig")
	if err := os.WriteFile(wrong, []byte(strings.ReplaceAll(string(b), server, "https://127.0.0.1:1")), 0o600); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, ".kube"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".kube", "config"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	common := []string{"--nats-url", w.st.NATS.URL(), "--leader-elect=false", "--metrics-bind-address", "0", "--health-probe-bind-address", "0"}
	for i, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"--master over the kubeconfig's server", nil, []string{"--kubeconfig", wrong, "--master", server}},
		{"KUBECONFIG", []string{"KUBECONFIG=" + w.admin}, nil},
		{"~/.kube/config", []string{"KUBECONFIG=", "HOME=" + home}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startWithEnv(t, tc.env, append(common, tc.args...)...)
			name := fmt.Sprintf("source-%d", i)
			w.create(t, "default", name, "china")
			w.waitVerified(t, "default", 60*time.Second)
			if err := p.stop(t, syscall.SIGTERM); err != nil {
				t.Errorf("exit %v", err)
			}
		})
	}
}

// TestSecondSignalExitsAtOnce: SIGTERM waits for a reconcile in flight (here
// a publish whose acknowledgement is held back), and a second signal exits
// at once without waiting for it.
func TestSecondSignalExitsAtOnce(t *testing.T) {
	w := newWorld(t)
	proxy := newFreezingProxy(t, strings.TrimPrefix(w.st.NATS.URL(), "nats://"))
	p := start(t, t.TempDir(), append(w.bridgeArgs(w.admin, "--shutdown-timeout=60s"), "--nats-url", "nats://"+proxy.addr, "--nats-ack-timeout", "30s")...)
	p.waitOutput(t, "stream ready", 30*time.Second)
	w.create(t, "default", "first", "china")
	w.waitVerified(t, "default", 30*time.Second)

	proxy.freeze() // the bridge's next publish waits for an ack that does not come
	w.create(t, "default", "held", "china")
	stacktest.WaitFor(t, "the held Student's write sent", func() error {
		if n := proxy.sentFrozen.Load(); n < 200 {
			return fmt.Errorf("%d bytes sent since the freeze", n)
		}
		return nil
	})
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		t.Fatalf("exited (%v) on the first signal with a publish in flight", err)
	case <-time.After(2 * time.Second):
	}
	second := time.Now()
	if err := p.stop(t, syscall.SIGTERM); err == nil {
		t.Errorf("exit 0 after the second signal, want 1")
	}
	if took := time.Since(second); took > 10*time.Second {
		t.Errorf("exited %s after the second signal", took)
	}
	if !strings.Contains(p.output(), "second signal") {
		t.Errorf("no word of the second signal in the output")
	}
}

// freezingProxy forwards TCP to a NATS server until frozen; then it holds
// every byte from the server back, as a server that stopped answering.
type freezingProxy struct {
	addr   string
	frozen atomic.Bool
	// closed is closed at the test's end: a frozen link holds until then.
	closed chan struct{}
	// sentFrozen counts the bytes the client sent while frozen.
	sentFrozen atomic.Int64
}

func newFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{addr: l.Addr().String(), closed: make(chan struct{})}
	t.Cleanup(func() { close(p.closed); l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			go func() {
				buf := make([]byte, 32*1024)
				for {
					n, err := c.Read(buf)
					if p.frozen.Load() {
						p.sentFrozen.Add(int64(n))
					}
					if n > 0 {
						if _, werr := s.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				s.Close()
			}()
			go func() {
				buf := make([]byte, 32*1024)
				for {
					n, err := s.Read(buf)
					if p.frozen.Load() {
						<-p.closed
					}
					if n > 0 {
						if _, werr := c.Write(buf[:n]); werr != nil {
							break
						}
					}
					if err != nil {
						break
					}
				}
				c.Close()
			}()
		}
	}()
	return p
}

func (p *freezingProxy) freeze() { p.frozen.Store(true) }
