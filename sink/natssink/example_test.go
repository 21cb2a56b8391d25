package natssink_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/nats-io/nats.go"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/sink/natssink"
)

// A business service subscribes to student.* and decodes each message with
// cloudevents/sdk-go, whichever binding mode the bridge uses.
func ExampleDecodeMsg() {
	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	_, err = nc.Subscribe("student.*", func(msg *nats.Msg) {
		ev, err := natssink.DecodeMsg(context.Background(), msg)
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
	})
	if err != nil {
		log.Fatal(err)
	}
	select {}
}
