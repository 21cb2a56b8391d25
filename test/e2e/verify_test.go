package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/verify"
)

// runVerify runs `student-bridge verify` with args and returns its
// standard output and exit status.
func runVerify(t *testing.T, args ...string) (string, int) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"verify"}, args...)...)
	var out strings.Builder
	cmd.Stdout = &out
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return out.String(), 0
	case errors.As(err, &exit):
		return out.String(), exit.ExitCode()
	}
	t.Fatal(err)
	return "", -1
}

// TestVerifyCommand: `student-bridge verify` as an operator runs it: 0
// and no findings for what a bridge published, 1 and the README's sample
// for a message no bridge published and for a delete no bridge saw
// (finalizer and record removed while none ran), the same as JSON, and 2
// when NATS cannot be reached.
func TestVerifyCommand(t *testing.T) {
	w := newWorld(t)
	p := w.startAndPublish(t, w.bridgeArgs(w.admin)...)
	w.update(t, "default", "object-name", "tsinghua")
	w.create(t, "default", "graduated", "china")
	w.waitVerified(t, "default", 60*time.Second)
	flags := []string{"--kubeconfig", w.admin, "--nats-url", w.st.NATSURL(), "--settle", "1s"}
	out, code := runVerify(t, flags...)
	if code != 0 || !strings.Contains(out, "no findings") {
		t.Fatalf("verify of what the bridge published: exit %d\n%s", code, out)
	}

	// A message no bridge published is drift on its own: exit 1.
	js, err := jetstream.New(w.nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(context.Background(), w.stream)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(context.Background(), "student.updated", []byte("not a CloudEvent"))
	if err != nil {
		t.Fatal(err)
	}
	out, code = runVerify(t, flags...)
	if code != 1 || !strings.Contains(out, "foreign") {
		t.Errorf("verify of a stream whose only drift is a foreign message: exit %d, want 1 and the finding\n%s", code, out)
	}
	if err := stream.DeleteMsg(context.Background(), ack.Sequence); err != nil {
		t.Fatal(err)
	}

	if err := p.stop(t, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	gone := &studentv1.Student{}
	if err := w.st.Client.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "graduated"}, gone); err != nil {
		t.Fatal(err)
	}
	gone.Finalizers = nil
	if err := w.st.Client.Update(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	if err := w.st.Client.Delete(context.Background(), gone); err != nil {
		t.Fatal(err)
	}
	if err := recordStore(t, w.nc).Delete(context.Background(), string(gone.UID)); err != nil {
		t.Fatal(err)
	}
	out, code = runVerify(t, flags...)
	if code != 1 {
		t.Fatalf("verify of a lost delete: exit %d, want 1\n%s", code, out)
	}
	if got, want := shape(out), shape(readmeBlock(t, "<!-- verify sample -->")); got != want {
		t.Errorf("verify printed\n%s\nthe README's sample has another shape:\n%s\nvs\n%s", out, got, want)
	}
	out, code = runVerify(t, append(flags, "-o", "json")...)
	var r verify.Report
	if err := json.Unmarshal([]byte(out), &r); err != nil || code != 1 {
		t.Fatalf("verify -o json: exit %d, %v\n%s", code, err, out)
	}
	if len(r.Findings) != 1 || r.Findings[0].Kind != verify.LostDelete || r.Findings[0].UID != string(gone.UID) {
		t.Errorf("verify -o json findings %+v, want the lost delete of %s", r.Findings, gone.UID)
	}

	// The chart's CronJob, as it runs in a pod: its arguments, its config
	// file and its credential (the paths moved from /etc/student-bridge to
	// a directory here), with a kubeconfig in place of the pod's account.
	args := cronJobArgs(t, w.st.NATSURL())
	if out, code := runVerify(t, append(args, "--kubeconfig", w.admin)...); code != 1 || !strings.Contains(out, "lost delete") {
		t.Errorf("the chart's verify CronJob on a lost delete: exit %d, want 1\n%s", code, out)
	}

	out, code = runVerify(t, "--kubeconfig", w.admin, "--nats-url", "nats://127.0.0.1:1", "--nats-connect-timeout", "1s")
	if code != 2 {
		t.Errorf("verify without NATS: exit %d, want 2\n%s", code, out)
	}

	// Every event purged (as the stream's limits age them out): the
	// Students that are left have no event, which is not drift unless
	// --strict; the lost delete's events went too.
	if err := stream.Purge(context.Background()); err != nil {
		t.Fatal(err)
	}
	out, code = runVerify(t, flags...)
	if code != 0 || !strings.Contains(out, "unknown") || !strings.Contains(out, "no drift") {
		t.Errorf("verify with every event aged out: exit %d, want 0 and unknown findings\n%s", code, out)
	}
	out, code = runVerify(t, append(flags, "--strict")...)
	if code != 1 || !strings.Contains(out, "missing") {
		t.Errorf("verify --strict with every event aged out: exit %d, want 1 and missing findings\n%s", code, out)
	}
}

var (
	hexID   = regexp.MustCompile(`\b[0-9a-f]{32}\b`)
	uid     = regexp.MustCompile(`\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`)
	number  = regexp.MustCompile(`\b\d+\b`)
	columns = regexp.MustCompile(` {2,}`)
)

// shape is verify's text output with what differs from run to run (ids,
// uids, numbers, column widths) replaced.
func shape(s string) string {
	s = uid.ReplaceAllString(s, "UID")
	s = hexID.ReplaceAllString(s, "ID")
	s = number.ReplaceAllString(s, "N")
	s = columns.ReplaceAllString(s, "  ")
	return strings.TrimSpace(s)
}

// readmeBlock returns the first fenced block after marker in the README,
// without its "$ " command line.
func readmeBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile(stack.RepoRoot() + "/README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("README has no %s", marker)
	}
	_, block, _ := strings.Cut(after, "```")
	_, block, _ = strings.Cut(block, "\n")
	block, _, _ = strings.Cut(block, "```")
	var lines []string
	for _, l := range strings.Split(block, "\n") {
		if !strings.HasPrefix(l, "$ ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// cronJobArgs renders the chart with verify.schedule and the consumer's
// credential, writes the CronJob's config file and password file to a
// directory of the test's, and returns the container's arguments after
// "verify", pointing there.
func cronJobArgs(t *testing.T, natsURL string) []string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(stack.RepoRoot(), "bin", "helm"), "template", "sb", filepath.Join(stack.RepoRoot(), "deploy", "helm", "student-bridge"),
		"--set", "verify.schedule=17 * * * *", "--set", "verify.natsAuth.secretName=student-bridge-nats", "--set", "config.nats.urls="+natsURL)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+dir+"/helm", "HELM_CONFIG_HOME="+dir+"/helm", "HELM_DATA_HOME="+dir+"/helm")
	rendered, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm template (bin/helm, built by make test): %v\n%s", err, rendered)
	}
	moved := strings.ReplaceAll(string(rendered), "/etc/student-bridge/", dir+"/")
	var args []string
	for _, doc := range strings.Split(moved, "\n---\n") {
		var obj struct {
			Kind string            `json:"kind"`
			Data map[string]string `json:"data"`
			Spec struct {
				JobTemplate struct {
					Spec struct {
						Template corev1.PodTemplateSpec `json:"template"`
					} `json:"spec"`
				} `json:"jobTemplate"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatal(err)
		}
		switch obj.Kind {
		case "ConfigMap":
			mustWrite(t, filepath.Join(dir, "config", "student-bridge.yaml"), obj.Data["student-bridge.yaml"])
		case "CronJob":
			args = obj.Spec.JobTemplate.Spec.Template.Spec.Containers[0].Args
		}
	}
	if len(args) == 0 || args[0] != "verify" {
		t.Fatalf("the chart renders no verify CronJob: %v", args)
	}
	mustWrite(t, filepath.Join(dir, "nats", "password"), "consumer-secret")
	return args[1:]
}

func mustWrite(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
