package bridge

import (
	"net/http"
	"net/url"
	"testing"
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
