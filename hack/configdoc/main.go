// Command configdoc writes the documented config file from the settings in
// internal/config to every path it is given (configs/student-bridge.yaml and
// the copy the deployment's ConfigMap is made from), so neither can drift
// from the code.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/student-bridge/student-bridge/internal/config"
)

func main() {
	// flag, so that -h prints the usage instead of naming a file to write.
	flag.Usage = func() { fmt.Fprintln(flag.CommandLine.Output(), "usage: configdoc <file>...") }
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	for _, path := range flag.Args() {
		if err := os.WriteFile(path, []byte(config.DocumentedYAML()), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
