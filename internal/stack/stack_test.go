package stack_test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestStartStopLeavesNothing starts and stops the whole stack repeatedly and
// checks that no child process, listening port or temporary store outlives
// it.
func TestStartStopLeavesNothing(t *testing.T) {
	for i := range 3 {
		s, err := stack.Start(stack.Options{})
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		apiHost := strings.TrimPrefix(strings.TrimPrefix(s.RestConfig.Host, "https://"), "http://")
		natsAddr := strings.TrimPrefix(s.NATS.URL(), "nats://")
		store := s.NATS.Server.JetStreamConfig().StoreDir
		kids := map[string]int{}
		for _, c := range stacktest.Children() {
			kids[c.Comm]++
		}
		if kids["etcd"] != 1 || kids["kube-apiserver"] != 1 {
			t.Errorf("start %d: expected one etcd and one kube-apiserver child, found %v", i, kids)
		}
		nc, err := nats.Connect(s.NATS.URL())
		if err != nil {
			t.Fatalf("start %d: NATS not reachable: %v", i, err)
		}
		if _, err := nc.JetStream(); err != nil {
			t.Errorf("JetStream: %v", err)
		}
		nc.Close()

		if err := s.Stop(); err != nil {
			t.Fatalf("stop %d: %v", i, err)
		}
		if err := stacktest.Eventually(10*time.Second, func() error {
			if kids := stacktest.Children(); len(kids) > 0 {
				return &leak{fmt.Sprintf("child processes %v", kids)}
			}
			for _, addr := range []string{apiHost, natsAddr} {
				if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
					c.Close()
					return &leak{"still listening on " + addr}
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("after stop %d: %v", i, err)
		}
		if _, err := os.Stat(store); !os.IsNotExist(err) {
			t.Errorf("after stop %d: temporary NATS store %s left behind (%v)", i, store, err)
		}
	}
}

// TestNATSRestartKeepsStore: a restarted server has the same URL and the
// stream data written before.
func TestNATSRestartKeepsStore(t *testing.T) {
	n, err := stack.StartNATS(stack.NATSOptions{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	url := n.URL()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := nc.JetStream()
	if _, err := js.AddStream(&nats.StreamConfig{Name: "KEEP", Subjects: []string{"keep.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish("keep.a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	if n.URL() != url {
		t.Errorf("URL changed from %s to %s", url, n.URL())
	}
	if err := stacktest.Eventually(10*time.Second, func() error {
		info, err := js.StreamInfo("KEEP")
		if err != nil {
			return err
		}
		if info.State.Msgs != 1 {
			return &leak{"messages " + strconv.FormatUint(info.State.Msgs, 10)}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

type leak struct{ s string }

func (l *leak) Error() string { return l.s }

// TestNATSOnATakenPortSaysWhy: a server that cannot listen (another
// process took its port) fails with the server's own error, not only
// "not ready".
func TestNATSOnATakenPortSaysWhy(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n, err := stack.StartNATS(stack.NATSOptions{Port: l.Addr().(*net.TCPAddr).Port})
	if err == nil {
		n.Stop()
		t.Fatal("a server started on a port another listener holds")
	}
	if !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("error %q does not say the port is taken", err)
	}
}
