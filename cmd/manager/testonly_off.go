//go:build !chaos && !chaosbug

package main

import "github.com/queen-locks/queen-locks/internal/manager"

// applyTestOnly does nothing: the test-only settings (a clock offset read
// from a file, for make chaos) exist only in a build with the chaos tag
// (testonly.go), so the shipped manager links neither them nor the
// skewed clock.
func applyTestOnly(*manager.Options) error { return nil }
