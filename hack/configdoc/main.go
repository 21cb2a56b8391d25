// Command configdoc writes configs/student-bridge.yaml from the settings in
// internal/config, so the documented file cannot drift from the code.
package main

import (
	"fmt"
	"os"

	"github.com/student-bridge/student-bridge/internal/config"
)

func main() {
	if err := os.WriteFile(os.Args[1], []byte(config.DocumentedYAML()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
