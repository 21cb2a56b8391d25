// Command dashboard writes the student-bridge Grafana dashboard
// (deploy/monitoring/dashboard.json), built with the Grafana Foundation
// SDK. `make generate` runs it; the chart ships the same file as a
// ConfigMap (dashboard.enabled). Its rows are what a person on call reads
// top to bottom: is it publishing, is it safe, who holds what, what it
// costs the cluster, and are the services in sync.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// source is the dashboard's Prometheus, picked by the datasource variable.
var source = common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}

// scope narrows every query to the namespace picked.
const scope = `namespace=~"$namespace"`

type query struct{ expr, legend string }

func series(title, unit, help string, qs ...query) cog.Builder[dashboard.Panel] {
	p := timeseries.NewPanelBuilder().Title(title).Description(help).Unit(unit).Datasource(source).Height(8).Span(8)
	for _, q := range qs {
		p.WithTarget(prometheus.NewDataqueryBuilder().Expr(q.expr).LegendFormat(q.legend))
	}
	return p
}

func single(title, unit, help string, q query) cog.Builder[dashboard.Panel] {
	return stat.NewPanelBuilder().Title(title).Description(help).Unit(unit).Datasource(source).Height(8).Span(8).
		WithTarget(prometheus.NewDataqueryBuilder().Expr(q.expr).LegendFormat(q.legend))
}

func rate(metric, by string) string {
	return fmt.Sprintf("sum by (%s) (rate(%s{%s}[$__rate_interval]))", by, metric, scope)
}

func quantile(q float64, metric, by string) string {
	return fmt.Sprintf("histogram_quantile(%g, sum by (le, %s) (rate(%s_bucket{%s}[$__rate_interval])))", q, by, metric, scope)
}

// build makes the dashboard in Grafana's classic JSON model, which every
// Grafana and its sidecar provisioning load; the SDK's v2 model needs
// Grafana 12's new dashboard schema.
//
//nolint:staticcheck // the classic model, on purpose (above)
func build() (dashboard.Dashboard, error) {
	b := dashboard.NewDashboardBuilder("student-bridge").
		Uid("student-bridge").
		Description("Student changes to CloudEvents on NATS: publishing, safety, shards, cost and the services' sync.").
		Tags([]string{"student-bridge", "nats", "kubernetes"}).
		Refresh("30s").
		Time("now-1h", "now").
		Timezone(common.TimeZoneBrowser).
		WithVariable(dashboard.NewDatasourceVariableBuilder("datasource").Label("Prometheus").Type("prometheus")).
		WithVariable(dashboard.NewQueryVariableBuilder("namespace").Label("Namespace").
			Datasource(source).Query(dashboard.StringOrMap{String: cog.ToPtr("label_values(student_bridge_nats_connected, namespace)")}).
			IncludeAll(true).Multi(true))

	b.WithRow(dashboard.NewRowBuilder("Is it publishing?")).
		WithPanel(series("Events published", "ops", "CloudEvents a second, by type and result.",
			query{rate("student_bridge_events_published_total", "type, result"), "{{type}} {{result}}"})).
		WithPanel(series("Publish latency", "s", "From the start of a publish to JetStream's ack.",
			query{quantile(0.5, "student_bridge_publish_duration_seconds", "type"), "p50 {{type}}"},
			query{quantile(0.99, "student_bridge_publish_duration_seconds", "type"), "p99 {{type}}"})).
		WithPanel(series("Backlog", "short", "Changes seen and not yet published, per shard (with shards), and the work queue per replica.",
			query{fmt.Sprintf("sum by (shard) (student_bridge_shard_unpublished{%s})", scope), "shard {{shard}}"},
			query{fmt.Sprintf(`sum by (pod) (workqueue_depth{name="student-bridge", %s})`, scope), "queue {{pod}}"})).
		WithPanel(series("Where a change's time goes (p99)", "s", "Per stage: queue, write_ahead, publish, record, finalizer, status, kubernetes_event.",
			query{quantile(0.99, "student_bridge_stage_duration_seconds", "stage"), "{{stage}}"}))

	b.WithRow(dashboard.NewRowBuilder("Is it safe?")).
		WithPanel(single("Records unsaved", "short", "Published events the record store has not taken; while above 0 nothing new is published.",
			query{fmt.Sprintf("sum(student_bridge_records_unsaved{%s})", scope), ""})).
		WithPanel(series("NATS connected", "short", "1 while a replica is connected to NATS.",
			query{fmt.Sprintf("student_bridge_nats_connected{%s}", scope), "{{pod}}"})).
		WithPanel(series("NATS reconnects and disconnects", "ops", "Per second.",
			query{rate("student_bridge_nats_reconnects_total", "pod"), "reconnects {{pod}}"},
			query{rate("student_bridge_nats_disconnects_total", "pod"), "disconnects {{pod}}"})).
		WithPanel(series("Record store operations", "ops", "By operation and result; conflicts mean another replica wrote the record.",
			query{rate("student_bridge_record_store_operations_total", "op, result"), "{{op}} {{result}}"}))

	b.WithRow(dashboard.NewRowBuilder("Who holds what?")).
		WithPanel(series("Shards held", "short", "Per replica, and the shards nobody holds.",
			query{fmt.Sprintf("student_bridge_shards_held{%s}", scope), "{{pod}}"},
			query{fmt.Sprintf("max(student_bridge_shards{%[1]s}) - sum(student_bridge_shards_held{%[1]s})", scope), "unowned"})).
		WithPanel(series("Shard handovers", "ops", "Shards taken (acquired) and given up (released, lost).",
			query{rate("student_bridge_shard_handovers_total", "kind"), "{{kind}}"})).
		WithPanel(series("Catching up", "short", "Students a start or a gained shard queued and not yet reconciled, per replica; the pause of a restart or a failover.",
			query{fmt.Sprintf("student_bridge_catch_up_students{%s}", scope), "{{pod}}"}))

	b.WithRow(dashboard.NewRowBuilder("What does it cost the cluster?")).
		WithPanel(series("Status writes", "ops", "Writes of the status view, by result, and the Students waiting for one (drained at status.qps a second).",
			query{rate("student_bridge_status_writes_total", "result"), "{{result}}"},
			query{fmt.Sprintf("sum(student_bridge_status_backlog{%s})", scope), "waiting"})).
		WithPanel(series("Kubernetes Events", "ops", "Written, failed and dropped (the queue was full), and the queue.",
			query{rate("student_bridge_kubernetes_events_total", "result"), "{{result}}"},
			query{fmt.Sprintf("sum(student_bridge_kubernetes_events_queued{%s})", scope), "queued"})).
		WithPanel(series("API requests", "reqps", "The bridge's requests to the Kubernetes API server, by method and code.",
			query{rate("rest_client_requests_total", "method, code"), "{{method}} {{code}}"}))

	b.WithRow(dashboard.NewRowBuilder("Are the services in sync?")).
		WithPanel(series("Students per service and state", "short", "InSync: applied the latest change; Behind: not yet; Failed: reported a failure.",
			query{fmt.Sprintf("sum by (service, state) (student_bridge_service_students{%s})", scope), "{{service}} {{state}}"})).
		WithPanel(series("Receipts read", "ops", "Updates of the receipts bucket, by result.",
			query{rate("student_bridge_receipts_total", "result"), "{{result}}"}))
	return b.Build()
}

func main() {
	flag.Usage = func() { fmt.Fprintln(flag.CommandLine.Output(), "usage: dashboard <dashboard.json>") }
	flag.Parse()
	if flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	d, err := build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := os.WriteFile(flag.Arg(0), append(b, '\n'), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
