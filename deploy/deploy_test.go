package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
	"github.com/student-bridge/student-bridge/internal/version"
)

var (
	st       *stack.Stack
	overlays = []string{"default", "bridge-only", "dev", "fleet-cluster"}
)

func TestMain(m *testing.M) {
	os.Exit(stacktest.RunTests(m, stack.Options{}, func(s *stack.Stack) { st = s }))
}

// render runs the built `kubectl kustomize` on deploy/<overlay>.
func render(t *testing.T, overlay string) []*unstructured.Unstructured {
	t.Helper()
	assets, err := stack.AssetsDir("")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(assets, "kubectl"), "kustomize", filepath.Join(stack.RepoRoot(), "deploy", overlay))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize deploy/%s: %v\n%s", overlay, err, stderr.String())
	}
	return decodeObjects(t, out)
}

// decodeObjects decodes a stream of YAML documents.
func decodeObjects(t *testing.T, out []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

// TestOverlaysApplyServerSide: every object of every overlay is accepted by
// the real kube-apiserver with server-side apply.
func TestOverlaysApplyServerSide(t *testing.T) {
	ctx := context.Background()
	for _, overlay := range overlays {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, overlay)
			// Namespaces and CRDs first, as kubectl apply would need them.
			rank := func(u *unstructured.Unstructured) int {
				switch u.GetKind() {
				case "Namespace":
					return 0
				case "CustomResourceDefinition":
					return 1
				}
				return 2
			}
			for r := 0; r < 3; r++ {
				for _, o := range objs {
					if rank(o) != r {
						continue
					}
					if err := st.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("deploy-test"), client.ForceOwnership); err != nil {
						t.Errorf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
					}
				}
			}
			// Remove what was applied (but the namespace and the CRD), so
			// the next overlay starts clean: a StatefulSet's volume claim
			// templates cannot be changed in place.
			defer func() {
				for _, o := range objs {
					if rank(o) == 2 {
						if err := st.Client.Delete(ctx, o); err != nil && !apierrors.IsNotFound(err) {
							t.Errorf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
						}
					}
				}
			}()
			kinds := map[string]bool{}
			for _, o := range objs {
				kinds[o.GetKind()] = true
			}
			want := []string{"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "Deployment", "Service"}
			if overlay != "bridge-only" {
				want = append(want, "StatefulSet")
			}
			for _, k := range want {
				if !kinds[k] {
					t.Errorf("deploy/%s renders no %s", overlay, k)
				}
			}
			if overlay == "bridge-only" && kinds["StatefulSet"] {
				t.Errorf("deploy/bridge-only renders a NATS StatefulSet")
			}
			if kinds["MutatingAdmissionPolicy"] {
				t.Errorf("deploy/%s renders the finalizer policy: it fails on Kubernetes 1.35 and older, where it belongs in deploy/admission", overlay)
			}
		})
	}
	// The finalizer policy beside them, where the API server serves it
	// (1.36 and later, as make deploy checks); elsewhere it is refused as
	// docs/deploy.md says, and the overlays above are whole without it.
	t.Run("admission", func(t *testing.T) {
		served, err := stack.ServesFinalizerPolicy(st.RestConfig)
		if err != nil {
			t.Fatal(err)
		}
		if want := stacktest.PolicyServed(t); served != want {
			t.Fatalf("the API server serves MutatingAdmissionPolicy: %v; want %v for its version", served, want)
		}
		for _, o := range render(t, "admission") {
			err := st.Client.Apply(ctx, client.ApplyConfigurationFromUnstructured(o), client.FieldOwner("deploy-test"), client.ForceOwnership)
			switch {
			case served && err != nil:
				t.Errorf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
			case !served && !meta.IsNoMatchError(err):
				t.Errorf("apply %s %s where the kind is not served: got %v, want no match for its kind", o.GetKind(), o.GetName(), err)
			case served:
				if err := st.Client.Delete(ctx, o); err != nil {
					t.Errorf("delete %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		}
	})
}

// TestPodsMeetRestrictedPodSecurity creates (dry-run) pods from the rendered
// templates in a namespace that enforces the restricted profile. A pod
// without the security context must be refused, or the check proves nothing.
func TestPodsMeetRestrictedPodSecurity(t *testing.T) {
	const ns = "restricted-check"
	restrictedNamespace(t, ns)
	objs := render(t, "default")
	templates := map[string]corev1.PodTemplateSpec{}
	for _, kind := range []string{"Deployment", "StatefulSet"} {
		u := find(t, objs, kind, "")
		tmpl, found, err := unstructured.NestedMap(u.Object, "spec", "template")
		if err != nil || !found {
			t.Fatalf("%s has no pod template: %v", kind, err)
		}
		var pt corev1.PodTemplateSpec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &pt); err != nil {
			t.Fatal(err)
		}
		if kind == "StatefulSet" {
			// The StatefulSet controller adds a volume per claim template.
			pt.Spec.Volumes = append(pt.Spec.Volumes, corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		}
		templates[kind] = pt
	}
	for kind, pt := range templates {
		if err := admitPod(ns, strings.ToLower(kind), pt.Spec); err != nil {
			t.Errorf("%s pod refused under restricted: %v", kind, err)
		}
	}
	dt := templates["Deployment"]
	loose := dt.Spec.DeepCopy()
	loose.SecurityContext = nil
	loose.Containers[0].SecurityContext = nil
	err := admitPod(ns, "loose", *loose)
	if err == nil || !strings.Contains(err.Error(), "restricted") {
		t.Errorf("a pod without a security context was not refused: %v", err)
	}
}

// TestRenderedRBACIsGenerated: what the overlay applies is exactly what
// controller-gen generated from the code's markers.
func TestRenderedRBACIsGenerated(t *testing.T) {
	generated := generatedRules(t)
	for _, overlay := range overlays {
		objs := render(t, overlay)
		for _, kind := range []string{"ClusterRole", "Role"} {
			rendered := find(t, objs, kind, "student-bridge")
			var r struct {
				Rules []rbacv1.PolicyRule `json:"rules"`
			}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rendered.Object, &r); err != nil {
				t.Fatal(err)
			}
			if len(generated[kind]) == 0 || !reflect.DeepEqual(r.Rules, generated[kind]) {
				t.Errorf("deploy/%s %s rules differ from the generated ones:\n%v\n%v", overlay, kind, r.Rules, generated[kind])
			}
		}
	}
}

// TestConfigMapLoads: the bridge's own loader accepts the ConfigMap's file,
// and every STUDENT_BRIDGE_* variable the Deployment sets names a real key.
func TestConfigMapLoads(t *testing.T) {
	known := map[string]bool{}
	for _, s := range append(config.Settings, config.TailSettings...) {
		known[config.EnvName(s.Key)] = true
	}
	for _, overlay := range overlays {
		objs := render(t, overlay)
		var cm *unstructured.Unstructured
		for _, o := range objs {
			if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "student-bridge-config") {
				cm = o
			}
		}
		if cm == nil {
			t.Fatalf("deploy/%s has no student-bridge-config ConfigMap", overlay)
		}
		data, found, err := unstructured.NestedString(cm.Object, "data", "student-bridge.yaml")
		if err != nil || !found {
			t.Fatalf("deploy/%s ConfigMap has no student-bridge.yaml (%v)", overlay, err)
		}
		documented, err := os.ReadFile(filepath.Join("..", "configs", "student-bridge.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if data != string(documented) {
			t.Errorf("deploy/%s ConfigMap's student-bridge.yaml is not configs/student-bridge.yaml", overlay)
		}
		file := filepath.Join(t.TempDir(), "student-bridge.yaml")
		if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := config.NewLoader(nil, config.BridgeCommand).Load(file); err != nil {
			t.Errorf("deploy/%s ConfigMap: %v", overlay, err)
		}
		dep := convert[struct {
			Spec struct {
				Template corev1.PodTemplateSpec `json:"template"`
			} `json:"spec"`
		}](t, find(t, objs, "Deployment", "student-bridge"))
		c := dep.Spec.Template.Spec.Containers[0]
		for _, e := range c.Env {
			if strings.HasPrefix(e.Name, config.EnvPrefix) && !known[e.Name] {
				t.Errorf("deploy/%s sets %s, which is no config key", overlay, e.Name)
			}
		}
		if !strings.Contains(strings.Join(c.Args, " "), "--config=/etc/student-bridge/config/student-bridge.yaml") {
			t.Errorf("deploy/%s does not load the ConfigMap: args %v", overlay, c.Args)
		}
	}
}

// TestVersionsAgree: the release named in the binary (internal/version),
// the chart's appVersion (the image tag the chart deploys) and CHANGELOG.md's
// newest section are one version.
func TestVersionsAgree(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "deploy/helm/student-bridge/Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(chart, []byte("\nappVersion: "+version.Version+"\n")) {
		t.Errorf("Chart.yaml's appVersion is not %s", version.Version)
	}
	changelog, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	// What is merged and not released yet is listed under Unreleased,
	// above the newest release.
	_, after, _ := bytes.Cut(changelog, []byte("\n## "))
	if bytes.HasPrefix(after, []byte("Unreleased\n")) {
		_, after, _ = bytes.Cut(after, []byte("\n## "))
	}
	if !bytes.HasPrefix(after, []byte(version.Version+" ")) {
		t.Errorf("CHANGELOG.md's newest release is not %s: %.40q", version.Version, after)
	}
}

// TestDockerfileBuildsTheTestedBinary: the Dockerfile builds its binary
// with the Makefile's image-binary target, the build `make test` runs, so
// the image's flags and tags cannot drift from what is tested.
func TestDockerfileBuildsTheTestedBinary(t *testing.T) {
	df, err := os.ReadFile(filepath.Join(stack.RepoRoot(), "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var builds []string
	for _, line := range strings.Split(string(df), "\n") {
		if strings.HasPrefix(line, "RUN ") && (strings.Contains(line, "go build") || strings.Contains(line, "make ")) {
			builds = append(builds, line)
		}
	}
	if len(builds) != 1 || !strings.HasPrefix(builds[0], "RUN make image-binary ") {
		t.Errorf("the Dockerfile's build steps are %q, want one: RUN make image-binary ...", builds)
	}
}
