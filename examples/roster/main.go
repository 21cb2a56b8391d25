// Command roster is an example business service: it mirrors every Student
// into its own store (a map here; a database in a real service), prints
// each change it applies, and reports receipts, so that `kubectl get stu`
// shows whether it is in sync.
//
//	go run ./examples/roster --nats-url nats://127.0.0.1:4222
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/nats-io/nats.go"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
)

func main() {
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// roster is the service's own store: who attends which school.
type roster struct {
	mu       sync.Mutex
	students map[string]string // uid -> "namespace/name: school"
	out      io.Writer
}

// apply is the service's handler: it makes the store match the desired
// state. It is idempotent, as a Handler must be.
func (r *roster) apply(_ context.Context, c consumer.Change) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if c.New == nil {
		delete(r.students, c.UID)
		fmt.Fprintf(r.out, "removed  %s/%s\n", c.Namespace, c.Name)
		return nil
	}
	r.students[c.UID] = fmt.Sprintf("%s/%s: %s", c.Namespace, c.Name, c.New.Spec.School)
	verb := "enrolled"
	if c.Old != nil {
		verb = "updated "
	}
	fmt.Fprintf(r.out, "%s %s/%s at %s (generation %d)\n", verb, c.Namespace, c.Name, c.New.Spec.School, c.Generation)
	return nil
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("roster", flag.ContinueOnError)
	url := fs.String("nats-url", "nats://127.0.0.1:4222", "NATS server URL.")
	user := fs.String("nats-user", "", "NATS user (the service's own, e.g. roster).")
	password := fs.String("nats-password", os.Getenv("ROSTER_NATS_PASSWORD"), "NATS password (default $ROSTER_NATS_PASSWORD).")
	service := fs.String("service", "roster", "Service name: the durable consumer and the receipts' name.")
	stream := fs.String("stream", studentv1.DefaultStream, "The bridge's stream.")
	subjects := fs.String("subjects", studentv1.DefaultSubjects, "Subjects of the stream to read.")
	receipts := fs.String("receipts-bucket", "STUDENT_BRIDGE_RECEIPTS", "The receipts bucket.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts := []nats.Option{nats.Name(*service), nats.MaxReconnects(-1)}
	if *user != "" {
		opts = append(opts, nats.UserInfo(*user, *password))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	r := &roster{students: map[string]string{}, out: out}
	m, err := consumer.NewMirror(nc, consumer.MirrorOptions{
		Service: *service, Handler: r.apply, Stream: *stream, Subjects: *subjects, ReceiptsBucket: *receipts,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: mirroring Students from %s\n", *service, *stream)
	return m.Run(ctx)
}
