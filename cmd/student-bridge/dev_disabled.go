//go:build nodev

package main

import "github.com/spf13/cobra"

// newDevCommand is left out of images built with -tags nodev: the local
// stack pulls in envtest and an embedded NATS server that a deployed bridge
// never uses.
func newDevCommand(logSetup, *string) *cobra.Command { return nil }
