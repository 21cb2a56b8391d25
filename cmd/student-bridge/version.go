package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/student-bridge/student-bridge/internal/version"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the release, commit and Go version this binary was built from",
		Long: `version prints the release this binary is (or comes after), the git commit it
was built from ("unknown" outside make's builds) and the Go version and
platform. The running bridge logs the same at start and exports it as the
student_bridge_build_info metric.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.String())
			return err
		},
	}
}
