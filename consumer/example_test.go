package consumer_test

import (
	"context"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/consumer"
)

// A service keeps its own store in step with the Students; each change it
// applies is reported, and `kubectl get stu` shows it in the IN-SYNC
// column. examples/roster is the same as a program.
func ExampleMirror() {
	nc, err := nats.Connect("nats://127.0.0.1:4222", nats.UserInfo("billing", "secret"))
	if err != nil {
		log.Fatal(err)
	}
	accounts := map[string]string{} // the service's actual state, by Student uid
	m, err := consumer.NewMirror(nc, consumer.MirrorOptions{
		Service: "billing",
		Handler: func(ctx context.Context, c consumer.Change) error {
			if c.New == nil {
				delete(accounts, c.UID) // deleted
				return nil
			}
			accounts[c.UID] = c.New.Spec.School // created or changed; an error is retried
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	log.Fatal(m.Run(context.Background()))
}

// A service that applies changes its own way reports by hand.
func ExampleReporter() {
	ctx := context.Background()
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	rep, err := consumer.NewReporter(ctx, nc, "billing", "")
	if err != nil {
		log.Fatal(err)
	}
	err = rep.Report(ctx, studentv1.Receipt{UID: "6c5b…", Namespace: "default", Name: "object-name",
		EventID: "the CloudEvent id", Generation: 2, Result: studentv1.ResultFailed, Message: "account locked"})
	fmt.Println(err)
}
