package main_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/version"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "student-bridge-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "student-bridge")
	if err := stack.Build(binary, "./cmd/student-bridge"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func run(t *testing.T, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestHelpExplainsEveryFlag: every setting with a flag appears in --help
// with its explanation.
func TestHelpExplainsEveryFlag(t *testing.T) {
	out, err := run(t, nil, "--help")
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, s := range config.Settings {
		if s.Flag == "" {
			continue
		}
		if !strings.Contains(out, "--"+s.Flag) || !strings.Contains(out, s.Help[:min(len(s.Help), 20)]) {
			t.Errorf("--help lacks --%s or its explanation", s.Flag)
		}
	}
	for _, f := range []string{"--config", "--kubeconfig", "--master", "--zap-log-level"} {
		if !strings.Contains(out, f) {
			t.Errorf("--help lacks %s", f)
		}
	}
}

// TestBadConfigFailsAtStartup: a bad value stops the binary before it
// connects anywhere, naming the key, with a non-zero exit.
func TestBadConfigFailsAtStartup(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("nats:\n  mode: kafka\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"file", nil, []string{"--config", cfg}, "nats.mode"},
		{"env", []string{"STUDENT_BRIDGE_WORKERS=none"}, nil, "workers"},
		{"flag", nil, []string{"--stream-discard=maybe"}, "nats.stream.discard"},
		{"missing creds", nil, []string{"--nats-creds-file=/nonexistent/creds"}, "nats.auth.credsFile"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, tc.env, tc.args...)
			if err == nil {
				t.Fatalf("exited 0:\n%s", out)
			}
			if !strings.Contains(out, tc.want) {
				t.Errorf("output does not name %s:\n%s", tc.want, out)
			}
		})
	}
}

// TestHelpShowsFlagTypes: durations and numbers are typed flags, as in
// kubectl's and controller-runtime's help, and --help is a plain bool.
func TestHelpShowsFlagTypes(t *testing.T) {
	out, err := run(t, nil, "--help")
	if err != nil {
		t.Fatalf("--help: %v\n%s", err, out)
	}
	for _, want := range []string{"--kube-api-qps float32", "--leader-election-lease-duration duration", "--kubernetes-events-qps float",
		"--workers int", "--stream-max-bytes int", "--status-qps float", "--shutdown-timeout duration"} {
		if !strings.Contains(out, want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	if strings.Contains(out, "[=true|false]") {
		t.Errorf("--help shows bool flags as [=true|false]:\n%s", out)
	}
	out, err = run(t, nil, "tail", "--help")
	if err != nil || !strings.Contains(out, "--from-sequence uint") {
		t.Errorf("tail --help lacks --from-sequence uint (%v):\n%s", err, out)
	}
}

// TestCommandsPeopleTypeSpeakPlainly: a startup error is printed once, and
// the commands people type (tail, snapshot) log lines for a terminal, not
// JSON; --zap-encoder still chooses.
func TestCommandsPeopleTypeSpeakPlainly(t *testing.T) {
	out, err := run(t, nil, "--nats-mode=kafka")
	if err == nil || strings.Count(out, "nats.mode") != 1 {
		t.Errorf("bad config: exit %v, want the error once:\n%s", err, out)
	}
	// Nothing listens on port 1: snapshot fails after logging it retries.
	out, err = run(t, nil, "snapshot", "--nats-url", "nats://127.0.0.1:1", "--timeout", "1s", "--zap-log-level", "debug")
	if err == nil {
		t.Fatalf("snapshot without NATS exited 0:\n%s", out)
	}
	if strings.Contains(out, `{"level"`) || strings.Count(out, "error: ") != 1 {
		t.Errorf("snapshot printed JSON log lines or not exactly one error:\n%s", out)
	}
	out, _ = run(t, nil, "snapshot", "--nats-url", "nats://127.0.0.1:1", "--timeout", "1s", "--zap-log-level", "debug", "--zap-encoder", "json")
	if !strings.Contains(out, `{"level"`) {
		t.Errorf("--zap-encoder json was not honoured:\n%s", out)
	}
}

// TestVersion: `student-bridge version` names the release of the source.
func TestVersion(t *testing.T) {
	out, err := run(t, nil, "version")
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	if !strings.HasPrefix(out, "student-bridge "+version.Version+" (commit ") {
		t.Errorf("version printed %q, want the release %s", out, version.Version)
	}
}
