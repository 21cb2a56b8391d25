package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
)

func newSnapshotCommand(setupLog func(), configFile *string) *cobra.Command {
	var (
		namespace string
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Ask the running bridge to publish a snapshot of every Student",
		Long: `snapshot asks the leading bridge, over NATS (snapshot.requestSubject), to publish
one io.k8s.example.student.snapshot event per current Student on student.snapshot,
and prints how many it published. A consumer that starts from nothing reads the
snapshot and then applies the change events that follow it.

The same request works without this command:
  nats req student-bridge.snapshot '{"namespace":"default"}'`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "Only Students of this namespace; default all.")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "How long to wait for the bridge's answer.")
	loader := config.NewSnapshotClient(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog()
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		if cfg.Snapshot.RequestSubject == "" {
			return errors.New("config key snapshot.requestSubject is empty: snapshot requests are disabled")
		}
		cfg.NATS.MaxReconnects = 0
		nc, err := bridge.ConnectNATS(cfg.NATS, ctrl.Log.WithName("nats"))
		if err != nil {
			return err
		}
		defer nc.Close()
		body, _ := json.Marshal(bridge.SnapshotRequest{Namespace: namespace})
		msg, err := nc.Request(cfg.Snapshot.RequestSubject, body, timeout)
		if err != nil {
			return fmt.Errorf("snapshot request on %s (is a bridge with snapshot requests enabled running and leading?): %w", cfg.Snapshot.RequestSubject, err)
		}
		var reply bridge.SnapshotReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			return fmt.Errorf("snapshot reply %q: %w", msg.Data, err)
		}
		if reply.Error != "" {
			return fmt.Errorf("snapshot %s: published %d, then: %s", reply.Run, reply.Published, reply.Error)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s: published %d Students\n", reply.Run, reply.Published)
		return nil
	}
	return cmd
}
