package contract

import (
	"embed"
	"io/fs"
	"path"
	"slices"
	"strings"

	studentv1 "github.com/student-bridge/student-bridge/api/v1"
)

// SchemaVersion is the major version of the contract's JSON Schemas. It
// goes up, with a new URI for every schema, on a change a consumer must
// follow (make test's compatibility gate refuses one without it).
const SchemaVersion = "v1"

// SchemaBase is where the schemas of every version are published: a
// schema's URI (its $id, and an event's dataschema) is
// SchemaBase + version + "/" + name + ".json".
const SchemaBase = "https://raw.githubusercontent.com/student-bridge/student-bridge/main/api/contract/schemas/"

// documents are the generated schemas and the AsyncAPI document (make
// generate: hack/contractdoc).
//
//go:embed schemas asyncapi.json
var documents embed.FS

// SchemaName names the schema of the data of an event of eventType, e.g.
// student-created.
func SchemaName(eventType string) string {
	return "student-" + studentv1.Operation(eventType)
}

// SchemaURI is the URI of the schema name of the current version.
func SchemaURI(name string) string {
	return SchemaBase + SchemaVersion + "/" + name + ".json"
}

// DataSchema is the dataschema of an event of eventType: its data's
// schema's URI.
func DataSchema(eventType string) string {
	return SchemaURI(SchemaName(eventType))
}

// Schema returns the JSON Schema (2020-12) named name, e.g. student-created
// or receipt, of the current version.
func Schema(name string) ([]byte, error) {
	return documents.ReadFile(path.Join("schemas", SchemaVersion, name+".json"))
}

// SchemaNames lists the schemas of the current version.
func SchemaNames() []string {
	entries, _ := fs.ReadDir(documents, path.Join("schemas", SchemaVersion))
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.Sort(names)
	return names
}

// AsyncAPI returns the contract's AsyncAPI 3.0 document (JSON): the
// subjects, the events in both encodings, the snapshot request and reply,
// the receipts and records buckets.
func AsyncAPI() []byte {
	b, _ := documents.ReadFile("asyncapi.json")
	return b
}
