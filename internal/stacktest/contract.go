package stacktest

import (
	"bytes"
	"fmt"
	"sync"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/student-bridge/student-bridge/api/contract"
)

var (
	schemasOnce sync.Once
	schemas     map[string]*jsonschema.Schema
	schemasErr  error
)

// compiledSchemas compiles the contract's JSON Schemas once, each under its
// URI, with formats (date-time) asserted.
func compiledSchemas() (map[string]*jsonschema.Schema, error) {
	schemasOnce.Do(func() {
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		for _, name := range contract.SchemaNames() {
			b, err := contract.Schema(name)
			if err != nil {
				schemasErr = err
				return
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
			if err != nil {
				schemasErr = fmt.Errorf("schema %s: %w", name, err)
				return
			}
			if err := c.AddResource(contract.SchemaURI(name), doc); err != nil {
				schemasErr = err
				return
			}
		}
		schemas = map[string]*jsonschema.Schema{}
		for _, name := range contract.SchemaNames() {
			s, err := c.Compile(contract.SchemaURI(name))
			if err != nil {
				schemasErr = fmt.Errorf("compile schema %s: %w", name, err)
				return
			}
			schemas[name] = s
		}
	})
	return schemas, schemasErr
}

// CheckContract checks a Student event against the contract's documents:
// its dataschema names the schema of its type's data, and its data
// validates against that schema (with santhosh-tekuri/jsonschema, a JSON
// Schema 2020-12 validator). Decode checks every event a test reads.
func CheckContract(ev cloudevents.Event) error {
	if want := contract.DataSchema(ev.Type()); ev.DataSchema() != want {
		return fmt.Errorf("event %s (%s) names dataschema %q, want %q", ev.ID(), ev.Type(), ev.DataSchema(), want)
	}
	if err := CheckSchema(contract.SchemaName(ev.Type()), ev.Data()); err != nil {
		return fmt.Errorf("event %s (%s): %w", ev.ID(), ev.Type(), err)
	}
	return nil
}

// CheckSchema validates doc, JSON, against the contract's schema name.
func CheckSchema(name string, doc []byte) error {
	all, err := compiledSchemas()
	if err != nil {
		return err
	}
	s, ok := all[name]
	if !ok {
		return fmt.Errorf("no schema %s", name)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	if err := s.Validate(v); err != nil {
		return fmt.Errorf("does not validate against %s: %w", contract.SchemaURI(name), err)
	}
	return nil
}
