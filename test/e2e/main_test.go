// Package e2e runs the real student-bridge binary as a process, against the
// real control plane and NATS, and kills and restarts it.
package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var binary, assets string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "student-bridge-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "student-bridge")
	if err := stack.Build(binary, "./cmd/student-bridge"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if assets, err = stack.AssetsDir(""); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running student-bridge process.
type proc struct {
	cmd  *exec.Cmd
	out  stacktest.Buffer // stdout and stderr
	done chan error
}

func start(t *testing.T, dir string, args ...string) *proc {
	t.Helper()
	return startIn(t, dir, nil, args...)
}

// startWithEnv starts the bridge with env added to its environment.
func startWithEnv(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	return startIn(t, t.TempDir(), env, args...)
}

func startIn(t *testing.T, dir string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{done: make(chan error, 1)}
	p.cmd = exec.Command(binary, args...)
	p.cmd.Dir = dir
	p.cmd.Env = append(append(os.Environ(), "KUBEBUILDER_ASSETS="+assets), env...)
	p.cmd.Stdout = &p.out
	p.cmd.Stderr = &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			// SIGTERM first: `dev` stops its kube-apiserver and etcd on
			// it, where SIGKILL would leave them running.
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-p.done:
				p.done <- err
			case <-time.After(15 * time.Second):
				_ = p.cmd.Process.Kill()
				t.Logf("%v killed: %v", args, <-p.done)
			}
		}
		if t.Failed() {
			t.Logf("output of %v:\n%s", args, p.output())
		}
	})
	return p
}

func (p *proc) output() string { return p.out.String() }

// waitOutput waits until the output contains s.
func (p *proc) waitOutput(t *testing.T, s string, timeout time.Duration) {
	t.Helper()
	if err := stacktest.Eventually(timeout, func() error {
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("process exited (%v) before printing %q", err, s)
		default:
		}
		if strings.Contains(p.output(), s) {
			return nil
		}
		return fmt.Errorf("no %q in output yet", s)
	}); err != nil {
		t.Fatalf("%v\noutput:\n%s", err, p.output())
	}
}

// stop sends sig and waits for the process to exit.
func (p *proc) stop(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		return err
	case <-time.After(60 * time.Second):
		t.Fatalf("process did not exit within 60s of %v\n%s", sig, p.output())
	}
	return nil
}

// processesUsing lists processes whose command line mentions s.
func processesUsing(s string) []string {
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []string
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil || !bytes.Contains(b, []byte(s)) {
			continue
		}
		pid := filepath.Base(filepath.Dir(d))
		if pid == strconv.Itoa(os.Getpid()) {
			continue
		}
		out = append(out, pid+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}
