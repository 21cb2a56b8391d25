package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
)

func newSnapshotCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var (
		namespace string
		cluster   string
		timeout   time.Duration
	)
	cmd := &cobra.Command{
		Use:   "snapshot",
		Short: "Ask the running bridge to publish a snapshot of every Student",
		Long: `snapshot asks the leading bridge, over NATS (snapshot.requestSubject), to publish
one io.k8s.example.student.snapshot event per current Student on student.snapshot,
and prints how many it published. A consumer that starts from nothing reads the
snapshot and then applies the change events that follow it. A request during a
snapshot, or within snapshot.minInterval of one whose events the stream still
holds, is answered by that one (docs/consuming.md).

From a fleet's hub (docs/fleet.md), --cluster asks that cluster's bridge (on
<snapshot.requestSubject>.<cluster>); its events reach the hub's stream as
every other event of the cluster does.

The same request works without this command:
  nats req student-bridge.snapshot '{"namespace":"default"}'`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "Only Students of this namespace; default all.")
	cmd.Flags().StringVar(&cluster, "cluster", "", "From a fleet's hub: the cluster whose bridge publishes the snapshot.")
	cmd.Flags().DurationVar(&timeout, "timeout", time.Minute, "How long to wait for the bridge's answer.")
	loader := config.NewLoader(cmd.Flags(), config.SnapshotCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		if cfg.Snapshot.RequestSubject == "" {
			return errors.New("config key snapshot.requestSubject is empty: snapshot requests are disabled")
		}
		nc, err := connectOnce(cfg)
		if err != nil {
			return err
		}
		defer nc.Close()
		subject := cfg.Snapshot.RequestSubject
		if cluster != "" {
			if err := checkClusterFlag(cluster); err != nil {
				return err
			}
			subject += "." + cluster
		}
		body, _ := json.Marshal(studentv1.SnapshotRequest{Namespace: namespace})
		msg, err := nc.Request(subject, body, timeout)
		if err != nil {
			return fmt.Errorf("snapshot request on %s (is a bridge with snapshot requests enabled running and leading?): %w", subject, err)
		}
		var reply studentv1.SnapshotReply
		if err := json.Unmarshal(msg.Data, &reply); err != nil {
			return fmt.Errorf("snapshot reply %q: %w", msg.Data, err)
		}
		if reply.Error != "" {
			return fmt.Errorf("snapshot %s: published %d, then: %s", reply.Run, reply.Published, reply.Error)
		}
		if reply.Coalesced {
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s (published %d Students from stream sequence %d, ended %s) answers this request; the next may start at %s\n",
				reply.Run, reply.Published, reply.FirstSequence, reply.Ended, reply.NextRun)
		} else {
			fmt.Fprintf(cmd.OutOrStdout(), "snapshot %s: published %d Students\n", reply.Run, reply.Published)
		}
		if cluster != "" && reply.Cluster != cluster {
			return fmt.Errorf("snapshot %s was published by the bridge of cluster %q, not %q", reply.Run, reply.Cluster, cluster)
		}
		return nil
	}
	return cmd
}
