package contractgen

import (
	"bytes"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/student-bridge/student-bridge/api/contract"
	studentv1 "github.com/student-bridge/student-bridge/api/v1"
	"github.com/student-bridge/student-bridge/internal/stack"
	"github.com/student-bridge/student-bridge/internal/stacktest"
)

// base is a schema as Schemas writes one: required a and nested.c, an
// optional integer b, an enum e, a map m.
const base = `{
  "$defs": {"Nested": {"type": "object", "properties": {"c": {"type": "string"}, "d": {"type": "string"}}, "required": ["c"]}},
  "type": "object",
  "properties": {
    "a": {"type": "string"},
    "b": {"type": "integer"},
    "e": {"type": "string", "enum": ["x", "y"]},
    "nested": {"allOf": [{"$ref": "#/$defs/Nested"}], "description": "n"},
    "m": {"type": "object", "additionalProperties": {"type": "string"}}
  },
  "required": ["a", "nested"]
}`

// edit returns base changed by f.
func edit(t *testing.T, f func(s Schema)) []byte {
	t.Helper()
	var s Schema
	if err := json.Unmarshal([]byte(base), &s); err != nil {
		t.Fatal(err)
	}
	f(s)
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func props(s Schema) Schema { return s["properties"].(map[string]any) }
func nested(s Schema) Schema {
	return s["$defs"].(map[string]any)["Nested"].(map[string]any)
}

// TestCompare: the gate finds each kind of breaking change, wherever it
// is (a nested type through its $ref, a map's values), and passes the
// additive ones.
func TestCompare(t *testing.T) {
	cases := []struct {
		name string
		edit func(s Schema)
		want []string // Break.String()s, in order
	}{
		{"a field renamed", func(s Schema) {
			props(s)["a2"] = props(s)["a"]
			delete(props(s), "a")
			s["required"] = []any{"a2", "nested"}
		}, []string{"t: newly required at a2: a consumer's old messages may lack it", "t: removed at a: the field is gone"}},
		{"a nested field removed", func(s Schema) { delete(props(nested(s)), "d") }, []string{"t: removed at nested.d: the field is gone"}},
		{"a type changed", func(s Schema) { props(s)["b"] = Schema{"type": "string"} }, []string{"t: type changed at b: string, was integer"}},
		{"a map's values changed", func(s Schema) {
			props(s)["m"] = Schema{"type": "object", "additionalProperties": Schema{"type": "integer"}}
		},
			[]string{"t: type changed at m.[additionalProperties]: integer, was string"}},
		{"a field newly required", func(s Schema) { nested(s)["required"] = []any{"c", "d"} }, []string{"t: newly required at nested.d: a consumer's old messages may lack it"}},
		{"an enum value removed", func(s Schema) { props(s)["e"].(map[string]any)["enum"] = []any{"x"} }, []string{"t: enum value removed at e: y"}},
		{"values newly limited", func(s Schema) { props(s)["a"].(map[string]any)["enum"] = []any{"x"} }, []string{"t: enum value removed at a: values are now limited to [x]"}},
		{"additions", func(s Schema) {
			props(s)["f"] = Schema{"type": "string"}
			props(nested(s))["g"] = Schema{"type": "boolean"}
			props(s)["e"].(map[string]any)["enum"] = []any{"x", "y", "z"}
			props(s)["a"].(map[string]any)["description"] = "now described"
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			breaks, err := Compare(map[string][]byte{"v1/t.json": []byte(base)}, map[string][]byte{"v1/t.json": edit(t, tc.edit)})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, b := range breaks {
				got = append(got, b.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("breaks\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
	breaks, err := Compare(map[string][]byte{"v1/t.json": []byte(base)}, map[string][]byte{"v1/u.json": []byte(base)})
	if err != nil || len(breaks) != 1 || breaks[0].Kind != "removed" {
		t.Errorf("a schema gone: %v, %v", breaks, err)
	}
}

// TestCompareSeesEveryField: in each schema the bridge publishes, a
// changed type of any field at any depth (a Student's metadata.labels'
// values, three levels below an event's root, through a $ref) is a break
// at that field's path.
func TestCompareSeesEveryField(t *testing.T) {
	current, err := Schemas(filepath.Join(stack.RepoRoot(), "api", "v1"), contract.SchemaVersion)
	if err != nil {
		t.Fatal(err)
	}
	deepest := 0
	for file, data := range current {
		var doc Schema
		if err := json.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		var walk func(at string, s Schema, depth int)
		walk = func(at string, s Schema, depth int) {
			s = resolve(s, doc)
			if depth > 8 || s == nil {
				return // a recursive type: far enough
			}
			if typ, ok := s["type"].(string); ok {
				other := "boolean"
				if typ == other {
					other = "string"
				}
				s["type"] = other
				changed, err := json.Marshal(doc)
				s["type"] = typ
				if err != nil {
					t.Fatal(err)
				}
				breaks, err := Compare(map[string][]byte{file: data}, map[string][]byte{file: changed})
				if err != nil {
					t.Fatal(err)
				}
				want := Break{Schema: schemaName(file), Path: at, Kind: "type changed", Detail: other + ", was " + typ}
				if at == "" {
					want.Path = "(root)"
				}
				if !slices.Contains(breaks, want) {
					t.Errorf("%s: %s changed from %s to %s; the gate found %v", file, want.Path, typ, other, breaks)
				}
				deepest = max(deepest, depth)
			}
			props, _ := s["properties"].(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(props)) {
				p, _ := props[name].(map[string]any)
				walk(join(at, name), p, depth+1)
			}
			for _, key := range []string{"items", "additionalProperties"} {
				if sub, ok := s[key].(map[string]any); ok {
					walk(join(at, "["+key+"]"), sub, depth+1)
				}
			}
		}
		walk("", doc, 0)
	}
	if deepest < 3 {
		t.Errorf("the deepest typed field is %d levels below a root, want metadata.labels' values (3) among them", deepest)
	}
}

// TestGateAgainstThePreviousRelease is the compatibility gate: the
// schemas generated from the previous release's api/v1 source (from git
// history) against today's. A break passes only when the schemas' version
// went up and docs/contract.md says what a consumer must change.
func TestGateAgainstThePreviousRelease(t *testing.T) {
	root := stack.RepoRoot()
	script, err := os.ReadFile(filepath.Join(root, "hack", "previous-release.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^PREVIOUS=([0-9a-f]{40})$`).FindSubmatch(script)
	if m == nil {
		t.Fatal("hack/previous-release.sh names no PREVIOUS commit")
	}
	previous := string(m[1])
	src := t.TempDir()
	stacktest.Archive(t, root, previous, src, "api/v1")
	// The previous release's version: the schemas' URIs were its.
	const previousVersion = "v1"
	old, err := schemas(filepath.Join(src, "api", "v1"), previousVersion, true)
	if err != nil {
		t.Fatalf("schemas of %s: %v", previous, err)
	}
	now, err := Schemas(filepath.Join(root, "api", "v1"), contract.SchemaVersion)
	if err != nil {
		t.Fatal(err)
	}
	breaks, err := Compare(old, now)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d schemas of %s against %d of today: %d breaking changes", len(old), previous[:12], len(now), len(breaks))
	if len(old) == 0 {
		t.Fatalf("the previous release's source gave no schema")
	}
	if len(breaks) == 0 {
		return
	}
	docs, err := os.ReadFile(filepath.Join(root, "docs", "contract.md"))
	if err != nil {
		t.Fatal(err)
	}
	if contract.SchemaVersion != previousVersion && strings.Contains(string(docs), "schemas/"+contract.SchemaVersion+"/") {
		t.Logf("breaking changes since %s, under the new schema version %s that docs/contract.md describes: %v", previous[:12], contract.SchemaVersion, breaks)
		return
	}
	for _, b := range breaks {
		t.Errorf("a breaking change since the previous release (%s): %s", previous[:12], b)
	}
	t.Errorf("a consumer written against the previous release breaks: keep the change additive, or raise contract.SchemaVersion (new URIs) and say in docs/contract.md what a consumer must change")
}

// TestSchemasAreTheCommittedOnes: what the bridge embeds and prints is
// what the source generates (make verify-gen says so too, for the files).
func TestSchemasAreTheCommittedOnes(t *testing.T) {
	root := stack.RepoRoot()
	gen, err := Schemas(filepath.Join(root, "api", "v1"), contract.SchemaVersion)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(contract.SchemaNames()); got != len(gen) {
		t.Errorf("api/contract embeds %d schemas, the source gives %d", got, len(gen))
	}
	for file, want := range gen {
		got, err := contract.Schema(schemaName(file))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("embedded schema %s is stale (make generate): %v", file, err)
		}
	}
}

// TestAsyncAPIValidates parses the AsyncAPI document with the AsyncAPI
// project's own parser (@asyncapi/parser, from the npm registry into
// bin/npm), which resolves every $ref and applies the AsyncAPI 3.0 schema
// and its rules.
func TestAsyncAPIValidates(t *testing.T) {
	npm, err := exec.LookPath("npm")
	if err != nil {
		// CI's machine comes with Node.js and npm: there a missing npm is
		// a failure, not a check quietly left out.
		if os.Getenv("CI") == "true" {
			t.Fatal("npm is not installed (CI=true): the AsyncAPI document cannot be validated")
		}
		t.Skip("npm is not installed: the AsyncAPI document is not validated")
	}
	root := stack.RepoRoot()
	dir := filepath.Join(root, "bin", "npm", "asyncapi-parser")
	const parser = "@asyncapi/parser@3.6.6"
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@asyncapi", "parser", "package.json")); err != nil {
		install := exec.Command(npm, "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", dir, parser)
		if out, err := install.CombinedOutput(); err != nil {
			t.Fatalf("npm install %s: %v\n%s", parser, err, out)
		}
	}
	doc := filepath.Join(t.TempDir(), "asyncapi.json")
	if err := os.WriteFile(doc, contract.AsyncAPI(), 0o644); err != nil {
		t.Fatal(err)
	}
	script, err := filepath.Abs("testdata/validate-asyncapi.cjs")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", script, doc)
	cmd.Env = append(os.Environ(), "NODE_PATH="+filepath.Join(dir, "node_modules"))
	out, err := cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("the AsyncAPI document does not validate: %v", err)
	}
}

// TestGoValuesValidate: what the Go types encode validates against their
// schemas (santhosh-tekuri/jsonschema), every field set and every
// optional one left out; a value missing what the schema requires does
// not.
func TestGoValuesValidate(t *testing.T) {
	at := metav1.NewTime(time.Date(2026, 12, 3, 1, 0, 0, 0, time.UTC))
	spec := studentv1.StudentSpec{Name: "wang", School: "china"}
	stu := &studentv1.Student{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "wang", UID: "u1", Generation: 2, ResourceVersion: "7", Labels: map[string]string{"grade": "3"}}, Spec: spec}
	values := map[string][]any{
		"receipt": {
			studentv1.Receipt{Service: "roster", UID: "u1", Cluster: "east", Namespace: "default", Name: "wang", EventID: "e1", Generation: 2, Result: studentv1.ResultFailed, Message: "no", Time: at, TraceID: "t"},
			studentv1.Receipt{Service: "roster", UID: "u1", Namespace: "default", Name: "wang", EventID: "e1", Generation: 2, Result: studentv1.ResultApplied, Time: at},
		},
		"snapshot-request": {studentv1.SnapshotRequest{}, studentv1.SnapshotRequest{Namespace: "default"}},
		"snapshot-reply": {
			studentv1.SnapshotReply{Run: "r", Published: 3},
			studentv1.SnapshotReply{Run: "r", Cluster: "east", Published: 3, Coalesced: true, FirstSequence: 9, Ended: at.Format(time.RFC3339), NextRun: at.Format(time.RFC3339), Error: "x"},
		},
		"record": {
			studentv1.StudentRecord{Namespace: "default", Name: "wang", UID: "u1", Pending: true, Published: studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "e1", Time: at, Generation: 1, Spec: spec}},
			studentv1.StudentRecord{Namespace: "default", Name: "wang", UID: "u1", Published: studentv1.PublishedEvent{Type: studentv1.EventTypeUpdated, ID: "e2", Time: at, Generation: 2, Sequence: 5, StudentSequence: 2, Spec: spec, Labels: map[string]string{"a": "b"}}},
		},
	}
	previous := &studentv1.PublishedEvent{Type: studentv1.EventTypeCreated, ID: "e1", Spec: studentv1.StudentSpec{Name: "wang", School: "old"}}
	for _, typ := range []string{studentv1.EventTypeCreated, studentv1.EventTypeUpdated, studentv1.EventTypeDeleted, studentv1.EventTypeSnapshot} {
		ev, err := contract.NewEvent("c", typ, "id", stu, previous, at.Time)
		if err != nil {
			t.Fatal(err)
		}
		if err := stacktest.CheckContract(ev); err != nil {
			t.Errorf("%s: %v", typ, err)
		}
	}
	for name, vs := range values {
		for _, v := range vs {
			b, err := json.Marshal(v)
			if err != nil {
				t.Fatal(err)
			}
			if err := stacktest.CheckSchema(name, b); err != nil {
				t.Errorf("%s %s: %v", name, b, err)
			}
		}
	}
	for name, doc := range map[string]string{
		"receipt":          `{"service":"roster","uid":"u1","namespace":"default","name":"wang","eventID":"e1","generation":2,"time":"2026-12-03T01:00:00Z"}`,
		"student-updated":  `{"metadata":{"namespace":"default","name":"wang","uid":"u1","generation":2,"resourceVersion":"7"},"spec":{"name":"wang","school":"china"}}`,
		"student-created":  `{"metadata":{"namespace":"default","name":"wang","uid":"u1","generation":2,"resourceVersion":"7"},"spec":{"name":"","school":"china"}}`,
		"snapshot-reply":   `{"run":"r","published":"3"}`,
		"record":           `{"namespace":"default","name":"wang","uid":"u1","published":{"type":"t","id":"e","time":"yesterday","generation":1,"spec":{"name":"a","school":"b"}}}`,
		"snapshot-request": `{"namespace":7}`,
	} {
		if err := stacktest.CheckSchema(name, []byte(doc)); err == nil {
			t.Errorf("%s validates %s", name, doc)
		}
	}
}
