package deploy_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	studentconsumer "github.com/student-bridge/student-bridge/consumer"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/fleet"
	"github.com/student-bridge/student-bridge/internal/natssink"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// TestFleetChartValues: a hub from deploy/helm/fleet/hub-values.yaml and
// two clusters' NATS from nats-values.yaml and fleet/leaf-values.yaml, with
// the users they ship: `student-bridge hub` sets up the hub as user fleet,
// the bridges of both clusters (configured as fleet/bridge-values.yaml
// configures one) publish as user bridge, a service on the hub mirrors
// both clusters as user roster, and its receipts show on the Students of
// both clusters. No user hits a permission it lacks.
func TestFleetChartValues(t *testing.T) {
	ctx := context.Background()
	hubValues := readChartValues(t, "fleet/hub-values.yaml")
	checkSecretEnv(t, "fleet/hub-values.yaml", hubValues, "student-bridge-hub",
		map[string]string{"LEAF_PASSWORD": "leaf-password", "FLEET_PASSWORD": "fleet-password", "ROSTER_PASSWORD": "roster-password"})
	if !hubValues.Config.Leafnodes.Enabled || hubValues.Config.Leafnodes.Port != 7422 || hubValues.Config.Cluster.Replicas != 3 {
		t.Errorf("hub-values.yaml: want a 3-node cluster listening for leaf nodes on 7422, got %+v", hubValues.Config)
	}
	hubOpts := parseChartConfig(t, hubValues, map[string]string{"LEAF_PASSWORD": "leaf-secret", "FLEET_PASSWORD": "fleet-secret", "ROSTER_PASSWORD": "roster-secret"})
	if hubOpts.JetStreamDomain != studentv1.DefaultHubDomain {
		t.Errorf("hub-values.yaml: JetStream domain %q, want %q", hubOpts.JetStreamDomain, studentv1.DefaultHubDomain)
	}
	leafPort, err := stack.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	hubOpts.ServerName, hubOpts.LeafNode.Port = "hub", leafPort
	hub := startServer(t, hubOpts)
	hubURL := hub.ClientURL()

	leafValues := readChartValues(t, "nats-values.yaml", "fleet/leaf-values.yaml")
	checkSecretEnv(t, "fleet/leaf-values.yaml", leafValues, "student-bridge-nats", map[string]string{"HUB_URL": "hub-url"})
	bridgeValues := podConfig(t, t.TempDir(), helmTemplate(t, "student-bridge-system", "-f", filepath.Join(stack.RepoRoot(), "deploy", "helm", "fleet", "bridge-values.yaml")))
	checkFleetBridge(t, "the chart with fleet/bridge-values.yaml", bridgeValues)
	env := map[string]string{"BRIDGE_PASSWORD": "bridge-secret", "CONSUMER_PASSWORD": "consumer-secret",
		"ROSTER_PASSWORD": "roster-secret", "HUB_URL": fmt.Sprintf("nats-leaf://leaf:leaf-secret@127.0.0.1:%d", leafPort)}
	// East's NATS is installed with Helm, west's with kustomize
	// (deploy/fleet-cluster, whose leaf.conf names the same cluster).
	chartLeaf := parseChartConfig(t, leafValues, env)
	checkLeaf(t, "leaf-values.yaml", chartLeaf, bridgeValues.Cluster, "STUDENTS")
	overlay := render(t, "fleet-cluster")
	kustomizeBridge := podConfig(t, t.TempDir(), overlay)
	checkFleetBridge(t, "deploy/fleet-cluster", kustomizeBridge)
	kustomizeLeaf := kustomizeLeafConfig(t, overlay, env)
	checkLeaf(t, "deploy/fleet-cluster", kustomizeLeaf, kustomizeBridge.Cluster, "")
	clusters := map[string]string{} // cluster -> its NATS's URL
	for name, opts := range map[string]*natsserver.Options{bridgeValues.Cluster: chartLeaf, "west": kustomizeLeaf} {
		// Each cluster's copy of the files: its own domain.
		opts.ServerName, opts.JetStreamDomain = name, name
		opts.LeafNode.ReconnectInterval = 250 * time.Millisecond
		clusters[name] = startNATS(t, opts)
	}
	if err := stacktest.Eventually(30*time.Second, func() error {
		if n := hub.NumLeafNodes(); n != len(clusters) {
			return fmt.Errorf("%d leaf nodes connected", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("the clusters' NATS did not connect to the hub as user leaf: %v", err)
	}

	fleetConn, fleetErrs := connectAs(t, hubURL, "fleet", "fleet-secret")
	if _, err := fleet.EnsureHub(ctx, fleetConn, fleet.Hub{Clusters: []string{bridgeValues.Cluster, "west"}}); err != nil {
		t.Fatalf("student-bridge hub as fleet: %v (permission errors %v)", err, fleetErrs())
	}
	// West ran alone before it joined the fleet: its receipts bucket is
	// there, without the hub's receipts as its source, which its bridge
	// adds.
	westBridge, _ := connectAs(t, clusters["west"], "bridge", "bridge-secret")
	if _, err := natssink.EnsureBucket(ctx, westBridge, natssink.BucketConfig{Name: studentv1.ReceiptsBucket, Replicas: 1}, true); err != nil {
		t.Fatal(err)
	}
	students := map[string]*studentv1.Student{}
	for name, natsURL := range clusters {
		ns := stacktest.Namespace(t, st.Client, "fleet-"+name)
		runBridgeAs(t, natsURL, ns, func(c *config.Config) {
			c.Cluster, c.Fleet.HubDomain = name, bridgeValues.Fleet.HubDomain
			c.Services.Expected = []string{"roster"}
		})
		s := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "object-name"}, Spec: studentv1.StudentSpec{Name: "wang", School: name}}
		if err := st.Client.Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		students[name] = s
	}

	rosterConn, rosterErrs := connectAs(t, hubURL, "roster", "roster-secret")
	mirror, err := studentconsumer.NewMirror(rosterConn, studentconsumer.MirrorOptions{Service: "roster", Fleet: true,
		Handler: func(context.Context, studentconsumer.Change) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	mctx, mcancel := context.WithCancel(ctx)
	mdone := make(chan error, 1)
	go func() { mdone <- mirror.Run(mctx) }()
	t.Cleanup(func() {
		mcancel()
		if err := <-mdone; err != nil {
			t.Errorf("mirror on the hub as roster: %v", err)
		}
	})
	for name, s := range students {
		if err := stacktest.Eventually(time.Minute, func() error {
			var got studentv1.Student
			if err := st.Client.Get(ctx, client.ObjectKeyFromObject(s), &got); err != nil {
				return err
			}
			if got.Status.ServicesInSync != "1/1" {
				return fmt.Errorf("%s/%s shows %q in sync", got.Namespace, got.Name, got.Status.ServicesInSync)
			}
			return nil
		}); err != nil {
			t.Errorf("cluster %s: %v (permission errors: roster %v, fleet %v)", name, err, rosterErrs(), fleetErrs())
		}
	}
	// From the hub, a snapshot request names the cluster that answers it.
	for name := range clusters {
		msg, err := fleetConn.Request(studentv1.DefaultSnapshotSubject+"."+name, nil, 30*time.Second)
		if err != nil {
			t.Fatalf("snapshot request for %s as fleet: %v", name, err)
		}
		var reply studentv1.SnapshotReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil || reply.Cluster != name || reply.Published != 1 || reply.Error != "" {
			t.Errorf("snapshot request for %s: %s (%v)", name, msg.Data, err)
		}
	}
	// A hub service writes only its own receipts.
	expectViolation(t, rosterConn, rosterErrs, "$KV.STUDENT_FLEET_RECEIPTS.west.billing."+string(students["west"].UID))
	if errs := append(rosterErrs(), fleetErrs()...); len(errs) > 1 {
		t.Errorf("permission errors beyond the one tried: %v", errs)
	}
	if _, err := nats.Connect(hubURL, nats.UserInfo("leaf", "wrong")); err == nil {
		t.Error("the hub let a wrong leaf password in")
	}
}

// checkLeaf checks a cluster's NATS configuration (from file): a leaf node
// of the hub in the domain of the cluster's name, with its local account
// bound to the hub's, carrying none of stack.LeafNodeDeny.
func checkLeaf(t *testing.T, file string, opts *natsserver.Options, cluster, account string) {
	t.Helper()
	if len(opts.LeafNode.Remotes) != 1 || len(opts.LeafNode.Remotes[0].URLs) != 1 {
		t.Fatalf("%s: want one leaf node remote with one URL, got %+v", file, opts.LeafNode.Remotes)
	}
	remote := opts.LeafNode.Remotes[0]
	if !slices.Equal(remote.DenyImports, stack.LeafNodeDeny) || !slices.Equal(remote.DenyExports, stack.LeafNodeDeny) || remote.LocalAccount != account {
		t.Errorf("%s: remote of account %q denies imports %v and exports %v, want account %q and %v both ways",
			file, remote.LocalAccount, remote.DenyImports, remote.DenyExports, account, stack.LeafNodeDeny)
	}
	if opts.JetStreamDomain != cluster {
		t.Errorf("%s: JetStream domain %q, but the bridge names the cluster %q", file, opts.JetStreamDomain, cluster)
	}
}

// kustomizeLeafConfig parses the NATS configuration of the rendered
// deploy/fleet-cluster (leaf.conf, which includes nats.conf) as its pod
// would, with env set.
func kustomizeLeafConfig(t *testing.T, objs []*unstructured.Unstructured, env map[string]string) *natsserver.Options {
	t.Helper()
	dir := t.TempDir()
	for _, o := range objs {
		if o.GetKind() != "ConfigMap" || !strings.HasPrefix(o.GetName(), "nats-config") {
			continue // the name ends in the content's hash
		}
		for name, text := range convert[corev1.ConfigMap](t, o).Data {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	nats := convert[appsv1.StatefulSet](t, find(t, objs, "StatefulSet", "nats"))
	if args := nats.Spec.Template.Spec.Containers[0].Args; len(args) == 0 || args[0] != "--config=/etc/nats/leaf.conf" {
		t.Fatalf("deploy/fleet-cluster: NATS runs with %v, want --config=/etc/nats/leaf.conf", args)
	}
	t.Setenv("POD_NAME", "nats-0")
	for k, v := range env {
		t.Setenv(k, v)
	}
	opts, err := natsserver.ProcessConfigFile(filepath.Join(dir, "leaf.conf"))
	if err != nil {
		t.Fatalf("deploy/fleet-cluster: leaf.conf does not parse: %v", err)
	}
	if !opts.SyncAlways || opts.StoreDir != "/data" || len(opts.Users) != 3 {
		t.Errorf("deploy/fleet-cluster: leaf.conf lost nats.conf's settings: sync always %v, store %s, %d users", opts.SyncAlways, opts.StoreDir, len(opts.Users))
	}
	opts.JetStream = true
	return opts
}

// checkFleetBridge checks the configuration a rendered bridge pod loads
// (from): one cluster of a fleet whose hub is in the default domain.
func checkFleetBridge(t *testing.T, from string, cfg *config.Config) {
	t.Helper()
	if cfg.Fleet.HubDomain != studentv1.DefaultHubDomain || !studentv1.ValidClusterName(cfg.Cluster) {
		t.Errorf("%s: the bridge loads cluster %q, fleet.hubDomain %q", from, cfg.Cluster, cfg.Fleet.HubDomain)
	}
}
