// Package contractgen generates the contract's machine-readable documents
// from api/v1's Go source: a JSON Schema (2020-12) for the data of each
// event type, the receipt, the snapshot request and its reply, and the
// record; and an AsyncAPI 3.0 document of the subjects, messages and
// operations. It reads the source (go/parser), not the compiled types, so
// that the field comments become descriptions and so that an earlier
// release's source, taken from git history, gives that release's schemas
// for the compatibility gate (Compare).
package contractgen

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/student-bridge/student-bridge/api/contract"
)

// Schema is a JSON Schema object, as JSON has it.
type Schema = map[string]any

// Root names one generated schema: a file name (without .json) and the Go
// type it describes, with the properties it requires beyond the type's.
type Root struct {
	Name     string
	Type     string
	Title    string
	Required []string
}

// Roots are the schemas of the contract.
var Roots = []Root{
	{Name: "student-created", Type: "StudentEventData", Title: "The data of a student.created event"},
	{Name: "student-updated", Type: "StudentEventData", Title: "The data of a student.updated event", Required: []string{"previousSpec"}},
	{Name: "student-deleted", Type: "StudentEventData", Title: "The data of a student.deleted event"},
	{Name: "student-snapshot", Type: "StudentEventData", Title: "The data of a student.snapshot event"},
	{Name: "receipt", Type: "Receipt", Title: "A service's receipt, the value of a key of the receipts bucket"},
	{Name: "snapshot-request", Type: "SnapshotRequest", Title: "The body of a snapshot request"},
	{Name: "snapshot-reply", Type: "SnapshotReply", Title: "The bridge's reply to a snapshot request"},
	{Name: "record", Type: "StudentRecord", Title: "A record of the record store: the last event published for a Student"},
}

// field is a struct field as the source declares it.
type field struct {
	name     string // JSON name
	typ      ast.Expr
	doc      string
	markers  []string
	optional bool
}

// types are the struct types of a package's source, by name.
type types map[string]structType

type structType struct {
	doc    string
	fields []field
}

// parse reads the struct types of the Go files in dir (tests left out).
func parse(dir string) (types, error) {
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	out := types{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") || strings.HasPrefix(filepath.Base(path), "zz_generated") {
			continue
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				doc := ts.Doc
				if doc == nil {
					doc = gd.Doc
				}
				text, _ := splitDoc(doc)
				t := structType{doc: text}
				for _, fl := range st.Fields.List {
					if len(fl.Names) == 0 || fl.Tag == nil {
						continue // embedded (TypeMeta, ObjectMeta) or untagged
					}
					tag, _ := strconv.Unquote(fl.Tag.Value)
					name, opts, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
					if name == "" || name == "-" {
						continue
					}
					text, markers := splitDoc(fl.Doc)
					_, pointer := fl.Type.(*ast.StarExpr)
					t.fields = append(t.fields, field{
						name: name, typ: fl.Type, doc: text, markers: markers,
						optional: (strings.Contains(opts, "omitempty") || pointer || slices.Contains(markers, "optional")) && !slices.Contains(markers, "required"),
					})
				}
				out[ts.Name.Name] = t
			}
		}
	}
	return out, nil
}

// splitDoc separates a comment's text from its +markers.
func splitDoc(cg *ast.CommentGroup) (string, []string) {
	if cg == nil {
		return "", nil
	}
	var text, markers []string
	for line := range strings.Lines(cg.Text()) {
		line = strings.TrimSpace(line)
		if m, ok := strings.CutPrefix(line, "+"); ok {
			markers = append(markers, m)
			continue
		}
		text = append(text, line)
	}
	return strings.TrimSpace(strings.Join(text, " ")), markers
}

// builder turns the source's types into schemas whose references to named
// types point at refPrefix+name, collecting those types' schemas in defs.
type builder struct {
	types     types
	refPrefix string
	defs      map[string]Schema
}

func (b *builder) structSchema(name string) (Schema, error) {
	t, ok := b.types[name]
	if !ok {
		return nil, fmt.Errorf("no struct type %s", name)
	}
	props := Schema{}
	required := []string{}
	for _, f := range t.fields {
		s, err := b.typeSchema(f.typ)
		if err != nil {
			return nil, fmt.Errorf("%s.%s: %w", name, f.name, err)
		}
		if f.doc != "" {
			if _, isRef := s["$ref"]; isRef {
				s = Schema{"allOf": []any{s}}
			}
			s["description"] = f.doc
		}
		applyMarkers(s, f.markers)
		props[f.name] = s
		if !f.optional {
			required = append(required, f.name)
		}
	}
	s := Schema{"type": "object", "properties": props}
	if t.doc != "" {
		s["description"] = t.doc
	}
	if len(required) > 0 {
		s["required"] = required
	}
	return s, nil
}

