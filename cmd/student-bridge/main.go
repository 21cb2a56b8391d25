// Command student-bridge publishes every change of a Student custom resource
// as a CloudEvent on NATS and as a Kubernetes Event on the Student.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natsconn"
)

func main() {
	// Commands return their errors without printing them (SilenceErrors):
	// printed here, once.
	if err := newRootCommand().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		var coded *codedError
		if errors.As(err, &coded) {
			os.Exit(coded.code)
		}
		os.Exit(1)
	}
}

// codedError is an error a command exits with a status of its own for.
type codedError struct {
	code int
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func exitError(code int, err error) error { return &codedError{code: code, err: err} }

// signalContext is cancelled on the first SIGINT or SIGTERM. A second one
// runs beforeExit (if set, to stop child processes) and exits at once.
func signalContext(beforeExit func()) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ch
		cancel()
		<-ch
		fmt.Fprintln(os.Stderr, "second signal: exiting without waiting for in-flight publishes")
		if beforeExit != nil {
			beforeExit()
		}
		os.Exit(1)
	}()
	return ctx, cancel
}

// logSetup installs the logger once flags are parsed. console asks for
// lines a person reads in a terminal (the commands people type); the bridge
// itself logs JSON for log collectors. --zap-encoder wins either way.
type logSetup func(console bool)

// addLogFlags registers the zap logging flags (--zap-log-level,
// --zap-encoder, ...) and returns the logSetup that applies them.
func addLogFlags(fs *pflag.FlagSet) logSetup {
	opts := zap.Options{Development: false}
	gfs := flag.NewFlagSet("log", flag.ContinueOnError)
	opts.BindFlags(gfs)
	fs.AddGoFlagSet(gfs)
	return func(console bool) {
		if console && opts.NewEncoder == nil {
			zap.ConsoleEncoder()(&opts)
		}
		ctrl.SetLogger(newLazyValues(zap.New(zap.UseFlagOptions(&opts))))
	}
}

func newRootCommand() *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "student-bridge",
		Short: "Publish every Student change as a CloudEvent on NATS and a Kubernetes Event",
		Long: `student-bridge watches Students (example.k8s.io/v1, short name stu) and
publishes every create, update and delete as a CloudEvent on NATS subjects
student.created, student.updated and student.deleted (subscribe to student.*),
stored in a JetStream stream for replay, and records a Kubernetes Event on the
Student.

Configuration comes from defaults, the --config file, STUDENT_BRIDGE_* environment
variables and flags, each overriding the one before. Every key, its default and
its environment variable are listed in configs/student-bridge.yaml.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Args:          cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&configFile, "config", "", "Path to a YAML config file (see configs/student-bridge.yaml).")
	loader := config.NewLoader(cmd.Flags(), config.BridgeCommand)
	setupLog := addLogFlags(cmd.PersistentFlags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(false)
		cfg, restCfg, err := loadWithKube(loader, configFile)
		if err != nil {
			return err
		}
		bridge.SetMemoryLimit(ctrl.Log.WithName("bridge"))
		ctx, cancel := signalContext(nil)
		defer cancel()
		return bridge.Run(ctx, cfg, restCfg)
	}
	cmd.AddCommand(newTailCommand(setupLog, &configFile), newSnapshotCommand(setupLog, &configFile), newReleaseCommand(setupLog, &configFile), newServicesCommand(setupLog, &configFile), newVerifyCommand(setupLog, &configFile), newHubCommand(setupLog, &configFile), newContractCommand(), newVersionCommand())
	if dev := newDevCommand(setupLog, &configFile); dev != nil {
		cmd.AddCommand(dev)
	}
	return cmd
}

// loadWithKube loads the configuration and the Kubernetes client
// configuration it names.
func loadWithKube(loader *config.Loader, file string) (*config.Config, *rest.Config, error) {
	cfg, err := loader.Load(file)
	if err != nil {
		return nil, nil, err
	}
	restCfg, err := restConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	return cfg, restCfg, nil
}

// restConfig keeps the tutorial's --kubeconfig and --master flags; without
// them it uses KUBECONFIG, ~/.kube/config or the in-cluster config.
func restConfig(cfg *config.Config) (*rest.Config, error) {
	if cfg.Kubeconfig == "" && cfg.Master == "" {
		c, err := ctrl.GetConfig()
		if err != nil {
			return nil, fmt.Errorf("kubernetes config (set --kubeconfig or KUBECONFIG): %w", err)
		}
		return c, nil
	}
	c, err := clientcmd.BuildConfigFromFlags(cfg.Master, cfg.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubernetes config from --kubeconfig %q --master %q: %w", cfg.Kubeconfig, cfg.Master, err)
	}
	return c, nil
}

// connectOnce connects a command to NATS: one attempt per URL, no
// reconnecting, so a NATS that is not there is an error at once.
func connectOnce(cfg *config.Config) (*nats.Conn, error) {
	cfg.NATS.MaxReconnects = 0
	return natsconn.Connect(cfg.NATS, ctrl.Log.WithName("nats"))
}

// checkClusterFlag refuses a --cluster value that cannot name a cluster.
func checkClusterFlag(cluster string) error {
	if !studentv1.ValidClusterName(cluster) {
		return fmt.Errorf("--cluster %q: not a cluster name (letters, digits, '-', '_')", cluster)
	}
	return nil
}
