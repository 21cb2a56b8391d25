//go:build tools

// Package golangcilint pins golangci-lint, which make lint runs. It is a
// module of its own so that its many dependencies never mix with the
// bridge's or the other tools'.
package golangcilint

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
