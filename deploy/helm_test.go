package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/shards"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

var chartDir = filepath.Join(stack.RepoRoot(), "deploy", "helm", "student-bridge")

// helm runs the helm CLI that `make test` builds into bin/, with its own
// cache and config directories. It returns the combined output.
func helm(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	bin := filepath.Join(stack.RepoRoot(), "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: `make test` (or `make tools`) builds it", err)
	}
	home := t.TempDir()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+home+"/cache", "HELM_CONFIG_HOME="+home+"/config", "HELM_DATA_HOME="+home+"/data")
	if kubeconfig != "" {
		cmd.Env = append(cmd.Env, "KUBECONFIG="+kubeconfig)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// helmTemplate renders the chart as release sb in namespace ns.
func helmTemplate(t *testing.T, ns string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := helm(t, "", append([]string{"template", "sb", chartDir, "-n", ns}, args...)...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, out)
	}
	return decodeObjects(t, []byte(out))
}

// userKubeconfig writes a kubeconfig of a new user of the test API server.
func userKubeconfig(t *testing.T, u envtest.User) string {
	t.Helper()
	au, err := st.Env.AddUser(u, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := au.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestChartLints: helm lint --strict passes with the default values and with
// values that change every optional part.
func TestChartLints(t *testing.T) {
	nonDefault := writeValues(t, `
replicaCount: 1
config:
  workers: 4
  nats:
    urls: nats://nats.messaging.svc:4222
    mode: core
  leaderElection:
    enabled: false
  deletes:
    holdWithFinalizer: false
watch:
  namespaces: [school-a, school-b]
  labelSelector:
    matchLabels: {tier: gold}
    matchExpressions:
    - {key: region, operator: In, values: [eu, us]}
    - {key: legacy, operator: DoesNotExist}
natsAuth:
  secretName: nats-creds
  passwordKey: ""
  credsKey: bridge.creds
natsTLS:
  secretName: nats-tls
  certKey: tls.crt
  keyKey: tls.key
serviceMonitor:
  enabled: true
  labels: {release: prometheus}
podDisruptionBudget:
  enabled: false
releaseFinalizersOnUninstall: false
alerts:
  enabled: true
  labels: {release: prometheus}
dashboard:
  enabled: true
verify:
  schedule: "*/30 * * * *"
`)
	fleetValues := filepath.Join(stack.RepoRoot(), "deploy", "helm", "fleet", "bridge-values.yaml")
	for name, args := range map[string][]string{"default values": nil, "non-default values": {"-f", nonDefault}, "a fleet's cluster": {"-f", fleetValues}} {
		if out, err := helm(t, "", append([]string{"lint", "--strict", chartDir}, args...)...); err != nil {
			t.Errorf("helm lint --strict with %s: %v\n%s", name, err, out)
		}
	}
}

// TestChartRefusesWrongValues: values the bridge would refuse are refused by
// the chart, with a message naming the value.
func TestChartRefusesWrongValues(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"config.nats.mode=fast", "at '/config/nats/mode': value must be one of 'jetstream', 'core'"},
		{"config.nats.url=nats://x:4222", "at '/config/nats': additional properties 'url' not allowed"},
		{"config.nats.auth.password=secret", "at '/config/nats': additional properties 'auth' not allowed"},
		{"config.namespaces={a}", "additional properties 'namespaces' not allowed"},
		{"config.workers=many", "at '/config/workers': got string, want integer"},
		{"config.nats.stream.maxAge=1week", "at '/config/nats/stream/maxAge'"},
		{"replicaCount=-1", "at '/replicaCount'"},
		{"watch.labelSelector.matchExpressions[0].key=tier,watch.labelSelector.matchExpressions[0].operator=Is", "at '/watch/labelSelector/matchExpressions/0/operator'"},
		{"natsAuth.tokenKey=token", "natsAuth: set exactly one of passwordKey, tokenKey, nkeySeedKey and credsKey"},
		{"natsTLS.secretName=tls,natsTLS.certKey=tls.crt", "natsTLS: set both certKey and keyKey, or neither"},
	} {
		out, err := helm(t, "", "template", "sb", chartDir, "--set", tc.set)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("--set %s: %v, want refused with %q; output:\n%s", tc.set, err, tc.want, out)
		}
	}
}

// policyServed is what helm template needs to render the finalizer policy:
// offline, helm knows no cluster's kinds.
var policyServed = []string{"--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"}

