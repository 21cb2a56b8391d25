package bridge

import (
	"net/http"
	"net/url"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/student-bridge/student-bridge/internal/config"
)

func TestRequestVerb(t *testing.T) {
	for _, c := range []struct {
		method, path, query string
		verb, resource      string
	}{
		{"GET", "/apis/example.k8s.io/v1/namespaces/a/students", "", "list", "students"},
		{"GET", "/apis/example.k8s.io/v1/students", "watch=true&resourceVersion=5", "watch", "students"},
		{"GET", "/apis/example.k8s.io/v1/namespaces/a/students/b", "", "get", "students"},
		{"PATCH", "/apis/example.k8s.io/v1/namespaces/a/students/b", "", "patch", "students"},
		{"PUT", "/apis/example.k8s.io/v1/namespaces/a/students/b/status", "", "update", "students/status"},
		{"POST", "/apis/events.k8s.io/v1/namespaces/a/events", "", "create", "events"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/a/leases/shard-3", "", "update", "leases"},
		{"GET", "/api/v1/namespaces/a", "", "get", "namespaces"},
		{"DELETE", "/api/v1/namespaces/a/events", "", "deletecollection", "events"},
		{"GET", "/apis", "", "get", "other"},
		{"GET", "/apis/example.k8s.io/v1", "", "get", "other"},
		{"GET", "/version", "", "get", "other"},
	} {
		req := &http.Request{Method: c.method, URL: &url.URL{Path: c.path, RawQuery: c.query}}
		if verb, resource := requestVerb(req); verb != c.verb || resource != c.resource {
			t.Errorf("%s %s?%s: %s %s, want %s %s", c.method, c.path, c.query, verb, resource, c.verb, c.resource)
		}
	}
}

// TestKubeAPIConfig: the bridge asks for uncompressed responses unless
// kubeAPICompression is set, and a kubeconfig's disable-compression wins.
func TestKubeAPIConfig(t *testing.T) {
	for _, c := range []struct {
		compression, kubeconfigDisables, wantDisabled bool
	}{
		{false, false, true},
		{true, false, false},
		{true, true, true},
		{false, true, true},
	} {
		cfg := &config.Config{KubeAPIQPS: 7, KubeAPIBurst: 9, KubeAPICompression: c.compression}
		in := &rest.Config{Host: "https://api.example", DisableCompression: c.kubeconfigDisables}
		got := kubeAPIConfig(cfg, in)
		if got.DisableCompression != c.wantDisabled {
			t.Errorf("kubeAPICompression %v, kubeconfig disable-compression %v: DisableCompression %v, want %v",
				c.compression, c.kubeconfigDisables, got.DisableCompression, c.wantDisabled)
		}
		if got.QPS != 7 || got.Burst != 9 {
			t.Errorf("QPS %v burst %d, want 7 and 9", got.QPS, got.Burst)
		}
		if in.DisableCompression != c.kubeconfigDisables || in.QPS != 0 {
			t.Errorf("the caller's config was changed: %+v", in)
		}
	}
}
