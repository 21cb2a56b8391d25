package contractgen

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// natsBinding is the AsyncAPI NATS bindings' version.
const natsBinding = "0.1.0"

// eventTypes are the event types, in the order the document lists them.
var eventTypes = []string{studentv1.EventTypeCreated, studentv1.EventTypeUpdated, studentv1.EventTypeDeleted, studentv1.EventTypeSnapshot}

// AsyncAPI generates the contract's AsyncAPI 3.0 document from the api/v1
// source in dir: the subjects the bridge publishes on (and their form on
// a fleet's hub), each event in both encodings, the snapshot request and
// its reply, and the receipts and records buckets. Its schemas are the
// JSON Schemas of Schemas, under components.schemas; it is the bridge's
// side: send is what the bridge publishes, receive what it reads.
func AsyncAPI(dir, version, release string) ([]byte, error) {
	ts, err := parse(dir)
	if err != nil {
		return nil, err
	}
	schemas := Schema{}
	for _, root := range Roots {
		s, defs, err := rootSchema(ts, root, "#/components/schemas/")
		if err != nil {
			return nil, err
		}
		// Not as $id: a base URI would send the parser to fetch the
		// document's own references from there.
		s["externalDocs"] = Schema{"description": "The same schema as a JSON Schema 2020-12 document", "url": contract.SchemaBase + version + "/" + root.Name + ".json"}
		schemas[root.Name] = s
		for name, def := range defs {
			schemas[name] = def
		}
	}

	channels, operations, messages := Schema{}, Schema{}, Schema{}
	nats := Schema{"nats": Schema{"bindingVersion": natsBinding}}
	for _, eventType := range eventTypes {
		op, dataSchema := studentv1.Operation(eventType), contract.SchemaName(eventType)
		id := "student" + strings.ToUpper(op[:1]) + op[1:]
		schemas[id+"Event"] = cloudEvent(eventType, contract.SchemaBase+version+"/"+dataSchema+".json", dataSchema)
		messages[id+"Structured"] = Schema{
			"name":        id + "Structured",
			"title":       eventType + ", structured mode",
			"summary":     "The whole CloudEvent as JSON (nats.encoding: structured, the default).",
			"contentType": "application/cloudevents+json",
			"payload":     ref("schemas", id+"Event"),
		}
		messages[id+"Binary"] = Schema{
			"name":        id + "Binary",
			"title":       eventType + ", binary mode",
			"summary":     "The data as the body, the attributes as ce- headers (nats.encoding: binary).",
			"contentType": "application/json",
			"payload":     ref("schemas", dataSchema),
			"traits":      []any{ref("messageTraits", "cloudEventsBinary")},
		}
		msgs := Schema{"structured": ref("messages", id+"Structured"), "binary": ref("messages", id+"Binary")}
		channels[id] = Schema{
			"address":     studentv1.DefaultSubjectPrefix + "." + op,
			"description": "Every " + op + " Student, in the stream " + studentv1.DefaultStream + " (nats.subjectPrefix and nats.subjectLayout change the subject).",
			"messages":    msgs,
			"bindings":    nats,
		}
		channels[id+"OnHub"] = Schema{
			"address":     studentv1.DefaultSubjectPrefix + ".{cluster}." + op,
			"description": "The same events on a fleet's hub, in its stream STUDENTS_FLEET, which sources every cluster's stream (docs/fleet.md).",
			"parameters":  Schema{"cluster": ref("parameters", "cluster")},
			"messages":    msgs,
			"bindings":    nats,
		}
		operations["publish"+strings.ToUpper(op[:1])+op[1:]] = Schema{
			"action":   "send",
			"channel":  ref("channels", id),
			"summary":  "The bridge publishes every " + op + " Student; the stream keeps it for replay.",
			"messages": []any{ref("channels", id, "messages", "structured"), ref("channels", id, "messages", "binary")},
			"bindings": nats,
		}
	}
	schemas["cloudEventsBinaryHeaders"] = binaryHeaders()

	messages["snapshotRequest"] = Schema{"name": "snapshotRequest", "contentType": "application/json", "payload": ref("schemas", "snapshot-request")}
	messages["snapshotReply"] = Schema{"name": "snapshotReply", "contentType": "application/json", "payload": ref("schemas", "snapshot-reply")}
	messages["receipt"] = Schema{"name": "receipt", "contentType": "application/json", "payload": ref("schemas", "receipt")}
	messages["record"] = Schema{"name": "record", "contentType": "application/json", "payload": ref("schemas", "record")}
	channels["snapshotRequest"] = Schema{
		"address":     studentv1.DefaultSnapshotSubject,
		"description": "Requests for a snapshot (snapshot.requestSubject); on a fleet's hub " + studentv1.DefaultSnapshotSubject + ".<cluster>.",
		"messages":    Schema{"request": ref("messages", "snapshotRequest")},
		"bindings":    nats,
	}
	channels["snapshotReply"] = Schema{
		"address":     nil,
		"description": "The request's reply subject (a NATS inbox).",
		"messages":    Schema{"reply": ref("messages", "snapshotReply")},
		"bindings":    nats,
	}
	channels["receipts"] = Schema{
		"address":     "$KV." + studentv1.ReceiptsBucket + ".{service}.{uid}",
		"description": "The receipts bucket (receipts.bucket): services put a receipt under <service>.<uid>; on a fleet's hub the bucket is " + studentv1.FleetReceiptsBucket + " and the key <cluster>.<service>.<uid>.",
		"parameters":  Schema{"service": ref("parameters", "service"), "uid": ref("parameters", "uid")},
		"messages":    Schema{"receipt": ref("messages", "receipt")},
		"bindings":    nats,
	}
	channels["records"] = Schema{
		"address":     "$KV." + studentv1.DefaultRecordsBucket + ".{uid}",
		"description": "The record store (records.bucket): the last event published per Student, under its uid. The bridge's own; services read it, never write it.",
		"parameters":  Schema{"uid": ref("parameters", "uid")},
		"messages":    Schema{"record": ref("messages", "record")},
		"bindings":    nats,
	}
	operations["answerSnapshotRequest"] = Schema{
		"action":   "receive",
		"channel":  ref("channels", "snapshotRequest"),
		"summary":  "The leading bridge publishes a snapshot of the namespace asked for and replies once its events are acknowledged.",
		"reply":    Schema{"channel": ref("channels", "snapshotReply")},
		"bindings": nats,
	}
	operations["readReceipts"] = Schema{
		"action":   "receive",
		"channel":  ref("channels", "receipts"),
		"summary":  "The bridge shows what each service applied on the Student's status.",
		"bindings": nats,
	}
	operations["writeRecords"] = Schema{
		"action":   "send",
		"channel":  ref("channels", "records"),
		"summary":  "The bridge records each event it published.",
		"bindings": nats,
	}

	doc := Schema{
		"asyncapi": "3.0.0",
		"info": Schema{
			"title":       "student-bridge",
			"version":     release,
			"description": "Every change of a Student (example.k8s.io/v1) as a CloudEvent on NATS, kept in a JetStream stream for replay; receipts back from the services. docs/contract.md says it in prose.",
			"license":     Schema{"name": "Apache-2.0"},
		},
		"defaultContentType": "application/cloudevents+json",
		"servers": Schema{
			"nats": Schema{"host": "nats:4222", "protocol": "nats", "description": "The NATS the bridge publishes to (nats.urls)."},
		},
		"channels":   channels,
		"operations": operations,
		"components": Schema{
			"schemas":  schemas,
			"messages": messages,
			"messageTraits": Schema{
				"cloudEventsBinary": Schema{
					"summary": "CloudEvents binary mode over NATS: every attribute in a ce- header, data as the body.",
					"headers": ref("schemas", "cloudEventsBinaryHeaders"),
				},
			},
			"parameters": Schema{
				"cluster": Schema{"description": "The cluster's name (the bridge's cluster setting)."},
				"service": Schema{"description": "The service's name: letters, digits, '-' and '_'."},
				"uid":     Schema{"description": "The Student's uid."},
			},
		},
	}
	data, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// ref is a reference into the document's components or channels.
func ref(parts ...string) Schema {
	if parts[0] == "channels" {
		return Schema{"$ref": "#/" + strings.Join(parts, "/")}
	}
	return Schema{"$ref": "#/components/" + strings.Join(parts, "/")}
}

// cloudEvent is the schema of a structured-mode event of eventType whose
// data is dataSchema's.
func cloudEvent(eventType, dataSchemaURI, dataSchema string) Schema {
	props := attributes()
	props["type"] = Schema{"const": eventType}
	props["dataschema"] = Schema{"const": dataSchemaURI, "description": "The URI of the data's JSON Schema; a new one on an incompatible change."}
	props["datacontenttype"] = Schema{"const": "application/json"}
	props["data"] = ref("schemas", dataSchema)
	return Schema{
		"type":       "object",
		"title":      eventType + " as a structured CloudEvent",
		"required":   []string{"specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema", "data"},
		"properties": props,
	}
}

// attributes are the CloudEvent attributes of every event.
func attributes() Schema {
	return Schema{
		"specversion":                  Schema{"const": "1.0"},
		"id":                           Schema{"type": "string", "description": "Unique per change with source; the same when a change is published again (JetStream's Nats-Msg-Id)."},
		"source":                       Schema{"type": "string", "format": "uri-reference", "description": "/clusters/<cluster>/apis/example.k8s.io/v1/students"},
		"type":                         Schema{"type": "string"},
		"subject":                      Schema{"type": "string", "description": "<namespace>/<name> of the Student."},
		"time":                         Schema{"type": "string", "format": "date-time"},
		"dataschema":                   Schema{"type": "string", "format": "uri"},
		studentv1.ExtensionSequence:    Schema{"type": "string", "description": "The event's place among its Student's events (CloudEvents sequence extension), 1 for the first; none on a snapshot of a Student never published."},
		studentv1.ExtensionPreviousID:  Schema{"type": "string", "description": "The id of the Student's event before this one."},
		studentv1.ExtensionTraceParent: Schema{"type": "string", "description": "W3C trace context of the change, when traced."},
		studentv1.ExtensionTraceState:  Schema{"type": "string"},
	}
}

// binaryHeaders is the schema of a binary-mode event's headers.
func binaryHeaders() Schema {
	props := Schema{}
	attrs := attributes()
	attrs["datacontenttype"] = Schema{"const": "application/json"}
	for _, name := range slices.Sorted(maps.Keys(attrs)) {
		s := attrs[name].(Schema)
		if _, isConst := s["const"]; !isConst {
			s = Schema{"type": "string", "description": s["description"]}
			if s["description"] == nil {
				delete(s, "description")
			}
		}
		props["ce-"+name] = s
	}
	props["traceparent"] = Schema{"type": "string", "description": "The trace context again as a plain header, for NATS-level tools."}
	return Schema{
		"type":       "object",
		"properties": props,
		"required":   []string{"ce-specversion", "ce-id", "ce-source", "ce-type", "ce-subject", "ce-time", "ce-datacontenttype", "ce-dataschema"},
	}
}
