//go:build !nodev

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/stack"
)

func newDevCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var (
		dir         string
		assets      string
		natsPort    int
		natsCluster int
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the bridge on a local stack: kube-apiserver + etcd + embedded NATS with JetStream",
		Long: `dev starts a real kube-apiserver and etcd (the binaries make builds into bin/)
with the Student CRD installed, an embedded NATS server with JetStream on a fixed
port (or, with --nats-cluster 3, a three-server JetStream cluster on that port
and the next two), and the bridge against both. State lives under --dir and survives restarts:
the next run resumes with the same Students and stream. A kubeconfig is written to
<dir>/kubeconfig. Ctrl+C stops everything.

All flags of the bridge itself apply; nats.urls and leader election are set by dev.`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().StringVar(&dir, "dir", ".dev", "Directory for the local stack's state and kubeconfig.")
	cmd.Flags().StringVar(&assets, "assets", "", "Directory with kube-apiserver, etcd and kubectl (default $KUBEBUILDER_ASSETS, else ./bin).")
	cmd.Flags().IntVar(&natsPort, "nats-port", 4222, "Port of the embedded NATS server (with --nats-cluster, the first server's; the others take the next ports).")
	cmd.Flags().IntVar(&natsCluster, "nats-cluster", 1, "NATS servers to run: 3 runs a JetStream cluster as deploy/nats does, the stream and the buckets at 3 replicas.")
	loader := config.NewLoader(cmd.Flags(), config.BridgeCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		if assets == "" && os.Getenv("KUBEBUILDER_ASSETS") == "" {
			assets = "bin"
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return err
		}
		if natsCluster < 1 || natsCluster > 5 {
			return fmt.Errorf("--nats-cluster: %d servers; 1 to 5 are possible", natsCluster)
		}
		start := time.Now()
		st, err := stack.Start(stack.Options{
			NATSCluster: natsCluster,
			AssetsDir:   assets,
			EtcdDataDir: filepath.Join(abs, "etcd"),
			NATS:        stack.NATSOptions{Port: natsPort, StoreDir: filepath.Join(abs, "nats")},
			// As deploy/default: the API server adds the finalizer to new
			// Students. Not when the bridge watches only some of them: the
			// others could then never be deleted.
			FinalizerPolicy: len(cfg.Namespaces) == 0 && cfg.LabelSelector == "",
		})
		if err != nil {
			return err
		}
		var stopOnce sync.Once
		stop := func() {
			stopOnce.Do(func() {
				if err := st.Stop(); err != nil {
					fmt.Fprintln(os.Stderr, "stop local stack:", err)
				}
			})
		}
		defer stop()

		kubeconfig := filepath.Join(abs, "kubeconfig")
		if err := writeKubeconfig(st.Env, kubeconfig); err != nil {
			return err
		}
		cfg.NATS.URLs = st.NATSURL()
		cfg.LeaderElection.Enabled = false
		if natsCluster > 1 {
			cfg.NATS.Stream.Replicas, cfg.Records.Replicas = min(natsCluster, 3), min(natsCluster, 3)
		}

		printBanner(cmd, kubeconfig, st.NATSURL(), time.Since(start))
		ctx, cancel := signalContext(stop)
		defer cancel()
		return bridge.Run(ctrl.LoggerInto(ctx, ctrl.Log), cfg, st.RestConfig)
	}
	return cmd
}

func writeKubeconfig(env *envtest.Environment, path string) error {
	user, err := env.AddUser(envtest.User{Name: "dev-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("create kubeconfig user: %w", err)
	}
	b, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("render kubeconfig: %w", err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

func printBanner(cmd *cobra.Command, kubeconfig, natsURL string, took time.Duration) {
	rel := kubeconfig
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, kubeconfig); err == nil {
			rel = r
		}
	}
	fmt.Fprintf(cmd.OutOrStdout(), `
student-bridge local stack is up (%s)
  kube-apiserver + etcd  kubeconfig: %[2]s
  NATS with JetStream    %[3]s   stream STUDENTS, subjects student.>

Try, in another terminal:
  export KUBECONFIG=%[2]s
  bin/kubectl create -f configs/samples/student-instance.yaml
  bin/kubectl get stu
  bin/kubectl edit stu object-name
  bin/kubectl delete stu object-name
  bin/kubectl describe stu object-name      # the Published events

Watch the events:
  bin/student-bridge tail --nats-url %[3]s
  nats sub --server %[3]s 'student.*'

Ctrl+C stops everything; state stays in the dev directory for the next run.

`, took.Round(100*time.Millisecond), rel, natsURL)
}
