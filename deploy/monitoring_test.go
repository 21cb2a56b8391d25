package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridgetest"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var monitoringDir = filepath.Join(stack.RepoRoot(), "deploy", "monitoring")

// promtool runs the promtool `make test` builds into bin/.
func promtool(t *testing.T, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(stack.RepoRoot(), "bin", "promtool")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: `make test` (or `make tools`) builds it", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = monitoringDir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestAlertRules: the rules are valid, and every alert passes its unit
// tests (alerts_test.yaml): it fires on the series that mean trouble, after
// its "for", with the labels and annotations written there, and not before.
func TestAlertRules(t *testing.T) {
	if out, err := promtool(t, "check", "rules", "alerts.yaml"); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := promtool(t, "test", "rules", "alerts_test.yaml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	alerts := alertRules(t)
	tests, err := os.ReadFile(filepath.Join(monitoringDir, "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range alerts {
		if !strings.Contains(string(tests), "alertname: "+a.Alert+"\n") {
			t.Errorf("alert %s has no unit test in alerts_test.yaml", a.Alert)
		}
		_, anchor, _ := strings.Cut(a.Annotations["runbook_url"], "docs/operations.md#")
		if anchor != strings.ToLower(a.Alert) || !strings.Contains(string(ops), "\n### "+a.Alert+"\n") {
			t.Errorf("alert %s: runbook_url %q is not its section (### %s) of docs/operations.md", a.Alert, a.Annotations["runbook_url"], a.Alert)
		}
	}
}

type alertRule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	Annotations map[string]string `json:"annotations"`
}

func alertRules(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(monitoringDir, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatal(err)
	}
	var out []alertRule
	for _, g := range file.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatal("alerts.yaml has no alert")
	}
	return out
}

var metricName = regexp.MustCompile(`\b(?:student_bridge|workqueue|rest_client)_[a-z_]+\b`)

// TestMonitoringMetricsExist: every metric the alerts and the dashboard
// read is one a running bridge serves on /metrics (with shards, a Student
// published and a service expected, so that every family has a series).
func TestMonitoringMetricsExist(t *testing.T) {
	var exprs []string
	for _, a := range alertRules(t) {
		exprs = append(exprs, a.Expr)
	}
	b, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	for _, p := range dash.Panels {
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	want := map[string]bool{}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			want[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_count"), "_sum")] = true
		}
	}
	if len(want) < 10 {
		t.Fatalf("found only %d metric names in the alerts and the dashboard: %v", len(want), want)
	}

	metricsAddr := fmt.Sprintf("127.0.0.1:%d", stacktest.FreePorts(t, 1))
	w := bridgetest.StartWith(t, st, "monitoring", func(cfg *config.Config) {
		cfg.Shards.Count = 2
		cfg.Services.Expected = []string{"roster"}
		cfg.MetricsAddr = metricsAddr
	})
	// Before anything happened, every series an alert takes a rate or an
	// increase of is there at 0: over a series that appears with its
	// first sample, they would miss that sample (the first error).
	stacktest.WaitFor(t, "every series the alerts rate exported from the start", func() error {
		families, err := scrape(metricsAddr)
		if err != nil {
			return err
		}
		var missing []string
		rated := 0
		for _, a := range alertRules(t) {
			for _, sel := range selector.FindAllStringSubmatch(a.Expr, -1) {
				rated++
				if !hasSeries(families[sel[1]], sel[2]) {
					missing = append(missing, sel[0])
				}
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("not exported before the first change: %v", missing)
		}
		if rated < 2 {
			return fmt.Errorf("found %d rates in the alerts, want the publish errors and the dropped Kubernetes Events", rated)
		}
		return nil
	})

	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: "wang"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(context.Background(), stu); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "every metric of the alerts and the dashboard exported", func() error {
		// What Prometheus would scrape: the bridge's /metrics, its
		// "# TYPE" lines.
		resp, err := http.Get("http://" + metricsAddr + "/metrics")
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		exported := map[string]bool{}
		for _, line := range strings.Split(string(body), "\n") {
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
				exported[f[2]] = true
			}
		}
		var missing []string
		for name := range want {
			if !exported[name] {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("not exported by a running bridge: %v", missing)
		}
		return nil
	})
}

// selector finds the rate or increase of a metric of the bridge's, and its
// label matchers (only "=" ones: the alerts use no other), in an
// expression.
var selector = regexp.MustCompile(`(?:rate|increase)\(((?:student_bridge|workqueue)_[a-z_]+)(?:\{([^}]*)\})?\[`)

var matcher = regexp.MustCompile(`(\w+)="([^"]*)"`)

// hasSeries reports whether f has a series with every label of matchers.
func hasSeries(f *dto.MetricFamily, matchers string) bool {
	if f == nil {
		return false
	}
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		ok := true
		for _, kv := range matcher.FindAllStringSubmatch(matchers, -1) {
			ok = ok && labels[kv[1]] == kv[2]
		}
		if ok {
			return true
		}
	}
	return false
}

