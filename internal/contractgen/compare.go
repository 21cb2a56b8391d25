package contractgen

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"reflect"
	"slices"
	"strings"
)

// Break is a change of a schema that a consumer written against the old
// one can trip over.
type Break struct {
	Schema string // the schema's name, e.g. student-created
	Path   string // where in the document, e.g. metadata.uid
	Kind   string // removed, type changed, newly required, enum value removed
	Detail string
}

func (b Break) String() string {
	return fmt.Sprintf("%s: %s at %s: %s", b.Schema, b.Kind, b.Path, b.Detail)
}

// Compare finds the breaking changes from the schemas old to the schemas
// current (both as Schemas returns them). A schema old has and current has not is
// a break too. Additions (a property, an optional field, an enum value, a
// new schema) are not.
func Compare(old, current map[string][]byte) ([]Break, error) {
	newByName := map[string][]byte{}
	for file, data := range current {
		newByName[schemaName(file)] = data
	}
	var breaks []Break
	for _, file := range slices.Sorted(maps.Keys(old)) {
		name := schemaName(file)
		nd, ok := newByName[name]
		if !ok {
			breaks = append(breaks, Break{Schema: name, Path: "(document)", Kind: "removed", Detail: "the schema is gone"})
			continue
		}
		var o, n Schema
		if err := json.Unmarshal(old[file], &o); err != nil {
			return nil, fmt.Errorf("%s (old): %w", file, err)
		}
		if err := json.Unmarshal(nd, &n); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		c := comparer{schema: name, oldRoot: o, newRoot: n}
		c.compare("", o, n, 0)
		breaks = append(breaks, c.breaks...)
	}
	return breaks, nil
}

// schemaName is a schema file's name without its version and extension.
func schemaName(file string) string {
	return strings.TrimSuffix(path.Base(file), ".json")
}

type comparer struct {
	schema           string
	oldRoot, newRoot Schema
	breaks           []Break
}

func (c *comparer) add(at, kind, format string, args ...any) {
	if at == "" {
		at = "(root)"
	}
	c.breaks = append(c.breaks, Break{Schema: c.schema, Path: at, Kind: kind, Detail: fmt.Sprintf(format, args...)})
}

func (c *comparer) compare(at string, o, n Schema, depth int) {
	if depth > 32 {
		return // a recursive type: compared far enough
	}
	o, n = resolve(o, c.oldRoot), resolve(n, c.newRoot)
	if ot, nt := o["type"], n["type"]; ot != nil && !reflect.DeepEqual(ot, nt) {
		c.add(at, "type changed", "%v, was %v", nt, ot)
		return
	}
	if oe, ok := o["enum"].([]any); ok || n["enum"] != nil {
		ne, _ := n["enum"].([]any)
		for _, v := range oe {
			if !slices.Contains(ne, v) {
				c.add(at, "enum value removed", "%v", v)
			}
		}
		if !ok {
			c.add(at, "enum value removed", "values are now limited to %v", ne)
		}
	}
	oldRequired, newRequired := stringList(o["required"]), stringList(n["required"])
	for _, r := range newRequired {
		if !slices.Contains(oldRequired, r) {
			c.add(join(at, r), "newly required", "a consumer's old messages may lack it")
		}
	}
	op, _ := o["properties"].(map[string]any)
	np, _ := n["properties"].(map[string]any)
	for _, name := range slices.Sorted(maps.Keys(op)) {
		ns, ok := np[name].(map[string]any)
		if !ok {
			c.add(join(at, name), "removed", "the field is gone")
			continue
		}
		olds, _ := op[name].(map[string]any)
		c.compare(join(at, name), olds, ns, depth+1)
	}
	for _, key := range []string{"items", "additionalProperties"} {
		olds, ok1 := o[key].(map[string]any)
		news, ok2 := n[key].(map[string]any)
		if ok1 && ok2 {
			c.compare(join(at, "["+key+"]"), olds, news, depth+1)
		}
	}
}

// resolve follows s's $ref (directly, or as the one schema of an allOf
// that only adds a description) within root.
func resolve(s, root Schema) Schema {
	for range 16 {
		if all, ok := s["allOf"].([]any); ok && len(all) == 1 {
			s, _ = all[0].(map[string]any)
			continue
		}
		ref, ok := s["$ref"].(string)
		if !ok {
			return s
		}
		var node any = root
		for _, part := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			m, _ := node.(map[string]any)
			node = m[part]
		}
		s, _ = node.(map[string]any)
	}
	return s
}

func stringList(v any) []string {
	var out []string
	switch l := v.(type) {
	case []any:
		for _, s := range l {
			if s, ok := s.(string); ok {
				out = append(out, s)
			}
		}
	case []string:
		out = l
	}
	return out
}

func join(at, name string) string {
	if at == "" {
		return name
	}
	return at + "." + name
}
