package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/scheme"
	"github.com/student-bridge/student-bridge/internal/verify"
)

// Exit statuses of verify.
const (
	exitDrift      = 1
	exitCannotRead = 2
)

func newVerifyCommand(setupLog logSetup, configFile *string) *cobra.Command {
	var (
		o       verify.Options
		output  string
		timeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check that the stream tells the truth about every Student",
		Long: `verify reads the bridge's record store (records.bucket), the Students of the watched
scope (namespaces, labelSelector) from the API server and every event of the
stream (nats.stream.name) of this cluster (cluster), and reports where they
disagree:

  missing       a Student with no event, or whose last event does not carry its
                current spec, labels and generation
  lost delete   no Student has the uid, and its last event is not deleted
  stale record  the record store names another last event than the stream
  duplicate     one event id more than once in the stream
  gap           a Student's sequence skips a number: an event is not in the stream
  out of order  an older generation after a newer one, or a change after deleted
  foreign       a message on the stream the bridge did not publish (not a
                Student CloudEvent, or an id the bridge would not give it)
  unknown       a Student with no event while older events left the stream
                (not drift, unless --strict)

Findings are checked again after --settle, so changes in flight are not
reported. It writes nothing anywhere.

Exit status: 0 when they agree, 1 when there is drift (the findings are
printed), 2 when a source cannot be read.

NATS permissions: $JS.API.STREAM.INFO on the stream and the record store's
stream (KV_<records.bucket>), $JS.API.CONSUMER.CREATE and .DELETE on both
(ordered consumers), $JS.API.CONSUMER.MSG.NEXT, and subscribe on _INBOX.>:
the bridge's user and deploy/nats's consumer user have them. Kubernetes: list
on students.example.k8s.io.`,
		Example: `  student-bridge verify
  student-bridge verify --settle 1m -o json | jq '.findings[] | select(.kind == "missing")'`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	cmd.Flags().DurationVar(&o.Settle, "settle", 30*time.Second, "Check findings again after this long and report only those still there (0: report the first reading).")
	cmd.Flags().BoolVar(&o.Strict, "strict", false, "Report a Student with no event as missing even when older events have left the stream.")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "Output: text (a line per finding) or json (the whole report).")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "How long reading all three sources may take, twice with --settle.")
	loader := config.NewLoader(cmd.Flags(), config.VerifyCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		if output != "text" && output != "json" {
			return fmt.Errorf("--output %q: use text or json", output)
		}
		cfg, restCfg, err := loadWithKube(loader, *configFile)
		if err != nil {
			return err
		}
		selector, _ := labels.Parse(cfg.LabelSelector) // validated by Load
		kube, err := client.New(restCfg, client.Options{Scheme: scheme.New()})
		if err != nil {
			return exitError(exitCannotRead, fmt.Errorf("kubernetes client: %w", err))
		}
		nc, err := connectOnce(cfg)
		if err != nil {
			return exitError(exitCannotRead, err)
		}
		defer nc.Close()
		ctx, cancel := signalContext(nil)
		defer cancel()
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
		r, err := verify.Verify(ctx, verify.Source{NATS: nc, Stream: cfg.NATS.Stream.Name, Bucket: cfg.Records.Bucket, Kube: kube,
			Namespaces: cfg.Namespaces, Selector: selector, Cluster: cfg.Cluster, Progress: cmd.ErrOrStderr()}, o)
		if err != nil {
			return exitError(exitCannotRead, err)
		}
		if output == "json" {
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			err = enc.Encode(r)
		} else {
			err = verify.Print(cmd.OutOrStdout(), r)
		}
		if err != nil {
			return err
		}
		if drift := len(r.Drift()); drift > 0 {
			return exitError(exitDrift, fmt.Errorf("%d finding(s): the stream does not tell the truth about every Student", drift))
		}
		return nil
	}
	return cmd
}