// scrape reads what Prometheus would from addr's /metrics.
func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(resp.Body)
}

// TestChartMonitoring: with alerts.enabled and dashboard.enabled the chart
// renders deploy/monitoring's rules as a PrometheusRule (the alerts'
// templates left for Prometheus) and its dashboard in a ConfigMap the
// Grafana sidecar picks up; neither without.
func TestChartMonitoring(t *testing.T) {
	if objs := helmTemplate(t, "sb"); slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool {
		return o.GetKind() == "PrometheusRule" || strings.HasSuffix(o.GetName(), "-dashboard")
	}) {
		t.Error("the chart renders the alerts or the dashboard by default")
	}
	objs := helmTemplate(t, "sb", "--set", "alerts.enabled=true", "--set", "dashboard.enabled=true", "--set", "dashboard.namespace=grafana")
	var rule, board *unstructured.Unstructured
	for _, o := range objs {
		switch {
		case o.GetKind() == "PrometheusRule":
			rule = o
		case o.GetKind() == "ConfigMap" && strings.HasSuffix(o.GetName(), "-dashboard"):
			board = o
		}
	}
	if rule == nil || board == nil {
		t.Fatalf("rendered no PrometheusRule (%v) or dashboard ConfigMap (%v)", rule != nil, board != nil)
	}
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	rendered, _ := json.Marshal(groups)
	var shipped struct {
		Groups any `json:"groups"`
	}
	b, err := os.ReadFile(filepath.Join(monitoringDir, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &shipped); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(shipped.Groups)
	if string(rendered) != string(want) {
		t.Errorf("the PrometheusRule's groups differ from deploy/monitoring/alerts.yaml:\n%s\nvs\n%s", rendered, want)
	}
	data, _, _ := unstructured.NestedString(board.Object, "data", "student-bridge.json")
	dash, err := os.ReadFile(filepath.Join(monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(data) != strings.TrimSpace(string(dash)) {
		t.Error("the dashboard ConfigMap does not hold deploy/monitoring/dashboard.json")
	}
	if board.GetNamespace() != "grafana" || board.GetLabels()["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap in %q with labels %v, want grafana and grafana_dashboard=1", board.GetNamespace(), board.GetLabels())
	}
}

// TestAlertsFireOnPrometheus: a real Prometheus (bin/prometheus) scrapes a
// running bridge and evaluates the shipped alerts (their "for" shortened to
// 2s): with the record store gone StudentBridgeRecordsUnsaved fires, with
// NATS stopped StudentBridgeNATSDisconnected too, and both resolve once
// NATS and the bucket are back.
func TestAlertsFireOnPrometheus(t *testing.T) {
	ctx := context.Background()
	bin := filepath.Join(stack.RepoRoot(), "bin", "prometheus")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: `make test` (or `make tools`) builds it", err)
	}
	nats, err := stack.StartNATS(stack.NATSOptions{Port: stacktest.FreePorts(t, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nats.Stop)
	ns := stacktest.Namespace(t, st.Client, "alerts")
	cfg := bridgetest.Config(t, st, ns, "alerts")
	cfg.NATS.URLs = nats.URL()
	metricsPort := stacktest.FreePorts(t, 1)
	cfg.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	bridgetest.Run(t, cfg, st.RestConfig)
	nc := stacktest.Connect(t, nats.URL())

	// The shipped rules, each "for" 2s so the test need not wait minutes.
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(monitoringDir, "alerts.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rules := regexp.MustCompile(`(?m)^(\s+for:) \S+$`).ReplaceAllString(string(b), "$1 2s")
	mustWriteFile(t, filepath.Join(dir, "alerts.yaml"), rules)
	mustWriteFile(t, filepath.Join(dir, "prometheus.yml"), fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [alerts.yaml]
scrape_configs:
- job_name: student-bridge
  static_configs:
  - targets: ["127.0.0.1:%d"]
    labels: {namespace: %s, pod: bridge-0}
`, metricsPort, ns))
	promPort := stacktest.FreePorts(t, 1)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		fmt.Sprintf("--web.listen-address=127.0.0.1:%d", promPort), "--log.level=warn")
	var logs stacktest.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	firing := func() (map[string]bool, error) {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/api/v1/alerts", promPort))
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		var body struct {
			Data struct {
				Alerts []struct {
					Labels map[string]string `json:"labels"`
					State  string            `json:"state"`
				} `json:"alerts"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return nil, err
		}
		out := map[string]bool{}
		for _, a := range body.Data.Alerts {
			if a.State == "firing" {
				out[a.Labels["alertname"]] = true
			}
		}
		return out, nil
	}
	want := func(what string, alerts map[string]bool) {
		t.Helper()
		stacktest.WaitFor(t, what, func() error {
			got, err := firing()
			if err != nil {
				return err
			}
			for name, on := range alerts {
				if got[name] != on {
					return fmt.Errorf("%s firing: %v, want %v (firing: %v; prometheus: %s)", name, got[name], on, got, logs.String())
				}
			}
			return nil
		})
	}
	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wang"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(ctx, stu); err != nil {
		t.Fatal(err)
	}
	want("a healthy bridge, scraped", map[string]bool{"StudentBridgeDown": false, "StudentBridgeNATSDisconnected": false, "StudentBridgeRecordsUnsaved": false})
	// The Student published and recorded before the bucket is limited: a
	// limit reached before its first record would refuse the write-ahead,
	// and the bridge would publish nothing (fail closed) rather than leave
	// a record unsaved.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the Student's record written", func() error {
		kv, err := js.KeyValue(ctx, cfg.Records.Bucket)
		if err != nil {
			return err
		}
		e, err := kv.Get(ctx, string(stu.UID))
		if err != nil {
			return err
		}
		if rec, ok := contract.ParseRecord(e.Key(), e.Value()); !ok || rec.Pending {
			return fmt.Errorf("record %q not written yet", e.Value())
		}
		return nil
	})

	// The record store is gone: the update goes out, its record cannot be
	// written.
	if err := js.DeleteKeyValue(ctx, cfg.Records.Bucket); err != nil {
		t.Fatal(err)
	}
	bridgetest.Patch(t, st.Client, stu, func(s *studentv1.Student) { s.Spec.School = "tsinghua" })
	want("the record store gone", map[string]bool{"StudentBridgeRecordsUnsaved": true, "StudentBridgeNATSDisconnected": false})
	nats.Shutdown()
	want("NATS stopped", map[string]bool{"StudentBridgeRecordsUnsaved": true, "StudentBridgeNATSDisconnected": true})
	if err := nats.Restart(); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "the test's connection back", func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("NATS %s", nc.Status())
		}
		return nil
	})
	stacktest.WaitFor(t, "the record store back", func() error {
		_, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Records.Bucket, History: 1})
		return err
	})
	want("NATS and the bucket back", map[string]bool{"StudentBridgeRecordsUnsaved": false, "StudentBridgeNATSDisconnected": false})
}

func mustWriteFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestChartInstallsWithMonitoring: helm install with the ServiceMonitor,
// the alerts and the dashboard on, against an API server with the
// Prometheus Operator's CRDs (hack/crds, generated from its Go types by
// `make monitoring-crds`): the API server takes the PrometheusRule and the
// ServiceMonitor as the operator's schemas define them.
func TestChartInstallsWithMonitoring(t *testing.T) {
	ctx := context.Background()
	for _, f := range []string{"monitoring.coreos.com_prometheusrules.yaml", "monitoring.coreos.com_servicemonitors.yaml"} {
		b, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "hack", "crds", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, crd := range decodeObjects(t, b) {
			if err := st.Client.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	}
	const ns, release = "helm-monitoring", "sbmon"
	if err := st.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	admin := userKubeconfig(t, envtest.User{Name: "helm-monitoring", Groups: []string{"system:masters"}})
	var out string
	stacktest.WaitFor(t, "helm install with the monitoring parts (once the CRDs serve)", func() error {
		var err error
		out, err = helm(t, admin, "install", release, chartDir, "-n", ns, "--set", "serviceMonitor.enabled=true",
			"--set", "alerts.enabled=true", "--set", "dashboard.enabled=true", "--set", "releaseFinalizersOnUninstall=false")
		if err != nil {
			_, _ = helm(t, admin, "uninstall", release, "-n", ns, "--no-hooks", "--ignore-not-found")
			return fmt.Errorf("%v\n%s", err, out)
		}
		return nil
	})
	t.Cleanup(func() { _, _ = helm(t, admin, "uninstall", release, "-n", ns, "--no-hooks", "--ignore-not-found") })
	name := release + "-student-bridge"
	for _, o := range []struct{ apiVersion, kind, name string }{
		{"monitoring.coreos.com/v1", "PrometheusRule", name},
		{"monitoring.coreos.com/v1", "ServiceMonitor", name},
		{"v1", "ConfigMap", name + "-dashboard"},
	} {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion(o.apiVersion)
		u.SetKind(o.kind)
		if err := st.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: o.name}, u); err != nil {
			t.Errorf("after install: %s %s: %v", o.kind, o.name, err)
		}
	}
}
