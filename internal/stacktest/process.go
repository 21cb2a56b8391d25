// Package stacktest is what tests and the benchmark need beside the stack:
// reading what the bridge published (StreamEvents, Subscribe), waiting for
// a condition (Eventually), reading a counter, a TestMain body (RunTests),
// the stack's child processes (Children, KillAPIServer) and a NATS server
// in a process of its own (NATSProcess).
package stacktest

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/student-bridge/student-bridge/internal/stack"
)

// RunTests is a TestMain body: it starts a Stack with opts, hands it to use,
// runs the tests and stops the Stack. It returns the exit code.
//
// Fuzzing a decoder (go test -run '^$' -fuzz FuzzX, as make fuzz does)
// needs no stack: none is started, and no test that needs it may run.
func RunTests(m interface{ Run() int }, opts stack.Options, use func(*stack.Stack)) int {
	if os.Getenv(natsChildEnv) != "" {
		return serveNATS()
	}
	flag.Parse()
	if f := flag.Lookup("test.fuzz"); f != nil && f.Value.String() != "" {
		return m.Run()
	}
	s, err := stack.Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	use(s)
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code
}

// RunWithoutStack is a TestMain body for tests that start no Stack but
// may start a NATS server in a process of its own (NATSProcess).
func RunWithoutStack(m interface{ Run() int }) int {
	if os.Getenv(natsChildEnv) != "" {
		return serveNATS()
	}
	return m.Run()
}

// KillAPIServer kills kube-apiserver (SIGKILL: a crash, and no waiting for
// it to drain watches) and starts it again on the same address with the same
// certificates and etcd. Clients see their watches break and their requests
// fail until it is back.
func KillAPIServer(s *stack.Stack) error {
	var pids []int
	for _, p := range Children() {
		if p.Comm == "kube-apiserver" {
			pids = append(pids, p.PID)
		}
	}
	if len(pids) != 1 {
		return fmt.Errorf("find the kube-apiserver child process: found %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill kube-apiserver: %w", err)
	}
	api := s.Env.ControlPlane.APIServer
	if err := api.Stop(); err != nil {
		return fmt.Errorf("reap kube-apiserver: %w", err)
	}
	if err := api.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	return nil
}

// Child is a child process of this process.
type Child struct {
	PID  int
	Comm string // the command name, e.g. kube-apiserver
}

// Children lists this process's child processes (from /proc): the control
// plane the stack started, for KillAPIServer and the benchmark's CPU
// accounting.
func Children() []Child {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	me := strconv.Itoa(os.Getpid())
	var kids []Child
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
		line := string(b)
		open, end := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
		if open < 0 || end < open {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(line[:open]))
		fields := strings.Fields(line[end+1:])
		if err != nil || len(fields) < 2 || fields[1] != me {
			continue
		}
		kids = append(kids, Child{PID: pid, Comm: line[open+1 : end]})
	}
	return kids
}

// natsChildEnv, set in a test binary's environment, makes RunTests (and
// RunWithoutStack) serve NATS instead of running tests: the child
// NATSProcess starts.
const natsChildEnv = "STUDENT_BRIDGE_TEST_NATS_CHILD"

// NATSProcess starts a NATS server with JetStream in a process of its own
// (this test binary again, whose TestMain calls RunTests or
// RunWithoutStack) and returns its URL; the server stops with tb. A
// benchmark of a client uses it, so that the allocations and context
// switches it counts are the client's alone.
func NATSProcess(tb testing.TB) string {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), natsChildEnv+"=1")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close() // the child's signal to stop
		_ = cmd.Wait()
	})
	url, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		tb.Fatalf("the NATS process said no URL: %v", err)
	}
	return strings.TrimSpace(url)
}

// serveNATS is the child of NATSProcess: it starts the server, writes its
// URL and serves until its stdin closes.
func serveNATS() int {
	n, err := stack.StartNATS(stack.NATSOptions{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer n.Stop()
	fmt.Println(n.URL())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}
