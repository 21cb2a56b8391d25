// Command chartschema writes the Helm chart's values.schema.json. The schema
// of the chart's own values is written here by hand; the schema of its
// config map is generated from the bridge's settings (internal/config), so
// that `helm install` refuses an unknown key, a wrong type or a value
// outside a key's choices, naming it, and cannot drift from the bridge.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/student-bridge/student-bridge/internal/config"
)

type obj = map[string]any

// chartOwned are the config keys the chart sets itself (or that make no
// sense in a pod), with the value to use instead.
var chartOwned = map[string]string{
	"kubeconfig":    "the in-cluster config is used",
	"master":        "the in-cluster config is used",
	"namespaces":    "set watch.namespaces",
	"labelSelector": "set watch.labelSelector",
	"metricsAddr":   "the chart serves metrics on port 8080",
	"healthAddr":    "the chart serves probes on port 8081",
	"nats.auth.":    "set natsAuth: credentials come from a Secret",
	"nats.tls.":     "set natsTLS: certificates come from a Secret",
}

const durationPattern = `^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$`

func main() {
	// flag, so that -h prints the usage instead of naming the file to write.
	flag.Usage = func() { fmt.Fprintln(flag.CommandLine.Output(), "usage: chartschema <values.schema.json>") }
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	b, err := json.MarshalIndent(valuesSchema(), "", "  ")
	if err != nil {
		panic(err)
	}
	if err := os.WriteFile(flag.Arg(0), append(b, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func owned(key string) (string, bool) {
	for k, why := range chartOwned {
		if key == k || (strings.HasSuffix(k, ".") && strings.HasPrefix(key, k)) {
			return why, true
		}
	}
	return "", false
}

// configSchema nests every setting the chart does not own as in the file.
func configSchema() obj {
	root := object("The bridge's configuration file (configs/student-bridge.yaml); keys left out keep their defaults.", obj{})
	settings := append(append([]config.Setting(nil), config.Settings...), config.TailSettings...)
	for _, s := range settings {
		if _, ok := owned(s.Key); ok {
			continue
		}
		parts := strings.Split(s.Key, ".")
		node := root
		for _, p := range parts[:len(parts)-1] {
			props := node["properties"].(obj)
			if props[p] == nil {
				props[p] = object("", obj{})
			}
			node = props[p].(obj)
		}
		node["properties"].(obj)[parts[len(parts)-1]] = settingSchema(s)
	}
	return root
}

func settingSchema(s config.Setting) obj {
	out := obj{"description": s.Help}
	switch s.Default.(type) {
	case bool:
		out["type"] = "boolean"
	case int, int64:
		out["type"] = "integer"
	case uint64:
		out["type"] = "integer"
		out["minimum"] = 0
	case float32, float64:
		out["type"] = "number"
	case time.Duration:
		out["type"] = "string"
		out["pattern"] = durationPattern
	case []string:
		out["type"] = "array"
		out["items"] = obj{"type": "string"}
	default:
		out["type"] = "string"
		if s.Choices != nil {
			out["enum"] = s.Choices
		}
	}
	return out
}

func object(description string, props obj) obj {
	o := obj{"type": "object", "additionalProperties": false, "properties": props}
	if description != "" {
		o["description"] = description
	}
	return o
}

func str(description string) obj     { return obj{"type": "string", "description": description} }
func boolean(description string) obj { return obj{"type": "boolean", "description": description} }
func stringMap(description string) obj {
	return obj{"type": "object", "description": description, "additionalProperties": obj{"type": "string"}}
}

// kube is a Kubernetes structure the chart passes through as it is.
func kube(typ, description string) obj { return obj{"type": typ, "description": description} }

func valuesSchema() obj {
	dnsLabel := obj{"type": "string", "pattern": `^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, "maxLength": 63}
	secretKey := func(what string) obj {
		return obj{"type": "string", "pattern": `^[-._a-zA-Z0-9]*$`, "description": "Key of the Secret holding " + what + "."}
	}
	s := object("Values of the student-bridge chart.", obj{
		"image": object("The bridge's container image.", obj{
			"repository": obj{"type": "string", "minLength": 1},
			"tag":        str("Defaults to the chart's appVersion."),
			"pullPolicy": obj{"type": "string", "enum": []string{"Always", "IfNotPresent", "Never"}},
		}),
		"imagePullSecrets": kube("array", "Pull secrets of the pods."),
		"replicaCount":     obj{"type": "integer", "minimum": 0, "description": "Replicas; with config.shards.count above 1 all publish, each for the shards it holds; with 1, one leads and the others stand by."},
		"config":           configSchema(),
		"watch": object("Which Students the bridge publishes; the finalizer policy gets the same scope.", obj{
			"namespaces": obj{"type": "array", "items": dnsLabel, "description": "Namespaces to watch; empty watches all."},
			"labelSelector": object("A Kubernetes label selector; empty selects every Student.", obj{
				"matchLabels": stringMap("Labels a Student must have."),
				"matchExpressions": obj{"type": "array", "items": obj{
					"type": "object", "additionalProperties": false, "required": []string{"key", "operator"},
					"properties": obj{
						"key":      obj{"type": "string", "minLength": 1},
						"operator": obj{"type": "string", "enum": []string{"In", "NotIn", "Exists", "DoesNotExist"}},
						"values":   obj{"type": "array", "items": obj{"type": "string"}},
					},
				}},
			}),
		}),
		"natsAuth": object("The bridge's NATS credential, from an existing Secret in the release's namespace.", obj{
			"secretName":  str("The Secret; empty connects without a credential."),
			"user":        str("NATS user name (with passwordKey or tokenKey)."),
			"passwordKey": secretKey("the password"),
			"tokenKey":    secretKey("the token"),
			"nkeySeedKey": secretKey("an NKey seed"),
			"credsKey":    secretKey("a JWT credentials file"),
		}),
		"natsTLS": object("TLS to NATS, from an existing Secret in the release's namespace.", obj{
			"secretName": str("The Secret; empty uses no client certificate and the system's CAs."),
			"caKey":      secretKey("the CA bundle"),
			"certKey":    secretKey("the client certificate"),
			"keyKey":     secretKey("the client key"),
		}),
		"finalizerPolicy": object("The MutatingAdmissionPolicy adding the bridge's finalizer to new Students.", obj{
			"enabled": boolean("Render it (only while config.deletes.holdWithFinalizer is true)."),
		}),
		"verify": object("`student-bridge verify` as a CronJob that fails on drift.", obj{
			"schedule": str("A cron schedule; empty renders no CronJob."),
			"settle":   obj{"type": "string", "pattern": `^([0-9]+(ms|s|m|h))+$`, "description": "How long before findings are checked again."},
			"strict":   boolean("Count Students with no event as missing even when older events left the stream."),
			"natsAuth": object("The NATS user and password verify reads with; an empty secretName uses the bridge's credential.", obj{
				"secretName":  str("The Secret; empty uses natsAuth's."),
				"user":        str("NATS user name."),
				"passwordKey": secretKey("the password"),
			}),
		}),
		"releaseFinalizersOnUninstall": boolean("Run the post-delete Job that removes the bridge's finalizer from every Student."),
		"serviceAccount": object("The bridge's ServiceAccount.", obj{
			"create":      boolean("Create it."),
			"name":        str("Its name; defaults to the release's full name."),
			"annotations": stringMap("Its annotations."),
		}),
		"podAnnotations":            stringMap("Extra annotations of the bridge's pods."),
		"podLabels":                 stringMap("Extra labels of the bridge's pods."),
		"resources":                 kube("object", "Resources of the bridge's container."),
		"nodeSelector":              stringMap("Node selector of the bridge's pods."),
		"tolerations":               kube("array", "Tolerations of the bridge's pods."),
		"extraEnv":                  kube("array", "Extra environment variables of the bridge's container (EnvVar objects), such as OTEL_EXPORTER_OTLP_ENDPOINT for tracing."),
		"affinity":                  kube("object", "Affinity of the bridge's pods."),
		"topologySpreadConstraints": kube("array", "Topology spread constraints of the bridge's pods."),
		"priorityClassName":         str("Priority class of the bridge's pods."),
		"podDisruptionBudget": object("A PodDisruptionBudget, rendered when replicaCount is above 1.", obj{
			"enabled":        boolean("Render it."),
			"maxUnavailable": obj{"type": []string{"integer", "string"}, "description": "Pods a voluntary disruption may take at once."},
		}),
		"spreadOverNodes": boolean("Spread the replicas over nodes (a topology spread constraint on kubernetes.io/hostname)."),
		"serviceMonitor": object("A Prometheus Operator ServiceMonitor for /metrics.", obj{
			"enabled":  boolean("Render it (needs the monitoring.coreos.com CRDs)."),
			"interval": obj{"type": "string", "pattern": `^([0-9]+(ms|s|m|h))+$`, "description": "Scrape interval."},
			"labels":   stringMap("Extra labels, e.g. for the Prometheus' serviceMonitorSelector."),
		}),
		"alerts": object("The alerts of deploy/monitoring/alerts.yaml as a PrometheusRule.", obj{
			"enabled": boolean("Render it (needs the monitoring.coreos.com CRDs)."),
			"labels":  stringMap("Extra labels, e.g. for the Prometheus' ruleSelector."),
		}),
		"dashboard": object("The Grafana dashboard in a ConfigMap for Grafana's dashboard sidecar.", obj{
			"enabled":   boolean("Render it."),
			"namespace": str("Where the ConfigMap goes; default the release's namespace."),
			"labels":    stringMap("Its labels; the sidecar selects on grafana_dashboard: \"1\"."),
		}),
	})
	s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	return s
}
