//go:build tools

// Package tools records the linter this module builds: golangci-lint. It has
// a module of its own so that its dependencies don't move the pins of
// controller-gen and helm in hack/tools.
package tools

import (
	_ "github.com/golangci/golangci-lint/v2/cmd/golangci-lint"
)
