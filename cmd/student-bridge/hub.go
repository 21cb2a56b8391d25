package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/fleet"
)

func newHubCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var (
		h       fleet.Hub
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "hub",
		Short: "Set up a fleet's hub NATS: one stream of every cluster's events, one receipts bucket",
		Long: `hub connects to the hub NATS of a fleet (clusters whose NATS servers are leaf
nodes of it, each in the JetStream domain of its cluster's name; see
docs/fleet.md) and makes sure it has:

- the stream (--stream) that sources every cluster's stream (--source-stream)
  through the cluster's domain, each subject with the cluster after the prefix:
  student.created in cluster east is student.east.created on the hub;
- the receipts bucket (--receipts-bucket) where services on the hub report,
  under keys <cluster>.<service>.<uid>; each cluster's bridge (fleet.hubDomain)
  sources its own keys from it.

It creates what is missing and adds the clusters the stream does not source
yet; it never removes one. Run it again when a cluster joins. The NATS user
needs $JS.API.STREAM.CREATE/UPDATE/INFO of both and the leaf node connections
must let the domains' APIs through (see deploy/helm/examples).`,
		Example:      `  student-bridge hub --nats-url nats://hub:4222 --clusters east,west`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().StringSliceVar(&h.Clusters, "clusters", nil, "The fleet's clusters, comma separated: each its bridge's cluster setting and its NATS's JetStream domain.")
	cmd.Flags().StringVar(&h.Stream, "stream", studentv1.FleetStream, "The hub's stream of every cluster's events.")
	cmd.Flags().StringVar(&h.SourceStream, "source-stream", studentv1.DefaultStream, "Each cluster's stream (its bridge's nats.stream.name).")
	cmd.Flags().StringVar(&h.SubjectPrefix, "source-subject-prefix", studentv1.DefaultSubjectPrefix, "Each cluster's nats.subjectPrefix.")
	cmd.Flags().StringVar(&h.ReceiptsBucket, "receipts-bucket", studentv1.FleetReceiptsBucket, "The hub's receipts bucket (each cluster's fleet.receiptsBucket).")
	cmd.Flags().StringVar(&h.Storage, "storage", "file", "Storage of what is created: file or memory.")
	cmd.Flags().IntVar(&h.Replicas, "replicas", 1, "Replicas of what is created (3 on a three-node hub).")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long the set-up may take.")
	loader := config.NewLoader(cmd.Flags(), config.HubCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		if len(h.Clusters) == 0 {
			return errors.New("--clusters: name the fleet's clusters")
		}
		if h.Storage != "file" && h.Storage != "memory" {
			return fmt.Errorf("--storage %q: want file or memory", h.Storage)
		}
		nc, err := connectOnce(cfg)
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		added, err := fleet.EnsureHub(ctx, nc, h)
		if err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "stream %s sources %s from %s (added: %s); receipts bucket %s\n",
			h.Stream, h.SourceStream, strings.Join(h.Clusters, ", "), cmp.Or(strings.Join(added, ", "), "none"), h.ReceiptsBucket)
		return nil
	}
	return cmd
}
