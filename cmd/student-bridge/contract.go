package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/student-bridge/student-bridge/api/contract"
)

func newContractCommand() *cobra.Command {
	var schema string
	var list bool
	cmd := &cobra.Command{
		Use:   "contract",
		Short: "Print the contract's AsyncAPI document or one of its JSON Schemas",
		Long: `contract prints what the bridge publishes, machine-readable, for a service's
build: by default the AsyncAPI 3.0 document (JSON) of the subjects, the events
in both encodings, the snapshot request and reply and the receipts and records
buckets; with --schema, the JSON Schema (2020-12) of one event's data, the
receipt, the snapshot request or reply, or the record. Every event names its
schema's URI in its dataschema attribute. docs/contract.md says the same in
prose.`,
		Example: `  student-bridge contract > asyncapi.json
  student-bridge contract --list
  student-bridge contract --schema student-created > student-created.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			switch {
			case list:
				for _, name := range contract.SchemaNames() {
					if _, err := fmt.Fprintf(out, "%-18s %s\n", name, contract.SchemaURI(name)); err != nil {
						return err
					}
				}
				return nil
			case schema != "":
				b, err := contract.Schema(schema)
				if err != nil {
					return fmt.Errorf("no schema %q: --list names them (%s)", schema, strings.Join(contract.SchemaNames(), ", "))
				}
				_, err = out.Write(b)
				return err
			}
			_, err := out.Write(contract.AsyncAPI())
			return err
		},
	}
	cmd.Flags().StringVar(&schema, "schema", "", "print the JSON Schema of this name (see --list) instead of the AsyncAPI document")
	cmd.Flags().BoolVar(&list, "list", false, "list the JSON Schemas with their URIs")
	return cmd
}