// TestChartScopesTheFinalizerPolicyLikeTheBridge: the label selector the
// bridge is configured with and the one the finalizer policy's binding uses
// select the same Students, and so do the namespaces.
func TestChartScopesTheFinalizerPolicyLikeTheBridge(t *testing.T) {
	objs := helmTemplate(t, "student-bridge-system", append(policyServed, "-f", writeValues(t, `
watch:
  namespaces: [school-a, school-b]
  labelSelector:
    matchLabels: {tier: gold}
    matchExpressions:
    - {key: region, operator: In, values: [eu, us]}
    - {key: year, operator: NotIn, values: ["1999"]}
    - {key: active, operator: Exists}
    - {key: legacy, operator: DoesNotExist}
`))...)
	cfg := podConfig(t, t.TempDir(), objs)
	bridgeSel, err := labels.Parse(cfg.LabelSelector)
	if err != nil {
		t.Fatalf("the bridge's labelSelector %q: %v", cfg.LabelSelector, err)
	}
	binding := convert[struct {
		Spec struct {
			MatchResources struct {
				NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector"`
				ObjectSelector    *metav1.LabelSelector `json:"objectSelector"`
			} `json:"matchResources"`
		} `json:"spec"`
	}](t, find(t, objs, "MutatingAdmissionPolicyBinding", ""))
	policySel, err := metav1.LabelSelectorAsSelector(binding.Spec.MatchResources.ObjectSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []labels.Set{
		{"tier": "gold", "region": "eu", "active": "yes"},
		{"tier": "gold", "region": "us", "active": "", "year": "2001"},
		{"tier": "gold", "region": "eu", "active": "yes", "legacy": "x"},
		{"tier": "gold", "region": "eu", "active": "yes", "year": "1999"},
		{"tier": "gold", "region": "asia", "active": "yes"},
		{"tier": "silver", "region": "eu", "active": "yes"},
		{"tier": "gold", "region": "eu"},
	} {
		if b, p := bridgeSel.Matches(l), policySel.Matches(l); b != p {
			t.Errorf("labels %v: the bridge selects %v, the finalizer policy %v", l, b, p)
		}
	}
	nsSel, err := metav1.LabelSelectorAsSelector(binding.Spec.MatchResources.NamespaceSelector)
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"school-a", "school-b", "school-c", "default"} {
		watched := ns == cfg.Namespaces[0] || ns == cfg.Namespaces[len(cfg.Namespaces)-1]
		if p := nsSel.Matches(labels.Set{"kubernetes.io/metadata.name": ns}); p != watched {
			t.Errorf("namespace %s: watched by the bridge %v (namespaces %v), by the finalizer policy %v", ns, watched, cfg.Namespaces, p)
		}
	}
}

func writeValues(t *testing.T, yaml string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// podConfig loads the bridge's configuration as the pod of a rendered
// Deployment would: its config file (from the rendered ConfigMap), its
// STUDENT_BRIDGE_* environment and its flags.
// The pod's files live under root: /etc/student-bridge/... becomes
// root/etc/student-bridge/..., each Secret item a file there.
func podConfig(t *testing.T, root string, objs []*unstructured.Unstructured) *config.Config {
	t.Helper()
	dep := convert[appsv1.Deployment](t, find(t, objs, "Deployment", ""))
	c := dep.Spec.Template.Spec.Containers[0]
	mountPaths := map[string]string{}
	for _, m := range c.VolumeMounts {
		mountPaths[m.Name] = m.MountPath
	}
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, item := range v.Secret.Items {
			p := filepath.Join(root, mountPaths[v.Name], item.Path)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("secret"), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	inPod := strings.NewReplacer("/etc/student-bridge/", root+"/etc/student-bridge/")
	var cm *corev1.ConfigMap
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" && strings.Contains(o.GetName(), "student-bridge-config") {
			cm = convert[corev1.ConfigMap](t, o)
		}
	}
	if cm == nil {
		t.Fatal("no student-bridge-config ConfigMap rendered")
	}
	file := filepath.Join(t.TempDir(), "student-bridge.yaml")
	if err := os.WriteFile(file, []byte(inPod.Replace(cm.Data["student-bridge.yaml"])), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg *config.Config
	t.Run("load "+dep.Name, func(t *testing.T) {
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, config.EnvPrefix) {
				if e.ValueFrom != nil {
					t.Fatalf("env %s comes from %+v; the bridge reads only values", e.Name, e.ValueFrom)
				}
				t.Setenv(e.Name, inPod.Replace(e.Value))
			}
		}
		fs := pflag.NewFlagSet("bridge", pflag.ContinueOnError)
		configFlag := fs.String("config", "", "")
		loader := config.NewLoader(fs, config.BridgeCommand)
		if err := fs.Parse(c.Args); err != nil {
			t.Fatalf("the Deployment's args %v: %v", c.Args, err)
		}
		if *configFlag != "/etc/student-bridge/config/student-bridge.yaml" {
			t.Fatalf("the Deployment does not load its ConfigMap: --config=%q", *configFlag)
		}
		var err error
		if cfg, err = loader.Load(file); err != nil {
			t.Fatalf("the rendered configuration: %v", err)
		}
	})
	if cfg == nil {
		t.FailNow()
	}
	return cfg
}

