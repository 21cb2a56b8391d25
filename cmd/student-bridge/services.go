package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natsconn"
	"github.com/student-bridge/student-bridge/internal/services"
)

func newServicesCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "services",
		Short: "Show per business service how far behind it is and how many Students it applied",
		Long: `services lists every business service (the expected ones, those with receipts,
and the stream's durable consumers): its consumer's lag (events pending, the
last stream sequence it acknowledged) and how many existing Students it has
applied in their latest published version (IN-SYNC), not yet (BEHIND), or
reported failing (FAILED). It reads the record store (state.bucket) and the
receipts bucket (receipts.bucket), so it needs a NATS user that may read both,
such as the bridge's.`,
		Example: `  student-bridge services
  student-bridge services --expected-services roster,billing`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long reading the buckets and the stream may take.")
	loader := config.NewServicesLoader(cmd.Flags())
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		cfg.NATS.MaxReconnects = 0
		nc, err := natsconn.Connect(cfg.NATS, ctrl.Log.WithName("nats"))
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
		defer cancel()
		rows, err := services.Report(ctx, nc, services.Options{Stream: cfg.NATS.Stream.Name, RecordsBucket: cfg.State.Bucket,
			ReceiptsBucket: cfg.Receipts.Bucket, Expected: cfg.Services.Expected})
		if err != nil {
			return err
		}
		return services.Print(cmd.OutOrStdout(), rows)
	}
	return cmd
}
