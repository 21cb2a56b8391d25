package bridge

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
)

// apiRequests counts every request the bridge sends to the API server by
// its Kubernetes verb and resource, the labels of the API server's own
// apiserver_request_total, so that what the bridge says it asked can be
// checked against what the server says it served. client-go's
// rest_client_requests_total has the HTTP method and host but not the
// resource.
var apiRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "student_bridge_api_requests_total",
	Help: "Requests the bridge sent to the Kubernetes API server, by verb (get, list, watch, create, update, patch, delete) and resource (students, students/status, events, leases; other for discovery and the rest).",
}, []string{"verb", "resource"})

// countAPIRequests makes every client built from cfg count its requests
// in apiRequests.
func countAPIRequests(cfg *rest.Config) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return countingTransport{rt}
	})
}

type countingTransport struct{ next http.RoundTripper }

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	verb, resource := requestVerb(req)
	apiRequests.WithLabelValues(verb, resource).Inc()
	return t.next.RoundTrip(req)
}

// requestVerb names a request the way the API server's metrics do: the
// verb from the method (a GET of a collection is a list, with watch=true
// a watch) and the resource from the path, with its subresource
// (/apis/example.k8s.io/v1/namespaces/a/students/b/status is
// students/status). A path that names no resource (discovery, /version)
// is "other".
func requestVerb(req *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	// /api/v1/... or /apis/<group>/<version>/...
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		parts = nil
	}
	// namespaces/<ns>/<resource>/..., unless it is the namespace itself.
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	named := len(parts) >= 2
	switch len(parts) {
	case 0:
		resource = "other"
	case 1, 2:
		resource = parts[0]
	default:
		resource = parts[0] + "/" + parts[2]
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			verb = "watch"
		case named || resource == "other":
			verb = "get"
		default:
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if !named && resource != "other" {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(req.Method)
	}
	return verb, resource
}