// TestChartAndKustomizeAgree: the chart with its default values and
// deploy/default cannot drift apart: same RBAC rules, same pod security,
// same finalizer policy, and the bridge loads the same configuration.
func TestChartAndKustomizeAgree(t *testing.T) {
	chart := helmTemplate(t, "student-bridge-system", policyServed...)
	kustomize := append(render(t, "default"), render(t, "admission")...)

	for _, kind := range []string{"ClusterRole", "Role"} {
		rules := func(objs []*unstructured.Unstructured, name string) []rbacv1.PolicyRule {
			return convert[rbacv1.ClusterRole](t, find(t, objs, kind, name)).Rules
		}
		if c, k := rules(chart, "sb-student-bridge"), rules(kustomize, "student-bridge"); !reflect.DeepEqual(c, k) {
			t.Errorf("%s rules differ:\nchart     %v\nkustomize %v", kind, c, k)
		}
	}

	podSpec := func(objs []*unstructured.Unstructured) corev1.PodSpec {
		return convert[appsv1.Deployment](t, find(t, objs, "Deployment", "")).Spec.Template.Spec
	}
	c, k := podSpec(chart), podSpec(kustomize)
	if !reflect.DeepEqual(c.SecurityContext, k.SecurityContext) {
		t.Errorf("pod security contexts differ:\nchart     %+v\nkustomize %+v", c.SecurityContext, k.SecurityContext)
	}
	if !reflect.DeepEqual(c.Containers[0].SecurityContext, k.Containers[0].SecurityContext) {
		t.Errorf("container security contexts differ:\nchart     %+v\nkustomize %+v", c.Containers[0].SecurityContext, k.Containers[0].SecurityContext)
	}
	if *c.TerminationGracePeriodSeconds != *k.TerminationGracePeriodSeconds {
		t.Errorf("termination grace periods differ: chart %d, kustomize %d", *c.TerminationGracePeriodSeconds, *k.TerminationGracePeriodSeconds)
	}

	// The same policy, but for the layout of its CEL expression.
	policy := func(objs []*unstructured.Unstructured) string {
		b, err := json.Marshal(find(t, objs, "MutatingAdmissionPolicy", "").Object["spec"])
		if err != nil {
			t.Fatal(err)
		}
		return strings.NewReplacer(`\n`, "", " ", "").Replace(string(b))
	}
	if c, k := policy(chart), policy(kustomize); !reflect.DeepEqual(c, k) {
		t.Errorf("finalizer policies differ:\nchart     %v\nkustomize %v", c, k)
	}

	root := t.TempDir()
	cc, kc := podConfig(t, root, chart), podConfig(t, root, kustomize)
	// Both limit the container's memory: the bridge's Go memory limit is
	// 90% of it.
	for name, spec := range map[string]corev1.PodSpec{"chart": c, "kustomize": k} {
		if limit := spec.Containers[0].Resources.Limits[corev1.ResourceMemory]; limit.IsZero() {
			t.Errorf("%s: the container has no memory limit", name)
		}
	}
	if !reflect.DeepEqual(cc, kc) {
		cj, _ := json.MarshalIndent(cc, "", " ")
		kj, _ := json.MarshalIndent(kc, "", " ")
		t.Errorf("the bridge's effective configuration differs:\nchart     %s\nkustomize %s", cj, kj)
	}
}

// generatedRules reads the rules controller-gen generated, by kind.
func generatedRules(t *testing.T) map[string][]rbacv1.PolicyRule {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "deploy", "rbac", "role.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	generated := map[string][]rbacv1.PolicyRule{}
	for _, o := range decodeObjects(t, b) {
		generated[o.GetKind()] = convert[rbacv1.ClusterRole](t, o).Rules
	}
	if len(generated["ClusterRole"]) == 0 || len(generated["Role"]) == 0 {
		t.Fatalf("deploy/rbac/role.yaml holds no ClusterRole or Role rules: %v", generated)
	}
	return generated
}

