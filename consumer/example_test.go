package consumer_test

import (
	"context"
	"encoding/json"
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

// A business service subscribes to student.* and decodes each message with
// cloudevents/sdk-go, whichever binding mode the bridge uses. handle is
// what it passes to nc.Subscribe("student.*", handle); here it is given a
// message as the bridge publishes it in binary mode (the CloudEvent's
// attributes in ce- headers, its data as the body).
func ExampleDecodeMsg() {
	handle := func(msg *nats.Msg) {
		ev, err := consumer.DecodeMsg(context.Background(), msg)
		if err != nil {
			log.Printf("not a CloudEvent: %v", err)
			return
		}
		var data studentv1.StudentEventData
		if err := json.Unmarshal(ev.Data(), &data); err != nil {
			log.Printf("event %s: %v", ev.ID(), err)
			return
		}
		// Dedupe on source+id; compare data.Spec with your actual state.
		fmt.Println(ev.Type(), ev.Subject(), data.Spec.Name, data.Spec.School)
	}

	handle(&nats.Msg{
		Subject: "student.updated",
		Header: nats.Header{
			"ce-specversion":     {"1.0"},
			"ce-id":              {"6eddb48ab4c2571ded8e08983f0845f8"},
			"ce-source":          {"/clusters/default/apis/example.k8s.io/v1/students"},
			"ce-type":            {"io.k8s.example.student.updated"},
			"ce-subject":         {"default/object-name"},
			"ce-time":            {"2026-12-05T16:20:33.508066042Z"},
			"ce-datacontenttype": {"application/json"},
			"ce-dataschema":      {"https://raw.githubusercontent.com/student-bridge/student-bridge/main/api/contract/schemas/v1/student-updated.json"},
		},
		Data: []byte(`{"metadata":{"namespace":"default","name":"object-name","uid":"2b6e4f0a-4c1d-4e8e-9a57-0c1f3f7d9b21","generation":2},` +
			`"spec":{"name":"wang","school":"tsinghua"},"previousSpec":{"name":"wang","school":"china"}}`),
	})
	// Output:
	// io.k8s.example.student.updated default/object-name wang tsinghua
}
