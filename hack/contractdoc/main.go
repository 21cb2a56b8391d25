// Command contractdoc writes the contract's machine-readable documents,
// generated from api/v1's Go source by internal/contractgen: the JSON
// Schemas into api/contract/schemas/<version>/ and the AsyncAPI document
// into api/contract/asyncapi.json (make generate).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/student-bridge/student-bridge/api/contract"
	"github.com/student-bridge/student-bridge/internal/contractgen"
	"github.com/student-bridge/student-bridge/internal/version"
)

func main() {
	api := flag.String("api", "api/v1", "the directory of the API's Go source")
	out := flag.String("out", "api/contract", "where the documents go")
	flag.Parse()
	if err := run(*api, *out); err != nil {
		fmt.Fprintln(os.Stderr, "contractdoc:", err)
		os.Exit(1)
	}
}

func run(api, out string) error {
	schemas, err := contractgen.Schemas(api, contract.SchemaVersion)
	if err != nil {
		return err
	}
	// A schema no longer generated goes.
	if err := os.RemoveAll(filepath.Join(out, "schemas", contract.SchemaVersion)); err != nil {
		return err
	}
	for name, data := range schemas {
		path := filepath.Join(out, "schemas", name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, data, 0o644); err != nil {
			return err
		}
	}
	doc, err := contractgen.AsyncAPI(api, contract.SchemaVersion, version.Version)
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "asyncapi.json"), doc, 0o644)
}