// restrictedNamespace creates a namespace that enforces the restricted Pod
// Security profile.
func restrictedNamespace(t *testing.T, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest",
	}}}
	if err := st.Client.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// admitPod asks the API server (dry run) to create a pod of spec in ns.
func admitPod(ns, name string, spec corev1.PodSpec) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: spec}
	return st.Client.Create(context.Background(), pod, client.DryRunAll)
}

// TestChartInstallUpgradeUninstall installs the chart with the real helm
// CLI on the test API server (no pods run there; the objects are checked),
// upgrades it and uninstalls it. The test plays the Job controller for the
// post-delete hook: it runs the Job's command, as the Job's
// ServiceAccount, and marks the Job complete.
func TestChartInstallUpgradeUninstall(t *testing.T) {
	ctx := context.Background()
	const ns, watched, release = "helm-check", "helm-school", "sb"
	name := release + "-student-bridge"
	restrictedNamespace(t, ns)
	if err := st.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: watched}}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	admin := userKubeconfig(t, envtest.User{Name: "helm-admin", Groups: []string{"system:masters"}})
	get := func(obj client.Object, namespace, name string) error {
		return st.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, obj)
	}

	// A wrong value is refused at install time, before anything is created.
	if out, err := helm(t, admin, "install", release, chartDir, "-n", ns, "--set", "config.nats.mode=fast"); err == nil || !strings.Contains(out, "value must be one of 'jetstream', 'core'") {
		t.Fatalf("install with config.nats.mode=fast: %v\n%s", err, out)
	}
	if err := get(&appsv1.Deployment{}, ns, name); !apierrors.IsNotFound(err) {
		t.Fatalf("a refused install created the Deployment (%v)", err)
	}

	if out, err := helm(t, admin, "install", release, chartDir, "-n", ns, "--set", "watch.namespaces={"+watched+"}"); err != nil {
		t.Fatalf("helm install: %v\n%s", err, out)
	}
	t.Cleanup(func() { _, _ = helm(t, admin, "uninstall", release, "-n", ns, "--no-hooks", "--ignore-not-found") })
	installed := []struct {
		obj       client.Object
		namespace string
		name      string
	}{
		{&corev1.ServiceAccount{}, ns, name},
		{&rbacv1.ClusterRole{}, "", name},
		{&rbacv1.ClusterRoleBinding{}, "", name},
		{&rbacv1.Role{}, ns, name},
		{&rbacv1.RoleBinding{}, ns, name},
		{&corev1.ConfigMap{}, ns, name + "-config"},
		{&appsv1.Deployment{}, ns, name},
		{&corev1.Service{}, ns, name + "-metrics"},
		{&unstructured.Unstructured{Object: map[string]any{"apiVersion": "policy/v1", "kind": "PodDisruptionBudget"}}, ns, name},
	}
	// The finalizer policy only where the API server serves its kind
	// (1.36 and later): elsewhere the chart leaves it out, and installs.
	served := stacktest.PolicyServed(t)
	if served {
		installed = append(installed, []struct {
			obj       client.Object
			namespace string
			name      string
		}{
			{&unstructured.Unstructured{Object: map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy"}}, "", name + "-finalizer"},
			{&unstructured.Unstructured{Object: map[string]any{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding"}}, "", name + "-finalizer"},
		}...)
	}
	for _, o := range installed {
		if err := get(o.obj, o.namespace, o.name); err != nil {
			t.Errorf("after install: %T %s: %v", o.obj, o.name, err)
		}
	}
	generated := generatedRules(t)
	var cr rbacv1.ClusterRole
	var role rbacv1.Role
	if err := get(&cr, "", name); err != nil {
		t.Fatal(err)
	}
	if err := get(&role, ns, name); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cr.Rules, generated["ClusterRole"]) || !reflect.DeepEqual(role.Rules, generated["Role"]) {
		t.Errorf("installed RBAC differs from the generated:\n%v\n%v\ngenerated %v", cr.Rules, role.Rules, generated)
	}
	var dep appsv1.Deployment
	if err := get(&dep, ns, name); err != nil {
		t.Fatal(err)
	}
	if err := admitPod(ns, "bridge", dep.Spec.Template.Spec); err != nil {
		t.Errorf("the bridge's pod is refused under the restricted profile: %v", err)
	}
	loose := dep.Spec.Template.Spec.DeepCopy()
	loose.SecurityContext, loose.Containers[0].SecurityContext = nil, nil
	if err := admitPod(ns, "loose", *loose); err == nil {
		t.Error("a pod without a security context was admitted: the restricted check proves nothing")
	}
	checksum := dep.Spec.Template.Annotations["checksum/config"]

	// The finalizer policy adds the finalizer in the watched namespace,
	// and only there (where it is served; elsewhere nothing adds it until
	// the bridge reconciles the Student).
	held := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: watched, Name: "held"}, Spec: studentv1.StudentSpec{Name: "wang", School: "china"}}
	if err := stacktest.Eventually(time.Minute, func() error {
		probe := held.DeepCopy()
		if err := st.Client.Create(ctx, probe, client.DryRunAll); err != nil {
			return err
		}
		if got := controllerutil.ContainsFinalizer(probe, studentv1.Finalizer); got != served {
			return fmt.Errorf("a new Student in %s has the finalizer: %v; want %v (the policy served: %v)", watched, got, served, served)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	outside := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "outside"}, Spec: held.Spec}
	if err := st.Client.Create(ctx, outside, client.DryRunAll); err != nil || controllerutil.ContainsFinalizer(outside, studentv1.Finalizer) {
		t.Errorf("a Student outside watch.namespaces got the finalizer (%v): %v", err, outside.Finalizers)
	}
	deleting := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: watched, Name: "deleting"}, Spec: held.Spec}
	for _, s := range []*studentv1.Student{held, deleting} {
		if !served {
			// Without the policy the bridge adds the finalizer when it
			// first reconciles the Student; no bridge runs here.
			controllerutil.AddFinalizer(s, studentv1.Finalizer)
		}
		if err := st.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Client.Delete(ctx, deleting); err != nil {
		t.Fatal(err)
	}
	// A shard Lease that replicas which stopped leave behind.
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "student-bridge.example.k8s.io-shard-3",
		Labels: map[string]string{shards.LabelBridge: "student-bridge.example.k8s.io", shards.LabelRole: shards.RoleShard}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(""), LeaseDurationSeconds: ptr.To[int32](15)}}
	if err := st.Client.Create(ctx, lease); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}

	// Upgrade: new replicas and configuration roll out, the policy goes.
	if out, err := helm(t, admin, "upgrade", release, chartDir, "-n", ns, "--set", "watch.namespaces={"+watched+"}",
		"--set", "replicaCount=5", "--set", "config.workers=4", "--set", "finalizerPolicy.enabled=false"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	if err := get(&dep, ns, name); err != nil {
		t.Fatal(err)
	}
	if *dep.Spec.Replicas != 5 || dep.Spec.Template.Annotations["checksum/config"] == checksum {
		t.Errorf("after upgrade: replicas %d, config checksum %s (was %s)", *dep.Spec.Replicas, dep.Spec.Template.Annotations["checksum/config"], checksum)
	}
	var cm corev1.ConfigMap
	if err := get(&cm, ns, name+"-config"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cm.Data["student-bridge.yaml"], "workers: 4") {
		t.Errorf("after upgrade the configuration has no workers: 4:\n%s", cm.Data["student-bridge.yaml"])
	}
	if served {
		if err := get(installed[9].obj, "", name+"-finalizer"); !apierrors.IsNotFound(err) {
			t.Errorf("finalizerPolicy.enabled=false left the policy (%v)", err)
		}
	}

	// Uninstall, with the post-delete hook run here.
	bin := filepath.Join(t.TempDir(), "student-bridge")
	if err := stack.Build(bin, "./cmd/student-bridge"); err != nil {
		t.Fatal(err)
	}
	hookSA := "system:serviceaccount:" + ns + ":" + name + "-release"
	hookKubeconfig := userKubeconfig(t, envtest.User{Name: hookSA, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns}})
	done := make(chan error, 1)
	var uninstallOut string
	go func() {
		var err error
		uninstallOut, err = helm(t, admin, "uninstall", release, "-n", ns, "--timeout", "2m")
		done <- err
	}()
	var job batchv1.Job
	if err := stacktest.Eventually(time.Minute, func() error { return get(&job, ns, name+"-release") }); err != nil {
		t.Fatalf("no post-delete Job: %v", err)
	}
	if err := admitPod(ns, "release", job.Spec.Template.Spec); err != nil {
		t.Errorf("the hook's pod is refused under the restricted profile: %v", err)
	}
	c := job.Spec.Template.Spec.Containers[0]
	var hookOut bytes.Buffer
	run := exec.Command(bin, append(append([]string(nil), c.Args...), "--kubeconfig", hookKubeconfig, "--wait", "30s")...)
	run.Stdout, run.Stderr = &hookOut, &hookOut
	if err := run.Run(); err != nil {
		t.Fatalf("the hook's command %v: %v\n%s", c.Args, err, hookOut.String())
	}
	if !strings.Contains(hookOut.String(), "released 2 Students") {
		t.Errorf("the hook's command printed %q, want 2 released", hookOut.String())
	}
	completeJob(t, &job)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("helm uninstall: %v\n%s", err, uninstallOut)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("helm uninstall did not return")
	}

	for _, o := range installed {
		if err := get(o.obj, o.namespace, o.name); !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall: %T %s is still there (%v)", o.obj, o.name, err)
		}
	}
	for _, o := range []client.Object{&batchv1.Job{}, &corev1.ServiceAccount{}, &rbacv1.Role{}} {
		if err := get(o, ns, name+"-release"); !apierrors.IsNotFound(err) {
			t.Errorf("after uninstall: the hook's %T is still there (%v)", o, err)
		}
	}
	if err := get(&rbacv1.ClusterRole{}, "", name+"-release"); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall: the hook's ClusterRole is still there (%v)", err)
	}
	if err := get(&coordinationv1.Lease{}, ns, lease.Name); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall: the free Lease is still there (%v)", err)
	}
	var crd unstructured.Unstructured
	crd.SetAPIVersion("apiextensions.k8s.io/v1")
	crd.SetKind("CustomResourceDefinition")
	if err := get(&crd, "", "students.example.k8s.io"); err != nil {
		t.Errorf("uninstall removed the CRD (and every Student): %v", err)
	}
	if err := get(&studentv1.Student{}, watched, deleting.Name); !apierrors.IsNotFound(err) {
		t.Errorf("the Student deleted before the uninstall is still held (%v)", err)
	}
	var h studentv1.Student
	if err := get(&h, watched, held.Name); err != nil || len(h.Finalizers) > 0 {
		t.Errorf("Student %s after uninstall: finalizers %v (%v)", held.Name, h.Finalizers, err)
	}
	if err := st.Client.Delete(ctx, &h); err != nil {
		t.Fatal(err)
	}
	if err := stacktest.Eventually(10*time.Second, func() error {
		if err := get(&studentv1.Student{}, watched, held.Name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Student %s cannot be deleted (%v)", held.Name, err)
		}
		return nil
	}); err != nil {
		t.Error(err)
	}
}

