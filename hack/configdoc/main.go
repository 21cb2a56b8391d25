// Command configdoc writes the documented config file from the settings in
// internal/config to every path it is given (configs/student-bridge.yaml and
// the copy the deployment's ConfigMap is made from), so neither can drift
// from the code.
package main

import (
	"fmt"
	"os"

	"github.com/student-bridge/student-bridge/internal/config"
)

func main() {
	for _, path := range os.Args[1:] {
		if err := os.WriteFile(path, []byte(config.DocumentedYAML()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