// typeSchema is the schema of a Go type expression.
func (b *builder) typeSchema(e ast.Expr) (Schema, error) {
	switch t := e.(type) {
	case *ast.StarExpr:
		return b.typeSchema(t.X)
	case *ast.ArrayType:
		items, err := b.typeSchema(t.Elt)
		return Schema{"type": "array", "items": items}, err
	case *ast.MapType:
		if k, ok := t.Key.(*ast.Ident); !ok || k.Name != "string" {
			return nil, fmt.Errorf("map keys must be strings")
		}
		values, err := b.typeSchema(t.Value)
		return Schema{"type": "object", "additionalProperties": values}, err
	case *ast.SelectorExpr:
		switch pkg := t.X.(*ast.Ident).Name + "." + t.Sel.Name; pkg {
		case "metav1.Time":
			return Schema{"type": "string", "format": "date-time"}, nil
		case "types.UID":
			return Schema{"type": "string"}, nil
		case "json.RawMessage":
			return Schema{"type": "object"}, nil
		default:
			return nil, fmt.Errorf("no schema for %s", pkg)
		}
	case *ast.Ident:
		switch t.Name {
		case "string":
			return Schema{"type": "string"}, nil
		case "bool":
			return Schema{"type": "boolean"}, nil
		case "int", "int32", "int64":
			return Schema{"type": "integer"}, nil
		case "uint", "uint32", "uint64":
			return Schema{"type": "integer", "minimum": 0}, nil
		case "float64":
			return Schema{"type": "number"}, nil
		}
		if _, ok := b.defs[t.Name]; !ok {
			b.defs[t.Name] = nil // a cycle stops here
			s, err := b.structSchema(t.Name)
			if err != nil {
				return nil, err
			}
			b.defs[t.Name] = s
		}
		return Schema{"$ref": b.refPrefix + t.Name}, nil
	}
	return nil, fmt.Errorf("no schema for %T", e)
}

// applyMarkers sets the validations of kubebuilder markers on s.
func applyMarkers(s Schema, markers []string) {
	for _, m := range markers {
		key, value, _ := strings.Cut(strings.TrimPrefix(m, "kubebuilder:validation:"), "=")
		switch key {
		case "MinLength":
			s["minLength"], _ = strconv.Atoi(value)
		case "MaxLength":
			s["maxLength"], _ = strconv.Atoi(value)
		case "MaxItems":
			s["maxItems"], _ = strconv.Atoi(value)
		case "Minimum":
			s["minimum"], _ = strconv.Atoi(value)
		case "Enum":
			var values []any
			for v := range strings.SplitSeq(value, ";") {
				values = append(values, v)
			}
			s["enum"] = values
		}
	}
}

// Schemas generates the contract's JSON Schemas from the api/v1 source in
// dir, as files by name (version/name.json), each under its $id.
func Schemas(dir, version string) (map[string][]byte, error) {
	return schemas(dir, version, false)
}

// schemas is Schemas; with skipMissing, a root whose type the source has
// not (an earlier release's) is left out.
func schemas(dir, version string, skipMissing bool) (map[string][]byte, error) {
	ts, err := parse(dir)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, root := range Roots {
		if _, ok := ts[root.Type]; !ok && skipMissing {
			continue
		}
		s, defs, err := rootSchema(ts, root, "#/$defs/")
		if err != nil {
			return nil, err
		}
		s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
		s["$id"] = contract.SchemaBase + version + "/" + root.Name + ".json"
		if len(defs) > 0 {
			s["$defs"] = defs
		}
		data, err := json.MarshalIndent(s, "", "  ")
		if err != nil {
			return nil, err
		}
		out[version+"/"+root.Name+".json"] = append(data, '\n')
	}
	return out, nil
}

// rootSchema is the schema of root, its references to named types at
// refPrefix, and those types' schemas.
func rootSchema(ts types, root Root, refPrefix string) (Schema, map[string]Schema, error) {
	b := &builder{types: ts, refPrefix: refPrefix, defs: map[string]Schema{}}
	s, err := b.structSchema(root.Type)
	if err != nil {
		return nil, nil, err
	}
	delete(b.defs, root.Type)
	requireAlso(s, root.Required)
	s["title"] = root.Title
	return s, b.defs, nil
}

func requireAlso(s Schema, names []string) {
	if len(names) == 0 {
		return
	}
	required, _ := s["required"].([]string)
	s["required"] = append(slices.Clone(required), names...)
}