// completeJob records job as succeeded, as the Job controller would once
// its pod exited 0.
func completeJob(t *testing.T, job *batchv1.Job) {
	t.Helper()
	now := metav1.Now()
	start := metav1.NewTime(now.Add(-time.Second))
	job.Status = batchv1.JobStatus{
		StartTime: &start, CompletionTime: &now, Succeeded: 1, Terminating: ptr.To[int32](0), Ready: ptr.To[int32](0),
		Conditions: []batchv1.JobCondition{
			{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
			{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastProbeTime: now, LastTransitionTime: now},
		},
	}
	if err := st.Client.Status().Update(context.Background(), job); err != nil {
		t.Fatalf("mark the hook Job complete: %v", err)
	}
}

// TestChartRendersThePolicyOnlyWhereServed: the chart renders the finalizer
// policy only for a cluster that serves its kind (Kubernetes 1.36 and
// later), so it installs on older clusters too.
func TestChartRendersThePolicyOnlyWhereServed(t *testing.T) {
	count := func(objs []*unstructured.Unstructured) int {
		n := 0
		for _, o := range objs {
			if strings.HasPrefix(o.GetKind(), "MutatingAdmissionPolicy") {
				n++
			}
		}
		return n
	}
	if n := count(helmTemplate(t, "student-bridge-system")); n != 0 {
		t.Errorf("rendered for a cluster that serves no MutatingAdmissionPolicy: %d policy objects, want 0", n)
	}
	if n := count(helmTemplate(t, "student-bridge-system", policyServed...)); n != 2 {
		t.Errorf("rendered for a cluster that serves MutatingAdmissionPolicy: %d policy objects, want 2 (the policy and its binding)", n)
	}
}
