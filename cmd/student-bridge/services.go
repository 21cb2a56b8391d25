package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/services"
)

func newServicesCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var (
		timeout time.Duration
		cluster string
	)
	cmd := &cobra.Command{
		Use:   "services",
		Short: "Show per business service how far behind it is and how many Students it applied",
		Long: `services lists every business service (the expected ones, those with receipts,
and the stream's durable consumers): its consumer's lag (events pending, the
last stream sequence it acknowledged) and how many existing Students it has
applied in their latest published version (IN-SYNC), not yet (BEHIND), or
reported failing (FAILED). It reads the record store (records.bucket) and the
receipts bucket (receipts.bucket), so it needs a NATS user that may read both,
such as the bridge's.

On a fleet's hub (docs/fleet.md), --cluster counts one cluster's Students:
its record store is read through the cluster's JetStream domain, the
receipts and the consumers are the hub's (STUDENT_FLEET_RECEIPTS and
STUDENTS_FLEET unless receipts.bucket and nats.stream.name say otherwise).`,
		Example: `  student-bridge services
  student-bridge services --expected-services roster,billing
  student-bridge services --nats-url nats://hub:4222 --cluster east`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long reading the buckets and the stream may take.")
	cmd.Flags().StringVar(&cluster, "cluster", "", "On a fleet's hub: the cluster whose Students are counted.")
	loader := config.NewLoader(cmd.Flags(), config.ServicesCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		nc, err := connectOnce(cfg)
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		o := services.Options{Stream: cfg.NATS.Stream.Name, RecordsBucket: cfg.Records.Bucket,
			ReceiptsBucket: cfg.Receipts.Bucket, Expected: cfg.Services.Expected, Cluster: cluster}
		if cluster != "" {
			if err := checkClusterFlag(cluster); err != nil {
				return err
			}
			if o.Stream == studentv1.DefaultStream {
				o.Stream = studentv1.FleetStream
			}
			if o.ReceiptsBucket == studentv1.ReceiptsBucket {
				o.ReceiptsBucket = studentv1.FleetReceiptsBucket
			}
		}
		rows, err := services.Report(ctx, nc, o)
		if err != nil {
			return err
		}
		return services.Print(cmd.OutOrStdout(), rows)
	}
	return cmd
}
