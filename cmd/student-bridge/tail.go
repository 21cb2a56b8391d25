package main

import (
	"time"

	"github.com/spf13/cobra"
	ctrl "sigs.k8s.io/controller-runtime"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/config"
	"github.com/student-bridge/student-bridge/internal/natsconn"
	"github.com/student-bridge/student-bridge/internal/tail"
)

func newTailCommand(setupLog logSetup, configFile *string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Print Student events from the JetStream stream, live or replayed",
		Long: `tail reads the Student CloudEvents the bridge published to the JetStream stream
and prints one line per event (time, stream sequence, operation, namespace/name,
generation, and on updates what changed), or with -o json one CloudEvent JSON
object per line, for piping into other tools.

Replay: --deliver all (the whole stream), last (the last event of every Student,
then new ones), since (--since 1h or an RFC 3339 time), sequence (--from-sequence N),
or new (default). With --durable NAME a restarted tail resumes after the last event
it printed. --follow=false exits once the stream is read to its end.

Every flag can also be set in the config file's tail: section or by environment
(STUDENT_BRIDGE_TAIL_*), like the bridge's own settings.`,
		Example: `  student-bridge tail
  student-bridge tail --deliver all --follow=false -o json | jq .data.spec
  student-bridge tail --deliver last --durable billing
  student-bridge tail --nats-url nats://hub:4222 --cluster east   # on a fleet's hub`,
		SilenceUsage: true,
		Args:         cobra.NoArgs,
	}
	loader := config.NewLoader(cmd.Flags(), config.TailCommand)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		setupLog(true)
		cfg, err := loader.Load(*configFile)
		if err != nil {
			return err
		}
		o := tail.Options{
			Stream:       cfg.NATS.Stream.Name,
			Subjects:     cfg.Tail.Subjects,
			Deliver:      cfg.Tail.Deliver,
			FromSequence: cfg.Tail.FromSequence,
			Durable:      cfg.Tail.Durable,
			Follow:       cfg.Tail.Follow,
			JSON:         cfg.Tail.Output == "json",
			Out:          cmd.OutOrStdout(),
		}
		switch {
		case cfg.Tail.Cluster != "":
			if o.Stream == studentv1.DefaultStream {
				o.Stream = studentv1.FleetStream
			}
			o.Subjects = []string{studentv1.FleetSubjects(cfg.NATS.SubjectPrefix, cfg.Tail.Cluster)}
		case len(o.Subjects) == 0:
			o.Subjects = []string{cfg.NATS.SubjectPrefix + ".>"}
		}
		if cfg.Tail.Since != "" {
			o.Since, _ = config.SinceTime(cfg.Tail.Since, time.Now()) // validated by Load
		}
		nc, err := natsconn.Connect(cfg.NATS, ctrl.Log.WithName("nats"))
		if err != nil {
			return err
		}
		defer nc.Close()
		ctx, cancel := signalContext(nil)
		defer cancel()
		return tail.Run(ctx, nc, o)
	}
	return cmd
}
