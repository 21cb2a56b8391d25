package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/student-bridge/student-bridge/internal/bridge"
	"github.com/student-bridge/student-bridge/internal/config"
)

func newReleaseCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "release-finalizers",
		Short: "Remove the bridge's finalizer from every Student, after the bridge is uninstalled",
		Long: `release-finalizers is the last step of uninstalling the bridge. Students carry
the finalizer example.k8s.io/student-bridge so that a deleted Student stays until
its deleted event is published; with no bridge left, such a Student could never
be deleted.

It waits until no bridge runs any more (the leader election Lease, or with
shards.count above 1 every shard and member Lease, is free, up to --wait),
removes the finalizer from every Student the bridge watched (namespaces,
labelSelector), and deletes the free Leases. Give it the bridge's
own configuration (--config, or the same flags and STUDENT_BRIDGE_* variables).
The Helm chart runs it as a post-delete hook. With kustomize, run it by hand
after deleting the bridge's Deployment and before "make undeploy", which
deletes the CRD and so waits on every Student still holding the finalizer
(docs/deploy.md). Students deleted while no bridge runs are still published as deleted by
the next bridge, from its record store, with the last state it published.`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().DurationVar(&wait, "wait", 2*time.Minute, "How long to wait for every bridge replica to stop (its Leases to be free) before giving up.")
	loader := config.NewLoader(cmd.Flags(), config.ReleaseCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, restCfg, err := loadWithKube(loader, *configFile)
		if err != nil {
			return err
		}
		ctx, cancel := signalContext(nil)
		defer cancel()
		n, err := bridge.ReleaseFinalizers(ctx, cfg, restCfg, wait)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "released %d Students\n", n)
		return nil
	}
	return cmd
}
