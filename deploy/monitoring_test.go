package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/yaml"

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
// read is one a running bridge exports (with shards, a Student published
// and a service expected, so that every family has a series).
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

	w := bridgetest.StartWith(t, st, "monitoring", func(cfg *config.Config) {
		cfg.Shards.Count = 2
		cfg.Services.Expected = []string{"roster"}
	})
	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: "wang"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := st.Client.Create(context.Background(), stu); err != nil {
		t.Fatal(err)
	}
	stacktest.WaitFor(t, "every metric of the alerts and the dashboard exported", func() error {
		families, err := metrics.Registry.Gather()
		if err != nil {
			return err
		}
		exported := map[string]bool{}
		for _, f := range families {
			exported[f.GetName()] = true
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
